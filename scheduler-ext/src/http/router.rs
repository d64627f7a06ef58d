//! The routes over one [`Service`]: kube-scheduler's extender verbs under
//! [`KUBE_PREFIX`](crate::protocol::kube_scheduler::KUBE_PREFIX), Volcano's under
//! [`VOLCANO_PREFIX`](crate::protocol::volcano::VOLCANO_PREFIX), `GET /ui` and `GET /healthz`.
//! `/metrics` is added around the finished router by [`crate::http::metrics::instrument`].

use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::get;

use crate::http::ui;
use crate::protocol::{kube_scheduler, volcano};
use crate::service::Service;

/// Largest request body accepted (a `NodeList` of thousands of nodes is large).
pub const BODY_LIMIT: usize = 64 << 20;

/// The HTTP routes over `svc`.
pub fn router(svc: Arc<Service>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/ui", get(ui::page))
        .merge(kube_scheduler::routes())
        .merge(volcano::routes())
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(svc)
}

async fn healthz() -> &'static str {
    "ok\n"
}
