//! `/metrics` (Prometheus text format) and `/healthz` for the exporter.
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
//! | `fumarole_colocation_pods{level}` | gauge | pods per `volcano.sh/qos-level` (`LC`, `LS`, `none`, `BE`) with `--colocation` |
//! | `fumarole_colocation_burst_pods` | gauge | pods with CPU burst enabled |
//! | `fumarole_colocation_pod_errors` | gauge | pods whose co-location settings failed in the last round |
//! | `fumarole_colocation_batch_cpu_millicores` | gauge | `kubernetes.io/batch-cpu` as last published (0 when off) |
//! | `fumarole_colocation_batch_memory_bytes` | gauge | `kubernetes.io/batch-memory` as last published (0 when off) |
//! | `fumarole_colocation_usage_percent{resource}` | gauge | kubepods usage in percent of allocatable (`cpu`, `memory`) |
//! | `fumarole_colocation_pressure{resource}` | gauge | 1 while the resource is under pressure (watermark or PSI) |
//! | `fumarole_colocation_evicting` | gauge | 1 while the node carries `volcano.sh/offline-job-evicting` |
//! | `fumarole_colocation_evictions_total{reason}` | counter | offline pods evicted (`pressure`, `oversubscription-off`) |
//! | `fumarole_colocation_eviction_failures_total` | counter | evictions the API server refused (a PodDisruptionBudget) or failed |
//! | `fumarole_colocation_config_valid` | gauge | 0 while an invalid configuration is ignored (the last good one is in force) |

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

type Labels = Vec<(String, String)>;

pub struct Metrics {
    registry: Registry,
    discoveries: Counter,
    discovery_errors: Counter,
    publishes: Family<Labels, Counter>,
    api_errors: Family<Labels, Counter>,
    last_success: Gauge<f64, AtomicU64>,
    devices: Family<Labels, Gauge>,
    devices_allocated: Gauge,
    colocation_pods: Family<Labels, Gauge>,
    colocation_burst_pods: Gauge,
    colocation_pod_errors: Gauge,
    colocation_node: ColocationNodeMetrics,
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
    /// longest backoff).
    pub fn new(recheck: Duration) -> Arc<Self> {
        let mut registry = Registry::with_prefix("fumarole");
        let m = Metrics {
            discoveries: Counter::default(),
            discovery_errors: Counter::default(),
            publishes: Family::default(),
            api_errors: Family::default(),
            last_success: Gauge::default(),
            devices: Family::default(),
            devices_allocated: Gauge::default(),
            colocation_pods: Family::default(),
            colocation_burst_pods: Gauge::default(),
            colocation_pod_errors: Gauge::default(),
            colocation_node: ColocationNodeMetrics::default(),
            last_tick: AtomicU64::new(now()),
            stale_after: recheck * 3 + Duration::from_secs(30),
            registry: Registry::default(),
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
            "colocation_pods",
            "Pods per volcano.sh/qos-level (co-location)",
            m.colocation_pods.clone(),
        );
        registry.register(
            "colocation_burst_pods",
            "Pods with CPU burst enabled (co-location)",
            m.colocation_burst_pods.clone(),
        );
        registry.register(
            "colocation_pod_errors",
            "Pods whose co-location settings failed in the last round",
            m.colocation_pod_errors.clone(),
        );
        m.colocation_node.register(&mut registry);
        Arc::new(Metrics { registry, ..m })
    }

