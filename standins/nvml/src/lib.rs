//! A stand-in for NVIDIA's `libnvidia-ml.so.1`, for tests without a GPU: the subset of the NVML
//! C API fumarole calls (discovery's questions and the health source's), answering from a JSON
//! state file the test writes and rewrites. The agent loads it exactly as it loads the real
//! library (`--nvml-library PATH`, through `nvml-wrapper`).
//!
//! The state file is named by the `FUMAROLE_NVML_STANDIN` environment variable and re-read
//! whenever it changes (write it whole, e.g. to a temporary file renamed over it). Its shape
//! extends the recorded NVML answers of the fixtures (`/fumarole/nvml.json`):
//!
//! ```json
//! {
//!   "driverVersion": "550.90.07", "cudaDriverVersion": 12040,
//!   "gpus": [{
//!     "pciBusId": "00000000:1B:00.0", "index": 0, "uuid": "GPU-...", "name": "NVIDIA H100",
//!     "serial": "1650000000000", "minor": 0,
//!     "nvlinks": [{"remotePciBusId": "00000000:D2:00.0", "remote": "switch", "up": true,
//!                  "txKib": 1024, "rxKib": 2048}],
//!     "lost": false, "retiredPagesPending": false,
//!     "rowRemapPending": false, "rowRemapFailed": false,
//!     "computeCapability": {"major": 9, "minor": 0}, "migCapable": true,
//!     "memoryBytes": 85520809984,
//!     "migDevices": [{"uuid": "MIG-...", "name": "NVIDIA H100 80GB HBM3 MIG 3g.40gb",
//!                     "memoryBytes": 42949672960}],
//!     "metrics": {"utilization": 73, "memoryUtilization": 20, "memoryUsedBytes": 1073741824,
//!                 "powerMilliwatts": 310600, "energyMillijoules": 5000000, "temperature": 45,
//!                 "smClockMhz": 1980, "memoryClockMhz": 2619, "throttleReasons": 4,
//!                 "eccCorrected": 1, "eccUncorrected": 0, "retiredPagesSingleBit": 2,
//!                 "retiredPagesDoubleBit": 0, "remappedRowsCorrectable": 3,
//!                 "remappedRowsUncorrectable": 0, "pcieTxKilobytesPerSecond": 100,
//!                 "pcieRxKilobytesPerSecond": 200, "pcieReplays": 0}
//!   }],
//!   "events": [{"id": 1, "gpu": 3, "xid": 79}, {"id": 2, "gpu": 3, "type": "dbe"}],
//!   "hang": ["nvmlEventSetWait_v2"],
//!   "fail": {"nvmlDeviceGetNvLinkState": 999},
//!   "garbage": ["nvmlDeviceGetNvLinkState"]
//! }
//! ```
//!
//! - `lost`: every call about that GPU (and its MIG devices) answers `NVML_ERROR_GPU_IS_LOST`.
//! - `migDevices`: with `migCapable`, MIG mode is enabled and these are the GPU's MIG devices,
//!   in slots 0.. of `nvmlDeviceGetMigDeviceHandleByIndex` (7 slots); their handles answer
//!   `nvmlDeviceGetUUID`, `nvmlDeviceGetName` and `nvmlDeviceGetMemoryInfo_v2`.
//! - `migEnabled`: MIG mode on even with no MIG device; MIG instances made through the
//!   library land in `migDevices` ([`mig`]).
//! - `metrics`: what the per-device figure calls answer (utilisation, memory used, power,
//!   energy, temperature, clocks, throttle reasons, ECC counts, retired pages, remapped rows,
//!   PCIe throughput and replays); a figure absent there answers NotSupported (memory used:
//!   0, all of it free).
//! - `events`: delivered once each, in `id` order, by `nvmlEventSetWait_v2` to the event sets
//!   that registered the GPU for the event's type (`xid`: a critical XID with that value;
//!   `"type": "dbe"`: a double-bit ECC error).
//! - `hang`: the named calls (or `"*"`: every call) block until the file no longer names
//!   them.
//! - `fail`: the named calls (or `"*"`) return that `nvmlReturn_t`.
//! - `garbage`: the named calls succeed with a value outside their enum.
//!
//! Without the variable, or with a state file that cannot be read, the library has no GPU.
//! This is test code standing in for a C library: it keeps process-wide state (the parsed
//! file, the event sets), as the real one does.

