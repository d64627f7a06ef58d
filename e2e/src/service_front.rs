//! [`ServiceFront`]: what a Kubernetes Service with a label selector and readiness gives the
//! schedulers, for processes running outside pods. It listens on one port and passes each new
//! connection to the replica whose Pod object carries the selector's label *and* whose
//! readiness endpoint answers 200, as the endpoints controller and kube-proxy would; with
//! none, the connection is closed at once (a Service without endpoints). Replicas are the
//! extension's processes, each with a Pod object of its own name that it labels itself
//! (`POD_NAME` / `POD_NAMESPACE`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Result;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use crate::cluster::http_get;

/// The front and the tasks behind it (stopped on drop).
pub struct ServiceFront {
    port: u16,
    target: Arc<Mutex<Option<(String, u16)>>>,
    tasks: Vec<JoinHandle<()>>,
}

impl ServiceFront {
    /// Serves on a free loopback port. `replicas` maps a Pod name (in `namespace`) to its
    /// replica's port; `selector` is the label selector, `ready_path` the readiness path.
    pub async fn start(
        pods: Api<Pod>,
        selector: &str,
        ready_path: &str,
        replicas: BTreeMap<String, u16>,
    ) -> Result<ServiceFront> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let target: Arc<Mutex<Option<(String, u16)>>> = Arc::new(Mutex::new(None));
        let endpoints = {
            let target = Arc::clone(&target);
            let selector = selector.to_string();
            let ready_path = ready_path.to_string();
            tokio::spawn(async move {
                loop {
                    let next = endpoint(&pods, &selector, &ready_path, &replicas).await;
                    *lock(&target) = next;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            })
        };
        let proxy = {
            let target = Arc::clone(&target);
            tokio::spawn(async move {
                while let Ok((mut client, _)) = listener.accept().await {
                    let Some((_, backend)) = lock(&target).clone() else {
                        // No endpoint: the connection is refused, as by kube-proxy.
                        drop(client);
                        continue;
                    };
                    tokio::spawn(async move {
                        if let Ok(mut server) = TcpStream::connect(("127.0.0.1", backend)).await {
                            let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                        }
                    });
                }
            })
        };
        Ok(ServiceFront {
            port,
            target,
            tasks: vec![endpoints, proxy],
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The Pod name new connections go to now, if any.
    pub fn endpoint(&self) -> Option<String> {
        lock(&self.target).as_ref().map(|(name, _)| name.clone())
    }
}

impl Drop for ServiceFront {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The first replica whose Pod matches `selector` and whose `ready_path` answers.
async fn endpoint(
    pods: &Api<Pod>,
    selector: &str,
    ready_path: &str,
    replicas: &BTreeMap<String, u16>,
) -> Option<(String, u16)> {
    let selected = pods
        .list_metadata(&ListParams::default().labels(selector))
        .await
        .ok()?;
    for p in selected.items {
        let Some(name) = p.metadata.name else {
            continue;
        };
        let Some(&port) = replicas.get(&name) else {
            continue;
        };
        if http_get(port, ready_path)
            .await
            .is_ok_and(|answer| answer.lines().next().is_some_and(|l| l.contains(" 200 ")))
        {
            return Some((name, port));
        }
    }
    None
}
