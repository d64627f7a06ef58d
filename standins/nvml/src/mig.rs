//! MIG instances made and removed through the library, as the DRA plugin does for a claim on a
//! partition: GPU instance profiles, a GPU instance at a placement, its compute instance, the
//! ids that find them again, and their destruction.
//!
//! A GPU with `"migEnabled": true` is in MIG mode with or without MIG devices. A GPU instance
//! made here is written into the state file as a `migDevices` entry with its `gpuInstance` id,
//! `profileId` and `placement` (`[start, size]` in memory slices) and no uuid; its compute
//! instance gives it `computeInstance` and a uuid, and only then is it a MIG device (listed by
//! `nvmlDeviceGetMigDeviceHandleByIndex`). The file is the driver's memory: an agent started
//! again finds what an earlier one made. Placements follow A100/H100 (8 memory slices, the
//! first 7 with compute); an overlapping one is refused with `INSUFFICIENT_RESOURCES`.

use std::ffi::c_uint;
use std::sync::{Mutex, PoisonError};

use nvml_wrapper_sys::bindings::*;
use serde_json::{Value, json};

use crate::{STATE_ENV, gpu, handle};

/// One GPU instance profile: NVML's enum value, the id NVML gives it, compute and memory
/// slices, the most per GPU, and whether it takes the media extensions.
struct GiProfile {
    profile: c_uint,
    id: c_uint,
    compute: c_uint,
    memory: c_uint,
    max: c_uint,
    media: bool,
}

const GI_PROFILES: [GiProfile; 7] = [
    gi(NVML_GPU_INSTANCE_PROFILE_1_SLICE, 19, 1, 1, 7, false),
    gi(NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1, 20, 1, 1, 1, true),
    gi(NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2, 15, 1, 2, 4, false),
    gi(NVML_GPU_INSTANCE_PROFILE_2_SLICE, 14, 2, 2, 3, false),
    gi(NVML_GPU_INSTANCE_PROFILE_3_SLICE, 9, 3, 4, 2, false),
    gi(NVML_GPU_INSTANCE_PROFILE_4_SLICE, 5, 4, 4, 1, false),
    gi(NVML_GPU_INSTANCE_PROFILE_7_SLICE, 0, 7, 8, 1, false),
];

const fn gi(
    profile: u32,
    id: c_uint,
    compute: c_uint,
    memory: c_uint,
    max: c_uint,
    media: bool,
) -> GiProfile {
    GiProfile {
        profile,
        id,
        compute,
        memory,
        max,
        media,
    }
}

const MEMORY_SLICES: c_uint = 8;
const COMPUTE_SLICES: c_uint = 7;

/// The compute instance profile (NVML's enum) that fills a GPU instance of `compute` slices.
fn ci_profile(compute: c_uint) -> Option<c_uint> {
    Some(match compute {
        1 => NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE,
        2 => NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE,
        3 => NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE,
        4 => NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE,
        7 => NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE,
        _ => return None,
    })
}

/// Memory per slice in GB: 10 on 80 GB GPUs, 5 on 40 GB ones.
fn gb_per_slice(gpu_name: &str) -> u64 {
    if gpu_name.contains("40GB") { 5 } else { 10 }
}

/// The profile name NVIDIA's tools write (`3g.40gb`, `1g.10gb+me`).
fn profile_name(p: &GiProfile, gpu_name: &str) -> String {
    let gb = u64::from(p.memory) * gb_per_slice(gpu_name);
    format!("{}g.{gb}gb{}", p.compute, if p.media { "+me" } else { "" })
}

const GI_BASE: usize = 1 << 32;
const CI_BASE: usize = 1 << 34;
const PER_GPU: usize = 64;

fn gi_handle(gpu: usize, gi: u64) -> nvmlGpuInstance_t {
    std::ptr::without_provenance_mut(GI_BASE + gpu * PER_GPU + gi as usize)
}

