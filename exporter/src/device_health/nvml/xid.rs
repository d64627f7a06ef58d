//! Which NVIDIA XID errors take a GPU out of use.
//!
//! NVML delivers an XID as a *critical* event whenever the driver logs one, including those
//! caused by the application running on the GPU (a bad kernel, a page fault in user memory).
//! Those say nothing about the GPU: like NVIDIA's own device plugin we ignore XIDs 13, 31, 43,
//! 45, 68 and 109 ([`DEFAULT_IGNORED`]), and operators may add more
//! (`--ignored-xids`). Every other XID marks the device; [`describe`] names the well-known ones
//! (79: fallen off the bus; 48: double-bit ECC; 63/64: page retirement or row remapping
//! recorded / failed; 94/95: contained / uncontained ECC error; 74: NVLink error; ...).

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

/// The last XID each GPU reported (ignored ones too), by device id, for the per-device figures
/// (`DCGM_FI_DEV_XID_ERRORS`). Nothing is known until the health thread watches XID events
/// ([`Self::watching`]); from then on a GPU without one reads 0.
#[derive(Clone, Debug, Default)]
pub struct LastXids(Arc<Mutex<Option<HashMap<String, u64>>>>);

impl LastXids {
    /// The health thread now receives XID events.
    pub fn watching(&self) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get_or_insert_with(HashMap::new);
    }

    pub fn record(&self, device: &str, xid: u64) {
        if let Some(last) = self
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_mut()
        {
            last.insert(device.to_string(), xid);
        }
    }

    /// `device`'s last XID, 0 when none came; `None` while XIDs are not watched.
    pub fn get(&self, device: &str) -> Option<u64> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map(|last| last.get(device).copied().unwrap_or(0))
    }
}

/// The XIDs NVIDIA's device plugin ignores because they are the application's fault:
/// 13 (graphics engine exception), 31 (GPU memory page fault), 43 (GPU stopped processing),
/// 45 (preemptive cleanup), 68 (video processor exception), 109 (context switch timeout).
pub const DEFAULT_IGNORED: [u64; 6] = [13, 31, 43, 45, 68, 109];

/// NVML's value for an XID it could not identify (`nvmlEventData_t.eventData`).
pub const UNKNOWN_XID: u64 = 999;

/// What an XID means for the device it names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum XidClass {
    /// The application's fault: the device stays in use.
    Ignored,
    /// The device is taken out of use; the string is what people read.
    Critical(String),
}

/// The ignored set: NVIDIA's defaults plus `extra`.
pub fn ignored_set(extra: &[u64]) -> BTreeSet<u64> {
    DEFAULT_IGNORED.iter().chain(extra).copied().collect()
}

/// The class of `xid` given the `ignored` set.
pub fn classify(xid: u64, ignored: &BTreeSet<u64>) -> XidClass {
    if ignored.contains(&xid) {
        return XidClass::Ignored;
    }
    let text = match describe(xid) {
        Some(what) => format!("XID {xid} ({what})"),
        None if xid == UNKNOWN_XID => "XID unknown to NVML".to_string(),
        None => format!("XID {xid}"),
    };
    XidClass::Critical(text)
}

/// What the well-known XIDs mean (NVIDIA's XID catalogue).
pub fn describe(xid: u64) -> Option<&'static str> {
    Some(match xid {
        13 => "graphics engine exception",
        31 => "GPU memory page fault",
        32 => "invalid or corrupted push buffer stream",
        38 => "driver firmware error",
        43 => "GPU stopped processing",
        45 => "preemptive cleanup",
        48 => "double-bit ECC error",
        61 | 62 => "internal micro-controller error",
        63 => "ECC page retirement or row remapping recorded",
        64 => "ECC page retirement or row remapping failure",
        68 => "video processor exception",
        69 => "graphics engine class error",
        74 => "NVLink error",
        79 => "GPU has fallen off the bus",
        92 => "high single-bit ECC error rate",
        94 => "contained ECC error",
        95 => "uncontained ECC error",
        109 => "context switch timeout",
        119 | 120 => "GSP error",
        121 => "C2C link error",
        140 => "ECC unrecovered error",
        _ => return None,
    })
}

/// Parses an XID list (`--ignored-xids 94,95`): decimal numbers.
pub fn parse_list(text: &str) -> Result<Vec<u64>, String> {
    text.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<u64>()
                .map_err(|_| format!("{s:?} is not an XID number"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn application_xids_are_ignored_hardware_xids_are_not() {
        let ignored = ignored_set(&[]);
        for xid in [13, 31, 43, 45, 68, 109] {
            assert_eq!(classify(xid, &ignored), XidClass::Ignored, "{xid}");
        }
        for xid in [48, 63, 64, 74, 79, 94, 95, 119] {
            assert!(
                matches!(classify(xid, &ignored), XidClass::Critical(_)),
                "{xid}"
            );
        }
        assert_eq!(
            classify(79, &ignored),
            XidClass::Critical("XID 79 (GPU has fallen off the bus)".into())
        );
        assert_eq!(
            classify(4242, &ignored),
            XidClass::Critical("XID 4242".into())
        );
        assert_eq!(
            classify(UNKNOWN_XID, &ignored),
            XidClass::Critical("XID unknown to NVML".into())
        );
    }

    #[test]
    fn operators_extend_the_list() {
        let ignored = ignored_set(&parse_list("94, 95").unwrap());
        assert_eq!(classify(94, &ignored), XidClass::Ignored);
        assert_eq!(classify(13, &ignored), XidClass::Ignored);
        assert!(matches!(classify(79, &ignored), XidClass::Critical(_)));
        assert!(parse_list("94,x").unwrap_err().contains("\"x\""));
        assert_eq!(parse_list("").unwrap(), Vec::<u64>::new());
    }
}
