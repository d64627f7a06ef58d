//! The MIG instances DRA claims on partitions hold (`draPartitions`), made and removed through
//! the NVML library ([`fumarole_exporter::mig`]) for the DRA plugin's prepare and unprepare.

use fumarole_device_plugin::dra::node::Partitioner;
use fumarole_exporter::mig::MigLibrary;
use fumarole_topology::Device;
use fumarole_topology::dra::{MadePartition, Partition};

/// The DRA plugin's [`Partitioner`] over the NVML library.
pub struct NvmlPartitions(pub MigLibrary);

impl Partitioner for NvmlPartitions {
    fn create(&self, parent: &Device, partition: &Partition) -> Result<MadePartition, String> {
        let uuid = parent
            .uuid
            .as_deref()
            .ok_or_else(|| format!("GPU {} has no uuid from NVML", parent.id))?;
        self.0.create(uuid, partition.profile, partition.placement)
    }

    fn destroy(&self, parent_uuid: &str, made: &MadePartition) -> Result<(), String> {
        self.0.destroy(parent_uuid, made)
    }
}
