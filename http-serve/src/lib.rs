//! Serving a [`Router`] over plain HTTP or HTTPS until a shutdown signal, hardened for a port
//! anything on the pod network can reach.
//!
//! - **TLS** ([`Tls`]): a PEM certificate chain and key, reloaded when the files change
//!   ([`Tls::watch`]; certificates rotated by cert-manager or by hand need no restart), with the
//!   certificate's expiry as a metric. With a client CA, clients may present a certificate: a
//!   certificate that does not verify fails the handshake, and a verified one is known to the
//!   routes as [`Peer::client`] (kube-scheduler's `tlsConfig.certFile`; see the extension's
//!   `http::access`). Without a certificate the connection is allowed and the routes decide
//!   (Volcano's extender client cannot present one).
//! - **Limits** ([`Limits`]): at most `max_connections` open connections, and at most
//!   `max_connections_per_peer` from one address, so one client cannot take every slot from the
//!   schedulers (further ones are closed at once); the TLS handshake and the request head each
//!   bounded in time, so slow or stuck clients hold up no one; per-route body limits and
//!   request timeouts are the router's (the extension's `http::router`).
//! - **Shutdown**: when `shutdown` completes the listener stops accepting and open connections
//!   finish their current request (at most [`DRAIN_TIMEOUT`]).
//!
//! Each connection runs hyper's HTTP/1.1 server with the [`Peer`] of the connection inserted
//! into every request's extensions.

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicI64;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};

use anyhow::{Context as _, anyhow};
use axum::Router;
use axum::body::Body;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use rustls::ServerConfig;
use rustls::pki_types::pem::{self, PemObject as _};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt as _;

/// Longest the open connections may take to finish after shutdown.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// The server's certificate, key and (optionally) the CA that signs client certificates.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// Certificate chain, leaf first.
    pub cert: PathBuf,
    /// Private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// CA bundle that client certificates must chain to; `None` asks for none.
    pub client_ca: Option<PathBuf>,
}

/// Connection limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Most connections open at once; further ones are closed at once.
    pub max_connections: usize,
    /// Most connections open at once from one IP address.
    pub max_connections_per_peer: usize,
    /// Longest a client may take to complete the TLS handshake.
    pub handshake_timeout: Duration,
    /// Longest a client may take to send a request head (slow-loris).
    pub header_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 512,
            max_connections_per_peer: 128,
            handshake_timeout: Duration::from_secs(10),
            header_timeout: Duration::from_secs(10),
        }
    }
}

/// Who is on the other end of a request's connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    pub addr: SocketAddr,
    /// The subject of the client certificate the connection presented and the client CA
    /// verified; `None` without one (or without TLS).
    pub client: Option<String>,
}

/// The files' identity when last loaded: a change of either means reload.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Stamp(Vec<Option<(SystemTime, u64)>>);

impl Stamp {
    fn of(files: &TlsFiles) -> Self {
        let paths = [
            Some(&files.cert),
            Some(&files.key),
            files.client_ca.as_ref(),
        ];
        Stamp(
            paths
                .into_iter()
                .flatten()
                .map(|p| {
                    std::fs::metadata(p)
                        .ok()
                        .and_then(|m| Some((m.modified().ok()?, m.len())))
                })
                .collect(),
        )
    }
}

/// A TLS configuration that follows its files.
#[derive(Debug)]
pub struct Tls {
    files: TlsFiles,
    config: RwLock<Arc<ServerConfig>>,
    stamp: Mutex<Stamp>,
    /// Unix seconds when the serving certificate expires.
    not_after: RwLock<Option<i64>>,
}

impl Tls {
    /// Loads the files; fails (naming the file) when they cannot be read or used.
    pub fn load(files: TlsFiles) -> anyhow::Result<Arc<Tls>> {
        let stamp = Stamp::of(&files);
        let (config, not_after) = server_config(&files)?;
        Ok(Arc::new(Tls {
            files,
            config: RwLock::new(Arc::new(config)),
            stamp: Mutex::new(stamp),
            not_after: RwLock::new(not_after),
        }))
    }

    /// The files it serves.
    pub fn files(&self) -> &TlsFiles {
        &self.files
    }

