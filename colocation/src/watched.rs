//! One kind of object watched into a local store (a kube-rs reflector): the agent's own Node,
//! its pods and the co-location ConfigMap. [`Watched::changes`] is notified on every change,
//! with one stored permit, so it suits one consumer; others read [`Watched::state`] when they
//! need it. The co-location tasks watch through it, and so does the agent's pod watch for the
//! device plugins, which is why it lives here, below both.

use std::fmt::Debug;
use std::hash::Hash;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fumarole_topology::every::Every;
use futures::StreamExt;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher;
use kube::{Api, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::{Notify, watch};

/// How often one failing watch is logged at warning (403, 410 loops and outages retry often).
const WARN_EVERY: Duration = Duration::from_secs(30);

pub struct Watched<K: Resource + 'static>
where
    K::DynamicType: Eq + Hash + Clone,
{
    store: Store<K>,
    changed: Arc<Notify>,
    /// True after the first complete list. The store's own `wait_until_ready` wakes only one
    /// of several concurrent waiters (it sits on a oneshot channel), so one task waits on it
    /// and tells everyone through this.
    ready: watch::Receiver<bool>,
}

impl<K> Watched<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone + Send + Sync,
{
    /// Starts watching what `config` selects through `api`, with kube-rs' default backoff
    /// (never reset by the watcher's own `Init`, see `fumarole_watch_retry`): a lost watch is
    /// re-listed, never given up.
    pub fn spawn(api: Api<K>, config: watcher::Config) -> Self {
        Self::spawn_observed(api, config, |_| {})
    }

    /// [`Self::spawn`], calling `observe` with every event of the watch, in the order the API
    /// server sends them (after the store has taken it): the objects added or changed
    /// (`Apply`, `InitApply`), deleted (`Delete`), and the relists (`Init`, `InitDone`).
    pub fn spawn_observed(
        api: Api<K>,
        config: watcher::Config,
        observe: impl Fn(&watcher::Event<K>) + Send + 'static,
    ) -> Self {
        let (store, writer) = reflector::store();
        let stream =
            reflector::reflector(writer, fumarole_watch_retry::retry(watcher(api, config)));
        let changed = Arc::new(Notify::new());
        let notify = changed.clone();
        let kind = K::kind(&K::DynamicType::default()).to_string();
        tokio::spawn(async move {
            futures::pin_mut!(stream);
            // A failing watch retries often: one warning per WARN_EVERY, the rest at debug.
            let mut warn = Every::new(WARN_EVERY);
            while let Some(event) = stream.next().await {
                match event {
                    Ok(event) => {
                        observe(&event);
                        if matches!(
                            event,
                            watcher::Event::Apply(_)
                                | watcher::Event::InitApply(_)
                                | watcher::Event::Delete(_)
                        ) {
                            notify.notify_one();
                        }
                    }
                    Err(e) if warn.due(Instant::now()) => {
                        tracing::warn!(kind, error = %e, "watch failing; retrying");
                    }
                    Err(e) => tracing::debug!(kind, error = %e, "watch failing; retrying"),
                }
            }
        });
        let (ready_tx, ready) = watch::channel(false);
        let first_list = store.clone();
        tokio::spawn(async move {
            match first_list.wait_until_ready().await {
                Ok(()) => {
                    let _ = ready_tx.send(true);
                }
                Err(e) => tracing::debug!(error = %e, "store dropped before its first list"),
            }
        });
        Self {
            store,
            changed,
            ready,
        }
    }

    /// The objects as last seen (empty until the first list).
    pub fn state(&self) -> Vec<Arc<K>> {
        self.store.state()
    }

    /// The object of that name, for watches narrowed to one object.
    pub fn named(&self, name: &str) -> Option<Arc<K>> {
        self.store
            .state()
            .into_iter()
            .find(|o| o.meta().name.as_deref() == Some(name))
    }

    /// Notified (one stored permit, for one consumer) whenever an object is added or changes.
    pub fn changes(&self) -> Arc<Notify> {
        self.changed.clone()
    }

    /// Waits for the first complete list (any number of tasks may wait).
    pub async fn ready(&self) {
        let mut ready = self.ready.clone();
        // An error means the watch task is gone: nothing left to wait for.
        let _ = ready.wait_for(|r| *r).await;
    }
}
