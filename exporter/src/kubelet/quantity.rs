//! Kubernetes quantity strings, for the two resources the kubelet reserves: CPU (to
//! millicores) and memory (to bytes). Enough of `resource.Quantity` for `kubeReserved`,
//! `systemReserved` and `evictionHard`.

/// Why a quantity could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{value:?} is not a valid quantity")]
pub struct QuantityError {
    pub value: String,
}

const SUFFIXES: &[(&str, f64)] = &[
    ("Ki", 1024.0),
    ("Mi", 1048576.0),
    ("Gi", 1073741824.0),
    ("Ti", 1099511627776.0),
    ("Pi", 1125899906842624.0),
    ("Ei", 1152921504606846976.0),
    ("n", 1e-9),
    ("u", 1e-6),
    ("m", 1e-3),
    ("k", 1e3),
    ("M", 1e6),
    ("G", 1e9),
    ("T", 1e12),
    ("P", 1e15),
    ("E", 1e18),
];

fn parse(value: &str) -> Result<f64, QuantityError> {
    let err = || QuantityError {
        value: value.to_owned(),
    };
    let v = value.trim();
    let (number, multiplier) = SUFFIXES
        .iter()
        .find_map(|(s, m)| v.strip_suffix(s).map(|n| (n, *m)))
        .unwrap_or((v, 1.0));
    let n: f64 = number.parse().map_err(|_| err())?;
    let out = n * multiplier;
    if !out.is_finite() || out < 0.0 {
        return Err(err());
    }
    Ok(out)
}

/// CPU quantity (`"500m"`, `"2"`, `"1.5"`) in millicores, rounded up.
pub fn cpu_millis(value: &str) -> Result<u64, QuantityError> {
    Ok((parse(value)? * 1000.0).ceil() as u64)
}

/// Memory quantity (`"1Gi"`, `"100M"`, `"1024"`) in bytes, rounded up.
pub fn bytes(value: &str) -> Result<u64, QuantityError> {
    Ok(parse(value)?.ceil() as u64)
}

/// Millicores as a quantity string: whole CPUs without a suffix.
pub fn format_cpu(millis: u64) -> String {
    if millis.is_multiple_of(1000) {
        (millis / 1000).to_string()
    } else {
        format!("{millis}m")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cpu_and_memory() {
        assert_eq!(cpu_millis("500m").unwrap(), 500);
        assert_eq!(cpu_millis("2").unwrap(), 2000);
        assert_eq!(cpu_millis("1.5").unwrap(), 1500);
        assert_eq!(bytes("1Gi").unwrap(), 1 << 30);
        assert_eq!(bytes("100M").unwrap(), 100_000_000);
        assert_eq!(bytes("1024").unwrap(), 1024);
        assert_eq!(format_cpu(1500), "1500m");
        assert_eq!(format_cpu(2000), "2");
        for bad in ["", "abc", "-1", "1Xi", "NaN"] {
            assert!(cpu_millis(bad).is_err(), "{bad}");
        }
    }
}
