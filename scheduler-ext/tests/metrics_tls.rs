#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The extender routes served for real (`server::serve` on a TCP port): request metrics at
//! `/metrics`; HTTPS with a self-signed certificate, reloaded when its files change; client
//! certificates and tokens as the access rules require them; connection limits.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::{CertificateDer, ServerName};
use scheduler_ext::core::score::Scoring;
use scheduler_ext::http::metrics::{self, Metrics};
use scheduler_ext::http::router::router;
use scheduler_ext::http::server::{Limits, Tls, TlsFiles, serve};
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
    let app = router(Arc::new(Service::new(view, Scoring::default())));
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
        Self::start_with(app, tls.map(|f| Tls::load(f).unwrap()), Limits::default()).await
    }

    async fn start_with(app: axum::Router, tls: Option<Arc<Tls>>, limits: Limits) -> Running {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let shutdown = async move {
            let _ = stopped.await;
        };
        let task = tokio::spawn(serve(listener, app, tls, limits, shutdown));
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
        client_ca: None,
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
    format!("{:#}", Tls::load(tls).unwrap_err())
}

#[tokio::test]
async fn unusable_cert_or_key_is_an_error_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let (files, _) = self_signed(dir.path());

    let missing = dir.path().join("missing-key.pem");
    let err = serve_error(TlsFiles {
        cert: files.cert.clone(),
        key: missing.clone(),
        client_ca: None,
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
        client_ca: None,
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
        client_ca: None,
    })
    .await;
    assert_eq!(
        err,
        format!("{}: no certificate found", files.key.display())
    );
}

/// A test CA and certificates it signs (server for `localhost`, clients by common name).
struct Ca {
    issuer: rcgen::CertifiedIssuer<'static, rcgen::KeyPair>,
}

impl Ca {
    fn new(name: &str) -> Ca {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        let issuer =
            rcgen::CertifiedIssuer::self_signed(params, rcgen::KeyPair::generate().unwrap())
                .unwrap();
        Ca { issuer }
    }

    /// A leaf certificate and key (PEM) for `names` (SANs) and common name `cn`.
    fn leaf(&self, cn: &str, names: &[&str]) -> (String, String, CertificateDer<'static>) {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params =
            rcgen::CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), key.serialize_pem(), cert.der().clone())
    }

    fn pem(&self) -> String {
        self.issuer.pem()
    }
}

/// A client that trusts `ca` and presents `identity` (certificate and key PEM) when given.
fn client(ca: &Ca, identity: Option<(&str, &str)>) -> TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.issuer.der().clone()).unwrap();
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots);
    let config = match identity {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            use rustls::pki_types::PrivateKeyDer;
            use rustls::pki_types::pem::PemObject;
            let certs: Vec<CertificateDer<'static>> =
                CertificateDer::pem_slice_iter(cert.as_bytes())
                    .collect::<Result<_, _>>()
                    .unwrap();
            let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap();
            builder.with_client_auth_cert(certs, key).unwrap()
        }
    };
    TlsConnector::from(Arc::new(config))
}

/// `POST path` with `auth` as the Authorization header, over `tls`: the status, or `None`
/// when the handshake fails.
async fn call(tls: &TlsConnector, addr: SocketAddr, path: &str, auth: Option<&str>) -> Option<u16> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let mut stream = tls
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .ok()?;
    let auth = auth.map_or_else(String::new, |a| format!("authorization: {a}\r\n"));
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: 2\r\n{auth}connection: close\r\n\r\n{{}}"
    );
    stream.write_all(head.as_bytes()).await.ok()?;
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await.ok()?;
    raw.split(' ').nth(1)?.parse().ok()
}

