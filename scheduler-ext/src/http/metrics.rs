//! Request counts and latencies per verb, served at `GET /metrics` (OpenMetrics text).
//!
//! Start at [`instrument`]: it wraps a finished [`Router`] with a middleware that records every
//! request and adds the `/metrics` route.
//!
//! | metric | type | meaning |
//! |---|---|---|
//! | `fumarole_scheduler_ext_requests_total{protocol, verb, code}` | counter | answered requests |
//! | `fumarole_scheduler_ext_request_duration_seconds{protocol, verb}` | histogram | time to the response head |
//!
//! `protocol` is `kube-scheduler` or `volcano` from the route prefix, `other` for any other
//! route; `verb` is the last segment of the matched route (`filter`, `predicate`,
//! `allocateFunc`, ...); `code` is the HTTP status (`200`, `400`, ...). Labels come from the
//! route *pattern* ([`MatchedPath`]), never from the request path, so the label sets are
//! bounded by the routes: a request that matches no route counts as protocol `other`, verb
//! `unmatched`. `/metrics` and `/healthz` are not counted.
//!
//! The service can add its own metrics under the same prefix through
//! [`Metrics::registry_mut`] before the [`Metrics`] is shared.

use std::fmt::Write as _;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::extract::{MatchedPath, Request, State};
use axum::http::header;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

use crate::protocol::kube_scheduler::KUBE_PREFIX;
use crate::protocol::volcano::VOLCANO_PREFIX;

/// Prefix of every metric name in [`Metrics`]'s registry.
pub const PREFIX: &str = "fumarole_scheduler_ext";

/// Route of the OpenMetrics text.
pub const METRICS_PATH: &str = "/metrics";

/// Routes that are not recorded (scrapes and probes).
const UNTRACKED: [&str; 2] = [METRICS_PATH, "/healthz"];

/// Content type of [`Metrics::encode`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Lowest histogram bucket bound, seconds.
const FIRST_BUCKET: f64 = 50e-6;
/// Bucket bounds 50 µs × 2^k, k = 0..17: the last finite bound is 6.55 s.
const BUCKETS: u16 = 18;

/// Which caller a route serves, from its prefix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Protocol {
    /// Under [`KUBE_PREFIX`].
    KubeScheduler,
    /// Under [`VOLCANO_PREFIX`].
    Volcano,
    /// Any other route, and requests that match no route.
    Other,
}

impl Protocol {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::KubeScheduler => "kube-scheduler",
            Protocol::Volcano => "volcano",
            Protocol::Other => "other",
        }
    }

    fn of_route(route: &str) -> Self {
        let under = |prefix: &str| {
            route
                .strip_prefix(prefix)
                .is_some_and(|rest| rest.starts_with('/'))
        };
        if under(KUBE_PREFIX) {
            Protocol::KubeScheduler
        } else if under(VOLCANO_PREFIX) {
            Protocol::Volcano
        } else {
            Protocol::Other
        }
    }
}

impl EncodeLabelValue for Protocol {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        encoder.write_str(self.as_str())
    }
}

/// The `verb` label: the last segment of the matched route pattern. Holds the router's own
/// `Arc<str>` (through [`MatchedPath`]), so recording a request allocates nothing.
#[derive(Clone, Debug)]
pub enum Verb {
    Route(MatchedPath),
    /// The request matched no route.
    Unmatched,
}

impl Verb {
    /// The label value.
    pub fn as_str(&self) -> &str {
        match self {
            Verb::Route(route) => {
                let path = route.as_str();
                path.rsplit('/').next().unwrap_or(path)
            }
            Verb::Unmatched => "unmatched",
        }
    }
}

impl PartialEq for Verb {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for Verb {}

impl Hash for Verb {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_str().hash(state);
    }
}

impl EncodeLabelValue for Verb {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        encoder.write_str(self.as_str())
    }
}

/// Labels of `requests_total`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct RequestLabels {
    pub protocol: Protocol,
    pub verb: Verb,
    pub code: u16,
}

