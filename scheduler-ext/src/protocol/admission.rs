//! A validating admission webhook that keeps each node's agent to its own node where RBAC and
//! ValidatingAdmissionPolicies cannot: an eviction names only the pod, and an Event only the
//! object it is about, so whether that pod runs on the caller's node needs the pod, which this
//! service has in its cache. Route `POST /admission/agent-writes`, `AdmissionReview`
//! `admission.k8s.io/v1` in and out.
//!
//! The webhook configuration sends it the agent's requests only (a `matchCondition` on the
//! agent's ServiceAccount); for those it allows:
//! - `pods/eviction` (create): a pod bound to the node the caller's token names, never in
//!   `kube-system`;
//! - Events (`events.k8s.io/v1` and core `v1`, create / update / patch), not in `kube-system`,
//!   about: the caller's Node, a pod bound to the caller's node, or the co-location ConfigMap
//!   `volcano-agent-configuration`.
//!
//! Everything else it is sent is allowed (not its to judge). The caller's node is the token's
//! `authentication.kubernetes.io/node-name` extra, as with node-bound ServiceAccount tokens; a
//! token without one is refused. A pod that cannot be read is refused.
//!
//! Denials are terse: the agent is told which pod is not its node's, never where that pod runs
//! or why it could not be read (an agent must not learn other nodes' pods through its
//! denials); the details go to this service's log. The route answers within
//! [`WEBHOOK_TIME_LIMIT`], body included, below the 5 s its configuration gives the API server.

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::response::Response;
use axum::routing::post;
use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

use crate::protocol::{bad_request, json_response};
use crate::service::Service;

/// Route of the webhook.
pub const AGENT_WRITES_PATH: &str = "/admission/agent-writes";
/// The ServiceAccount token extra naming the node a token is bound to.
pub const NODE_NAME_EXTRA: &str = "authentication.kubernetes.io/node-name";
/// Namespace no agent may evict from or write Events into.
pub const PROTECTED_NAMESPACE: &str = "kube-system";
/// The co-location configuration the agent records refusals on.
pub const COLOCATION_CONFIGMAP: &str = "volcano-agent-configuration";
/// Largest review: an Event or an Eviction with its request metadata.
pub const REVIEW_LIMIT: usize = 1 << 20;
/// Longest a review may take, its body read included: less than the webhook configuration's
/// `timeoutSeconds: 5`, so the API server gets our answer (503 when over) rather than its own
/// timeout, and a client that sends its body slowly holds a connection no longer.
pub const WEBHOOK_TIME_LIMIT: std::time::Duration = std::time::Duration::from_secs(4);

/// The verdict for one request: `Ok` allows, `Err` is the reason it is denied.
pub type Verdict = Result<(), String>;

/// What the reviewed request asks, read from an `AdmissionRequest`.
#[derive(Debug, PartialEq, Eq)]
enum Ask<'a> {
    Evict {
        namespace: &'a str,
        pod: &'a str,
    },
    Event {
        namespace: &'a str,
        about: About<'a>,
    },
    Other,
}

/// The object an Event is about.
#[derive(Debug, PartialEq, Eq)]
struct About<'a> {
    kind: &'a str,
    namespace: &'a str,
    name: &'a str,
}

fn str_at<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

fn ask(request: &Value) -> Ask<'_> {
    let group = str_at(request, "/resource/group");
    let resource = str_at(request, "/resource/resource");
    let sub = str_at(request, "/subResource");
    let namespace = str_at(request, "/namespace");
    match (group, resource, sub) {
        ("", "pods", "eviction") => Ask::Evict {
            namespace,
            pod: str_at(request, "/name"),
        },
        ("events.k8s.io" | "", "events", "") => {
            // events.k8s.io/v1 says `regarding`, core/v1 `involvedObject`.
            let object = request.get("object").unwrap_or(&Value::Null);
            let about = object
                .get("regarding")
                .or_else(|| object.get("involvedObject"))
                .unwrap_or(&Value::Null);
            Ask::Event {
                namespace,
                about: About {
                    kind: str_at(about, "/kind"),
                    namespace: str_at(about, "/namespace"),
                    name: str_at(about, "/name"),
                },
            }
        }
        _ => Ask::Other,
    }
}

