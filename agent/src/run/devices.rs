//! Starting the node's devices in `fumarole-agent run`: which resources it serves
//! ([`served`], known before the health sources start, since they watch those resources'
//! device nodes), then the DRA kubelet plugin and the device plugins ([`start`]), each with
//! its settings ([`DeviceSettings`]). [`crate::plugins`] does the serving.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use fumarole_device_plugin::admission::PodSource;
use fumarole_device_plugin::dra::claims::KubeClaims;
use fumarole_device_plugin::dra::node::Partitioner;
use fumarole_device_plugin::dra::serve::{DraDirs, DraServer};
use fumarole_device_plugin::plugin::Pods;
use fumarole_device_plugin::resources::{Resource, split};
use fumarole_device_plugin::settings::DevicePluginSettings;
use fumarole_exporter::device_health::HealthStream;
use fumarole_exporter::device_health::sources::ascend_devices;
use fumarole_exporter::mig::MigLibrary;
use fumarole_exporter::publish::{DraSlices, LatestAllocations};
use fumarole_exporter::vnpu::VnpuLibrary;
use fumarole_topology::NodeTopology;
use fumarole_topology::crd::SharingInfo;

use super::partitions::LibraryPartitions;
use crate::node::NvmlSource;
use crate::{plugins, pods};

/// The devices' settings: the device plugins' and the DRA plugin's.
#[derive(Clone, Debug)]
pub struct DeviceSettings {
    pub plugins: DevicePluginSettings,
    pub dra: DraDirs,
    /// Where NVIDIA answers come from: with the library, DRA claims on MIG partitions are
    /// prepared by making the instances through it.
    pub nvml: NvmlSource,
    /// The DCMI library (as the health source loads it), through which DRA claims on vNPU
    /// partitions are prepared; `None`: none on this node.
    pub dcmi: Option<PathBuf>,
}

/// The resources the node serves (device plugins and DRA together) under the device-plugin
/// configuration, their device nodes looked up under `root`.
pub fn served(
    settings: &DevicePluginSettings,
    topology: &NodeTopology,
    root: &Path,
) -> Result<Vec<Resource>> {
    plugins::resources(topology, root, settings.cdi, settings.config.as_deref())
}

/// What runs once the devices are started.
pub struct Devices {
    /// The DRA kubelet plugin, while it runs.
    dra: Option<DraServer>,
    /// The ids of the devices the DRA plugin serves (what the ResourceSlices list).
    dra_devices: Option<BTreeSet<String>>,
    /// Of those, the ones several claims may hold at once (`draShares`), with how many.
    dra_shares: BTreeMap<String, u32>,
    /// Of those, the ones published as partitionable devices (`draPartitions`).
    dra_partitioned: BTreeSet<String>,
    /// Devices the device plugins offer in replicas, by id.
    sharing: BTreeMap<String, SharingInfo>,
}

impl Devices {
    /// Nothing served.
    pub fn none() -> Self {
        Self {
            dra: None,
            dra_devices: None,
            dra_shares: BTreeMap::new(),
            dra_partitioned: BTreeSet::new(),
            sharing: BTreeMap::new(),
        }
    }

    /// Devices the device plugins offer in replicas (`DeviceTopology` says so).
    pub fn sharing(&self) -> &BTreeMap<String, SharingInfo> {
        &self.sharing
    }

    /// The ResourceSlices node `node` publishes: the devices the DRA plugin serves, if it
    /// runs.
    pub fn dra_slices(&self, node: &str) -> Option<DraSlices> {
        self.dra_devices.as_ref().map(|devices| DraSlices {
            node: node.to_string(),
            devices: devices.clone(),
            shares: self.dra_shares.clone(),
            partitioned: self.dra_partitioned.clone(),
        })
    }

    /// Stops the DRA plugin: removes its sockets (the kubelet deregisters the drivers), lets
    /// requests in flight finish, but does not wait on the kubelet for long.
    pub async fn shutdown(self) {
        if let Some(server) = self.dra
            && tokio::time::timeout(Duration::from_secs(5), server.shutdown())
                .await
                .is_err()
        {
            tracing::warn!("DRA plugin requests still in flight after 5 s: stopping anyway");
        }
    }
}

/// Serves `resources` of node `node_name` (as [`served`] found them on `topology`): the DRA
/// half through the DRA kubelet plugin (claims read with `client`), the rest through the
/// device plugins when `settings` name their directory and the node's pods are watched
/// (`node_pods`, which learn the kubelet's `allocations`). Device health follows `health`.
pub fn start(
    settings: &DeviceSettings,
    node_name: &str,
    client: &kube::Client,
    (resources, topology): (Vec<Resource>, NodeTopology),
    node_pods: Option<&Arc<pods::NodePods>>,
    allocations: &LatestAllocations,
    health: &HealthStream,
) -> Result<Devices> {
    let (device_plugin, dra) = split(resources);
    // What the DRA plugin serves is what the ResourceSlices list.
    let dra_devices: BTreeSet<String> = dra
        .iter()
        .flat_map(|r| &r.devices)
        .map(|d| d.id.clone())
        .collect();
    let dra_shares: BTreeMap<String, u32> = dra
        .iter()
        .flat_map(|r| &r.devices)
        .filter_map(|d| Some((d.id.clone(), d.dra_shares?)))
        .collect();
    let dra_partitioned = partitioned(&dra, &topology);
    let mut sharing = BTreeMap::new();
    let partitioner = (!dra_partitioned.is_empty()).then(|| {
        let mig = match &settings.nvml {
            NvmlSource::Library(path) => Some(MigLibrary::new(path.clone())),
            NvmlSource::Recorded => None,
        };
        let vnpu = settings
            .dcmi
            .clone()
            .map(|path| VnpuLibrary::new(path, ascend_devices(&topology)));
        Arc::new(LibraryPartitions { mig, vnpu }) as Arc<dyn Partitioner>
    });
    let server = plugins::start_dra(
        node_name,
        &topology,
        dra,
        &settings.dra,
        Arc::new(KubeClaims::new(client.clone())),
        partitioner,
    )?;
    let dra_devices = server.as_ref().map(|_| dra_devices);
    if let Some(dir) = settings.plugins.dir.clone()
        && let Some(node_pods) = node_pods
    {
        node_pods.set_allocations(allocations.clone());
        sharing = device_plugin
            .iter()
            .flat_map(Resource::sharing_info)
            .collect();
        let pods = Pods {
            source: node_pods.clone() as Arc<dyn PodSource>,
            await_choice: settings.plugins.await_choice.clone(),
        };
        plugins::start(
            &topology,
            device_plugin,
            dir,
            Some(pods),
            &health.subscribe(),
        )?;
    }
    Ok(Devices {
        dra: server,
        dra_devices,
        dra_shares,
        dra_partitioned,
        sharing,
    })
}

/// The DRA devices published as partitionable (`draPartitions`); a device whose model has no
/// partition table is published whole, with a warning.
fn partitioned(dra: &[Resource], topology: &NodeTopology) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for d in dra
        .iter()
        .flat_map(|r| &r.devices)
        .filter(|d| d.dra_partitions)
    {
        let model = topology.devices.get(d.position).map(|t| t.model.as_str());
        match model {
            Some(m) if fumarole_topology::share::Catalogue::for_model(m).is_some() => {
                out.insert(d.id.clone());
            }
            _ => tracing::warn!(
                device = %d.id,
                model = model.unwrap_or_default(),
                "draPartitions: no MIG or vNPU partition table for this model; published whole"
            ),
        }
    }
    out
}
