//! The kubelet device-plugin gRPC service for one resource.
//!
//! Health lives in a `watch` channel: whoever checks devices sends the new health vector and
//! every `ListAndWatch` stream forwards it to the kubelet at once. `GetPreferredAllocation`
//! uses `topology::select` over this resource's devices, with a context built once.

use std::pin::Pin;
use std::sync::Arc;

use fumarole_topology::NodeTopology;
use fumarole_topology::{SelectContext, SelectError};
use tokio::sync::watch;
use tokio_stream::wrappers::WatchStream;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status};

use crate::annotation::PodSource;
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

struct Inner {
    resource: Resource,
    /// Pending pods with the scheduler's device choice, when running against an API server.
    pods: Option<Arc<dyn PodSource>>,
    /// Weights among this resource's devices, for `select`.
    select: SelectContext,
    health: watch::Receiver<Vec<bool>>,
}

impl DevicePluginService {
    /// The service for `resource` on `topology`, and the sender that updates device health
    /// (one flag per device of the resource, in order). Fails only if the topology's link
    /// matrix is inconsistent.
    pub fn new(
        topology: &NodeTopology,
        resource: Resource,
        pods: Option<Arc<dyn PodSource>>,
    ) -> Result<(Self, watch::Sender<Vec<bool>>), SelectError> {
        let weights: Vec<Vec<u32>> = resource
            .devices
            .iter()
            .map(|a| {
                resource
                    .devices
                    .iter()
                    .map(|b| topology.links.weight(a.position, b.position))
                    .collect()
            })
            .collect();
        let select = SelectContext::from_weights(&weights)?;
        let (tx, rx) = watch::channel(resource.devices.iter().map(|d| d.healthy).collect());
        Ok((
            Self {
                inner: Arc::new(Inner {
                    resource,
                    pods,
                    select,
                    health: rx,
                }),
            },
            tx,
        ))
    }

    pub fn resource(&self) -> &Resource {
        &self.inner.resource
    }

    fn devices(&self, health: &[bool]) -> api::ListAndWatchResponse {
        api::ListAndWatchResponse {
            devices: self
                .inner
                .resource
                .devices
                .iter()
                .zip(health.iter().chain(std::iter::repeat(&false)))
                .map(|(d, healthy)| api::Device {
                    id: d.id.clone(),
                    health: if *healthy { HEALTHY } else { UNHEALTHY }.into(),
                    topology: d.numa_node.map(|n| api::TopologyInfo {
                        nodes: vec![api::NumaNode { id: i64::from(n) }],
                    }),
                })
                .collect(),
        }
    }

    /// The preferred devices for one container request: the scheduler's choice for the
    /// oldest pending pod it fits (see [`crate::annotation`]), else `topology::select`.
    pub fn preferred(
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
        let free = r
            .positions(&req.available_device_i_ds)
            .map_err(|e| invalid(e.to_string()))?;
        let must = r
            .positions(&req.must_include_device_i_ds)
            .map_err(|e| invalid(e.to_string()))?;
        if let Some(ids) = self.scheduler_choice(req, k) {
            return Ok(ids);
        }
        let chosen = self
            .inner
            .select
            .select(&free, &must, k)
            .map_err(|e| invalid(e.to_string()))?;
        Ok(chosen
            .devices
            .into_iter()
            .map(|i| r.devices[i].id.clone())
            .collect())
    }

    /// The first `k` still-available devices the scheduler chose for a pending pod (see
    /// [`crate::annotation`]), when they cover the request's must-include devices. A pod whose
    /// choice cannot be honoured is logged with the reason, and `select` decides.
    fn scheduler_choice(
        &self,
        req: &api::ContainerPreferredAllocationRequest,
        k: usize,
    ) -> Option<Vec<String>> {
        let r = &self.inner.resource;
        for pod in self.inner.pods.as_ref()?.pending() {
            let Some(ids) = pod.devices.get(&r.name) else {
                continue;
            };
            let who = format!("{}/{}", pod.namespace, pod.name);
            let available: Vec<&String> = ids
                .iter()
                .filter(|id| req.available_device_i_ds.contains(id))
                .collect();
            if available.len() < k {
                tracing::info!(pod = %who, resource = %r.name, chosen = ?ids, wanted = k,
                    available = available.len(),
                    "not enough of the scheduler's devices are available; choosing with select");
                continue;
            }
            let picked: Vec<String> = available.into_iter().take(k).cloned().collect();
            if !req
                .must_include_device_i_ds
                .iter()
                .all(|m| picked.contains(m))
            {
                tracing::info!(pod = %who, resource = %r.name,
                    "the kubelet's must-include devices are not the scheduler's; choosing with select");
                continue;
            }
            tracing::info!(pod = %who, resource = %r.name, devices = ?picked, "using the scheduler's devices");
            return Some(picked);
        }
        None
    }
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
        let container_responses = request
            .into_inner()
            .container_requests
            .iter()
            .map(|req| {
                self.preferred(req)
                    .map(|ids| api::ContainerPreferredAllocationResponse { device_i_ds: ids })
            })
            .collect::<Result<Vec<_>, Status>>()?;
        Ok(Response::new(api::PreferredAllocationResponse {
            container_responses,
        }))
    }

    async fn allocate(
        &self,
        request: Request<api::AllocateRequest>,
    ) -> Result<Response<api::AllocateResponse>, Status> {
        let r = &self.inner.resource;
        let container_responses = request
            .into_inner()
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
