//! Setup shared by the scheduler-extension e2e tests: nodes that publish `DeviceTopology`
// Each test binary uses part of this module.
#![allow(dead_code)]
//! objects (as the agent would), fumarole-scheduler-ext serving the live cluster, and the
//! scheduler configurations that call it.

use std::collections::BTreeMap;

use fumarole_e2e::{NodeSpec, TestCluster, fumarole};
use fumarole_topology::annotation::{self, DEVICES_ANNOTATION};
use fumarole_topology::crd::device_topology::SuperNodeInfo;
use fumarole_topology::crd::{DeviceTopology, testing};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};

/// A node of `gpus` NVIDIA GPUs `<name>-gpu<i>`, every pair on NVLink, the listed ones
/// allocated (to pods the node runs), in super-node `rack` if given.
pub fn dgx(name: &str, gpus: u32, allocated: &[u32], rack: Option<&str>) -> DeviceTopology {
    let mut t = testing::nvlink_node(name, gpus, 180, allocated, |i| format!("{name}-gpu{i}"));
    t.spec.model = "NVIDIA H100 80GB HBM3".into();
    t.spec.super_node = rack.map(|r| SuperNodeInfo {
        id: r.into(),
        source: "config".into(),
    });
    t
}

/// A MetaX C500 node as the agent publishes the `metax-c500-8` fixture: 8 GPUs `<name>-gpu<i>`
/// in two MetaXLink groups (0-3 and 4-7, one per NUMA node) joined across the NUMA nodes, the
/// listed ones allocated, in super-node `rack` if given.
pub fn metax(name: &str, allocated: &[u32], rack: Option<&str>) -> DeviceTopology {
    let mut t = dgx(name, 8, allocated, rack);
    t.spec.model = "MetaX C500".into();
    for d in &mut t.spec.devices {
        d.vendor = "metax".into();
    }
    for l in &mut t.spec.links {
        let within = (l.a < 4) == (l.b < 4);
        l.kind = if within { "metaxLink" } else { "crossNuma" }.into();
        l.weight = if within { 200 } else { 10 };
    }
    t
}

/// The extended resource a topology's accelerators are advertised as.
pub fn resource_of(t: &DeviceTopology) -> &'static str {
    match t.spec.devices.first().map(|d| d.vendor.as_str()) {
        Some("metax") => "metax-tech.com/gpu",
        Some("huawei") => "huawei.com/Ascend910",
        _ => "nvidia.com/gpu",
    }
}

/// What a topology's device plugin advertises: its whole devices as [`resource_of`], each
/// device offered in replicas as its `sharing` resource times the replicas, each MIG device as
/// `nvidia.com/mig-<profile>`.
pub fn offered(t: &DeviceTopology) -> BTreeMap<String, u32> {
    let mut out: BTreeMap<String, u32> = BTreeMap::new();
    for d in &t.spec.devices {
        let mut add = |r: String, n: u32| *out.entry(r).or_default() += n;
        match &d.sharing {
            Some(s) => add(s.resource.clone(), s.replicas),
            None if d.mig.is_empty() => add(resource_of(t).to_string(), 1),
            None => {}
        }
        for m in &d.mig {
            add(fumarole_topology::share::mig_resource(&m.profile), 1);
        }
    }
    out
}

/// A pod for Volcano asking for `gpus` NVIDIA GPUs (and 1 CPU, 1 GiB).
pub fn volcano_gpu_pod(name: &str, gpus: u32) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {
            "schedulerName": "volcano",
            "containers": [{
                "name": "c", "image": "example.invalid/none",
                "resources": {"requests": {"cpu": "1", "memory": "1Gi"},
                              "limits": {"nvidia.com/gpu": gpus.to_string()}}
            }]
        }
    }))
    .unwrap()
}

/// Creates a Node for each topology (advertising all its GPUs, so only the extender tells
/// free from used) and publishes the topology with its status.
pub async fn publish(cluster: &TestCluster, topologies: &[DeviceTopology]) {
    let api: Api<DeviceTopology> = Api::all(cluster.client());
    for t in topologies {
        let name = t.metadata.name.clone().unwrap();
        let node = offered(t).into_iter().fold(
            NodeSpec::new(&name)
                .capacity("cpu", "64")
                .capacity("memory", "512Gi"),
            |node, (resource, n)| node.capacity(&resource, &n.to_string()),
        );
        cluster.create_node(&node).await.unwrap();
        let mut spec_only = t.clone();
        spec_only.status = None;
        api.create(&PostParams::default(), &spec_only)
            .await
            .unwrap();
        let status = serde_json::json!({"status": t.status});
        api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .unwrap();
    }
}

