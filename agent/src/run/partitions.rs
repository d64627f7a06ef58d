//! The partitions DRA claims on partitionable devices hold (`draPartitions`), made and removed
//! for the DRA plugin's prepare and unprepare: MIG instances through the NVML library
//! ([`fumarole_exporter::mig`]), Ascend vNPUs through the DCMI library
//! ([`fumarole_exporter::vnpu`]).

use fumarole_device_plugin::dra::node::Partitioner;
use fumarole_exporter::mig::MigLibrary;
use fumarole_exporter::vnpu::VnpuLibrary;
use fumarole_topology::dra::{MadePartition, Partition};
use fumarole_topology::{Device, Vendor};

/// The DRA plugin's [`Partitioner`] over the vendor libraries the node has.
pub struct LibraryPartitions {
    pub mig: Option<MigLibrary>,
    pub vnpu: Option<VnpuLibrary>,
}

impl Partitioner for LibraryPartitions {
    fn makes(&self, vendor: Vendor) -> bool {
        match vendor {
            Vendor::Nvidia => self.mig.is_some(),
            Vendor::Huawei => self.vnpu.is_some(),
            _ => false,
        }
    }

    fn create(&self, parent: &Device, partition: &Partition) -> Result<MadePartition, String> {
        match (parent.vendor, &self.mig, &self.vnpu) {
            (Vendor::Nvidia, Some(mig), _) => {
                let uuid = parent
                    .uuid
                    .as_deref()
                    .ok_or_else(|| format!("GPU {} has no uuid from NVML", parent.id))?;
                mig.create(uuid, partition.profile, partition.placement)
            }
            (Vendor::Huawei, _, Some(vnpu)) => vnpu.create(&parent.id, partition.profile.name),
            _ => Err(format!(
                "no library on this node makes partitions of {} ({})",
                parent.id,
                parent.vendor.as_str()
            )),
        }
    }

    fn destroy(&self, parent: &str, made: &MadePartition) -> Result<(), String> {
        match (made, &self.mig, &self.vnpu) {
            (MadePartition::Mig { .. }, Some(mig), _) => mig.destroy(parent, made),
            (MadePartition::Vnpu { .. }, _, Some(vnpu)) => vnpu.destroy(parent, made),
            _ => Err(format!(
                "no library on this node removes {made:?} of {parent}"
            )),
        }
    }
}
