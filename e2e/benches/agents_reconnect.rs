//! Many agents and an API server that restarts: `--agents` (200) `fumarole-agent run` processes
//! (publishing mode, the cpu-only fixture, one Node each) talk to the real API server through a
//! [`FaultProxy`] that counts every request. Once every agent has published, kube-apiserver is
//! stopped for `--outage` seconds (30; the proxy resets connections meanwhile, as a restarting
//! server does) and every node's truth changes (the kubelet hands out other CPUs). Then the
//! server comes back, and the bench measures:
//!
//! - the time until every agent's `Numatopology` is the truth again, and how the agents' first
//!   successful writes spread over that time (jittered backoff: they do not come back at once);
//! - the request rate at the API server: peak in any one second, and in total, during the
//!   outage and after it;
//! - that every agent process still runs (none gave up).
//!
//! A measurement, not a test; figures go in docs/reliability.md.
//!
//! ```sh
//! cargo build --release -p fumarole-agent
//! cargo bench -p fumarole-e2e --bench agents_reconnect                    # 200 agents, 30 s
//! cargo bench -p fumarole-e2e --bench agents_reconnect -- --agents 20 --outage 10
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use fumarole_e2e::cluster::free_port;
use fumarole_e2e::fault_proxy::{Fault, FaultProxy, Record, peak_per_second};
use fumarole_e2e::fumarole::numatopologies;
use fumarole_e2e::{AgentBuilder, NodeSpec, TestCluster};
use kube::api::ListParams;

const CPUS: u32 = 64;
const KUBELET_CONFIG: &str = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncpuManagerPolicy: static\n";

fn arg(flag: &str, default: u64) -> u64 {
    let argv: Vec<String> = std::env::args().collect();
    argv.iter()
        .position(|a| a == flag)
        .and_then(|i| argv.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn node(i: usize) -> String {
    format!("many-{i:03}")
}

/// Writes the kubelet's CPU checkpoint giving CPUs 2..=last to one pod (whole, by rename);
/// returns what the Numatopology must then say free.
fn allocate(dir: &std::path::Path, last: u32) -> String {
    let next = dir.join("cpu_manager_state.next");
    std::fs::write(
        &next,
        format!(
            r#"{{"policyName":"static","defaultCpuSet":"0-1,{}-{}","entries":{{"p":{{"c":"2-{last}"}}}},"checksum":{last}}}"#,
            last + 1,
            CPUS - 1
        ),
    )
    .unwrap();
    std::fs::rename(&next, dir.join("cpu_manager_state")).unwrap();
    format!("0-1,{}-{}", last + 1, CPUS - 1)
}

/// Nodes whose Numatopology says `free`.
async fn current(cluster: &TestCluster, free: &str) -> usize {
    let api = numatopologies(cluster.client());
    match api.list(&ListParams::default()).await {
        Ok(list) => list
            .items
            .iter()
            .filter(|o| o.data["spec"]["numares"]["cpu"]["allocatable"] == free)
            .count(),
        Err(_) => 0,
    }
}

fn main() {
    let agents = arg("--agents", 200) as usize;
    let outage = Duration::from_secs(arg("--outage", 30));
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async move {
        let cluster = TestCluster::start().await.unwrap();
        cluster.install_fumarole_crds().await.unwrap();
        let proxy = FaultProxy::start(cluster.client()).await.unwrap();
        let dirs: Vec<tempfile::TempDir> = (0..agents).map(|_| tempfile::tempdir().unwrap()).collect();
        let started = Instant::now();
        for (i, dir) in dirs.iter().enumerate() {
            cluster
                .create_node(
                    &NodeSpec::new(&node(i))
                        .capacity("cpu", &CPUS.to_string())
                        .capacity("memory", "256Gi"),
                )
                .await
                .unwrap();
            std::fs::write(dir.path().join("config.yaml"), KUBELET_CONFIG).unwrap();
            allocate(dir.path(), 2);
            let kubeconfig: PathBuf = dir.path().join("kubeconfig");
            std::fs::write(&kubeconfig, proxy.kubeconfig(&node(i), &["system:masters"])).unwrap();
            AgentBuilder::fixture("cpu-only")
                .process(&format!("agent-{}", node(i)))
                .node(&node(i))
                .kubelet_config(&dir.path().join("config.yaml"))
                .cpu_manager_state(&dir.path().join("cpu_manager_state"))
                .pod_resources_socket(&dir.path().join("absent.sock"))
                .flag("--recheck-interval", "30s")
                .metrics_on_port(free_port().unwrap())
                .kubeconfig(&kubeconfig)
                .env("FUMAROLE_LOG", "warn")
                .start_in(&cluster)
                .unwrap();
        }
        let before = "0-1,3-63";
        while current(&cluster, before).await < agents {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        eprintln!("{agents} agents published in {:.1?}", started.elapsed());
        tokio::time::sleep(Duration::from_secs(5)).await;

        // The outage.
        let down = proxy.now();
        proxy.set(Fault::Reset);
        cluster.stop_apiserver().unwrap();
        let after: Vec<String> = dirs.iter().map(|d| allocate(d.path(), 9)).collect();
        let want = after[0].clone();
        tokio::time::sleep(outage).await;
        cluster.start_apiserver().await.unwrap();
        let up = proxy.now();
        proxy.set(Fault::None);
        let back = Instant::now();
        let mut all_at = None;
        while back.elapsed() < Duration::from_secs(180) {
            if current(&cluster, &want).await == agents {
                all_at = Some(back.elapsed());
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
        let end = proxy.now();
        cluster.check_processes().unwrap();

        let records = proxy.records();
        let during: Vec<&Record> = records.iter().filter(|r| r.at >= down && r.at < up).collect();
        let since: Vec<&Record> = records.iter().filter(|r| r.at >= up && r.at < end).collect();
        // Each agent's first successful write of the new truth after the server came back.
        let mut first_writes: Vec<Duration> = (0..agents)
            .filter_map(|i| {
                since
                    .iter()
                    .find(|r| r.client == node(i) && r.is_write() && r.status == 200)
                    .map(|r| r.at - up)
            })
            .collect();
        first_writes.sort();
        let q = |p: f64| {
            first_writes
                .get(((first_writes.len() as f64 - 1.0) * p).round() as usize)
                .copied()
                .unwrap_or_default()
        };
        let per_agent_peak = (0..agents)
            .map(|i| peak_per_second(since.iter().copied().filter(|r| r.client == node(i))))
            .max()
            .unwrap_or(0);
        println!("agents {agents}, outage {outage:?}");
        println!(
            "every Numatopology current {} after the API server was back; every agent process still running",
            all_at.map_or("NOT within 180 s".into(), |d| format!("{d:.1?}"))
        );
        println!(
            "first successful write per agent after it was back: min {:.1?}, median {:.1?}, p90 {:.1?}, max {:.1?} ({} agents)",
            q(0.0),
            q(0.5),
            q(0.9),
            q(1.0),
            first_writes.len()
        );
        println!(
            "requests during the outage: {} ({:.1}/s), peak {}/s",
            during.len(),
            during.len() as f64 / (up - down).as_secs_f64(),
            peak_per_second(during.iter().copied())
        );
        println!(
            "requests in the {:.0?} after it: {}, peak {}/s at the API server, at most {}/s from one agent",
            end - up,
            since.len(),
            peak_per_second(since.iter().copied()),
            per_agent_peak
        );
        assert!(all_at.is_some(), "not every agent caught up");
    });
}
