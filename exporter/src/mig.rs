//! MIG instances made and removed through NVML, for DRA claims on partitions
//! ([`fumarole_topology::dra::partitions`]): a GPU instance of a profile at a placement, the
//! compute instance that fills it, and the MIG device's uuid; later, both destroyed again by
//! their ids. The calls are NVML's (`nvmlDeviceGetGpuInstanceProfileInfo`,
//! `nvmlDeviceCreateGpuInstanceWithPlacement`, `nvmlGpuInstanceGetComputeInstanceProfileInfo`,
//! `nvmlGpuInstanceCreateComputeInstance`, `nvmlDeviceGetGpuInstanceById`, ...), through
//! `nvml-wrapper-sys`: `nvml-wrapper` does not wrap them.

use std::ffi::c_uint;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

use fumarole_topology::dra::MadePartition;
use fumarole_topology::share::Profile;
use nvml_wrapper::Nvml;
use nvml_wrapper_sys::bindings::*;

use crate::discover::nvml::open_library;

/// The NVML library MIG instances are made through: `lib_path` (default
/// `libnvidia-ml.so.1`), loaded at the first call, and again after a failed load.
pub struct MigLibrary {
    lib_path: Option<PathBuf>,
    nvml: Mutex<Option<Arc<Nvml>>>,
}

impl MigLibrary {
    pub fn new(lib_path: Option<PathBuf>) -> Self {
        Self {
            lib_path,
            nvml: Mutex::new(None),
        }
    }

    fn nvml(&self) -> Result<Arc<Nvml>, String> {
        let mut nvml = self.nvml.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = nvml.as_ref() {
            return Ok(n.clone());
        }
        let opened = open_library(self.lib_path.as_deref())
            .map_err(|e| e.to_string())?
            .ok_or("no NVML library on this node: MIG instances cannot be made")?;
        let opened = Arc::new(opened);
        *nvml = Some(opened.clone());
        Ok(opened)
    }

    /// [`create`] through this library.
    pub fn create(&self, gpu_uuid: &str, p: &Profile, start: u32) -> Result<MadePartition, String> {
        create(&*self.nvml()?, gpu_uuid, p, start)
    }

    /// [`destroy`] through this library.
    pub fn destroy(&self, gpu_uuid: &str, made: &MadePartition) -> Result<(), String> {
        destroy(&*self.nvml()?, gpu_uuid, made)
    }
}

/// NVML's GPU instance profile for `p` (`1g.10gb` -> `NVML_GPU_INSTANCE_PROFILE_1_SLICE`,
/// the `+me` profiles `_REV1`, the one-compute-slice profiles with two memory slices
/// (`1g.20gb`, A100 40GB's `1g.10gb`) `_REV2`), and the compute instance profile that fills it.
fn profiles(p: &Profile) -> Option<(c_uint, c_uint)> {
    let media = p.name.ends_with("+me");
    let gi = match (p.uses.compute, p.uses.memory, media) {
        (1, _, true) => NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1,
        (1, 1, false) => NVML_GPU_INSTANCE_PROFILE_1_SLICE,
        (1, 2, false) => NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2,
        (2, _, _) => NVML_GPU_INSTANCE_PROFILE_2_SLICE,
        (3, _, _) => NVML_GPU_INSTANCE_PROFILE_3_SLICE,
        (4, _, _) => NVML_GPU_INSTANCE_PROFILE_4_SLICE,
        (7, _, _) => NVML_GPU_INSTANCE_PROFILE_7_SLICE,
        _ => return None,
    };
    let ci = match p.uses.compute {
        1 => NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE,
        2 => NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE,
        3 => NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE,
        4 => NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE,
        _ => NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE,
    };
    Some((gi, ci))
}

/// `call` of the library, or an error naming it.
macro_rules! sym {
    ($nvml:expr, $call:ident) => {
        $nvml
            .lib()
            .$call
            .as_ref()
            .map_err(|e| format!("{}: not in the NVML library: {e}", stringify!($call)))?
    };
}

fn checked(call: &str, code: nvmlReturn_t) -> Result<(), String> {
    if code == nvmlReturn_enum_NVML_SUCCESS {
        Ok(())
    } else {
        Err(format!("{call}: NVML error {code}"))
    }
}