fn gi_of(h: nvmlGpuInstance_t) -> Option<(usize, u64)> {
    let a = h
        .addr()
        .checked_sub(GI_BASE)
        .filter(|a| *a < CI_BASE - GI_BASE)?;
    Some((a / PER_GPU, (a % PER_GPU) as u64))
}

fn ci_handle(gpu: usize, gi: u64) -> nvmlComputeInstance_t {
    std::ptr::without_provenance_mut(CI_BASE + gpu * PER_GPU + gi as usize)
}

fn ci_of(h: nvmlComputeInstance_t) -> Option<(usize, u64)> {
    let a = h.addr().checked_sub(CI_BASE)?;
    Some((a / PER_GPU, (a % PER_GPU) as u64))
}

/// Serializes changes to the state file within this process.
static WRITE: Mutex<()> = Mutex::new(());

/// Reads the state file, lets `f` change GPU `gpu`'s entry, writes it back whole (a temporary
/// file renamed over it).
fn change<T>(
    gpu: usize,
    f: impl FnOnce(&mut Value) -> Result<T, nvmlReturn_t>,
) -> Result<T, nvmlReturn_t> {
    let _one = WRITE.lock().unwrap_or_else(PoisonError::into_inner);
    let path = std::env::var_os(STATE_ENV).ok_or(nvmlReturn_enum_NVML_ERROR_UNKNOWN)?;
    let text = std::fs::read_to_string(&path).map_err(|_| nvmlReturn_enum_NVML_ERROR_UNKNOWN)?;
    let mut state: Value =
        serde_json::from_str(&text).map_err(|_| nvmlReturn_enum_NVML_ERROR_UNKNOWN)?;
    let entry = state
        .get_mut("gpus")
        .and_then(|g| g.get_mut(gpu))
        .ok_or(nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT)?;
    let out = f(entry)?;
    let tmp = std::path::PathBuf::from(&path).with_extension("standin-tmp");
    std::fs::write(&tmp, state.to_string()).map_err(|_| nvmlReturn_enum_NVML_ERROR_UNKNOWN)?;
    std::fs::rename(&tmp, &path).map_err(|_| nvmlReturn_enum_NVML_ERROR_UNKNOWN)?;
    Ok(out)
}

/// The GPU's `migDevices` entries made here (with a `gpuInstance`).
fn instances(entry: &Value) -> Vec<Value> {
    entry["migDevices"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m.get("gpuInstance").is_some())
        .cloned()
        .collect()
}

fn find_instance(gpu: usize, gi: u64) -> Option<Value> {
    let path = std::env::var_os(STATE_ENV)?;
    let state: Value = serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()?;
    instances(&state["gpus"][gpu])
        .into_iter()
        .find(|m| m["gpuInstance"].as_u64() == Some(gi))
}

/// A GPU in MIG mode (`migEnabled`, or MIG devices listed): its index and name.
fn mig_gpu(device: nvmlDevice_t) -> Result<(usize, String), nvmlReturn_t> {
    let (i, g) = gpu(device)?;
    if !g.in_mig_mode() {
        return Err(nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED);
    }
    Ok((i, g.name))
}

/// `nvmlDeviceGetGpuInstanceProfileInfo`.
///
/// # Safety
/// `info` is a writable `nvmlGpuInstanceProfileInfo_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceProfileInfo(
    device: nvmlDevice_t,
    profile: c_uint,
    info: *mut nvmlGpuInstanceProfileInfo_t,
) -> nvmlReturn_t {
    check!("nvmlDeviceGetGpuInstanceProfileInfo");
    let name = match mig_gpu(device) {
        Ok((_, name)) => name,
        Err(code) => return code,
    };
    let Some(p) = GI_PROFILES.iter().find(|p| p.profile == profile) else {
        return nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED;
    };
    // SAFETY: plain old data; all zeroes is a valid value.
    let mut value: nvmlGpuInstanceProfileInfo_t = unsafe { std::mem::zeroed() };
    value.id = p.id;
    value.sliceCount = p.compute;
    value.instanceCount = p.max;
    value.memorySizeMB = u64::from(p.memory) * gb_per_slice(&name) * 1024;
    out!(info, value)
}

