//! The devices the DRA plugin serves on this node: [`DraNode`], the node's topology and the
//! DRA side of its resources ([`crate::resources::split`]), looked up by driver and device
//! name exactly as the exporter names them in ResourceSlices ([`fumarole_topology::dra`]).

use fumarole_topology::NodeTopology;
use fumarole_topology::dra;

use crate::resources::{PluginDevice, Resource};

/// This node as the DRA plugin serves it.
#[derive(Clone, Debug)]
pub struct DraNode {
    /// The node's name, which is its pool's name.
    pub node_name: String,
    topology: NodeTopology,
    /// The resources' DRA-served devices, with their resource's env vars and shared nodes.
    resources: Vec<Resource>,
}

/// A device found by name, with the resource that says what a container gets for it.
#[derive(Clone, Copy, Debug)]
pub struct Served<'a> {
    pub resource: &'a Resource,
    pub device: &'a PluginDevice,
}

/// Why a device name of a claim cannot be served here.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LookupError {
    /// No device of this node has that name under that driver.
    #[error("device {device:?} of driver {driver} is not a device of node {node}")]
    Unknown {
        driver: String,
        device: String,
        node: String,
    },
    /// The device exists but its configuration does not serve it through DRA.
    #[error(
        "device {device:?} ({id}) of node {node} is not served through DRA (its device-plugin config entry says servedBy: devicePlugin)"
    )]
    NotServed {
        device: String,
        id: String,
        node: String,
    },
    /// A partition (`draPartitions`): scheduled, but this plugin does not create partitions.
    #[error(
        "device {device:?} is a {profile} partition of {id} on node {node}: the scheduler may allocate partitions, but this DRA plugin does not yet create them (a MIG instance through NVML, a vNPU through DCMI), so it cannot prepare the claim"
    )]
    PartitionNotCreated {
        device: String,
        profile: String,
        id: String,
        node: String,
    },
}

impl DraNode {
    /// `resources` are the DRA-served resources of `topology` (the second half of
    /// [`crate::resources::split`]).
    pub fn new(node_name: &str, topology: NodeTopology, resources: Vec<Resource>) -> Self {
        Self {
            node_name: node_name.to_string(),
            topology,
            resources,
        }
    }

    /// The drivers with at least one served device, in [`dra::DRIVERS`] order.
    pub fn drivers(&self) -> Vec<&'static str> {
        dra::DRIVERS
            .into_iter()
            .filter(|driver| {
                self.served().any(|s| {
                    self.topology
                        .devices
                        .get(s.device.position)
                        .is_some_and(|d| dra::driver(d) == *driver)
                })
            })
            .collect()
    }

    /// Every served device.
    pub fn served(&self) -> impl Iterator<Item = Served<'_>> {
        self.resources.iter().flat_map(|resource| {
            resource
                .devices
                .iter()
                .map(move |device| Served { resource, device })
        })
    }

    /// The served device `driver` publishes as `name`.
    pub fn lookup(&self, driver: &str, name: &str) -> Result<Served<'_>, LookupError> {
        if let Some((d, p)) = dra::find_partition(&self.topology, driver, name) {
            return Err(LookupError::PartitionNotCreated {
                device: name.to_string(),
                profile: p.profile.name.to_string(),
                id: d.id.clone(),
                node: self.node_name.clone(),
            });
        }
        let Some(d) = dra::find(&self.topology, driver, name) else {
            return Err(LookupError::Unknown {
                driver: driver.to_string(),
                device: name.to_string(),
                node: self.node_name.clone(),
            });
        };
        self.served()
            .find(|s| s.device.id == d.id)
            .ok_or_else(|| LookupError::NotServed {
                device: name.to_string(),
                id: d.id.clone(),
                node: self.node_name.clone(),
            })
    }
}
