//! The kubectl plugin (`kubectl-fumarole`, the built binary run as kubectl would run it)
//! against the real API server: two real agents publish the `DeviceTopology` of fixture nodes
//! in two super-nodes (dgx-1: dgx-h100 in rack-a; pcie-1: pcie-4gpu in rack-b), a pod is bound
//! to dgx-1 with two GPUs in `fumarole.dev/devices`, and pods wait (no scheduler runs). Then
//! `explain`, `node`, `top` and `defrag` are checked in table and JSON (and YAML, wide) form, the
//! kubeconfig found through `--kubeconfig`, `KUBECONFIG` and `~/.kube/config`, the namespace
//! from the context or `-n`, and bad input (an unknown pod, node or context, an unknown output
//! format) fails with a clear message and a non-zero exit.
//!
//! Run with `--nocapture` to see every output (docs/kubectl-plugin.md shows them).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use fumarole_e2e::cluster::{eventually, free_port};
use fumarole_e2e::fumarole::{fixture_root, kubectl_plugin_bin};
use fumarole_e2e::{AgentBuilder, NodeSpec, TestCluster};
use fumarole_topology::annotation::DEVICES_ANNOTATION;
use fumarole_topology::crd::DeviceTopology;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

/// Starts `fumarole-agent run` for `node` on a fresh root of the bundled `fixture`, in
/// `super_node`; returns the root (take a `dev/` node away and the device turns unhealthy).
async fn start_agent(
    cluster: &TestCluster,
    node: &str,
    fixture: &str,
    super_node: &str,
) -> PathBuf {
    cluster
        .create_node(
            &NodeSpec::new(node)
                .capacity("cpu", "64")
                .capacity("memory", "512Gi"),
        )
        .await
        .unwrap();
    let dir = cluster.root().join(format!("agent-{node}"));
    std::fs::create_dir_all(dir.join("device-plugins")).unwrap();
    let root = fixture_root(fixture, &dir).unwrap();
    AgentBuilder::root(&root)
        .process(&format!("fumarole-agent-{node}"))
        .node(node)
        .flag("--super-node", super_node)
        .device_plugin_dir(&dir.join("device-plugins"))
        .without_host_kubelet(&dir)
        .metrics_on_port(free_port().unwrap())
        .flag("--health-poll-interval", "300ms")
        .env("FUMAROLE_LOG", "info")
        .start_in(cluster)
        .unwrap();
    root
}

/// The node's `DeviceTopology` once its status reports every device healthy.
async fn published(cluster: &TestCluster, node: &str) -> DeviceTopology {
    let api: Api<DeviceTopology> = Api::all(cluster.client());
    eventually(
        &format!("DeviceTopology {node} with status"),
        Duration::from_secs(60),
        || {
            let api = api.clone();
            let node = node.to_string();
            async move {
                Ok(api.get_opt(&node).await?.filter(|dt| {
                    dt.status
                        .as_ref()
                        .is_some_and(|s| s.healthy_count == dt.spec.accelerator_count)
                }))
            }
        },
    )
    .await
    .unwrap()
}

fn gpu_pod(name: &str, gpus: u32, node: Option<&str>, devices: &[String]) -> Pod {
    let annotations = if devices.is_empty() {
        json!({})
    } else {
        json!({DEVICES_ANNOTATION: json!({"nvidia.com/gpu": devices}).to_string()})
    };
    serde_json::from_value(json!({
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "nodeName": node,
            "containers": [{
                "name": "c", "image": "example.invalid/none",
                "resources": {"limits": {"nvidia.com/gpu": gpus.to_string()}}
            }]
        }
    }))
    .unwrap()
}

