//! Which extended resources a node offers and what a container gets for its devices.
//!
//! Devices are grouped by resource name (`nvidia.com/gpu`, `huawei.com/Ascend910`,
//! `metax-tech.com/gpu`, ...). [`Resource::allocate`] answers the kubelet's `Allocate` per
//! vendor convention: NVIDIA `NVIDIA_VISIBLE_DEVICES` (uuids), Ascend `ASCEND_VISIBLE_DEVICES`
//! (davinci numbers) plus the manager nodes, others `FUMAROLE_VISIBLE_DEVICES` (device ids);
//! device specs for every device node; CDI names when enabled. A [`Config`] changes names,
//! variables and device nodes per device class ([`resources_with`]), and says whether each
//! device is served by the device plugin, the DRA kubelet plugin or both ([`split`]): a DRA
//! container gets the same variables and nodes, through CDI ([`crate::dra::cdi`]).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use fumarole_topology::crd::SharingInfo;
use fumarole_topology::share::{
    Ask, Catalogue, DeviceUse, Offer, mig_resource, replica_id, replica_of,
};
use fumarole_topology::{Device, Health, NodeTopology, Vendor};

use crate::api;
use crate::config::{
    Config, ConfigError, EnvValue, NVIDIA_GPU, ReplicaAllocation, ResourceRule, ServedBy, Sharing,
};

/// One device as a plugin serves it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PluginDevice {
    /// The id advertised to the kubelet.
    pub id: String,
    /// Index among the vendor's devices (davinci number for Ascend).
    pub index: u32,
    /// Position in `NodeTopology::devices`, for link weights.
    pub position: usize,
    pub numa_node: Option<u32>,
    /// Device nodes handed to the container; also what health checks look at.
    pub dev_nodes: Vec<String>,
    pub healthy: bool,
    /// The NVIDIA uuid, when known.
    pub uuid: Option<String>,
    /// `dddd:bb:dd.f`.
    pub bus_id: String,
    /// Device plugin, DRA or both (the config entry's `servedBy`).
    pub served_by: ServedBy,
    /// Claims that may hold the device at once through DRA (the entry's `draShares`).
    pub dra_shares: Option<u32>,
    /// Published through DRA as a partitionable device (the entry's `draPartitions`).
    pub dra_partitions: bool,
    /// Device memory, when discovery knows it (NVML): MPS clients get a part of it.
    pub memory_bytes: Option<u64>,
    /// For a MIG device, the id of its GPU, whose health it has.
    pub parent: Option<String>,
}

impl PluginDevice {
    /// The id whose health is this device's: its GPU's for a MIG device.
    pub fn health_id(&self) -> &str {
        self.parent.as_deref().unwrap_or(&self.id)
    }
}

/// One extended resource and its devices.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resource {
    pub name: String,
    pub vendor: Vendor,
    pub devices: Vec<PluginDevice>,
    /// Node-wide device nodes every container of this resource needs (control devices).
    pub shared_dev_nodes: Vec<String>,
    /// Emit CDI device names (`<resource>=<id>`) in `Allocate`.
    pub cdi: bool,
    /// The variable listing a container's devices (`NVIDIA_VISIBLE_DEVICES`, ...).
    pub env: String,
    /// What names each device in `env`.
    pub env_value: EnvValue,
    /// Each device advertised as replicas (time-slicing or MPS), `None`: whole devices.
    pub sharing: Option<Sharing>,
}

/// Why a request cannot be answered; becomes gRPC `InvalidArgument`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("empty device list")]
    Empty,
    #[error("unknown device id {id:?} for resource {resource}")]
    UnknownDevice { id: String, resource: String },
    #[error("device id {0:?} listed twice")]
    Duplicate(String),
    /// NVIDIA's words for `failRequestsGreaterThanOne`.
    #[error("invalid request: maximum request size for shared resources is 1; found {0}")]
    MoreThanOneReplica(usize),
    #[error("{asked} replicas asked, {available} available")]
    TooFewReplicas { asked: usize, available: usize },
}

/// The control device nodes a vendor's containers need.
fn shared_nodes(vendor: Vendor) -> &'static [&'static str] {
    match vendor {
        Vendor::Nvidia => &[
            "/dev/nvidiactl",
            "/dev/nvidia-uvm",
            "/dev/nvidia-uvm-tools",
            "/dev/nvidia-modeset",
        ],
        Vendor::Huawei => &["/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc"],
        Vendor::Metax => &["/dev/mxcd"],
        Vendor::Amd => &["/dev/kfd"],
        Vendor::Intel | Vendor::Other => &[],
    }
}

/// The device node a vendor's driver gives device `index`, when it has a convention; used to
/// watch a device whose node was missing at discovery.
fn primary_node(vendor: Vendor, index: u32) -> Option<String> {
    match vendor {
        Vendor::Nvidia => Some(format!("/dev/nvidia{index}")),
        Vendor::Huawei => Some(format!("/dev/davinci{index}")),
        _ => None,
    }
}

/// The variable and value a vendor's containers get by default.
fn default_env(vendor: Vendor) -> (&'static str, EnvValue) {
    match vendor {
        Vendor::Nvidia => ("NVIDIA_VISIBLE_DEVICES", EnvValue::Uuid),
        Vendor::Huawei => ("ASCEND_VISIBLE_DEVICES", EnvValue::Index),
        _ => ("FUMAROLE_VISIBLE_DEVICES", EnvValue::Id),
    }
}

/// The resources of a node with every vendor's defaults. `root` is where `/dev` is read (the
/// host, or a fixture).
pub fn resources(t: &NodeTopology, root: &Path, cdi: bool) -> Vec<Resource> {
    match resources_with(t, root, cdi, &Config::default()) {
        Ok(r) => r,
        // Defaults give each vendor its own name: no conflict is possible.
        Err(e) => {
            tracing::error!(error = %e, "device plugin defaults");
            Vec::new()
        }
    }
}

