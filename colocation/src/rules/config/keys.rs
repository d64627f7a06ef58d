//! The names fumarole shares with volcano-agent: the ConfigMap and its key, and the node labels
//! and annotations that switch co-location on or override a setting for one node.

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
