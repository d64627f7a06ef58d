//! `fumarole-agent run`: the DaemonSet's long-running job. Discovers the node, publishes its
//! `Numatopology`, `NodeResourceTopology`, `DeviceTopology` and labels, keeps them current,
//! serves `/metrics` and `/healthz`, and, with `--device-plugin-dir`, the device plugins.
//! Devices the `--device-plugin-config` says `servedBy: dra` (or `both`) are served by the DRA
//! kubelet plugin ([`fumarole_device_plugin::dra`]), registered in `--dra-registry-dir`.
//! `--standalone` serves only the device plugins, with no API server. `--colocation` also does
//! volcano-agent's job for this node ([`fumarole_colocation::tasks`]): QoS levels and CPU burst
//! on the pods' cgroups, batch resources, pressure taint and eviction, configured by the
//! `volcano-agent-configuration` ConfigMap.
//!
//! Each crate declares its own flags, flattened into [`RunArgs`]: publishing's, the kubelet's
//! and device health's in `fumarole_exporter` ([`PublishArgs`], [`KubeletArgs`],
//! [`HealthArgs`]), the device plugins' and DRA's in `fumarole_device_plugin`
//! ([`DevicePluginArgs`], [`DraArgs`]), co-location's in `fumarole_colocation`
//! ([`ColocationArgs`]). [`serve`] wires three tasks, each started by a module of its own with
//! its own settings: publishing ([`publishing`]), devices ([`devices`]) and co-location
//! ([`colocation`]).

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use clap::Args;
use fumarole_colocation::metrics::ColocationMetrics;
use fumarole_colocation::settings::ColocationArgs;
use fumarole_device_plugin::resources::{Resource, split};
use fumarole_device_plugin::settings::{DevicePluginArgs, DevicePluginSettings, DraArgs};
use fumarole_exporter::device_health::HealthStream;
use fumarole_exporter::device_health::dcmi::ServerAnswers;
use fumarole_exporter::device_health::nvml::NvmlSession;
use fumarole_exporter::device_health::nvml::xid::LastXids;
use fumarole_exporter::device_health::settings::HealthArgs;
use fumarole_exporter::device_health::sources::{ascend_devices, dcmi_library, start_sources};
use fumarole_exporter::device_metrics::{self, DeviceMetrics, DeviceMetricsArgs};
use fumarole_exporter::discover;
use fumarole_exporter::kubelet::KubeletArgs;
use fumarole_exporter::publish::{PublishArgs, PublishSettings, metrics, metrics::Metrics};
use fumarole_topology::NodeTopology;
use kube::runtime::events::{Recorder, Reporter};

use crate::fault_events;
use crate::node::{NodeArgs, NvmlSource, Prepared};
use crate::{plugins, pods};

mod colocation;
mod devices;
mod partitions;
mod publishing;

use devices::{DeviceSettings, Devices};
use publishing::Publishing;

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
    #[command(flatten)]
    device_plugins: DevicePluginArgs,
    #[command(flatten)]
    kubelet: KubeletArgs,
    #[command(flatten)]
    publish: PublishArgs,
    #[command(flatten)]
    health: HealthArgs,
    #[command(flatten)]
    device_metrics: DeviceMetricsArgs,
    #[command(flatten)]
    dra: DraArgs,
    #[command(flatten)]
    colocation: ColocationArgs,
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
    runtime.block_on(serve(args, node_name, prepared))
}