/// `nvmlDeviceCreateGpuInstanceWithPlacement`.
///
/// # Safety
/// `placement` is a readable `nvmlGpuInstancePlacement_t`, `instance` a writable handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceCreateGpuInstanceWithPlacement(
    device: nvmlDevice_t,
    profile_id: c_uint,
    placement: *const nvmlGpuInstancePlacement_t,
    instance: *mut nvmlGpuInstance_t,
) -> nvmlReturn_t {
    check!("nvmlDeviceCreateGpuInstanceWithPlacement");
    let (i, name) = match mig_gpu(device) {
        Ok(g) => g,
        Err(code) => return code,
    };
    let Some(p) = GI_PROFILES.iter().find(|p| p.id == profile_id) else {
        return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
    };
    if placement.is_null() || instance.is_null() {
        return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: the caller passes a readable placement (checked non-null).
    let at = unsafe { *placement };
    let compute_slots = COMPUTE_SLICES
        .min(at.start + at.size)
        .saturating_sub(at.start);
    if at.size != p.memory
        || at.start % p.memory != 0
        || at.start + at.size > MEMORY_SLICES
        || compute_slots < p.compute
    {
        return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
    }
    let made = change(i, |entry| {
        let taken = instances(entry);
        let overlaps = taken.iter().any(|m| {
            let s = m["placement"][0].as_u64().unwrap_or(0);
            let n = m["placement"][1].as_u64().unwrap_or(0);
            s < u64::from(at.start + at.size) && u64::from(at.start) < s + n
        });
        let media_taken = p.media && taken.iter().any(|m| m["media"] == json!(true));
        let of_profile = taken
            .iter()
            .filter(|m| m["profileId"].as_u64() == Some(u64::from(p.id)))
            .count();
        if overlaps || media_taken || of_profile >= p.max as usize {
            return Err(nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES);
        }
        let id = (1..).find(|id| !taken.iter().any(|m| m["gpuInstance"] == json!(id)));
        let Some(id) = id else {
            return Err(nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES);
        };
        let gb = u64::from(p.memory) * gb_per_slice(&name);
        let record = json!({
            "uuid": "", "name": format!("{name} MIG {}", profile_name(p, &name)),
            "memoryBytes": gb << 30, "gpuInstance": id, "profileId": p.id,
            "placement": [at.start, at.size], "media": p.media,
        });
        match entry.get_mut("migDevices").and_then(Value::as_array_mut) {
            Some(list) => list.push(record),
            None => entry["migDevices"] = json!([record]),
        }
        Ok(id)
    });
    match made {
        Ok(id) => out!(instance, gi_handle(i, id)),
        Err(code) => code,
    }
}

/// `nvmlGpuInstanceGetInfo`.
///
/// # Safety
/// `info` is a writable `nvmlGpuInstanceInfo_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetInfo(
    instance: nvmlGpuInstance_t,
    info: *mut nvmlGpuInstanceInfo_t,
) -> nvmlReturn_t {
    check!("nvmlGpuInstanceGetInfo");
    let Some((g, id)) = gi_of(instance) else {
        return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
    };
    let Some(m) = find_instance(g, id) else {
        return nvmlReturn_enum_NVML_ERROR_NOT_FOUND;
    };
    let value = nvmlGpuInstanceInfo_t {
        device: handle(g),
        id: id as c_uint,
        profileId: m["profileId"].as_u64().unwrap_or(0) as c_uint,
        placement: nvmlGpuInstancePlacement_t {
            start: m["placement"][0].as_u64().unwrap_or(0) as c_uint,
            size: m["placement"][1].as_u64().unwrap_or(0) as c_uint,
        },
    };
    out!(info, value)
}

