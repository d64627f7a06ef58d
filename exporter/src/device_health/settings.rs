//! Where device health comes from, as flags ([`HealthArgs`], flattened into
//! `fumarole-agent run`): the DCMI library, how often the vendor libraries are checked, the
//! rules that give a device back, the XIDs and HCCS codes that count. [`super::sources`]
//! starts the sources with them.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::dcmi;
use super::nvml::{NvmlSession, xid};

/// Where device health comes from, and the rules that give a device back.
#[derive(Args, Clone)]
pub struct HealthArgs {
    /// The DCMI library for Ascend health (default: `libdcmi.so` from the library path on this
    /// host; on a `--root` or `--fixture` node only when given).
    #[arg(long, value_name = "FILE", env = "FUMAROLE_DCMI_LIBRARY")]
    pub(super) dcmi_library: Option<PathBuf>,
    /// How often NVML and DCMI are checked for what they do not report as events (retired
    /// pages, row remapping, NVLink lanes, a GPU fallen off the bus, Ascend chip and network
    /// health).
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = humantime::parse_duration)]
    pub(super) health_poll_interval: Duration,
    /// How long a GPU stays out after its last critical XID or ECC event; it comes back when
    /// this has passed and a check since the event found it healthy.
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = humantime::parse_duration)]
    pub(super) health_quiet_period: Duration,
    /// XIDs that do not mark a GPU, on top of NVIDIA's defaults (13, 31, 43, 45, 68, 109: the
    /// application's fault). Comma-separated.
    #[arg(long, value_name = "XIDS", env = "FUMAROLE_IGNORED_XIDS", value_parser = parse_xids, default_value = "")]
    pub(super) ignored_xids: XidList,
    /// Ascend error codes that mean an HCCS link fault (0x-prefixed hex or decimal,
    /// comma-separated): a chip reporting one has its HCCS pairs lowered to PCIe.
    #[arg(long, value_name = "CODES", value_parser = parse_codes, default_value = "")]
    pub(super) hccs_fault_codes: CodeList,
    /// Longest wait at start for NVML to answer discovery; then NVIDIA devices are
    /// discovered without it (and NVML health starts whenever the library answers).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = humantime::parse_duration)]
    nvml_init_timeout: Duration,
}

#[derive(Clone, Debug, Default)]
pub(super) struct XidList(pub(super) Vec<u64>);

#[derive(Clone, Debug, Default)]
pub(super) struct CodeList(pub(super) Vec<u32>);

fn parse_xids(s: &str) -> Result<XidList, String> {
    xid::parse_list(s).map(XidList)
}

fn parse_codes(s: &str) -> Result<CodeList, String> {
    dcmi::answers::parse_codes(s).map(CodeList)
}

impl HealthArgs {
    /// An NVML session on `library` (discovery's answers and the health thread).
    pub fn nvml_session(&self, library: Option<PathBuf>) -> NvmlSession {
        NvmlSession::new(library, self.nvml_init_timeout)
    }
}
