//! "Why did my pod go there": per node, the filter verdict and reason, `q`, `loss`, the score
//! and the devices the pod would get, as a table or as JSON. The verdicts come from
//! [`crate::decider::Decider::explain`]; this module only lays them out.
//!
//! JSON is a list of objects with exactly the keys `node`, `feasible`, `reason`, `q`, `loss`,
//! `score`, `devices` (other tools rely on them). `reason`, `q`, `loss` and `score` are `null`
//! where they do not apply (`reason` on feasible nodes, the others on filtered ones). `score` is
//! the node's score on Volcano's scale (0..100 times `weight`), which the caller's `scale` gives
//! ([`crate::protocol::scale::volcano`]). Rows come best first.

use serde::Serialize;

use crate::core::request::DeviceRequest;
use crate::core::verdict::NodeVerdict;
use crate::core::view::ClusterView;
use crate::text_table;

/// One row of the explanation.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Row {
    pub node: String,
    pub feasible: bool,
    pub reason: Option<String>,
    pub q: Option<f64>,
    pub loss: Option<f64>,
    pub score: Option<f64>,
    pub devices: Vec<String>,
}

impl Row {
    /// The row of verdict `v`, its 0..1 score shown as `scale` turns it.
    pub fn new(v: NodeVerdict, scale: impl Fn(f64) -> f64, view: &ClusterView) -> Self {
        Row {
            feasible: v.feasible(),
            devices: v.device_ids(view),
            reason: v.reason(),
            node: v.node.into(),
            q: v.q,
            loss: v.loss,
            score: v.raw.map(scale),
        }
    }
}

/// JSON text (pretty, one trailing newline).
pub fn json(rows: &[Row]) -> String {
    let mut s = serde_json::to_string_pretty(rows).unwrap_or_else(|_| "[]".into());
    s.push('\n');
    s
}

/// A number cell of the table: `digits` decimals, `-` where it does not apply.
pub fn num(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "-".into(), |x| format!("{x:.digits$}"))
}

/// A plain-text table with a header line naming the request.
pub fn table(req: &DeviceRequest, rows: &[Row]) -> String {
    let mut cells = vec![
        ["NODE", "FEASIBLE", "Q", "LOSS", "SCORE", "DEVICES / REASON"]
            .map(String::from)
            .to_vec(),
    ];
    for r in rows {
        cells.push(vec![
            r.node.clone(),
            if r.feasible { "yes" } else { "no" }.into(),
            num(r.q, 3),
            num(r.loss, 3),
            num(r.score, 1),
            match &r.reason {
                Some(reason) => reason.clone(),
                None => r.devices.join(","),
            },
        ]);
    }
    format!(
        "pod {} requests {} {}\n{}",
        req.pod,
        req.count,
        req.resource,
        text_table::render(&cells)
    )
}