    /// Unix seconds when the serving certificate expires, if it could be read.
    pub fn not_after(&self) -> Option<i64> {
        *self.not_after.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Reloads when the files changed since the last load. `Ok(true)`: reloaded; an error keeps
    /// the configuration in force (a half-written file is read again on the next change).
    pub fn reload_if_changed(&self) -> anyhow::Result<bool> {
        let now = Stamp::of(&self.files);
        let mut stamp = self.stamp.lock().unwrap_or_else(|p| p.into_inner());
        if *stamp == now {
            return Ok(false);
        }
        *stamp = now;
        let (config, not_after) = server_config(&self.files)?;
        *self.config.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(config);
        *self.not_after.write().unwrap_or_else(|p| p.into_inner()) = not_after;
        Ok(true)
    }

    /// Checks the files every `every` and reloads them when they change, keeping `metrics`
    /// current; runs forever.
    pub async fn watch(self: Arc<Self>, every: Duration, metrics: TlsMetrics) {
        metrics.update(&self);
        loop {
            tokio::time::sleep(every).await;
            match self.reload_if_changed() {
                Ok(true) => tracing::info!(cert = %self.files.cert.display(), "TLS files reloaded"),
                Ok(false) => {}
                Err(e) => {
                    metrics.reload_errors.inc();
                    tracing::warn!(error = %format!("{e:#}"), "TLS files changed but cannot be used; keeping the previous ones");
                }
            }
            metrics.update(&self);
        }
    }

    fn acceptor(&self) -> TlsAcceptor {
        let config = self.config.read().unwrap_or_else(|p| p.into_inner());
        TlsAcceptor::from(Arc::clone(&config))
    }
}

/// `tls_cert_expiry_timestamp_seconds` (when the serving certificate expires, Unix seconds)
/// and `tls_reload_errors_total` (changed files that could not be used).
#[derive(Clone, Debug, Default)]
pub struct TlsMetrics {
    pub expiry: Gauge<i64, AtomicI64>,
    pub reload_errors: Counter,
}

impl TlsMetrics {
    /// The metrics, registered in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = TlsMetrics::default();
        registry.register(
            "tls_cert_expiry_timestamp_seconds",
            "When the serving certificate expires (Unix seconds)",
            m.expiry.clone(),
        );
        registry.register(
            "tls_reload_errors",
            "Changed certificate or key files that could not be used (the previous ones stay)",
            m.reload_errors.clone(),
        );
        m
    }

    fn update(&self, tls: &Tls) {
        if let Some(t) = tls.not_after() {
            self.expiry.set(t);
        }
    }
}

