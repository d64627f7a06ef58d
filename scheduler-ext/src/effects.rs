//! Every API write of the decisions, in one place: the `fumarole.dev/devices` annotation (with
//! the node it is for), alone ([`Effects::annotate`]) or carried by the pod's `Binding`
//! ([`Effects::bind`]); the withdrawal of a promise never bound ([`Effects::withdraw`]); and
//! the leader's label on its own Pod when a term begins or ends ([`Effects::label_leader`]).
//! Beside an Ascend choice goes Huawei's `huawei.com/<Chip>` annotation naming the same NPUs
//! ([`ascend::from_choice`]), so Huawei's device plugin, if it served the node instead of
//! fumarole's, would hand out the same ones, and the annotations the training job reads
//! (`hccl/rankIndex`, `super-pod-rank`, `super-pod-id`: computed by
//! [`crate::decider::job_annotations`]), in the same write, or for a Binding in a patch just
//! before it (the admission policy allows a Binding only the choice's keys: the API server
//! copies them over whatever the pod has). A pod not bound yet is read from
//! the [`PodStore`] (which keeps those whole), any other from the API server
//! ([`Effects::pod`], [`Effects::checked_pod`]).
//!
//! Nothing here decides: the decider ([`crate::decider`]) commits first, and a write the API
//! server refused ([`refused_by_server`]) is released by the caller
//! ([`crate::service::Service::assign`]).

use std::collections::BTreeMap;

use fumarole_topology::annotation::{
    self, DEVICES_ANNOTATION, DEVICES_NODE_ANNOTATION, DeviceChoice, ascend,
};
use k8s_openapi::api::core::v1::{Binding, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};

use crate::pod_store::PodStore;

/// Annotations to write (`None`: remove), keyed by name: the job annotations of
/// [`crate::decider::job_annotations`].
pub type JobAnnotations = BTreeMap<String, Option<String>>;

/// Field manager of the service's writes.
pub const FIELD_MANAGER: &str = "fumarole-scheduler-ext";

/// True when the API server refused a write (a 4xx status: conflict, not found, invalid,
/// forbidden, too many requests), so nothing was written. Any other failure (the connection
/// closed before the answer, a timeout, a 5xx such as an etcd timeout) leaves the outcome
/// unknown: the write may have been applied.
pub fn refused_by_server(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if (400..500).contains(&s.code))
}

/// The label the leading replica puts on its own Pod (`"true"`); the chart's Service selects
/// it, so the schedulers reach the leader only.
pub const LEADER_LABEL: &str = "fumarole.dev/scheduler-ext-leader";

/// Why a verb refuses the pod a request names.
#[derive(Debug, thiserror::Error)]
pub enum PodCheckError {
    #[error("pod {pod} does not exist")]
    Unknown { pod: String },
    #[error("reading pod {pod}: {source}")]
    Read {
        pod: String,
        #[source]
        source: kube::Error,
    },
    #[error("pod {pod} has uid {actual}, not {claimed} (deleted and created again?)")]
    Uid {
        pod: String,
        actual: String,
        claimed: String,
    },
    #[error("pod {pod} is scheduled by {scheduler:?}, which this service does not serve")]
    NotOurs { pod: String, scheduler: String },
    /// Volcano's `allocateFunc` and `deallocateFunc` come before a bind, never after: a call
    /// for a bound pod would move or free devices that a running pod holds.
    #[error("pod {pod} is already bound to node {node}; its devices change only when it ends")]
    Bound { pod: String, node: String },
}

impl PodCheckError {
    /// `pod`, unless it is bound to a node ([`PodCheckError::Bound`]).
    pub fn unbound(pod: Pod) -> Result<Pod, PodCheckError> {
        match pod.spec.as_ref().and_then(|s| s.node_name.clone()) {
            Some(node) if !node.is_empty() => Err(PodCheckError::Bound {
                pod: format!(
                    "{}/{}",
                    pod.metadata.namespace.as_deref().unwrap_or("default"),
                    pod.metadata.name.as_deref().unwrap_or_default()
                ),
                node,
            }),
            _ => Ok(pod),
        }
    }
}

