//! The per-device figure calls the agent's metrics sampler makes, answered from each GPU's
//! `metrics` in the state file (absent: NotSupported).

// The bindings' constants keep NVML's C names.
#![allow(non_upper_case_globals)]

use std::ffi::{c_uint, c_ulonglong};

use nvml_wrapper_sys::bindings::*;

use crate::{GpuMetrics, gpu};

/// The GPU's figure `pick` chooses, or the code to return (lost GPU, NotSupported).
fn figure<T>(
    device: nvmlDevice_t,
    pick: impl FnOnce(&GpuMetrics) -> Option<T>,
) -> Result<T, nvmlReturn_t> {
    let (_, g) = gpu(device)?;
    pick(&g.metrics).ok_or(nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED)
}

/// Writes the figure `pick` chooses into `out`.
fn answer<T>(
    device: nvmlDevice_t,
    out: *mut T,
    pick: impl FnOnce(&GpuMetrics) -> Option<T>,
) -> nvmlReturn_t {
    match figure(device, pick) {
        Ok(v) => out!(out, v),
        Err(code) => code,
    }
}

/// `nvmlDeviceGetUtilizationRates`.
///
/// # Safety
/// `utilization` is a writable out-parameter.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    device: nvmlDevice_t,
    utilization: *mut nvmlUtilization_t,
) -> nvmlReturn_t {
    check!("nvmlDeviceGetUtilizationRates");
    answer(device, utilization, |m| {
        Some(nvmlUtilization_t {
            gpu: m.utilization?,
            memory: m.memory_utilization?,
        })
    })
}

/// `nvmlDeviceGetPowerUsage` (milliwatts).
///
/// # Safety
/// `power` is a writable out-parameter.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPowerUsage(
    device: nvmlDevice_t,
    power: *mut c_uint,
) -> nvmlReturn_t {
    check!("nvmlDeviceGetPowerUsage");
    answer(device, power, |m| m.power_milliwatts)
}

/// `nvmlDeviceGetTotalEnergyConsumption` (millijoules).
///
/// # Safety
/// `energy` is a writable out-parameter.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTotalEnergyConsumption(
    device: nvmlDevice_t,
    energy: *mut c_ulonglong,
) -> nvmlReturn_t {
    check!("nvmlDeviceGetTotalEnergyConsumption");
    answer(device, energy, |m| m.energy_millijoules)
}

/// `nvmlDeviceGetTemperature` (the GPU die's sensor).
///
/// # Safety
/// `temperature` is a writable out-parameter.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTemperature(
    device: nvmlDevice_t,
    sensor: nvmlTemperatureSensors_t,
    temperature: *mut c_uint,
) -> nvmlReturn_t {
    check!("nvmlDeviceGetTemperature");
    if sensor != nvmlTemperatureSensors_enum_NVML_TEMPERATURE_GPU {
        return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
    }
    answer(device, temperature, |m| m.temperature)
}

/// `nvmlDeviceGetClockInfo` (MHz): the SM and memory clocks.
///
/// # Safety
/// `clock` is a writable out-parameter.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetClockInfo(
    device: nvmlDevice_t,
    kind: nvmlClockType_t,
    clock: *mut c_uint,
) -> nvmlReturn_t {
    check!("nvmlDeviceGetClockInfo");
    answer(device, clock, |m| match kind {
        nvmlClockType_enum_NVML_CLOCK_SM => m.sm_clock_mhz,
        nvmlClockType_enum_NVML_CLOCK_MEM => m.memory_clock_mhz,
        _ => None,
    })
}

/// `nvmlDeviceGetCurrentClocksThrottleReasons` (NVML's bitmask).
///
/// # Safety
/// `reasons` is a writable out-parameter.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCurrentClocksThrottleReasons(
    device: nvmlDevice_t,
    reasons: *mut c_ulonglong,
) -> nvmlReturn_t {
    check!("nvmlDeviceGetCurrentClocksThrottleReasons");
    answer(device, reasons, |m| m.throttle_reasons)
}

/// `nvmlDeviceGetTotalEccErrors` (volatile counts only).
///
/// # Safety
/// `count` is a writable out-parameter.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTotalEccErrors(
    device: nvmlDevice_t,
    kind: nvmlMemoryErrorType_t,
    counter: nvmlEccCounterType_t,
    count: *mut c_ulonglong,
) -> nvmlReturn_t {
    check!("nvmlDeviceGetTotalEccErrors");
    if counter != nvmlEccCounterType_enum_NVML_VOLATILE_ECC {
        return nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED;
    }
    answer(device, count, |m| match kind {
        nvmlMemoryErrorType_enum_NVML_MEMORY_ERROR_TYPE_CORRECTED => m.ecc_corrected,
        nvmlMemoryErrorType_enum_NVML_MEMORY_ERROR_TYPE_UNCORRECTED => m.ecc_uncorrected,
        _ => None,
    })
}

/// How many pages `cause` retired.
fn retired(device: nvmlDevice_t, cause: nvmlPageRetirementCause_t) -> Result<c_uint, nvmlReturn_t> {
    figure(device, |m| match cause {
        nvmlPageRetirementCause_enum_NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS => {
            m.retired_pages_single_bit
        }
        nvmlPageRetirementCause_enum_NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR => {
            m.retired_pages_double_bit
        }
        _ => None,
    })
}

