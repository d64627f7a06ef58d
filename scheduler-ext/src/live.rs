//! The live cluster view: reflectors over `DeviceTopology`, `Numatopology`, `Node` (metadata
//! only: labels) and `Pod`, and a loop that rebuilds the [`ClusterView`] after changes.
//!
//! Changes are coalesced: after the first change the loop waits `debounce`, then makes one view
//! and hands it to the service's [`crate::decider::Decider`] (which prunes its ledger against
//! it); it also hands the view over every [`TICK`] so commits time out without changes. Pod
//! events, and those of a node's own objects (`DeviceTopology`, `Node`, `Numatopology`),
//! make the next view from the last one and what they name ([`IncrementalView`]: the cost of
//! what they touch); the view is built in full from the stores at start, after a relist,
//! after a ResourceClaim change or one to a PodGroup's `sp-block` / `sp-fit`
//! ([`PodGroupsRead`]: not its status, which Volcano updates many times per job), and after a
//! node change that reaches beyond the node (it joins or leaves, changes super-node, resources
//! or devices), counted in [`ViewBuilds`]. A pod deletion releases the pod's commit at once.
//! Each watch reports to a [`Freshness`] (`/readyz`).
//!
//! Only the leader ([`crate::controllers::leader`]) writes: the after-the-fact annotations,
//! HyperNodes, and the withdrawal of promises whose commit timed out (a pod Volcano allocated
//! but never bound keeps no devices). A term begins by reading every unfinished pod's promise
//! from the API server ([`crate::controllers::terms`]), so what the last leader handed out
//! counts before this one commits.
//!
//! Pods bound by a scheduler that does not tell us its choice (Volcano before `allocateFunc`,
//! named in `annotate_schedulers`) get their devices chosen and written after the fact, so the
//! device plugin and the view still agree ([`crate::controllers::bound_pods`], a task of its
//! own beside the rebuild loop).
//!
//! With `publish_hypernodes`, Volcano `HyperNode` objects follow the super-nodes
//! ([`crate::controllers::hypernode`]).
//!
//! `ResourceClaim` (`resource.k8s.io/v1`) is watched where the API server serves it: the
//! devices allocated claims hold count as used, and pods asking through claims of fumarole's
//! DRA classes are judged like extended-resource pods ([`crate::core::claims`]). Templates are
//! read through the claims generated from them (named in the pod's status), so
//! `ResourceClaimTemplate` is not watched.
//!
//! `Numatopology` is optional (clusters without Volcano's CRDs): without it NUMA fit has no CPU
//! data and says so in its reasons. `DeviceTopology` is required.
//!
//! Volcano `PodGroup`s (`scheduling.volcano.sh/v1beta1`, metadata only) are watched where the
//! API server serves them: their `sp-block` / `sp-fit` (copied by Volcano from the Volcano
//! Job's annotations) count for the pods that name them ([`crate::core::unit`]). Without the
//! CRD (kube-scheduler-only clusters), or without the rights to read it, only pod annotations
//! count; a task probes every 30 s to 5 min (logging each change of answer once) and starts
//! the watch once PodGroups can be read, so a CRD installed later counts without a restart
//! ([`start_pod_groups`]).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Debug;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use fumarole_topology::crd::{DeviceTopology, Numatopology};
use fumarole_watch_retry::retry_with;
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::ResourceClaim;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams};
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tokio::sync::Notify;

use crate::controllers::{bound_pods, hypernode, terms};
use crate::core::claims::Claims;
use crate::core::pod_facts::PodFacts;
use crate::core::request::pod_key;
use crate::core::unit::{JobSources, PodGroupSizes};
use crate::core::view::{ClusterView, ContextCache, IncrementalView, NodeObjects};
use crate::effects::Effects;
use crate::freshness::{Freshness, WatchBackoff};
use crate::pod_store::PodStore;
use crate::service::Service;

/// How often the view is rebuilt without changes (commit and promise time-outs).
pub const TICK: Duration = Duration::from_secs(5);

/// How the live view behaves.
#[derive(Clone)]
pub struct LiveOptions {
    /// Wait this long after a change before rebuilding, to take in a burst at once.
    pub debounce: Duration,
    /// `spec.schedulerName`s whose bound pods we annotate afterwards.
    pub annotate_schedulers: Vec<String>,
    /// Publish Volcano `HyperNode` objects for the super-nodes ([`crate::controllers::hypernode`]).
    pub publish_hypernodes: bool,
    /// How long a watch may fail before the view counts as stale (`/readyz` fails).
    pub max_staleness: Duration,
    /// Client for the service's own writes (annotations, Bindings), with a short timeout under
    /// leader election; the reflectors' client when `None`.
    pub write_client: Option<Client>,
    /// This replica's own Pod (namespace, name), labelled [`crate::effects::LEADER_LABEL`]
    /// while it leads so a Service can select the leader.
    pub own_pod: Option<(String, String)>,
    /// Counts the views made, in full and from pod changes.
    pub builds: ViewBuilds,
    /// Counts the views that took in a `DeviceTopology` change (or were built in full), once
    /// each is in force: a scheduler plugin retries the pods fumarole refused when it moves.
    pub device_views: Arc<std::sync::atomic::AtomicU64>,
}

/// Views made by the live loop, by how: `full` (from every object of the stores: at start,
/// after a relist, after a change to a claim or to a PodGroup's `sp-block` / `sp-fit`, or to
/// a node that reaches beyond it) and `changes` (the last view and the nodes and pods that
/// changed). Served as `fumarole_scheduler_ext_view_builds_total{how}` where
/// [`ViewBuilds::register`]ed.
#[derive(Clone, Debug, Default)]
pub struct ViewBuilds {
    builds: Family<Vec<(String, String)>, Counter>,
}

impl ViewBuilds {
    pub fn register(&self, registry: &mut prometheus_client::registry::Registry) {
        registry.register(
            "view_builds",
            "Cluster views made by the live loop, by how: in full, or from the nodes and pods that changed",
            self.builds.clone(),
        );
    }

    fn count(&self, how: &str) {
        self.builds
            .get_or_create(&vec![("how".to_string(), how.to_string())])
            .inc();
    }

    /// Views made so far `how` (`full`, `changes`).
    pub fn get(&self, how: &str) -> u64 {
        self.builds
            .get_or_create(&vec![("how".to_string(), how.to_string())])
            .get()
    }
}

impl Default for LiveOptions {
    fn default() -> Self {
        LiveOptions {
            debounce: Duration::from_millis(50),
            annotate_schedulers: vec!["volcano".into()],
            publish_hypernodes: false,
            max_staleness: Duration::from_secs(30),
            write_client: None,
            own_pod: None,
            builds: ViewBuilds::default(),
            device_views: Arc::default(),
        }
    }
}

/// The reflector stores.
#[derive(Clone)]
struct Stores {
    topologies: Store<DeviceTopology>,
    numatopologies: Option<Store<Numatopology>>,
    nodes: Store<PartialObjectMeta<Node>>,
    pods: PodStore,
    /// `None` where the API server does not serve `resource.k8s.io/v1` ResourceClaims.
    claims: Option<Store<ResourceClaim>>,
    /// Empty while the API server does not serve Volcano's PodGroups or lets us read them
    /// ([`start_pod_groups`]).
    pod_groups: Store<PartialObjectMeta<DynamicObject>>,
}

