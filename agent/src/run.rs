//! `fumarole-agent run`: the DaemonSet's long-running job. Discovers the node, publishes its
//! `Numatopology`, `NodeResourceTopology`, `DeviceTopology` and labels, keeps them current,
//! serves `/metrics` and `/healthz`, and, with `--device-plugin-dir`, the device plugins.
//! Devices the `--device-plugin-config` says `servedBy: dra` (or `both`) are served by the DRA
//! kubelet plugin ([`fumarole_device_plugin::dra`]), registered in `--dra-registry-dir`.
//! `--standalone` serves only the device plugins, with no API server. `--colocation` also does
//! volcano-agent's job for this node ([`fumarole_colocation::tasks`]): QoS levels and CPU burst
//! on the pods' cgroups, batch resources, pressure taint and eviction, configured by the
//! `volcano-agent-configuration` ConfigMap.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args;
use fumarole_colocation::cgroup;
use fumarole_colocation::metrics::ColocationMetrics;
use fumarole_colocation::watched::Watched;
use fumarole_device_plugin::admission::{AwaitChoice, PodSource};
use fumarole_device_plugin::dra::claims::KubeClaims;
use fumarole_device_plugin::dra::serve::{self as dra_serve, DraDirs};
use fumarole_device_plugin::plugin::Pods;
use fumarole_device_plugin::resources::split;
use fumarole_exporter::discover;
use fumarole_exporter::kubelet::config::parse_reserved_memory_flag;
use fumarole_exporter::kubelet::{KubeletConfig, KubeletPaths};
use fumarole_exporter::publish::{self, Publisher, metrics, metrics::Metrics, state::NodeState};
use fumarole_topology::crd::ColocationStatus;
use fumarole_topology::{SuperNode, SuperNodeSource};
use k8s_openapi::api::core::v1::Node;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::watcher;
use tokio::sync::{Notify, watch};

use fumarole_exporter::health::HealthStream;
use fumarole_exporter::health::dcmi::ServerAnswers;
use fumarole_exporter::health::nvml::NvmlSession;
use fumarole_topology::NodeTopology;

use crate::health::{self, HealthArgs};
use crate::node::{NodeArgs, NvmlSource, Prepared};
use crate::{plugins, pods};

