//! The scheduler's choice is the device the container gets, followed per pod from the scheduler
//! to the container: the real kube-scheduler (with the extension as filter, prioritize and
//! bind), kube-scheduler-fumarole (kube-scheduler v1.37 with fumarole's framework plugin
//! compiled in, binding with the choice in the Binding), the real Volcano (with the extension
//! as its `extender` plugin, binding without telling it, so the extension writes the choice
//! right after the bind), or vc-scheduler-fumarole (Volcano v1.10 with fumarole's plugin
//! compiled in and the seeds' configuration: the plugin writes the choice when Volcano
//! allocates, while Volcano binds), the fumarole agent in cluster mode on every node, and
//! harness nodes running the kubelet's own device manager and topology manager
//! (`kubelet-node`) that admit every bound pod through the agent's device plugins.
//!
//! A mixed workload (pods of 1, 2, 4 and 8 GPUs, and gpu-group-size units of two 4-GPU pods;
//! Volcano Jobs through Volcano, bare pods through kube-scheduler) flows through 4 dgx-h100
//! nodes in 2 super-nodes: pods are submitted while others run, checked as soon as their node
//! admits them, then deleted. For every pod, the devices in its
//! `fumarole.dev/devices` annotation, the devices the kubelet's device manager allocated, and
//! the `NVIDIA_VISIBLE_DEVICES` the agent's `Allocate` answered must be the same set; no device
//! is given to two running pods of a node; every unit runs in one super-node. Every difference
//! is counted and the test fails on any. `FUMAROLE_CHAIN_PODS` sets how many pods (default 96
//! per scheduler; the run used 240 through each, see docs/testing.md).

// Test code: helpers outside #[test] fns may unwrap and panic too.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::Way;
use fumarole_e2e::chain::{self, Scheduler};
use fumarole_e2e::cluster::eventually;
use fumarole_e2e::fumarole::KUBE_PLUGIN;
use fumarole_e2e::{TestCluster, fumarole};
use kube::api::Api;