/// A cluster with our CRDs and no nodes yet.
pub async fn cluster() -> TestCluster {
    let cluster = TestCluster::start().await.unwrap();
    cluster.install_fumarole_crds().await.unwrap();
    cluster
}

/// A cluster with `topologies` published and fumarole-scheduler-ext (with `args`) serving it;
/// returns the cluster and the service's port.
pub async fn cluster_with_extender(
    topologies: &[DeviceTopology],
    args: &[&str],
) -> (TestCluster, u16) {
    let cluster = cluster().await;
    publish(&cluster, topologies).await;
    let port = cluster.start_scheduler_ext(args).await.unwrap();
    (cluster, port)
}

/// dgx-a: 4 of 8 GPUs free (4-7); dgx-b: 6 of 8 free (2-7); pcie-a: 3 of 4 free (1-3).
pub fn two_dgx() -> Vec<DeviceTopology> {
    vec![
        dgx("dgx-a", 8, &[0, 1, 2, 3], None),
        dgx("dgx-b", 8, &[0, 1], None),
        dgx("pcie-a", 4, &[0], None),
    ]
}

/// Three super-nodes of 8-GPU nodes with 4 GPUs free each (4-7): rack-a (a0..a3, 16 free),
/// rack-b (b0..b3, 16 free) and rack-c (c0..c2, 12 free).
pub fn racks() -> Vec<DeviceTopology> {
    let mut out = Vec::new();
    for (rack, prefix, n) in [("rack-a", "a", 4), ("rack-b", "b", 4), ("rack-c", "c", 3)] {
        for i in 0..n {
            out.push(dgx(&format!("{prefix}{i}"), 8, &[0, 1, 2, 3], Some(rack)));
        }
    }
    out
}

/// The super-node of a node of [`racks`].
pub fn rack_of(node: &str) -> &'static str {
    match node.chars().next() {
        Some('a') => "rack-a",
        Some('b') => "rack-b",
        Some('c') => "rack-c",
        _ => "?",
    }
}

/// How Volcano reaches fumarole.
#[derive(Clone, Copy, Debug)]
pub enum Way {
    /// Upstream's vc-scheduler, its `extender` plugin, fumarole-scheduler-ext.
    Extender,
    /// `vc-scheduler-fumarole`: Volcano's scheduler with fumarole's plugin compiled in.
    Plugin,
    /// `vc-scheduler-fumarole-v1.14.1` (the same plugin built against Volcano v1.14.1), beside
    /// Volcano v1.14.1's CRDs and vc-controller-manager.
    PluginOnV1_14,
}

/// The Volcano release [`Way::PluginOnV1_14`] runs.
pub const VOLCANO_V1_14: &str = "v1.14.1";

/// Starts Volcano on `cluster` (its nodes published) deciding with fumarole the `way` given:
/// fumarole-scheduler-ext with `extender_args` behind upstream vc-scheduler's `extender`
/// plugin, or vc-scheduler-fumarole with the configuration `plugin_conf`, where the plugin
/// reads its arguments.
pub async fn start_volcano(
    cluster: &TestCluster,
    way: Way,
    extender_args: &[&str],
    plugin_conf: &str,
) {
    match way {
        Way::Extender => {
            let port = cluster.start_scheduler_ext(extender_args).await.unwrap();
            cluster
                .start_volcano(&fumarole::volcano_conf_with_extender(port))
                .await
                .unwrap();
        }
        Way::Plugin => {
            let scheduler = fumarole::volcano_plugin_bin().unwrap();
            cluster
                .start_volcano_with(&scheduler, plugin_conf)
                .await
                .unwrap();
        }
        Way::PluginOnV1_14 => {
            let release = fumarole_e2e::upstream::Upstream::get()
                .unwrap()
                .volcano_release(VOLCANO_V1_14)
                .unwrap();
            let scheduler = fumarole::volcano_plugin_bin_for(VOLCANO_V1_14).unwrap();
            cluster
                .start_volcano_release(&release, &scheduler, plugin_conf)
                .await
                .unwrap();
            // The binary says which Volcano it was built against (build.sh stamps it).
            let log = cluster.log_tail("vc-scheduler", 4000).unwrap();
            assert!(
                log.contains(&format!("(Volcano {VOLCANO_V1_14}-fumarole)")),
                "vc-scheduler is not Volcano {VOLCANO_V1_14}:\n{log}"
            );
        }
    }
}

