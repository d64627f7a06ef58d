//! The co-location configuration: ConfigMap `volcano-agent-configuration`, key
//! `colocation-config`, in volcano-agent's JSON spelling, and what it means for one node. One job
//! per file:
//!
//! - [`wire`]: the document as volcano-agent spells it ([`VolcanoAgentConfig`]);
//! - [`mod@parse`]: the text to a validated document, with [`warnings`] for keys fumarole ignores;
//! - [`selector`]: a `nodesConfig` entry's label selector against the node's labels;
//! - [`merge`]: defaults, layers, node labels and annotations to the [`NodeConfig`] in force;
//! - [`settings`]: that resolved [`NodeConfig`], its parts and the built-in defaults;
//! - [`resolve`]: the configuration in force across changes, keeping the last good one
//!   ([`Resolver`]);
//! - [`keys`]: the ConfigMap, label and annotation names; [`error`]: why a configuration was
//!   refused.
//!
//! Start at [`parse()`] (the ConfigMap text to a validated [`VolcanoAgentConfig`], with warnings
//! for keys we ignore) and [`effective`] (that config plus the node's labels and annotations to a
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
//!   in `evictingConfig` tune the PSI signal ([`crate::rules::evict`]), which volcano-agent lacks;
//! - invalid values are errors naming the key (volcano-agent skips a broken selector silently),
//!   and low watermarks must be strictly below high ones wherever they come from.

pub mod error;
pub mod keys;
pub mod merge;
pub mod parse;
pub mod resolve;
pub mod selector;
pub mod settings;
pub mod warnings;
pub mod wire;

pub use error::ConfigError;
pub use keys::{
    COLOCATION_LABEL, CONFIG_KEY, CONFIGMAP_NAME, CPU_HIGH_WATERMARK_ANNOTATION,
    CPU_LOW_WATERMARK_ANNOTATION, MEMORY_HIGH_WATERMARK_ANNOTATION,
    MEMORY_LOW_WATERMARK_ANNOTATION, OVERSUBSCRIPTION_LABEL, OVERSUBSCRIPTION_TYPES_ANNOTATION,
};
pub use merge::effective;
pub use parse::{Parsed, parse};
pub use resolve::{ConfigState, Document, Fault, Problem, Resolver};
pub use selector::selector_matches;
pub use settings::{EvictionSettings, Features, NodeConfig, OversubscriptionSettings, Watermarks};
pub use wire::{
    ColocationConfig, EvictingConfig, Feature, NodesConfig, OverSubscriptionConfig,
    VolcanoAgentConfig,
};

#[cfg(test)]
mod tests;