#[derive(Args)]
pub struct RunArgs {
    #[command(flatten)]
    node: NodeArgs,
    /// This node's name (the Node object and every published object are named after it).
    /// Required unless `--standalone`.
    #[arg(long, env = "NODE_NAME")]
    node_name: Option<String>,
    /// Serve the device plugins only, with no Kubernetes API calls (demos, node bring-up,
    /// tests): needs `--device-plugin-dir`.
    #[arg(long, requires = "device_plugin_dir")]
    standalone: bool,
    /// Serve the node's device plugins in this directory and register them with the kubelet
    /// answering on `DIR/kubelet.sock` (usually /var/lib/kubelet/device-plugins).
    #[arg(long, value_name = "DIR")]
    device_plugin_dir: Option<PathBuf>,
    /// Also answer `Allocate` with CDI device names (`<resource>=<device id>`).
    #[arg(long)]
    cdi: bool,
    /// Device-plugin configuration (YAML): resource names, env vars and device nodes per
    /// device class; see the `fumarole_device_plugin::config` docs.
    #[arg(long, value_name = "FILE")]
    device_plugin_config: Option<PathBuf>,
    /// Schedulers (`spec.schedulerName`) that write the scheduler extension's device choice
    /// after binding (Volcano v1.10 binds without telling the extension): the device plugin
    /// waits for the choice of their pods before choosing itself. Comma-separated.
    #[arg(
        long,
        value_name = "NAMES",
        value_delimiter = ',',
        default_value = "volcano"
    )]
    await_device_choice_from: Vec<String>,
    /// Longest wait, at admission, for a pod the agent has not seen yet or a choice not
    /// written yet; then the plugin chooses and says why (an Event on the pod).
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = humantime::parse_duration)]
    await_device_choice_timeout: Duration,
    /// The kubelet configuration file.
    #[arg(
        long,
        value_name = "FILE",
        default_value = "/var/lib/kubelet/config.yaml"
    )]
    kubelet_config: PathBuf,
    /// The kubelet's per-NUMA memory reservation in its `--reserved-memory` syntax
    /// (`0:memory=1Gi,hugepages-1Gi=2Gi;1:memory=2Gi`, repeatable), for kubelets that set it by
    /// flag; replaces `reservedMemory` of the kubelet configuration file. NodeResourceTopology's
    /// per-zone allocatable memory subtracts it.
    #[arg(long, value_name = "NUMA:RESOURCE=QUANTITY,...")]
    reserved_memory: Vec<String>,
    /// The kubelet PodResources socket.
    #[arg(
        long,
        value_name = "FILE",
        default_value = "/var/lib/kubelet/pod-resources/kubelet.sock"
    )]
    pod_resources_socket: PathBuf,
    /// The kubelet CPU manager checkpoint (fallback when PodResources is unavailable).
    #[arg(
        long,
        value_name = "FILE",
        default_value = "/var/lib/kubelet/cpu_manager_state"
    )]
    cpu_manager_state: PathBuf,
    /// How often to re-check that the published objects are current.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = humantime::parse_duration)]
    recheck_interval: Duration,
    /// Node label whose value is this node's super-node id (read from the Node at start; the
    /// `--super-node` flag wins over it, it wins over the override file and the hardware: the
    /// NVLink fabric, an Ascend A3 chip's super-pod id from DCMI).
    #[arg(long, value_name = "KEY")]
    super_node_label: Option<String>,
    /// Also label the Node with the keys other projects' tools select nodes by: NVIDIA
    /// gpu-feature-discovery's `nvidia.com/gpu.*`, `nvidia.com/cuda.*`, `nvidia.com/mig.capable`
    /// (same keys and value formats) and Ascend's `accelerator` (docs/labels.md). Off by
    /// default: with GFD installed too, both would write the same keys.
    #[arg(long)]
    compat_labels: bool,
    /// Also publish what Huawei's Ascend scheduler plugin (ascend-for-volcano, per-node mode)
    /// reads, on nodes with Ascend NPUs: the ConfigMap `kube-system/mindx-dl-deviceinfo-<node>`
    /// (device lists by health, super-pod id and server index) and the labels `accelerator`
    /// and `accelerator-type` (docs/labels.md). Off by default: do not turn it on where
    /// Huawei's device plugin runs too (both would write the ConfigMap).
    #[arg(long)]
    ascend_device_info: bool,
    /// Address of `/metrics` and `/healthz`.
    #[arg(long, value_name = "ADDR", default_value = "0.0.0.0:9400")]
    metrics_addr: SocketAddr,
    #[command(flatten)]
    health: HealthArgs,
    #[command(flatten)]
    dra: DraArgs,
    #[command(flatten)]
    colocation: ColocationArgs,
}

/// The DRA kubelet plugin, served for the devices whose `--device-plugin-config` entry says
/// `servedBy: dra` or `both` (none by default).
#[derive(Args)]
struct DraArgs {
    /// The kubelet's plugin registry: the DRA plugin's registration sockets
    /// (`<driver>-reg.sock`) go here.
    #[arg(long, value_name = "DIR", env = "DRA_REGISTRY_DIR", default_value = dra_serve::DEFAULT_REGISTRY_DIR)]
    dra_registry_dir: PathBuf,
    /// The kubelet's plugins directory: the DRA service sockets go in `DIR/<driver>/dra.sock`.
    #[arg(long, value_name = "DIR", env = "DRA_PLUGINS_DIR", default_value = dra_serve::DEFAULT_PLUGINS_DIR)]
    dra_plugins_dir: PathBuf,
    /// Where the DRA plugin writes a prepared claim's CDI spec (the container runtime's CDI
    /// spec directory).
    #[arg(long, value_name = "DIR", env = "CDI_DIR", default_value = dra_serve::DEFAULT_CDI_DIR)]
    cdi_dir: PathBuf,
}