/// The agent on a node of a cluster: publishing, the node's devices and co-location, until
/// SIGTERM.
async fn serve(args: RunArgs, node_name: String, mut prepared: Prepared) -> Result<()> {
    let client = api_client().await?;
    let publish = args.publish.settings();
    let host = matches!(prepared.options.source, discover::Source::Host);
    let devices = DeviceSettings {
        plugins: args.device_plugins.settings(),
        dra: args.dra.dirs(),
        nvml: prepared.nvml_source.clone(),
        dcmi: dcmi_library(&args.health, host),
    };
    if let Some(key) = &publish.super_node_label
        && prepared.options.super_node.is_none()
    {
        prepared.options.super_node =
            publishing::super_node_from_label(&client, &node_name, key).await?;
    }
    let (metrics, counters) = serve_metrics(&publish, &node_name, &args.device_metrics).await?;
    let stream = HealthStream::new();
    let (answers, dcmi) = publishing::dcmi_answers();
    let served = discover_and_watch_health(
        &args.health,
        &devices.plugins,
        &mut prepared,
        &stream,
        answers,
        (
            &args.device_metrics,
            &counters.devices,
            devices.dcmi.as_deref(),
        ),
    )?;
    let kubelet = args.kubelet.settings()?;
    let publishing = Publishing::start(publish, kubelet.clone(), &stream, dcmi);
    start_device_metrics(
        &args.device_metrics,
        &prepared.nvml_source,
        &counters.devices,
        publishing.allocations(),
    );
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "fumarole-agent".into(),
            instance: Some(node_name.clone()),
        },
    );
    fault_events::spawn_reports(
        stream.subscribe(),
        Some((recorder.clone(), fault_events::node_reference(&node_name))),
        Some(counters.faults),
    );
    let node_pods = (devices.plugins.dir.is_some() || args.colocation.enabled()).then(|| {
        pods::NodePods::watch(client.clone(), &node_name, recorder, Some(counters.choices))
    });
    let started = match served {
        Some(served) => devices::start(
            &devices,
            &node_name,
            &client,
            served,
            node_pods.as_ref(),
            publishing.allocations(),
            &stream,
        )?,
        None => Devices::none(),
    };
    if let Some(pods) = node_pods
        && let Some(settings) = colocation::settings(&args.colocation, &kubelet.paths.config)
    {
        colocation::start(settings, &client, &node_name, pods, counters.colocation);
    }
    let publishing = publishing
        .with_dra(started.dra_slices(&node_name))
        .with_sharing(started.sharing().clone())
        .with_device_usage(counters.devices.pods());
    tokio::select! {
        () = publishing.run(client, &node_name, prepared.options.clone(), prepared.nvml, metrics) => {}
        () = shutdown() => tracing::info!("shutting down"),
    }
    started.shutdown().await;
    Ok(())
}

/// The API client, with no retries of its own.
async fn api_client() -> Result<kube::Client> {
    let mut config = kube::Config::infer()
        .await
        .context("finding the API server (in-cluster config or KUBECONFIG)")?;
    // No retries inside the client: kube's start 5 ms apart and grow from there, a burst per
    // call on every 5xx. Each loop retries on its own, spread out (the publisher's jittered
    // backoff with Retry-After as a floor, the watches' jittered exponential backoff).
    config.default_retry = false;
    kube::Client::try_from(config).context("building the API client")
}

/// The other components' metrics, served on publishing's `/metrics` beside its own.
struct Counters {
    colocation: Arc<ColocationMetrics>,
    choices: Arc<plugins::ChoiceMetrics>,
    faults: Arc<fault_events::DeviceFaultMetrics>,
    devices: DeviceMetrics,
}

/// Serves `/metrics` and `/healthz` on `--metrics-addr`.
async fn serve_metrics(
    settings: &PublishSettings,
    node_name: &str,
    device_metrics: &DeviceMetricsArgs,
) -> Result<(Arc<Metrics>, Counters)> {
    // The co-location metrics are on /metrics with or without --colocation.
    let (metrics, (colocation, choices, faults, devices)) =
        Metrics::new(settings.recheck, |registry, unprefixed| {
            (
                ColocationMetrics::register(registry),
                plugins::ChoiceMetrics::register(registry),
                fault_events::DeviceFaultMetrics::register(registry),
                DeviceMetrics::register(registry, unprefixed, node_name, device_metrics),
            )
        });
    let listener = tokio::net::TcpListener::bind(settings.metrics_addr)
        .await
        .with_context(|| format!("--metrics-addr {}", settings.metrics_addr))?;
    tokio::spawn(metrics::serve(listener, metrics.clone()));
    Ok((
        metrics,
        Counters {
            colocation,
            choices,
            faults,
            devices,
        },
    ))
}

