//! Fuzz targets for every parser that reads the outside world.
//!
//! Each target is a function taking the raw input, so the same code runs under libFuzzer
//! (`fuzz_targets/`, driven by `scripts/fuzz.sh` with `cargo fuzz`) and, on stable, in
//! `tests/corpus.rs`, which replays the committed seeds and every crash ever found
//! (`regressions/`). A target fails only by panicking: on a panic in the code under test, or
//! on an assertion here about what a parser promises (a round trip, an answer the API allows).
//!
//! Inputs that are not UTF-8 are dropped where the real reader would drop them too (sysfs and
//! kubelet files are read with `read_to_string`, Kubernetes strings are UTF-8 by definition).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::{Arc, OnceLock};

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use fumarole_colocation::cgroup::{ContainerId, Driver};
use fumarole_colocation::rules::batch_limits;
use fumarole_colocation::rules::burst::{self, BurstRequest, Quota};
use fumarole_colocation::rules::config::{Document, Resolver, parse as parse_config};
use fumarole_colocation::rules::kernel::Version;
use fumarole_colocation::rules::level::QosLevel;
use fumarole_colocation::rules::pod::QosClass;
use fumarole_colocation::rules::psi::parse_psi;
use fumarole_device_plugin::admission::{AwaitChoice, BoundPod, Outcome, PodSource};
use fumarole_device_plugin::api;
use fumarole_device_plugin::api::device_plugin_server::DevicePlugin;
use fumarole_device_plugin::plugin::DevicePluginService;
use fumarole_device_plugin::plugin::Pods;
use fumarole_exporter::device_health::dcmi::answers;
use fumarole_exporter::discover::overrides::Overrides;
use fumarole_exporter::discover::sysfs::{NvidiaProcInfo, parse_numa_node};
use fumarole_exporter::kubelet::KubeletConfig;
use fumarole_exporter::kubelet::config::parse_reserved_memory_flag;
use fumarole_exporter::kubelet::cpu_manager_state::CpuManagerState;
use fumarole_exporter::publish::ascend;
use fumarole_exporter::publish::objects::label_value;
use fumarole_sim::{self, Simulation, policy::Policy, shape::ClusterShape, shape::SimCluster};
use fumarole_topology::{CpuSet, NodeTopology, annotation as devices_annotation};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use prost::Message;
use scheduler_ext::core::score::Scoring;
use scheduler_ext::core::view::ClusterView;
use scheduler_ext::http::router::router;
use scheduler_ext::protocol::kube_scheduler::{ExtenderFilterResult, HostPriority, KUBE_PREFIX};
use scheduler_ext::protocol::volcano::VOLCANO_PREFIX;
use scheduler_ext::service::Service;

/// A fuzz target: takes any input, panics only on a bug.
pub type Target = fn(&[u8]);

/// Every target by name, as `fuzz_targets/` and the corpus directories name them.
pub const TARGETS: &[(&str, Target)] = &[
    ("cpuset", cpuset),
    ("sysfs_attributes", sysfs_attributes),
    ("override_file", override_file),
    ("kubelet_config", kubelet_config),
    ("cpu_manager_state", cpu_manager_state),
    ("pod_annotations", pod_annotations),
    ("colocation_config", colocation_config),
    ("extender_kube", extender_kube),
    ("extender_volcano", extender_volcano),
    ("device_plugin_requests", device_plugin_requests),
    ("device_plugin_config", device_plugin_config),
    ("kernel_files", kernel_files),
    ("simulate_trace", simulate_trace),
    ("ascend_device_info", ascend_device_info),
    ("dcmi_chip_info", dcmi_chip_info),
    ("configuration_file", configuration_file),
];

/// `cpuset`, `local_cpulist` and the kubelet's CPU lists; sysfs `cpumap` masks. A list that
/// parses prints in canonical form and reads back as the same set.
pub fn cpuset(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(set) = CpuSet::parse(text) {
        let canonical = set.to_string();
        assert_eq!(
            CpuSet::parse(&canonical).ok().as_ref(),
            Some(&set),
            "{text:?} printed as {canonical:?} does not read back"
        );
    }
    let _ = CpuSet::parse_mask(text);
}

