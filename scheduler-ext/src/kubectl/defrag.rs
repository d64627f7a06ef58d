//! `kubectl fumarole defrag` (and `fumarole-scheduler-ext defrag` without a snapshot): the
//! fewest running pods whose move would make room for the largest waiting unit
//! ([`crate::core::defrag`]), over the cluster as one list of each kind reads it now.

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::ListParams;

use super::config::Connection;
use crate::core::cluster::Cluster;
use crate::core::defrag::{self, Advice};
use crate::core::ledger::Ledger;
use crate::core::pod_facts::PodFacts;
use crate::core::view::ClusterView;
use crate::live;

/// Reads the cluster (the view, then the pods for their owners and devices) and advises.
pub async fn read(conn: &Connection) -> Result<Advice> {
    let view = live::read_once(&conn.client).await?;
    for w in view.warnings() {
        tracing::warn!("{w}");
    }
    let pods = Api::<Pod>::all(conn.client.clone())
        .list(&ListParams::default().fields("status.phase!=Succeeded,status.phase!=Failed"))
        .await
        .context("listing Pod")?;
    let facts: Vec<PodFacts> = pods.items.iter().map(PodFacts::of).collect();
    Ok(advise(&view, &facts))
}

/// The advice for `view`, whose pods are `facts`.
pub fn advise(view: &ClusterView, facts: &[PodFacts]) -> Advice {
    let ledger = Ledger::default();
    let c = Cluster::new(view, &ledger, std::time::Instant::now());
    let (running, waiting) = defrag::from_facts(&c, facts);
    defrag::advise(&c, &running, &waiting)
}

/// The advice as a table (`-o wide` adds nothing).
pub fn table(advice: &Advice, _wide: bool) -> String {
    defrag::table(advice)
}
