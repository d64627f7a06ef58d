//! Ascend vNPUs made and removed through Huawei's DCMI library, for DRA claims on vNPU
//! partitions ([`fumarole_topology::dra::partitions`]): a vNPU of a template on a chip, found
//! by its physical id, and later destroyed again by its vdev id. The calls are DCMI's
//! `dcmi_create_vdevice` and `dcmi_set_destroy_vdevice` ([`crate::device_health::dcmi::ffi`]).

use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

use fumarole_topology::dra::MadePartition;

use crate::device_health::dcmi::ffi::Dcmi;
use crate::device_health::dcmi::{Located, locate};

/// The DCMI library vNPUs are made through, loaded and initialised at the first call (and
/// again after a failed one), with the node's chips located then.
pub struct VnpuLibrary {
    path: PathBuf,
    /// The node's Ascend NPUs: (davinci index, device id).
    devices: Vec<(u32, String)>,
    loaded: Mutex<Option<Arc<Loaded>>>,
}

struct Loaded {
    dcmi: Dcmi,
    chips: Vec<Located>,
}

impl VnpuLibrary {
    pub fn new(path: PathBuf, devices: Vec<(u32, String)>) -> Self {
        Self {
            path,
            devices,
            loaded: Mutex::new(None),
        }
    }

    fn loaded(&self) -> Result<Arc<Loaded>, String> {
        let mut loaded = self.loaded.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(l) = loaded.as_ref() {
            return Ok(l.clone());
        }
        let dcmi = Dcmi::open(&self.path).map_err(|e| e.to_string())?;
        dcmi.init().map_err(|e| e.to_string())?;
        let chips = locate(&dcmi, &self.devices);
        let l = Arc::new(Loaded { dcmi, chips });
        *loaded = Some(l.clone());
        Ok(l)
    }

    /// Makes a vNPU of `template` (`vir02`) on the chip whose device id is `npu`
    /// (`Ascend910-2`).
    pub fn create(&self, npu: &str, template: &str) -> Result<MadePartition, String> {
        let l = self.loaded()?;
        let chip = chip(&l, npu)?;
        let vdev_id = l
            .dcmi
            .create_vdevice(chip.card, chip.chip, template)
            .map_err(|e| format!("making a {template} vNPU on {npu}: {e}"))?;
        Ok(MadePartition::Vnpu { vdev_id })
    }

    /// Destroys a vNPU [`Self::create`] made on `npu`.
    pub fn destroy(&self, npu: &str, made: &MadePartition) -> Result<(), String> {
        let &MadePartition::Vnpu { vdev_id } = made else {
            return Err(format!("{made:?} is not a vNPU"));
        };
        let l = self.loaded()?;
        let chip = chip(&l, npu)?;
        l.dcmi
            .destroy_vdevice(chip.card, chip.chip, vdev_id)
            .map_err(|e| format!("destroying vNPU {vdev_id} of {npu}: {e}"))
    }
}

/// The located chip that is device `npu`.
fn chip<'l>(l: &'l Loaded, npu: &str) -> Result<&'l Located, String> {
    l.chips
        .iter()
        .find(|c| c.id == npu)
        .ok_or_else(|| format!("DCMI lists no chip that is {npu}"))
}
