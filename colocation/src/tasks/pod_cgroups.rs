//! The pod cgroup loop of `fumarole-agent run --colocation`: QoS levels
//! ([`crate::rules::level`]), batch resources as limits ([`crate::rules::batch_limits`]) and CPU
//! burst ([`crate::rules::burst`]) applied to the cgroups of this node's pods, levels and burst as
//! far as the configuration in force enables them ([`Features`]).
//!
//! Start at [`Syncer::sync`]: one round over the pods the API server lists for the node. It is
//! stateless with respect to the cgroups: every value is read before it is written and written
//! only when it differs ([`Cgroups::write_if_changed`]), so a restarted agent re-applies the
//! same values without writing (or logging) anything. [`run`] repeats rounds every interval and
//! whenever the pod list changes.
//!
//! What a round does per pod (`Pending` or `Running`, with a uid and `status.qosClass`):
//!
//! - finds the pod cgroup from the [`Layout`](crate::cgroup::Layout) and the containers' cgroups
//!   from `status.containerStatuses[].containerID`; a pod whose cgroup does not exist yet is
//!   skipped (debug) and retried on the next round, as are containers not started yet;
//! - writes [`level::desired`] for the pod's `volcano.sh/qos-level` (the CPU files with
//!   `cpuQosConfig` on, the memory files with `memoryQosConfig` on). The defaults of
//!   [`QosLevel::Unset`] are written only to pods this agent gave a level before, or whose
//!   cgroup still shows one (`cpu.idle = 1`, `cpu.qos_level != 0`): an annotation removed while
//!   the agent was down is still undone, and pods nobody annotated are left to the kubelet;
//! - writes [`batch_limits::desired`] for a BestEffort pod that asks for `kubernetes.io/batch-cpu`
//!   or `batch-memory`, whatever the configuration (as volcano-agent: a pod that runs on batch
//!   resources is held to them on every node). The pod cgroup's CPU weight stays with the level
//!   where a `BE` level is in force (an idle group refuses weight writes; without `cpu.idle` the
//!   level's minimal weight is the point); otherwise the batch weight replaces the level's. It
//!   comes before burst, which reads the quotas it sets;
//! - runs [`burst_files::sync`] for the pod's burst annotations (burst 0 without them, or with
//!   `cpuBurstConfig` off).
//!
//! Switching a feature off therefore restores the kubelet's values on the next round.
//!
//! A pod's errors (bad annotations, a kernel refusing a value) are logged once per change of
//! the message, never stop the round, and are retried every round.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::{Notify, watch};

use super::report::StatusTx;
use crate::cgroup::{
    self, Applied, CgroupPath, Cgroups, ContainerId, Settings, batch_files, burst_files,
    level_files,
};
use crate::rules::batch_limits::{self, Plan};
use crate::rules::burst::BurstRequest;
use crate::rules::config::{ConfigState, Features};
use crate::rules::kernel::Kernel;
use crate::rules::level::{self, PodResources, QosLevel};
use crate::rules::pod::{QosClass, pod_cpu_request_millis};

/// What one round saw: pods per QoS level and with burst on, among the pods whose cgroups
/// exist; logged when it changes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// Pods per level value (`2` LC/HLS, `1` LS, `0` none, `-1` BE).
    pub levels: BTreeMap<i64, usize>,
    pub burst_enabled: usize,
    /// BestEffort pods held to their batch resources ([`batch_limits`]).
    pub batch_limited: usize,
    /// Pods whose cgroup does not exist yet.
    pub not_started: usize,
    /// Pods with an error this round (logged once per change).
    pub failed: usize,
}

/// How one pod's sync ended, short of an error.
enum Outcome {
    Synced {
        level: Option<QosLevel>,
        burst: bool,
        batch: bool,
    },
    NotStarted,
}

/// The round-to-round memory of the loop: which pods we gave a level (so that removing the
/// annotation restores the defaults) and which errors were already logged.
pub struct Syncer {
    cgroups: Cgroups,
    leveled: HashSet<String>,
    reported: HashMap<String, String>,
}

impl Syncer {
    pub fn new(cgroups: Cgroups) -> Self {
        Syncer {
            cgroups,
            leveled: HashSet::new(),
            reported: HashMap::new(),
        }
    }

    pub fn cgroups(&self) -> &Cgroups {
        &self.cgroups
    }

