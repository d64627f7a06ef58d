//! What DCMI's answers mean, as pure functions over the numbers the library returns.
//!
//! - `dcmi_get_device_health`: 0 = normal, 1 = general (minor) alarm, 2 = major alarm,
//!   3 = critical alarm. 0 and 1 leave the chip in use (Huawei's device plugin does the
//!   same); 2 and 3 take it out ([`FaultKind::DcmiChip`], with the chip's error codes from
//!   `dcmi_get_device_errorcode_v2` in the reason). Anything else is garbage.
//! - `dcmi_get_device_network_health` (`enum dcmi_rdfx_detect_result`): 0 = OK, 6 = detection
//!   not started yet (no verdict), 1..=5, 7, 8 = the RoCE port cannot reach its peer
//!   ([`FaultKind::DcmiNetwork`], what Huawei's plugin reports as NetworkUnhealthy); anything
//!   else is garbage.
//! - error codes the operator names as HCCS link faults (`--hccs-fault-codes`) lower the
//!   chip's HCCS pairs ([`FaultKind::HccsDown`]); the chip's health decides its use.
//! - `dcmi_get_device_info` super-pod info ([`super_pod`]): super-pod hardware's chips (Huawei's
//!   `npu-smi` asks only A3 / 910_93 and 950 chips); `super_pod_id` `0xFFFFFFFF` means the server is in no super-pod, any other value
//!   is the super-pod's id, with `server_index` the server's place in it.

use std::collections::BTreeSet;

use fumarole_topology::{Fault, FaultKind};

/// An answer outside the documented range: the last good state stays.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{call} answered {value}, outside its documented range")]
pub struct Garbage {
    pub call: &'static str,
    pub value: i64,
}

/// `DCMI_RDFX_DETECT_OK`.
pub const NETWORK_OK: i32 = 0;
/// `DCMI_RDFX_DETECT_INIT`: the chip has not probed its peer yet.
pub const NETWORK_INIT: i32 = 6;

/// `super_pod_id` of a chip in no super-pod (CANN's `invalidSuperPodId`).
pub const NO_SUPER_POD: u32 = 0xFFFF_FFFF;

/// What the hardware says of the server's super-pod: the chips answered the super-pod query
/// (so this is an A3 server), and the super-pod it is in, if any.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SuperPod {
    /// `Some((super-pod id, server index))` when the server is in a super-pod.
    pub member: Option<(u32, u32)>,
}

/// The server's super-pod from each chip's answer (`super_pod_id`, `server_index`). The chips
/// of one server must agree; chips that disagree are garbage (the last good state stays).
pub fn super_pod(answers: &[(u32, u32)]) -> Result<Option<SuperPod>, Garbage> {
    let Some(first) = answers.first() else {
        return Ok(None);
    };
    if let Some((id, _)) = answers.iter().find(|a| a.0 != first.0) {
        return Err(Garbage {
            call: "dcmi_get_device_info (super-pod id differs between chips)",
            value: i64::from(*id),
        });
    }
    let member = (first.0 != NO_SUPER_POD).then_some(*first);
    if let Some((_, index)) = member
        && answers.iter().any(|a| a.1 != index)
    {
        return Err(Garbage {
            call: "dcmi_get_device_info (server index differs between chips)",
            value: i64::from(index),
        });
    }
    Ok(Some(SuperPod { member }))
}