/// Per-device sysfs attributes, a NUMA node's `meminfo` and the NVIDIA driver's `information`
/// file.
pub fn sysfs_attributes(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = parse_numa_node(text);
    let _ = CpuSet::parse(text.trim());
    let _ = fumarole_exporter::discover::memory::mem_total(text);
    let info = NvidiaProcInfo::parse(text);
    if let Some(model) = info.model {
        assert!(!model.is_empty() && !model.starts_with("N/A"));
    }
}

/// The operator's override file (`/etc/fumarole/overrides.yaml`); a valid matrix is resolved
/// against its own device list as discovery does.
pub fn override_file(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(overrides) = Overrides::parse(text) else {
        return;
    };
    if let Some(m) = &overrides.matrix {
        let bus_ids: Vec<String> = m.devices.iter().map(|d| d.to_ascii_lowercase()).collect();
        let _ = overrides.link_classes(Path::new("overrides.yaml"), &bus_ids);
    }
}

/// The kubelet's `KubeletConfiguration` file.
pub fn kubelet_config(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = KubeletConfig::parse(text);
        if let Ok(entries) = parse_reserved_memory_flag(text) {
            let _ = KubeletConfig {
                reserved_memory: entries,
                ..KubeletConfig::default()
            }
            .policies();
        }
    }
}

/// The kubelet's CPU manager checkpoint.
pub fn cpu_manager_state(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(state) = CpuManagerState::parse(text) {
        let containers: usize = state.entries.values().map(BTreeMap::len).sum();
        let allocated: usize = state
            .pod_allocations()
            .iter()
            .map(|p| p.containers.len())
            .sum();
        assert_eq!(containers, allocated, "a checkpoint entry went missing");
    }
}