impl Stores {
    /// The view of the stores, built in full, with the pods it was built from (in key order,
    /// as [`IncrementalView`] takes them in); `None` (keep the previous view) if it cannot be
    /// built.
    fn view(
        &self,
        contexts: &mut ContextCache,
        whole_job_super_pod: bool,
    ) -> Option<IncrementalView> {
        let dts = self.topologies.state();
        let nts = self
            .numatopologies
            .as_ref()
            .map(Store::state)
            .unwrap_or_default();
        let nodes = self.nodes.state();
        let mut pods = self.pods.state();
        pods.sort_unstable_by(|a, b| a.key.cmp(&b.key));
        let claims = self.claims.as_ref().map_or_else(Claims::default, |s| {
            Claims::new(s.state().iter().map(AsRef::as_ref))
        });
        let groups = self.pod_groups.state();
        let sources = JobSources {
            pod_groups: pod_group_sizes(groups.iter().map(|g| &g.metadata)),
            whole_job_super_pod,
        };
        let built = ClusterView::build_with_jobs(
            contexts,
            dts.iter().map(AsRef::as_ref),
            nts.iter().map(AsRef::as_ref),
            nodes.iter().map(|n| &n.metadata),
            pods.iter().map(AsRef::as_ref),
            claims,
            sources,
        );
        // Only a nameless object fails the build, and the API server names every object.
        built
            .inspect_err(|e| tracing::warn!(error = %e, "keeping the previous cluster view"))
            .ok()
            .map(|view| IncrementalView::new(view, pods))
    }
}

/// Volcano's `PodGroup` (`scheduling.volcano.sh/v1beta1`).
pub fn pod_group_resource() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(
        "scheduling.volcano.sh",
        "v1beta1",
        "PodGroup",
    ))
}

/// The `sp-block` / `sp-fit` of PodGroups, from their metadata.
fn pod_group_sizes<'a>(groups: impl Iterator<Item = &'a ObjectMeta>) -> PodGroupSizes {
    PodGroupSizes::new(groups.filter_map(|m| {
        Some((
            m.namespace.as_deref().unwrap_or("default"),
            m.name.as_deref()?,
            m.annotations.as_ref()?,
        ))
    }))
}

/// The `sp-block` / `sp-fit` of each PodGroup that has them, as its watch last reported. Only a
/// change to those changes the view; Volcano updates a PodGroup's status many times per job,
/// and each such event used to have the view built in full.
#[derive(Debug, Default)]
struct PodGroupsRead {
    seen: HashMap<String, BTreeMap<String, String>>,
    /// While the watch (re)lists: what the list has brought so far.
    listing: Option<HashMap<String, BTreeMap<String, String>>>,
}

impl PodGroupsRead {
    /// Takes in one event of the PodGroup watch; answers whether the view must be made again.
    fn changes_view(&mut self, ev: &watcher::Event<PartialObjectMeta<DynamicObject>>) -> bool {
        let read = |o: &PartialObjectMeta<DynamicObject>| {
            let m = &o.metadata;
            let key = format!(
                "{}/{}",
                m.namespace.as_deref().unwrap_or("default"),
                m.name.as_deref().unwrap_or_default()
            );
            let ours = m
                .annotations
                .as_ref()
                .and_then(PodGroupSizes::annotations_read);
            (key, ours)
        };
        match ev {
            watcher::Event::Init => {
                self.listing = Some(HashMap::new());
                false
            }
            watcher::Event::InitApply(o) => {
                if let (Some(listing), (key, Some(ours))) = (self.listing.as_mut(), read(o)) {
                    listing.insert(key, ours);
                }
                false
            }
            watcher::Event::InitDone => {
                let listed = self.listing.take().unwrap_or_default();
                let changed = listed != self.seen;
                self.seen = listed;
                changed
            }
            watcher::Event::Apply(o) => match read(o) {
                (key, Some(ours)) => self.seen.insert(key, ours.clone()) != Some(ours),
                (key, None) => self.seen.remove(&key).is_some(),
            },
            watcher::Event::Delete(o) => self.seen.remove(&read(o).0).is_some(),
        }
    }
}

/// True when the API server serves `K` (its CRD is installed).
async fn served<K>(api: &Api<K>) -> Result<bool>
where
    K: Resource + Clone + Debug + serde::de::DeserializeOwned,
{
    probe_served(api)
        .await
        .context("listing from the API server")
}

/// One probe for [`served`]: a one-item list, 404 meaning not served.
async fn probe_served<K>(api: &Api<K>) -> kube::Result<bool>
where
    K: Resource + Clone + Debug + serde::de::DeserializeOwned,
{
    match api.list_metadata(&ListParams::default().limit(1)).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
        Err(e) => Err(e),
    }
}

/// [`served`] for a service starting up: a failure that may pass (the API server unreachable
/// or overloaded: no answer, 429, 5xx) is retried with the watches' backoff, logged at most
/// every 30 s, instead of ending the process; a refusal (another 4xx) is returned.
async fn served_at_start<K>(api: &Api<K>) -> Result<bool>
where
    K: Resource + Clone + Debug + serde::de::DeserializeOwned,
{
    let mut backoff = WatchBackoff::default();
    let mut warn = fumarole_topology::every::Every::new(Duration::from_secs(30));
    loop {
        match probe_served(api).await {
            Err(e) if may_pass(&e) => {
                if warn.due(std::time::Instant::now()) {
                    tracing::warn!(error = %e, "the API server failed while starting; retrying");
                }
                let pause = backoff
                    .next()
                    .unwrap_or(crate::freshness::WATCH_BACKOFF_MAX);
                tokio::time::sleep(pause).await;
            }
            answer => return answer.context("listing from the API server"),
        }
    }
}

/// Whether a failed request may succeed if tried again: no answer, or 429 / 5xx.
fn may_pass(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(s) => s.code == 429 || s.code >= 500,
        kube::Error::SerdeError(_) | kube::Error::BuildRequest(_) => false,
        _ => true,
    }
}

/// Every object of `api`'s kind, or none where the API server does not serve it.
async fn list_if_served<K>(api: &Api<K>, kind: &str) -> Result<Vec<K>>
where
    K: Resource + Clone + Debug + serde::de::DeserializeOwned,
{
    if !served(api).await? {
        return Ok(Vec::new());
    }
    Ok(api
        .list(&ListParams::default())
        .await
        .with_context(|| format!("listing {kind}"))?
        .items)
}

/// What every watch shares: the rebuild loop's wake-up, what changed, and the freshness
/// record.
#[derive(Clone)]
struct Watches {
    changed: Arc<Notify>,
    changes: ChangeLog,
    freshness: Arc<Freshness>,
}

