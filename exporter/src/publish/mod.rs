//! Publishing a node's objects to the API server, and keeping them true.
//!
//! Each round [`collect`] reads the node (discovery, health, DCMI's answers, the kubelet: all
//! the I/O) into one snapshot, [`desired`] turns it into the objects (a pure function of the
//! snapshot and the [`settings::PublishOptions`]; [`objects`] renders fumarole's own,
//! [`compat`] and [`ascend`] other projects' formats: GFD's labels; Huawei's device-info
//! ConfigMap and Ascend labels, [`slices`] the ResourceSlices), and [`Publisher`] writes them
//! with server-side apply (field manager [`FIELD_MANAGER`]) only when they differ from what was
//! last applied or from the live object, which it watches (so a deleted object is re-created
//! and a field someone overwrote is restored, with no reads in steady state). [`run`] is the
//! loop: re-check every interval or at once when poked, back off exponentially while the API
//! server fails, recover by itself; [`watch_allocations`] pokes it when a pod gets or frees
//! exclusive CPUs or devices, [`wake_on_change`] when another input (a device's or link's
//! health, a DCMI answer) changes. [`settings`] holds the flags and options, [`metrics`]
//! serves `/metrics` and `/healthz`.

pub mod ascend;
pub mod collect;
pub mod compat;
pub mod desired;
pub mod metrics;
pub mod objects;
mod publisher;
pub mod settings;
pub mod slices;

pub use collect::{NodeCollector, Sources};
pub use desired::{Desired, NodeSnapshot, desired};
pub use publisher::{FIELD_MANAGER, Publisher, run};
pub use settings::{DraSlices, PublishArgs, PublishOptions, PublishSettings};

use std::sync::Arc;
use std::time::Duration;

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

/// Pokes `wake` whenever `input` changes, until its sender is gone: a fault or a recovery on
/// the health stream, or a late DCMI answer, is published at once rather than at the next
/// re-check.
pub fn wake_on_change<T: Send + Sync + 'static>(mut input: watch::Receiver<T>, wake: Arc<Notify>) {
    tokio::spawn(async move {
        while input.changed().await.is_ok() {
            wake.notify_one();
        }
    });
}
