//! Starting the node's device plugins, keeping their health and link weights equal to the
//! node's health stream, and counting what became of the scheduler's device choices
//! ([`ChoiceMetrics`]); and starting the DRA kubelet plugin for the devices the config serves
//! through DRA ([`start_dra`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};
use fumarole_device_plugin::admission::Outcome;
use fumarole_device_plugin::config::Config;
use fumarole_device_plugin::dra::claims::ClaimReader;
use fumarole_device_plugin::dra::node::{DraNode, Partitioner};
use fumarole_device_plugin::dra::serve::{self as dra_serve, DraDirs, DraServer};
use fumarole_device_plugin::plugin::{DevicePluginService, Pods};
use fumarole_device_plugin::register;
use fumarole_device_plugin::resources::{self, Resource};
use fumarole_topology::{NodeHealth, NodeTopology};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use tokio::sync::watch;

/// `fumarole_device_choice_total{resource, outcome}`: what became of the scheduler extension's
/// device choice per container (`honoured`, `no-choice`, `invalid`, `not-honoured`,
/// `differs`, `no-choice-in-time`, `overruled`; see `fumarole_device_plugin::admission::Outcome`).
#[derive(Debug, Default)]
pub struct ChoiceMetrics {
    total: Family<Vec<(String, String)>, Counter>,
}

impl ChoiceMetrics {
    /// The counter, registered in `registry` (names under its `fumarole` prefix).
    pub fn register(registry: &mut Registry) -> Arc<Self> {
        let m = Self::default();
        registry.register(
            "device_choice",
            "What became of the scheduler's device choice, per container",
            m.total.clone(),
        );
        Arc::new(m)
    }

    pub fn count(&self, resource: &str, outcome: &Outcome) {
        self.total
            .get_or_create(&vec![
                ("resource".to_string(), resource.to_string()),
                ("outcome".to_string(), outcome.label().to_string()),
            ])
            .inc();
    }
}

/// The resources of `topology` under the `--device-plugin-config` file `config` (resource
/// names, env vars, device nodes per device class), their device nodes looked up under `root`.
pub fn resources(
    topology: &NodeTopology,
    root: &Path,
    cdi: bool,
    config: Option<&Path>,
) -> Result<Vec<Resource>> {
    let config = match config {
        Some(path) => Config::load(path).context("--device-plugin-config")?,
        None => Config::default(),
    };
    resources::resources_with(topology, root, cdi, &config).context("--device-plugin-config")
}

/// Each served device and the device nodes it needs: what the device-node health source
/// checks (a device is healthy while they all exist).
pub fn dev_nodes(resources: &[Resource]) -> Vec<(String, Vec<String>)> {
    resources
        .iter()
        .flat_map(|r| {
            r.devices
                .iter()
                .map(|d| (d.id.clone(), d.dev_nodes.clone()))
        })
        .collect()
}

/// Serves one plugin per resource in `dir`, registered with the kubelet there. Device health
/// and link weights follow the node's health stream `health` over `topology` (the node as
/// discovered). With `pods`, the scheduler's device choice for the pod being admitted is
/// honoured (or its fate reported).
pub fn start(
    topology: &NodeTopology,
    resources: Vec<Resource>,
    dir: PathBuf,
    pods: Option<Pods>,
    health: &watch::Receiver<NodeHealth>,
) -> Result<()> {
    std::fs::create_dir_all(&dir)
        .with_context(|| format!("--device-plugin-dir {}", dir.display()))?;
    for resource in resources {
        let (service, tx) = DevicePluginService::new(topology, resource.clone(), pods.clone())
            .with_context(|| format!("building the {} plugin", resource.name))?;
        tracing::info!(resource = %resource.name, devices = resource.devices.len(), "serving device plugin");
        let dir = dir.clone();
        let served = service.clone();
        tokio::spawn(async move {
            if let Err(e) = register::serve(dir, served).await {
                tracing::error!(error = %e, "device plugin stopped");
            }
        });
        tokio::spawn(follow_health(service, topology.clone(), tx, health.clone()));
    }
    Ok(())
}

/// Serves the DRA kubelet plugin for `resources` (the DRA half of
/// `fumarole_device_plugin::resources::split`) of node `node_name`, claims read through
/// `claims`. `None` when no device is served through DRA. The servers run while the
/// returned [`DraServer`] is kept.
pub fn start_dra(
    node_name: &str,
    topology: &NodeTopology,
    resources: Vec<Resource>,
    dirs: &DraDirs,
    claims: Arc<dyn ClaimReader>,
    partitioner: Option<Arc<dyn Partitioner>>,
) -> Result<Option<DraServer>> {
    if resources.iter().all(|r| r.devices.is_empty()) {
        return Ok(None);
    }
    let devices: usize = resources.iter().map(|r| r.devices.len()).sum();
    let mut node = DraNode::new(node_name, topology.clone(), resources);
    if let Some(p) = partitioner {
        node = node.with_partitioner(p);
    }
    let server = dra_serve::start(dirs, node, claims).with_context(|| {
        format!(
            "serving the DRA plugin (--dra-registry-dir {}, --dra-plugins-dir {}, --cdi-dir {})",
            dirs.registry.display(),
            dirs.plugins.display(),
            dirs.cdi.display()
        )
    })?;
    tracing::info!(devices, drivers = ?server.drivers(), "DRA kubelet plugin started");
    Ok(Some(server))
}

/// Keeps one plugin's device health (what `ListAndWatch` sends the kubelet) and link weights
/// (what `GetPreferredAllocation`'s `select` uses) equal to what the health stream says.
async fn follow_health(
    service: DevicePluginService,
    topology: NodeTopology,
    devices: watch::Sender<Vec<bool>>,
    mut health: watch::Receiver<NodeHealth>,
) {
    let name = service.resource().name.clone();
    loop {
        let now = health.borrow_and_update().clone();
        let healthy: Vec<bool> = service
            .resource()
            .devices
            .iter()
            .map(|d| now.is_healthy(d.health_id()))
            .collect();
        devices.send_if_modified(|current| {
            if *current == healthy {
                return false;
            }
            for (d, (was, is)) in service
                .resource()
                .devices
                .iter()
                .zip(current.iter().zip(&healthy))
            {
                if was != is {
                    tracing::warn!(resource = %name, device = %d.id, healthy = is, "device health changed");
                }
            }
            current.clone_from(&healthy);
            true
        });
        match service.update_links(&topology.with_health(&now)) {
            Ok(true) => {
                tracing::info!(resource = %name, "link weights changed: select uses the new ones")
            }
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(resource = %name, error = %e, "link weights unusable: keeping the last ones")
            }
        }
        if health.changed().await.is_err() {
            return;
        }
    }
}
