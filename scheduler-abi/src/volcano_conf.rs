//! What users write in `volcano-scheduler-configmap`, read as the seeds write it: MetaX's
//! `gpu-aware` (`weight`, `loss.weight`) and `gpu-podaffinity`, Huawei's NPU plugin (listed
//! under a versioned name such as `volcano-npu_v7.3.0_linux-x86_64`) with its top-level
//! `init-params` configuration, whose values are strings. The result is the decider's
//! [`Settings`], plus one note per argument fumarole does not implement, which the plugin logs
//! once: nothing is dropped silently.

use std::collections::BTreeMap;

use anyhow::{Context, Result, bail};
use scheduler_ext::cli::{self, CommitArgs, ScoringArgs, SuperPodArgs};
use scheduler_ext::decider::Settings;
use serde::Deserialize;
use serde_json::Value;

/// MetaX's scoring plugin.
pub const GPU_AWARE: &str = "gpu-aware";
/// MetaX's plugin that keeps a gpu-group-size unit in one super-node.
pub const GPU_PODAFFINITY: &str = "gpu-podaffinity";
/// Huawei's NPU plugin is listed under `volcano-npu_<version>_<os>-<arch>`.
pub const NPU_PREFIX: &str = "volcano-npu";
/// Huawei's top-level configuration entry for its NPU plugin.
pub const INIT_PARAMS: &str = "init-params";
/// fumarole's own argument, read under any of its plugins: the node pool this scheduler hands
/// accelerators out in (`--node-pool`).
pub const NODE_POOL_ARG: &str = "fumarole.node-pool";

/// A `tiers[].plugins[]` or `configurations[]` entry: a name and its arguments as written.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct Entry {
    pub name: String,
    #[serde(default, deserialize_with = "null_as_empty")]
    pub arguments: BTreeMap<String, Value>,
}

/// The plugin's side of the scheduler's configuration, as the Go plugin hands it over.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VolcanoConf {
    /// The fumarole plugins the tiers list (any of [`GPU_AWARE`], [`GPU_PODAFFINITY`], a
    /// [`NPU_PREFIX`] name), with their arguments.
    #[serde(default, deserialize_with = "null_as_empty")]
    pub plugins: Vec<Entry>,
    /// The top-level `configurations` list (Huawei's `init-params` is read from it).
    #[serde(default, deserialize_with = "null_as_empty")]
    pub configurations: Vec<Entry>,
    /// The scheduler's `--scheduler-name`s: the pods whose devices the plugin chooses.
    #[serde(default, deserialize_with = "null_as_empty")]
    pub scheduler_names: Vec<String>,
}

/// The decider's settings for a configuration, and what in it fumarole does not implement.
#[derive(Debug)]
pub struct Translated {
    pub settings: Settings,
    /// One line per argument not implemented, naming the plugin and the argument.
    pub notes: Vec<String>,
}

/// Huawei `init-params` keys fumarole does not implement, with what they do in Huawei's plugin.
const NPU_NOT_IMPLEMENTED: &[(&str, &str)] = &[
    (
        "grace-over-time",
        "waiting before moving a job off a faulty NPU",
    ),
    ("presetVirtualDevice", "static vNPU"),
    ("nslb-version", "network-side load balancing"),
    ("shared-tor-num", "jobs per shared top-of-rack switch"),
    ("useClusterInfoManager", "cluster-level device ConfigMaps"),
];

