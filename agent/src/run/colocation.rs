//! Starting co-location in `fumarole-agent run --colocation`: the settings
//! ([`fumarole_colocation::settings`], completed from the kubelet's configuration by
//! [`settings`]) and the tasks ([`fumarole_colocation::tasks`], started by [`start`]) on the
//! node's watched pods.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use fumarole_colocation::cgroup;
use fumarole_colocation::metrics::ColocationMetrics;
use fumarole_colocation::rules::config::ConfigState;
use fumarole_colocation::settings::{ColocationArgs, ColocationSettings, KubeletCgroups};
use fumarole_colocation::watched::Watched;
use fumarole_exporter::kubelet::KubeletConfig;
use fumarole_topology::crd::ColocationStatus;
use k8s_openapi::api::core::v1::Node;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::watcher;
use tokio::sync::watch;

use crate::pods;

/// The co-location settings, with what the flags leave open taken from the kubelet
/// configuration `kubelet_config` (read only with `--colocation`); `None` without it.
pub fn settings(args: &ColocationArgs, kubelet_config: &Path) -> Option<ColocationSettings> {
    if !args.enabled() {
        return None;
    }
    let kubelet = std::fs::read_to_string(kubelet_config)
        .map_err(|e| e.to_string())
        .and_then(|text| {
            serde_norway::from_str::<KubeletConfig>(&text).map_err(|e| e.to_string())
        })
        .inspect_err(|e| {
            tracing::warn!(file = %kubelet_config.display(), error = %e, "co-location: kubelet config unreadable; detecting the cgroup driver, assuming no static CPU manager")
        })
        .unwrap_or_default();
    args.settings(KubeletCgroups {
        static_cpu_manager: kubelet.cpu_manager_policy.as_deref() == Some("static"),
        driver: kubelet.cgroup_driver,
        cgroup_root: kubelet.cgroup_root,
    })
}

/// Starts the co-location tasks ([`fumarole_colocation::tasks`]): the configuration watch,
/// the pod cgroup loop, the node loop and the state report.
pub fn start(
    settings: ColocationSettings,
    client: &kube::Client,
    node_name: &str,
    pods: Arc<pods::NodePods>,
    metrics: Arc<ColocationMetrics>,
) {
    use fumarole_colocation::tasks::node_loop::{NodeLoop, NodeLoopSettings};
    use fumarole_colocation::tasks::{config_watch, heartbeat, report};
    let ColocationSettings {
        config_namespace,
        heartbeat_lease,
        memory_pressure_file,
        qos_interval: interval,
        cgroups,
        static_cpu_manager,
    } = settings;
    tracing::info!(settings = ?cgroups, ?interval, namespace = %config_namespace, "co-location on");
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
        config_namespace.clone(),
        node_name.to_string(),
        node.clone(),
        heartbeat_lease,
    ));
    let (status, reports) = watch::channel(ColocationStatus::default());
    tokio::spawn(report::run(client.clone(), node_name.to_string(), reports));
    let config = config_watch::watch(
        client.clone(),
        &config_namespace,
        node_name,
        node.clone(),
        recorder.clone(),
        metrics.clone(),
        status.clone(),
    );

    let node_loop = NodeLoop::new(
        NodeLoopSettings {
            node_name: node_name.to_string(),
            cgroups: cgroups.clone(),
            memory_pressure: memory_pressure_file,
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
    tokio::spawn(pod_cgroups(
        cgroups, interval, pods, config, status, metrics,
    ));
}

/// The pod cgroup loop ([`fumarole_colocation::tasks::pod_cgroups`]) on the node's pods, once
/// they are listed, its summary counted in `metrics`.
async fn pod_cgroups(
    cgroups: cgroup::Settings,
    interval: Duration,
    pods: Arc<pods::NodePods>,
    config: watch::Receiver<Option<ConfigState>>,
    status: watch::Sender<ColocationStatus>,
    metrics: Arc<ColocationMetrics>,
) {
    use fumarole_colocation::tasks::pod_cgroups::{self, Summary};
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
        cgroups,
        interval,
        || pods.pods(),
        changes,
        config,
        status,
        record,
    )
    .await;
}
