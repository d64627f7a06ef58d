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
use fumarole_e2e::process::Footprint;
use fumarole_e2e::{AgentBuilder, KubeletDm, NodeSpec, TestCluster};

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
        let agent = AgentBuilder::fixture("dgx-h100")
            .node("dgx-1")
            .flag("--recheck-interval", "10s")
            .device_plugin_dir(&plugins)
            .kubelet_config(&dir.path().join("config.yaml"))
            .cpu_manager_state(&dir.path().join("cpu_manager_state"))
            .pod_resources_socket(&dir.path().join("kubelet.sock"))
            .metrics_on_port(free_port().unwrap())
            .arg("--colocation")
            .flag("--colocation-config-namespace", "default")
            .spawn_in(&cluster)
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
