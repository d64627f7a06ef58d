//! Serving a plugin and registering it with the kubelet, again and again.
//!
//! The kubelet dials the plugin synchronously while handling `Register`, so the plugin serves
//! first and registers second. On restart the kubelet deletes every socket in its directory
//! and creates `kubelet.sock` anew; [`serve`] polls for both (our socket gone, or
//! `kubelet.sock` with a new inode) every 200 ms and serves and registers again.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::{Endpoint, Server};

use crate::api;
use crate::api::device_plugin_server::DevicePluginServer;
use crate::api::registration_client::RegistrationClient;
use crate::plugin::DevicePluginService;

/// The API version we speak.
pub const VERSION: &str = "v1beta1";
/// The kubelet's registration socket, in the device-plugin directory.
pub const KUBELET_SOCKET: &str = "kubelet.sock";

const POLL: Duration = Duration::from_millis(200);

#[derive(Debug, thiserror::Error)]
pub enum RegisterError {
    #[error("serving on {path}: {reason}")]
    Serve {
        path: PathBuf,
        reason: std::io::Error,
    },
    #[error("registering {resource} with {path}: {reason}")]
    Register {
        resource: String,
        path: PathBuf,
        reason: String,
    },
}

fn inode(path: &Path) -> Option<u64> {
    std::fs::metadata(path).ok().map(|m| m.ino())
}

/// Calls `Registration/Register` on `dir/kubelet.sock`.
pub async fn register(dir: &Path, service: &DevicePluginService) -> Result<(), RegisterError> {
    let resource = service.resource();
    let kubelet = dir.join(KUBELET_SOCKET);
    let err = |reason: String| RegisterError::Register {
        resource: resource.name.clone(),
        path: kubelet.clone(),
        reason,
    };
    let channel = Endpoint::from_shared(format!("unix:{}", kubelet.display()))
        .map_err(|e| err(e.to_string()))?
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|e| err(e.to_string()))?;
    RegistrationClient::new(channel)
        .register(api::RegisterRequest {
            version: VERSION.into(),
            endpoint: resource.socket_name(),
            resource_name: resource.name.clone(),
            options: Some(api::DevicePluginOptions {
                pre_start_required: false,
                get_preferred_allocation_available: true,
            }),
        })
        .await
        .map_err(|e| err(e.message().to_string()))?;
    Ok(())
}

/// Serves `service` on `dir/<socket>` and keeps it registered with the kubelet in `dir` for
/// as long as the process runs: serve, register (retrying until the kubelet answers), then
/// watch for a kubelet restart and start over.
pub async fn serve(dir: PathBuf, service: DevicePluginService) -> Result<(), RegisterError> {
    let name = service.resource().name.clone();
    let socket = dir.join(service.resource().socket_name());
    let kubelet = dir.join(KUBELET_SOCKET);
    loop {
        // A stale socket from an earlier run would make bind fail.
        let _ = std::fs::remove_file(&socket);
        let listener = UnixListener::bind(&socket).map_err(|reason| RegisterError::Serve {
            path: socket.clone(),
            reason,
        })?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(
            Server::builder()
                .add_service(DevicePluginServer::new(service.clone()))
                .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async {
                    let _ = stopped.await;
                }),
        );
        let our_inode = inode(&socket);

        let mut logged = false;
        let kubelet_inode = loop {
            match register(&dir, &service).await {
                Ok(()) => break inode(&kubelet),
                Err(e) => {
                    if !logged {
                        tracing::warn!(resource = %name, error = %e, "kubelet not reachable yet; retrying");
                        logged = true;
                    }
                    tokio::time::sleep(POLL).await;
                }
            }
        };
        tracing::info!(resource = %name, socket = %socket.display(), "registered with the kubelet");

        // Serve until the kubelet restarts (or our socket is removed under us).
        loop {
            tokio::time::sleep(POLL).await;
            let ours_gone = inode(&socket) != our_inode;
            let kubelet_new = inode(&kubelet).is_some_and(|i| Some(i) != kubelet_inode);
            if ours_gone || kubelet_new {
                tracing::info!(resource = %name, ours_gone, kubelet_new, "kubelet restarted; serving and registering again");
                break;
            }
        }
        let _ = stop.send(());
        let _ = server.await;
    }
}
