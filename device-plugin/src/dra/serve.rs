//! Serving the DRA plugin: per driver with devices, the DRA service on
//! `<plugins-dir>/<driver>/dra.sock` first, then the registration service on
//! `<registry-dir>/<driver>-reg.sock`, where the kubelet's plugin watcher finds it and dials
//! the DRA socket it names. [`start`] takes every directory, the node and the claim reader,
//! so tests run it on temp dirs with a fake reader.
//!
//! The servers run until the [`DraServer`] is dropped or [`DraServer::shutdown`] (which also
//! removes the sockets, so the kubelet deregisters the plugin). Stale sockets of an earlier
//! process are replaced.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::UnixListener;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;
use tokio_stream::{Stream, StreamExt};
use tonic::transport::Server;
use tonic::transport::server::Connected;

use crate::dra::api::dra_plugin_server::DraPluginServer;
use crate::dra::authority;
use crate::dra::claims::ClaimReader;
use crate::dra::node::DraNode;
use crate::dra::prepare::DriverPlugin;
use crate::dra::registration::{RegistrationService, RegistrationStatus};
use crate::dra::registration_api::registration_server::RegistrationServer;
use crate::dra::service::DraService;

/// The kubelet's plugin registry, watched for registration sockets.
pub const DEFAULT_REGISTRY_DIR: &str = "/var/lib/kubelet/plugins_registry";
/// Where plugins keep their service sockets, one directory per driver.
pub const DEFAULT_PLUGINS_DIR: &str = "/var/lib/kubelet/plugins";
/// Where container runtimes look for transient CDI specs.
pub const DEFAULT_CDI_DIR: &str = "/var/run/cdi";

/// The directories the plugin works in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DraDirs {
    /// The kubelet's plugin registry (registration sockets).
    pub registry: PathBuf,
    /// The plugins directory (`<driver>/dra.sock`).
    pub plugins: PathBuf,
    /// The CDI spec directory.
    pub cdi: PathBuf,
}

impl Default for DraDirs {
    /// The kubelet's and the runtimes' defaults.
    fn default() -> Self {
        Self {
            registry: DEFAULT_REGISTRY_DIR.into(),
            plugins: DEFAULT_PLUGINS_DIR.into(),
            cdi: DEFAULT_CDI_DIR.into(),
        }
    }
}

impl DraDirs {
    /// `<registry>/<driver>-reg.sock`.
    pub fn registration_socket(&self, driver: &str) -> PathBuf {
        self.registry.join(format!("{driver}-reg.sock"))
    }

    /// `<plugins>/<driver>/dra.sock`.
    pub fn service_socket(&self, driver: &str) -> PathBuf {
        self.plugins.join(driver).join("dra.sock")
    }
}

/// Why the plugin could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// A directory could not be created.
    #[error("creating {path}: {reason}")]
    Dir {
        path: PathBuf,
        reason: std::io::Error,
    },
    /// A socket could not be bound (path too long, permissions).
    #[error("serving on {path}: {reason}")]
    Bind {
        path: PathBuf,
        reason: std::io::Error,
    },
}

/// The running plugin: its drivers' servers. Dropping it stops them.
pub struct DraServer {
    drivers: Vec<Driver>,
}

struct Driver {
    name: &'static str,
    registration: RegistrationService,
    sockets: Vec<PathBuf>,
    stops: Vec<oneshot::Sender<()>>,
    tasks: Vec<JoinHandle<()>>,
}

