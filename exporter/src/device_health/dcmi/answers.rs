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
//! - `dcmi_get_device_chip_info` ([`chip_info`]): the chip's type (`Ascend`), name (`910B3`),
//!   version and AI core count, as C strings in 32-byte arrays. An array without its NUL, text
//!   that is not UTF-8 or not printable ASCII, or an empty name is no answer ([`BadChipInfo`]).

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

/// What `dcmi_get_device_chip_info` says of a chip, decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChipInfo {
    /// `chip_type`, e.g. `Ascend`.
    pub chip_type: String,
    /// `chip_name`, e.g. `910B3` (what Huawei's device plugin publishes as
    /// `node.kubernetes.io/npu.chip.name`).
    pub name: String,
    /// `chip_ver`, e.g. `V1`.
    pub version: String,
    /// `aicore_cnt`: AI cores per chip.
    pub ai_cores: u32,
}

/// A chip-info answer that cannot be used: which field, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadChipInfo {
    #[error("dcmi_get_device_chip_info: {field} fills its {len} bytes without a terminating NUL")]
    Unterminated { field: &'static str, len: usize },
    #[error("dcmi_get_device_chip_info: {field} is not UTF-8 ({bytes:02x?})")]
    NotUtf8 { field: &'static str, bytes: Vec<u8> },
    #[error(
        "dcmi_get_device_chip_info: {field} {text:?} holds characters other than printable ASCII"
    )]
    NotPrintable { field: &'static str, text: String },
    #[error("dcmi_get_device_chip_info: empty chip name")]
    EmptyName,
}

/// The text of a C string held in a fixed array: the bytes before the first NUL.
fn c_text(field: &'static str, bytes: &[u8]) -> Result<String, BadChipInfo> {
    let end = bytes
        .iter()
        .position(|b| *b == 0)
        .ok_or(BadChipInfo::Unterminated {
            field,
            len: bytes.len(),
        })?;
    let text = std::str::from_utf8(&bytes[..end]).map_err(|_| BadChipInfo::NotUtf8 {
        field,
        bytes: bytes[..end].to_vec(),
    })?;
    if !text.chars().all(|c| c.is_ascii_graphic()) {
        return Err(BadChipInfo::NotPrintable {
            field,
            text: text.to_string(),
        });
    }
    Ok(text.to_string())
}

/// The chip's info from the raw arrays of `struct dcmi_chip_info`.
pub fn chip_info(
    chip_type: &[u8],
    name: &[u8],
    version: &[u8],
    ai_cores: u32,
) -> Result<ChipInfo, BadChipInfo> {
    let name = c_text("chip_name", name)?;
    if name.is_empty() {
        return Err(BadChipInfo::EmptyName);
    }
    Ok(ChipInfo {
        chip_type: c_text("chip_type", chip_type)?,
        name,
        version: c_text("chip_ver", version)?,
        ai_cores,
    })
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

    /// A 32-byte C array holding `text` and NULs.
    fn arr(text: &[u8]) -> [u8; 32] {
        let mut a = [0u8; 32];
        a[..text.len()].copy_from_slice(text);
        a
    }

    #[test]
    fn chip_info_decodes_c_strings() {
        let got = chip_info(&arr(b"Ascend"), &arr(b"910B3"), &arr(b"V1"), 20).unwrap();
        assert_eq!(
            got,
            ChipInfo {
                chip_type: "Ascend".into(),
                name: "910B3".into(),
                version: "V1".into(),
                ai_cores: 20
            }
        );
        // Bytes after the first NUL are not the string's.
        let mut trailing = arr(b"910A");
        trailing[10] = b'x';
        assert_eq!(
            chip_info(&arr(b"Ascend"), &trailing, &arr(b""), 32)
                .unwrap()
                .name,
            "910A"
        );
    }

    #[test]
    fn garbled_chip_info_is_refused_with_its_reason() {
        let ok = arr(b"Ascend");
        // All 32 bytes used, no NUL: the library overran the field.
        assert_eq!(
            chip_info(&ok, &[b'9'; 32], &ok, 20),
            Err(BadChipInfo::Unterminated {
                field: "chip_name",
                len: 32
            })
        );
        assert_eq!(
            chip_info(&[b'A'; 32], &arr(b"910B3"), &ok, 20),
            Err(BadChipInfo::Unterminated {
                field: "chip_type",
                len: 32
            })
        );
        // Not UTF-8.
        let err = chip_info(&ok, &arr(&[0x39, 0xff, 0xfe]), &ok, 20).unwrap_err();
        assert!(
            matches!(
                err,
                BadChipInfo::NotUtf8 {
                    field: "chip_name",
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("39, ff, fe"), "{err}");
        // UTF-8 but not a name: a space, a control character, a non-ASCII letter.
        for bad in [&b"910 B3"[..], b"910\x07", "910\u{e9}".as_bytes()] {
            assert!(
                matches!(
                    chip_info(&ok, &arr(bad), &ok, 20),
                    Err(BadChipInfo::NotPrintable {
                        field: "chip_name",
                        ..
                    })
                ),
                "{bad:?}"
            );
        }
        assert_eq!(
            chip_info(&ok, &arr(b""), &ok, 20),
            Err(BadChipInfo::EmptyName)
        );
        // A slice without any NUL, even an empty one, is refused the same way.
        assert!(chip_info(&ok, b"", &ok, 20).is_err());
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
