//! The device-plugin configuration file (`fumarole-agent run --device-plugin-config FILE`):
//! resource names and what `Allocate` returns, per device class.
//!
//! ```yaml
//! resources:
//!   # Share the A100s among pods (before the entry for all NVIDIA GPUs: the first match wins):
//!   # NVIDIA's own `sharing` block, time-slicing or MPS; renamed, as replicas and whole GPUs
//!   # cannot be one resource.
//!   - match: {vendor: nvidia, model: "NVIDIA A100*"}
//!     sharing:
//!       timeSlicing:
//!         renameByDefault: true           # nvidia.com/gpu.shared
//!         resources:
//!           - {name: nvidia.com/gpu, replicas: 4}
//!     replicaAllocation: packed           # distributed (default) | packed
//!   # Rename NVIDIA's resource and choose the env var and its value.
//!   - match: {vendor: nvidia}             # or {pciVendor: "0x10de", pciDevice: "0x2330"}, {model: "NVIDIA H100*"}
//!     resourceName: nvidia.com/gpu        # default: the vendor plugin's name
//!     env: NVIDIA_VISIBLE_DEVICES         # default: the vendor's variable
//!     envValue: uuid                      # uuid | index | id | busId
//!     sharedDeviceNodes: [/dev/nvidiactl, /dev/nvidia-uvm]
//!   # Any accelerator class: a resource, an env var, per-device nodes.
//!   - match: {pciVendor: "0x1e52"}
//!     resourceName: example.com/npu
//!     env: EXAMPLE_VISIBLE_DEVICES
//!     envValue: index
//!     deviceNodes: ["/dev/accel/accel{index}"]
//!     cdi: true
//!   # Serve a class through DRA (ResourceClaims) instead of a device-plugin resource.
//!   - match: {vendor: huawei}
//!     servedBy: dra                       # devicePlugin (default) | dra | both
//!   # Leave a class to another plugin.
//!   - match: {vendor: amd}
//!     enabled: false
//! ```
//!
//! **Matching.** Each entry's `match` selects among the accelerators discovery found (NVIDIA,
//! Huawei, MetaX, AMD and Intel GPUs/NPUs, and any vendor's PCI processing accelerator, class
//! `0x12xx`, or co-processor, `0x0b40`); the config cannot make other PCI functions devices.
//! Keys of one `match` must all hold: `vendor` (`nvidia`, `huawei` or `ascend`, `metax`, `amd`,
//! `intel`, `other`), `pciVendor` and `pciDevice` (16-bit hex, `pciDevice` needs `pciVendor`),
//! `kind` (`gpu`, `npu`, `other`), `model` (the discovered model name; `*` matches any run of
//! characters). **The first entry that matches a device wins**; later entries never see it.
//! Devices no entry matches keep the defaults.
//!
//! **Settings**, each optional (unset = the vendor default):
//! - `resourceName`: a domain-qualified extended resource name (`domain/name`, not in
//!   `kubernetes.io`, not `requests.`). Devices of several entries may share a name only when
//!   they get the same settings.
//! - `env`, `envValue`: the variable listing a container's devices, comma-separated, and what
//!   names each device: `uuid` (the NVIDIA uuid; the device id when there is none), `index`
//!   (vendor index, the davinci number on Ascend), `id` (the id the kubelet sees), `busId`.
//!   Defaults: NVIDIA `NVIDIA_VISIBLE_DEVICES`/`uuid`, Ascend `ASCEND_VISIBLE_DEVICES`/`index`,
//!   others `FUMAROLE_VISIBLE_DEVICES`/`id`.
//! - `deviceNodes`: a device's own nodes, replacing the discovered ones; `{index}`, `{id}` and
//!   `{busId}` are substituted. A device is healthy while all its nodes exist.
//! - `sharedDeviceNodes`: nodes every container of the resource gets (control devices),
//!   replacing the vendor's; those missing on the node are left out with a warning.
//! - `cdi`: emit CDI device names (`<resource>=<device id>`), overriding `--cdi`.
//! - `servedBy`: how the kubelet gets the devices: `devicePlugin` (the default: an extended
//!   resource served by a device plugin), `dra` (the DRA kubelet plugin, [`crate::dra`]: the
//!   devices are published in ResourceSlices and handed out through ResourceClaims, and no
//!   device-plugin resource offers them) or `both` (offered both ways; the cluster must then
//!   keep a device from being given out twice). DRA containers get the same env vars and
//!   device nodes as device-plugin containers, always through CDI, so `cdi` is refused
//!   with `servedBy: dra`.
//! - `draShares`: with `servedBy: dra`, how many claims may hold a device at once (2 to 64).
//!   The device is published with `allowMultipleAllocations` and a `shares` capacity of that
//!   many, of which each claim takes one unless it asks more; its memory, when known, is
//!   capacity too, of which a claim that does not ask takes an equal part
//!   ([`fumarole_topology::dra::SHARES`]). Nothing isolates the claims on the device: it is
//!   time-slicing, the processes share its memory (docs/sharing.md).
//! - `draPartitions: true`: with `servedBy: dra`, each matched device whose model has a
//!   partition table (MIG GPUs, Ascend vNPU chips; [`fumarole_topology::share::Catalogue`]) is
//!   published as a partitionable device: the whole device and every MIG profile at every
//!   placement (every vNPU template instance), consuming one counter set, so the scheduler
//!   allocates partitions that fit beside each other and never one beside the whole device
//!   ([`fumarole_topology::dra::partitions`]). Not with `draShares`. A device without a table
//!   is published whole (a warning says so).
//! - `sharing`: NVIDIA's device-plugin `sharing` block as its own config file writes it
//!   (`timeSlicing` or `mps`, each with `renameByDefault`, `failRequestsGreaterThanOne` and
//!   `resources: [{name: nvidia.com/gpu, replicas: N}]`), for NVIDIA GPUs served by the device
//!   plugin: each GPU is advertised as N replicas `<uuid>::<n>`, under `nvidia.com/gpu` (or
//!   `nvidia.com/gpu.shared` with `renameByDefault`); a container sees each of its GPUs once.
//!   Checked as NVIDIA's plugin checks it ([`fumarole_topology::share::SharingConfig`]).
//!   Time-sliced replicas are isolated by nothing; MPS clients get the pipe of NVIDIA's MPS
//!   control daemon and their part of the GPU's memory and SMs, which the daemon enforces
//!   (docs/sharing.md).
//! - `replicaAllocation`: with `sharing`, which free replicas `GetPreferredAllocation` offers:
//!   `distributed` (the default, NVIDIA's: from the GPUs that gave the fewest) or `packed`
//!   (from the GPUs that gave the most, keeping the others free).
//! - `mpsRoot`: with `sharing.mps`, the host directory of NVIDIA's MPS control daemon
//!   (default `/run/nvidia/mps`, its chart's `mps.root`).
//! - `migLayout`: the MIG devices each matched GPU should have, by profile
//!   (`["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]`, in any order). A profile the GPU's MIG
//!   table lacks, or a layout that does not fit in the GPU, is an error at start; a GPU whose
//!   MIG devices (as NVML reports them) differ from it is logged as a warning and served as NVML
//!   reports it. A GPU in MIG mode is served as its MIG devices, each under
//!   `nvidia.com/mig-<profile>` (NVIDIA's mixed strategy), whatever the entry says of
//!   `migLayout`; its entry may not set `servedBy`, `sharing` or `resourceName`.
//! - `enabled: false`: serve no plugin for the matched devices (takes no other setting).
//!
//! Unknown keys are errors. Every error names the file, the entry (`resources[N]`) and the key.
//! Also rejected: an entry with the same `match` as an earlier one (it could never apply), and,
//! against the node's devices, devices that would share a resource name with different
//! settings. An entry that matches no device is logged as a warning; a device matched by
//! several entries is logged (the first wins). In YAML flow lists (`[...]`) quote templates:
//! `["/dev/accel/accel{index}"]`.

