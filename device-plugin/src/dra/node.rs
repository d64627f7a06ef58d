//! The devices the DRA plugin serves on this node: [`DraNode`], the node's topology and the
//! DRA side of its resources ([`crate::resources::split`]), looked up by driver and device
//! name exactly as the exporter names them in ResourceSlices ([`fumarole_topology::dra`]).

use std::sync::Arc;

use fumarole_topology::dra::{self, MadePartition, Partition};
use fumarole_topology::{Device, NodeTopology};

use crate::resources::{PluginDevice, Resource};

/// This node as the DRA plugin serves it.
#[derive(Clone, Debug)]
pub struct DraNode {
    /// The node's name, which is its pool's name.
    pub node_name: String,
    topology: NodeTopology,
    /// The resources' DRA-served devices, with their resource's env vars and shared nodes.
    resources: Vec<Resource>,
    /// Makes the partitions claims hold (MIG instances through NVML, vNPUs through DCMI), when
    /// the node can.
    partitioner: Option<Arc<dyn Partitioner>>,
}

/// Makes and removes the hardware partitions DRA claims hold. Calls may block (a vendor
/// library): the plugin makes them off its async threads.
pub trait Partitioner: Send + Sync {
    /// Whether it can make the partitions of `vendor`'s devices on this node.
    fn makes(&self, vendor: fumarole_topology::Vendor) -> bool;
    /// Makes `partition` of device `parent`.
    fn create(&self, parent: &Device, partition: &Partition) -> Result<MadePartition, String>;
    /// Removes what [`Partitioner::create`] made on the device of uuid `parent_uuid`; what is
    /// already gone is not an error.
    fn destroy(&self, parent_uuid: &str, made: &MadePartition) -> Result<(), String>;
}

impl std::fmt::Debug for dyn Partitioner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Partitioner")
    }
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
    /// A partition (`draPartitions`) this node cannot make: no vendor library to make it.
    #[error(
        "device {device:?} is a {profile} partition of {id} on node {node}: this DRA plugin cannot make it here (MIG instances need the NVML library, vNPUs the DCMI library), so it cannot prepare the claim"
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
            partitioner: None,
        }
    }

    /// With `p` making the partitions claims hold.
    pub fn with_partitioner(mut self, p: Arc<dyn Partitioner>) -> Self {
        self.partitioner = Some(p);
        self
    }

    pub fn partitioner(&self) -> Option<&Arc<dyn Partitioner>> {
        self.partitioner.as_ref()
    }

    /// When `driver`'s device `name` is a partition of a served device here: the device it
    /// is cut from (as served, and as discovered), and the partition; `Err` when this node
    /// cannot make it.
    pub fn partition(
        &self,
        driver: &str,
        name: &str,
    ) -> Option<Result<(Served<'_>, &Device, Partition), LookupError>> {
        let (d, p) = dra::find_partition(&self.topology, driver, name)?;
        let not_here = || LookupError::PartitionNotCreated {
            device: name.to_string(),
            profile: p.profile.name.to_string(),
            id: d.id.clone(),
            node: self.node_name.clone(),
        };
        // Made through the partitioner, which says which vendors it can make.
        if !self.partitioner.as_ref().is_some_and(|p| p.makes(d.vendor)) {
            return Some(Err(not_here()));
        }
        Some(match self.served().find(|s| s.device.id == d.id) {
            Some(parent) => Ok((parent, d, p)),
            None => Err(LookupError::NotServed {
                device: name.to_string(),
                id: d.id.clone(),
                node: self.node_name.clone(),
            }),
        })
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