/// A cluster with `topologies` published and Volcano deciding with fumarole the `way` given,
/// the plugin with the seeds' configuration unchanged ([`fumarole::SEED_VOLCANO_CONF`]).
pub async fn volcano_with(topologies: &[DeviceTopology], way: Way) -> TestCluster {
    let cluster = cluster().await;
    publish(&cluster, topologies).await;
    start_volcano(&cluster, way, &[], fumarole::SEED_VOLCANO_CONF).await;
    cluster
}

/// The logs of whatever decided, for a failure message.
pub fn decider_logs(cluster: &TestCluster) -> String {
    format!(
        "scheduler-ext:\n{}\nvc-scheduler:\n{}",
        cluster
            .log_tail("fumarole-scheduler-ext", 60)
            .unwrap_or_default(),
        cluster.log_tail("vc-scheduler", 80).unwrap_or_default()
    )
}

/// Every extender call succeeded (Volcano logs failed ones and carries on), and fumarole's
/// plugin neither failed to start nor stopped a panic.
pub fn assert_no_failed_calls(cluster: &TestCluster) {
    let log = cluster.log_tail("vc-scheduler", 4000).unwrap();
    for failure in [
        "Predicate failed",
        "Prioritize failed",
        "fumarole is not ready",
        "fumarole panicked",
    ] {
        assert!(
            !log.contains(failure),
            "{failure} in vc-scheduler log:\n{log}"
        );
    }
}

/// kube-scheduler configuration with fumarole-scheduler-ext as filtering, scoring and binding
/// extender for `nvidia.com/gpu` pods.
pub fn kube_scheduler_config(port: u16) -> String {
    fumarole::kube_scheduler_config(port, &["nvidia.com/gpu"])
}

/// The devices a pod carries in `fumarole.dev/devices`, if any.
pub fn devices_of(pod: &Pod) -> Option<Vec<String>> {
    let value = pod.metadata.annotations.as_ref()?.get(DEVICES_ANNOTATION)?;
    let choice = annotation::parse(value).unwrap();
    Some(choice.into_values().flatten().collect())
}

/// Pod name -> (node, devices) for bound pods with our annotation.
pub async fn placements(
    pods: &Api<Pod>,
    names: &[String],
) -> BTreeMap<String, (String, Vec<String>)> {
    let mut out = BTreeMap::new();
    for n in names {
        // Not created yet (a controller makes them) counts as not placed.
        let Some(p) = pods.get_opt(n).await.unwrap() else {
            continue;
        };
        if let (Some(node), Some(devices)) = (
            p.spec.as_ref().and_then(|s| s.node_name.clone()),
            devices_of(&p),
        ) {
            out.insert(n.clone(), (node, devices));
        }
    }
    out
}

/// Waits up to 90 s for pod `name` bound with fumarole's device annotation: (name, (node,
/// devices)).
pub async fn placed(
    pods: &Api<Pod>,
    name: &str,
) -> anyhow::Result<(String, (String, Vec<String>))> {
    let what = format!("{name} bound and annotated");
    fumarole_e2e::cluster::eventually(&what, std::time::Duration::from_secs(90), || async {
        Ok(placements(pods, &[name.to_string()]).await.pop_first())
    })
    .await
}

/// Waits up to `within` until every pod of `names` is bound with our annotation
/// ([`placements`]); the error names how long it waited.
pub async fn all_placed(
    pods: &Api<Pod>,
    names: &[String],
    within: std::time::Duration,
) -> anyhow::Result<BTreeMap<String, (String, Vec<String>)>> {
    let what = format!("all {} pods bound and annotated", names.len());
    fumarole_e2e::cluster::eventually(&what, within, || async {
        let placed = placements(pods, names).await;
        Ok((placed.len() == names.len()).then_some(placed))
    })
    .await
}