use std::ffi::{c_char, c_uint, c_ulonglong};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use nvml_wrapper_sys::bindings::*;
use serde::Deserialize;

/// The environment variable naming the state file.
pub const STATE_ENV: &str = "FUMAROLE_NVML_STANDIN";

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct State {
    #[serde(default)]
    driver_version: Option<String>,
    /// `1000 * major + 10 * minor`; 12040 (CUDA 12.4) when absent.
    #[serde(default)]
    cuda_driver_version: Option<i32>,
    #[serde(default)]
    gpus: Vec<Gpu>,
    #[serde(default)]
    events: Vec<EventSpec>,
    #[serde(default)]
    hang: Vec<String>,
    #[serde(default)]
    fail: std::collections::BTreeMap<String, u32>,
    #[serde(default)]
    garbage: Vec<String>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Gpu {
    pci_bus_id: String,
    #[serde(default)]
    uuid: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    serial: Option<String>,
    #[serde(default)]
    minor: Option<u32>,
    #[serde(default)]
    nvlinks: Vec<Lane>,
    #[serde(default)]
    lost: bool,
    #[serde(default)]
    retired_pages_pending: bool,
    #[serde(default)]
    row_remap_pending: bool,
    #[serde(default)]
    row_remap_failed: bool,
    /// Absent: `nvmlDeviceGetCudaComputeCapability` answers NotSupported.
    #[serde(default)]
    compute_capability: Option<ComputeCapability>,
    /// `true`: `nvmlDeviceGetMigMode` answers (MIG enabled when `mig_devices` has any, else
    /// disabled); otherwise NotSupported.
    #[serde(default)]
    mig_capable: Option<bool>,
    /// Absent: `nvmlDeviceGetMemoryInfo_v2` answers NotSupported.
    #[serde(default)]
    memory_bytes: Option<u64>,
    /// The GPU's MIG devices; any (with `migCapable`) means MIG mode is enabled.
    #[serde(default)]
    mig_devices: Vec<MigDevice>,
    /// MIG mode on, with or without MIG devices.
    #[serde(default)]
    mig_enabled: bool,
    /// What the per-device figure calls answer.
    #[serde(default)]
    metrics: GpuMetrics,
}

/// A GPU's figures, in NVML's units; `None` answers NotSupported.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct GpuMetrics {
    utilization: Option<u32>,
    memory_utilization: Option<u32>,
    memory_used_bytes: Option<u64>,
    power_milliwatts: Option<u32>,
    energy_millijoules: Option<u64>,
    temperature: Option<u32>,
    sm_clock_mhz: Option<u32>,
    memory_clock_mhz: Option<u32>,
    throttle_reasons: Option<u64>,
    ecc_corrected: Option<u64>,
    ecc_uncorrected: Option<u64>,
    retired_pages_single_bit: Option<u32>,
    retired_pages_double_bit: Option<u32>,
    remapped_rows_correctable: Option<u32>,
    remapped_rows_uncorrectable: Option<u32>,
    pcie_tx_kilobytes_per_second: Option<u32>,
    pcie_rx_kilobytes_per_second: Option<u32>,
    pcie_replays: Option<u32>,
}

impl Gpu {
    /// In MIG mode: `migEnabled`, or MIG devices listed.
    fn in_mig_mode(&self) -> bool {
        self.mig_capable == Some(true) && (self.mig_enabled || !self.mig_devices.is_empty())
    }

    /// The MIG devices the library lists: those of the file, and of the instances made through
    /// it those with a compute instance ([`mig`]).
    fn listed_mig_devices(&self) -> Vec<MigDevice> {
        self.mig_devices
            .iter()
            .filter(|m| m.gpu_instance.is_none() || m.compute_instance.is_some())
            .cloned()
            .collect()
    }
}

/// One MIG device: its uuid (`MIG-...`), its NVML name (`NVIDIA H100 80GB HBM3 MIG 1g.10gb`)
/// and memory.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct MigDevice {
    uuid: String,
    name: String,
    #[serde(default)]
    memory_bytes: Option<u64>,
    /// Made through the library: its GPU instance and, once made, compute instance.
    #[serde(default)]
    gpu_instance: Option<u32>,
    #[serde(default)]
    compute_instance: Option<u32>,
}

