//! The DCMI sampler: a thread of its own, with its own handle on the library, so the DCMI
//! health thread's polls never queue behind a reading, and a reading that hangs stops only
//! this thread (the figures' age says so).

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use super::{DeviceMetrics, DeviceSample, Figure, Library, MIB, Snapshot};
use crate::device_health::LogOnce;
use crate::device_health::dcmi::answers::chip_info;
use crate::device_health::dcmi::ffi::{
    CallError, Dcmi, FREQUENCY_AI_CORE_CURRENT, HCCS_LINKS, UTILIZATION_AI_CORE,
};
use crate::device_health::dcmi::{Located, locate};

/// DCMI's GB/s, taken as 10^9 bytes a second.
const GB: f64 = 1e9;
/// The window each chip's HCCS rates are measured over: the call takes this long.
const HCCS_WINDOW_MS: i32 = 100;

/// Starts reading every NPU's figures into `metrics` every `every`, from the library at
/// `library`; `devices` are the node's Ascend NPUs (davinci index, device id). No thread's
/// work when the library cannot be loaded or initialised (one log line).
pub fn spawn(
    library: PathBuf,
    devices: Vec<(u32, String)>,
    every: Duration,
    metrics: DeviceMetrics,
) {
    let spawned = std::thread::Builder::new()
        .name("fumarole-dcmi-metrics".into())
        .spawn(move || {
            let dcmi = match Dcmi::open(&library) {
                Ok(d) => d,
                Err(e) => {
                    tracing::info!(error = %e, "no DCMI library: no per-NPU figures");
                    return;
                }
            };
            if let Err(e) = dcmi.init() {
                tracing::warn!(error = %e, "DCMI would not start: no per-NPU figures");
                return;
            }
            let chips = locate(&dcmi, &devices);
            let models: Vec<String> = chips.iter().map(|c| model(&dcmi, c)).collect();
            let mut logs = LogOnce::default();
            loop {
                metrics.store(sample(&dcmi, &chips, &models, &metrics, &mut logs));
                std::thread::sleep(every);
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot start the DCMI metrics thread: no per-NPU figures");
    }
}

/// The chip's model as npu-exporter names it (`Ascend910B3`: chip type and name); empty when
/// the library cannot say.
fn model(dcmi: &Dcmi, chip: &Located) -> String {
    let Some(Ok(raw)) = dcmi.chip_info(chip.card, chip.chip) else {
        return String::new();
    };
    chip_info(
        &raw.chip_type,
        &raw.chip_name,
        &raw.chip_ver,
        raw.aicore_cnt,
    )
    .map(|c| format!("{}{}", c.chip_type, c.name))
    .unwrap_or_default()
}

/// One reading of every located chip; a figure the library does not give is left out and
/// counted.
pub fn sample(
    dcmi: &Dcmi,
    chips: &[Located],
    models: &[String],
    metrics: &DeviceMetrics,
    logs: &mut LogOnce,
) -> Snapshot {
    let mut devices = Vec::with_capacity(chips.len());
    for (c, model) in chips.iter().zip(models) {
        let mut npu = DeviceSample {
            index: c.phy,
            id: c.id.clone(),
            model: model.clone(),
            ..Default::default()
        };
        let mut left_out = |figures: &[Figure], e: &CallError| {
            for figure in figures {
                metrics.failed(*figure);
                if logs.first(&format!("{}/{}", c.id, figure.label())) {
                    tracing::info!(npu = %c.id, figure = figure.label(), error = %e,
                        "DCMI does not give this figure: left out");
                }
            }
        };
        // One call may answer several figures; when it fails, each of them is left out.
        let mut read = |figures: &[Figure], values: Result<Vec<f64>, CallError>| match values {
            Ok(values) => npu.values.extend(figures.iter().copied().zip(values)),
            Err(e) => left_out(figures, &e),
        };
        let (card, chip) = (c.card, c.chip);
        read(
            &[Figure::Utilization],
            dcmi.utilization(card, chip, UTILIZATION_AI_CORE)
                .map(|p| vec![f64::from(p) / 100.0]),
        );
        read(
            &[Figure::MemoryUsed, Figure::MemoryFree, Figure::MemoryTotal],
            dcmi.hbm(card, chip).map(|h| {
                let (used, total) = (h.memory_usage as f64 * MIB, h.memory_size as f64 * MIB);
                vec![used, (total - used).max(0.0), total]
            }),
        );
        read(
            &[Figure::Power],
            dcmi.power(card, chip).map(|p| vec![f64::from(p) / 10.0]),
        );
        read(
            &[Figure::Temperature],
            dcmi.temperature(card, chip).map(|t| vec![f64::from(t)]),
        );
        read(
            &[Figure::AiCoreClock],
            dcmi.frequency(card, chip, FREQUENCY_AI_CORE_CURRENT)
                .map(|mhz| vec![f64::from(mhz) * 1e6]),
        );
        // As the health source judges it: 0 normal and 1 minor alarm serve, 2 and 3 are
        // faults, anything else is no answer.
        read(
            &[Figure::Healthy],
            dcmi.health(card, chip).and_then(|h| match h {
                0..=3 => Ok(vec![f64::from(u8::from(h <= 1))]),
                _ => Err(CallError {
                    call: "dcmi_get_device_health",
                    code: i64::from(h),
                }),
            }),
        );
        let hccs = [Figure::HccsTransmit, Figure::HccsReceive];
        match dcmi.hccs_bandwidth(card, chip, HCCS_WINDOW_MS) {
            Ok(bw) => {
                for link in 0..HCCS_LINKS {
                    let rates = [bw.tx[link], bw.rx[link]].map(|gbps| gbps * GB);
                    npu.links
                        .insert(link as u32, hccs.iter().copied().zip(rates).collect());
                }
            }
            Err(e) => left_out(&hccs, &e),
        }
        devices.push(npu);
    }
    Snapshot {
        library: Library::Dcmi,
        taken: SystemTime::now(),
        driver_version: String::new(),
        devices,
    }
}
