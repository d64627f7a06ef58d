//! The live cluster view: reflectors over `DeviceTopology`, `Numatopology`, `Node` (metadata
//! only: labels) and `Pod`, and a loop that rebuilds the [`ClusterView`] after changes.
//!
//! Changes are coalesced: after the first change the loop waits `debounce`, then builds one view
//! from the stores and hands it to the [`Service`] (which prunes its ledger against it). A pod
//! deletion releases the pod's commit at once.
//!
//! Pods bound by a scheduler that does not tell us its choice (Volcano before `allocateFunc`,
//! named in `annotate_schedulers`) get their devices chosen and written after the fact, so the
//! device plugin and the view still agree.
//!
//! With `publish_hypernodes`, Volcano `HyperNode` objects follow the super-nodes
//! ([`crate::hypernode`]).
//!
//! `Numatopology` is optional (clusters without Volcano's CRDs): without it NUMA fit has no CPU
//! data and says so in its reasons. `DeviceTopology` is required.

use std::collections::{BTreeMap, HashSet};
use std::fmt::Debug;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use fumarole_topology::annotation::DEVICES_ANNOTATION;
use fumarole_topology::crd::{DeviceTopology, Numatopology};
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams};
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource};
use tokio::sync::Notify;

use crate::core::request::pod_key;
use crate::core::view::{ClusterView, ContextCache};
use crate::hypernode;
use crate::kube_ops::KubeOps;
use crate::service::Service;

/// How the live view behaves.
#[derive(Clone, Debug)]
pub struct LiveOptions {
    /// Wait this long after a change before rebuilding, to take in a burst at once.
    pub debounce: Duration,
    /// `spec.schedulerName`s whose bound pods we annotate afterwards.
    pub annotate_schedulers: Vec<String>,
    /// Publish Volcano `HyperNode` objects for the super-nodes ([`crate::hypernode`]).
    pub publish_hypernodes: bool,
}

impl Default for LiveOptions {
    fn default() -> Self {
        LiveOptions {
            debounce: Duration::from_millis(50),
            annotate_schedulers: vec!["volcano".into()],
            publish_hypernodes: false,
        }
    }
}

/// The reflector stores.
#[derive(Clone)]
struct Stores {
    topologies: Store<DeviceTopology>,
    numatopologies: Option<Store<Numatopology>>,
    nodes: Store<PartialObjectMeta<Node>>,
    pods: Store<Pod>,
}

impl Stores {
    /// The view of the stores; `None` (keep the previous view) if it cannot be built.
    fn view(&self, contexts: &mut ContextCache) -> Option<ClusterView> {
        let dts = self.topologies.state();
        let nts = self
            .numatopologies
            .as_ref()
            .map(Store::state)
            .unwrap_or_default();
        let nodes = self.nodes.state();
        let pods = self.pods.state();
        let built = ClusterView::build_with(
            contexts,
            dts.iter().map(AsRef::as_ref),
            nts.iter().map(AsRef::as_ref),
            nodes.iter().map(|n| &n.metadata),
            pods.iter().map(AsRef::as_ref),
        );
        // Only a nameless object fails the build, and the API server names every object.
        built
            .inspect_err(|e| tracing::warn!(error = %e, "keeping the previous cluster view"))
            .ok()
    }
}

/// True when the API server serves `K` (its CRD is installed).
async fn served<K>(api: &Api<K>) -> Result<bool>
where
    K: Resource + Clone + Debug + serde::de::DeserializeOwned,
{
    match api.list_metadata(&ListParams::default().limit(1)).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
        Err(e) => Err(e).context("listing from the API server"),
    }
}

/// Drives one watch stream into its store, waking the rebuild loop on every event and calling
/// `on_delete` for deleted objects.
async fn drive<K>(
    kind: &'static str,
    stream: impl Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
    changed: Arc<Notify>,
    on_delete: impl Fn(&K),
) {
    let mut stream = std::pin::pin!(stream);
    while let Some(ev) = stream.next().await {
        match ev {
            Ok(watcher::Event::Delete(obj)) => on_delete(&obj),
            Ok(_) => {}
            Err(e) => tracing::warn!(kind, error = %e, "watch failed; retrying"),
        }
        changed.notify_one();
    }
}

fn reflect<K>(
    kind: &'static str,
    api: Api<K>,
    changed: &Arc<Notify>,
    on_delete: impl Fn(&K) + Send + 'static,
) -> Store<K>
where
    K: Resource + Clone + Debug + Send + Sync + serde::de::DeserializeOwned + 'static,
    K::DynamicType: Default + Eq + Hash + Clone + Send + Sync,
{
    let (store, writer) = reflector::store();
    let stream = watcher(api, watcher::Config::default())
        .default_backoff()
        .reflect(writer);
    tokio::spawn(drive(kind, stream, Arc::clone(changed), on_delete));
    store
}