/// Checks a job's placement: every pod's devices lie on its node and no device is given twice;
/// the pods of each unit of `per_unit` consecutive ranks share one super-node, and the units
/// use different super-nodes. Returns each unit's super-node.
pub fn check_units(
    placed: &BTreeMap<String, (String, Vec<String>)>,
    rank: impl Fn(&str) -> u32,
    per_unit: u32,
) -> BTreeMap<u32, String> {
    let mut seen = std::collections::BTreeSet::new();
    let mut units: BTreeMap<u32, std::collections::BTreeSet<&str>> = BTreeMap::new();
    for (pod, (node, devices)) in placed {
        for d in devices {
            assert!(
                d.starts_with(&format!("{node}-gpu")),
                "{pod}: {d} is not on {node}"
            );
            assert!(seen.insert(d.clone()), "{d} given twice");
        }
        units
            .entry(rank(pod) / per_unit)
            .or_default()
            .insert(rack_of(node));
    }
    let mut out = BTreeMap::new();
    for (unit, racks) in units {
        assert_eq!(racks.len(), 1, "unit {unit} spans {racks:?}: {placed:?}");
        out.insert(unit, racks.into_iter().next().unwrap().to_string());
    }
    out
}

/// Every pod of the namespace as `name node annotation`, for failure messages.
pub async fn pod_states(pods: &Api<Pod>) -> Vec<String> {
    let list = pods.list(&Default::default()).await.unwrap();
    list.items
        .iter()
        .map(|p| {
            format!(
                "{} on {:?} devices {:?}",
                p.metadata.name.as_deref().unwrap_or("?"),
                p.spec.as_ref().and_then(|s| s.node_name.as_deref()),
                devices_of(p)
            )
        })
        .collect()
}

/// A pod asking for 1 CPU and `gpus` NVIDIA GPUs (none for 0), for kube-scheduler.
pub fn gpu_pod(name: &str, gpus: u32, annotations: serde_json::Value) -> Pod {
    let limits = if gpus == 0 {
        serde_json::json!({})
    } else {
        serde_json::json!({"nvidia.com/gpu": gpus.to_string()})
    };
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"containers": [{
            "name": "c", "image": "example.invalid/none",
            "resources": {"requests": {"cpu": "1"}, "limits": limits}
        }]}
    }))
    .unwrap()
}

/// Over [`racks`], through whichever scheduler runs: `huge-0` (a 2-GPU pod of a 32-GPU
/// gpu-group-size unit, which fits no super-node) and a job of 16 pods of 2 GPUs in units of 16
/// GPUs. Waits for the 16 to be bound and checks each unit landed whole in one super-node
/// (rack-a and rack-b; rack-c is too small), over 8 nodes, no device given twice.
pub async fn place_a_group_job_over_the_racks(pods: &Api<Pod>) {
    let pp = PostParams::default();
    let group = |size: &str| serde_json::json!({"metax-tech.com/gpu-group-size": size});
    pods.create(&pp, &gpu_pod("huge-0", 2, group("32")))
        .await
        .unwrap();
    let names: Vec<String> = (0..16).map(|i| format!("train-{i}")).collect();
    for n in &names {
        pods.create(&pp, &gpu_pod(n, 2, group("16"))).await.unwrap();
    }
    let placed = all_placed(pods, &names, std::time::Duration::from_secs(120))
        .await
        .unwrap();
    let rank = |pod: &str| pod.trim_start_matches("train-").parse::<u32>().unwrap();
    let units = check_units(&placed, rank, 8);
    let racks: std::collections::BTreeSet<&str> = units.values().map(String::as_str).collect();
    assert_eq!(
        racks,
        std::collections::BTreeSet::from(["rack-a", "rack-b"]),
        "{placed:?}"
    );
    let nodes: std::collections::BTreeSet<&str> =
        placed.values().map(|(n, _)| n.as_str()).collect();
    assert_eq!(nodes.len(), 8, "{placed:?}");
}

/// A pod asking for `n` of `resource` (time-sliced replicas, a MIG profile).
pub fn share_pod(name: &str, resource: &str, n: u32) -> Pod {
    scheduled_share_pod(name, resource, n, "default-scheduler")
}

/// [`share_pod`] for the scheduler called `scheduler`.
pub fn scheduled_share_pod(name: &str, resource: &str, n: u32, scheduler: &str) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {"schedulerName": scheduler, "containers": [{
            "name": "c", "image": "example.invalid/none",
            "resources": {"requests": {"cpu": "100m"}, "limits": {resource: n.to_string()}}
        }]}
    }))
    .unwrap()
}