use std::fmt;
use std::path::{Path, PathBuf};

use fumarole_topology::share::{Naming, SharingConfig, Strategy};
use fumarole_topology::{Device, DeviceKind, Vendor};
use serde::Deserialize;

/// The resource NVIDIA's sharing configuration shares.
pub const NVIDIA_GPU: &str = "nvidia.com/gpu";

/// The validated configuration. [`Config::default`] is "defaults for every device".
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Config {
    /// Where it was read from, for messages.
    pub source: Option<PathBuf>,
    /// Entries in file order; the first that matches a device wins.
    pub resources: Vec<ResourceRule>,
}

/// One `resources` entry.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResourceRule {
    pub matcher: Match,
    pub enabled: bool,
    pub resource_name: Option<String>,
    pub env: Option<String>,
    pub env_value: Option<EnvValue>,
    /// Templates with `{index}`, `{id}`, `{busId}`.
    pub device_nodes: Option<Vec<String>>,
    pub shared_device_nodes: Option<Vec<String>>,
    pub cdi: Option<bool>,
    /// Device plugin, DRA or both.
    pub served_by: ServedBy,
    /// With `servedBy: dra`: each device may be allocated to this many claims at once.
    pub dra_shares: Option<u32>,
    /// With `servedBy: dra`: published as partitionable devices (`draPartitions`).
    pub dra_partitions: bool,
    /// NVIDIA's `sharing` block, resolved: each device advertised as replicas.
    pub sharing: Option<Sharing>,
    /// The MIG devices each matched GPU should have, by profile (`migLayout`): checked
    /// against the GPU's MIG table at start and compared with what NVML reports.
    pub mig_layout: Option<Vec<String>>,
}