/// Starts the reflectors, waits for their first lists, installs the first view and the API
/// client in `svc`, and returns the task that keeps the view current.
pub async fn start(
    client: Client,
    svc: Arc<Service>,
    opts: LiveOptions,
) -> Result<tokio::task::JoinHandle<()>> {
    let changed = Arc::new(Notify::new());
    let dt_api: Api<DeviceTopology> = Api::all(client.clone());
    if !served(&dt_api).await? {
        bail!(
            "the API server does not serve devicetopologies.topology.fumarole.dev: install deploy/crds/devicetopologies.topology.fumarole.dev.yaml"
        );
    }
    let nt_api: Api<Numatopology> = Api::all(client.clone());
    let numatopologies = if served(&nt_api).await? {
        Some(reflect("Numatopology", nt_api, &changed, |_| {}))
    } else {
        tracing::warn!(
            "numatopologies.nodeinfo.volcano.sh is not served: NUMA fit has no CPU data"
        );
        None
    };
    let node_store = {
        let (store, writer) = reflector::store();
        let api: Api<PartialObjectMeta<Node>> = Api::all(client.clone());
        let stream = watcher(api, watcher::Config::default())
            .default_backoff()
            .reflect(writer);
        tokio::spawn(drive("Node", stream, Arc::clone(&changed), |_| {}));
        store
    };
    let released = Arc::clone(&svc);
    let stores = Stores {
        topologies: reflect("DeviceTopology", dt_api, &changed, |_| {}),
        numatopologies,
        nodes: node_store,
        pods: reflect("Pod", Api::all(client.clone()), &changed, move |p: &Pod| {
            if released.release(&pod_key(p)).is_some() {
                tracing::debug!(pod = %pod_key(p), "pod deleted; devices released");
            }
        }),
    };
    stores
        .topologies
        .wait_until_ready()
        .await
        .context("DeviceTopology reflector")?;
    stores
        .nodes
        .wait_until_ready()
        .await
        .context("Node reflector")?;
    stores
        .pods
        .wait_until_ready()
        .await
        .context("Pod reflector")?;
    if let Some(nt) = &stores.numatopologies {
        nt.wait_until_ready()
            .await
            .context("Numatopology reflector")?;
    }
    let mut opts = opts;
    if opts.publish_hypernodes {
        let api: Api<kube::api::DynamicObject> =
            Api::all_with(client.clone(), &hypernode::resource());
        if !served(&api).await? {
            tracing::warn!(
                "hypernodes.topology.volcano.sh is not served (Volcano < 1.12?): not publishing HyperNodes"
            );
            opts.publish_hypernodes = false;
        }
    }
    svc.set_kube(KubeOps::new(client.clone(), stores.pods.clone()));
    let mut late = LoopState {
        client,
        tried: HashSet::new(),
        hypernodes: None,
        contexts: ContextCache::default(),
    };
    rebuild(&stores, &svc, &opts, &mut late).await;
    tracing::info!(nodes = svc.view().len(), "cluster view ready");
    Ok(tokio::spawn(async move {
        loop {
            changed.notified().await;
            tokio::time::sleep(opts.debounce).await;
            rebuild(&stores, &svc, &opts, &mut late).await;
        }
    }))
}

/// What the rebuild loop remembers between rounds.
struct LoopState {
    client: Client,
    /// Pods already tried by the after-the-fact annotation (so a failure is logged once).
    tried: HashSet<String>,
    /// The HyperNodes last published (`None`: not yet, or the last attempt failed).
    hypernodes: Option<BTreeMap<String, Vec<String>>>,
    /// Select contexts (and their memos) shared from one view to the next.
    contexts: ContextCache,
}

/// Builds and installs a new view, publishes HyperNodes if asked, then annotates bound pods
/// that lack our choice.
async fn rebuild(stores: &Stores, svc: &Service, opts: &LiveOptions, late: &mut LoopState) {
    let Some(view) = stores.view(&mut late.contexts) else {
        return;
    };
    for w in &view.warnings {
        tracing::debug!("{w}");
    }
    let want = opts.publish_hypernodes.then(|| hypernode::desired(&view));
    for dropped in svc.replace_view(view) {
        tracing::debug!(pod = %dropped, "commit settled or timed out");
    }
    if let Some(want) = want
        && late.hypernodes.as_ref() != Some(&want)
    {
        match hypernode::sync(&late.client, &want).await {
            Ok(()) => {
                tracing::info!(count = want.len(), "HyperNodes published");
                late.hypernodes = Some(want);
            }
            Err(e) => {
                tracing::warn!(error = %e, "publishing HyperNodes failed; retrying on the next change");
                late.hypernodes = None;
            }
        }
    }
    if opts.annotate_schedulers.is_empty() {
        return;
    }
    if svc.kube().is_none() {
        return;
    }
    let view = svc.view();
    if late.tried.len() > 100_000 {
        late.tried.clear();
    }
    for pod in stores.pods.state() {
        let Some(spec) = pod.spec.as_ref() else {
            continue;
        };
        let (Some(node), Some(scheduler)) = (&spec.node_name, &spec.scheduler_name) else {
            continue;
        };
        let finished = matches!(
            pod.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Succeeded" | "Failed")
        );
        let annotated = pod
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(DEVICES_ANNOTATION));
        let key = pod_key(&pod);
        if finished
            || annotated
            || !opts.annotate_schedulers.contains(scheduler)
            || view.reported(&key)
            || late.tried.contains(&key)
        {
            continue;
        }
        late.tried.insert(key.clone());
        match svc.assign_bound(&pod, node).await {
            Ok(Some(c)) => {
                tracing::info!(pod = %key, node = %node, devices = ?c.devices, "annotated a pod bound by {scheduler}")
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(pod = %key, node = %node, error = %e, "cannot give devices to a bound pod")
            }
        }
    }
}
