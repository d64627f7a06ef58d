//! [`FaultProxy`]: an HTTP front for the real API server that injects the faults clients meet
//! in big clusters, so a test can watch how the agents and the extension behave through them.
//!
//! Clients talk plain HTTP to the proxy (a kubeconfig from [`FaultProxy::kubeconfig`]); the
//! proxy forwards each request, with the client's impersonation headers, through the cluster's
//! admin client (TLS, token), so the API server sees the same identity as without it. The
//! fault in force ([`Fault`]) is set at any time; setting one also cuts every open watch, so
//! watches meet it when they come back. Every request is recorded ([`Record`]): who sent it,
//! when, what, and what it got.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use anyhow::Result;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::{Body as HttpBody, Frame};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use kube::Client;
use serde_json::json;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// What the proxy does to the requests it gets.
#[derive(Clone, Debug, PartialEq)]
pub enum Fault {
    /// Forward everything.
    None,
    /// `429 Too Many Requests` with `Retry-After` (and `retryAfterSeconds` in the Status), as
    /// the API server's priority and fairness answers when a client's level is full.
    TooManyRequests { retry_after_s: u32 },
    /// This status (500, 503, ...) for every request.
    ServerError(u16),
    /// `409 Conflict` for every write; reads pass.
    Conflict,
    /// Every request waits this long before it is forwarded.
    Latency(Duration),
    /// Every watch ends at once with `410 Gone` (`Expired`: the resource version was
    /// compacted away in etcd); lists and writes pass.
    Gone,
    /// Every connection is closed without an answer.
    Reset,
    /// An API server coming back after etcd compacted its history: every watch ends at once
    /// with `410 Gone`, so the watchers must list again, and every other request is answered
    /// with this status (503) while it holds.
    Outage(u16),
    /// A network cut that lets requests through but no answers: every write is forwarded (it
    /// takes effect) and its connection closed instead of the answer; every read is closed
    /// unanswered, so watches see nothing until the fault ends.
    AnswerLost,
}

/// One request seen by the proxy.
#[derive(Clone, Debug)]
pub struct Record {
    /// Since the proxy started.
    pub at: Duration,
    /// The impersonated user, else the user agent.
    pub client: String,
    pub method: String,
    pub path: String,
    pub watch: bool,
    /// A GET of a collection with `limit`, as kube's watcher lists.
    pub list: bool,
    /// The status answered; 0 when the connection was closed instead.
    pub status: u16,
}

impl Record {
    pub fn is_write(&self) -> bool {
        matches!(self.method.as_str(), "POST" | "PUT" | "PATCH" | "DELETE")
    }
}

struct Shared {
    upstream: Client,
    fault: Mutex<Fault>,
    /// Bumped to cut every open watch.
    cut: watch::Sender<u64>,
    records: Mutex<Vec<Record>>,
    started: Instant,
}

/// The proxy and its accept loop (stopped on drop).
pub struct FaultProxy {
    port: u16,
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

impl FaultProxy {
    /// Serves on a free loopback port, forwarding through `upstream` (the admin client).
    pub async fn start(upstream: Client) -> Result<FaultProxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let shared = Arc::new(Shared {
            upstream,
            fault: Mutex::new(Fault::None),
            cut: watch::Sender::new(0),
            records: Mutex::new(Vec::new()),
            started: Instant::now(),
        });
        let accept = Arc::clone(&shared);
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let shared = Arc::clone(&accept);
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        let shared = Arc::clone(&shared);
                        async move { handle(&shared, req).await }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(FaultProxy { port, shared, task })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `http://127.0.0.1:<port>`
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Puts `fault` in force and cuts every open watch.
    pub fn set(&self, fault: Fault) {
        if let Ok(mut f) = self.shared.fault.lock() {
            *f = fault;
        }
        self.shared.cut.send_modify(|n| *n += 1);
    }