/// The rules, with `pod_node` telling where a pod is bound (`Err`: it cannot be read).
async fn judge<F, Fut>(request: &Value, pod_node: F) -> Verdict
where
    F: Fn(String, String) -> Fut,
    Fut: std::future::Future<Output = Result<Option<String>, String>>,
{
    let ask = ask(request);
    if ask == Ask::Other {
        return Ok(());
    }
    let Some(node) = request
        .pointer(&format!(
            "/userInfo/extra/{}",
            NODE_NAME_EXTRA.replace('/', "~1")
        ))
        .and_then(|v| v.get(0))
        .and_then(Value::as_str)
    else {
        return Err("the agent's token is not bound to a node".into());
    };
    let on_this_node = |namespace: &str, pod: &str| {
        let (namespace, pod) = (namespace.to_string(), pod.to_string());
        let fut = pod_node(namespace.clone(), pod.clone());
        async move {
            let detail = match fut.await {
                Ok(Some(n)) if n == node => return Ok(()),
                Ok(Some(n)) => format!("it runs on {n}"),
                Ok(None) => "it is not bound".to_string(),
                Err(e) => e,
            };
            tracing::info!(pod = %format!("{namespace}/{pod}"), node, detail, "an agent's write about a pod not on its node");
            Err(format!(
                "pod {namespace}/{pod} is not a pod of {node}, the agent's node"
            ))
        }
    };
    match ask {
        Ask::Evict { namespace, .. } | Ask::Event { namespace, .. }
            if namespace == PROTECTED_NAMESPACE =>
        {
            Err(format!(
                "the agent may not evict pods or write Events in {PROTECTED_NAMESPACE}"
            ))
        }
        Ask::Evict { namespace, pod } => on_this_node(namespace, pod).await,
        Ask::Event { about, .. } => match about.kind {
            "Node" if about.name == node => Ok(()),
            "Node" => Err(format!(
                "an Event about node {} is not the agent's to write (its node is {node})",
                about.name
            )),
            "Pod" => on_this_node(about.namespace, about.name).await,
            "ConfigMap" if about.name == COLOCATION_CONFIGMAP => Ok(()),
            kind => Err(format!(
                "the agent writes Events about its node, its node's pods and {COLOCATION_CONFIGMAP}, not a {kind} {}",
                about.name
            )),
        },
        Ask::Other => Ok(()),
    }
}

/// The `AdmissionReview` answering `review` with `verdict`.
fn response(review: &Value, verdict: Verdict) -> Value {
    let uid = review.pointer("/request/uid").cloned().unwrap_or(json!(""));
    let mut response = json!({"uid": uid, "allowed": verdict.is_ok()});
    if let Err(reason) = verdict {
        response["status"] = json!({"code": 403, "reason": "Forbidden", "message": reason});
    }
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": response,
    })
}

/// `POST /admission/agent-writes`.
async fn agent_writes(State(svc): State<Arc<Service>>, body: Bytes) -> Response {
    let review: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return bad_request("admission", &format!("malformed AdmissionReview: {e}")),
    };
    let request = review.get("request").cloned().unwrap_or(Value::Null);
    let verdict = judge(&request, |namespace, name| {
        let svc = Arc::clone(&svc);
        async move {
            let Some(ops) = svc.effects() else {
                return Err("the webhook needs the API server".to_string());
            };
            match ops.pod(&namespace, &name).await {
                Ok(p) => Ok(pod_node(&p)),
                Err(kube::Error::Api(s)) if s.code == 404 => {
                    Err(format!("pod {namespace}/{name} does not exist"))
                }
                Err(e) => Err(format!("reading pod {namespace}/{name}: {e}")),
            }
        }
    })
    .await;
    if let Err(reason) = &verdict {
        tracing::warn!(
            user = str_at(&request, "/userInfo/username"),
            reason,
            "denied an agent write"
        );
    }
    json_response(&response(&review, verdict))
}

fn pod_node(pod: &Pod) -> Option<String> {
    pod.spec.as_ref().and_then(|s| s.node_name.clone())
}

