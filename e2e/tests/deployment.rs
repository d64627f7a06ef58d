//! `deploy/daemonset` and the Helm chart against the real API server: every manifest and the
//! rendered chart pass a server-side dry-run apply, and the chart renders the same objects as
//! the manifests; installed, each component does its whole job with only its ServiceAccount's
//! rights (the admin token impersonates the ServiceAccount, with the node name a kubelet-bound
//! token carries), verbs it does not need are forbidden, and the ValidatingAdmissionPolicy keeps
//! an agent's writes to its own node.
//!
//! The chart is rendered by `helm-render` (built by `e2e/build-upstream.sh` from Helm's Go
//! module: Helm's own template engine, no `helm` install). The chart passes its components'
//! flags in a configuration file (`--config`, a ConfigMap) where the manifests pass them on
//! the command line: they are compared as the binaries read them ([`effective_args`], each
//! rendered file checked by the binary's own `config check`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use fumarole_e2e::cluster::{Identity, eventually, free_port, http_post_json};
use fumarole_e2e::colocation::{self, log};
use fumarole_e2e::deploy::{apply, deploy_dir, documents, kustomization};
use fumarole_e2e::fumarole::{agent_bin, scheduler_ext_bin};
use fumarole_e2e::process::Proc;
use fumarole_e2e::upstream::Upstream;
use fumarole_e2e::{NodeSpec, TestCluster};
use fumarole_topology::crd::DeviceTopology;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod, Secret};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

const NAMESPACE: &str = "fumarole-system";
/// Dashboard metrics that exist only once the agent has measured a co-location node.
const MEASURED_ON_A_COLOCATION_NODE: &[&str] = &[
    "fumarole_colocation_usage_percent",
    "fumarole_colocation_pods",
];

/// Dashboard metrics that exist only once the agent has read a GPU through its vendor library
/// (this test's agent runs on recorded NVML answers): device_metrics.rs checks them.
fn measured_through_a_gpu_library(family: &str) -> bool {
    let Some(name) = family.strip_prefix("fumarole_") else {
        return false;
    };
    // The error counter has a sample (and so a family) once a figure could not be read.
    name == "device_metrics_age_seconds"
        || name == "device_metric_errors"
        || fumarole_exporter::device_metrics::SPECS
            .iter()
            .any(|s| s.name == name)
}

/// The chart rendered with Helm's engine, release `fumarole` in `fumarole-system`, with
/// `--set` `values`; each object named `template: Kind/name`.
fn render_chart(values: &[&str], include_crds: bool) -> Vec<(String, Value)> {
    let mut cmd = std::process::Command::new(Upstream::get().unwrap().bin("helm-render"));
    cmd.arg("--chart").arg(deploy_dir().join("helm/fumarole"));
    // The agent-writes webhook is on by default and needs a CA to render; a test's own
    // `--set` of it comes later and wins.
    cmd.args(["--set", WEBHOOK_CA]);
    for v in values {
        cmd.args(["--set", v]);
    }
    if include_crds {
        cmd.arg("--include-crds");
    }
    let out = cmd.output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success(),
        "helm-render failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_norway::Deserializer::from_str(&text)
        .filter_map(|doc| {
            let v: Value = serde::Deserialize::deserialize(doc).unwrap();
            let name = format!(
                "chart: {}/{}",
                v["kind"].as_str()?,
                v["metadata"]["name"].as_str()?
            );
            Some((name, v))
        })
        .collect()
}

/// The object of `kind` named `name`.
fn find<'a>(objects: &'a [(String, Value)], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|(_, v)| v["kind"] == kind && v["metadata"]["name"] == name)
        .map(|(_, v)| v)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

/// A caBundle for the chart's agent-writes webhook (on by default; the chart refuses to render
/// it without one): base64 of "ca".
const WEBHOOK_CA: &str = "schedulerExt.agentWritesWebhook.caBundle=Y2E=";

/// The chart's configuration files, ConfigMaps the manifests do not have (they pass flags).
const CONFIG_FILES: [&str; 2] = [
    "ConfigMap/fumarole-system/fumarole-agent-config",
    "ConfigMap/fumarole-system/fumarole-scheduler-ext-config",
];

/// The arguments of workload `kind`/`name`'s container as its binary reads them: a
/// `--config=FILE` replaced by the flags the file stands for, as the binary's
/// `config check` prints them (which fails on a file the binary would refuse). The file is
/// the ConfigMap the container mounts at the file's directory.
fn effective_args(objects: &[(String, Value)], kind: &str, name: &str) -> Vec<String> {
    let pod = &find(objects, kind, name)["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let mut out = Vec::new();
    for arg in container["args"].as_array().unwrap() {
        let arg = arg.as_str().unwrap();
        let Some(path) = arg.strip_prefix("--config=") else {
            out.push(arg.to_string());
            continue;
        };
        let (dir, key) = path.rsplit_once('/').unwrap();
        let mount = container["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["mountPath"] == dir)
            .unwrap_or_else(|| panic!("{name}: nothing mounted at {dir}"));
        let volume = pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == mount["name"])
            .unwrap();
        let config_map = volume["configMap"]["name"].as_str().unwrap();
        let text = find(objects, "ConfigMap", config_map)["data"][key]
            .as_str()
            .unwrap();
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), text).unwrap();
        let bin = match name {
            "fumarole-agent" => agent_bin(),
            _ => scheduler_ext_bin(),
        };
        let checked = std::process::Command::new(bin.unwrap())
            .args(["config", "check"])
            .arg(file.path())
            .output()
            .unwrap();
        assert!(
            checked.status.success(),
            "{name}'s rendered configuration file is refused: {}\n{text}",
            String::from_utf8_lossy(&checked.stderr)
        );
        // The first line is the section (the subcommand, already in the arguments).
        let stdout = String::from_utf8(checked.stdout).unwrap();
        out.extend(stdout.lines().skip(1).map(str::to_string));
    }
    out
}

/// `Kind/namespace/name` of each object.
fn identities(objects: &[(String, Value)]) -> std::collections::BTreeSet<String> {
    objects
        .iter()
        .map(|(_, v)| {
            format!(
                "{}/{}/{}",
                v["kind"].as_str().unwrap(),
                v["metadata"]["namespace"].as_str().unwrap_or(""),
                v["metadata"]["name"].as_str().unwrap()
            )
        })
        .collect()
}