/// kube-scheduler's verbs need a client certificate from the configured CA; Volcano's accept
/// one too, or the token as Bearer or as the Basic credentials Go's client sends for
/// `https://fumarole:<token>@host`; a certificate from another CA fails the handshake.
#[tokio::test]
async fn verbs_need_a_client_certificate_or_the_token() {
    use scheduler_ext::http::access::{Rule, Token};
    use scheduler_ext::http::router::{Options, router_with};

    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA");
    let (server_cert, server_key, _) = ca.leaf("fumarole-scheduler-ext", &["localhost"]);
    let files = TlsFiles {
        cert: dir.path().join("tls.crt"),
        key: dir.path().join("tls.key"),
        client_ca: Some(dir.path().join("ca.crt")),
    };
    std::fs::write(&files.cert, &server_cert).unwrap();
    std::fs::write(&files.key, &server_key).unwrap();
    std::fs::write(files.client_ca.as_ref().unwrap(), ca.pem()).unwrap();
    let view =
        snapshot::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/snapshots/two-dgx"))
            .unwrap();
    let svc = Arc::new(Service::new(view, Scoring::default()));
    let options = Options {
        kube: Rule {
            client_cert: true,
            token: None,
        },
        volcano: Rule {
            client_cert: true,
            token: Some(Token::new("s3cret")),
        },
        ..Options::default()
    };
    let server = Running::start(router_with(svc, &options), Some(files)).await;

    let (cert, key, _) = ca.leaf("kube-scheduler", &[]);
    let scheduler = client(&ca, Some((&cert, &key)));
    let anonymous = client(&ca, None);
    let other_ca = Ca::new("someone else");
    let (cert, key, _) = other_ca.leaf("kube-scheduler", &[]);
    let impostor = client(&ca, Some((&cert, &key)));
    let filter = "/kube-scheduler/filter";
    let predicate = "/volcano/predicate";

    // With the certificate the verb runs (400: `{}` is not ExtenderArgs); without it, 401.
    assert_eq!(call(&scheduler, server.addr, filter, None).await, Some(400));
    assert_eq!(call(&anonymous, server.addr, filter, None).await, Some(401));
    assert_eq!(
        call(&anonymous, server.addr, filter, Some("Bearer s3cret")).await,
        Some(401),
        "the Volcano token does not open kube-scheduler's verbs"
    );
    assert_eq!(call(&impostor, server.addr, filter, None).await, None);
    // Volcano: the token either way, or the certificate.
    let basic = format!(
        "Basic {}",
        base64::Engine::encode(
            &base64::engine::general_purpose::STANDARD,
            "fumarole:s3cret"
        )
    );
    for auth in [Some("Bearer s3cret"), Some(basic.as_str())] {
        assert_eq!(
            call(&anonymous, server.addr, predicate, auth).await,
            Some(200)
        );
    }
    assert_eq!(
        call(&scheduler, server.addr, predicate, None).await,
        Some(200)
    );
    assert_eq!(
        call(&anonymous, server.addr, predicate, None).await,
        Some(401)
    );
    assert_eq!(
        call(&anonymous, server.addr, predicate, Some("Bearer wrong")).await,
        Some(401)
    );
    server.stop().await;
}

/// Certificate files replaced on disk are served from the next connection on, without a
/// restart; files that cannot be used keep the previous certificate.
#[tokio::test]
async fn certificates_are_reloaded_when_their_files_change() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("rotating CA");
    let files = TlsFiles {
        cert: dir.path().join("tls.crt"),
        key: dir.path().join("tls.key"),
        client_ca: None,
    };
    let (cert, key, first) = ca.leaf("first", &["localhost"]);
    std::fs::write(&files.cert, &cert).unwrap();
    std::fs::write(&files.key, &key).unwrap();
    let tls = Tls::load(files.clone()).unwrap();
    let expiry = tls.not_after().unwrap();
    assert!(expiry > 1_700_000_000, "{expiry}");
    let server = Running::start_with(
        axum::Router::new().route("/healthz", axum::routing::get(|| async { "ok" })),
        Some(Arc::clone(&tls)),
        Limits::default(),
    )
    .await;
    let served = |addr: SocketAddr| {
        let ca = &ca;
        async move {
            let tcp = TcpStream::connect(addr).await.unwrap();
            let stream = client(ca, None)
                .connect(ServerName::try_from("localhost").unwrap(), tcp)
                .await
                .unwrap();
            stream.get_ref().1.peer_certificates().unwrap()[0].clone()
        }
    };
    assert_eq!(served(server.addr).await, first);
    assert!(!tls.reload_if_changed().unwrap(), "nothing changed yet");

    let (cert, key, second) = ca.leaf("second", &["localhost"]);
    std::fs::write(&files.key, &key).unwrap();
    std::fs::write(&files.cert, &cert).unwrap();
    assert!(tls.reload_if_changed().unwrap());
    assert_eq!(served(server.addr).await, second);

    // A half-written certificate: the error names the file, the second one stays.
    std::fs::write(&files.cert, "-----BEGIN CERTIFICATE-----\n").unwrap();
    let err = tls.reload_if_changed().unwrap_err();
    assert!(format!("{err:#}").contains("tls.crt"), "{err:#}");
    assert_eq!(served(server.addr).await, second);
    server.stop().await;
}

/// A new connection to `addr` is closed without an answer (`what` names it in the failure).
async fn closed_at_once(addr: SocketAddr, what: &str) {
    let mut conn = TcpStream::connect(addr).await.unwrap();
    let mut buf = Vec::new();
    let n = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        conn.read_to_end(&mut buf),
    )
    .await
    .unwrap_or_else(|_| panic!("{what} is not closed at once"));
    assert!(
        n.is_err() || buf.is_empty(),
        "{what}: {:?}",
        String::from_utf8_lossy(&buf)
    );
}