/// Error codes as people and Huawei's documents write them: `0x80E01801, 0x80CB8009`.
pub fn format_codes(codes: &[u32]) -> String {
    codes
        .iter()
        .map(|c| format!("{c:#010X}").replacen("0X", "0x", 1))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The chip's fault from its health value and error codes.
pub fn chip(health: u32, codes: &[u32]) -> Result<Option<Fault>, Garbage> {
    let level = match health {
        0 | 1 => return Ok(None),
        2 => "major alarm",
        3 => "critical alarm",
        v => {
            return Err(Garbage {
                call: "dcmi_get_device_health",
                value: i64::from(v),
            });
        }
    };
    let reason = if codes.is_empty() {
        format!("chip health {health} ({level})")
    } else {
        format!(
            "chip health {health} ({level}), error codes {}",
            format_codes(codes)
        )
    };
    Ok(Some(Fault::new(FaultKind::DcmiChip, reason)))
}

/// The chip's RoCE network fault, if any; `Ok(None)` also while detection has not run yet.
pub fn network(result: i32) -> Result<Option<Fault>, Garbage> {
    let what = match result {
        NETWORK_OK | NETWORK_INIT => return Ok(None),
        1 => "socket failure",
        2 => "receive timeout",
        3 => "peer unreachable",
        4 => "time exceeded",
        5 => "link fault",
        7 => "detection thread error",
        8 => "IP address not set",
        v => {
            return Err(Garbage {
                call: "dcmi_get_device_network_health",
                value: i64::from(v),
            });
        }
    };
    Ok(Some(Fault::new(
        FaultKind::DcmiNetwork,
        format!("RoCE network unhealthy: {what} (detect result {result})"),
    )))
}

/// The chip's HCCS link fault: one of its error codes is a code the operator named.
pub fn hccs(codes: &[u32], hccs_codes: &BTreeSet<u32>) -> Option<Fault> {
    let hits: Vec<u32> = codes
        .iter()
        .copied()
        .filter(|c| hccs_codes.contains(c))
        .collect();
    (!hits.is_empty()).then(|| {
        Fault::new(
            FaultKind::HccsDown,
            format!("HCCS link fault, error codes {}", format_codes(&hits)),
        )
    })
}

/// Parses an error-code list (`--hccs-fault-codes 0x8C204E00,0x8C2FA009`): hex with `0x`, or
/// decimal.
pub fn parse_codes(text: &str) -> Result<Vec<u32>, String> {
    text.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            let parsed = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
                Some(hex) => u32::from_str_radix(hex, 16),
                None => s.parse::<u32>(),
            };
            parsed.map_err(|_| format!("{s:?} is not an error code (0x-prefixed hex or decimal)"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chip_health_levels() {
        assert_eq!(chip(0, &[]), Ok(None));
        assert_eq!(chip(1, &[0x80E0_1801]), Ok(None));
        let f = chip(3, &[0x80E0_1801, 0x80CB_8009]).unwrap().unwrap();
        assert_eq!(f.kind, FaultKind::DcmiChip);
        assert_eq!(
            f.reason,
            "chip health 3 (critical alarm), error codes 0x80E01801, 0x80CB8009"
        );
        assert_eq!(
            chip(2, &[]).unwrap().unwrap().reason,
            "chip health 2 (major alarm)"
        );
        assert_eq!(
            chip(0xffff_ffff, &[]),
            Err(Garbage {
                call: "dcmi_get_device_health",
                value: 0xffff_ffff
            })
        );
    }

    #[test]
    fn network_results() {
        assert_eq!(network(0), Ok(None));
        assert_eq!(network(6), Ok(None));
        let f = network(3).unwrap().unwrap();
        assert_eq!(f.kind, FaultKind::DcmiNetwork);
        assert!(f.reason.contains("peer unreachable"), "{}", f.reason);
        assert!(network(255).is_err());
        assert!(network(-1).is_err());
    }

    #[test]
    fn super_pod_answers() {
        assert_eq!(super_pod(&[]), Ok(None));
        assert_eq!(
            super_pod(&[(7, 3), (7, 3)]),
            Ok(Some(SuperPod {
                member: Some((7, 3))
            }))
        );
        assert_eq!(
            super_pod(&[(NO_SUPER_POD, 0x3ff)]),
            Ok(Some(SuperPod { member: None }))
        );
        assert!(super_pod(&[(7, 3), (8, 3)]).is_err());
        assert!(super_pod(&[(7, 3), (7, 4)]).is_err());
    }

    #[test]
    fn hccs_codes_and_their_parsing() {
        let named: BTreeSet<u32> = parse_codes("0x8C204E00, 2351")
            .unwrap()
            .into_iter()
            .collect();
        assert!(named.contains(&0x8C20_4E00) && named.contains(&2351));
        assert_eq!(hccs(&[1, 2], &named), None);
        let f = hccs(&[1, 0x8C20_4E00], &named).unwrap();
        assert_eq!(f.kind, FaultKind::HccsDown);
        assert_eq!(f.reason, "HCCS link fault, error codes 0x8C204E00");
        assert!(parse_codes("0xZZ").unwrap_err().contains("0xZZ"));
    }
}
