//! CPU sets in the Linux list format (`"0-3,8,10-11"`), as sysfs, cgroups, the kubelet and
//! Volcano's `Numatopology` write them.
//!
//! [`CpuSet`] keeps the ids sorted and unique, parses with a clear error on bad input and
//! always formats in the canonical, shortest form, so two equal sets print the same string.

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Highest CPU id we accept when parsing (Linux `NR_CPUS` tops out at 8192); a larger number is
/// bad input, not a machine.
pub const MAX_CPU_ID: u32 = 1 << 16;

/// A set of logical CPU (processing unit) ids.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CpuSet(BTreeSet<u32>);

/// Why a cpuset string could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CpuSetError {
    /// A token is not a number or a `lo-hi` range.
    #[error("invalid cpuset {input:?}: {token:?} is not a CPU id or a lo-hi range")]
    BadToken { input: String, token: String },
    /// A range whose end is before its start.
    #[error("invalid cpuset {input:?}: range {token:?} ends before it starts")]
    ReversedRange { input: String, token: String },
    /// A CPU id above [`MAX_CPU_ID`].
    #[error("invalid cpuset {input:?}: CPU id {id} is above the limit {MAX_CPU_ID}")]
    TooLarge { input: String, id: u64 },
}

impl CpuSet {
    /// The empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Parses the Linux list format. Whitespace around tokens and trailing newlines or NUL
    /// bytes (as read from sysfs) are accepted; an empty string is the empty set.
    pub fn parse(input: &str) -> Result<Self, CpuSetError> {
        let mut set = BTreeSet::new();
        let trimmed = input.trim_matches(|c: char| c.is_whitespace() || c == '\0');
        for token in trimmed.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let bad = || CpuSetError::BadToken {
                input: input.to_owned(),
                token: token.to_owned(),
            };
            let id = |s: &str| -> Result<u32, CpuSetError> {
                let n: u64 = s.trim().parse().map_err(|_| bad())?;
                if n > u64::from(MAX_CPU_ID) {
                    return Err(CpuSetError::TooLarge {
                        input: input.to_owned(),
                        id: n,
                    });
                }
                u32::try_from(n).map_err(|_| bad())
            };
            match token.split_once('-') {
                None => {
                    set.insert(id(token)?);
                }
                Some((lo, hi)) => {
                    let (lo, hi) = (id(lo)?, id(hi)?);
                    if hi < lo {
                        return Err(CpuSetError::ReversedRange {
                            input: input.to_owned(),
                            token: token.to_owned(),
                        });
                    }
                    set.extend(lo..=hi);
                }
            }
        }
        Ok(Self(set))
    }

    /// Parses the hex mask format of sysfs `cpumap` / `local_cpus` files
    /// (`"00000000,0000ffff"`: comma-separated 32-bit words, most significant first).
    pub fn parse_mask(input: &str) -> Result<Self, CpuSetError> {
        let mut set = BTreeSet::new();
        let words: Vec<&str> = input
            .trim_matches(|c: char| c.is_whitespace() || c == '\0')
            .split(',')
            .collect();
        for (i, word) in words.iter().rev().enumerate() {
            let word = word.trim().trim_start_matches("0x");
            let bits = u32::from_str_radix(word, 16).map_err(|_| CpuSetError::BadToken {
                input: input.to_owned(),
                token: word.to_owned(),
            })?;
            for bit in 0..32u32 {
                if bits & (1 << bit) != 0 {
                    let id =
                        u64::try_from(i).unwrap_or(u64::MAX).saturating_mul(32) + u64::from(bit);
                    let id = u32::try_from(id)
                        .ok()
                        .filter(|id| *id <= MAX_CPU_ID)
                        .ok_or_else(|| CpuSetError::TooLarge {
                            input: input.to_owned(),
                            id,
                        })?;
                    set.insert(id);
                }
            }
        }
        Ok(Self(set))
    }

    pub fn insert(&mut self, cpu: u32) -> bool {
        self.0.insert(cpu)
    }

    pub fn contains(&self, cpu: u32) -> bool {
        self.0.contains(&cpu)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// CPU ids in ascending order.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.0.iter().copied()
    }

    pub fn union(&self, other: &CpuSet) -> CpuSet {
        CpuSet(self.0.union(&other.0).copied().collect())
    }

    pub fn intersection(&self, other: &CpuSet) -> CpuSet {
        CpuSet(self.0.intersection(&other.0).copied().collect())
    }

    pub fn difference(&self, other: &CpuSet) -> CpuSet {
        CpuSet(self.0.difference(&other.0).copied().collect())
    }

    pub fn is_subset(&self, other: &CpuSet) -> bool {
        self.0.is_subset(&other.0)
    }
}

impl FromIterator<u32> for CpuSet {
    fn from_iter<I: IntoIterator<Item = u32>>(iter: I) -> Self {
        Self(iter.into_iter().collect())
    }
}

impl FromStr for CpuSet {
    type Err = CpuSetError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

/// Canonical list format: ascending, ranges of three or more collapsed (`0-2`), pairs written
/// as `0-1` like the kernel does.
impl fmt::Display for CpuSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        let mut iter = self.0.iter().copied().peekable();
        while let Some(start) = iter.next() {
            let mut end = start;
            while iter.peek() == Some(&(end + 1)) {
                end += 1;
                iter.next();
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if start == end {
                write!(f, "{start}")?;
            } else {
                write!(f, "{start}-{end}")?;
            }
        }
        Ok(())
    }
}

impl Serialize for CpuSet {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for CpuSet {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        CpuSet::parse(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_and_formats_canonically() {
        let set = CpuSet::parse("8, 0-3,2,10-11\n\0").unwrap();
        assert_eq!(set.iter().collect::<Vec<_>>(), vec![0, 1, 2, 3, 8, 10, 11]);
        assert_eq!(set.to_string(), "0-3,8,10-11");
        assert_eq!(CpuSet::parse("").unwrap(), CpuSet::new());
        assert_eq!(CpuSet::new().to_string(), "");
    }

    #[test]
    fn rejects_bad_input_with_the_token() {
        let err = CpuSet::parse("0-3,x").unwrap_err();
        assert!(err.to_string().contains("\"x\""), "{err}");
        assert!(matches!(
            CpuSet::parse("5-2"),
            Err(CpuSetError::ReversedRange { .. })
        ));
        assert!(matches!(
            CpuSet::parse("0-99999999"),
            Err(CpuSetError::TooLarge { .. })
        ));
        assert!(matches!(
            CpuSet::parse("1--2"),
            Err(CpuSetError::BadToken { .. })
        ));
    }

    #[test]
    fn parses_sysfs_masks() {
        let set = CpuSet::parse_mask("00000000,00000000,0000ff00\n").unwrap();
        assert_eq!(set.to_string(), "8-15");
        let set = CpuSet::parse_mask("00000001,80000000").unwrap();
        assert_eq!(set.to_string(), "31-32");
        assert!(CpuSet::parse_mask("zz").is_err());
    }

    proptest! {
        #[test]
        fn display_then_parse_round_trips(ids in proptest::collection::btree_set(0u32..512, 0..64)) {
            let set: CpuSet = ids.into_iter().collect();
            prop_assert_eq!(CpuSet::parse(&set.to_string()).unwrap(), set);
        }

        #[test]
        fn parse_never_panics(s in "\\PC{0,40}") {
            let _ = CpuSet::parse(&s);
            let _ = CpuSet::parse_mask(&s);
        }
    }
}
