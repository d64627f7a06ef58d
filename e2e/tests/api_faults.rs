//! API-server faults the agents survive: three agents (`fumarole-agent run`, publishing) talk
//! to the real API server through a [`FaultProxy`] that answers, one fault at a time, 429 with
//! Retry-After, 503, 409 on writes, 3 s of latency, 410 Gone on every watch (an etcd
//! compaction), connection resets, and for 20 s an API server back from a compaction (410 on
//! every watch, 503 on the rest: the watchers list and fail). While a fault holds, each node's
//! truth changes (the kubelet hands out other CPUs); after it, every agent's `Numatopology`
//! must be the truth.
//! Checked through the proxy's record of every request: retries after a 429 wait at least its
//! Retry-After, failed writes are retried no sooner than 150 ms (no retry storm), and no agent
//! sends more than a bounded number of requests in any second, and no watch (agents' or the
//! extension's) lists again at its backoff's first step after every failed list.
//! The scheduler extension watches through the same proxy: it reports itself unready while
//! its watches fail (resets, 503) and ready again after every fault. And when the answer to
//! its Binding is lost (the Binding applied, the connection closed), it keeps the devices the
//! Binding carries instead of handing them to the next pod.
//! Figures are printed (`--nocapture`) and kept in docs/reliability.md.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use fumarole_e2e::cluster::{eventually, free_port, http_get, http_post_json};
use fumarole_e2e::fault_proxy::{Fault, FaultProxy, Record, peak_per_second};
use fumarole_e2e::fumarole::{numatopologies, scheduler_ext_bin};
use fumarole_e2e::{AgentBuilder, NodeSpec, TestCluster};

const AGENTS: usize = 3;
const CPUS: u32 = 64;
const KUBELET_CONFIG: &str = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncpuManagerPolicy: static\n";
/// Most requests one agent may send in any second, whatever the fault: a publish round is a
/// handful of writes and the watches' relists; a retry storm is far more.
const MAX_PER_SECOND: usize = 25;

struct Agent {
    node: String,
    user: String,
    dir: tempfile::TempDir,
}

impl Agent {
    fn state(&self) -> PathBuf {
        self.dir.path().join("cpu_manager_state")
    }

    /// The kubelet hands CPUs `2..=last` to one pod: what the Numatopology must then say free.
    /// Written whole (a rename), as the kubelet writes its checkpoint.
    fn allocate(&self, last: u32) -> String {
        let next = self.dir.path().join("cpu_manager_state.next");
        std::fs::write(
            &next,
            format!(
                r#"{{"policyName":"static","defaultCpuSet":"0-1,{}-{}","entries":{{"p":{{"c":"2-{last}"}}}},"checksum":{last}}}"#,
                last + 1,
                CPUS - 1
            ),
        )
        .unwrap();
        std::fs::rename(&next, self.state()).unwrap();
        format!("0-1,{}-{}", last + 1, CPUS - 1)
    }
}

async fn start_agent(cluster: &TestCluster, proxy: &FaultProxy, i: usize) -> Agent {
    let node = format!("faulty-{i}");
    cluster
        .create_node(
            &NodeSpec::new(&node)
                .capacity("cpu", &CPUS.to_string())
                .capacity("memory", "256Gi"),
        )
        .await
        .unwrap();
    let agent = Agent {
        user: format!("agent-{i}"),
        node,
        dir: tempfile::tempdir().unwrap(),
    };
    let config = agent.dir.path().join("config.yaml");
    std::fs::write(&config, KUBELET_CONFIG).unwrap();
    agent.allocate(2);
    let kubeconfig = agent.dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        proxy.kubeconfig(&agent.user, &["system:masters"]),
    )
    .unwrap();
    AgentBuilder::fixture("cpu-only")
        .process(&format!("fumarole-agent-{}", agent.node))
        .node(&agent.node)
        .kubelet_config(&config)
        .cpu_manager_state(&agent.state())
        .pod_resources_socket(&agent.dir.path().join("absent.sock"))
        .flag("--recheck-interval", "1s")
        .metrics_on_port(free_port().unwrap())
        .kubeconfig(&kubeconfig)
        .env("FUMAROLE_LOG", "info")
        .start_in(cluster)
        .unwrap();
    agent
}

