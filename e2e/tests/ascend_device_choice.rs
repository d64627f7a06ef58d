//! Huawei's Ascend annotations through the kubelet's real device manager (a harness node for
//! the `atlas-800-910` fixture, 8 Ascend 910) and the agent's Ascend device plugin in cluster
//! mode:
//! - a pod bound the way Huawei's Volcano plugin binds it (`spec.nodeName`, with
//!   `huawei.com/Ascend910: "Ascend910-2,Ascend910-3"` and `predicate-time`) gets exactly NPUs
//!   2 and 3 (the kubelet's record, `ASCEND_VISIBLE_DEVICES`, the device nodes), and the agent
//!   writes `huawei.com/AscendReal` naming them;
//! - both annotations, different: `fumarole.dev/devices` wins, a `DeviceChoiceConflict` Event;
//! - fumarole's extension binds an Ascend pod: it writes `huawei.com/Ascend910` naming the
//!   same NPUs as its `fumarole.dev/devices`, and the pod gets them;
//! - a garbled `huawei.com/Ascend910` and one naming NPU 9 (the node has 0-7): a Warning Event
//!   naming the problem, and the pod gets only the count it asked for, from the free NPUs
//!   (the documented fallback for a bad `fumarole.dev/devices`: the node chooses).
//!
//! The annotations fumarole writes are read back with [`huawei`], a parser written from the
//! reference (`shared/reference/ascend-contract.md`), not with fumarole's own code.

// Test code: helpers outside #[test] fns may unwrap and panic too.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::time::Duration;

use fumarole_e2e::cluster::{eventually, http_post_json};
use fumarole_e2e::harness_node::PodRecord;
use fumarole_e2e::process::Proc;
use fumarole_e2e::{AgentBuilder, HarnessNode, NodeSpec, TestCluster};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

const NPU: &str = "huawei.com/Ascend910";
const NODE: &str = "atlas-0";
const T: Duration = Duration::from_secs(60);

/// Huawei's pod annotation formats, from the reference alone: a device list is
/// `<Chip>-<physical id>` names joined by commas, the chip being the resource name's part
/// after `huawei.com/`.
mod huawei {
    /// The physical ids a device list of resource `resource` names, in order.
    pub fn device_list(resource: &str, value: &str) -> Result<Vec<u32>, String> {
        let chip = resource
            .strip_prefix("huawei.com/")
            .ok_or_else(|| format!("{resource} is not a huawei.com resource"))?;
        value
            .split(',')
            .map(|name| {
                let id = name
                    .strip_prefix(chip)
                    .and_then(|rest| rest.strip_prefix('-'))
                    .ok_or_else(|| format!("{name:?} is not a {chip} device name"))?;
                id.parse::<u32>()
                    .map_err(|e| format!("{name:?}: physical id {id:?}: {e}"))
            })
            .collect()
    }

    #[test]
    fn reads_the_reference_example() {
        assert_eq!(
            device_list("huawei.com/Ascend910", "Ascend910-2,Ascend910-3"),
            Ok(vec![2, 3])
        );
        assert!(device_list("huawei.com/Ascend910", "Ascend310P-2").is_err());
    }
}

/// The agent in cluster mode on the atlas-800-910 fixture, its device plugins registered with
/// `node`'s kubelet.
fn agent(cluster: &TestCluster, node: &HarnessNode) -> Proc {
    AgentBuilder::fixture("atlas-800-910")
        .node(NODE)
        .device_plugin_dir(node.plugin_dir())
        .without_host_kubelet(cluster.root())
        .env("RUST_LOG", "info")
        .spawn_in(cluster)
        .unwrap()
}

/// A pod asking for `n` NPUs with `annotations`, bound to `NODE` by `spec.nodeName` (as
/// Huawei's plugin's bind leaves it) when `bound`.
fn pod(name: &str, n: u32, annotations: Value, bound: bool) -> Pod {
    let mut spec = json!({"containers": [{"name": "main", "image": "example.invalid/none",
        "resources": {"limits": {NPU: n.to_string()}}}]});
    if bound {
        spec["nodeName"] = json!(NODE);
    }
    serde_json::from_value(json!({
        "metadata": {"name": name, "annotations": annotations},
        "spec": spec,
    }))
    .unwrap()
}

