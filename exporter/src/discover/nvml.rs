//! NVIDIA facts that only the driver's management library knows: uuids, NVLink lanes and the
//! NVLink fabric (cluster uuid + clique id of NVL72-class systems).
//!
//! [`NvmlProbe`] is the seam: [`LibraryProbe`] loads `libnvidia-ml.so.1` at run time through
//! `nvml-wrapper` (a missing library is an answer, not an error: the node simply has no NVML),
//! and [`RecordedProbe`] reads an [`NvmlReport`] saved as JSON, so fixtures and tests stand in
//! for the library without a GPU.

use std::collections::BTreeMap;
use std::path::PathBuf;

use fumarole_topology::MigInstance;
use serde::{Deserialize, Serialize};

/// Everything discovery asks NVML, per GPU.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NvmlReport {
    #[serde(default)]
    pub driver_version: Option<String>,
    /// The CUDA version the driver supports (`nvmlSystemGetCudaDriverVersion`), encoded as
    /// NVML answers it: `1000 * major + 10 * minor` (12040 is CUDA 12.4).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda_driver_version: Option<i32>,
    pub gpus: Vec<NvmlGpu>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NvmlGpu {
    /// `dddd:bb:dd.f`, any case; NVML writes `00000000:1B:00.0`, which is normalised.
    pub pci_bus_id: String,
    pub index: u32,
    pub uuid: String,
    pub name: String,
    #[serde(default)]
    pub serial: Option<String>,
    #[serde(default)]
    pub minor: Option<u32>,
    /// Active NVLink lanes, one entry per lane.
    #[serde(default)]
    pub nvlinks: Vec<NvlinkLane>,
    #[serde(default)]
    pub fabric: Option<FabricInfo>,
    /// Total device memory in bytes (`nvmlDeviceGetMemoryInfo`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
    /// CUDA compute capability (`nvmlDeviceGetCudaComputeCapability`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_capability: Option<ComputeCapability>,
    /// Whether the GPU supports MIG: `nvmlDeviceGetMigMode` answers (`Some(true)`) or says
    /// NotSupported (`Some(false)`); `None` when the call failed otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_capable: Option<bool>,
    /// With MIG mode enabled, its MIG devices (`nvmlDeviceGetMigDeviceHandleByIndex`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mig: Vec<MigInstance>,
}

/// CUDA compute capability, e.g. 9.0 for Hopper.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ComputeCapability {
    pub major: i32,
    pub minor: i32,
}

/// The far end of one active NVLink lane.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NvlinkLane {
    pub remote_pci_bus_id: String,
    pub remote: RemoteKind,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RemoteKind {
    Gpu,
    /// An NVSwitch: every GPU with lanes into the switch fabric reaches every other one.
    Switch,
    /// Anything else (IBM NPU, unknown).
    Other,
}

/// NVLink fabric membership (`nvmlDeviceGetGpuFabricInfo`), present on NVL72-class systems.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FabricInfo {
    pub cluster_uuid: String,
    pub clique_id: u32,
}

