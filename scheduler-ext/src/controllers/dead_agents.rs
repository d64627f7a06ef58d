//! What a dead agent leaves behind: its node's `volcano.sh/offline-job-evicting` taint and
//! `kubernetes.io/batch-*` resources, removed once its heartbeat Lease has expired.
//!
//! Each co-location agent renews a Lease (`fumarole-agent-<node>`, labelled
//! [`HEARTBEAT_LABEL`]; see `colocation/src/tasks/heartbeat.rs`). This task watches those
//! Leases; a Lease whose `resourceVersion` has not changed for its `leaseDurationSeconds` by
//! *this* process's clock (client-go's rule for leader Leases, so clock offsets between nodes
//! do not matter) belongs to a dead agent, and the leader removes the taint and the batch
//! resources from that Node, once per expiry, with a Warning Event on the Node saying why.
//! The agent, when it comes back, renews its Lease and writes what its rules say again.
//!
//! A replica that starts (or takes over) counts every Lease as renewed at start, so a dead
//! agent's leftovers go at most one lease duration after that. While the Lease watch has not
//! listed or fails ([`Freshness`]'s rule: until it lists or sends an event again, or no error
//! came for longer than a retry takes) renewals cannot be seen, so no Lease expires and every
//! clock starts again: an API outage longer than a lease does not make every node look dead at
//! once. A Lease whose label names another node than its name is no heartbeat
//! ([`heartbeat_of`]): an agent can write only its own node's Lease, by name.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fumarole_topology::colocation::{self, HEARTBEAT_LABEL, Leftovers, heartbeat_of};
use fumarole_watch_retry::retry_with;
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource};

use crate::freshness::Freshness;
use crate::service::Service;

/// The heartbeat Lease watch, as [`Freshness`] names it.
const LEASE_WATCH: &str = "heartbeat Lease";

/// How often the Leases are looked at.
const TICK: Duration = Duration::from_secs(1);

/// One Lease as this process has seen it.
#[derive(Debug)]
struct Seen {
    version: Option<String>,
    /// When `version` was first seen here.
    since: Instant,
    /// This expiry has been dealt with.
    cleaned: bool,
    /// Not a heartbeat ([`heartbeat_of`]), and said so.
    ignored: bool,
}

impl Seen {
    fn new(version: Option<String>, now: Instant) -> Self {
        Seen {
            version,
            since: now,
            cleaned: false,
            ignored: false,
        }
    }
}

/// Watches the heartbeat Leases in `namespace` and, while `svc` leads, cleans up after the
/// agents whose Lease has expired. Runs forever.
pub async fn run(client: Client, namespace: String, svc: Arc<Service>) {
    let leases: Api<Lease> = Api::namespaced(client.clone(), &namespace);
    let (store, writer) = reflector::store();
    let stream = retry_with(
        watcher(leases, watcher::Config::default().labels(HEARTBEAT_LABEL)),
        crate::freshness::WatchBackoff::default(),
    )
    .reflect(writer);
    // How the watch fares, by the view's own rule (and its warnings, at most every 30 s):
    // working once it lists or sends an event, failing from an error until then or until no
    // error came for longer than a retry takes.
    let lease_watch = Arc::new(Freshness::new(Duration::ZERO));
    lease_watch.track(LEASE_WATCH);
    let fares = Arc::clone(&lease_watch);
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            match event {
                // Made up by kube's watcher before it lists: says nothing of the watch.
                Ok(watcher::Event::Init) => {}
                Ok(event) => fares.ok(LEASE_WATCH, matches!(event, watcher::Event::InitDone)),
                Err(e) => fares.failed(LEASE_WATCH, &e),
            }
        }
    });
    let cleaner = Cleaner {
        nodes: Api::all(client.clone()),
        recorder: Recorder::new(
            client,
            Reporter {
                controller: "fumarole-scheduler-ext".into(),
                instance: std::env::var("POD_NAME").ok(),
            },
        ),
    };
    let mut seen: BTreeMap<String, Seen> = BTreeMap::new();
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let watching = lease_watch.check().is_ok();
        let due = expired(&store, &mut seen, Instant::now(), watching);
        if !svc.leads() {
            continue;
        }
        for Expired { lease, node, quiet } in due {
            match cleaner.clean(&node, quiet).await {
                Ok(_) => {
                    if let Some(s) = seen.get_mut(&lease) {
                        s.cleaned = true;
                    }
                }
                Err(e) => {
                    tracing::warn!(node, error = %e, "removing a dead agent's taint and batch resources failed; retrying");
                }
            }
        }
    }
}