impl DraArgs {
    fn dirs(&self) -> DraDirs {
        DraDirs {
            registry: self.dra_registry_dir.clone(),
            plugins: self.dra_plugins_dir.clone(),
            cdi: self.cdi_dir.clone(),
        }
    }
}

/// Co-location (what volcano-agent does): QoS levels, CPU burst, oversubscription, eviction.
#[derive(Args)]
struct ColocationArgs {
    /// Do volcano-agent's job on this node: `volcano.sh/qos-level` and CPU burst on the pod
    /// cgroups, batch resources, pressure taint and eviction of offline pods, as the
    /// `volcano-agent-configuration` ConfigMap and the node's labels enable them.
    #[arg(long)]
    colocation: bool,
    /// Namespace of the `volcano-agent-configuration` ConfigMap and of the heartbeat Lease.
    #[arg(
        long,
        value_name = "NAMESPACE",
        env = "COLOCATION_CONFIG_NAMESPACE",
        default_value = "volcano-system"
    )]
    colocation_config_namespace: String,
    /// How long the node's heartbeat Lease (`fumarole-agent-<node>`, in the
    /// --colocation-config-namespace) lasts without renewal; renewed four times as often.
    /// Once it expires the scheduler extension removes the taint and batch resources this
    /// agent left on the Node.
    #[arg(long, value_name = "DURATION", default_value = "40s", value_parser = parse_lease_duration)]
    heartbeat_lease_duration: Duration,
    /// The node's memory pressure (PSI) file, an earlier eviction signal than usage.
    #[arg(long, value_name = "FILE", default_value = "/proc/pressure/memory")]
    memory_pressure_file: PathBuf,
    /// How often to re-apply the cgroup settings (pod and config changes also trigger a round).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = humantime::parse_duration)]
    qos_interval: Duration,
    /// Where the cgroup filesystems are mounted.
    #[arg(long, value_name = "DIR", default_value = cgroup::DEFAULT_ROOT)]
    cgroup_root: PathBuf,
    /// The mount table that tells cgroup v1 from v2.
    #[arg(long, value_name = "FILE", default_value = cgroup::DEFAULT_MOUNTINFO)]
    cgroup_mountinfo: PathBuf,
    /// The kubelet's cgroup driver (`cgroupfs` or `systemd`); default: the kubelet config's
    /// `cgroupDriver`, else whichever kubepods cgroup exists.
    #[arg(long, value_name = "DRIVER")]
    cgroup_driver: Option<String>,
    /// The kubelet's `cgroupRoot` (the cgroup `kubepods` lives under); default: the kubelet
    /// config's, else `/`.
    #[arg(long, value_name = "CGROUP")]
    kubelet_cgroup_root: Option<String>,
}

impl ColocationArgs {
    /// The cgroup settings, with what the flags leave open taken from the kubelet
    /// configuration, and whether the kubelet gives Guaranteed pods exclusive CPUs
    /// (`cpuManagerPolicy: static`).
    fn settings(&self, kubelet_config: &Path) -> (cgroup::Settings, bool) {
        let kubelet = std::fs::read_to_string(kubelet_config)
            .map_err(|e| e.to_string())
            .and_then(|text| {
                serde_norway::from_str::<KubeletConfig>(&text).map_err(|e| e.to_string())
            })
            .inspect_err(|e| {
                tracing::warn!(file = %kubelet_config.display(), error = %e, "co-location: kubelet config unreadable; detecting the cgroup driver, assuming no static CPU manager")
            })
            .unwrap_or_default();
        let settings = cgroup::Settings {
            cgroup_root: self.cgroup_root.clone(),
            mountinfo: self.cgroup_mountinfo.clone(),
            driver: self.cgroup_driver.clone().or(kubelet.cgroup_driver),
            kubelet_cgroup_root: self.kubelet_cgroup_root.clone().or(kubelet.cgroup_root),
        };
        let static_cpu_manager = kubelet.cpu_manager_policy.as_deref() == Some("static");
        (settings, static_cpu_manager)
    }
}

