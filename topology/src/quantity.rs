//! Kubernetes quantity strings (`resource.Quantity`), read exactly: `500m`, `2`, `1.5`, `1Gi`,
//! `100M`, `1e3`. The one parser of the project: the exporter reads the kubelet's reserved
//! amounts with it, the agent pods' requests, the scheduler extension CPU and device counts.
//!
//! The value is kept as an exact fraction (no floating point), so `0.1` CPU is 100 millicores and
//! `1Ei` is 2^60 bytes, not a neighbour of either. Amounts are never negative here: a negative
//! quantity is valid Kubernetes syntax but no resource amount, so it is an error.
//!
//! Syntax, as `k8s.io/apimachinery/pkg/api/resource`: an optional `+`, digits with at most one
//! `.` (at least one digit), then one suffix: binary `Ki Mi Gi Ti Pi Ei`, decimal
//! `n u m k M G T P E`, or a decimal exponent `e<int>` / `E<int>`.

/// Why a quantity could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    /// Not quantity syntax (or a negative amount).
    #[error("{0:?} is not a valid quantity")]
    Syntax(String),
    /// Syntax is fine but the amount does not fit in 64 bits.
    #[error("{0:?} is too large")]
    TooLarge(String),
    /// A count (devices) that is not a whole number.
    #[error("{0:?} is not a whole number")]
    NotWhole(String),
}

/// `value = numerator / denominator`, both exact.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Exact {
    numerator: u128,
    denominator: u128,
}

const BINARY: &[(&str, u32)] = &[
    ("Ki", 10),
    ("Mi", 20),
    ("Gi", 30),
    ("Ti", 40),
    ("Pi", 50),
    ("Ei", 60),
];

const DECIMAL: &[(&str, i32)] = &[
    ("n", -9),
    ("u", -6),
    ("m", -3),
    ("", 0),
    ("k", 3),
    ("M", 6),
    ("G", 9),
    ("T", 12),
    ("P", 15),
    ("E", 18),
];

/// Largest power of ten kept exact (10^38 < 2^128); values are exact to 38 decimal places.
const MAX_EXPONENT: i32 = 38;

fn parse(value: &str) -> Result<Exact, QuantityError> {
    let syntax = || QuantityError::Syntax(value.to_owned());
    let too_large = || QuantityError::TooLarge(value.to_owned());
    let v = value.trim();
    let v = v.strip_prefix('+').unwrap_or(v);
    let split = v
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(v.len());
    let (number, suffix) = v.split_at(split);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if (whole.is_empty() && fraction.is_empty()) || fraction.contains('.') {
        return Err(syntax());
    }
    let mut numerator: u128 = 0;
    for d in whole.bytes().chain(fraction.bytes()) {
        numerator = numerator
            .checked_mul(10)
            .and_then(|n| n.checked_add(u128::from(d - b'0')))
            .ok_or_else(too_large)?;
    }
    let mut exponent10 =
        -i32::try_from(fraction.len()).map_err(|_| QuantityError::TooLarge(value.to_owned()))?;
    let mut shift2 = 0u32;
    if let Some((_, bits)) = BINARY.iter().find(|(s, _)| *s == suffix) {
        shift2 = *bits;
    } else if let Some((_, e)) = DECIMAL.iter().find(|(s, _)| *s == suffix) {
        exponent10 += e;
    } else if let Some(e) = suffix
        .strip_prefix(['e', 'E'])
        .and_then(|e| e.parse::<i32>().ok())
    {
        exponent10 = exponent10.checked_add(e).ok_or_else(too_large)?;
    } else {
        return Err(syntax());
    }
    if exponent10 > MAX_EXPONENT && numerator == 0 {
        exponent10 = 0;
    }
    // Below 10^-38 only rounding up matters: ⌈⌈a/b⌉/c⌉ = ⌈a/(b·c)⌉.
    while exponent10 < -MAX_EXPONENT {
        numerator = numerator.div_ceil(10);
        exponent10 += 1;
    }
    let mut denominator: u128 = 1;
    if exponent10 >= 0 {
        if exponent10 > MAX_EXPONENT {
            return Err(too_large());
        }
        numerator = numerator
            .checked_mul(10u128.pow(exponent10.unsigned_abs()))
            .ok_or_else(too_large)?;
    } else {
        denominator = 10u128.pow(exponent10.unsigned_abs());
    }
    numerator = numerator
        .checked_mul(1u128 << shift2)
        .ok_or_else(too_large)?;
    Ok(Exact {
        numerator,
        denominator,
    })
}

