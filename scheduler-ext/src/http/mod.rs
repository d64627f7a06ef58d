//! The HTTP face of the service: [`router`] mounts the protocols' routes beside `/ui`
//! ([`ui`]) and `/healthz`, [`metrics`] counts and times every request and serves `/metrics`,
//! and [`tls`] serves the whole over plain HTTP or HTTPS until shutdown.

pub mod metrics;
pub mod router;
pub mod tls;
pub mod ui;