/// A device-plugin resource whose devices are advertised as replicas (an entry's `sharing`:
/// NVIDIA's time-slicing or MPS).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sharing {
    /// Replicas per device.
    pub replicas: u32,
    /// MPS: the host directory of NVIDIA's MPS control daemon (its `--mps-root`); `None` for
    /// time-slicing.
    pub mps_root: Option<String>,
    /// `failRequestsGreaterThanOne`: a container may hold one replica only.
    pub one_each: bool,
    /// `renameByDefault`: the replicas are `nvidia.com/gpu.shared`.
    pub rename_by_default: bool,
    /// Which replicas `GetPreferredAllocation` prefers.
    pub allocation: ReplicaAllocation,
}

/// Which free replicas a container is offered first (`replicaAllocation`; NVIDIA's names).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ReplicaAllocation {
    /// From the devices with the fewest replicas given (NVIDIA's default): a container of two
    /// replicas gets two devices, and pods spread over the devices.
    #[default]
    Distributed,
    /// From the devices with the most replicas given: shared devices fill up first and the
    /// others stay free for whole use elsewhere.
    Packed,
}

/// Where NVIDIA's MPS control daemon keeps its pipes by default (its chart's `mps.root`).
pub const DEFAULT_MPS_ROOT: &str = "/run/nvidia/mps";

/// How the kubelet gets a device: the per-entry `servedBy` setting.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ServedBy {
    /// An extended resource of a device plugin (v1beta1), the default.
    #[default]
    DevicePlugin,
    /// ResourceClaims through the DRA kubelet plugin only.
    Dra,
    /// Both ways.
    Both,
}

impl ServedBy {
    const NAMES: &'static str = "devicePlugin, dra, both";

    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "devicePlugin" => ServedBy::DevicePlugin,
            "dra" => ServedBy::Dra,
            "both" => ServedBy::Both,
            _ => return None,
        })
    }

    /// Whether a device-plugin resource offers the device.
    pub fn device_plugin(self) -> bool {
        matches!(self, ServedBy::DevicePlugin | ServedBy::Both)
    }

    /// Whether the DRA kubelet plugin serves the device.
    pub fn dra(self) -> bool {
        matches!(self, ServedBy::Dra | ServedBy::Both)
    }
}

/// Which devices an entry applies to: every given key must hold.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Match {
    pub vendor: Option<Vendor>,
    pub pci_vendor: Option<u16>,
    pub pci_device: Option<u16>,
    pub kind: Option<DeviceKind>,
    /// Model name, `*` as a wildcard.
    pub model: Option<String>,
}

/// What names a device in the visible-devices variable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EnvValue {
    /// The NVIDIA uuid, else the device id.
    Uuid,
    /// The vendor index (davinci number on Ascend).
    Index,
    /// The id advertised to the kubelet.
    Id,
    /// The PCI bus id.
    BusId,
}