/// Labels of `request_duration_seconds`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct RouteLabels {
    pub protocol: Protocol,
    pub verb: Verb,
}

fn duration_histogram() -> Histogram {
    Histogram::new(exponential_buckets(FIRST_BUCKET, 2.0, BUCKETS))
}

/// The registry with the request metrics in it.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    durations: Family<RouteLabels, Histogram, fn() -> Histogram>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A registry with prefix [`PREFIX`] holding the request metrics.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix(PREFIX);
        let requests = Family::<RequestLabels, Counter>::default();
        let durations = Family::<RouteLabels, Histogram, fn() -> Histogram>::new_with_constructor(
            duration_histogram,
        );
        registry.register(
            "requests",
            "Requests answered, by protocol, verb and HTTP status",
            requests.clone(),
        );
        registry.register_with_unit(
            "request_duration",
            "Time from a request's arrival to its response head, by protocol and verb",
            Unit::Seconds,
            durations.clone(),
        );
        Metrics {
            registry,
            requests,
            durations,
        }
    }

    /// The registry, for the service to register its own metrics (they get the
    /// `fumarole_scheduler_ext_` prefix). Call it before wrapping the `Metrics` in an `Arc` for
    /// [`instrument`]; metric handles registered here stay usable afterwards (they are shared
    /// handles).
    pub fn registry_mut(&mut self) -> &mut Registry {
        &mut self.registry
    }

    /// Records one answered request.
    pub fn record(&self, protocol: Protocol, verb: Verb, code: u16, seconds: f64) {
        let route = RouteLabels { protocol, verb };
        self.durations.get_or_create(&route).observe(seconds);
        let labels = RequestLabels {
            protocol: route.protocol,
            verb: route.verb,
            code,
        };
        self.requests.get_or_create(&labels).inc();
    }

    /// Every registered metric in the OpenMetrics text format (ends with `# EOF`).
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail; a metric failing to encode would leave it out.
        if let Err(e) = encode(&mut out, &self.registry) {
            tracing::warn!(error = %e, "encoding metrics");
            let _ = writeln!(out, "# EOF");
        }
        out
    }
}

/// Adds the request-recording middleware and the `GET /metrics` route to a router whose state
/// is already applied. The middleware wraps every route and the fallback; `/metrics` and
/// `/healthz` are answered but not recorded.
pub fn instrument(router: Router, metrics: Arc<Metrics>) -> Router {
    router
        .route(
            METRICS_PATH,
            get(serve_metrics).with_state(Arc::clone(&metrics)),
        )
        .layer(middleware::from_fn_with_state(metrics, record))
}

async fn serve_metrics(State(m): State<Arc<Metrics>>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, CONTENT_TYPE)], m.encode())
}