/// Pod annotations and the pod fields read with them, one `key=value` per line. Some keys are
/// not annotations: `@name` sets the pod's name (a rank source), `@gpus` the quantity of
/// `nvidia.com/gpu` its container asks for, `@requests.<resource>` / `@limits.<resource>` the
/// container's amounts for the batch limits (`kubernetes.io/batch-cpu`, `batch-memory`).
pub fn pod_annotations(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut annotations = BTreeMap::new();
    let mut name = "job-0".to_string();
    let mut gpus = "1".to_string();
    // `@requests.<resource>=q` / `@limits.<resource>=q`: the container's batch amounts.
    let mut amounts: BTreeMap<&str, BTreeMap<String, Quantity>> = BTreeMap::new();
    for line in text.lines() {
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        match key {
            "@name" => name = value.to_string(),
            "@gpus" => gpus = value.to_string(),
            _ if key.starts_with("@requests.") || key.starts_with("@limits.") => {
                let (kind, resource) = key.split_once('.').unwrap_or_default();
                let kind = if kind == "@requests" {
                    "requests"
                } else {
                    "limits"
                };
                amounts
                    .entry(kind)
                    .or_default()
                    .insert(resource.to_string(), Quantity(value.to_string()));
            }
            _ => {
                annotations.insert(key.to_string(), value.to_string());
            }
        }
    }

    // The node agent: QoS level and CPU burst.
    let _ = QosLevel::from_annotations(&annotations);
    if let Ok(request) = BurstRequest::from_annotations(&annotations) {
        let quotas = [Quota::Limited(50_000), Quota::Unlimited, Quota::Limited(1)];
        let plan = burst::desired(request, Quota::Limited(100_000), &quotas);
        assert_eq!(plan.containers.len(), quotas.len());
        if let Some(pod) = plan.pod {
            assert!(pod <= 100_000, "pod burst {pod} above the pod's quota");
        }
    }

    // The node agent: batch resources as a BestEffort pod's cgroup limits, always values the
    // kernel takes and keeps.
    let batch_spec = k8s_openapi::api::core::v1::PodSpec {
        containers: vec![k8s_openapi::api::core::v1::Container {
            name: "main".into(),
            resources: Some(k8s_openapi::api::core::v1::ResourceRequirements {
                requests: amounts.remove("requests"),
                limits: amounts.remove("limits"),
                ..Default::default()
            }),
            ..Default::default()
        }],
        ..Default::default()
    };
    if let Ok(containers) = batch_limits::from_spec(&batch_spec) {
        for version in [Version::V1, Version::V2] {
            let Some(plan) = batch_limits::desired(QosClass::BestEffort, &containers, version)
            else {
                continue;
            };
            let writes = plan
                .containers
                .iter()
                .flat_map(|(_, w)| w)
                .chain(&plan.pod_limits)
                .chain([&plan.pod_weight]);
            for (file, value) in writes {
                batch_write_is_kept_by_the_kernel(file, value);
            }
        }
    }

    // The scheduler extension and the device plugin: group sizes and the devices it chose.
    let pod = Pod {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some(name),
            namespace: Some("default".into()),
            annotations: Some(annotations.clone()),
            ..Default::default()
        },
        spec: Some(k8s_openapi::api::core::v1::PodSpec {
            containers: vec![k8s_openapi::api::core::v1::Container {
                name: "main".into(),
                resources: Some(k8s_openapi::api::core::v1::ResourceRequirements {
                    limits: Some(BTreeMap::from([(
                        "nvidia.com/gpu".to_string(),
                        k8s_openapi::apimachinery::pkg::api::resource::Quantity(gpus),
                    )])),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        }),
        status: None,
    };
    let offered = BTreeSet::from(["nvidia.com/gpu"]);
    if let Ok(request) = scheduler_ext::core::request::pod_request(
        &pod,
        &offered,
        &scheduler_ext::core::unit::Jobs::of([&pod]),
    ) && let Some(group) = request.unit
    {
        assert!(group.spec.group_size % group.spec.atomic_size == 0);
    }
    if let Some(value) = annotations.get(devices_annotation::DEVICES_ANNOTATION)
        && let Ok(choice) = devices_annotation::parse(value)
    {
        let again = devices_annotation::parse(&devices_annotation::format(&choice));
        assert_eq!(again.as_ref(), Ok(&choice), "{value:?} does not round-trip");
    }
}

/// Whether the kernel takes `value` for `file` and reads it back unchanged.
fn batch_write_is_kept_by_the_kernel(file: &str, value: &str) {
    let number = |v: &str| -> u64 {
        let n = v.parse().ok();
        assert!(n.is_some(), "{file} = {value:?} is not a number");
        n.unwrap_or_default()
    };
    let in_range = |n: u64, low: u64, high: u64| {
        assert!(
            (low..=high).contains(&n),
            "{file} = {value:?} outside [{low}, {high}]"
        );
    };
    let known = match file {
        "cpu.shares" => {
            in_range(number(value), 2, 262_144);
            true
        }
        "cpu.weight" => {
            in_range(number(value), 1, 10_000);
            true
        }
        "cpu.cfs_quota_us" => {
            in_range(number(value), 1_000, batch_limits::MAX_QUOTA_US);
            true
        }
        "cpu.max" => {
            let (quota, period) = value.split_once(' ').unwrap_or_default();
            in_range(number(quota), 1_000, batch_limits::MAX_QUOTA_US);
            assert_eq!(period, "100000", "{file} = {value:?}");
            true
        }
        "memory.limit_in_bytes" | "memory.max" => {
            let bytes = number(value);
            in_range(
                bytes,
                batch_limits::MEMORY_ALIGN,
                batch_limits::MAX_MEMORY_BYTES,
            );
            assert_eq!(bytes % batch_limits::MEMORY_ALIGN, 0, "{file} = {value:?}");
            true
        }
        _ => false,
    };
    assert!(known, "unexpected batch limit file {file} = {value:?}");
}

/// The co-location ConfigMap's `colocation-config` JSON; after a line `---`, the Node's
/// annotations (`key=value` lines) that may override it. A refused document keeps the last
/// good configuration in force.
pub fn colocation_config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (document, node) = text.split_once("\n---\n").unwrap_or((text, ""));
    let annotations: BTreeMap<String, String> = node
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let labels = BTreeMap::from([(
        "volcano.sh/oversubscription".to_string(),
        "true".to_string(),
    )]);
    let refused = parse_config(document).is_err();

    let mut resolver = Resolver::new();
    resolver.resolve(Document::Absent, &labels, &BTreeMap::new());
    let state = resolver.resolve(Document::Present(Some(document)), &labels, &annotations);
    if refused {
        assert!(
            state.error.is_some(),
            "a refused document reported no error"
        );
        // The last good document (the defaults) stays in force, under the node's annotations.
        let mut reference = Resolver::new();
        reference.resolve(Document::Absent, &labels, &BTreeMap::new());
        let expected = reference.resolve(Document::Absent, &labels, &annotations);
        assert_eq!(
            state.node, expected.node,
            "a refused document changed the config"
        );
    }
}

/// The cluster view of the two-DGX snapshot the extender tests use, loaded once.
fn cluster_view() -> &'static ClusterView {
    static VIEW: OnceLock<ClusterView> = OnceLock::new();
    VIEW.get_or_init(|| {
        let dir =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../scheduler-ext/tests/snapshots/two-dgx");
        match scheduler_ext::snapshot::load(&dir) {
            Ok(view) => view,
            // A harness that cannot start is a bug in the harness, reported at once.
            Err(e) => unreachable!("loading {}: {e}", dir.display()),
        }
    })
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        match tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
        {
            Ok(rt) => rt,
            Err(e) => unreachable!("tokio runtime: {e}"),
        }
    })
}

