//! Command-line plumbing shared by the binaries that decide through the core
//! (`fumarole-scheduler-ext`, `fumarole-sim`, `kubectl-fumarole`): the decision flags, in
//! groups ([`ScoringArgs`], [`SuperPodArgs`], [`ReservationArgs`], [`CommitArgs`]) that each
//! fill their part of the decider's [`Settings`] through [`settings`], the one way every entry
//! point builds them; and the `main` frame (logging to stderr, `error: ...` and exit code 1 on
//! failure).

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Result, bail};

use crate::core::placement::SuperPods;
use crate::core::score::Scoring;
use crate::decider::Settings;

/// A group of flags that fills part of the decider's [`Settings`].
pub trait SettingsFlags {
    /// Sets what these flags say in `settings`, or says why they are out of range.
    fn apply(&self, settings: &mut Settings) -> Result<()>;
}

/// The decider's settings: the defaults, then each group of flags a command has, in order.
/// Every entry point (serve, explain, kubectl, the simulator) builds its settings here, once.
pub fn settings(groups: &[&dyn SettingsFlags]) -> Result<Settings> {
    let mut settings = Settings::default();
    for group in groups {
        group.apply(&mut settings)?;
    }
    Ok(settings)
}

/// Scoring arguments (Volcano's `weight` and `loss.weight`, the super-node weight).
#[derive(clap::Args, Clone, Copy, Debug)]
pub struct ScoringArgs {
    /// Multiplies the 0..100 (Volcano) score.
    #[arg(long, default_value_t = 1.0)]
    pub weight: f64,
    /// How much the loss counts against the quality (Volcano's `loss.weight`).
    #[arg(long = "loss-weight", default_value_t = 1.0)]
    pub loss_weight: f64,
    /// How much the share of a node's super-node in use adds to the 0..1 score (small jobs
    /// lean to partly used super-nodes); 0 leaves it out.
    #[arg(long = "super-node-weight", default_value_t = 0.0)]
    pub super_node_weight: f64,
}

impl ScoringArgs {
    /// The scoring settings, or why the flags are out of range.
    pub fn scoring(self) -> Result<Scoring> {
        if !(self.weight.is_finite() && self.weight >= 0.0) {
            bail!("--weight must be a number >= 0, got {}", self.weight);
        }
        if !(self.loss_weight.is_finite() && self.loss_weight >= 0.0) {
            bail!(
                "--loss-weight must be a number >= 0, got {}",
                self.loss_weight
            );
        }
        if !(self.super_node_weight.is_finite() && self.super_node_weight >= 0.0) {
            bail!(
                "--super-node-weight must be a number >= 0, got {}",
                self.super_node_weight
            );
        }
        Ok(Scoring {
            weight: self.weight,
            loss_weight: self.loss_weight,
            super_node_weight: self.super_node_weight,
        })
    }
}

impl SettingsFlags for ScoringArgs {
    fn apply(&self, settings: &mut Settings) -> Result<()> {
        settings.scorer = self.scoring()?;
        Ok(())
    }
}

/// Huawei's super-pod parameters for `sp-block` jobs (its Volcano plugin's `init-params`).
#[derive(clap::Args, Clone, Copy, Debug)]
pub struct SuperPodArgs {
    /// Nodes per physical super-pod (Huawei's `super-pod-size`): `sp-block` jobs needing more
    /// nodes than this are refused. Unset: not checked.
    #[arg(long)]
    pub super_pod_size: Option<u32>,
    /// Whole nodes to keep free in each super-node when placing `sp-block` jobs (Huawei's
    /// `reserve-nodes`); kept while another super-node can take the block.
    #[arg(long, default_value_t = 0)]
    pub reserve_nodes: u32,
    /// Huawei's default for super-pod jobs without `sp-block`: a job of more than one pod
    /// asking for an Ascend resource, with no group annotation at all, is one logical
    /// super-pod (`sp-block` = its NPUs). Needs --super-pod-size.
    #[arg(long)]
    pub whole_job_super_pod: bool,
}

impl SuperPodArgs {
    /// The parameters, or why they do not go together.
    pub fn super_pods(self) -> Result<SuperPods> {
        if let Some(size) = self.super_pod_size
            && (size == 0 || self.reserve_nodes >= size)
        {
            bail!(
                "--super-pod-size {size} must be positive and larger than --reserve-nodes {}",
                self.reserve_nodes
            );
        }
        Ok(SuperPods {
            size: self.super_pod_size,
            reserve_nodes: self.reserve_nodes,
        })
    }

    /// `--whole-job-super-pod`, or why it cannot be used: Huawei applies its default in
    /// super-pod mode only.
    pub fn whole_job(self) -> Result<bool> {
        if self.whole_job_super_pod && self.super_pod_size.is_none() {
            bail!("--whole-job-super-pod needs --super-pod-size (Huawei's super-pod mode)");
        }
        Ok(self.whole_job_super_pod)
    }
}

impl SettingsFlags for SuperPodArgs {
    fn apply(&self, settings: &mut Settings) -> Result<()> {
        settings.super_pods = self.super_pods()?;
        settings.whole_job_super_pod = self.whole_job()?;
        Ok(())
    }
}

