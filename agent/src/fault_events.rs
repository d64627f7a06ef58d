//! What becomes of each device fault beyond the kubelet and `DeviceTopology`: a log line, a
//! Kubernetes Event on the Node naming the device and the fault, and
//! `fumarole_device_faults_total{device,kind}` ([`spawn_reports`], following the node's
//! health stream, [`fumarole_exporter::device_health`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use fumarole_topology::{Fault, FaultKind, NodeHealth};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use tokio::sync::watch;

/// `fumarole_device_faults_total{device, kind}`: faults seen per device and kind (`xid`,
/// `ecc`, `row-remap`, `fell-off-bus`, `nvlink-down`, `dcmi-chip`, `dcmi-network`,
/// `hccs-down`, `dev-node-missing`), counted when they start.
#[derive(Debug, Default)]
pub struct DeviceFaultMetrics {
    total: Family<Vec<(String, String)>, Counter>,
}

impl DeviceFaultMetrics {
    /// The counter, registered in `registry` (names under its `fumarole` prefix).
    pub fn register(registry: &mut Registry) -> Arc<Self> {
        let m = Self::default();
        registry.register(
            "device_faults",
            "Device faults seen, per device and kind, counted when they start",
            m.total.clone(),
        );
        Arc::new(m)
    }

    fn count(&self, device: &str, kind: FaultKind) {
        self.total
            .get_or_create(&vec![
                ("device".to_string(), device.to_string()),
                ("kind".to_string(), kind.as_str().to_string()),
            ])
            .inc();
    }
}

/// One device fault that started or ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    Started { device: String, fault: Fault },
    Ended { device: String, kind: FaultKind },
}

/// The faults (by device and kind) that started or ended between `before` and `after`.
pub fn changes(before: &NodeHealth, after: &NodeHealth) -> Vec<Change> {
    let kinds = |h: &NodeHealth| -> BTreeMap<(String, FaultKind), Fault> {
        h.devices
            .iter()
            .flat_map(|(id, faults)| {
                faults
                    .iter()
                    .map(move |f| ((id.clone(), f.kind), f.clone()))
            })
            .collect()
    };
    let (b, a) = (kinds(before), kinds(after));
    let mut out = Vec::new();
    for ((device, _), fault) in a.iter().filter(|(k, _)| !b.contains_key(*k)) {
        out.push(Change::Started {
            device: device.clone(),
            fault: fault.clone(),
        });
    }
    let ended: BTreeSet<&(String, FaultKind)> = b.keys().filter(|k| !a.contains_key(*k)).collect();
    for (device, kind) in ended {
        out.push(Change::Ended {
            device: device.clone(),
            kind: *kind,
        });
    }
    out
}

/// The Events a change of health gives, one per device whose state changed: out of use
/// (`DeviceUnhealthy`, naming the faults) or back (`DeviceRecovered`), links weighted lower
/// (`DeviceLinkDegraded`) or as built again (`DeviceLinkRestored`).
pub fn device_events(before: &NodeHealth, after: &NodeHealth) -> Vec<(String, Event)> {
    let degraded = |h: &NodeHealth, id: &str| h.faults(id).iter().any(|f| !f.kind.disables());
    let devices: BTreeSet<&String> = before.devices.keys().chain(after.devices.keys()).collect();
    let mut out = Vec::new();
    for id in devices {
        let describe = |disabling: bool| {
            after
                .faults(id)
                .iter()
                .filter(|f| f.kind.disables() == disabling)
                .map(|f| f.to_string())
                .collect::<Vec<_>>()
                .join("; ")
        };
        let mut push = |type_, reason: &str, note: String| {
            out.push((
                id.clone(),
                Event {
                    type_,
                    reason: reason.into(),
                    // The Events API caps the note at 1 kB.
                    note: Some(note.chars().take(1000).collect()),
                    action: "CheckDeviceHealth".into(),
                    secondary: None,
                },
            ));
        };
        match (before.is_healthy(id), after.is_healthy(id)) {
            (true, false) => push(
                EventType::Warning,
                "DeviceUnhealthy",
                format!("{id} is out of use: {}", describe(true)),
            ),
            (false, true) => push(
                EventType::Normal,
                "DeviceRecovered",
                format!("{id} is healthy again and back in use"),
            ),
            _ => {}
        }
        match (degraded(before, id), degraded(after, id)) {
            (false, true) => push(
                EventType::Warning,
                "DeviceLinkDegraded",
                format!("{id}: {}; its links are weighted lower", describe(false)),
            ),
            (true, false) => push(
                EventType::Normal,
                "DeviceLinkRestored",
                format!("{id}: links up again and weighted as built"),
            ),
            _ => {}
        }
    }
    out
}