#[derive(Clone, Copy, Debug, Deserialize)]
struct ComputeCapability {
    major: i32,
    minor: i32,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Lane {
    remote_pci_bus_id: String,
    #[serde(default)]
    remote: String,
    #[serde(default = "yes")]
    up: bool,
    /// KiB sent and received over the link since the driver loaded
    /// (`NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX` / `_RX`); absent: NotSupported.
    #[serde(default)]
    tx_kib: Option<u64>,
    #[serde(default)]
    rx_kib: Option<u64>,
}

fn yes() -> bool {
    true
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct EventSpec {
    id: u64,
    gpu: usize,
    #[serde(default)]
    xid: Option<u64>,
    #[serde(default, rename = "type")]
    kind: Option<String>,
}

struct Loaded {
    stamp: Option<(SystemTime, u64)>,
    state: State,
}

/// The parsed state file, re-read when its modification time or size changes.
static LOADED: Mutex<Option<Loaded>> = Mutex::new(None);
/// Per event set: the GPUs registered and their event types.
static SETS: Mutex<Vec<Vec<(usize, u64)>>> = Mutex::new(Vec::new());
/// The highest event id delivered.
static DELIVERED: Mutex<u64> = Mutex::new(0);

fn state() -> State {
    let Some(path) = std::env::var_os(STATE_ENV) else {
        return State::default();
    };
    let stamp = std::fs::metadata(&path)
        .ok()
        .and_then(|m| Some((m.modified().ok()?, m.len())));
    let mut loaded = LOADED.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(l) = loaded.as_ref()
        && l.stamp == stamp
        && stamp.is_some()
    {
        return l.state.clone();
    }
    let parsed = std::fs::read_to_string(&path)
        .ok()
        .and_then(|text| serde_json::from_str::<State>(&text).ok());
    match parsed {
        Some(state) => {
            *loaded = Some(Loaded {
                stamp,
                state: state.clone(),
            });
            state
        }
        // A half-written file: keep what was read before.
        None => loaded.as_ref().map(|l| l.state.clone()).unwrap_or_default(),
    }
}

/// Blocks while the state names `call` under `hang`, then returns its `fail` code if any.
fn enter(call: &str) -> Option<nvmlReturn_t> {
    loop {
        let s = state();
        if !s.hang.iter().any(|h| h == call || h == "*") {
            return s.fail.get(call).or_else(|| s.fail.get("*")).copied();
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn garbage(call: &str) -> bool {
    state().garbage.iter().any(|g| g == call)
}

fn handle(index: usize) -> nvmlDevice_t {
    std::ptr::without_provenance_mut(index + 1)
}

/// A MIG device's handle: its GPU's, plus its slot above [`MIG_HANDLE_STRIDE`].
const MIG_HANDLE_STRIDE: usize = 1 << 16;

/// MIG device slots per GPU (`nvmlDeviceGetMaxMigDeviceCount`; 7 on A100 and H100).
const MIG_SLOTS: c_uint = 7;

fn mig_handle(gpu: usize, slot: usize) -> nvmlDevice_t {
    std::ptr::without_provenance_mut(gpu + 1 + (slot + 1) * MIG_HANDLE_STRIDE)
}

/// What a handle names: a GPU, or one of its MIG devices (unless the GPU is lost).
fn device_of(device: nvmlDevice_t) -> Result<(Gpu, Option<MigDevice>), nvmlReturn_t> {
    let addr = device.addr();
    let (gpu_handle, slot) = (addr % MIG_HANDLE_STRIDE, addr / MIG_HANDLE_STRIDE);
    let (_, g) = gpu(std::ptr::without_provenance_mut(gpu_handle))?;
    if slot == 0 {
        return Ok((g, None));
    }
    match g.listed_mig_devices().get(slot - 1).cloned() {
        Some(m) => Ok((g, Some(m))),
        None => Err(nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT),
    }
}

/// The GPU a handle names, unless it is lost: `Err` is the code to return.
fn gpu(device: nvmlDevice_t) -> Result<(usize, Gpu), nvmlReturn_t> {
    let index = device.addr().wrapping_sub(1);
    match state().gpus.get(index) {
        None => Err(nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT),
        Some(g) if g.lost => Err(nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST),
        Some(g) => Ok((index, g.clone())),
    }
}

/// Writes `s` and a NUL into the caller's buffer of `len` bytes.
///
/// # Safety
/// `dst` must be null or point to `len` writable bytes.
unsafe fn copy_str(dst: *mut c_char, len: c_uint, s: &str) -> nvmlReturn_t {
    let bytes = s.as_bytes();
    if dst.is_null() {
        return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
    }
    if usize::try_from(len).unwrap_or(0) < bytes.len() + 1 {
        return nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE;
    }
    // SAFETY: the caller's buffer holds at least `bytes.len() + 1` bytes (checked above).
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr().cast::<c_char>(), dst, bytes.len());
        *dst.add(bytes.len()) = 0;
    }
    nvmlReturn_enum_NVML_SUCCESS
}

/// An `nvmlPciInfo_t` for a bus id in NVML's form (`00000000:1B:00.0`).
fn pci_info(bus_id: &str) -> nvmlPciInfo_t {
    // SAFETY: plain old data; all zeroes is a valid value.
    let mut info: nvmlPciInfo_t = unsafe { std::mem::zeroed() };
    let parts: Vec<&str> = bus_id.split([':', '.']).collect();
    let hex = |i: usize| {
        parts
            .get(i)
            .and_then(|p| u32::from_str_radix(p, 16).ok())
            .unwrap_or(0)
    };
    info.domain = hex(0);
    info.bus = hex(1);
    info.device = hex(2);
    info.pciDeviceId = 0x2330_10de;
    for (dst, src) in info.busId.iter_mut().zip(bus_id.bytes().take(31)) {
        *dst = src as c_char;
    }
    let legacy = bus_id.get(4..).unwrap_or(bus_id);
    for (dst, src) in info.busIdLegacy.iter_mut().zip(legacy.bytes().take(15)) {
        *dst = src as c_char;
    }
    info
}

macro_rules! check {
    ($call:expr) => {
        if let Some(code) = $crate::enter($call) {
            return code;
        }
    };
}

macro_rules! out {
    ($ptr:expr, $value:expr) => {{
        if $ptr.is_null() {
            return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
        }
        // SAFETY: the caller passes a writable out-parameter (checked non-null).
        unsafe { *$ptr = $value };
        nvmlReturn_enum_NVML_SUCCESS
    }};
}

// After the macros, which it uses.
mod figures;
mod mig;

/// `nvmlInit_v2`.
#[unsafe(no_mangle)]
pub extern "C" fn nvmlInit_v2() -> nvmlReturn_t {
    check!("nvmlInit_v2");
    nvmlReturn_enum_NVML_SUCCESS
}

/// `nvmlInitWithFlags`.
#[unsafe(no_mangle)]
pub extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> nvmlReturn_t {
    nvmlInit_v2()
}

/// `nvmlShutdown`.
#[unsafe(no_mangle)]
pub extern "C" fn nvmlShutdown() -> nvmlReturn_t {
    nvmlReturn_enum_NVML_SUCCESS
}

/// `nvmlErrorString`.
// The bindings' constants keep NVML's C names.
#[allow(non_upper_case_globals)]
#[unsafe(no_mangle)]
pub extern "C" fn nvmlErrorString(result: nvmlReturn_t) -> *const c_char {
    let text: &'static [u8] = match result {
        nvmlReturn_enum_NVML_SUCCESS => b"Success\0",
        nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED => b"Not Supported\0",
        nvmlReturn_enum_NVML_ERROR_TIMEOUT => b"Timeout\0",
        nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST => b"GPU is lost\0",
        _ => b"Unknown Error (stand-in)\0",
    };
    text.as_ptr().cast()
}

/// `nvmlSystemGetDriverVersion`.
///
/// # Safety
/// `version` points to `length` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(
    version: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    check!("nvmlSystemGetDriverVersion");
    let v = state().driver_version.unwrap_or_else(|| "550.90.07".into());
    // SAFETY: forwarded from the caller's contract.
    unsafe { copy_str(version, length, &v) }
}

/// `nvmlSystemGetCudaDriverVersion_v2`.
///
/// # Safety
/// `version` is a writable out-parameter.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(
    version: *mut std::ffi::c_int,
) -> nvmlReturn_t {
    check!("nvmlSystemGetCudaDriverVersion_v2");
    out!(version, state().cuda_driver_version.unwrap_or(12_040))
}

