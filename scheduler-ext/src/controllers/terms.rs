//! The leader's term: what a replica does when it begins or ends leading. A term begins by
//! reading every unfinished pod's promise from the API server and adopting each as a commit
//! ([`begin_term`]), so what the last leader handed out counts before this one commits; then
//! the replica's own Pod gets the leader label ([`crate::effects::label_leader`]), taken off
//! again when the term ends. Start at [`follow_terms`], which the live view spawns under
//! leader election ([`crate::controllers::leader`]).

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use fumarole_topology::annotation::{self, DEVICES_ANNOTATION, DEVICES_NODE_ANNOTATION};
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, ListParams};
use kube::core::PartialObjectMeta;

use crate::controllers::leader::Leadership;
use crate::effects::label_leader;
use crate::service::Service;

/// Begins every term this replica's leadership starts ([`begin_term`]), retrying until done
/// or the term is over, then labels `own_pod` as the leader's; takes the label off when the
/// term ends.
pub async fn follow_terms(
    client: Client,
    svc: Arc<Service>,
    leadership: Arc<Leadership>,
    own_pod: Option<(String, String)>,
) {
    let mut changes = leadership.subscribe();
    loop {
        if leadership.holds() {
            let term = leadership.begin();
            loop {
                match begin_term(&client, &svc).await {
                    Ok(adopted) => {
                        tracing::info!(
                            adopted,
                            term,
                            "read the pods' promises: committing as leader"
                        );
                        leadership.ready(term);
                        if let Some(pod) = &own_pod {
                            label_leader(&client, pod, true).await;
                        }
                        break;
                    }
                    Err(e) if leadership.holds() && leadership.begin() == term => {
                        tracing::warn!(error = %format!("{e:#}"), "reading the pods' promises failed; retrying before committing");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                    Err(_) => break,
                }
            }
        } else if let Some(pod) = &own_pod {
            label_leader(&client, pod, false).await;
        }
        if changes.changed().await.is_err() {
            return;
        }
    }
}

/// Reads every unfinished pod's `fumarole.dev/devices` with its node from the API server (a
/// fresh list, not the watch's store, which may lag) and adopts each as a commit: devices the
/// last leader handed out, bound or not yet, count before this one hands out any. Returns how
/// many were adopted.
pub async fn begin_term(client: &Client, svc: &Service) -> Result<usize> {
    let api: Api<PartialObjectMeta<Pod>> = Api::all(client.clone());
    let mut params = ListParams::default()
        .fields("status.phase!=Succeeded,status.phase!=Failed")
        .limit(500);
    let mut adopted = 0;
    loop {
        let page = api
            .list_metadata(&params)
            .await
            .context("listing the pods' metadata")?;
        for pod in &page.items {
            let meta = &pod.metadata;
            if meta.deletion_timestamp.is_some() {
                continue;
            }
            let Some(a) = meta.annotations.as_ref() else {
                continue;
            };
            let (Some(node), Some(value)) =
                (a.get(DEVICES_NODE_ANNOTATION), a.get(DEVICES_ANNOTATION))
            else {
                continue;
            };
            let key = format!(
                "{}/{}",
                meta.namespace.as_deref().unwrap_or_default(),
                meta.name.as_deref().unwrap_or_default()
            );
            match annotation::parse(value) {
                Ok(choice) => {
                    for (resource, devices) in choice {
                        adopted += usize::from(svc.decider().adopt(&key, node, &resource, devices));
                    }
                }
                Err(e) => tracing::debug!(pod = %key, error = %e, "not a promise"),
            }
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(adopted),
        }
    }
}
