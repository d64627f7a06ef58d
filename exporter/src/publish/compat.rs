//! Node labels under other projects' keys, for tools that select nodes by them: those NVIDIA's
//! gpu-feature-discovery (GFD) publishes, with its keys and value formats, and the Ascend
//! `accelerator` and `accelerator-type` labels Huawei's scheduler plugin reads ([`ascend::labels`]). Only labels whose value fumarole knows
//! truthfully are rendered (docs/labels.md lists the others and why). Pure functions: the
//! publisher writes them when `--compat-labels` is on.

use std::collections::BTreeMap;

use fumarole_topology::{NodeTopology, Vendor};

use crate::device_health::dcmi::answers::SuperPod;
use crate::discover::nvml::NvmlReport;

use super::ascend;
use super::objects::label_value;

/// Every key [`labels`] may render: the publisher treats these as ours on the Node (and the
/// node-scoped-writes policy lets the agent change exactly these).
pub const KEYS: &[&str] = &[
    "nvidia.com/gpu.product",
    "nvidia.com/gpu.count",
    "nvidia.com/gpu.memory",
    "nvidia.com/gpu.family",
    "nvidia.com/gpu.compute.major",
    "nvidia.com/gpu.compute.minor",
    "nvidia.com/gpu.clique",
    "nvidia.com/gpu.mode",
    "nvidia.com/mig.capable",
    "nvidia.com/cuda.driver-version.major",
    "nvidia.com/cuda.driver-version.minor",
    "nvidia.com/cuda.driver-version.revision",
    "nvidia.com/cuda.driver-version.full",
    "nvidia.com/cuda.driver.major",
    "nvidia.com/cuda.driver.minor",
    "nvidia.com/cuda.driver.rev",
    "nvidia.com/cuda.runtime-version.major",
    "nvidia.com/cuda.runtime-version.minor",
    "nvidia.com/cuda.runtime-version.full",
    "nvidia.com/cuda.runtime.major",
    "nvidia.com/cuda.runtime.minor",
    "accelerator",
    "accelerator-type",
    // Rendered by `ascend::labels` with `--ascend-device-info` only (from DCMI's chip info).
    "servertype",
    "node.kubernetes.io/npu.chip.name",
];

/// The compatible labels of node `t`, with NVML's answers `nvml` (`None`: not asked or absent)
/// and the DCMI super-pod answer `super_pod` (`None`: no answer, see [`ascend::labels`]).
pub fn labels(
    t: &NodeTopology,
    nvml: Option<&NvmlReport>,
    super_pod: Option<&SuperPod>,
) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    gfd(t, nvml, &mut out);
    // The chip-info labels (`servertype`, `npu.chip.name`) are `--ascend-device-info`'s only.
    out.extend(ascend::labels(t, super_pod, None));
    debug_assert!(out.keys().all(|k| KEYS.contains(&k.as_str())));
    out
}