/// The resources of a node under `config`: the first entry matching a device decides its
/// resource and settings, unmatched devices keep the defaults, disabled ones are left out.
/// Fails when devices sharing a resource name would get different settings.
pub fn resources_with(
    t: &NodeTopology,
    root: &Path,
    cdi: bool,
    config: &Config,
) -> Result<Vec<Resource>, ConfigError> {
    let exists = |n: &str| root.join(n.trim_start_matches('/')).exists();
    // Which entry (or the defaults) made each resource, for conflict messages.
    let mut by_name: BTreeMap<String, (Resource, String)> = BTreeMap::new();
    let mut used = vec![false; config.resources.len()];
    for (position, d) in t.devices.iter().enumerate() {
        let rule = config.rule_for(d);
        if let Some((i, _)) = rule {
            used[i] = true;
            let also: Vec<String> = config
                .resources
                .iter()
                .enumerate()
                .skip(i + 1)
                .filter(|(_, r)| r.matcher.matches(d))
                .map(|(j, _)| format!("resources[{j}]"))
                .collect();
            if !also.is_empty() {
                tracing::info!(device = %d.id, entry = i, shadowed = %also.join(", "), "device matches several device-plugin config entries: the first wins");
            }
        }
        if let Some((i, r)) = rule
            && !r.enabled
        {
            tracing::info!(device = %d.id, entry = i, "device disabled by the device-plugin config");
            continue;
        }
        if let Some((i, r)) = rule
            && let Some(sharing) = &r.sharing
        {
            check_shared(d, sharing).map_err(|message| ConfigError::Invalid {
                file: config.file(),
                entry: i,
                field: "sharing".into(),
                message,
            })?;
        }
        if let Some((i, r)) = rule
            && let Some(layout) = &r.mig_layout
        {
            let mismatch = check_mig_layout(d, layout).map_err(|message| ConfigError::Invalid {
                file: config.file(),
                entry: i,
                field: "migLayout".into(),
                message,
            })?;
            if let Some(m) = mismatch {
                tracing::warn!(device = %d.id, entry = i, "{m}: serving what NVML reports");
            }
        }
        // A GPU whose MIG devices are DRA's own partitions (`draPartitions`) is served whole.
        let dra_partitions = rule.is_some_and(|(_, r)| r.dra_partitions);
        if let Some((i, r)) = rule
            && !d.mig.is_empty()
            && !dra_partitions
        {
            check_mig(d, r).map_err(|(field, message)| ConfigError::Invalid {
                file: config.file(),
                entry: i,
                field: field.into(),
                message,
            })?;
        }
        let origin = match rule {
            Some((i, _)) => format!("resources[{i}]"),
            None => format!("the {} defaults", d.vendor.as_str()),
        };
        let configured = rule.and_then(|(_, r)| r.device_nodes_for(d));
        let healthy = d.health == Health::Healthy
            && configured
                .as_ref()
                .is_none_or(|nodes| nodes.iter().all(|n| exists(n)));
        let dev_nodes = match configured {
            Some(nodes) => nodes,
            None if d.dev_nodes.is_empty() => primary_node(d.vendor, d.index).into_iter().collect(),
            None => d.dev_nodes.clone(),
        };
        let whole = PluginDevice {
            id: d.id.clone(),
            index: d.index,
            position,
            numa_node: d.numa_node,
            dev_nodes,
            healthy,
            uuid: d.uuid.clone(),
            bus_id: d.pci_bus_id.clone(),
            served_by: rule.map_or(ServedBy::DevicePlugin, |(_, r)| r.served_by),
            dra_shares: rule.and_then(|(_, r)| r.dra_shares),
            dra_partitions: rule.is_some_and(|(_, r)| r.dra_partitions),
            memory_bytes: d.memory_bytes,
            parent: None,
        };
        // A GPU in MIG mode is served as its MIG devices, each under `nvidia.com/mig-<profile>`
        // (NVIDIA's mixed strategy), with the GPU's place, nodes and health.
        let served: Vec<(Option<String>, PluginDevice)> = if d.mig.is_empty() || dra_partitions {
            vec![(None, whole)]
        } else {
            d.mig
                .iter()
                .map(|m| {
                    let device = PluginDevice {
                        id: m.uuid.clone(),
                        uuid: Some(m.uuid.clone()),
                        memory_bytes: m.memory_bytes,
                        parent: Some(d.id.clone()),
                        ..whole.clone()
                    };
                    (Some(mig_resource(&m.profile)), device)
                })
                .collect()
        };
        for (name, device) in served {
            let mut candidate = new_resource(d, rule.map(|(_, r)| r), cdi, &exists);
            if let Some(name) = name {
                candidate.name = name;
            }
            let (r, first_origin) = by_name
                .entry(candidate.name.clone())
                .or_insert_with(|| (candidate.clone(), origin.clone()));
            if !same_settings(r, &candidate) {
                return Err(ConfigError::Conflict {
                    file: config.file(),
                    resource: candidate.name,
                    message: format!(
                        "device {} ({origin}) would join devices of {first_origin} with other settings (env, envValue, sharedDeviceNodes, cdi or sharing); give it another resourceName or the same settings",
                        d.id
                    ),
                });
            }
            r.devices.push(device);
        }
    }
    for (i, used) in used.iter().enumerate() {
        if !used {
            tracing::warn!(file = %config.file(), entry = i, r#match = %config.resources[i].matcher, "device-plugin config entry matches no device of this node");
        }
    }
    Ok(by_name.into_values().map(|(r, _)| r).collect())
}

/// An empty resource for `d`, under its config entry if any.
fn new_resource(
    d: &Device,
    rule: Option<&ResourceRule>,
    cdi: bool,
    exists: &dyn Fn(&str) -> bool,
) -> Resource {
    let (env, env_value) = default_env(d.vendor);
    let sharing = rule.and_then(|r| r.sharing.clone());
    let name = match &sharing {
        Some(s) if s.rename_by_default => format!("{NVIDIA_GPU}.shared"),
        _ => rule
            .and_then(|r| r.resource_name.clone())
            .unwrap_or_else(|| d.default_resource_name()),
    };
    let shared_dev_nodes = match rule.and_then(|r| r.shared_device_nodes.as_ref()) {
        Some(nodes) => nodes
            .iter()
            .filter(|n| {
                let ok = exists(n);
                if !ok {
                    tracing::warn!(resource = %name, node = %n, "configured shared device node missing: left out");
                }
                ok
            })
            .cloned()
            .collect(),
        None => shared_nodes(d.vendor)
            .iter()
            .filter(|n| exists(n))
            .map(|n| n.to_string())
            .collect(),
    };
    Resource {
        vendor: d.vendor,
        devices: Vec::new(),
        shared_dev_nodes,
        cdi: rule.and_then(|r| r.cdi).unwrap_or(cdi),
        env: rule
            .and_then(|r| r.env.clone())
            .unwrap_or_else(|| env.to_string()),
        env_value: rule.and_then(|r| r.env_value).unwrap_or(env_value),
        name,
        sharing,
    }
}

/// Why the entry `rule` cannot serve the MIG devices of `d`: they are device-plugin resources
/// named by their profile, not shared further; (the key at fault, why).
fn check_mig(d: &Device, rule: &ResourceRule) -> Result<(), (&'static str, String)> {
    let why = |key: &'static str| {
        Err((
            key,
            format!(
                "matches GPU {}, which is in MIG mode: its MIG devices are served by the device plugin as nvidia.com/mig-<profile> (NVIDIA's mixed strategy), which takes no {key}",
                d.id
            ),
        ))
    };
    if rule.served_by != ServedBy::DevicePlugin {
        return why("servedBy");
    }
    if rule.sharing.is_some() {
        return why("sharing");
    }
    if rule.resource_name.is_some() {
        return why("resourceName");
    }
    Ok(())
}

