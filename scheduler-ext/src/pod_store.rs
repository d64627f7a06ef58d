//! The pods the live view reads, as [`PodFacts`] by `namespace/name`, kept current from a pod
//! watch: what a reflector's store does for whole objects, with each pod read once per version
//! ([`PodFacts::of`]) and its k8s-openapi struct dropped (only a pod not bound yet is kept
//! whole). A relist replaces the store at its end, so pods deleted while the watch was down
//! leave it.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher;
use tokio::sync::watch;

use crate::core::pod_facts::PodFacts;
use crate::core::request::pod_key;

type Pods = HashMap<Arc<str>, Arc<PodFacts>>;

#[derive(Default)]
struct State {
    pods: Pods,
    /// The pods of a relist in progress.
    relist: Option<Pods>,
}

/// Shared handle; clones read the same store.
#[derive(Clone)]
pub struct PodStore {
    state: Arc<RwLock<State>>,
    ready: watch::Sender<bool>,
}

impl Default for PodStore {
    fn default() -> Self {
        PodStore {
            state: Arc::default(),
            ready: watch::Sender::new(false),
        }
    }
}

impl PodStore {
    /// Takes one watch event in.
    pub fn apply(&self, event: &watcher::Event<Pod>) {
        let Ok(mut state) = self.state.write() else {
            return;
        };
        match event {
            watcher::Event::Init => state.relist = Some(Pods::new()),
            watcher::Event::InitApply(pod) => {
                let facts = Arc::new(PodFacts::of(pod));
                match state.relist.as_mut() {
                    Some(relist) => relist.insert(Arc::clone(&facts.key), facts),
                    None => state.pods.insert(Arc::clone(&facts.key), facts),
                };
            }
            watcher::Event::InitDone => {
                if let Some(relist) = state.relist.take() {
                    state.pods = relist;
                }
                self.ready.send_replace(true);
            }
            watcher::Event::Apply(pod) => {
                let facts = Arc::new(PodFacts::of(pod));
                state.pods.insert(Arc::clone(&facts.key), facts);
            }
            watcher::Event::Delete(pod) => {
                state.pods.remove(pod_key(pod).as_str());
            }
        }
    }

    /// The pod `namespace/name`, if the store holds it.
    pub fn get(&self, key: &str) -> Option<Arc<PodFacts>> {
        self.state.read().ok()?.pods.get(key).cloned()
    }

    /// Every pod of the store.
    pub fn state(&self) -> Vec<Arc<PodFacts>> {
        self.state
            .read()
            .map(|s| s.pods.values().cloned().collect())
            .unwrap_or_default()
    }

    /// Waits for the first complete list.
    pub async fn wait_until_ready(&self) {
        let mut ready = self.ready.subscribe();
        // The sender lives as long as `self`.
        let _ = ready.wait_for(|r| *r).await;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    fn pod(name: &str, node: Option<&str>) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "ns", "uid": name},
            "spec": {"nodeName": node, "containers": []},
        }))
        .unwrap()
    }

    #[test]
    fn relist_replaces_and_deletes() {
        let store = PodStore::default();
        store.apply(&watcher::Event::Init);
        store.apply(&watcher::Event::InitApply(pod("a", Some("n1"))));
        store.apply(&watcher::Event::InitApply(pod("b", None)));
        // Not visible until the list is complete.
        assert!(store.state().is_empty());
        store.apply(&watcher::Event::InitDone);
        assert_eq!(store.state().len(), 2);
        // A bound pod is kept as facts only; an unbound one whole.
        assert!(store.get("ns/a").unwrap().unbound.is_none());
        assert!(store.get("ns/b").unwrap().unbound.is_some());
        store.apply(&watcher::Event::Apply(pod("b", Some("n2"))));
        assert_eq!(store.get("ns/b").unwrap().node.as_deref(), Some("n2"));
        store.apply(&watcher::Event::Delete(pod("a", Some("n1"))));
        assert!(store.get("ns/a").is_none());
        // A relist without "b" (deleted while the watch was down) drops it.
        store.apply(&watcher::Event::Init);
        store.apply(&watcher::Event::InitApply(pod("c", None)));
        assert!(
            store.get("ns/b").is_some(),
            "kept until the relist is complete"
        );
        store.apply(&watcher::Event::InitDone);
        let keys: Vec<String> = store.state().iter().map(|p| p.key.to_string()).collect();
        assert_eq!(keys, vec!["ns/c".to_string()]);
    }
}
