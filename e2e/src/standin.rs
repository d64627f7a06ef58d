//! The vendor-library stand-ins' state files (`fumarole-standin-nvml`, `fumarole-standin-dcmi`:
//! cdylibs the agent loads through the same flags and code path as the real libraries, which
//! answer from a JSON state file a test rewrites).

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use serde_json::{Value, json};

use crate::fumarole::{fixture_root, standin_lib};

/// A stand-in library's state file: edited in memory, written whole (renamed into place).
/// For tests: a write that fails panics.
pub struct StandIn {
    pub path: PathBuf,
    pub state: Value,
}

#[allow(clippy::expect_used)]
impl StandIn {
    pub fn new(path: PathBuf, state: Value) -> Self {
        let s = StandIn { path, state };
        s.write();
        s
    }

    pub fn write(&self) {
        let tmp = self.path.with_extension("tmp");
        std::fs::write(&tmp, self.state.to_string()).expect("writing the stand-in's state");
        std::fs::rename(&tmp, &self.path).expect("renaming the stand-in's state into place");
    }

    /// Applies `f` and writes the file; returns the moment it was written.
    pub fn edit(&mut self, f: impl FnOnce(&mut Value)) -> Instant {
        f(&mut self.state);
        self.write();
        Instant::now()
    }

    /// Appends an event for the stand-in NVML to deliver (it numbers them).
    pub fn event(&mut self, event: Value) -> Instant {
        self.edit(|s| {
            if !s["events"].is_array() {
                s["events"] = json!([]);
            }
            if let Some(events) = s["events"].as_array_mut() {
                let mut e = event;
                e["id"] = json!(events.len() as u64 + 1);
                events.push(e);
            }
        })
    }
}

/// The `dgx-h100` fixture written out as a root under `dir`, its recorded NVML answers turned
/// into the stand-in's state (and removed, so only the library answers), and the library
/// copied in as `libnvidia-ml.so.1`: (root, library, state).
pub fn nvidia_root(dir: &Path) -> Result<(PathBuf, PathBuf, StandIn)> {
    let root = fixture_root("dgx-h100", dir)?;
    let recorded = root.join("fumarole/nvml.json");
    let mut state: Value = serde_json::from_str(
        &std::fs::read_to_string(&recorded).with_context(|| recorded.display().to_string())?,
    )?;
    std::fs::remove_file(&recorded)?;
    state["events"] = json!([]);
    let lib = dir.join("libnvidia-ml.so.1");
    std::fs::copy(standin_lib("fumarole-standin-nvml")?, &lib)?;
    Ok((root, lib, StandIn::new(dir.join("nvml-state.json"), state)))
}

/// The DCMI stand-in copied into `dir` as `libdcmi.so`, answering from `state` written to a
/// file there: (library, state).
pub fn dcmi_standin(dir: &Path, state: Value) -> Result<(PathBuf, StandIn)> {
    let lib = dir.join("libdcmi.so");
    std::fs::copy(standin_lib("fumarole-standin-dcmi")?, &lib)?;
    Ok((lib, StandIn::new(dir.join("dcmi-state.json"), state)))
}

/// The DCMI stand-in's chips for `n` healthy NPUs, one per card (davinci N = card N = logic id
/// N = physical id N), each with the fields `more(N)` adds (an object).
pub fn ascend_chips(n: u64, more: impl Fn(u64) -> Value) -> Vec<Value> {
    (0..n)
        .map(|i| {
            let mut chip = json!({"card": i, "device": 0, "logicId": i, "phyId": i,
                                  "health": 0, "errorCodes": [], "network": 0});
            if let (Some(chip), Value::Object(extra)) = (chip.as_object_mut(), more(i)) {
                chip.extend(extra);
            }
            chip
        })
        .collect()
}
