#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The kube-scheduler extender routes over the two-dgx snapshot, through the HTTP router.

use std::path::Path;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use scheduler_ext::core::score::Scoring;
use scheduler_ext::http::router::router;
use scheduler_ext::protocol::kube_scheduler::{ExtenderFilterResult, HostPriority};
use scheduler_ext::service::Service;
use scheduler_ext::snapshot;
use serde_json::{Value, json};
use tower::ServiceExt;

fn app() -> axum::Router {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/snapshots/two-dgx");
    let view = snapshot::load(&dir).unwrap();
    router(Arc::new(Service::new(view, Scoring::default())))
}

/// `POST` to `app`, answering the status and the body text.
async fn post_raw(app: &axum::Router, path: &str, body: String) -> (StatusCode, String) {
    let resp = app
        .clone()
        .oneshot(
            Request::post(path)
                .header("content-type", "application/json")
                .body(Body::from(body))
                .unwrap(),
        )
        .await
        .unwrap();
    let status = resp.status();
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .unwrap();
    (status, String::from_utf8(bytes.to_vec()).unwrap())
}

/// `POST` to a fresh service over the two-dgx snapshot.
async fn post(path: &str, body: String) -> (StatusCode, String) {
    post_raw(&app(), path, body).await
}

fn pod(gpus: &str) -> Value {
    json!({
        "metadata": {"name": "train-0", "namespace": "training", "uid": "u1"},
        "spec": {"containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": gpus}}}]}
    })
}

#[tokio::test]
async fn healthz() {
    let resp = app()
        .oneshot(Request::get("/healthz").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
}

#[tokio::test]
async fn filter_with_node_names() {
    let args =
        json!({"Pod": pod("4"), "NodeNames": ["dgx-a", "dgx-b", "pcie-a", "cpu-0", "ghost"]});
    let (status, body) = post("/kube-scheduler/filter", args.to_string()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let r: ExtenderFilterResult = serde_json::from_str(&body).unwrap();
    assert_eq!(r.node_names.unwrap(), ["dgx-a", "dgx-b"]);
    assert!(r.nodes.is_none());
    // Short of free devices: an eviction could help (preemption may try). No devices or an
    // unknown node: it could not (kube-scheduler tries no preemption there).
    assert_eq!(r.failed_nodes["pcie-a"], "needs 4 nvidia.com/gpu, 3 free");
    assert_eq!(r.failed_nodes.len(), 1);
    let unresolvable = &r.failed_and_unresolvable_nodes;
    assert_eq!(unresolvable["cpu-0"], "node publishes no DeviceTopology");
    assert!(unresolvable["ghost"].starts_with("unknown node"));
    assert_eq!(unresolvable.len(), 2);
    assert_eq!(r.error, "");
    // The raw keys are the Go field names.
    let raw: Value = serde_json::from_str(&body).unwrap();
    assert!(raw.get("FailedNodes").is_some() && raw.get("NodeNames").is_some());
}

#[tokio::test]
async fn filter_with_node_list_echoes_a_node_list() {
    let nodes = json!({"kind": "NodeList", "apiVersion": "v1", "metadata": {}, "items": [
        {"metadata": {"name": "dgx-a"}}, {"metadata": {"name": "pcie-a"}}]});
    let args = json!({"Pod": pod("2"), "Nodes": nodes, "NodeNames": null});
    let (status, body) = post("/kube-scheduler/filter", args.to_string()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let r: ExtenderFilterResult = serde_json::from_str(&body).unwrap();
    assert!(r.node_names.is_none());
    let items = r.nodes.unwrap()["items"].as_array().unwrap().clone();
    assert_eq!(items.len(), 2);
    assert!(r.failed_nodes.is_empty());
}

#[tokio::test]
async fn non_accelerator_pods_pass() {
    let p = json!({"metadata": {"name": "web"}, "spec": {"containers": [{"name": "c"}]}});
    let args = json!({"Pod": p, "NodeNames": ["cpu-0", "dgx-a"]});
    let (_, body) = post("/kube-scheduler/filter", args.to_string()).await;
    let r: ExtenderFilterResult = serde_json::from_str(&body).unwrap();
    assert_eq!(r.node_names.unwrap(), ["cpu-0", "dgx-a"]);
    let (_, body) = post("/kube-scheduler/prioritize", args.to_string()).await;
    let r: Vec<HostPriority> = serde_json::from_str(&body).unwrap();
    assert!(r.iter().all(|h| h.score == 0));
}

#[tokio::test]
async fn prioritize_prefers_the_exact_fit() {
    let args = json!({"Pod": pod("4"), "NodeNames": ["dgx-b", "dgx-a", "pcie-a", "ghost"]});
    let (status, body) = post("/kube-scheduler/prioritize", args.to_string()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let r: Vec<HostPriority> = serde_json::from_str(&body).unwrap();
    let score = |h: &str| r.iter().find(|p| p.host == h).unwrap().score;
    assert_eq!(r.len(), 4);
    assert_eq!(score("dgx-a"), 10);
    assert_eq!(score("dgx-b"), 8);
    assert_eq!(score("pcie-a"), 0);
    assert_eq!(score("ghost"), 0);
    let raw: Value = serde_json::from_str(&body).unwrap();
    assert!(raw[0].get("Host").is_some() && raw[0].get("Score").is_some());
}

#[tokio::test]
async fn bad_requests_get_400_with_a_message() {
    for (body, needle) in [
        ("{not json".to_string(), "malformed ExtenderArgs"),
        (json!({"NodeNames": ["a"]}).to_string(), "no Pod"),
        (
            json!({"Pod": pod("1")}).to_string(),
            "neither NodeNames nor Nodes",
        ),
        (
            json!({"Pod": {"metadata": 5}, "NodeNames": []}).to_string(),
            "malformed ExtenderArgs",
        ),
        (
            json!({"Pod": pod("1"), "Nodes": {"items": [{}]}}).to_string(),
            "not a NodeList",
        ),
    ] {
        for verb in ["filter", "prioritize"] {
            let (status, text) = post(&format!("/kube-scheduler/{verb}"), body.clone()).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{verb} {body}");
            assert!(text.contains(needle), "{verb} {body}: {text}");
        }
    }
}

#[tokio::test]
async fn bad_quantity_fails_every_node_with_the_reason() {
    let args = json!({"Pod": pod("1.5"), "NodeNames": ["dgx-a"]});
    let (_, body) = post("/kube-scheduler/filter", args.to_string()).await;
    let r: ExtenderFilterResult = serde_json::from_str(&body).unwrap();
    assert!(r.node_names.unwrap().is_empty());
    assert!(r.failed_and_unresolvable_nodes["dgx-a"].contains("not a whole number"));
    assert!(r.failed_nodes.is_empty());
}

#[tokio::test]
async fn volcano_predicate_and_prioritize() {
    let task = json!({"UID": "u", "Name": "t", "Pod": pod("4")});
    let (status, body) = post(
        "/volcano/predicate",
        json!({"task": task, "node": {"Name": "pcie-a"}}).to_string(),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let r: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        r,
        json!({"status": "needs 4 nvidia.com/gpu, 3 free", "code": 2})
    );
    let (_, body) = post(
        "/volcano/prioritize",
        json!({"task": task, "nodes": [{"Name": "dgx-a"}, {"Name": "dgx-b"}]}).to_string(),
    )
    .await;
    let r: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        r,
        json!({"nodeScore": {"dgx-a": 100.0, "dgx-b": 75.0}, "errorMessage": ""})
    );
    let (status, _) = post("/volcano/onSessionOpen", json!({"Jobs": {}}).to_string()).await;
    assert_eq!(status, StatusCode::OK);
    let (status, text) = post("/volcano/predicate", "[".into()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        text.contains("malformed Volcano predicate request"),
        "{text}"
    );
}

/// `POST` to a shared router, answering the parsed JSON.
async fn post_to(app: &axum::Router, path: &str, body: Value) -> (StatusCode, Value) {
    let resp = app
        .clone()
        .oneshot(
            Request::post(path)
                .header("content-type", "application/json")
                .body(Body::from(body.to_string()))
                .unwrap(),
        )
        .await
        .unwrap();
    let status = resp.status();
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .unwrap();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

fn named_pod(name: &str, gpus: &str) -> Value {
    json!({
        "metadata": {"name": name, "namespace": "training"},
        "spec": {"containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": gpus}}}]}
    })
}

