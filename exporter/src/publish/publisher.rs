use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use fumarole_topology::dra;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource};
use serde_json::{Value, json};
use tokio::sync::Notify;

use super::ascend;
use super::collect::NodeCollector;
use super::desired::Desired;
use super::metrics::Metrics;
use super::objects::LABEL_PREFIX;
use super::settings::PublishOptions;
use super::slices;
use fumarole_topology::every::Every;

/// How often one failing watch is logged at warning (403, 410 loops and outages retry often).
const WATCH_WARN_EVERY: Duration = Duration::from_secs(30);

/// Our server-side apply field manager.
pub const FIELD_MANAGER: &str = "fumarole-exporter";

/// The objects, by what we write of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Numatopology,
    NodeResourceTopology,
    DeviceTopology,
    DeviceTopologyStatus,
    NodeLabels,
    /// Slice `k` of the pool of driver `gpu.fumarole.dev`.
    GpuSlice(usize),
    /// Slice `k` of the pool of driver `npu.fumarole.dev`.
    NpuSlice(usize),
    /// Huawei's device-info ConfigMap `kube-system/mindx-dl-deviceinfo-<node>`.
    AscendDeviceInfo,
}

impl Kind {
    const ALL: [Kind; 8] = [
        Kind::Numatopology,
        Kind::NodeResourceTopology,
        Kind::DeviceTopology,
        Kind::DeviceTopologyStatus,
        Kind::NodeLabels,
        Kind::GpuSlice(0),
        Kind::NpuSlice(0),
        Kind::AscendDeviceInfo,
    ];

    /// Objects of their own for the node, owned by its Node so they go when it goes.
    fn owned_by_node(self) -> bool {
        !matches!(self, Kind::DeviceTopologyStatus | Kind::NodeLabels)
    }

    /// The DRA driver and the number of the ResourceSlice this kind is.
    fn pool_slice(self) -> Option<(&'static str, usize)> {
        match self {
            Kind::GpuSlice(k) => Some((dra::GPU_DRIVER, k)),
            Kind::NpuSlice(k) => Some((dra::NPU_DRIVER, k)),
            _ => None,
        }
    }

    /// Slice `k` of the pool of `driver`.
    fn slice(driver: &str, k: usize) -> Kind {
        if driver == dra::NPU_DRIVER {
            Kind::NpuSlice(k)
        } else {
            Kind::GpuSlice(k)
        }
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Numatopology => "numatopology",
            Kind::NodeResourceTopology => "noderesourcetopology",
            Kind::DeviceTopology => "devicetopology",
            Kind::DeviceTopologyStatus => "devicetopology-status",
            Kind::NodeLabels => "node-labels",
            Kind::GpuSlice(_) => "resourceslice-gpu",
            Kind::NpuSlice(_) => "resourceslice-npu",
            Kind::AscendDeviceInfo => "configmap-ascend-device-info",
        }
    }
}

fn resource(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: if group.is_empty() {
            version.into()
        } else {
            format!("{group}/{version}")
        },
        kind: kind.into(),
        plural: plural.into(),
    }
}

/// Watched live copies of one object kind, narrowed to this node's object.
struct Watched {
    api: Api<DynamicObject>,
    ar: ApiResource,
    store: Store<DynamicObject>,
}

/// What we last wrote, and the resourceVersion the API server gave it.
#[derive(Default)]
struct Applied {
    body: Option<Value>,
    resource_version: Option<String>,
}

/// Writes one node's objects.
pub struct Publisher {
    node: String,
    numatopology: Watched,
    nrt: Watched,
    device_topology: Watched,
    nodes: Watched,
    /// Watched only when the node serves devices through DRA.
    resource_slices: Option<Watched>,
    /// Watched only with `--ascend-device-info`.
    ascend_device_info: Option<Watched>,
    /// The Ascend device lists last rendered and their `UpdateTime`.
    ascend_last: Option<(BTreeMap<String, String>, i64)>,
    applied: BTreeMap<Kind, Applied>,
    metrics: Arc<Metrics>,
}

