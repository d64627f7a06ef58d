//! Which PCI functions are accelerators, and the vendor conventions for naming them.
//!
//! An accelerator is a known GPU/NPU vendor's display or 3D controller (class `0x03xx`), or
//! any vendor's processing accelerator (`0x12xx`) or co-processor (`0x0b40`). A display
//! controller from another vendor is a BMC's VGA chip (ASPEED, Matrox, ...), not an
//! accelerator; so is an NVIDIA NVSwitch (class `0x0680`).

use fumarole_topology::{DeviceKind, LinkClass, Vendor};

/// PCI class (class << 8 | subclass) groups.
const DISPLAY: u16 = 0x03;
const PROCESSING_ACCELERATOR: u16 = 0x12;
const CO_PROCESSOR: u16 = 0x0b40;

/// The kind of accelerator a PCI function is, or `None` when it is not one.
pub fn classify(vendor_id: u16, class: u16) -> Option<DeviceKind> {
    let vendor = Vendor::from_pci(vendor_id);
    let base = class >> 8;
    match vendor {
        Vendor::Huawei if base == PROCESSING_ACCELERATOR => Some(DeviceKind::Npu),
        Vendor::Nvidia | Vendor::Metax | Vendor::Amd | Vendor::Intel
            if base == DISPLAY || base == PROCESSING_ACCELERATOR =>
        {
            Some(DeviceKind::Gpu)
        }
        _ if base == PROCESSING_ACCELERATOR || class == CO_PROCESSOR => Some(DeviceKind::Other),
        _ => None,
    }
}

/// Ascend families, from the PCI device id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AscendFamily {
    /// Ascend 910: HCCS groups {0-3} and {4-7}.
    A910,
    /// Ascend 910B: full HCCS mesh within each half of 8 (a 16-NPU board has two halves).
    A910B,
    /// Ascend 310P: inference, no HCCS.
    A310P,
    /// Ascend 310: inference, no HCCS.
    A310,
}

impl AscendFamily {
    pub fn from_device_id(device: u16) -> Option<Self> {
        match device {
            0xd801 => Some(AscendFamily::A910),
            0xd802 => Some(AscendFamily::A910B),
            0xd500 => Some(AscendFamily::A310P),
            0xd100 => Some(AscendFamily::A310),
            _ => None,
        }
    }

    /// The name in device ids and resource names (`huawei.com/Ascend910` covers 910B too).
    pub fn resource_name(self) -> &'static str {
        match self {
            AscendFamily::A910 | AscendFamily::A910B => "Ascend910",
            AscendFamily::A310P => "Ascend310P",
            AscendFamily::A310 => "Ascend310",
        }
    }

    pub fn model(self) -> &'static str {
        match self {
            AscendFamily::A910 => "Ascend910",
            AscendFamily::A910B => "Ascend910B",
            AscendFamily::A310P => "Ascend310P",
            AscendFamily::A310 => "Ascend310",
        }
    }

    /// The HCCS class between NPUs `a` and `b` (davinci indices), `None` when they talk over
    /// PCIe only.
    pub fn hccs(self, a: u32, b: u32) -> Option<LinkClass> {
        match self {
            AscendFamily::A910 => (a / 4 == b / 4).then_some(LinkClass::Hccs),
            AscendFamily::A910B => (a / 8 == b / 8).then_some(LinkClass::Hccs),
            AscendFamily::A310P | AscendFamily::A310 => None,
        }
    }
}

/// Model names for PCI ids we know; the driver or NVML name wins when available.
pub fn known_model(vendor: u16, device: u16) -> Option<&'static str> {
    Some(match (vendor, device) {
        (0x10de, 0x2330) => "NVIDIA H100 80GB HBM3",
        (0x10de, 0x2331) => "NVIDIA H100 PCIe",
        (0x10de, 0x20b0) => "NVIDIA A100-SXM4-40GB",
        (0x10de, 0x20b2) => "NVIDIA A100-SXM4-80GB",
        (0x10de, 0x26b9) => "NVIDIA L40S",
        (0x19e5, d) => AscendFamily::from_device_id(d)?.model(),
        _ => return None,
    })
}

/// A readable fallback model name from the PCI ids.
pub fn fallback_model(vendor: u16, device: u16) -> String {
    format!(
        "{} {vendor:04x}:{device:04x}",
        Vendor::from_pci(vendor).as_str()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_by_vendor_and_class_together() {
        assert_eq!(classify(0x10de, 0x0302), Some(DeviceKind::Gpu)); // H100 3D controller
        assert_eq!(classify(0x10de, 0x0300), Some(DeviceKind::Gpu));
        assert_eq!(classify(0x10de, 0x0680), None); // NVSwitch bridge
        assert_eq!(classify(0x19e5, 0x1200), Some(DeviceKind::Npu));
        assert_eq!(classify(0x19e5, 0x0200), None); // Huawei NIC
        assert_eq!(classify(0x9999, 0x0380), Some(DeviceKind::Gpu));
        assert_eq!(classify(0x1a03, 0x0300), None); // ASPEED BMC VGA
        assert_eq!(classify(0x102b, 0x0300), None); // Matrox BMC VGA
        assert_eq!(classify(0x8086, 0x0b40), Some(DeviceKind::Other)); // Xeon Phi co-processor
        assert_eq!(classify(0x1da3, 0x1200), Some(DeviceKind::Other)); // any processing accel
        assert_eq!(classify(0x15b3, 0x0207), None); // InfiniBand NIC
    }

    #[test]
    fn ascend_hccs_groups() {
        let a910 = AscendFamily::A910;
        assert_eq!(a910.hccs(0, 3), Some(LinkClass::Hccs));
        assert_eq!(a910.hccs(3, 4), None);
        assert_eq!(a910.hccs(4, 7), Some(LinkClass::Hccs));
        let b = AscendFamily::A910B;
        assert_eq!(b.hccs(0, 7), Some(LinkClass::Hccs));
        assert_eq!(b.hccs(7, 8), None);
        assert_eq!(AscendFamily::A310P.hccs(0, 1), None);
        assert_eq!(
            AscendFamily::from_device_id(0xd802),
            Some(AscendFamily::A910B)
        );
    }
}
