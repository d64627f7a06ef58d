//! Pressure stall information (PSI) as the kernel writes it in `/proc/pressure/*` and cgroup v2
//! `*.pressure` files: [`parse_psi`] reads the text into a [`Psi`]; the cgroup layer reads the
//! files (`crate::cgroup::psi_files`). Which file the eviction rules want, and why, is in
//! [`crate::rules::evict`].

use std::path::PathBuf;

/// One line of a pressure file: percents of wall time over 10 s, 60 s and 300 s, and the total
/// stall time in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct PsiLine {
    pub avg10: f64,
    pub avg60: f64,
    pub avg300: f64,
    pub total_us: u64,
}

/// A `/proc/pressure/*` or cgroup `*.pressure` file.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Psi {
    /// Some task stalled.
    pub some: PsiLine,
    /// All non-idle tasks stalled at once; missing for CPU before Linux 5.13.
    pub full: Option<PsiLine>,
}

impl Psi {
    /// The worse of two readings, field by field: for several cgroups (the online pods), the
    /// worst one speaks for them.
    pub fn worst(self, other: Psi) -> Psi {
        fn line(a: PsiLine, b: PsiLine) -> PsiLine {
            PsiLine {
                avg10: a.avg10.max(b.avg10),
                avg60: a.avg60.max(b.avg60),
                avg300: a.avg300.max(b.avg300),
                total_us: a.total_us.max(b.total_us),
            }
        }
        Psi {
            some: line(self.some, other.some),
            full: match (self.full, other.full) {
                (Some(a), Some(b)) => Some(line(a, b)),
                (a, b) => a.or(b),
            },
        }
    }
}

/// Why a pressure file could not be used: [`parse_psi`] returns `Format`, the cgroup layer's
/// reader `Read` as well.
#[derive(Debug, thiserror::Error)]
pub enum PsiError {
    /// Not readable: no PSI in the kernel (`CONFIG_PSI` off, or `psi=0`: the read fails with
    /// EOPNOTSUPP), a cgroup v1 hierarchy without pressure files, or a cgroup that is gone.
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Readable but not in the `some avg10=.. avg60=.. avg300=.. total=..` format.
    #[error("{what}: {reason}")]
    Format { what: String, reason: String },
}