/// `nvmlDeviceGetCudaComputeCapability`.
///
/// # Safety
/// `major` and `minor` are writable out-parameters.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCudaComputeCapability(
    device: nvmlDevice_t,
    major: *mut std::ffi::c_int,
    minor: *mut std::ffi::c_int,
) -> nvmlReturn_t {
    check!("nvmlDeviceGetCudaComputeCapability");
    match gpu(device) {
        Ok((_, g)) => match g.compute_capability {
            Some(cc) => {
                if major.is_null() {
                    return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
                }
                // SAFETY: the caller passes a writable out-parameter (checked non-null).
                unsafe { *major = cc.major };
                out!(minor, cc.minor)
            }
            None => nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED,
        },
        Err(code) => code,
    }
}

/// `nvmlDeviceGetMemoryInfo_v2`: the GPU's memory, `metrics.memoryUsedBytes` of it used (a
/// MIG device's all free).
///
/// # Safety
/// `memory` is a writable `nvmlMemory_v2_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_v2_t,
) -> nvmlReturn_t {
    check!("nvmlDeviceGetMemoryInfo_v2");
    match device_of(device) {
        Ok((g, mig)) => match mig.as_ref().map_or(g.memory_bytes, |m| m.memory_bytes) {
            Some(total) => {
                if memory.is_null() {
                    return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
                }
                let used = match mig {
                    None => g.metrics.memory_used_bytes.unwrap_or(0).min(total),
                    Some(_) => 0,
                };
                // SAFETY: the caller passes a writable struct (checked non-null); its version
                // field is the caller's and is kept.
                unsafe {
                    (*memory).total = total;
                    (*memory).reserved = 0;
                    (*memory).free = total - used;
                    (*memory).used = used;
                }
                nvmlReturn_enum_NVML_SUCCESS
            }
            None => nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED,
        },
        Err(code) => code,
    }
}

