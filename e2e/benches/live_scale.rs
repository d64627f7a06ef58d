//! The scheduler extension serving a big, busy live cluster: the real API server holding
//! `--nodes` nodes (5,000: a `DeviceTopology` of 8 NVLink GPUs and a `Node` each, 18 nodes per
//! super-node) and `--pods` unfinished pods (50,000: four fifths bound with their
//! `fumarole.dev/devices` on GPUs 0-5 of their node, one fifth pending), then `--churn` pod events per second (100: pods
//! created and deleted, bound and pending, half each) for `--seconds` (120), while
//!
//! - a client loops `filter` for a 1-GPU pod with every node's name (kube-scheduler's
//!   `nodeCacheCapable` request at 100 % of nodes scored), or with `--names` of them (500 is what
//!   kube-scheduler sends at 5,000 nodes: 10 % scored), one request at a time over a fresh
//!   loopback connection: latency p50 / p99 / max, and the extension's own filter durations;
//! - every 5 s a probe pod takes all 8 GPUs of a node kept empty, and `filter` on that node is
//!   polled until it says the node is full (then again after the probe is deleted until it
//!   fits): the view's staleness, from the API server's answer to the extension seeing it;
//! - the extension's resident memory is sampled every second;
//! - the views the extension made over the window are counted from its
//!   `fumarole_scheduler_ext_view_builds_total{how}`: in full, or from what changed.
//!
//! A measurement, not a test: it asserts only that the extension answered. Figures go in
//! docs/performance.md.
//!
//! ```sh
//! cargo build --release -p fumarole-scheduler-ext
//! cargo bench -p fumarole-e2e --bench live_scale                        # 5,000 nodes, 50,000 pods
//! cargo bench -p fumarole-e2e --bench live_scale -- --names 500                 # 10 % scored
//! cargo bench -p fumarole-e2e --bench live_scale -- --nodes 500 --pods 5000 --seconds 30
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use fumarole_e2e::TestCluster;
use fumarole_e2e::cluster::{free_port, http_post_json};
use fumarole_e2e::fumarole::scheduler_ext_bin;
use fumarole_e2e::process::{Footprint, Proc, percentile};
use fumarole_topology::crd::DeviceTopology;
use fumarole_topology::crd::device_topology::SuperNodeInfo;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::{Value, json};
use tokio::sync::Semaphore;

const GPUS: u32 = 8;
const SUPER_NODE_SIZE: usize = 18;
/// Objects created at once while filling the cluster.
const PARALLEL: usize = 48;

struct Args {
    nodes: usize,
    pods: usize,
    churn: u64,
    seconds: u64,
    names: usize,
}

