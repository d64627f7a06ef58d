//! kubelet-dm (the kubelet's own device-manager code) registers a tiny device
//! plugin written here, sees its devices, and calls it like the kubelet does.

// Test code: helpers outside #[test] fns may unwrap and panic too.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fumarole_e2e::KubeletDm;
use hyper_util::rt::TokioIo;
use serde_json::json;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::watch;
use tokio_stream::wrappers::{UnixListenerStream, WatchStream};
use tokio_stream::{Stream, StreamExt};
use tonic::transport::{Endpoint, Server};
use tonic::{Request, Response, Status};

// The project's own v1beta1 types; the plugin below is the test's, not fumarole's.
use fumarole_device_plugin::api as pb;
use pb::device_plugin_server::{DevicePlugin, DevicePluginServer};
use pb::registration_client::RegistrationClient;

const RESOURCE: &str = "example.com/tiny";

fn device(id: &str, healthy: bool, numa: i64) -> pb::Device {
    pb::Device {
        id: id.to_string(),
        health: if healthy { "Healthy" } else { "Unhealthy" }.to_string(),
        topology: Some(pb::TopologyInfo {
            nodes: vec![pb::NumaNode { id: numa }],
        }),
    }
}

#[derive(Clone)]
struct TinyPlugin {
    devices: watch::Receiver<Vec<pb::Device>>,
    prestarted: Arc<Mutex<Vec<Vec<String>>>>,
}

type LawStream = Pin<Box<dyn Stream<Item = Result<pb::ListAndWatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl DevicePlugin for TinyPlugin {
    async fn get_device_plugin_options(
        &self,
        _: Request<pb::Empty>,
    ) -> Result<Response<pb::DevicePluginOptions>, Status> {
        Ok(Response::new(pb::DevicePluginOptions {
            pre_start_required: true,
            get_preferred_allocation_available: true,
        }))
    }

    type ListAndWatchStream = LawStream;

    async fn list_and_watch(&self, _: Request<pb::Empty>) -> Result<Response<LawStream>, Status> {
        let s = WatchStream::new(self.devices.clone())
            .map(|devices| Ok(pb::ListAndWatchResponse { devices }));
        Ok(Response::new(Box::pin(s)))
    }

    async fn get_preferred_allocation(
        &self,
        req: Request<pb::PreferredAllocationRequest>,
    ) -> Result<Response<pb::PreferredAllocationResponse>, Status> {
        // Prefer the highest ids: something the caller cannot guess by accident.
        let container_responses = req
            .into_inner()
            .container_requests
            .into_iter()
            .map(|r| {
                let mut ids = r.available_device_i_ds;
                ids.sort();
                ids.reverse();
                ids.truncate(r.allocation_size as usize);
                pb::ContainerPreferredAllocationResponse { device_i_ds: ids }
            })
            .collect();
        Ok(Response::new(pb::PreferredAllocationResponse {
            container_responses,
        }))
    }

    async fn allocate(
        &self,
        req: Request<pb::AllocateRequest>,
    ) -> Result<Response<pb::AllocateResponse>, Status> {
        let container_responses = req
            .into_inner()
            .container_requests
            .into_iter()
            .map(|r| pb::ContainerAllocateResponse {
                envs: HashMap::from([("TINY_DEVICES".to_string(), r.devices_ids.join(","))]),
                devices: r
                    .devices_ids
                    .iter()
                    .map(|id| pb::DeviceSpec {
                        container_path: format!("/dev/tiny-{id}"),
                        host_path: format!("/dev/tiny-{id}"),
                        permissions: "rw".to_string(),
                    })
                    .collect(),
                ..Default::default()
            })
            .collect();
        Ok(Response::new(pb::AllocateResponse {
            container_responses,
        }))
    }

    async fn pre_start_container(
        &self,
        req: Request<pb::PreStartContainerRequest>,
    ) -> Result<Response<pb::PreStartContainerResponse>, Status> {
        self.prestarted
            .lock()
            .unwrap()
            .push(req.into_inner().devices_ids);
        Ok(Response::new(pb::PreStartContainerResponse {}))
    }
}

async fn register(kubelet_sock: &Path, endpoint: &str) {
    let path: PathBuf = kubelet_sock.to_path_buf();
    let channel = Endpoint::try_from("http://kubelet.invalid")
        .unwrap()
        .connect_with_connector(tower::service_fn(move |_| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
        }))
        .await
        .unwrap();
    RegistrationClient::new(channel)
        .register(pb::RegisterRequest {
            version: "v1beta1".to_string(),
            endpoint: endpoint.to_string(),
            resource_name: RESOURCE.to_string(),
            options: Some(pb::DevicePluginOptions {
                pre_start_required: true,
                get_preferred_allocation_available: true,
            }),
        })
        .await
        .unwrap();
}