fn gpu_handle(nvml: &Nvml, uuid: &str) -> Result<nvmlDevice_t, String> {
    let device = nvml
        .device_by_uuid(uuid)
        .map_err(|e| format!("GPU {uuid}: {e}"))?;
    // SAFETY: the handle is only used while `nvml` lives, for calls on this GPU.
    Ok(unsafe { device.handle() })
}

/// Makes a MIG device of profile `p` at memory slice `start` on GPU `gpu_uuid` (in MIG mode).
/// Nothing is left behind on an error.
pub fn create(
    nvml: &Nvml,
    gpu_uuid: &str,
    p: &Profile,
    start: u32,
) -> Result<MadePartition, String> {
    let (gi_profile, ci_profile) =
        profiles(p).ok_or_else(|| format!("{}: no NVML GPU instance profile", p.name))?;
    let device = gpu_handle(nvml, gpu_uuid)?;
    // SAFETY (every call below): NVML calls with this GPU's handle, instance handles NVML
    // gave, and out-parameters of the types NVML writes.
    let mut info: nvmlGpuInstanceProfileInfo_t = unsafe { std::mem::zeroed() };
    let code =
        unsafe { sym!(nvml, nvmlDeviceGetGpuInstanceProfileInfo)(device, gi_profile, &mut info) };
    checked("nvmlDeviceGetGpuInstanceProfileInfo", code)?;
    let placement = nvmlGpuInstancePlacement_t {
        start,
        size: p.uses.memory,
    };
    let mut gi: nvmlGpuInstance_t = std::ptr::null_mut();
    let code = unsafe {
        sym!(nvml, nvmlDeviceCreateGpuInstanceWithPlacement)(device, info.id, &placement, &mut gi)
    };
    checked("nvmlDeviceCreateGpuInstanceWithPlacement", code)
        .map_err(|e| format!("{} at memory slice {start} of {gpu_uuid}: {e}", p.name))?;
    let undo_gi = |e: String| {
        if let Ok(destroy) = nvml.lib().nvmlGpuInstanceDestroy.as_ref() {
            let _ = unsafe { destroy(gi) };
        }
        e
    };
    let mut gi_info: nvmlGpuInstanceInfo_t = unsafe { std::mem::zeroed() };
    let code = unsafe { sym!(nvml, nvmlGpuInstanceGetInfo)(gi, &mut gi_info) };
    checked("nvmlGpuInstanceGetInfo", code).map_err(undo_gi)?;
    let mut ci_info: nvmlComputeInstanceProfileInfo_t = unsafe { std::mem::zeroed() };
    let code = unsafe {
        sym!(nvml, nvmlGpuInstanceGetComputeInstanceProfileInfo)(
            gi,
            ci_profile,
            NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
            &mut ci_info,
        )
    };
    checked("nvmlGpuInstanceGetComputeInstanceProfileInfo", code).map_err(undo_gi)?;
    let mut ci: nvmlComputeInstance_t = std::ptr::null_mut();
    let code = unsafe { sym!(nvml, nvmlGpuInstanceCreateComputeInstance)(gi, ci_info.id, &mut ci) };
    checked("nvmlGpuInstanceCreateComputeInstance", code).map_err(undo_gi)?;
    match find_mig(nvml, gpu_uuid, gi_info.id) {
        Ok((uuid, compute_instance)) => Ok(MadePartition::Mig {
            uuid,
            gpu_instance: gi_info.id,
            compute_instance,
        }),
        Err(e) => {
            if let Ok(destroy) = nvml.lib().nvmlComputeInstanceDestroy.as_ref() {
                let _ = unsafe { destroy(ci) };
            }
            Err(undo_gi(e))
        }
    }
}

