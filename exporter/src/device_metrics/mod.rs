//! Per-device figures on the agent's `/metrics`: utilisation, memory, power and energy,
//! temperature, clocks and throttling, ECC errors, retired pages and remapped rows, PCIe
//! traffic. A sampler reads them from the vendor library on a clock of its own
//! ([`nvml::spawn`]) into a cache that every scrape reads: a scrape never calls the library,
//! and a library that hangs leaves the last figures in place with their age growing
//! (`fumarole_device_metrics_age_seconds`), never a hung scrape. A call that fails or is not
//! supported on a device leaves that one figure out for that device and counts the failure
//! (`fumarole_device_metric_errors_total{figure}`).
//!
//! Every figure carries the pod holding the device (from PodResources: a whole device, one of
//! its replicas, one of its MIG devices; one series per holder, as dcgm-exporter does), and is
//! written under fumarole's names (`fumarole_device_*`), dcgm-exporter's (`DCGM_FI_DEV_*`
//! with its labels, so the dashboards and alerts written for it work unchanged), or both
//! ([`Names`]; the names and their units are in [`SPECS`], the reference in
//! `docs/reference/dcgm-exporter.md`).

pub mod nvml;
pub mod usage;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, SystemTime};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use tokio::sync::watch;

use fumarole_topology::crd::PodDeviceUsage;

use crate::kubelet::{AllocationSource, Allocations};
use usage::UsageTracker;

/// What the agent samples and under which names (flattened into `fumarole-agent run`).
#[derive(clap::Args, Clone, Debug)]
pub struct DeviceMetricsArgs {
    /// How often the per-device figures are read from the vendor library (a scrape reads the
    /// last reading); 0 turns them off.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = humantime::parse_duration)]
    pub device_metrics_interval: Duration,
    /// The names the per-device figures are written under, comma-separated: `fumarole`
    /// (`fumarole_device_*`), `dcgm` (dcgm-exporter's `DCGM_FI_DEV_*` and labels).
    #[arg(
        long,
        value_name = "NAMES",
        value_delimiter = ',',
        default_value = "fumarole"
    )]
    pub device_metric_names: Vec<Names>,
    /// The window a pod's use of its devices is averaged over (`DeviceTopology` status
    /// `pods`: a pod under 5 % over it holds devices and uses little of them).
    #[arg(long, value_name = "DURATION", default_value = "10m", value_parser = humantime::parse_duration)]
    pub device_usage_window: Duration,
}

/// A set of names the figures are written under.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Names {
    /// `fumarole_device_*`, labels `device`, `uuid`, `model`, `node`, `namespace`, `pod`,
    /// `container`.
    Fumarole,
    /// dcgm-exporter's: `DCGM_FI_DEV_*`, labels `gpu`, `UUID`, `pci_bus_id`, `device`,
    /// `modelName`, `Hostname`, `DCGM_FI_DRIVER_VERSION`, `namespace`, `pod`, `container`.
    Dcgm,
}

/// One figure of a device, in base units (ratios 0-1, bytes, watts, joules, hertz).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Figure {
    Utilization,
    MemoryUtilization,
    MemoryUsed,
    MemoryFree,
    MemoryTotal,
    Power,
    Energy,
    Temperature,
    SmClock,
    MemoryClock,
    ThrottleReasons,
    EccCorrected,
    EccUncorrected,
    RetiredPagesSingleBit,
    RetiredPagesDoubleBit,
    RetiredPagesPending,
    RemappedRowsCorrectable,
    RemappedRowsUncorrectable,
    RowRemapFailed,
    PcieTransmit,
    PcieReceive,
    PcieReplays,
}

/// How a figure is written.
pub struct Spec {
    pub figure: Figure,
    /// fumarole's name, without the `fumarole_` prefix (a counter's samples add `_total`).
    pub name: &'static str,
    pub help: &'static str,
    pub counter: bool,
    /// dcgm-exporter's field; `None` where it has none.
    pub dcgm: Option<DcgmField>,
}