    /// Time since the proxy started (the clock of [`Record::at`]).
    pub fn now(&self) -> Duration {
        self.shared.started.elapsed()
    }

    /// Every request so far.
    pub fn records(&self) -> Vec<Record> {
        self.shared
            .records
            .lock()
            .map(|r| r.clone())
            .unwrap_or_default()
    }

    /// A kubeconfig (JSON, which is YAML) for a client acting as `user` in `groups` through
    /// the proxy; the proxy authenticates it upstream.
    pub fn kubeconfig(&self, user: &str, groups: &[&str]) -> String {
        json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "proxy", "cluster": {"server": self.url()}}],
            "users": [{"name": "proxy", "user": {"as": user, "as-groups": groups}}],
            "contexts": [{"name": "proxy", "context": {"cluster": "proxy", "user": "proxy"}}],
            "current-context": "proxy",
        })
        .to_string()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

type Answer = Response<ProxyBody>;

async fn handle(shared: &Shared, req: Request<Incoming>) -> Result<Answer, std::io::Error> {
    // Subscribed before the fault is read: a fault set while this request is on its way to
    // the API server still cuts the watch it opens.
    let cut = shared.cut.subscribe();
    let fault = shared
        .fault
        .lock()
        .map(|f| f.clone())
        .unwrap_or(Fault::None);
    let method = req.method().to_string();
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or_default();
    let watch = query
        .split('&')
        .any(|kv| kv == "watch=true" || kv == "watch=1");
    let list = method == "GET" && !watch && query.split('&').any(|kv| kv.starts_with("limit="));
    let write = matches!(method.as_str(), "POST" | "PUT" | "PATCH" | "DELETE");
    let headers = req.headers();
    let client = headers
        .get("impersonate-user")
        .or_else(|| headers.get(http::header::USER_AGENT))
        .and_then(|v| v.to_str().ok())
        .unwrap_or("?")
        .to_string();
    let mut record = Record {
        at: shared.started.elapsed(),
        client,
        method,
        path,
        watch,
        list,
        status: 0,
    };
    let answer = match fault {
        Fault::Reset => None,
        Fault::AnswerLost => {
            if write {
                drop(forward(shared, req, None).await);
            }
            None
        }
        Fault::TooManyRequests { retry_after_s } => {
            let mut r = status(429, "TooManyRequests", "too many requests, try again later");
            if let Ok(v) = http::HeaderValue::from_str(&retry_after_s.to_string()) {
                r.headers_mut().insert(http::header::RETRY_AFTER, v);
            }
            *r.body_mut() = ProxyBody::full(
                json!({"apiVersion": "v1", "kind": "Status", "status": "Failure",
                    "message": "too many requests, try again later", "reason": "TooManyRequests",
                    "code": 429, "details": {"retryAfterSeconds": retry_after_s}})
                .to_string(),
            );
            Some(r)
        }
        Fault::ServerError(code) => Some(status(code, "InternalError", "injected server error")),
        Fault::Outage(_) if watch => Some(gone()),
        Fault::Outage(code) => Some(status(code, "InternalError", "injected server error")),
        Fault::Conflict if write => Some(status(
            409,
            "Conflict",
            "the object has been modified; please apply your changes to the latest version",
        )),
        Fault::Gone if watch => Some(gone()),
        Fault::Latency(wait) => {
            tokio::time::sleep(wait).await;
            Some(forward(shared, req, watch.then_some(cut)).await)
        }
        Fault::None | Fault::Conflict | Fault::Gone => {
            Some(forward(shared, req, watch.then_some(cut)).await)
        }
    };
    record.status = answer.as_ref().map_or(0, |r| r.status().as_u16());
    if let Ok(mut records) = shared.records.lock() {
        records.push(record);
    }
    answer.ok_or_else(|| std::io::Error::other("injected connection reset"))
}

