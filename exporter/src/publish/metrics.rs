//! `/metrics` (Prometheus text format) and `/healthz` for the exporter. The agent registers its
//! co-location metrics (`fumarole_colocation_*`, declared in `fumarole-colocation`) into the same
//! registry through [`Metrics::new`], so one endpoint serves both.
//!
//! | metric | type | meaning |
//! |---|---|---|
//! | `fumarole_discoveries_total` | counter | discovery rounds |
//! | `fumarole_discovery_errors_total` | counter | discovery rounds that failed |
//! | `fumarole_publishes_total{object}` | counter | server-side applies that succeeded |
//! | `fumarole_api_errors_total{object}` | counter | server-side applies that failed |
//! | `fumarole_last_publish_success_timestamp_seconds` | gauge | end of the last round with every write done |
//! | `fumarole_devices{health}` | gauge | accelerators on the node by health (`healthy`, `unhealthy`) as last discovered |
//! | `fumarole_devices_allocated` | gauge | accelerators the kubelet has given to a container |
//! | `fumarole_device_shares_allocated` | gauge | shares of accelerators (time-sliced or MPS replicas, MIG devices) the kubelet has given to containers |

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::encoding::text::{encode_eof, encode_registry};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

type Labels = Vec<(String, String)>;

pub struct Metrics {
    registry: Registry,
    /// Names other exporters use, written as they are (no `fumarole_` prefix): dcgm-exporter's
    /// `DCGM_FI_DEV_*` ([`crate::device_metrics`]).
    unprefixed: Registry,
    discoveries: Counter,
    discovery_errors: Counter,
    publishes: Family<Labels, Counter>,
    api_errors: Family<Labels, Counter>,
    last_success: Gauge<f64, AtomicU64>,
    devices: Family<Labels, Gauge>,
    devices_allocated: Gauge,
    device_shares_allocated: Gauge,
    /// Unix seconds of the last loop round, for `/healthz`.
    last_tick: AtomicU64,
    /// A round older than this makes `/healthz` fail.
    stale_after: Duration,
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Metrics {
    /// `recheck` is the publish interval; health fails after three missed rounds (plus the
    /// longest backoff). After the exporter's own metrics, `more` registers other components'
    /// into the same registry (prefix `fumarole`) or, for names other exporters use, into an
    /// unprefixed one, both served on the same `/metrics`; what it returns (those components'
    /// handles on their metrics) comes back beside ours.
    pub fn new<T>(
        recheck: Duration,
        more: impl FnOnce(&mut Registry, &mut Registry) -> T,
    ) -> (Arc<Self>, T) {
        let mut registry = Registry::with_prefix("fumarole");
        let mut unprefixed = Registry::default();
        let m = Metrics {
            discoveries: Counter::default(),
            discovery_errors: Counter::default(),
            publishes: Family::default(),
            api_errors: Family::default(),
            last_success: Gauge::default(),
            devices: Family::default(),
            devices_allocated: Gauge::default(),
            device_shares_allocated: Gauge::default(),
            last_tick: AtomicU64::new(now()),
            stale_after: recheck * 3 + Duration::from_secs(30),
            registry: Registry::default(),
            unprefixed: Registry::default(),
        };
        registry.register("discoveries", "Discovery rounds", m.discoveries.clone());
        registry.register(
            "discovery_errors",
            "Discovery rounds that failed",
            m.discovery_errors.clone(),
        );
        registry.register(
            "publishes",
            "Server-side applies that succeeded",
            m.publishes.clone(),
        );
        registry.register(
            "api_errors",
            "Server-side applies that failed",
            m.api_errors.clone(),
        );
        registry.register(
            "last_publish_success_timestamp_seconds",
            "Unix time of the end of the last round with every write done",
            m.last_success.clone(),
        );
        registry.register(
            "devices",
            "Accelerators on the node by health, as last discovered",
            m.devices.clone(),
        );
        registry.register(
            "devices_allocated",
            "Accelerators the kubelet has given to a container",
            m.devices_allocated.clone(),
        );
        registry.register(
            "device_shares_allocated",
            "Shares of accelerators (replicas, MIG devices) the kubelet has given to containers",
            m.device_shares_allocated.clone(),
        );
        let theirs = more(&mut registry, &mut unprefixed);
        (
            Arc::new(Metrics {
                registry,
                unprefixed,
                ..m
            }),
            theirs,
        )
    }

    pub fn discovery(&self, ok: bool) {
        self.discoveries.inc();
        if !ok {
            self.discovery_errors.inc();
        }
    }

    /// Creates the per-object counters at 0.
    pub fn objects_known(&self, object: &str) {
        let labels = vec![("object".into(), object.into())];
        let _ = self.publishes.get_or_create(&labels);
        let _ = self.api_errors.get_or_create(&labels);
    }

    pub fn publish(&self, object: &str) {
        self.publishes
            .get_or_create(&vec![("object".into(), object.into())])
            .inc();
    }

    pub fn api_error(&self, object: &str) {
        self.api_errors
            .get_or_create(&vec![("object".into(), object.into())])
            .inc();
    }

    /// The node's accelerators as last discovered: how many are healthy, unhealthy, allocated
    /// whole, and how many of their shares (replicas, MIG devices) containers hold.
    pub fn devices(&self, healthy: usize, unhealthy: usize, allocated: usize, shares: usize) {
        let gauge = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        for (health, n) in [("healthy", healthy), ("unhealthy", unhealthy)] {
            self.devices
                .get_or_create(&vec![("health".into(), health.into())])
                .set(gauge(n));
        }
        self.devices_allocated.set(gauge(allocated));
        self.device_shares_allocated.set(gauge(shares));
    }

    pub fn success(&self) {
        self.last_success.set(now() as f64);
    }

    pub fn tick(&self) {
        self.last_tick.store(now(), Ordering::Relaxed);
    }

    /// The loop ran recently.
    pub fn healthy(&self) -> bool {
        now().saturating_sub(self.last_tick.load(Ordering::Relaxed)) <= self.stale_after.as_secs()
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = encode_registry(&mut out, &self.registry);
        let _ = encode_registry(&mut out, &self.unprefixed);
        let _ = encode_eof(&mut out);
        out
    }
}

async fn metrics(State(m): State<Arc<Metrics>>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        m.encode(),
    )
}

