//! Publishing a node's objects to the API server, and keeping them true.
//!
//! [`objects`] builds what the node should look like; [`Publisher`] writes it with
//! server-side apply (field manager [`FIELD_MANAGER`]) only when it differs from what was last
//! applied or from the live object, which it watches (so a deleted object is re-created and a
//! field someone overwrote is restored, with no reads in steady state); [`run`] is the loop:
//! re-check every interval or at once when poked, back off exponentially while the API server
//! fails, recover by itself; [`watch_allocations`] pokes it when a pod gets or frees
//! exclusive CPUs or devices. [`metrics`] serves `/metrics` and `/healthz`.

pub mod metrics;
pub mod objects;
mod publisher;
pub mod state;

pub use publisher::{Desired, FIELD_MANAGER, Publisher, run};

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use crate::kubelet::{KubeletPaths, read_allocations};

/// Pokes `wake` as soon as the kubelet's allocations change (checked every `every`; reading
/// them is a local call of well under a millisecond), so a new or finished pod is published
/// without waiting for the re-check interval. Never returns.
pub async fn watch_allocations(kubelet: KubeletPaths, every: Duration, wake: Arc<Notify>) {
    let mut last = None;
    loop {
        let now = read_allocations(&kubelet).await.ok().map(|a| a.pods);
        if last.is_some() && now.is_some() && now != last {
            tracing::debug!("allocations changed");
            wake.notify_one();
        }
        if now.is_some() {
            last = now;
        }
        tokio::time::sleep(every).await;
    }
}