/// A heartbeat that has not changed for its duration.
#[derive(Debug, PartialEq, Eq)]
struct Expired {
    lease: String,
    node: String,
    /// Since it was last seen renewed.
    quiet: Duration,
}

/// The heartbeats that have not changed for their duration and were not cleaned up after for
/// this expiry yet; updates `seen`. While the watch is not `watching`, none: every clock is
/// held at `now` (renewals may be happening unseen).
fn expired(
    store: &Store<Lease>,
    seen: &mut BTreeMap<String, Seen>,
    now: Instant,
    watching: bool,
) -> Vec<Expired> {
    let leases = store.state();
    seen.retain(|name, _| {
        leases
            .iter()
            .any(|l| l.metadata.name.as_deref() == Some(name))
    });
    let mut out = Vec::new();
    for lease in leases {
        let Some(name) = lease.metadata.name.clone() else {
            continue;
        };
        let Some((node, duration)) = heartbeat_of(&lease) else {
            // Labelled as a heartbeat (the watch selects by label), but not one: said once.
            let s = seen
                .entry(name.clone())
                .or_insert_with(|| Seen::new(None, now));
            if !s.ignored {
                s.ignored = true;
                tracing::warn!(
                    lease = name,
                    "a Lease labelled as a heartbeat whose name is not fumarole-agent-<the node its label names>, or without a duration: ignored"
                );
            }
            continue;
        };
        let version = lease.metadata.resource_version.clone();
        let s = seen
            .entry(name.clone())
            .or_insert_with(|| Seen::new(version.clone(), now));
        if s.version != version || s.ignored || !watching {
            *s = Seen::new(version, now);
        }
        let quiet = now.duration_since(s.since);
        if quiet > duration && !s.cleaned {
            out.push(Expired {
                lease: name,
                node,
                quiet,
            });
        }
    }
    out
}

struct Cleaner {
    nodes: Api<Node>,
    recorder: Recorder,
}