/// What [`Effects::withdraw`] did.
#[derive(Debug, PartialEq, Eq)]
pub enum Withdrawal {
    /// The promise was taken off the pod.
    Withdrawn,
    /// Nothing to take off: the pod is gone, bound, promised elsewhere, or could not be read
    /// (logged).
    Moot,
}

/// The write client and the pod store.
#[derive(Clone)]
pub struct Effects {
    client: Client,
    pods: PodStore,
}

impl std::fmt::Debug for Effects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Effects").finish_non_exhaustive()
    }
}

impl Effects {
    pub fn new(client: Client, pods: PodStore) -> Self {
        Effects { client, pods }
    }

    /// The pods the live view reads (for readers off the scheduling path, as `/ui`).
    pub fn pods(&self) -> &PodStore {
        &self.pods
    }

    fn api(&self, ns: &str) -> Api<Pod> {
        Api::namespaced(self.client.clone(), ns)
    }

    /// True when the pod store holds `pod` (same namespace, name and uid): a pod the API
    /// server knows, not one made up in a request body.
    pub fn knows(&self, pod: &Pod) -> bool {
        let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
        let (Some(name), Some(uid)) = (pod.metadata.name.as_deref(), pod.metadata.uid.as_deref())
        else {
            return false;
        };
        self.pods
            .get(&format!("{ns}/{name}"))
            .is_some_and(|p| p.uid.as_deref() == Some(uid))
    }

    /// The pod: from the store while it is not bound, else from the API server.
    pub async fn pod(&self, ns: &str, name: &str) -> Result<Pod, kube::Error> {
        if let Some(p) = self
            .pods
            .get(&format!("{ns}/{name}"))
            .and_then(|f| f.unbound.clone())
        {
            return Ok((*p).clone());
        }
        self.api(ns).get(name).await
    }

    /// The pod a request names, as the API server has it: a verb that writes acts on this, never
    /// on the request body's copy. Refused when it does not exist, its uid is not the one
    /// claimed (when one is), or `serves` says its scheduler is not one this service serves.
    pub async fn checked_pod(
        &self,
        namespace: &str,
        name: &str,
        claimed_uid: Option<&str>,
        serves: impl Fn(&Pod) -> bool,
    ) -> Result<Pod, PodCheckError> {
        let key = format!("{namespace}/{name}");
        let pod = match self.pod(namespace, name).await {
            Ok(p) => p,
            Err(kube::Error::Api(s)) if s.code == 404 => {
                return Err(PodCheckError::Unknown { pod: key });
            }
            Err(source) => return Err(PodCheckError::Read { pod: key, source }),
        };
        let actual = pod.metadata.uid.clone().unwrap_or_default();
        if let Some(claimed) = claimed_uid.filter(|u| !u.is_empty())
            && claimed != actual
        {
            return Err(PodCheckError::Uid {
                pod: key,
                actual,
                claimed: claimed.to_string(),
            });
        }
        if !serves(&pod) {
            let scheduler = pod
                .spec
                .as_ref()
                .and_then(|s| s.scheduler_name.clone())
                .unwrap_or_default();
            return Err(PodCheckError::NotOurs {
                pod: key,
                scheduler,
            });
        }
        Ok(pod)
    }

