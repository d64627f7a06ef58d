//! The routes over one [`Service`], in two routers for two listeners:
//!
//! - [`router`]: what the schedulers call, kube-scheduler's extender verbs under
//!   [`KUBE_PREFIX`](crate::protocol::kube_scheduler::KUBE_PREFIX) and Volcano's under
//!   [`VOLCANO_PREFIX`](crate::protocol::volcano::VOLCANO_PREFIX), each protocol behind its
//!   [`Rule`] ([`crate::http::access`]), plus `GET /healthz` (alive), `GET /readyz` (the
//!   view is current) and `GET /leaderz` (this replica hands out devices).
//! - [`webhook_router`]: the API server's admission webhook ([`crate::protocol::admission`])
//!   and `GET /healthz`, on a listener of its own: the API server must reach it (it presents
//!   no credentials; the webhook answers allow or deny and writes nothing), while network
//!   policy keeps everyone but the schedulers off the schedulers' port. Every request is bounded in time
//!   ([`Options::request_timeout`]) and every verb in body size (its protocol module's limits).
//! - [`ui_router`]: `GET /ui` (the page for people) and `GET /healthz`, served on a listener
//!   of its own (localhost by default), never on the schedulers' port.
//!
//! `/metrics` is added around a finished router by [`crate::http::metrics::instrument`].

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use crate::http::access::{self, Rule};
use crate::http::ui;
use crate::protocol::{admission, kube_scheduler, volcano};
use crate::service::Service;

/// How the schedulers' router guards its routes.
#[derive(Clone, Debug)]
pub struct Options {
    /// Who may call kube-scheduler's verbs.
    pub kube: Rule,
    /// Who may call Volcano's verbs.
    pub volcano: Rule,
    /// Longest a request may take, answer included (a bind writes to the API server twice).
    pub request_timeout: Duration,
}

impl Default for Options {
    /// Open routes (tests, snapshots), 30 s per request.
    fn default() -> Self {
        Options {
            kube: Rule::default(),
            volcano: Rule::default(),
            request_timeout: Duration::from_secs(30),
        }
    }
}

/// The schedulers' routes over `svc`, open to anyone (tests and snapshot serving).
pub fn router(svc: Arc<Service>) -> Router {
    router_with(svc, &Options::default())
}

/// The schedulers' routes over `svc`, guarded as `options` says.
pub fn router_with(svc: Arc<Service>, options: &Options) -> Router {
    let kube = kube_scheduler::routes().route_layer(middleware::from_fn_with_state(
        options.kube.clone(),
        access::require,
    ));
    let volcano = volcano::routes().route_layer(middleware::from_fn_with_state(
        options.volcano.clone(),
        access::require,
    ));
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/leaderz", get(leaderz))
        .merge(kube)
        .merge(volcano)
        .layer(middleware::from_fn_with_state(
            options.request_timeout,
            time_limit,
        ))
        .with_state(svc)
}

/// The admission webhook and `/healthz` over `svc`.
pub fn webhook_router(svc: Arc<Service>) -> Router {
    webhook_router_within(svc, admission::WEBHOOK_TIME_LIMIT)
}

/// [`webhook_router`] answering every request, body included, within `limit`.
pub fn webhook_router_within(svc: Arc<Service>, limit: Duration) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .merge(admission::routes())
        .layer(middleware::from_fn_with_state(limit, time_limit))
        .with_state(svc)
}

/// `/ui` and `/healthz` over `svc`.
pub fn ui_router(svc: Arc<Service>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/ui", get(ui::page))
        .with_state(ui::Page::new(svc))
}

async fn healthz() -> &'static str {
    "ok\n"
}

/// `200` while the view is current, else `503` with the reason.
async fn readyz(State(svc): State<Arc<Service>>) -> Response {
    status(svc.readiness())
}

/// `200` when this replica hands out devices (it leads, or there is no election), else `503`
/// naming the leader.
async fn leaderz(State(svc): State<Arc<Service>>) -> Response {
    status(svc.leader_status())
}

fn status(result: Result<(), String>) -> Response {
    match result {
        Ok(()) => "ok\n".into_response(),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")).into_response(),
    }
}

/// Answers `503` when the request is not done within `limit`.
async fn time_limit(State(limit): State<Duration>, req: Request, next: Next) -> Response {
    let path = req.uri().path().to_string();
    match tokio::time::timeout(limit, next.run(req)).await {
        Ok(response) => response,
        Err(_) => {
            tracing::warn!(%path, ?limit, "request timed out");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                format!("request took longer than {limit:?}\n"),
            )
                .into_response()
        }
    }
}
