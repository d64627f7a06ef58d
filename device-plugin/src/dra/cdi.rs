//! The CDI (Container Device Interface) spec files the plugin writes, one per prepared claim:
//! what the container runtime adds to a container that uses the claim, and the plugin's own
//! record of what it prepared.
//!
//! A claim's file is `<cdi-dir>/<driver>-claim_<claim uid>.json`, kind `<driver>/claim`
//! (`gpu.fumarole.dev/claim`), one CDI device per allocated device named
//! `<claim uid>-<device name>` (fully qualified: `gpu.fumarole.dev/claim=<uid>-nvidia-0`), so
//! no name is ever reused by another claim. The spec-level edits carry the vendor variables
//! listing all the claim's devices (`NVIDIA_VISIBLE_DEVICES=<uuid>,<uuid>`) and the shared
//! control nodes (`/dev/nvidiactl`, `/dev/davinci_manager`); each device's own edits carry its
//! device nodes. Annotations record the claim, and per device its pool, name and requests, so
//! the answer to the kubelet can be rebuilt from the file alone ([`Spec::answer`]).
//!
//! Files are written atomically (a hidden temporary file, then a rename): a runtime that
//! watches the directory never reads half a spec.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::dra::api;
use crate::dra::node::Served;

/// The CDI spec version written: 0.6.0 is the first with annotations (0.5.0 brought device
/// nodes' `hostPath` and device names starting with a digit, which uids do).
pub const CDI_VERSION: &str = "0.6.0";
/// The CDI class of our devices: each is one claim's device.
pub const CLASS: &str = "claim";
/// Spec annotation: the claim, `<namespace>/<name>`.
pub const CLAIM_ANNOTATION: &str = "fumarole.dev/claim";
/// Device annotation: the pool (the node).
pub const POOL_ANNOTATION: &str = "fumarole.dev/pool";
/// Device annotation: the device's name in the pool.
pub const DEVICE_ANNOTATION: &str = "fumarole.dev/device";
/// Device annotation: the claim's requests the device serves, comma-separated.
pub const REQUESTS_ANNOTATION: &str = "fumarole.dev/requests";

/// A CDI spec, the fields we write.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    pub cdi_version: String,
    pub kind: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    pub devices: Vec<Device>,
    #[serde(default, skip_serializing_if = "ContainerEdits::is_empty")]
    pub container_edits: ContainerEdits,
}

/// One CDI device.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    pub name: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    pub container_edits: ContainerEdits,
}

/// Edits to a container: variables (`NAME=value`) and device nodes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerEdits {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub device_nodes: Vec<DeviceNode>,
}

impl ContainerEdits {
    fn is_empty(&self) -> bool {
        self.env.is_empty() && self.device_nodes.is_empty()
    }
}

/// A device node, at the same path in the container as on the host.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceNode {
    pub path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permissions: Option<String>,
}

impl DeviceNode {
    fn rw(path: &str) -> Self {
        Self {
            path: path.to_string(),
            host_path: Some(path.to_string()),
            permissions: Some("rw".into()),
        }
    }
}

/// `<driver>/claim`.
pub fn kind(driver: &str) -> String {
    format!("{driver}/{CLASS}")
}

/// The CDI device name of `device` in claim `uid`.
pub fn device_name(uid: &str, device: &str) -> String {
    format!("{uid}-{device}")
}

/// The file name of claim `uid`'s spec: `<driver>-claim_<uid>.json`.
pub fn file_name(driver: &str, uid: &str) -> String {
    format!("{driver}-{CLASS}_{uid}.json")
}

/// One device of a claim as it goes into the spec.
#[derive(Clone, Debug)]
pub struct ClaimDevice<'a> {
    /// Its name in the pool.
    pub name: String,
    pub requests: Vec<String>,
    pub served: Served<'a>,
}