/// GFD's labels for the node's NVIDIA GPUs (none without one, as GFD).
fn gfd(t: &NodeTopology, nvml: Option<&NvmlReport>, out: &mut BTreeMap<String, String>) {
    let gpus: Vec<_> = t
        .devices
        .iter()
        .filter(|d| d.vendor == Vendor::Nvidia)
        .collect();
    let Some(first) = gpus.first() else {
        return;
    };
    let mut put = |key: &str, value: String| {
        out.insert(format!("nvidia.com/{key}"), value);
    };
    // GFD labels the node by one GPU's name and memory.
    let product = sanitise(&first.model);
    if !product.is_empty() {
        put("gpu.product", product);
    }
    put("gpu.count", gpus.len().to_string());
    if let Some(mib) = first.memory_bytes.map(|b| b >> 20).filter(|m| *m > 0) {
        put("gpu.memory", mib.to_string());
    }
    // GFD's mode from the PCI class shared by every GPU: VGA controller or 3D controller.
    let class = first.pci_id.class;
    let mode = match class {
        _ if gpus.iter().any(|d| d.pci_id.class != class) => "unknown",
        0x0300 => "graphics",
        0x0302 => "compute",
        _ => "unknown",
    };
    put("gpu.mode", mode.into());
    let Some(report) = nvml else {
        return;
    };
    let first_gpu = report
        .gpus
        .iter()
        .find(|g| Some(g.uuid.as_str()) == first.uuid.as_deref())
        .or_else(|| report.gpus.first());
    // GFD leaves the architecture out when the major is 0.
    if let Some(cc) = first_gpu
        .and_then(|g| g.compute_capability)
        .filter(|c| c.major != 0)
    {
        put("gpu.family", family(cc.major, cc.minor).to_string());
        put("gpu.compute.major", cc.major.to_string());
        put("gpu.compute.minor", cc.minor.to_string());
    }
    // True when any GPU is MIG-capable; false only when every GPU said it is not.
    let mig: Vec<Option<bool>> = report.gpus.iter().map(|g| g.mig_capable).collect();
    if mig.contains(&Some(true)) {
        put("mig.capable", "true".into());
    } else if !mig.is_empty() && mig.iter().all(|m| *m == Some(false)) {
        put("mig.capable", "false".into());
    }
    // One cluster uuid and one clique among the fabric-attached GPUs.
    let mut fabrics: Vec<String> = report
        .gpus
        .iter()
        .filter_map(|g| g.fabric.as_ref())
        .map(|f| format!("{}.{}", f.cluster_uuid, f.clique_id))
        .collect();
    fabrics.sort();
    fabrics.dedup();
    if let [clique] = fabrics.as_slice() {
        put("gpu.clique", clique.clone());
    }
    if let Some(v) = &report.driver_version {
        let parts: Vec<&str> = v.split('.').collect();
        if (2..=3).contains(&parts.len()) {
            let revision = parts.get(2).copied().unwrap_or_default();
            for (old, new, value) in [
                ("major", "major", parts[0]),
                ("minor", "minor", parts[1]),
                ("rev", "revision", revision),
            ] {
                put(&format!("cuda.driver.{old}"), value.to_string());
                put(&format!("cuda.driver-version.{new}"), value.to_string());
            }
            put("cuda.driver-version.full", v.clone());
        }
    }
    if let Some(v) = report.cuda_driver_version.filter(|v| *v > 0) {
        let (major, minor) = (v / 1000, v % 1000 / 10);
        for prefix in ["cuda.runtime", "cuda.runtime-version"] {
            put(&format!("{prefix}.major"), major.to_string());
            put(&format!("{prefix}.minor"), minor.to_string());
        }
        put("cuda.runtime-version.full", format!("{major}.{minor}"));
    }
}

/// GFD's product sanitising: only `A-Z a-z 0-9 - _ .` and spaces kept, runs of spaces become
/// one `-`; then held to a valid label value ([`label_value`]: at most 63 characters,
/// alphanumeric at both ends), so a long product name cannot fail the whole label write.
pub fn sanitise(name: &str) -> String {
    let kept: String = name
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ' '))
        .collect();
    label_value(&kept.split_whitespace().collect::<Vec<_>>().join("-"))
}

