//! Per-device figures on the agent's `/metrics`: for NVIDIA GPUs utilisation, memory, power
//! and energy, temperature, clocks and throttling, ECC errors, retired pages and remapped rows,
//! PCIe traffic, NVLink data per link and the last XID; for Ascend NPUs AI-core utilisation and
//! clock, HBM, power, temperature, health and HCCS rates per link. A sampler per vendor library
//! reads them on a clock of its own ([`nvml::spawn`], [`dcmi::spawn`]) into a cache that every
//! scrape reads: a scrape never calls a library, and a library that hangs leaves the last
//! figures in place with their age growing (`fumarole_device_metrics_age_seconds{library}`),
//! never a hung scrape. A call that fails or is not supported on a device leaves that one
//! figure out for that device and counts the failure
//! (`fumarole_device_metric_errors_total{figure}`).
//!
//! Every figure carries the pod holding the device (from PodResources: a whole device, one of
//! its replicas, one of its MIG devices, a device of a DRA claim; one series per holder, as
//! dcgm-exporter does), and is written under fumarole's names (`fumarole_device_*`),
//! dcgm-exporter's for GPUs (`DCGM_FI_DEV_*`) and npu-exporter's for NPUs (`npu_chip_info_*`),
//! each with its labels so the dashboards and alerts written for them work unchanged, or
//! several ([`Names`]; the names and their units are in [`SPECS`], the references in
//! `docs/reference/dcgm-exporter.md` and `docs/reference/npu-exporter.md`).

pub mod dcmi;
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
use fumarole_topology::{Vendor, dra};

use crate::device_health::nvml::xid::LastXids;
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
    /// (`fumarole_device_*`), `dcgm` (dcgm-exporter's `DCGM_FI_DEV_*` and labels, GPUs),
    /// `npu-exporter` (Huawei npu-exporter's `npu_chip_info_*` and labels, NPUs).
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
    /// Huawei npu-exporter's: `npu_chip_info_*`, labels `id`, `model_name`, `namespace`,
    /// `pod_name`, `container_name`.
    NpuExporter,
}

/// The vendor library a reading comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Library {
    /// NVIDIA's NVML: GPUs.
    Nvml,
    /// Huawei's DCMI: Ascend NPUs.
    Dcmi,
}

impl Library {
    pub fn label(self) -> &'static str {
        match self {
            Library::Nvml => "nvml",
            Library::Dcmi => "dcmi",
        }
    }

    /// The vendor of the devices it answers for.
    fn vendor(self) -> Vendor {
        match self {
            Library::Nvml => Vendor::Nvidia,
            Library::Dcmi => Vendor::Huawei,
        }
    }

    /// How fumarole's `device` label names its devices (`nvidia-0`, `ascend-0`).
    fn device_prefix(self) -> &'static str {
        match self {
            Library::Nvml => "nvidia",
            Library::Dcmi => "ascend",
        }
    }
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
    AiCoreClock,
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
    NvlinkTransmit,
    NvlinkReceive,
    HccsTransmit,
    HccsReceive,
    LastXid,
    Healthy,
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
    /// npu-exporter's metric; `None` where it has none.
    pub npu: Option<NpuField>,
}

/// An npu-exporter metric (`docs/reference/npu-exporter.md`): a gauge.
pub struct NpuField {
    pub name: &'static str,
    /// From the base unit to the metric's (%, MB, MHz).
    pub factor: f64,
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
    )
    .npu("npu_chip_info_utilization", 100.0),
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
    )
    .npu("npu_chip_info_hbm_used_memory", 1.0 / MIB),
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
    )
    .npu("npu_chip_info_hbm_total_memory", 1.0 / MIB),
    spec(
        Figure::Power,
        "device_power_watts",
        "Power draw",
        false,
        Some(dcgm("DCGM_FI_DEV_POWER_USAGE", 1.0, false)),
    )
    .npu("npu_chip_info_power", 1.0),
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
    )
    .npu("npu_chip_info_temperature", 1.0),
    spec(
        Figure::SmClock,
        "device_sm_clock_hertz",
        "SM clock",
        false,
        Some(dcgm("DCGM_FI_DEV_SM_CLOCK", 1e-6, false)),
    ),
    spec(
        Figure::AiCoreClock,
        "device_aicore_clock_hertz",
        "AI-core clock now",
        false,
        None,
    )
    .npu("npu_chip_info_aicore_current_freq", 1e-6),
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
    spec(
        Figure::NvlinkTransmit,
        "device_nvlink_transmit_bytes",
        "Data sent over the NVLink link since the driver loaded, per link",
        true,
        None,
    ),
    spec(
        Figure::NvlinkReceive,
        "device_nvlink_receive_bytes",
        "Data received over the NVLink link since the driver loaded, per link",
        true,
        None,
    ),
    spec(
        Figure::HccsTransmit,
        "device_hccs_transmit_bytes_per_second",
        "Data rate out over the HCCS link, per link, over DCMI's last 100 ms window",
        false,
        None,
    ),
    spec(
        Figure::HccsReceive,
        "device_hccs_receive_bytes_per_second",
        "Data rate in over the HCCS link, per link, over DCMI's last 100 ms window",
        false,
        None,
    ),
    spec(
        Figure::LastXid,
        "device_last_xid",
        "The last XID error the driver reported for the device (0: none since the agent started)",
        false,
        Some(dcgm("DCGM_FI_DEV_XID_ERRORS", 1.0, false)),
    ),
    spec(
        Figure::Healthy,
        "device_healthy",
        "1 when the vendor library calls the device healthy, 0 when it reports a fault",
        false,
        None,
    )
    .npu("npu_chip_info_health_status", 1.0),
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
        npu: None,
    }
}

