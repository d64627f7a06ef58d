//! Why a configuration was refused: [`ConfigError`], whose text names the key at fault.

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
    pub(super) fn collect(mut errors: Vec<ConfigError>) -> Result<(), ConfigError> {
        match errors.len() {
            0 => Ok(()),
            1 => Err(errors.remove(0)),
            _ => Err(ConfigError::Several(errors)),
        }
    }
}
