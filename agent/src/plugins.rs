//! Starting the node's device plugins, keeping their health current, and counting what became
//! of the scheduler's device choices ([`ChoiceMetrics`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use fumarole_device_plugin::admission::Outcome;
use fumarole_device_plugin::config::Config;
use fumarole_device_plugin::plugin::{DevicePluginService, Pods};
use fumarole_device_plugin::register;
use fumarole_device_plugin::resources::{self, Resource};
use fumarole_topology::NodeTopology;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use tokio::sync::{Notify, watch};

/// `fumarole_device_choice_total{resource, outcome}`: what became of the scheduler extension's
/// device choice per container (`honoured`, `no-choice`, `invalid`, `not-honoured`,
/// `differs`, `no-choice-in-time`; see `fumarole_device_plugin::admission::Outcome`).
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

/// How often device nodes are checked; a health change reaches the kubelet within this.
const HEALTH_POLL: Duration = Duration::from_millis(500);

/// Serves one plugin per resource of `topology` in `dir`, registered with the kubelet there.
/// Device health follows the device nodes under `root`; `on_change` is poked when it changes.
/// With `pods`, the scheduler's device choice for the pod being admitted is honoured (or its
/// fate reported). `config` is the
/// `--device-plugin-config` file (resource names, env vars, device nodes per device class).
pub fn start(
    topology: &NodeTopology,
    root: &Path,
    dir: PathBuf,
    cdi: bool,
    on_change: Option<Arc<Notify>>,
    pods: Option<Pods>,
    config: Option<&Path>,
) -> Result<()> {
    let config = match config {
        Some(path) => Config::load(path).context("--device-plugin-config")?,
        None => Config::default(),
    };
    let resources = resources::resources_with(topology, root, cdi, &config)
        .context("--device-plugin-config")?;
    std::fs::create_dir_all(&dir)
        .with_context(|| format!("--device-plugin-dir {}", dir.display()))?;
    for resource in resources {
        let (service, health) = DevicePluginService::new(topology, resource.clone(), pods.clone())
            .with_context(|| format!("building the {} plugin", resource.name))?;
        tracing::info!(resource = %resource.name, devices = resource.devices.len(), "serving device plugin");
        let dir = dir.clone();
        tokio::spawn(async move {
            if let Err(e) = register::serve(dir, service).await {
                tracing::error!(error = %e, "device plugin stopped");
            }
        });
        tokio::spawn(watch_health(
            resource,
            root.to_path_buf(),
            health,
            on_change.clone(),
        ));
    }
    Ok(())
}

/// A device is healthy while all its device nodes exist; a node that comes back makes the
/// device healthy again (the kubelet sees both directions).
async fn watch_health(
    resource: Resource,
    root: PathBuf,
    health: watch::Sender<Vec<bool>>,
    on_change: Option<Arc<Notify>>,
) {
    loop {
        tokio::time::sleep(HEALTH_POLL).await;
        let now: Vec<bool> = resource
            .devices
            .iter()
            .map(|d| {
                d.dev_nodes
                    .iter()
                    .all(|n| root.join(n.trim_start_matches('/')).exists())
            })
            .collect();
        let changed = health.send_if_modified(|current| {
            if *current == now {
                return false;
            }
            for (d, (was, is)) in resource.devices.iter().zip(current.iter().zip(&now)) {
                if was != is {
                    tracing::warn!(resource = %resource.name, device = %d.id, healthy = is, "device health changed");
                }
            }
            *current = now.clone();
            true
        });
        if changed && let Some(n) = &on_change {
            n.notify_one();
        }
    }
}