impl VolcanoConf {
    /// The settings, or a clear error for a value that cannot be read (a weight that is no
    /// number, a `super-pod-size` that is no whole number).
    pub fn translate(&self) -> Result<Translated> {
        let mut notes = Vec::new();
        let mut scoring = ScoringArgs {
            weight: 1.0,
            loss_weight: 1.0,
            super_node_weight: 0.0,
        };
        let mut super_pods = SuperPodArgs {
            super_pod_size: None,
            reserve_nodes: 0,
            whole_job_super_pod: false,
        };
        let mut npu = false;
        let mut node_pool = None;
        for plugin in &self.plugins {
            if let Some(value) = plugin.arguments.get(NODE_POOL_ARG) {
                let Value::String(pool) = value else {
                    bail!(
                        "{} argument {NODE_POOL_ARG:?} must be a string, got {value}",
                        plugin.name
                    );
                };
                if node_pool.as_ref().is_some_and(|p| p != pool) {
                    bail!("{NODE_POOL_ARG} is given twice, with two values");
                }
                node_pool = Some(pool.clone());
            }
            let mut arguments = plugin.arguments.clone();
            arguments.remove(NODE_POOL_ARG);
            match plugin.name.as_str() {
                GPU_AWARE => {
                    for (key, value) in &arguments {
                        match key.as_str() {
                            "weight" => scoring.weight = number(GPU_AWARE, key, value)?,
                            "loss.weight" => scoring.loss_weight = number(GPU_AWARE, key, value)?,
                            _ => notes.push(not_implemented(GPU_AWARE, key)),
                        }
                    }
                }
                GPU_PODAFFINITY => notes.extend(
                    arguments
                        .keys()
                        .map(|key| not_implemented(GPU_PODAFFINITY, key)),
                ),
                name if name.starts_with(NPU_PREFIX) => {
                    npu = true;
                    notes.extend(arguments.keys().map(|key| not_implemented(name, key)));
                }
                name => bail!("{name:?} is not a fumarole plugin"),
            }
        }
        for conf in &self.configurations {
            if conf.name != INIT_PARAMS {
                continue;
            }
            if !npu {
                notes.push(format!(
                    "configuration {INIT_PARAMS} is read only with Huawei's NPU plugin ({NPU_PREFIX}_*) in the tiers; ignored"
                ));
                continue;
            }
            for (key, value) in &conf.arguments {
                match key.as_str() {
                    "super-pod-size" => {
                        super_pods.super_pod_size = Some(whole(INIT_PARAMS, key, value)?);
                        // Huawei's plugin treats a multi-pod Ascend job without sp-block as one
                        // logical super-pod in super-pod mode.
                        super_pods.whole_job_super_pod = true;
                    }
                    "reserve-nodes" => super_pods.reserve_nodes = whole(INIT_PARAMS, key, value)?,
                    _ => match NPU_NOT_IMPLEMENTED.iter().find(|(k, _)| k == key) {
                        Some((_, what)) => notes.push(format!(
                            "{INIT_PARAMS} argument {key:?} ({what}) is not implemented by fumarole; ignored"
                        )),
                        None => notes.push(not_implemented(INIT_PARAMS, key)),
                    },
                }
            }
        }
        let commit = CommitArgs {
            scheduler_names: if self.scheduler_names.is_empty() {
                vec!["volcano".into()]
            } else {
                self.scheduler_names.clone()
            },
            commit_ttl: Settings::default().commit_ttl,
            node_pool,
        };
        let settings = cli::settings(&[&scoring, &super_pods, &commit])
            .context("the fumarole plugins' arguments")?;
        Ok(Translated { settings, notes })
    }
}

/// Go encodes an empty list or map as `null`.
fn null_as_empty<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

fn not_implemented(plugin: &str, key: &str) -> String {
    format!("{plugin} argument {key:?} is not implemented by fumarole; ignored")
}

/// A number as YAML or JSON write it, or a string holding one (Huawei writes every value as
/// a string).
fn number(plugin: &str, key: &str, value: &Value) -> Result<f64> {
    let parsed = match value {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    };
    match parsed {
        Some(n) if n.is_finite() && n >= 0.0 => Ok(n),
        _ => bail!("{plugin} argument {key:?} must be a number >= 0, got {value}"),
    }
}

