//! The HTTP server: hyper directly (not `axum::serve`) so that a response marked
//! [`DropConnection`] can close the connection without an answer — a lost response, as the
//! caller sees it when a network or a provider fails after applying. Optionally over TLS and
//! behind an API key, as a real provider is.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::response::IntoResponse as _;
use eos_runtime::secrets::Secret;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject as _;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;

/// How clients must reach the server.
#[derive(Clone, Default)]
pub(crate) struct Access {
    /// Serve HTTPS with this.
    pub tls: Option<TlsAcceptor>,
    /// The exact `Authorization` value /charges requests must carry.
    pub required_authorization: Option<Secret>,
}

impl std::fmt::Debug for Access {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Access")
            .field("tls", &self.tls.is_some())
            .field("required_authorization", &self.required_authorization)
            .finish()
    }
}

/// A TLS acceptor from PEM files (ring: the provider the workspace's other rustls users build).
pub(crate) fn tls_acceptor(cert: &Path, key: &Path) -> anyhow::Result<TlsAcceptor> {
    let chain = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| anyhow::anyhow!("--tls-cert {}: {e}", cert.display()))?;
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| anyhow::anyhow!("--tls-key {}: {e}", key.display()))?;
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_no_client_auth()
    .with_single_cert(chain, key)?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// Whether `request` may reach the API: /charges needs the configured `Authorization`; the
/// probes and /metrics stay open.
fn authorized(request: &hyper::Request<Incoming>, required: Option<&Secret>) -> bool {
    let Some(required) = required else {
        return true;
    };
    if !request.uri().path().starts_with("/charges") {
        return true;
    }
    request
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .is_some_and(|given| given.as_bytes() == required.expose().as_bytes())
}

use crate::http_api::DropConnection;

/// Returned to hyper to make it drop the connection.
#[derive(Debug, thiserror::Error)]
#[error("response dropped on purpose (fault injection)")]
struct DroppedOnPurpose;

/// Serves until `shutdown`, then gives open connections `drain` to finish.
pub(crate) async fn serve(
    listener: TcpListener,
    app: Router,
    access: Access,
    shutdown: CancellationToken,
    drain: Duration,
) {
    let graceful = GracefulShutdown::new();
    while let Some(stream) = eos_runtime::shutdown::accept_until(&listener, &shutdown).await {
        let _ = stream.set_nodelay(true);
        let app = app.clone();
        let required = access.required_authorization.clone();
        let watcher = graceful.watcher();
        match access.tls.clone() {
            None => {
                tokio::spawn(serve_connection(stream, app, required, watcher));
            }
            Some(acceptor) => {
                // The handshake runs in the connection's task, so a slow client cannot stall
                // the accept loop.
                tokio::spawn(async move {
                    match acceptor.accept(stream).await {
                        Ok(stream) => serve_connection(stream, app, required, watcher).await,
                        Err(error) => tracing::debug!(%error, "TLS handshake failed"),
                    }
                });
            }
        }
    }
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(drain) => {
            tracing::warn!(?drain, "connections still open after the drain timeout");
        }
    }
}

async fn serve_connection<S>(
    stream: S,
    app: Router,
    required: Option<Secret>,
    watcher: hyper_util::server::graceful::Watcher,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
        let app = app.clone();
        let allowed = authorized(&request, required.as_ref());
        async move {
            if !allowed {
                return Ok((
                    axum::http::StatusCode::UNAUTHORIZED,
                    "missing or wrong Authorization\n",
                )
                    .into_response());
            }
            let response = match app.oneshot(request.map(axum::body::Body::new)).await {
                Ok(response) => response,
                Err(never) => match never {},
            };
            if response.extensions().get::<DropConnection>().is_some() {
                return Err(DroppedOnPurpose);
            }
            Ok(response)
        }
    });
    let connection =
        hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service);
    if let Err(error) = watcher.watch(connection).await {
        tracing::debug!(%error, "connection closed");
    }
}
