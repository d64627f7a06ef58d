//! Fixture nodes as a cluster runs them: for each [`FleetNode`] a Node object, a harness node
//! (the kubelet's own device and topology managers, [`HarnessNode`]) and `fumarole-agent run`
//! on one of the agent's bundled fixtures, in its super-node. Shared by the device-chain tests
//! ([`crate::chain`]) and the demo (`fumarole-demo`).

use std::time::Duration;

use anyhow::{Context, Result};

use crate::agent::AgentBuilder;
use crate::cluster::{NodeSpec, TestCluster, free_port};
use crate::harness_node::HarnessNode;

/// One node of the fleet.
#[derive(Debug, Clone)]
pub struct FleetNode {
    pub name: String,
    /// A fixture of `fumarole-agent discover --list-fixtures` (e.g. `dgx-h100`).
    pub fixture: String,
    /// The super-node the agent reports (`--super-node`); none when `None`.
    pub super_node: Option<String>,
    /// The extended resource the node's devices are advertised as, and how many there are:
    /// [`start`] waits until the node's kubelet has them all.
    pub resource: String,
    pub devices: i64,
    /// The Node's CPU and memory capacity.
    pub cpu: String,
    pub memory: String,
    /// Labels of the Node object (e.g. `fumarole.dev/node-pool`).
    pub labels: Vec<(String, String)>,
}

impl FleetNode {
    pub fn new(name: &str, fixture: &str, resource: &str, devices: i64) -> Self {
        FleetNode {
            name: name.into(),
            fixture: fixture.into(),
            super_node: None,
            resource: resource.into(),
            devices,
            cpu: "224".into(),
            memory: "2Ti".into(),
            labels: Vec::new(),
        }
    }

    pub fn super_node(mut self, super_node: &str) -> Self {
        self.super_node = Some(super_node.into());
        self
    }

    pub fn capacity(mut self, cpu: &str, memory: &str) -> Self {
        self.cpu = cpu.into();
        self.memory = memory.into();
        self
    }

    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.labels.push((key.into(), value.into()));
        self
    }
}

/// Starts every node (Node object, harness node, agent with `agent_args` on top of the
/// defaults) and waits until each node's kubelet has all its devices allocatable.
pub async fn start(
    cluster: &TestCluster,
    nodes: &[FleetNode],
    agent_args: &[&str],
) -> Result<Vec<HarnessNode>> {
    let mut harness = Vec::new();
    for n in nodes {
        let spec = n.labels.iter().fold(
            NodeSpec::new(&n.name)
                .capacity("cpu", &n.cpu)
                .capacity("memory", &n.memory),
            |spec, (k, v)| spec.label(k, v),
        );
        cluster.create_node(&spec).await?;
        let h = cluster.start_harness_node(&n.name).await?;
        let mut agent = AgentBuilder::fixture(&n.fixture)
            .process(&format!("fumarole-agent-{}", n.name))
            .node(&n.name)
            .device_plugin_dir(h.plugin_dir())
            .metrics_on_port(free_port()?)
            .without_host_kubelet(cluster.root());
        if let Some(s) = &n.super_node {
            agent = agent.flag("--super-node", s);
        }
        agent.args(agent_args).start_in(cluster)?;
        harness.push(h);
    }
    for (h, n) in harness.iter().zip(nodes) {
        h.wait_allocatable(&n.resource, n.devices, Duration::from_secs(120))
            .await
            .with_context(|| format!("node {} ({})", n.name, n.fixture))?;
    }
    Ok(harness)
}
