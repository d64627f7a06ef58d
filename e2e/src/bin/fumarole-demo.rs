//! `fumarole-demo` (run by `scripts/demo.sh`): fumarole's main job on a local cluster.
//!
//! Starts the e2e control plane (etcd, kube-apiserver, Volcano's controllers), seven fixture
//! nodes in two super-nodes, each with a harness node (the kubelet's own device and topology
//! managers) and a real `fumarole-agent`, and the two schedulers with fumarole deciding: by
//! default both plugins (`kube-scheduler-fumarole` and `vc-scheduler-fumarole`, the decision
//! core compiled into each, the nodes split into node pools between them), or with `--with
//! extender` upstream's kube-scheduler and Volcano calling the scheduler extension (one core for
//! both, and its `/ui` page). Submits a few workloads, prints where each pod landed, with which
//! devices and why, and stays up until Ctrl-C (or exits at once with `--once`). Everything it
//! started stops with it.

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Parser, ValueEnum};
use fumarole_e2e::chain::{pytorch_demo, vcjob_resource};
use fumarole_e2e::fleet::{self, FleetNode};
use fumarole_e2e::fumarole::{
    SEED_VOLCANO_CONF, kube_scheduler_config, kubectl_plugin_bin, start_kube_plugin,
    volcano_conf_with_extender, volcano_plugin_bin,
};
use fumarole_e2e::wait::eventually;
use fumarole_e2e::{HarnessNode, TestCluster};
use fumarole_topology::annotation::{self, DEVICES_ANNOTATION};
use fumarole_topology::crd::DeviceTopology;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use kube::{Client, ResourceExt};
use scheduler_ext::core::explain;
use scheduler_ext::core::view::NODE_POOL_LABEL;
use scheduler_ext::decider::{Decider, Settings};
use scheduler_ext::live;
use scheduler_ext::protocol::scale;
use scheduler_ext::text_table;
use serde_json::json;

const GPU: &str = "nvidia.com/gpu";
const NPU: &str = "huawei.com/Ascend910";
const NAMESPACE: &str = "default";

/// The node pool kube-scheduler-fumarole hands accelerators out in, under `--with plugins`
/// (Volcano's plugin takes the unlabelled nodes).
const KUBE_POOL: &str = "kube";

#[derive(Parser)]
#[command(about = "fumarole's main job on a local cluster of bundled fixture nodes")]
struct Args {
    /// How the schedulers reach fumarole.
    #[arg(long, value_enum, default_value_t = With::Plugins)]
    with: With,
    /// Port of the scheduler extension's `/ui` on 127.0.0.1 (`--with extender`).
    #[arg(long, default_value_t = 8890)]
    ui_port: u16,
    /// Print the report and stop everything, instead of waiting for Ctrl-C.
    #[arg(long)]
    once: bool,
}

/// How kube-scheduler and Volcano reach fumarole.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum With {
    /// kube-scheduler-fumarole and vc-scheduler-fumarole: the decision core compiled into each
    /// scheduler. Two ledgers, so the nodes are split into node pools: the DGX nodes are
    /// Volcano's, the Atlas and PCIe nodes kube-scheduler's (`fumarole.dev/node-pool: kube`).
    Plugins,
    /// Upstream's kube-scheduler and Volcano calling fumarole-scheduler-ext (one ledger for
    /// both, every node shared), which serves the `/ui` page.
    Extender,
}

/// The demo cluster: 4 DGX H100 and 2 Atlas 800 (910) in super-nodes `sn-a` and `sn-b`, and a
/// 4-GPU PCIe server in none; under `with` plugins the Atlas and PCIe nodes in kube-scheduler's
/// node pool.
fn nodes(with: With) -> Vec<FleetNode> {
    let kube = |n: FleetNode| match with {
        With::Plugins => n.label(NODE_POOL_LABEL, KUBE_POOL),
        With::Extender => n,
    };
    let dgx = |name: &str, sn: &str| FleetNode::new(name, "dgx-h100", GPU, 8).super_node(sn);
    let atlas = |name: &str, sn: &str| {
        kube(
            FleetNode::new(name, "atlas-800-910", NPU, 8)
                .super_node(sn)
                .capacity("192", "1Ti"),
        )
    };
    vec![
        dgx("dgx-a0", "sn-a"),
        dgx("dgx-a1", "sn-a"),
        atlas("atlas-a", "sn-a"),
        dgx("dgx-b0", "sn-b"),
        dgx("dgx-b1", "sn-b"),
        atlas("atlas-b", "sn-b"),
        kube(FleetNode::new("pcie-0", "pcie-4gpu", GPU, 4).capacity("64", "512Gi")),
    ]
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    // Ctrl-C at any point, startup included, drops `run` and with it everything it started.
    let result = tokio::select! {
        r = run(&args) => r,
        r = shutdown_signal() => r.map(|()| step("stopping")),
    };
    match result {
        Ok(()) => say("demo: stopped; nothing it started is left running"),
        Err(e) => {
            eprintln!("demo: {e:#}");
            std::process::exit(1);
        }
    }
}