/// The pod's NPUs by the kubelet's device manager, after checking that the agent's `Allocate`
/// answer agrees: `ASCEND_VISIBLE_DEVICES` the davinci numbers, a device node each.
fn allocated(record: &PodRecord) -> Vec<String> {
    assert!(record.admitted, "{record:?}");
    let devices = record.devices(NPU);
    let numbers: BTreeSet<u32> = devices
        .iter()
        .map(|id| huawei::device_list(NPU, id).unwrap()[0])
        .collect();
    let c = record.container("main").unwrap();
    let options = c.options.as_ref().unwrap();
    let visible: BTreeSet<u32> = options.envs["ASCEND_VISIBLE_DEVICES"]
        .split(',')
        .map(|n| n.parse().unwrap())
        .collect();
    assert_eq!(
        visible, numbers,
        "{}: env and allocation differ",
        record.name
    );
    let nodes: BTreeSet<String> = options
        .devices
        .iter()
        .map(|d| d.host_path.clone())
        .filter(|p| p.trim_start_matches("/dev/davinci").parse::<u32>().is_ok())
        .collect();
    let want: BTreeSet<String> = numbers.iter().map(|n| format!("/dev/davinci{n}")).collect();
    assert_eq!(
        nodes, want,
        "{}: device nodes and allocation differ",
        record.name
    );
    devices
}

/// Warning Events on `pod`, as `reason: note`.
async fn warnings(cluster: &TestCluster, pod: &str) -> Vec<String> {
    use k8s_openapi::api::events::v1::Event;
    use kube::api::ListParams;
    let events: Api<Event> = Api::namespaced(cluster.client(), "default");
    events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(pod))
        .filter(|e| e.type_.as_deref() == Some("Warning"))
        .map(|e| {
            format!(
                "{}: {}",
                e.reason.unwrap_or_default(),
                e.note.unwrap_or_default()
            )
        })
        .collect()
}

async fn wait_warning(cluster: &TestCluster, pod: &str, reason: &str, text: &str) -> String {
    eventually(&format!("{reason} on {pod}"), T, || async {
        Ok(warnings(cluster, pod)
            .await
            .into_iter()
            .find(|e| e.starts_with(reason) && e.contains(text)))
    })
    .await
    .unwrap()
}

/// `huawei.com/AscendReal` of `name` once the agent wrote it, as physical ids.
async fn ascend_real(pods: &Api<Pod>, name: &str) -> Vec<u32> {
    let value = eventually(&format!("huawei.com/AscendReal on {name}"), T, || async {
        Ok(pods
            .get(name)
            .await?
            .annotations()
            .get("huawei.com/AscendReal")
            .cloned())
    })
    .await
    .unwrap();
    huawei::device_list(NPU, &value).unwrap()
}