impl Publisher {
    /// Starts watching this node's objects; every change to them pokes `wake`. With
    /// `options.dra`, its ResourceSlices too; with `options.ascend_device_info`, its Ascend
    /// device-info ConfigMap (in `kube-system`, by name).
    pub fn new(
        client: Client,
        node: &str,
        options: &PublishOptions,
        metrics: Arc<Metrics>,
        wake: Arc<Notify>,
    ) -> Self {
        let (dra, ascend) = (options.dra.is_some(), options.ascend_device_info);
        // Every object's counters exist from the start, so rate() and alerts see 0, not nothing.
        for kind in Kind::ALL {
            metrics.objects_known(kind.name());
        }
        let by_name = format!("metadata.name={node}");
        let watch_in = |api: Api<DynamicObject>, ar: ApiResource, fields: &str| {
            let writer = reflector::store::Writer::new(ar.clone());
            let store = writer.as_reader();
            let stream = reflector::reflector(
                writer,
                fumarole_watch_retry::retry(watcher(
                    api.clone(),
                    watcher::Config::default().fields(fields),
                )),
            )
            .touched_objects();
            let wake = wake.clone();
            let kind = ar.kind.clone();
            tokio::spawn(async move {
                futures::pin_mut!(stream);
                // One warning per WATCH_WARN_EVERY for a failing watch, the rest at debug.
                let mut warn = Every::new(WATCH_WARN_EVERY);
                while let Some(event) = stream.next().await {
                    match event {
                        Err(e) if warn.due(std::time::Instant::now()) => {
                            tracing::warn!(kind, error = %e, "watch failing; retrying");
                        }
                        Err(e) => tracing::debug!(kind, error = %e, "watch failing; retrying"),
                        Ok(_) => {}
                    }
                    wake.notify_one();
                }
            });
            Watched { api, ar, store }
        };
        let watch = |ar: ApiResource, fields: &str| {
            watch_in(Api::all_with(client.clone(), &ar), ar, fields)
        };
        Publisher {
            node: node.to_string(),
            numatopology: watch(
                resource(
                    "nodeinfo.volcano.sh",
                    "v1alpha1",
                    "Numatopology",
                    "numatopologies",
                ),
                &by_name,
            ),
            nrt: watch(
                resource(
                    "topology.node.k8s.io",
                    "v1alpha2",
                    "NodeResourceTopology",
                    "noderesourcetopologies",
                ),
                &by_name,
            ),
            device_topology: watch(
                resource(
                    "topology.fumarole.dev",
                    "v1alpha1",
                    "DeviceTopology",
                    "devicetopologies",
                ),
                &by_name,
            ),
            nodes: watch(ApiResource::erase::<Node>(&()), &by_name),
            resource_slices: dra.then(|| {
                watch(
                    ApiResource::erase::<ResourceSlice>(&()),
                    &format!("spec.nodeName={node}"),
                )
            }),
            ascend_device_info: ascend.then(|| {
                let ar = ApiResource::erase::<ConfigMap>(&());
                watch_in(
                    Api::namespaced_with(client.clone(), ascend::NAMESPACE, &ar),
                    ar,
                    &format!("metadata.name={}", ascend::configmap_name(node)),
                )
            }),
            ascend_last: None,
            applied: BTreeMap::new(),
            metrics,
        }
    }

