//! Reading the `colocation-config` text: JSON to a validated [`VolcanoAgentConfig`], with
//! warnings for what fumarole ignores ([`super::warnings`]). Start at [`parse`].

use super::error::ConfigError;
use super::warnings::ignored_keys;
use super::wire::VolcanoAgentConfig;

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