/// dgx-b has 6 free GPUs. Twenty Volcano `allocateFunc` calls for 1-GPU pods race for it on
/// a multi-threaded runtime: exactly six succeed, each with a device of its own, the others get
/// a reason; `deallocateFunc` gives a device back for the next pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_allocations_never_share_a_device() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/snapshots/two-dgx");
    let svc = Arc::new(Service::new(
        snapshot::load(&dir).unwrap(),
        Scoring::default(),
    ));
    let app = router(Arc::clone(&svc));
    let calls = (0..20).map(|i| {
        let app = app.clone();
        tokio::spawn(async move {
            let task = json!({"task": {"Name": format!("p{i}"), "NodeName": "dgx-b",
                                       "Pod": named_pod(&format!("p{i}"), "1")}});
            post_to(&app, "/volcano/allocateFunc", task).await
        })
    });
    let mut ok = 0;
    for c in calls {
        let (status, body) = c.await.unwrap();
        assert_eq!(status, StatusCode::OK);
        let msg = body["errorMessage"].as_str().unwrap();
        if msg.is_empty() {
            ok += 1;
        } else {
            assert!(msg.contains("needs 1 nvidia.com/gpu, 0 free"), "{msg}");
        }
    }
    assert_eq!(ok, 6);
    let mut given = std::collections::BTreeSet::new();
    for i in 0..20 {
        let mut pod: k8s_openapi::api::core::v1::Pod =
            serde_json::from_value(named_pod(&format!("p{i}"), "1")).unwrap();
        pod.spec.as_mut().unwrap().node_name = Some("dgx-b".into());
        if let Ok(Some(c)) = svc.decider().commit(&pod, "dgx-b") {
            // Committing again answers the earlier choice.
            assert!(
                given.insert(c.devices[0].clone()),
                "{:?} given twice",
                c.devices
            );
        }
    }
    assert_eq!(given.len(), 6);

    // Give p0's device back: the next pod gets exactly that one.
    let (_, body) = post_to(
        &app,
        "/volcano/deallocateFunc",
        json!({"task": {"Pod": named_pod("p0", "1")}}),
    )
    .await;
    assert_eq!(body["errorMessage"], "");
    let (_, body) = post_to(
        &app,
        "/volcano/allocateFunc",
        json!({"task": {"NodeName": "dgx-b", "Pod": named_pod("late", "1")}}),
    )
    .await;
    assert_eq!(body["errorMessage"], "");
    // A filter now sees dgx-b full.
    let (_, r) = post_to(
        &app,
        "/kube-scheduler/filter",
        json!({"Pod": named_pod("more", "1"), "NodeNames": ["dgx-b"]}),
    )
    .await;
    assert_eq!(r["FailedNodes"]["dgx-b"], "needs 1 nvidia.com/gpu, 0 free");
}