    /// Removes the promise on `pod` (`namespace/name`) for `node`, unless the pod moved on
    /// (bound, or promised elsewhere) or is gone meanwhile. `Err` when the removal itself
    /// failed (the caller takes the commit back, to try again when it times out).
    pub async fn withdraw(&self, pod: &str, node: &str) -> Result<Withdrawal, kube::Error> {
        let (ns, name) = pod.split_once('/').unwrap_or(("default", pod));
        match self.pod(ns, name).await {
            Ok(p) => {
                let bound = p
                    .spec
                    .as_ref()
                    .and_then(|s| s.node_name.as_deref())
                    .is_some();
                let still = p
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(DEVICES_NODE_ANNOTATION))
                    .is_some_and(|n| n == node);
                if bound || !still {
                    return Ok(Withdrawal::Moot);
                }
            }
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(Withdrawal::Moot),
            Err(e) => {
                tracing::warn!(pod, error = %e, "reading a pod whose promise timed out");
                return Ok(Withdrawal::Moot);
            }
        }
        self.annotate(ns, name, None).await?;
        Ok(Withdrawal::Withdrawn)
    }

    /// Sets the pod's `fumarole.dev/devices` annotation to the devices `choice` gives it on
    /// `node` (with `fumarole.dev/devices-node`, the Ascend names and the job's annotations
    /// given), or with `None` removes them (Huawei's only where they still say what the
    /// removed choice said: another scheduler's are left alone; the job's annotations only
    /// where the extension added them and the pod is not bound).
    pub async fn annotate(
        &self,
        ns: &str,
        name: &str,
        choice: Option<(&str, &DeviceChoice, &JobAnnotations)>,
    ) -> Result<(), kube::Error> {
        let mut annotations: JobAnnotations = BTreeMap::new();
        match choice {
            Some((node, c, job)) => {
                annotations.extend(job.clone());
                annotations.insert(DEVICES_ANNOTATION.into(), Some(annotation::format(c)));
                annotations.insert(DEVICES_NODE_ANNOTATION.into(), Some(node.into()));
                for (key, value) in ascend::from_choice(c) {
                    annotations.insert(key, Some(value));
                }
            }
            None => {
                annotations.insert(DEVICES_ANNOTATION.into(), None);
                annotations.insert(DEVICES_NODE_ANNOTATION.into(), None);
                for key in self.written_with_choice(ns, name).await? {
                    annotations.insert(key, None);
                }
            }
        }
        self.patch_annotations(ns, name, &annotations).await
    }

    /// A merge patch of the pod's annotations (`None` removes one).
    async fn patch_annotations(
        &self,
        ns: &str,
        name: &str,
        annotations: &JobAnnotations,
    ) -> Result<(), kube::Error> {
        let patch = serde_json::json!({"metadata": {"annotations": annotations}});
        self.api(ns)
            .patch(
                name,
                &PatchParams {
                    field_manager: Some(FIELD_MANAGER.into()),
                    ..Default::default()
                },
                &Patch::Merge(&patch),
            )
            .await
            .map(drop)
    }

    /// What goes with the pod's choice when it is removed: the `huawei.com/<Chip>`
    /// annotations that say what its `fumarole.dev/devices` says (written with it) and, on a
    /// pod not bound, the job annotations the extension added (with their record).
    async fn written_with_choice(&self, ns: &str, name: &str) -> Result<Vec<String>, kube::Error> {
        let pod = match self.pod(ns, name).await {
            Ok(p) => p,
            Err(kube::Error::Api(e)) if e.code == 404 => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let have = pod.metadata.annotations.unwrap_or_default();
        let mut keys = Vec::new();
        if pod.spec.and_then(|s| s.node_name).is_none() {
            keys.extend(
                ascend::written_job_keys(&have)
                    .into_iter()
                    .map(String::from),
            );
            if have.contains_key(ascend::WRITTEN_JOB_ANNOTATIONS) {
                keys.push(ascend::WRITTEN_JOB_ANNOTATIONS.to_string());
            }
        }
        if let Some(Ok(choice)) = have.get(DEVICES_ANNOTATION).map(|v| annotation::parse(v)) {
            keys.extend(
                ascend::from_choice(&choice)
                    .into_iter()
                    .filter(|(k, v)| have.get(k) == Some(v))
                    .map(|(k, _)| k),
            );
        }
        Ok(keys)
    }

    /// Binds the pod to `node` (the `pods/binding` subresource), as a binding extender must,
    /// with the devices `choice` gives it there (no annotation for `None`: a pod whose devices
    /// come from ResourceClaims): the API server copies a Binding's annotations onto the pod,
    /// so node and devices arrive in one write (one watch event for every watcher, and never
    /// a device choice on a pod whose Binding failed). The job's annotations `job` are
    /// patched onto the pod first, so the pod never runs without them; a Binding that then
    /// fails leaves them recorded as the extension's, replaced by the next placement.
    pub async fn bind(
        &self,
        ns: &str,
        name: &str,
        uid: &str,
        node: &str,
        choice: Option<&DeviceChoice>,
        job: &JobAnnotations,
    ) -> Result<(), kube::Error> {
        if !job.is_empty() {
            self.patch_annotations(ns, name, job).await?;
        }
        let annotations = choice.map(|choice| {
            let mut a = ascend::from_choice(choice);
            a.insert(DEVICES_ANNOTATION.to_string(), annotation::format(choice));
            a.insert(DEVICES_NODE_ANNOTATION.to_string(), node.to_string());
            a
        });
        let binding = Binding {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                namespace: Some(ns.to_string()),
                uid: (!uid.is_empty()).then(|| uid.to_string()),
                annotations,
                ..Default::default()
            },
            target: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Node".into()),
                name: Some(node.to_string()),
                ..Default::default()
            },
        };
        self.api(ns)
            .create_subresource::<Binding, serde_json::Value>(
                "binding",
                name,
                &PostParams {
                    field_manager: Some(FIELD_MANAGER.into()),
                    ..Default::default()
                },
                &binding,
            )
            .await
            .map(drop)
    }
}

