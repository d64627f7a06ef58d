#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The extender routes served for real (`server::serve` on a TCP port): request metrics at
//! `/metrics`, and HTTPS with a self-signed certificate.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::{CertificateDer, ServerName};
use scheduler_ext::core::score::gpu_aware::GpuAware;
use scheduler_ext::http::metrics::{self, Metrics};
use scheduler_ext::http::router::router;
use scheduler_ext::http::tls::{TlsFiles, serve};
use scheduler_ext::service::Service;
use scheduler_ext::snapshot;
use serde_json::json;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_rustls::TlsConnector;

fn app(m: &Arc<Metrics>) -> axum::Router {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/snapshots/two-dgx");
    let view = snapshot::load(&dir).unwrap();
    let app = router(Arc::new(Service::new(view, GpuAware::default())));
    metrics::instrument(app, Arc::clone(m))
}

/// A running server: its address, the shutdown trigger and the task returning `serve`'s result.
struct Running {
    addr: SocketAddr,
    stop: oneshot::Sender<()>,
    task: JoinHandle<anyhow::Result<()>>,
}

impl Running {
    async fn start(app: axum::Router, tls: Option<TlsFiles>) -> Running {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let shutdown = async move {
            let _ = stopped.await;
        };
        let task = tokio::spawn(serve(listener, app, tls, shutdown));
        Running { addr, stop, task }
    }

    /// Triggers shutdown and waits for `serve` to return.
    async fn stop(self) {
        self.stop.send(()).unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(10), self.task)
            .await
            .expect("serve returns after shutdown")
            .unwrap()
            .unwrap();
    }
}

/// One HTTP/1.1 exchange on `stream` (`connection: close`): status code and body.
async fn exchange(
    mut stream: impl AsyncRead + AsyncWrite + Unpin,
    method: &str,
    path: &str,
    body: &str,
) -> (u16, String) {
    let req = format!(
        "{method} {path} HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(req.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    stream.read_to_end(&mut buf).await.unwrap();
    let text = String::from_utf8(buf).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let code = head.split(' ').nth(1).unwrap().parse().unwrap();
    (code, body.to_owned())
}

async fn http(addr: SocketAddr, method: &str, path: &str, body: &str) -> (u16, String) {
    exchange(TcpStream::connect(addr).await.unwrap(), method, path, body).await
}

fn pod(gpus: &str) -> serde_json::Value {
    json!({
        "metadata": {"name": "train-0", "namespace": "training", "uid": "u1"},
        "spec": {"containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": gpus}}}]}
    })
}

fn metric_lines<'a>(text: &'a str, name: &str) -> Vec<&'a str> {
    let mut lines: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .collect();
    lines.sort_unstable();
    lines
}