/// Starts the cluster, runs the workloads, prints the report; then waits forever (the caller
/// stops it) or, with `--once`, returns.
async fn run(args: &Args) -> Result<()> {
    preflight(args)?;
    step("starting the control plane (etcd, kube-apiserver)");
    let cluster = TestCluster::start().await?;
    cluster.install_fumarole_crds().await?;
    let nodes = nodes(args.with);
    step(&format!(
        "starting {} nodes: a harness kubelet and a fumarole-agent each",
        nodes.len()
    ));
    let harness = fleet::start(&cluster, &nodes, &[]).await?;
    match args.with {
        With::Plugins => {
            step(&format!(
                "starting kube-scheduler-fumarole (node pool {KUBE_POOL:?}) and \
                 vc-scheduler-fumarole (the seeds' configuration; the unlabelled nodes)"
            ));
            start_kube_plugin(&cluster, &format!("{{nodePool: {KUBE_POOL}}}")).await?;
            cluster
                .start_volcano_with(&volcano_plugin_bin()?, SEED_VOLCANO_CONF)
                .await?;
        }
        With::Extender => {
            step("starting fumarole-scheduler-ext, kube-scheduler and Volcano");
            let ui = format!("--ui-listen=127.0.0.1:{}", args.ui_port);
            let port = cluster.start_scheduler_ext(&[&ui]).await?;
            cluster
                .start_kube_scheduler(&kube_scheduler_config(port, &[GPU, NPU]))
                .await?;
            cluster
                .start_volcano(&volcano_conf_with_extender(port))
                .await?;
        }
    }

    let client = cluster.client();
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let mut report = Vec::new();

    step("submitting the Volcano Job pytorch-demo (4 pods x 8 GPUs, gpu-group-size 16)");
    let jobs: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), NAMESPACE, &vcjob_resource());
    // The seed's job sized for the demo's four 8-GPU nodes: 1 + 3 pods, units of 16 GPUs.
    jobs.create(&PostParams::default(), &pytorch_demo(3, 16, None))
        .await?;
    let job_pods: Vec<String> = std::iter::once("pytorch-demo-master-0".to_string())
        .chain((0..3).map(|i| format!("pytorch-demo-worker-{i}")))
        .collect();
    for name in &job_pods {
        report.push(wait_running(&pods, name).await?);
    }

    for (pod, what) in [
        (gpu_pod("train-4gpu", 4), "a pod of 4 GPUs"),
        (npu_pod("infer-1npu", 1), "a pod of 1 Ascend NPU"),
        (
            best_effort_pod("batch-be"),
            "a best-effort pod, QoS level BE",
        ),
    ] {
        let name = pod.name_any();
        step(&format!("{what}: {name}; where it can go, best first"));
        if pod_asks_for_devices(&pod) {
            match why(&client, &pod, args.with).await {
                Ok(rows) => say(&indent(&rows)),
                Err(e) => say(&format!("  (no explanation: {e:#})")),
            }
        } else {
            say(
                "  no accelerator asked: kube-scheduler places it without fumarole. Its QoS \
                 level is for the agent's co-location (--colocation, docs/colocation.md), \
                 which the demo's fixture nodes do not run",
            );
        }
        pods.create(&PostParams::default(), &pod).await?;
        report.push(wait_running(&pods, &name).await?);
    }

    say("");
    let topologies = Api::<DeviceTopology>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items;
    say(&placements(&report, &harness, &nodes, &topologies).await?);
    say(&units(&report, &nodes));
    let page = match args.with {
        With::Extender => format!("The cluster page: http://127.0.0.1:{}/ui", args.ui_port),
        With::Plugins => {
            "The cluster page (/ui) is the extension's: scripts/demo.sh --with extender".to_string()
        }
    };
    say(&format!(
        "\n{page}\n\
         kubectl: export KUBECONFIG={}\n\
         kubectl-fumarole (explain POD, node NODE, top): {}\n\
         Logs: {} (kept after the demo with FUMAROLE_E2E_KEEP=1)",
        cluster.admin_kubeconfig().display(),
        kubectl_plugin_bin()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|e| format!("{e:#}")),
        cluster.root().join("logs").display(),
    ));
    if args.once {
        step("--once: stopping");
        return Ok(());
    }
    say("\nRunning; Ctrl-C stops everything.");
    std::future::pending::<()>().await;
    Ok(())
}