fn args() -> Args {
    let argv: Vec<String> = std::env::args().collect();
    let get = |flag: &str, default: u64| {
        argv.iter()
            .position(|a| a == flag)
            .and_then(|i| argv.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    Args {
        nodes: get("--nodes", 5000) as usize,
        pods: get("--pods", 50_000) as usize,
        churn: get("--churn", 100),
        seconds: get("--seconds", 120),
        names: get("--names", 0) as usize,
    }
}

fn node_name(i: usize) -> String {
    format!("gpu-{i:05}")
}

fn gpu(node: usize, i: u32) -> String {
    format!("GPU-{node:05}-{i}")
}

fn topology(i: usize) -> DeviceTopology {
    let mut t =
        fumarole_topology::crd::testing::nvlink_node(&node_name(i), GPUS, 280, &[], |g| gpu(i, g));
    t.spec.super_node = Some(SuperNodeInfo {
        id: format!("sn-{}", i / SUPER_NODE_SIZE),
        source: "config".into(),
    });
    t
}

/// A 1-GPU pod: bound to `node` with device `g` chosen, or pending.
fn pod(name: &str, bound: Option<(usize, u32)>) -> Pod {
    let (node, annotations) = match bound {
        Some((n, g)) => (
            Some(node_name(n)),
            json!({
                "fumarole.dev/devices": json!({"nvidia.com/gpu": [gpu(n, g)]}).to_string(),
                "fumarole.dev/devices-node": node_name(n),
            }),
        ),
        None => (None, json!({})),
    };
    serde_json::from_value(json!({
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"nodeName": node, "schedulerName": "none",
            "containers": [{"name": "main", "image": "example.invalid/none",
                "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
    }))
    .unwrap()
}

/// Creates every object of `items` with at most [`PARALLEL`] requests in flight.
async fn create_all<K>(api: Api<K>, items: Vec<K>, what: &str)
where
    K: kube::Resource
        + Clone
        + serde::Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let started = Instant::now();
    let n = items.len();
    let gate = Arc::new(Semaphore::new(PARALLEL));
    let mut tasks = tokio::task::JoinSet::new();
    for item in items {
        let (api, permit) = (
            api.clone(),
            Arc::clone(&gate).acquire_owned().await.unwrap(),
        );
        tasks.spawn(async move {
            let _permit = permit;
            for attempt in 0..5 {
                match api.create(&PostParams::default(), &item).await {
                    Ok(_) => return,
                    Err(kube::Error::Api(s)) if s.code == 409 => return,
                    Err(e) if attempt < 4 => {
                        eprintln!("create failed ({e}); retrying");
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    Err(e) => panic!("create failed: {e}"),
                }
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    eprintln!("{n} {what} created in {:.0?}", started.elapsed());
}

/// `filter` for a 1-GPU pod on `names`: (latency, the nodes that passed).
async fn filter(port: u16, names: &Value) -> (Duration, Vec<String>) {
    let body = json!({
        "Pod": {"metadata": {"name": "probe-client", "namespace": "default", "uid": "bench"},
            "spec": {"schedulerName": "default-scheduler", "containers": [{"name": "c",
                "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}},
        "NodeNames": names,
    });
    let started = Instant::now();
    let answer = http_post_json(port, "/kube-scheduler/filter", &body)
        .await
        .unwrap();
    let took = started.elapsed();
    let v: Value = serde_json::from_str(&answer).unwrap_or_else(|e| panic!("{e}: {answer}"));
    let passed = v["NodeNames"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|n| n.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    (took, passed)
}

/// The extension's views made so far: (in full, from what changed).
fn view_builds(metrics: &str) -> (u64, u64) {
    let count = |how: &str| {
        let line = format!("fumarole_scheduler_ext_view_builds_total{{how=\"{how}\"}} ");
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&line))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0)
    };
    (count("full"), count("changes"))
}

/// The upper bound of the histogram bucket holding quantile `q` of the extension's filter
/// durations (the buckets double, so this bounds the quantile within a factor of two).
fn server_side(metrics: &str, q: f64) -> String {
    let prefix = "fumarole_scheduler_ext_request_duration_seconds_bucket{";
    let buckets: Vec<(f64, f64)> = metrics
        .lines()
        .filter(|l| l.starts_with(prefix) && l.contains("verb=\"filter\""))
        .filter_map(|l| {
            let le = l.split("le=\"").nth(1)?.split('"').next()?;
            let n: f64 = l.rsplit(' ').next()?.parse().ok()?;
            Some((le.parse().unwrap_or(f64::INFINITY), n))
        })
        .collect();
    let total = buckets.last().map_or(0.0, |b| b.1);
    buckets
        .iter()
        .find(|(_, n)| *n >= q * total)
        .map_or("?".into(), |(le, _)| format!("{:.1}ms", le * 1e3))
}

fn main() {
    let a = args();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async move {
        let cluster = TestCluster::start().await.unwrap();
        cluster.install_fumarole_crds().await.unwrap();
        let client = cluster.client();
        // The last node stays empty for the staleness probe.
        let probe_node = a.nodes - 1;
        create_all(
            Api::<DeviceTopology>::all(client.clone()),
            (0..a.nodes).map(topology).collect(),
            "DeviceTopologies",
        )
        .await;
        let nodes: Vec<Node> = (0..a.nodes)
            .map(|i| {
                serde_json::from_value(json!({"metadata": {"name": node_name(i),
                    "labels": {"fumarole.dev/super-node": format!("sn-{}", i / SUPER_NODE_SIZE)}}}))
                .unwrap()
            })
            .collect();
        create_all(Api::<Node>::all(client.clone()), nodes, "Nodes").await;
        // Bound pods take GPUs 0-5 of every node but the probe's (several pods per GPU when
        // there are more than six per node): GPU 6 stays free, GPU 7 is the bound churn's.
        let bound_target = a.pods * 4 / 5;
        let per_node = 6;
        let mut pods = Vec::with_capacity(a.pods);
        for i in 0..a.pods {
            let bound = (i < bound_target).then(|| {
                let slot = i % ((a.nodes - 1) * per_node);
                (slot / per_node, (slot % per_node) as u32)
            });
            pods.push(pod(&format!("p-{i:06}"), bound));
        }
        let pod_api: Api<Pod> = Api::namespaced(client.clone(), "default");
        create_all(pod_api.clone(), pods, "Pods").await;

        let port = free_port().unwrap();
        let started = Instant::now();
        let mut ext = Proc::spawn_with_env(
            "fumarole-scheduler-ext",
            &scheduler_ext_bin().unwrap(),
            &[
                "serve".into(),
                format!("--kubeconfig={}", cluster.admin_kubeconfig().display()),
                format!("--listen=127.0.0.1:{port}"),
                "--ui-listen=off".into(),
                "--leader-elect-resource-namespace=default".into(),
            ],
            &[("RUST_LOG", "info")],
            &cluster.root().join("logs"),
        )
        .unwrap();
        let url = format!("http://127.0.0.1:{port}");
        cluster.wait_ok("fumarole-scheduler-ext", &url, "/readyz").await.unwrap();
        cluster.wait_ok("fumarole-scheduler-ext", &url, "/leaderz").await.unwrap();
        let ready_in = started.elapsed();
        let pid = ext.pid();
        let rss_ready = Footprint::of(pid).unwrap().rss_mib();
        eprintln!("extension ready in {ready_in:.1?}, RSS {rss_ready:.0} MiB");
        let builds_ready = view_builds(
            &fumarole_e2e::cluster::http_get(port, "/metrics").await.unwrap(),
        );

        let stop = Arc::new(AtomicBool::new(false));
        let events = Arc::new(AtomicU64::new(0));
        // Churn: a pod created, and one deleted, by turns; bound and pending alternately.
        let churn = {
            let (api, stop, events) = (pod_api.clone(), Arc::clone(&stop), Arc::clone(&events));
            let (nodes, rate) = (a.nodes, a.churn.max(1));
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate as f64));
                let mut live: std::collections::VecDeque<String> = Default::default();
                let mut i = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    tick.tick().await;
                    let api = api.clone();
                    if i.is_multiple_of(2) || live.len() < 100 {
                        let name = format!("churn-{i:07}");
                        // Bound churn pods use GPUs the bulk pods leave free (per_node < 8).
                        let bound = i.is_multiple_of(4).then(|| ((i / 4) % (nodes - 1), GPUS - 1));
                        live.push_back(name.clone());
                        let p = pod(&name, bound);
                        tokio::spawn(async move { api.create(&PostParams::default(), &p).await.map(drop) });
                    } else if let Some(name) = live.pop_front() {
                        tokio::spawn(async move {
                            api.delete(&name, &DeleteParams::default().grace_period(0)).await.map(drop)
                        });
                    }
                    events.fetch_add(1, Ordering::Relaxed);
                    i += 1;
                }
            })
        };
        // Memory.
        let memory = {
            let stop = Arc::clone(&stop);
            tokio::spawn(async move {
                let mut peak = 0f64;
                let mut last = 0f64;
                while !stop.load(Ordering::Relaxed) {
                    if let Ok(f) = Footprint::of(pid) {
                        last = f.rss_mib();
                        peak = peak.max(last);
                    }
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                (peak, last)
            })
        };
        // Filter latency: every node, or a window of `--names` that moves on each request.
        let names: Vec<String> = (0..a.nodes).map(node_name).collect();
        let per_request = if a.names == 0 { a.nodes } else { a.names.min(a.nodes) };
        let latency = {
            let stop = Arc::clone(&stop);
            tokio::spawn(async move {
                let mut took = Vec::new();
                let mut from = 0;
                while !stop.load(Ordering::Relaxed) {
                    let asked: Value = names
                        .iter()
                        .cycle()
                        .skip(from)
                        .take(per_request)
                        .cloned()
                        .collect::<Vec<_>>()
                        .into();
                    from = (from + per_request) % names.len();
                    let (t, passed) = filter(port, &asked).await;
                    assert!(!passed.is_empty(), "no node passed filter");
                    took.push(t);
                }
                took
            })
        };
        // Staleness.
        let probe: Value = vec![node_name(probe_node)].into();
        let mut seen_full = Vec::new();
        let mut seen_free = Vec::new();
        let window = Instant::now();
        let mut n = 0;
        while window.elapsed() < Duration::from_secs(a.seconds) {
            tokio::time::sleep(Duration::from_secs(5)).await;
            let name = format!("probe-{n}");
            n += 1;
            let mut p = pod(&name, Some((probe_node, 0)));
            let all_gpus: Vec<String> = (0..GPUS).map(|g| gpu(probe_node, g)).collect();
            p.metadata.annotations.as_mut().unwrap().insert(
                "fumarole.dev/devices".into(),
                json!({"nvidia.com/gpu": all_gpus}).to_string(),
            );
            pod_api.create(&PostParams::default(), &p).await.unwrap();
            let t0 = Instant::now();
            while !filter(port, &probe).await.1.is_empty() {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            seen_full.push(t0.elapsed());
            pod_api.delete(&name, &DeleteParams::default().grace_period(0)).await.unwrap();
            let t1 = Instant::now();
            while filter(port, &probe).await.1.is_empty() {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            seen_free.push(t1.elapsed());
        }
        stop.store(true, Ordering::Relaxed);
        churn.await.unwrap();
        let (peak, last) = memory.await.unwrap();
        let mut took = latency.await.unwrap();
        took.sort();
        seen_full.sort();
        seen_free.sort();
        ext.check_running().unwrap();
        let events = events.load(Ordering::Relaxed);
        println!(
            "nodes {} pods {} churn {:.0} events/s over {} s",
            a.nodes,
            a.pods,
            events as f64 / a.seconds as f64,
            a.seconds
        );
        println!("ready after start: {ready_in:.1?}; RSS ready {rss_ready:.0} MiB, peak {peak:.0} MiB, end {last:.0} MiB");
        println!(
            "filter ({per_request} of {} nodes per request): {} requests, p50 {:.2?}, p99 {:.2?}, max {:.2?}",
            a.nodes,
            took.len(),
            percentile(&took, 0.5),
            percentile(&took, 0.99),
            took.last().copied().unwrap_or_default()
        );
        let metrics = fumarole_e2e::cluster::http_get(port, "/metrics")
            .await
            .unwrap();
        println!(
            "filter inside the extension (its request-duration histogram): p50 <= {}, p99 <= {}",
            server_side(&metrics, 0.5),
            server_side(&metrics, 0.99)
        );
        let builds_end = view_builds(&metrics);
        println!(
            "views made over the window: {} in full, {} from what changed",
            builds_end.0 - builds_ready.0,
            builds_end.1 - builds_ready.1
        );
        println!(
            "staleness, pod created -> seen: median {:.0?}, max {:.0?}; deleted -> seen: median {:.0?}, max {:.0?} ({} probes)",
            percentile(&seen_full, 0.5),
            seen_full.last().copied().unwrap_or_default(),
            percentile(&seen_free, 0.5),
            seen_free.last().copied().unwrap_or_default(),
            seen_full.len()
        );
    });
}