/// How many pods the run pushes through one scheduler.
fn pod_count() -> usize {
    std::env::var("FUMAROLE_CHAIN_PODS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(96)
}

/// Which scheduler decides, and how it reaches fumarole.
#[derive(Clone, Copy, Debug)]
enum Decider {
    /// Upstream's kube-scheduler with the extension as filter, prioritize and bind extender.
    KubeScheduler,
    /// `kube-scheduler-fumarole`: the framework plugin compiled in, binding with the choice.
    KubePlugin,
    Volcano(Way),
}

async fn run_chain(decider: Decider) {
    let cluster = TestCluster::start().await.unwrap();
    cluster.install_fumarole_crds().await.unwrap();
    let harness = chain::start_nodes(&cluster, &[]).await.unwrap();
    let scheduler = match decider {
        Decider::KubeScheduler => {
            let port = cluster.start_scheduler_ext(&[]).await.unwrap();
            cluster
                .start_kube_scheduler(&common::kube_scheduler_config(port))
                .await
                .unwrap();
            Scheduler::Kube
        }
        Decider::KubePlugin => {
            fumarole::start_kube_plugin(&cluster, "{}").await.unwrap();
            Scheduler::Kube
        }
        Decider::Volcano(way) => {
            common::start_volcano(&cluster, way, &[], fumarole::SEED_VOLCANO_CONF).await;
            Scheduler::Volcano
        }
    };
    let target = pod_count();
    let findings = chain::run(
        &cluster,
        &harness,
        scheduler,
        target,
        Duration::from_secs(60 + 6 * target as u64),
        || match decider {
            Decider::Volcano(Way::Plugin) => {
                cluster.log_tail("vc-scheduler", 60).unwrap_or_default()
            }
            Decider::KubePlugin => cluster.log_tail(KUBE_PLUGIN, 60).unwrap_or_default(),
            _ => cluster
                .log_tail("fumarole-scheduler-ext", 40)
                .unwrap_or_default(),
        },
    )
    .await
    .unwrap();
    eprintln!(
        "device chain through {} ({decider:?}): {}",
        scheduler.name(),
        findings.summary()
    );
    assert!(findings.clean(), "{findings:#?}");
    // Every Warning the agents recorded about the pods' devices would be a difference.
    let warnings = eventually(
        "no device-choice Warning Events",
        Duration::from_secs(5),
        || {
            let client = cluster.client();
            async move {
                let events: Api<k8s_openapi::api::events::v1::Event> =
                    Api::namespaced(client, "default");
                let found: Vec<String> = events
                    .list(&Default::default())
                    .await?
                    .items
                    .into_iter()
                    .filter(|e| {
                        e.reason
                            .as_deref()
                            .is_some_and(|r| r.starts_with("DeviceChoice"))
                    })
                    .map(|e| {
                        let pod = e.regarding.and_then(|r| r.name).unwrap_or_default();
                        format!("{pod}: {:?}: {:?}", e.reason, e.note)
                    })
                    .collect();
                Ok(Some(found))
            }
        },
    )
    .await
    .unwrap();
    assert!(
        warnings.is_empty(),
        "{warnings:#?}\n{}",
        logged_of(&cluster, &warnings)
    );
    // The plugin neither failed to start nor stopped a panic.
    match decider {
        Decider::Volcano(Way::Plugin) => common::assert_no_failed_calls(&cluster),
        Decider::KubePlugin => {
            let log = cluster.log_tail(KUBE_PLUGIN, 100_000).unwrap();
            assert!(!log.contains("fumarole panicked"), "{log}");
        }
        _ => {}
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn kube_scheduler_choice_is_what_every_container_gets() {
    run_chain(Decider::KubeScheduler).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn kube_plugin_choice_is_what_every_container_gets() {
    run_chain(Decider::KubePlugin).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn volcano_choice_is_what_every_container_gets() {
    run_chain(Decider::Volcano(Way::Extender)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn volcano_plugin_choice_is_what_every_container_gets() {
    run_chain(Decider::Volcano(Way::Plugin)).await;
}

/// Every line the deciders and agents logged of the pods the `warnings` name (each starts with
/// its pod's name): whose side was late.
fn logged_of(cluster: &TestCluster, warnings: &[String]) -> String {
    let pods: Vec<&str> = warnings
        .iter()
        .filter_map(|w| w.split(':').next())
        .collect();
    let logs = std::fs::read_dir(cluster.root().join("logs"))
        .map(|dir| dir.flatten().map(|e| e.path()).collect::<Vec<_>>())
        .unwrap_or_default();
    logs.iter()
        .filter(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                n.ends_with(".log")
                    && (n.starts_with("fumarole")
                        || n.starts_with("vc-scheduler")
                        || n.starts_with(KUBE_PLUGIN))
            })
        })
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .flat_map(|log| {
            log.lines()
                .filter(|line| pods.iter().any(|pod| line.contains(pod)))
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Time-sliced replicas through the whole chain: two dgx-h100 harness nodes whose agents serve
/// every GPU as 4 `nvidia.com/gpu.shared` replicas (`packed`), kube-scheduler with the
/// extension. The agents publish the offer in `DeviceTopology`; six one-replica pods, one after
/// the other, land on one node and, through the kubelet's own device manager, on two of its GPUs
/// (4 + 2). (The harness nodes serve no PodResources, so the agents report no holders here:
/// the scheduler counts the shares it committed, which is what this run checks;
/// `podresources.rs` checks the holders the agent reports.)
#[tokio::test(flavor = "multi_thread")]
async fn shares_through_agent_kubelet_and_kube_scheduler_pack_onto_one_node() {
    use fumarole_e2e::fleet::{self, FleetNode};
    use fumarole_topology::crd::DeviceTopology;
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::PostParams;
    const SHARED: &str = "nvidia.com/gpu.shared";
    let cluster = TestCluster::start().await.unwrap();
    cluster.install_fumarole_crds().await.unwrap();
    let config = cluster.root().join("sharing.yaml");
    std::fs::write(
        &config,
        "resources:\n  - match: {vendor: nvidia}\n    replicaAllocation: packed\n    sharing:\n      \
         timeSlicing:\n        renameByDefault: true\n        resources:\n          \
         - {name: nvidia.com/gpu, replicas: 4}\n",
    )
    .unwrap();
    let nodes: Vec<FleetNode> = ["dgx-0", "dgx-1"]
        .iter()
        .map(|n| FleetNode::new(n, "dgx-h100", SHARED, 32))
        .collect();
    let args = ["--device-plugin-config", config.to_str().unwrap()];
    let harness = fleet::start(&cluster, &nodes, &args).await.unwrap();
    let topologies: Api<DeviceTopology> = Api::all(cluster.client());
    eventually(
        "both DeviceTopologies offering 4 replicas of every GPU",
        Duration::from_secs(60),
        || {
            let topologies = topologies.clone();
            async move {
                for n in ["dgx-0", "dgx-1"] {
                    let Some(dt) = topologies.get_opt(n).await? else {
                        return Ok(None);
                    };
                    let offered = dt.spec.devices.iter().all(|d| {
                        d.sharing.as_ref().is_some_and(|s| {
                            s.resource == SHARED && s.replicas == 4 && s.mechanism == "timeSlicing"
                        })
                    });
                    if !offered || dt.spec.devices.len() != 8 {
                        return Ok(None);
                    }
                }
                Ok(Some(()))
            }
        },
    )
    .await
    .unwrap();
    let port = cluster.start_scheduler_ext(&[]).await.unwrap();
    let managed = ["nvidia.com/gpu", SHARED];
    cluster
        .start_kube_scheduler(&fumarole::kube_scheduler_config(port, &managed))
        .await
        .unwrap();

    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    let mut placed: Vec<(String, String)> = Vec::new();
    for i in 0..6 {
        let name = format!("infer-{i}");
        let created = pods
            .create(&PostParams::default(), &common::share_pod(&name, SHARED, 1))
            .await
            .unwrap();
        let node = eventually(&format!("{name} bound"), Duration::from_secs(60), || {
            let pods = pods.clone();
            let name = name.clone();
            async move { Ok(pods.get(&name).await?.spec.and_then(|s| s.node_name)) }
        })
        .await
        .unwrap();
        let h = harness.iter().find(|h| h.node_name() == node).unwrap();
        let rec = h
            .wait_decided(&created, Duration::from_secs(90))
            .await
            .unwrap();
        assert!(rec.admitted, "{rec:#?}");
        let replicas = &rec.container("c").unwrap().devices[SHARED];
        assert_eq!(replicas.len(), 1, "{replicas:?}");
        let gpu = replicas[0].split("::").next().unwrap().to_string();
        placed.push((node, gpu));
    }
    let node = &placed[0].0;
    assert!(placed.iter().all(|(n, _)| n == node), "{placed:?}");
    let mut per_gpu = std::collections::BTreeMap::<&str, usize>::new();
    for (_, gpu) in &placed {
        *per_gpu.entry(gpu.as_str()).or_default() += 1;
    }
    let mut counts: Vec<usize> = per_gpu.values().copied().collect();
    counts.sort_unstable();
    assert_eq!(counts, [2, 4], "{placed:?}");
}
