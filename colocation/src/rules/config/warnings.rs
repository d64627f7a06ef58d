//! Keys in a `colocation-config` document that fumarole does not act on: volcano-agent sections
//! it does not implement, and unknown keys (most likely typos). They are warnings, not refusals,
//! because volcano-agent ignores them too. Start at `ignored_keys`, which [`super::parse()`]
//! calls.

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

pub(super) fn ignored_keys(doc: &serde_json::Value, out: &mut Vec<String>) {
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