/// Why NVML could not be asked. A missing library is not an error (see [`NvmlProbe::probe`]).
#[derive(Debug, thiserror::Error)]
pub enum NvmlError {
    #[error("reading recorded NVML answers {path}: {reason}")]
    ReadRecording {
        path: PathBuf,
        reason: std::io::Error,
    },
    #[error("recorded NVML answers {path} are not valid: {reason}")]
    ParseRecording {
        path: PathBuf,
        reason: serde_json::Error,
    },
    #[error("NVML call {call} failed: {message}")]
    Call { call: &'static str, message: String },
}

/// A source of [`NvmlReport`]s.
pub trait NvmlProbe {
    /// `Ok(None)` when there is no NVML on this node (library not installed): discovery then
    /// derives NVIDIA links from PCIe only.
    fn probe(&self) -> Result<Option<NvmlReport>, NvmlError>;
}

/// Answers recorded in a JSON file (the serialized [`NvmlReport`]).
pub struct RecordedProbe(pub PathBuf);

impl NvmlProbe for RecordedProbe {
    fn probe(&self) -> Result<Option<NvmlReport>, NvmlError> {
        let text = std::fs::read_to_string(&self.0).map_err(|reason| NvmlError::ReadRecording {
            path: self.0.clone(),
            reason,
        })?;
        let report = serde_json::from_str(&text).map_err(|reason| NvmlError::ParseRecording {
            path: self.0.clone(),
            reason,
        })?;
        Ok(Some(report))
    }
}

/// No NVML at all (XML input, nodes without NVIDIA devices).
pub struct NoProbe;

impl NvmlProbe for NoProbe {
    fn probe(&self) -> Result<Option<NvmlReport>, NvmlError> {
        Ok(None)
    }
}

/// The real library, loaded at run time. `lib_path` overrides the default
/// `libnvidia-ml.so.1` lookup.
#[derive(Default)]
pub struct LibraryProbe {
    pub lib_path: Option<PathBuf>,
}

impl NvmlProbe for LibraryProbe {
    fn probe(&self) -> Result<Option<NvmlReport>, NvmlError> {
        match open_library(self.lib_path.as_deref())? {
            Some(nvml) => read_report(&nvml).map(Some),
            None => Ok(None),
        }
    }
}

/// Loads and initialises the NVML library (`lib_path`, else `libnvidia-ml.so.1` from the
/// loader's search path). `Ok(None)` when there is no NVML on this node (library not
/// installed, driver not loaded), which is logged once here.
pub fn open_library(
    lib_path: Option<&std::path::Path>,
) -> Result<Option<nvml_wrapper::Nvml>, NvmlError> {
    use nvml_wrapper::Nvml;
    use nvml_wrapper::error::NvmlError as E;

    let mut builder = Nvml::builder();
    if let Some(p) = lib_path {
        builder.lib_path(p.as_os_str());
    }
    match builder.init() {
        Ok(nvml) => Ok(Some(nvml)),
        Err(E::LibloadingError(e)) => {
            tracing::info!(
                error = %e,
                "NVML library not found: NVIDIA links come from the PCI tree only, health from device nodes"
            );
            Ok(None)
        }
        Err(E::DriverNotLoaded) => {
            tracing::info!(
                "NVIDIA driver not loaded: NVIDIA links come from the PCI tree only, health from device nodes"
            );
            Ok(None)
        }
        Err(e) => Err(call("nvmlInit", e)),
    }
}

fn call(call: &'static str, e: nvml_wrapper::error::NvmlError) -> NvmlError {
    NvmlError::Call {
        call,
        message: e.to_string(),
    }
}

/// `NVML_NVLINK_MAX_LINKS` on Hopper: the lanes a GPU may have.
pub const NVLINK_MAX_LANES: u32 = 18;

/// Everything discovery asks NVML, from an initialised library.
pub fn read_report(nvml: &nvml_wrapper::Nvml) -> Result<NvmlReport, NvmlError> {
    let count = nvml
        .device_count()
        .map_err(|e| call("nvmlDeviceGetCount", e))?;
    let mut gpus = Vec::new();
    for index in 0..count {
        let dev = nvml
            .device_by_index(index)
            .map_err(|e| call("nvmlDeviceGetHandleByIndex", e))?;
        let pci = dev
            .pci_info()
            .map_err(|e| call("nvmlDeviceGetPciInfo", e))?;
        let mut nvlinks = Vec::new();
        // Unsupported lanes answer NotSupported.
        for lane in 0..NVLINK_MAX_LANES {
            let link = dev.link_wrapper_for(lane);
            if !link.is_active().unwrap_or(false) {
                continue;
            }
            let Ok(remote_pci) = link.remote_pci_info() else {
                continue;
            };
            let remote = remote_kind(nvml, &dev, lane);
            nvlinks.push(NvlinkLane {
                remote_pci_bus_id: remote_pci.bus_id,
                remote,
            });
        }
        gpus.push(NvmlGpu {
            pci_bus_id: pci.bus_id,
            index,
            uuid: dev.uuid().map_err(|e| call("nvmlDeviceGetUUID", e))?,
            name: dev.name().map_err(|e| call("nvmlDeviceGetName", e))?,
            serial: dev.serial().ok(),
            minor: dev.minor_number().ok(),
            nvlinks,
            fabric: fabric_info(nvml, &dev),
            memory_bytes: dev.memory_info().ok().map(|m| m.total),
            compute_capability: dev
                .cuda_compute_capability()
                .ok()
                .map(|c| ComputeCapability {
                    major: c.major,
                    minor: c.minor,
                }),
            mig_capable: match dev.mig_mode() {
                Ok(_) => Some(true),
                Err(nvml_wrapper::error::NvmlError::NotSupported) => Some(false),
                Err(_) => None,
            },
            mig: mig_instances(&dev),
        });
    }
    Ok(NvmlReport {
        driver_version: nvml.sys_driver_version().ok(),
        cuda_driver_version: nvml.sys_cuda_driver_version().ok(),
        gpus,
    })
}

/// NVML's MIG mode value for "enabled".
pub(crate) const MIG_ENABLED: u32 = 1;

/// The MIG devices of a GPU whose MIG mode is enabled, each with its profile read from its
/// name (`NVIDIA H100 80GB HBM3 MIG 1g.10gb`); none when MIG is off or not supported. A slot
/// without a MIG device answers NotFound; a device whose name carries no profile is skipped
/// with a warning.
fn mig_instances(dev: &nvml_wrapper::Device<'_>) -> Vec<MigInstance> {
    if dev.mig_mode().ok().map(|m| m.current) != Some(MIG_ENABLED) {
        return Vec::new();
    }
    let slots = dev.mig_device_count().unwrap_or(0);
    let mut out = Vec::new();
    for slot in 0..slots {
        let Ok(mig) = dev.mig_device_by_index(slot) else {
            continue;
        };
        let (Ok(uuid), Ok(name)) = (mig.uuid(), mig.name()) else {
            continue;
        };
        let Some(profile) = mig_profile(&name) else {
            tracing::warn!(mig = %uuid, name = %name, "MIG device whose name names no profile: not served");
            continue;
        };
        out.push(MigInstance {
            uuid,
            profile: profile.to_string(),
            memory_bytes: mig.memory_info().ok().map(|m| m.total),
        });
    }
    out
}

/// The MIG profile at the end of a MIG device's NVML name (`... MIG 3g.40gb` -> `3g.40gb`).
pub fn mig_profile(name: &str) -> Option<&str> {
    let (_, profile) = name.rsplit_once(" MIG ")?;
    let profile = profile.trim();
    (!profile.is_empty() && !profile.contains(' ')).then_some(profile)
}

/// `nvmlDeviceGetNvLinkRemoteDeviceType`, called directly: nvml-wrapper 0.13's wrapper reads
/// its answer from a temporary and always reports `Unknown`.
pub fn remote_kind(
    nvml: &nvml_wrapper::Nvml,
    dev: &nvml_wrapper::Device<'_>,
    lane: u32,
) -> RemoteKind {
    use nvml_wrapper_sys::bindings as sys;
    let Ok(get) = nvml.lib().nvmlDeviceGetNvLinkRemoteDeviceType.as_ref() else {
        return RemoteKind::Other;
    };
    let mut kind: sys::nvmlIntNvLinkDeviceType_t =
        sys::nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_UNKNOWN;
    // SAFETY: live handle of this `nvml`, `kind` is writable for the duration of the call.
    let ret = unsafe { get(dev.handle(), lane, &mut kind) };
    if ret != sys::nvmlReturn_enum_NVML_SUCCESS {
        return RemoteKind::Other;
    }
    match kind {
        sys::nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_GPU => RemoteKind::Gpu,
        sys::nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_SWITCH => RemoteKind::Switch,
        _ => RemoteKind::Other,
    }
}

/// `nvmlDeviceGetGpuFabricInfo`, which nvml-wrapper does not wrap. `None` when the driver
/// lacks the call or the GPU is not part of a fabric.
fn fabric_info(nvml: &nvml_wrapper::Nvml, dev: &nvml_wrapper::Device<'_>) -> Option<FabricInfo> {
    use nvml_wrapper_sys::bindings::{nvmlGpuFabricInfo_t, nvmlReturn_enum_NVML_SUCCESS};
    let get = nvml.lib().nvmlDeviceGetGpuFabricInfo.as_ref().ok()?;
    // SAFETY: the struct is plain old data that NVML fills; a zeroed value is a valid input.
    let mut info: nvmlGpuFabricInfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: `dev.handle()` is a live handle of this `nvml` instance, `info` is writable and
    // outlives the call, and the function pointer was resolved from the loaded library.
    let ret = unsafe { get(dev.handle(), &mut info) };
    // state 3 = NVML_GPU_FABRIC_STATE_COMPLETED; the status must be success too.
    if ret != nvmlReturn_enum_NVML_SUCCESS
        || info.state != 3
        || info.status != nvmlReturn_enum_NVML_SUCCESS
    {
        return None;
    }
    if info.clusterUuid.iter().all(|b| *b == 0) {
        return None;
    }
    let hex: String = info
        .clusterUuid
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let uuid = format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    );
    Some(FabricInfo {
        cluster_uuid: uuid,
        clique_id: info.cliqueId,
    })
}