impl EnvValue {
    const NAMES: &'static str = "uuid, index, id, busId";

    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "uuid" => EnvValue::Uuid,
            "index" => EnvValue::Index,
            "id" => EnvValue::Id,
            "busId" => EnvValue::BusId,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            EnvValue::Uuid => "uuid",
            EnvValue::Index => "index",
            EnvValue::Id => "id",
            EnvValue::BusId => "busId",
        }
    }
}

/// A configuration that cannot be used. Never a panic: every problem is one of these.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{file}: {source}")]
    Read {
        file: String,
        source: std::io::Error,
    },
    #[error("{file}: {message}")]
    Parse { file: String, message: String },
    #[error("{file}: resources[{entry}].{field}: {message}")]
    Invalid {
        file: String,
        entry: usize,
        field: String,
        message: String,
    },
    /// Devices that would share a resource with different settings (found against the node).
    #[error("{file}: resource {resource}: {message}")]
    Conflict {
        file: String,
        resource: String,
        message: String,
    },
}

impl Config {
    /// Reads and validates `path`.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            file: path.display().to_string(),
            source,
        })?;
        Self::parse(&text, Some(path))
    }

    /// Parses and validates YAML (or JSON) text; `source` names it in errors.
    pub fn parse(text: &str, source: Option<&Path>) -> Result<Self, ConfigError> {
        let file = source.map_or_else(|| "device-plugin config".to_string(), display);
        let raw: Option<RawConfig> =
            serde_norway::from_str(text).map_err(|e| ConfigError::Parse {
                file: file.clone(),
                message: e.to_string(),
            })?;
        let raw = raw.unwrap_or_default();
        let mut resources: Vec<ResourceRule> = Vec::new();
        for (entry, r) in raw.resources.into_iter().enumerate() {
            let invalid = |field: &str, message: String| ConfigError::Invalid {
                file: file.clone(),
                entry,
                field: field.to_string(),
                message,
            };
            let rule = r.validate(&invalid)?;
            if let Some(first) = resources.iter().position(|p| p.matcher == rule.matcher) {
                return Err(invalid(
                    "match",
                    format!(
                        "the same match as resources[{first}], which wins: this entry never applies"
                    ),
                ));
            }
            if let Some(name) = &rule.resource_name
                && let Some(first) = resources
                    .iter()
                    .position(|p| p.resource_name.as_ref() == Some(name) && !p.same_settings(&rule))
            {
                return Err(invalid(
                    "resourceName",
                    format!(
                        "{name} is also resources[{first}]'s, with other settings: entries may share a resource only with the same env, envValue, sharedDeviceNodes and cdi"
                    ),
                ));
            }
            resources.push(rule);
        }
        Ok(Config {
            source: source.map(Path::to_path_buf),
            resources,
        })
    }

    /// The file name for messages.
    pub fn file(&self) -> String {
        self.source
            .as_deref()
            .map_or_else(|| "device-plugin config".to_string(), display)
    }

    /// The entry that decides `device` (its position and the entry), `None` for the defaults.
    pub fn rule_for(&self, device: &Device) -> Option<(usize, &ResourceRule)> {
        self.resources
            .iter()
            .enumerate()
            .find(|(_, r)| r.matcher.matches(device))
    }

    /// How `device` is served: `None` when its entry disables it, else its entry's
    /// `servedBy` (the device plugin for a device no entry matches).
    pub fn served_by(&self, device: &Device) -> Option<ServedBy> {
        match self.rule_for(device) {
            Some((_, r)) if !r.enabled => None,
            Some((_, r)) => Some(r.served_by),
            None => Some(ServedBy::DevicePlugin),
        }
    }
}

fn display(p: &Path) -> String {
    p.display().to_string()
}

impl ResourceRule {
    fn same_settings(&self, other: &ResourceRule) -> bool {
        self.env == other.env
            && self.env_value == other.env_value
            && self.shared_device_nodes == other.shared_device_nodes
            && self.cdi == other.cdi
            && self.sharing == other.sharing
    }