/// What changed since the view was last made.
#[derive(Debug, Default)]
struct Changes {
    /// Pods applied or deleted since, by `namespace/name`.
    pods: HashSet<Arc<str>>,
    /// Nodes whose `DeviceTopology`, `Node` or `Numatopology` was applied or deleted since.
    nodes: HashSet<String>,
    /// Whether a `DeviceTopology` was applied or deleted since.
    devices: bool,
    /// Why the next view must be built in full, if it must: a relist (objects deleted while
    /// the watch was down leave the store at once), a change to a claim, or to a PodGroup's
    /// `sp-block` / `sp-fit`.
    full: Option<&'static str>,
}

/// The changes the watches report and the loop takes ([`ChangeLog::take`]). A watch records
/// a change after its store took it in, so a change the loop takes is in the store it reads
/// (a change stored but not yet recorded is read early and taken again next time: the same).
#[derive(Clone, Debug, Default)]
struct ChangeLog(Arc<std::sync::Mutex<Changes>>);

impl ChangeLog {
    fn with(&self, f: impl FnOnce(&mut Changes)) {
        match self.0.lock() {
            Ok(mut c) => f(&mut c),
            Err(poisoned) => f(&mut poisoned.into_inner()),
        }
    }

    fn pod(&self, key: Arc<str>) {
        self.with(|c| {
            c.pods.insert(key);
        });
    }

    /// Records one event of a kind other than pods: the node it names for a node's own
    /// objects, else everything.
    fn note<K: Resource>(&self, kind: &'static str, ev: &watcher::Event<K>) {
        match ev {
            watcher::Event::Init => {}
            watcher::Event::Apply(o) | watcher::Event::Delete(o) if PER_NODE.contains(&kind) => {
                match o.meta().name.clone() {
                    Some(name) => self.with(|c| {
                        c.nodes.insert(name);
                        c.devices |= kind == DEVICE_TOPOLOGY;
                    }),
                    None => self.everything(kind),
                }
            }
            _ => self.everything(kind),
        }
    }

    fn everything(&self, why: &'static str) {
        self.with(|c| {
            c.full.get_or_insert(why);
        });
    }

    fn take(&self) -> Changes {
        let mut taken = Changes::default();
        self.with(|c| taken = std::mem::take(c));
        taken
    }
}

/// The kind whose watch reports its changes itself, one pod at a time ([`reflect_pods`]).
const POD: &str = "Pod";

/// Volcano's PodGroups, whose watch reports only the changes that count ([`PodGroupsRead`]).
const POD_GROUP: &str = "PodGroup";

/// The kinds whose watches record their changes themselves.
const NOTED_BY_THEIR_WATCH: [&str; 2] = [POD, POD_GROUP];

/// The kinds whose objects belong to one node (named as it): a change to one makes that
/// node's view again ([`IncrementalView::update_nodes`]). A change to any other kind (claims)
/// has the view built in full.
const PER_NODE: [&str; 3] = [DEVICE_TOPOLOGY, "Node", "Numatopology"];

const DEVICE_TOPOLOGY: &str = "DeviceTopology";

/// Drives one watch stream, waking the rebuild loop on every event, handing each event to
/// `on_event` (after a reflector's store took it in) and telling `freshness` how the watch
/// fares.
async fn drive<K: Resource>(
    kind: &'static str,
    stream: impl Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
    watches: Watches,
    on_event: impl Fn(&watcher::Event<K>),
) {
    let mut stream = std::pin::pin!(stream);
    while let Some(ev) = stream.next().await {
        match ev {
            Ok(ev) => {
                // kube's watcher yields `Init` before it lists, with no request made (after
                // every failure too), so it says nothing about the watch working: only a
                // list's results and watch events do. Counting it kept a failing view ready.
                if !matches!(ev, watcher::Event::Init) {
                    watches
                        .freshness
                        .ok(kind, matches!(ev, watcher::Event::InitDone));
                }
                on_event(&ev);
                if !NOTED_BY_THEIR_WATCH.contains(&kind) {
                    watches.changes.note(kind, &ev);
                }
            }
            Err(e) => watches.freshness.failed(kind, &e),
        }
        watches.changed.notify_one();
    }
}

/// The first wait between two probes for PodGroups that are not served or not readable.
const POD_GROUP_PROBE_FIRST: Duration = Duration::from_secs(30);
/// The longest wait between two probes for PodGroups.
const POD_GROUP_PROBE_MAX: Duration = Duration::from_secs(300);

/// Whether the API server lets us read a kind, as one probe found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Readable {
    Yes,
    /// Not served: its CRD is not installed (404).
    NotServed,
    /// Our RBAC does not allow it (401, 403).
    Forbidden,
    /// Any other failure (API server unreachable, 5xx).
    Failing,
}

impl Readable {
    fn of<T>(probe: &Result<T, kube::Error>) -> Readable {
        match probe {
            Ok(_) => Readable::Yes,
            Err(kube::Error::Api(s)) if s.code == 404 => Readable::NotServed,
            Err(kube::Error::Api(s)) if s.code == 401 || s.code == 403 => Readable::Forbidden,
            Err(_) => Readable::Failing,
        }
    }
}

/// One probe: can we list PodGroups (metadata, one item)? With the error, if any.
async fn probe_pod_groups(api: &Api<DynamicObject>) -> (Readable, String) {
    let result = api.list_metadata(&ListParams::default().limit(1)).await;
    let error = result.as_ref().err().map(ToString::to_string);
    (Readable::of(&result), error.unwrap_or_default())
}

/// Logs what a PodGroup probe found (called once per change of answer).
fn log_pod_groups(readable: Readable, error: &str) {
    match readable {
        Readable::Yes => {
            tracing::info!("podgroups.scheduling.volcano.sh can be read now: starting the watch")
        }
        Readable::NotServed => tracing::warn!(
            "podgroups.scheduling.volcano.sh is not served: sp-block / sp-fit are read from pod annotations only until it is (probing every 30 s to 5 min)"
        ),
        Readable::Forbidden | Readable::Failing => tracing::warn!(
            error,
            "podgroups.scheduling.volcano.sh cannot be read: sp-block / sp-fit are read from pod annotations only until it can (probing every 30 s to 5 min)"
        ),
    }
}

/// Probes with `probe` after each of `delays` until it answers [`Readable::Yes`]; `last` is
/// the answer before the first wait. Each new answer is logged once (a missing CRD is not
/// logged every 5 minutes). Returns the answers logged, in order.
async fn wait_until_readable<F, Fut>(
    mut last: Readable,
    mut probe: F,
    delays: impl IntoIterator<Item = Duration>,
) -> Vec<Readable>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = (Readable, String)>,
{
    let mut logged = Vec::new();
    for delay in delays {
        if last == Readable::Yes {
            break;
        }
        tokio::time::sleep(delay).await;
        let (now, error) = probe().await;
        if now != last {
            log_pod_groups(now, &error);
            logged.push(now);
        }
        last = now;
    }
    logged
}

/// The waits between PodGroup probes: from [`POD_GROUP_PROBE_FIRST`], doubling up to
/// [`POD_GROUP_PROBE_MAX`], without end.
fn pod_group_probe_delays() -> impl Iterator<Item = Duration> {
    std::iter::successors(Some(POD_GROUP_PROBE_FIRST), |d| {
        Some((*d * 2).min(POD_GROUP_PROBE_MAX))
    })
}

