//! How the decider decides: the one typed settings object of the scheduler side.
//!
//! Every entry point builds it the same way, from the flag groups it has
//! ([`crate::cli::settings`]: `serve`, `explain`, `kubectl fumarole explain`, `fumarole-sim`),
//! and hands it whole to [`super::Decider::new`]; nothing reads a decision flag elsewhere.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::core::placement::SuperPods;
use crate::core::score::Scoring;

/// How the decider decides, from flags.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    pub scorer: Scoring,
    /// How long a commit waits for the view to show its pod bound with its annotation.
    pub commit_ttl: Duration,
    /// How long a unit's plan waits for its next pod.
    pub reservation_ttl: Duration,
    /// The schedulers (`spec.schedulerName`) whose pods the verbs accept.
    pub scheduler_names: BTreeSet<String>,
    /// Huawei's super-pod parameters, for `sp-block` jobs.
    pub super_pods: SuperPods,
    /// Huawei's default for Ascend jobs without `sp-block` (`--whole-job-super-pod`), applied
    /// where the live view is built.
    pub whole_job_super_pod: bool,
    /// `--keep-waiting-reservations`: waiting plans are renewed while their pods are retried
    /// ([`crate::core::ledger::Ledger::keeping_waiting_plans`]) instead of lapsing when their
    /// super-node lost the room or their unit cannot start
    /// ([`crate::core::placement::ensure_plan`]).
    pub keep_waiting_reservations: bool,
    /// `--node-pool`: the nodes whose accelerators this scheduler hands out, those labelled
    /// [`crate::core::view::NODE_POOL_LABEL`] with this value (`None`: the nodes without the
    /// label). Two schedulers sharing a cluster each get their own pool.
    pub node_pool: Option<String>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            scorer: Scoring::default(),
            commit_ttl: Duration::from_secs(120),
            reservation_ttl: Duration::from_secs(300),
            scheduler_names: ["default-scheduler", "volcano"]
                .into_iter()
                .map(String::from)
                .collect(),
            super_pods: SuperPods::default(),
            whole_job_super_pod: false,
            keep_waiting_reservations: false,
            node_pool: None,
        }
    }
}
