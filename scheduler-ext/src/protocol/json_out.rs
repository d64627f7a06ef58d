//! JSON written straight into a byte buffer, for the answers that name thousands of nodes
//! (`filter`'s `NodeNames` and `FailedNodes`, `prioritize`'s `HostPriorityList`). Through
//! serde every string is escaped byte by byte, the keys of every entry included, and with all
//! 5,000 names in a request that was a tenth of the extender's CPU. Here a string that needs no
//! escape (every Kubernetes node name, every reason fumarole writes) is one copy, and a string
//! that does goes through serde_json's own escaping; tests compare the bytes with serde's.

use std::io::Write as _;

/// Appends `s` as a JSON string.
pub fn push_str(out: &mut Vec<u8>, s: &str) {
    if needs_escape(s) {
        // Writing into a Vec cannot fail, and a `str` always serializes.
        let _ = serde_json::to_writer(&mut *out, s);
        return;
    }
    out.reserve(s.len() + 2);
    out.push(b'"');
    out.extend_from_slice(s.as_bytes());
    out.push(b'"');
}

/// `s` as a JSON string, escaped once to be copied many times.
pub fn quoted(s: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len() + 2);
    push_str(&mut out, s);
    out
}

/// Appends `n` in decimal.
pub fn push_int(out: &mut Vec<u8>, n: i64) {
    match u8::try_from(n) {
        Ok(d) if d < 10 => out.push(b'0' + d),
        _ => {
            let _ = write!(out, "{n}");
        }
    }
}

/// Whether JSON needs `s` escaped: a quote, a backslash or a control character. (Other
/// non-ASCII text is written as it is, as serde_json does.) Written as one pass without early
/// exit so the compiler can check many bytes at a time.
fn needs_escape(s: &str) -> bool {
    s.bytes().fold(false, |bad, b| {
        bad | (b < 0x20) | (b == b'"') | (b == b'\\')
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[test]
    fn strings_come_out_as_serde_writes_them() {
        for s in [
            "",
            "gpu-node-0001.example.com",
            "needs 8 nvidia.com/gpu, 3 free",
            "a \"quoted\" name",
            "back\\slash",
            "tab\tand\nnewline\u{1}",
            "ünïcödé ノード",
        ] {
            let mut out = Vec::new();
            push_str(&mut out, s);
            assert_eq!(out, serde_json::to_vec(s).unwrap(), "{s:?}");
            assert_eq!(quoted(s), out);
        }
    }

    #[test]
    fn integers_come_out_as_serde_writes_them() {
        for n in [0, 7, 9, 10, 11, 100, -1, -10, i64::MAX, i64::MIN] {
            let mut out = Vec::new();
            push_int(&mut out, n);
            assert_eq!(out, serde_json::to_vec(&n).unwrap(), "{n}");
        }
    }
}