    /// One round over `pods` (the node's pods as the API server lists them).
    pub fn sync<'a>(
        &mut self,
        pods: impl IntoIterator<Item = &'a Pod>,
        features: Features,
    ) -> Summary {
        let mut summary = Summary::default();
        let mut seen = HashSet::new();
        for pod in pods {
            let Some(uid) = pod.metadata.uid.clone() else {
                continue;
            };
            let status = pod.status.as_ref();
            let phase = status.and_then(|s| s.phase.as_deref());
            if !matches!(phase, Some("Pending" | "Running")) {
                continue;
            }
            let Some(qos_class) = status.and_then(|s| s.qos_class.as_deref()) else {
                continue;
            };
            seen.insert(uid.clone());
            let name = format!(
                "{}/{}",
                pod.metadata.namespace.as_deref().unwrap_or_default(),
                pod.metadata.name.as_deref().unwrap_or_default()
            );
            let mut errors = Vec::new();
            match self.sync_pod(pod, &name, &uid, qos_class, features, &mut errors) {
                Outcome::Synced {
                    level,
                    burst,
                    batch,
                } => {
                    if let Some(level) = level {
                        *summary.levels.entry(level.value()).or_default() += 1;
                    }
                    if burst {
                        summary.burst_enabled += 1;
                    }
                    if batch {
                        summary.batch_limited += 1;
                    }
                }
                Outcome::NotStarted => summary.not_started += 1,
            }
            if errors.is_empty() {
                if self.reported.remove(&uid).is_some() {
                    tracing::info!(pod = %name, "co-location settings applied again");
                }
            } else {
                summary.failed += 1;
                let message = errors.join("; ");
                if self.reported.get(&uid) != Some(&message) {
                    tracing::warn!(pod = %name, error = %message, "co-location settings not fully applied; retrying every round");
                    self.reported.insert(uid, message);
                }
            }
        }
        self.leveled.retain(|uid| seen.contains(uid));
        self.reported.retain(|uid, _| seen.contains(uid));
        summary
    }

    fn sync_pod(
        &mut self,
        pod: &Pod,
        name: &str,
        uid: &str,
        qos_class: &str,
        features: Features,
        errors: &mut Vec<String>,
    ) -> Outcome {
        let cgroups = &self.cgroups;
        let found = qos_class
            .parse::<QosClass>()
            .map_err(|e| e.to_string())
            .and_then(|qos| {
                let path = cgroups.layout().pod(qos, uid).map_err(|e| e.to_string())?;
                Ok((qos, path))
            });
        let (qos, path) = match found {
            Ok(found) => found,
            Err(e) => {
                errors.push(e);
                return Outcome::NotStarted;
            }
        };
        if !cgroups.dir("cpu", &path).is_dir() {
            tracing::debug!(pod = %name, cgroup = %path, "pod cgroup not there yet; next round");
            return Outcome::NotStarted;
        }
        let containers = self.containers(pod, name, qos, uid, errors);
        let empty = BTreeMap::new();
        let annotations = pod.metadata.annotations.as_ref().unwrap_or(&empty);
        let mut gone = false;
        let mut note = |e: cgroup::Error, errors: &mut Vec<String>| match e {
            cgroup::Error::NoCgroup { .. } => gone = true,
            e => errors.push(e.to_string()),
        };

        let level = match QosLevel::from_annotations(annotations) {
            Ok(level) => Some(level),
            Err(e) => {
                errors.push(e.to_string());
                None
            }
        };
        let batch = match pod.spec.as_ref().map(batch_limits::from_spec).transpose() {
            Ok(containers) => {
                containers.and_then(|c| batch_limits::desired(qos, &c, self.cgroups.version()))
            }
            Err(e) => {
                errors.push(format!("batch limits: {e}"));
                None
            }
        };
        // openEuler keeps the level in cpu.qos_level, beside the weight: no conflict there.
        let level_owns_weight = features.cpu_qos
            && level.is_some_and(QosLevel::is_offline)
            && !self.cgroups.has(&path, "cpu.qos_level");
        let batch_weight = batch.is_some() && !level_owns_weight;
        if let Some(level) = level
            && let Err(e) = self.apply_level(pod, uid, &path, level, features, batch_weight)
        {
            note(e, errors);
        }
        // A group still idle (a level this round could not read) refuses weight writes.
        let idle = self.cgroups.read(&path, "cpu.idle").is_ok_and(|v| v == "1");
        if let Some(plan) = &batch
            && let Err(e) = batch_files::apply(
                &self.cgroups,
                &path,
                &containers.iter().cloned().collect(),
                plan,
                batch_weight && !idle,
            )
        {
            note(e, errors);
        }

        let request = match BurstRequest::from_annotations(annotations) {
            Ok(request) if features.cpu_burst => request,
            Ok(_) => BurstRequest::Disabled,
            Err(e) => {
                errors.push(e.to_string());
                BurstRequest::Disabled
            }
        };
        let container_paths: Vec<_> = containers.into_iter().map(|(_, path)| path).collect();
        if let Err(e) = burst_files::sync(&self.cgroups, &path, &container_paths, request) {
            note(e, errors);
        }
        if gone {
            tracing::debug!(pod = %name, cgroup = %path, "a cgroup went away during the sync; next round");
            return Outcome::NotStarted;
        }
        Outcome::Synced {
            level,
            burst: matches!(request, BurstRequest::Enabled { .. }),
            batch: batch.is_some(),
        }
    }

    /// The cgroups of the pod's started containers, by container name; containers without an
    /// id or a cgroup yet are left for a later round.
    fn containers(
        &self,
        pod: &Pod,
        name: &str,
        qos: QosClass,
        uid: &str,
        errors: &mut Vec<String>,
    ) -> Vec<(String, CgroupPath)> {
        let statuses = pod
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref());
        let mut paths = Vec::new();
        for status in statuses.into_iter().flatten() {
            let Some(id) = status.container_id.as_deref().filter(|id| !id.is_empty()) else {
                continue;
            };
            let path = id
                .parse::<ContainerId>()
                .and_then(|id| self.cgroups.layout().container(qos, uid, &id));
            match path {
                Ok(path) if self.cgroups.dir("cpu", &path).is_dir() => {
                    paths.push((status.name.clone(), path));
                }
                Ok(path) => {
                    tracing::debug!(pod = %name, cgroup = %path, "container cgroup not there yet");
                }
                Err(e) => errors.push(format!("container {}: {e}", status.name)),
            }
        }
        paths
    }

    /// Writes the level's plan, or for [`QosLevel::Unset`] the kubelet's defaults where a level
    /// was applied before (by this agent, or by one before a restart). A controller whose
    /// feature is off gets the defaults too. With `batch_weight` the pod's CPU weight is left
    /// out: the batch limits set it, and the two must not take turns.
    fn apply_level(
        &mut self,
        pod: &Pod,
        uid: &str,
        path: &CgroupPath,
        level: QosLevel,
        features: Features,
        batch_weight: bool,
    ) -> cgroup::Result<Applied> {
        let cgroups = &self.cgroups;
        let cpu_level = if features.cpu_qos {
            level
        } else {
            QosLevel::Unset
        };
        let memory_level = if features.memory_qos {
            level
        } else {
            QosLevel::Unset
        };
        let unset = cpu_level == QosLevel::Unset && memory_level == QosLevel::Unset;
        if unset && !self.leveled.contains(uid) && !shows_a_level(cgroups, path) {
            return Ok(Applied::default());
        }
        let cpu_request_millis = match pod.spec.as_ref() {
            Some(spec) => {
                let name = fumarole_topology::pod::key(pod);
                pod_cpu_request_millis(spec, &name).map_err(|e| cgroup::Error::Invalid {
                    what: "pod CPU request",
                    value: name,
                    reason: e.to_string(),
                })?
            }
            None => 0,
        };
        let resources = PodResources {
            cpu_request_millis,
            memory_limit_bytes: level_files::memory_limit(cgroups, path)?,
        };
        let kernel = Kernel::probe(cgroups, path);
        let is_memory = |file: &&str| file.starts_with("memory.");
        let weight_file = Plan::weight_file(cgroups.version());
        let mut plan: Vec<_> = level::desired(cpu_level, &resources, &kernel)
            .into_iter()
            .filter(|(file, _)| !(is_memory(file) || batch_weight && *file == weight_file))
            .collect();
        plan.extend(
            level::desired(memory_level, &resources, &kernel)
                .into_iter()
                .filter(|(file, _)| is_memory(file)),
        );
        let applied = level_files::apply(cgroups, path, &plan)?;
        if unset {
            self.leveled.remove(uid);
        } else {
            self.leveled.insert(uid.to_string());
        }
        Ok(applied)
    }
}

