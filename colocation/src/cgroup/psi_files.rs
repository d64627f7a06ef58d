//! Pressure (PSI) files read from the kernel: [`read_psi`] reads and parses one
//! (`/proc/pressure/memory`, a cgroup v2 `cpu.pressure`), [`PsiSource`] reads the same file every
//! round and logs its failures once. The text format is [`crate::rules::psi`].

use std::path::{Path, PathBuf};

use crate::rules::psi::{Psi, PsiError, parse_psi};

/// Reads and parses a pressure file.
pub fn read_psi(path: &Path) -> Result<Psi, PsiError> {
    let text = std::fs::read_to_string(path).map_err(|source| PsiError::Read {
        path: path.to_owned(),
        source,
    })?;
    parse_psi(&text).map_err(|e| match e {
        PsiError::Format { reason, .. } => PsiError::Format {
            what: path.display().to_string(),
            reason,
        },
        other => other,
    })
}

/// A pressure file read every round: `None` when it cannot be used, with the reason logged as a
/// warning the first time and at debug level while it stays so (a kernel without PSI would
/// otherwise warn every 10 s), and an info line when it works again.
#[derive(Debug)]
pub struct PsiSource {
    path: PathBuf,
    failing: bool,
}

impl PsiSource {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            failing: false,
        }
    }

    pub fn read(&mut self) -> Option<Psi> {
        match read_psi(&self.path) {
            Ok(psi) => {
                if self.failing {
                    tracing::info!(path = %self.path.display(), "pressure file readable again");
                    self.failing = false;
                }
                Some(psi)
            }
            Err(e) => {
                if self.failing {
                    tracing::debug!(error = %e, "no pressure signal this round");
                } else {
                    tracing::warn!(error = %e, "no pressure signal; eviction uses watermarks only");
                    self.failing = true;
                }
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    /// Linux before 5.13: CPU has no `full` line.
    const OLD_CPU: &str = "some avg10=12.50 avg60=3.02 avg300=0.80 total=77123\n";

    #[test]
    fn reads_this_machines_pressure_files_when_present() {
        for name in ["cpu", "memory", "io"] {
            let path = Path::new("/proc/pressure").join(name);
            if !path.exists() {
                continue;
            }
            match read_psi(&path) {
                Ok(psi) => {
                    assert!((0.0..=100.0).contains(&psi.some.avg10), "{name}: {psi:?}");
                    if name == "memory" {
                        assert!(psi.full.is_some());
                    }
                }
                // psi=0 on the kernel command line: the file exists but reading fails.
                Err(PsiError::Read { .. }) => {}
                Err(e) => panic!("{name}: {e}"),
            }
        }
    }

    #[test]
    fn unreadable_pressure_file_is_none() {
        let dir = tempfile::tempdir().unwrap();
        let mut missing = PsiSource::new(dir.path().join("cpu.pressure"));
        assert_eq!(missing.read(), None);
        assert_eq!(missing.read(), None);
        let e = read_psi(&dir.path().join("cpu.pressure")).unwrap_err();
        assert!(e.to_string().starts_with("reading "), "{e}");
        std::fs::write(dir.path().join("cpu.pressure"), OLD_CPU).unwrap();
        assert_eq!(missing.read().unwrap().some.avg10, 12.5);
        std::fs::write(dir.path().join("memory.pressure"), "garbage").unwrap();
        let e = read_psi(&dir.path().join("memory.pressure")).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "{}: no \"some\" line",
                dir.path().join("memory.pressure").display()
            )
        );
    }
}
