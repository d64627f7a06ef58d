//! The kube-scheduler plugin's side of a `KubeSchedulerConfiguration`: the profiles that enable
//! it (their `schedulerName`s are the pods whose devices it chooses) and its typed
//! `pluginConfig` arguments (`FumaroleArgs`). An argument this type does not name is an error
//! at start, never dropped: kube-scheduler keeps an out-of-tree plugin's arguments as raw JSON,
//! so this is where they are checked.
//!
//! The score's weight is not an argument: kube-scheduler weighs every score plugin by the
//! profile's `plugins.score.enabled[].weight`, and the plugin scores on kube-scheduler's own
//! scale, 0..100.

use anyhow::{Context, Result, bail};
use scheduler_ext::cli::{self, CommitArgs, ScoringArgs, SuperPodArgs};
use scheduler_ext::decider::Settings;
use serde::Deserialize;

use crate::volcano_conf::Translated;

/// The plugin's name in `KubeSchedulerConfiguration` profiles.
pub const PLUGIN_NAME: &str = "Fumarole";

/// What the Go plugin hands over from kube-scheduler's configuration.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KubeSchedulerConf {
    /// The `schedulerName` of every profile that enables the plugin.
    #[serde(default)]
    pub scheduler_names: Vec<String>,
    /// The plugin's `pluginConfig[].args`, as written (`null` when the profile gives none).
    #[serde(default)]
    pub args: Option<serde_json::Value>,
}

/// `pluginConfig[].args` for the plugin (`name: Fumarole`): the extender's scoring and
/// super-pod flags under their configuration names.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FumaroleArgs {
    /// kube-scheduler writes `kind` / `apiVersion` where the args carry them.
    #[serde(default)]
    pub kind: Option<String>,
    #[serde(default)]
    pub api_version: Option<String>,
    /// Weight of the interconnect loss in the score (the extender's `--loss-weight`).
    #[serde(default)]
    pub loss_weight: Option<f64>,
    /// Weight of staying inside one super-node (`--super-node-weight`).
    #[serde(default)]
    pub super_node_weight: Option<f64>,
    /// Huawei's super-pod size for `sp-block` jobs (`--super-pod-size`).
    #[serde(default)]
    pub super_pod_size: Option<u32>,
    /// Nodes kept free in each super-pod (`--reserve-nodes`).
    #[serde(default)]
    pub reserve_nodes: Option<u32>,
    /// An Ascend job without `sp-block` is one logical super-pod (`--whole-job-super-pod`).
    #[serde(default)]
    pub whole_job_super_pod: Option<bool>,
    /// The nodes whose accelerators this scheduler hands out: those labelled
    /// `fumarole.dev/node-pool` with this value (`--node-pool`; unset: the nodes without it).
    #[serde(default)]
    pub node_pool: Option<String>,
}

impl KubeSchedulerConf {
    /// The decider's settings, or a clear error naming the argument that cannot be read.
    pub fn translate(&self) -> Result<Translated> {
        let args: FumaroleArgs = match &self.args {
            None | Some(serde_json::Value::Null) => FumaroleArgs::default(),
            Some(v) => serde_json::from_value(v.clone())
                .with_context(|| format!("pluginConfig args of {PLUGIN_NAME}"))?,
        };
        for (name, w) in [
            ("lossWeight", args.loss_weight),
            ("superNodeWeight", args.super_node_weight),
        ] {
            if let Some(w) = w
                && !(w.is_finite() && w >= 0.0)
            {
                bail!("{PLUGIN_NAME} argument {name} must be a number >= 0, got {w}");
            }
        }
        let defaults = Settings::default();
        let scoring = ScoringArgs {
            weight: 1.0,
            loss_weight: args.loss_weight.unwrap_or(defaults.scorer.loss_weight),
            super_node_weight: args
                .super_node_weight
                .unwrap_or(defaults.scorer.super_node_weight),
        };
        let super_pods = SuperPodArgs {
            super_pod_size: args.super_pod_size,
            reserve_nodes: args.reserve_nodes.unwrap_or(0),
            whole_job_super_pod: args.whole_job_super_pod.unwrap_or(false),
        };
        let commit = CommitArgs {
            scheduler_names: if self.scheduler_names.is_empty() {
                vec!["default-scheduler".into()]
            } else {
                self.scheduler_names.clone()
            },
            commit_ttl: defaults.commit_ttl,
            node_pool: args.node_pool.clone(),
        };
        let settings = cli::settings(&[&scoring, &super_pods, &commit])
            .with_context(|| format!("{PLUGIN_NAME}'s arguments"))?;
        Ok(Translated {
            settings,
            notes: Vec::new(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conf(json: &str) -> KubeSchedulerConf {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn typed_args_set_the_scoring_and_super_pods() {
        let t = conf(
            r#"{"schedulerNames":["gpu-scheduler"],"args":{"kind":"FumaroleArgs",
                "apiVersion":"kubescheduler.config.k8s.io/v1","lossWeight":0.5,
                "superPodSize":8,"reserveNodes":1}}"#,
        )
        .translate()
        .unwrap();
        assert_eq!(t.settings.scorer.weight, 1.0);
        assert_eq!(t.settings.scorer.loss_weight, 0.5);
        assert_eq!(t.settings.super_pods.size, Some(8));
        assert_eq!(t.settings.super_pods.reserve_nodes, 1);
        assert!(t.settings.scheduler_names.contains("gpu-scheduler"));
        assert!(!t.settings.scheduler_names.contains("default-scheduler"));
    }

    #[test]
    fn the_node_pool_is_a_typed_argument() {
        let t = conf(r#"{"args":{"nodePool":"kube"}}"#).translate().unwrap();
        assert_eq!(t.settings.node_pool.as_deref(), Some("kube"));
        let e = conf(r#"{"args":{"nodePool":"no/slash"}}"#)
            .translate()
            .unwrap_err();
        assert!(format!("{e:#}").contains("--node-pool"), "{e:#}");
    }

    #[test]
    fn no_args_take_the_extenders_defaults_for_the_default_scheduler() {
        let t = conf(r#"{"args":null}"#).translate().unwrap();
        let d = Settings::default();
        assert_eq!(t.settings.scorer.loss_weight, d.scorer.loss_weight);
        assert_eq!(
            t.settings.scheduler_names.iter().collect::<Vec<_>>(),
            ["default-scheduler"]
        );
    }

    #[test]
    fn an_unknown_or_malformed_argument_is_an_error_that_names_it() {
        let e = conf(r#"{"args":{"lossWieght":0.5}}"#)
            .translate()
            .unwrap_err();
        assert!(format!("{e:#}").contains("lossWieght"), "{e:#}");
        let e = conf(r#"{"args":{"superPodSize":"eight"}}"#)
            .translate()
            .unwrap_err();
        assert!(format!("{e:#}").contains("superPodSize") || format!("{e:#}").contains("eight"));
        let e = conf(r#"{"args":{"lossWeight":-1}}"#)
            .translate()
            .unwrap_err();
        assert!(format!("{e:#}").contains("lossWeight"), "{e:#}");
    }
}