#[tokio::test]
async fn kubelet_dm_registers_plugin_and_sees_devices() {
    let tmp = tempfile::tempdir().unwrap();
    let sockets = tmp.path().join("device-plugins");
    let kdm = KubeletDm::start(&sockets, &tmp.path().join("logs"))
        .await
        .unwrap();
    assert_eq!(kdm.socket(), sockets.join("kubelet.sock"));

    // Serve first, then register (the kubelet dials back synchronously).
    let (tx, rx) = watch::channel(vec![
        device("tiny-0", true, 0),
        device("tiny-1", true, 0),
        device("tiny-2", true, 1),
    ]);
    let prestarted = Arc::new(Mutex::new(Vec::new()));
    let plugin = TinyPlugin {
        devices: rx,
        prestarted: prestarted.clone(),
    };
    let plugin_sock = sockets.join("tiny.sock");
    let listener = UnixListener::bind(&plugin_sock).unwrap();
    tokio::spawn(
        Server::builder()
            .add_service(DevicePluginServer::new(plugin))
            .serve_with_incoming(UnixListenerStream::new(listener)),
    );
    register(kdm.socket(), "tiny.sock").await;

    let reg = kdm
        .wait_event(0, Duration::from_secs(20), |e| e.kind == "registered")
        .await
        .unwrap();
    assert_eq!(reg.resource, RESOURCE);
    assert_eq!(reg.endpoint.as_deref(), Some(plugin_sock.to_str().unwrap()));
    assert_eq!(
        reg.options,
        Some(json!({"pre_start_required": true, "get_preferred_allocation_available": true}))
    );
    let law = kdm
        .wait_event(reg.seq, Duration::from_secs(20), |e| {
            e.kind == "list_and_watch"
        })
        .await
        .unwrap();
    let devs = law.devices.unwrap();
    let ids: Vec<&str> = devs.iter().map(|d| d["ID"].as_str().unwrap()).collect();
    assert_eq!(ids, ["tiny-0", "tiny-1", "tiny-2"]);
    assert_eq!(devs[2]["health"], "Healthy");
    assert_eq!(devs[2]["topology"]["nodes"][0]["ID"], 1);

    // A health change reaches the kubelet as a new ListAndWatch update.
    tx.send(vec![
        device("tiny-0", true, 0),
        device("tiny-1", false, 0),
        device("tiny-2", true, 1),
    ])
    .unwrap();
    let upd = kdm
        .wait_event(law.seq, Duration::from_secs(20), |e| {
            e.kind == "list_and_watch"
        })
        .await
        .unwrap();
    assert_eq!(upd.devices.unwrap()[1]["health"], "Unhealthy");

    // The kubelet's client calls the plugin's RPCs.
    let pref = kdm
        .preferred(
            RESOURCE,
            json!({"container_requests": [{
                "available_deviceIDs": ["tiny-0", "tiny-2", "tiny-1"],
                "allocation_size": 2
            }]}),
        )
        .await
        .unwrap();
    assert_eq!(
        pref["container_responses"][0]["deviceIDs"],
        json!(["tiny-2", "tiny-1"])
    );
    let alloc = kdm
        .allocate(
            RESOURCE,
            json!({"container_requests": [{"devices_ids": ["tiny-0", "tiny-2"]}]}),
        )
        .await
        .unwrap();
    let c0 = &alloc["container_responses"][0];
    assert_eq!(c0["envs"]["TINY_DEVICES"], "tiny-0,tiny-2");
    assert_eq!(c0["devices"][1]["container_path"], "/dev/tiny-tiny-2");
    kdm.prestart(RESOURCE, json!({"devices_ids": ["tiny-0"]}))
        .await
        .unwrap();
    assert_eq!(
        *prestarted.lock().unwrap(),
        vec![vec!["tiny-0".to_string()]]
    );
    let opts = kdm.options(RESOURCE).await.unwrap();
    assert_eq!(opts["pre_start_required"], true);
    // An unknown resource is an error, not a silent success.
    assert!(kdm.options("example.com/other").await.is_err());

    // A kubelet restart disconnects the plugin and deletes its socket.
    let before = kdm.events(0, Duration::ZERO).await.unwrap().len() as u64;
    assert_eq!(kdm.restart().await.unwrap(), 2);
    kdm.wait_event(before, Duration::from_secs(20), |e| {
        e.kind == "disconnected" && e.resource == RESOURCE
    })
    .await
    .unwrap();
    assert!(
        !plugin_sock.exists(),
        "plugin socket survived the kubelet restart"
    );
    assert!(kdm.socket().exists());
    let state = kdm.state().await.unwrap();
    assert_eq!(state["generation"], 2);
    assert_eq!(state["plugins"], json!({}));
    assert!(kdm.options(RESOURCE).await.is_err());

    // Serving and registering again reconnects, in the new generation.
    let after = kdm.events(0, Duration::ZERO).await.unwrap().len() as u64;
    let listener = UnixListener::bind(&plugin_sock).unwrap();
    tokio::spawn(
        Server::builder()
            .add_service(DevicePluginServer::new(TinyPlugin {
                devices: tx.subscribe(),
                prestarted: prestarted.clone(),
            }))
            .serve_with_incoming(UnixListenerStream::new(listener)),
    );
    register(kdm.socket(), "tiny.sock").await;
    let again = kdm
        .wait_event(after, Duration::from_secs(20), |e| {
            e.kind == "list_and_watch"
        })
        .await
        .unwrap();
    assert_eq!(again.generation, 2);
    assert_eq!(again.devices.unwrap().len(), 3);
    assert_eq!(
        kdm.options(RESOURCE).await.unwrap()["get_preferred_allocation_available"],
        true
    );
}