/// Puts [`LEADER_LABEL`] on this replica's Pod (and takes it off the other pods of its
/// namespace that still carry it: a dead or cut-off leader cannot), or takes it off. Failures
/// are logged: the label only routes the schedulers, the next term change writes it again.
pub async fn label_leader(client: &Client, (ns, name): &(String, String), leading: bool) {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let set =
        |value: Option<&str>| serde_json::json!({"metadata": {"labels": {LEADER_LABEL: value}}});
    let params = PatchParams::default();
    if leading {
        let others = ListParams::default().labels(&format!("{LEADER_LABEL}=true"));
        match api.list_metadata(&others).await {
            Ok(list) => {
                for p in list.items.iter().filter_map(|p| p.metadata.name.as_deref()) {
                    if p != name
                        && let Err(e) = api.patch(p, &params, &Patch::Merge(set(None))).await
                    {
                        tracing::warn!(pod = %format!("{ns}/{p}"), error = %e, "taking the leader label off a former leader failed");
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "listing pods labelled leader failed"),
        }
    }
    let value = leading.then_some("true");
    match api.patch(name, &params, &Patch::Merge(set(value))).await {
        Ok(_) => tracing::info!(pod = %format!("{ns}/{name}"), leading, "leader label set"),
        Err(e) => {
            tracing::warn!(pod = %format!("{ns}/{name}"), error = %e, "setting the leader label failed")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_client_error_status_means_nothing_was_written() {
        let status = |code| {
            kube::Error::Api(
                kube::core::Status::failure("write", "Test")
                    .with_code(code)
                    .boxed(),
            )
        };
        for refused in [400, 403, 404, 409, 422, 429] {
            assert!(refused_by_server(&status(refused)), "{refused}");
        }
        // An etcd timeout (500, 504) may still have committed the write.
        for unknown in [500, 503, 504] {
            assert!(!refused_by_server(&status(unknown)), "{unknown}");
        }
        assert!(!refused_by_server(
            &kube::Error::LinesCodecMaxLineLengthExceeded
        ));
    }
}
