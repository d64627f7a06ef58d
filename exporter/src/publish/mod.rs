//! Publishing a node's objects to the API server, and keeping them true.
//!
//! [`objects`] builds what the node should look like; [`Publisher`] writes it with
//! server-side apply (field manager [`FIELD_MANAGER`]) only when it differs from what was last
//! applied or from the live object, which it watches (so a deleted object is re-created and a
//! field someone overwrote is restored, with no reads in steady state); [`run`] is the loop:
//! re-check every interval or at once when poked, back off exponentially while the API server
//! fails, recover by itself; [`watch_allocations`] pokes it when a pod gets or frees
//! exclusive CPUs or devices, [`wake_on_health`] when a device's or link's health changes.
//! [`metrics`] serves `/metrics` and `/healthz`. [`compat`] and [`ascend`] render other
//! projects' formats (GFD's labels; Huawei's device-info ConfigMap and Ascend labels).

pub mod ascend;
pub mod compat;
pub mod metrics;
pub mod objects;
mod publisher;
pub mod slices;
pub mod state;

pub use publisher::{FIELD_MANAGER, Publisher, run};
pub use state::Desired;

use std::sync::Arc;
use std::time::Duration;

use fumarole_topology::NodeHealth;
use tokio::sync::{Notify, watch};

use crate::kubelet::{AllocationReader, Allocations, KubeletPaths};

/// The latest reading of the kubelet's allocations (`None` until the first one); an error is
/// the reason they could not be read.
pub type LatestAllocations = watch::Receiver<Option<Result<Allocations, String>>>;

/// Starts the only reader of the kubelet's allocations: every `every` (reading them is a
/// local call of well under a millisecond) it refreshes the returned [`LatestAllocations`]
/// and pokes `wake` when they changed, so a new or finished pod is published without waiting
/// for the re-check interval.
pub fn watch_allocations(
    kubelet: KubeletPaths,
    every: Duration,
    wake: Arc<Notify>,
) -> LatestAllocations {
    let (tx, rx) = watch::channel(None);
    tokio::spawn(async move {
        let mut reader = AllocationReader::new(kubelet);
        loop {
            let now = reader.read().await.map_err(|e| e.to_string());
            let changed =
                tx.send_if_modified(|latest: &mut Option<Result<Allocations, String>>| {
                    let changed = match (latest.as_ref(), &now) {
                        (Some(Ok(before)), Ok(after)) => before.pods != after.pods,
                        (Some(Err(before)), Err(after)) => before != after,
                        _ => true,
                    };
                    *latest = Some(now);
                    changed
                });
            if changed {
                tracing::debug!("allocations changed");
                wake.notify_one();
            }
            tokio::time::sleep(every).await;
        }
    });
    rx
}

/// Pokes `wake` whenever `health` changes, so a fault or a recovery is published at once
/// rather than at the next re-check.
pub fn wake_on_health(mut health: watch::Receiver<NodeHealth>, wake: Arc<Notify>) {
    tokio::spawn(async move {
        while health.changed().await.is_ok() {
            wake.notify_one();
        }
    });
}