impl Spec {
    /// The figure under npu-exporter's `name` too, in base units times `factor`.
    const fn npu(self, name: &'static str, factor: f64) -> Spec {
        Spec {
            npu: Some(NpuField { name, factor }),
            ..self
        }
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

/// One device's figures at one reading.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DeviceSample {
    /// NVML's index; an NPU's physical id (the `N` of `/dev/davinciN`).
    pub index: u32,
    /// The id the device plugin hands the kubelet: a GPU's uuid, `Ascend910-N`.
    pub id: String,
    /// A GPU's uuid; empty for an NPU.
    pub uuid: String,
    pub model: String,
    /// NVML's form (`00000000:1B:00.0`); empty for an NPU.
    pub pci_bus_id: String,
    /// The uuids of its MIG devices: whoever holds one holds a part of this GPU.
    pub mig_uuids: Vec<String>,
    /// The figures read (a failed read leaves its figure out).
    pub values: BTreeMap<Figure, f64>,
    /// Per-link figures (NVLink data, HCCS rates), by link number.
    pub links: BTreeMap<u32, BTreeMap<Figure, f64>>,
}

impl DeviceSample {
    /// Whether any reading of `figure` is here, per device or per link.
    fn has(&self, figure: Figure) -> bool {
        self.values.contains_key(&figure) || self.links.values().any(|l| l.contains_key(&figure))
    }
}

/// One reading of every device of the node that one library answers for.
#[derive(Clone, Debug, PartialEq)]
pub struct Snapshot {
    pub library: Library,
    /// When the reading ended.
    pub taken: SystemTime,
    pub driver_version: String,
    pub devices: Vec<DeviceSample>,
}

/// A container holding a device (or a share of it).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Holder {
    pub namespace: String,
    pub pod: String,
    pub container: String,
}

/// A device as the kubelet says a container holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Held {
    /// Through a device plugin: the id it handed out.
    Plugin(String),
    /// Through a DRA claim: the driver and the device's name in its pool.
    Claim { driver: String, device: String },
}