/// A whole number >= 0, written as a number or a string.
fn whole(plugin: &str, key: &str, value: &Value) -> Result<u32> {
    let parsed = match value {
        Value::Number(n) => n.as_u64().and_then(|n| u32::try_from(n).ok()),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    };
    parsed.with_context(|| {
        format!("{plugin} argument {key:?} must be a whole number >= 0, got {value}")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conf(json: &str) -> VolcanoConf {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn the_seeds_gpu_aware_arguments_set_the_scoring() {
        let t = conf(r#"{"plugins":[{"name":"gpu-aware","arguments":{"weight":1,"loss.weight":0.5}},{"name":"gpu-podaffinity"}]}"#)
            .translate()
            .unwrap();
        assert_eq!(t.settings.scorer.weight, 1.0);
        assert_eq!(t.settings.scorer.loss_weight, 0.5);
        assert!(t.notes.is_empty(), "{:?}", t.notes);
        assert!(t.settings.scheduler_names.contains("volcano"));
    }

    #[test]
    fn huaweis_init_params_are_strings_and_the_unimplemented_ones_are_named() {
        let t = conf(
            r#"{"plugins":[{"name":"volcano-npu_v7.3.0_linux-x86_64"}],
                "configurations":[{"name":"init-params","arguments":{"grace-over-time":"900","presetVirtualDevice":"true","nslb-version":"1.0","shared-tor-num":"2","useClusterInfoManager":"false","super-pod-size":"48","reserve-nodes":"2"}}]}"#,
        )
        .translate()
        .unwrap();
        assert_eq!(t.settings.super_pods.size, Some(48));
        assert_eq!(t.settings.super_pods.reserve_nodes, 2);
        assert!(t.settings.whole_job_super_pod);
        assert_eq!(t.notes.len(), 5, "{:?}", t.notes);
        assert!(t.notes.iter().any(|n| n.contains("grace-over-time")));
    }

    #[test]
    fn the_node_pool_is_read_under_any_fumarole_plugin() {
        let t = conf(r#"{"plugins":[{"name":"gpu-aware","arguments":{"weight":1}},{"name":"gpu-podaffinity","arguments":{"fumarole.node-pool":"volcano"}}]}"#)
            .translate()
            .unwrap();
        assert_eq!(t.settings.node_pool.as_deref(), Some("volcano"));
        assert!(t.notes.is_empty(), "{:?}", t.notes);
        let t = conf(r#"{"plugins":[{"name":"gpu-aware"}]}"#)
            .translate()
            .unwrap();
        assert_eq!(t.settings.node_pool, None);
        for bad in [
            r#"{"plugins":[{"name":"gpu-aware","arguments":{"fumarole.node-pool":7}}]}"#,
            r#"{"plugins":[{"name":"gpu-aware","arguments":{"fumarole.node-pool":"a b"}}]}"#,
            r#"{"plugins":[{"name":"gpu-aware","arguments":{"fumarole.node-pool":"a"}},{"name":"gpu-podaffinity","arguments":{"fumarole.node-pool":"b"}}]}"#,
        ] {
            let e = conf(bad).translate().unwrap_err();
            assert!(format!("{e:#}").contains("node-pool"), "{bad}: {e:#}");
        }
    }

    #[test]
    fn gos_null_lists_read_as_empty() {
        let t = conf(r#"{"plugins":[{"name":"gpu-aware","arguments":null}],"configurations":null,"schedulerNames":null}"#)
            .translate()
            .unwrap();
        assert!(t.notes.is_empty());
    }

    #[test]
    fn bad_values_are_clear_errors() {
        let e = conf(r#"{"plugins":[{"name":"gpu-aware","arguments":{"loss.weight":"lots"}}]}"#)
            .translate()
            .unwrap_err();
        assert!(format!("{e:#}").contains("loss.weight"), "{e:#}");
        let e = conf(
            r#"{"plugins":[{"name":"volcano-npu_v7"}],"configurations":[{"name":"init-params","arguments":{"super-pod-size":"2","reserve-nodes":"2"}}]}"#,
        )
        .translate()
        .unwrap_err();
        assert!(format!("{e:#}").contains("reserve-nodes"), "{e:#}");
        let e = conf(r#"{"plugins":[{"name":"binpack"}]}"#)
            .translate()
            .unwrap_err();
        assert!(format!("{e:#}").contains("binpack"), "{e:#}");
    }

    #[test]
    fn an_unknown_argument_is_a_note_not_an_error() {
        let t = conf(r#"{"plugins":[{"name":"gpu-aware","arguments":{"weight":"2","topology.mode":"strict"}}]}"#)
            .translate()
            .unwrap();
        assert_eq!(t.settings.scorer.weight, 2.0);
        assert_eq!(t.notes, vec![not_implemented(GPU_AWARE, "topology.mode")]);
    }
}
