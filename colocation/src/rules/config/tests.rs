#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};

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
    let json = r#"{"globalConfig": {"overSubscriptionConfig": {"overSubscriptionTypes": "cpu"}}}"#;
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

#[test]
fn the_documented_example_is_valid() {
    let doc = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/colocation.md");
    let readme = std::fs::read_to_string(doc).unwrap();
    let section = &readme[readme.find("## Configuration").unwrap()..];
    let start = section.find("```json\n").unwrap() + "```json\n".len();
    let json = &section[start..start + section[start..].find("```").unwrap()];
    let parsed = parse(json).unwrap();
    assert!(parsed.warnings.is_empty(), "{:?}", parsed.warnings);
    let node = effective(
        &parsed.config,
        &BTreeMap::from([
            ("pool".to_string(), "gpu".to_string()),
            (COLOCATION_LABEL.to_string(), "true".to_string()),
        ]),
        &BTreeMap::new(),
    )
    .unwrap();
    assert!(node.cpu_qos && node.cpu_burst && !node.memory_qos);
    assert_eq!(node.eviction.cpu.high, 90);
}
