//! Publishing a node's objects to the API server, and keeping them true.
//!
//! [`objects`] builds what the node should look like; [`Publisher`] writes it with
//! server-side apply (field manager [`FIELD_MANAGER`]) only when it differs from what was last
//! applied or from the live object, which it watches (so a deleted object is re-created and a
//! field someone overwrote is restored, with no reads in steady state); [`run`] is the loop:
//! re-check every interval or at once when poked, back off exponentially while the API server
//! fails, recover by itself. [`metrics`] serves `/metrics` and `/healthz`.

pub mod metrics;
pub mod objects;
mod publisher;
pub mod state;

pub use publisher::{Desired, FIELD_MANAGER, Publisher, run};