/// A reference to Node `name` for Events (the kubelet uses the node name as its uid too).
pub fn node_reference(name: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(name.to_string()),
        uid: Some(name.to_string()),
        ..ObjectReference::default()
    }
}

/// The device an Event is about, as the Event's related object: its entry in the node's
/// `DeviceTopology` status. It also keeps the Events of different devices apart (Events are
/// aggregated per regarding and related object, reason and action).
fn device_reference(node: &str, device: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("topology.fumarole.dev/v1alpha1".into()),
        kind: Some("DeviceTopology".into()),
        name: Some(node.to_string()),
        field_path: Some(format!("status.devices[{device}]")),
        ..ObjectReference::default()
    }
}

/// Follows the health stream: every fault that starts or ends is a log line, an Event on the
/// Node (with `events`) and a count in `metrics` (when it starts).
pub fn spawn_reports(
    mut health: watch::Receiver<NodeHealth>,
    events: Option<(Recorder, ObjectReference)>,
    metrics: Option<Arc<DeviceFaultMetrics>>,
) {
    tokio::spawn(async move {
        let mut before = NodeHealth::default();
        loop {
            let after = health.borrow_and_update().clone();
            for change in changes(&before, &after) {
                match &change {
                    Change::Started { device, fault } => {
                        tracing::warn!(device = %device, kind = %fault.kind, reason = %fault.reason, disables = fault.kind.disables(), "device fault");
                        if let Some(m) = &metrics {
                            m.count(device, fault.kind);
                        }
                    }
                    Change::Ended { device, kind } => {
                        tracing::info!(device = %device, kind = %kind, healthy = after.is_healthy(device), "device fault cleared");
                    }
                }
            }
            if let Some((recorder, node)) = &events {
                let node_name = node.name.clone().unwrap_or_default();
                for (device, mut event) in device_events(&before, &after) {
                    event.secondary = Some(device_reference(&node_name, &device));
                    let (recorder, node) = (recorder.clone(), node.clone());
                    tokio::spawn(async move {
                        if let Err(e) = recorder.publish(&event, &node).await {
                            tracing::warn!(error = %e, "recording the device health Event failed");
                        }
                    });
                }
            }
            before = after;
            if health.changed().await.is_err() {
                return;
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_are_per_device_and_kind() {
        let mut before = NodeHealth::default();
        before.add(
            "g1",
            Fault::new(FaultKind::NvlinkDown, "NVLink lane 3 down"),
        );
        let mut after = before.clone();
        // Another lane of the same kind: no new change.
        after.devices.insert(
            "g1".into(),
            vec![Fault::new(FaultKind::NvlinkDown, "NVLink lanes 3, 4 down")],
        );
        after.add("g3", Fault::new(FaultKind::Xid, "XID 79"));
        assert_eq!(
            changes(&before, &after),
            vec![Change::Started {
                device: "g3".into(),
                fault: Fault::new(FaultKind::Xid, "XID 79")
            }]
        );
        assert_eq!(
            changes(&after, &NodeHealth::default()),
            vec![
                Change::Ended {
                    device: "g1".into(),
                    kind: FaultKind::NvlinkDown
                },
                Change::Ended {
                    device: "g3".into(),
                    kind: FaultKind::Xid
                },
            ]
        );
    }

    #[test]
    fn events_follow_each_device_in_and_out_of_use() {
        let mut faulty = NodeHealth::default();
        faulty.add(
            "GPU-3",
            Fault::new(FaultKind::Xid, "XID 79 (GPU has fallen off the bus)"),
        );
        faulty.add(
            "GPU-5",
            Fault::new(FaultKind::NvlinkDown, "NVLink lane 5 down"),
        );
        let healthy = NodeHealth::default();
        let e = device_events(&healthy, &faulty);
        let seen: Vec<(&str, &str, &str)> = e
            .iter()
            .map(|(d, e)| {
                (
                    d.as_str(),
                    e.reason.as_str(),
                    e.note.as_deref().unwrap_or(""),
                )
            })
            .collect();
        assert_eq!(
            seen,
            [
                (
                    "GPU-3",
                    "DeviceUnhealthy",
                    "GPU-3 is out of use: xid: XID 79 (GPU has fallen off the bus)"
                ),
                (
                    "GPU-5",
                    "DeviceLinkDegraded",
                    "GPU-5: nvlink-down: NVLink lane 5 down; its links are weighted lower"
                ),
            ]
        );
        // A second fault of a device already out of use is no new Event.
        let mut worse = faulty.clone();
        worse.add("GPU-3", Fault::new(FaultKind::FellOffBus, "lost"));
        assert!(device_events(&faulty, &worse).is_empty());
        let back: Vec<String> = device_events(&worse, &healthy)
            .into_iter()
            .map(|(_, e)| e.reason)
            .collect();
        assert_eq!(back, ["DeviceRecovered", "DeviceLinkRestored"]);
    }
}