/// What one run of the plugin printed.
struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// Runs `kubectl-fumarole args` with `env` (and nothing else of the test's environment that
/// could point it at a cluster: KUBECONFIG and HOME are the test's to set).
async fn plugin(args: &[&str], env: &[(&str, &Path)]) -> Run {
    let mut cmd = tokio::process::Command::new(kubectl_plugin_bin().unwrap());
    cmd.args(args)
        .env_remove("KUBECONFIG")
        .env("HOME", "/nonexistent")
        .env_remove("RUST_LOG")
        .env_remove("KUBERNETES_SERVICE_HOST");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().await.unwrap();
    let run = Run {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    println!(
        "$ kubectl fumarole {}\n{}{}",
        args.iter()
            .filter(|a| !a.starts_with("--kubeconfig"))
            .copied()
            .collect::<Vec<_>>()
            .join(" "),
        run.stdout,
        run.stderr
    );
    run
}

/// A successful run's stdout.
async fn ok(kubeconfig: &str, args: &[&str]) -> String {
    let mut all = vec![kubeconfig];
    all.extend(args);
    let run = plugin(&all, &[]).await;
    assert_eq!(run.code, Some(0), "{args:?}: {}", run.stderr);
    run.stdout
}

/// A successful run's stdout as JSON.
async fn ok_json(kubeconfig: &str, args: &[&str]) -> Value {
    let text = ok(kubeconfig, args).await;
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{args:?}: {e}: {text}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn explain_node_and_top_against_the_real_api_server() {
    let cluster = TestCluster::start().await.unwrap();
    cluster.install_fumarole_crds().await.unwrap();
    let dgx_root = start_agent(&cluster, "dgx-1", "dgx-h100", "rack-a").await;
    start_agent(&cluster, "pcie-1", "pcie-4gpu", "rack-b").await;
    let dgx = published(&cluster, "dgx-1").await;
    let pcie = published(&cluster, "pcie-1").await;
    let gpu = |dt: &DeviceTopology, i: usize| dt.spec.devices[i].id.clone();

    // bound: on dgx-1 with its first two GPUs; big: fits nowhere; four: fits (no scheduler
    // runs, so it waits too).
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    let pp = PostParams::default();
    let bound_devices = [gpu(&dgx, 0), gpu(&dgx, 1)];
    for p in [
        gpu_pod("bound", 2, Some("dgx-1"), &bound_devices),
        gpu_pod("big", 16, None, &[]),
        gpu_pod("four", 4, None, &[]),
    ] {
        pods.create(&pp, &p).await.unwrap();
    }

    let kc_flag = format!("--kubeconfig={}", cluster.admin_kubeconfig().display());
    let kc = kc_flag.as_str();

    // explain: the pod that fits nowhere, per node, with the free counts the bound pod left.
    let text = ok(kc, &["explain", "big"]).await;
    assert!(
        text.starts_with("pod default/big requests 16 nvidia.com/gpu\nNODE "),
        "{text}"
    );
    let line = |node: &str| {
        text.lines()
            .find(|l| l.starts_with(&format!("{node} ")))
            .unwrap_or_else(|| panic!("no row for {node}: {text}"))
            .to_string()
    };
    assert!(
        line("dgx-1").ends_with("needs 16 nvidia.com/gpu, 6 free"),
        "{text}"
    );
    assert!(
        line("pcie-1").ends_with("needs 16 nvidia.com/gpu, 4 free"),
        "{text}"
    );
    assert!(
        text.contains("Waits: no node fits 16 nvidia.com/gpu (0 of 2 nodes).\n"),
        "{text}"
    );
    let v = ok_json(kc, &["explain", "big", "-o", "json"]).await;
    assert_eq!(v["pod"], "default/big");
    assert_eq!(
        v["request"],
        json!({"resource": "nvidia.com/gpu", "count": 16})
    );
    let rows = v["nodes"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "{v}");
    for r in rows {
        assert_eq!(r["feasible"], false, "{v}");
        let free = if r["node"] == "dgx-1" { 6 } else { 4 };
        assert_eq!(r["free"], free, "{v}");
        assert_eq!(
            r["reason"],
            format!("needs 16 nvidia.com/gpu, {free} free"),
            "{v}"
        );
    }

    // A pod that fits: the best node is the one where 4 GPUs leave the least behind, with the
    // devices it would get, none of them the bound pod's.
    let v = ok_json(kc, &["explain", "four", "-o", "json"]).await;
    let best = &v["nodes"][0];
    assert_eq!(best["feasible"], true, "{v}");
    let chosen: Vec<String> = serde_json::from_value(best["devices"].clone()).unwrap();
    assert_eq!(chosen.len(), 4, "{v}");
    assert!(chosen.iter().all(|d| !bound_devices.contains(d)), "{v}");
    let wide = ok(kc, &["explain", "four", "-o", "wide"]).await;
    assert!(
        wide.contains("NODE    SUPER-NODE  FREE  FEASIBLE"),
        "{wide}"
    );
    assert!(
        wide.contains(&format!(
            "best {} with {}",
            best["node"].as_str().unwrap(),
            chosen.join(",")
        )),
        "{wide}"
    );
    assert!(wide.contains("dgx-1   rack-a      6"), "{wide}");
    assert!(wide.contains("pcie-1  rack-b      4"), "{wide}");

    // The bound pod: where and with what.
    let text = ok(kc, &["explain", "bound", "-n", "default"]).await;
    assert!(
        text.contains(&format!(
            "Bound to dgx-1 with {} ({DEVICES_ANNOTATION})",
            bound_devices.join(",")
        )),
        "{text}"
    );

    // node: the dgx's NVLink matrix and health, the PCIe node's switches.
    let text = ok(kc, &["node", "dgx-1"]).await;
    assert!(
        text.starts_with(
            "Node dgx-1: 8 devices (NVIDIA H100 80GB HBM3), super-node rack-a (from config), 8/8 healthy\n"
        ),
        "{text}"
    );
    assert!(
        text.contains("\nGPU0  X     NV18  NV18  NV18  NV18  NV18  NV18  NV18  0"),
        "{text}"
    );
    assert!(text.contains("  NV#  = NVLink with # links"), "{text}");
    assert_eq!(
        text.lines()
            .filter(|l| l.starts_with("GPU") && l.contains(" Healthy "))
            .count(),
        8,
        "{text}"
    );
    // The bound pod's choice shows on its devices (no kubelet runs, so none is reported
    // allocated).
    for (i, id) in bound_devices.iter().enumerate() {
        assert!(
            text.contains(&format!(
                "\nGPU{i}    {id}  Healthy  default/bound (chosen)\n"
            )),
            "{text}"
        );
    }
    assert!(
        text.contains(&format!("\nGPU2    {}  Healthy  -\n", gpu(&dgx, 2))),
        "{text}"
    );
    let text = ok(kc, &["node", "pcie-1"]).await;
    assert!(text.contains("\nGPU0  X     PIX   PHB   PHB   0"), "{text}");
    assert!(
        text.contains("  PHB  = through a PCIe host bridge (30)\n"),
        "{text}"
    );
    let v = ok_json(kc, &["node", "pcie-1", "-o", "json"]).await;
    assert_eq!(v["node"], "pcie-1");
    assert_eq!(v["superNode"], "rack-b");
    assert_eq!(v["healthy"], 4);
    assert_eq!(
        v["matrix"],
        json!([
            ["X", "PIX", "PHB", "PHB"],
            ["PIX", "X", "PHB", "PHB"],
            ["PHB", "PHB", "X", "PIX"],
            ["PHB", "PHB", "PIX", "X"]
        ])
    );
    let ids: Vec<&str> = v["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["id"].as_str().unwrap())
        .collect();
    let want: Vec<String> = (0..4).map(|i| gpu(&pcie, i)).collect();
    assert_eq!(ids, want);

    // top: per super-node; per node with -o wide; both in JSON and YAML.
    let text = ok(kc, &["top"]).await;
    assert_eq!(
        text,
        "SUPER-NODE  NODES  DEVICES  FREE  IN-USE  SHARED  UNHEALTHY  IDLE-PODS\n\
         rack-a      1      8        6     2       0       0          0\n\
         rack-b      1      4        4     0       0       0          0\n"
    );
    let wide = ok(kc, &["top", "-o", "wide"]).await;
    assert!(
        wide.ends_with(
            "NODE    SUPER-NODE  DEVICES  FREE  IN-USE  SHARED  UNHEALTHY  IDLE-PODS\n\
             dgx-1   rack-a      8        6     2       0       0          0\n\
             pcie-1  rack-b      4        4     0       0       0          0\n"
        ),
        "{wide}"
    );
    let v = ok_json(kc, &["top", "-o", "json"]).await;
    assert_eq!(
        v["superNodes"][0],
        json!({"superNode": "rack-a", "nodes": 1, "devices": 8, "free": 6, "inUse": 2, "shared": 0, "unhealthy": 0, "idlePods": 0})
    );
    let yaml: Value = serde_norway::from_str(&ok(kc, &["top", "-o", "yaml"]).await).unwrap();
    assert_eq!(yaml, v);

    // GPU7 of dgx-1 loses its device node: node shows it unhealthy with the agent's reason, top
    // counts it unhealthy instead of free.
    std::fs::remove_file(dgx_root.join("dev/nvidia7")).unwrap();
    let api: Api<DeviceTopology> = Api::all(cluster.client());
    let gpu7 = gpu(&dgx, 7);
    // The reason read from DeviceTopology and the one `node` prints are compared in one round,
    // again until they agree: the agent may rewrite the status between two reads (a device
    // found unhealthy by discovery before its fault's reason arrives, say).
    let text = eventually(
        "node shows GPU7 unhealthy with its reason",
        Duration::from_secs(30),
        || {
            let api = api.clone();
            let gpu7 = gpu7.clone();
            async move {
                let dt = api.get("dgx-1").await?;
                let Some(reason) = dt
                    .status
                    .and_then(|s| s.devices.get(&gpu7).cloned())
                    .filter(|d| d.health == "Unhealthy")
                    .and_then(|d| d.reason)
                else {
                    return Ok(None);
                };
                let text = ok(kc, &["node", "dgx-1"]).await;
                let line =
                    format!("\nGPU7    {gpu7}  Unhealthy  -                       {reason}\n");
                Ok(text.contains(&line).then_some(text))
            }
        },
    )
    .await
    .unwrap();
    assert!(text.contains(", 7/8 healthy\n"), "{text}");
    let v = ok_json(kc, &["top", "-o", "json"]).await;
    assert_eq!(
        v["superNodes"][0],
        json!({"superNode": "rack-a", "nodes": 1, "devices": 8, "free": 5, "inUse": 2, "shared": 0, "unhealthy": 1, "idlePods": 0})
    );

    // The kubeconfig from KUBECONFIG and from ~/.kube/config, the namespace from its context.
    let home = cluster.root().join("home");
    std::fs::create_dir_all(home.join(".kube")).unwrap();
    std::fs::copy(cluster.admin_kubeconfig(), home.join(".kube/config")).unwrap();
    for env in [
        ("KUBECONFIG", cluster.admin_kubeconfig()),
        ("HOME", home.as_path()),
    ] {
        let run = plugin(&["explain", "big", "--context", "e2e"], &[env]).await;
        assert_eq!(run.code, Some(0), "{}: {}", env.0, run.stderr);
        assert!(
            run.stdout.starts_with("pod default/big requests 16"),
            "{}",
            run.stdout
        );
    }

    // A context with a namespace: the pod is looked up there unless -n says otherwise.
    let mut with_ns: Value =
        serde_json::from_str(&std::fs::read_to_string(cluster.admin_kubeconfig()).unwrap())
            .unwrap();
    with_ns["contexts"][0]["context"]["namespace"] = json!("other");
    let with_ns_path = cluster.root().join("other.kubeconfig");
    std::fs::write(&with_ns_path, with_ns.to_string()).unwrap();
    let other = format!("--kubeconfig={}", with_ns_path.display());
    let run = plugin(&[&other, "explain", "big"], &[]).await;
    assert_eq!(run.code, Some(1), "{}", run.stdout);
    assert!(
        run.stderr.contains("error: pod other/big not found"),
        "{}",
        run.stderr
    );
    let text = ok(&other, &["explain", "big", "-n", "default"]).await;
    assert!(text.starts_with("pod default/big requests 16"), "{text}");

    // Bad input: a clear message, a non-zero exit, no panic.
    for (args, message) in [
        (
            vec![kc, "explain", "nope"],
            "error: pod default/nope not found (no pod \"nope\" in namespace \"default\")",
        ),
        (
            vec![kc, "explain", "big", "-n", "other"],
            "error: pod other/big not found",
        ),
        (vec![kc, "node", "nope"], "error: node nope not found"),
        (
            vec![kc, "node", "nope", "--context", "missing"],
            "context \"missing\"",
        ),
    ] {
        let run = plugin(&args, &[]).await;
        assert_eq!(run.code, Some(1), "{args:?}: {}", run.stdout);
        assert!(run.stderr.contains(message), "{args:?}: {}", run.stderr);
        assert!(!run.stderr.contains("panicked"), "{}", run.stderr);
        assert!(run.stdout.is_empty(), "{}", run.stdout);
    }
    let run = plugin(&[kc, "explain", "big", "-o", "xml"], &[]).await;
    assert_eq!(run.code, Some(2), "clap's usage error: {}", run.stderr);
    assert!(run.stderr.contains("invalid value 'xml'"), "{}", run.stderr);

    // defrag: while big (16 GPUs, more than any node has) waits, nothing can help it.
    let v = ok_json(kc, &["defrag", "-o", "json"]).await;
    assert_eq!(v["unit"]["name"], "pod default/big", "{v}");
    assert!(v["moves"].as_array().unwrap().is_empty(), "{v}");
    assert!(
        v["reason"]
            .as_str()
            .unwrap()
            .contains("dgx-1 holds 0 such pods even empty"),
        "{v}"
    );
    // Without big, five (5 GPUs) waits: dgx-1 has 4 free (GPU7 is unhealthy, the bare pod
    // `bound` holds 2, nobody would recreate it, and web, a ReplicaSet's pod, 1). Moving web to
    // pcie-1 makes room on dgx-1; `bound` is never proposed.
    pods.delete("big", &Default::default()).await.unwrap();
    let mut web = gpu_pod("web", 1, Some("dgx-1"), &[gpu(&dgx, 2)]);
    web.metadata.owner_references =
        Some(vec![fumarole_e2e::fumarole::replica_set_owner("web-5c6b")]);
    pods.create(&pp, &web).await.unwrap();
    pods.create(&pp, &gpu_pod("five", 5, None, &[]))
        .await
        .unwrap();
    let v = eventually("defrag to see five", Duration::from_secs(30), || async {
        let v = ok_json(kc, &["defrag", "-o", "json"]).await;
        Ok((v["unit"]["name"] == "pod default/five").then_some(v))
    })
    .await
    .unwrap();
    assert_eq!(v["target"], "dgx-1", "{v}");
    let moves = v["moves"].as_array().unwrap();
    assert_eq!(moves.len(), 1, "{v}");
    assert_eq!(moves[0]["pod"], "default/web");
    assert_eq!(moves[0]["devices"], json!([gpu(&dgx, 2)]));
    assert_eq!(moves[0]["to"], "pcie-1");
    assert_eq!(moves[0]["restarts"], 1);
    let text = ok(kc, &["defrag"]).await;
    assert!(
        text.starts_with("waiting: pod default/five asks 1 pods of 5 nvidia.com/gpu\n"),
        "{text}"
    );
    assert!(
        text.lines().any(|l| l.starts_with("default/web ")
            && l.contains(" dgx-1 ")
            && l.contains(" pcie-1 ")),
        "{text}"
    );
}
