//! Co-location's flags ([`ColocationArgs`], flattened into `fumarole-agent run`) and the
//! typed settings the tasks take ([`ColocationSettings`]). What the flags leave open about
//! cgroups comes from the kubelet's configuration ([`KubeletCgroups`], read by the agent).

use std::path::PathBuf;
use std::time::Duration;

use crate::cgroup;

/// Co-location (what volcano-agent does): QoS levels, CPU burst, oversubscription, eviction.
#[derive(clap::Args, Clone, Debug)]
pub struct ColocationArgs {
    /// Do volcano-agent's job on this node: `volcano.sh/qos-level` and CPU burst on the pod
    /// cgroups, batch resources, pressure taint and eviction of offline pods, as the
    /// `volcano-agent-configuration` ConfigMap and the node's labels enable them.
    #[arg(long)]
    colocation: bool,
    /// Namespace of the `volcano-agent-configuration` ConfigMap and of the heartbeat Lease.
    #[arg(
        long,
        value_name = "NAMESPACE",
        env = "COLOCATION_CONFIG_NAMESPACE",
        default_value = "volcano-system"
    )]
    colocation_config_namespace: String,
    /// How long the node's heartbeat Lease (`fumarole-agent-<node>`, in the
    /// --colocation-config-namespace) lasts without renewal; renewed four times as often.
    /// Once it expires the scheduler extension removes the taint and batch resources this
    /// agent left on the Node.
    #[arg(long, value_name = "DURATION", default_value = "40s", value_parser = parse_lease_duration)]
    heartbeat_lease_duration: Duration,
    /// The node's memory pressure (PSI) file, an earlier eviction signal than usage.
    #[arg(long, value_name = "FILE", default_value = "/proc/pressure/memory")]
    memory_pressure_file: PathBuf,
    /// How often to re-apply the cgroup settings (pod and config changes also trigger a round).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = humantime::parse_duration)]
    qos_interval: Duration,
    /// Where the cgroup filesystems are mounted.
    #[arg(long, value_name = "DIR", default_value = cgroup::DEFAULT_ROOT)]
    cgroup_root: PathBuf,
    /// The mount table that tells cgroup v1 from v2.
    #[arg(long, value_name = "FILE", default_value = cgroup::DEFAULT_MOUNTINFO)]
    cgroup_mountinfo: PathBuf,
    /// The kubelet's cgroup driver (`cgroupfs` or `systemd`); default: the kubelet config's
    /// `cgroupDriver`, else whichever kubepods cgroup exists.
    #[arg(long, value_name = "DRIVER")]
    cgroup_driver: Option<String>,
    /// The kubelet's `cgroupRoot` (the cgroup `kubepods` lives under); default: the kubelet
    /// config's, else `/`.
    #[arg(long, value_name = "CGROUP")]
    kubelet_cgroup_root: Option<String>,
}

/// What the kubelet's configuration says about cgroups and CPUs (all unknown when it cannot
/// be read).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KubeletCgroups {
    /// Its `cgroupDriver`.
    pub driver: Option<String>,
    /// Its `cgroupRoot`.
    pub cgroup_root: Option<String>,
    /// Whether it gives Guaranteed pods exclusive CPUs (`cpuManagerPolicy: static`).
    pub static_cpu_manager: bool,
}

/// The co-location tasks' settings.
#[derive(Clone, Debug)]
pub struct ColocationSettings {
    /// Namespace of the `volcano-agent-configuration` ConfigMap and of the heartbeat Lease.
    pub config_namespace: String,
    /// How long the heartbeat Lease lasts without renewal.
    pub heartbeat_lease: Duration,
    /// The node's memory pressure (PSI) file.
    pub memory_pressure_file: PathBuf,
    /// How often the pod cgroups are re-applied.
    pub qos_interval: Duration,
    /// Where the cgroups are and how the kubelet names them.
    pub cgroups: cgroup::Settings,
    /// Whether the kubelet gives Guaranteed pods exclusive CPUs.
    pub static_cpu_manager: bool,
}

impl ColocationArgs {
    /// Whether `--colocation` is on.
    pub fn enabled(&self) -> bool {
        self.colocation
    }

    /// The tasks' settings, with what the flags leave open taken from the kubelet's
    /// configuration `kubelet`; `None` without `--colocation`.
    pub fn settings(&self, kubelet: KubeletCgroups) -> Option<ColocationSettings> {
        self.colocation.then(|| ColocationSettings {
            config_namespace: self.colocation_config_namespace.clone(),
            heartbeat_lease: self.heartbeat_lease_duration,
            memory_pressure_file: self.memory_pressure_file.clone(),
            qos_interval: self.qos_interval,
            cgroups: cgroup::Settings {
                cgroup_root: self.cgroup_root.clone(),
                mountinfo: self.cgroup_mountinfo.clone(),
                driver: self.cgroup_driver.clone().or(kubelet.driver),
                kubelet_cgroup_root: self.kubelet_cgroup_root.clone().or(kubelet.cgroup_root),
            },
            static_cpu_manager: kubelet.static_cpu_manager,
        })
    }
}

/// A heartbeat lease duration: whole seconds, at least 4 s (renewed every quarter).
fn parse_lease_duration(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| e.to_string())?;
    if d < Duration::from_secs(4) || d.subsec_nanos() != 0 {
        return Err(format!("{s}: a lease lasts whole seconds, at least 4"));
    }
    Ok(d)
}