/// Waits until every agent's Numatopology says `free` (per agent); returns how long it took.
async fn converged(cluster: &TestCluster, agents: &[Agent], free: &[String]) -> Duration {
    let started = Instant::now();
    let api = numatopologies(cluster.client());
    eventually(
        "every Numatopology current",
        Duration::from_secs(90),
        || {
            let api = api.clone();
            async move {
                for (a, want) in agents.iter().zip(free) {
                    let Some(o) = api.get_opt(&a.node).await? else {
                        return Ok(None);
                    };
                    if o.data["spec"]["numares"]["cpu"]["allocatable"] != want.as_str() {
                        return Ok(None);
                    }
                }
                Ok(Some(()))
            }
        },
    )
    .await
    .unwrap();
    started.elapsed()
}

/// Most failed lists of one watch (client and path) while one fault holds (20 s at most):
/// each is retried after a backoff that grows (kube's default from 0.8 s, the extension's
/// from 0.25 s, doubling), about 5 in 20 s. Retried at the first step again and again (the
/// backoff reset by the watcher's own `Init` before every list), it is 15 to 50.
const MAX_FAILED_LISTS: usize = 8;

/// Every watch whose lists failed while `fault` held backed off between them.
fn failed_lists_back_off(fault: &Fault, records: &[Record]) {
    let mut per_watch: std::collections::BTreeMap<(&str, &str), Vec<Duration>> =
        std::collections::BTreeMap::new();
    for r in records.iter().filter(|r| r.list && r.status != 200) {
        per_watch
            .entry((r.client.as_str(), r.path.as_str()))
            .or_default()
            .push(r.at);
    }
    let most = per_watch.values().map(Vec::len).max().unwrap_or(0);
    println!(
        "{fault:?}: {} watches with failed lists, at most {most} failed lists per watch",
        per_watch.len()
    );
    if matches!(fault, Fault::Outage(_)) {
        // Else the check below proves nothing: the outage must make the watchers list.
        assert!(
            most >= 3,
            "{fault:?}: no watch listed again and again: {}",
            by_path(&records.iter().collect::<Vec<_>>())
        );
    }
    for ((client, path), at) in &per_watch {
        let gaps: Vec<Duration> = at.windows(2).map(|w| w[1] - w[0]).collect();
        assert!(
            at.len() <= MAX_FAILED_LISTS,
            "{fault:?}: {client} listed {path} {} times, failing, gaps {gaps:.2?}",
            at.len()
        );
    }
}

/// Requests per method, path and kind, most first: what a failed bound was spent on.
fn by_path(records: &[&Record]) -> String {
    let mut counts: std::collections::BTreeMap<String, usize> = Default::default();
    for r in records {
        let kind = if r.watch { "watch" } else { "" };
        *counts
            .entry(format!("{} {} {kind} -> {}", r.method, r.path, r.status))
            .or_default() += 1;
    }
    let mut counts: Vec<(String, usize)> = counts.into_iter().collect();
    counts.sort_by_key(|c| std::cmp::Reverse(c.1));
    counts
        .iter()
        .map(|(k, n)| format!("{n} x {k}"))
        .collect::<Vec<_>>()
        .join("; ")
}

/// Starts the scheduler extension through the proxy (one replica, a 3 s staleness bound);
/// returns its port once it is ready.
async fn start_extension(cluster: &TestCluster, proxy: &FaultProxy) -> u16 {
    let port = spawn_extension(cluster, proxy);
    cluster
        .wait_ok(
            "fumarole-scheduler-ext",
            &format!("http://127.0.0.1:{port}"),
            "/readyz",
        )
        .await
        .unwrap();
    port
}

/// Starts the scheduler extension through the proxy; returns its port at once.
fn spawn_extension(cluster: &TestCluster, proxy: &FaultProxy) -> u16 {
    let port = free_port().unwrap();
    let kubeconfig = cluster.root().join("extension-via-proxy.kubeconfig");
    std::fs::write(
        &kubeconfig,
        proxy.kubeconfig("extension", &["system:masters"]),
    )
    .unwrap();
    let args: Vec<String> = [
        "serve".to_string(),
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--listen=127.0.0.1:{port}"),
        "--leader-elect=false".into(),
        "--max-view-staleness=3s".into(),
    ]
    .into();
    cluster
        .start_program(
            "fumarole-scheduler-ext",
            &scheduler_ext_bin().unwrap(),
            &args,
            &[],
        )
        .unwrap();
    port
}

/// An extension started while the API server answers 503 (as on a control plane that is
/// coming up) waits and tries again instead of exiting, and is ready once it answers.
#[tokio::test(flavor = "multi_thread")]
async fn the_extension_starts_through_an_api_server_that_fails_at_first() {
    let cluster = TestCluster::start().await.unwrap();
    cluster.install_fumarole_crds().await.unwrap();
    let proxy = FaultProxy::start(cluster.client()).await.unwrap();
    proxy.set(Fault::ServerError(503));
    let port = spawn_extension(&cluster, &proxy);
    tokio::time::sleep(Duration::from_secs(4)).await;
    cluster
        .check_processes()
        .expect("the extension exited on the API server's 503");
    assert!(readiness(port).await.is_err(), "ready without a view");
    proxy.set(Fault::None);
    ready_again(&cluster, port).await;
    cluster.check_processes().unwrap();
}

