//! The kubelet device-plugin gRPC service for one resource.
//!
//! Health lives in a `watch` channel: whoever checks devices sends the new health vector and
//! every `ListAndWatch` stream forwards it to the kubelet at once. Link weights can change
//! too (a fabric link that goes down, [`DevicePluginService::update_links`]): `select` then
//! works on the lowered weights. `GetPreferredAllocation`
//! prefers the scheduler extension's choice for the pod being admitted
//! ([`crate::admission`]), else `topology::select` over this resource's devices, with a
//! context built once; `Allocate` checks what the kubelet took against that preference.

use std::collections::BTreeSet;
use std::pin::Pin;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, Instant};

use fumarole_topology::annotation::ascend;
use fumarole_topology::{NodeTopology, Vendor};
use fumarole_topology::{SelectContext, SelectError};
use tokio::sync::watch;
use tokio_stream::wrappers::WatchStream;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status};

use crate::admission::{Admissions, AwaitChoice, BoundPod, ContainerRequest, Decision, PodSource};
use crate::api;
use crate::api::device_plugin_server::DevicePlugin;
use crate::resources::Resource;

/// The kubelet's health strings.
pub const HEALTHY: &str = "Healthy";
pub const UNHEALTHY: &str = "Unhealthy";

/// One resource's plugin. Cheap to clone (shared state).
#[derive(Clone)]
pub struct DevicePluginService {
    inner: Arc<Inner>,
}

/// What to prefer for one container.
enum Choice {
    /// The scheduler's devices for the pod being admitted.
    Scheduler(Vec<String>),
    /// Choose with `select`, keeping off `avoid` (other waiting pods' choices) if possible.
    Select { avoid: BTreeSet<String> },
}

/// How often a request waiting for a pod or its choice looks again.
const AWAIT_POLL: Duration = Duration::from_millis(50);

/// The node's pods, when running against an API server: where the scheduler's choices come
/// from and where outcomes are reported.
#[derive(Clone)]
pub struct Pods {
    pub source: Arc<dyn PodSource>,
    pub await_choice: AwaitChoice,
}

struct Inner {
    resource: Resource,
    pods: Option<Pods>,
    admissions: Admissions,
    /// Weights among this resource's devices, for `select` (replaced when links change).
    select: RwLock<Arc<SelectContext>>,
    health: watch::Receiver<Vec<bool>>,
}

impl DevicePluginService {
    /// The service for `resource` on `topology`, and the sender that updates device health
    /// (one flag per device of the resource, in order). Fails only if the topology's link
    /// matrix is inconsistent.
    pub fn new(
        topology: &NodeTopology,
        resource: Resource,
        pods: Option<Pods>,
    ) -> Result<(Self, watch::Sender<Vec<bool>>), SelectError> {
        let select = SelectContext::from_weights(&weights(topology, &resource))?;
        let (tx, rx) = watch::channel(resource.devices.iter().map(|d| d.healthy).collect());
        let mut admissions = Admissions::new(
            &resource.name,
            resource.devices.iter().map(|d| d.id.clone()),
        );
        // Huawei's scheduler names an Ascend resource's NPUs by physical id: the davinci number.
        if resource.vendor == Vendor::Huawei
            && let Some(chip) = ascend::chip_of(&resource.name)
        {
            admissions = admissions.with_ascend_names(
                chip,
                resource.devices.iter().map(|d| (d.index, d.id.clone())),
            );
        }
        Ok((
            Self {
                inner: Arc::new(Inner {
                    admissions,
                    resource,
                    pods,
                    select: RwLock::new(Arc::new(select)),
                    health: rx,
                }),
            },
            tx,
        ))
    }

    pub fn resource(&self) -> &Resource {
        &self.inner.resource
    }

    /// Takes the link weights among this resource's devices from `topology` (the same node,
    /// its links as health leaves them); returns whether they changed. A matrix `select`
    /// cannot use is refused and the current one kept.
    pub fn update_links(&self, topology: &NodeTopology) -> Result<bool, SelectError> {
        let weights = weights(topology, &self.inner.resource);
        let current = self.select_context();
        let same = weights.iter().enumerate().all(|(a, row)| {
            row.iter()
                .enumerate()
                .all(|(b, w)| a == b || current.weight(a, b) == *w)
        });
        if same {
            return Ok(false);
        }
        let select = SelectContext::from_weights(&weights)?;
        *self
            .inner
            .select
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Arc::new(select);
        Ok(true)
    }

