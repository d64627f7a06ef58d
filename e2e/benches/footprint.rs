//! The agent's footprint in steady state: `fumarole-agent run` on the dgx-h100 fixture (8 GPUs)
//! with a 10 s re-check against the real API server, its device plugins registered with
//! kubelet-dm and co-location on. After a warm-up it samples the process every 5 s and prints
//! its RSS (first, last, largest), open file descriptors (first, last) and CPU time over the
//! window, in percent of one core. A measurement, not a test: nothing is asserted.
//!
//! With `--nvml`, the node's NVIDIA answers come from the NVML stand-in library instead of the
//! fixture's recorded ones (the health thread and the per-device figures' sampler run, every
//! 10 s, with the stand-in's figures set), and `/metrics` is also scraped every second: the
//! scrape's wall time (median, largest) and size are printed. The stand-in re-reads its state
//! file at each call, so its own cost is in the CPU figure too; the figures' sampler thread's
//! own CPU time (the stand-in's work in its calls included) is printed apart. With `--dcmi`,
//! the same on the atlas-800-910 fixture (8 NPUs) through the DCMI stand-in.
//!
//! ```sh
//! cargo build --release -p fumarole-agent
//! cargo bench -p fumarole-e2e --bench footprint            # 120 s window
//! cargo bench -p fumarole-e2e --bench footprint -- 600     # another window, in seconds
//! cargo bench -p fumarole-e2e --bench footprint -- --nvml  # with NVML and the figures
//! cargo bench -p fumarole-e2e --bench footprint -- --dcmi  # with DCMI and the figures
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use fumarole_e2e::cluster::{free_port, http_get};
use fumarole_e2e::fumarole::{agent_bin, fixture_root};
use fumarole_e2e::process::{Footprint, thread_cpu_ticks};
use fumarole_e2e::standin::{ascend_chips, dcmi_standin};
use fumarole_e2e::{AgentBuilder, KubeletDm, NodeSpec, TestCluster};

const WARM_UP: Duration = Duration::from_secs(30);
const EVERY: Duration = Duration::from_secs(5);

fn main() {
    let window = std::env::args()
        .skip(1)
        .find_map(|a| a.parse::<u64>().ok())
        .map_or(Duration::from_secs(120), Duration::from_secs);
    let nvml = std::env::args().any(|a| a == "--nvml");
    let dcmi = std::env::args().any(|a| a == "--dcmi");
    let figures = nvml || dcmi;
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
        let port = free_port().unwrap();
        let standin = nvml.then(|| {
            let (root, lib, mut state) = fumarole_e2e::standin::nvidia_root(dir.path()).unwrap();
            state.edit(|s| {
                for (i, g) in s["gpus"].as_array_mut().unwrap().iter_mut().enumerate() {
                    g["metrics"] = serde_json::json!({
                        "utilization": 50 + i, "memoryUtilization": 20, "memoryUsedBytes": 1u64 << 34,
                        "powerMilliwatts": 400_000, "energyMillijoules": 1u64 << 32, "temperature": 60,
                        "smClockMhz": 1980, "memoryClockMhz": 2619, "throttleReasons": 0,
                        "eccCorrected": 0, "eccUncorrected": 0, "retiredPagesSingleBit": 0,
                        "retiredPagesDoubleBit": 0, "remappedRowsCorrectable": 0,
                        "remappedRowsUncorrectable": 0, "pcieTxKilobytesPerSecond": 1000,
                        "pcieRxKilobytesPerSecond": 1000, "pcieReplays": 0
                    });
                }
            });
            (root, lib, state)
        });
        let npus = dcmi.then(|| {
            let root = fixture_root("atlas-800-910", dir.path()).unwrap();
            let chips = ascend_chips(8, |i| serde_json::json!({
                "chipInfo": {"chipType": "Ascend", "chipName": "910B3", "chipVer": "V1", "aicoreCnt": 20},
                "metrics": {"aicore": 50 + i, "temperature": 55, "power": 1805, "aicoreFreq": 1800,
                            "hbmTotal": 65536, "hbmUsed": 8192, "hccsTx": vec![1.5; 7], "hccsRx": vec![1.5; 7]}
            }));
            let (lib, state) =
                dcmi_standin(dir.path(), serde_json::json!({"chips": chips})).unwrap();
            (root, lib, state)
        });
        let builder = match (&standin, &npus) {
            (Some((root, lib, state)), _) => AgentBuilder::root(root)
                .nvml_standin(lib, &state.path)
                .flag("--device-metric-names", "fumarole,dcgm"),
            (None, Some((root, lib, state))) => AgentBuilder::root(root)
                .dcmi_standin(lib, &state.path)
                .flag("--device-metric-names", "fumarole,npu-exporter"),
            (None, None) => AgentBuilder::fixture("dgx-h100"),
        };
        let agent = builder
            .node("dgx-1")
            .flag("--recheck-interval", "10s")
            .device_plugin_dir(&plugins)
            .kubelet_config(&dir.path().join("config.yaml"))
            .cpu_manager_state(&dir.path().join("cpu_manager_state"))
            .pod_resources_socket(&dir.path().join("kubelet.sock"))
            .metrics_on_port(port)
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
        // The figures' sampler threads: `fumarole-nvml-metrics`, `fumarole-dcmi-metrics`.
        let sampler = if nvml { "fumarole-nvml-m" } else { "fumarole-dcmi-m" };
        let sampler_first = thread_cpu_ticks(pid, sampler).unwrap();
        let mut max_rss = first.rss_kib;
        let mut scrapes: Vec<Duration> = Vec::new();
        let mut scraped = 0;
        let mut next_sample = start + EVERY;
        while start.elapsed() < window {
            if figures {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let t = Instant::now();
                scraped = http_get(port, "/metrics").await.unwrap().len();
                scrapes.push(t.elapsed());
            } else {
                tokio::time::sleep(EVERY).await;
            }
            if Instant::now() >= next_sample {
                next_sample += EVERY;
                max_rss = max_rss.max(Footprint::of(pid).unwrap().rss_kib);
            }
        }
        let last = Footprint::of(pid).unwrap();
        max_rss = max_rss.max(last.rss_kib);
        let seconds = start.elapsed().as_secs_f64();
        let per_core = |ticks: u64| {
            ticks as f64 / fumarole_e2e::process::clock_ticks_per_second().unwrap() / seconds * 100.0
        };
        let cpu = per_core(last.cpu_ticks - first.cpu_ticks);
        if figures {
            let ticks = thread_cpu_ticks(pid, sampler).unwrap() - sampler_first;
            println!(
                "the figures' sampler thread alone: CPU {:.2} % of one core",
                per_core(ticks)
            );
        }
        println!(
            "agent steady state over {seconds:.0} s: RSS {:.1} MiB at start, {:.1} MiB at end, {:.1} MiB max; \
             fds {} -> {}; CPU {cpu:.2} % of one core",
            first.rss_mib(),
            last.rss_mib(),
            max_rss as f64 / 1024.0,
            first.fds,
            last.fds
        );
        if !scrapes.is_empty() {
            scrapes.sort();
            println!(
                "/metrics with the per-device figures of 8 devices (both names): {} scrapes, median {:.2} ms, largest {:.2} ms, {} bytes",
                scrapes.len(),
                scrapes[scrapes.len() / 2].as_secs_f64() * 1e3,
                scrapes[scrapes.len() - 1].as_secs_f64() * 1e3,
                scraped
            );
        }
    });
}