/// The cache between the sampler and the scrapes, and who holds what.
#[derive(Clone, Debug)]
pub struct DeviceMetrics {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    node: String,
    /// Each library's latest reading.
    snapshots: RwLock<BTreeMap<Library, Arc<Snapshot>>>,
    /// Devices as the kubelet says they are held (a plugin's id, `<id>::<n>`, a MIG uuid, a
    /// claimed device's pool name) and who has each.
    held: RwLock<Vec<(Held, Holder)>>,
    errors: Family<Vec<(String, String)>, Counter>,
    /// Each GPU's last XID, from the NVML health thread's events.
    last_xids: LastXids,
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
                snapshots: RwLock::new(BTreeMap::new()),
                held: RwLock::new(Vec::new()),
                errors: Family::default(),
                last_xids: LastXids::default(),
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
        for unprefixed_names in [Names::Dcgm, Names::NpuExporter] {
            if names.contains(&unprefixed_names) {
                unprefixed.register_collector(Box::new(Figures {
                    metrics: metrics.clone(),
                    names: unprefixed_names,
                }));
            }
        }
        metrics
    }

    /// A sampler's latest reading; each holding pod's use follows from it and the other
    /// libraries' latest.
    pub fn store(&self, snapshot: Snapshot) {
        let snapshot = Arc::new(snapshot);
        let all = {
            let mut snapshots = self
                .inner
                .snapshots
                .write()
                .unwrap_or_else(PoisonError::into_inner);
            snapshots.insert(snapshot.library, Arc::clone(&snapshot));
            snapshots.values().cloned().collect::<Vec<_>>()
        };
        let held: Vec<(&DeviceSample, Vec<Holder>)> = all
            .iter()
            .flat_map(|s| s.devices.iter().map(|d| (s.library, d)))
            .map(|(library, d)| (d, self.holders(library, d)))
            .collect();
        let pods = self
            .inner
            .usage
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .update(&snapshot, &held);
        self.inner.pods.send_if_modified(|last| {
            let changed = *last != pods;
            *last = pods;
            changed
        });
    }

    /// A figure the library could not give for one device.
    pub fn failed(&self, figure: Figure) {
        self.inner
            .errors
            .get_or_create(&vec![("figure".into(), figure.label().into())])
            .inc();
    }

    /// Who holds which device, from the kubelet's allocations (PodResources: device plugins'
    /// and DRA claims'; the checkpoint knows no devices, and leaves the last holders in place).
    pub fn set_allocations(&self, alloc: &Allocations) {
        if alloc.source != AllocationSource::PodResources {
            return;
        }
        let mut held = Vec::new();
        for p in &alloc.pods {
            for c in &p.containers {
                let holder = Holder {
                    namespace: p.namespace.clone(),
                    pod: p.name.clone(),
                    container: c.name.clone(),
                };
                let plugin = c.devices.values().flatten().cloned().map(Held::Plugin);
                // Only fumarole's drivers name devices the way the figures do.
                let claimed = c
                    .claimed
                    .iter()
                    .filter(|d| dra::DRIVERS.contains(&d.driver.as_str()))
                    .map(|d| Held::Claim {
                        driver: d.driver.clone(),
                        device: d.device.clone(),
                    });
                held.extend(plugin.chain(claimed).map(|h| (h, holder.clone())));
            }
        }
        *self
            .inner
            .held
            .write()
            .unwrap_or_else(PoisonError::into_inner) = held;
    }

    /// Where the NVML health thread records each GPU's last XID, for the figures.
    pub fn last_xids(&self) -> LastXids {
        self.inner.last_xids.clone()
    }

    /// Each holding pod's use of its devices, as of the last reading (empty before one).
    pub fn pods(&self) -> watch::Receiver<Vec<PodDeviceUsage>> {
        self.inner.pods.subscribe()
    }

    /// Each library's latest reading.
    fn snapshots(&self) -> Vec<Arc<Snapshot>> {
        self.inner
            .snapshots
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .cloned()
            .collect()
    }

    /// Who holds `device` (of `library`) or a share of it, each once, in the kubelet's order:
    /// through a device plugin (its id, a replica `<id>::<n>`, a MIG device's uuid) or a DRA
    /// claim (its name in fumarole's pool, or one of its partitions).
    fn holders(&self, library: Library, device: &DeviceSample) -> Vec<Holder> {
        let held = self
            .inner
            .held
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        let vendor = library.vendor().as_str();
        let dra_name = dra::name_of(vendor, device.index);
        let dra_driver = dra::driver_of(vendor);
        let mut out: Vec<Holder> = Vec::new();
        for (id, holder) in held.iter() {
            let ours = match id {
                Held::Plugin(id) => {
                    *id == device.id
                        || id
                            .strip_prefix(device.id.as_str())
                            .is_some_and(|rest| rest.starts_with("::"))
                        || device.mig_uuids.contains(id)
                }
                Held::Claim {
                    driver,
                    device: name,
                } => driver == dra_driver && dra::is_or_partitions(name, &dra_name),
            };
            if ours && !device.id.is_empty() && !out.contains(holder) {
                out.push(holder.clone());
            }
        }
        out
    }
}

/// One series' labels.
type LabelSet = Vec<(String, String)>;

/// The figures under one set of names, encoded at each scrape from the cache.
#[derive(Debug)]
struct Figures {
    metrics: DeviceMetrics,
    names: Names,
}

impl Figures {
    /// Whether these names cover the devices of `library` (dcgm-exporter's GPUs only,
    /// npu-exporter's NPUs only).
    fn cover(&self, library: Library) -> bool {
        match self.names {
            Names::Fumarole => true,
            Names::Dcgm => library == Library::Nvml,
            Names::NpuExporter => library == Library::Dcmi,
        }
    }

