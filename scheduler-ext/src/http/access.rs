//! Who may call the scheduler verbs: only the schedulers.
//!
//! - **kube-scheduler** authenticates with a client certificate (its extender
//!   `tlsConfig.certFile` / `keyFile`) signed by the CA given with `--client-ca-file`; the TLS
//!   layer verifies it ([`crate::http::server`]) and [`Rule::client_cert`] requires it.
//! - **Volcano**'s extender plugin (v1.10 to v1.13) sends plain `net/http` requests and cannot
//!   present a certificate, but Go's HTTP client sends the user info of its URL as Basic
//!   credentials: with `--volcano-token-file`, `extender.urlPrefix:
//!   https://fumarole:<token>@<service>/volcano` authenticates it ([`Rule::token`]). A client
//!   that can set headers may send `Authorization: Bearer <token>` instead; a verified client
//!   certificate is accepted too.
//!
//! A rule with neither requirement lets every request through (a development setup; `serve`
//! warns at start). Refusals are `401` with the reason and are counted like every answer.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;

use crate::http::server::Peer;

/// The user name the Volcano token is sent under in Basic credentials.
pub const TOKEN_USER: &str = "fumarole";

/// What one protocol's routes require of a caller.
#[derive(Clone, Debug, Default)]
pub struct Rule {
    /// A verified client certificate is enough (and, without a token, required).
    pub client_cert: bool,
    /// The shared token, as Basic credentials of user [`TOKEN_USER`] or a Bearer token.
    pub token: Option<Token>,
}

/// A shared secret and the `Authorization` values that carry it.
#[derive(Clone)]
pub struct Token {
    basic: Arc<[u8]>,
    bearer: Arc<[u8]>,
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

impl Token {
    /// The token `secret` (surrounding whitespace is not part of it).
    pub fn new(secret: &str) -> Self {
        let secret = secret.trim();
        let basic = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{TOKEN_USER}:{secret}"))
        );
        Token {
            basic: basic.into_bytes().into(),
            bearer: format!("Bearer {secret}").into_bytes().into(),
        }
    }

    fn matches(&self, value: &[u8]) -> bool {
        // Constant time in the value's content, so the token cannot be guessed byte by byte.
        constant_eq(value, &self.basic) | constant_eq(value, &self.bearer)
    }
}

fn constant_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Rule {
    /// True when the rule lets anyone through.
    pub fn is_open(&self) -> bool {
        !self.client_cert && self.token.is_none()
    }

    /// `None` when `req` may pass; else why not.
    fn refuse(&self, req: &Request) -> Option<&'static str> {
        if self.is_open() {
            return None;
        }
        let verified = req
            .extensions()
            .get::<Peer>()
            .is_some_and(|p| p.client.is_some());
        if self.client_cert && verified {
            return None;
        }
        if let Some(token) = &self.token
            && let Some(value) = req.headers().get(header::AUTHORIZATION)
            && token.matches(value.as_bytes())
        {
            return None;
        }
        Some(match (self.client_cert, self.token.is_some()) {
            (true, false) => "a client certificate signed by the configured CA is required",
            (false, true) => "the extender token is required",
            _ => {
                "a client certificate signed by the configured CA or the extender token is required"
            }
        })
    }
}

/// Middleware: lets the request through when `rule` allows it, else answers `401`.
pub async fn require(State(rule): State<Rule>, req: Request, next: Next) -> Response {
    match rule.refuse(&req) {
        None => next.run(req).await,
        Some(reason) => {
            let who = req.extensions().get::<Peer>().map(|p| p.addr);
            tracing::warn!(path = %req.uri().path(), peer = ?who, reason, "refused an unauthenticated request");
            (
                StatusCode::UNAUTHORIZED,
                format!("unauthorized: {reason}\n"),
            )
                .into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    fn request(auth: Option<&str>, client: Option<&str>) -> Request {
        let mut req = Request::new(axum::body::Body::empty());
        if let Some(a) = auth {
            req.headers_mut()
                .insert(header::AUTHORIZATION, a.parse().unwrap());
        }
        req.extensions_mut().insert(Peer {
            addr: "127.0.0.1:1".parse().unwrap(),
            client: client.map(str::to_string),
        });
        req
    }

    #[test]
    fn tokens_and_certificates() {
        let token = Rule {
            client_cert: true,
            token: Some(Token::new(" s3cret\n")),
        };
        // What Go's client sends for https://fumarole:s3cret@host/volcano.
        let basic = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode("fumarole:s3cret")
        );
        assert!(token.refuse(&request(Some(&basic), None)).is_none());
        assert!(
            token
                .refuse(&request(Some("Bearer s3cret"), None))
                .is_none()
        );
        assert!(
            token
                .refuse(&request(None, Some("CN=kube-scheduler")))
                .is_none()
        );
        assert!(token.refuse(&request(Some("Bearer s3cre"), None)).is_some());
        assert!(
            token
                .refuse(&request(Some("Bearer s3cret!"), None))
                .is_some()
        );
        assert!(token.refuse(&request(None, None)).is_some());
        let other_user = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode("admin:s3cret")
        );
        assert!(token.refuse(&request(Some(&other_user), None)).is_some());

        let cert_only = Rule {
            client_cert: true,
            token: None,
        };
        assert!(
            cert_only
                .refuse(&request(Some("Bearer s3cret"), None))
                .is_some()
        );
        assert!(Rule::default().refuse(&request(None, None)).is_none());
        assert_eq!(format!("{:?}", Token::new("x")), "Token(<redacted>)");
    }
}
