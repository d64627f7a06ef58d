//! The agent's footprint in steady state: `fumarole-agent run` on the dgx-h100 fixture (8 GPUs)
//! with a 10 s re-check against the real API server, its device plugins registered with
//! kubelet-dm and co-location on. After a warm-up it samples the process every 5 s and prints
//! its RSS (first, last, largest), open file descriptors (first, last) and CPU time over the
//! window, in percent of one core. A measurement, not a test: nothing is asserted.
//!
//! ```sh
//! cargo build --release -p fumarole-agent
//! cargo bench -p fumarole-e2e --bench footprint            # 120 s window
//! cargo bench -p fumarole-e2e --bench footprint -- 600     # another window, in seconds
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use fumarole_e2e::cluster::free_port;
use fumarole_e2e::fumarole::agent_bin;
use fumarole_e2e::process::{Footprint, Proc};
use fumarole_e2e::{KubeletDm, NodeSpec, TestCluster};

const WARM_UP: Duration = Duration::from_secs(30);
const EVERY: Duration = Duration::from_secs(5);

fn main() {
    let window = std::env::args()
        .skip(1)
        .find_map(|a| a.parse::<u64>().ok())
        .map_or(Duration::from_secs(120), Duration::from_secs);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async move {
        let cluster = TestCluster::start().await.unwrap();
        cluster.install_fumarole_crds().await.unwrap();
        cluster
            .create_node(
                &NodeSpec::new("dgx-1")
                    .capacity("cpu", "224")
                    .capacity("memory", "2Ti")
                    .label("volcano.sh/colocation", "true"),
            )
            .await
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let plugins = dir.path().join("device-plugins");
        std::fs::create_dir_all(&plugins).unwrap();
        let logs = cluster.root().join("logs");
        let _kdm = KubeletDm::start(&plugins, &logs).await.unwrap();
        let path = |f: &str| dir.path().join(f).display().to_string();
        let args: Vec<String> = [
            "run",
            "--fixture",
            "dgx-h100",
            "--node-name",
            "dgx-1",
            "--recheck-interval",
            "10s",
            "--device-plugin-dir",
            plugins.to_str().unwrap(),
            "--kubelet-config",
            &path("config.yaml"),
            "--cpu-manager-state",
            &path("cpu_manager_state"),
            "--pod-resources-socket",
            &path("kubelet.sock"),
            "--metrics-addr",
            &format!("127.0.0.1:{}", free_port().unwrap()),
            "--colocation",
            "--colocation-config-namespace",
            "default",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let kubeconfig = cluster.admin_kubeconfig().display().to_string();
        let agent = Proc::spawn_with_env(
            "fumarole-agent",
            &agent_bin().unwrap(),
            &args,
            &[("KUBECONFIG", kubeconfig.as_str())],
            &logs,
        )
        .unwrap();
        eprintln!(
            "footprint: {} warming up {WARM_UP:?}, then sampling {window:?}",
            agent_bin().unwrap().display()
        );
        tokio::time::sleep(WARM_UP).await;
        let pid = agent.pid();
        let start = Instant::now();
        let first = Footprint::of(pid).unwrap();
        let mut last = first;
        let mut max_rss = first.rss_kib;
        while start.elapsed() < window {
            tokio::time::sleep(EVERY).await;
            last = Footprint::of(pid).unwrap();
            max_rss = max_rss.max(last.rss_kib);
        }
        let seconds = start.elapsed().as_secs_f64();
        let cpu =
            (last.cpu_ticks - first.cpu_ticks) as f64 / fumarole_e2e::process::clock_ticks_per_second().unwrap() / seconds * 100.0;
        println!(
            "agent steady state over {seconds:.0} s: RSS {:.1} MiB at start, {:.1} MiB at end, {:.1} MiB max; \
             fds {} -> {}; CPU {cpu:.2} % of one core",
            first.rss_mib(),
            last.rss_mib(),
            max_rss as f64 / 1024.0,
            first.fds,
            last.fds
        );
    });
}
