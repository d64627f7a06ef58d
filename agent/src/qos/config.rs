//! The co-location configuration: ConfigMap `volcano-agent-configuration`, key
//! `colocation-config`, in volcano-agent's JSON spelling, and what it means for one node.
//!
//! Start at [`parse`] (the ConfigMap text to a validated [`VolcanoAgentConfig`], with warnings for
//! keys we ignore) and [`effective`] (that config plus the node's labels and annotations to a
//! [`NodeConfig`]). Precedence, lowest first: built-in defaults, `globalConfig`, every
//! `nodesConfig` entry whose selector matches the node, in order and field by field, then node
//! annotations for watermarks; the node labels `volcano.sh/colocation` and
//! `volcano.sh/oversubscription` switch the features on or off for the node.
//!
//! Differences from volcano-agent, on purpose:
//! - every matching `nodesConfig` entry applies field by field (volcano-agent applies only the last
//!   matching entry); with one match the result is the same;
//! - a watermark annotation overrides only its own watermark (volcano-agent takes all four from
//!   annotations, with built-in defaults, as soon as one is present);
//! - `overSubscriptionRatio` (percent of idle resources offered, default 60) may be set in
//!   `overSubscriptionConfig`; volcano-agent only has the `--oversubscription-ratio` flag;
//! - `evictingCPUPressureThreshold`, `evictingMemoryPressureThreshold` and `pressureCountLimit`
//!   in `evictingConfig` tune the PSI signal ([`super::evict`]), which volcano-agent lacks;
//! - invalid values are errors naming the key (volcano-agent skips a broken selector silently),
//!   and low watermarks must be strictly below high ones wherever they come from.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use serde::{Deserialize, Deserializer, Serialize};

/// The ConfigMap volcano-agent (and fumarole) read, in the agent's namespace.
pub const CONFIGMAP_NAME: &str = "volcano-agent-configuration";
/// The ConfigMap key holding the JSON document.
pub const CONFIG_KEY: &str = "colocation-config";

/// Node label: `"true"` makes the node a co-location node.
pub const COLOCATION_LABEL: &str = "volcano.sh/colocation";
/// Node label: `"true"` makes the node publish batch resources (and implies co-location).
pub const OVERSUBSCRIPTION_LABEL: &str = "volcano.sh/oversubscription";
/// Node annotation of the older API: overrides `overSubscriptionTypes` for the node.
pub const OVERSUBSCRIPTION_TYPES_ANNOTATION: &str = "volcano.sh/oversubscription-types";
/// Node annotation overriding `evictingCPUHighWatermark`.
pub const CPU_HIGH_WATERMARK_ANNOTATION: &str = "volcano.sh/evicting-cpu-high-watermark";
/// Node annotation overriding `evictingCPULowWatermark`.
pub const CPU_LOW_WATERMARK_ANNOTATION: &str = "volcano.sh/evicting-cpu-low-watermark";
/// Node annotation overriding `evictingMemoryHighWatermark`.
pub const MEMORY_HIGH_WATERMARK_ANNOTATION: &str = "volcano.sh/evicting-memory-high-watermark";
/// Node annotation overriding `evictingMemoryLowWatermark`.
pub const MEMORY_LOW_WATERMARK_ANNOTATION: &str = "volcano.sh/evicting-memory-low-watermark";

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
/// CPU PSI `some avg10` percent above which a round counts as pressured; see [`super::evict`].
pub const DEFAULT_CPU_PRESSURE_THRESHOLD: f64 = 40.0;
/// Memory PSI `full avg10` percent above which a round counts as pressured; see [`super::evict`].
pub const DEFAULT_MEMORY_PRESSURE_THRESHOLD: f64 = 10.0;
/// Consecutive PSI-pressured rounds that make pressure (half a minute at the default interval).
pub const DEFAULT_PRESSURE_COUNT_LIMIT: u32 = 3;

/// The whole `colocation-config` document.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolcanoAgentConfig {
    /// Applies to every node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub global_config: Option<ColocationConfig>,
    /// Per node pool overrides, applied in order where the selector matches.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub nodes_config: Vec<NodesConfig>,
}

/// The feature sections; every field left out keeps the value from below it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ColocationConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_qos_config: Option<Feature>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_burst_config: Option<Feature>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_qos_config: Option<Feature>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub over_subscription_config: Option<OverSubscriptionConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evicting_config: Option<EvictingConfig>,
}

/// One `nodesConfig` entry: a selector and the same sections as [`ColocationConfig`] (spelled
/// out rather than flattened so that errors keep their exact path, line and column).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodesConfig {
    /// Which nodes the entry applies to; left out, it applies to none (as in volcano-agent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_qos_config: Option<Feature>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_burst_config: Option<Feature>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_qos_config: Option<Feature>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub over_subscription_config: Option<OverSubscriptionConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evicting_config: Option<EvictingConfig>,
}

/// `cpuQosConfig`, `cpuBurstConfig`, `memoryQosConfig`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Feature {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable: Option<bool>,
}

/// `overSubscriptionConfig`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OverSubscriptionConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable: Option<bool>,
    /// Comma-separated `cpu`, `memory`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub over_subscription_types: Option<String>,
    /// Percent of idle resources offered, 1 to 100 (fumarole; volcano-agent has a flag).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub over_subscription_ratio: Option<i64>,
}

/// `evictingConfig`. Integers are read wide so that out-of-range values get our error, which
/// names the key, rather than a type error.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EvictingConfig {
    #[serde(
        rename = "evictingCPUHighWatermark",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub cpu_high_watermark: Option<i64>,
    #[serde(
        rename = "evictingMemoryHighWatermark",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub memory_high_watermark: Option<i64>,
    #[serde(
        rename = "evictingCPULowWatermark",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub cpu_low_watermark: Option<i64>,
    #[serde(
        rename = "evictingMemoryLowWatermark",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub memory_low_watermark: Option<i64>,
    /// Seconds between rounds (newer volcano-agent), 1 to 3600.
    #[serde(
        rename = "monitorInterval",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub monitor_interval: Option<i64>,
    /// Consecutive high rounds that make pressure (newer volcano-agent), 1 to 1000.
    #[serde(
        rename = "highUsageCountLimit",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub high_usage_count_limit: Option<i64>,
    /// CPU PSI `some avg10` percent, 0 to 100; 100 turns the CPU PSI signal off (fumarole).
    #[serde(
        rename = "evictingCPUPressureThreshold",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub cpu_pressure_threshold: Option<f64>,
    /// Memory PSI `full avg10` percent, 0 to 100; 100 turns the memory PSI signal off (fumarole).
    #[serde(
        rename = "evictingMemoryPressureThreshold",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub memory_pressure_threshold: Option<f64>,
    /// Consecutive PSI-pressured rounds that make pressure, 1 to 1000 (fumarole).
    #[serde(
        rename = "pressureCountLimit",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub pressure_count_limit: Option<i64>,
}

fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// What the configuration means for one node.
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

/// Batch resources for the node ([`super::oversub`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OversubscriptionSettings {
    /// Label `volcano.sh/oversubscription` is true and `overSubscriptionConfig.enable` too;
    /// when this turns false the caller runs [`super::oversub::Oversubscription::disable`].
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

/// Eviction of offline pods ([`super::evict`]).
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