pub fn run(args: RunArgs) -> Result<()> {
    // Before any thread: hwloc reads its root from the environment.
    let prepared = args.node.prepare(args.node_name.clone())?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    if args.standalone {
        return runtime.block_on(standalone(args, prepared));
    }
    let Some(node_name) = args.node_name.clone() else {
        bail!("--node-name (or NODE_NAME) is required unless --standalone");
    };
    runtime.block_on(async move {
        let mut config = kube::Config::infer()
            .await
            .context("finding the API server (in-cluster config or KUBECONFIG)")?;
        // No retries inside the client: kube's start 5 ms apart and grow from there, a burst per
        // call on every 5xx. Each loop retries on its own, spread out (the publisher's jittered
        // backoff with Retry-After as a floor, the watches' jittered exponential backoff).
        config.default_retry = false;
        let client = kube::Client::try_from(config).context("building the API client")?;
        let mut prepared = prepared;
        if let Some(key) = &args.super_node_label
            && prepared.options.super_node.is_none()
        {
            prepared.options.super_node = super_node_from_label(&client, &node_name, key).await?;
        }
        // The co-location metrics are on /metrics with or without --colocation.
        let (metrics, (colocation_metrics, choice_metrics, fault_metrics)) =
            Metrics::new(args.recheck_interval, |registry| {
                (
                    ColocationMetrics::register(registry),
                    plugins::ChoiceMetrics::register(registry),
                    health::DeviceFaultMetrics::register(registry),
                )
            });
        let listener = tokio::net::TcpListener::bind(args.metrics_addr)
            .await
            .with_context(|| format!("--metrics-addr {}", args.metrics_addr))?;
        tokio::spawn(metrics::serve(listener, metrics.clone()));

        let stream = HealthStream::new();
        // The DCMI source's answer to the super-pod query (A3 hardware), for publishing.
        let (super_pod_tx, super_pod) = watch::channel(None);
        // Its chips' chip info (the servertype and npu.chip.name labels).
        let (chip_info_tx, chip_info) = watch::channel(None);
        let mut resources = None;
        // The config may serve devices through DRA even without device plugins.
        let serves_devices =
            args.device_plugin_dir.is_some() || args.device_plugin_config.is_some();
        match discover_node(&args, &mut prepared) {
            Ok((topology, session)) => {
                if serves_devices {
                    resources = Some((
                        plugins::resources(
                            &topology,
                            root_of(&prepared),
                            args.cdi,
                            args.device_plugin_config.as_deref(),
                        )?,
                        topology.clone(),
                    ));
                }
                let served = resources.as_ref().map(|(r, _)| r.as_slice());
                start_health(
                    &args,
                    &prepared,
                    &topology,
                    served,
                    session.as_ref(),
                    &stream,
                    ServerAnswers {
                        super_pod: Some(super_pod_tx),
                        chip: Some(chip_info_tx),
                    },
                );
            }
            // The device plugins cannot start without the node; the publisher can keep trying.
            Err(e) if serves_devices => return Err(e),
            Err(e) => {
                // No DCMI source: nobody will answer the super-pod or chip-info question.
                drop(super_pod_tx);
                drop(chip_info_tx);
                tracing::warn!(error = %e, "discovery failed: no health sources; publishing retries discovery");
            }
        }

        let wake = Arc::new(Notify::new());
        publish::wake_on_health(stream.subscribe(), wake.clone());
        // A late DCMI answer is published at once, not at the next re-check.
        wake_on_change(super_pod.clone(), wake.clone());
        wake_on_change(chip_info.clone(), wake.clone());
        let reserved_memory = if args.reserved_memory.is_empty() {
            None
        } else {
            let mut all = Vec::new();
            for v in &args.reserved_memory {
                all.extend(
                    parse_reserved_memory_flag(v)
                        .map_err(|e| anyhow::anyhow!("--reserved-memory {v:?}: {e}"))?,
                );
            }
            Some(all)
        };
        let kubelet = KubeletPaths {
            config: args.kubelet_config.clone(),
            pod_resources_socket: args.pod_resources_socket.clone(),
            cpu_manager_state: args.cpu_manager_state.clone(),
        };
        let allocations =
            publish::watch_allocations(kubelet.clone(), Duration::from_secs(1), wake.clone());
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: "fumarole-agent".into(),
                instance: Some(node_name.clone()),
            },
        );
        health::spawn_reports(
            stream.subscribe(),
            Some((recorder.clone(), health::node_reference(&node_name))),
            Some(fault_metrics),
        );
        let node_pods = (args.device_plugin_dir.is_some() || args.colocation.colocation)
            .then(|| {
                pods::NodePods::watch(client.clone(), &node_name, recorder, Some(choice_metrics))
            });
        let (resources, dra_server, dra_served) = match resources {
            Some((all, topology)) => {
                let (device_plugin, dra) = split(all);
                // What the DRA plugin serves is what the ResourceSlices list.
                let served: BTreeSet<String> = dra
                    .iter()
                    .flat_map(|r| &r.devices)
                    .map(|d| d.id.clone())
                    .collect();
                let server = plugins::start_dra(
                    &node_name,
                    &topology,
                    dra,
                    &args.dra.dirs(),
                    Arc::new(KubeClaims::new(client.clone())),
                )?;
                let served = server.as_ref().map(|_| served);
                (Some((device_plugin, topology)), server, served)
            }
            None => (None, None, None),
        };
        if let (Some(dir), Some((resources, topology))) = (args.device_plugin_dir.clone(), resources)
            && let Some(node_pods) = &node_pods
        {
            node_pods.set_allocations(allocations.clone());
            let pods = Pods {
                source: node_pods.clone() as Arc<dyn PodSource>,
                await_choice: AwaitChoice {
                    schedulers: args
                        .await_device_choice_from
                        .iter()
                        .filter(|s| !s.is_empty())
                        .cloned()
                        .collect(),
                    timeout: args.await_device_choice_timeout,
                },
            };
            plugins::start(&topology, resources, dir, Some(pods), &stream.subscribe())?;
        }
        if args.colocation.colocation
            && let Some(pods) = node_pods
        {
            start_colocation(&args, &client, &node_name, pods, colocation_metrics);
        }
        let publisher = Publisher::new(
            client,
            &node_name,
            dra_served.is_some(),
            args.ascend_device_info,
            metrics.clone(),
            wake.clone(),
        );
        let mut state = NodeState::new(prepared.options.clone(), prepared.nvml, kubelet, allocations, metrics)
            .with_health(stream.subscribe())
            .with_compat_labels(args.compat_labels)
            .with_ascend_device_info(args.ascend_device_info)
            .with_super_pod(super_pod)
            .with_chip_info(chip_info)
            .with_reserved_memory(reserved_memory);
        if let Some(served) = dra_served {
            state = state.with_dra(&node_name, served);
        }
        tracing::info!(node = %node_name, recheck = ?args.recheck_interval, "publishing node topology");
        tokio::select! {
            () = publish::run(publisher, state, args.recheck_interval, wake) => {}
            () = shutdown() => tracing::info!("shutting down"),
        }
        if let Some(server) = dra_server {
            // Removes the sockets (the kubelet deregisters the drivers), lets requests in
            // flight finish, but does not wait on the kubelet for long.
            if tokio::time::timeout(Duration::from_secs(5), server.shutdown()).await.is_err() {
                tracing::warn!("DRA plugin requests still in flight after 5 s: stopping anyway");
            }
        }
        Ok(())
    })
}