/// Unless `--device-metrics-interval` is 0: starts sampling the GPUs' figures (when NVIDIA
/// answers come from the library; the NPUs' start with discovery, [`start_npu_metrics`]) and
/// keeps the figures' holders current from the kubelet's allocations.
fn start_device_metrics(
    args: &DeviceMetricsArgs,
    nvml: &NvmlSource,
    metrics: &DeviceMetrics,
    allocations: &fumarole_exporter::publish::LatestAllocations,
) {
    if args.device_metrics_interval.is_zero() {
        return;
    }
    if let NvmlSource::Library(path) = nvml {
        device_metrics::nvml::spawn(path.clone(), args.device_metrics_interval, metrics.clone());
    }
    let mut allocations = allocations.clone();
    let metrics = metrics.clone();
    tokio::spawn(async move {
        loop {
            if let Some(Ok(alloc)) = allocations.borrow_and_update().as_ref() {
                metrics.set_allocations(alloc);
            }
            if allocations.changed().await.is_err() {
                return;
            }
        }
    });
}

/// Starts sampling the Ascend NPUs' figures where the DCMI health source would watch them (the
/// node has NPUs and the DCMI library `dcmi`) and `--device-metrics-interval` is not 0.
fn start_npu_metrics(
    topology: &NodeTopology,
    args: &DeviceMetricsArgs,
    metrics: &DeviceMetrics,
    dcmi: Option<&Path>,
) {
    let npus = ascend_devices(topology);
    if let Some(library) = dcmi
        && !npus.is_empty()
        && !args.device_metrics_interval.is_zero()
    {
        let every = args.device_metrics_interval;
        device_metrics::dcmi::spawn(library.to_path_buf(), npus, every, metrics.clone());
    }
}

/// Discovers the node and starts its health sources (the DCMI source answers on `answers`).
/// When the node serves devices, also the resources it serves, with the node as discovered;
/// `None` when it serves none, or discovery failed (logged: the publisher retries it).
fn discover_and_watch_health(
    health: &HealthArgs,
    plugins: &DevicePluginSettings,
    prepared: &mut Prepared,
    stream: &HealthStream,
    answers: ServerAnswers,
    (metrics_args, metrics, dcmi): (&DeviceMetricsArgs, &DeviceMetrics, Option<&Path>),
) -> Result<Option<(Vec<Resource>, NodeTopology)>> {
    let serves_devices = plugins.serves_devices();
    match discover_node(health, prepared) {
        Ok((topology, session)) => {
            start_npu_metrics(&topology, metrics_args, metrics, dcmi);
            let resources = if serves_devices {
                Some(devices::served(plugins, &topology, root_of(prepared))?)
            } else {
                None
            };
            start_health(
                health,
                prepared,
                &topology,
                resources.as_deref(),
                session.as_ref(),
                stream,
                (answers, metrics.last_xids()),
            );
            Ok(resources.map(|r| (r, topology)))
        }
        // The device plugins cannot start without the node; the publisher can keep trying.
        Err(e) if serves_devices => Err(e),
        Err(e) => {
            // No DCMI source: nobody will answer the super-pod or chip-info question.
            drop(answers);
            tracing::warn!(error = %e, "discovery failed: no health sources; publishing retries discovery");
            Ok(None)
        }
    }
}

/// `--standalone`: discover once, serve the device plugins with their health, nothing else.
async fn standalone(args: RunArgs, mut prepared: Prepared) -> Result<()> {
    let settings = args.device_plugins.settings();
    let Some(dir) = settings.dir.clone() else {
        bail!("--standalone needs --device-plugin-dir")
    };
    let (topology, session) = discover_node(&args.health, &mut prepared)?;
    let resources = devices::served(&settings, &topology, root_of(&prepared))?;
    let stream = HealthStream::new();
    start_health(
        &args.health,
        &prepared,
        &topology,
        Some(&resources),
        session.as_ref(),
        &stream,
        (ServerAnswers::default(), LastXids::default()),
    );
    fault_events::spawn_reports(stream.subscribe(), None, None);
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
    health: &HealthArgs,
    prepared: &mut Prepared,
) -> Result<(NodeTopology, Option<NvmlSession>)> {
    let session = match &prepared.nvml_source {
        NvmlSource::Library(path) => {
            let session = health.nvml_session(path.clone());
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

/// Starts the node's health sources (see [`start_sources`]).
fn start_health(
    health: &HealthArgs,
    prepared: &Prepared,
    topology: &NodeTopology,
    resources: Option<&[Resource]>,
    session: Option<&NvmlSession>,
    stream: &HealthStream,
    (answers, last_xids): (ServerAnswers, LastXids),
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
    start_sources(
        health,
        topology,
        root_of(prepared).to_path_buf(),
        dev_nodes,
        session,
        host,
        stream,
        answers,
        last_xids,
    );
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