impl Default for NodeConfig {
    /// A node without labels: co-location off, everything else at its default.
    fn default() -> Self {
        let mut merged = Merged::default();
        merged.finish(false, false)
    }
}

/// Why a configuration was refused. The text names the key and is meant for a Kubernetes Event;
/// whatever the variant, the caller keeps the last good configuration and tries again on the next
/// change of the ConfigMap or the node.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    /// The text is not JSON, or a value has the wrong type; the message has the key path, line
    /// and column.
    #[error("colocation-config is not valid: {0}")]
    Json(String),
    /// A value outside what its key allows; `key` says where it came from (a config path, a
    /// node label or a node annotation).
    #[error("{key} is {value}; {expected}")]
    Value {
        key: String,
        value: String,
        expected: String,
    },
    /// A low watermark at or above its high watermark, after merging; each side says where its
    /// value came from.
    #[error(
        "{resource} low watermark {low}% ({low_from}) must be below the high watermark {high}% ({high_from})"
    )]
    WatermarkOrder {
        resource: &'static str,
        low: u8,
        low_from: String,
        high: u8,
        high_from: String,
    },
    /// A label selector that cannot be evaluated.
    #[error("{key}: {reason}")]
    Selector { key: String, reason: String },
    /// Several of the above, all listed.
    #[error("{}", several(.0))]
    Several(Vec<ConfigError>),
}

fn several(errors: &[ConfigError]) -> String {
    let list: Vec<String> = errors.iter().map(ToString::to_string).collect();
    format!("{} problems: {}", errors.len(), list.join("; "))
}

impl ConfigError {
    fn collect(mut errors: Vec<ConfigError>) -> Result<(), ConfigError> {
        match errors.len() {
            0 => Ok(()),
            1 => Err(errors.remove(0)),
            _ => Err(ConfigError::Several(errors)),
        }
    }
}

/// A parsed document and what in it was ignored.
#[derive(Debug, Clone, PartialEq)]
pub struct Parsed {
    pub config: VolcanoAgentConfig,
    /// Keys we do not act on (volcano-agent sections fumarole does not implement, and unknown
    /// keys, which are most likely typos) and `nodesConfig` entries without a selector; worth a
    /// log line, not a refusal, because volcano-agent ignores them too.
    pub warnings: Vec<String>,
}

/// Reads and validates the `colocation-config` text. Every value is checked, also in
/// `nodesConfig` entries that do not match this node, so that all agents agree on whether a
/// ConfigMap is valid.
pub fn parse(json: &str) -> Result<Parsed, ConfigError> {
    let mut de = serde_json::Deserializer::from_str(json);
    let config: VolcanoAgentConfig = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        // A syntax error inside a map ends the path in an unknown `?` segment: drop it.
        let full = e.path().to_string();
        let path = full.trim_end_matches(".?");
        if path == "." || path == "?" {
            ConfigError::Json(e.inner().to_string())
        } else {
            ConfigError::Json(format!("{path}: {}", e.inner()))
        }
    })?;
    // Nothing but whitespace may follow the document.
    de.end().map_err(|e| ConfigError::Json(e.to_string()))?;
    // serde also reads a struct from an array; volcano-agent (Go) would not.
    let value: serde_json::Value =
        serde_json::from_str(json).map_err(|e| ConfigError::Json(e.to_string()))?;
    if !value.is_object() {
        return Err(ConfigError::Json(
            "the document must be a JSON object".into(),
        ));
    }
    config.validate()?;
    let mut warnings = Vec::new();
    ignored_keys(&value, &mut warnings);
    for (i, entry) in config.nodes_config.iter().enumerate() {
        if entry.selector.is_none() {
            warnings.push(format!(
                "nodesConfig[{i}] has no selector and applies to no node"
            ));
        }
    }
    Ok(Parsed { config, warnings })
}

/// The sections of a global or per-node entry, borrowed, so that both merge the same way.
#[derive(Clone, Copy)]
struct Sections<'a> {
    cpu_qos: Option<&'a Feature>,
    cpu_burst: Option<&'a Feature>,
    memory_qos: Option<&'a Feature>,
    over_subscription: Option<&'a OverSubscriptionConfig>,
    evicting: Option<&'a EvictingConfig>,
}

impl ColocationConfig {
    fn sections(&self) -> Sections<'_> {
        Sections {
            cpu_qos: self.cpu_qos_config.as_ref(),
            cpu_burst: self.cpu_burst_config.as_ref(),
            memory_qos: self.memory_qos_config.as_ref(),
            over_subscription: self.over_subscription_config.as_ref(),
            evicting: self.evicting_config.as_ref(),
        }
    }
}

impl NodesConfig {
    fn sections(&self) -> Sections<'_> {
        Sections {
            cpu_qos: self.cpu_qos_config.as_ref(),
            cpu_burst: self.cpu_burst_config.as_ref(),
            memory_qos: self.memory_qos_config.as_ref(),
            over_subscription: self.over_subscription_config.as_ref(),
            evicting: self.evicting_config.as_ref(),
        }
    }
}

impl VolcanoAgentConfig {
    /// Checks every value and selector in the document, whichever node it is for.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut errors = Vec::new();
        let mut scratch = Merged::default();
        if let Some(global) = &self.global_config {
            scratch.apply(global.sections(), "globalConfig", &mut errors);
        }
        for (i, entry) in self.nodes_config.iter().enumerate() {
            let prefix = format!("nodesConfig[{i}]");
            if let Some(selector) = &entry.selector
                && let Err(e) = check_selector(selector, &format!("{prefix}.selector"))
            {
                errors.push(e);
            }
            scratch.apply(entry.sections(), &prefix, &mut errors);
        }
        ConfigError::collect(errors)
    }
}

/// The configuration for the node with these labels and annotations.
pub fn effective(
    config: &VolcanoAgentConfig,
    node_labels: &BTreeMap<String, String>,
    node_annotations: &BTreeMap<String, String>,
) -> Result<NodeConfig, ConfigError> {
    config.validate()?;
    let mut errors = Vec::new();
    let mut merged = Merged::default();
    if let Some(global) = &config.global_config {
        merged.apply(global.sections(), "globalConfig", &mut errors);
    }
    for (i, entry) in config.nodes_config.iter().enumerate() {
        let Some(selector) = &entry.selector else {
            continue;
        };
        let key = format!("nodesConfig[{i}].selector");
        match selector_matches(selector, node_labels, &key) {
            Ok(true) => merged.apply(entry.sections(), &format!("nodesConfig[{i}]"), &mut errors),
            Ok(false) => {}
            Err(e) => errors.push(e),
        }
    }
    merged.apply_annotations(node_annotations, &mut errors);
    let colocation_label = label_bool(node_labels, COLOCATION_LABEL, &mut errors);
    let oversubscription_label = label_bool(node_labels, OVERSUBSCRIPTION_LABEL, &mut errors);
    merged.check_order(&mut errors);
    ConfigError::collect(errors)?;
    Ok(merged.finish(colocation_label, oversubscription_label))
}

/// A value and where it came from, for error messages that point at the right place.
#[derive(Debug, Clone)]
struct Sourced<T> {
    value: T,
    from: String,
}

impl<T> Sourced<T> {
    fn default(value: T) -> Self {
        Self {
            value,
            from: "default".into(),
        }
    }
}