async fn record(State(m): State<Arc<Metrics>>, req: Request, next: Next) -> Response {
    let (protocol, verb) = match req.extensions().get::<MatchedPath>() {
        Some(route) if UNTRACKED.contains(&route.as_str()) => return next.run(req).await,
        Some(route) => (
            Protocol::of_route(route.as_str()),
            Verb::Route(route.clone()),
        ),
        None => (Protocol::Other, Verb::Unmatched),
    };
    let start = Instant::now();
    let resp = next.run(req).await;
    m.record(
        protocol,
        verb,
        resp.status().as_u16(),
        start.elapsed().as_secs_f64(),
    );
    resp
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use axum::body::Body;
    use axum::http::{Method, StatusCode};
    use axum::routing::post;
    use tower::ServiceExt;

    fn app(m: &Arc<Metrics>) -> Router {
        let r = Router::new()
            .route("/kube-scheduler/filter", post(|| async { "{}" }))
            .route(
                "/volcano/allocateFunc",
                post(|| async { (StatusCode::BAD_REQUEST, "no") }),
            )
            .route("/debug/{what}", get(|| async { "x" }))
            .route("/healthz", get(|| async { "ok\n" }));
        instrument(r, Arc::clone(m))
    }

    async fn call(app: &Router, method: Method, path: &str) -> (StatusCode, String) {
        let resp = app
            .clone()
            .oneshot(
                Request::builder()
                    .method(method)
                    .uri(path)
                    .body(Body::empty())
                    .unwrap(),
            )
            .await
            .unwrap();
        let status = resp.status();
        let body = axum::body::to_bytes(resp.into_body(), usize::MAX)
            .await
            .unwrap();
        (status, String::from_utf8(body.to_vec()).unwrap())
    }

    #[test]
    fn protocol_from_route_prefix() {
        assert_eq!(
            Protocol::of_route("/kube-scheduler/bind"),
            Protocol::KubeScheduler
        );
        assert_eq!(
            Protocol::of_route("/volcano/onSessionOpen"),
            Protocol::Volcano
        );
        assert_eq!(
            Protocol::of_route("/kube-schedulerx/filter"),
            Protocol::Other
        );
        assert_eq!(Protocol::of_route("/volcano"), Protocol::Other);
    }

    #[test]
    fn buckets_span_50us_to_seconds() {
        let b: Vec<f64> = exponential_buckets(FIRST_BUCKET, 2.0, BUCKETS).collect();
        assert_eq!(b[0], 50e-6);
        assert!((5.0..7.0).contains(&b[b.len() - 1]), "{b:?}");
    }

    #[tokio::test]
    async fn records_by_route_pattern() {
        let m = Arc::new(Metrics::new());
        let app = app(&m);
        for _ in 0..2 {
            call(&app, Method::POST, "/kube-scheduler/filter").await;
        }
        call(&app, Method::GET, "/kube-scheduler/filter").await; // 405, same route
        call(&app, Method::POST, "/volcano/allocateFunc").await;
        call(&app, Method::GET, "/debug/a").await;
        call(&app, Method::GET, "/debug/b").await;
        call(&app, Method::GET, "/nope/1").await;
        call(&app, Method::GET, "/nope/2").await;
        call(&app, Method::GET, "/healthz").await;
        let (status, text) = call(&app, Method::GET, "/metrics").await;
        assert_eq!(status, StatusCode::OK);
        let counters: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("fumarole_scheduler_ext_requests_total{"))
            .collect();
        let mut counters = counters;
        counters.sort_unstable();
        assert_eq!(
            counters,
            [
                r#"fumarole_scheduler_ext_requests_total{protocol="kube-scheduler",verb="filter",code="200"} 2"#,
                r#"fumarole_scheduler_ext_requests_total{protocol="kube-scheduler",verb="filter",code="405"} 1"#,
                r#"fumarole_scheduler_ext_requests_total{protocol="other",verb="unmatched",code="404"} 2"#,
                r#"fumarole_scheduler_ext_requests_total{protocol="other",verb="{what}",code="200"} 2"#,
                r#"fumarole_scheduler_ext_requests_total{protocol="volcano",verb="allocateFunc",code="400"} 1"#,
            ],
            "{text}"
        );
        assert!(
            text.contains(
                r#"fumarole_scheduler_ext_request_duration_seconds_count{protocol="kube-scheduler",verb="filter"} 3"#
            ),
            "{text}"
        );
        assert!(
            text.contains("# UNIT fumarole_scheduler_ext_request_duration_seconds seconds"),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"), "{text}");
    }

    #[tokio::test]
    async fn service_metrics_share_the_registry() {
        let mut m = Metrics::new();
        let views = Counter::<u64>::default();
        m.registry_mut()
            .register("view_replacements", "View swaps", views.clone());
        let m = Arc::new(m);
        views.inc();
        let (_, text) = call(&app(&m), Method::GET, "/metrics").await;
        assert!(
            text.contains("fumarole_scheduler_ext_view_replacements_total 1"),
            "{text}"
        );
    }
}