/// How long a unit's super-node reservation lives, and whether it is renewed while its unit
/// waits (the service and the simulator).
#[derive(clap::Args, Clone, Copy, Debug)]
pub struct ReservationArgs {
    /// How long a gpu-group-size unit's super-node reservation waits for the unit's next pod
    /// (simulated time in fumarole-sim).
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    pub reservation_ttl: Duration,
    /// Keep a waiting unit's super-node reservation while its pods are retried, instead of
    /// letting it lapse once that super-node lost the room or the unit cannot start (which
    /// queues less, docs/placement.md; under Volcano without `allocateFunc` they never lapse).
    #[arg(long)]
    pub keep_waiting_reservations: bool,
}

impl SettingsFlags for ReservationArgs {
    fn apply(&self, settings: &mut Settings) -> Result<()> {
        settings.reservation_ttl = self.reservation_ttl;
        settings.keep_waiting_reservations = self.keep_waiting_reservations;
        Ok(())
    }
}

/// Whose pods the verbs accept and how long a commit waits for its pod to show up bound (the
/// service only).
#[derive(clap::Args, Clone, Debug)]
pub struct CommitArgs {
    /// The schedulers (`spec.schedulerName`) whose pods the verbs accept; comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "default-scheduler,volcano"
    )]
    pub scheduler_names: Vec<String>,
    /// How long devices committed to a pod are held until the pod shows up bound with them.
    #[arg(long, default_value = "2m", value_parser = humantime::parse_duration)]
    pub commit_ttl: Duration,
    /// Hand out the accelerators of the nodes labelled `fumarole.dev/node-pool=<POOL>` only;
    /// without it, those of the nodes without the label. Give each scheduler that places
    /// accelerator pods its own pool: their ledgers are separate.
    #[arg(long, value_name = "POOL")]
    pub node_pool: Option<String>,
}

impl SettingsFlags for CommitArgs {
    fn apply(&self, settings: &mut Settings) -> Result<()> {
        settings.scheduler_names = self
            .scheduler_names
            .iter()
            .filter(|s| !s.is_empty())
            .cloned()
            .collect();
        settings.commit_ttl = self.commit_ttl;
        settings.node_pool = match self.node_pool.as_deref() {
            None => None,
            Some(p) if valid_label_value(p) => Some(p.to_string()),
            Some(p) => bail!(
                "--node-pool {p:?} is no label value (at most 63 of A-Z a-z 0-9 - _ ., starting and ending alphanumeric)"
            ),
        };
        Ok(())
    }
}

/// Logs to stderr (`RUST_LOG`, default `info`), runs `command`, and turns its error into
/// `error: ...` on stderr and exit code 1.
pub fn main_with(command: impl FnOnce() -> Result<()>) -> ExitCode {
    main_logging("info", command)
}

/// [`main_with`] with another default log filter (`warn` for the kubectl plugin, whose stderr
/// a person reads beside its output).
pub fn main_logging(default_filter: &str, command: impl FnOnce() -> Result<()>) -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter)),
        )
        .init();
    match command() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// True for a non-empty Kubernetes label value: at most 63 characters of `[A-Za-z0-9_.-]`,
/// starting and ending with an alphanumeric one.
fn valid_label_value(v: &str) -> bool {
    let alnum = |c: char| c.is_ascii_alphanumeric();
    (1..=63).contains(&v.len())
        && v.chars().all(|c| alnum(c) || matches!(c, '-' | '_' | '.'))
        && v.starts_with(alnum)
        && v.ends_with(alnum)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[test]
    fn super_pod_flags_must_go_together() {
        let args = |size, reserve| SuperPodArgs {
            super_pod_size: size,
            reserve_nodes: reserve,
            whole_job_super_pod: false,
        };
        assert_eq!(
            args(Some(48), 2).super_pods().unwrap(),
            SuperPods {
                size: Some(48),
                reserve_nodes: 2
            }
        );
        assert_eq!(args(None, 3).super_pods().unwrap().reserve_nodes, 3);
        let e = args(Some(2), 2).super_pods().unwrap_err().to_string();
        assert_eq!(
            e,
            "--super-pod-size 2 must be positive and larger than --reserve-nodes 2"
        );
        assert!(args(Some(0), 0).super_pods().is_err());
        let whole = |size| SuperPodArgs {
            whole_job_super_pod: true,
            ..args(size, 0)
        };
        assert!(whole(Some(48)).whole_job().unwrap());
        assert_eq!(
            whole(None).whole_job().unwrap_err().to_string(),
            "--whole-job-super-pod needs --super-pod-size (Huawei's super-pod mode)"
        );
        assert!(!args(None, 0).whole_job().unwrap());
    }

    #[test]
    fn a_node_pool_must_be_a_label_value() {
        let pool = |p: &str| {
            let args = CommitArgs {
                scheduler_names: vec!["volcano".into()],
                commit_ttl: Duration::from_secs(1),
                node_pool: Some(p.into()),
            };
            let mut settings = Settings::default();
            args.apply(&mut settings).map(|()| settings.node_pool)
        };
        assert_eq!(pool("volcano-a.1").unwrap().as_deref(), Some("volcano-a.1"));
        for bad in ["", "-a", "a-", "a b", "a/b", &"x".repeat(64)] {
            let e = pool(bad).unwrap_err().to_string();
            assert!(e.contains("no label value"), "{bad:?}: {e}");
        }
    }
}