/// `POST`s `body` to `uri` on the router; the status and the body of the answer.
fn post(svc: &Arc<Service>, uri: &str, body: &[u8]) -> (StatusCode, Vec<u8>) {
    use http_body_util::BodyExt;
    use tower::ServiceExt;
    runtime().block_on(async {
        let request = Request::builder()
            .method(Method::POST)
            .uri(uri)
            .header("content-type", "application/json")
            .body(Body::from(body.to_vec()));
        let Ok(request) = request else {
            unreachable!("a request with a constant uri");
        };
        let Ok(response) = router(svc.clone()).oneshot(request).await;
        let status = response.status();
        let bytes = match response.into_body().collect().await {
            Ok(b) => b.to_bytes().to_vec(),
            Err(e) => unreachable!("reading an in-memory body: {e}"),
        };
        (status, bytes)
    })
}

/// kube-scheduler's `ExtenderArgs` body, to `filter` and `prioritize`. The service answers
/// 200 with the upstream result type or 400, never anything else.
pub fn extender_kube(data: &[u8]) {
    let svc = Arc::new(Service::new(cluster_view().clone(), Scoring::default()));
    let (status, body) = post(&svc, &format!("{KUBE_PREFIX}/filter"), data);
    assert!(
        matches!(status, StatusCode::OK | StatusCode::BAD_REQUEST),
        "filter answered {status}"
    );
    if status == StatusCode::OK {
        assert!(serde_json::from_slice::<ExtenderFilterResult>(&body).is_ok());
    }
    let (status, body) = post(&svc, &format!("{KUBE_PREFIX}/prioritize"), data);
    assert!(
        matches!(status, StatusCode::OK | StatusCode::BAD_REQUEST),
        "prioritize answered {status}"
    );
    if status == StatusCode::OK {
        let scores: Vec<HostPriority> = serde_json::from_slice(&body).unwrap_or_default();
        assert!(scores.iter().all(|h| (0..=10).contains(&h.score)));
    }
}

