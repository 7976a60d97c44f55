//! How payments-api holds its HTTP connections against slow, stalled and too many clients
//! (docs/security.md "payments-api"): a cap on open connections, a header-read timeout (hyper's,
//! which also bounds a keep-alive connection waiting for its next request), an idle timeout for
//! keep-alive connections, and — in the handler, through [`read_body`] — a body-read timeout and
//! a size limit answered 413 whether the body has a length or is chunked.
//!
//! Without them a client sending its headers at a byte per second held its connection for ever,
//! and a few hundred such clients took every file descriptor the process had.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes, HttpBody};
use futures::StreamExt as _;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use metrics::counter;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt as _;

/// Connections the server closed on its own, by `reason`: `connection_cap`, `header_timeout`,
/// `body_timeout`, `idle_timeout`, `body_too_large`.
pub(crate) const CONNECTIONS_DROPPED: &str = "payments_api_connections_dropped_total";

/// The largest request body taken, in bytes: a payment is about a hundred.
pub(crate) const MAX_BODY_BYTES: usize = 64 * 1024;

/// How much of an oversized body is read and thrown away after the 413, so that closing the
/// connection does not reset it under the client's feet (the answer would be lost with it).
const MAX_DRAIN_BYTES: usize = 64 * 1024 * 1024;

/// How long connections still open at shutdown get to finish.
const SHUTDOWN_DRAIN: Duration = Duration::from_secs(30);

/// The limits of [`serve`] (`--header-read-timeout`, `--body-read-timeout`, `--idle-timeout`,
/// `--max-connections`).
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    pub header_read_timeout: Duration,
    pub body_read_timeout: Duration,
    pub idle_timeout: Duration,
    pub max_connections: usize,
}

pub(crate) fn describe_metrics() {
    metrics::describe_counter!(
        CONNECTIONS_DROPPED,
        "HTTP connections payments-api closed on its own, by reason: connection_cap (refused at \
         --max-connections), header_timeout, body_timeout, idle_timeout, body_too_large"
    );
    // Every reason from 0, so a dashboard shows "none" rather than "no data" in a healthy run.
    for reason in [
        "connection_cap",
        "header_timeout",
        "body_timeout",
        "idle_timeout",
        "body_too_large",
    ] {
        metrics::counter!(CONNECTIONS_DROPPED, "reason" => reason).absolute(0);
    }
}

