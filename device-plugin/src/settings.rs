//! This crate's flags, flattened into `fumarole-agent run`, and the typed settings they
//! become: [`DevicePluginArgs`] (the device plugins: where they are served, CDI, the
//! configuration file, waiting for the scheduler's device choice) into
//! [`DevicePluginSettings`], and [`DraArgs`] (the DRA kubelet plugin's directories) into
//! [`DraDirs`].

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use crate::admission::AwaitChoice;
use crate::dra::serve::{self as dra_serve, DraDirs};

/// The device plugins.
#[derive(clap::Args, Clone, Debug)]
pub struct DevicePluginArgs {
    /// Serve the node's device plugins in this directory and register them with the kubelet
    /// answering on `DIR/kubelet.sock` (usually /var/lib/kubelet/device-plugins).
    #[arg(long, value_name = "DIR")]
    device_plugin_dir: Option<PathBuf>,
    /// Also answer `Allocate` with CDI device names (`<resource>=<device id>`).
    #[arg(long)]
    cdi: bool,
    /// Device-plugin configuration (YAML): resource names, env vars and device nodes per
    /// device class; see the `fumarole_device_plugin::config` docs.
    #[arg(long, value_name = "FILE")]
    device_plugin_config: Option<PathBuf>,
    /// Schedulers (`spec.schedulerName`) that write the scheduler extension's device choice
    /// after binding (Volcano v1.10 binds without telling the extension): the device plugin
    /// waits for the choice of their pods before choosing itself. Comma-separated.
    #[arg(
        long,
        value_name = "NAMES",
        value_delimiter = ',',
        default_value = "volcano"
    )]
    await_device_choice_from: Vec<String>,
    /// Longest wait, at admission, for a pod the agent has not seen yet or a choice not
    /// written yet; then the plugin chooses and says why (an Event on the pod). The default
    /// outlasts a failover of the scheduler extension with its default lease (15 s, a retry
    /// every 2 s, then the new leader's first view), so a pod bound just before its leader
    /// died still gets the scheduler's devices.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = humantime::parse_duration)]
    await_device_choice_timeout: Duration,
}

/// The device plugins' typed settings.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DevicePluginSettings {
    /// Where the plugins are served and the kubelet answers; `None`: no device plugin.
    pub dir: Option<PathBuf>,
    /// Also answer `Allocate` with CDI device names.
    pub cdi: bool,
    /// The configuration file ([`crate::config`]); `None`: the defaults.
    pub config: Option<PathBuf>,
    /// How long to wait for the scheduler's device choice, and for which schedulers' pods.
    pub await_choice: AwaitChoice,
}

impl DevicePluginSettings {
    /// Whether the node serves devices at all: the configuration may serve them through DRA
    /// even without device plugins.
    pub fn serves_devices(&self) -> bool {
        self.dir.is_some() || self.config.is_some()
    }
}

impl DevicePluginArgs {
    /// The typed settings (empty scheduler names are dropped).
    pub fn settings(&self) -> DevicePluginSettings {
        DevicePluginSettings {
            dir: self.device_plugin_dir.clone(),
            cdi: self.cdi,
            config: self.device_plugin_config.clone(),
            await_choice: AwaitChoice {
                schedulers: self
                    .await_device_choice_from
                    .iter()
                    .filter(|s| !s.is_empty())
                    .cloned()
                    .collect::<BTreeSet<String>>(),
                timeout: self.await_device_choice_timeout,
            },
        }
    }
}

/// The DRA kubelet plugin, served for the devices whose `--device-plugin-config` entry says
/// `servedBy: dra` or `both` (none by default).
#[derive(clap::Args, Clone, Debug)]
pub struct DraArgs {
    /// The kubelet's plugin registry: the DRA plugin's registration sockets
    /// (`<driver>-reg.sock`) go here.
    #[arg(long, value_name = "DIR", env = "DRA_REGISTRY_DIR", default_value = dra_serve::DEFAULT_REGISTRY_DIR)]
    dra_registry_dir: PathBuf,
    /// The kubelet's plugins directory: the DRA service sockets go in `DIR/<driver>/dra.sock`.
    #[arg(long, value_name = "DIR", env = "DRA_PLUGINS_DIR", default_value = dra_serve::DEFAULT_PLUGINS_DIR)]
    dra_plugins_dir: PathBuf,
    /// Where the DRA plugin writes a prepared claim's CDI spec (the container runtime's CDI
    /// spec directory).
    #[arg(long, value_name = "DIR", env = "CDI_DIR", default_value = dra_serve::DEFAULT_CDI_DIR)]
    cdi_dir: PathBuf,
}

impl DraArgs {
    /// The directories the DRA plugin works in.
    pub fn dirs(&self) -> DraDirs {
        DraDirs {
            registry: self.dra_registry_dir.clone(),
            plugins: self.dra_plugins_dir.clone(),
            cdi: self.cdi_dir.clone(),
        }
    }
}
