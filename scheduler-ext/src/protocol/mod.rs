//! The wire protocols, one module each: [`kube_scheduler`] (the extender API), [`volcano`]
//! (Volcano's `extender` plugin) and [`admission`] (the API server's webhook that keeps
//! agents to their own node). Each holds its wire types, its verbs as functions over
//! [`crate::service::Service`] (decisions from its [`crate::decider::Decider`], writes through
//! [`crate::effects`]), and the HTTP routes that parse a body, call a verb and answer;
//! [`crate::http::router`] mounts them side by side. [`scale`] turns the core's 0..1 scores
//! into each scheduler's numbers.

pub mod admission;
mod json_out;
pub mod kube_scheduler;
pub mod scale;
pub mod volcano;

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

/// `200` with `value` as JSON.
fn json_response<T: Serialize>(value: &T) -> Response {
    match serde_json::to_string(value) {
        Ok(body) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            body,
        )
            .into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// `200` with `body`, JSON written by hand ([`json_out`]).
fn json_bytes_response(body: Vec<u8>) -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response()
}

/// `400` with the reason, logged at warning.
fn bad_request(protocol: &str, e: &dyn std::fmt::Display) -> Response {
    tracing::warn!(error = %e, protocol, "bad extender request");
    (StatusCode::BAD_REQUEST, format!("{e}\n")).into_response()
}
