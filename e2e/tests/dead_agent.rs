//! What a dead agent leaves, against the real API server and kernel: the co-location agent
//! renews its heartbeat Lease, the scheduler extension's leader removes the
//! `volcano.sh/offline-job-evicting` taint and the `kubernetes.io/batch-*` resources from the
//! node of an agent whose Lease expired, and the agent writes its batch resources again when it
//! comes back.
//!
//! Both run as their ServiceAccounts from `deploy/daemonset` (the agent with a token bound to
//! its node), so the test also proves the RBAC and the node-scoped admission policy allow the
//! heartbeat and the clean-up, and that an agent may write no Lease but its own node's; and
//! that a Lease labelled with the node but named for another does not aim the clean-up at it.
//! Needs root and cgroup v1 `cpu`, `cpuacct` and `memory` hierarchies (the agent's batch
//! resources come from the kernel's usage counters); its skip is recorded otherwise.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use fumarole_e2e::cluster::{Identity, free_port};
use fumarole_e2e::colocation::{self, CgroupTree, config_map, event_seen};
use fumarole_e2e::fumarole::scheduler_ext_bin;
use fumarole_e2e::{NodeSpec, TestCluster};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Event, Node};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

const NODE: &str = "colo-dead";
/// Where deploy/daemonset installs the agent, the extension and the ConfigMap.
const NAMESPACE: &str = "fumarole-system";
const TAINT: &str = "volcano.sh/offline-job-evicting";
/// The agent's heartbeat lease duration in this test (the default is 40 s).
const LEASE_S: u64 = 4;

fn config() -> ConfigMap {
    config_map(&json!({"globalConfig": {"evictingConfig": {
        "monitorInterval": 1,
        // The machine's own memory pressure is not under test: PSI off.
        "evictingMemoryPressureThreshold": 100,
    }}}))
}

/// (taint, batch-cpu in capacity, batch-cpu in allocatable) on the Node.
async fn leftovers(nodes: &Api<Node>) -> (bool, bool, bool) {
    let node = nodes.get(NODE).await.unwrap();
    let taint = node
        .spec
        .and_then(|s| s.taints)
        .is_some_and(|t| t.iter().any(|t| t.key == TAINT && t.effect == "NoSchedule"));
    let status = node.status.unwrap_or_default();
    let has = |m: Option<std::collections::BTreeMap<String, _>>| {
        m.is_some_and(|m| m.contains_key("kubernetes.io/batch-cpu"))
    };
    (taint, has(status.capacity), has(status.allocatable))
}

