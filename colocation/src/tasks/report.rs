//! The co-location state report: the [`ColocationStatus`] the other tasks fill in through a
//! [`StatusTx`], written to `status.colocation` of this node's `DeviceTopology` (server-side apply
//! on the status subresource, field manager [`FIELD_MANAGER`], so the publish loop's device
//! status and ours never overwrite each other).
//!
//! Until that object exists (the publish loop creates it; it may still be starting or failing)
//! the report goes to the Node annotation [`ANNOTATION`] as JSON; once the `DeviceTopology`
//! takes it, the annotation is removed. A report is written when it changed, at most once per
//! [`MIN_GAP`]; a failed write is retried after [`RETRY`].

use std::time::Duration;

use fumarole_topology::crd::{ColocationStatus, DeviceTopology};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client, CustomResourceExt};
use serde_json::{Value, json};
use tokio::sync::watch;

/// The shared state report: each task fills in its part with `send_if_modified`, [`run`] writes
/// it out.
pub type StatusTx = watch::Sender<ColocationStatus>;

/// Our server-side apply field manager for `status.colocation`.
pub const FIELD_MANAGER: &str = "fumarole-agent-colocation";
/// Node annotation holding the report while the node has no `DeviceTopology`.
pub const ANNOTATION: &str = "fumarole.dev/colocation-status";
/// At most one write per this.
pub const MIN_GAP: Duration = Duration::from_secs(1);
/// Wait after a failed write, and between tries to move a report from the Node annotation to
/// the `DeviceTopology`.
pub const RETRY: Duration = Duration::from_secs(10);

/// Where the report went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Target {
    DeviceTopology,
    NodeAnnotation,
}

/// Writes every new report until all senders are gone.
pub async fn run(
    client: Client,
    node_name: String,
    mut reports: watch::Receiver<ColocationStatus>,
) {
    let writer = Writer {
        topologies: Api::all(client.clone()),
        nodes: Api::all(client),
        node: node_name,
    };
    let mut written: Option<(ColocationStatus, Target)> = None;
    // A report left on the Node by an earlier run is ours to remove once it moves.
    let mut annotated = true;
    loop {
        let report = reports.borrow_and_update().clone();
        let target = written.as_ref().map(|(_, t)| *t);
        let stale = written.as_ref().is_none_or(|(w, _)| *w != report);
        if stale || target == Some(Target::NodeAnnotation) {
            match writer.write(&report, &mut annotated).await {
                Ok(target) => {
                    if written.as_ref().map(|(_, t)| *t) != Some(target) {
                        tracing::info!(node = %writer.node, ?target, "co-location: state report written");
                    }
                    written = Some((report, target));
                }
                Err(e) => {
                    tracing::warn!(node = %writer.node, error = %e, "co-location: writing the state report failed; retrying");
                    tokio::time::sleep(RETRY).await;
                    continue;
                }
            }
        }
        let waiting_for_topology = written
            .as_ref()
            .is_some_and(|(_, t)| *t == Target::NodeAnnotation);
        tokio::select! {
            changed = reports.changed() => if changed.is_err() { return },
            () = tokio::time::sleep(RETRY), if waiting_for_topology => {}
        }
        tokio::time::sleep(MIN_GAP).await;
    }
}

struct Writer {
    topologies: Api<DeviceTopology>,
    nodes: Api<Node>,
    node: String,
}

impl Writer {
    async fn write(&self, report: &ColocationStatus, annotated: &mut bool) -> kube::Result<Target> {
        let crd = DeviceTopology::api_resource();
        let body = json!({
            "apiVersion": crd.api_version,
            "kind": crd.kind,
            "metadata": {"name": self.node},
            "status": {"colocation": report},
        });
        let params = PatchParams::apply(FIELD_MANAGER).force();
        match self
            .topologies
            .patch_status(&self.node, &params, &Patch::Apply(&body))
            .await
        {
            Ok(_) => {
                if *annotated {
                    self.annotate(None).await?;
                    *annotated = false;
                }
                Ok(Target::DeviceTopology)
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {
                let text = serde_json::to_string(report).unwrap_or_default();
                self.annotate(Some(text)).await?;
                *annotated = true;
                Ok(Target::NodeAnnotation)
            }
            Err(e) => Err(e),
        }
    }

    /// Sets or removes the annotation with a merge patch, which never creates a Node.
    async fn annotate(&self, text: Option<String>) -> kube::Result<()> {
        let removing = text.is_none();
        let value = text.map_or(Value::Null, Value::String);
        let patch = json!({"metadata": {"annotations": {ANNOTATION: value}}});
        match self
            .nodes
            .patch(&self.node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => Ok(()),
            // No Node, nothing to remove.
            Err(kube::Error::Api(s)) if s.code == 404 && removing => Ok(()),
            Err(e) => Err(e),
        }
    }
}