/// A dcgm-exporter field (`docs/reference/dcgm-exporter.md`).
pub struct DcgmField {
    pub name: &'static str,
    /// From the base unit to the field's (MiB, %, mJ, MHz, KB/s).
    pub factor: f64,
    /// dcgm-exporter types it a counter (written untyped here, keeping the name).
    pub counter: bool,
}

const MIB: f64 = 1024.0 * 1024.0;

/// Every figure: fumarole's name and help, and dcgm-exporter's field.
pub const SPECS: &[Spec] = &[
    spec(
        Figure::Utilization,
        "device_utilization_ratio",
        "Share of the last sample period the device was running a kernel",
        false,
        Some(dcgm("DCGM_FI_DEV_GPU_UTIL", 100.0, false)),
    ),
    spec(
        Figure::MemoryUtilization,
        "device_memory_utilization_ratio",
        "Share of the last sample period device memory was read or written",
        false,
        Some(dcgm("DCGM_FI_DEV_MEM_COPY_UTIL", 100.0, false)),
    ),
    spec(
        Figure::MemoryUsed,
        "device_memory_used_bytes",
        "Device memory in use",
        false,
        Some(dcgm("DCGM_FI_DEV_FB_USED", 1.0 / MIB, false)),
    ),
    spec(
        Figure::MemoryFree,
        "device_memory_free_bytes",
        "Device memory free",
        false,
        Some(dcgm("DCGM_FI_DEV_FB_FREE", 1.0 / MIB, false)),
    ),
    spec(
        Figure::MemoryTotal,
        "device_memory_total_bytes",
        "Device memory in all",
        false,
        Some(dcgm("DCGM_FI_DEV_FB_TOTAL", 1.0 / MIB, false)),
    ),
    spec(
        Figure::Power,
        "device_power_watts",
        "Power draw",
        false,
        Some(dcgm("DCGM_FI_DEV_POWER_USAGE", 1.0, false)),
    ),
    spec(
        Figure::Energy,
        "device_energy_joules",
        "Energy used since the driver loaded",
        true,
        Some(dcgm("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 1000.0, true)),
    ),
    spec(
        Figure::Temperature,
        "device_temperature_celsius",
        "Temperature of the device",
        false,
        Some(dcgm("DCGM_FI_DEV_GPU_TEMP", 1.0, false)),
    ),
    spec(
        Figure::SmClock,
        "device_sm_clock_hertz",
        "SM clock",
        false,
        Some(dcgm("DCGM_FI_DEV_SM_CLOCK", 1e-6, false)),
    ),
    spec(
        Figure::MemoryClock,
        "device_memory_clock_hertz",
        "Memory clock",
        false,
        Some(dcgm("DCGM_FI_DEV_MEM_CLOCK", 1e-6, false)),
    ),
    spec(
        Figure::ThrottleReasons,
        "device_clock_throttle_reasons",
        "Why the clocks are held down now (NVML's bitmask; 0: they are not)",
        false,
        Some(dcgm("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", 1.0, false)),
    ),
    spec(
        Figure::EccCorrected,
        "device_ecc_corrected_errors",
        "Corrected (single-bit) ECC errors since the driver loaded",
        true,
        Some(dcgm("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", 1.0, true)),
    ),
    spec(
        Figure::EccUncorrected,
        "device_ecc_uncorrected_errors",
        "Uncorrected (double-bit) ECC errors since the driver loaded",
        true,
        Some(dcgm("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 1.0, true)),
    ),
    spec(
        Figure::RetiredPagesSingleBit,
        "device_retired_pages_single_bit",
        "Memory pages retired after repeated single-bit errors",
        false,
        Some(dcgm("DCGM_FI_DEV_RETIRED_SBE", 1.0, true)),
    ),
    spec(
        Figure::RetiredPagesDoubleBit,
        "device_retired_pages_double_bit",
        "Memory pages retired after a double-bit error",
        false,
        Some(dcgm("DCGM_FI_DEV_RETIRED_DBE", 1.0, true)),
    ),
    spec(
        Figure::RetiredPagesPending,
        "device_retired_pages_pending",
        "1 when pages wait to be retired at the next driver load",
        false,
        Some(dcgm("DCGM_FI_DEV_RETIRED_PENDING", 1.0, true)),
    ),
    spec(
        Figure::RemappedRowsCorrectable,
        "device_remapped_rows_correctable",
        "Memory rows remapped after correctable errors",
        false,
        Some(dcgm("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", 1.0, true)),
    ),
    spec(
        Figure::RemappedRowsUncorrectable,
        "device_remapped_rows_uncorrectable",
        "Memory rows remapped after uncorrectable errors",
        false,
        Some(dcgm("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", 1.0, true)),
    ),
    spec(
        Figure::RowRemapFailed,
        "device_row_remap_failed",
        "1 when a row could not be remapped",
        false,
        Some(dcgm("DCGM_FI_DEV_ROW_REMAP_FAILURE", 1.0, false)),
    ),
    spec(
        Figure::PcieTransmit,
        "device_pcie_transmit_bytes_per_second",
        "PCIe traffic out of the device over NVML's last 20 ms",
        false,
        Some(dcgm("DCGM_FI_DEV_PCIE_TX_THROUGHPUT", 1.0 / 1024.0, true)),
    ),
    spec(
        Figure::PcieReceive,
        "device_pcie_receive_bytes_per_second",
        "PCIe traffic into the device over NVML's last 20 ms",
        false,
        Some(dcgm("DCGM_FI_DEV_PCIE_RX_THROUGHPUT", 1.0 / 1024.0, true)),
    ),
    spec(
        Figure::PcieReplays,
        "device_pcie_replays",
        "PCIe retries since the driver loaded",
        true,
        Some(dcgm("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", 1.0, true)),
    ),
];

const fn dcgm(name: &'static str, factor: f64, counter: bool) -> DcgmField {
    DcgmField {
        name,
        factor,
        counter,
    }
}

const fn spec(
    figure: Figure,
    name: &'static str,
    help: &'static str,
    counter: bool,
    dcgm: Option<DcgmField>,
) -> Spec {
    Spec {
        figure,
        name,
        help,
        counter,
        dcgm,
    }
}

impl Figure {
    /// The label value that names the figure in the error counter (its fumarole name).
    pub fn label(self) -> &'static str {
        SPECS
            .iter()
            .find(|s| s.figure == self)
            .map_or("unknown", |s| s.name)
    }
}

/// One GPU's figures at one reading.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GpuSample {
    /// NVML's index.
    pub index: u32,
    pub uuid: String,
    pub model: String,
    /// NVML's form (`00000000:1B:00.0`).
    pub pci_bus_id: String,
    /// The uuids of its MIG devices: whoever holds one holds a part of this GPU.
    pub mig_uuids: Vec<String>,
    /// The figures read (a failed read leaves its figure out).
    pub values: BTreeMap<Figure, f64>,
}

/// One reading of every device of the node.
#[derive(Clone, Debug, PartialEq)]
pub struct Snapshot {
    /// When the reading ended.
    pub taken: SystemTime,
    pub driver_version: String,
    pub gpus: Vec<GpuSample>,
}

/// A container holding a device (or a share of it).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Holder {
    pub namespace: String,
    pub pod: String,
    pub container: String,
}

/// The cache between the sampler and the scrapes, and who holds what.
#[derive(Clone, Debug)]
pub struct DeviceMetrics {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    node: String,
    snapshot: RwLock<Option<Arc<Snapshot>>>,
    /// Device ids as the kubelet gave them (a uuid, `<uuid>::<n>`, a MIG uuid) and who has
    /// each.
    held: RwLock<Vec<(String, Holder)>>,
    errors: Family<Vec<(String, String)>, Counter>,
    usage: Mutex<UsageTracker>,
    /// Each holding pod's use of its devices, after each reading.
    pods: watch::Sender<Vec<PodDeviceUsage>>,
}

impl DeviceMetrics {
    /// Registers the figures of `node` under the names `args` asks for: fumarole's into
    /// `registry` (prefixed `fumarole_`), dcgm-exporter's into `unprefixed`; the error counter
    /// and the figures' age always.
    pub fn register(
        registry: &mut Registry,
        unprefixed: &mut Registry,
        node: &str,
        args: &DeviceMetricsArgs,
    ) -> Self {
        let names = &args.device_metric_names;
        let metrics = DeviceMetrics {
            inner: Arc::new(Inner {
                node: node.to_string(),
                snapshot: RwLock::new(None),
                held: RwLock::new(Vec::new()),
                errors: Family::default(),
                usage: Mutex::new(UsageTracker::new(args.device_usage_window)),
                pods: watch::channel(Vec::new()).0,
            }),
        };
        registry.register(
            "device_metric_errors",
            "Per-device figures the vendor library could not give (failed or not supported), by figure",
            metrics.inner.errors.clone(),
        );
        registry.register_collector(Box::new(Age {
            metrics: metrics.clone(),
        }));
        if names.contains(&Names::Fumarole) {
            registry.register_collector(Box::new(Figures {
                metrics: metrics.clone(),
                names: Names::Fumarole,
            }));
        }
        if names.contains(&Names::Dcgm) {
            unprefixed.register_collector(Box::new(Figures {
                metrics: metrics.clone(),
                names: Names::Dcgm,
            }));
        }
        metrics
    }

    /// The sampler's latest reading; each holding pod's use follows from it.
    pub fn store(&self, snapshot: Snapshot) {
        let holders: Vec<Vec<Holder>> = snapshot.gpus.iter().map(|g| self.holders(g)).collect();
        let pods = self
            .inner
            .usage
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .update(&snapshot, &holders);
        self.inner.pods.send_if_modified(|last| {
            let changed = *last != pods;
            *last = pods;
            changed
        });
        *self
            .inner
            .snapshot
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Some(Arc::new(snapshot));
    }

    /// A figure the library could not give for one device.
    pub fn failed(&self, figure: Figure) {
        self.inner
            .errors
            .get_or_create(&vec![("figure".into(), figure.label().into())])
            .inc();
    }

    /// Who holds which device, from the kubelet's allocations (PodResources; the checkpoint
    /// knows no devices, and leaves the last holders in place).
    pub fn set_allocations(&self, alloc: &Allocations) {
        if alloc.source != AllocationSource::PodResources {
            return;
        }
        let held = alloc
            .pods
            .iter()
            .flat_map(|p| {
                p.containers.iter().flat_map(move |c| {
                    c.devices.values().flatten().map(move |id| {
                        let holder = Holder {
                            namespace: p.namespace.clone(),
                            pod: p.name.clone(),
                            container: c.name.clone(),
                        };
                        (id.clone(), holder)
                    })
                })
            })
            .collect();
        *self
            .inner
            .held
            .write()
            .unwrap_or_else(PoisonError::into_inner) = held;
    }

    /// Each holding pod's use of its devices, as of the last reading (empty before one).
    pub fn pods(&self) -> watch::Receiver<Vec<PodDeviceUsage>> {
        self.inner.pods.subscribe()
    }

    fn snapshot(&self) -> Option<Arc<Snapshot>> {
        self.inner
            .snapshot
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Who holds `gpu` or a share of it, each once, in the kubelet's order.
    fn holders(&self, gpu: &GpuSample) -> Vec<Holder> {
        let held = self
            .inner
            .held
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        let mut out: Vec<Holder> = Vec::new();
        for (id, holder) in held.iter() {
            let ours = *id == gpu.uuid
                || id
                    .strip_prefix(gpu.uuid.as_str())
                    .is_some_and(|rest| rest.starts_with("::"))
                || gpu.mig_uuids.contains(id);
            if ours && !gpu.uuid.is_empty() && !out.contains(holder) {
                out.push(holder.clone());
            }
        }
        out
    }
}

/// The figures under one set of names, encoded at each scrape from the cache.
#[derive(Debug)]
struct Figures {
    metrics: DeviceMetrics,
    names: Names,
}

impl Figures {
    /// The labels of `gpu`'s series held by `holder` (empty pod labels when none holds it).
    fn labels(
        &self,
        snapshot: &Snapshot,
        gpu: &GpuSample,
        holder: &Holder,
    ) -> Vec<(String, String)> {
        let node = &self.metrics.inner.node;
        let holder_labels = [
            ("namespace", &holder.namespace),
            ("pod", &holder.pod),
            ("container", &holder.container),
        ];
        let mut labels: Vec<(String, String)> = match self.names {
            Names::Fumarole => vec![
                ("device".into(), format!("nvidia-{}", gpu.index)),
                ("uuid".into(), gpu.uuid.clone()),
                ("model".into(), gpu.model.clone()),
                ("node".into(), node.clone()),
            ],
            Names::Dcgm => vec![
                ("gpu".into(), gpu.index.to_string()),
                ("UUID".into(), gpu.uuid.clone()),
                ("pci_bus_id".into(), gpu.pci_bus_id.clone()),
                ("device".into(), format!("nvidia{}", gpu.index)),
                ("modelName".into(), gpu.model.clone()),
                ("Hostname".into(), node.clone()),
                (
                    "DCGM_FI_DRIVER_VERSION".into(),
                    snapshot.driver_version.clone(),
                ),
            ],
        };
        labels.extend(holder_labels.map(|(k, v)| (k.to_string(), v.clone())));
        labels
    }
}

impl Collector for Figures {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(snapshot) = self.metrics.snapshot() else {
            return Ok(());
        };
        // Each GPU's label sets, one per holder (empty pod labels when none), built once for
        // all its figures.
        let series: Vec<Vec<Vec<(String, String)>>> = snapshot
            .gpus
            .iter()
            .map(|g| {
                let mut holders = self.metrics.holders(g);
                if holders.is_empty() {
                    holders.push(Holder::default());
                }
                holders
                    .iter()
                    .map(|h| self.labels(&snapshot, g, h))
                    .collect()
            })
            .collect();
        for spec in SPECS {
            let (name, factor, kind) = match (self.names, &spec.dcgm) {
                (Names::Fumarole, _) => {
                    let kind = if spec.counter {
                        MetricType::Counter
                    } else {
                        MetricType::Gauge
                    };
                    (spec.name, 1.0, kind)
                }
                // dcgm-exporter's counters keep their names (no `_total`): written untyped.
                (Names::Dcgm, Some(field)) => {
                    let kind = if field.counter {
                        MetricType::Unknown
                    } else {
                        MetricType::Gauge
                    };
                    (field.name, field.factor, kind)
                }
                (Names::Dcgm, None) => continue,
            };
            if !snapshot
                .gpus
                .iter()
                .any(|g| g.values.contains_key(&spec.figure))
            {
                continue;
            }
            let mut family = encoder.encode_descriptor(name, spec.help, None, kind)?;
            for (gpu, label_sets) in snapshot.gpus.iter().zip(&series) {
                let Some(value) = gpu.values.get(&spec.figure) else {
                    continue;
                };
                let value = value * factor;
                for labels in label_sets {
                    let mut sample = family.encode_family(labels)?;
                    if spec.counter && self.names == Names::Fumarole {
                        sample.encode_counter::<NoLabelSet, f64, f64>(&value, None)?;
                    } else {
                        sample.encode_gauge(&value)?;
                    }
                }
            }
        }
        Ok(())
    }
}

/// How old the figures are, whatever names they are written under.
#[derive(Debug)]
struct Age {
    metrics: DeviceMetrics,
}

impl Collector for Age {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(snapshot) = self.metrics.snapshot() else {
            return Ok(());
        };
        let age = SystemTime::now()
            .duration_since(snapshot.taken)
            .unwrap_or_default()
            .as_secs_f64();
        let mut family = encoder.encode_descriptor(
            "device_metrics_age_seconds",
            "Seconds since the per-device figures were last read (grows while the library does not answer)",
            None,
            MetricType::Gauge,
        )?;
        family.encode_gauge(&age)
    }
}

#[cfg(test)]
mod tests;