/// kube-scheduler's prioritize of the nodes a pod's filter just passed, in the filter's order,
/// scores them as that filter saw the cluster (the filter's verdicts, not judged again);
/// another pod, or nodes outside the filter's answer or its order, are judged afresh.
#[tokio::test]
async fn prioritize_reuses_the_filters_verdicts_for_the_nodes_it_passed() {
    let app = app();
    let mut p = named_pod("train-0", "4");
    p["metadata"]["uid"] = json!("u1");
    let (_, r) = post_to(
        &app,
        "/kube-scheduler/filter",
        json!({"Pod": p, "NodeNames": ["dgx-b", "dgx-a", "pcie-a"]}),
    )
    .await;
    assert_eq!(r["NodeNames"], json!(["dgx-b", "dgx-a"]), "{r}");
    // Another pod takes two of dgx-a's GPUs between the two calls.
    let (_, body) = post_to(
        &app,
        "/volcano/allocateFunc",
        json!({"task": {"NodeName": "dgx-a", "Pod": named_pod("other", "2")}}),
    )
    .await;
    assert_eq!(body["errorMessage"], "", "{body}");
    let scores = |r: Value| -> Vec<(String, i64)> {
        let list: Vec<HostPriority> = serde_json::from_value(r).unwrap();
        list.into_iter().map(|h| (h.host, h.score)).collect()
    };
    let prioritize = |pod: Value, names: Value| {
        let app = app.clone();
        async move {
            let (status, r) = post_to(
                &app,
                "/kube-scheduler/prioritize",
                json!({"Pod": pod, "NodeNames": names}),
            )
            .await;
            assert_eq!(status, StatusCode::OK);
            scores(r)
        }
    };
    let reused = prioritize(p.clone(), json!(["dgx-b", "dgx-a"])).await;
    assert_eq!(reused, [("dgx-b".into(), 8), ("dgx-a".into(), 10)]);
    assert_eq!(
        prioritize(p.clone(), json!(["dgx-a"])).await,
        [("dgx-a".into(), 10)],
        "a part of the filter's answer, in its order"
    );
    let mut twin = p.clone();
    twin["metadata"]["uid"] = json!("u2");
    let fresh = prioritize(twin, json!(["dgx-b", "dgx-a"])).await;
    let dgx_a_now = fresh[1].1;
    assert_ne!(dgx_a_now, 10, "dgx-a has 6 free GPUs now: {fresh:?}");
    assert_eq!(
        prioritize(p.clone(), json!(["dgx-a", "dgx-b"])).await,
        [("dgx-a".into(), dgx_a_now), ("dgx-b".into(), 8)],
        "not the filter's order: judged again"
    );
    assert_eq!(
        prioritize(p, json!(["dgx-b", "pcie-a"])).await,
        [("dgx-b".into(), 8), ("pcie-a".into(), 0)],
        "pcie-a did not pass the filter: judged again"
    );
}

/// `bind` needs the API server: on a snapshot it answers an error, never a crash; bad bodies
/// get 400.
#[tokio::test]
async fn bind_on_a_snapshot_and_bad_bodies() {
    let (status, body) = post(
        "/kube-scheduler/bind",
        json!({"PodName": "train-0", "PodNamespace": "training", "PodUID": "u1", "Node": "dgx-a"})
            .to_string(),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let r: Value = serde_json::from_str(&body).unwrap();
    assert!(
        r["Error"].as_str().unwrap().contains("cluster snapshot"),
        "{body}"
    );
    let (status, body) = post("/kube-scheduler/bind", json!({"Node": "dgx-a"}).to_string()).await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.contains("needs PodName and Node"), "{body}");
    let (status, _) = post("/kube-scheduler/bind", "{not json".into()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, _) = post("/volcano/allocateFunc", "{\"task\": 5}".into()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, body) = post("/volcano/allocateFunc", json!({"task": {}}).to_string()).await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.contains("no task.Pod"), "{body}");
}