/// The uuid and compute instance id of the MIG device of GPU instance `gi` of `gpu_uuid`.
fn find_mig(nvml: &Nvml, gpu_uuid: &str, gi: u32) -> Result<(String, u32), String> {
    let device = nvml
        .device_by_uuid(gpu_uuid)
        .map_err(|e| format!("GPU {gpu_uuid}: {e}"))?;
    let slots = device.mig_device_count().map_err(|e| e.to_string())?;
    for slot in 0..slots {
        let Ok(mig) = device.mig_device_by_index(slot) else {
            continue;
        };
        // SAFETY: a MIG device handle NVML gave, used while `nvml` lives.
        let handle = unsafe { mig.handle() };
        let (mut gi_id, mut ci_id): (c_uint, c_uint) = (0, 0);
        let code = unsafe { sym!(nvml, nvmlDeviceGetGpuInstanceId)(handle, &mut gi_id) };
        if code != nvmlReturn_enum_NVML_SUCCESS || gi_id != gi {
            continue;
        }
        let code = unsafe { sym!(nvml, nvmlDeviceGetComputeInstanceId)(handle, &mut ci_id) };
        checked("nvmlDeviceGetComputeInstanceId", code)?;
        let uuid = mig.uuid().map_err(|e| format!("MIG device uuid: {e}"))?;
        return Ok((uuid, ci_id));
    }
    Err(format!(
        "GPU instance {gi} of {gpu_uuid}: no MIG device lists it"
    ))
}

/// Destroys what [`create`] made (compute instance, then GPU instance). Instances already gone
/// are not an error, so an unprepare repeated after a restart succeeds.
pub fn destroy(nvml: &Nvml, gpu_uuid: &str, made: &MadePartition) -> Result<(), String> {
    let &MadePartition::Mig {
        gpu_instance,
        compute_instance,
        ..
    } = made
    else {
        return Err(format!("{made:?} is not a MIG device"));
    };
    let device = gpu_handle(nvml, gpu_uuid)?;
    let mut gi: nvmlGpuInstance_t = std::ptr::null_mut();
    // SAFETY (every call below): as in `create`.
    let code = unsafe { sym!(nvml, nvmlDeviceGetGpuInstanceById)(device, gpu_instance, &mut gi) };
    if code == nvmlReturn_enum_NVML_ERROR_NOT_FOUND {
        return Ok(());
    }
    checked("nvmlDeviceGetGpuInstanceById", code)?;
    let mut ci: nvmlComputeInstance_t = std::ptr::null_mut();
    let code =
        unsafe { sym!(nvml, nvmlGpuInstanceGetComputeInstanceById)(gi, compute_instance, &mut ci) };
    if code != nvmlReturn_enum_NVML_ERROR_NOT_FOUND {
        checked("nvmlGpuInstanceGetComputeInstanceById", code)?;
        let code = unsafe { sym!(nvml, nvmlComputeInstanceDestroy)(ci) };
        checked("nvmlComputeInstanceDestroy", code)?;
    }
    let code = unsafe { sym!(nvml, nvmlGpuInstanceDestroy)(gi) };
    checked("nvmlGpuInstanceDestroy", code)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use fumarole_topology::share::Catalogue;

    #[test]
    fn every_mig_profile_has_its_nvml_profiles() {
        let h100 = Catalogue::for_model("NVIDIA H100 80GB HBM3").unwrap();
        let a100 = Catalogue::for_model("NVIDIA A100-SXM4-40GB").unwrap();
        let of = |c: &Catalogue, name: &str| profiles(c.profile(name).unwrap()).unwrap();
        assert_eq!(of(h100, "1g.10gb").0, NVML_GPU_INSTANCE_PROFILE_1_SLICE);
        assert_eq!(
            of(h100, "1g.10gb+me").0,
            NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1
        );
        assert_eq!(
            of(h100, "1g.20gb").0,
            NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2
        );
        assert_eq!(
            of(a100, "1g.10gb").0,
            NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2
        );
        assert_eq!(
            of(h100, "3g.40gb"),
            (
                NVML_GPU_INSTANCE_PROFILE_3_SLICE,
                NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE
            )
        );
        assert_eq!(
            of(h100, "7g.80gb"),
            (
                NVML_GPU_INSTANCE_PROFILE_7_SLICE,
                NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE
            )
        );
        for c in fumarole_topology::share::MIG_CATALOGUES {
            for p in c.profiles {
                assert!(profiles(p).is_some(), "{}", p.name);
            }
        }
    }
}