/// Volcano's `extender` plugin bodies, to every verb: `predicate`, `prioritize`, then
/// `allocateFunc` and `deallocateFunc` of the same task, after which the node must answer
/// `predicate` as before (a released allocation leaves nothing behind).
pub fn extender_volcano(data: &[u8]) {
    let svc = Arc::new(Service::new(cluster_view().clone(), Scoring::default()));
    let verb = |name: &str| {
        let (status, body) = post(&svc, &format!("{VOLCANO_PREFIX}/{name}"), data);
        assert!(
            matches!(status, StatusCode::OK | StatusCode::BAD_REQUEST),
            "{name} answered {status}"
        );
        (status, body)
    };
    let before = verb("predicate");
    verb("prioritize");
    verb("allocateFunc");
    verb("deallocateFunc");
    assert_eq!(
        verb("predicate"),
        before,
        "allocate + deallocate left state"
    );
}

/// One pod bound to the node, asking for 4 GPUs, whose `fumarole.dev/devices` names the first
/// four.
struct OnePendingPod(Vec<String>);

impl PodSource for OnePendingPod {
    fn bound(&self) -> Vec<BoundPod> {
        vec![BoundPod {
            namespace: "default".into(),
            name: "chosen".into(),
            uid: "uid-chosen".into(),
            arrival: 1,
            created: "2026-01-01T00:00:00Z".into(),
            scheduler: "default-scheduler".into(),
            requests: BTreeMap::from([("nvidia.com/gpu".to_string(), 4)]),
            choice: Some(devices_annotation::format(&BTreeMap::from([(
                "nvidia.com/gpu".to_string(),
                self.0.clone(),
            )]))),
            ..Default::default()
        }]
    }

    fn report(&self, _: &BoundPod, _: &str, _: &Outcome) {}
}

/// The `dgx-h100` fixture as discovery sees it, and its GPU plugin's service.
fn gpu_plugin() -> &'static DevicePluginService {
    static PLUGIN: OnceLock<DevicePluginService> = OnceLock::new();
    PLUGIN.get_or_init(|| {
        let topology = dgx_h100();
        let root = Path::new("/nonexistent");
        let resources = fumarole_device_plugin::resources::resources(&topology, root, false);
        let Some(gpus) = resources.into_iter().find(|r| r.name == "nvidia.com/gpu") else {
            unreachable!("dgx-h100 has NVIDIA GPUs");
        };
        let chosen = gpus.devices.iter().take(4).map(|d| d.id.clone()).collect();
        // No waiting: a request no pod is waiting for is answered by `select` at once.
        let pods = Pods {
            source: Arc::new(OnePendingPod(chosen)),
            await_choice: AwaitChoice {
                timeout: std::time::Duration::ZERO,
                ..AwaitChoice::default()
            },
        };
        match DevicePluginService::new(&topology, gpus, Some(pods)) {
            Ok((service, _health)) => service,
            Err(e) => unreachable!("dgx-h100 links: {e}"),
        }
    })
}

fn dgx_h100() -> NodeTopology {
    use fumarole_exporter::discover::{DiscoverOptions, Source, discover, nvml::RecordedProbe};
    let Some(fixture) = fumarole_exporter::fixtures::get("dgx-h100") else {
        unreachable!("dgx-h100 is bundled");
    };
    let dir = match tempfile::tempdir() {
        Ok(d) => d,
        Err(e) => unreachable!("temporary directory: {e}"),
    };
    if let Err(e) = fixture.materialize(dir.path()) {
        unreachable!("writing the fixture: {e}");
    }
    // SAFETY: called once, before the harness starts any thread of its own (libFuzzer and the
    // corpus test run targets on one thread).
    unsafe { fumarole_exporter::discover::use_fsroot(dir.path()) };
    let recorded = dir
        .path()
        .join(fumarole_exporter::discover::RECORDED_NVML_FILE.trim_start_matches('/'));
    let options = DiscoverOptions::new(Source::FsRoot(dir.path().to_path_buf()));
    match discover(&options, &RecordedProbe(recorded)) {
        Ok(t) => t,
        Err(e) => unreachable!("discovering dgx-h100: {e}"),
    }
}