/// The PodGroup store, and whether PodGroups could be read at start (then the caller waits
/// for the first list). PodGroups are optional (kube-scheduler-only clusters have no Volcano
/// CRDs; an RBAC that predates this watch cannot read them): where they cannot be read the
/// store stays empty and a task probes with backoff ([`pod_group_probe_delays`]) until they
/// can, then starts the watch, so a CRD installed or a right granted later counts without a
/// restart. The rest of the view never waits for it.
async fn start_pod_groups(
    client: &Client,
    watches: &Watches,
) -> (Store<PartialObjectMeta<DynamicObject>>, bool) {
    let writer = reflector::store::Writer::new(pod_group_resource());
    let store = writer.as_reader();
    let probe_api: Api<DynamicObject> = Api::all_with(client.clone(), &pod_group_resource());
    let meta_api: Api<PartialObjectMeta<DynamicObject>> =
        Api::all_with(client.clone(), &pod_group_resource());
    let (now, error) = probe_pod_groups(&probe_api).await;
    let watch = |watches: Watches, late: bool| {
        let stream = retry_with(
            watcher(meta_api, watcher::Config::default()),
            WatchBackoff::default(),
        )
        .reflect(writer);
        let listed = std::sync::atomic::AtomicBool::new(!late);
        let read = std::sync::Mutex::new(PodGroupsRead::default());
        let changes = watches.changes.clone();
        drive(POD_GROUP, stream, watches, move |ev| {
            if matches!(ev, watcher::Event::InitDone)
                && !listed.swap(true, std::sync::atomic::Ordering::Relaxed)
            {
                tracing::info!("PodGroups listed: their sp-block / sp-fit count from now on");
            }
            let changed = match read.lock() {
                Ok(mut r) => r.changes_view(ev),
                Err(poisoned) => poisoned.into_inner().changes_view(ev),
            };
            if changed {
                changes.everything(POD_GROUP);
            }
        })
    };
    if now == Readable::Yes {
        watches.freshness.track(POD_GROUP);
        tokio::spawn(watch(watches.clone(), false));
        return (store, true);
    }
    log_pod_groups(now, &error);
    let watches = watches.clone();
    tokio::spawn(async move {
        let probe = || probe_pod_groups(&probe_api);
        wait_until_readable(now, probe, pod_group_probe_delays()).await;
        // Not tracked in the freshness record before it lists: a late watch does not make
        // the view unready while it starts.
        watch(watches, true).await;
    });
    (store, false)
}

