//! `/ui`: the cluster page for people, "where is there room for an 8-GPU job". Server-rendered
//! HTML that reloads itself every [`REFRESH_SECONDS`], no JavaScript.
//!
//! From the service's own state (the view and the ledger, as `filter` sees them):
//! - per super-node, its nodes with a grid of their devices (free, in use, shared or
//!   partitioned with who holds the shares, unhealthy) and the
//!   largest job that still gets ideal interconnect there ([`largest_ideal_block`]: the most
//!   devices a node can still give with `q = 1`, the same quality as on an empty node);
//! - the pods waiting for an accelerator, with why (the scheduler's last verdict for the pod
//!   when there is one, else the verdicts of a fresh evaluation, for at most
//!   [`EVALUATED_MAX`] pods; gpu-group-size pods are not evaluated here, since planning their
//!   unit would reserve a super-node);
//! - the defragmentation advice: the fewest running pods whose move would make room for the
//!   largest waiting unit ([`crate::core::defrag`]), from the live pod store;
//! - the last scorings the schedulers asked for, per node, the same rows as `explain`.
//!
//! The page is rendered again only when the service's state moved (a new view, a new scoring)
//! or [`RENDER_EVERY`] passed, whatever the rate of GETs: a burst of page loads costs one
//! evaluation. It is served on its own listener
//! ([`crate::http::router::ui_router`]), never on the schedulers' port.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use axum::extract::State;
use axum::response::Html;

use html_escape::encode_double_quoted_attribute as esc;

use crate::core::cluster::Cluster;
use crate::core::defrag;
use crate::core::explain::Row;
use crate::core::request::{self, pod_key};
use crate::core::view::{ClusterView, NodeView};
use crate::decision_log::Decision;
use crate::protocol::scale;
use crate::service::Service;

pub const REFRESH_SECONDS: u32 = 10;

/// Longest a rendered page is served again before it is rendered anew.
pub const RENDER_EVERY: Duration = Duration::from_secs(5);

/// Most pending pods evaluated afresh per render (the others show their last scoring only).
pub const EVALUATED_MAX: usize = 50;

/// The service and the last rendered page (when, at which service generation).
pub struct Page {
    svc: Arc<Service>,
    last: tokio::sync::Mutex<Option<(Instant, u64, Arc<str>)>>,
}

impl Page {
    pub fn new(svc: Arc<Service>) -> Arc<Self> {
        Arc::new(Page {
            svc,
            last: tokio::sync::Mutex::new(None),
        })
    }
}

/// GET `/ui`: the last rendered page while the service's state has not moved and it is
/// younger than [`RENDER_EVERY`]; else a new one.
pub async fn page(State(page): State<Arc<Page>>) -> Html<String> {
    let mut last = page.last.lock().await;
    let generation = page.svc.generation();
    if let Some((at, seen, html)) = last.as_ref()
        && *seen == generation
        && at.elapsed() < RENDER_EVERY
    {
        return Html(html.to_string());
    }
    let html: Arc<str> = render(&page.svc, SystemTime::now()).into();
    *last = Some((Instant::now(), generation, Arc::clone(&html)));
    Html(html.to_string())
}

/// Device states of one node, by device index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeviceState {
    Free,
    Used,
    /// In use as shares or partitions: by whom, or which.
    Shared(String),
    Unhealthy,
}

/// What the page shows of a node.
#[derive(Clone, Debug)]
pub struct NodeRow {
    pub name: String,
    pub devices: Vec<(String, DeviceState)>,
    pub free: usize,
    /// [`largest_ideal_block`].
    pub ideal: usize,
}

/// The most devices `nv` can still give one pod with ideal interconnect: the largest `k` for
/// which the best selection among the free devices has `q = 1`.
pub fn largest_ideal_block(nv: &NodeView, free: u64) -> usize {
    (1..=free.count_ones() as usize)
        .rev()
        .find(|&k| nv.ideal_fit(free, k))
        .unwrap_or(0)
}