    /// Applies every object whose desired content differs from what is there. Returns the
    /// number of writes; an error stops at the first failed write (the caller backs off),
    /// except a kind the API server does not serve (404: its CRD is not installed, as Volcano's
    /// on a DRA-only cluster), which is skipped so the other objects are still published.
    pub async fn publish(&mut self, desired: &Desired) -> Result<usize, kube::Error> {
        let mut bodies: Vec<(Kind, Option<Value>)> = Vec::new();
        if let Some(spec) = &desired.numatopology {
            bodies.push((Kind::Numatopology, Some(json!({ "spec": spec }))));
        }
        if let Some(nrt) = &desired.node_resource_topology {
            let body = serde_json::to_value(nrt).unwrap_or_default();
            bodies.push((Kind::NodeResourceTopology, Some(body)));
        }
        if let Some((spec, status)) = &desired.device_topology {
            bodies.push((Kind::DeviceTopology, Some(json!({ "spec": spec }))));
            bodies.push((
                Kind::DeviceTopologyStatus,
                Some(json!({ "status": status })),
            ));
        }
        if let Some(labels) = &desired.labels {
            let body = json!({ "metadata": { "labels": labels } });
            bodies.push((Kind::NodeLabels, Some(body)));
        }
        if let Some(pools) = &desired.resource_slices {
            for driver in dra::DRIVERS {
                let mut specs: Vec<Value> = pools
                    .get(driver)
                    .into_iter()
                    .flatten()
                    .map(|spec| json!({ "spec": spec }))
                    .collect();
                let live = self.live_slices(driver);
                let generation = Self::pool_generation(driver, &live, &specs);
                for body in &mut specs {
                    body["spec"]["pool"]["generation"] = json!(generation);
                }
                // The desired slices, then those of the pool's live ones it no longer has.
                let desired = specs.len();
                for (k, body) in specs.into_iter().enumerate() {
                    bodies.push((Kind::slice(driver, k), Some(body)));
                }
                for k in (desired..slices::MAX_SLICES).filter(|k| live[*k].is_some()) {
                    bodies.push((Kind::slice(driver, k), None));
                }
            }
        }
        if let Some(info) = &desired.ascend_device_info {
            let time = self.ascend_update_time(info);
            bodies.push((Kind::AscendDeviceInfo, Some(ascend::body(info, time))));
        }
        let mut writes = 0;
        for (kind, body) in bodies {
            let result = match body {
                Some(body) => self.ensure(kind, body).await,
                // Only slices are ever absent: a driver left with no device.
                None => self.ensure_absent(kind).await,
            };
            match result {
                Ok(n) => writes += n,
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        Ok(writes)
    }

    /// The live slices of this node's pool of `driver`, by number (`None`: not there), read
    /// from the watch once.
    fn live_slices(&self, driver: &str) -> Vec<Option<Arc<DynamicObject>>> {
        let state = self
            .resource_slices
            .as_ref()
            .map(|w| w.store.state())
            .unwrap_or_default();
        (0..slices::MAX_SLICES)
            .map(|k| {
                let name = slices::slice_name(&self.node, driver, k);
                state
                    .iter()
                    .find(|o| o.metadata.name.as_deref() == Some(name.as_str()))
                    .cloned()
            })
            .collect()
    }

    /// The generation to write the pool of `driver` (its `live` slices) as `bodies` with: the live one while the
    /// live slices hold exactly `bodies`, else one past the highest live one. Consumers use
    /// only a pool's highest generation, and only once all its slices are there, so a pool
    /// rewritten slice by slice is never read half old, half new.
    fn pool_generation(driver: &str, live: &[Option<Arc<DynamicObject>>], bodies: &[Value]) -> i64 {
        let highest = live
            .iter()
            .flatten()
            .filter_map(|o| o.data["spec"]["pool"]["generation"].as_i64())
            .max()
            .unwrap_or(0);
        let without_generation = |mut v: Value| {
            if let Some(pool) = v["spec"]["pool"].as_object_mut() {
                pool.remove("generation");
            }
            v
        };
        let same = live
            .iter()
            .enumerate()
            .all(|(k, o)| match (o, bodies.get(k)) {
                (None, None) => true,
                (Some(o), Some(body)) => {
                    o.data["spec"]["pool"]["generation"].as_i64() == Some(highest)
                        && without_generation(Self::live_part(Kind::slice(driver, k), o, body))
                            == without_generation(body.clone())
                }
                _ => false,
            });
        if same && highest > 0 {
            highest
        } else {
            highest + 1
        }
    }

    /// `UpdateTime` for the device lists of `info`: moves only when they change (kept from
    /// our last rendering, or from the live object after a restart).
    fn ascend_update_time(&mut self, info: &ascend::DeviceInfo) -> i64 {
        let live = self.live(Kind::AscendDeviceInfo).and_then(|o| {
            o.data
                .get("data")?
                .get(ascend::DATA_KEY)?
                .as_str()
                .and_then(ascend::parse_live)
        });
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
        let time = ascend::update_time(
            &info.lists,
            self.ascend_last.as_ref().map(|(l, t)| (l, *t)),
            live.as_ref().map(|(l, t)| (l, *t)),
            now,
        );
        self.ascend_last = Some((info.lists.clone(), time));
        time
    }

    fn watched(&self, kind: Kind) -> Option<&Watched> {
        match kind {
            Kind::Numatopology => Some(&self.numatopology),
            Kind::NodeResourceTopology => Some(&self.nrt),
            Kind::DeviceTopology | Kind::DeviceTopologyStatus => Some(&self.device_topology),
            Kind::NodeLabels => Some(&self.nodes),
            Kind::GpuSlice(_) | Kind::NpuSlice(_) => self.resource_slices.as_ref(),
            Kind::AscendDeviceInfo => self.ascend_device_info.as_ref(),
        }
    }

    /// The name of this node's object of `kind`.
    fn object_name(&self, kind: Kind) -> String {
        match kind.pool_slice() {
            Some((driver, k)) => slices::slice_name(&self.node, driver, k),
            None if kind == Kind::AscendDeviceInfo => ascend::configmap_name(&self.node),
            None => self.node.clone(),
        }
    }

    /// The live copy of this node's object of `kind`, if the watch has it.
    fn live(&self, kind: Kind) -> Option<Arc<DynamicObject>> {
        let name = self.object_name(kind);
        self.watched(kind)?
            .store
            .state()
            .into_iter()
            .find(|o| o.metadata.name.as_deref() == Some(name.as_str()))
    }

    /// Deletes this node's object of `kind` when it exists (a driver left with no device).
    async fn ensure_absent(&mut self, kind: Kind) -> Result<usize, kube::Error> {
        let (Some(watched), Some(_)) = (self.watched(kind), self.live(kind)) else {
            self.applied.remove(&kind);
            return Ok(0);
        };
        let name = self.object_name(kind);
        match watched.api.delete(&name, &Default::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => {
                self.metrics.api_error(kind.name());
                tracing::warn!(object = kind.name(), %name, error = %e, "delete failed");
                return Err(e);
            }
        }
        self.metrics.publish(kind.name());
        tracing::info!(object = kind.name(), %name, "deleted: no device left to publish");
        self.applied.remove(&kind);
        Ok(1)
    }

    /// The part of the live object that `body` sets, in the same shape.
    fn live_part(kind: Kind, live: &DynamicObject, body: &Value) -> Value {
        let data = &live.data;
        match kind {
            Kind::Numatopology | Kind::DeviceTopology => json!({ "spec": data.get("spec") }),
            Kind::DeviceTopologyStatus => {
                // `status.colocation` belongs to the agent's co-location loops (their own field
                // manager): not ours to compare.
                let mut status = data.get("status").cloned().unwrap_or(Value::Null);
                if let Some(map) = status.as_object_mut() {
                    map.remove("colocation");
                }
                json!({ "status": status })
            }
            Kind::NodeResourceTopology => {
                let mut v = json!({ "zones": data.get("zones") });
                if let Some(a) = data.get("attributes") {
                    v["attributes"] = a.clone();
                }
                v
            }
            Kind::GpuSlice(_) | Kind::NpuSlice(_) => {
                // The API server stamps `timeAdded` on taints we leave it out of.
                let mut spec = data.get("spec").cloned().unwrap_or(Value::Null);
                for device in spec
                    .get_mut("devices")
                    .and_then(Value::as_array_mut)
                    .into_iter()
                    .flatten()
                {
                    for taint in device
                        .get_mut("taints")
                        .and_then(Value::as_array_mut)
                        .into_iter()
                        .flatten()
                    {
                        if let Some(t) = taint.as_object_mut() {
                            t.remove("timeAdded");
                        }
                    }
                }
                json!({ "spec": spec })
            }
            Kind::AscendDeviceInfo => {
                // Ours: the labels and the data key we set; others' keys are not compared.
                let set = &body["metadata"]["labels"];
                let labels: BTreeMap<&String, &String> = live
                    .metadata
                    .labels
                    .iter()
                    .flatten()
                    .filter(|(k, _)| set.get(k.as_str()).is_some())
                    .collect();
                let cfg = data
                    .get("data")
                    .and_then(|d| d.get(ascend::DATA_KEY))
                    .cloned()
                    .unwrap_or(Value::Null);
                json!({ "metadata": { "labels": labels }, "data": { ascend::DATA_KEY: cfg } })
            }
            Kind::NodeLabels => {
                // Ours: every label under our prefix, and the compatible labels (other
                // projects' keys) we set. A compatible key we do not set is not compared, so
                // a GFD beside an agent without `--compat-labels` causes no writes.
                let set = &body["metadata"]["labels"];
                let ours: BTreeMap<&String, &String> = live
                    .metadata
                    .labels
                    .iter()
                    .flatten()
                    .filter(|(k, _)| k.starts_with(LABEL_PREFIX) || set.get(k.as_str()).is_some())
                    .collect();
                json!({ "metadata": { "labels": ours } })
            }
        }
    }

    /// The owner reference to this node's Node, once the Node has been seen: the garbage
    /// collector deletes our objects with the Node. Not a controller reference, and without
    /// `blockOwnerDeletion`, so it needs no permission on the Node beyond reading it.
    fn node_owner(&self) -> Option<Value> {
        let node = self
            .nodes
            .store
            .state()
            .into_iter()
            .find(|o| o.metadata.name.as_deref() == Some(&self.node))?;
        let uid = node.metadata.uid.clone()?;
        Some(json!({"apiVersion": "v1", "kind": "Node", "name": self.node, "uid": uid}))
    }

    async fn ensure(&mut self, kind: Kind, body: Value) -> Result<usize, kube::Error> {
        let owner = kind.owned_by_node().then(|| self.node_owner()).flatten();
        let live = self.live(kind);
        let applied = self.applied.entry(kind).or_default();
        let unchanged = applied.body.as_ref() == Some(&body);
        let needed = match &live {
            // Node labels: never create a Node; the kubelet owns its existence.
            None if kind == Kind::NodeLabels => {
                if !unchanged {
                    tracing::debug!(node = %self.node, "Node object not seen yet; labels wait");
                }
                false
            }
            None => true,
            Some(obj) => {
                // Someone else changed the object since our write, and our part differs.
                let touched = obj.metadata.resource_version != applied.resource_version;
                let unowned = owner.as_ref().is_some_and(|o| {
                    !obj.metadata
                        .owner_references
                        .iter()
                        .flatten()
                        .any(|r| r.kind == "Node" && Some(r.uid.as_str()) == o["uid"].as_str())
                });
                !unchanged || unowned || (touched && Self::live_part(kind, obj, &body) != body)
            }
        };
        if !needed {
            return Ok(0);
        }
        let name = self.object_name(kind);
        let Some(watched) = self.watched(kind) else {
            tracing::warn!(object = kind.name(), "not watched; not publishing it");
            return Ok(0);
        };
        let mut full = body.clone();
        full["apiVersion"] = json!(watched.ar.api_version);
        full["kind"] = json!(watched.ar.kind);
        full["metadata"]["name"] = json!(name);
        if let Some(owner) = owner {
            full["metadata"]["ownerReferences"] = json!([owner]);
        }
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let result = match kind {
            Kind::DeviceTopologyStatus => {
                watched
                    .api
                    .patch_status(&name, &params, &Patch::Apply(&full))
                    .await
            }
            _ => {
                watched
                    .api
                    .patch(&name, &params, &Patch::Apply(&full))
                    .await
            }
        };
        match result {
            Ok(obj) => {
                self.metrics.publish(kind.name());
                tracing::info!(object = kind.name(), node = %self.node, "published");
                let applied = self.applied.entry(kind).or_default();
                applied.body = Some(body);
                applied.resource_version = obj.meta().resource_version.clone();
                Ok(1)
            }
            Err(e) => {
                self.metrics.api_error(kind.name());
                tracing::warn!(object = kind.name(), node = %self.node, error = %e, "publish failed");
                Err(e)
            }
        }
    }
}

/// The wait after `failures` failed rounds in a row: a bound doubling from 400 ms to
/// [`MAX_RETRY_DELAY`], and a random point in its upper half ("equal jitter"), so agents that
/// failed together (an API server outage) do not come back together; never shorter than what
/// the server asked for (`Retry-After`, which the API server also puts in the Status as
/// `retryAfterSeconds`), itself spread by up to a quarter.
fn retry_delay(failures: u32, retry_after: Option<Duration>, random: f64) -> Duration {
    let bound =
        Duration::from_millis(200u64.saturating_mul(1 << failures.min(8))).min(MAX_RETRY_DELAY);
    let backoff = bound / 2 + (bound / 2).mul_f64(random);
    match retry_after {
        Some(asked) => backoff.max(asked + (asked / 4).mul_f64(random)),
        None => backoff,
    }
}

/// How long the first round waits for the Node watch's first list.
const NODE_LIST_WAIT: Duration = Duration::from_secs(10);

/// The longest wait between failed rounds. An agent is current at most this long after the API
/// server is back; 200 agents retrying this often add about 27 requests/s during an outage,
/// against about 160/s from their watches' own backoff (docs/reliability.md).
pub const MAX_RETRY_DELAY: Duration = Duration::from_secs(10);

/// The `Retry-After` of a failed request, when the API server gave one (429, some 5xx).
fn retry_after(e: &kube::Error) -> Option<Duration> {
    match e {
        kube::Error::Api(status) => status
            .details
            .as_ref()
            .map(|d| d.retry_after_seconds)
            .filter(|s| *s > 0)
            .map(|s| Duration::from_secs(u64::from(s))),
        _ => None,
    }
}

/// The publish loop: read the node and build its objects (`node`), publish them, then wait for
/// the re-check interval, a poke on `wake` (a watched object changed, a device's health or
/// allocation changed), or, after a failure, the backoff delay. Never returns.
pub async fn run(
    mut publisher: Publisher,
    mut node: NodeCollector,
    recheck: Duration,
    wake: Arc<Notify>,
) {
    // The first round should already carry the Node owner reference (else every agent start
    // writes its objects twice): wait a little for the Node watch's first list, not for good
    // (a Node that cannot be listed must not stop publishing).
    if tokio::time::timeout(NODE_LIST_WAIT, publisher.nodes.store.wait_until_ready())
        .await
        .is_err()
    {
        tracing::warn!(node = %publisher.node, wait = ?NODE_LIST_WAIT, "the Node watch has not listed yet; publishing without the owner reference for now");
    }
    // Likewise the device-info ConfigMap's: after a restart its UpdateTime is kept from the
    // live object, which the first round must see.
    if let Some(w) = &publisher.ascend_device_info
        && tokio::time::timeout(NODE_LIST_WAIT, w.store.wait_until_ready())
            .await
            .is_err()
    {
        tracing::warn!(node = %publisher.node, wait = ?NODE_LIST_WAIT, "the Ascend device-info ConfigMap watch has not listed yet; its UpdateTime may move once");
    }
    let mut failures = 0u32;
    loop {
        let state = node.desired().await;
        let wait = match publisher.publish(&state).await {
            Ok(_) => {
                if failures > 0 {
                    tracing::info!(failures, "API server reachable again; objects are current");
                }
                failures = 0;
                publisher.metrics.success();
                recheck
            }
            Err(e) => {
                failures = failures.saturating_add(1);
                retry_delay(failures, retry_after(&e), fastrand::f64())
            }
        };
        publisher.metrics.tick();
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = wake.notified(), if failures == 0 => {
                // Coalesce bursts of watch events into one round.
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[test]
    fn retry_delay_grows_caps_and_spreads() {
        // The upper half of a bound doubling from 400 ms to 30 s.
        assert_eq!(retry_delay(1, None, 0.0), Duration::from_millis(200));
        assert_eq!(retry_delay(1, None, 1.0), Duration::from_millis(400));
        assert!(retry_delay(3, None, 0.0) > retry_delay(2, None, 0.0));
        assert_eq!(retry_delay(50, None, 0.0), Duration::from_secs(5));
        assert_eq!(retry_delay(50, None, 1.0), Duration::from_secs(10));
        // Agents drawing different numbers wait differently.
        assert_ne!(retry_delay(4, None, 0.1), retry_delay(4, None, 0.9));
    }

    #[test]
    fn retry_after_is_a_floor() {
        let asked = Some(Duration::from_secs(5));
        assert_eq!(retry_delay(1, asked, 0.0), Duration::from_secs(5));
        assert_eq!(retry_delay(1, asked, 1.0), Duration::from_millis(6250));
        // A longer backoff still wins.
        assert_eq!(
            retry_delay(50, Some(Duration::from_secs(1)), 0.0),
            Duration::from_secs(5)
        );
    }

    #[test]
    fn retry_after_is_read_from_the_status() {
        let status: kube::core::Status = serde_json::from_value(serde_json::json!({
            "status": "Failure", "message": "slow down", "reason": "TooManyRequests",
            "code": 429, "details": {"retryAfterSeconds": 3}
        }))
        .unwrap();
        let e = kube::Error::Api(Box::new(status));
        assert_eq!(retry_after(&e), Some(Duration::from_secs(3)));
        let no = kube::Error::Api(Box::new(
            serde_json::from_value(serde_json::json!({"status": "Failure", "code": 500})).unwrap(),
        ));
        assert_eq!(retry_after(&no), None);
    }
}