    /// The co-location node loop's gauges and counters (batch resources, pressure, eviction).
    pub fn colocation_node(&self) -> &ColocationNodeMetrics {
        &self.colocation_node
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

    /// The node's accelerators as last discovered: how many are healthy, unhealthy, allocated.
    pub fn devices(&self, healthy: usize, unhealthy: usize, allocated: usize) {
        let gauge = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        for (health, n) in [("healthy", healthy), ("unhealthy", unhealthy)] {
            self.devices
                .get_or_create(&vec![("health".into(), health.into())])
                .set(gauge(n));
        }
        self.devices_allocated.set(gauge(allocated));
    }

    /// The co-location loop's last round: pods per level name, burst-enabled and failed pods.
    pub fn colocation(&self, levels: &[(&str, i64)], burst_pods: i64, failed_pods: i64) {
        for (level, pods) in levels {
            self.colocation_pods
                .get_or_create(&vec![("level".into(), (*level).into())])
                .set(*pods);
        }
        self.colocation_burst_pods.set(burst_pods);
        self.colocation_pod_errors.set(failed_pods);
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
        let _ = encode(&mut out, &self.registry);
        out
    }
}

/// Node-level co-location state: batch resources, usage, pressure, eviction, configuration.
#[derive(Default)]
pub struct ColocationNodeMetrics {
    batch_cpu_millis: Gauge,
    batch_memory_bytes: Gauge,
    usage_percent: Family<Labels, Gauge<f64, AtomicU64>>,
    pressure: Family<Labels, Gauge>,
    evicting: Gauge,
    evictions: Family<Labels, Counter>,
    eviction_failures: Counter,
    config_valid: Gauge,
}

fn saturating_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

impl ColocationNodeMetrics {
    fn register(&self, registry: &mut Registry) {
        registry.register(
            "colocation_batch_cpu_millicores",
            "kubernetes.io/batch-cpu as last published on the Node status",
            self.batch_cpu_millis.clone(),
        );
        registry.register(
            "colocation_batch_memory_bytes",
            "kubernetes.io/batch-memory as last published on the Node status",
            self.batch_memory_bytes.clone(),
        );
        registry.register(
            "colocation_usage_percent",
            "Usage of the kubepods cgroup tree in percent of the node's allocatable",
            self.usage_percent.clone(),
        );
        registry.register(
            "colocation_pressure",
            "1 while the resource is under pressure (watermark or PSI)",
            self.pressure.clone(),
        );
        registry.register(
            "colocation_evicting",
            "1 while the node carries the volcano.sh/offline-job-evicting taint",
            self.evicting.clone(),
        );
        registry.register(
            "colocation_evictions",
            "Offline pods evicted through the Eviction API",
            self.evictions.clone(),
        );
        registry.register(
            "colocation_eviction_failures",
            "Evictions refused or failed",
            self.eviction_failures.clone(),
        );
        registry.register(
            "colocation_config_valid",
            "0 while an invalid co-location configuration is ignored",
            self.config_valid.clone(),
        );
        // Known label values start at 0, so rate() and alerts see them before the first event.
        for reason in ["pressure", "oversubscription-off"] {
            let _ = self
                .evictions
                .get_or_create(&vec![("reason".into(), reason.into())]);
        }
        for resource in ["cpu", "memory"] {
            let _ = self
                .pressure
                .get_or_create(&vec![("resource".into(), resource.into())]);
        }
    }

    /// Batch resources as published (both 0 while oversubscription is off).
    pub fn batch(&self, cpu_millis: u64, memory_bytes: u64) {
        self.batch_cpu_millis.set(saturating_i64(cpu_millis));
        self.batch_memory_bytes.set(saturating_i64(memory_bytes));
    }

    pub fn usage(&self, resource: &str, percent: f64) {
        self.usage_percent
            .get_or_create(&vec![("resource".into(), resource.into())])
            .set(percent);
    }

    pub fn pressure(&self, resource: &str, under_pressure: bool) {
        self.pressure
            .get_or_create(&vec![("resource".into(), resource.into())])
            .set(i64::from(under_pressure));
    }

    pub fn evicting(&self, tainted: bool) {
        self.evicting.set(i64::from(tainted));
    }

    pub fn eviction(&self, reason: &str) {
        self.evictions
            .get_or_create(&vec![("reason".into(), reason.into())])
            .inc();
    }

    pub fn eviction_failure(&self) {
        self.eviction_failures.inc();
    }

    pub fn config_valid(&self, valid: bool) {
        self.config_valid.set(i64::from(valid));
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
pub async fn serve(listener: tokio::net::TcpListener, m: Arc<Metrics>) -> std::io::Result<()> {
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .with_state(m);
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "serving /metrics and /healthz");
    }
    axum::serve(listener, app).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_prefixed_metrics() {
        let m = Metrics::new(Duration::from_secs(10));
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
}