async fn healthz(State(m): State<Arc<Metrics>>) -> impl IntoResponse {
    if m.healthy() {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "publish loop stalled")
    }
}

/// Serves `/metrics` and `/healthz` on `listener` until the process ends.
pub async fn serve(listener: tokio::net::TcpListener, m: Arc<Metrics>) -> anyhow::Result<()> {
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .with_state(m);
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "serving /metrics and /healthz");
    }
    // The extension's limits (connections in all and per peer, header timeout): the port is
    // open to the pod network, and a stuck or greedy client must not starve the scrapes.
    fumarole_http_serve::serve(
        listener,
        app,
        None,
        fumarole_http_serve::Limits::default(),
        std::future::pending(),
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The agent's `/metrics` port has the extension's connection limits: one address that
    /// holds its 128 connections gets its next one closed at once, and another is served.
    #[tokio::test]
    async fn one_peer_cannot_take_every_metrics_connection() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (m, ()) = Metrics::new(Duration::from_secs(10), |_, _| ());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(serve(listener, m));
        let per_peer = fumarole_http_serve::Limits::default().max_connections_per_peer;
        let mut held = Vec::new();
        for _ in 0..per_peer {
            held.push(tokio::net::TcpStream::connect(addr).await.unwrap());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut next = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut buf = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(5), next.read_to_end(&mut buf))
            .await
            .expect("the next connection is closed at once");
        assert!(read.is_err() || buf.is_empty(), "{buf:?}");
        let other = tokio::net::TcpSocket::new_v4().unwrap();
        other.bind("127.0.0.2:0".parse().unwrap()).unwrap();
        let mut other = other.connect(addr).await.unwrap();
        other
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut answer = Vec::new();
        other.read_to_end(&mut answer).await.unwrap();
        assert!(answer.starts_with(b"HTTP/1.1 200"), "{answer:?}");
        drop(held);
    }

    #[test]
    fn encodes_prefixed_metrics() {
        let (m, ()) = Metrics::new(Duration::from_secs(10), |_, _| ());
        m.discovery(true);
        m.publish("numatopology");
        m.api_error("node-labels");
        let text = m.encode();
        assert!(text.contains("fumarole_discoveries_total 1"), "{text}");
        assert!(
            text.contains("fumarole_publishes_total{object=\"numatopology\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("fumarole_api_errors_total{object=\"node-labels\"} 1"),
            "{text}"
        );
        assert!(m.healthy());
    }

    #[test]
    fn other_components_register_into_the_same_registry() {
        let (m, extra) = Metrics::new(Duration::from_secs(10), |registry, _| {
            let extra = Counter::<u64>::default();
            registry.register("extra_events", "Events of another component", extra.clone());
            extra
        });
        extra.inc();
        let text = m.encode();
        assert!(text.contains("fumarole_extra_events_total 1"), "{text}");
        assert!(text.contains("fumarole_discoveries_total 0"), "{text}");
    }
}