/// `nvmlDeviceGetMaxMigDeviceCount`: 7 slots on a GPU in MIG mode, NotSupported on others.
///
/// # Safety
/// `count` is a writable out-parameter.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxMigDeviceCount(
    device: nvmlDevice_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    check!("nvmlDeviceGetMaxMigDeviceCount");
    match gpu(device) {
        Ok((_, g)) if g.mig_capable == Some(true) => out!(count, MIG_SLOTS),
        Ok(_) => nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED,
        Err(code) => code,
    }
}

/// `nvmlDeviceGetMigDeviceHandleByIndex`: the MIG device in slot `index`, NotFound for an
/// empty slot.
///
/// # Safety
/// `mig` is a writable out-parameter.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigDeviceHandleByIndex(
    device: nvmlDevice_t,
    index: c_uint,
    mig: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    check!("nvmlDeviceGetMigDeviceHandleByIndex");
    match gpu(device) {
        Ok((i, g)) if g.in_mig_mode() => {
            let slot = usize::try_from(index).unwrap_or(usize::MAX);
            if index >= MIG_SLOTS {
                return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
            }
            if slot >= g.listed_mig_devices().len() {
                return nvmlReturn_enum_NVML_ERROR_NOT_FOUND;
            }
            out!(mig, mig_handle(i, slot))
        }
        Ok(_) => nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED,
        Err(code) => code,
    }
}

/// `nvmlDeviceGetMigMode`: on a capable GPU, enabled when `migEnabled` or it has MIG devices,
/// else disabled; NotSupported on others.
///
/// # Safety
/// `current` and `pending` are writable out-parameters.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(
    device: nvmlDevice_t,
    current: *mut c_uint,
    pending: *mut c_uint,
) -> nvmlReturn_t {
    check!("nvmlDeviceGetMigMode");
    match gpu(device) {
        Ok((_, g)) if g.mig_capable == Some(true) => {
            if current.is_null() {
                return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
            }
            let mode = c_uint::from(g.in_mig_mode());
            // SAFETY: the caller passes a writable out-parameter (checked non-null).
            unsafe { *current = mode };
            out!(pending, mode)
        }
        Ok(_) => nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED,
        Err(code) => code,
    }
}

/// `nvmlDeviceGetCount_v2`.
///
/// # Safety
/// `count` is a writable out-parameter.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> nvmlReturn_t {
    check!("nvmlDeviceGetCount_v2");
    let n = c_uint::try_from(state().gpus.len()).unwrap_or(0);
    out!(count, n)
}

