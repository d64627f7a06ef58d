//! From a validated document and one node's labels and annotations to the [`NodeConfig`] in
//! force for it: built-in defaults, then `globalConfig`, then every `nodesConfig` entry whose
//! selector matches, field by field, then the node's watermark annotations; the labels
//! `volcano.sh/colocation` and `volcano.sh/oversubscription` switch the features on or off.
//! Every value remembers where it came from, so an error names the key at fault.
//!
//! Start at [`effective`]; [`VolcanoAgentConfig::validate`] runs the same checks on every layer
//! whatever node it is for.

use std::collections::BTreeMap;
use std::time::Duration;

use super::error::ConfigError;
use super::keys::{
    COLOCATION_LABEL, CPU_HIGH_WATERMARK_ANNOTATION, CPU_LOW_WATERMARK_ANNOTATION,
    MEMORY_HIGH_WATERMARK_ANNOTATION, MEMORY_LOW_WATERMARK_ANNOTATION, OVERSUBSCRIPTION_LABEL,
    OVERSUBSCRIPTION_TYPES_ANNOTATION,
};
use super::selector::{check_selector, selector_matches};
use super::settings::{
    DEFAULT_CPU_PRESSURE_THRESHOLD, DEFAULT_HIGH_USAGE_COUNT_LIMIT, DEFAULT_HIGH_WATERMARK,
    DEFAULT_LOW_WATERMARK, DEFAULT_MEMORY_PRESSURE_THRESHOLD, DEFAULT_MONITOR_INTERVAL,
    DEFAULT_OVERSUBSCRIPTION_RATIO, DEFAULT_PRESSURE_COUNT_LIMIT, EvictionSettings, NodeConfig,
    OversubscriptionSettings, Watermarks,
};
use super::wire::{
    ColocationConfig, EvictingConfig, Feature, NodesConfig, OverSubscriptionConfig,
    VolcanoAgentConfig,
};

impl Default for NodeConfig {
    /// A node without labels: co-location off, everything else at its default.
    fn default() -> Self {
        let mut merged = Merged::default();
        merged.finish(false, false)
    }
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