fn names(ids: &[u32]) -> Vec<String> {
    ids.iter().map(|i| format!("Ascend910-{i}")).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn huaweis_ascend_annotations_are_honoured_written_and_checked() {
    let cluster = TestCluster::start().await.unwrap();
    cluster.install_fumarole_crds().await.unwrap();
    cluster
        .create_node(&NodeSpec::new(NODE).capacity("cpu", "192"))
        .await
        .unwrap();
    let node = cluster.start_harness_node(NODE).await.unwrap();
    let _agent = agent(&cluster, &node);
    node.wait_allocatable(NPU, 8, T).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    let admit = |p: Pod| {
        let (pods, node) = (pods.clone(), &node);
        async move {
            let created = pods.create(&PostParams::default(), &p).await.unwrap();
            node.wait_decided(&created, T).await.unwrap()
        }
    };
    let mut given: BTreeSet<String> = BTreeSet::new();
    let mut take = |got: &[String]| {
        for id in got {
            assert!(given.insert(id.clone()), "{id} given twice");
        }
    };

    // Huawei's choice, bound by spec.nodeName: exactly NPUs 2 and 3, and AscendReal says so.
    let r = admit(pod(
        "huawei",
        2,
        json!({NPU: "Ascend910-2,Ascend910-3", "predicate-time": "1764130000000000000"}),
        true,
    ))
    .await;
    let got = allocated(&r);
    assert_eq!(got, names(&[2, 3]));
    take(&got);
    assert_eq!(ascend_real(&pods, "huawei").await, [2, 3]);
    assert!(warnings(&cluster, "huawei").await.is_empty());

    // Both annotations, different: fumarole's wins and the pod hears of Huawei's.
    let ours = json!({NPU: ["Ascend910-6", "Ascend910-7"]}).to_string();
    let r = admit(pod(
        "both",
        2,
        json!({NPU: "Ascend910-0,Ascend910-1", "fumarole.dev/devices": ours}),
        true,
    ))
    .await;
    let got = allocated(&r);
    assert_eq!(got, names(&[6, 7]));
    take(&got);
    wait_warning(
        &cluster,
        "both",
        "DeviceChoiceConflict",
        "huawei.com/Ascend910 names Ascend910-0,Ascend910-1",
    )
    .await;
    assert_eq!(ascend_real(&pods, "both").await, [6, 7]);

    // fumarole's extension chooses and binds: Huawei's annotation names the same NPUs.
    let port = cluster.start_scheduler_ext(&[]).await.unwrap();
    let created = pods
        .create(
            &PostParams::default(),
            &pod("extension", 2, json!({}), false),
        )
        .await
        .unwrap();
    let uid = created.uid().unwrap();
    eventually("bind through the extension", T, || {
        let uid = uid.clone();
        async move {
            let body = json!({"PodName": "extension", "PodNamespace": "default",
                "PodUID": uid, "Node": NODE});
            let answer: Value =
                serde_json::from_str(&http_post_json(port, "/kube-scheduler/bind", &body).await?)?;
            // The view may not list the node's NPUs yet: try again.
            Ok((answer["Error"] == "").then_some(()))
        }
    })
    .await
    .unwrap();
    let bound = pods.get("extension").await.unwrap();
    let a = bound.annotations();
    let theirs = huawei::device_list(NPU, &a[NPU]).unwrap();
    let choice: Value = serde_json::from_str(&a["fumarole.dev/devices"]).unwrap();
    let ours: Vec<String> = serde_json::from_value(choice[NPU].clone()).unwrap();
    assert_eq!(names(&theirs), ours, "the two annotations differ");
    let r = node.wait_decided(&bound, T).await.unwrap();
    let got = allocated(&r);
    let mut want = ours.clone();
    want.sort();
    assert_eq!(got, want);
    take(&got);
    let mut real = ascend_real(&pods, "extension").await;
    real.sort();
    let mut theirs = theirs;
    theirs.sort();
    assert_eq!(real, theirs);
    assert!(warnings(&cluster, "extension").await.is_empty());

    // Garbled: ignored with the reason; the pod gets one NPU, a free one.
    let r = admit(pod(
        "garbled",
        1,
        json!({NPU: "Ascend910-2;Ascend910-x"}),
        true,
    ))
    .await;
    let got = allocated(&r);
    assert_eq!(got.len(), 1);
    take(&got);
    wait_warning(
        &cluster,
        "garbled",
        "DeviceChoiceIgnored",
        "ignoring huawei.com/Ascend910: \"Ascend910-2;Ascend910-x\" is not a device name",
    )
    .await;

    // NPU 9 (the node has 0-7): ignored with the reason; one NPU, the last free one.
    let r = admit(pod("ghost", 1, json!({NPU: "Ascend910-9"}), true)).await;
    let got = allocated(&r);
    assert_eq!(got.len(), 1);
    take(&got);
    wait_warning(
        &cluster,
        "ghost",
        "DeviceChoiceIgnored",
        "\"Ascend910-9\" is not a huawei.com/Ascend910 device of this node",
    )
    .await;
    assert_eq!(given.len(), 8);
}
