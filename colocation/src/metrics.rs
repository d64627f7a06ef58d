//! The co-location metrics, declared here and registered into the agent's `/metrics` registry
//! (the exporter's, prefix `fumarole_`) by [`ColocationMetrics::register`]. The names, types,
//! help texts and labels are what the Grafana dashboard (`deploy/grafana/`) and the e2e tests
//! read.
//!
//! | metric | type | meaning |
//! |---|---|---|
//! | `fumarole_colocation_pods{level}` | gauge | pods per `volcano.sh/qos-level` (`LC`, `LS`, `none`, `BE`) with `--colocation` |
//! | `fumarole_colocation_burst_pods` | gauge | pods with CPU burst enabled |
//! | `fumarole_colocation_batch_limited_pods` | gauge | BestEffort pods held to their `kubernetes.io/batch-*` amounts as cgroup limits |
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
use std::sync::atomic::AtomicU64;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

type Labels = Vec<(String, String)>;

/// The co-location gauges and counters: the pod loop's (levels, burst, errors) and the node
/// loop's (batch resources, usage, pressure, eviction, configuration).
#[derive(Default)]
pub struct ColocationMetrics {
    pods: Family<Labels, Gauge>,
    burst_pods: Gauge,
    batch_limited_pods: Gauge,
    pod_errors: Gauge,
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

impl ColocationMetrics {
    /// Declares the metrics in `registry` (whose prefix, `fumarole`, comes first in each name).
    pub fn register(registry: &mut Registry) -> Arc<Self> {
        let m = Self::default();
        registry.register(
            "colocation_pods",
            "Pods per volcano.sh/qos-level (co-location)",
            m.pods.clone(),
        );
        registry.register(
            "colocation_burst_pods",
            "Pods with CPU burst enabled (co-location)",
            m.burst_pods.clone(),
        );
        registry.register(
            "colocation_batch_limited_pods",
            "BestEffort pods with their batch resources as cgroup limits (co-location)",
            m.batch_limited_pods.clone(),
        );
        registry.register(
            "colocation_pod_errors",
            "Pods whose co-location settings failed in the last round",
            m.pod_errors.clone(),
        );
        registry.register(
            "colocation_batch_cpu_millicores",
            "kubernetes.io/batch-cpu as last published on the Node status",
            m.batch_cpu_millis.clone(),
        );
        registry.register(
            "colocation_batch_memory_bytes",
            "kubernetes.io/batch-memory as last published on the Node status",
            m.batch_memory_bytes.clone(),
        );
        registry.register(
            "colocation_usage_percent",
            "Usage of the kubepods cgroup tree in percent of the node's allocatable",
            m.usage_percent.clone(),
        );
        registry.register(
            "colocation_pressure",
            "1 while the resource is under pressure (watermark or PSI)",
            m.pressure.clone(),
        );
        registry.register(
            "colocation_evicting",
            "1 while the node carries the volcano.sh/offline-job-evicting taint",
            m.evicting.clone(),
        );
        registry.register(
            "colocation_evictions",
            "Offline pods evicted through the Eviction API",
            m.evictions.clone(),
        );
        registry.register(
            "colocation_eviction_failures",
            "Evictions refused or failed",
            m.eviction_failures.clone(),
        );
        registry.register(
            "colocation_config_valid",
            "0 while an invalid co-location configuration is ignored",
            m.config_valid.clone(),
        );
        // Known label values start at 0, so rate() and alerts see them before the first event.
        for reason in ["pressure", "oversubscription-off"] {
            let _ = m
                .evictions
                .get_or_create(&vec![("reason".into(), reason.into())]);
        }
        for resource in ["cpu", "memory"] {
            let _ = m
                .pressure
                .get_or_create(&vec![("resource".into(), resource.into())]);
        }
        Arc::new(m)
    }

    /// The pod loop's last round: pods per level name, burst-enabled, batch-limited and failed
    /// pods.
    pub fn pods(
        &self,
        levels: &[(&str, i64)],
        burst_pods: i64,
        batch_limited_pods: i64,
        failed_pods: i64,
    ) {
        for (level, pods) in levels {
            self.pods
                .get_or_create(&vec![("level".into(), (*level).into())])
                .set(*pods);
        }
        self.burst_pods.set(burst_pods);
        self.batch_limited_pods.set(batch_limited_pods);
        self.pod_errors.set(failed_pods);
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

#[cfg(test)]
mod tests {
    use prometheus_client::encoding::text::encode;

    use super::*;

    #[test]
    fn registered_with_the_agent_prefix() {
        let mut registry = Registry::with_prefix("fumarole");
        let m = ColocationMetrics::register(&mut registry);
        m.pods(&[("BE", 2), ("none", 1)], 1, 3, 0);
        m.eviction("pressure");
        let mut text = String::new();
        encode(&mut text, &registry).unwrap();
        for line in [
            "fumarole_colocation_pods{level=\"BE\"} 2",
            "fumarole_colocation_burst_pods 1",
            "fumarole_colocation_batch_limited_pods 3",
            "fumarole_colocation_evictions_total{reason=\"pressure\"} 1",
            "fumarole_colocation_evictions_total{reason=\"oversubscription-off\"} 0",
            "fumarole_colocation_pressure{resource=\"memory\"} 0",
            "# HELP fumarole_colocation_config_valid 0 while an invalid co-location configuration is ignored.",
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
    }
}