#[tokio::test]
async fn counts_requests_per_protocol_verb_and_code() {
    let m = Arc::new(Metrics::new());
    let server = Running::start(app(&m), None).await;
    let addr = server.addr;

    let filter = json!({"Pod": pod("4"), "NodeNames": ["dgx-a", "pcie-a"]}).to_string();
    for _ in 0..2 {
        let (code, body) = http(addr, "POST", "/kube-scheduler/filter", &filter).await;
        assert_eq!(code, 200, "{body}");
    }
    let (code, _) = http(addr, "POST", "/kube-scheduler/filter", "not json").await;
    assert_eq!(code, 400);
    let task = json!({"Pod": pod("4")});
    let predicate = json!({"task": task, "node": {"Name": "dgx-a"}}).to_string();
    let (code, body) = http(addr, "POST", "/volcano/predicate", &predicate).await;
    assert_eq!(code, 200, "{body}");
    let (code, _) = http(addr, "GET", "/no/such/route", "").await;
    assert_eq!(code, 404);
    let (code, _) = http(addr, "GET", "/volcano/no-such-verb", "").await;
    assert_eq!(code, 404);
    let (code, body) = http(addr, "GET", "/healthz", "").await;
    assert_eq!((code, body.trim()), (200, "ok"));
    http(addr, "GET", "/metrics", "").await;

    let (code, text) = http(addr, "GET", "/metrics", "").await;
    assert_eq!(code, 200);
    assert_eq!(
        metric_lines(&text, "fumarole_scheduler_ext_requests_total"),
        [
            r#"fumarole_scheduler_ext_requests_total{protocol="kube-scheduler",verb="filter",code="200"} 2"#,
            r#"fumarole_scheduler_ext_requests_total{protocol="kube-scheduler",verb="filter",code="400"} 1"#,
            r#"fumarole_scheduler_ext_requests_total{protocol="other",verb="unmatched",code="404"} 2"#,
            r#"fumarole_scheduler_ext_requests_total{protocol="volcano",verb="predicate",code="200"} 1"#,
        ],
        "{text}"
    );
    assert_eq!(
        metric_lines(
            &text,
            "fumarole_scheduler_ext_request_duration_seconds_count"
        ),
        [
            r#"fumarole_scheduler_ext_request_duration_seconds_count{protocol="kube-scheduler",verb="filter"} 3"#,
            r#"fumarole_scheduler_ext_request_duration_seconds_count{protocol="other",verb="unmatched"} 2"#,
            r#"fumarole_scheduler_ext_request_duration_seconds_count{protocol="volcano",verb="predicate"} 1"#,
        ],
        "{text}"
    );
    assert!(
        text.contains(r#"fumarole_scheduler_ext_request_duration_seconds_bucket{le="+Inf",protocol="kube-scheduler",verb="filter"} 3"#),
        "{text}"
    );
    assert!(!text.contains("verb=\"metrics\"") && !text.contains("verb=\"healthz\""));
    assert!(text.ends_with("# EOF\n"), "{text}");

    // The content type, read from the raw response head.
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut raw = String::new();
    tcp.read_to_string(&mut raw).await.unwrap();
    assert!(
        raw.contains("content-type: application/openmetrics-text; version=1.0.0; charset=utf-8"),
        "{raw}"
    );

    server.stop().await;
}

/// A self-signed certificate for `localhost` and 127.0.0.1, written as PEM files into `dir`,
/// and the certificate for the client to trust.
fn self_signed(dir: &Path) -> (TlsFiles, CertificateDer<'static>) {
    let ck =
        rcgen::generate_simple_self_signed(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
            .unwrap();
    let files = TlsFiles {
        cert: dir.join("cert.pem"),
        key: dir.join("key.pem"),
    };
    std::fs::write(&files.cert, ck.cert.pem()).unwrap();
    std::fs::write(&files.key, ck.signing_key.serialize_pem()).unwrap();
    (files, ck.cert.der().clone())
}

fn connector(cert: CertificateDer<'static>) -> TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert).unwrap();
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    TlsConnector::from(Arc::new(config))
}

async fn https(tls: &TlsConnector, addr: SocketAddr, method: &str, path: &str) -> (u16, String) {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let stream = tls
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap();
    exchange(stream, method, path, "").await
}

#[tokio::test]
async fn serves_https_and_survives_bad_clients() {
    let dir = tempfile::tempdir().unwrap();
    let (files, cert) = self_signed(dir.path());
    let m = Arc::new(Metrics::new());
    let server = Running::start(app(&m), Some(files)).await;
    let tls = connector(cert);

    let (code, body) = https(&tls, server.addr, "GET", "/healthz").await;
    assert_eq!((code, body.trim()), (200, "ok"));

    // A client that connects and never starts the handshake holds up no one.
    let idle = TcpStream::connect(server.addr).await.unwrap();

    // Plain HTTP on the TLS port: the handshake fails, the client gets a TLS alert (or a reset),
    // no HTTP answer.
    let mut plain = TcpStream::connect(server.addr).await.unwrap();
    plain
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut buf = Vec::new();
    let read = plain.read_to_end(&mut buf).await;
    assert!(
        read.is_err() || !buf.starts_with(b"HTTP/"),
        "{read:?} {:?}",
        String::from_utf8_lossy(&buf)
    );

    // A client that does not trust the certificate fails its handshake.
    let stranger = connector(
        rcgen::generate_simple_self_signed(vec!["localhost".to_owned()])
            .unwrap()
            .cert
            .der()
            .clone(),
    );
    let tcp = TcpStream::connect(server.addr).await.unwrap();
    assert!(
        stranger
            .connect(ServerName::try_from("localhost").unwrap(), tcp)
            .await
            .is_err()
    );

    // The server still answers, and the routes are counted over TLS too.
    let (code, _) = https(&tls, server.addr, "POST", "/kube-scheduler/filter").await;
    assert_eq!(code, 400);
    let (code, text) = https(&tls, server.addr, "GET", "/metrics").await;
    assert_eq!(code, 200);
    assert!(
        text.contains(r#"fumarole_scheduler_ext_requests_total{protocol="kube-scheduler",verb="filter",code="400"} 1"#),
        "{text}"
    );

    drop(idle);
    server.stop().await;
}

async fn serve_error(tls: TlsFiles) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let app = axum::Router::new();
    let err = serve(listener, app, Some(tls), std::future::pending())
        .await
        .unwrap_err();
    format!("{err:#}")
}

#[tokio::test]
async fn unusable_cert_or_key_is_an_error_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let (files, _) = self_signed(dir.path());

    let missing = dir.path().join("missing-key.pem");
    let err = serve_error(TlsFiles {
        cert: files.cert.clone(),
        key: missing.clone(),
    })
    .await;
    assert!(
        err.starts_with(&format!("reading {}: ", missing.display())),
        "{err}"
    );

    // The certificate file holds no key.
    let err = serve_error(TlsFiles {
        cert: files.cert.clone(),
        key: files.cert.clone(),
    })
    .await;
    assert_eq!(
        err,
        format!("{}: no private key found", files.cert.display())
    );

    // The key file holds no certificate.
    let err = serve_error(TlsFiles {
        cert: files.key.clone(),
        key: files.key.clone(),
    })
    .await;
    assert_eq!(
        err,
        format!("{}: no certificate found", files.key.display())
    );
}