/// `nvmlDeviceGetHandleByIndex_v2`.
///
/// # Safety
/// `device` is a writable out-parameter.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    check!("nvmlDeviceGetHandleByIndex_v2");
    let i = usize::try_from(index).unwrap_or(usize::MAX);
    if i >= state().gpus.len() {
        return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
    }
    out!(device, handle(i))
}

/// `nvmlDeviceGetHandleByUUID`: the GPU of that uuid (MIG uuids are not looked up).
///
/// # Safety
/// `uuid` is a NUL-terminated string, `device` a writable out-parameter.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(
    uuid: *const c_char,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    check!("nvmlDeviceGetHandleByUUID");
    if uuid.is_null() {
        return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: the caller passes a NUL-terminated string (checked non-null).
    let wanted = unsafe { std::ffi::CStr::from_ptr(uuid) }.to_string_lossy();
    match state().gpus.iter().position(|g| g.uuid == wanted) {
        Some(i) => out!(device, handle(i)),
        None => nvmlReturn_enum_NVML_ERROR_NOT_FOUND,
    }
}

/// `nvmlDeviceGetIndex`.
///
/// # Safety
/// `index` is a writable out-parameter.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetIndex(
    device: nvmlDevice_t,
    index: *mut c_uint,
) -> nvmlReturn_t {
    check!("nvmlDeviceGetIndex");
    match gpu(device) {
        Ok((i, _)) => out!(index, c_uint::try_from(i).unwrap_or(0)),
        Err(code) => code,
    }
}

/// `nvmlDeviceGetPciInfo_v3`.
///
/// # Safety
/// `pci` is a writable out-parameter.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(
    device: nvmlDevice_t,
    pci: *mut nvmlPciInfo_t,
) -> nvmlReturn_t {
    check!("nvmlDeviceGetPciInfo_v3");
    match gpu(device) {
        Ok((_, g)) => out!(pci, pci_info(&g.pci_bus_id)),
        Err(code) => code,
    }
}

/// `nvmlDeviceGetUUID`.
///
/// # Safety
/// `uuid` points to `length` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    device: nvmlDevice_t,
    uuid: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    check!("nvmlDeviceGetUUID");
    match device_of(device) {
        // SAFETY: forwarded from the caller's contract.
        Ok((_, Some(m))) => unsafe { copy_str(uuid, length, &m.uuid) },
        // SAFETY: forwarded from the caller's contract.
        Ok((g, None)) => unsafe { copy_str(uuid, length, &g.uuid) },
        Err(code) => code,
    }
}

/// `nvmlDeviceGetName`.
///
/// # Safety
/// `name` points to `length` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetName(
    device: nvmlDevice_t,
    name: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    check!("nvmlDeviceGetName");
    match device_of(device) {
        // SAFETY: forwarded from the caller's contract.
        Ok((_, Some(m))) => unsafe { copy_str(name, length, &m.name) },
        // SAFETY: forwarded from the caller's contract.
        Ok((g, None)) => unsafe { copy_str(name, length, &g.name) },
        Err(code) => code,
    }
}

/// `nvmlDeviceGetSerial`.
///
/// # Safety
/// `serial` points to `length` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSerial(
    device: nvmlDevice_t,
    serial: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    check!("nvmlDeviceGetSerial");
    match gpu(device) {
        Ok((_, g)) => match g.serial {
            // SAFETY: forwarded from the caller's contract.
            Some(s) => unsafe { copy_str(serial, length, &s) },
            None => nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED,
        },
        Err(code) => code,
    }
}

/// `nvmlDeviceGetMinorNumber`.
///
/// # Safety
/// `minor` is a writable out-parameter.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMinorNumber(
    device: nvmlDevice_t,
    minor: *mut c_uint,
) -> nvmlReturn_t {
    check!("nvmlDeviceGetMinorNumber");
    match gpu(device) {
        Ok((i, g)) => out!(minor, g.minor.unwrap_or(c_uint::try_from(i).unwrap_or(0))),
        Err(code) => code,
    }
}

/// The lane `link` of a GPU, or the code to return.
fn lane(device: nvmlDevice_t, link: c_uint) -> Result<Lane, nvmlReturn_t> {
    let (_, g) = gpu(device)?;
    let i = usize::try_from(link).unwrap_or(usize::MAX);
    match g.nvlinks.get(i) {
        Some(l) => Ok(l.clone()),
        // Lanes the GPU does not have: what NVML answers for them.
        None if link < 18 => Err(nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED),
        None => Err(nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT),
    }
}