fn step(what: &str) {
    say(&format!("==> {what}"));
}

/// Prints a line; a closed stdout (the reader went away) is no reason to stop: the demo still
/// has to stop what it started.
fn say(text: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stdout(), "{text}");
}

fn indent(text: &str) -> String {
    text.lines()
        .map(|l| format!("  {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// What can be checked before anything starts: root (the harness nodes run in their own mount
/// namespace) and, for the extension, the `/ui` port.
fn preflight(args: &Args) -> Result<()> {
    let ui_port = args.ui_port;
    if !nix::unistd::Uid::effective().is_root() {
        bail!(
            "the demo's nodes run the kubelet's device manager in their own mount namespace, \
             which needs root; run it as root, or `scripts/demo.sh discover` for one node's \
             topology without a cluster"
        );
    }
    if args.with == With::Plugins {
        return Ok(());
    }
    TcpListener::bind(("127.0.0.1", ui_port)).map_err(|e| {
        anyhow::anyhow!(
            "port {ui_port} on 127.0.0.1 (the /ui page) is not free ({e}); \
             pass --ui-port with another port"
        )
    })?;
    Ok(())
}

async fn shutdown_signal() -> Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("watching SIGTERM")?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r.context("watching Ctrl-C")?,
        _ = term.recv() => {}
    }
    Ok(())
}

fn pod(name: &str, annotations: serde_json::Value, resources: serde_json::Value) -> Pod {
    let value = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "annotations": annotations},
        "spec": {"containers": [{"name": "main", "image": "example.invalid/app",
                                 "resources": resources}]}
    });
    // The JSON above is a valid Pod by construction.
    serde_json::from_value(value).unwrap_or_default()
}

fn gpu_pod(name: &str, gpus: u32) -> Pod {
    pod(
        name,
        json!({}),
        json!({"requests": {"cpu": "4", "memory": "16Gi"}, "limits": {GPU: gpus.to_string()}}),
    )
}

fn npu_pod(name: &str, npus: u32) -> Pod {
    pod(
        name,
        json!({}),
        json!({"requests": {"cpu": "4", "memory": "16Gi"}, "limits": {NPU: npus.to_string()}}),
    )
}

fn best_effort_pod(name: &str) -> Pod {
    pod(name, json!({"volcano.sh/qos-level": "BE"}), json!({}))
}

/// The `explain` rows for `pod`, from the live cluster as it is now (the view `kubectl fumarole
/// explain` reads), judged as the scheduler placing it does: under `with` plugins, in
/// kube-scheduler's node pool (every pod asked about here is kube-scheduler's).
async fn why(client: &Client, pod: &Pod, with: With) -> Result<String> {
    let view = live::read_once(client).await?;
    let settings = Settings {
        node_pool: (with == With::Plugins).then(|| KUBE_POOL.to_string()),
        ..Settings::default()
    };
    let decider = Decider::new(view, settings);
    let (req, rows) = decider.explain(pod, scale::shown(decider.scorer()))?;
    Ok(explain::table(&req, &rows))
}

/// One placed pod.
struct Placed {
    name: String,
    scheduler: String,
    node: String,
    qos: String,
    /// The scheduler's choice, `fumarole.dev/devices`.
    chosen: Vec<String>,
}

async fn wait_running(pods: &Api<Pod>, name: &str) -> Result<Placed> {
    let pod = eventually(
        &format!("pod {name} running"),
        Duration::from_secs(180),
        || async move {
            let Some(p) = pods.get_opt(name).await? else {
                return Ok(None);
            };
            let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
            if phase == Some("Failed") {
                bail!(
                    "pod {name} failed: {:?}",
                    p.status.as_ref().and_then(|s| s.message.clone())
                );
            }
            Ok((phase == Some("Running")).then_some(p))
        },
    )
    .await?;
    let annotations = pod.annotations();
    let chosen = match annotations.get(DEVICES_ANNOTATION) {
        Some(v) => annotation::parse(v)
            .with_context(|| format!("pod {name}: {DEVICES_ANNOTATION}"))?
            .into_values()
            .flatten()
            .collect(),
        None => Vec::new(),
    };
    Ok(Placed {
        name: name.to_string(),
        scheduler: pod
            .spec
            .as_ref()
            .and_then(|s| s.scheduler_name.clone())
            .unwrap_or_default(),
        node: pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default(),
        qos: annotations
            .get("volcano.sh/qos-level")
            .cloned()
            .unwrap_or_else(|| "-".into()),
        chosen,
    })
}