/// The spec of claim `uid` (`claim` is `<namespace>/<name>`) of `driver`, its devices in
/// pool `pool`: the variables and nodes a device-plugin container of the devices' resources
/// would get ([`crate::resources::Resource::allocate`]), split into spec-level edits (the
/// variables, joined per variable over the claim's devices in order, and the resources'
/// shared nodes) and per-device edits (each device's own nodes).
pub fn build(driver: &str, uid: &str, claim: &str, pool: &str, devices: &[ClaimDevice]) -> Spec {
    let mut env: Vec<(String, Vec<String>)> = Vec::new();
    let mut shared: Vec<String> = Vec::new();
    for d in devices {
        let r = d.served.resource;
        let value = r.visible_name(d.served.device);
        match env.iter_mut().find(|(name, _)| *name == r.env) {
            Some((_, values)) if !values.contains(&value) => values.push(value),
            Some(_) => {}
            None => env.push((r.env.clone(), vec![value])),
        }
        for n in &r.shared_dev_nodes {
            if !shared.contains(n) {
                shared.push(n.clone());
            }
        }
    }
    Spec {
        cdi_version: CDI_VERSION.into(),
        kind: kind(driver),
        annotations: [(CLAIM_ANNOTATION.to_string(), claim.to_string())].into(),
        devices: devices
            .iter()
            .map(|d| Device {
                name: device_name(uid, &d.name),
                annotations: [
                    (POOL_ANNOTATION.to_string(), pool.to_string()),
                    (DEVICE_ANNOTATION.to_string(), d.name.clone()),
                    (REQUESTS_ANNOTATION.to_string(), d.requests.join(",")),
                ]
                .into(),
                container_edits: ContainerEdits {
                    env: Vec::new(),
                    device_nodes: d
                        .served
                        .device
                        .dev_nodes
                        .iter()
                        .map(|n| DeviceNode::rw(n))
                        .collect(),
                },
            })
            .collect(),
        container_edits: ContainerEdits {
            env: env
                .into_iter()
                .map(|(name, values)| format!("{name}={}", values.join(",")))
                .collect(),
            device_nodes: shared.iter().map(|n| DeviceNode::rw(n)).collect(),
        },
    }
}

impl Spec {
    /// The kubelet's answer for the claim this spec prepared, from the spec alone: per device
    /// its requests, pool, name and fully qualified CDI id. `None` when a device lacks our
    /// annotations (not a spec we wrote).
    pub fn answer(&self) -> Option<Vec<api::Device>> {
        self.devices
            .iter()
            .map(|d| {
                let requests = d.annotations.get(REQUESTS_ANNOTATION)?;
                Some(api::Device {
                    request_names: requests
                        .split(',')
                        .filter(|r| !r.is_empty())
                        .map(str::to_string)
                        .collect(),
                    pool_name: d.annotations.get(POOL_ANNOTATION)?.clone(),
                    device_name: d.annotations.get(DEVICE_ANNOTATION)?.clone(),
                    cdi_device_ids: vec![format!("{}={}", self.kind, d.name)],
                    share_id: None,
                })
            })
            .collect()
    }
}

/// Writes `spec` to `dir/file` atomically: a hidden temporary file beside it (which CDI
/// runtimes ignore: not `.json`), synced, then renamed over the target.
pub fn write(dir: &Path, file: &str, spec: &Spec) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let target = dir.join(file);
    let tmp = dir.join(format!(".{file}.{}.tmp", std::process::id()));
    let text = serde_json::to_vec_pretty(spec).map_err(std::io::Error::other)?;
    let written = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&text)?;
        f.sync_all()?;
        std::fs::rename(&tmp, &target)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written.map(|()| target)
}

/// The spec in `dir/file`: `Ok(None)` when there is none, `Err` when it cannot be read or is
/// not a spec.
pub fn read(dir: &Path, file: &str) -> Result<Option<Spec>, String> {
    let path = dir.join(file);
    match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| format!("{}: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

/// Removes `dir/file`; one already gone is success.
pub fn remove(dir: &Path, file: &str) -> std::io::Result<()> {
    match std::fs::remove_file(dir.join(file)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}