async fn until(what: &str, secs: u64, mut check: impl AsyncFnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !check().await {
        assert!(
            start.elapsed() < Duration::from_secs(secs),
            "timed out: {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    start.elapsed()
}

async fn expired_events(events: &Api<Event>) -> bool {
    event_seen(events, |e| {
        e.reason.as_deref() == Some("AgentHeartbeatExpired")
            && e.involved_object.kind.as_deref() == Some("Node")
            && e.involved_object.name.as_deref() == Some(NODE)
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_agents_taint_and_batch_resources_go_when_its_heartbeat_expires() {
    let Some(tree) = CgroupTree::create(
        "dead",
        &["cpu", "cpuacct", "memory"],
        &[("cpuacct", "cpuacct.usage"), ("memory", "memory.stat")],
    ) else {
        return;
    };
    let cluster = TestCluster::start().await.unwrap();
    cluster.install_fumarole_crds().await.unwrap();
    let node = cluster
        .create_node(
            &NodeSpec::new(NODE)
                .capacity("cpu", "2")
                .capacity("memory", "4Gi")
                .label("volcano.sh/colocation", "true")
                .label("volcano.sh/oversubscription", "true"),
        )
        .await
        .unwrap();
    cluster.install_deploy_daemonset().await.unwrap();
    let configmaps: Api<ConfigMap> = Api::namespaced(cluster.client(), NAMESPACE);
    configmaps
        .replace(
            "volcano-agent-configuration",
            &PostParams::default(),
            &config(),
        )
        .await
        .unwrap();
    let nodes: Api<Node> = Api::all(cluster.client());
    let leases: Api<Lease> = Api::namespaced(cluster.client(), NAMESPACE);
    let events: Api<Event> = Api::all(cluster.client());

    // The extension as its ServiceAccount, electing a leader as deployed.
    let ext_id = Identity::service_account(NAMESPACE, "fumarole-scheduler-ext");
    let ext_kubeconfig = cluster.kubeconfig_for("ext.kubeconfig", &ext_id).unwrap();
    let port = free_port().unwrap();
    cluster
        .start_program(
            "fumarole-scheduler-ext",
            &scheduler_ext_bin().unwrap(),
            &[
                "serve".into(),
                format!("--kubeconfig={}", ext_kubeconfig.display()),
                format!("--listen=127.0.0.1:{port}"),
                "--ui-listen=off".into(),
                "--leader-elect-lease-duration=6s".into(),
                "--leader-elect-renew-deadline=4s".into(),
                "--leader-elect-retry-period=1s".into(),
            ],
            &[
                ("POD_NAME", "ext-0"),
                ("POD_NAMESPACE", NAMESPACE),
                ("RUST_LOG", "info"),
            ],
        )
        .unwrap();
    cluster
        .wait_ok(
            "the extension leads",
            &format!("http://127.0.0.1:{port}"),
            "/leaderz",
        )
        .await
        .unwrap();

    let agent_id = Identity::service_account(NAMESPACE, "fumarole-agent").on_node(NODE);
    let kubeconfig = cluster
        .kubeconfig_for("agent.kubeconfig", &agent_id)
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubelet = tree.kubelet_config(dir.path()).unwrap();
    tree.mkdir("cpu", "kubepods").unwrap();
    let run = |name| {
        colocation::agent(NODE, &kubelet, dir.path())
            .unwrap()
            .process(name)
            .kubeconfig(&kubeconfig)
            .flag("--colocation-config-namespace", NAMESPACE)
            .flag("--heartbeat-lease-duration", format!("{LEASE_S}s"))
    };
    let mut agent = run("fumarole-agent-1").spawn_in(&cluster).unwrap();

    // Alive: batch resources published, the heartbeat owned by the Node.
    until("batch-cpu published", 60, async || {
        leftovers(&nodes).await == (false, true, true)
    })
    .await;
    let lease = leases.get(&format!("fumarole-agent-{NODE}")).await.unwrap();
    let owner = &lease.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!((owner.kind.as_str(), owner.name.as_str()), ("Node", NODE));
    assert_eq!(Some(&owner.uid), node.metadata.uid.as_ref());
    assert_eq!(lease.spec.as_ref().unwrap().lease_duration_seconds, Some(4));
    // An agent writes only its own node's heartbeat (node-scoped-writes.yaml).
    let as_agent: Api<Lease> =
        Api::namespaced(cluster.client_for(&agent_id).await.unwrap(), NAMESPACE);
    for name in ["fumarole-agent-other-node", "fumarole-scheduler-ext"] {
        let mut other = lease.clone();
        other.metadata = kube::api::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        };
        let refused = as_agent
            .patch(
                name,
                &PatchParams::apply("test").force(),
                &Patch::Apply(&other),
            )
            .await;
        assert!(
            matches!(&refused, Err(kube::Error::Api(s)) if s.code == 403 || s.code == 422),
            "the agent of {NODE} wrote the Lease {name}: {refused:?}"
        );
    }
    // A Lease labelled with this node but named for another (written here as an admin; the
    // policy refuses it to agents, see the deployment e2e) that nobody renews: no heartbeat of
    // this node, so its expiry must not aim the clean-up at it.
    let mut aimed = lease.clone();
    aimed.metadata = kube::api::ObjectMeta {
        name: Some("fumarole-agent-aimed".into()),
        labels: lease.metadata.labels.clone(),
        ..Default::default()
    };
    leases.create(&PostParams::default(), &aimed).await.unwrap();
    // A live agent keeps what it wrote: three lease durations, nothing removed.
    tokio::time::sleep(Duration::from_secs(3 * LEASE_S)).await;
    assert_eq!(leftovers(&nodes).await, (false, true, true));
    assert!(!expired_events(&events).await);

    // Killed (SIGKILL: no goodbye), having just tainted its node under pressure; the taint is
    // written here, as the agent writes it, because a live agent removes it once the load
    // falls.
    agent.kill();
    let killed = Instant::now();
    nodes
        .patch(
            NODE,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"taints": [
                {"key": TAINT, "value": "true", "effect": "NoSchedule"}]}})),
        )
        .await
        .unwrap();
    assert_eq!(leftovers(&nodes).await, (true, true, true));
    until(
        "the dead agent's taint and batch resources removed",
        60,
        async || leftovers(&nodes).await == (false, false, false),
    )
    .await;
    let removed_after = killed.elapsed();
    // Not before the lease could expire (the last renewal was at most a quarter earlier).
    assert!(
        removed_after >= Duration::from_secs(LEASE_S) * 3 / 4,
        "removed {removed_after:?} after the kill, before the heartbeat could expire"
    );
    until(
        "the AgentHeartbeatExpired Event on the Node",
        30,
        async || expired_events(&events).await,
    )
    .await;

    // Back: it renews its heartbeat and publishes batch resources again, and nothing removes
    // them while it lives.
    let _agent = run("fumarole-agent-2").spawn_in(&cluster).unwrap();
    let back = until("batch-cpu published again", 60, async || {
        leftovers(&nodes).await == (false, true, true)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3 * LEASE_S)).await;
    assert_eq!(leftovers(&nodes).await, (false, true, true));
    cluster.check_processes().unwrap();
    println!(
        "heartbeat {LEASE_S} s: taint and batch resources removed {removed_after:.1?} after SIGKILL; \
         batch resources back {back:.1?} after the restart"
    );
}
