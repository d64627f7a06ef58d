//! The HTTP face of the service: [`router`] mounts the protocols' routes (each guarded by
//! [`access`]) and, on a listener of its own, `/ui` ([`ui`]); [`metrics`] counts and times
//! every request and serves `/metrics`; [`server`] serves a router over plain HTTP or HTTPS
//! (reloadable certificates, client certificates, connection limits) until shutdown.

pub mod access;
pub mod metrics;
pub mod router;
pub use fumarole_http_serve as server;
pub mod ui;