/// Defaults with layers applied on top.
#[derive(Debug, Clone)]
struct Merged {
    cpu_qos: bool,
    cpu_burst: bool,
    memory_qos: bool,
    oversubscription: bool,
    oversubscription_cpu: bool,
    oversubscription_memory: bool,
    ratio: u8,
    cpu_high: Sourced<u8>,
    cpu_low: Sourced<u8>,
    memory_high: Sourced<u8>,
    memory_low: Sourced<u8>,
    monitor_interval: Duration,
    high_usage_count_limit: u32,
    cpu_pressure_threshold: f64,
    memory_pressure_threshold: f64,
    pressure_count_limit: u32,
}

impl Default for Merged {
    /// volcano-agent's defaults: fine-grained QoS features off (they need kernel support the
    /// operator has to confirm), oversubscription on for nodes that carry the label.
    fn default() -> Self {
        Self {
            cpu_qos: false,
            cpu_burst: false,
            memory_qos: false,
            oversubscription: true,
            oversubscription_cpu: true,
            oversubscription_memory: true,
            ratio: DEFAULT_OVERSUBSCRIPTION_RATIO,
            cpu_high: Sourced::default(DEFAULT_HIGH_WATERMARK),
            cpu_low: Sourced::default(DEFAULT_LOW_WATERMARK),
            memory_high: Sourced::default(DEFAULT_HIGH_WATERMARK),
            memory_low: Sourced::default(DEFAULT_LOW_WATERMARK),
            monitor_interval: DEFAULT_MONITOR_INTERVAL,
            high_usage_count_limit: DEFAULT_HIGH_USAGE_COUNT_LIMIT,
            cpu_pressure_threshold: DEFAULT_CPU_PRESSURE_THRESHOLD,
            memory_pressure_threshold: DEFAULT_MEMORY_PRESSURE_THRESHOLD,
            pressure_count_limit: DEFAULT_PRESSURE_COUNT_LIMIT,
        }
    }
}

const PERCENT: &str = "it must be a whole percent from 0 to 100";

fn int_in(key: &str, value: i64, min: i64, max: i64, errors: &mut Vec<ConfigError>) -> Option<u32> {
    if (min..=max).contains(&value) {
        u32::try_from(value).ok()
    } else {
        errors.push(ConfigError::Value {
            key: key.into(),
            value: value.to_string(),
            expected: format!("it must be a whole number from {min} to {max}"),
        });
        None
    }
}

fn percent(key: &str, value: i64, errors: &mut Vec<ConfigError>) -> Option<u8> {
    match u8::try_from(value) {
        Ok(v) if v <= 100 => Some(v),
        _ => {
            errors.push(ConfigError::Value {
                key: key.into(),
                value: value.to_string(),
                expected: PERCENT.into(),
            });
            None
        }
    }
}

fn threshold(key: &str, value: f64, errors: &mut Vec<ConfigError>) -> Option<f64> {
    if value.is_finite() && (0.0..=100.0).contains(&value) {
        Some(value)
    } else {
        errors.push(ConfigError::Value {
            key: key.into(),
            value: value.to_string(),
            expected: "it must be a percent from 0 to 100".into(),
        });
        None
    }
}

/// `overSubscriptionTypes` to (cpu, memory); spaces around names and empty items are allowed.
fn oversubscription_types(
    key: &str,
    value: &str,
    errors: &mut Vec<ConfigError>,
) -> Option<(bool, bool)> {
    let (mut cpu, mut memory) = (false, false);
    let mut ok = true;
    for item in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        match item {
            "cpu" => cpu = true,
            "memory" => memory = true,
            other => {
                ok = false;
                errors.push(ConfigError::Value {
                    key: key.into(),
                    value: format!("{value:?}"),
                    expected: format!("{other:?} is not supported, only cpu and memory"),
                });
            }
        }
    }
    if ok && !cpu && !memory {
        errors.push(ConfigError::Value {
            key: key.into(),
            value: format!("{value:?}"),
            expected: "list cpu and/or memory, or set enable to false".into(),
        });
        return None;
    }
    ok.then_some((cpu, memory))
}

impl Merged {
    /// Validates one layer and applies what is valid; problems go to `errors`.
    fn apply(&mut self, s: Sections<'_>, prefix: &str, errors: &mut Vec<ConfigError>) {
        if let Some(enable) = s.cpu_qos.and_then(|f| f.enable) {
            self.cpu_qos = enable;
        }
        if let Some(enable) = s.cpu_burst.and_then(|f| f.enable) {
            self.cpu_burst = enable;
        }
        if let Some(enable) = s.memory_qos.and_then(|f| f.enable) {
            self.memory_qos = enable;
        }
        if let Some(o) = s.over_subscription {
            let p = format!("{prefix}.overSubscriptionConfig");
            if let Some(enable) = o.enable {
                self.oversubscription = enable;
            }
            if let Some(types) = &o.over_subscription_types {
                let key = format!("{p}.overSubscriptionTypes");
                if let Some((cpu, memory)) = oversubscription_types(&key, types, errors) {
                    self.oversubscription_cpu = cpu;
                    self.oversubscription_memory = memory;
                }
            }
            if let Some(ratio) = o.over_subscription_ratio {
                let key = format!("{p}.overSubscriptionRatio");
                if (1..=100).contains(&ratio) {
                    self.ratio = ratio as u8;
                } else {
                    errors.push(ConfigError::Value {
                        key,
                        value: ratio.to_string(),
                        expected: "it must be a whole percent from 1 to 100".into(),
                    });
                }
            }
        }
        if let Some(e) = s.evicting {
            self.apply_evicting(e, &format!("{prefix}.evictingConfig"), errors);
        }
    }

    fn apply_evicting(&mut self, e: &EvictingConfig, p: &str, errors: &mut Vec<ConfigError>) {
        let mut mark = |value: Option<i64>, name: &str, slot: &mut Sourced<u8>| -> Option<u8> {
            let key = format!("{p}.{name}");
            let v = percent(&key, value?, errors)?;
            *slot = Sourced {
                value: v,
                from: key,
            };
            Some(v)
        };
        let cpu_high = mark(
            e.cpu_high_watermark,
            "evictingCPUHighWatermark",
            &mut self.cpu_high,
        );
        let cpu_low = mark(
            e.cpu_low_watermark,
            "evictingCPULowWatermark",
            &mut self.cpu_low,
        );
        let memory_high = mark(
            e.memory_high_watermark,
            "evictingMemoryHighWatermark",
            &mut self.memory_high,
        );
        let memory_low = mark(
            e.memory_low_watermark,
            "evictingMemoryLowWatermark",
            &mut self.memory_low,
        );
        // Both set in one section: refuse a wrong pair even where this entry does not apply.
        if let (Some(high), Some(low)) = (cpu_high, cpu_low)
            && low >= high
        {
            errors.push(order_error("cpu", &self.cpu_low, &self.cpu_high));
        }
        if let (Some(high), Some(low)) = (memory_high, memory_low)
            && low >= high
        {
            errors.push(order_error("memory", &self.memory_low, &self.memory_high));
        }
        if let Some(v) = e.monitor_interval
            && let Some(secs) = int_in(&format!("{p}.monitorInterval"), v, 1, 3600, errors)
        {
            self.monitor_interval = Duration::from_secs(u64::from(secs));
        }
        if let Some(v) = e.high_usage_count_limit
            && let Some(n) = int_in(&format!("{p}.highUsageCountLimit"), v, 1, 1000, errors)
        {
            self.high_usage_count_limit = n;
        }
        if let Some(v) = e.pressure_count_limit
            && let Some(n) = int_in(&format!("{p}.pressureCountLimit"), v, 1, 1000, errors)
        {
            self.pressure_count_limit = n;
        }
        if let Some(v) = e.cpu_pressure_threshold
            && let Some(t) = threshold(&format!("{p}.evictingCPUPressureThreshold"), v, errors)
        {
            self.cpu_pressure_threshold = t;
        }
        if let Some(v) = e.memory_pressure_threshold
            && let Some(t) = threshold(&format!("{p}.evictingMemoryPressureThreshold"), v, errors)
        {
            self.memory_pressure_threshold = t;
        }
    }