/// The webhook's route.
pub fn routes() -> Router<Arc<Service>> {
    Router::new().route(
        AGENT_WRITES_PATH,
        post(agent_writes).layer(DefaultBodyLimit::max(REVIEW_LIMIT)),
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    fn request(resource: &str, sub: &str, namespace: &str, name: &str, object: Value) -> Value {
        let (group, resource) = resource.split_once('/').unwrap_or(("", resource));
        json!({
            "uid": "r1",
            "resource": {"group": group, "version": "v1", "resource": resource},
            "subResource": sub,
            "namespace": namespace,
            "name": name,
            "object": object,
            "userInfo": {"username": "system:serviceaccount:fumarole-system:fumarole-agent",
                         "extra": {NODE_NAME_EXTRA: ["node-a"]}},
        })
    }

    async fn verdict(request: &Value) -> Verdict {
        judge(request, |ns, name| async move {
            Ok(match (ns.as_str(), name.as_str()) {
                ("ml", "here") => Some("node-a".to_string()),
                ("ml", "there") => Some("node-b".to_string()),
                _ => None,
            })
        })
        .await
    }

    #[tokio::test]
    async fn evictions_only_on_the_agents_node_and_never_in_kube_system() {
        assert!(
            verdict(&request("pods", "eviction", "ml", "here", json!({})))
                .await
                .is_ok()
        );
        let e = verdict(&request("pods", "eviction", "ml", "there", json!({})))
            .await
            .unwrap_err();
        assert!(e.contains("not a pod of node-a"), "{e}");
        // Where the pod runs is not the agent's to learn.
        assert!(!e.contains("node-b"), "{e}");
        let e = verdict(&request(
            "pods",
            "eviction",
            "kube-system",
            "here",
            json!({}),
        ))
        .await
        .unwrap_err();
        assert!(e.contains("kube-system"), "{e}");
        let mut unbound = request("pods", "eviction", "ml", "here", json!({}));
        unbound["userInfo"]["extra"] = json!({});
        assert!(
            verdict(&unbound)
                .await
                .unwrap_err()
                .contains("not bound to a node")
        );
    }

    #[tokio::test]
    async fn events_about_the_node_its_pods_and_the_config_only() {
        let event = |kind: &str, ns: &str, name: &str| json!({"regarding": {"kind": kind, "namespace": ns, "name": name}});
        let core = |kind: &str, ns: &str, name: &str| json!({"involvedObject": {"kind": kind, "namespace": ns, "name": name}});
        let ok = [
            request(
                "events.k8s.io/events",
                "",
                "default",
                "e",
                event("Node", "", "node-a"),
            ),
            request(
                "events.k8s.io/events",
                "",
                "ml",
                "e",
                event("Pod", "ml", "here"),
            ),
            request("events", "", "ml", "e", core("Pod", "ml", "here")),
            request(
                "events.k8s.io/events",
                "",
                "fumarole-system",
                "e",
                event("ConfigMap", "fumarole-system", COLOCATION_CONFIGMAP),
            ),
        ];
        for r in &ok {
            assert!(verdict(r).await.is_ok(), "{r}");
        }
        let denied = [
            request(
                "events.k8s.io/events",
                "",
                "default",
                "e",
                event("Node", "", "node-b"),
            ),
            request(
                "events.k8s.io/events",
                "",
                "ml",
                "e",
                event("Pod", "ml", "there"),
            ),
            request(
                "events.k8s.io/events",
                "",
                "kube-system",
                "e",
                event("Node", "", "node-a"),
            ),
            request(
                "events.k8s.io/events",
                "",
                "ml",
                "e",
                event("Secret", "ml", "s"),
            ),
        ];
        for r in &denied {
            assert!(verdict(r).await.is_err(), "{r}");
        }
        // Not an eviction or an Event: not this webhook's to judge.
        assert!(
            verdict(&request("configmaps", "", "ml", "c", json!({})))
                .await
                .is_ok()
        );
    }

    #[test]
    fn answers_are_admission_reviews() {
        let review = json!({"request": {"uid": "u-1"}});
        let allowed = response(&review, Ok(()));
        assert_eq!(allowed["response"]["uid"], "u-1");
        assert_eq!(allowed["response"]["allowed"], true);
        let denied = response(&review, Err("no".into()));
        assert_eq!(denied["response"]["allowed"], false);
        assert_eq!(denied["response"]["status"]["message"], "no");
        assert_eq!(denied["kind"], "AdmissionReview");
    }
}