/// GFD's architecture family for a compute capability.
pub fn family(major: i32, minor: i32) -> &'static str {
    match (major, minor) {
        (1, _) => "tesla",
        (2, _) => "fermi",
        (3, _) => "kepler",
        (5, _) => "maxwell",
        (6, _) => "pascal",
        (7, m) if m < 5 => "volta",
        (7, _) => "turing",
        (8, m) if m < 9 => "ampere",
        (8, _) => "ada-lovelace",
        (9, _) => "hopper",
        (10 | 12, _) => "blackwell",
        (13, _) => "rubin",
        _ => "undefined",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discover::nvml::{ComputeCapability, FabricInfo, NvmlGpu};
    use fumarole_topology::model::{Device, DeviceKind, PciId};
    use fumarole_topology::{CpuSet, Health, LinkClass, LinkMatrix};

    fn device(vendor: Vendor, id: String, model: &str, i: u32) -> Device {
        Device {
            id,
            index: i,
            vendor,
            kind: DeviceKind::Gpu,
            model: model.into(),
            pci_bus_id: format!("0000:{:02x}:00.0", i + 1),
            pci_path: vec![],
            pci_id: PciId {
                vendor: 0x10de,
                device: 0x2330,
                class: 0x0302,
            },
            numa_node: None,
            local_cpus: CpuSet::default(),
            dev_nodes: vec![],
            health: Health::Healthy,
            uuid: Some(format!("GPU-{i}")),
            serial: None,
            memory_bytes: Some(81_559 << 20),
            mig: Vec::new(),
        }
    }

    fn node(devices: Vec<Device>) -> NodeTopology {
        NodeTopology {
            hostname: "n1".into(),
            packages: vec![],
            processing_units: vec![],
            allowed_cpus: CpuSet::default(),
            numa_nodes: vec![],
            links: LinkMatrix::filled(devices.len(), LinkClass::CrossNuma),
            devices,
            super_node: None,
        }
    }

    fn h100s(n: u32) -> NodeTopology {
        node(
            (0..n)
                .map(|i| {
                    device(
                        Vendor::Nvidia,
                        format!("GPU-{i}"),
                        "NVIDIA H100 80GB HBM3",
                        i,
                    )
                })
                .collect(),
        )
    }

    fn report(n: u32) -> NvmlReport {
        NvmlReport {
            driver_version: Some("550.90.07".into()),
            cuda_driver_version: Some(12_040),
            gpus: (0..n)
                .map(|i| NvmlGpu {
                    uuid: format!("GPU-{i}"),
                    compute_capability: Some(ComputeCapability { major: 9, minor: 0 }),
                    mig_capable: Some(true),
                    ..Default::default()
                })
                .collect(),
        }
    }

    fn get<'a>(l: &'a BTreeMap<String, String>, k: &str) -> Option<&'a str> {
        l.get(k).map(String::as_str)
    }

    #[test]
    fn gfd_keys_and_value_formats() {
        let l = labels(&h100s(8), Some(&report(8)), None);
        let want = [
            ("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3"),
            ("nvidia.com/gpu.count", "8"),
            ("nvidia.com/gpu.memory", "81559"),
            ("nvidia.com/gpu.family", "hopper"),
            ("nvidia.com/gpu.compute.major", "9"),
            ("nvidia.com/gpu.compute.minor", "0"),
            ("nvidia.com/gpu.mode", "compute"),
            ("nvidia.com/mig.capable", "true"),
            ("nvidia.com/cuda.driver-version.major", "550"),
            ("nvidia.com/cuda.driver-version.minor", "90"),
            ("nvidia.com/cuda.driver-version.revision", "07"),
            ("nvidia.com/cuda.driver-version.full", "550.90.07"),
            ("nvidia.com/cuda.driver.major", "550"),
            ("nvidia.com/cuda.driver.minor", "90"),
            ("nvidia.com/cuda.driver.rev", "07"),
            ("nvidia.com/cuda.runtime-version.major", "12"),
            ("nvidia.com/cuda.runtime-version.minor", "4"),
            ("nvidia.com/cuda.runtime-version.full", "12.4"),
            ("nvidia.com/cuda.runtime.major", "12"),
            ("nvidia.com/cuda.runtime.minor", "4"),
        ];
        let want: BTreeMap<String, String> = want
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        assert_eq!(l, want);
    }

    #[test]
    fn only_what_is_known() {
        // Without NVML: product, count, memory and mode only.
        let mut t = h100s(2);
        t.devices[0].memory_bytes = None;
        let l = labels(&t, None, None);
        assert_eq!(
            l.keys().map(String::as_str).collect::<Vec<_>>(),
            [
                "nvidia.com/gpu.count",
                "nvidia.com/gpu.mode",
                "nvidia.com/gpu.product"
            ]
        );
        // A two-part driver version has an empty revision (as GFD); an odd one gives none.
        let mut r = report(2);
        r.driver_version = Some("560.35".into());
        r.cuda_driver_version = None;
        r.gpus[0].compute_capability = None;
        r.gpus[0].mig_capable = None;
        r.gpus[1].mig_capable = Some(false);
        let l = labels(&t, Some(&r), None);
        assert_eq!(get(&l, "nvidia.com/cuda.driver-version.revision"), Some(""));
        assert_eq!(get(&l, "nvidia.com/cuda.driver.rev"), Some(""));
        assert_eq!(
            get(&l, "nvidia.com/cuda.driver-version.full"),
            Some("560.35")
        );
        assert_eq!(get(&l, "nvidia.com/cuda.runtime-version.full"), None);
        assert_eq!(get(&l, "nvidia.com/gpu.family"), None);
        // One GPU unknown, none capable: not claimed either way.
        assert_eq!(get(&l, "nvidia.com/mig.capable"), None);
        r.gpus[0].mig_capable = Some(false);
        r.driver_version = Some("1.2.3.4".into());
        let l = labels(&t, Some(&r), None);
        assert_eq!(get(&l, "nvidia.com/mig.capable"), Some("false"));
        assert!(!l.keys().any(|k| k.contains("cuda.driver")));
        // Mixed PCI classes: mode unknown.
        t.devices[1].pci_id.class = 0x0300;
        assert_eq!(
            get(&labels(&t, None, None), "nvidia.com/gpu.mode"),
            Some("unknown")
        );
        t.devices[0].pci_id.class = 0x0300;
        assert_eq!(
            get(&labels(&t, None, None), "nvidia.com/gpu.mode"),
            Some("graphics")
        );
    }

    #[test]
    fn clique_only_when_one() {
        let mut r = report(2);
        let fabric = |clique| {
            Some(FabricInfo {
                cluster_uuid: "7b968a6d-c8aa-45e1-9e07-e1e51be99c31".into(),
                clique_id: clique,
            })
        };
        r.gpus[0].fabric = fabric(1);
        r.gpus[1].fabric = fabric(1);
        let l = labels(&h100s(2), Some(&r), None);
        assert_eq!(
            get(&l, "nvidia.com/gpu.clique"),
            Some("7b968a6d-c8aa-45e1-9e07-e1e51be99c31.1")
        );
        r.gpus[1].fabric = fabric(2);
        assert_eq!(
            get(&labels(&h100s(2), Some(&r), None), "nvidia.com/gpu.clique"),
            None
        );
    }

    #[test]
    fn none_without_a_gpu_and_ascend_family() {
        assert!(labels(&node(vec![]), None, None).is_empty());
        let npus = |family: &str| {
            node(
                (0..8)
                    .map(|i| device(Vendor::Huawei, format!("{family}-{i}"), "Ascend910B", i))
                    .collect(),
            )
        };
        let l = labels(&npus("Ascend910"), None, None);
        assert_eq!(l.len(), 2);
        assert_eq!(get(&l, "accelerator"), Some("huawei-Ascend910"));
        assert_eq!(get(&l, "accelerator-type"), Some("module-910b-8"));
        let l = labels(&npus("Ascend310P"), None, None);
        assert_eq!(get(&l, "accelerator"), Some("huawei-Ascend310P"));
        assert!(labels(&npus("npu"), None, None).is_empty());
    }

    #[test]
    fn sanitise_and_family_as_gfd() {
        assert_eq!(sanitise("NVIDIA H100 80GB HBM3"), "NVIDIA-H100-80GB-HBM3");
        assert_eq!(sanitise("  Tesla  T4 (rev a1)/x\t"), "Tesla-T4-rev-a1x");
        assert_eq!(sanitise("NVIDIA A100-SXM4-40GB"), "NVIDIA-A100-SXM4-40GB");
        for ((major, minor), want) in [
            ((7, 0), "volta"),
            ((7, 5), "turing"),
            ((8, 0), "ampere"),
            ((8, 6), "ampere"),
            ((8, 9), "ada-lovelace"),
            ((9, 0), "hopper"),
            ((10, 0), "blackwell"),
            ((12, 0), "blackwell"),
            ((11, 0), "undefined"),
        ] {
            assert_eq!(family(major, minor), want, "{major}.{minor}");
        }
    }

    #[test]
    fn the_policy_allows_exactly_these_keys() {
        for (path, text) in [
            (
                "deploy/daemonset/node-scoped-writes.yaml",
                include_str!("../../../deploy/daemonset/node-scoped-writes.yaml"),
            ),
            (
                "deploy/helm/fumarole/templates/node-scoped-writes.yaml",
                include_str!("../../../deploy/helm/fumarole/templates/node-scoped-writes.yaml"),
            ),
        ] {
            let mut lines = text
                .lines()
                .skip_while(|l| !l.contains("name: compatLabels"));
            let list = lines.nth(1).unwrap_or_default();
            let list = list
                .trim()
                .strip_prefix("expression: \"[")
                .and_then(|l| l.strip_suffix("]\""))
                .unwrap_or_else(|| panic!("{path}: no compatLabels list"));
            let keys: Vec<&str> = list.split(", ").map(|k| k.trim_matches('\'')).collect();
            assert_eq!(keys, KEYS, "{path}");
        }
    }
}