    /// Watermark annotations (and their older `volcano.sh/oversubscription-evicting-*` spelling,
    /// read only when the new key is absent) and the older `oversubscription-types` annotation.
    fn apply_annotations(
        &mut self,
        annotations: &BTreeMap<String, String>,
        errors: &mut Vec<ConfigError>,
    ) {
        let slots = [
            (CPU_HIGH_WATERMARK_ANNOTATION, &mut self.cpu_high),
            (CPU_LOW_WATERMARK_ANNOTATION, &mut self.cpu_low),
            (MEMORY_HIGH_WATERMARK_ANNOTATION, &mut self.memory_high),
            (MEMORY_LOW_WATERMARK_ANNOTATION, &mut self.memory_low),
        ];
        for (key, slot) in slots {
            let legacy = key.replacen("volcano.sh/", "volcano.sh/oversubscription-", 1);
            let found = annotations
                .get(key)
                .map(|v| (key.to_owned(), v))
                .or_else(|| annotations.get(&legacy).map(|v| (legacy.clone(), v)));
            let Some((key, raw)) = found else { continue };
            let from = format!("node annotation {key}");
            match raw.trim().parse::<u8>() {
                Ok(v) if v <= 100 => *slot = Sourced { value: v, from },
                _ => errors.push(ConfigError::Value {
                    key: from,
                    value: format!("{raw:?}"),
                    expected: PERCENT.into(),
                }),
            }
        }
        if let Some(raw) = annotations.get(OVERSUBSCRIPTION_TYPES_ANNOTATION)
            && !raw.trim().is_empty()
        {
            let key = format!("node annotation {OVERSUBSCRIPTION_TYPES_ANNOTATION}");
            if let Some((cpu, memory)) = oversubscription_types(&key, raw, errors) {
                self.oversubscription_cpu = cpu;
                self.oversubscription_memory = memory;
            }
        }
    }

    fn check_order(&self, errors: &mut Vec<ConfigError>) {
        if self.cpu_low.value >= self.cpu_high.value {
            errors.push(order_error("cpu", &self.cpu_low, &self.cpu_high));
        }
        if self.memory_low.value >= self.memory_high.value {
            errors.push(order_error("memory", &self.memory_low, &self.memory_high));
        }
    }

    fn finish(&mut self, colocation_label: bool, oversubscription_label: bool) -> NodeConfig {
        // An oversubscription node runs offline pods, so it is a co-location node too.
        let colocation = colocation_label || oversubscription_label;
        NodeConfig {
            colocation,
            cpu_qos: colocation && self.cpu_qos,
            cpu_burst: colocation && self.cpu_burst,
            memory_qos: colocation && self.memory_qos,
            oversubscription: OversubscriptionSettings {
                enabled: oversubscription_label && self.oversubscription,
                cpu: self.oversubscription_cpu,
                memory: self.oversubscription_memory,
                ratio_percent: self.ratio,
            },
            eviction: EvictionSettings {
                enabled: colocation,
                cpu: Watermarks {
                    high: self.cpu_high.value,
                    low: self.cpu_low.value,
                },
                memory: Watermarks {
                    high: self.memory_high.value,
                    low: self.memory_low.value,
                },
                high_usage_count_limit: self.high_usage_count_limit,
                cpu_pressure_threshold: self.cpu_pressure_threshold,
                memory_pressure_threshold: self.memory_pressure_threshold,
                pressure_count_limit: self.pressure_count_limit,
                monitor_interval: self.monitor_interval,
            },
        }
    }
}

fn order_error(resource: &'static str, low: &Sourced<u8>, high: &Sourced<u8>) -> ConfigError {
    ConfigError::WatermarkOrder {
        resource,
        low: low.value,
        low_from: low.from.clone(),
        high: high.value,
        high_from: high.from.clone(),
    }
}

/// A node label read as Go's `strconv.ParseBool` does (what volcano-agent uses); missing is
/// false, anything else unreadable is an error rather than a silent false.
fn label_bool(labels: &BTreeMap<String, String>, key: &str, errors: &mut Vec<ConfigError>) -> bool {
    match labels.get(key).map(String::as_str) {
        None => false,
        Some("1" | "t" | "T" | "true" | "TRUE" | "True") => true,
        Some("0" | "f" | "F" | "false" | "FALSE" | "False") => false,
        Some(other) => {
            errors.push(ConfigError::Value {
                key: format!("node label {key}"),
                value: format!("{other:?}"),
                expected: "it must be true or false".into(),
            });
            false
        }
    }
}

/// The operators of a `matchExpressions` requirement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Operator {
    In,
    NotIn,
    Exists,
    DoesNotExist,
}

impl fmt::Display for Operator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Operator::In => "In",
            Operator::NotIn => "NotIn",
            Operator::Exists => "Exists",
            Operator::DoesNotExist => "DoesNotExist",
        })
    }
}

fn requirement(r: &LabelSelectorRequirement, key: &str) -> Result<Operator, ConfigError> {
    let err = |reason: String| ConfigError::Selector {
        key: key.into(),
        reason,
    };
    if r.key.is_empty() {
        return Err(err("the label key is empty".into()));
    }
    let op = match r.operator.as_str() {
        "In" => Operator::In,
        "NotIn" => Operator::NotIn,
        "Exists" => Operator::Exists,
        "DoesNotExist" => Operator::DoesNotExist,
        other => {
            return Err(err(format!(
                "operator {other:?} is not one of In, NotIn, Exists, DoesNotExist"
            )));
        }
    };
    let values = r.values.as_deref().unwrap_or_default();
    match op {
        Operator::In | Operator::NotIn if values.is_empty() => Err(err(format!(
            "operator {op} on {:?} needs at least one value",
            r.key
        ))),
        Operator::Exists | Operator::DoesNotExist if !values.is_empty() => {
            Err(err(format!("operator {op} on {:?} takes no values", r.key)))
        }
        _ => Ok(op),
    }
}

fn check_selector(selector: &LabelSelector, key: &str) -> Result<(), ConfigError> {
    if let Some(labels) = &selector.match_labels
        && labels.keys().any(String::is_empty)
    {
        return Err(ConfigError::Selector {
            key: format!("{key}.matchLabels"),
            reason: "a label key is empty".into(),
        });
    }
    for (i, r) in selector.match_expressions.iter().flatten().enumerate() {
        requirement(r, &format!("{key}.matchExpressions[{i}]"))?;
    }
    Ok(())
}