/// `nvmlDeviceGetNvLinkState`.
///
/// # Safety
/// `is_active` is a writable out-parameter.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkState(
    device: nvmlDevice_t,
    link: c_uint,
    is_active: *mut nvmlEnableState_t,
) -> nvmlReturn_t {
    check!("nvmlDeviceGetNvLinkState");
    match lane(device, link) {
        Ok(_) if garbage("nvmlDeviceGetNvLinkState") => out!(is_active, 7),
        Ok(l) => out!(
            is_active,
            if l.up {
                nvmlEnableState_enum_NVML_FEATURE_ENABLED
            } else {
                nvmlEnableState_enum_NVML_FEATURE_DISABLED
            }
        ),
        Err(code) => code,
    }
}

/// `nvmlDeviceGetNvLinkRemotePciInfo_v2`.
///
/// # Safety
/// `pci` is a writable out-parameter.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkRemotePciInfo_v2(
    device: nvmlDevice_t,
    link: c_uint,
    pci: *mut nvmlPciInfo_t,
) -> nvmlReturn_t {
    check!("nvmlDeviceGetNvLinkRemotePciInfo_v2");
    match lane(device, link) {
        Ok(l) => out!(pci, pci_info(&l.remote_pci_bus_id)),
        Err(code) => code,
    }
}

/// `nvmlDeviceGetNvLinkRemoteDeviceType`.
///
/// # Safety
/// `kind` is a writable out-parameter.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkRemoteDeviceType(
    device: nvmlDevice_t,
    link: c_uint,
    kind: *mut nvmlIntNvLinkDeviceType_t,
) -> nvmlReturn_t {
    check!("nvmlDeviceGetNvLinkRemoteDeviceType");
    match lane(device, link) {
        Ok(l) => out!(
            kind,
            match l.remote.as_str() {
                "gpu" => nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_GPU,
                "switch" => nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_SWITCH,
                _ => nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_UNKNOWN,
            }
        ),
        Err(code) => code,
    }
}

/// `nvmlDeviceGetGpuFabricInfo`: the stand-in's GPUs are in no NVLink fabric.
#[unsafe(no_mangle)]
pub extern "C" fn nvmlDeviceGetGpuFabricInfo(
    _device: nvmlDevice_t,
    _info: *mut nvmlGpuFabricInfo_t,
) -> nvmlReturn_t {
    nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED
}

/// `nvmlDeviceGetRetiredPagesPendingStatus`.
///
/// # Safety
/// `pending` is a writable out-parameter.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetRetiredPagesPendingStatus(
    device: nvmlDevice_t,
    pending: *mut nvmlEnableState_t,
) -> nvmlReturn_t {
    check!("nvmlDeviceGetRetiredPagesPendingStatus");
    match gpu(device) {
        Ok(_) if garbage("nvmlDeviceGetRetiredPagesPendingStatus") => out!(pending, 7),
        Ok((_, g)) => out!(
            pending,
            if g.retired_pages_pending {
                nvmlEnableState_enum_NVML_FEATURE_ENABLED
            } else {
                nvmlEnableState_enum_NVML_FEATURE_DISABLED
            }
        ),
        Err(code) => code,
    }
}

/// `nvmlDeviceGetRemappedRows`.
///
/// # Safety
/// The four pointers are writable out-parameters.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetRemappedRows(
    device: nvmlDevice_t,
    corrected: *mut c_uint,
    uncorrected: *mut c_uint,
    pending: *mut c_uint,
    failure: *mut c_uint,
) -> nvmlReturn_t {
    check!("nvmlDeviceGetRemappedRows");
    let g = match gpu(device) {
        Ok((_, g)) => g,
        Err(code) => return code,
    };
    if corrected.is_null() || uncorrected.is_null() || pending.is_null() || failure.is_null() {
        return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: all four are writable out-parameters (checked non-null).
    unsafe {
        *corrected = g.metrics.remapped_rows_correctable.unwrap_or(0);
        *uncorrected = g
            .metrics
            .remapped_rows_uncorrectable
            .unwrap_or(u32::from(g.row_remap_pending || g.row_remap_failed));
        *pending = u32::from(g.row_remap_pending);
        *failure = u32::from(g.row_remap_failed);
    }
    nvmlReturn_enum_NVML_SUCCESS
}

/// The event types every stand-in GPU supports.
const SUPPORTED_EVENTS: u64 = (nvmlEventTypeXidCriticalError
    | nvmlEventTypeDoubleBitEccError
    | nvmlEventTypeSingleBitEccError) as u64;

/// `nvmlDeviceGetSupportedEventTypes`.
///
/// # Safety
/// `types` is a writable out-parameter.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSupportedEventTypes(
    device: nvmlDevice_t,
    types: *mut c_ulonglong,
) -> nvmlReturn_t {
    check!("nvmlDeviceGetSupportedEventTypes");
    match gpu(device) {
        Ok(_) => out!(types, SUPPORTED_EVENTS),
        Err(code) => code,
    }
}