/// A kubelet request to the GPU plugin: the first byte picks `Allocate` (even) or
/// `GetPreferredAllocation` (odd), the rest is the protobuf message as gRPC delivers it. The
/// plugin answers, or refuses with `InvalidArgument`; a preferred allocation has the size
/// asked for, from the devices offered.
pub fn device_plugin_requests(data: &[u8]) {
    let Some((kind, message)) = data.split_first() else {
        return;
    };
    let plugin = gpu_plugin();
    let refused_properly =
        |s: &tonic::Status| assert_eq!(s.code(), tonic::Code::InvalidArgument, "{s}");
    if kind % 2 == 0 {
        let Ok(request) = api::AllocateRequest::decode(message) else {
            return;
        };
        let asked = request.container_requests.len();
        match runtime().block_on(plugin.allocate(tonic::Request::new(request))) {
            Ok(r) => assert_eq!(r.into_inner().container_responses.len(), asked),
            Err(s) => refused_properly(&s),
        }
    } else {
        let Ok(request) = api::PreferredAllocationRequest::decode(message) else {
            return;
        };
        let asked = request.container_requests.clone();
        let answer =
            runtime().block_on(plugin.get_preferred_allocation(tonic::Request::new(request)));
        match answer {
            Ok(r) => {
                let answers = r.into_inner().container_responses;
                assert_eq!(answers.len(), asked.len());
                for (req, answer) in asked.iter().zip(&answers) {
                    let size = usize::try_from(req.allocation_size).unwrap_or(usize::MAX);
                    assert_eq!(answer.device_i_ds.len(), size);
                    for id in &answer.device_i_ds {
                        assert!(req.available_device_i_ds.contains(id), "{id} not offered");
                    }
                }
            }
            Err(s) => refused_properly(&s),
        }
    }
}

/// The device plugin's configuration file (`--device-plugin-config`).
pub fn device_plugin_config(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = fumarole_device_plugin::config::Config::parse(text, None);
    }
}

/// Values the agent reads from the kernel and from pod status: CFS quotas (v1 and v2), PSI
/// files, container ids, QoS classes, the cgroup driver name.
pub fn kernel_files(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    for version in [Version::V1, Version::V2] {
        if let Ok(Quota::Limited(us)) = Quota::parse(version, text) {
            assert!(us > 0);
        }
    }
    if let Ok(psi) = parse_psi(text) {
        assert!(psi.some.avg10.is_finite());
    }
    let _ = text.parse::<ContainerId>();
    let _ = text.parse::<QosClass>();
    let _ = text.parse::<Driver>();
}

/// The cluster small traces run on: two dgx-h100 nodes in one super-node, built once.
fn sim_cluster() -> &'static SimCluster {
    static CLUSTER: OnceLock<SimCluster> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        let built = "2xdgx-h100:1"
            .parse::<ClusterShape>()
            .map_err(|e| e.to_string())
            .and_then(|shape| shape.build().map_err(|e| e.to_string()));
        match built {
            Ok(cluster) => cluster,
            Err(e) => unreachable!("a bundled shape: {e}"),
        }
    })
}

/// A `simulate` job trace (JSON lines). One the reader accepts and that is small (a few jobs
/// and pods) is also run under the fumarole policy: every job either starts, at or after its
/// arrival, with all its pods placed, or is reported never placed.
pub fn simulate_trace(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(sim) = Simulation::load(sim_cluster().clone(), text, "fuzz") else {
        return;
    };
    let pods: u64 = sim.jobs.iter().map(|j| u64::from(j.job.pods)).sum();
    if sim.jobs.len() > 8 || pods > 32 {
        return;
    }
    let outcome = fumarole_sim::run(&sim, Policy::Fumarole, &fumarole_sim::Options::default());
    for (job, got) in sim.jobs.iter().zip(&outcome.jobs) {
        match got.start {
            Some(start) => {
                assert!(
                    start >= job.job.arrival,
                    "{} started before it arrived",
                    job.job.job
                );
                assert_eq!(got.pods.len(), job.job.pods as usize, "{}", job.job.job);
            }
            None => assert!(got.pods.is_empty()),
        }
    }
}