/// `layout` (an entry's `migLayout`) against GPU `d`: an error when a profile is not one of
/// the GPU's or the layout does not fit in it (its MIG table's slices and counts); else how
/// the MIG devices NVML reports differ from it, if they do.
fn check_mig_layout(d: &Device, layout: &[String]) -> Result<Option<String>, String> {
    let catalogue = (d.vendor == Vendor::Nvidia)
        .then(|| Catalogue::for_model(&d.model))
        .flatten();
    let Some(catalogue) = catalogue else {
        return Err(format!(
            "matches device {} ({}), which has no MIG profiles fumarole knows",
            d.id, d.model
        ));
    };
    let mut gpu = DeviceUse::new(Offer::Partitioned(catalogue));
    for name in layout {
        let Some(profile) = catalogue.profile(name) else {
            let known: Vec<&str> = catalogue.profiles.iter().map(|p| p.name).collect();
            return Err(format!(
                "{name} is not a MIG profile of {} ({}): one of {}",
                d.id,
                d.model,
                known.join(", ")
            ));
        };
        gpu.take(Ask::Partitions { profile, count: 1 })
            .map_err(|e| format!("does not fit in {} ({}): {e}", d.id, d.model))?;
    }
    let mut want: Vec<&str> = layout.iter().map(String::as_str).collect();
    let mut have: Vec<&str> = d.mig.iter().map(|m| m.profile.as_str()).collect();
    want.sort_unstable();
    have.sort_unstable();
    Ok((want != have).then(|| {
        format!(
            "GPU {}: migLayout says [{}], NVML reports [{}]",
            d.id,
            want.join(", "),
            have.join(", ")
        )
    }))
}

/// Why `d` cannot be shared as `sharing` says: only NVIDIA GPUs are (NVIDIA's configuration),
/// and an MPS client's memory limit is a part of the device's memory, which must be known.
fn check_shared(d: &Device, sharing: &Sharing) -> Result<(), String> {
    if d.vendor != Vendor::Nvidia {
        return Err(format!(
            "matches device {} ({} {}): sharing applies to NVIDIA GPUs only",
            d.id,
            d.vendor.as_str(),
            d.model
        ));
    }
    if sharing.mps_root.is_some() && d.memory_bytes.is_none_or(|m| m == 0) {
        return Err(format!(
            "mps: device {}'s memory is unknown (NVML did not report it), and each MPS client's memory limit is a part of it",
            d.id
        ));
    }
    Ok(())
}

/// The resources as the device plugins serve them and as the DRA kubelet plugin serves them:
/// each keeps the devices its `servedBy` gives it (`both`: in both), and a resource left with
/// no device is dropped, so a resource whose devices all say `dra` gets no device plugin.
pub fn split(resources: Vec<Resource>) -> (Vec<Resource>, Vec<Resource>) {
    let keep = |r: &Resource, by: fn(ServedBy) -> bool| {
        let devices: Vec<PluginDevice> = r
            .devices
            .iter()
            .filter(|d| by(d.served_by))
            .cloned()
            .collect();
        (!devices.is_empty()).then(|| Resource {
            devices,
            ..r.clone()
        })
    };
    let device_plugin = resources
        .iter()
        .filter_map(|r| keep(r, ServedBy::device_plugin))
        .collect();
    let dra = resources
        .iter()
        .filter_map(|r| keep(r, ServedBy::dra))
        .collect();
    (device_plugin, dra)
}

fn same_settings(a: &Resource, b: &Resource) -> bool {
    a.shared_dev_nodes == b.shared_dev_nodes
        && a.cdi == b.cdi
        && a.env == b.env
        && a.env_value == b.env_value
        && a.sharing == b.sharing
}

impl Resource {
    /// Whether the scheduler's device choices name this resource's devices: whole devices
    /// only, not replicas or MIG devices, which it does not place yet (issue 39).
    pub fn placed_by_scheduler(&self) -> bool {
        self.sharing.is_none() && self.devices.iter().all(|d| d.parent.is_none())
    }

    /// Socket file name in the device-plugin directory: `fumarole-<resource>.sock` with `/`
    /// replaced (`fumarole-nvidia.com_gpu.sock`).
    pub fn socket_name(&self) -> String {
        format!("fumarole-{}.sock", self.name.replace('/', "_"))
    }

    /// Positions in `devices` of `ids`, checked.
    pub fn positions(&self, ids: &[String]) -> Result<Vec<usize>, RequestError> {
        let mut seen = BTreeSet::new();
        ids.iter()
            .map(|id| {
                if !seen.insert(id.as_str()) {
                    return Err(RequestError::Duplicate(id.clone()));
                }
                self.devices
                    .iter()
                    .position(|d| d.id == *id)
                    .ok_or_else(|| RequestError::UnknownDevice {
                        id: id.clone(),
                        resource: self.name.clone(),
                    })
            })
            .collect()
    }

    /// What names `d` in the visible-devices variable ([`Resource::env`]), per `env_value`.
    pub fn visible_name(&self, d: &PluginDevice) -> String {
        match self.env_value {
            EnvValue::Uuid => d.uuid.clone().unwrap_or_else(|| d.id.clone()),
            EnvValue::Index => d.index.to_string(),
            EnvValue::Id => d.id.clone(),
            EnvValue::BusId => d.bus_id.clone(),
        }
    }

    /// Each of this resource's devices with how it is shared, as `DeviceTopology` publishes
    /// it for the schedulers; none for whole devices.
    pub fn sharing_info(&self) -> Vec<(String, SharingInfo)> {
        let Some(s) = &self.sharing else {
            return Vec::new();
        };
        let info = SharingInfo {
            resource: self.name.clone(),
            mechanism: if s.mps_root.is_some() {
                "mps"
            } else {
                "timeSlicing"
            }
            .into(),
            replicas: s.replicas,
        };
        self.devices
            .iter()
            .map(|d| (d.id.clone(), info.clone()))
            .collect()
    }

    /// The ids the kubelet sees, each with the position of its device: the device ids, or
    /// with sharing `<id>::<n>` for each of its replicas.
    pub fn advertised(&self) -> Vec<(String, usize)> {
        match &self.sharing {
            None => (self.devices.iter().enumerate())
                .map(|(i, d)| (d.id.clone(), i))
                .collect(),
            Some(s) => (self.devices.iter().enumerate())
                .flat_map(|(i, d)| (0..s.replicas).map(move |n| (replica_id(&d.id, n), i)))
                .collect(),
        }
    }