/// Volcano's own chart template for its scheduler (`installer/helm/chart/volcano/templates/
/// scheduler.yaml` of the `volcano.sh/volcano` module `e2e/upstream/volcano` pins).
fn volcano_scheduler_chart() -> String {
    let out = std::process::Command::new("go")
        .args(["list", "-m", "-f", "{{.Dir}}", "volcano.sh/volcano"])
        .current_dir(fumarole_e2e::upstream::e2e_dir().join("upstream/volcano"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "go list: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dir = String::from_utf8(out.stdout).unwrap();
    let path = std::path::Path::new(dir.trim())
        .join("installer/helm/chart/volcano/templates/scheduler.yaml");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `text` without terminal colour sequences.
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn forbidden<T: std::fmt::Debug>(what: &str, result: kube::Result<T>) -> String {
    match result {
        Err(kube::Error::Api(s)) if s.code == 403 => s.message,
        other => panic!("{what}: expected 403 Forbidden, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn every_manifest_passes_a_server_side_dry_run() {
    let cluster = TestCluster::start().await.unwrap();
    let client = cluster.client();
    let objects = kustomization(&deploy_dir().join("daemonset")).unwrap();
    // Everything in deploy/daemonset is in the kustomization.
    for entry in std::fs::read_dir(deploy_dir().join("daemonset")).unwrap() {
        let path = entry.unwrap().path();
        let file = path.file_name().unwrap().to_string_lossy().to_string();
        if path.is_file() && file != "kustomization.yaml" {
            assert!(
                objects
                    .iter()
                    .any(|(name, _)| name.starts_with(&format!("{file}:"))),
                "{file} is not listed in deploy/daemonset/kustomization.yaml"
            );
        }
    }
    // Namespaced objects need their namespaces to exist for a dry run.
    cluster.create_namespace(NAMESPACE).await.unwrap();
    cluster.create_namespace("volcano-system").await.unwrap();
    let mut examples =
        documents(&deploy_dir().join("daemonset/examples/volcano-scheduler-configmap.yaml"))
            .unwrap();
    let network_policy =
        documents(&deploy_dir().join("daemonset/examples/scheduler-ext-networkpolicy.yaml"))
            .unwrap();
    examples.extend(network_policy.iter().cloned());
    let mut applied = 0;
    for (name, object) in objects.iter().chain(&examples) {
        if let Err(e) = apply(&client, object, true).await {
            panic!("{name}: server-side dry-run apply failed: {e}");
        }
        applied += 1;
    }
    assert!(applied >= 15, "only {applied} objects");

    // The chart: the same objects (Helm creates the namespace itself), and they apply too.
    let chart = render_chart(&[], true);
    let mut expected = identities(&objects);
    expected.extend(CONFIG_FILES.map(String::from));
    expected.remove(&format!("Namespace//{NAMESPACE}"));
    // The kube-system Role for Huawei's device-info ConfigMap: in the manifests, in the chart
    // only with agent.ascendDeviceInfo.
    let ascend_rbac = [
        "Role/kube-system/fumarole-agent-ascend-device-info",
        "RoleBinding/kube-system/fumarole-agent-ascend-device-info",
    ];
    for id in ascend_rbac {
        assert!(expected.remove(id), "{id} not in deploy/daemonset");
    }
    assert_eq!(identities(&chart), expected);
    let with_ascend = render_chart(&["agent.ascendDeviceInfo=true"], false);
    for id in ascend_rbac {
        assert!(identities(&with_ascend).contains(id), "{id} not rendered");
    }
    for (name, object) in &with_ascend {
        if let Err(e) = apply(&client, object, true).await {
            panic!("{name}: server-side dry-run apply failed: {e}");
        }
    }
    for (name, object) in &chart {
        if let Err(e) = apply(&client, object, true).await {
            panic!("{name}: server-side dry-run apply failed: {e}");
        }
    }
    // The same content, not only the same names: the agent's DaemonSet and ConfigMap.
    let pick = |objects: &[(String, Value)], kind: &str, name: &str| {
        objects
            .iter()
            .find(|(_, v)| v["kind"] == kind && v["metadata"]["name"] == name)
            .map(|(_, v)| v.clone())
            .unwrap()
    };
    // The agent's arguments as it reads them (the chart's file renders its fields sorted).
    let sorted_args = |objects: &[(String, Value)]| {
        let mut args = effective_args(objects, "DaemonSet", "fumarole-agent");
        args.sort();
        args
    };
    assert_eq!(
        sorted_args(&chart),
        sorted_args(&objects),
        "DaemonSet fumarole-agent /spec/template/spec/containers/0/args"
    );
    // The volumes, but for the chart's configuration file.
    let mut chart_ds = pick(&chart, "DaemonSet", "fumarole-agent");
    let volumes = chart_ds
        .pointer_mut("/spec/template/spec/volumes")
        .unwrap()
        .as_array_mut()
        .unwrap();
    let before = volumes.len();
    volumes.retain(|v| v["name"] != "config");
    assert_eq!(
        volumes.len() + 1,
        before,
        "the chart's agent mounts no configuration file"
    );
    assert_eq!(
        chart_ds.pointer("/spec/template/spec/volumes"),
        pick(&objects, "DaemonSet", "fumarole-agent").pointer("/spec/template/spec/volumes"),
        "DaemonSet fumarole-agent /spec/template/spec/volumes"
    );
    // Of the host's cgroup tree and /proc the agent mounts only the kubelet's pod cgroups and
    // the pressure files, whatever the layout (issue 37 item 4); the host's /sys/fs/cgroup
    // under its /sys is covered. The v1 layout is the one e2e soak.rs runs the agent with.
    let v1 = render_chart(
        &["qos.cgroupMounts={cpu/kubepods,cpuacct/kubepods,memory/kubepods}"],
        false,
    );
    for (objects, cgroups) in [
        (&objects, &["/sys/fs/cgroup/kubepods.slice"][..]),
        (&chart, &["/sys/fs/cgroup/kubepods.slice"][..]),
        (
            &v1,
            &[
                "/sys/fs/cgroup/cpu/kubepods",
                "/sys/fs/cgroup/cpuacct/kubepods",
                "/sys/fs/cgroup/memory/kubepods",
            ][..],
        ),
    ] {
        let ds = pick(objects, "DaemonSet", "fumarole-agent");
        let volumes = ds["spec"]["template"]["spec"]["volumes"]
            .as_array()
            .unwrap();
        let host_path = |v: &&Value| v["hostPath"]["path"].as_str().map(String::from);
        let host: std::collections::BTreeSet<String> =
            volumes.iter().filter_map(|v| host_path(&v)).collect();
        let mounted: Vec<&String> = host
            .iter()
            .filter(|p| p.starts_with("/sys/fs/cgroup") || p.starts_with("/proc"))
            .collect();
        let mut want: Vec<&str> = cgroups.to_vec();
        want.push("/proc/pressure");
        want.sort_unstable();
        assert_eq!(mounted, want, "the agent's cgroup and /proc mounts");
        let mounts = ds["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
            .as_array()
            .unwrap();
        let covered = mounts.iter().find(|m| m["mountPath"] == "/sys/fs/cgroup");
        let cover = covered.and_then(|m| volumes.iter().find(|v| v["name"] == m["name"]));
        assert!(
            cover.is_some_and(|v| v.get("emptyDir").is_some()),
            "the host's /sys/fs/cgroup is not covered: {mounts:#?}"
        );
    }
    for (kind, name, path) in [
        ("ClusterRole", "fumarole-agent", "/rules"),
        ("ClusterRole", "fumarole-scheduler-ext", "/rules"),
        (
            "ValidatingAdmissionPolicy",
            "fumarole-agent-node-scoped-writes",
            "/spec/validations",
        ),
        (
            "ValidatingAdmissionPolicy",
            "fumarole-scheduler-ext-node-writes",
            "/spec/validations",
        ),
        // The agent-writes webhook, on by default on both install paths.
        (
            "ValidatingWebhookConfiguration",
            "fumarole-agent-writes",
            "/webhooks/0/rules",
        ),
        (
            "ValidatingWebhookConfiguration",
            "fumarole-agent-writes",
            "/webhooks/0/matchConditions",
        ),
        (
            "ValidatingWebhookConfiguration",
            "fumarole-agent-writes",
            "/webhooks/0/failurePolicy",
        ),
    ] {
        let want = pick(&objects, kind, name);
        assert!(want.pointer(path).is_some(), "{kind} {name} has no {path}");
        assert_eq!(
            pick(&chart, kind, name).pointer(path),
            want.pointer(path),
            "{kind} {name} {path}"
        );
    }
    // The extension serves it on both (its port and flag).
    for objects in [&chart, &objects] {
        let args = effective_args(objects, "Deployment", "fumarole-scheduler-ext");
        assert!(
            args.iter().any(|a| a.contains("webhook-listen")),
            "{args:?}"
        );
    }
    // Without a CA for it the chart refuses to render, and says how to go on.
    let refused = std::process::Command::new(Upstream::get().unwrap().bin("helm-render"))
        .arg("--chart")
        .arg(deploy_dir().join("helm/fumarole"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && stderr.contains("agentWritesWebhook.caBundle"),
        "{stderr}"
    );
    let colocation = |objects: &[(String, Value)]| {
        let cm = pick(objects, "ConfigMap", "volcano-agent-configuration");
        serde_json::from_str::<Value>(cm["data"]["colocation-config"].as_str().unwrap()).unwrap()
    };
    assert_eq!(colocation(&chart), colocation(&objects));

    // The DRA DeviceClasses: deploy/dra applies, and the chart renders the same when asked.
    let device_classes = kustomization(&deploy_dir().join("dra")).unwrap();
    assert_eq!(
        device_classes.len(),
        4,
        "whole devices and partitions, per driver"
    );
    for (name, object) in &device_classes {
        if let Err(e) = apply(&client, object, true).await {
            panic!("{name}: server-side dry-run apply failed: {e}");
        }
    }
    let with_dra = render_chart(
        &[
            "dra.enabled=true",
            "dra.deviceClasses=true",
            "devicePlugin.config.resources[0].match.vendor=huawei",
            "devicePlugin.config.resources[0].servedBy=dra",
        ],
        false,
    );
    for (name, object) in &with_dra {
        if let Err(e) = apply(&client, object, true).await {
            panic!("{name}: server-side dry-run apply failed: {e}");
        }
    }
    // The agent reads the configuration the chart renders, and mounts the kubelet's DRA
    // directories where its flags say.
    let config = pick(&with_dra, "ConfigMap", "fumarole-device-plugin-config");
    let config = fumarole_device_plugin::config::Config::parse(
        config["data"]["config.yaml"].as_str().unwrap(),
        None,
    )
    .unwrap();
    assert_eq!(config.resources.len(), 1);
    assert_eq!(
        config.resources[0].served_by,
        fumarole_device_plugin::config::ServedBy::Dra
    );
    let ds = pick(&with_dra, "DaemonSet", "fumarole-agent");
    let args = effective_args(&with_dra, "DaemonSet", "fumarole-agent").join(" ");
    let mounts = ds
        .pointer("/spec/template/spec/containers/0/volumeMounts")
        .unwrap()
        .to_string();
    for (flag, path) in [
        ("--dra-registry-dir", "/var/lib/kubelet/plugins_registry"),
        ("--dra-plugins-dir", "/var/lib/kubelet/plugins"),
        ("--cdi-dir", "/var/run/cdi"),
        (
            "--device-plugin-config",
            "/etc/fumarole/device-plugin/config.yaml",
        ),
    ] {
        assert!(args.contains(&format!("{flag}={path}")), "{flag} in {args}");
        let dir = path.trim_end_matches("/config.yaml");
        assert!(mounts.contains(&format!("\"{dir}\"")), "{dir} in {mounts}");
    }
    let classes = |objects: &[(String, Value)]| -> Vec<Value> {
        objects
            .iter()
            .filter(|(_, v)| v["kind"] == "DeviceClass")
            .map(|(_, v)| v.clone())
            .collect()
    };
    assert_eq!(classes(&with_dra), classes(&device_classes));
    assert!(classes(&chart).is_empty());

    // Features switched off take their objects, arguments and mounts with them.
    let lean = render_chart(
        &[
            "schedulerExt.enabled=false",
            "qos.enabled=false",
            "oversubscription.enabled=false",
            "devicePlugin.enabled=false",
            "nodeScopedWrites.enabled=false",
        ],
        false,
    );
    let names = identities(&lean);
    for gone in [
        "Deployment/fumarole-system/fumarole-scheduler-ext",
        "ConfigMap/fumarole-system/volcano-agent-configuration",
        "ValidatingAdmissionPolicy//fumarole-agent-node-scoped-writes",
        "ValidatingAdmissionPolicy//fumarole-scheduler-ext-node-writes",
    ] {
        assert!(!names.contains(gone), "{gone} still rendered");
    }
    let ds = pick(&lean, "DaemonSet", "fumarole-agent");
    let text = format!(
        "{ds} {}",
        effective_args(&lean, "DaemonSet", "fumarole-agent").join(" ")
    );
    for gone in [
        "--colocation",
        "--device-plugin-dir",
        "device-plugins",
        "/host/sys/fs/cgroup",
        "/host/proc",
    ] {
        assert!(!text.contains(gone), "{gone} still in the DaemonSet");
    }
    let rules = pick(&lean, "ClusterRole", "fumarole-agent")["rules"].to_string();
    assert!(
        !rules.contains("pods/eviction") && !rules.contains("nodes/status"),
        "{rules}"
    );
    for (name, object) in &lean {
        if let Err(e) = apply(&client, object, true).await {
            panic!("{name} (features off): server-side dry-run apply failed: {e}");
        }
    }
    // The agent runs unprivileged, with no capability (soak.rs runs it so), unless asked.
    let security = |objects: &[(String, Value)]| {
        pick(objects, "DaemonSet", "fumarole-agent")["spec"]["template"]["spec"]["containers"][0]
            ["securityContext"]
            .clone()
    };
    assert_eq!(security(&chart), security(&objects));
    assert!(security(&objects)["privileged"].is_null());
    assert_eq!(security(&objects)["capabilities"]["drop"], json!(["ALL"]));
    assert_eq!(security(&objects)["allowPrivilegeEscalation"], false);
    assert_eq!(
        security(&render_chart(&["agent.privileged=true"], false))["privileged"],
        true
    );
    // The kubelet's root directory is a value.
    let moved = render_chart(&["agent.kubeletRootDir=/data/kubelet"], false);
    let volumes =
        pick(&moved, "DaemonSet", "fumarole-agent")["spec"]["template"]["spec"]["volumes"]
            .to_string();
    for path in [
        "/data/kubelet/device-plugins",
        "/data/kubelet/pod-resources",
    ] {
        assert!(volumes.contains(path), "{path} not in {volumes}");
    }
    assert!(!volumes.contains("/var/lib/kubelet"), "{volumes}");
    // The compatible labels only when asked.
    let agent_args = |objects: &[(String, Value)]| {
        effective_args(objects, "DaemonSet", "fumarole-agent").join(" ")
    };
    assert!(!agent_args(&chart).contains("--compat-labels"));
    assert!(
        agent_args(&render_chart(&["agent.compatLabels=true"], false)).contains("--compat-labels")
    );
    // Huawei's device-info ConfigMap only when asked.
    assert!(!agent_args(&chart).contains("--ascend-device-info"));
    assert!(
        agent_args(&render_chart(&["agent.ascendDeviceInfo=true"], false))
            .contains("--ascend-device-info")
    );
    // Any flag is a value (agent.run, schedulerExt.serve: the file's fields), winning over
    // the chart's own; extraArgs stay flags, after the file, and win over it.
    let tuned = render_chart(
        &[
            "agent.run.recheckInterval=30s",
            "agent.run.awaitDeviceChoiceFrom={volcano,my-scheduler}",
            "agent.run.compatLabels=true",
            "agent.compatLabels=false",
            "agent.extraArgs={--metrics-addr=0.0.0.0:9500}",
            "schedulerExt.serve.commitTtl=5m",
            "schedulerExt.serve.listen=0.0.0.0:9999",
        ],
        false,
    );
    let args = effective_args(&tuned, "DaemonSet", "fumarole-agent");
    for want in [
        "--recheck-interval=30s",
        "--await-device-choice-from=volcano",
        "--await-device-choice-from=my-scheduler",
        "--compat-labels",
        "--metrics-addr=0.0.0.0:9400",
    ] {
        assert!(args.iter().any(|a| a == want), "{want} not in {args:?}");
    }
    assert_eq!(
        args.last().map(String::as_str),
        Some("--metrics-addr=0.0.0.0:9500")
    );
    let args = effective_args(&tuned, "Deployment", "fumarole-scheduler-ext");
    for want in ["--commit-ttl=5m", "--listen=0.0.0.0:9999"] {
        assert!(args.iter().any(|a| a == want), "{want} not in {args:?}");
    }
    assert!(
        !args.iter().any(|a| a == "--listen=0.0.0.0:8888"),
        "{args:?}"
    );
    // HyperNode rights and the flag come only with publishing; cert-manager issues the
    // certificates when asked, and its CA is then the client CA. (cert-manager's CRDs are not
    // in the test cluster: these are rendered, not applied.)
    let rules = |objects: &[(String, Value)]| {
        pick(objects, "ClusterRole", "fumarole-scheduler-ext")["rules"].to_string()
    };
    let ext_spec = |objects: &[(String, Value)]| {
        format!(
            "{} {}",
            pick(objects, "Deployment", "fumarole-scheduler-ext")["spec"],
            effective_args(objects, "Deployment", "fumarole-scheduler-ext").join(" ")
        )
    };
    assert!(!rules(&chart).contains("hypernodes"));
    assert!(!ext_spec(&chart).contains("--publish-hypernodes"));
    let publishing = render_chart(&["schedulerExt.publishHyperNodes=true"], false);
    assert!(rules(&publishing).contains("hypernodes"));
    assert!(ext_spec(&publishing).contains("--publish-hypernodes"));
    assert!(
        !identities(&chart)
            .iter()
            .any(|n| n.starts_with("Certificate/"))
    );
    let issued = render_chart(&["schedulerExt.certManager.enabled=true"], false);
    let names = identities(&issued);
    for want in [
        "Issuer/fumarole-system/fumarole-selfsigned",
        "Certificate/fumarole-system/fumarole-ca",
        "Issuer/fumarole-system/fumarole-ca",
        "Certificate/fumarole-system/fumarole-scheduler-ext",
        "Certificate/fumarole-system/fumarole-kube-scheduler-client",
    ] {
        assert!(names.contains(want), "{want} not rendered");
    }
    let serving = pick(&issued, "Certificate", "fumarole-scheduler-ext");
    assert_eq!(serving["spec"]["secretName"], "fumarole-scheduler-ext-tls");
    assert!(
        ext_spec(&issued).contains(r#""secretName":"fumarole-ca""#),
        "{}",
        ext_spec(&issued)
    );
    // The NetworkPolicy: the chart's is the example's, and it admits the pods Volcano's own
    // chart (v1.10.0, from the Go module the e2e builds Volcano from) labels as its scheduler.
    assert!(
        !identities(&chart)
            .iter()
            .any(|n| n.starts_with("NetworkPolicy/"))
    );
    let fenced = render_chart(&["schedulerExt.networkPolicy.enabled=true"], false);
    let example = &network_policy[0].1;
    assert_eq!(
        pick(&fenced, "NetworkPolicy", "fumarole-scheduler-ext")["spec"],
        example["spec"]
    );
    let volcano_label = &example["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"];
    let volcano_chart = volcano_scheduler_chart();
    for (key, value) in volcano_label.as_object().unwrap() {
        let line = format!("{key}: {}", value.as_str().unwrap());
        assert!(
            volcano_chart.contains(&format!(
                "  template:\n    metadata:\n      labels:\n        {line}\n"
            )),
            "Volcano's scheduler pods are not labelled {line}"
        );
    }
    // The example KubeSchedulerConfiguration is not an API object: the real kube-scheduler
    // loads it (strict decoding, extender validation), with the test cluster's CA as the
    // extender's CA.
    let example =
        std::fs::read_to_string(deploy_dir().join("daemonset/examples/kube-scheduler-config.yaml"))
            .unwrap();
    let ca = cluster.root().join("pki/ca.crt");
    assert!(ca.is_file(), "{}", ca.display());
    let pki = cluster.root().join("pki");
    let example = example
        .replace("/etc/kubernetes/fumarole-ca.crt", &ca.display().to_string())
        .replace(
            "/etc/kubernetes/fumarole-client.crt",
            &pki.join("apiserver.crt").display().to_string(),
        )
        .replace(
            "/etc/kubernetes/fumarole-client.key",
            &pki.join("apiserver.key").display().to_string(),
        );
    cluster.start_kube_scheduler(&example).await.unwrap();

    // A dry run creates nothing.
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), NAMESPACE);
    assert!(
        api.get_opt("volcano-agent-configuration")
            .await
            .unwrap()
            .is_none()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn each_component_does_its_job_with_only_its_rights_and_the_agent_writes_only_its_node() {
    let cluster = TestCluster::start().await.unwrap();
    // The Volcano and NodeResourceTopology CRDs come from their own projects' installs.
    cluster.install_fumarole_crds().await.unwrap();
    let admin = cluster.client();
    cluster.install_deploy_daemonset().await.unwrap();
    for node in ["node-a", "node-b"] {
        cluster
            .create_node(
                &NodeSpec::new(node)
                    .capacity("cpu", "8")
                    .capacity("memory", "32Gi")
                    .capacity("nvidia.com/gpu", "8")
                    .label("volcano.sh/colocation", "true"),
            )
            .await
            .unwrap();
    }

    // The agent on node-a, as its ServiceAccount with a token bound to node-a.
    let agent_id = Identity::service_account(NAMESPACE, "fumarole-agent").on_node("node-a");
    let kubeconfig = cluster
        .kubeconfig_for("agent.kubeconfig", &agent_id)
        .unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let no_kubelet = scratch.path().join("config.yaml");
    let agent = colocation::agent("node-a", &no_kubelet, scratch.path())
        .unwrap()
        .kubeconfig(&kubeconfig)
        .flag("--colocation-config-namespace", NAMESPACE);
    let agent_metrics = agent.metrics_port().unwrap();
    let agent = agent.spawn_in(&cluster).unwrap();

    // Its whole job: every object published, labels on its Node, the co-location report.
    let topologies: Api<DeviceTopology> = Api::all(admin.clone());
    eventually(
        "node-a's DeviceTopology with the co-location report",
        Duration::from_secs(60),
        || {
            let topologies = topologies.clone();
            async move {
                let t = topologies.get_opt("node-a").await?;
                Ok(t.and_then(|t| t.status?.colocation)
                    .filter(|c| c.enabled)
                    .map(drop))
            }
        },
    )
    .await
    .unwrap();
    for (api, what) in [
        (
            fumarole_e2e::fumarole::numatopologies(admin.clone()),
            "Numatopology",
        ),
        (
            fumarole_e2e::fumarole::node_resource_topologies(admin.clone()),
            "NodeResourceTopology",
        ),
    ] {
        eventually(what, Duration::from_secs(30), || {
            let api = api.clone();
            async move { Ok(api.get_opt("node-a").await?.map(drop)) }
        })
        .await
        .unwrap();
    }
    let nodes: Api<Node> = Api::all(admin.clone());
    eventually("fumarole labels on node-a", Duration::from_secs(30), || {
        let nodes = nodes.clone();
        async move {
            let node = nodes.get("node-a").await?;
            Ok(node
                .labels()
                .keys()
                .any(|k| k.starts_with("fumarole.dev/"))
                .then_some(()))
        }
    })
    .await
    .unwrap();
    let agent_log = log(&agent);
    assert!(
        !agent_log.to_lowercase().contains("forbidden"),
        "{agent_log}"
    );

    // Node-scoped writes: its own node's objects pass, node-b's are denied by the policy.
    let as_agent = cluster.client_for(&agent_id).await.unwrap();
    let agent_topologies: Api<DeviceTopology> = Api::all(as_agent.clone());
    let agent_nodes: Api<Node> = Api::all(as_agent.clone());
    let label = |v: &str| Patch::Merge(json!({"metadata": {"labels": {"fumarole.dev/e2e": v}}}));
    agent_nodes
        .patch("node-a", &PatchParams::default(), &label("own"))
        .await
        .unwrap();
    let topology = |node: &str| {
        json!({
            "apiVersion": "topology.fumarole.dev/v1alpha1", "kind": "DeviceTopology",
            "metadata": {"name": node},
            "spec": {"acceleratorCount": 0, "model": "", "numaNodes": [], "devices": [], "links": []},
        })
    };
    let ssa = PatchParams::apply("fumarole-exporter").force();
    agent_topologies
        .patch("node-a", &ssa, &Patch::Apply(topology("node-a")))
        .await
        .unwrap();
    // Its own node's Ascend device-info ConfigMap in kube-system, by server-side apply.
    let agent_configmaps: Api<ConfigMap> = Api::namespaced(as_agent.clone(), "kube-system");
    let device_info = |name: &str| {
        json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": "kube-system",
                "labels": {"mx-consumer-cim": "true"}},
            "data": {"DeviceInfoCfg": "{}"},
        })
    };
    agent_configmaps
        .patch(
            "mindx-dl-deviceinfo-node-a",
            &ssa,
            &Patch::Apply(device_info("mindx-dl-deviceinfo-node-a")),
        )
        .await
        .unwrap();
    // Its own heartbeat Lease, labelled with its node (the node the extension cleans up after
    // when the Lease expires).
    let agent_leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(as_agent.clone(), "fumarole-system");
    let heartbeat = |labelled: &str| {
        json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "fumarole-agent-node-a", "namespace": "fumarole-system",
                "labels": {"fumarole.dev/agent-heartbeat": labelled}},
            "spec": {"leaseDurationSeconds": 40},
        })
    };
    agent_leases
        .patch(
            "fumarole-agent-node-a",
            &ssa,
            &Patch::Apply(heartbeat("node-a")),
        )
        .await
        .unwrap();
    let policy = "may write only the objects of its own node";
    let denied = [
        (
            "its own heartbeat Lease labelled with node-b (aiming the clean-up at node-b)",
            agent_leases
                .patch(
                    "fumarole-agent-node-a",
                    &ssa,
                    &Patch::Apply(heartbeat("node-b")),
                )
                .await
                .map(drop),
        ),
        (
            "node-b's Ascend device-info ConfigMap",
            agent_configmaps
                .patch(
                    "mindx-dl-deviceinfo-node-b",
                    &ssa,
                    &Patch::Apply(device_info("mindx-dl-deviceinfo-node-b")),
                )
                .await
                .map(drop),
        ),
        (
            "another kube-system ConfigMap",
            agent_configmaps
                .patch(
                    "cluster-settings",
                    &ssa,
                    &Patch::Apply(device_info("cluster-settings")),
                )
                .await
                .map(drop),
        ),
        (
            "node-b's labels",
            agent_nodes
                .patch("node-b", &PatchParams::default(), &label("other"))
                .await
                .map(drop),
        ),
        (
            "node-b's status",
            agent_nodes
                .patch_status(
                    "node-b",
                    &PatchParams::default(),
                    &Patch::Merge(
                        json!({"status": {"capacity": {"kubernetes.io/batch-cpu": "1"}}}),
                    ),
                )
                .await
                .map(drop),
        ),
        (
            "node-b's DeviceTopology",
            agent_topologies
                .patch("node-b", &ssa, &Patch::Apply(topology("node-b")))
                .await
                .map(drop),
        ),
    ];
    for (what, result) in denied {
        let message = forbidden(what, result);
        assert!(message.contains(policy), "{what}: {message}");
    }
    // On its own Node, only what it writes (labels under fumarole.dev/, its annotation, its
    // taint, batch resources): an admin's taint, another label or capacity stay as they are.
    let admin_nodes: Api<Node> = Api::all(cluster.client());
    admin_nodes
        .patch(
            "node-a",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"taints": [
                {"key": "dedicated", "value": "infra", "effect": "NoSchedule"}]}})),
        )
        .await
        .unwrap();
    let own_node = "may change on its Node only";
    let denied = [
        (
            "a node-restriction label on its node",
            agent_nodes
                .patch(
                    "node-a",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"labels": {
                        "node-restriction.kubernetes.io/pool": "gpu"}}})),
                )
                .await
                .map(drop),
            own_node,
        ),
        // Through nodes/status too: the API server keeps the metadata sent with a status update.
        (
            "a node-restriction label on its node, through nodes/status",
            agent_nodes
                .patch_status(
                    "node-a",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"labels": {
                        "node-restriction.kubernetes.io/pool": "gpu"}}})),
                )
                .await
                .map(drop),
            own_node,
        ),
        (
            "another annotation on its node, through nodes/status",
            agent_nodes
                .patch_status(
                    "node-a",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"annotations": {"team": "x"}}})),
                )
                .await
                .map(drop),
            own_node,
        ),
        (
            "an nvidia.com/ label that is not a compatible label",
            agent_nodes
                .patch(
                    "node-a",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"labels": {
                        "nvidia.com/gpu.deploy.driver": "false"}}})),
                )
                .await
                .map(drop),
            own_node,
        ),
        (
            "removing an admin's taint from its node",
            agent_nodes
                .patch(
                    "node-a",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"taints": []}})),
                )
                .await
                .map(drop),
            own_node,
        ),
        (
            "its node's CPU capacity",
            agent_nodes
                .patch_status(
                    "node-a",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": {"capacity": {"cpu": "1000"}}})),
                )
                .await
                .map(drop),
            "may change in its Node's status only",
        ),
    ];
    for (what, result, policy) in denied {
        let message = forbidden(what, result);
        assert!(message.contains(policy), "{what}: {message}");
    }
    // Its own taint and labels it may add beside the admin's (compatible labels too).
    agent_nodes
        .patch(
            "node-a",
            &PatchParams::default(),
            &Patch::Merge(json!({
                "metadata": {"labels": {"fumarole.dev/probe": "1",
                    "nvidia.com/gpu.product": "probe", "accelerator": "probe"}},
                "spec": {"taints": [
                    {"key": "dedicated", "value": "infra", "effect": "NoSchedule"},
                    {"key": "volcano.sh/offline-job-evicting", "value": "true", "effect": "NoSchedule"}]},
            })),
        )
        .await
        .unwrap();
    admin_nodes
        .patch(
            "node-a",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"fumarole.dev/probe": null,
                    "nvidia.com/gpu.product": null, "accelerator": null}},
                "spec": {"taints": null}})),
        )
        .await
        .unwrap();
    // A token not bound to a node writes no node objects at all.
    let unbound = cluster
        .client_for(&Identity::service_account(NAMESPACE, "fumarole-agent"))
        .await
        .unwrap();
    let message = forbidden(
        "node-a's labels without a node-bound token",
        Api::<Node>::all(unbound)
            .patch("node-a", &PatchParams::default(), &label("unbound"))
            .await,
    );
    assert!(message.contains(policy), "{message}");

    // Verbs the agent does not need.
    let agent_pods: Api<Pod> = Api::namespaced(as_agent.clone(), "default");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }))
    .unwrap();
    forbidden(
        "create pods",
        agent_pods.create(&PostParams::default(), &pod).await,
    );
    // Pod writes: only huawei.com/AscendReal (the NPUs mounted), only on its own node's pods.
    let admin_pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    for (name, node) in [("npu-on-a", "node-a"), ("npu-on-b", "node-b")] {
        let p: Pod = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]},
        }))
        .unwrap();
        admin_pods.create(&PostParams::default(), &p).await.unwrap();
    }
    let annotate =
        |key: &str, value: &str| Patch::Merge(json!({"metadata": {"annotations": {key: value}}}));
    agent_pods
        .patch(
            "npu-on-a",
            &PatchParams::default(),
            &annotate("huawei.com/AscendReal", "Ascend910-0"),
        )
        .await
        .unwrap();
    let message = forbidden(
        "annotate another node's pod",
        agent_pods
            .patch(
                "npu-on-b",
                &PatchParams::default(),
                &annotate("huawei.com/AscendReal", "Ascend910-0"),
            )
            .await,
    );
    assert!(message.contains(policy), "{message}");
    let message = forbidden(
        "set a device choice on a pod",
        agent_pods
            .patch(
                "npu-on-a",
                &PatchParams::default(),
                &annotate("fumarole.dev/devices", "nvidia0"),
            )
            .await,
    );
    // Two policies deny it; which one answers first varies.
    assert!(
        message.contains("only the huawei.com/AscendReal annotation")
            || message.contains("only fumarole's schedulers (fumarole-scheduler-ext"),
        "{message}"
    );
    let message = forbidden(
        "choose a pod's NPUs",
        agent_pods
            .patch(
                "npu-on-a",
                &PatchParams::default(),
                &annotate("huawei.com/Ascend910", "Ascend910-1"),
            )
            .await,
    );
    // Two policies deny it too.
    assert!(
        message.contains("only the huawei.com/AscendReal annotation")
            || message.contains("set huawei.com/<Ascend chip>"),
        "{message}"
    );
    for name in ["npu-on-a", "npu-on-b"] {
        admin_pods
            .delete(name, &DeleteParams::default().grace_period(0))
            .await
            .unwrap();
    }
    forbidden(
        "delete pods",
        agent_pods.delete("p", &DeleteParams::default()).await,
    );
    forbidden(
        "delete nodes",
        agent_nodes.delete("node-b", &DeleteParams::default()).await,
    );
    forbidden(
        "list secrets",
        Api::<Secret>::all(as_agent.clone())
            .list(&ListParams::default())
            .await,
    );
    forbidden(
        "other ConfigMaps",
        Api::<ConfigMap>::namespaced(as_agent.clone(), NAMESPACE)
            .get("kube-root-ca.crt")
            .await,
    );
    forbidden(
        "delete DeviceTopology",
        agent_topologies
            .delete("node-a", &DeleteParams::default())
            .await,
    );

    // The scheduler extension, as its ServiceAccount: the live view and a bind.
    let ext_id = Identity::service_account(NAMESPACE, "fumarole-scheduler-ext");
    let ext_kubeconfig = cluster.kubeconfig_for("ext.kubeconfig", &ext_id).unwrap();
    let port = free_port().unwrap();
    // POD_NAMESPACE as the Deployment's downward API sets it: the Lease lives there.
    let ext = Proc::spawn_with_env(
        "fumarole-scheduler-ext",
        &scheduler_ext_bin().unwrap(),
        &[
            "serve".to_string(),
            format!("--kubeconfig={}", ext_kubeconfig.display()),
            format!("--listen=127.0.0.1:{port}"),
        ],
        &[("POD_NAMESPACE", NAMESPACE)],
        &cluster.root().join("logs"),
    )
    .unwrap();
    let ext_log = || log(&ext);
    eventually(
        "the extension's cluster view",
        Duration::from_secs(30),
        || async { Ok(ext_log().contains("cluster view ready").then_some(())) },
    )
    .await
    .unwrap();
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let trainer: Pod = serde_json::from_value(json!({
        "metadata": {"name": "trainer"},
        "spec": {"containers": [{"name": "c", "image": "busybox",
            "resources": {"limits": {"nvidia.com/gpu": "2"}}}]},
    }))
    .unwrap();
    let created = pods.create(&PostParams::default(), &trainer).await.unwrap();
    let answer = eventually("bind through the extension", Duration::from_secs(30), || {
        let uid = created.uid().unwrap();
        async move {
            let body = json!({"PodName": "trainer", "PodNamespace": "default", "PodUID": uid, "Node": "node-a"});
            let answer: Value = serde_json::from_str(
                &http_post_json(port, "/kube-scheduler/bind", &body).await?,
            )?;
            // The view may not list node-a's devices yet: try again.
            Ok((answer["Error"] == "").then_some(answer))
        }
    })
    .await
    .unwrap();
    assert_eq!(answer["Error"], "");
    let bound = pods.get("trainer").await.unwrap();
    assert!(bound.annotations().contains_key("fumarole.dev/devices"));
    assert_eq!(
        bound.spec.as_ref().unwrap().node_name.as_deref(),
        Some("node-a")
    );
    assert!(
        !ext_log().to_lowercase().contains("forbidden"),
        "{}",
        ext_log()
    );

    // The extension as the manifest runs it (its files written here): it starts, serves HTTPS,
    // and no verb is open (kube-scheduler's need a client certificate, Volcano's the token).
    let objects = kustomization(&deploy_dir().join("daemonset")).unwrap();
    let deployment = objects
        .iter()
        .map(|(_, v)| v)
        .find(|v| v["kind"] == "Deployment" && v["metadata"]["name"] == "fumarole-scheduler-ext")
        .unwrap();
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    let mounts: Vec<&str> = container["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["mountPath"].as_str())
        .collect();
    let pki = cluster.root().join("pki");
    let token = cluster.root().join("volcano-token");
    std::fs::write(&token, "a-token-only-volcano-knows\n").unwrap();
    let files = [
        ("/etc/fumarole/tls/tls.crt", pki.join("apiserver.crt")),
        ("/etc/fumarole/tls/tls.key", pki.join("apiserver.key")),
        ("/etc/fumarole/client-ca/ca.crt", pki.join("ca.crt")),
        ("/etc/fumarole/volcano/token", token),
    ];
    let tls_port = free_port().unwrap();
    let webhook_port = free_port().unwrap();
    let mut args: Vec<String> = Vec::new();
    for arg in container["args"].as_array().unwrap() {
        let mut arg = arg.as_str().unwrap().to_string();
        if let Some((_, path)) = arg.split_once("=/etc/fumarole/") {
            let path = format!("/etc/fumarole/{path}");
            assert!(
                mounts.iter().any(|m| path.starts_with(m)),
                "{path} is not under a volume mount of the manifest's extension"
            );
            let (_, here) = files
                .iter()
                .find(|(there, _)| *there == path)
                .unwrap_or_else(|| panic!("no stand-in for {path}"));
            arg = arg.replace(&path, &here.display().to_string());
        }
        if arg.starts_with("--listen=") {
            arg = format!("--listen=0.0.0.0:{tls_port}");
        }
        // The agent-writes admission webhook, on by default in the manifest too.
        if arg.starts_with("--webhook-listen=") {
            arg = format!("--webhook-listen=127.0.0.1:{webhook_port}");
        }
        args.push(arg);
    }
    assert!(
        args.iter().any(|a| a.starts_with("--webhook-listen=")),
        "the manifest's extension serves no webhook: {args:?}"
    );
    args.push(format!("--kubeconfig={}", ext_kubeconfig.display()));
    args.push("--ui-listen=off".into());
    // A Lease of its own: the first extension still leads over the default one.
    args.push("--leader-elect-resource-name=fumarole-scheduler-ext-as-deployed".into());
    let manifest_ext = Proc::spawn_with_env(
        "fumarole-scheduler-ext-as-deployed",
        &scheduler_ext_bin().unwrap(),
        &args,
        &[("POD_NAMESPACE", NAMESPACE), ("NO_COLOR", "1")],
        &cluster.root().join("logs"),
    )
    .unwrap();
    let serving = eventually(
        "the extension as deployed serves",
        Duration::from_secs(30),
        || async {
            let text = strip_ansi(&log(&manifest_ext));
            Ok(text
                .lines()
                .find(|l| l.contains(" serving address="))
                .map(str::to_string))
        },
    )
    .await
    .unwrap();
    for want in [
        "https=true",
        "kube_scheduler_open=false",
        "volcano_open=false",
    ] {
        assert!(serving.contains(want), "{want} not in: {serving}");
    }
    // Attacked from the pod network: whoever reaches the port without kube-scheduler's client
    // certificate or Volcano's token gets 401 from every verb, and the pending pod it names is
    // not touched (same resourceVersion, not bound, no device choice).
    let victim: Pod = serde_json::from_value(json!({
        "metadata": {"name": "victim"},
        "spec": {"containers": [{"name": "c", "image": "busybox",
            "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
    }))
    .unwrap();
    let victim = pods.create(&PostParams::default(), &victim).await.unwrap();
    let uid = victim.uid().unwrap();
    let kube_body =
        json!({"PodName": "victim", "PodNamespace": "default", "PodUID": uid, "Node": "node-b"});
    let volcano_body = json!({"task": {"uid": uid, "name": "victim", "namespace": "default",
        "pod": victim}, "node": {"name": "node-b"}});
    let https = |path: &str, body: &Value, credentials: Option<&str>| {
        let mut cmd = std::process::Command::new("curl");
        cmd.args(["-sS", "-o", "/dev/null", "-w", "%{http_code}", "--cacert"])
            .arg(pki.join("ca.crt"))
            .args([
                "-X",
                "POST",
                "-H",
                "Content-Type: application/json",
                "--data-binary",
            ])
            .arg(body.to_string());
        if let Some(user) = credentials {
            cmd.args(["-u", user]);
        }
        cmd.arg(format!("https://127.0.0.1:{tls_port}{path}"));
        let out = cmd.output().unwrap();
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    for (path, body) in [
        ("/kube-scheduler/filter", &kube_body),
        ("/kube-scheduler/prioritize", &kube_body),
        ("/kube-scheduler/bind", &kube_body),
        ("/volcano/predicate", &volcano_body),
        ("/volcano/allocateFunc", &volcano_body),
        ("/volcano/deallocateFunc", &volcano_body),
    ] {
        assert_eq!(https(path, body, None), "401", "{path} without credentials");
        assert_eq!(
            https(path, body, Some("fumarole:a-guessed-token")),
            "401",
            "{path} with a wrong token"
        );
    }
    // Volcano's token opens Volcano's verbs (a read-only one here), not kube-scheduler's.
    let token_user = "fumarole:a-token-only-volcano-knows";
    assert_ne!(
        https("/volcano/predicate", &volcano_body, Some(token_user)),
        "401"
    );
    assert_eq!(
        https("/kube-scheduler/bind", &kube_body, Some(token_user)),
        "401"
    );
    let after = pods.get("victim").await.unwrap();
    assert_eq!(
        after.metadata.resource_version,
        victim.metadata.resource_version
    );
    assert!(after.spec.as_ref().unwrap().node_name.is_none());
    assert!(!after.annotations().contains_key("fumarole.dev/devices"));
    // And the API server's audit log holds no write on it but its creation.
    let victim_writes = |audit: Vec<Value>| -> Vec<Value> {
        audit
            .into_iter()
            .filter(|e| {
                e["objectRef"]["resource"] == "pods"
                    && e["objectRef"]["namespace"] == "default"
                    && e["objectRef"]["name"] == "victim"
            })
            .collect()
    };
    let writes = victim_writes(cluster.audited_writes().unwrap());
    assert_eq!(writes.len(), 1, "{writes:#?}");
    assert_eq!(writes[0]["verb"], "create");
    assert_eq!(writes[0]["user"]["username"], "fumarole-e2e-admin");

    // The real kube-scheduler with the example configuration, its client certificate in
    // tlsConfig: it calls the extension as deployed over mTLS, and the extension binds the pod
    // with its devices.
    let mut config: Value = serde_norway::from_str(
        &std::fs::read_to_string(
            deploy_dir().join("daemonset/examples/kube-scheduler-config.yaml"),
        )
        .unwrap(),
    )
    .unwrap();
    let extender = &mut config["extenders"][0];
    assert_eq!(extender["enableHTTPS"], true);
    extender["urlPrefix"] = json!(format!("https://127.0.0.1:{tls_port}/kube-scheduler"));
    let tls = &mut extender["tlsConfig"];
    for (key, file) in [
        ("caFile", "ca.crt"),
        ("certFile", "kube-scheduler-client.crt"),
        ("keyFile", "kube-scheduler-client.key"),
    ] {
        assert!(tls[key].is_string(), "the example has no tlsConfig.{key}");
        tls[key] = json!(pki.join(file).display().to_string());
    }
    cluster
        .start_kube_scheduler(&serde_norway::to_string(&config).unwrap())
        .await
        .unwrap();
    let bound = eventually(
        "kube-scheduler binds the pod through the extension (mTLS)",
        Duration::from_secs(60),
        || async {
            let p = pods.get("victim").await?;
            let node = p.spec.as_ref().and_then(|s| s.node_name.clone());
            Ok(node.map(|_| p))
        },
    )
    .await
    .unwrap();
    assert_eq!(
        bound.spec.as_ref().unwrap().node_name.as_deref(),
        Some("node-a")
    );
    assert!(
        bound.annotations().contains_key("fumarole.dev/devices"),
        "{:?}",
        bound.annotations()
    );
    // The Binding came from the extension's account, not from kube-scheduler's own binder.
    let binder = victim_writes(cluster.audited_writes().unwrap())
        .into_iter()
        .find(|e| e["objectRef"]["subresource"] == "binding")
        .unwrap();
    assert_eq!(
        binder["impersonatedUser"]["username"],
        "system:serviceaccount:fumarole-system:fumarole-scheduler-ext",
        "{binder:#}"
    );
    assert_eq!(binder["responseStatus"]["code"], 201, "{binder:#}");
    cluster.stop("kube-scheduler").unwrap();
    // The chart's ValidatingWebhookConfiguration, registered for real (the test's API server
    // reaches the webhook by URL instead of through a Service): node-a's agent may evict and
    // write Events only for its own node's pods, never in kube-system.
    let ca_bundle = base64::Engine::encode(
        &base64::engine::general_purpose::STANDARD,
        std::fs::read(pki.join("ca.crt")).unwrap(),
    );
    let webhooked = render_chart(
        &[
            "schedulerExt.agentWritesWebhook.enabled=true",
            &format!("schedulerExt.agentWritesWebhook.caBundle={ca_bundle}"),
        ],
        false,
    );
    let mut config = webhooked
        .iter()
        .map(|(_, v)| v)
        .find(|v| v["kind"] == "ValidatingWebhookConfiguration")
        .unwrap()
        .clone();
    let client_config = &mut config["webhooks"][0]["clientConfig"];
    assert_eq!(client_config["service"]["name"], "fumarole-agent-writes");
    let path = client_config["service"]["path"]
        .as_str()
        .unwrap()
        .to_string();
    client_config["url"] = json!(format!("https://127.0.0.1:{webhook_port}{path}"));
    if let Some(m) = client_config.as_object_mut() {
        m.remove("service");
    }
    apply(&cluster.client(), &config, false).await.unwrap();
    for (name, node) in [("on-a", "node-a"), ("on-b", "node-b")] {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]},
        }))
        .unwrap();
        Api::<Pod>::namespaced(admin.clone(), "default")
            .create(&PostParams::default(), &pod)
            .await
            .unwrap();
    }
    // An Event in `namespace` about a Node (cluster-scoped) or a Pod of that namespace.
    let event = |namespace: &str, kind: &str, name: &str| {
        let mut regarding = json!({"kind": kind, "name": name});
        if kind == "Pod" {
            regarding["namespace"] = json!(namespace);
        }
        json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"generateName": "probe-", "namespace": namespace},
            "eventTime": "2026-01-01T00:00:00.000000Z", "reportingController": "fumarole-agent",
            "reportingInstance": "node-a", "action": "Probe", "reason": "Probe", "type": "Normal",
            "regarding": regarding})
    };
    let create_event = |namespace: &str, body: Value| {
        let api: Api<k8s_openapi::api::events::v1::Event> =
            Api::namespaced(as_agent.clone(), namespace);
        async move {
            let event: k8s_openapi::api::events::v1::Event = serde_json::from_value(body).unwrap();
            api.create(&PostParams::default(), &event).await
        }
    };
    // The webhook is called once the API server has loaded the configuration.
    let agent_pods_default: Api<Pod> = Api::namespaced(as_agent.clone(), "default");
    let evict_b = eventually(
        "the webhook refuses node-a's agent evicting a pod on node-b",
        Duration::from_secs(20),
        || async {
            match agent_pods_default.evict("on-b", &Default::default()).await {
                Err(kube::Error::Api(s)) if s.message.contains("agent-writes.fumarole.dev") => {
                    Ok(Some(s))
                }
                Err(e) => Err(anyhow::anyhow!("{e}")),
                Ok(_) => Err(fumarole_e2e::wait::Fatal(
                    "node-a's agent evicted a pod on node-b".into(),
                )
                .into()),
            }
        },
    )
    .await
    .unwrap();
    // Terse: which pod is not the agent's node's, never where it runs.
    assert!(
        evict_b.message.contains("is not a pod of node-a") && !evict_b.message.contains("node-b"),
        "{}",
        evict_b.message
    );
    for (what, result) in [
        (
            "an Event in kube-system",
            create_event("kube-system", event("kube-system", "Pod", "kube-proxy-x")).await,
        ),
        (
            "an Event about node-b",
            create_event("default", event("default", "Node", "node-b")).await,
        ),
        (
            "an Event about a pod on node-b",
            create_event("default", event("default", "Pod", "on-b")).await,
        ),
    ] {
        let message = forbidden(what, result);
        assert!(
            message.contains("agent-writes.fumarole.dev"),
            "{what}: {message}"
        );
    }
    // Its own node's: allowed.
    create_event("default", event("default", "Node", "node-a"))
        .await
        .unwrap();
    create_event("default", event("default", "Pod", "on-a"))
        .await
        .unwrap();
    agent_pods_default
        .evict("on-a", &Default::default())
        .await
        .unwrap();
    drop(manifest_ext);

    let as_ext = cluster.client_for(&ext_id).await.unwrap();
    forbidden(
        "extension: delete pods",
        Api::<Pod>::namespaced(as_ext.clone(), "default")
            .delete("trainer", &DeleteParams::default())
            .await,
    );
    // It may patch Nodes only to remove what a dead agent left (scheduler-ext-node-writes.yaml;
    // the removal itself is e2e dead_agent.rs).
    let ext_nodes = Api::<Node>::all(as_ext.clone());
    let message = forbidden(
        "extension: label a node",
        ext_nodes
            .patch("node-a", &PatchParams::default(), &label("ext"))
            .await,
    );
    assert!(message.contains("may change no label"), "{message}");
    // Nor through nodes/status, which keeps the labels and annotations sent with it.
    for (what, patch) in [
        ("label", json!({"metadata": {"labels": {"team": "ext"}}})),
        (
            "annotate",
            json!({"metadata": {"annotations": {"team": "ext"}}}),
        ),
    ] {
        let message = forbidden(
            &format!("extension: {what} a node through nodes/status"),
            ext_nodes
                .patch_status("node-a", &PatchParams::default(), &Patch::Merge(patch))
                .await,
        );
        assert!(message.contains("may change no label"), "{message}");
    }
    forbidden(
        "extension: taint a node",
        ext_nodes
            .patch(
                "node-a",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"taints": [
                    {"key": "volcano.sh/offline-job-evicting", "effect": "NoSchedule"}]}})),
            )
            .await,
    );
    forbidden(
        "extension: change a node's CPU capacity",
        ext_nodes
            .patch_status(
                "node-a",
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"capacity": {"cpu": "1000"}}})),
            )
            .await,
    );
    let ext_pods = Api::<Pod>::namespaced(as_ext.clone(), "default");
    for (what, patch) in [
        ("a label", json!({"metadata": {"labels": {"team": "x"}}})),
        (
            "another annotation",
            json!({"metadata": {"annotations": {"team": "x"}}}),
        ),
    ] {
        let message = forbidden(
            &format!("extension: {what} on a pod"),
            ext_pods
                .patch("trainer", &PatchParams::default(), &Patch::Merge(patch))
                .await,
        );
        assert!(message.contains("may change on a pod only"), "{message}");
    }
    // Its Bindings carry only its own annotations (the API server copies them onto the pod).
    let admin_pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    let pending: Pod = serde_json::from_value(json!({
        "metadata": {"name": "ext-bound"},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }))
    .unwrap();
    admin_pods
        .create(&PostParams::default(), &pending)
        .await
        .unwrap();
    let ext_binding = |annotations: Value| {
        json!({"apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": "ext-bound", "annotations": annotations},
            "target": {"apiVersion": "v1", "kind": "Node", "name": "node-b"}})
    };
    // Neither another annotation nor Huawei's job annotations: the API server would copy
    // them over the pod's own.
    for (what, other) in [
        ("another annotation", "team"),
        ("a job annotation", "hccl/rankIndex"),
    ] {
        let message = forbidden(
            &format!("extension: a Binding with {what}"),
            ext_pods
                .create_subresource::<Value, Value>(
                    "binding",
                    "ext-bound",
                    &PostParams::default(),
                    &ext_binding(json!({"fumarole.dev/devices-node": "node-b", other: "0"})),
                )
                .await,
        );
        assert!(message.contains("may put on a Binding only"), "{message}");
    }
    // On a pod not bound yet, the job annotations it added (and recorded) are its own to
    // replace or remove; one it did not add, and one it claims to have added but did not,
    // stand.
    let annotate = |a: Value| Patch::Merge(json!({"metadata": {"annotations": a}}));
    let on_ext_bound = |a: Value| {
        let (ext_pods, patch) = (ext_pods.clone(), annotate(a));
        async move {
            ext_pods
                .patch("ext-bound", &PatchParams::default(), &patch)
                .await
        }
    };
    on_ext_bound(json!({"hccl/rankIndex": "3"})).await.unwrap();
    on_ext_bound(json!({"super-pod-id": "7", "super-pod-rank": "1",
        "fumarole.dev/job-annotations": "super-pod-id,super-pod-rank"}))
    .await
    .unwrap();
    on_ext_bound(json!({"super-pod-id": "8", "super-pod-rank": null,
        "fumarole.dev/job-annotations": "super-pod-id"}))
    .await
    .unwrap();
    for (what, change) in [
        (
            "change a job annotation it did not add",
            json!({"hccl/rankIndex": "4"}),
        ),
        (
            "record a job annotation it did not add",
            json!({"fumarole.dev/job-annotations": "hccl/rankIndex,super-pod-id"}),
        ),
        (
            "record another annotation",
            json!({"team": "x", "fumarole.dev/job-annotations": "super-pod-id,team"}),
        ),
    ] {
        let message = forbidden(&format!("extension: {what}"), on_ext_bound(change).await);
        assert!(message.contains("may change on a pod only"), "{message}");
    }
    ext_pods
        .create_subresource::<Value, Value>(
            "binding",
            "ext-bound",
            &PostParams::default(),
            &ext_binding(json!({"fumarole.dev/devices-node": "node-b"})),
        )
        .await
        .unwrap();
    let bound = admin_pods.get("ext-bound").await.unwrap();
    assert_eq!(bound.spec.unwrap().node_name.as_deref(), Some("node-b"));
    let kept = bound.metadata.annotations.unwrap();
    assert_eq!(
        (
            kept["hccl/rankIndex"].as_str(),
            kept["super-pod-id"].as_str()
        ),
        ("3", "8")
    );
    assert!(!kept.contains_key("super-pod-rank"), "{kept:?}");
    // Once bound, not even those; its other writes go on beside the record it left.
    let message = forbidden(
        "extension: change a job annotation it added, on a bound pod",
        on_ext_bound(json!({"super-pod-id": "9"})).await,
    );
    assert!(message.contains("may change on a pod only"), "{message}");
    on_ext_bound(json!({"fumarole.dev/devices": "{\"nvidia.com/gpu\":[\"GPU-0\"]}"}))
        .await
        .unwrap();
    // Huawei's job annotations: added where the pod has none, never changed afterwards.
    let rank = |v: &str| Patch::Merge(json!({"metadata": {"annotations": {"hccl/rankIndex": v}}}));
    ext_pods
        .patch("trainer", &PatchParams::default(), &rank("3"))
        .await
        .unwrap();
    let message = forbidden(
        "extension: change hccl/rankIndex on a pod",
        ext_pods
            .patch("trainer", &PatchParams::default(), &rank("4"))
            .await,
    );
    assert!(message.contains("may change on a pod only"), "{message}");
    // Nobody else sets a device choice: a user who may create and patch pods in default.
    let alice = Identity::user("alice", &["system:authenticated"]);
    let rbac = [
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "pod-editor", "namespace": "default"},
            "rules": [{"apiGroups": [""], "resources": ["pods"],
                "verbs": ["get", "list", "create", "patch", "update"]},
                {"apiGroups": [""], "resources": ["pods/binding"], "verbs": ["create"]},
                {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch", "update"]}]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "alice-pod-editor", "namespace": "default"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-editor"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "alice"}]}),
    ];
    for object in &rbac {
        apply(&cluster.client(), object, false).await.unwrap();
    }
    let alice_pods: Api<Pod> =
        Api::namespaced(cluster.client_for(&alice).await.unwrap(), "default");
    let forged: Pod = serde_json::from_value(json!({
        "metadata": {"name": "forged", "annotations": {"fumarole.dev/devices": "nvidia0"}},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }))
    .unwrap();
    let choice_policy = "only fumarole's schedulers";
    // Once the RoleBinding is in force (RBAC follows it within moments), her own pod goes in.
    let plain: Pod = serde_json::from_value(json!({
        "metadata": {"name": "alices"},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }))
    .unwrap();
    eventually("alice may create pods", Duration::from_secs(10), || async {
        Ok(alice_pods.create(&PostParams::default(), &plain).await.ok())
    })
    .await
    .unwrap();
    let message = forbidden(
        "a user creates a pod with a device choice",
        alice_pods.create(&PostParams::default(), &forged).await,
    );
    assert!(message.contains(choice_policy), "{message}");
    let message = forbidden(
        "a user changes a pod's device choice",
        alice_pods
            .patch(
                "trainer",
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"metadata": {"annotations": {"fumarole.dev/devices": "nvidia7"}}}),
                ),
            )
            .await,
    );
    assert!(message.contains(choice_policy), "{message}");
    // Nor the extension's record of the job annotations it added (which it may replace).
    let message = forbidden(
        "a user records job annotations as the extension's",
        alice_pods
            .patch(
                "trainer",
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"metadata": {"annotations": {"fumarole.dev/job-annotations": "hccl/rankIndex"}}}),
                ),
            )
            .await,
    );
    assert!(
        message.contains("only fumarole's schedulers set fumarole.dev/job-annotations"),
        "{message}"
    );
    // Nor through pods/status, which keeps the annotations sent with a status update.
    let message = forbidden(
        "a user changes a pod's device choice through pods/status",
        alice_pods
            .patch_status(
                "trainer",
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"metadata": {"annotations": {"fumarole.dev/devices": "nvidia7"}}}),
                ),
            )
            .await,
    );
    assert!(message.contains(choice_policy), "{message}");
    // Huawei's NPU choice (huawei.com/<Ascend chip>), which the device plugins honour too.
    let ascend_policy = "set huawei.com/<Ascend chip>";
    let forged_npus: Pod = serde_json::from_value(json!({
        "metadata": {"name": "forged-npus", "annotations": {"huawei.com/Ascend910": "Ascend910-0"}},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }))
    .unwrap();
    let message = forbidden(
        "a user creates a pod with an NPU choice",
        alice_pods
            .create(&PostParams::default(), &forged_npus)
            .await,
    );
    assert!(message.contains(ascend_policy), "{message}");
    let message = forbidden(
        "a user sets an NPU choice on a pod",
        alice_pods
            .patch(
                "trainer",
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"metadata": {"annotations": {"huawei.com/Ascend910": "Ascend910-3"}}}),
                ),
            )
            .await,
    );
    assert!(message.contains(ascend_policy), "{message}");
    // Nor through a Binding (the API server copies its annotations onto the pod), while a
    // Binding without one goes through: she may bind, not choose devices.
    let binding = |annotations: Value| {
        json!({"apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": "alices", "annotations": annotations},
            "target": {"apiVersion": "v1", "kind": "Node", "name": "node-b"}})
    };
    let message = forbidden(
        "a user binds a pod with a device choice",
        alice_pods
            .create_subresource::<Value, Value>(
                "binding",
                "alices",
                &PostParams::default(),
                &binding(json!({"fumarole.dev/devices": "{\"nvidia.com/gpu\":[\"GPU-0\"]}"})),
            )
            .await,
    );
    assert!(message.contains(choice_policy), "{message}");
    alice_pods
        .create_subresource::<Value, Value>(
            "binding",
            "alices",
            &PostParams::default(),
            &binding(json!({"team": "ml"})),
        )
        .await
        .unwrap();
    let alices = alice_pods.get("alices").await.unwrap();
    assert_eq!(alices.spec.unwrap().node_name.as_deref(), Some("node-b"));
    assert_eq!(alices.metadata.annotations.unwrap()["team"], "ml");
    // The same user's other edits go through.
    alice_pods
        .patch(
            "trainer",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"team": "ml"}}})),
        )
        .await
        .unwrap();
    forbidden(
        "extension: write DeviceTopology",
        Api::<DeviceTopology>::all(as_ext.clone())
            .patch("node-b", &ssa, &Patch::Apply(topology("node-b")))
            .await,
    );
    forbidden(
        "extension: list secrets",
        Api::<Secret>::all(as_ext)
            .list(&ListParams::default())
            .await,
    );

    // Every metric the Grafana dashboard queries is one the two components export.
    let mut exported = std::collections::BTreeSet::new();
    for port in [agent_metrics, port] {
        let text = fumarole_e2e::cluster::http_get(port, "/metrics")
            .await
            .unwrap();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                exported.insert(rest.split(' ').next().unwrap().to_string());
            }
        }
    }
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(deploy_dir().join("grafana/fumarole.json")).unwrap(),
    )
    .unwrap();
    let mut queried = 0;
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().unwrap();
            for name in expr
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .filter(|w| w.starts_with("fumarole_"))
            {
                // Counters are exported as `name_total`, histograms as `name_bucket`.
                let family = name
                    .strip_suffix("_total")
                    .or_else(|| name.strip_suffix("_bucket"))
                    .unwrap_or(name);
                // These two need a node with pods and a kubepods cgroup to measure:
                // colocation_node.rs checks them.
                if MEASURED_ON_A_COLOCATION_NODE.contains(&family)
                    || measured_through_a_gpu_library(family)
                {
                    continue;
                }
                assert!(
                    exported.contains(family),
                    "{}: {name} is not exported (exported: {exported:?})",
                    panel["title"]
                );
                queried += 1;
            }
        }
    }
    assert!(queried >= 20, "{queried}");
    drop(ext);
    drop(agent);
}
