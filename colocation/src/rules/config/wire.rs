//! The `colocation-config` document as volcano-agent spells it (JSON, camelCase keys), read with
//! serde and written back the same way. Every field is optional: a field left out keeps the value
//! from the layer below it ([`super::merge`]). Nothing here checks values; [`super::parse()`]
//! does.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde::{Deserialize, Deserializer, Serialize};

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
