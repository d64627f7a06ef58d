//! Starting the node's health sources into its stream ([`start_sources`]) with the settings of
//! [`super::settings::HealthArgs`]: device nodes always, NVML and DCMI where the node has their
//! devices.

use std::path::PathBuf;
use std::time::Duration;

use fumarole_topology::{LinkClass, NodeTopology, Vendor};

use super::dcmi::{self, DcmiSetup, ServerAnswers};
use super::nvml::xid::{self, LastXids};
use super::nvml::{HealthSetup, NvmlSession};
use super::settings::HealthArgs;
use super::{HealthStream, dev_nodes, watchdog};

/// Starts every health source of the node into `stream`: device nodes (`dev_nodes`: each
/// device id and the nodes it needs under `root`), NVML through `nvml` when the node uses the
/// library, DCMI when the node has Ascend NPUs and a DCMI library (`host` nodes look for
/// `libdcmi.so` by default). The DCMI source's answers about the server (super-pod, chip
/// info) go to `answers`; the NVML source's XIDs, each GPU's last, to `last_xids`.
#[allow(clippy::too_many_arguments)]
pub fn start_sources(
    args: &HealthArgs,
    topology: &NodeTopology,
    root: PathBuf,
    dev_node_list: Vec<(String, Vec<String>)>,
    nvml: Option<&NvmlSession>,
    host: bool,
    stream: &HealthStream,
    answers: ServerAnswers,
    last_xids: LastXids,
) {
    dev_nodes::spawn(root, dev_node_list, stream.source("dev-nodes"));
    let limit = args.health_poll_interval + Duration::from_secs(5);

    let nvidia: Vec<(String, String)> = topology
        .devices
        .iter()
        .filter(|d| d.vendor == Vendor::Nvidia)
        .map(|d| (d.pci_bus_id.clone(), d.id.clone()))
        .collect();
    if let Some(session) = nvml
        && !nvidia.is_empty()
    {
        watchdog::spawn("NVML", session.calls(), limit);
        session.start_health(HealthSetup {
            devices: nvidia,
            ignored_xids: xid::ignored_set(&args.ignored_xids.0),
            quiet: args.health_quiet_period,
            poll: args.health_poll_interval,
            source: stream.source("nvml"),
            last_xids,
        });
    }

    let ascend = ascend_devices(topology);
    if let Some(library) = dcmi_library(args, host)
        && !ascend.is_empty()
    {
        let calls = dcmi::start(DcmiSetup {
            library,
            devices: ascend,
            hccs_pairs: hccs_pairs(topology),
            hccs_codes: args.hccs_fault_codes.0.iter().copied().collect(),
            poll: args.health_poll_interval,
            source: stream.source("dcmi"),
            answers,
        });
        watchdog::spawn("DCMI", calls, limit);
    }
}

/// The node's Ascend NPUs: (davinci index, device id).
pub fn ascend_devices(topology: &NodeTopology) -> Vec<(u32, String)> {
    topology
        .devices
        .iter()
        .filter(|d| d.vendor == Vendor::Huawei && d.id.starts_with("Ascend"))
        .map(|d| (d.index, d.id.clone()))
        .collect()
}

/// The DCMI library to load: `--dcmi-library`, else `libdcmi.so` on a `host` node (one that
/// reads the machine it runs on); `None`: no DCMI.
pub fn dcmi_library(args: &HealthArgs, host: bool) -> Option<PathBuf> {
    args.dcmi_library
        .clone()
        .or_else(|| host.then(|| PathBuf::from("libdcmi.so")))
}

/// The device pairs joined by HCCS.
fn hccs_pairs(t: &NodeTopology) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (i, a) in t.devices.iter().enumerate() {
        for (j, b) in t.devices.iter().enumerate().skip(i + 1) {
            if t.links.class(i, j) == Some(LinkClass::Hccs) {
                out.push((a.id.clone(), b.id.clone()));
            }
        }
    }
    out
}