fn reflect<K>(kind: &'static str, api: Api<K>, watches: &Watches) -> Store<K>
where
    K: Resource + Clone + Debug + Send + Sync + serde::de::DeserializeOwned + 'static,
    K::DynamicType: Default + Eq + Hash + Clone + Send + Sync,
{
    let (store, writer) = reflector::store();
    let stream = retry_with(
        watcher(api, watcher::Config::default()),
        WatchBackoff::default(),
    )
    .reflect(writer);
    watches.freshness.track(kind);
    tokio::spawn(drive(kind, stream, watches.clone(), |_| {}));
    store
}

/// The pod watch: unfinished pods only (a pod that finishes leaves the watch as if deleted),
/// each trimmed ([`trim_pod`]) and read into a [`PodStore`].
fn reflect_pods(
    api: Api<Pod>,
    watches: &Watches,
    on_delete: impl Fn(&Pod) + Send + 'static,
) -> PodStore {
    let store = PodStore::default();
    let config = watcher::Config::default().fields("status.phase!=Succeeded,status.phase!=Failed");
    let stream = retry_with(watcher(api, config), WatchBackoff::default()).modify(trim_pod);
    watches.freshness.track(POD);
    let writer = store.clone();
    let changes = watches.changes.clone();
    tokio::spawn(drive(POD, stream, watches.clone(), move |ev| {
        take_pod_event(&writer, &changes, ev, &on_delete);
    }));
    store
}

/// Takes one pod event into `store`, then records what changed: the pod, or after a relist
/// everything (pods deleted while the watch was down left the store at once).
fn take_pod_event(
    store: &PodStore,
    changes: &ChangeLog,
    ev: &watcher::Event<Pod>,
    on_delete: &impl Fn(&Pod),
) {
    store.apply(ev);
    match ev {
        watcher::Event::Apply(pod) => changes.pod(pod_key(pod).into()),
        watcher::Event::Delete(pod) => {
            changes.pod(pod_key(pod).into());
            on_delete(pod);
        }
        watcher::Event::InitDone => changes.everything("pods listed again"),
        watcher::Event::Init | watcher::Event::InitApply(_) => {}
    }
}

/// Keeps of a pod what the view and the verbs read: identity, labels, annotations, owners,
/// deletion; per container its name, resources, env (framework ranks) and restart policy
/// (sidecars); the pod's node, scheduler, overhead, pod-level resources and ResourceClaims;
/// its phase and the names of its generated claims. The
/// rest (managed fields, volumes, images, probes, statuses) is most of a pod's size.
pub fn trim_pod(pod: &mut Pod) {
    let meta = &mut pod.metadata;
    meta.managed_fields = None;
    meta.finalizers = None;
    if let Some(spec) = pod.spec.as_mut() {
        let keep = |c: &mut k8s_openapi::api::core::v1::Container| {
            *c = k8s_openapi::api::core::v1::Container {
                name: std::mem::take(&mut c.name),
                resources: c.resources.take(),
                env: c.env.take(),
                restart_policy: c.restart_policy.take(),
                ..Default::default()
            };
        };
        spec.containers.iter_mut().for_each(keep);
        spec.init_containers.iter_mut().flatten().for_each(keep);
        *spec = k8s_openapi::api::core::v1::PodSpec {
            containers: std::mem::take(&mut spec.containers),
            init_containers: spec.init_containers.take(),
            node_name: spec.node_name.take(),
            scheduler_name: spec.scheduler_name.take(),
            overhead: spec.overhead.take(),
            resources: spec.resources.take(),
            resource_claims: spec.resource_claims.take(),
            ..Default::default()
        };
    }
    if let Some(status) = pod.status.as_mut() {
        *status = k8s_openapi::api::core::v1::PodStatus {
            phase: status.phase.take(),
            resource_claim_statuses: status.resource_claim_statuses.take(),
            ..Default::default()
        };
    }
}

/// The view of the cluster as it is now, from one list of each kind instead of watches: for
/// one-shot readers (`kubectl fumarole`), which ask once and exit. Kinds the API server does
/// not serve are left out as in [`start`]; `DeviceTopology` is required.
pub async fn read_once(client: &Client) -> Result<ClusterView> {
    read_once_with(client, false).await
}

/// [`read_once`], with Huawei's whole-job default for Ascend jobs when `whole_job_super_pod`
/// (as the service's `--whole-job-super-pod`).
pub async fn read_once_with(client: &Client, whole_job_super_pod: bool) -> Result<ClusterView> {
    let dt_api: Api<DeviceTopology> = Api::all(client.clone());
    if !served(&dt_api).await? {
        bail!(
            "the API server does not serve devicetopologies.topology.fumarole.dev: install deploy/crds/devicetopologies.topology.fumarole.dev.yaml"
        );
    }
    let all = ListParams::default();
    let topologies = dt_api.list(&all).await.context("listing DeviceTopology")?;
    let numatopologies =
        list_if_served(&Api::<Numatopology>::all(client.clone()), "Numatopology").await?;
    let nodes = Api::<Node>::all(client.clone())
        .list_metadata(&all)
        .await
        .context("listing Node")?;
    // The same pods the watch keeps: finished ones hold nothing.
    let pods = Api::<Pod>::all(client.clone())
        .list(
            &all.clone()
                .fields("status.phase!=Succeeded,status.phase!=Failed"),
        )
        .await
        .context("listing Pod")?;
    let claim_api: Api<ResourceClaim> = Api::all(client.clone());
    let claims = if served(&claim_api).await? {
        let list = claim_api
            .list(&all)
            .await
            .context("listing ResourceClaim")?;
        Claims::new(list.items.iter())
    } else {
        Claims::default()
    };
    // Optional: a reader without rights on PodGroups still gets the rest.
    let pod_groups = list_if_served(
        &Api::<DynamicObject>::all_with(client.clone(), &pod_group_resource()),
        "PodGroup",
    )
    .await
    .unwrap_or_else(|e| {
        tracing::warn!(error = %e, "PodGroups not read: sp-block / sp-fit from pod annotations only");
        Vec::new()
    });
    let sources = JobSources {
        pod_groups: pod_group_sizes(pod_groups.iter().map(|g| &g.metadata)),
        whole_job_super_pod,
    };
    let facts: Vec<PodFacts> = pods.items.iter().map(PodFacts::of).collect();
    let view = ClusterView::build_with_jobs(
        &mut ContextCache::default(),
        &topologies.items,
        &numatopologies,
        nodes.items.iter().map(|n| &n.metadata),
        &facts,
        claims,
        sources,
    )?;
    Ok(view)
}

/// Starts the reflectors, waits for their first lists, installs the first view and the API
/// client in `svc`, and returns the task that keeps the view current.
pub async fn start(
    client: Client,
    svc: Arc<Service>,
    opts: LiveOptions,
) -> Result<tokio::task::JoinHandle<()>> {
    let watches = Watches {
        changed: Arc::new(Notify::new()),
        changes: ChangeLog::default(),
        freshness: Arc::new(Freshness::new(opts.max_staleness)),
    };
    svc.set_freshness(Arc::clone(&watches.freshness));
    let dt_api: Api<DeviceTopology> = Api::all(client.clone());
    if !served_at_start(&dt_api).await? {
        bail!(
            "the API server does not serve devicetopologies.topology.fumarole.dev: install deploy/crds/devicetopologies.topology.fumarole.dev.yaml"
        );
    }
    let nt_api: Api<Numatopology> = Api::all(client.clone());
    let numatopologies = if served_at_start(&nt_api).await? {
        Some(reflect("Numatopology", nt_api, &watches))
    } else {
        tracing::warn!(
            "numatopologies.nodeinfo.volcano.sh is not served: NUMA fit has no CPU data"
        );
        None
    };
    let node_store = {
        let (store, writer) = reflector::store();
        let api: Api<PartialObjectMeta<Node>> = Api::all(client.clone());
        let stream = retry_with(
            watcher(api, watcher::Config::default()),
            WatchBackoff::default(),
        )
        .reflect(writer);
        watches.freshness.track("Node");
        tokio::spawn(drive("Node", stream, watches.clone(), |_| {}));
        store
    };
    let claim_api: Api<ResourceClaim> = Api::all(client.clone());
    let claims = if served_at_start(&claim_api).await? {
        Some(reflect("ResourceClaim", claim_api, &watches))
    } else {
        tracing::warn!(
            "resourceclaims.resource.k8s.io/v1 is not served: pods' ResourceClaims are not read"
        );
        None
    };
    let (pod_groups, pod_groups_at_start) = start_pod_groups(&client, &watches).await;
    let released = Arc::clone(&svc);
    let stores = Stores {
        topologies: reflect(DEVICE_TOPOLOGY, dt_api, &watches),
        numatopologies,
        nodes: node_store,
        pods: reflect_pods(Api::all(client.clone()), &watches, move |p: &Pod| {
            if released.decider().release(&pod_key(p)).is_some() {
                tracing::debug!(pod = %pod_key(p), "pod deleted or finished; devices released");
            }
        }),
        claims,
        pod_groups,
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
    stores.pods.wait_until_ready().await;
    if let Some(nt) = &stores.numatopologies {
        nt.wait_until_ready()
            .await
            .context("Numatopology reflector")?;
    }
    if let Some(c) = &stores.claims {
        c.wait_until_ready()
            .await
            .context("ResourceClaim reflector")?;
    }
    if pod_groups_at_start {
        stores
            .pod_groups
            .wait_until_ready()
            .await
            .context("PodGroup reflector")?;
    }
    let mut opts = opts;
    if opts.publish_hypernodes {
        let api: Api<kube::api::DynamicObject> =
            Api::all_with(client.clone(), &hypernode::resource());
        if !served_at_start(&api).await? {
            tracing::warn!(
                "hypernodes.topology.volcano.sh is not served (Volcano < 1.12?): not publishing HyperNodes"
            );
            opts.publish_hypernodes = false;
        }
    }
    let writes = opts.write_client.clone().unwrap_or_else(|| client.clone());
    svc.set_effects(Effects::new(writes, stores.pods.clone()));
    let (choices, to_write) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(bound_pods::write_choices(
        Arc::clone(&svc),
        stores.pods.clone(),
        opts.annotate_schedulers.clone(),
        to_write,
    ));
    let mut late = LoopState {
        client: client.clone(),
        choices,
        hypernodes: None,
        contexts: ContextCache::default(),
        incremental: None,
        changes: watches.changes.clone(),
        led: false,
    };
    rebuild(&stores, &svc, &opts, &mut late).await;
    tracing::info!(nodes = svc.decider().view().len(), "cluster view ready");
    if let Some(leadership) = svc.leadership().cloned() {
        tokio::spawn(terms::follow_terms(
            client,
            Arc::clone(&svc),
            leadership,
            opts.own_pod.clone(),
        ));
    }
    let changed = watches.changed;
    Ok(tokio::spawn(async move {
        let mut took = Duration::ZERO;
        loop {
            // A quiet cluster still gets commits timed out.
            let _ = tokio::time::timeout(TICK, changed.notified()).await;
            // Waiting at least as long as the last build took keeps building to half a core
            // however busy the cluster.
            tokio::time::sleep(opts.debounce.max(took)).await;
            took = rebuild(&stores, &svc, &opts, &mut late).await;
        }
    }))
}

/// What the rebuild loop remembers between rounds.
struct LoopState {
    client: Client,
    /// The pods the after-the-fact annotation ([`bound_pods::write_choices`]) is to look at.
    choices: tokio::sync::mpsc::UnboundedSender<bound_pods::Candidates>,
    /// The HyperNodes last published (`None`: not yet, or the last attempt failed).
    hypernodes: Option<BTreeMap<String, Vec<String>>>,
    /// Select contexts (and their memos) shared from one view to the next.
    contexts: ContextCache,
    /// The last view and what it needs to follow pod changes (`None` before the first view,
    /// or after a build failed).
    incremental: Option<IncrementalView>,
    /// What the watches saw change since the last round.
    changes: ChangeLog,
    /// This replica led in the last round.
    led: bool,
}

/// How a round made its view.
enum Made {
    /// From every object of the stores, for this reason.
    Full(&'static str),
    /// From the last view, the nodes (this many) and the pods that changed.
    Changes(usize, crate::core::view::Update),
}

impl Stores {
    /// The objects of each of `nodes`, held while the view takes them in.
    fn node_objects(&self, nodes: &HashSet<String>) -> Vec<HeldNode> {
        nodes
            .iter()
            .map(|name| HeldNode {
                name: name.clone(),
                topology: self.topologies.get(&reflector::ObjectRef::new(name)),
                node: self.nodes.get(&reflector::ObjectRef::new(name)),
                numa: self
                    .numatopologies
                    .as_ref()
                    .and_then(|s| s.get(&reflector::ObjectRef::new(name))),
            })
            .collect()
    }
}

/// One node's objects as the stores hold them.
struct HeldNode {
    name: String,
    topology: Option<Arc<DeviceTopology>>,
    node: Option<Arc<PartialObjectMeta<Node>>>,
    numa: Option<Arc<Numatopology>>,
}

impl HeldNode {
    fn objects(&self) -> NodeObjects<'_> {
        NodeObjects {
            name: &self.name,
            topology: self.topology.as_deref(),
            node: self.node.as_deref().map(|n| &n.metadata),
            numa: self.numa.as_deref(),
        }
    }
}

/// Makes and installs a new view (in full, or from the nodes and pods that changed:
/// [`Changes`]),
/// publishes HyperNodes if asked, then tells the choice writer which pods to look at (bound
/// pods that lack our choice). Answers how long making the view took.
async fn rebuild(
    stores: &Stores,
    svc: &Service,
    opts: &LiveOptions,
    late: &mut LoopState,
) -> Duration {
    let changes = late.changes.take();
    let full = match &late.incremental {
        None => Some("start"),
        Some(_) => changes.full,
    };
    let changed: Vec<Arc<str>> = changes.pods.into_iter().collect();
    let nodes = changes.nodes;
    let devices = changes.devices || full.is_some();
    // Off the runtime's workers, which answer the schedulers meanwhile.
    let made = {
        let stores = stores.clone();
        let mut contexts = std::mem::take(&mut late.contexts);
        let mut incremental = late.incremental.take();
        let whole_job = svc.decider().settings().whole_job_super_pod;
        let changed = changed.clone();
        tokio::task::spawn_blocking(move || {
            let started = std::time::Instant::now();
            let held = stores.node_objects(&nodes);
            let full = match (full, incremental.as_mut()) {
                (None, Some(last)) => last
                    .update_nodes(&mut contexts, held.iter().map(HeldNode::objects))
                    .map(|made| {
                        let pods = changed
                            .iter()
                            .map(|key| (Arc::clone(key), stores.pods.get(key)));
                        Made::Changes(made, last.update_pods(pods))
                    }),
                (why, _) => Err(why.unwrap_or("start")),
            };
            let made = match full {
                Ok(made) => Some(made),
                Err(why) => {
                    incremental = stores.view(&mut contexts, whole_job);
                    incremental.is_some().then_some(Made::Full(why))
                }
            };
            (incremental, contexts, made, started.elapsed())
        })
        .await
    };
    let mut took = Duration::ZERO;
    let made = match made {
        Ok((incremental, contexts, made, build)) => {
            took = build;
            late.contexts = contexts;
            late.incremental = incremental;
            match &made {
                Some(Made::Full(why)) => {
                    opts.builds.count("full");
                    tracing::info!(
                        why,
                        took = ?took,
                        pods = late.incremental.as_ref().map_or(0, IncrementalView::pods),
                        "cluster view built in full"
                    );
                }
                // A round with nothing new (a tick) hands the same view over again.
                Some(Made::Changes(0, u)) if u.pods == 0 => {}
                Some(Made::Changes(nodes, u)) => {
                    opts.builds.count("changes");
                    tracing::debug!(nodes, pods = u.pods, counted_on = u.nodes, jobs = u.jobs,
                        job_pods = u.job_pods, took = ?took, "cluster view updated");
                }
                None => {}
            }
            made
        }
        Err(e) => {
            tracing::warn!(error = %e, "building the cluster view failed; keeping the previous one");
            None
        }
    };
    let (Some(made), Some(incremental)) = (made, late.incremental.as_ref()) else {
        // Try again in full next round.
        late.changes.everything("the last build failed");
        return took;
    };
    let view = incremental.view().clone();
    let full = matches!(made, Made::Full(_));
    // Every warning after a full build (gathering them reads every pod's), when shown.
    if full && tracing::enabled!(tracing::Level::DEBUG) {
        for w in view.warnings() {
            tracing::debug!("{w}");
        }
    }
    // Super-nodes change only with a full build; a failed publication is tried again.
    let want = (opts.publish_hypernodes && (full || late.hypernodes.is_none()))
        .then(|| hypernode::desired(&view));
    let dropped = svc.decider().replace_view(view);
    if devices {
        opts.device_views
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    let leads = svc.leads();
    let newly_led = leads && !late.led;
    late.led = leads;
    if !leads {
        return took;
    }
    let view = svc.decider().view();
    for (pod, commit) in dropped {
        if view.promised_on(&pod) != Some(commit.node.as_str()) {
            tracing::debug!(pod = %pod, "commit settled");
            continue;
        }
        // Promised, never bound within the commit time-to-live: give the devices back.
        svc.withdraw(&pod, commit).await;
    }
    if let Some(want) = want {
        hypernode::publish(&late.client, want, &mut late.hypernodes).await;
    }
    // Every pod after a full build or when this replica begins to lead, else the pods
    // that changed (the writer adds those whose failed write is due again).
    let candidates = if full || newly_led {
        bound_pods::Candidates::All
    } else {
        bound_pods::Candidates::Changed(changed)
    };
    if !opts.annotate_schedulers.is_empty() && late.choices.send(candidates).is_err() {
        tracing::error!("the bound pods' choice writer has stopped");
    }
    took
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::core::request::pod_request;
    use std::collections::BTreeSet;

    fn api_error(code: u16) -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure("probe", "Test")
                .with_code(code)
                .boxed(),
        )
    }

    #[test]
    fn probe_answers_tell_missing_from_forbidden() {
        assert_eq!(Readable::of(&Ok::<(), _>(())), Readable::Yes);
        assert_eq!(
            Readable::of::<()>(&Err(api_error(404))),
            Readable::NotServed
        );
        assert_eq!(
            Readable::of::<()>(&Err(api_error(403))),
            Readable::Forbidden
        );
        assert_eq!(
            Readable::of::<()>(&Err(api_error(401))),
            Readable::Forbidden
        );
        assert_eq!(Readable::of::<()>(&Err(api_error(503))), Readable::Failing);
    }

    /// The probe waits 30 s, then doubling, never more than 5 min between probes.
    #[test]
    fn pod_group_probes_back_off_to_five_minutes() {
        let secs: Vec<u64> = pod_group_probe_delays()
            .take(7)
            .map(|d| d.as_secs())
            .collect();
        assert_eq!(secs, [30, 60, 120, 240, 300, 300, 300]);
    }

    /// Not served, then forbidden (CRD installed, RBAC not yet), then readable: the wait ends
    /// at the first readable answer, after one probe per delay, and logs each new answer once
    /// (not the repeated ones).
    #[tokio::test]
    async fn waiting_for_pod_groups_ends_when_readable_and_logs_changes_once() {
        let answers = std::sync::Mutex::new(vec![
            Readable::NotServed,
            Readable::NotServed,
            Readable::Forbidden,
            Readable::Forbidden,
            Readable::Yes,
            Readable::NotServed,
        ]);
        let probes = std::sync::atomic::AtomicUsize::new(0);
        let probe = || {
            probes.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let answer = answers.lock().unwrap().remove(0);
            async move { (answer, String::new()) }
        };
        let delays = std::iter::repeat(Duration::from_millis(1));
        let logged = wait_until_readable(Readable::NotServed, probe, delays.clone()).await;
        assert_eq!(logged, [Readable::Forbidden, Readable::Yes]);
        assert_eq!(probes.load(std::sync::atomic::Ordering::SeqCst), 5);
        // Readable from the start: no probe, nothing logged.
        let probes = std::sync::atomic::AtomicUsize::new(0);
        let counted = || {
            probes.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async { (Readable::Yes, String::new()) }
        };
        assert!(
            wait_until_readable(Readable::Yes, counted, delays)
                .await
                .is_empty()
        );
        assert_eq!(probes.load(std::sync::atomic::Ordering::SeqCst), 0);
    }

    /// A trimmed pod asks for the same devices, in the same unit, as the whole pod.
    #[test]
    fn trimming_keeps_what_the_view_reads() {
        let full: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "w-3", "namespace": "ml", "uid": "u",
                "labels": {"volcano.sh/job-name": "w", "volcano.sh/task-spec": "worker"},
                "annotations": {"fumarole.dev/gpu-group-size": "16"},
                "ownerReferences": [{"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
                    "name": "w", "uid": "j"}],
                "managedFields": [{"manager": "kubectl", "operation": "Apply",
                    "fieldsV1": {"f:spec": {}}}]},
            "spec": {"schedulerName": "volcano", "nodeName": "n1",
                "volumes": [{"name": "data", "emptyDir": {}}],
                "initContainers": [{"name": "sidecar", "image": "s", "restartPolicy": "Always",
                    "resources": {"limits": {"cpu": "1"}}}],
                "containers": [{"name": "main", "image": "trainer:latest", "command": ["python"],
                    "env": [{"name": "RANK", "value": "3"}],
                    "resources": {"limits": {"nvidia.com/gpu": "4"}}}]},
            "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}]}
        }))
        .unwrap();
        let mut trimmed = full.clone();
        trim_pod(&mut trimmed);
        assert!(trimmed.metadata.managed_fields.is_none());
        assert!(trimmed.spec.as_ref().unwrap().volumes.is_none());
        assert!(trimmed.spec.as_ref().unwrap().containers[0].image.is_none());
        assert!(trimmed.status.as_ref().unwrap().conditions.is_none());
        let resources = BTreeSet::from(["nvidia.com/gpu"]);
        let jobs = crate::core::unit::Jobs::of([&full]);
        let a = pod_request(&full, &resources, &jobs).unwrap();
        let b = pod_request(
            &trimmed,
            &resources,
            &crate::core::unit::Jobs::of([&trimmed]),
        )
        .unwrap();
        assert_eq!(format!("{a:?}"), format!("{b:?}"));
    }

    /// A trimmed pod keeps its ResourceClaims and the names of its generated claims, so it
    /// asks through them as the whole pod does.
    #[test]
    fn trimming_keeps_the_claims() {
        use crate::core::claims::Claims;
        use crate::core::claims::testing::claim;
        use crate::core::request::pod_request_in;
        let full: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ml"},
            "spec": {"resourceClaims": [
                    {"name": "a", "resourceClaimName": "two"},
                    {"name": "b", "resourceClaimTemplateName": "tpl"}],
                "volumes": [{"name": "data", "emptyDir": {}}],
                "containers": [{"name": "main", "image": "x",
                    "resources": {"claims": [{"name": "a"}, {"name": "b"}]}}]},
            "status": {"phase": "Pending",
                "conditions": [{"type": "PodScheduled", "status": "False"}],
                "resourceClaimStatuses": [{"name": "b", "resourceClaimName": "p-b-1"}]}
        }))
        .unwrap();
        let mut trimmed = full.clone();
        trim_pod(&mut trimmed);
        assert!(trimmed.spec.as_ref().unwrap().volumes.is_none());
        let npu = "npu.fumarole.dev";
        let claims = Claims::new(&[claim("two", npu, 2, None), claim("p-b-1", npu, 3, None)]);
        let resources = BTreeSet::from([npu]);
        let jobs = crate::core::unit::Jobs::default();
        let a = pod_request_in(&full, &resources, &jobs, &claims).unwrap();
        let b = pod_request_in(&trimmed, &resources, &jobs, &claims).unwrap();
        assert_eq!(a, b);
        assert_eq!((b.devices.resource.as_str(), b.devices.count), (npu, 5));
    }

    /// Views are counted by how they were made, under the name the live_scale bench reads.
    #[test]
    fn view_builds_are_served_by_how() {
        let builds = ViewBuilds::default();
        let mut registry =
            prometheus_client::registry::Registry::with_prefix("fumarole_scheduler_ext");
        builds.register(&mut registry);
        builds.count("full");
        builds.count("changes");
        builds.count("changes");
        assert_eq!((builds.get("full"), builds.get("changes")), (1, 2));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains(r#"fumarole_scheduler_ext_view_builds_total{how="full"} 1"#)
                && text.contains(r#"fumarole_scheduler_ext_view_builds_total{how="changes"} 2"#),
            "{text}"
        );
    }

    /// Pod events are recorded by pod, a relist or another kind's event as a full build,
    /// and taking the log empties it.
    #[tokio::test]
    async fn watches_record_what_changed() {
        let watches = Watches {
            changed: Arc::new(Notify::new()),
            changes: ChangeLog::default(),
            freshness: Arc::new(Freshness::new(Duration::from_secs(30))),
        };
        let pod = |name: &str| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name, "namespace": "ml"},
                "spec": {"containers": []}
            }))
            .unwrap()
        };
        let store = PodStore::default();
        let changes = watches.changes.clone();
        let events: Vec<Result<watcher::Event<Pod>, watcher::Error>> = vec![
            Ok(watcher::Event::Apply(pod("a"))),
            Ok(watcher::Event::Delete(pod("b"))),
            Ok(watcher::Event::Apply(pod("a"))),
        ];
        let deleted = std::sync::Mutex::new(Vec::new());
        let on_delete = |p: &Pod| deleted.lock().unwrap().push(pod_key(p));
        drive(POD, futures::stream::iter(events), watches.clone(), |ev| {
            take_pod_event(&store, &changes, ev, &on_delete);
        })
        .await;
        let taken = watches.changes.take();
        let mut pods: Vec<&str> = taken.pods.iter().map(AsRef::as_ref).collect();
        pods.sort();
        assert_eq!((pods, taken.full), (vec!["ml/a", "ml/b"], None));
        assert_eq!(*deleted.lock().unwrap(), ["ml/b"]);
        // The change is in the store when it is recorded.
        assert!(store.get("ml/a").is_some());
        assert!(watches.changes.take().pods.is_empty());
        // A relist: everything.
        let relist: Vec<Result<watcher::Event<Pod>, watcher::Error>> = vec![
            Ok(watcher::Event::Init),
            Ok(watcher::Event::InitApply(pod("c"))),
            Ok(watcher::Event::InitDone),
        ];
        drive(POD, futures::stream::iter(relist), watches.clone(), |ev| {
            take_pod_event(&store, &changes, ev, &on_delete);
        })
        .await;
        assert_eq!(watches.changes.take().full, Some("pods listed again"));
        // A node's objects listed again: everything.
        let nodes: Vec<Result<watcher::Event<Node>, watcher::Error>> =
            vec![Ok(watcher::Event::Init), Ok(watcher::Event::InitDone)];
        drive(
            "Node",
            futures::stream::iter(nodes),
            watches.clone(),
            |_| (),
        )
        .await;
        assert_eq!(watches.changes.take().full, Some("Node"));
        // A node's own object: that node.
        let node: Node =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "gpu-1"}})).unwrap();
        let applied: Vec<Result<watcher::Event<Node>, watcher::Error>> =
            vec![Ok(watcher::Event::Apply(node))];
        drive(
            "Node",
            futures::stream::iter(applied),
            watches.clone(),
            |_| (),
        )
        .await;
        let taken = watches.changes.take();
        assert_eq!(
            (taken.nodes.into_iter().collect::<Vec<_>>(), taken.full),
            (vec!["gpu-1".to_string()], None)
        );
        // Another kind: everything.
        let claim: Node =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "claim"}})).unwrap();
        let applied: Vec<Result<watcher::Event<Node>, watcher::Error>> =
            vec![Ok(watcher::Event::Apply(claim))];
        drive(
            "ResourceClaim",
            futures::stream::iter(applied),
            watches.clone(),
            |_| (),
        )
        .await;
        assert_eq!(watches.changes.take().full, Some("ResourceClaim"));
        // A PodGroup's watch records its changes itself ([`PodGroupsRead`]).
        let group: Node =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "pg"}})).unwrap();
        let applied: Vec<Result<watcher::Event<Node>, watcher::Error>> =
            vec![Ok(watcher::Event::Apply(group))];
        drive(
            POD_GROUP,
            futures::stream::iter(applied),
            watches.clone(),
            |_| (),
        )
        .await;
        assert_eq!(watches.changes.take().full, None);
    }

    fn pod_group(name: &str, annotations: serde_json::Value) -> PartialObjectMeta<DynamicObject> {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "scheduling.volcano.sh/v1beta1",
            "kind": "PodGroup",
            "metadata": {"name": name, "namespace": "ml", "annotations": annotations},
        }))
        .unwrap()
    }

    #[test]
    fn only_a_pod_groups_sp_block_or_sp_fit_changes_the_view() {
        use watcher::Event::{Apply, Delete, Init, InitApply, InitDone};
        let mut read = PodGroupsRead::default();
        let plain = || pod_group("pg", serde_json::json!({"volcano.sh/status": "Running"}));
        let block = |b: &str| pod_group("pg", serde_json::json!({"sp-block": b, "x": "1"}));
        // The first list: a group with sp-block counts, one without does not.
        assert!(!read.changes_view(&Init));
        assert!(!read.changes_view(&InitApply(block("16"))));
        assert!(!read.changes_view(&InitApply(pod_group("other", serde_json::json!({})))));
        assert!(read.changes_view(&InitDone));
        // Status updates and other annotations: nothing.
        assert!(!read.changes_view(&Apply(block("16"))));
        assert!(!read.changes_view(&Apply(pod_group(
            "pg",
            serde_json::json!({"sp-block": "16", "x": "2"})
        ))));
        assert!(!read.changes_view(&Apply(pod_group("other", serde_json::json!({"a": "b"})))));
        // sp-block changed, sp-fit added, sp-block removed: each counts once.
        assert!(read.changes_view(&Apply(block("8"))));
        assert!(!read.changes_view(&Apply(block("8"))));
        assert!(read.changes_view(&Apply(pod_group(
            "pg",
            serde_json::json!({"sp-block": "8", "sp-fit": "idlest"})
        ))));
        assert!(read.changes_view(&Apply(plain())));
        assert!(!read.changes_view(&Apply(plain())));
        // Deleting a group that counted counts; one that did not, not.
        assert!(read.changes_view(&Apply(block("8"))));
        assert!(read.changes_view(&Delete(block("8"))));
        assert!(!read.changes_view(&Delete(plain())));
        // A relist that finds what was seen changes nothing; one that finds a group gone does.
        assert!(read.changes_view(&Apply(block("4"))));
        for (listed, changed) in [(vec![block("4")], false), (vec![], true)] {
            assert!(!read.changes_view(&Init));
            for g in listed {
                assert!(!read.changes_view(&InitApply(g)));
            }
            assert_eq!(read.changes_view(&InitDone), changed);
        }
    }

    #[tokio::test]
    async fn a_watch_that_only_restarts_stays_failing() {
        let watches = Watches {
            changed: Arc::new(Notify::new()),
            changes: ChangeLog::default(),
            freshness: Arc::new(Freshness::new(Duration::ZERO)),
        };
        watches.freshness.track("Node");
        let listed: Vec<Result<watcher::Event<Node>, watcher::Error>> =
            vec![Ok(watcher::Event::Init), Ok(watcher::Event::InitDone)];
        drive(
            "Node",
            futures::stream::iter(listed),
            watches.clone(),
            |_| (),
        )
        .await;
        assert!(watches.freshness.check().is_ok());

        // A failed list, then the watcher's own restart: no request has succeeded since.
        let restarts: Vec<Result<watcher::Event<Node>, watcher::Error>> = vec![
            Err(watcher::Error::InitialListFailed(api_error(503))),
            Ok(watcher::Event::Init),
        ];
        drive(
            "Node",
            futures::stream::iter(restarts),
            watches.clone(),
            |_| (),
        )
        .await;
        tokio::time::sleep(Duration::from_millis(5)).await;
        let stale = watches.freshness.check().unwrap_err();
        assert!(stale.contains("Node watch failing"), "{stale}");

        // A list that answers is a sign of life.
        let relisted: Vec<Result<watcher::Event<Node>, watcher::Error>> =
            vec![Ok(watcher::Event::InitDone)];
        drive(
            "Node",
            futures::stream::iter(relisted),
            watches.clone(),
            |_| (),
        )
        .await;
        assert!(watches.freshness.check().is_ok());
    }
}
