//! What the configuration means for one node, resolved: [`NodeConfig`] and its parts, the
//! cgroup [`Features`] it switches on, and the built-in defaults (volcano-agent's). The values
//! here are valid by construction; [`super::merge::effective`] builds them.

use std::time::Duration;

/// Usage percent at or above which a round counts as high (volcano-agent's documented default).
pub const DEFAULT_HIGH_WATERMARK: u8 = 80;
/// Usage percent at or below which the evicting taint is removed.
pub const DEFAULT_LOW_WATERMARK: u8 = 30;
/// Percent of idle resources offered as batch resources (volcano-agent's flag default).
pub const DEFAULT_OVERSUBSCRIPTION_RATIO: u8 = 60;
/// How often usage is sampled and eviction decided.
pub const DEFAULT_MONITOR_INTERVAL: Duration = Duration::from_secs(10);
/// Consecutive high rounds that make pressure (one minute at the default interval).
pub const DEFAULT_HIGH_USAGE_COUNT_LIMIT: u32 = 6;
/// CPU PSI `some avg10` percent above which a round counts as pressured; see
/// [`crate::rules::evict`].
pub const DEFAULT_CPU_PRESSURE_THRESHOLD: f64 = 40.0;
/// Memory PSI `full avg10` percent above which a round counts as pressured; see
/// [`crate::rules::evict`].
pub const DEFAULT_MEMORY_PRESSURE_THRESHOLD: f64 = 10.0;
/// Consecutive PSI-pressured rounds that make pressure (half a minute at the default interval).
pub const DEFAULT_PRESSURE_COUNT_LIMIT: u32 = 3;

/// What the configuration means for one node. Its `Default` (a node without labels or
/// configuration) comes from [`super::merge`], from the same defaults as every merge.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeConfig {
    /// The node takes part in co-location: label `volcano.sh/colocation` or
    /// `volcano.sh/oversubscription` is true.
    pub colocation: bool,
    /// `cpuQosConfig.enable` on a co-location node.
    pub cpu_qos: bool,
    /// `cpuBurstConfig.enable` on a co-location node.
    pub cpu_burst: bool,
    /// `memoryQosConfig.enable` on a co-location node.
    pub memory_qos: bool,
    pub oversubscription: OversubscriptionSettings,
    pub eviction: EvictionSettings,
}

/// Batch resources for the node ([`crate::rules::oversub`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OversubscriptionSettings {
    /// Label `volcano.sh/oversubscription` is true and `overSubscriptionConfig.enable` too;
    /// when this turns false the caller runs [`crate::rules::oversub::Oversubscription::disable`].
    pub enabled: bool,
    /// `cpu` is listed in `overSubscriptionTypes`: publish `kubernetes.io/batch-cpu`.
    pub cpu: bool,
    /// `memory` is listed: publish `kubernetes.io/batch-memory`.
    pub memory: bool,
    /// Percent of idle resources offered.
    pub ratio_percent: u8,
}

/// A pair of usage percents: pressure counts from `high`, the taint goes at `low`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Watermarks {
    pub high: u8,
    pub low: u8,
}

impl Default for Watermarks {
    fn default() -> Self {
        Self {
            high: DEFAULT_HIGH_WATERMARK,
            low: DEFAULT_LOW_WATERMARK,
        }
    }
}

/// Eviction of offline pods ([`crate::rules::evict`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EvictionSettings {
    /// On co-location nodes only: elsewhere there are no offline pods to protect anyone from.
    /// When false the caller removes a leftover taint and evicts nothing.
    pub enabled: bool,
    pub cpu: Watermarks,
    pub memory: Watermarks,
    /// Consecutive rounds at or above a high watermark that make pressure.
    pub high_usage_count_limit: u32,
    /// CPU PSI `some avg10` percent; above it a round counts as pressured.
    pub cpu_pressure_threshold: f64,
    /// Memory PSI `full avg10` percent; above it a round counts as pressured.
    pub memory_pressure_threshold: f64,
    /// Consecutive PSI-pressured rounds that make pressure.
    pub pressure_count_limit: u32,
    /// Time between rounds.
    pub monitor_interval: Duration,
}

impl Default for EvictionSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            cpu: Watermarks::default(),
            memory: Watermarks::default(),
            high_usage_count_limit: DEFAULT_HIGH_USAGE_COUNT_LIMIT,
            cpu_pressure_threshold: DEFAULT_CPU_PRESSURE_THRESHOLD,
            memory_pressure_threshold: DEFAULT_MEMORY_PRESSURE_THRESHOLD,
            pressure_count_limit: DEFAULT_PRESSURE_COUNT_LIMIT,
            monitor_interval: DEFAULT_MONITOR_INTERVAL,
        }
    }
}

/// Which cgroup settings the configuration switches on for the node's pods.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Features {
    /// `cpuQosConfig.enable`: `volcano.sh/qos-level` on the CPU controller.
    pub cpu_qos: bool,
    /// `memoryQosConfig.enable`: the level on the memory controller.
    pub memory_qos: bool,
    /// `cpuBurstConfig.enable`: `volcano.sh/enable-quota-burst`.
    pub cpu_burst: bool,
}

impl Features {
    pub fn of(config: &NodeConfig) -> Self {
        Self {
            cpu_qos: config.cpu_qos,
            memory_qos: config.memory_qos,
            cpu_burst: config.cpu_burst,
        }
    }
}
