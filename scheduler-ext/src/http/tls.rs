//! Serving a [`Router`] over plain HTTP or HTTPS, until a shutdown signal.
//!
//! kube-scheduler (`extenders[].tlsConfig`) and Volcano can call the extender over HTTPS. With
//! [`TlsFiles`] (a PEM certificate chain and a PEM private key), [`serve`] terminates TLS itself
//! with rustls (`ring` provider, HTTP/1.1, no client certificates asked); without them it is
//! plain `axum::serve`. Both go through `axum::serve`, so both stop accepting when `shutdown`
//! completes and return once the open connections have finished.
//!
//! TLS handshakes run in tasks of their own, each bounded by [`HANDSHAKE_TIMEOUT`]: a slow or
//! broken client does not hold up the others, and a failed handshake is logged and dropped,
//! never an error of the server.

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, anyhow};
use axum::Router;
use axum::serve::{Listener, ListenerExt as _};
use rustls::ServerConfig;
use rustls::pki_types::pem::{self, PemObject as _};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

/// Longest a client may take to complete the TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The server's certificate and key, as PEM files.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// Certificate chain, leaf first.
    pub cert: PathBuf,
    /// Private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

/// Serves `app` on `listener`, over TLS when `tls` is given, until `shutdown` completes and the
/// open connections have finished. Fails before serving when the certificate or key cannot be
/// read or used (the message names the file), or when accepting fails for good.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    tls: Option<TlsFiles>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    match tls {
        None => {
            let listener = listener.tap_io(set_nodelay);
            axum::serve(listener, app)
                .with_graceful_shutdown(shutdown)
                .await
                .context("serving HTTP")
        }
        Some(files) => {
            let listener = TlsListener {
                tcp: listener,
                acceptor: TlsAcceptor::from(Arc::new(server_config(&files)?)),
                handshakes: JoinSet::new(),
            };
            axum::serve(listener, app)
                .with_graceful_shutdown(shutdown)
                .await
                .context("serving HTTPS")
        }
    }
}

/// The rustls server configuration for `files`: HTTP/1.1 over TLS 1.2 or 1.3 with the `ring`
/// provider, which this also installs as the process default when none is (kube's client and
/// any other rustls user then agree).
pub fn server_config(files: &TlsFiles) -> anyhow::Result<ServerConfig> {
    // Err means a provider is installed already: keep it.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let certs = CertificateDer::pem_slice_iter(&read(&files.cert)?)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow!("{}: {e}", files.cert.display()))?;
    if certs.is_empty() {
        return Err(anyhow!("{}: no certificate found", files.cert.display()));
    }
    let key = match PrivateKeyDer::from_pem_slice(&read(&files.key)?) {
        Ok(key) => key,
        Err(pem::Error::NoItemsFound) => {
            return Err(anyhow!("{}: no private key found", files.key.display()));
        }
        Err(e) => return Err(anyhow!("{}: {e}", files.key.display())),
    };
    let mut config =
        ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .map_err(|e| anyhow!("{} with {}: {e}", files.cert.display(), files.key.display()))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

fn read(path: &Path) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| anyhow!("reading {}: {e}", path.display()))
}

fn set_nodelay(tcp: &mut TcpStream) {
    // Small request/response exchanges: do not wait for Nagle.
    if let Err(e) = tcp.set_nodelay(true) {
        tracing::debug!(error = %e, "setting TCP_NODELAY");
    }
}

/// A [`Listener`] yielding connections whose TLS handshake succeeded.
struct TlsListener {
    tcp: TcpListener,
    acceptor: TlsAcceptor,
    /// Handshakes in progress; `None` for one that failed.
    handshakes: JoinSet<Option<(TlsStream<TcpStream>, SocketAddr)>>,
}

impl Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    // Cancel-safe (axum drops it on shutdown): TCP accept and `join_next` both are.
    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            tokio::select! {
                (mut tcp, addr) = Listener::accept(&mut self.tcp) => {
                    set_nodelay(&mut tcp);
                    let acceptor = self.acceptor.clone();
                    self.handshakes.spawn(async move {
                        match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                            Ok(Ok(tls)) => Some((tls, addr)),
                            Ok(Err(e)) => {
                                tracing::debug!(%addr, error = %e, "TLS handshake failed");
                                None
                            }
                            Err(_) => {
                                tracing::debug!(%addr, "TLS handshake timed out");
                                None
                            }
                        }
                    });
                }
                Some(done) = self.handshakes.join_next(), if !self.handshakes.is_empty() => {
                    match done {
                        Ok(Some(conn)) => return conn,
                        Ok(None) => {}
                        Err(e) => tracing::warn!(error = %e, "TLS handshake task failed"),
                    }
                }
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
}