fn set_index(set: nvmlEventSet_t) -> usize {
    set.addr().wrapping_sub(1)
}

/// `nvmlEventSetCreate`.
///
/// # Safety
/// `set` is a writable out-parameter.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetCreate(set: *mut nvmlEventSet_t) -> nvmlReturn_t {
    check!("nvmlEventSetCreate");
    let mut sets = SETS.lock().unwrap_or_else(PoisonError::into_inner);
    sets.push(Vec::new());
    out!(set, std::ptr::without_provenance_mut(sets.len()))
}

/// `nvmlEventSetFree`.
#[unsafe(no_mangle)]
pub extern "C" fn nvmlEventSetFree(set: nvmlEventSet_t) -> nvmlReturn_t {
    let mut sets = SETS.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(s) = sets.get_mut(set_index(set)) {
        s.clear();
    }
    nvmlReturn_enum_NVML_SUCCESS
}

/// `nvmlDeviceRegisterEvents`.
#[unsafe(no_mangle)]
pub extern "C" fn nvmlDeviceRegisterEvents(
    device: nvmlDevice_t,
    types: c_ulonglong,
    set: nvmlEventSet_t,
) -> nvmlReturn_t {
    check!("nvmlDeviceRegisterEvents");
    let index = match gpu(device) {
        Ok((i, _)) => i,
        Err(code) => return code,
    };
    if types & !SUPPORTED_EVENTS != 0 {
        return nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED;
    }
    let mut sets = SETS.lock().unwrap_or_else(PoisonError::into_inner);
    match sets.get_mut(set_index(set)) {
        Some(s) => {
            s.push((index, types));
            nvmlReturn_enum_NVML_SUCCESS
        }
        None => nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT,
    }
}

/// The next undelivered event for `set`: (gpu, type bit, data). Events for GPUs the set did
/// not register count as delivered.
fn next_event(set: usize) -> Option<(usize, u64, u64)> {
    let registered = SETS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get(set)
        .cloned()
        .unwrap_or_default();
    let mut events = state().events;
    events.sort_by_key(|e| e.id);
    let mut delivered = DELIVERED.lock().unwrap_or_else(PoisonError::into_inner);
    let after = *delivered;
    for e in events.iter().filter(|e| e.id > after) {
        *delivered = e.id;
        let (bit, data) = match (e.kind.as_deref(), e.xid) {
            (Some("dbe"), _) => (u64::from(nvmlEventTypeDoubleBitEccError), 0),
            (_, Some(xid)) => (u64::from(nvmlEventTypeXidCriticalError), xid),
            _ => continue,
        };
        if registered
            .iter()
            .any(|(gpu, types)| *gpu == e.gpu && types & bit != 0)
        {
            return Some((e.gpu, bit, data));
        }
    }
    None
}

/// `nvmlEventSetWait_v2`.
///
/// # Safety
/// `data` is a writable out-parameter.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetWait_v2(
    set: nvmlEventSet_t,
    data: *mut nvmlEventData_t,
    timeoutms: c_uint,
) -> nvmlReturn_t {
    check!("nvmlEventSetWait_v2");
    let deadline = Instant::now() + Duration::from_millis(u64::from(timeoutms));
    loop {
        if let Some((gpu, bit, value)) = next_event(set_index(set)) {
            return out!(
                data,
                nvmlEventData_t {
                    device: handle(gpu),
                    eventType: bit,
                    eventData: value,
                    gpuInstanceId: 0,
                    computeInstanceId: 0,
                }
            );
        }
        let now = Instant::now();
        if now >= deadline {
            return nvmlReturn_enum_NVML_ERROR_TIMEOUT;
        }
        std::thread::sleep((deadline - now).min(Duration::from_millis(10)));
    }
}