/// `nvmlGpuInstanceGetComputeInstanceProfileInfo`: the profile that fills the GPU instance
/// (the only one answered), with the shared engine profile.
///
/// # Safety
/// `info` is a writable `nvmlComputeInstanceProfileInfo_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceProfileInfo(
    instance: nvmlGpuInstance_t,
    profile: c_uint,
    eng_profile: c_uint,
    info: *mut nvmlComputeInstanceProfileInfo_t,
) -> nvmlReturn_t {
    check!("nvmlGpuInstanceGetComputeInstanceProfileInfo");
    let Some((g, id)) = gi_of(instance) else {
        return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
    };
    let Some(m) = find_instance(g, id) else {
        return nvmlReturn_enum_NVML_ERROR_NOT_FOUND;
    };
    let gi_profile = GI_PROFILES
        .iter()
        .find(|p| u64::from(p.id) == m["profileId"].as_u64().unwrap_or(u64::MAX));
    let Some(p) = gi_profile else {
        return nvmlReturn_enum_NVML_ERROR_UNKNOWN;
    };
    if eng_profile != NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
        || ci_profile(p.compute) != Some(profile)
    {
        return nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED;
    }
    // SAFETY: plain old data; all zeroes is a valid value.
    let mut value: nvmlComputeInstanceProfileInfo_t = unsafe { std::mem::zeroed() };
    value.id = profile;
    value.sliceCount = p.compute;
    value.instanceCount = 1;
    out!(info, value)
}

/// `nvmlGpuInstanceCreateComputeInstance`: the one compute instance (id 0) filling the GPU
/// instance; the MIG device appears with a uuid.
///
/// # Safety
/// `compute` is a writable handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceCreateComputeInstance(
    instance: nvmlGpuInstance_t,
    profile_id: c_uint,
    compute: *mut nvmlComputeInstance_t,
) -> nvmlReturn_t {
    check!("nvmlGpuInstanceCreateComputeInstance");
    let Some((g, id)) = gi_of(instance) else {
        return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
    };
    let gpu_uuid = match gpu(handle(g)) {
        Ok((_, gpu)) => gpu.uuid,
        Err(code) => return code,
    };
    let made = change(g, |entry| {
        let list = entry
            .get_mut("migDevices")
            .and_then(Value::as_array_mut)
            .ok_or(nvmlReturn_enum_NVML_ERROR_NOT_FOUND)?;
        let m = list
            .iter_mut()
            .find(|m| m["gpuInstance"].as_u64() == Some(id))
            .ok_or(nvmlReturn_enum_NVML_ERROR_NOT_FOUND)?;
        let p = GI_PROFILES
            .iter()
            .find(|p| u64::from(p.id) == m["profileId"].as_u64().unwrap_or(u64::MAX))
            .ok_or(nvmlReturn_enum_NVML_ERROR_UNKNOWN)?;
        if ci_profile(p.compute) != Some(profile_id) {
            return Err(nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT);
        }
        if m.get("computeInstance").is_some() {
            return Err(nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES);
        }
        // A uuid of the MIG device's own, stable for its GPU and instance.
        let tail = gpu_uuid
            .get(gpu_uuid.len().saturating_sub(12)..)
            .unwrap_or("0");
        m["uuid"] = json!(format!("MIG-{id:08x}-0000-4000-8000-{tail}"));
        m["computeInstance"] = json!(0);
        Ok(())
    });
    match made {
        Ok(()) => out!(compute, ci_handle(g, id)),
        Err(code) => code,
    }
}

/// `nvmlDeviceGetGpuInstanceById`.
///
/// # Safety
/// `instance` is a writable handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceById(
    device: nvmlDevice_t,
    id: c_uint,
    instance: *mut nvmlGpuInstance_t,
) -> nvmlReturn_t {
    check!("nvmlDeviceGetGpuInstanceById");
    let i = match mig_gpu(device) {
        Ok((i, _)) => i,
        Err(code) => return code,
    };
    match find_instance(i, u64::from(id)) {
        Some(_) => out!(instance, gi_handle(i, u64::from(id))),
        None => nvmlReturn_enum_NVML_ERROR_NOT_FOUND,
    }
}