/// Starts the co-location tasks ([`fumarole_colocation::tasks`]): the configuration watch,
/// the pod cgroup loop, the node loop and the state report.
fn start_colocation(
    args: &RunArgs,
    client: &kube::Client,
    node_name: &str,
    pods: Arc<pods::NodePods>,
    metrics: Arc<ColocationMetrics>,
) {
    use fumarole_colocation::tasks::node_loop::{NodeLoop, NodeLoopSettings};
    use fumarole_colocation::tasks::pod_cgroups::{self, Summary};
    use fumarole_colocation::tasks::{config_watch, heartbeat, report};
    let (settings, static_cpu_manager) = args.colocation.settings(&args.kubelet_config);
    let interval = args.colocation.qos_interval;
    tracing::info!(?settings, ?interval, namespace = %args.colocation.colocation_config_namespace, "co-location on");
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "fumarole-agent".into(),
            instance: Some(node_name.to_string()),
        },
    );
    let node = Arc::new(Watched::spawn(
        kube::Api::<Node>::all(client.clone()),
        watcher::Config::default().fields(&format!("metadata.name={node_name}")),
    ));
    tokio::spawn(heartbeat::run(
        client.clone(),
        args.colocation.colocation_config_namespace.clone(),
        node_name.to_string(),
        node.clone(),
        args.colocation.heartbeat_lease_duration,
    ));
    let (status, reports) = tokio::sync::watch::channel(ColocationStatus::default());
    tokio::spawn(report::run(client.clone(), node_name.to_string(), reports));
    let config = config_watch::watch(
        client.clone(),
        &args.colocation.colocation_config_namespace,
        node_name,
        node.clone(),
        recorder.clone(),
        metrics.clone(),
        status.clone(),
    );

    let node_loop = NodeLoop::new(
        NodeLoopSettings {
            node_name: node_name.to_string(),
            cgroups: settings.clone(),
            memory_pressure: args.colocation.memory_pressure_file.clone(),
            static_cpu_manager,
        },
        client.clone(),
        node,
        recorder,
        metrics.clone(),
        status.clone(),
    );
    let node_pods = pods.clone();
    let node_config = config.clone();
    tokio::spawn(async move {
        node_pods.ready().await;
        node_loop.run(|| node_pods.pods(), node_config).await;
    });

    tokio::spawn(async move {
        pods.ready().await;
        let changes = pods.changes();
        let record = |s: &Summary| {
            let gauge = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
            let levels = s.by_level_name().map(|(name, n)| (name, gauge(n)));
            metrics.pods(
                &levels,
                gauge(s.burst_enabled),
                gauge(s.batch_limited),
                gauge(s.failed),
            );
        };
        pod_cgroups::run(
            settings,
            interval,
            || pods.pods(),
            changes,
            config,
            status,
            record,
        )
        .await;
    });
}