impl DraServer {
    /// The drivers served, in [`fumarole_topology::dra::DRIVERS`] order.
    pub fn drivers(&self) -> Vec<&'static str> {
        self.drivers.iter().map(|d| d.name).collect()
    }

    /// What the kubelet said about `driver`'s registration.
    pub fn registration_status(&self, driver: &str) -> Option<watch::Receiver<RegistrationStatus>> {
        self.drivers
            .iter()
            .find(|d| d.name == driver)
            .map(|d| d.registration.status())
    }

    /// Removes the sockets (registration first: the kubelet deregisters the driver), then
    /// stops every server, letting requests in flight finish.
    pub async fn shutdown(self) {
        for d in &self.drivers {
            for s in d.sockets.iter().rev() {
                let _ = std::fs::remove_file(s);
            }
        }
        for mut d in self.drivers {
            for stop in d.stops.drain(..) {
                let _ = stop.send(());
            }
            for task in d.tasks.drain(..) {
                let _ = task.await;
            }
        }
    }
}

/// Serves the DRA plugin of `node` (one pair of sockets per driver with devices, in `dirs`),
/// preparing claims read through `claims` into `dirs.cdi`. Needs a tokio runtime.
pub fn start(
    dirs: &DraDirs,
    node: DraNode,
    claims: Arc<dyn ClaimReader>,
) -> Result<DraServer, ServeError> {
    // Before any socket: a failure here leaves nothing registered behind.
    std::fs::create_dir_all(&dirs.cdi).map_err(|reason| ServeError::Dir {
        path: dirs.cdi.clone(),
        reason,
    })?;
    let node = Arc::new(node);
    let mut drivers = Vec::new();
    for name in node.drivers() {
        let plugin = Arc::new(DriverPlugin::new(
            name,
            node.clone(),
            dirs.cdi.clone(),
            claims.clone(),
        ));
        let service_socket = dirs.service_socket(name);
        let registration_socket = dirs.registration_socket(name);
        let registration = RegistrationService::new(name, service_socket.clone());
        let mut driver = Driver {
            name,
            registration: registration.clone(),
            sockets: Vec::new(),
            stops: Vec::new(),
            tasks: Vec::new(),
        };
        // The DRA service first: the kubelet may dial it as soon as it sees the registration.
        let listener = bind(&service_socket)?;
        driver.sockets.push(service_socket.clone());
        let (stop, stopped) = oneshot::channel::<()>();
        driver.stops.push(stop);
        driver.tasks.push(tokio::spawn(run(
            Server::builder().add_service(DraPluginServer::new(DraService::new(plugin))),
            UnixListenerStream::new(listener),
            stopped,
            service_socket,
        )));
        let listener = bind(&registration_socket)?;
        driver.sockets.push(registration_socket.clone());
        let (stop, stopped) = oneshot::channel::<()>();
        driver.stops.push(stop);
        // The kubelet's registration dial sends an `:authority` h2 refuses: see `authority`.
        let incoming = UnixListenerStream::new(listener).map(|conn| conn.map(authority::relay));
        driver.tasks.push(tokio::spawn(run(
            Server::builder().add_service(RegistrationServer::new(registration)),
            incoming,
            stopped,
            registration_socket.clone(),
        )));
        tracing::info!(driver = name, registration = %registration_socket.display(), cdi = %dirs.cdi.display(), "serving DRA plugin");
        drivers.push(driver);
    }
    Ok(DraServer { drivers })
}

/// Binds `path`, creating its directory and replacing a stale socket.
fn bind(path: &Path) -> Result<UnixListener, ServeError> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|reason| ServeError::Dir {
            path: dir.to_path_buf(),
            reason,
        })?;
    }
    let _ = std::fs::remove_file(path);
    UnixListener::bind(path).map_err(|reason| ServeError::Bind {
        path: path.to_path_buf(),
        reason,
    })
}

async fn run<S, IO>(
    router: tonic::transport::server::Router,
    incoming: S,
    stopped: oneshot::Receiver<()>,
    path: PathBuf,
) where
    S: Stream<Item = std::io::Result<IO>> + Send + 'static,
    IO: Connected + AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let served = router
        .serve_with_incoming_shutdown(incoming, async {
            let _ = stopped.await;
        })
        .await;
    if let Err(e) = served {
        tracing::error!(socket = %path.display(), error = %e, "DRA plugin server stopped");
    }
}
