//! The node's one health stream: every source of device and link health feeds it, every
//! consumer subscribes to it.
//!
//! Start at [`HealthStream`]: sources get a [`SourceHandle`] and report their whole current
//! view ([`fumarole_topology::NodeHealth`]) whenever it changes; the stream merges the views
//! and hands the result to subscribers through a `tokio::sync::watch` channel (the device
//! plugins' `ListAndWatch`, the `DeviceTopology` publisher, the agent's Node Events and
//! metrics). The sources, by name: [`dev_nodes`] (today's rule: a device whose `/dev` node is
//! gone is unhealthy), [`nvml`] (NVIDIA: XID and ECC events, and a periodic check of retired
//! pages, row remapping, NVLink lanes and the GPU answering at all) and [`dcmi`] (Ascend: chip
//! health and error codes, RoCE network health, HCCS fault codes). [`recovery`] is the rule
//! that gives a device back, [`watchdog`] what tells a library that hangs from one that is
//! slow. [`sources`] starts them all with the flags of [`settings`].
//!
//! Vendor libraries are blocking C code: their sources run on threads of their own and only
//! ever publish through the stream, so a library that hangs or answers garbage freezes its own
//! view (the last good state) and nothing else: the kubelet's gRPC calls never wait for it.

pub mod dcmi;
pub mod dev_nodes;
pub mod nvml;
pub mod recovery;
pub mod settings;
pub mod sources;
pub mod watchdog;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError};

use fumarole_topology::NodeHealth;
use tokio::sync::watch;

/// The merged health of the node's devices and links, fed by named sources. Cheap to clone.
#[derive(Clone)]
pub struct HealthStream {
    shared: Arc<Shared>,
}

struct Shared {
    sources: Mutex<BTreeMap<&'static str, NodeHealth>>,
    merged: watch::Sender<NodeHealth>,
}

impl Default for HealthStream {
    fn default() -> Self {
        Self::new()
    }
}

impl HealthStream {
    /// A stream with no source yet: every device healthy.
    pub fn new() -> Self {
        let (merged, _) = watch::channel(NodeHealth::default());
        Self {
            shared: Arc::new(Shared {
                sources: Mutex::new(BTreeMap::new()),
                merged,
            }),
        }
    }

    /// A receiver of the merged health: the current value at once, then every change.
    pub fn subscribe(&self) -> watch::Receiver<NodeHealth> {
        self.shared.merged.subscribe()
    }

    /// The merged health now.
    pub fn current(&self) -> NodeHealth {
        self.shared.merged.borrow().clone()
    }

    /// The handle through which source `name` reports (`dev-nodes`, `nvml`, `dcmi`).
    pub fn source(&self, name: &'static str) -> SourceHandle {
        SourceHandle {
            name,
            shared: self.shared.clone(),
        }
    }
}

/// One source's way into the stream. Usable from any thread (std or tokio).
#[derive(Clone)]
pub struct SourceHandle {
    name: &'static str,
    shared: Arc<Shared>,
}

impl SourceHandle {
    /// The source's name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Replaces what this source says with `health` (its whole view); subscribers hear of it
    /// only when the merged health changed. Returns whether it did.
    pub fn report(&self, health: NodeHealth) -> bool {
        let mut sources = self
            .shared
            .sources
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if sources.get(self.name) == Some(&health) {
            return false;
        }
        sources.insert(self.name, health);
        let merged = NodeHealth::merge(sources.values());
        drop(sources);
        self.shared.merged.send_if_modified(|current| {
            if *current == merged {
                return false;
            }
            *current = merged;
            true
        })
    }
}

/// Remembers which problems were already logged, so a problem that persists is one log line
/// (and its end another one), not one per poll.
#[derive(Debug, Default)]
pub struct LogOnce {
    seen: BTreeSet<String>,
}

impl LogOnce {
    /// True the first time `key` is a problem (log it then).
    pub fn first(&mut self, key: &str) -> bool {
        self.seen.insert(key.to_string())
    }

    /// True when `key` was a problem and is not any more (log the recovery then).
    pub fn cleared(&mut self, key: &str) -> bool {
        self.seen.remove(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fumarole_topology::{Fault, FaultKind};

    #[test]
    fn sources_merge_and_unchanged_reports_are_silent() {
        let stream = HealthStream::new();
        let mut rx = stream.subscribe();
        rx.borrow_and_update();
        let nodes = stream.source("dev-nodes");
        let nvml = stream.source("nvml");
        let mut a = NodeHealth::default();
        a.add("g1", Fault::new(FaultKind::DevNodeMissing, "/dev/nvidia1"));
        assert!(nodes.report(a.clone()));
        assert!(rx.has_changed().unwrap());
        rx.borrow_and_update();
        assert!(!nodes.report(a.clone()));
        assert!(!rx.has_changed().unwrap());
        let mut b = NodeHealth::default();
        b.add("g2", Fault::new(FaultKind::Xid, "XID 79"));
        assert!(nvml.report(b));
        let now = stream.current();
        assert!(!now.is_healthy("g1") && !now.is_healthy("g2"));
        // A source that clears its faults clears only its own.
        assert!(nvml.report(NodeHealth::default()));
        assert_eq!(stream.current(), a);
    }

    #[test]
    fn log_once_says_first_and_cleared_once() {
        let mut l = LogOnce::default();
        assert!(l.first("x"));
        assert!(!l.first("x"));
        assert!(l.cleared("x"));
        assert!(!l.cleared("x"));
    }
}
