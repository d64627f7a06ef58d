//! The topology override file: facts the PCI tree and vendor libraries do not give, written
//! by the operator (or shipped with a fixture). YAML or JSON:
//!
//! ```yaml
//! superNode: rack-7                 # optional super-node id
//! models:                           # optional model names, by PCI bus id or vendor:device
//!   "9999:4000": MetaX C500
//! linkZones:                        # optional: devices in one zone share a fabric
//!   class: metaxLink                # metaxLink | hccs | fabric | nvlink
//!   nvlinkCount: 0                  # lanes, only for class nvlink
//!   zones:
//!     - ["0000:1b:00.0", "0000:1c:00.0"]
//! matrix:                           # optional explicit classes, applied last
//!   devices: ["0000:1b:00.0", "0000:1c:00.0"]
//!   classes:                        # legend names of `discover --format matrix`
//!     - [X, MXL]
//!     - [MXL, X]
//! ```
//!
//! Devices are named by PCI bus id (`lspci -D`), which does not change across reboots.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use fumarole_topology::LinkClass;
use serde::Deserialize;

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Overrides {
    #[serde(default)]
    pub super_node: Option<String>,
    #[serde(default)]
    pub models: BTreeMap<String, String>,
    #[serde(default)]
    pub link_zones: Option<LinkZones>,
    #[serde(default)]
    pub matrix: Option<ExplicitMatrix>,
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LinkZones {
    pub class: ZoneClass,
    #[serde(default)]
    pub nvlink_count: u32,
    pub zones: Vec<Vec<String>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ZoneClass {
    MetaxLink,
    Hccs,
    Fabric,
    Nvlink,
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExplicitMatrix {
    pub devices: Vec<String>,
    pub classes: Vec<Vec<String>>,
}

/// What is wrong with an override file; always names the file.
#[derive(Debug, thiserror::Error)]
pub enum OverrideError {
    #[error("override file {path}: {reason}")]
    Read {
        path: PathBuf,
        reason: std::io::Error,
    },
    #[error("override file {path}: {message}")]
    Invalid { path: PathBuf, message: String },
}

impl Overrides {
    /// Reads and checks the file's own consistency (device references are checked against
    /// the node by [`Overrides::link_classes`]).
    pub fn load(path: &Path) -> Result<Self, OverrideError> {
        let text = std::fs::read_to_string(path).map_err(|reason| OverrideError::Read {
            path: path.to_path_buf(),
            reason,
        })?;
        Self::parse(&text).map_err(|message| OverrideError::Invalid {
            path: path.to_path_buf(),
            message,
        })
    }

    /// An override file's text, checked for its own consistency as [`Overrides::load`] does.
    pub fn parse(text: &str) -> Result<Self, String> {
        let parsed: Overrides = serde_norway::from_str(text).map_err(|e| e.to_string())?;
        if let Some(m) = &parsed.matrix {
            let n = m.devices.len();
            if m.classes.len() != n || m.classes.iter().any(|row| row.len() != n) {
                return Err(format!(
                    "matrix: {n} devices need {n} rows of {n} classes each"
                ));
            }
            for (i, row) in m.classes.iter().enumerate() {
                for (j, cell) in row.iter().enumerate() {
                    if i == j {
                        continue;
                    }
                    let class =
                        parse_short_class(cell).map_err(|e| format!("matrix[{i}][{j}]: {e}"))?;
                    let mirror = parse_short_class(&m.classes[j][i])
                        .map_err(|e| format!("matrix[{j}][{i}]: {e}"))?;
                    if class != mirror {
                        return Err(format!(
                            "matrix is not symmetric: [{i}][{j}] is {cell} but [{j}][{i}] is {}",
                            m.classes[j][i]
                        ));
                    }
                }
            }
        }
        if let Some(z) = &parsed.link_zones
            && z.class == ZoneClass::Nvlink
            && z.nvlink_count == 0
        {
            return Err("linkZones: class nvlink needs nvlinkCount > 0".into());
        }
        Ok(parsed)
    }

    /// Pair classes this file sets, by device position in `bus_ids`. An unknown bus id is an
    /// error: a typo must not silently drop a link.
    pub fn link_classes(
        &self,
        path: &Path,
        bus_ids: &[String],
    ) -> Result<Vec<(usize, usize, LinkClass)>, OverrideError> {
        let position = |id: &str| -> Result<usize, OverrideError> {
            let want = id.trim().to_ascii_lowercase();
            bus_ids
                .iter()
                .position(|b| *b == want)
                .ok_or_else(|| OverrideError::Invalid {
                    path: path.to_path_buf(),
                    message: format!(
                        "device {id:?} is not an accelerator on this node (known: {})",
                        bus_ids.join(", ")
                    ),
                })
        };
        let mut out = Vec::new();
        if let Some(z) = &self.link_zones {
            let class = match z.class {
                ZoneClass::MetaxLink => LinkClass::MetaxLink,
                ZoneClass::Hccs => LinkClass::Hccs,
                ZoneClass::Fabric => LinkClass::Fabric,
                ZoneClass::Nvlink => LinkClass::Nvlink {
                    count: z.nvlink_count,
                },
            };
            for zone in &z.zones {
                let members = zone
                    .iter()
                    .map(|id| position(id))
                    .collect::<Result<Vec<_>, _>>()?;
                for (i, a) in members.iter().enumerate() {
                    for b in &members[i + 1..] {
                        out.push((*a, *b, class));
                    }
                }
            }
        }
        if let Some(m) = &self.matrix {
            let members = m
                .devices
                .iter()
                .map(|id| position(id))
                .collect::<Result<Vec<_>, _>>()?;
            for (i, row) in m.classes.iter().enumerate() {
                for (j, cell) in row.iter().enumerate().skip(i + 1) {
                    // Checked in `load`.
                    if let Ok(class) = parse_short_class(cell) {
                        out.push((members[i], members[j], class));
                    }
                }
            }
        }
        Ok(out)
    }

    /// The model name for a device, by bus id first, then `vendor:device` in hex.
    pub fn model_for(&self, bus_id: &str, vendor: u16, device: u16) -> Option<&str> {
        self.models
            .get(bus_id)
            .or_else(|| self.models.get(&format!("{vendor:04x}:{device:04x}")))
            .map(String::as_str)
    }
}

/// Parses a legend name (`NV18`, `HCCS`, `MXL`, `FAB`, `PIX`, `PXB`, `PHB`, `NODE`, `SYS`).
pub fn parse_short_class(s: &str) -> Result<LinkClass, String> {
    let s = s.trim();
    Ok(match s.to_ascii_uppercase().as_str() {
        "HCCS" => LinkClass::Hccs,
        "MXL" => LinkClass::MetaxLink,
        "FAB" => LinkClass::Fabric,
        "PIX" => LinkClass::PcieSwitch,
        "PXB" => LinkClass::PcieMultiSwitch,
        "PHB" => LinkClass::PcieHostBridge,
        "NODE" => LinkClass::SameNuma,
        "SYS" => LinkClass::CrossNuma,
        up => match up.strip_prefix("NV").map(str::parse::<u32>) {
            Some(Ok(count)) if count > 0 => LinkClass::Nvlink { count },
            _ => {
                return Err(format!(
                    "{s:?} is not a link class (NV#, HCCS, MXL, FAB, PIX, PXB, PHB, NODE, SYS)"
                ));
            }
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(text: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("topology.yaml");
        std::fs::write(&path, text).unwrap();
        (dir, path)
    }

    #[test]
    fn zones_and_matrix_become_pair_classes() {
        let (_d, path) = write(
            "superNode: rack-7\nmodels: {\"9999:4000\": MetaX C500}\nlinkZones:\n  class: metaxLink\n  zones: [[\"0000:01:00.0\", \"0000:02:00.0\"]]\nmatrix:\n  devices: [\"0000:02:00.0\", \"0000:03:00.0\"]\n  classes: [[X, NV4], [nv4, X]]\n",
        );
        let o = Overrides::load(&path).unwrap();
        assert_eq!(o.super_node.as_deref(), Some("rack-7"));
        assert_eq!(
            o.model_for("0000:01:00.0", 0x9999, 0x4000),
            Some("MetaX C500")
        );
        let ids: Vec<String> = ["0000:01:00.0", "0000:02:00.0", "0000:03:00.0"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let classes = o.link_classes(&path, &ids).unwrap();
        assert_eq!(
            classes,
            vec![
                (0, 1, LinkClass::MetaxLink),
                (1, 2, LinkClass::Nvlink { count: 4 })
            ]
        );
    }

    #[test]
    fn bad_files_name_the_path_and_the_problem() {
        let cases = [
            ("linkZones: {class: warp, zones: []}", "unknown variant"),
            ("matrix: {devices: [a, b], classes: [[X]]}", "2 rows"),
            (
                "matrix: {devices: [a, b], classes: [[X, PIX], [SYS, X]]}",
                "not symmetric",
            ),
            (
                "matrix: {devices: [a, b], classes: [[X, WARP], [WARP, X]]}",
                "not a link class",
            ),
            ("linkZones: {class: nvlink, zones: []}", "nvlinkCount"),
            ("colour: blue", "unknown field"),
            ("{{{{", ""),
        ];
        for (text, want) in cases {
            let (_d, path) = write(text);
            let err = Overrides::load(&path).unwrap_err().to_string();
            assert!(err.contains(&path.display().to_string()), "{err}");
            assert!(err.contains(want), "{text}: {err}");
        }
        let err = Overrides::load(Path::new("/nonexistent/topology.yaml")).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/topology.yaml"));
    }

    #[test]
    fn unknown_devices_are_errors() {
        let (_d, path) = write("linkZones: {class: hccs, zones: [[\"0000:09:00.0\"]]}");
        let o = Overrides::load(&path).unwrap();
        let err = o.link_classes(&path, &["0000:01:00.0".into()]).unwrap_err();
        assert!(err.to_string().contains("0000:09:00.0"), "{err}");
    }
}
