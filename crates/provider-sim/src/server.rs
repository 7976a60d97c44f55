//! The HTTP server: hyper directly (not `axum::serve`) so that a response marked
//! [`DropConnection`] can close the connection without an answer — a lost response, as the
//! caller sees it when a network or a provider fails after applying.

use std::time::Duration;

use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;

use crate::http_api::DropConnection;

/// Returned to hyper to make it drop the connection.
#[derive(Debug, thiserror::Error)]
#[error("response dropped on purpose (fault injection)")]
struct DroppedOnPurpose;

/// Serves until `shutdown`, then gives open connections `drain` to finish.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    shutdown: CancellationToken,
    drain: Duration,
) {
    let graceful = GracefulShutdown::new();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = shutdown.cancelled() => break,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(error) => {
                tracing::warn!(%error, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let app = app.clone();
        let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
            let app = app.clone();
            async move {
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
        let connection = hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(stream), service);
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%error, "connection closed");
            }
        });
    }
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(drain) => {
            tracing::warn!(?drain, "connections still open after the drain timeout");
        }
    }
}