/// Serves `app` on `listener` until `shutdown`, then lets open connections finish their request
/// (bounded by `SHUTDOWN_DRAIN`).
pub(crate) async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ConnectionLimits,
    shutdown: CancellationToken,
) {
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let connections = TaskTracker::new();
    while let Some(stream) = eos_runtime::shutdown::accept_until(&listener, &shutdown).await {
        // Refused at once rather than left in the backlog: the client learns now, and the
        // descriptors and memory of the open ones stay bounded.
        let Ok(permit) = Arc::clone(&permits).try_acquire_owned() else {
            counter!(CONNECTIONS_DROPPED, "reason" => "connection_cap").increment(1);
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let (app, shutdown) = (app.clone(), shutdown.clone());
        connections.spawn(async move {
            serve_connection(stream, app, limits, shutdown).await;
            drop(permit);
        });
    }
    connections.close();
    if tokio::time::timeout(SHUTDOWN_DRAIN, connections.wait())
        .await
        .is_err()
    {
        tracing::warn!(drain = ?SHUTDOWN_DRAIN, "connections still open after the drain");
    }
}

/// What a connection is doing, for its idle timer.
#[derive(Debug, Clone, Copy, Default)]
struct Activity {
    in_flight: usize,
    answered: u64,
}

/// Counts a request out of `in_flight` when its answer is done (or the request dropped).
struct Answered(watch::Sender<Activity>);

impl Drop for Answered {
    fn drop(&mut self) {
        self.0.send_modify(|activity| {
            activity.in_flight -= 1;
            activity.answered += 1;
        });
    }
}

async fn serve_connection(
    stream: tokio::net::TcpStream,
    app: Router,
    limits: ConnectionLimits,
    shutdown: CancellationToken,
) {
    let (activity, mut watched) = watch::channel(Activity::default());
    let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
        activity.send_modify(|activity| activity.in_flight += 1);
        let answered = Answered(activity.clone());
        let app = app.clone();
        async move {
            let response = app.oneshot(request.map(Body::new)).await;
            drop(answered);
            response
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    let connection = builder.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(connection);
    let mut closing = false;
    loop {
        let now = *watched.borrow_and_update();
        // Idle: between requests of a keep-alive connection. A connection that has sent no
        // request yet is the header-read timeout's.
        let idle = now.in_flight == 0 && now.answered > 0;
        tokio::select! {
            ended = connection.as_mut() => {
                if let Err(error) = ended {
                    if error.is_timeout() {
                        counter!(CONNECTIONS_DROPPED, "reason" => "header_timeout").increment(1);
                    }
                    tracing::debug!(%error, "connection closed");
                }
                return;
            }
            () = shutdown.cancelled(), if !closing => {
                connection.as_mut().graceful_shutdown();
                closing = true;
            }
            Ok(()) = watched.changed() => {}
            () = tokio::time::sleep(limits.idle_timeout), if idle && !closing => {
                counter!(CONNECTIONS_DROPPED, "reason" => "idle_timeout").increment(1);
                connection.as_mut().graceful_shutdown();
                closing = true;
            }
        }
    }
}

/// Why a request's body was not read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BodyError {
    #[error("the body is over the limit of {MAX_BODY_BYTES} bytes")]
    TooLarge,
    #[error("the body did not arrive within {0:?}")]
    TimedOut(Duration),
    #[error("the body could not be read: {0}")]
    Broken(String),
}

/// The whole body, within `timeout` (from now, for the whole body: a trickle of bytes does not
/// extend it) and [`MAX_BODY_BYTES`]. An oversized body is drained in the background, bounded by
/// `MAX_DRAIN_BYTES` and `timeout`, so the 413 reaches the client instead of a reset.
pub(crate) async fn read_body(body: Body, timeout: Duration) -> Result<Bytes, BodyError> {
    let deadline = Instant::now() + timeout;
    let declared_too_large = HttpBody::size_hint(&body).lower() > MAX_BODY_BYTES as u64;
    let mut stream = body.into_data_stream();
    if declared_too_large {
        drain(stream, timeout);
        counter!(CONNECTIONS_DROPPED, "reason" => "body_too_large").increment(1);
        return Err(BodyError::TooLarge);
    }
    let mut read = Vec::new();
    loop {
        let Ok(next) = tokio::time::timeout_at(deadline, stream.next()).await else {
            counter!(CONNECTIONS_DROPPED, "reason" => "body_timeout").increment(1);
            return Err(BodyError::TimedOut(timeout));
        };
        match next {
            None => return Ok(Bytes::from(read)),
            Some(Err(error)) => return Err(BodyError::Broken(error.to_string())),
            Some(Ok(chunk)) if read.len() + chunk.len() > MAX_BODY_BYTES => {
                drain(stream, timeout);
                counter!(CONNECTIONS_DROPPED, "reason" => "body_too_large").increment(1);
                return Err(BodyError::TooLarge);
            }
            Some(Ok(chunk)) => read.extend_from_slice(&chunk),
        }
    }
}

/// Reads and drops the rest of a refused body while hyper sends the answer: hyper keeps reading
/// a body whose receiver is alive, and closes the connection (`Connection: close`) once it ends.
fn drain(mut stream: axum::body::BodyDataStream, timeout: Duration) {
    tokio::spawn(async move {
        let deadline = Instant::now() + timeout;
        let mut drained = 0usize;
        while drained <= MAX_DRAIN_BYTES {
            match tokio::time::timeout_at(deadline, stream.next()).await {
                Ok(Some(Ok(chunk))) => drained += chunk.len(),
                _ => return,
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    /// Reads until the server closes the connection; how long that took, or `None` past 5 s.
    async fn closed_after(stream: &mut tokio::net::TcpStream) -> Option<Duration> {
        let started = Instant::now();
        let mut buffer = [0u8; 1024];
        tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                match stream.read(&mut buffer).await {
                    Ok(0) | Err(_) => return started.elapsed(),
                    Ok(_) => {}
                }
            }
        })
        .await
        .ok()
    }

    #[tokio::test]
    async fn one_connection_past_the_cap_is_closed_and_an_idle_one_times_out() -> anyhow::Result<()>
    {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let app = Router::new().route("/", axum::routing::get(|| async { "ok" }));
        let limits = ConnectionLimits {
            header_read_timeout: Duration::from_secs(30),
            body_read_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_millis(300),
            max_connections: 2,
        };
        let shutdown = CancellationToken::new();
        let server = tokio::spawn(serve(listener, app, limits, shutdown.clone()));

        let mut first = tokio::net::TcpStream::connect(addr).await?;
        let _second = tokio::net::TcpStream::connect(addr).await?;
        let mut third = tokio::net::TcpStream::connect(addr).await?;
        let refused = closed_after(&mut third).await;
        assert!(
            refused.is_some_and(|after| after < Duration::from_secs(1)),
            "{refused:?}"
        );

        // A keep-alive connection answered once, then idle: closed after the idle timeout.
        first
            .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await?;
        let idle = closed_after(&mut first).await;
        assert!(
            idle.is_some_and(|after| after >= Duration::from_millis(300)),
            "{idle:?}"
        );
        shutdown.cancel();
        server.await?;
        Ok(())
    }
}