    fn select_context(&self) -> Arc<SelectContext> {
        self.inner
            .select
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn devices(&self, health: &[bool]) -> api::ListAndWatchResponse {
        let r = &self.inner.resource;
        api::ListAndWatchResponse {
            devices: r
                .advertised()
                .into_iter()
                .map(|(id, i)| {
                    let healthy = health.get(i).copied().unwrap_or(false);
                    api::Device {
                        id,
                        health: if healthy { HEALTHY } else { UNHEALTHY }.into(),
                        topology: r.devices[i].numa_node.map(|n| api::TopologyInfo {
                            nodes: vec![api::NumaNode { id: i64::from(n) }],
                        }),
                    }
                })
                .collect(),
        }
    }

    /// The preferred devices for one container request: the scheduler's choice for the pod
    /// being admitted (see [`crate::admission`]), else `topology::select`.
    pub async fn preferred(
        &self,
        req: &api::ContainerPreferredAllocationRequest,
    ) -> Result<Vec<String>, Status> {
        let r = &self.inner.resource;
        let invalid = |e: String| Status::invalid_argument(format!("{}: {e}", r.name));
        let k = usize::try_from(req.allocation_size)
            .ok()
            .filter(|k| *k > 0)
            .ok_or_else(|| {
                invalid(format!(
                    "allocation size {} must be positive",
                    req.allocation_size
                ))
            })?;
        if r.sharing.is_some() {
            // Replicas: the scheduler chooses whole devices only, so there is no choice to
            // wait for (issue 39).
            return r
                .choose_replicas(&req.available_device_i_ds, &req.must_include_device_i_ds, k)
                .map_err(|e| invalid(e.to_string()));
        }
        let free = r
            .positions(&req.available_device_i_ds)
            .map_err(|e| invalid(e.to_string()))?;
        let must = r
            .positions(&req.must_include_device_i_ds)
            .map_err(|e| invalid(e.to_string()))?;
        // MIG devices: no scheduler choice to wait for either; `select` over their GPUs' links.
        let avoid = if r.placed_by_scheduler() {
            match self.scheduler_choice(req, k).await {
                Choice::Scheduler(ids) => return Ok(ids),
                Choice::Select { avoid } => avoid,
            }
        } else {
            BTreeSet::new()
        };
        // Keep off the devices chosen for the other waiting pods when enough others are free.
        let spare: Vec<usize> = free
            .iter()
            .copied()
            .filter(|&i| !avoid.contains(&r.devices[i].id) || must.contains(&i))
            .collect();
        let pool = if spare.len() >= k { &spare } else { &free };
        let chosen = self
            .select_context()
            .select(pool, &must, k)
            .map_err(|e| invalid(e.to_string()))?;
        Ok(chosen
            .devices
            .into_iter()
            .map(|i| r.devices[i].id.clone())
            .collect())
    }

    /// The scheduler's devices for the pod being admitted, waiting a bounded time for the pod
    /// or its choice to arrive; else (after reporting why, when the pod is known) `select`
    /// decides, keeping off the devices chosen for other waiting pods.
    async fn scheduler_choice(
        &self,
        req: &api::ContainerPreferredAllocationRequest,
        k: usize,
    ) -> Choice {
        let Some(pods) = self.inner.pods.as_ref() else {
            return Choice::Select {
                avoid: BTreeSet::new(),
            };
        };
        let r = &self.inner.resource;
        let request = ContainerRequest {
            available: &req.available_device_i_ds,
            must_include: &req.must_include_device_i_ds,
            size: k,
        };
        let start = Instant::now();
        self.reconcile(&pods.source.bound());
        loop {
            let bound = pods.source.bound();
            let decision =
                self.inner
                    .admissions
                    .decide(&bound, request, &pods.await_choice, start.elapsed());
            match decision {
                Decision::Prefer { pod, devices } => {
                    tracing::info!(pod = %pod, resource = %r.name, devices = ?devices,
                        waited = ?start.elapsed(), "preferring the scheduler's devices");
                    if let Some(overruled) = self.inner.admissions.overruled(&pod) {
                        pods.source.report(&pod, &r.name, &overruled);
                    }
                    return Choice::Scheduler(devices);
                }
                Decision::Select {
                    pod: Some(pod),
                    outcome,
                } => {
                    pods.source.report(&pod, &r.name, &outcome);
                    let avoid = self.inner.admissions.spoken_for(&bound, Some(&pod.uid));
                    return Choice::Select { avoid };
                }
                Decision::Select { pod: None, .. } => {
                    tracing::info!(resource = %r.name, waited = ?start.elapsed(),
                        "no pod bound to this node is waiting for this resource; choosing with select");
                    let avoid = self.inner.admissions.spoken_for(&bound, None);
                    return Choice::Select { avoid };
                }
                Decision::Wait => tokio::time::sleep(AWAIT_POLL).await,
            }
        }
    }

    /// Takes the kubelet's account (PodResources) of which pod holds which devices where this
    /// plugin's differs ([`Admissions::reconcile`]), and reports each pod it corrected.
    fn reconcile(&self, bound: &[BoundPod]) {
        let Some(pods) = &self.inner.pods else {
            return;
        };
        for (pod, outcome) in self.inner.admissions.reconcile(bound) {
            pods.source
                .report(&pod, &self.inner.resource.name, &outcome);
        }
    }

    /// Records the devices `Allocate` gave, reports whether they are the scheduler's and, for
    /// an Ascend resource, writes the pod's `huawei.com/AscendReal` (what training jobs read).
    fn allocated(&self, devices: &[String]) {
        let Some(pods) = &self.inner.pods else {
            return;
        };
        let bound = pods.source.bound();
        let admissions = &self.inner.admissions;
        admissions.retain(&bound);
        self.reconcile(&bound);
        let Some((pod, outcome)) = admissions.allocated(&bound, devices) else {
            return;
        };
        if let Some(outcome) = outcome {
            pods.source
                .report(&pod, &self.inner.resource.name, &outcome);
        }
        if let Some(real) = admissions.ascend_real(&pod) {
            pods.source
                .annotate(&pod, ascend::ASCEND_REAL_ANNOTATION, &real);
        }
    }
}

/// The weights among `resource`'s devices in `topology`.
fn weights(topology: &NodeTopology, resource: &Resource) -> Vec<Vec<u32>> {
    resource
        .devices
        .iter()
        .map(|a| {
            resource
                .devices
                .iter()
                .map(|b| topology.links.weight(a.position, b.position))
                .collect()
        })
        .collect()
}

type ListAndWatchStream =
    Pin<Box<dyn Stream<Item = Result<api::ListAndWatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl DevicePlugin for DevicePluginService {
    async fn get_device_plugin_options(
        &self,
        _: Request<api::Empty>,
    ) -> Result<Response<api::DevicePluginOptions>, Status> {
        Ok(Response::new(api::DevicePluginOptions {
            pre_start_required: false,
            get_preferred_allocation_available: true,
        }))
    }

    type ListAndWatchStream = ListAndWatchStream;

    async fn list_and_watch(
        &self,
        _: Request<api::Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let this = self.clone();
        // The first item is the current list; then one per health change.
        let stream = WatchStream::new(self.inner.health.clone())
            .map(move |health| Ok(this.devices(&health)));
        Ok(Response::new(Box::pin(stream)))
    }

    async fn get_preferred_allocation(
        &self,
        request: Request<api::PreferredAllocationRequest>,
    ) -> Result<Response<api::PreferredAllocationResponse>, Status> {
        let mut container_responses = Vec::new();
        for req in &request.into_inner().container_requests {
            container_responses.push(api::ContainerPreferredAllocationResponse {
                device_i_ds: self.preferred(req).await?,
            });
        }
        Ok(Response::new(api::PreferredAllocationResponse {
            container_responses,
        }))
    }

    async fn allocate(
        &self,
        request: Request<api::AllocateRequest>,
    ) -> Result<Response<api::AllocateResponse>, Status> {
        let r = &self.inner.resource;
        let requests = request.into_inner();
        let container_responses = requests
            .container_requests
            .iter()
            .map(|c| {
                r.allocate(&c.devices_ids)
                    .map_err(|e| Status::invalid_argument(format!("{}: {e}", r.name)))
            })
            .collect::<Result<Vec<_>, Status>>()?;
        if container_responses.is_empty() {
            return Err(Status::invalid_argument(format!(
                "{}: no container requests",
                r.name
            )));
        }
        // What the scheduler chose is recorded for whole devices only; it does not place
        // replicas or MIG devices yet.
        if r.placed_by_scheduler() {
            for c in &requests.container_requests {
                self.allocated(&c.devices_ids);
            }
        }
        Ok(Response::new(api::AllocateResponse {
            container_responses,
        }))
    }

    async fn pre_start_container(
        &self,
        _: Request<api::PreStartContainerRequest>,
    ) -> Result<Response<api::PreStartContainerResponse>, Status> {
        Ok(Response::new(api::PreStartContainerResponse {}))
    }
}