/// The rustls server configuration for `files` (HTTP/1.1 over TLS 1.2 or 1.3, the `ring`
/// provider, which this also installs as the process default when none is), and the
/// certificate's expiry.
fn server_config(files: &TlsFiles) -> anyhow::Result<(ServerConfig, Option<i64>)> {
    // Err means a provider is installed already: keep it.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let certs = read_certs(&files.cert)?;
    let not_after = certs.first().and_then(|c| expiry(c));
    let key = match PrivateKeyDer::from_pem_slice(&read(&files.key)?) {
        Ok(key) => key,
        Err(pem::Error::NoItemsFound) => {
            return Err(anyhow!("{}: no private key found", files.key.display()));
        }
        Err(e) => return Err(anyhow!("{}: {e}", files.key.display())),
    };
    let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()?;
    let builder = match &files.client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in read_certs(ca)? {
                roots.add(c).map_err(|e| anyhow!("{}: {e}", ca.display()))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .allow_unauthenticated()
                .build()
                .map_err(|e| anyhow!("{}: {e}", ca.display()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .map_err(|e| anyhow!("{} with {}: {e}", files.cert.display(), files.key.display()))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok((config, not_after))
}

fn read_certs(path: &Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_slice_iter(&read(path)?)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow!("{}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(anyhow!("{}: no certificate found", path.display()));
    }
    Ok(certs)
}

fn read(path: &Path) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| anyhow!("reading {}: {e}", path.display()))
}

/// Unix seconds of a certificate's `notAfter`.
fn expiry(cert: &CertificateDer<'_>) -> Option<i64> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    Some(parsed.validity().not_after.timestamp())
}

/// The subject of a verified client certificate, for logs and [`Peer::client`].
fn subject(cert: &CertificateDer<'_>) -> String {
    x509_parser::parse_x509_certificate(cert.as_ref())
        .map(|(_, c)| c.subject().to_string())
        .unwrap_or_else(|_| "<unreadable subject>".into())
}

fn set_nodelay(tcp: &TcpStream) {
    // Small request/response exchanges: do not wait for Nagle.
    if let Err(e) = tcp.set_nodelay(true) {
        tracing::debug!(error = %e, "setting TCP_NODELAY");
    }
}

/// Serves `app` on `listener` (over TLS when `tls` is given) within `limits`, until `shutdown`
/// completes and the open connections have finished. Fails only when accepting fails for good.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    tls: Option<Arc<Tls>>,
    limits: Limits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let per_peer = PeerSlots::new(limits.max_connections_per_peer);
    let graceful = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (tcp, addr) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) if is_transient(&e) => {
                    tracing::warn!(error = %e, "accepting a connection failed; going on");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
                Err(e) => return Err(e).context("accepting connections"),
            },
            () = &mut shutdown => break,
        };
        let Some(peer_slot) = per_peer.take(addr.ip()) else {
            tracing::warn!(%addr, max = limits.max_connections_per_peer, "too many connections from this address; closing this one");
            continue;
        };
        let Ok(permit) = Arc::clone(&slots).try_acquire_owned() else {
            tracing::warn!(%addr, max = limits.max_connections, "too many connections; closing this one");
            continue;
        };
        set_nodelay(&tcp);
        let app = app.clone();
        let tls = tls.clone();
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let _permits = (permit, peer_slot);
            match tls {
                None => {
                    let peer = Peer { addr, client: None };
                    serve_connection(tcp, app, peer, limits, watcher).await;
                }
                Some(tls) => {
                    let handshake = tls.acceptor().accept(tcp);
                    match tokio::time::timeout(limits.handshake_timeout, handshake).await {
                        Ok(Ok(stream)) => {
                            let client = stream
                                .get_ref()
                                .1
                                .peer_certificates()
                                .and_then(|c| c.first())
                                .map(subject);
                            let peer = Peer { addr, client };
                            serve_connection(stream, app, peer, limits, watcher).await;
                        }
                        Ok(Err(e)) => tracing::debug!(%addr, error = %e, "TLS handshake failed"),
                        Err(_) => tracing::debug!(%addr, "TLS handshake timed out"),
                    }
                }
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(DRAIN_TIMEOUT, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("connections still open after {DRAIN_TIMEOUT:?}; closing them");
    }
    Ok(())
}

/// The connections open per peer address.
#[derive(Clone)]
struct PeerSlots {
    max: usize,
    open: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

/// One connection's place in [`PeerSlots`], given back when dropped.
struct PeerSlot {
    ip: IpAddr,
    open: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

impl PeerSlots {
    fn new(max: usize) -> Self {
        PeerSlots {
            max: max.max(1),
            open: Arc::default(),
        }
    }

    /// A slot for one more connection from `ip`, unless it has `max` open.
    fn take(&self, ip: IpAddr) -> Option<PeerSlot> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let n = open.entry(ip).or_default();
        if *n >= self.max {
            return None;
        }
        *n += 1;
        Some(PeerSlot {
            ip,
            open: Arc::clone(&self.open),
        })
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = open.get_mut(&self.ip) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

/// Accept errors that concern one connection (or a passing shortage), not the listener.
fn is_transient(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        e.kind(),
        ConnectionAborted | ConnectionReset | Interrupted | WouldBlock | TimedOut
    ) || matches!(e.raw_os_error(), Some(23 | 24)) // ENFILE, EMFILE
}

/// One connection: HTTP/1.1 with keep-alive, the request head bounded in time, `peer` in
/// every request's extensions.
async fn serve_connection<I>(
    io: I,
    app: Router,
    peer: Peer,
    limits: Limits,
    graceful: hyper_util::server::graceful::Watcher,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let addr = peer.addr;
    let service = tower::service_fn(move |mut req: hyper::Request<Incoming>| {
        req.extensions_mut().insert(peer.clone());
        app.clone().oneshot(req.map(Body::new))
    });
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .keep_alive(true);
    let conn = http.serve_connection(TokioIo::new(io), TowerToHyperService::new(service));
    if let Err(e) = graceful.watch(conn).await {
        tracing::debug!(%addr, error = %e, "connection ended with an error");
    }
}