/// `nvmlGpuInstanceGetComputeInstanceById`.
///
/// # Safety
/// `compute` is a writable handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceById(
    instance: nvmlGpuInstance_t,
    id: c_uint,
    compute: *mut nvmlComputeInstance_t,
) -> nvmlReturn_t {
    check!("nvmlGpuInstanceGetComputeInstanceById");
    let Some((g, gi)) = gi_of(instance) else {
        return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
    };
    match find_instance(g, gi) {
        Some(m) if m["computeInstance"].as_u64() == Some(u64::from(id)) => {
            out!(compute, ci_handle(g, gi))
        }
        _ => nvmlReturn_enum_NVML_ERROR_NOT_FOUND,
    }
}

/// `nvmlComputeInstanceDestroy`: the MIG device goes; its GPU instance stays.
#[unsafe(no_mangle)]
pub extern "C" fn nvmlComputeInstanceDestroy(compute: nvmlComputeInstance_t) -> nvmlReturn_t {
    check!("nvmlComputeInstanceDestroy");
    let Some((g, gi)) = ci_of(compute) else {
        return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
    };
    let done = change(g, |entry| {
        let m = entry
            .get_mut("migDevices")
            .and_then(Value::as_array_mut)
            .and_then(|l| l.iter_mut().find(|m| m["gpuInstance"].as_u64() == Some(gi)))
            .filter(|m| m.get("computeInstance").is_some())
            .ok_or(nvmlReturn_enum_NVML_ERROR_NOT_FOUND)?;
        if let Some(o) = m.as_object_mut() {
            o.remove("computeInstance");
            o.insert("uuid".into(), json!(""));
        }
        Ok(())
    });
    done.err().unwrap_or(nvmlReturn_enum_NVML_SUCCESS)
}

/// `nvmlGpuInstanceDestroy`: refused while a compute instance is left (`IN_USE`).
#[unsafe(no_mangle)]
pub extern "C" fn nvmlGpuInstanceDestroy(instance: nvmlGpuInstance_t) -> nvmlReturn_t {
    check!("nvmlGpuInstanceDestroy");
    let Some((g, gi)) = gi_of(instance) else {
        return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
    };
    let done = change(g, |entry| {
        let list = entry
            .get_mut("migDevices")
            .and_then(Value::as_array_mut)
            .ok_or(nvmlReturn_enum_NVML_ERROR_NOT_FOUND)?;
        let at = list
            .iter()
            .position(|m| m["gpuInstance"].as_u64() == Some(gi))
            .ok_or(nvmlReturn_enum_NVML_ERROR_NOT_FOUND)?;
        if list[at].get("computeInstance").is_some() {
            return Err(nvmlReturn_enum_NVML_ERROR_IN_USE);
        }
        list.remove(at);
        Ok(())
    });
    done.err().unwrap_or(nvmlReturn_enum_NVML_SUCCESS)
}

/// `nvmlDeviceGetGpuInstanceId`: of a MIG device's handle.
///
/// # Safety
/// `id` is a writable out-parameter.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceId(
    device: nvmlDevice_t,
    id: *mut c_uint,
) -> nvmlReturn_t {
    check!("nvmlDeviceGetGpuInstanceId");
    match crate::device_of(device) {
        Ok((_, Some(m))) => match m.gpu_instance {
            Some(gi) => out!(id, gi),
            None => nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED,
        },
        Ok((_, None)) => nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT,
        Err(code) => code,
    }
}

/// `nvmlDeviceGetComputeInstanceId`: of a MIG device's handle.
///
/// # Safety
/// `id` is a writable out-parameter.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeInstanceId(
    device: nvmlDevice_t,
    id: *mut c_uint,
) -> nvmlReturn_t {
    check!("nvmlDeviceGetComputeInstanceId");
    match crate::device_of(device) {
        Ok((_, Some(m))) => match m.compute_instance {
            Some(ci) => out!(id, ci),
            None => nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED,
        },
        Ok((_, None)) => nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT,
        Err(code) => code,
    }
}