    /// Positions in `devices` and replica numbers of the replica ids `ids`, checked.
    pub fn replica_positions(&self, ids: &[String]) -> Result<Vec<(usize, u32)>, RequestError> {
        let replicas = self.sharing.as_ref().map_or(0, |s| s.replicas);
        let mut seen = BTreeSet::new();
        ids.iter()
            .map(|id| {
                if !seen.insert(id.as_str()) {
                    return Err(RequestError::Duplicate(id.clone()));
                }
                replica_of(id)
                    .filter(|(_, n)| *n < replicas)
                    .and_then(|(device, n)| {
                        Some((self.devices.iter().position(|d| d.id == device)?, n))
                    })
                    .ok_or_else(|| RequestError::UnknownDevice {
                        id: id.clone(),
                        resource: self.name.clone(),
                    })
            })
            .collect()
    }

    /// The replicas to offer a container asking `size` of them, among `available` and with
    /// every one of `must`: from the devices [`ReplicaAllocation`] says, each device's lowest
    /// free replica first.
    pub fn choose_replicas(
        &self,
        available: &[String],
        must: &[String],
        size: usize,
    ) -> Result<Vec<String>, RequestError> {
        // Without sharing no id is a replica's, and `replica_positions` refuses them all.
        let (one_each, allocation) = self
            .sharing
            .as_ref()
            .map_or((false, ReplicaAllocation::default()), |s| {
                (s.one_each, s.allocation)
            });
        if one_each && size > 1 {
            return Err(RequestError::MoreThanOneReplica(size));
        }
        let mut free: BTreeMap<usize, BTreeSet<u32>> = BTreeMap::new();
        for (position, n) in self.replica_positions(available)? {
            free.entry(position).or_default().insert(n);
        }
        let mut chosen: Vec<String> = Vec::with_capacity(size);
        for (position, n) in self.replica_positions(must)? {
            if let Some(f) = free.get_mut(&position) {
                f.remove(&n);
            }
            chosen.push(replica_id(&self.devices[position].id, n));
        }
        let left: usize = free.values().map(BTreeSet::len).sum();
        if chosen.len() + left < size {
            return Err(RequestError::TooFewReplicas {
                asked: size,
                available: chosen.len() + left,
            });
        }
        while chosen.len() < size {
            // Distributed: the device with the most replicas free (fewest given); packed: the
            // one with the fewest still free. Ties go to the lower position.
            let candidates = free.iter().filter(|(_, f)| !f.is_empty());
            let device = match allocation {
                ReplicaAllocation::Distributed => {
                    candidates.min_by_key(|(p, f)| (std::cmp::Reverse(f.len()), **p))
                }
                ReplicaAllocation::Packed => candidates.min_by_key(|(p, f)| (f.len(), **p)),
            }
            .map(|(p, _)| *p);
            let Some(position) = device else { break };
            let f = free.entry(position).or_default();
            let Some(n) = f.pop_first() else { break };
            chosen.push(replica_id(&self.devices[position].id, n));
        }
        Ok(chosen)
    }

    /// The kubelet's `Allocate` answer for one container.
    pub fn allocate(&self, ids: &[String]) -> Result<api::ContainerAllocateResponse, RequestError> {
        if ids.is_empty() {
            return Err(RequestError::Empty);
        }
        // The devices, each once, and how many replicas of each the container holds.
        let mut held: Vec<(&PluginDevice, u32)> = Vec::new();
        match &self.sharing {
            None => held.extend(
                self.positions(ids)?
                    .into_iter()
                    .map(|i| (&self.devices[i], 1)),
            ),
            Some(s) => {
                if s.one_each && ids.len() > 1 {
                    return Err(RequestError::MoreThanOneReplica(ids.len()));
                }
                for (i, _) in self.replica_positions(ids)? {
                    let d = &self.devices[i];
                    match held.iter_mut().find(|(h, _)| h.id == d.id) {
                        Some((_, n)) => *n += 1,
                        None => held.push((d, 1)),
                    }
                }
            }
        }
        let value: Vec<String> = held.iter().map(|(d, _)| self.visible_name(d)).collect();
        let spec = |path: &String| api::DeviceSpec {
            container_path: path.clone(),
            host_path: path.clone(),
            permissions: "rw".into(),
        };
        let mut devices: Vec<api::DeviceSpec> = held
            .iter()
            .flat_map(|(d, _)| d.dev_nodes.iter().map(spec))
            .collect();
        devices.extend(self.shared_dev_nodes.iter().map(spec));
        let cdi_devices = if self.cdi {
            held.iter()
                .map(|(d, _)| api::CdiDevice {
                    name: format!("{}={}", self.name, d.id),
                })
                .collect()
        } else {
            Vec::new()
        };
        let mut envs: std::collections::HashMap<String, String> =
            [(self.env.clone(), value.join(","))].into_iter().collect();
        let mut mounts = Vec::new();
        if let Some(s) = &self.sharing
            && let Some(root) = &s.mps_root
        {
            let (mps_envs, mps_mounts) = self.mps_client(root, s.replicas, &held);
            envs.extend(mps_envs);
            mounts = mps_mounts;
        }
        Ok(api::ContainerAllocateResponse {
            envs,
            mounts,
            devices,
            annotations: Default::default(),
            cdi_devices,
        })
    }