/// `nvmlDeviceGetRetiredPages`: with a buffer too small for them, how many there are
/// (`INSUFFICIENT_SIZE`), as the real library answers.
///
/// # Safety
/// `count` is a writable in/out parameter; `addresses` holds `*count` entries.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetRetiredPages(
    device: nvmlDevice_t,
    cause: nvmlPageRetirementCause_t,
    count: *mut c_uint,
    addresses: *mut c_ulonglong,
) -> nvmlReturn_t {
    check!("nvmlDeviceGetRetiredPages");
    // SAFETY: the caller's contract, passed on (no timestamps asked for).
    unsafe { retired_pages(device, cause, count, addresses, std::ptr::null_mut()) }
}

/// `nvmlDeviceGetRetiredPages_v2`: the pages' addresses (0, 4096, ...) and timestamps (0).
///
/// # Safety
/// `count` is a writable in/out parameter; `addresses` and `timestamps` (or null) hold
/// `*count` entries.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetRetiredPages_v2(
    device: nvmlDevice_t,
    cause: nvmlPageRetirementCause_t,
    count: *mut c_uint,
    addresses: *mut c_ulonglong,
    timestamps: *mut c_ulonglong,
) -> nvmlReturn_t {
    check!("nvmlDeviceGetRetiredPages_v2");
    // SAFETY: the caller's contract, passed on.
    unsafe { retired_pages(device, cause, count, addresses, timestamps) }
}

/// # Safety
/// As [`nvmlDeviceGetRetiredPages_v2`].
unsafe fn retired_pages(
    device: nvmlDevice_t,
    cause: nvmlPageRetirementCause_t,
    count: *mut c_uint,
    addresses: *mut c_ulonglong,
    timestamps: *mut c_ulonglong,
) -> nvmlReturn_t {
    let n = match retired(device, cause) {
        Ok(n) => n,
        Err(code) => return code,
    };
    if count.is_null() {
        return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: `count` is a writable in/out parameter (checked non-null).
    let room = unsafe { *count };
    // SAFETY: as above.
    unsafe { *count = n };
    if room < n {
        return nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for i in 0..n as usize {
        // SAFETY: both buffers hold `room >= n` entries when non-null.
        unsafe {
            if !addresses.is_null() {
                *addresses.add(i) = i as c_ulonglong * 4096;
            }
            if !timestamps.is_null() {
                *timestamps.add(i) = 0;
            }
        }
    }
    nvmlReturn_enum_NVML_SUCCESS
}

/// `nvmlDeviceGetPcieThroughput` (KB/s).
///
/// # Safety
/// `value` is a writable out-parameter.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPcieThroughput(
    device: nvmlDevice_t,
    counter: nvmlPcieUtilCounter_t,
    value: *mut c_uint,
) -> nvmlReturn_t {
    check!("nvmlDeviceGetPcieThroughput");
    answer(device, value, |m| match counter {
        nvmlPcieUtilCounter_enum_NVML_PCIE_UTIL_TX_BYTES => m.pcie_tx_kilobytes_per_second,
        nvmlPcieUtilCounter_enum_NVML_PCIE_UTIL_RX_BYTES => m.pcie_rx_kilobytes_per_second,
        _ => None,
    })
}

/// `nvmlDeviceGetPcieReplayCounter`.
///
/// # Safety
/// `value` is a writable out-parameter.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPcieReplayCounter(
    device: nvmlDevice_t,
    value: *mut c_uint,
) -> nvmlReturn_t {
    check!("nvmlDeviceGetPcieReplayCounter");
    answer(device, value, |m| m.pcie_replays)
}

/// `NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX` / `_RX`.
const FI_NVLINK_DATA_TX: c_uint = 138;
const FI_NVLINK_DATA_RX: c_uint = 139;

/// `nvmlDeviceGetFieldValues`: the NVLink data counters of the link each value's `scopeId`
/// names (the lane's `txKib` / `rxKib`); any other field, or a figure absent, answers
/// NotSupported in that value, as the real library does per field.
///
/// # Safety
/// `values` holds `count` writable entries.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetFieldValues(
    device: nvmlDevice_t,
    count: std::ffi::c_int,
    values: *mut nvmlFieldValue_t,
) -> nvmlReturn_t {
    check!("nvmlDeviceGetFieldValues");
    if let Err(code) = gpu(device) {
        return code;
    }
    let Ok(n) = usize::try_from(count) else {
        return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
    };
    if values.is_null() {
        return nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: the caller passes `count` writable entries (checked non-null).
    let values = unsafe { std::slice::from_raw_parts_mut(values, n) };
    for v in values {
        let kib = crate::lane(device, v.scopeId)
            .ok()
            .and_then(|l| match v.fieldId {
                FI_NVLINK_DATA_TX => l.tx_kib,
                FI_NVLINK_DATA_RX => l.rx_kib,
                _ => None,
            });
        match kib {
            Some(kib) => {
                v.nvmlReturn = nvmlReturn_enum_NVML_SUCCESS;
                v.valueType = nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
                v.value.ullVal = kib;
            }
            None => v.nvmlReturn = nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED,
        }
    }
    nvmlReturn_enum_NVML_SUCCESS
}
