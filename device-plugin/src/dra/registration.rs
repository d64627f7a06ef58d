//! The plugin-registration service the kubelet's plugin watcher calls on
//! `<registry-dir>/<driver>-reg.sock`: `GetInfo` says we are a DRA plugin for the driver,
//! where our DRA service listens and which services we offer; `NotifyRegistrationStatus`
//! tells us whether the kubelet took it (logged, and kept for [`RegistrationService::status`]).

use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::watch;
use tonic::{Request, Response, Status};

use crate::dra::registration_api as api;
use crate::dra::registration_api::registration_server::Registration;

/// The plugin type a DRA driver registers as.
pub const PLUGIN_TYPE: &str = "DRAPlugin";
/// The services we offer, as the kubelet names them (`<proto package>.<service>`; the v1
/// DRA service's package is `k8s.io.kubelet.pkg.apis.dra.v1`, yet the kubelet lists it as
/// `v1.DRAPlugin`). The v1 health service (`v1.DRAResourceHealth`) is not offered.
pub const SUPPORTED_SERVICES: [&str; 1] = ["v1.DRAPlugin"];

/// What the kubelet last said about our registration: `None` before it said anything,
/// else `Ok(())` or its error.
pub type RegistrationStatus = Option<Result<(), String>>;

/// `Registration` for one driver. Cheap to clone.
#[derive(Clone)]
pub struct RegistrationService {
    driver: &'static str,
    endpoint: PathBuf,
    status: Arc<watch::Sender<RegistrationStatus>>,
}

impl RegistrationService {
    /// For `driver`, whose DRA service listens on `endpoint` (an absolute socket path).
    pub fn new(driver: &'static str, endpoint: PathBuf) -> Self {
        Self {
            driver,
            endpoint,
            status: Arc::new(watch::channel(None).0),
        }
    }

    /// What the kubelet said, as it says it.
    pub fn status(&self) -> watch::Receiver<RegistrationStatus> {
        self.status.subscribe()
    }
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn get_info(
        &self,
        _request: Request<api::InfoRequest>,
    ) -> Result<Response<api::PluginInfo>, Status> {
        Ok(Response::new(api::PluginInfo {
            r#type: PLUGIN_TYPE.into(),
            name: self.driver.into(),
            endpoint: self.endpoint.display().to_string(),
            supported_versions: SUPPORTED_SERVICES.iter().map(|s| s.to_string()).collect(),
        }))
    }

    async fn notify_registration_status(
        &self,
        request: Request<api::RegistrationStatus>,
    ) -> Result<Response<api::RegistrationStatusResponse>, Status> {
        let s = request.into_inner();
        if s.plugin_registered {
            tracing::info!(driver = self.driver, endpoint = %self.endpoint.display(), "DRA plugin registered with the kubelet");
            self.status.send_replace(Some(Ok(())));
        } else {
            tracing::error!(driver = self.driver, error = %s.error, "the kubelet refused the DRA plugin");
            self.status.send_replace(Some(Err(s.error)));
        }
        Ok(Response::new(api::RegistrationStatusResponse {}))
    }
}
