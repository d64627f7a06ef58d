//! The kubelet's DRA plugin gRPC service (v1) for one driver, over [`DriverPlugin`]: each
//! claim of a request gets its own answer, an error string where it failed.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use crate::dra::api;
use crate::dra::api::dra_plugin_server::DraPlugin;
use crate::dra::claims::ClaimRef;
use crate::dra::prepare::DriverPlugin;

/// `DRAPlugin` for one driver. Cheap to clone.
#[derive(Clone)]
pub struct DraService {
    plugin: Arc<DriverPlugin>,
}

impl DraService {
    pub fn new(plugin: Arc<DriverPlugin>) -> Self {
        Self { plugin }
    }
}

#[tonic::async_trait]
impl DraPlugin for DraService {
    async fn node_prepare_resources(
        &self,
        request: Request<api::NodePrepareResourcesRequest>,
    ) -> Result<Response<api::NodePrepareResourcesResponse>, Status> {
        let mut out = api::NodePrepareResourcesResponse::default();
        for c in &request.get_ref().claims {
            let claim = ClaimRef::from(c);
            let answer = match self.plugin.prepare(&claim).await {
                Ok(devices) => api::NodePrepareResourceResponse {
                    devices,
                    error: String::new(),
                },
                Err(e) => {
                    tracing::warn!(driver = self.plugin.driver(), %claim, error = %e, "claim not prepared");
                    api::NodePrepareResourceResponse {
                        devices: Vec::new(),
                        error: e.to_string(),
                    }
                }
            };
            out.claims.insert(c.uid.clone(), answer);
        }
        Ok(Response::new(out))
    }

    async fn node_unprepare_resources(
        &self,
        request: Request<api::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<api::NodeUnprepareResourcesResponse>, Status> {
        let mut out = api::NodeUnprepareResourcesResponse::default();
        for c in &request.get_ref().claims {
            let claim = ClaimRef::from(c);
            let error = match self.plugin.unprepare(&claim).await {
                Ok(()) => String::new(),
                Err(e) => {
                    tracing::warn!(driver = self.plugin.driver(), %claim, error = %e, "claim not unprepared");
                    e.to_string()
                }
            };
            out.claims
                .insert(c.uid.clone(), api::NodeUnprepareResourceResponse { error });
        }
        Ok(Response::new(out))
    }
}