/// A heartbeat lease duration: whole seconds, at least 4 s (renewed every quarter).
fn parse_lease_duration(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| e.to_string())?;
    if d < Duration::from_secs(4) || d.subsec_nanos() != 0 {
        return Err(format!("{s}: a lease lasts whole seconds, at least 4"));
    }
    Ok(d)
}

/// The value of the node's `key` label as its super-node, if the label is set.
async fn super_node_from_label(
    client: &kube::Client,
    node: &str,
    key: &str,
) -> Result<Option<SuperNode>> {
    let nodes: kube::Api<Node> = kube::Api::all(client.clone());
    let found = nodes
        .get_opt(node)
        .await
        .with_context(|| format!("reading Node {node} for --super-node-label"))?;
    let id = found
        .and_then(|n| n.metadata.labels?.get(key).cloned())
        .filter(|v| !v.is_empty());
    if id.is_none() {
        tracing::info!(node, label = key, "super-node label not set on the node");
    }
    Ok(id.map(|id| SuperNode {
        id,
        source: SuperNodeSource::NodeLabel,
    }))
}

/// `--standalone`: discover once, serve the device plugins with their health, nothing else.
async fn standalone(args: RunArgs, mut prepared: Prepared) -> Result<()> {
    let Some(dir) = args.device_plugin_dir.clone() else {
        bail!("--standalone needs --device-plugin-dir")
    };
    let (topology, session) = discover_node(&args, &mut prepared)?;
    let resources = plugins::resources(
        &topology,
        root_of(&prepared),
        args.cdi,
        args.device_plugin_config.as_deref(),
    )?;
    let stream = HealthStream::new();
    start_health(
        &args,
        &prepared,
        &topology,
        Some(&resources),
        session.as_ref(),
        &stream,
        ServerAnswers::default(),
    );
    health::spawn_reports(stream.subscribe(), None, None);
    let (resources, dra) = split(resources);
    let dra_devices: usize = dra.iter().map(|r| r.devices.len()).sum();
    if dra_devices > 0 {
        tracing::warn!(
            devices = dra_devices,
            "--standalone serves no DRA plugin (it reads claims from the API server): devices whose config says servedBy: dra are not served, those saying both only by the device plugin"
        );
    }
    plugins::start(&topology, resources, dir, None, &stream.subscribe())?;
    shutdown().await;
    tracing::info!("shutting down");
    Ok(())
}