/// Whether `labels` satisfy `selector`, as `metav1.LabelSelectorAsSelector` evaluates it: every
/// `matchLabels` pair and every expression must hold; an empty selector matches every node.
pub fn selector_matches(
    selector: &LabelSelector,
    labels: &BTreeMap<String, String>,
    key: &str,
) -> Result<bool, ConfigError> {
    check_selector(selector, key)?;
    let labels_ok = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    if !labels_ok {
        return Ok(false);
    }
    for (i, r) in selector.match_expressions.iter().flatten().enumerate() {
        let op = requirement(r, &format!("{key}.matchExpressions[{i}]"))?;
        let values = r.values.as_deref().unwrap_or_default();
        let value = labels.get(&r.key);
        let holds = match op {
            Operator::In => value.is_some_and(|v| values.contains(v)),
            Operator::NotIn => value.is_none_or(|v| !values.contains(v)),
            Operator::Exists => value.is_some(),
            Operator::DoesNotExist => value.is_none(),
        };
        if !holds {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Sections volcano-agent knows that fumarole does not act on.
const NOT_IMPLEMENTED: &[&str] = &[
    "networkQosConfig",
    "memoryQosV2Config",
    "cpuThrottlingConfig",
    "blkioQosConfig",
    "timeBasedQoSPolicies",
    "nodeLabelConfig",
    "nodeMonitor",
];

const FEATURE_KEYS: &[&str] = &["enable"];
const OVERSUBSCRIPTION_KEYS: &[&str] =
    &["enable", "overSubscriptionTypes", "overSubscriptionRatio"];
const EVICTING_KEYS: &[&str] = &[
    "evictingCPUHighWatermark",
    "evictingMemoryHighWatermark",
    "evictingCPULowWatermark",
    "evictingMemoryLowWatermark",
    "monitorInterval",
    "highUsageCountLimit",
    "evictingCPUPressureThreshold",
    "evictingMemoryPressureThreshold",
    "pressureCountLimit",
];

fn section_keys(name: &str) -> Option<&'static [&'static str]> {
    match name {
        "cpuQosConfig" | "cpuBurstConfig" | "memoryQosConfig" => Some(FEATURE_KEYS),
        "overSubscriptionConfig" => Some(OVERSUBSCRIPTION_KEYS),
        "evictingConfig" => Some(EVICTING_KEYS),
        _ => None,
    }
}

fn ignored_keys(doc: &serde_json::Value, out: &mut Vec<String>) {
    let Some(top) = doc.as_object() else { return };
    for key in top.keys() {
        if key != "globalConfig" && key != "nodesConfig" {
            out.push(format!("{key} is not a known key; ignored"));
        }
    }
    if let Some(global) = top.get("globalConfig") {
        ignored_in_layer(global, "globalConfig", false, out);
    }
    if let Some(nodes) = top.get("nodesConfig").and_then(|n| n.as_array()) {
        for (i, entry) in nodes.iter().enumerate() {
            ignored_in_layer(entry, &format!("nodesConfig[{i}]"), true, out);
        }
    }
}

fn ignored_in_layer(
    layer: &serde_json::Value,
    prefix: &str,
    selector: bool,
    out: &mut Vec<String>,
) {
    let Some(layer) = layer.as_object() else {
        return;
    };
    for (key, value) in layer {
        if selector && key == "selector" {
            continue;
        }
        if NOT_IMPLEMENTED.contains(&key.as_str()) {
            out.push(format!(
                "{prefix}.{key} is a volcano-agent setting fumarole does not implement; ignored"
            ));
            continue;
        }
        let Some(known) = section_keys(key) else {
            out.push(format!("{prefix}.{key} is not a known key; ignored"));
            continue;
        };
        for inner in value.as_object().into_iter().flat_map(|o| o.keys()) {
            if !known.contains(&inner.as_str()) {
                out.push(format!(
                    "{prefix}.{key}.{inner} is not a known key; ignored"
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn node(json: &str, labels: &[(&str, &str)], annotations: &[(&str, &str)]) -> NodeConfig {
        let parsed = parse(json).unwrap();
        effective(&parsed.config, &map(labels), &map(annotations)).unwrap()
    }

    fn err(json: &str) -> String {
        parse(json).unwrap_err().to_string()
    }

    fn err_on(json: &str, labels: &[(&str, &str)], annotations: &[(&str, &str)]) -> String {
        let parsed = parse(json).unwrap();
        effective(&parsed.config, &map(labels), &map(annotations))
            .unwrap_err()
            .to_string()
    }

    type Labels = &'static [(&'static str, &'static str)];

    const COLOCATED: &[(&str, &str)] = &[(COLOCATION_LABEL, "true")];
    const OVERSOLD: &[(&str, &str)] = &[(OVERSUBSCRIPTION_LABEL, "true")];

    /// volcano-agent's own sample ConfigMap (its `DefaultCfg`), which must be accepted as is.
    const VOLCANO_DEFAULT: &str = r#"
{
    "globalConfig":{
        "nodeLabelConfig":{"nodeColocationEnable":true,"nodeOverSubscriptionEnable":false},
        "cpuBurstConfig":{"enable":false},
        "cpuQosConfig":{"enable":false},
        "memoryQosConfig":{"enable":false},
        "memoryQosV2Config":{"enable":false},
        "networkQosConfig":{"enable":false,"onlineBandwidthWatermarkPercent":80,
            "offlineLowBandwidthPercent":10,"offlineHighBandwidthPercent":40,"qosCheckInterval":10000000},
        "overSubscriptionConfig":{"enable":true,"overSubscriptionTypes":"cpu,memory"},
        "evictingConfig":{"evictingCPUHighWatermark":80,"evictingMemoryHighWatermark":60,
            "evictingCPULowWatermark":30,"evictingMemoryLowWatermark":30,
            "monitorInterval":10,"highUsageCountLimit":6},
        "cpuThrottlingConfig":{"enable":false}
    }
}"#;

    #[test]
    fn defaults_without_config_or_labels() {
        let n = node("{}", &[], &[]);
        assert_eq!(n, NodeConfig::default());
        assert!(!n.colocation && !n.cpu_qos && !n.cpu_burst && !n.memory_qos);
        assert!(!n.oversubscription.enabled);
        assert!(n.oversubscription.cpu && n.oversubscription.memory);
        assert_eq!(n.oversubscription.ratio_percent, 60);
        assert!(!n.eviction.enabled);
        assert_eq!(n.eviction.cpu, Watermarks { high: 80, low: 30 });
        assert_eq!(n.eviction.memory, Watermarks { high: 80, low: 30 });
        assert_eq!(n.eviction.high_usage_count_limit, 6);
        assert_eq!(n.eviction.pressure_count_limit, 3);
        assert_eq!(n.eviction.cpu_pressure_threshold, 40.0);
        assert_eq!(n.eviction.memory_pressure_threshold, 10.0);
        assert_eq!(n.eviction.monitor_interval, Duration::from_secs(10));
        // null sections are the same as missing ones.
        assert_eq!(
            node(r#"{"globalConfig": null, "nodesConfig": null}"#, &[], &[]),
            n
        );
    }

    #[test]
    fn volcano_agent_default_config_is_accepted_with_warnings() {
        let parsed = parse(VOLCANO_DEFAULT).unwrap();
        assert_eq!(
            parsed.warnings,
            [
                "globalConfig.cpuThrottlingConfig is a volcano-agent setting fumarole does not implement; ignored",
                "globalConfig.memoryQosV2Config is a volcano-agent setting fumarole does not implement; ignored",
                "globalConfig.networkQosConfig is a volcano-agent setting fumarole does not implement; ignored",
                "globalConfig.nodeLabelConfig is a volcano-agent setting fumarole does not implement; ignored",
            ]
        );
        let n = effective(&parsed.config, &map(OVERSOLD), &map(&[])).unwrap();
        assert!(n.colocation && n.oversubscription.enabled && n.eviction.enabled);
        assert_eq!(n.eviction.memory, Watermarks { high: 60, low: 30 });
    }

    #[test]
    fn labels_switch_features_per_node() {
        let json = r#"{"globalConfig": {"cpuQosConfig": {"enable": true},
            "cpuBurstConfig": {"enable": true}, "memoryQosConfig": {"enable": true}}}"#;
        // (labels, colocation, cpu qos, oversubscription)
        let table: &[(Labels, bool, bool, bool)] = &[
            (&[], false, false, false),
            (&[(COLOCATION_LABEL, "true")], true, true, false),
            (&[(COLOCATION_LABEL, "false")], false, false, false),
            (&[(COLOCATION_LABEL, "True")], true, true, false),
            (&[(COLOCATION_LABEL, "1")], true, true, false),
            (&[(OVERSUBSCRIPTION_LABEL, "true")], true, true, true),
            (
                &[(COLOCATION_LABEL, "false"), (OVERSUBSCRIPTION_LABEL, "t")],
                true,
                true,
                true,
            ),
        ];
        for (labels, colocation, cpu_qos, oversub) in table {
            let n = node(json, labels, &[]);
            assert_eq!(n.colocation, *colocation, "{labels:?}");
            assert_eq!(n.cpu_qos, *cpu_qos, "{labels:?}");
            assert_eq!(n.cpu_burst, *cpu_qos, "{labels:?}");
            assert_eq!(n.memory_qos, *cpu_qos, "{labels:?}");
            assert_eq!(n.eviction.enabled, *colocation, "{labels:?}");
            assert_eq!(n.oversubscription.enabled, *oversub, "{labels:?}");
        }
        // The label does not turn on what the config turned off.
        let off = r#"{"globalConfig": {"overSubscriptionConfig": {"enable": false}}}"#;
        let n = node(off, OVERSOLD, &[]);
        assert!(n.colocation && !n.oversubscription.enabled);
    }

    #[test]
    fn bad_label_values_are_errors() {
        assert_eq!(
            err_on("{}", &[(COLOCATION_LABEL, "yes")], &[]),
            r#"node label volcano.sh/colocation is "yes"; it must be true or false"#
        );
        assert_eq!(
            err_on("{}", &[(OVERSUBSCRIPTION_LABEL, "")], &[]),
            r#"node label volcano.sh/oversubscription is ""; it must be true or false"#
        );
    }

    fn requirement(key: &str, op: &str, values: &[&str]) -> LabelSelectorRequirement {
        LabelSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: (!values.is_empty()).then(|| values.iter().map(|v| v.to_string()).collect()),
        }
    }

    #[test]
    fn selector_table() {
        let labels = map(&[("pool", "gpu"), ("zone", "a"), ("spot", "")]);
        let labels_sel = |pairs: &[(&str, &str)]| LabelSelector {
            match_labels: Some(map(pairs)),
            match_expressions: None,
        };
        let exprs = |reqs: Vec<LabelSelectorRequirement>| LabelSelector {
            match_labels: None,
            match_expressions: Some(reqs),
        };
        let table: Vec<(&str, LabelSelector, bool)> = vec![
            ("empty matches all", LabelSelector::default(), true),
            ("matchLabels hit", labels_sel(&[("pool", "gpu")]), true),
            (
                "matchLabels all",
                labels_sel(&[("pool", "gpu"), ("zone", "a")]),
                true,
            ),
            ("matchLabels miss", labels_sel(&[("pool", "cpu")]), false),
            ("matchLabels absent", labels_sel(&[("rack", "1")]), false),
            ("empty value", labels_sel(&[("spot", "")]), true),
            (
                "In hit",
                exprs(vec![requirement("pool", "In", &["cpu", "gpu"])]),
                true,
            ),
            (
                "In miss",
                exprs(vec![requirement("pool", "In", &["cpu"])]),
                false,
            ),
            (
                "In absent",
                exprs(vec![requirement("rack", "In", &["1"])]),
                false,
            ),
            (
                "NotIn hit",
                exprs(vec![requirement("pool", "NotIn", &["gpu"])]),
                false,
            ),
            (
                "NotIn miss",
                exprs(vec![requirement("pool", "NotIn", &["cpu"])]),
                true,
            ),
            (
                "NotIn absent",
                exprs(vec![requirement("rack", "NotIn", &["1"])]),
                true,
            ),
            (
                "Exists",
                exprs(vec![requirement("zone", "Exists", &[])]),
                true,
            ),
            (
                "Exists empty value",
                exprs(vec![requirement("spot", "Exists", &[])]),
                true,
            ),
            (
                "Exists absent",
                exprs(vec![requirement("rack", "Exists", &[])]),
                false,
            ),
            (
                "DoesNotExist",
                exprs(vec![requirement("rack", "DoesNotExist", &[])]),
                true,
            ),
            (
                "DoesNotExist present",
                exprs(vec![requirement("zone", "DoesNotExist", &[])]),
                false,
            ),
            (
                "all expressions must hold",
                exprs(vec![
                    requirement("zone", "Exists", &[]),
                    requirement("pool", "In", &["cpu"]),
                ]),
                false,
            ),
            (
                "labels and expressions",
                LabelSelector {
                    match_labels: Some(map(&[("zone", "a")])),
                    match_expressions: Some(vec![requirement("pool", "NotIn", &["cpu"])]),
                },
                true,
            ),
        ];
        for (name, selector, want) in table {
            assert_eq!(
                selector_matches(&selector, &labels, "s").unwrap(),
                want,
                "{name}"
            );
        }
    }

    #[test]
    fn bad_selectors_are_errors() {
        let table = [
            (
                r#"{"matchExpressions": [{"key": "pool", "operator": "Equals", "values": ["a"]}]}"#,
                r#"nodesConfig[0].selector.matchExpressions[0]: operator "Equals" is not one of In, NotIn, Exists, DoesNotExist"#,
            ),
            (
                r#"{"matchExpressions": [{"key": "pool", "operator": "In"}]}"#,
                r#"nodesConfig[0].selector.matchExpressions[0]: operator In on "pool" needs at least one value"#,
            ),
            (
                r#"{"matchExpressions": [{"key": "pool", "operator": "NotIn", "values": []}]}"#,
                r#"nodesConfig[0].selector.matchExpressions[0]: operator NotIn on "pool" needs at least one value"#,
            ),
            (
                r#"{"matchExpressions": [{"key": "pool", "operator": "Exists", "values": ["x"]}]}"#,
                r#"nodesConfig[0].selector.matchExpressions[0]: operator Exists on "pool" takes no values"#,
            ),
            (
                r#"{"matchExpressions": [{"key": "", "operator": "Exists"}]}"#,
                "nodesConfig[0].selector.matchExpressions[0]: the label key is empty",
            ),
            (
                r#"{"matchLabels": {"": "x"}}"#,
                "nodesConfig[0].selector.matchLabels: a label key is empty",
            ),
        ];
        for (selector, want) in table {
            let json = format!(r#"{{"nodesConfig": [{{"selector": {selector}}}]}}"#);
            assert_eq!(err(&json), want, "{selector}");
        }
    }

    #[test]
    fn merging_global_then_matching_entries_field_by_field() {
        let json = r#"{
            "globalConfig": {
                "cpuQosConfig": {"enable": true},
                "evictingConfig": {"evictingCPUHighWatermark": 70, "evictingMemoryHighWatermark": 75}
            },
            "nodesConfig": [
                {"selector": {"matchLabels": {"pool": "gpu"}},
                 "cpuQosConfig": {"enable": false},
                 "evictingConfig": {"evictingCPUHighWatermark": 90}},
                {"selector": {"matchExpressions": [{"key": "zone", "operator": "Exists"}]},
                 "cpuBurstConfig": {"enable": true},
                 "evictingConfig": {"evictingCPULowWatermark": 40}},
                {"selector": {"matchLabels": {"pool": "cpu"}},
                 "evictingConfig": {"evictingCPUHighWatermark": 50}},
                {"cpuBurstConfig": {"enable": false}}
            ]
        }"#;
        let table: &[(Labels, bool, bool, Watermarks, Watermarks)] = &[
            // (labels, cpu qos, cpu burst, cpu, memory)
            (
                &[(COLOCATION_LABEL, "true")],
                true,
                false,
                Watermarks { high: 70, low: 30 },
                Watermarks { high: 75, low: 30 },
            ),
            (
                &[(COLOCATION_LABEL, "true"), ("pool", "gpu")],
                false,
                false,
                Watermarks { high: 90, low: 30 },
                Watermarks { high: 75, low: 30 },
            ),
            (
                &[(COLOCATION_LABEL, "true"), ("pool", "gpu"), ("zone", "a")],
                false,
                true,
                Watermarks { high: 90, low: 40 },
                Watermarks { high: 75, low: 30 },
            ),
            (
                &[(COLOCATION_LABEL, "true"), ("pool", "cpu"), ("zone", "a")],
                true,
                true,
                Watermarks { high: 50, low: 40 },
                Watermarks { high: 75, low: 30 },
            ),
        ];
        for (labels, cpu_qos, cpu_burst, cpu, memory) in table {
            let n = node(json, labels, &[]);
            assert_eq!(n.cpu_qos, *cpu_qos, "{labels:?}");
            assert_eq!(n.cpu_burst, *cpu_burst, "{labels:?}");
            assert_eq!(n.eviction.cpu, *cpu, "{labels:?}");
            assert_eq!(n.eviction.memory, *memory, "{labels:?}");
        }
        let parsed = parse(json).unwrap();
        assert_eq!(
            parsed.warnings,
            ["nodesConfig[3] has no selector and applies to no node"]
        );
    }

    #[test]
    fn oversubscription_types_and_ratio() {
        let with = |section: &str| {
            let json = format!(r#"{{"globalConfig": {{"overSubscriptionConfig": {section}}}}}"#);
            node(&json, OVERSOLD, &[]).oversubscription
        };
        let o = with(r#"{"overSubscriptionTypes": "cpu"}"#);
        assert!(o.enabled && o.cpu && !o.memory);
        let o = with(r#"{"overSubscriptionTypes": " memory , "}"#);
        assert!(!o.cpu && o.memory);
        let o = with(r#"{"overSubscriptionTypes": "memory,cpu", "overSubscriptionRatio": 45}"#);
        assert!(o.cpu && o.memory);
        assert_eq!(o.ratio_percent, 45);
        // The older node annotation wins over the config.
        let json =
            r#"{"globalConfig": {"overSubscriptionConfig": {"overSubscriptionTypes": "cpu"}}}"#;
        let o = node(
            json,
            OVERSOLD,
            &[(OVERSUBSCRIPTION_TYPES_ANNOTATION, "memory")],
        );
        assert!(!o.oversubscription.cpu && o.oversubscription.memory);
    }

    #[test]
    fn annotations_override_watermarks_one_by_one() {
        let json = r#"{"globalConfig": {"evictingConfig": {"evictingMemoryHighWatermark": 70}}}"#;
        let n = node(
            json,
            COLOCATED,
            &[
                (CPU_HIGH_WATERMARK_ANNOTATION, "95"),
                (MEMORY_LOW_WATERMARK_ANNOTATION, " 20 "),
            ],
        );
        assert_eq!(n.eviction.cpu, Watermarks { high: 95, low: 30 });
        assert_eq!(n.eviction.memory, Watermarks { high: 70, low: 20 });
        // The older spelling is read when the new one is absent, and loses when both are there.
        let n = node(
            "{}",
            COLOCATED,
            &[
                (
                    "volcano.sh/oversubscription-evicting-cpu-low-watermark",
                    "10",
                ),
                (
                    "volcano.sh/oversubscription-evicting-memory-low-watermark",
                    "10",
                ),
                (MEMORY_LOW_WATERMARK_ANNOTATION, "25"),
            ],
        );
        assert_eq!(n.eviction.cpu.low, 10);
        assert_eq!(n.eviction.memory.low, 25);
    }

    #[test]
    fn bad_annotations_are_errors() {
        let table = [
            (
                CPU_HIGH_WATERMARK_ANNOTATION,
                "abc",
                r#"node annotation volcano.sh/evicting-cpu-high-watermark is "abc"; it must be a whole percent from 0 to 100"#,
            ),
            (
                MEMORY_HIGH_WATERMARK_ANNOTATION,
                "101",
                r#"node annotation volcano.sh/evicting-memory-high-watermark is "101"; it must be a whole percent from 0 to 100"#,
            ),
            (
                CPU_LOW_WATERMARK_ANNOTATION,
                "-1",
                r#"node annotation volcano.sh/evicting-cpu-low-watermark is "-1"; it must be a whole percent from 0 to 100"#,
            ),
            (
                CPU_LOW_WATERMARK_ANNOTATION,
                "85",
                "cpu low watermark 85% (node annotation volcano.sh/evicting-cpu-low-watermark) must be below the high watermark 80% (default)",
            ),
            (
                OVERSUBSCRIPTION_TYPES_ANNOTATION,
                "cpu,gpu",
                r#"node annotation volcano.sh/oversubscription-types is "cpu,gpu"; "gpu" is not supported, only cpu and memory"#,
            ),
        ];
        for (key, value, want) in table {
            assert_eq!(
                err_on("{}", COLOCATED, &[(key, value)]),
                want,
                "{key}={value}"
            );
        }
    }

    #[test]
    fn bad_values_are_errors_naming_the_key() {
        let table = [
            (
                r#"{"globalConfig": {"evictingConfig": {"evictingCPUHighWatermark": 120}}}"#,
                "globalConfig.evictingConfig.evictingCPUHighWatermark is 120; it must be a whole percent from 0 to 100",
            ),
            (
                r#"{"nodesConfig": [{"selector": {}}, {"selector": {}, "evictingConfig": {"evictingMemoryLowWatermark": -5}}]}"#,
                "nodesConfig[1].evictingConfig.evictingMemoryLowWatermark is -5; it must be a whole percent from 0 to 100",
            ),
            (
                r#"{"globalConfig": {"evictingConfig": {"evictingCPUHighWatermark": 50, "evictingCPULowWatermark": 50}}}"#,
                "cpu low watermark 50% (globalConfig.evictingConfig.evictingCPULowWatermark) must be below the high watermark 50% (globalConfig.evictingConfig.evictingCPUHighWatermark)",
            ),
            (
                r#"{"nodesConfig": [{"selector": {"matchLabels": {"x": "y"}}, "evictingConfig": {"evictingMemoryHighWatermark": 20, "evictingMemoryLowWatermark": 40}}]}"#,
                "memory low watermark 40% (nodesConfig[0].evictingConfig.evictingMemoryLowWatermark) must be below the high watermark 20% (nodesConfig[0].evictingConfig.evictingMemoryHighWatermark)",
            ),
            (
                r#"{"globalConfig": {"overSubscriptionConfig": {"overSubscriptionTypes": "cpu,gpu"}}}"#,
                r#"globalConfig.overSubscriptionConfig.overSubscriptionTypes is "cpu,gpu"; "gpu" is not supported, only cpu and memory"#,
            ),
            (
                r#"{"globalConfig": {"overSubscriptionConfig": {"overSubscriptionTypes": " , "}}}"#,
                r#"globalConfig.overSubscriptionConfig.overSubscriptionTypes is " , "; list cpu and/or memory, or set enable to false"#,
            ),
            (
                r#"{"globalConfig": {"overSubscriptionConfig": {"overSubscriptionRatio": 0}}}"#,
                "globalConfig.overSubscriptionConfig.overSubscriptionRatio is 0; it must be a whole percent from 1 to 100",
            ),
            (
                r#"{"globalConfig": {"evictingConfig": {"monitorInterval": 0}}}"#,
                "globalConfig.evictingConfig.monitorInterval is 0; it must be a whole number from 1 to 3600",
            ),
            (
                r#"{"globalConfig": {"evictingConfig": {"highUsageCountLimit": -1}}}"#,
                "globalConfig.evictingConfig.highUsageCountLimit is -1; it must be a whole number from 1 to 1000",
            ),
            (
                r#"{"globalConfig": {"evictingConfig": {"evictingMemoryPressureThreshold": 100.5}}}"#,
                "globalConfig.evictingConfig.evictingMemoryPressureThreshold is 100.5; it must be a percent from 0 to 100",
            ),
            (
                r#"{"globalConfig": {"evictingConfig": {"evictingCPUHighWatermark": 101, "evictingMemoryHighWatermark": 102}}}"#,
                "2 problems: globalConfig.evictingConfig.evictingCPUHighWatermark is 101; it must be a whole percent from 0 to 100; globalConfig.evictingConfig.evictingMemoryHighWatermark is 102; it must be a whole percent from 0 to 100",
            ),
        ];
        for (json, want) in table {
            assert_eq!(err(json), want, "{json}");
        }
    }

    #[test]
    fn order_is_checked_after_merging() {
        // Each layer is fine alone; together the low watermark ends above the high one.
        let json = r#"{
            "globalConfig": {"evictingConfig": {"evictingCPULowWatermark": 60}},
            "nodesConfig": [{"selector": {"matchLabels": {"pool": "a"}},
                             "evictingConfig": {"evictingCPUHighWatermark": 55}}]
        }"#;
        assert_eq!(
            node(json, COLOCATED, &[]).eviction.cpu,
            Watermarks { high: 80, low: 60 }
        );
        assert_eq!(
            err_on(json, &[("pool", "a")], &[]),
            "cpu low watermark 60% (globalConfig.evictingConfig.evictingCPULowWatermark) must be below the high watermark 55% (nodesConfig[0].evictingConfig.evictingCPUHighWatermark)"
        );
    }

    #[test]
    fn values_in_entries_for_other_nodes_are_still_checked() {
        let json = r#"{"nodesConfig": [{"selector": {"matchLabels": {"pool": "elsewhere"}},
            "evictingConfig": {"evictingCPUHighWatermark": 300}}]}"#;
        assert_eq!(
            err(json),
            "nodesConfig[0].evictingConfig.evictingCPUHighWatermark is 300; it must be a whole percent from 0 to 100"
        );
    }

    #[test]
    fn malformed_json_has_path_line_and_column() {
        let table = [
            (
                "{\"globalConfig\": {\n  \"cpuQosConfig\": {\"enable\": \"yes\"}}}",
                r#"colocation-config is not valid: globalConfig.cpuQosConfig.enable: invalid type: string "yes", expected a boolean at line 2 column 34"#,
            ),
            (
                "{\"globalConfig\": {\n  \"cpuQosConfig\": {\"enable\": true}\n  \"cpuBurstConfig\": {}}}",
                "colocation-config is not valid: globalConfig: expected `,` or `}` at line 3 column 3",
            ),
            (
                r#"{"globalConfig": {"evictingConfig": {"evictingCPUHighWatermark": 80.5}}}"#,
                "colocation-config is not valid: globalConfig.evictingConfig.evictingCPUHighWatermark: invalid type: floating point `80.5`, expected i64 at line 1 column 69",
            ),
            (
                r#"{"nodesConfig": [{"selector": {"matchExpressions": [{"operator": "In"}]}}]}"#,
                // k8s-openapi reads a missing key as empty; the selector check names it.
                "nodesConfig[0].selector.matchExpressions[0]: the label key is empty",
            ),
            (
                "",
                "colocation-config is not valid: EOF while parsing a value at line 1 column 0",
            ),
            (
                "[]",
                "colocation-config is not valid: the document must be a JSON object",
            ),
            (
                "null",
                "colocation-config is not valid: invalid type: null, expected struct VolcanoAgentConfig at line 1 column 4",
            ),
            (
                "{} {}",
                "colocation-config is not valid: trailing characters at line 1 column 4",
            ),
        ];
        for (json, want) in table {
            assert_eq!(err(json), want, "{json}");
        }
    }

    #[test]
    fn unknown_keys_are_warnings() {
        let json = r#"{
            "globalConfig": {"evictingConfig": {"evictingCPUHighWaterMark": 70},
                             "cpuQosConfg": {"enable": true}},
            "nodesConfig": [{"selector": {}, "blkioQosConfig": {}}],
            "extra": 1
        }"#;
        assert_eq!(
            parse(json).unwrap().warnings,
            [
                "extra is not a known key; ignored",
                "globalConfig.cpuQosConfg is not a known key; ignored",
                "globalConfig.evictingConfig.evictingCPUHighWaterMark is not a known key; ignored",
                "nodesConfig[0].blkioQosConfig is a volcano-agent setting fumarole does not implement; ignored",
            ]
        );
    }

    #[test]
    fn round_trips_through_serde_with_volcano_spelling() {
        let config = VolcanoAgentConfig {
            global_config: Some(ColocationConfig {
                evicting_config: Some(EvictingConfig {
                    cpu_high_watermark: Some(70),
                    ..Default::default()
                }),
                over_subscription_config: Some(OverSubscriptionConfig {
                    over_subscription_types: Some("cpu".into()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            nodes_config: vec![],
        };
        let text = serde_json::to_string(&config).unwrap();
        assert_eq!(
            text,
            r#"{"globalConfig":{"overSubscriptionConfig":{"overSubscriptionTypes":"cpu"},"evictingConfig":{"evictingCPUHighWatermark":70}}}"#
        );
        assert_eq!(parse(&text).unwrap().config, config);
    }
}