/// `⌈value · scale⌉`, checked against 64 bits.
fn ceil_scaled(value: &str, scale: u128) -> Result<u64, QuantityError> {
    let q = parse(value)?;
    let scaled = q
        .numerator
        .checked_mul(scale)
        .ok_or_else(|| QuantityError::TooLarge(value.to_owned()))?;
    u64::try_from(scaled.div_ceil(q.denominator))
        .map_err(|_| QuantityError::TooLarge(value.to_owned()))
}

/// A CPU quantity (`"500m"`, `"2"`, `"1.5"`) in millicores, rounded up (as the kubelet does
/// for `cpu.shares`).
pub fn cpu_millis(value: &str) -> Result<u64, QuantityError> {
    ceil_scaled(value, 1000)
}

/// A quantity in its base unit, rounded up: bytes of memory (`"1Gi"`, `"100M"`), or the value
/// of a batch resource (`kubernetes.io/batch-cpu` is millicores written as a plain number).
pub fn units(value: &str) -> Result<u64, QuantityError> {
    ceil_scaled(value, 1)
}

/// A count of devices: a whole number (`"2"`, `"1k"`); `"500m"` or `"1.5"` is an error.
pub fn whole(value: &str) -> Result<u64, QuantityError> {
    let q = parse(value)?;
    if q.numerator % q.denominator != 0 {
        return Err(QuantityError::NotWhole(value.to_owned()));
    }
    u64::try_from(q.numerator / q.denominator)
        .map_err(|_| QuantityError::TooLarge(value.to_owned()))
}

/// Millicores as a quantity string: whole CPUs without a suffix (`2`, `1500m`).
pub fn format_cpu(millis: u64) -> String {
    if millis.is_multiple_of(1000) {
        (millis / 1000).to_string()
    } else {
        format!("{millis}m")
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn cpu_memory_and_counts() {
        assert_eq!(cpu_millis("500m").unwrap(), 500);
        assert_eq!(cpu_millis("2").unwrap(), 2000);
        assert_eq!(cpu_millis("1.5").unwrap(), 1500);
        assert_eq!(cpu_millis(" 0.1 ").unwrap(), 100);
        assert_eq!(cpu_millis("0.3").unwrap(), 300);
        assert_eq!(cpu_millis("100u").unwrap(), 1);
        assert_eq!(cpu_millis("+1").unwrap(), 1000);
        assert_eq!(cpu_millis(".5").unwrap(), 500);
        assert_eq!(cpu_millis("5.").unwrap(), 5000);
        assert_eq!(units("1Gi").unwrap(), 1 << 30);
        assert_eq!(units("1Ei").unwrap(), 1 << 60);
        assert_eq!(units("100M").unwrap(), 100_000_000);
        assert_eq!(units("1024").unwrap(), 1024);
        assert_eq!(units("1.5Ki").unwrap(), 1536);
        assert_eq!(units("1e3").unwrap(), 1000);
        assert_eq!(units("1E3").unwrap(), 1000);
        assert_eq!(units("2E").unwrap(), 2_000_000_000_000_000_000);
        assert_eq!(units("1e-3").unwrap(), 1);
        assert_eq!(units("0").unwrap(), 0);
        assert_eq!(units("0e99").unwrap(), 0);
        assert_eq!(units("1e-99").unwrap(), 1);
        assert_eq!(whole("2").unwrap(), 2);
        assert_eq!(whole("1k").unwrap(), 1000);
        assert_eq!(whole("2000m").unwrap(), 2);
        assert_eq!(format_cpu(1500), "1500m");
        assert_eq!(format_cpu(2000), "2");
    }

    #[test]
    fn bad_values_are_named() {
        for bad in [
            "", "abc", "-1", "1Xi", "NaN", "1..2", ".", "1K", "1 Gi", "e3", "1e",
        ] {
            assert!(
                matches!(cpu_millis(bad), Err(QuantityError::Syntax(ref v)) if v == bad),
                "{bad}: {:?}",
                cpu_millis(bad)
            );
        }
        assert!(matches!(units("20Ei"), Err(QuantityError::TooLarge(_))));
        assert!(matches!(units("1e40"), Err(QuantityError::TooLarge(_))));
        assert!(matches!(
            units(&"9".repeat(60)),
            Err(QuantityError::TooLarge(_))
        ));
        assert!(matches!(whole("500m"), Err(QuantityError::NotWhole(_))));
        assert!(matches!(whole("1.5"), Err(QuantityError::NotWhole(_))));
        assert_eq!(
            whole("x").unwrap_err().to_string(),
            "\"x\" is not a valid quantity"
        );
    }
}