/// The filesystem root device nodes are looked up under.
fn root_of(prepared: &Prepared) -> &Path {
    prepared.options.source.root().unwrap_or(Path::new("/"))
}

/// Discovers the node once. When NVIDIA answers come from the library, one NVML session
/// serves discovery (now and in every publish round) and the health thread.
fn discover_node(
    args: &RunArgs,
    prepared: &mut Prepared,
) -> Result<(NodeTopology, Option<NvmlSession>)> {
    let session = match &prepared.nvml_source {
        NvmlSource::Library(path) => {
            let session = args.health.nvml_session(path.clone());
            prepared.nvml = Box::new(session.clone());
            Some(session)
        }
        NvmlSource::Recorded => None,
    };
    // Discovery reads sysfs and may wait for NVML's first answer: not on a runtime worker.
    let topology = tokio::task::block_in_place(|| {
        discover::discover(&prepared.options, prepared.nvml.as_ref())
    })?;
    Ok((topology, session))
}

/// Starts the node's health sources (see [`health::start_sources`]).
fn start_health(
    args: &RunArgs,
    prepared: &Prepared,
    topology: &NodeTopology,
    resources: Option<&[fumarole_device_plugin::resources::Resource]>,
    session: Option<&NvmlSession>,
    stream: &HealthStream,
    answers: ServerAnswers,
) {
    // The device plugins' device nodes when they are served, else what discovery found.
    let dev_nodes = match resources {
        Some(r) => plugins::dev_nodes(r),
        None => topology
            .devices
            .iter()
            .map(|d| (d.id.clone(), d.dev_nodes.clone()))
            .collect(),
    };
    let host = matches!(prepared.options.source, discover::Source::Host);
    health::start_sources(
        &args.health,
        topology,
        root_of(prepared).to_path_buf(),
        dev_nodes,
        session,
        host,
        stream,
        answers,
    );
}

/// Wakes the publisher whenever `answer` changes, until its sender is gone.
fn wake_on_change<T: Send + Sync + 'static>(mut answer: watch::Receiver<T>, wake: Arc<Notify>) {
    tokio::spawn(async move {
        while answer.changed().await.is_ok() {
            wake.notify_one();
        }
    });
}

/// SIGTERM (the kubelet stopping the pod) or Ctrl-C.
async fn shutdown() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = term => {}
    }
}