impl Cleaner {
    /// Removes our taint and the batch resources from `node`; what was there.
    async fn clean(&self, node: &str, expired_for: Duration) -> kube::Result<Leftovers> {
        let Some(current) = self.nodes.get_opt(node).await? else {
            return Ok(Leftovers::default());
        };
        let left = Leftovers::of(&current);
        if let Some(patch) = colocation::taint_patch(&current, false) {
            self.nodes
                .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
        }
        if left.batch {
            let patch = colocation::batch_patch(None);
            self.nodes
                .patch_status(node, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
        }
        if left.any() {
            tracing::warn!(
                node,
                ?expired_for,
                taint = left.taint,
                batch_resources = left.batch,
                "the node's fumarole-agent heartbeat expired: removed what it left"
            );
            let what = match (left.taint, left.batch) {
                (true, true) => "the offline-job-evicting taint and the batch resources",
                (true, false) => "the offline-job-evicting taint",
                _ => "the batch resources",
            };
            let event = Event {
                type_: EventType::Warning,
                reason: "AgentHeartbeatExpired".into(),
                note: Some(format!(
                    "fumarole-agent has not renewed its heartbeat for {}s: removed {what}",
                    expired_for.as_secs()
                )),
                action: "RemoveColocationLeftovers".into(),
                secondary: None,
            };
            if let Err(e) = self
                .recorder
                .publish(&event, &current.object_ref(&()))
                .await
            {
                tracing::warn!(node, error = %e, "could not record the AgentHeartbeatExpired Event");
            }
        }
        Ok(left)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use fumarole_topology::colocation::heartbeat_lease;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    use kube::runtime::watcher::Event as WatchEvent;

    fn lease(node: &str, version: &str) -> Lease {
        let mut l = heartbeat_lease(
            node,
            "uid",
            "ns",
            10,
            MicroTime(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        );
        l.metadata.resource_version = Some(version.into());
        l
    }

    #[test]
    fn a_lease_expires_after_its_duration_without_a_new_version_once() {
        let (store, mut writer) = reflector::store();
        writer.apply_watcher_event(&WatchEvent::Apply(lease("a", "1")));
        writer.apply_watcher_event(&WatchEvent::Apply(lease("b", "1")));
        let mut seen = BTreeMap::new();
        let t0 = Instant::now();
        assert!(expired(&store, &mut seen, t0, true).is_empty());
        // b renews; a does not.
        writer.apply_watcher_event(&WatchEvent::Apply(lease("b", "2")));
        let t1 = t0 + Duration::from_secs(8);
        assert!(expired(&store, &mut seen, t1, true).is_empty());
        let t2 = t0 + Duration::from_secs(11);
        let out = expired(&store, &mut seen, t2, true);
        assert_eq!(
            out,
            vec![Expired {
                lease: "fumarole-agent-a".into(),
                node: "a".into(),
                quiet: Duration::from_secs(11)
            }]
        );
        // Until cleaned it is reported again; after, not for the same expiry.
        seen.get_mut("fumarole-agent-a").unwrap().cleaned = true;
        assert!(expired(&store, &mut seen, t2, true).is_empty());
        // a comes back and lapses again: a new expiry.
        writer.apply_watcher_event(&WatchEvent::Apply(lease("a", "3")));
        assert!(expired(&store, &mut seen, t2, true).is_empty());
        let t3 = t2 + Duration::from_secs(11);
        let mut nodes: Vec<String> = expired(&store, &mut seen, t3, true)
            .into_iter()
            .map(|e| e.node)
            .collect();
        nodes.sort();
        assert_eq!(nodes, vec!["a".to_string(), "b".to_string()]);
        // A deleted Lease is forgotten.
        writer.apply_watcher_event(&WatchEvent::Delete(lease("b", "2")));
        expired(&store, &mut seen, t3, true);
        assert!(!seen.contains_key("fumarole-agent-b"));
    }

    #[test]
    fn no_lease_expires_while_the_watch_fails_and_every_clock_starts_again_after() {
        let (store, mut writer) = reflector::store();
        writer.apply_watcher_event(&WatchEvent::Apply(lease("a", "1")));
        let mut seen = BTreeMap::new();
        let t0 = Instant::now();
        assert!(expired(&store, &mut seen, t0, true).is_empty());
        // An outage longer than the lease: renewals are not seen, nothing expires.
        let during = t0 + Duration::from_secs(30);
        assert!(expired(&store, &mut seen, during, false).is_empty());
        // The watch works again: a whole lease from then, not from the last renewal seen.
        let after = during + Duration::from_secs(9);
        assert!(expired(&store, &mut seen, after, true).is_empty());
        let later = during + Duration::from_secs(11);
        assert_eq!(expired(&store, &mut seen, later, true).len(), 1);
    }

    #[test]
    fn a_lease_whose_label_names_another_node_is_no_heartbeat() {
        let (store, mut writer) = reflector::store();
        let mut aimed = lease("a", "1");
        aimed
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert(HEARTBEAT_LABEL.into(), "victim".into());
        writer.apply_watcher_event(&WatchEvent::Apply(aimed));
        let mut seen = BTreeMap::new();
        let t0 = Instant::now();
        assert!(expired(&store, &mut seen, t0, true).is_empty());
        let t1 = t0 + Duration::from_secs(60);
        assert!(expired(&store, &mut seen, t1, true).is_empty());
        // Put right, it is a heartbeat from then on.
        writer.apply_watcher_event(&WatchEvent::Apply(lease("a", "2")));
        assert!(expired(&store, &mut seen, t1, true).is_empty());
        let t2 = t1 + Duration::from_secs(11);
        assert_eq!(expired(&store, &mut seen, t2, true)[0].node, "a");
    }
}
