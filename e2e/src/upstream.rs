//! Where the upstream binaries and Volcano's CRDs are.
//!
//! `e2e/build-upstream.sh` builds them into a cache keyed by the pinned
//! versions and prints `FUMAROLE_UPSTREAM_DIR=<dir>` as its last line. If that
//! variable is already set (CI exports it), it is used as is; otherwise the
//! script is run once per test process (a warm run takes well under a second).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use anyhow::{Context, Result, anyhow, bail};

/// Environment variable naming the directory with `bin/` and `crds/volcano/`.
pub const ENV_DIR: &str = "FUMAROLE_UPSTREAM_DIR";

/// The binaries every cache directory holds.
pub const BINARIES: &[&str] = &[
    "etcd",
    "kube-apiserver",
    "kube-scheduler",
    "kubelet-dm",
    "kubelet-node",
    "vc-scheduler",
    "vc-controller-manager",
];

/// A built upstream cache directory.
#[derive(Debug, Clone)]
pub struct Upstream {
    dir: PathBuf,
}

static UPSTREAM: OnceLock<std::result::Result<Upstream, String>> = OnceLock::new();

impl Upstream {
    /// The upstream build, from `$FUMAROLE_UPSTREAM_DIR` or by running the build script.
    pub fn get() -> Result<&'static Upstream> {
        UPSTREAM
            .get_or_init(|| Self::locate().map_err(|e| format!("{e:#}")))
            .as_ref()
            .map_err(|e| anyhow!("{e}"))
    }

    fn locate() -> Result<Upstream> {
        let dir = match std::env::var_os(ENV_DIR) {
            Some(d) if !d.is_empty() => PathBuf::from(d),
            _ => run_build_script()?,
        };
        let up = Upstream { dir };
        for b in BINARIES {
            let p = up.bin(b);
            if !p.is_file() {
                bail!("{} is missing; run e2e/build-upstream.sh", p.display());
            }
        }
        Ok(up)
    }

    /// The cache directory itself.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Path of one binary, e.g. `bin("kube-apiserver")`.
    pub fn bin(&self, name: &str) -> PathBuf {
        self.dir.join("bin").join(name)
    }

    /// Volcano's CRDs as shipped in the pinned Volcano module.
    pub fn volcano_crds(&self) -> PathBuf {
        self.dir.join("crds").join("volcano")
    }

    /// Another Volcano release's controller manager and CRDs (`version` like `v1.14.1`), which
    /// the build script builds from `e2e/upstream/volcano-v<major>.<minor>/`.
    pub fn volcano_release(&self, version: &str) -> Result<VolcanoRelease> {
        let dir = self.dir.join(format!("volcano-{version}"));
        let release = VolcanoRelease {
            version: version.to_string(),
            controller_manager: dir.join("bin").join("vc-controller-manager"),
            crds: dir.join("crds"),
        };
        if !release.controller_manager.is_file() || !release.crds.is_dir() {
            bail!(
                "Volcano {version} is not in {}: it needs a module in e2e/upstream/volcano-v<major>.<minor>/ \
                 and a run of e2e/build-upstream.sh",
                dir.display()
            );
        }
        Ok(release)
    }
}

/// A Volcano release other than the pinned one ([`Upstream::volcano_release`]).
#[derive(Debug, Clone)]
pub struct VolcanoRelease {
    /// Its tag, e.g. `v1.14.1`.
    pub version: String,
    /// Its `vc-controller-manager`.
    pub controller_manager: PathBuf,
    /// The directory of its CRDs (`*.yaml`), as its module ships them.
    pub crds: PathBuf,
}

/// The `e2e/` directory of this repository.
pub fn e2e_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn run_build_script() -> Result<PathBuf> {
    let script = e2e_dir().join("build-upstream.sh");
    let out = Command::new("bash")
        .arg(&script)
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    if !out.status.success() {
        bail!("{} failed: {}", script.display(), out.status);
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix(&format!("{ENV_DIR}=")))
        .ok_or_else(|| anyhow!("{} printed no {ENV_DIR}= line", script.display()))?;
    Ok(PathBuf::from(line.trim()))
}
