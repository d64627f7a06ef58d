//! "Why did my pod go there": per node, the filter verdict and reason, `q`, `loss`, the score
//! and the devices the pod would get, as a table or as JSON.
//!
//! JSON is a list of objects with exactly the keys `node`, `feasible`, `reason`, `q`, `loss`,
//! `score`, `devices` (other tools rely on them). `reason`, `q`, `loss` and `score` are `null`
//! where they do not apply (`reason` on feasible nodes, the others on filtered ones). `score` is
//! the gpu-aware score on Volcano's scale (0..100 times `weight`). Rows come best first.

use k8s_openapi::api::core::v1::Pod;
use serde::Serialize;

use crate::extender::Service;
use crate::request::{DeviceRequest, RequestError};
use crate::score::gpu_aware::{GpuAware, NodeVerdict, best_first};
use crate::view::ClusterView;

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
    pub fn new(v: NodeVerdict, g: &GpuAware, view: &ClusterView) -> Self {
        Row {
            feasible: v.feasible(),
            devices: v.device_ids(view),
            node: v.node,
            reason: v.reason,
            q: v.q,
            loss: v.loss,
            score: v.raw.map(|r| g.volcano(r)),
        }
    }
}

/// The explanation of `pod` over every node of the service's view, best first, through the
/// same steps as `filter` (group plans included, made in the service's own ledger).
pub fn explain(svc: &Service, pod: &Pod) -> Result<(DeviceRequest, Vec<Row>), RequestError> {
    let view = svc.view();
    let names: Vec<String> = view.nodes().map(|n| n.name.clone()).collect();
    let req = crate::request::device_request(pod, &view.resources())?;
    let mut verdicts = svc.evaluate(pod, &names, false)?;
    best_first(&mut verdicts);
    let g = svc.scorer();
    Ok((
        req,
        verdicts
            .into_iter()
            .map(|v| Row::new(v, g, &view))
            .collect(),
    ))
}

/// JSON text (pretty, one trailing newline).
pub fn json(rows: &[Row]) -> String {
    let mut s = serde_json::to_string_pretty(rows).unwrap_or_else(|_| "[]".into());
    s.push('\n');
    s
}

fn num(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "-".into(), |x| format!("{x:.digits$}"))
}

/// A plain-text table with a header line naming the request.
pub fn table(req: &DeviceRequest, rows: &[Row]) -> String {
    let mut cells = vec![[
        "NODE".to_string(),
        "FEASIBLE".into(),
        "Q".into(),
        "LOSS".into(),
        "SCORE".into(),
        "DEVICES / REASON".into(),
    ]];
    for r in rows {
        cells.push([
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
    let mut width = [0usize; 6];
    for row in &cells {
        for (w, c) in width.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = format!("pod {} requests {} {}\n", req.pod, req.count, req.resource);
    for row in &cells {
        let line: Vec<String> = row
            .iter()
            .zip(width)
            .enumerate()
            .map(|(i, (c, w))| {
                if i == 5 {
                    c.clone()
                } else {
                    format!("{c:<w$}")
                }
            })
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}
