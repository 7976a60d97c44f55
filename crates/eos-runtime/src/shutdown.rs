//! The shutdown signal: SIGINT or SIGTERM cancels a token every task watches.

use tokio_util::sync::CancellationToken;

/// Waits for SIGINT or SIGTERM.
pub async fn wait_for_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut sigterm) => {
                tokio::select! {
                    _ = ctrl_c => {}
                    _ = sigterm.recv() => {}
                }
            }
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGTERM; only SIGINT stops the service");
                let _ = ctrl_c.await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

/// A token cancelled on the first SIGINT or SIGTERM. Call inside a Tokio runtime.
pub fn shutdown_token() -> CancellationToken {
    let token = CancellationToken::new();
    let cancel = token.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("shutdown signal received");
        cancel.cancel();
    });
    token
}

/// The next connection on `listener`, or `None` once `shutdown` is cancelled: the accept step of
/// the servers that hold their connections themselves (payments-api, provider-sim). A failed
/// accept (out of descriptors, most likely) is logged and waited out rather than spun on.
pub async fn accept_until(
    listener: &tokio::net::TcpListener,
    shutdown: &CancellationToken,
) -> Option<tokio::net::TcpStream> {
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = shutdown.cancelled() => return None,
        };
        match accepted {
            Ok((stream, _)) => return Some(stream),
            Err(error) => {
                tracing::warn!(%error, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    }
}