/// Parses a pressure file's text. Tolerant: unknown keys and lines are skipped, a missing `full`
/// line is `None`; a missing `some` line or a missing or non-numeric field is an error.
pub fn parse_psi(text: &str) -> Result<Psi, PsiError> {
    let bad = |reason: String| PsiError::Format {
        what: "pressure file".into(),
        reason,
    };
    let (mut some, mut full) = (None, None);
    for line in text.lines() {
        let mut words = line.split_whitespace();
        let slot = match words.next() {
            Some("some") => &mut some,
            Some("full") => &mut full,
            _ => continue,
        };
        let (mut avg10, mut avg60, mut avg300, mut total) = (None, None, None, None);
        for word in words {
            let Some((k, v)) = word.split_once('=') else {
                return Err(bad(format!("{word:?} is not key=value in {line:?}")));
            };
            let float = || {
                v.parse::<f64>()
                    .ok()
                    .filter(|f| f.is_finite() && *f >= 0.0)
                    .ok_or_else(|| bad(format!("{k}={v:?} is not a percent in {line:?}")))
            };
            match k {
                "avg10" => avg10 = Some(float()?),
                "avg60" => avg60 = Some(float()?),
                "avg300" => avg300 = Some(float()?),
                "total" => {
                    total = Some(
                        v.parse::<u64>()
                            .map_err(|_| bad(format!("total={v:?} is not a count in {line:?}")))?,
                    )
                }
                _ => {}
            }
        }
        let need =
            |f: Option<f64>, k: &str| f.ok_or_else(|| bad(format!("{k} missing in {line:?}")));
        *slot = Some(PsiLine {
            avg10: need(avg10, "avg10")?,
            avg60: need(avg60, "avg60")?,
            avg300: need(avg300, "avg300")?,
            total_us: total.ok_or_else(|| bad(format!("total missing in {line:?}")))?,
        });
    }
    let some = some.ok_or_else(|| bad("no \"some\" line".into()))?;
    Ok(Psi { some, full })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    /// `/proc/pressure/*` of the machine these tests were written on (Linux 6.18).
    const HOST_CPU: &str = "some avg10=0.00 avg60=1.47 avg300=9.91 total=2986686122\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n";
    const HOST_MEMORY: &str = "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n";
    const HOST_IO: &str = "some avg10=0.00 avg60=0.12 avg300=0.90 total=204843504\nfull avg10=0.00 avg60=0.06 avg300=0.51 total=121325417\n";
    /// Linux before 5.13: CPU has no `full` line.
    const OLD_CPU: &str = "some avg10=12.50 avg60=3.02 avg300=0.80 total=77123\n";
    /// A cgroup v2 `memory.pressure` of a pod under reclaim.
    const CGROUP_MEMORY: &str = "some avg10=41.27 avg60=20.03 avg300=5.10 total=9912345\nfull avg10=23.81 avg60=11.40 avg300=2.96 total=5123456\n";

    #[test]
    fn parses_pressure_files() {
        let cpu = parse_psi(HOST_CPU).unwrap();
        assert_eq!(
            cpu.some,
            PsiLine {
                avg10: 0.0,
                avg60: 1.47,
                avg300: 9.91,
                total_us: 2_986_686_122
            }
        );
        assert_eq!(cpu.full.unwrap().total_us, 0);
        assert_eq!(parse_psi(HOST_MEMORY).unwrap().some.avg10, 0.0);
        assert_eq!(parse_psi(HOST_IO).unwrap().full.unwrap().avg300, 0.51);
        let old = parse_psi(OLD_CPU).unwrap();
        assert_eq!(old.some.avg10, 12.5);
        assert_eq!(old.full, None);
        let cg = parse_psi(CGROUP_MEMORY).unwrap();
        assert_eq!(cg.full.unwrap().avg10, 23.81);
        // Unknown keys and lines are skipped; no trailing newline is fine.
        let odd =
            parse_psi("some avg10=1.00 avg60=2.00 avg300=3.00 total=4 new=9\nwhat ever\n").unwrap();
        assert_eq!(odd.some.avg300, 3.0);
    }

    #[test]
    fn bad_pressure_files_are_errors() {
        let table = [
            ("", "pressure file: no \"some\" line"),
            (
                "full avg10=0.00 avg60=0.00 avg300=0.00 total=0",
                "pressure file: no \"some\" line",
            ),
            (
                "some avg10=0.00 avg60=0.00 total=0",
                "pressure file: avg300 missing in \"some avg10=0.00 avg60=0.00 total=0\"",
            ),
            (
                "some avg10=x avg60=0.00 avg300=0.00 total=0",
                "pressure file: avg10=\"x\" is not a percent in \"some avg10=x avg60=0.00 avg300=0.00 total=0\"",
            ),
            (
                "some avg10=1 avg60=0.00 avg300=0.00 total=-3",
                "pressure file: total=\"-3\" is not a count in \"some avg10=1 avg60=0.00 avg300=0.00 total=-3\"",
            ),
            (
                "some avg10 avg60=0.00",
                "pressure file: \"avg10\" is not key=value in \"some avg10 avg60=0.00\"",
            ),
        ];
        for (text, want) in table {
            assert_eq!(parse_psi(text).unwrap_err().to_string(), want, "{text:?}");
        }
    }

    #[test]
    fn worst_of_several_cgroups() {
        let a = parse_psi(OLD_CPU).unwrap();
        let b = parse_psi(HOST_CPU).unwrap();
        let w = a.worst(b);
        assert_eq!(w.some.avg10, 12.5);
        assert_eq!(w.some.avg300, 9.91);
        assert_eq!(w.some.total_us, 2_986_686_122);
        assert_eq!(w.full, b.full);
    }
}