/// Whether the pod's cgroup holds a level that only a co-location agent sets.
fn shows_a_level(cgroups: &Cgroups, path: &CgroupPath) -> bool {
    let reads =
        |file: &str, default: &str| cgroups.read(path, file).is_ok_and(|v| v.trim() != default);
    reads("cpu.idle", "0") || reads("cpu.qos_level", "0") || reads("memory.qos_level", "0")
}

impl Summary {
    /// Pods per level name (`LC` also counts `HLS`; `none` is no annotation), every level
    /// listed so that a gauge drops to 0.
    pub fn by_level_name(&self) -> [(&'static str, usize); 4] {
        let count = |level: QosLevel| self.levels.get(&level.value()).copied().unwrap_or(0);
        [
            ("LC", count(QosLevel::Critical)),
            ("LS", count(QosLevel::Sensitive)),
            ("none", count(QosLevel::Unset)),
            ("BE", count(QosLevel::BestEffort)),
        ]
    }
}

/// Runs rounds every `interval`, whenever `changed` is notified and whenever the
/// configuration changes, over what `pods` returns, until the task is dropped; `on_round` sees
/// each round's summary (for metrics), and `status` gets its counts. Rounds wait for the first
/// configuration. Detecting the cgroup layout is retried every round until it works (the
/// kubelet may create `kubepods` after the agent starts).
pub async fn run(
    settings: Settings,
    interval: Duration,
    pods: impl Fn() -> Vec<Arc<Pod>>,
    changed: Arc<Notify>,
    mut config: watch::Receiver<Option<ConfigState>>,
    status: StatusTx,
    mut on_round: impl FnMut(&Summary),
) {
    let mut syncer: Option<Syncer> = None;
    let mut last_error: Option<String> = None;
    let mut last: Option<Summary> = None;
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            () = changed.notified() => {}
            result = config.changed() => if result.is_err() { return },
        }
        let Some(features) = config.borrow().as_ref().map(|c| Features::of(&c.node)) else {
            continue;
        };
        if syncer.is_none() {
            match settings.detect() {
                Ok(cgroups) => {
                    tracing::info!(
                        root = %cgroups.root().display(),
                        version = ?cgroups.version(),
                        driver = ?cgroups.layout().driver,
                        "co-location: cgroup layout detected"
                    );
                    syncer = Some(Syncer::new(cgroups));
                }
                Err(e) => {
                    let message = e.to_string();
                    if last_error.as_ref() != Some(&message) {
                        tracing::warn!(error = %message, "co-location: cannot find the pod cgroups; retrying every round");
                        last_error = Some(message);
                    }
                    continue;
                }
            }
        }
        let Some(syncer) = syncer.as_mut() else {
            continue;
        };
        let pods = pods();
        let summary = syncer.sync(pods.iter().map(|p| p.as_ref()), features);
        on_round(&summary);
        status.send_if_modified(|s| {
            let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
            let levels: BTreeMap<String, u32> = summary
                .by_level_name()
                .iter()
                .map(|(name, n)| ((*name).to_string(), count(*n)))
                .collect();
            let burst = count(summary.burst_enabled);
            let modified = s.qos_level_pods != levels || s.burst_pods != burst;
            s.qos_level_pods = levels;
            s.burst_pods = burst;
            modified
        });
        if last.as_ref() != Some(&summary) {
            tracing::info!(
                ?features,
                levels = ?summary.levels,
                burst_enabled = summary.burst_enabled,
                batch_limited = summary.batch_limited,
                not_started = summary.not_started,
                failed = summary.failed,
                "co-location: pods synced"
            );
            last = Some(summary);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::{Driver, Layout};
    use crate::rules::kernel::Version;
    use std::path::Path;

    impl Features {
        /// Everything on.
        fn all() -> Self {
            Self {
                cpu_qos: true,
                memory_qos: true,
                cpu_burst: true,
            }
        }
    }

    const BE_UID: &str = "11111111-1111-1111-1111-111111111111";
    const BURST_UID: &str = "22222222-2222-2222-2222-222222222222";
    const PLAIN_UID: &str = "33333333-3333-3333-3333-333333333333";

    /// A v1 `cpu` cgroup as plain files.
    fn cgroup(dir: &Path, quota: &str) {
        std::fs::create_dir_all(dir).unwrap();
        for (file, value) in [
            ("cpu.idle", "0"),
            ("cpu.shares", "1024"),
            ("cpu.cfs_quota_us", quota),
            ("cpu.cfs_burst_us", "0"),
        ] {
            std::fs::write(dir.join(file), format!("{value}\n")).unwrap();
        }
    }

    fn read(dir: &Path, file: &str) -> String {
        std::fs::read_to_string(dir.join(file))
            .unwrap()
            .trim()
            .to_string()
    }

    fn pod(uid: &str, qos: &str, annotations: serde_json::Value, container: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": uid, "namespace": "default", "uid": uid, "annotations": annotations},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "500m"}}}]},
            "status": {
                "phase": "Running",
                "qosClass": qos,
                "containerStatuses": [{
                    "name": "c", "image": "x", "imageID": "", "ready": true, "restartCount": 0,
                    "containerID": format!("containerd://{container}"),
                }],
            },
        }))
        .unwrap()
    }

    #[test]
    fn levels_and_burst_applied_restored_and_idempotent() {
        let root = tempfile::tempdir().unwrap();
        let cpu = root.path().join("cpu/kubepods");
        let be = cpu.join(format!("burstable/pod{BE_UID}"));
        let bursty = cpu.join(format!("burstable/pod{BURST_UID}"));
        let plain = cpu.join(format!("besteffort/pod{PLAIN_UID}"));
        cgroup(&be, "-1");
        cgroup(&be.join("aaa"), "-1");
        cgroup(&bursty, "50000");
        cgroup(&bursty.join("bbb"), "50000");
        cgroup(&plain, "-1");
        std::fs::write(plain.join("cpu.shares"), "2\n").unwrap();
        let layout = Layout::new(Version::V1, Driver::Cgroupfs);
        let mut syncer = Syncer::new(Cgroups::new(root.path(), layout));

        let annotated = [
            pod(
                BE_UID,
                "Burstable",
                serde_json::json!({"volcano.sh/qos-level": "BE"}),
                "aaa",
            ),
            pod(
                BURST_UID,
                "Burstable",
                serde_json::json!({"volcano.sh/enable-quota-burst": "true", "volcano.sh/quota-burst-time": "30000"}),
                "bbb",
            ),
            pod(PLAIN_UID, "BestEffort", serde_json::json!({}), "ccc"),
            pod(
                "44444444-4444-4444-4444-444444444444",
                "Burstable",
                serde_json::json!({}),
                "ddd",
            ),
        ];
        let summary = syncer.sync(&annotated, Features::all());
        assert_eq!(summary.levels, BTreeMap::from([(-1, 1), (0, 2)]));
        assert_eq!(
            (summary.burst_enabled, summary.not_started, summary.failed),
            (1, 1, 0)
        );
        assert_eq!(
            summary.by_level_name(),
            [("LC", 0), ("LS", 0), ("none", 2), ("BE", 1)]
        );
        assert_eq!(read(&be, "cpu.idle"), "1");
        assert_eq!(read(&bursty.join("bbb"), "cpu.cfs_burst_us"), "30000");
        assert_eq!(read(&bursty, "cpu.cfs_burst_us"), "30000");
        // Never annotated: the kubelet's value stays (no Unset defaults forced on it).
        assert_eq!(read(&plain, "cpu.shares"), "2");

        // Annotations removed: defaults back.
        let removed = [
            pod(BE_UID, "Burstable", serde_json::json!({}), "aaa"),
            pod(BURST_UID, "Burstable", serde_json::json!({}), "bbb"),
        ];
        syncer.sync(&removed, Features::all());
        assert_eq!(read(&be, "cpu.idle"), "0");
        assert_eq!(read(&be, "cpu.shares"), "512");
        assert_eq!(read(&bursty.join("bbb"), "cpu.cfs_burst_us"), "0");
        assert_eq!(read(&bursty, "cpu.cfs_burst_us"), "0");

        // A fresh syncer (an agent restart) over a cgroup left idle by the previous one
        // restores it; over settled cgroups it writes nothing.
        std::fs::write(be.join("cpu.idle"), "1\n").unwrap();
        let mut restarted = Syncer::new(syncer.cgroups().clone());
        restarted.sync(&removed, Features::all());
        assert_eq!(read(&be, "cpu.idle"), "0");
        let before: Vec<_> = [&be, &bursty, &bursty.join("bbb")]
            .iter()
            .flat_map(|d| std::fs::read_dir(d).unwrap())
            .map(|e| {
                let e = e.unwrap();
                (e.path(), e.metadata().unwrap().modified().unwrap())
            })
            .collect();
        std::thread::sleep(Duration::from_millis(20));
        Syncer::new(syncer.cgroups().clone()).sync(&removed, Features::all());
        for (path, modified) in before {
            assert_eq!(
                std::fs::metadata(&path).unwrap().modified().unwrap(),
                modified,
                "{}",
                path.display()
            );
        }
    }

    #[test]
    fn features_switched_off_restore_the_kubelet_values() {
        let root = tempfile::tempdir().unwrap();
        let cpu = root.path().join("cpu/kubepods/burstable");
        let be = cpu.join(format!("pod{BE_UID}"));
        let bursty = cpu.join(format!("pod{BURST_UID}"));
        cgroup(&be, "-1");
        cgroup(&bursty, "50000");
        cgroup(&bursty.join("bbb"), "50000");
        let mut syncer = Syncer::new(Cgroups::new(
            root.path(),
            Layout::new(Version::V1, Driver::Cgroupfs),
        ));
        let pods = [
            pod(
                BE_UID,
                "Burstable",
                serde_json::json!({"volcano.sh/qos-level": "BE"}),
                "aaa",
            ),
            pod(
                BURST_UID,
                "Burstable",
                serde_json::json!({"volcano.sh/enable-quota-burst": "true"}),
                "bbb",
            ),
        ];
        let on = syncer.sync(&pods, Features::all());
        assert_eq!((on.levels.get(&-1), on.burst_enabled), (Some(&1), 1));
        assert_eq!(read(&be, "cpu.idle"), "1");
        assert_eq!(read(&bursty.join("bbb"), "cpu.cfs_burst_us"), "50000");

        // The annotations stay; the configuration turns both features off.
        let off = syncer.sync(&pods, Features::default());
        assert_eq!(off.burst_enabled, 0);
        assert_eq!(read(&be, "cpu.idle"), "0");
        assert_eq!(read(&be, "cpu.shares"), "512");
        assert_eq!(read(&bursty.join("bbb"), "cpu.cfs_burst_us"), "0");
        assert_eq!(read(&bursty, "cpu.cfs_burst_us"), "0");

        // Memory QoS alone leaves the CPU files to the kubelet.
        let memory_only = Features {
            memory_qos: true,
            ..Features::default()
        };
        syncer.sync(&pods, memory_only);
        assert_eq!(read(&be, "cpu.idle"), "0");
    }

    #[test]
    fn bad_annotations_are_errors_not_guesses() {
        let root = tempfile::tempdir().unwrap();
        let dir = root
            .path()
            .join(format!("cpu/kubepods/burstable/pod{BE_UID}"));
        cgroup(&dir, "-1");
        let mut syncer = Syncer::new(Cgroups::new(
            root.path(),
            Layout::new(Version::V1, Driver::Cgroupfs),
        ));
        let bad = [pod(
            BE_UID,
            "Burstable",
            serde_json::json!({"volcano.sh/qos-level": "be"}),
            "aaa",
        )];
        let summary = syncer.sync(&bad, Features::all());
        assert_eq!(summary.failed, 1);
        assert_eq!(read(&dir, "cpu.idle"), "0");
        assert_eq!(syncer.reported.len(), 1);
        let ok = [pod(BE_UID, "Burstable", serde_json::json!({}), "aaa")];
        assert_eq!(syncer.sync(&ok, Features::all()).failed, 0);
        assert!(syncer.reported.is_empty());
    }

    /// A BestEffort pod asking for batch resources, with its `cpu` and `memory` cgroups (v1).
    fn batch_pod(annotations: serde_json::Value, cpu: &str, memory: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "batch", "namespace": "default", "uid": BE_UID, "annotations": annotations},
            "spec": {"containers": [{"name": "c", "resources": {
                "requests": {"kubernetes.io/batch-cpu": cpu, "kubernetes.io/batch-memory": memory},
                "limits": {"kubernetes.io/batch-cpu": cpu, "kubernetes.io/batch-memory": memory}}}]},
            "status": {
                "phase": "Running",
                "qosClass": "BestEffort",
                "containerStatuses": [{
                    "name": "c", "image": "x", "imageID": "", "ready": true, "restartCount": 0,
                    "containerID": "containerd://aaa",
                }],
            },
        }))
        .unwrap()
    }

    #[test]
    fn batch_limits_applied_beside_levels_without_taking_turns() {
        let root = tempfile::tempdir().unwrap();
        let pod_dir = |controller: &str| {
            root.path()
                .join(controller)
                .join(format!("kubepods/besteffort/pod{BE_UID}"))
        };
        for dir in [pod_dir("cpu"), pod_dir("cpu").join("aaa")] {
            cgroup(&dir, "-1");
            std::fs::write(dir.join("cpu.shares"), "2\n").unwrap();
        }
        for dir in [pod_dir("memory"), pod_dir("memory").join("aaa")] {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("memory.limit_in_bytes"), "9223372036854771712\n").unwrap();
        }
        let (cpu, container) = (pod_dir("cpu"), pod_dir("cpu").join("aaa"));
        let memory = pod_dir("memory");
        let mut syncer = Syncer::new(Cgroups::new(
            root.path(),
            Layout::new(Version::V1, Driver::Cgroupfs),
        ));

        // No level: the batch amounts everywhere, whatever the features.
        let plain = [batch_pod(serde_json::json!({}), "1500", "1Gi")];
        let summary = syncer.sync(&plain, Features::default());
        assert_eq!((summary.batch_limited, summary.failed), (1, 0));
        for dir in [&cpu, &container] {
            assert_eq!(read(dir, "cpu.shares"), "1536");
            assert_eq!(read(dir, "cpu.cfs_quota_us"), "150000");
        }
        assert_eq!(read(&memory, "memory.limit_in_bytes"), "1073741824");
        assert_eq!(
            read(&memory.join("aaa"), "memory.limit_in_bytes"),
            "1073741824"
        );

        // BE with cpu.idle: the level owns the pod's weight, the batch the rest.
        let be = [batch_pod(
            serde_json::json!({"volcano.sh/qos-level": "BE"}),
            "1500",
            "1Gi",
        )];
        syncer.sync(&be, Features::all());
        assert_eq!(read(&cpu, "cpu.idle"), "1");
        assert_eq!(read(&cpu, "cpu.cfs_quota_us"), "150000");
        assert_eq!(read(&container, "cpu.shares"), "1536");

        // The level goes: not idle, and the batch weight (not the kubelet's 2) in one round
        // that is then stable.
        let summary = syncer.sync(&plain, Features::all());
        assert_eq!(summary.failed, 0);
        assert_eq!(read(&cpu, "cpu.idle"), "0");
        assert_eq!(read(&cpu, "cpu.shares"), "1536");
        let before = std::fs::metadata(cpu.join("cpu.shares"))
            .unwrap()
            .modified()
            .unwrap();
        std::thread::sleep(Duration::from_millis(20));
        Syncer::new(syncer.cgroups().clone()).sync(&plain, Features::all());
        assert_eq!(
            std::fs::metadata(cpu.join("cpu.shares"))
                .unwrap()
                .modified()
                .unwrap(),
            before
        );

        // A level that does not parse while the group is still idle: the weight is left alone
        // (the kernel would refuse it), the limits stay, only the annotation is an error.
        std::fs::write(cpu.join("cpu.idle"), "1\n").unwrap();
        std::fs::write(cpu.join("cpu.shares"), "3\n").unwrap();
        let typo = [batch_pod(
            serde_json::json!({"volcano.sh/qos-level": "be"}),
            "1500",
            "1Gi",
        )];
        let summary = syncer.sync(&typo, Features::all());
        assert_eq!((summary.batch_limited, summary.failed), (1, 1));
        assert_eq!(read(&cpu, "cpu.shares"), "3");
        assert!(
            !syncer.reported[BE_UID].contains("cpu.shares"),
            "{:?}",
            syncer.reported
        );
        std::fs::write(cpu.join("cpu.idle"), "0\n").unwrap();

        // A malformed amount: an error naming it, nothing written, other settings still go.
        std::fs::write(cpu.join("cpu.cfs_quota_us"), "-1\n").unwrap();
        let bad = [batch_pod(serde_json::json!({}), "lots", "1Gi")];
        let summary = syncer.sync(&bad, Features::all());
        assert_eq!((summary.batch_limited, summary.failed), (0, 1));
        assert!(
            syncer.reported[BE_UID].contains("kubernetes.io/batch-cpu"),
            "{:?}",
            syncer.reported
        );
        assert_eq!(read(&cpu, "cpu.cfs_quota_us"), "-1");
    }
}