/// Normalises NVML's `00000000:1B:00.0` to sysfs' `0000:1b:00.0`.
pub fn normalize_bus_id(id: &str) -> String {
    let id = id.trim().to_ascii_lowercase();
    match id.split_once(':') {
        Some((domain, rest)) if domain.len() > 4 => {
            format!("{}:{rest}", &domain[domain.len() - 4..])
        }
        _ => id,
    }
}

/// NVLink lane counts between GPU pairs (by normalised bus id). Direct lanes count as they
/// are; lanes into NVSwitches join every pair of switch-attached GPUs with the smaller of
/// their two switch-lane counts (all-to-all through the switch fabric).
pub fn nvlink_counts(report: &NvmlReport) -> BTreeMap<(String, String), u32> {
    let mut direct: BTreeMap<(String, String), u32> = BTreeMap::new();
    let mut switch_lanes: BTreeMap<String, u32> = BTreeMap::new();
    for gpu in &report.gpus {
        let me = normalize_bus_id(&gpu.pci_bus_id);
        for lane in &gpu.nvlinks {
            match lane.remote {
                RemoteKind::Gpu => {
                    let peer = normalize_bus_id(&lane.remote_pci_bus_id);
                    // Each direct lane is reported by both ends; count it from the lower id.
                    if me < peer {
                        *direct.entry((me.clone(), peer)).or_default() += 1;
                    }
                }
                RemoteKind::Switch => *switch_lanes.entry(me.clone()).or_default() += 1,
                RemoteKind::Other => {}
            }
        }
    }
    let switched: Vec<(&String, &u32)> = switch_lanes.iter().collect();
    for (i, (a, na)) in switched.iter().enumerate() {
        for (b, nb) in &switched[i + 1..] {
            *direct.entry(((*a).clone(), (*b).clone())).or_default() += (**na).min(**nb);
        }
    }
    direct
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lane(peer: &str, remote: RemoteKind) -> NvlinkLane {
        NvlinkLane {
            remote_pci_bus_id: peer.into(),
            remote,
        }
    }

    #[test]
    fn a_mig_devices_profile_is_the_end_of_its_name() {
        assert_eq!(
            mig_profile("NVIDIA H100 80GB HBM3 MIG 3g.40gb"),
            Some("3g.40gb")
        );
        assert_eq!(
            mig_profile("NVIDIA A100-SXM4-40GB MIG 1g.5gb+me"),
            Some("1g.5gb+me")
        );
        assert_eq!(mig_profile("NVIDIA H100 80GB HBM3"), None);
        assert_eq!(mig_profile("NVIDIA H100 MIG "), None);
    }

    #[test]
    fn normalises_nvml_bus_ids() {
        assert_eq!(normalize_bus_id("00000000:1B:00.0"), "0000:1b:00.0");
        assert_eq!(normalize_bus_id("0000:1b:00.0"), "0000:1b:00.0");
    }

    #[test]
    fn counts_direct_and_switched_lanes() {
        let gpu = |bus: &str, nvlinks| NvmlGpu {
            pci_bus_id: bus.into(),
            uuid: format!("GPU-{bus}"),
            name: "x".into(),
            nvlinks,
            ..Default::default()
        };
        let report = NvmlReport {
            driver_version: None,
            cuda_driver_version: None,
            gpus: vec![
                gpu(
                    "0000:01:00.0",
                    vec![lane("0000:02:00.0", RemoteKind::Gpu); 4],
                ),
                gpu(
                    "0000:02:00.0",
                    vec![lane("0000:01:00.0", RemoteKind::Gpu); 4],
                ),
                gpu(
                    "0000:03:00.0",
                    vec![lane("0000:f0:00.0", RemoteKind::Switch); 18],
                ),
                gpu(
                    "0000:04:00.0",
                    vec![lane("0000:f1:00.0", RemoteKind::Switch); 12],
                ),
            ],
        };
        let counts = nvlink_counts(&report);
        assert_eq!(counts[&("0000:01:00.0".into(), "0000:02:00.0".into())], 4);
        assert_eq!(counts[&("0000:03:00.0".into(), "0000:04:00.0".into())], 12);
        assert_eq!(counts.len(), 2);
    }

    #[test]
    fn missing_library_is_no_report_not_an_error() {
        let probe = LibraryProbe {
            lib_path: Some("/nonexistent/libnvidia-ml.so.1".into()),
        };
        assert!(probe.probe().unwrap().is_none());
    }

    #[test]
    fn bad_recording_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nvml.json");
        std::fs::write(&path, "{not json").unwrap();
        let err = RecordedProbe(path.clone()).probe().unwrap_err();
        assert!(
            err.to_string().contains(&path.display().to_string()),
            "{err}"
        );
    }
}