/// `shared-a` (2 GPUs in 4 time-sliced replicas, 2 of GPU 0's held by other pods, so 6 free
/// though its Node advertises 8), `shared-b` (8 GPUs in 4 replicas, none held), `mig-d` (one
/// H100 with two 3g.40gb MIG devices) and `whole-c` (8 whole GPUs).
pub fn share_nodes() -> Vec<DeviceTopology> {
    use fumarole_topology::crd::SharingInfo;
    use fumarole_topology::crd::device_topology::{MigInfo, ShareAllocation};
    let shared = |name: &str, gpus: u32| {
        let mut t = dgx(name, gpus, &[], None);
        for d in &mut t.spec.devices {
            d.sharing = Some(SharingInfo {
                resource: "nvidia.com/gpu.shared".into(),
                mechanism: "timeSlicing".into(),
                replicas: 4,
            });
        }
        t
    };
    let mut a = shared("shared-a", 2);
    let gpu0 = a
        .status
        .get_or_insert_default()
        .devices
        .entry("shared-a-gpu0".into())
        .or_default();
    gpu0.health = "Healthy".into();
    gpu0.shares = (0..2)
        .map(|r| ShareAllocation {
            share: format!("shared-a-gpu0::{r}"),
            namespace: "other".into(),
            pod: format!("infer-{r}"),
            container: "main".into(),
        })
        .collect();
    let mut mig = dgx("mig-d", 1, &[], None);
    mig.spec.devices[0].mig = (0..2)
        .map(|k| MigInfo {
            uuid: format!("MIG-d-{k}"),
            profile: "3g.40gb".into(),
        })
        .collect();
    vec![a, shared("shared-b", 8), mig, dgx("whole-c", 8, &[], None)]
}

/// Over [`share_nodes`], through whichever scheduler runs (`scheduler`, the pods'
/// `schedulerName`): seven one-replica pods, one after the other. The first six pack onto
/// `shared-a` (GPU 0's last two, then GPU 1, never opening `shared-b`), counting the replicas
/// committed and not reported yet; the seventh finds `shared-a` full and goes to `shared-b`.
/// A MIG pod lands on `mig-d`, a whole-GPU pod on `whole-c`; no share pod carries a device
/// choice. With `counted_by` (a cluster running fumarole-scheduler-ext for a scheduler that
/// binds without telling it, Volcano v1.10), each share pod is also waited for until the
/// extension's log says it counted the pod's shares, so the next pod is judged with them.
pub async fn place_shares(pods: &Api<Pod>, scheduler: &str, counted_by: Option<&TestCluster>) {
    let pp = PostParams::default();
    let bound = |name: String| {
        let pods = pods.clone();
        async move {
            let what = format!("{name} bound");
            fumarole_e2e::cluster::eventually(&what, std::time::Duration::from_secs(60), || {
                let pods = pods.clone();
                let name = name.clone();
                async move { Ok(pods.get(&name).await?.spec.and_then(|s| s.node_name)) }
            })
            .await
            .unwrap()
        }
    };
    let mut nodes = Vec::new();
    for i in 0..7 {
        let name = format!("infer-{i}");
        let pod = scheduled_share_pod(&name, "nvidia.com/gpu.shared", 1, scheduler);
        pods.create(&pp, &pod).await.unwrap();
        nodes.push(bound(name.clone()).await);
        if let Some(cluster) = counted_by {
            let what = format!("the extension counting {name}'s share");
            // The log may be coloured: the pod's name ends at a space or an escape.
            let keys = [format!("default/{name} "), format!("default/{name}\u{1b}")];
            fumarole_e2e::cluster::eventually(&what, std::time::Duration::from_secs(30), || {
                let log = cluster
                    .log_tail("fumarole-scheduler-ext", 400)
                    .unwrap_or_default();
                let counted = log.lines().any(|l| {
                    l.contains("counted the shares") && keys.iter().any(|k| l.contains(k))
                });
                async move { Ok(counted.then_some(())) }
            })
            .await
            .unwrap();
        }
    }
    let a = "shared-a";
    assert_eq!(nodes, [a, a, a, a, a, a, "shared-b"]);
    let mig = scheduled_share_pod("mig", "nvidia.com/mig-3g.40gb", 1, scheduler);
    pods.create(&pp, &mig).await.unwrap();
    assert_eq!(bound("mig".into()).await, "mig-d");
    let mut whole = gpu_pod("whole", 2, serde_json::json!({}));
    whole.spec.as_mut().unwrap().scheduler_name = Some(scheduler.into());
    pods.create(&pp, &whole).await.unwrap();
    assert_eq!(bound("whole".into()).await, "whole-c");
    for i in 0..7 {
        let p = pods.get(&format!("infer-{i}")).await.unwrap();
        assert_eq!(devices_of(&p), None, "infer-{i} carries a choice");
    }
}