/// A watch that ends at once with `410 Gone` (`Expired`), as after an etcd compaction.
fn gone() -> Answer {
    let event = json!({"type": "ERROR", "object": {"apiVersion": "v1", "kind": "Status",
        "status": "Failure", "message": "too old resource version", "reason": "Expired",
        "code": 410}});
    let mut r = Response::new(ProxyBody::full(format!("{event}\n")));
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    r
}

/// A Status answer.
fn status(code: u16, reason: &str, message: &str) -> Answer {
    let mut r = Response::new(ProxyBody::full(
        json!({"apiVersion": "v1", "kind": "Status", "status": "Failure", "message": message,
            "reason": reason, "code": code})
        .to_string(),
    ));
    *r.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    r
}

/// Sends the request on through the admin client, keeping the client's impersonation; a
/// change of `cut` (watches only) ends the answer's body.
async fn forward(
    shared: &Shared,
    req: Request<Incoming>,
    cut: Option<watch::Receiver<u64>>,
) -> Answer {
    let (parts, body) = req.into_parts();
    let body = match body.collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return status(400, "BadRequest", &format!("reading the request: {e}")),
    };
    let uri = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    let mut up = Request::builder().method(parts.method).uri(uri);
    for (name, value) in &parts.headers {
        let keep = name.as_str().starts_with("impersonate-")
            || name == http::header::CONTENT_TYPE
            || name == http::header::ACCEPT
            || name == http::header::USER_AGENT;
        if keep {
            up = up.header(name, value);
        }
    }
    let Ok(up) = up.body(kube::client::Body::from(body.to_vec())) else {
        return status(400, "BadRequest", "could not rebuild the request");
    };
    match shared.upstream.send(up).await {
        Ok(resp) => {
            let (parts, body) = resp.into_parts();
            Response::from_parts(parts, ProxyBody::upstream(body, cut))
        }
        Err(e) => status(503, "ServiceUnavailable", &format!("upstream: {e}")),
    }
}

/// A response body: a whole one, or the API server's, which a cut ends with an error (the
/// client sees its watch stream break).
pub struct ProxyBody {
    inner: Inner,
    cut: Option<Pin<Box<dyn Future<Output = ()> + Send + Sync>>>,
}

enum Inner {
    Full(Option<Bytes>),
    Upstream(Pin<Box<kube::client::Body>>),
}

impl ProxyBody {
    fn full(text: String) -> Self {
        ProxyBody {
            inner: Inner::Full(Some(Bytes::from(text))),
            cut: None,
        }
    }

    fn upstream(body: kube::client::Body, cut: Option<watch::Receiver<u64>>) -> Self {
        ProxyBody {
            inner: Inner::Upstream(Box::pin(body)),
            cut: cut.map(|mut rx| {
                Box::pin(async move {
                    let _ = rx.changed().await;
                }) as Pin<Box<dyn Future<Output = ()> + Send + Sync>>
            }),
        }
    }
}

impl HttpBody for ProxyBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        if let Some(cut) = this.cut.as_mut()
            && cut.as_mut().poll(cx).is_ready()
        {
            this.cut = None;
            this.inner = Inner::Full(None);
            return Poll::Ready(Some(Err("watch cut by the fault proxy".into())));
        }
        match &mut this.inner {
            Inner::Full(data) => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            Inner::Upstream(body) => body.as_mut().poll_frame(cx).map_err(Into::into),
        }
    }
}

/// Most requests from one client in any one-second window of `records`.
pub fn peak_per_second<'a>(records: impl IntoIterator<Item = &'a Record>) -> usize {
    let mut times: Vec<Duration> = records.into_iter().map(|r| r.at).collect();
    times.sort();
    let mut peak = 0;
    let mut from = 0;
    for (i, t) in times.iter().enumerate() {
        while times
            .get(from)
            .is_some_and(|f| *t - *f >= Duration::from_secs(1))
        {
            from += 1;
        }
        peak = peak.max(i + 1 - from);
    }
    peak
}