    /// The device's own nodes from the `deviceNodes` templates, if set.
    pub fn device_nodes_for(&self, d: &Device) -> Option<Vec<String>> {
        self.device_nodes
            .as_ref()
            .map(|t| t.iter().map(|t| expand(t, d)).collect())
    }
}

fn expand(template: &str, d: &Device) -> String {
    template
        .replace("{index}", &d.index.to_string())
        .replace("{id}", &d.id)
        .replace("{busId}", &d.pci_bus_id)
}

impl Match {
    pub fn matches(&self, d: &Device) -> bool {
        self.vendor.is_none_or(|v| v == d.vendor)
            && self.pci_vendor.is_none_or(|v| v == d.pci_id.vendor)
            && self.pci_device.is_none_or(|v| v == d.pci_id.device)
            && self.kind.is_none_or(|k| k == d.kind)
            && self.model.as_deref().is_none_or(|m| glob(m, &d.model))
    }
}

impl fmt::Display for Match {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if let Some(v) = self.vendor {
            parts.push(format!("vendor: {}", v.as_str()));
        }
        if let Some(v) = self.pci_vendor {
            parts.push(format!("pciVendor: 0x{v:04x}"));
        }
        if let Some(v) = self.pci_device {
            parts.push(format!("pciDevice: 0x{v:04x}"));
        }
        if let Some(k) = self.kind {
            parts.push(format!("kind: {}", kind_name(k)));
        }
        if let Some(m) = &self.model {
            parts.push(format!("model: {m:?}"));
        }
        write!(f, "{{{}}}", parts.join(", "))
    }
}

fn kind_name(k: DeviceKind) -> &'static str {
    match k {
        DeviceKind::Gpu => "gpu",
        DeviceKind::Npu => "npu",
        DeviceKind::Other => "other",
    }
}

