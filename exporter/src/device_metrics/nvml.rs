//! The NVML sampler: a thread of its own, with its own handle on the library (NVML counts its
//! users), so the health thread's event wait and checks never queue behind a reading, and a
//! reading that hangs stops only this thread.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::{
    Clock, EccCounter, MemoryError, PcieUtilCounter, RetirementCause, TemperatureSensor,
};
use nvml_wrapper::error::NvmlError;

use super::{DeviceMetrics, DeviceSample, Figure, Library, Snapshot};
use crate::device_health::LogOnce;
use crate::device_health::nvml::remapped_rows;
use crate::discover::nvml::{MIG_ENABLED, NVLINK_MAX_LANES, open_library};

/// Starts reading every GPU's figures into `metrics` every `every`, from the library at
/// `lib_path` (default `libnvidia-ml.so.1`). No thread when the library is not there.
pub fn spawn(lib_path: Option<PathBuf>, every: Duration, metrics: DeviceMetrics) {
    let spawned = std::thread::Builder::new()
        .name("fumarole-nvml-metrics".into())
        .spawn(move || {
            let nvml = match open_library(lib_path.as_deref()) {
                Ok(Some(nvml)) => nvml,
                Ok(None) => return,
                Err(e) => {
                    tracing::warn!(error = %e, "NVML would not start: no per-device figures");
                    return;
                }
            };
            let mut logs = LogOnce::default();
            // The driver does not change under a running agent.
            let driver_version = nvml.sys_driver_version().unwrap_or_default();
            loop {
                metrics.store(sample(&nvml, &driver_version, &metrics, &mut logs));
                std::thread::sleep(every);
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot start the NVML metrics thread: no per-device figures");
    }
}

/// One reading of every GPU; a figure the library does not give is left out and counted.
pub fn sample(
    nvml: &Nvml,
    driver_version: &str,
    metrics: &DeviceMetrics,
    logs: &mut LogOnce,
) -> Snapshot {
    let count = match nvml.device_count() {
        Ok(n) => n,
        Err(e) => {
            if logs.first("nvmlDeviceGetCount") {
                tracing::warn!(error = %e, "NVML cannot count the GPUs: no per-device figures");
            }
            0
        }
    };
    let last_xids = metrics.last_xids();
    let mut gpus = Vec::new();
    for index in 0..count {
        let Ok(device) = nvml.device_by_index(index) else {
            continue;
        };
        let uuid = device.uuid().unwrap_or_default();
        let mut gpu = DeviceSample {
            index,
            id: uuid.clone(),
            uuid,
            model: device.name().unwrap_or_default(),
            pci_bus_id: device.pci_info().map(|p| p.bus_id).unwrap_or_default(),
            mig_uuids: mig_uuids(&device),
            values: Default::default(),
            links: Default::default(),
        };
        // One call may answer several figures; when it fails, each of them is left out.
        let mut read = |figures: &[Figure], values: Result<Vec<f64>, NvmlError>| match values {
            Ok(values) => gpu.values.extend(figures.iter().copied().zip(values)),
            Err(e) => {
                for figure in figures {
                    metrics.failed(*figure);
                    if logs.first(&format!("{index}/{}", figure.label())) {
                        tracing::info!(gpu = index, figure = figure.label(), error = %e,
                            "NVML does not give this figure: left out");
                    }
                }
            }
        };
        let one = |v: f64| vec![v];
        read(
            &[Figure::Utilization, Figure::MemoryUtilization],
            device
                .utilization_rates()
                .map(|u| vec![f64::from(u.gpu) / 100.0, f64::from(u.memory) / 100.0]),
        );
        read(
            &[Figure::MemoryUsed, Figure::MemoryFree, Figure::MemoryTotal],
            device
                .memory_info()
                .map(|m| vec![m.used as f64, m.free as f64, m.total as f64]),
        );
        read(
            &[Figure::Power],
            device.power_usage().map(|mw| one(f64::from(mw) / 1e3)),
        );
        read(
            &[Figure::Energy],
            device
                .total_energy_consumption()
                .map(|mj| one(mj as f64 / 1e3)),
        );
        read(
            &[Figure::Temperature],
            device
                .temperature(TemperatureSensor::Gpu)
                .map(|c| one(f64::from(c))),
        );
        read(
            &[Figure::SmClock],
            device
                .clock_info(Clock::SM)
                .map(|mhz| one(f64::from(mhz) * 1e6)),
        );
        read(
            &[Figure::MemoryClock],
            device
                .clock_info(Clock::Memory)
                .map(|mhz| one(f64::from(mhz) * 1e6)),
        );
        read(
            &[Figure::ThrottleReasons],
            device
                .current_throttle_reasons()
                .map(|r| one(r.bits() as f64)),
        );
        for (figure, error) in [
            (Figure::EccCorrected, MemoryError::Corrected),
            (Figure::EccUncorrected, MemoryError::Uncorrected),
        ] {
            read(
                &[figure],
                device
                    .total_ecc_errors(error, EccCounter::Volatile)
                    .map(|n| one(n as f64)),
            );
        }
        for (figure, cause) in [
            (
                Figure::RetiredPagesSingleBit,
                RetirementCause::MultipleSingleBitEccErrors,
            ),
            (
                Figure::RetiredPagesDoubleBit,
                RetirementCause::DoubleBitEccError,
            ),
        ] {
            read(
                &[figure],
                device.retired_pages(cause).map(|p| one(p.len() as f64)),
            );
        }
        read(
            &[Figure::RetiredPagesPending],
            device
                .are_pages_pending_retired()
                .map(|p| one(f64::from(u8::from(p)))),
        );
        read(
            &[
                Figure::RemappedRowsCorrectable,
                Figure::RemappedRowsUncorrectable,
                Figure::RowRemapFailed,
            ],
            remapped_rows(nvml, &device).map(|r| {
                vec![
                    f64::from(r.correctable),
                    f64::from(r.uncorrectable),
                    f64::from(u8::from(r.failed)),
                ]
            }),
        );
        for (figure, counter) in [
            (Figure::PcieTransmit, PcieUtilCounter::Send),
            (Figure::PcieReceive, PcieUtilCounter::Receive),
        ] {
            read(
                &[figure],
                device
                    .pcie_throughput(counter)
                    .map(|kb| one(f64::from(kb) * 1024.0)),
            );
        }
        read(
            &[Figure::PcieReplays],
            device.pcie_replay_counter().map(|n| one(f64::from(n))),
        );
        match nvlink_throughput(nvml, &device) {
            Ok(links) => gpu.links = links,
            Err(e) => {
                for figure in [Figure::NvlinkTransmit, Figure::NvlinkReceive] {
                    metrics.failed(figure);
                    if logs.first(&format!("{index}/{}", figure.label())) {
                        tracing::info!(gpu = index, figure = figure.label(), error = %e,
                            "NVML does not give this figure: left out");
                    }
                }
            }
        }
        // From the health thread's events (none while it does not watch them).
        if let Some(xid) = last_xids.get(&gpu.id) {
            gpu.values.insert(Figure::LastXid, xid as f64);
        }
        gpus.push(gpu);
    }
    Snapshot {
        library: Library::Nvml,
        taken: SystemTime::now(),
        driver_version: driver_version.to_string(),
        devices: gpus,
    }
}

/// `NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX` / `_RX`: KiB of data over one link (`scopeId`) since
/// the driver loaded.
const FI_NVLINK_DATA_TX: u32 = 138;
const FI_NVLINK_DATA_RX: u32 = 139;

/// Bytes sent and received over each active NVLink link (`nvmlDeviceGetFieldValues` with the
/// link as scope, which `nvml-wrapper` does not set). A GPU without NVLink has no active link:
/// no figure and no call. A link whose fields NVML does not give is left out.
fn nvlink_throughput(
    nvml: &Nvml,
    device: &nvml_wrapper::Device<'_>,
) -> Result<BTreeMap<u32, BTreeMap<Figure, f64>>, NvmlError> {
    use nvml_wrapper_sys::bindings::{
        nvmlFieldValue_t, nvmlReturn_enum_NVML_SUCCESS,
        nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_LONG_LONG,
    };
    let active: Vec<u32> = (0..NVLINK_MAX_LANES)
        .filter(|l| device.link_wrapper_for(*l).is_active().unwrap_or(false))
        .collect();
    if active.is_empty() {
        return Ok(BTreeMap::new());
    }
    let get = nvml
        .lib()
        .nvmlDeviceGetFieldValues
        .as_ref()
        .map_err(|e| NvmlError::FailedToLoadSymbol(e.to_string()))?;
    let mut fields: Vec<nvmlFieldValue_t> = active
        .iter()
        .flat_map(|link| {
            [FI_NVLINK_DATA_TX, FI_NVLINK_DATA_RX].map(|id| {
                // SAFETY: a plain C struct, valid all zeros (as nvml-wrapper builds it).
                let mut f: nvmlFieldValue_t = unsafe { std::mem::zeroed() };
                f.fieldId = id;
                f.scopeId = *link;
                f
            })
        })
        .collect();
    let count = i32::try_from(fields.len()).unwrap_or(i32::MAX);
    // SAFETY: live handle of this `nvml`; `fields` holds `count` writable entries.
    let ret = unsafe { get(device.handle(), count, fields.as_mut_ptr()) };
    if ret != nvmlReturn_enum_NVML_SUCCESS {
        return Err(NvmlError::from(ret));
    }
    let mut links: BTreeMap<u32, BTreeMap<Figure, f64>> = BTreeMap::new();
    for f in &fields {
        if f.nvmlReturn != nvmlReturn_enum_NVML_SUCCESS
            || f.valueType != nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
        {
            continue;
        }
        let figure = if f.fieldId == FI_NVLINK_DATA_TX {
            Figure::NvlinkTransmit
        } else {
            Figure::NvlinkReceive
        };
        // SAFETY: `valueType` says the union holds an unsigned long long.
        let kib = unsafe { f.value.ullVal };
        links
            .entry(f.scopeId)
            .or_default()
            .insert(figure, kib as f64 * 1024.0);
    }
    Ok(links)
}

/// The uuids of a GPU's MIG devices (none when MIG is off or not supported).
fn mig_uuids(device: &nvml_wrapper::Device<'_>) -> Vec<String> {
    if device.mig_mode().ok().map(|m| m.current) != Some(MIG_ENABLED) {
        return Vec::new();
    }
    let slots = device.mig_device_count().unwrap_or(0);
    (0..slots)
        .filter_map(|slot| device.mig_device_by_index(slot).ok()?.uuid().ok())
        .collect()
}