/// A live Ascend device-info ConfigMap's `DeviceInfoCfg` (anyone can write it): what parses
/// renders back and reads back as the same lists and time.
pub fn ascend_device_info(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Some((lists, time)) = ascend::parse_live(text) else {
        return;
    };
    let info = ascend::DeviceInfo {
        lists: lists.clone(),
        super_pod_id: -1,
        server_index: -1,
        rack_id: -1,
    };
    let rendered = ascend::device_info_cfg(&info, time);
    assert_eq!(
        ascend::parse_live(&rendered),
        Some((lists, time)),
        "{rendered}"
    );
}

/// `struct dcmi_chip_info` as a DCMI library fills it (three 32-byte arrays, then the AI core
/// count; a short input leaves the rest zero, as the zeroed struct the agent passes): decoded,
/// and when usable, the labels derived from it are valid label values.
pub fn dcmi_chip_info(data: &[u8]) {
    let mut raw = [0u8; 100];
    let n = data.len().min(raw.len());
    raw[..n].copy_from_slice(&data[..n]);
    let cores = u32::from_ne_bytes([raw[96], raw[97], raw[98], raw[99]]);
    let Ok(info) = answers::chip_info(&raw[0..32], &raw[32..64], &raw[64..96], cores) else {
        return;
    };
    assert!(!info.name.is_empty() && info.name.len() < 32, "{info:?}");
    for a3 in [false, true] {
        for (key, value) in ascend::chip_labels(&info, a3) {
            assert_eq!(label_value(&value), value, "{key}={value:?} from {info:?}");
        }
    }
}

/// A configuration file (`--config FILE`), against a command with a flag of each kind the
/// binaries have. What the file accepts, the command line accepts: its arguments parse.
pub fn configuration_file(data: &[u8]) {
    use clap::{Arg, ArgAction, Command, value_parser};
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    static COMMAND: OnceLock<Command> = OnceLock::new();
    let command = COMMAND.get_or_init(|| {
        let mut root = Command::new("fuzz").subcommand(
            Command::new("run")
                .arg(
                    Arg::new("compat_labels")
                        .long("compat-labels")
                        .action(ArgAction::SetTrue),
                )
                .arg(
                    Arg::new("weight")
                        .long("weight")
                        .value_parser(value_parser!(f64)),
                )
                .arg(
                    Arg::new("count")
                        .long("count")
                        .value_parser(value_parser!(u32)),
                )
                .arg(
                    Arg::new("leader_elect")
                        .long("leader-elect")
                        .action(ArgAction::Set)
                        .value_parser(value_parser!(bool)),
                )
                .arg(
                    Arg::new("names")
                        .long("names")
                        .action(ArgAction::Append)
                        .value_delimiter(',')
                        .default_value("volcano"),
                )
                .arg(
                    Arg::new("repeated")
                        .long("repeated")
                        .action(ArgAction::Append),
                )
                .arg(Arg::new("verbose").long("verbose").action(ArgAction::Count))
                .arg(Arg::new("mode").long("mode").value_parser(["text", "json"])),
        );
        root.build();
        root
    });
    let Some(run) = command.find_subcommand("run") else {
        return;
    };
    let Ok(configuration) =
        fumarole_settings::Configuration::parse(text, "FuzzConfiguration", &[run])
    else {
        return;
    };
    let arguments = configuration.arguments("run", run, &BTreeSet::new());
    let argv = ["fuzz".into(), "run".into()].into_iter().chain(arguments);
    let parsed = command.clone().try_get_matches_from(argv);
    assert!(
        parsed.is_ok(),
        "a configuration accepted as {configuration:?} is refused: {parsed:?}"
    );
}