/// `pattern` against `text`, `*` matching any run of characters (none included).
fn glob(pattern: &str, text: &str) -> bool {
    let mut parts = pattern.split('*');
    let Some(first) = parts.next() else {
        return text.is_empty();
    };
    let Some(mut rest) = text.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        return rest.is_empty(); // no `*`: exact
    };
    for p in middle {
        match rest.find(p) {
            Some(i) => rest = &rest[i + p.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

/// Most claims one device may be shared among (`draShares`).
pub const MAX_DRA_SHARES: u32 = 64;

// ---- the file's shape, before validation ----

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    resources: Vec<RawRule>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawRule {
    #[serde(rename = "match")]
    matcher: Option<RawMatch>,
    enabled: Option<bool>,
    resource_name: Option<String>,
    env: Option<String>,
    env_value: Option<String>,
    device_nodes: Option<Vec<String>>,
    shared_device_nodes: Option<Vec<String>>,
    cdi: Option<bool>,
    served_by: Option<String>,
    dra_shares: Option<u32>,
    dra_partitions: Option<bool>,
    sharing: Option<SharingConfig>,
    replica_allocation: Option<String>,
    mps_root: Option<String>,
    mig_layout: Option<Vec<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawMatch {
    vendor: Option<String>,
    pci_vendor: Option<HexId>,
    pci_device: Option<HexId>,
    kind: Option<String>,
    model: Option<String>,
}

/// `"0x10de"`, `"10de"`, or a YAML integer (`0x10de` unquoted is one).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum HexId {
    Int(u64),
    Str(String),
}

impl HexId {
    fn parse(&self) -> Option<u16> {
        match self {
            HexId::Int(n) => u16::try_from(*n).ok(),
            HexId::Str(s) => {
                let s = s.trim();
                let digits = s
                    .strip_prefix("0x")
                    .or_else(|| s.strip_prefix("0X"))
                    .unwrap_or(s);
                if digits.is_empty() || digits.len() > 4 {
                    return None;
                }
                u16::from_str_radix(digits, 16).ok()
            }
        }
    }

    fn shown(&self) -> String {
        match self {
            HexId::Int(n) => n.to_string(),
            HexId::Str(s) => format!("{s:?}"),
        }
    }
}

impl RawRule {
    fn validate(
        mut self,
        invalid: &dyn Fn(&str, String) -> ConfigError,
    ) -> Result<ResourceRule, ConfigError> {
        let Some(m) = self.matcher.take() else {
            return Err(invalid(
                "match",
                "missing: say which devices the entry is for (vendor, pciVendor, pciDevice, kind, model)".into(),
            ));
        };
        let matcher = m.validate(invalid)?;
        let enabled = self.enabled.unwrap_or(true);
        if !enabled {
            let others = [
                ("resourceName", self.resource_name.is_some()),
                ("env", self.env.is_some()),
                ("envValue", self.env_value.is_some()),
                ("deviceNodes", self.device_nodes.is_some()),
                ("sharedDeviceNodes", self.shared_device_nodes.is_some()),
                ("cdi", self.cdi.is_some()),
                ("servedBy", self.served_by.is_some()),
                ("draShares", self.dra_shares.is_some()),
                ("draPartitions", self.dra_partitions.is_some()),
                ("sharing", self.sharing.is_some()),
                ("replicaAllocation", self.replica_allocation.is_some()),
                ("mpsRoot", self.mps_root.is_some()),
                ("migLayout", self.mig_layout.is_some()),
            ];
            if let Some((field, _)) = others.iter().find(|(_, set)| *set) {
                return Err(invalid(
                    field,
                    "set on an entry with enabled: false, which serves nothing".into(),
                ));
            }
        }
        if let Some(name) = &self.resource_name {
            check_resource_name(name).map_err(|m| invalid("resourceName", m))?;
        }
        if let Some(env) = &self.env {
            check_env_name(env).map_err(|m| invalid("env", m))?;
        }
        let env_value = match &self.env_value {
            None => None,
            Some(v) => Some(EnvValue::parse(v).ok_or_else(|| {
                invalid(
                    "envValue",
                    format!("unknown value {v:?}: one of {}", EnvValue::NAMES),
                )
            })?),
        };
        let served_by = match &self.served_by {
            None => ServedBy::default(),
            Some(v) => ServedBy::parse(v).ok_or_else(|| {
                invalid(
                    "servedBy",
                    format!("unknown value {v:?}: one of {}", ServedBy::NAMES),
                )
            })?,
        };
        if served_by == ServedBy::Dra && self.cdi.is_some() {
            return Err(invalid(
                "cdi",
                "set on an entry with servedBy: dra: cdi only changes device-plugin answers, and DRA always hands devices out through CDI".into(),
            ));
        }
        if let Some(n) = self.dra_shares {
            if served_by != ServedBy::Dra {
                return Err(invalid(
                    "draShares",
                    "needs servedBy: dra (a device-plugin resource hands a device to one container, so a device shared in DRA and offered whole there could be given out twice)".into(),
                ));
            }
            if !(2..=MAX_DRA_SHARES).contains(&n) {
                return Err(invalid(
                    "draShares",
                    format!("{n} claims per device: from 2 to {MAX_DRA_SHARES}"),
                ));
            }
        }
        let dra_partitions = self.dra_partitions.unwrap_or(false);
        if dra_partitions && served_by != ServedBy::Dra {
            return Err(invalid(
                "draPartitions",
                "needs servedBy: dra (partitions are published in ResourceSlices; the device plugin serves MIG devices as NVML reports them)".into(),
            ));
        }
        if dra_partitions && self.dra_shares.is_some() {
            return Err(invalid(
                "draPartitions",
                "set with draShares: a device is either shared among claims or split into partitions".into(),
            ));
        }
        let sharing = self.sharing(served_by, invalid)?;
        for (i, n) in self.device_nodes.iter().flatten().enumerate() {
            check_node(n, true).map_err(|m| invalid(&format!("deviceNodes[{i}]"), m))?;
        }
        for (i, n) in self.shared_device_nodes.iter().flatten().enumerate() {
            check_node(n, false).map_err(|m| invalid(&format!("sharedDeviceNodes[{i}]"), m))?;
        }
        Ok(ResourceRule {
            matcher,
            enabled,
            resource_name: self.resource_name,
            env: self.env,
            env_value,
            device_nodes: self.device_nodes,
            shared_device_nodes: self.shared_device_nodes,
            cdi: self.cdi,
            served_by,
            dra_shares: self.dra_shares,
            dra_partitions,
            sharing,
            mig_layout: self.mig_layout,
        })
    }

    /// The entry's `sharing` (with `replicaAllocation` and `mpsRoot`), checked as NVIDIA's
    /// plugin checks it and against the rest of the entry.
    fn sharing(
        &self,
        served_by: ServedBy,
        invalid: &dyn Fn(&str, String) -> ConfigError,
    ) -> Result<Option<Sharing>, ConfigError> {
        let (strategy, naming, one_each) = match &self.sharing {
            None => (Strategy::None, Naming::default(), false),
            Some(config) => config
                .resolve()
                .map_err(|e| invalid("sharing", e.to_string()))?,
        };
        let (replicas, mps) = match strategy {
            Strategy::None => {
                for (field, set) in [
                    ("replicaAllocation", self.replica_allocation.is_some()),
                    ("mpsRoot", self.mps_root.is_some()),
                ] {
                    if set {
                        return Err(invalid(field, "needs sharing (timeSlicing or mps)".into()));
                    }
                }
                return Ok(None);
            }
            Strategy::TimeSlicing { replicas } => (replicas, false),
            Strategy::Mps { replicas } => (replicas, true),
        };
        if served_by != ServedBy::DevicePlugin {
            return Err(invalid(
                "sharing",
                "needs servedBy: devicePlugin (replicas are device-plugin ids; DRA shares a device with draShares)".into(),
            ));
        }
        if let Some(name) = self.resource_name.as_deref().filter(|n| *n != NVIDIA_GPU) {
            return Err(invalid(
                "resourceName",
                format!(
                    "{name} with sharing: the sharing block names the resource ({NVIDIA_GPU}, or {NVIDIA_GPU}.shared with renameByDefault)"
                ),
            ));
        }
        let allocation = match self.replica_allocation.as_deref() {
            None | Some("distributed") => ReplicaAllocation::Distributed,
            Some("packed") => ReplicaAllocation::Packed,
            Some(v) => {
                return Err(invalid(
                    "replicaAllocation",
                    format!("unknown value {v:?}: one of distributed, packed"),
                ));
            }
        };
        let mps_root = match (&self.mps_root, mps) {
            (Some(_), false) => {
                return Err(invalid(
                    "mpsRoot",
                    "needs sharing.mps (time-sliced replicas have no daemon)".into(),
                ));
            }
            (Some(root), true) => {
                check_node(root, false).map_err(|m| invalid("mpsRoot", m))?;
                Some(root.clone())
            }
            (None, true) => Some(DEFAULT_MPS_ROOT.to_string()),
            (None, false) => None,
        };
        Ok(Some(Sharing {
            replicas,
            mps_root,
            one_each,
            rename_by_default: naming.rename_by_default,
            allocation,
        }))
    }
}

impl RawMatch {
    fn validate(self, invalid: &dyn Fn(&str, String) -> ConfigError) -> Result<Match, ConfigError> {
        let vendor = match self.vendor.as_deref() {
            None => None,
            Some(v) => Some(parse_vendor(v).ok_or_else(|| {
                invalid(
                    "match.vendor",
                    format!(
                        "unknown vendor {v:?}: one of nvidia, huawei (or ascend), metax, amd, intel, other"
                    ),
                )
            })?),
        };
        let hex = |field: &str, h: &Option<HexId>| -> Result<Option<u16>, ConfigError> {
            match h {
                None => Ok(None),
                Some(h) => h.parse().map(Some).ok_or_else(|| {
                    invalid(
                        field,
                        format!("{} is not a 16-bit hex PCI id like \"0x10de\"", h.shown()),
                    )
                }),
            }
        };
        let pci_vendor = hex("match.pciVendor", &self.pci_vendor)?;
        let pci_device = hex("match.pciDevice", &self.pci_device)?;
        let kind = match self.kind.as_deref() {
            None => None,
            Some("gpu") => Some(DeviceKind::Gpu),
            Some("npu") => Some(DeviceKind::Npu),
            Some("other") => Some(DeviceKind::Other),
            Some(k) => {
                return Err(invalid(
                    "match.kind",
                    format!("unknown kind {k:?}: one of gpu, npu, other"),
                ));
            }
        };
        if pci_device.is_some() && pci_vendor.is_none() {
            return Err(invalid(
                "match.pciDevice",
                "needs match.pciVendor (device ids are per vendor)".into(),
            ));
        }
        if let (Some(v), Some(p)) = (vendor, pci_vendor)
            && Vendor::from_pci(p) != v
        {
            return Err(invalid(
                "match.pciVendor",
                format!(
                    "0x{p:04x} is not a {} PCI vendor id: the entry could never match",
                    v.as_str()
                ),
            ));
        }
        if let Some(m) = &self.model
            && m.is_empty()
        {
            return Err(invalid("match.model", "empty".into()));
        }
        let m = Match {
            vendor,
            pci_vendor,
            pci_device,
            kind,
            model: self.model,
        };
        if m == Match::default() {
            return Err(invalid(
                "match",
                "empty: give at least one of vendor, pciVendor, pciDevice, kind, model".into(),
            ));
        }
        Ok(m)
    }
}

fn parse_vendor(v: &str) -> Option<Vendor> {
    Some(match v.to_ascii_lowercase().as_str() {
        "nvidia" => Vendor::Nvidia,
        "huawei" | "ascend" => Vendor::Huawei,
        "metax" => Vendor::Metax,
        "amd" => Vendor::Amd,
        "intel" => Vendor::Intel,
        "other" => Vendor::Other,
        _ => return None,
    })
}

/// Kubernetes' rule for extended resource names: a qualified name `domain/name` whose domain
/// is a DNS subdomain outside `kubernetes.io`, and not starting with `requests.`.
pub fn check_resource_name(name: &str) -> Result<(), String> {
    let Some((domain, short)) = name.split_once('/') else {
        return Err(format!(
            "{name:?} is not domain-qualified: extended resources are named domain/name, e.g. example.com/gpu"
        ));
    };
    if name.contains("kubernetes.io/") {
        return Err(format!(
            "{name:?}: the kubernetes.io domain is reserved for native resources"
        ));
    }
    if name.starts_with("requests.") {
        return Err(format!(
            "{name:?} must not start with \"requests.\" (the quota prefix)"
        ));
    }
    let subdomain_ok = !domain.is_empty()
        && domain.len() <= 253
        && domain.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        });
    if !subdomain_ok {
        return Err(format!(
            "{name:?}: the domain {domain:?} is not a lower-case DNS subdomain"
        ));
    }
    let alnum = |c: Option<u8>| c.is_some_and(|b| b.is_ascii_alphanumeric());
    let short_ok = short.len() <= 63
        && alnum(short.bytes().next())
        && alnum(short.bytes().last())
        && short
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if !short_ok {
        return Err(format!(
            "{name:?}: the name {short:?} must be 1-63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
        ));
    }
    Ok(())
}

/// A POSIX-portable environment variable name.
pub fn check_env_name(env: &str) -> Result<(), String> {
    let ok = env
        .bytes()
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && env.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{env:?} is not an environment variable name (letters, digits and '_', not starting with a digit)"
        ))
    }
}

/// An absolute device path; `{index}`, `{id}` and `{busId}` only where `templates`.
fn check_node(node: &str, templates: bool) -> Result<(), String> {
    if !node.starts_with('/') {
        return Err(format!("{node:?} is not an absolute path"));
    }
    if node.split('/').any(|c| c == "..") {
        return Err(format!("{node:?} must not contain \"..\""));
    }
    let mut rest = node;
    while let Some(open) = rest.find('{') {
        let Some(len) = rest[open..].find('}') else {
            return Err(format!("{node:?}: unclosed '{{'"));
        };
        let field = &rest[open + 1..open + len];
        if !templates {
            return Err(format!(
                "{node:?}: placeholders ({{{field}}}) only apply to deviceNodes"
            ));
        }
        if !matches!(field, "index" | "id" | "busId") {
            return Err(format!(
                "{node:?}: unknown placeholder {{{field}}}: one of {{index}}, {{id}}, {{busId}}"
            ));
        }
        rest = &rest[open + len + 1..];
    }
    if rest.contains('}') {
        return Err(format!("{node:?}: unmatched '}}'"));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