/// `Ok` when the extension's `/readyz` answers 200, else what it answered.
async fn readiness(port: u16) -> Result<(), String> {
    match http_get(port, "/readyz").await {
        Ok(r) if r.lines().next().is_some_and(|l| l.contains(" 200")) => Ok(()),
        Ok(r) => Err(r.lines().last().unwrap_or_default().to_string()),
        Err(e) => Err(e.to_string()),
    }
}

/// Waits for the extension on `port` to answer `/readyz` with 200 again.
async fn ready_again(cluster: &TestCluster, port: u16) {
    cluster
        .wait_ok(
            "the extension ready again",
            &format!("http://127.0.0.1:{port}"),
            "/readyz",
        )
        .await
        .unwrap();
}

fn of<'a>(records: &'a [Record], user: &str) -> Vec<&'a Record> {
    records.iter().filter(|r| r.client == user).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn agents_converge_through_api_server_faults_with_bounded_spread_retries() {
    let cluster = TestCluster::start().await.unwrap();
    cluster.install_fumarole_crds().await.unwrap();
    let proxy = FaultProxy::start(cluster.client()).await.unwrap();
    let mut agents = Vec::new();
    for i in 0..AGENTS {
        agents.push(start_agent(&cluster, &proxy, i).await);
    }
    let free: Vec<String> = agents.iter().map(|a| a.allocate(2)).collect();
    converged(&cluster, &agents, &free).await;
    let ext = start_extension(&cluster, &proxy).await;

    let faults = [
        (Fault::TooManyRequests { retry_after_s: 3 }, 10),
        (Fault::ServerError(503), 8),
        (Fault::Conflict, 8),
        (Fault::Latency(Duration::from_secs(3)), 10),
        (Fault::Gone, 8),
        (Fault::Reset, 8),
        // The long one: lists fail for 20 s, so a watcher's backoff must grow.
        (Fault::Outage(503), 20),
    ];
    for (round, (fault, hold_s)) in faults.into_iter().enumerate() {
        let from = proxy.now();
        proxy.set(fault.clone());
        // The truth changes while the fault holds.
        let last = 3 + u32::try_from(round).unwrap();
        let free: Vec<String> = agents.iter().map(|a| a.allocate(last)).collect();
        // The extension's readiness while the fault holds: a view whose watches fail longer
        // than --max-view-staleness (3 s) is not ready.
        let mut unready = false;
        let mut timeline = Vec::new();
        let hold = Instant::now();
        while hold.elapsed() < Duration::from_secs(hold_s) {
            let answer = readiness(ext).await;
            unready |= answer.is_err();
            timeline.push(format!("{:.1?} {answer:?}", hold.elapsed()));
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        proxy.set(Fault::None);
        let to = proxy.now();
        let took = converged(&cluster, &agents, &free).await;
        ready_again(&cluster, ext).await;
        cluster.check_processes().unwrap();
        if matches!(
            fault,
            Fault::Reset | Fault::ServerError(_) | Fault::Outage(_)
        ) {
            assert!(
                unready,
                "{fault:?}: the extension stayed ready with its watches failing: {timeline:#?}"
            );
        }

        let records: Vec<Record> = proxy
            .records()
            .into_iter()
            .filter(|r| r.at >= from && r.at < to)
            .collect();
        let mut line = format!(
            "{fault:?} for {hold_s} s: converged {took:.1?} after; extension unready meanwhile: {unready};"
        );
        for a in &agents {
            let mine = of(&records, &a.user);
            let peak = peak_per_second(mine.iter().copied());
            line += &format!(
                " {}: {} requests ({} writes), peak {peak}/s;",
                a.user,
                mine.len(),
                mine.iter().filter(|r| r.is_write()).count()
            );
            assert!(
                peak <= MAX_PER_SECOND,
                "{fault:?}: {} sent {peak} requests in one second: {}",
                a.user,
                by_path(&mine)
            );
        }
        println!("{line}");
        failed_lists_back_off(&fault, &records);

        match fault {
            Fault::TooManyRequests { retry_after_s } => {
                // A write after a 429 waits at least its Retry-After (25 ms for clocks).
                let floor =
                    Duration::from_secs(u64::from(retry_after_s)) - Duration::from_millis(25);
                for a in &agents {
                    let writes: Vec<&Record> = of(&records, &a.user)
                        .into_iter()
                        .filter(|r| r.is_write())
                        .collect();
                    assert!(writes.len() >= 2, "{}: {writes:?}", a.user);
                    for pair in writes.windows(2) {
                        if pair[0].status == 429 {
                            let gap = pair[1].at - pair[0].at;
                            assert!(gap >= floor, "{}: retried {gap:?} after a 429", a.user);
                        }
                    }
                }
            }
            Fault::ServerError(code) => {
                // No retry storm: an agent's failed writes are at least 150 ms apart (kube's
                // client retries 5 ms apart by default; the agent turns that off and backs off
                // with jitter itself).
                for a in &agents {
                    let failed: Vec<&Record> = of(&records, &a.user)
                        .into_iter()
                        .filter(|r| r.is_write() && r.status == code)
                        .collect();
                    assert!(failed.len() >= 2, "{}: {failed:?}", a.user);
                    let gaps: Vec<Duration> =
                        failed.windows(2).map(|w| w[1].at - w[0].at).collect();
                    println!("{}: gaps between failed writes {gaps:.2?}", a.user);
                    assert!(
                        gaps.iter().all(|g| *g >= Duration::from_millis(150)),
                        "{}: retried too soon: {gaps:?}",
                        a.user
                    );
                }
            }
            _ => {}
        }
    }
}

/// A Binding applied whose answer is lost: the extension cannot know it took effect, so it
/// keeps the devices it carries. The next pod is not given them while the view cannot show
/// the first pod bound (the same cut closes the watches), and is refused once it does.
#[tokio::test(flavor = "multi_thread")]
async fn a_binding_whose_answer_is_lost_keeps_its_devices() {
    use k8s_openapi::api::core::v1::Pod;
    use kube::ResourceExt;
    use kube::api::{Api, PostParams};
    use serde_json::{Value, json};
    const T: Duration = Duration::from_secs(30);
    let cluster = common::cluster().await;
    // dgx-a: GPUs 4-7 free.
    common::publish(&cluster, &[common::dgx("dgx-a", 8, &[0, 1, 2, 3], None)]).await;
    let proxy = FaultProxy::start(cluster.client()).await.unwrap();
    let ext = start_extension(&cluster, &proxy).await;
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    let pod = |name: &str| -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": "example.invalid/none",
                "resources": {"limits": {"nvidia.com/gpu": "4"}}}]}
        }))
        .unwrap()
    };
    let first = pods
        .create(&PostParams::default(), &pod("first"))
        .await
        .unwrap();
    let second = pods
        .create(&PostParams::default(), &pod("second"))
        .await
        .unwrap();
    let fits = |p: &Pod| {
        let body = json!({"Pod": p, "NodeNames": ["dgx-a"]});
        async move {
            let answer: Value =
                serde_json::from_str(&http_post_json(ext, "/kube-scheduler/filter", &body).await?)?;
            anyhow::Ok(
                answer["NodeNames"]
                    .as_array()
                    .is_some_and(|n| !n.is_empty()),
            )
        }
    };
    // The extension's view has the pods and dgx-a's devices.
    eventually("second fits on dgx-a", T, || async {
        Ok(fits(&second).await?.then_some(()))
    })
    .await
    .unwrap();

    proxy.set(Fault::AnswerLost);
    let body = json!({"PodName": "first", "PodNamespace": "default",
        "PodUID": first.uid().unwrap(), "Node": "dgx-a"});
    let answer: Value = serde_json::from_str(
        &http_post_json(ext, "/kube-scheduler/bind", &body)
            .await
            .unwrap(),
    )
    .unwrap();
    assert_ne!(answer["Error"], "", "the bind saw no answer: {answer}");
    // Its view cannot show first bound (no watch gets through): the devices are still kept.
    assert!(
        !fits(&second).await.unwrap(),
        "second was offered the devices of first's lost-answer Binding"
    );
    proxy.set(Fault::None);

    // The Binding did take effect, with the devices.
    let bound = pods.get("first").await.unwrap();
    assert_eq!(
        bound.spec.as_ref().and_then(|s| s.node_name.as_deref()),
        Some("dgx-a")
    );
    let choice: Value = serde_json::from_str(&bound.annotations()["fumarole.dev/devices"]).unwrap();
    assert_eq!(choice["nvidia.com/gpu"].as_array().map(Vec::len), Some(4));
    // Once the view shows it, second is refused on dgx-a for the same reason.
    ready_again(&cluster, ext).await;
    assert!(!fits(&second).await.unwrap());
}
