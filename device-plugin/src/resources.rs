//! Which extended resources a node offers and what a container gets for its devices.
//!
//! Devices are grouped by resource name (`nvidia.com/gpu`, `huawei.com/Ascend910`,
//! `metax-tech.com/gpu`, ...). [`Resource::allocate`] answers the kubelet's `Allocate` per
//! vendor convention: NVIDIA `NVIDIA_VISIBLE_DEVICES` (uuids), Ascend `ASCEND_VISIBLE_DEVICES`
//! (davinci numbers) plus the manager nodes, others `FUMAROLE_VISIBLE_DEVICES` (device ids);
//! device specs for every device node; CDI names when enabled.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use fumarole_topology::{Health, NodeTopology, Vendor};

use crate::api;

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

/// The resources of a node. `root` is where `/dev` is read (the host, or a fixture).
pub fn resources(t: &NodeTopology, root: &Path, cdi: bool) -> Vec<Resource> {
    let mut by_name: BTreeMap<String, Resource> = BTreeMap::new();
    for (position, d) in t.devices.iter().enumerate() {
        let name = d.default_resource_name();
        let r = by_name.entry(name.clone()).or_insert_with(|| Resource {
            name,
            vendor: d.vendor,
            devices: Vec::new(),
            shared_dev_nodes: shared_nodes(d.vendor)
                .iter()
                .filter(|n| root.join(n.trim_start_matches('/')).exists())
                .map(|n| n.to_string())
                .collect(),
            cdi,
        });
        let dev_nodes = if d.dev_nodes.is_empty() {
            primary_node(d.vendor, d.index).into_iter().collect()
        } else {
            d.dev_nodes.clone()
        };
        r.devices.push(PluginDevice {
            id: d.id.clone(),
            index: d.index,
            position,
            numa_node: d.numa_node,
            dev_nodes,
            healthy: d.health == Health::Healthy,
        });
    }
    by_name.into_values().collect()
}

impl Resource {
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

    /// The kubelet's `Allocate` answer for one container.
    pub fn allocate(&self, ids: &[String]) -> Result<api::ContainerAllocateResponse, RequestError> {
        if ids.is_empty() {
            return Err(RequestError::Empty);
        }
        let chosen: Vec<&PluginDevice> = self
            .positions(ids)?
            .into_iter()
            .map(|i| &self.devices[i])
            .collect();
        let (env, value) = match self.vendor {
            Vendor::Nvidia => (
                "NVIDIA_VISIBLE_DEVICES",
                chosen.iter().map(|d| d.id.clone()).collect::<Vec<_>>(),
            ),
            Vendor::Huawei => (
                "ASCEND_VISIBLE_DEVICES",
                chosen.iter().map(|d| d.index.to_string()).collect(),
            ),
            _ => (
                "FUMAROLE_VISIBLE_DEVICES",
                chosen.iter().map(|d| d.id.clone()).collect(),
            ),
        };
        let spec = |path: &String| api::DeviceSpec {
            container_path: path.clone(),
            host_path: path.clone(),
            permissions: "rw".into(),
        };
        let mut devices: Vec<api::DeviceSpec> = chosen
            .iter()
            .flat_map(|d| d.dev_nodes.iter().map(spec))
            .collect();
        devices.extend(self.shared_dev_nodes.iter().map(spec));
        let cdi_devices = if self.cdi {
            chosen
                .iter()
                .map(|d| api::CdiDevice {
                    name: format!("{}={}", self.name, d.id),
                })
                .collect()
        } else {
            Vec::new()
        };
        Ok(api::ContainerAllocateResponse {
            envs: [(env.to_string(), value.join(","))].into_iter().collect(),
            mounts: Vec::new(),
            devices,
            annotations: Default::default(),
            cdi_devices,
        })
    }
}