    /// What an MPS client container gets: the pipe of NVIDIA's control daemon for this
    /// resource (host `<root>/<resource>/pipe` at `/mps/<resource>/pipe`, as NVIDIA's plugin
    /// mounts it, and the daemon's `/dev/shm`), and its limits: per visible device (by its
    /// ordinal in the container) the replicas' part of the device's memory, and the replicas'
    /// part of the SMs (the least any device gives; one value covers all the client's devices).
    /// The daemon enforces both; the daemon's own defaults are set by NVIDIA's
    /// `mps-control-daemon` (docs/sharing.md).
    fn mps_client(
        &self,
        root: &str,
        replicas: u32,
        held: &[(&PluginDevice, u32)],
    ) -> (Vec<(String, String)>, Vec<api::Mount>) {
        const CONTAINER_ROOT: &str = "/mps";
        let root = root.trim_end_matches('/');
        let pipe = format!("{CONTAINER_ROOT}/{}/pipe", self.name);
        let limits: Vec<String> = held
            .iter()
            .enumerate()
            .filter_map(|(ordinal, (d, n))| {
                let part = d.memory_bytes? / u64::from(replicas.max(1)) / (1 << 20);
                Some(format!("{ordinal}={}M", part * u64::from(*n)))
            })
            .collect();
        let threads = held
            .iter()
            .map(|(_, n)| (n * 100 / replicas.max(1)).min(100))
            .min()
            .unwrap_or(0);
        let mut envs = vec![
            ("CUDA_MPS_PIPE_DIRECTORY".to_string(), pipe.clone()),
            (
                "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE".to_string(),
                threads.to_string(),
            ),
        ];
        if !limits.is_empty() {
            envs.push((
                "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT".to_string(),
                limits.join(","),
            ));
        }
        let mount = |host: String, container: String| api::Mount {
            container_path: container,
            host_path: host,
            read_only: false,
        };
        let mounts = vec![
            mount(format!("{root}/{}/pipe", self.name), pipe),
            mount(format!("{root}/shm"), "/dev/shm".into()),
        ];
        (envs, mounts)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use fumarole_topology::{CpuSet, DeviceKind, LinkClass, LinkMatrix, PciId};

    fn device(vendor: Vendor, pci: (u16, u16), index: u32, id: &str, nodes: &[&str]) -> Device {
        Device {
            id: id.into(),
            index,
            vendor,
            kind: DeviceKind::Gpu,
            model: "model".into(),
            pci_bus_id: format!("0000:{:02x}:00.0", index + 0x10),
            pci_path: Vec::new(),
            pci_id: PciId {
                vendor: pci.0,
                device: pci.1,
                class: 0x0302,
            },
            numa_node: Some(0),
            local_cpus: CpuSet::default(),
            dev_nodes: nodes.iter().map(|n| n.to_string()).collect(),
            health: Health::Healthy,
            uuid: (vendor == Vendor::Nvidia).then(|| id.to_string()),
            serial: None,
            memory_bytes: None,
            mig: Vec::new(),
        }
    }

    /// Two NVIDIA GPUs, two Ascend NPUs, one generic accelerator, with their nodes under a root.
    fn node() -> (NodeTopology, tempfile::TempDir) {
        let devices = vec![
            device(
                Vendor::Nvidia,
                (0x10de, 0x2330),
                0,
                "GPU-a",
                &["/dev/nvidia0"],
            ),
            device(
                Vendor::Nvidia,
                (0x10de, 0x2330),
                1,
                "GPU-b",
                &["/dev/nvidia1"],
            ),
            device(
                Vendor::Huawei,
                (0x19e5, 0xd801),
                0,
                "Ascend910-0",
                &["/dev/davinci0"],
            ),
            device(
                Vendor::Huawei,
                (0x19e5, 0xd801),
                1,
                "Ascend910-1",
                &["/dev/davinci1"],
            ),
            device(Vendor::Other, (0x1e52, 0x401e), 0, "0000:40:00.0", &[]),
        ];
        let n = devices.len();
        let t = NodeTopology {
            hostname: "n".into(),
            packages: Vec::new(),
            processing_units: Vec::new(),
            allowed_cpus: CpuSet::default(),
            numa_nodes: Vec::new(),
            devices,
            links: LinkMatrix::filled(n, LinkClass::CrossNuma),
            super_node: None,
        };
        let root = tempfile::tempdir().unwrap();
        let dev = root.path().join("dev");
        std::fs::create_dir_all(dev.join("accel")).unwrap();
        for f in [
            "nvidia0",
            "nvidia1",
            "nvidiactl",
            "nvidia-uvm",
            "davinci0",
            "davinci1",
            "davinci_manager",
            "accel/accel0",
            "accel_ctl",
        ] {
            std::fs::write(dev.join(f), "").unwrap();
        }
        (t, root)
    }

    fn config(text: &str) -> Config {
        Config::parse(text, Some(Path::new("dp.yaml"))).unwrap()
    }

    fn by_name<'a>(rs: &'a [Resource], name: &str) -> &'a Resource {
        rs.iter()
            .find(|r| r.name == name)
            .unwrap_or_else(|| panic!("no {name} in {rs:?}"))
    }

    fn paths(c: &api::ContainerAllocateResponse) -> Vec<&str> {
        c.devices.iter().map(|d| d.host_path.as_str()).collect()
    }

    #[test]
    fn defaults_per_vendor() {
        let (t, root) = node();
        let rs = resources(&t, root.path(), false);
        let names: Vec<&str> = rs.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "fumarole.dev/accelerator",
                "huawei.com/Ascend910",
                "nvidia.com/gpu"
            ]
        );
        let gpu = by_name(&rs, "nvidia.com/gpu");
        let c = gpu.allocate(&["GPU-b".into(), "GPU-a".into()]).unwrap();
        assert_eq!(c.envs["NVIDIA_VISIBLE_DEVICES"], "GPU-b,GPU-a");
        assert_eq!(
            paths(&c),
            [
                "/dev/nvidia1",
                "/dev/nvidia0",
                "/dev/nvidiactl",
                "/dev/nvidia-uvm"
            ]
        );
        assert!(c.cdi_devices.is_empty());
        let npu = by_name(&rs, "huawei.com/Ascend910");
        let c = npu.allocate(&["Ascend910-1".into()]).unwrap();
        assert_eq!(c.envs["ASCEND_VISIBLE_DEVICES"], "1");
        assert_eq!(paths(&c), ["/dev/davinci1", "/dev/davinci_manager"]);
        let acc = by_name(&rs, "fumarole.dev/accelerator");
        let c = acc.allocate(&["0000:40:00.0".into()]).unwrap();
        assert_eq!(c.envs["FUMAROLE_VISIBLE_DEVICES"], "0000:40:00.0");
        assert!(c.devices.is_empty());
        assert_eq!(
            acc.allocate(&[]).unwrap_err(),
            RequestError::Empty,
            "empty request"
        );
    }

    #[test]
    fn config_renames_and_sets_env_and_nodes() {
        let (t, root) = node();
        let c = config(
            r#"
resources:
  - match: {vendor: nvidia}
    resourceName: example.com/h100
    env: GPUS
    envValue: index
    sharedDeviceNodes: [/dev/nvidiactl, /dev/missing]
    cdi: true
  - match: {pciVendor: "0x1e52"}
    resourceName: example.com/npu
    env: EXAMPLE_VISIBLE_DEVICES
    envValue: busId
    deviceNodes: ["/dev/accel/accel{index}"]
    sharedDeviceNodes: [/dev/accel_ctl]
"#,
        );
        let rs = resources_with(&t, root.path(), false, &c).unwrap();
        let names: Vec<&str> = rs.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "example.com/h100",
                "example.com/npu",
                "huawei.com/Ascend910"
            ]
        );
        let gpu = by_name(&rs, "example.com/h100");
        let a = gpu.allocate(&["GPU-b".into()]).unwrap();
        assert_eq!(a.envs.len(), 1);
        assert_eq!(a.envs["GPUS"], "1");
        // A configured shared node that is missing is left out.
        assert_eq!(paths(&a), ["/dev/nvidia1", "/dev/nvidiactl"]);
        assert_eq!(a.cdi_devices[0].name, "example.com/h100=GPU-b");
        let npu = by_name(&rs, "example.com/npu");
        assert_eq!(npu.devices[0].dev_nodes, ["/dev/accel/accel0"]);
        assert!(npu.devices[0].healthy);
        let a = npu.allocate(&["0000:40:00.0".into()]).unwrap();
        assert_eq!(a.envs["EXAMPLE_VISIBLE_DEVICES"], "0000:10:00.0"); // busId, not the id
        assert_eq!(paths(&a), ["/dev/accel/accel0", "/dev/accel_ctl"]);
        assert!(a.cdi_devices.is_empty());
        // Unmatched Ascend keeps its defaults.
        let a = by_name(&rs, "huawei.com/Ascend910")
            .allocate(&["Ascend910-0".into()])
            .unwrap();
        assert_eq!(a.envs["ASCEND_VISIBLE_DEVICES"], "0");
    }

    #[test]
    fn configured_nodes_decide_health_and_disabled_devices_are_left_out() {
        let (t, root) = node();
        let c = config(
            r#"
resources:
  - match: {vendor: nvidia}
    deviceNodes: ["/dev/nvidia{index}", "/dev/gpu-extra{index}"]
  - match: {vendor: huawei}
    enabled: false
"#,
        );
        std::fs::write(root.path().join("dev/gpu-extra1"), "").unwrap();
        let rs = resources_with(&t, root.path(), true, &c).unwrap();
        assert!(rs.iter().all(|r| r.name != "huawei.com/Ascend910"));
        let gpu = by_name(&rs, "nvidia.com/gpu");
        assert_eq!(
            gpu.devices[1].dev_nodes,
            ["/dev/nvidia1", "/dev/gpu-extra1"]
        );
        assert_eq!(
            gpu.devices.iter().map(|d| d.healthy).collect::<Vec<_>>(),
            [false, true]
        );
        // --cdi applies where the entry does not say.
        assert!(gpu.cdi);
        // envValue uuid on a device without one: its id.
        let c = config("resources:\n  - match: {vendor: other}\n    envValue: uuid\n");
        let rs = resources_with(&t, root.path(), false, &c).unwrap();
        let a = by_name(&rs, "fumarole.dev/accelerator")
            .allocate(&["0000:40:00.0".into()])
            .unwrap();
        assert_eq!(a.envs["FUMAROLE_VISIBLE_DEVICES"], "0000:40:00.0");
        let a = gpu.allocate(&["GPU-a".into()]).unwrap();
        assert_eq!(a.envs["NVIDIA_VISIBLE_DEVICES"], "GPU-a");
    }

    #[test]
    fn first_match_wins_and_shared_names_need_equal_settings() {
        let (t, root) = node();
        // Everything into one resource: allowed, the settings agree.
        let c = config(
            r#"
resources:
  - match: {vendor: nvidia}
    resourceName: example.com/xpu
    env: XPUS
    envValue: id
    sharedDeviceNodes: []
  - match: {kind: gpu}
    resourceName: example.com/xpu
    env: XPUS
    envValue: id
    sharedDeviceNodes: []
"#,
        );
        let rs = resources_with(&t, root.path(), false, &c).unwrap();
        assert_eq!(rs.len(), 1);
        let ids: Vec<&str> = rs[0].devices.iter().map(|d| d.id.as_str()).collect();
        assert_eq!(
            ids,
            [
                "GPU-a",
                "GPU-b",
                "Ascend910-0",
                "Ascend910-1",
                "0000:40:00.0"
            ]
        );
        // Positions still point into the node's devices (link weights).
        assert_eq!(rs[0].devices[4].position, 4);

        // A renamed class landing on another vendor's default name with other settings.
        let c =
            config("resources:\n  - match: {vendor: other}\n    resourceName: nvidia.com/gpu\n");
        let e = resources_with(&t, root.path(), false, &c)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("dp.yaml: resource nvidia.com/gpu: device 0000:40:00.0 (resources[0]) would join devices of the nvidia defaults"),
            "{e}"
        );
    }
    #[test]
    fn split_gives_each_device_to_what_its_entry_says() {
        let (t, root) = node();
        let c = config(
            r#"
resources:
  - match: {vendor: huawei}
    servedBy: dra
  - match: {vendor: nvidia, model: "model"}
    servedBy: both
"#,
        );
        let (dp, dra) = split(resources_with(&t, root.path(), false, &c).unwrap());
        let names = |rs: &[Resource]| {
            rs.iter()
                .map(|r| format!("{}:{}", r.name, r.devices.len()))
                .collect::<Vec<_>>()
        };
        // Ascend is DRA only: no device-plugin resource at all.
        assert_eq!(
            names(&dp),
            ["fumarole.dev/accelerator:1", "nvidia.com/gpu:2"]
        );
        assert_eq!(names(&dra), ["huawei.com/Ascend910:2", "nvidia.com/gpu:2"]);
        // The DRA side keeps the resource's settings (env, shared nodes).
        let npu = by_name(&dra, "huawei.com/Ascend910");
        assert_eq!(npu.env, "ASCEND_VISIBLE_DEVICES");
        assert_eq!(npu.shared_dev_nodes, ["/dev/davinci_manager"]);
        // One entry can split a resource: a device matched by a DRA entry leaves it.
        let c = config(
            "resources:\n  - match: {vendor: nvidia, pciDevice: \"0x2330\", pciVendor: \"0x10de\"}\n    servedBy: dra\n",
        );
        let mut t2 = t.clone();
        t2.devices[1].pci_id.device = 0x2331;
        let (dp, dra) = split(resources_with(&t2, root.path(), false, &c).unwrap());
        let ids = |rs: &[Resource], name: &str| {
            by_name(rs, name)
                .devices
                .iter()
                .map(|d| d.id.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(ids(&dp, "nvidia.com/gpu"), ["GPU-b"]);
        assert_eq!(ids(&dra, "nvidia.com/gpu"), ["GPU-a"]);
    }

    /// The node's two NVIDIA GPUs shared as `sharing` says (80 GiB each).
    fn shared(sharing: &str) -> (Resource, tempfile::TempDir) {
        let (mut t, root) = node();
        for d in &mut t.devices {
            d.memory_bytes = Some(80 << 30);
        }
        let c = config(&format!(
            "resources:\n  - match: {{vendor: nvidia}}\n{sharing}"
        ));
        let rs = resources_with(&t, root.path(), false, &c).unwrap();
        let r = rs.into_iter().find(|r| r.vendor == Vendor::Nvidia).unwrap();
        (r, root)
    }

    fn ids(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    const TIME_SLICED: &str = "    sharing:\n      timeSlicing:\n        resources:\n          - {name: nvidia.com/gpu, replicas: 3}\n";

    #[test]
    fn replicas_are_advertised_under_their_device() {
        let (r, _root) = shared(TIME_SLICED);
        assert_eq!(r.name, "nvidia.com/gpu");
        let ads: Vec<(String, usize)> = r.advertised();
        assert_eq!(
            ads,
            [
                ("GPU-a::0".to_string(), 0),
                ("GPU-a::1".into(), 0),
                ("GPU-a::2".into(), 0),
                ("GPU-b::0".into(), 1),
                ("GPU-b::1".into(), 1),
                ("GPU-b::2".into(), 1),
            ]
        );
        let (renamed, _root) = shared(
            "    sharing:\n      timeSlicing:\n        renameByDefault: true\n        resources:\n          - {name: nvidia.com/gpu, replicas: 3}\n",
        );
        assert_eq!(renamed.name, "nvidia.com/gpu.shared");
        // Ids that are not this resource's replicas are refused by name.
        for bad in ["GPU-a", "GPU-a::3", "GPU-c::0", "GPU-a::x"] {
            assert_eq!(
                r.replica_positions(&ids(&[bad])).unwrap_err(),
                RequestError::UnknownDevice {
                    id: bad.into(),
                    resource: "nvidia.com/gpu".into()
                }
            );
        }
    }

    #[test]
    fn distributed_spreads_replicas_and_packed_fills_one_device() {
        let all = ids(&[
            "GPU-a::0", "GPU-a::1", "GPU-a::2", "GPU-b::0", "GPU-b::1", "GPU-b::2",
        ]);
        let (spread, _root) = shared(TIME_SLICED);
        assert_eq!(
            spread.choose_replicas(&all, &[], 2).unwrap(),
            ["GPU-a::0", "GPU-b::0"]
        );
        // GPU-a has given two replicas: the next goes to GPU-b, which has given none.
        let after = ids(&["GPU-a::2", "GPU-b::0", "GPU-b::1", "GPU-b::2"]);
        assert_eq!(
            spread.choose_replicas(&after, &[], 1).unwrap(),
            ["GPU-b::0"]
        );

        let (packed, _root) = shared(&format!("{TIME_SLICED}    replicaAllocation: packed\n"));
        assert_eq!(
            packed.choose_replicas(&all, &[], 2).unwrap(),
            ["GPU-a::0", "GPU-a::1"]
        );
        // GPU-a, already shared, before GPU-b, which is still free.
        assert_eq!(
            packed.choose_replicas(&after, &[], 1).unwrap(),
            ["GPU-a::2"]
        );
        assert_eq!(
            packed.choose_replicas(&after, &[], 2).unwrap(),
            ["GPU-a::2", "GPU-b::0"]
        );
        // What the kubelet must include comes first, is not offered twice, and packing goes
        // on beside it.
        assert_eq!(
            packed
                .choose_replicas(&all, &ids(&["GPU-b::1"]), 2)
                .unwrap(),
            ["GPU-b::1", "GPU-b::0"]
        );
        assert_eq!(
            packed.choose_replicas(&after, &[], 5).unwrap_err(),
            RequestError::TooFewReplicas {
                asked: 5,
                available: 4
            }
        );
    }

    #[test]
    fn a_container_of_replicas_sees_each_device_once() {
        let (r, _root) = shared(TIME_SLICED);
        let c = r
            .allocate(&ids(&["GPU-a::0", "GPU-a::2", "GPU-b::1"]))
            .unwrap();
        assert_eq!(c.envs["NVIDIA_VISIBLE_DEVICES"], "GPU-a,GPU-b");
        assert_eq!(paths(&c)[..2], ["/dev/nvidia0", "/dev/nvidia1"]);
        assert!(c.mounts.is_empty());
        assert!(!c.envs.contains_key("CUDA_MPS_PIPE_DIRECTORY"));
        assert_eq!(
            r.allocate(&ids(&["GPU-a::0", "GPU-a::0"])).unwrap_err(),
            RequestError::Duplicate("GPU-a::0".into())
        );
        // failRequestsGreaterThanOne, in NVIDIA's words.
        let (one, _root) = shared(
            "    sharing:\n      timeSlicing:\n        failRequestsGreaterThanOne: true\n        resources:\n          - {name: nvidia.com/gpu, replicas: 3}\n",
        );
        let e = one.allocate(&ids(&["GPU-a::0", "GPU-b::0"])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid request: maximum request size for shared resources is 1; found 2"
        );
        assert_eq!(
            one.choose_replicas(&ids(&["GPU-a::0", "GPU-b::0"]), &[], 2)
                .unwrap_err(),
            RequestError::MoreThanOneReplica(2)
        );
        assert!(one.allocate(&ids(&["GPU-b::2"])).is_ok());
    }

    #[test]
    fn an_mps_client_gets_the_daemons_pipe_and_its_part_of_the_device() {
        let (r, _root) = shared(
            "    sharing:\n      mps:\n        failRequestsGreaterThanOne: false\n        resources:\n          - {name: nvidia.com/gpu, replicas: 4}\n    mpsRoot: /var/run/mps\n",
        );
        let c = r.allocate(&ids(&["GPU-b::3"])).unwrap();
        assert_eq!(c.envs["NVIDIA_VISIBLE_DEVICES"], "GPU-b");
        assert_eq!(
            c.envs["CUDA_MPS_PIPE_DIRECTORY"],
            "/mps/nvidia.com/gpu/pipe"
        );
        // 80 GiB / 4 = 20480 MiB, and a quarter of the SMs.
        assert_eq!(c.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"], "0=20480M");
        assert_eq!(c.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], "25");
        let mounts: Vec<(&str, &str)> = c
            .mounts
            .iter()
            .map(|m| (m.host_path.as_str(), m.container_path.as_str()))
            .collect();
        assert_eq!(
            mounts,
            [
                (
                    "/var/run/mps/nvidia.com/gpu/pipe",
                    "/mps/nvidia.com/gpu/pipe"
                ),
                ("/var/run/mps/shm", "/dev/shm")
            ]
        );
        // Two replicas of GPU-a and one of GPU-b: limits per device ordinal, and the SM share
        // the smaller part gives.
        let c = r
            .allocate(&ids(&["GPU-a::0", "GPU-b::0", "GPU-a::1"]))
            .unwrap();
        assert_eq!(c.envs["NVIDIA_VISIBLE_DEVICES"], "GPU-a,GPU-b");
        assert_eq!(
            c.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"],
            "0=40960M,1=20480M"
        );
        assert_eq!(c.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], "25");
    }

    #[test]
    fn sharing_refuses_devices_it_cannot_share() {
        let (t, root) = node();
        // MPS on GPUs whose memory is unknown.
        let c = config(
            "resources:\n  - match: {vendor: nvidia}\n    sharing:\n      mps:\n        resources:\n          - {name: nvidia.com/gpu, replicas: 2}\n",
        );
        let e = resources_with(&t, root.path(), false, &c)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("resources[0].sharing: mps: device GPU-a's memory is unknown"),
            "{e}"
        );
        // An entry that matches Ascend NPUs.
        let c = config(&format!(
            "resources:\n  - match: {{kind: gpu}}\n{TIME_SLICED}"
        ));
        let e = resources_with(&t, root.path(), false, &c)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("resources[0].sharing: matches device Ascend910-0 (huawei model): sharing applies to NVIDIA GPUs only"),
            "{e}"
        );
        // Replicas of one GPU and another GPU whole under one name: refused, naming sharing.
        let mut t2 = t.clone();
        t2.devices[1].pci_id.device = 0x2331;
        let c = config(&format!(
            "resources:\n  - match: {{pciVendor: \"0x10de\", pciDevice: \"0x2330\"}}\n{TIME_SLICED}"
        ));
        let e = resources_with(&t2, root.path(), false, &c)
            .unwrap_err()
            .to_string();
        assert!(e.contains("resource nvidia.com/gpu: device GPU-b"), "{e}");
        assert!(e.contains("sharing"), "{e}");
    }

    /// The node's first NVIDIA GPU an H100 in MIG mode with `profiles`.
    fn mig_node(profiles: &[&str]) -> (NodeTopology, tempfile::TempDir) {
        let (mut t, root) = node();
        t.devices[0].model = "NVIDIA H100 80GB HBM3".into();
        t.devices[0].mig = profiles
            .iter()
            .enumerate()
            .map(|(i, p)| fumarole_topology::MigInstance {
                uuid: format!("MIG-{i}"),
                profile: p.to_string(),
                memory_bytes: None,
            })
            .collect();
        (t, root)
    }

    #[test]
    fn a_gpu_in_mig_mode_is_served_as_its_mig_devices() {
        let (t, root) = mig_node(&["3g.40gb", "1g.10gb", "1g.10gb+me"]);
        let rs = resources_with(&t, root.path(), false, &Config::default()).unwrap();
        let ids = |name: &str| -> Vec<String> {
            by_name(&rs, name)
                .devices
                .iter()
                .map(|d| d.id.clone())
                .collect()
        };
        assert_eq!(ids("nvidia.com/mig-3g.40gb"), ["MIG-0"]);
        assert_eq!(ids("nvidia.com/mig-1g.10gb"), ["MIG-1"]);
        assert_eq!(ids("nvidia.com/mig-1g.10gb.me"), ["MIG-2"]);
        // The GPU itself is not offered whole; the other GPU is.
        assert_eq!(ids("nvidia.com/gpu"), ["GPU-b"]);
        let mig = &by_name(&rs, "nvidia.com/mig-1g.10gb");
        assert!(!mig.placed_by_scheduler());
        assert!(by_name(&rs, "nvidia.com/gpu").placed_by_scheduler());
        let d = &mig.devices[0];
        // The GPU's health, place and nodes; the MIG uuid in the container.
        assert_eq!(d.health_id(), "GPU-a");
        assert_eq!((d.position, d.numa_node), (0, Some(0)));
        let c = mig.allocate(&["MIG-1".to_string()]).unwrap();
        assert_eq!(c.envs["NVIDIA_VISIBLE_DEVICES"], "MIG-1");
        assert_eq!(paths(&c)[0], "/dev/nvidia0");
        // An entry for the GPU that would serve it otherwise is refused, naming the key.
        for (entry, key) in [
            ("    servedBy: dra\n", "servedBy"),
            ("    resourceName: example.com/gpu\n", "resourceName"),
            (TIME_SLICED, "sharing"),
        ] {
            let c = config(&format!(
                "resources:\n  - match: {{vendor: nvidia}}\n{entry}"
            ));
            let e = resources_with(&t, root.path(), false, &c)
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(&format!(
                    "resources[0].{key}: matches GPU GPU-a, which is in MIG mode"
                )),
                "{e}"
            );
        }
        // Unless its MIG devices are DRA's own partitions: the GPU is served whole through
        // DRA (an agent started again while claims hold partitions).
        let c = config(
            "resources:\n  - match: {vendor: nvidia}\n    servedBy: dra\n    draPartitions: true\n",
        );
        let rs = resources_with(&t, root.path(), false, &c).unwrap();
        let gpus = by_name(&rs, "nvidia.com/gpu");
        let ids: Vec<&str> = gpus.devices.iter().map(|d| d.id.as_str()).collect();
        assert_eq!(ids, ["GPU-a", "GPU-b"]);
        assert!(gpus.devices.iter().all(|d| d.dra_partitions));
        assert!(rs.iter().all(|r| !r.name.starts_with("nvidia.com/mig-")));
    }

    #[test]
    fn a_mig_layout_is_checked_against_the_table_and_compared_with_nvml() {
        let h100 = |profiles: &[&str]| mig_node(profiles).0.devices[0].clone();
        let layout = |l: &[&str]| l.iter().map(|p| p.to_string()).collect::<Vec<_>>();
        let want = layout(&["3g.40gb", "1g.10gb", "1g.10gb"]);
        assert_eq!(
            check_mig_layout(&h100(&["1g.10gb", "3g.40gb", "1g.10gb"]), &want),
            Ok(None)
        );
        assert_eq!(
            check_mig_layout(&h100(&["3g.40gb", "2g.20gb"]), &want),
            Ok(Some(
                "GPU GPU-a: migLayout says [1g.10gb, 1g.10gb, 3g.40gb], NVML reports [2g.20gb, 3g.40gb]"
                    .into()
            ))
        );
        let e = check_mig_layout(&h100(&[]), &layout(&["2g.15gb"])).unwrap_err();
        assert!(
            e.starts_with(
                "2g.15gb is not a MIG profile of GPU-a (NVIDIA H100 80GB HBM3): one of 1g.10gb"
            ),
            "{e}"
        );
        let e = check_mig_layout(&h100(&[]), &layout(&["7g.80gb", "1g.10gb"])).unwrap_err();
        assert!(e.starts_with("does not fit in GPU-a"), "{e}");
        // Not an NVIDIA GPU with a MIG table.
        let (t, _root) = node();
        let e = check_mig_layout(&t.devices[2], &layout(&["1g.10gb"])).unwrap_err();
        assert!(e.contains("no MIG profiles fumarole knows"), "{e}");
        // At start: an error names the file, the entry and the key.
        let (t, root) = mig_node(&["3g.40gb"]);
        let c =
            config("resources:\n  - match: {vendor: nvidia}\n    migLayout: [4g.40gb, 4g.40gb]\n");
        let e = resources_with(&t, root.path(), false, &c)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("resources[0].migLayout: does not fit in GPU-a"),
            "{e}"
        );
    }
}