/// The placement table: per pod, its node and super-node, the scheduler's device choice and what
/// the node's kubelet gave the container (through the agent's device plugin), as device indices
/// of the node's `DeviceTopology`, and whether they agree.
async fn placements(
    placed: &[Placed],
    harness: &[HarnessNode],
    nodes: &[FleetNode],
    topologies: &[DeviceTopology],
) -> Result<String> {
    let mut cells = vec![
        [
            "POD",
            "SCHEDULER",
            "NODE",
            "SUPER-NODE",
            "QOS",
            "CHOSEN",
            "KUBELET GAVE",
            "SAME",
        ]
        .map(String::from)
        .to_vec(),
    ];
    for p in placed {
        let h = harness.iter().find(|h| h.node_name() == p.node);
        let n = nodes.iter().find(|n| n.name == p.node);
        let mut given = match h {
            Some(h) => h
                .pod(NAMESPACE, &p.name)
                .await?
                .map(|r| {
                    r.containers
                        .iter()
                        .flat_map(|c| c.devices.values().flatten().cloned())
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default(),
            None => Vec::new(),
        };
        given.sort();
        let mut chosen = p.chosen.clone();
        chosen.sort();
        let dt = topologies.iter().find(|t| t.name_any() == p.node);
        let same = match (chosen.is_empty(), chosen == given) {
            (true, true) => "-",
            (false, true) => "yes",
            (_, false) => "NO",
        };
        cells.push(vec![
            p.name.clone(),
            p.scheduler.clone(),
            p.node.clone(),
            n.and_then(|n| n.super_node.clone())
                .unwrap_or_else(|| "-".into()),
            p.qos.clone(),
            indices(&chosen, dt),
            indices(&given, dt),
            same.into(),
        ]);
    }
    Ok(text_table::render(&cells))
}

/// How the job's gpu-group-size units landed: ranks (pod order) in units of two pods.
fn units(placed: &[Placed], nodes: &[FleetNode]) -> String {
    let mut by_unit: BTreeMap<usize, Vec<String>> = BTreeMap::new();
    let job: Vec<&Placed> = placed
        .iter()
        .filter(|p| p.name.starts_with("pytorch-demo-"))
        .collect();
    for (rank, p) in job.iter().enumerate() {
        let sn = nodes
            .iter()
            .find(|n| n.name == p.node)
            .and_then(|n| n.super_node.clone())
            .unwrap_or_else(|| "-".into());
        by_unit.entry(rank / 2).or_default().push(sn);
    }
    let mut out = String::from("pytorch-demo's units of 16 GPUs (2 pods each, rank order):");
    for (unit, sns) in by_unit {
        let mut distinct = sns.clone();
        distinct.dedup();
        let verdict = if distinct.len() == 1 {
            format!("whole in super-node {}", distinct[0])
        } else {
            format!("SPLIT over {}", sns.join(", "))
        };
        out.push_str(&format!("\n  unit {unit}: {verdict}"));
    }
    out
}

/// Device ids as the node's device indices in runs (`0-3,6`); an id the node's `DeviceTopology`
/// does not list stays as it is.
fn indices(ids: &[String], topology: Option<&DeviceTopology>) -> String {
    if ids.is_empty() {
        return "-".into();
    }
    let index_of = |id: &String| {
        topology.and_then(|t| t.spec.devices.iter().find(|d| &d.id == id).map(|d| d.index))
    };
    let mut known: Vec<u32> = ids.iter().filter_map(index_of).collect();
    known.sort_unstable();
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < known.len() {
        let mut j = i;
        while j + 1 < known.len() && known[j + 1] == known[j] + 1 {
            j += 1;
        }
        parts.push(if i == j {
            known[i].to_string()
        } else {
            format!("{}-{}", known[i], known[j])
        });
        i = j + 1;
    }
    parts.extend(ids.iter().filter(|id| index_of(id).is_none()).cloned());
    parts.join(",")
}

/// Whether the pod asks for any extended resource (the demo's accelerators).
fn pod_asks_for_devices(pod: &Pod) -> bool {
    pod.spec.iter().flat_map(|s| &s.containers).any(|c| {
        c.resources.as_ref().is_some_and(|r| {
            r.limits
                .iter()
                .chain(r.requests.iter())
                .flatten()
                .any(|(name, _)| name.contains('/'))
        })
    })
}
