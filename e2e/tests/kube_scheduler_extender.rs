//! kube-scheduler calls an HTTP extender given in the KubeSchedulerConfiguration,
//! and obeys its filter answer.

// Test code: helpers outside #[test] fns may unwrap and panic too.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use fumarole_e2e::cluster::eventually;
use fumarole_e2e::{NodeSpec, TestCluster};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

type Calls = Arc<Mutex<Vec<(String, Value)>>>;

/// Reads one HTTP/1.1 request: (path, JSON body).
async fn read_request(stream: &mut TcpStream) -> Option<(String, Value)> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let header_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..header_end]).to_string();
    let path = head.split_whitespace().nth(1)?.to_string();
    let len: usize = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().ok())?
        })
        .unwrap_or(0);
    while buf.len() < header_end + len {
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let body = serde_json::from_slice(&buf[header_end..header_end + len]).ok()?;
    Some((path, body))
}

/// An extender whose filter lets only `allowed` through.
async fn serve_extender(listener: TcpListener, allowed: &'static str, calls: Calls) {
    loop {
        let Ok((mut stream, _)) = listener.accept().await else {
            return;
        };
        let calls = calls.clone();
        tokio::spawn(async move {
            while let Some((path, args)) = read_request(&mut stream).await {
                let names: Vec<String> =
                    serde_json::from_value(args["NodeNames"].clone()).unwrap_or_default();
                let failed: serde_json::Map<String, Value> = names
                    .iter()
                    .filter(|n| *n != allowed)
                    .map(|n| (n.clone(), json!("fumarole-e2e extender says no")))
                    .collect();
                let keep: Vec<&String> = names.iter().filter(|n| *n == allowed).collect();
                calls.lock().unwrap().push((path, args));
                let body =
                    json!({"NodeNames": keep, "FailedNodes": failed, "Error": ""}).to_string();
                let resp = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                );
                if stream.write_all(resp.as_bytes()).await.is_err() {
                    return;
                }
            }
        });
    }
}

#[tokio::test]
async fn kube_scheduler_obeys_extender_filter() {
    let cluster = TestCluster::start().await.unwrap();
    for name in ["n1", "n2", "n3"] {
        cluster
            .create_node(
                &NodeSpec::new(name)
                    .capacity("cpu", "8")
                    .capacity("memory", "16Gi"),
            )
            .await
            .unwrap();
    }
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let calls: Calls = Arc::default();
    tokio::spawn(serve_extender(listener, "n2", calls.clone()));

    cluster
        .start_kube_scheduler(&format!(
            "apiVersion: kubescheduler.config.k8s.io/v1\n\
             kind: KubeSchedulerConfiguration\n\
             extenders:\n\
             - urlPrefix: http://127.0.0.1:{port}/fumarole\n\
             \x20 filterVerb: filter\n\
             \x20 nodeCacheCapable: true\n\
             \x20 weight: 1\n"
        ))
        .await
        .unwrap();

    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "image": "example.invalid/none",
                                 "resources": {"requests": {"cpu": "1"}}}]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let node = eventually("p to be bound", Duration::from_secs(60), || {
        let pods = pods.clone();
        async move { Ok(pods.get("p").await?.spec.and_then(|s| s.node_name)) }
    })
    .await
    .unwrap();
    assert_eq!(node, "n2");

    let calls = calls.lock().unwrap().clone();
    let (path, args) = calls
        .iter()
        .find(|(_, a)| a["Pod"]["metadata"]["name"] == "p")
        .expect("extender never saw pod p");
    assert_eq!(path, "/fumarole/filter");
    let mut names: Vec<String> = serde_json::from_value(args["NodeNames"].clone()).unwrap();
    names.sort();
    assert_eq!(names, ["n1", "n2", "n3"]);
    assert!(
        args["Nodes"].is_null(),
        "nodeCacheCapable: expected names only"
    );
}
