//! The agent's heartbeat: a `coordination.k8s.io/v1` Lease named after the node
//! ([`fumarole_topology::colocation::lease_name`]), renewed four times per lease duration by
//! server-side apply. While it is current, the pressure taint and the batch resources on the
//! Node are this agent's to keep; once it expires (the agent was killed, crashed, or was
//! uninstalled) the scheduler extension's leader removes them (see
//! `scheduler-ext/src/controllers/dead_agents.rs`). The Lease is owned by the Node, so it goes with it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use fumarole_topology::colocation::heartbeat_lease;
use fumarole_topology::every::Every;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};

use crate::watched::Watched;

/// Field manager of the heartbeat's server-side apply.
const FIELD_MANAGER: &str = "fumarole-agent-heartbeat";

/// How often a failing renewal is logged at warning.
const WARN_EVERY: Duration = Duration::from_secs(60);

/// Renews `node_name`'s heartbeat Lease in `namespace` every `duration / 4`, forever. Waits
/// for the Node (its uid is the Lease's owner); a failed renewal is retried at the next tick.
pub async fn run(
    client: Client,
    namespace: String,
    node_name: String,
    node: Arc<Watched<Node>>,
    duration: Duration,
) {
    let leases: Api<Lease> = Api::namespaced(client, &namespace);
    let seconds = i32::try_from(duration.as_secs()).unwrap_or(i32::MAX).max(1);
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let mut tick = tokio::time::interval(duration / 4);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut warn = Every::new(WARN_EVERY);
    let mut renewed_once = false;
    let name = fumarole_topology::colocation::lease_name(&node_name);
    node.ready().await;
    loop {
        tick.tick().await;
        let Some(uid) = node.named(&node_name).and_then(|n| n.metadata.uid.clone()) else {
            tracing::debug!(node = %node_name, "heartbeat: the Node is not there yet");
            continue;
        };
        let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
        let lease = heartbeat_lease(&node_name, &uid, &namespace, seconds, now);
        match leases.patch(&name, &params, &Patch::Apply(&lease)).await {
            Ok(_) if !renewed_once => {
                renewed_once = true;
                tracing::info!(lease = %format!("{namespace}/{name}"), ?duration, "heartbeat Lease renewed");
            }
            Ok(_) => {}
            Err(e) if warn.due(Instant::now()) => {
                tracing::warn!(lease = %format!("{namespace}/{name}"), error = %e, "heartbeat renewal failed; the extension removes this node's taint and batch resources if it stays failing for the lease duration");
            }
            Err(e) => tracing::debug!(error = %e, "heartbeat renewal failed"),
        }
    }
}