fn node_row(c: &Cluster, nv: &NodeView) -> NodeRow {
    let free = nv
        .resource_masks
        .iter()
        .fold(0u64, |m, (r, _)| m | c.free_mask(nv, r));
    let devices = nv
        .device_ids
        .iter()
        .enumerate()
        .map(|(i, id)| {
            let bit = 1u64 << i;
            let shared = nv.shared.iter().find(|(d, _)| *d == i);
            let state = if nv.unhealthy_mask & bit != 0 {
                DeviceState::Unhealthy
            } else if let Some((_, what)) = shared {
                DeviceState::Shared(what.clone())
            } else if free & bit != 0 {
                DeviceState::Free
            } else {
                DeviceState::Used
            };
            (id.clone(), state)
        })
        .collect();
    NodeRow {
        name: nv.name.clone(),
        devices,
        free: free.count_ones() as usize,
        ideal: largest_ideal_block(nv, free),
    }
}

fn ago(now: SystemTime, at: SystemTime) -> String {
    let secs = now.duration_since(at).map_or(0, |d| d.as_secs());
    match secs {
        0..60 => format!("{secs} s ago"),
        60..3600 => format!("{} min ago", secs / 60),
        _ => format!("{} h ago", secs / 3600),
    }
}

const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:24px;color:#222}\
h1{font-size:22px}h2{font-size:17px;margin-top:28px}table{border-collapse:collapse;margin:6px 0 14px}\
td,th{border-bottom:1px solid #ddd;padding:4px 10px;text-align:left;font-size:13px;vertical-align:top}\
th{background:#f3f5f7}td:first-child{white-space:nowrap}.dev{display:inline-block;width:16px;height:16px;margin:1px;border-radius:3px}\
.free{background:#43a047}.used{background:#1e88e5}.shared{background:#fb8c00}.unhealthy{background:#e53935}\
.summary{color:#555;font-size:13px}.ok{color:#2e7d32}.no{color:#c62828}.legend span{margin-right:14px}";

/// The page at `now`.
pub fn render(svc: &Service, now: SystemTime) -> String {
    let view = svc.decider().view();
    let decisions = svc.decisions(scale::shown(svc.decider().scorer()));
    let rows: BTreeMap<String, NodeRow> = svc.decider().with_cluster(|c| {
        view.nodes()
            .filter(|nv| nv.has_topology)
            .map(|nv| (nv.name.clone(), node_row(&c, nv)))
            .collect()
    });
    let (mut free, mut used, mut shared, mut unhealthy) = (0, 0, 0, 0);
    for r in rows.values() {
        for (_, s) in &r.devices {
            match s {
                DeviceState::Free => free += 1,
                DeviceState::Used => used += 1,
                DeviceState::Shared(_) => shared += 1,
                DeviceState::Unhealthy => unhealthy += 1,
            }
        }
    }

    let mut o = String::new();
    let _ = write!(
        o,
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>fumarole cluster</title>\
         <meta http-equiv=\"refresh\" content=\"{REFRESH_SECONDS}\"><style>{STYLE}</style></head><body>"
    );
    let _ = write!(
        o,
        "<h1>fumarole cluster</h1><p class=\"summary\" id=\"totals\">{} nodes · {free} free · {used} in use · \
         {shared} shared · {unhealthy} unhealthy accelerators · refreshes every {REFRESH_SECONDS} s</p>\
         <p class=\"legend\"><span><i class=\"dev free\"></i> free</span><span><i class=\"dev used\"></i> in use</span>\
         <span><i class=\"dev shared\"></i> shared or partitioned</span><span><i class=\"dev unhealthy\"></i> unhealthy</span></p>",
        rows.len()
    );

    // Super-nodes first, then the nodes outside any.
    let mut groups: Vec<(Option<&str>, Vec<&NodeRow>)> = Vec::new();
    let mut alone = Vec::new();
    for (group, names) in view.super_nodes() {
        let members: Vec<&NodeRow> = names.iter().filter_map(|n| rows.get(n)).collect();
        let is_super = names
            .iter()
            .filter_map(|n| view.node(n))
            .any(|nv| nv.super_node.is_some());
        if is_super {
            groups.push((Some(group.as_str()), members));
        } else {
            alone.extend(members);
        }
    }
    if !alone.is_empty() {
        groups.push((None, alone));
    }
    for (group, members) in &groups {
        let total_ideal: usize = members.iter().map(|r| r.ideal).sum();
        let best = members.iter().map(|r| r.ideal).max().unwrap_or(0);
        let free: usize = members.iter().map(|r| r.free).sum();
        let id = group.unwrap_or("");
        let heading = group.map_or("Nodes outside super-nodes".to_string(), |g| {
            format!("Super-node {g}")
        });
        let _ = write!(
            o,
            "<h2 class=\"super-node\" data-id=\"{}\">{}</h2><p class=\"summary\">{} nodes · {free} free · \
             largest job with ideal interconnect: <b class=\"fits\">{total_ideal}</b> GPUs \
             (each node's largest ideal block, summed; on one node: {best})</p>\
             <table><tr><th>node</th><th>devices</th><th>free</th><th>largest ideal block</th></tr>",
            esc(id),
            esc(&heading),
            members.len()
        );
        for r in members {
            let _ = write!(
                o,
                "<tr class=\"node\" data-node=\"{}\"><td>{}</td><td>",
                esc(&r.name),
                esc(&r.name)
            );
            for (id, state) in &r.devices {
                let (class, what) = match state {
                    DeviceState::Free => ("free", "free".to_string()),
                    DeviceState::Used => ("used", "used".to_string()),
                    DeviceState::Shared(what) => ("shared", format!("shared: {what}")),
                    DeviceState::Unhealthy => ("unhealthy", "unhealthy".to_string()),
                };
                let _ = write!(
                    o,
                    "<i class=\"dev {class}\" title=\"{} ({})\"></i>",
                    esc(id),
                    esc(&what)
                );
            }
            let _ = write!(o, "</td><td>{}</td><td>{}</td></tr>", r.free, r.ideal);
        }
        o.push_str("</table>");
    }

    // Pending pods and why they wait.
    let offered = view.resources();
    o.push_str("<h2>Pending accelerator pods</h2>");
    if view.pending().is_empty() {
        o.push_str("<p class=\"summary\" id=\"no-pending\">none</p>");
    } else {
        o.push_str(
            "<table id=\"pending\"><tr><th>pod</th><th>asks for</th><th>why it waits</th></tr>",
        );
        let mut evaluated = 0;
        for pod in view.pending() {
            let key = pod_key(pod);
            // Claims read too: a pod asking through a ResourceClaim asks for devices.
            let asks = request::RequestFacts::of(pod)
                .request(&offered, view.claims())
                .map_or_else(
                    |e| e.to_string(),
                    |r| format!("{} × {}", r.count, r.resource),
                );
            let why = waiting_reason(svc, pod, &key, &decisions, &mut evaluated);
            let _ = write!(
                o,
                "<tr class=\"pending\" data-pod=\"{}\"><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(&key),
                esc(&key),
                esc(&asks),
                esc(&why)
            );
        }
        o.push_str("</table>");
    }

    idle_section(&view, &mut o);
    defrag_section(svc, &mut o);

    // The last scorings.
    o.push_str("<h2>Last decisions</h2>");
    if decisions.is_empty() {
        o.push_str("<p class=\"summary\">no scoring asked for yet</p>");
    }
    for d in &decisions {
        let _ = write!(
            o,
            "<h3 class=\"decision\" data-pod=\"{}\">{} <span class=\"summary\">{}</span></h3>\
             <table><tr><th>node</th><th>fits</th><th>score</th><th>q</th><th>loss</th><th>devices / reason</th></tr>",
            esc(&d.pod),
            esc(&d.pod),
            ago(now, d.at)
        );
        for r in &d.rows {
            let num = |v: Option<f64>| v.map_or("–".to_string(), |v| format!("{v:.2}"));
            let detail = match &r.reason {
                Some(reason) => reason.clone(),
                None => r.devices.join(", "),
            };
            let _ = write!(
                o,
                "<tr><td>{}</td><td class=\"{}\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(&r.node),
                if r.feasible { "ok" } else { "no" },
                if r.feasible { "yes" } else { "no" },
                num(r.score),
                num(r.q),
                num(r.loss),
                esc(&detail)
            );
        }
        o.push_str("</table>");
    }
    o.push_str("</body></html>\n");
    o
}

/// The defragmentation advice for the largest waiting unit ([`defrag::advise`]), over the
/// live pod store: a line with the gain, then the moves. Computed only when the page is
/// rendered, over a copy of the ledger, so the schedulers' requests never wait for it. Served
/// over a snapshot (no pod store) it says that it needs the live cluster.
/// Pods that hold devices and use little of them, as the agents report (`DeviceTopology`
/// status `pods`: under 5 % over their window), longest idle first.
fn idle_section(view: &ClusterView, o: &mut String) {
    let mut idle: Vec<(&str, &fumarole_topology::crd::PodDeviceUsage)> = view
        .nodes()
        .flat_map(|nv| nv.idle_pods().map(move |p| (nv.name.as_str(), p)))
        .collect();
    idle.sort_by(|a, b| a.1.idle_since.cmp(&b.1.idle_since));
    o.push_str("<h2>Held but idle</h2>");
    if idle.is_empty() {
        o.push_str("<p class=\"summary\" id=\"no-idle\">none (or no agent reads its devices' utilisation)</p>");
        return;
    }
    o.push_str(
        "<table id=\"idle\"><tr><th>pod</th><th>node</th><th>devices</th><th>utilisation</th><th>idle since</th></tr>",
    );
    for (node, p) in idle {
        let _ = write!(
            o,
            "<tr class=\"idle\" data-pod=\"{ns}/{pod}\"><td>{ns}/{pod}</td><td>{node}</td><td>{}</td><td>{}%</td><td>{}</td></tr>",
            p.devices,
            p.utilization_percent,
            esc(p.idle_since.as_deref().unwrap_or_default()),
            ns = esc(&p.namespace),
            pod = esc(&p.pod),
            node = esc(node),
        );
    }
    o.push_str("</table>");
}

fn defrag_section(svc: &Service, o: &mut String) {
    o.push_str("<h2 id=\"defragmentation\">Defragmentation</h2>");
    let Some(kube) = svc.effects() else {
        o.push_str(
            "<p class=\"summary\" id=\"defrag-gain\">needs the live cluster's pods (not served from a snapshot)</p>",
        );
        return;
    };
    let facts = kube.pods().state();
    let view = svc.decider().view();
    let ledger = svc.decider().with_cluster(|c| c.ledger.clone());
    let c = Cluster::new(&view, &ledger, Instant::now());
    let (running, waiting) = defrag::from_facts(&c, facts.iter().map(AsRef::as_ref));
    let advice = defrag::advise(&c, &running, &waiting);
    let _ = write!(
        o,
        "<p class=\"summary\" id=\"defrag-gain\">{}</p>",
        esc(&advice.gain)
    );
    if advice.moves.is_empty() {
        return;
    }
    o.push_str(
        "<table id=\"defrag\"><tr><th>pod</th><th>job</th><th>from</th><th>devices</th><th>to</th><th>to devices</th><th>restarts</th></tr>",
    );
    for m in &advice.moves {
        let _ = write!(
            o,
            "<tr class=\"move\" data-pod=\"{}\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&m.pod),
            esc(&m.pod),
            esc(&m.job),
            esc(&m.from),
            esc(&m.devices.join(", ")),
            esc(&m.to),
            esc(&m.to_devices.join(", ")),
            m.restarts
        );
    }
    o.push_str("</table>");
}

/// Why `pod` waits: from the scheduler's last scoring of it, else a fresh evaluation over every
/// node (not for gpu-group-size pods: planning their unit would reserve a super-node).
fn waiting_reason(
    svc: &Service,
    pod: &k8s_openapi::api::core::v1::Pod,
    key: &str,
    decisions: &[Decision],
    evaluated: &mut usize,
) -> String {
    let rows: Vec<Row> = match decisions.iter().find(|d| d.pod == key) {
        Some(d) => d.rows.clone(),
        None => {
            if svc.decider().view().jobs().in_unit(pod) {
                return "gpu-group-size unit: no scoring asked for yet".into();
            }
            if svc.decider().view().is_empty() {
                return "no nodes".into();
            }
            if *evaluated >= EVALUATED_MAX {
                return format!(
                    "no scoring asked for yet (more than {EVALUATED_MAX} pods wait; not evaluated here)"
                );
            }
            *evaluated += 1;
            match svc
                .decider()
                .explain(pod, scale::shown(svc.decider().scorer()))
            {
                Ok((_, rows)) => rows,
                Err(e) => return e.to_string(),
            }
        }
    };
    if let Some(best) = rows.iter().find(|r| r.feasible) {
        return format!(
            "fits on {} (devices {}): waiting for the scheduler",
            best.node,
            best.devices.join(", ")
        );
    }
    let mut reasons: BTreeMap<&str, usize> = BTreeMap::new();
    for r in &rows {
        if let Some(reason) = &r.reason {
            *reasons.entry(reason.as_str()).or_default() += 1;
        }
    }
    let mut by_count: Vec<(&str, usize)> = reasons.into_iter().collect();
    by_count.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    by_count
        .iter()
        .take(3)
        .map(|(reason, n)| format!("{reason} ({n} node{})", if *n == 1 { "" } else { "s" }))
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use crate::core::claims::Claims;
    use crate::core::claims::testing::{ascend_node, claim, claim_pod};
    use crate::core::pod_facts::PodFacts;
    use crate::core::score::Scoring;
    use crate::core::view::{ClusterView, ContextCache};

    /// A pending pod asking through a ResourceClaim is listed with what its claim asks for.
    #[test]
    fn a_pending_claim_pod_shows_its_claims_ask() {
        let pod = claim_pod("waits", &["two"], None, serde_json::json!({}));
        let view = ClusterView::build_with_jobs(
            &mut ContextCache::default(),
            &[ascend_node("a")],
            &[],
            &[],
            &[PodFacts::of(&pod)],
            Claims::new(&[claim("two", "npu.fumarole.dev", 2, None)]),
            crate::core::unit::JobSources::default(),
        )
        .unwrap();
        let page = render(&Service::new(view, Scoring::default()), SystemTime::now());
        let row = page
            .split("<tr class=\"pending\"")
            .nth(1)
            .expect("a pending row");
        assert!(row.contains("2 × npu.fumarole.dev"), "{row}");
    }

    /// A device shared or in MIG mode is drawn as such, with who holds the shares or which
    /// MIG devices it has; the totals count it apart from free and used.
    #[test]
    fn shared_and_partitioned_devices_say_who_holds_them() {
        use fumarole_topology::crd::device_topology::{MigInfo, ShareAllocation};
        let mut t =
            fumarole_topology::crd::testing::nvlink_node("a", 4, 10, &[], |i| format!("GPU-{i}"));
        t.spec.devices[1].mig = vec![MigInfo {
            uuid: "MIG-0".into(),
            profile: "3g.40gb".into(),
        }];
        let status = t.status.as_mut().unwrap();
        status.devices.get_mut("GPU-3").unwrap().shares = ["a", "b"]
            .map(|pod| ShareAllocation {
                share: format!("GPU-3::{pod}"),
                namespace: "serve".into(),
                pod: pod.into(),
                container: "main".into(),
            })
            .to_vec();
        let view = ClusterView::build(&[t], &[], &[], &[]).unwrap();
        let page = render(&Service::new(view, Scoring::default()), SystemTime::now());
        assert!(
            page.contains("<i class=\"dev shared\" title=\"GPU-1 (shared: MIG 3g.40gb)\"></i>"),
            "{page}"
        );
        assert!(
            page.contains(
                "<i class=\"dev shared\" title=\"GPU-3 (shared: 2 shares: serve/a/main, serve/b/main)\"></i>"
            ),
            "{page}"
        );
        assert!(
            page.contains("<i class=\"dev free\" title=\"GPU-0 (free)\"></i>"),
            "{page}"
        );
        assert!(
            page.contains("2 free · 0 in use · 2 shared · 0 unhealthy"),
            "{page}"
        );
    }

    /// Pods the agent reports idle are listed with their node and since when; busy ones not.
    #[test]
    fn held_but_idle_pods_are_listed_longest_idle_first() {
        use fumarole_topology::crd::PodDeviceUsage;
        let mut t = fumarole_topology::crd::testing::nvlink_node("a", 4, 10, &[0, 1], |i| {
            format!("GPU-{i}")
        });
        let usage = |pod: &str, since: Option<&str>| PodDeviceUsage {
            namespace: "ml".into(),
            pod: pod.into(),
            devices: 1,
            utilization_percent: if since.is_some() { 0 } else { 80 },
            idle_since: since.map(String::from),
        };
        t.status.as_mut().unwrap().pods = vec![
            usage("late", Some("2026-11-29T19:00:00Z")),
            usage("busy", None),
            usage("early", Some("2026-11-29T18:00:00Z")),
        ];
        let view = ClusterView::build(&[t], &[], &[], &[]).unwrap();
        let page = render(&Service::new(view, Scoring::default()), SystemTime::now());
        let rows: Vec<&str> = page
            .split("<tr class=\"idle\" data-pod=\"")
            .skip(1)
            .collect();
        assert_eq!(rows.len(), 2, "{page}");
        assert!(rows[0].starts_with("ml/early\"><td>ml/early</td><td>a</td><td>1</td><td>0%</td><td>2026-11-29T18:00:00Z</td>"), "{}", rows[0]);
        assert!(rows[1].starts_with("ml/late\""), "{}", rows[1]);
        assert!(!page.contains("ml/busy"), "{page}");
    }

    /// The defragmentation section over the `defrag` snapshot's pods in the pod store: the
    /// gain, and the one move with its destination; served from a snapshot (no pod store), it
    /// says it needs the live cluster.
    #[tokio::test]
    async fn the_defrag_section_shows_the_move_from_the_pod_store() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/snapshots/defrag");
        let objects = crate::snapshot::read_dir(&dir).unwrap();
        let svc = Service::new(objects.view().unwrap(), Scoring::default());
        let page = render(&svc, SystemTime::now());
        assert!(
            page.contains("<p class=\"summary\" id=\"defrag-gain\">needs the live cluster"),
            "{page}"
        );
        let store = crate::pod_store::PodStore::default();
        for pod in &objects.pods {
            store.apply(&kube::runtime::watcher::Event::Apply(pod.clone()));
        }
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        let client = kube::Client::try_from(config).unwrap();
        svc.set_effects(crate::effects::Effects::new(client, store));
        let page = render(&svc, SystemTime::now());
        let section = page
            .split("<h2 id=\"defragmentation\">")
            .nth(1)
            .expect("a defragmentation section");
        assert!(
            section.contains("unit 0 of job ml/train (atomic part 0) (2 pods of 8 nvidia.com/gpu) becomes placeable in rack-a"),
            "{section}"
        );
        let row = section
            .split("<tr class=\"move\" data-pod=\"ml/web-7d9f\">")
            .nth(1)
            .expect("a row for web");
        assert!(
            row.starts_with("<td>ml/web-7d9f</td><td>ml/ReplicaSet/web-5c6b</td><td>a1</td><td>GPU-a1-3</td><td>b0</td><td>GPU-b0-3</td><td>1</td>"),
            "{row}"
        );
    }
}