    /// The labels of `device`'s series held by `holder` (empty pod labels when none holds it).
    fn labels(&self, snapshot: &Snapshot, device: &DeviceSample, holder: &Holder) -> LabelSet {
        let node = &self.metrics.inner.node;
        let mut labels: LabelSet = match self.names {
            Names::Fumarole => vec![
                (
                    "device".into(),
                    format!("{}-{}", snapshot.library.device_prefix(), device.index),
                ),
                ("uuid".into(), device.uuid.clone()),
                ("model".into(), device.model.clone()),
                ("node".into(), node.clone()),
            ],
            Names::Dcgm => vec![
                ("gpu".into(), device.index.to_string()),
                ("UUID".into(), device.uuid.clone()),
                ("pci_bus_id".into(), device.pci_bus_id.clone()),
                ("device".into(), format!("nvidia{}", device.index)),
                ("modelName".into(), device.model.clone()),
                ("Hostname".into(), node.clone()),
                (
                    "DCGM_FI_DRIVER_VERSION".into(),
                    snapshot.driver_version.clone(),
                ),
            ],
            Names::NpuExporter => vec![
                ("id".into(), device.index.to_string()),
                ("model_name".into(), device.model.clone()),
            ],
        };
        let holder_labels = match self.names {
            Names::Fumarole | Names::Dcgm => ["namespace", "pod", "container"],
            Names::NpuExporter => ["namespace", "pod_name", "container_name"],
        };
        let values = [&holder.namespace, &holder.pod, &holder.container];
        labels.extend(
            holder_labels
                .iter()
                .zip(values)
                .map(|(k, v)| (k.to_string(), v.clone())),
        );
        labels
    }

    /// How `spec` is written under these names: name, factor from the base unit, type.
    /// `None`: these names have no such figure.
    fn written(&self, spec: &Spec) -> Option<(&'static str, f64, MetricType)> {
        match self.names {
            Names::Fumarole => {
                let kind = if spec.counter {
                    MetricType::Counter
                } else {
                    MetricType::Gauge
                };
                Some((spec.name, 1.0, kind))
            }
            // dcgm-exporter's counters keep their names (no `_total`): written untyped.
            Names::Dcgm => spec.dcgm.as_ref().map(|field| {
                let kind = if field.counter {
                    MetricType::Unknown
                } else {
                    MetricType::Gauge
                };
                (field.name, field.factor, kind)
            }),
            Names::NpuExporter => spec
                .npu
                .as_ref()
                .map(|field| (field.name, field.factor, MetricType::Gauge)),
        }
    }
}

impl Collector for Figures {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let snapshots = self.metrics.snapshots();
        // Each device's label sets, one per holder (empty pod labels when none), built once
        // for all its figures.
        let devices: Vec<(&DeviceSample, Vec<LabelSet>)> = snapshots
            .iter()
            .filter(|s| self.cover(s.library))
            .flat_map(|s| s.devices.iter().map(move |d| (s, d)))
            .map(|(s, d)| {
                let mut holders = self.metrics.holders(s.library, d);
                if holders.is_empty() {
                    holders.push(Holder::default());
                }
                let label_sets = holders.iter().map(|h| self.labels(s, d, h)).collect();
                (d, label_sets)
            })
            .collect();
        for spec in SPECS {
            let Some((name, factor, kind)) = self.written(spec) else {
                continue;
            };
            if !devices.iter().any(|(d, _)| d.has(spec.figure)) {
                continue;
            }
            let mut family = encoder.encode_descriptor(name, spec.help, None, kind)?;
            let counter = spec.counter && self.names == Names::Fumarole;
            for (device, label_sets) in &devices {
                if let Some(value) = device.values.get(&spec.figure) {
                    for labels in label_sets {
                        encode_one(&mut family, labels, value * factor, counter)?;
                    }
                }
                for (link, figures) in &device.links {
                    let Some(value) = figures.get(&spec.figure) else {
                        continue;
                    };
                    for labels in label_sets {
                        // `link` before the holder's three labels.
                        let mut labels = labels.clone();
                        labels.insert(labels.len() - 3, ("link".into(), link.to_string()));
                        encode_one(&mut family, &labels, value * factor, counter)?;
                    }
                }
            }
        }
        Ok(())
    }
}

/// One sample of a family: a counter (fumarole's names) or a gauge.
fn encode_one(
    family: &mut prometheus_client::encoding::MetricEncoder<'_>,
    labels: &LabelSet,
    value: f64,
    counter: bool,
) -> Result<(), std::fmt::Error> {
    let mut sample = family.encode_family(labels)?;
    if counter {
        sample.encode_counter::<NoLabelSet, f64, f64>(&value, None)
    } else {
        sample.encode_gauge(&value)
    }
}

/// How old each library's figures are, whatever names they are written under.
#[derive(Debug)]
struct Age {
    metrics: DeviceMetrics,
}

impl Collector for Age {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let snapshots = self.metrics.snapshots();
        if snapshots.is_empty() {
            return Ok(());
        }
        let mut family = encoder.encode_descriptor(
            "device_metrics_age_seconds",
            "Seconds since the per-device figures were last read, by library (grows while the library does not answer)",
            None,
            MetricType::Gauge,
        )?;
        for snapshot in snapshots {
            let age = SystemTime::now()
                .duration_since(snapshot.taken)
                .unwrap_or_default()
                .as_secs_f64();
            let labels = [("library", snapshot.library.label())];
            family.encode_family(&labels)?.encode_gauge(&age)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
