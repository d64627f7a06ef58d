//! `nodesConfig[].selector`: a Kubernetes label selector, checked and evaluated against the
//! node's labels as `metav1.LabelSelectorAsSelector` does. Start at [`selector_matches`].

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};

use super::error::ConfigError;

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

pub(super) fn check_selector(selector: &LabelSelector, key: &str) -> Result<(), ConfigError> {
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