/// At most `max_connections` at once (the next is closed at once and served again when one
/// goes); a client that never finishes its request head is disconnected.
#[tokio::test]
async fn connections_are_capped_and_slow_heads_cut_off() {
    let limits = Limits {
        max_connections: 2,
        header_timeout: std::time::Duration::from_millis(300),
        ..Limits::default()
    };
    let app = axum::Router::new().route("/healthz", axum::routing::get(|| async { "ok\n" }));
    let server = Running::start_with(app, None, limits).await;
    let slow_a = TcpStream::connect(server.addr).await.unwrap();
    let slow_b = TcpStream::connect(server.addr).await.unwrap();
    // Give the server time to accept both.
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    closed_at_once(server.addr, "the third connection").await;

    // A partial head: the server gives up after the header timeout and frees the slot.
    let mut partial = slow_a;
    partial
        .write_all(b"GET /healthz HTTP/1.1\r\n")
        .await
        .unwrap();
    let mut rest = Vec::new();
    let read = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        partial.read_to_end(&mut rest),
    )
    .await
    .expect("a slow request head is cut off");
    assert!(
        read.is_err() || !rest.starts_with(b"HTTP/1.1 200"),
        "{:?}",
        String::from_utf8_lossy(&rest)
    );
    drop(partial);
    drop(slow_b);
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let (code, body) = http(server.addr, "GET", "/healthz", "").await;
    assert_eq!((code, body.trim()), (200, "ok"));
    server.stop().await;
}

/// At most `max_connections_per_peer` from one address: a client that holds them gets its
/// next connection closed at once, while another address is still served.
#[tokio::test]
async fn one_peer_cannot_take_every_connection() {
    let limits = Limits {
        max_connections: 16,
        max_connections_per_peer: 2,
        ..Limits::default()
    };
    let app = axum::Router::new().route("/healthz", axum::routing::get(|| async { "ok\n" }));
    let server = Running::start_with(app, None, limits).await;
    let held_a = TcpStream::connect(server.addr).await.unwrap();
    let held_b = TcpStream::connect(server.addr).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    closed_at_once(server.addr, "the peer's third connection").await;
    // Another address (127.0.0.2, on the loopback too) is served meanwhile.
    let other = tokio::net::TcpSocket::new_v4().unwrap();
    other.bind("127.0.0.2:0".parse().unwrap()).unwrap();
    let mut other = other.connect(server.addr).await.unwrap();
    other
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    other.read_to_end(&mut answer).await.unwrap();
    assert!(
        answer.starts_with(b"HTTP/1.1 200"),
        "{:?}",
        String::from_utf8_lossy(&answer)
    );
    drop((held_a, held_b));
    server.stop().await;
}

/// The admission webhook answers within its time limit, body included: a review whose body
/// never finishes gets a 503 in time (the API server then applies the failure policy),
/// instead of holding the connection until the API server gives up.
#[tokio::test]
async fn a_webhook_review_sent_slowly_is_answered_within_the_limit() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/snapshots/two-dgx");
    let svc = Arc::new(Service::new(
        snapshot::load(&dir).unwrap(),
        Scoring::default(),
    ));
    let limit = std::time::Duration::from_millis(300);
    let app = scheduler_ext::http::router::webhook_router_within(svc, limit);
    let server = Running::start_with(app, None, Limits::default()).await;
    let mut slow = TcpStream::connect(server.addr).await.unwrap();
    slow.write_all(
        b"POST /admission/agent-writes HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\nConnection: close\r\n\r\n{\"apiVersion\"",
    )
    .await
    .unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(
        std::time::Duration::from_secs(5),
        slow.read_to_end(&mut answer),
    )
    .await
    .expect("answered within the limit, not held open")
    .unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains("request took longer than"), "{answer}");
    server.stop().await;
}

/// Every verb has a body limit sized to its requests: a `bind` body of 100 KiB is refused.
#[tokio::test]
async fn oversized_bodies_are_refused() {
    let m = Arc::new(Metrics::new());
    let server = Running::start(app(&m), None).await;
    let big = format!("{{\"PodName\":\"{}\"}}", "x".repeat(100 << 10));
    let (code, _) = http(server.addr, "POST", "/kube-scheduler/bind", &big).await;
    assert_eq!(code, 413);
    let (code, _) = http(server.addr, "GET", "/healthz", "").await;
    assert_eq!(code, 200);
    server.stop().await;
}
