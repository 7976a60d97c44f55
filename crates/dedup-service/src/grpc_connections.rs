//! How dedup-service holds its gRPC connections against silent, stalled and too many clients
//! (docs/security.md "dedup-service"): its own accept loop ([`incoming`]) hands tonic each
//! connection as a [`GuardedConnection`], which holds one of `--max-connections` slots and closes
//! itself when its client has not finished the handshake within `--handshake-timeout`, or has had
//! no call in flight for `--idle-timeout`. [`track_calls`] is the layer that tells a connection
//! when its calls begin and end.
//!
//! Without them a TCP connection that sent nothing, or only the HTTP/2 preface, was held for ever
//! (still open after 150 s in a hostile-input probe, docs/security.md), nothing capped their
//! number, and a few thousand took every file descriptor the process had, stopping every call.
//! tonic has no handshake or idle timeout of its own, and its HTTP/2 keep-alive PINGs close only a
//! connection whose client stops answering them: none is sent before the preface, and a client that
//! answers them is kept however long it makes no call.

use std::convert::Infallible;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use futures::Stream;
use futures::future::BoxFuture;
use metrics::counter;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};
use tokio_util::sync::CancellationToken;
use tonic::codegen::http;
use tonic::transport::server::Connected;

use crate::metrics::CONNECTIONS_DROPPED;

/// The limits of [`incoming`] (`--max-connections`, `--handshake-timeout`, `--idle-timeout`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ConnectionLimits {
    pub(crate) max_connections: usize,
    pub(crate) handshake_timeout: Duration,
    pub(crate) idle_timeout: Duration,
}

/// Why the server closed a connection on its own: the `reason` of
/// `eos_dedup_connections_dropped_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DropReason {
    /// Accepted past `--max-connections`, and closed at once.
    ConnectionCap,
    /// No complete handshake within `--handshake-timeout` of being accepted.
    HandshakeTimeout,
    /// No call in flight for `--idle-timeout`.
    IdleTimeout,
}

impl DropReason {
    pub(crate) fn label(self) -> &'static str {
        match self {
            DropReason::ConnectionCap => "connection_cap",
            DropReason::HandshakeTimeout => "handshake_timeout",
            DropReason::IdleTimeout => "idle_timeout",
        }
    }

    fn count(self) {
        counter!(CONNECTIONS_DROPPED, "reason" => self.label()).increment(1);
    }
}

/// The connections tonic serves: accepted from `listener` until `accepting` is cancelled, each
/// in a slot of `limits.max_connections`. With `tls`, the handshake a connection must finish in
/// time is the TLS handshake (its HTTP/2 preface travels encrypted, out of this layer's sight).
pub(crate) fn incoming(
    listener: TcpListener,
    limits: ConnectionLimits,
    tls: bool,
    accepting: CancellationToken,
) -> impl Stream<Item = Result<GuardedConnection, Infallible>> {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    futures::stream::unfold(
        (listener, slots, accepting),
        move |(listener, slots, accepting)| async move {
            loop {
                let stream = eos_runtime::shutdown::accept_until(&listener, &accepting).await?;
                // Closed at once rather than left in the backlog: the client learns now, and
                // the descriptors of the open ones stay bounded.
                let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
                    DropReason::ConnectionCap.count();
                    drop(stream);
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let connection = GuardedConnection::new(stream, slot, limits, tls);
                return Some((Ok(connection), (listener, slots, accepting)));
            }
        },
    )
}

/// What the client has sent of its side of the HTTP/2 handshake (RFC 9113 §3.4): the 24-byte
/// preface, then a SETTINGS frame, whole. Fed the bytes as the server reads them.
#[derive(Debug)]
struct HandshakeProgress {
    /// The preface and the SETTINGS frame's 9-byte header, as far as they have arrived.
    head: [u8; HANDSHAKE_HEAD],
    /// Every byte read so far (saturating: only the first few thousand matter).
    read: usize,
    complete: bool,
}

const HTTP2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const FRAME_HEADER: usize = 9;
const HANDSHAKE_HEAD: usize = HTTP2_PREFACE.len() + FRAME_HEADER;
const SETTINGS_FRAME: u8 = 0x4;

impl Default for HandshakeProgress {
    fn default() -> Self {
        Self {
            head: [0; HANDSHAKE_HEAD],
            read: 0,
            complete: false,
        }
    }
}

impl HandshakeProgress {
    /// Takes the next bytes read; true once the preface and a whole SETTINGS frame are in.
    /// Bytes that are no HTTP/2 handshake never complete it: hyper refuses them itself, and the
    /// handshake timeout closes what it does not.
    fn feed(&mut self, bytes: &[u8]) -> bool {
        if self.read < HANDSHAKE_HEAD {
            let take = bytes.len().min(HANDSHAKE_HEAD - self.read);
            self.head[self.read..self.read + take].copy_from_slice(&bytes[..take]);
        }
        self.read = self.read.saturating_add(bytes.len());
        if self.read < HANDSHAKE_HEAD
            || &self.head[..HTTP2_PREFACE.len()] != HTTP2_PREFACE
            || self.head[HTTP2_PREFACE.len() + 3] != SETTINGS_FRAME
        {
            return false;
        }
        let length = &self.head[HTTP2_PREFACE.len()..HTTP2_PREFACE.len() + 3];
        let payload =
            usize::from(length[0]) << 16 | usize::from(length[1]) << 8 | usize::from(length[2]);
        self.complete = self.read >= HANDSHAKE_HEAD + payload;
        self.complete
    }
}

/// What one connection is doing, shared by its [`GuardedConnection`] and the calls on it.
#[derive(Debug)]
struct Activity {
    state: Mutex<ActivityState>,
}

#[derive(Debug)]
struct ActivityState {
    handshake_done: bool,
    calls_in_flight: usize,
    /// When the last call ended, or the handshake did if no call has: where the idle timeout
    /// counts from while no call is in flight.
    idle_since: Instant,
}

impl Activity {
    fn state(&self) -> std::sync::MutexGuard<'_, ActivityState> {
        // Nothing panics while holding it: a poisoned state is still a consistent one.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn handshake_finished(&self) {
        let mut state = self.state();
        if !state.handshake_done {
            state.handshake_done = true;
            state.idle_since = Instant::now();
        }
    }
}

/// The connection's side of [`track_calls`]: tonic puts it in every request's extensions
/// (tonic's `Connected`), so a call can say when it begins and ends.
#[derive(Debug, Clone)]
pub(crate) struct ConnectionCalls(Arc<Activity>);

impl ConnectionCalls {
    fn begin(&self) -> CallInFlight {
        self.0.state().calls_in_flight += 1;
        CallInFlight(Arc::clone(&self.0))
    }
}

/// One call in flight on a connection, until its answer is sent (or dropped).
#[derive(Debug)]
struct CallInFlight(Arc<Activity>);

impl Drop for CallInFlight {
    fn drop(&mut self) {
        let mut state = self.0.state();
        state.calls_in_flight -= 1;
        if state.calls_in_flight == 0 {
            state.idle_since = Instant::now();
        }
    }
}

/// What bounds a connection now, and when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Limit {
    /// Closed at `at` for `reason`, unless the connection moves on before.
    CloseAt(Instant, DropReason),
    /// A call is in flight: nothing to close, look again at `at`.
    Busy(Instant),
}

impl Limit {
    fn of(state: &ActivityState, accepted: Instant, limits: &ConnectionLimits) -> Limit {
        if !state.handshake_done {
            Limit::CloseAt(
                accepted + limits.handshake_timeout,
                DropReason::HandshakeTimeout,
            )
        } else if state.calls_in_flight > 0 {
            // Looked at again an idle timeout from now rather than woken when the last call
            // ends: the end of a call need not know the connection's task.
            Limit::Busy(Instant::now() + limits.idle_timeout)
        } else {
            Limit::CloseAt(
                state.idle_since + limits.idle_timeout,
                DropReason::IdleTimeout,
            )
        }
    }
}

/// An accepted TCP connection as tonic serves it: its slot of `--max-connections` is held until
/// tonic drops it, and once its limit passes (`Limit`) it reads as closed by the client (end
/// of file) and refuses writes, so hyper ends the connection and tonic drops it. With no call
/// in flight nothing is cut short, and the client's next call connects again.
#[derive(Debug)]
pub(crate) struct GuardedConnection {
    stream: TcpStream,
    activity: Arc<Activity>,
    limits: ConnectionLimits,
    tls: bool,
    accepted: Instant,
    handshake: HandshakeProgress,
    timer: Pin<Box<Sleep>>,
    closed: bool,
    _slot: OwnedSemaphorePermit,
}

impl GuardedConnection {
    fn new(
        stream: TcpStream,
        slot: OwnedSemaphorePermit,
        limits: ConnectionLimits,
        tls: bool,
    ) -> Self {
        let accepted = Instant::now();
        Self {
            stream,
            activity: Arc::new(Activity {
                state: Mutex::new(ActivityState {
                    handshake_done: false,
                    calls_in_flight: 0,
                    idle_since: accepted,
                }),
            }),
            limits,
            tls,
            accepted,
            handshake: HandshakeProgress::default(),
            timer: Box::pin(tokio::time::sleep_until(
                accepted + limits.handshake_timeout,
            )),
            closed: false,
            _slot: slot,
        }
    }

    /// Ready once the connection's limit has passed; else the timer is set for it, to wake the
    /// connection's task (the one polling this connection's reads and writes).
    fn poll_limit(&mut self, cx: &mut Context<'_>) -> Poll<DropReason> {
        loop {
            let limit = Limit::of(&self.activity.state(), self.accepted, &self.limits);
            match limit {
                Limit::CloseAt(at, _) if self.timer.deadline() != at => {
                    self.timer.as_mut().reset(at);
                }
                // Any time ahead will do for a look: resetting it at every read and write of a
                // busy connection would cost a timer update each.
                Limit::Busy(at) if self.timer.is_elapsed() => self.timer.as_mut().reset(at),
                Limit::CloseAt(..) | Limit::Busy(_) => {}
            }
            ready!(self.timer.as_mut().poll(cx));
            match limit {
                Limit::CloseAt(_, reason) => return Poll::Ready(reason),
                // Still busy an idle timeout ago: look again (the next look sets a later time).
                Limit::Busy(_) => {}
            }
        }
    }

    /// True once the connection is closed, by this poll or an earlier one.
    fn closes_now(&mut self, cx: &mut Context<'_>) -> bool {
        if self.closed {
            return true;
        }
        let Poll::Ready(reason) = self.poll_limit(cx) else {
            return false;
        };
        self.closed = true;
        reason.count();
        tracing::debug!(
            reason = reason.label(),
            open_for = ?self.accepted.elapsed(),
            "gRPC connection closed"
        );
        true
    }
}

fn closed_error() -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionAborted,
        "the connection passed its handshake or idle timeout",
    )
}

impl AsyncRead for GuardedConnection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.closes_now(cx) {
            // End of file: to hyper and to a TLS handshake, the client went away.
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.stream).poll_read(cx, buf))?;
        // Over TLS these bytes are encrypted: tonic's `connect_info` says when TLS is done.
        if !this.tls && !this.handshake.complete && this.handshake.feed(&buf.filled()[before..]) {
            this.activity.handshake_finished();
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for GuardedConnection {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        // Checked on writes too: a client that reads nothing leaves the task waiting to write.
        if self.closes_now(cx) {
            return Poll::Ready(Err(closed_error()));
        }
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if self.closes_now(cx) {
            return Poll::Ready(Err(closed_error()));
        }
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.closes_now(cx) {
            return Poll::Ready(Err(closed_error()));
        }
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

impl Connected for GuardedConnection {
    type ConnectInfo = ConnectionCalls;

    fn connect_info(&self) -> ConnectionCalls {
        // tonic asks once per connection: at once without TLS, and with TLS once its TLS
        // handshake is done — the handshake this layer can see the end of.
        if self.tls {
            self.activity.handshake_finished();
        }
        ConnectionCalls(Arc::clone(&self.activity))
    }
}

/// The layer that counts each call on its connection from its request until its answer is sent
/// (or dropped), so that [`GuardedConnection`] knows when the connection is idle.
pub(crate) fn track_calls() -> TrackCallsLayer {
    TrackCallsLayer
}

/// The layer [`track_calls`] returns. A named type rather than an `impl Layer`, so that the
/// server built at start-up (its type includes its layers) can be kept until it runs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TrackCallsLayer;

impl<S> tower::Layer<S> for TrackCallsLayer {
    type Service = TrackCalls<S>;

    fn layer(&self, inner: S) -> TrackCalls<S> {
        TrackCalls { inner }
    }
}

/// The service of [`track_calls`].
#[derive(Debug, Clone)]
pub(crate) struct TrackCalls<S> {
    inner: S,
}

impl<S, B> tower::Service<http::Request<B>> for TrackCalls<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let call = request
            .extensions()
            .get::<ConnectionCalls>()
            .map(ConnectionCalls::begin);
        let answer = self.inner.call(request);
        Box::pin(async move {
            let response = answer.await?;
            Ok(match call {
                Some(call) => {
                    response.map(|body| tonic::body::Body::new(AnswerBody { body, _call: call }))
                }
                None => response,
            })
        })
    }
}

/// A call's answer, holding the call in flight until it has been sent or dropped.
#[derive(Debug)]
struct AnswerBody {
    body: tonic::body::Body,
    _call: CallInFlight,
}

impl http_body::Body for AnswerBody {
    type Data = tonic::codegen::Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(payload: &[u8]) -> Vec<u8> {
        let length = u32::try_from(payload.len()).expect("a short payload");
        let mut frame = length.to_be_bytes()[1..].to_vec();
        frame.extend_from_slice(&[SETTINGS_FRAME, 0, 0, 0, 0, 0]);
        frame.extend_from_slice(payload);
        frame
    }

    #[test]
    fn every_drop_reason_is_registered_at_zero() {
        let labels = [
            DropReason::ConnectionCap,
            DropReason::HandshakeTimeout,
            DropReason::IdleTimeout,
        ]
        .map(DropReason::label);
        assert_eq!(labels, crate::metrics::CONNECTION_DROP_REASONS);
    }

    #[test]
    fn the_handshake_is_the_preface_and_a_whole_settings_frame_in_any_pieces() {
        let mut handshake = HTTP2_PREFACE.to_vec();
        handshake.extend(settings(&[0, 3, 0, 0, 0, 100, 0, 4, 0, 1, 0, 0]));
        for piece in [1, 5, 24, 33, handshake.len()] {
            let mut progress = HandshakeProgress::default();
            let mut done = Vec::new();
            for bytes in handshake.chunks(piece) {
                done.push(progress.feed(bytes));
            }
            assert_eq!(done.pop(), Some(true), "pieces of {piece}");
            assert!(done.iter().all(|done| !done), "pieces of {piece}: {done:?}");
        }
        // An empty SETTINGS frame is a whole one; what follows it changes nothing.
        let mut progress = HandshakeProgress::default();
        assert!(!progress.feed(HTTP2_PREFACE));
        assert!(progress.feed(&settings(&[])));
        assert!(progress.feed(b"more frames"));
    }

    #[test]
    fn the_preface_alone_or_other_bytes_are_no_handshake() {
        let mut progress = HandshakeProgress::default();
        assert!(!progress.feed(HTTP2_PREFACE));
        let mut progress = HandshakeProgress::default();
        assert!(!progress.feed(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n0123456789abcdef"));
        // The preface, then a frame that is not SETTINGS (a PING).
        let mut ping = HTTP2_PREFACE.to_vec();
        ping.extend_from_slice(&[0, 0, 8, 0x6, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8]);
        let mut progress = HandshakeProgress::default();
        assert!(!progress.feed(&ping));
        // A SETTINGS frame cut short.
        let mut cut = HTTP2_PREFACE.to_vec();
        cut.extend(settings(&[0, 3, 0, 0, 0, 100]));
        cut.pop();
        let mut progress = HandshakeProgress::default();
        assert!(!progress.feed(&cut));
    }

    fn limits() -> ConnectionLimits {
        ConnectionLimits {
            max_connections: 2,
            handshake_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(300),
        }
    }

    #[test]
    fn the_limit_is_the_handshake_then_idleness_counted_from_the_last_call() {
        let accepted = Instant::now();
        let activity = Arc::new(Activity {
            state: Mutex::new(ActivityState {
                handshake_done: false,
                calls_in_flight: 0,
                idle_since: accepted,
            }),
        });
        let limit = || Limit::of(&activity.state(), accepted, &limits());
        let idle = Duration::from_secs(300);
        assert_eq!(
            limit(),
            Limit::CloseAt(
                accepted + Duration::from_secs(10),
                DropReason::HandshakeTimeout
            )
        );
        activity.handshake_finished();
        let Limit::CloseAt(at, DropReason::IdleTimeout) = limit() else {
            panic!("{:?}", limit());
        };
        assert!(at >= accepted + idle && at <= Instant::now() + idle);

        let calls = ConnectionCalls(Arc::clone(&activity));
        let (first, second) = (calls.begin(), calls.begin());
        assert!(matches!(limit(), Limit::Busy(_)));
        drop(first);
        assert!(
            matches!(limit(), Limit::Busy(_)),
            "one call still in flight"
        );
        let last_call_ends = Instant::now();
        drop(second);
        let Limit::CloseAt(at, DropReason::IdleTimeout) = limit() else {
            panic!("{:?}", limit());
        };
        assert!(
            at >= last_call_ends + idle,
            "counted from the last call's end"
        );
    }

    async fn connected_pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let client = TcpStream::connect(listener.local_addr().expect("addr"));
        let (client, accepted) = tokio::join!(client, listener.accept());
        (client.expect("connect"), accepted.expect("accept").0)
    }

    /// A silent connection reads as closed at its handshake timeout; a handshaken one not before
    /// its idle timeout.
    #[tokio::test]
    async fn a_connection_reads_as_closed_once_its_limit_passes() {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let limits = ConnectionLimits {
            max_connections: 1,
            handshake_timeout: Duration::from_millis(200),
            idle_timeout: Duration::from_millis(600),
        };
        let slots = Arc::new(Semaphore::new(2));
        let (_silent, server) = connected_pair().await;
        let slot = Arc::clone(&slots).try_acquire_owned().expect("a slot");
        let mut silent = GuardedConnection::new(server, slot, limits, false);
        let started = Instant::now();
        let mut buffer = [0u8; 64];
        assert_eq!(silent.read(&mut buffer).await.expect("end of file"), 0);
        let closed = started.elapsed();
        assert!(closed >= Duration::from_millis(200), "{closed:?}");
        assert!(silent.write_all(b"x").await.is_err());
        drop(silent);
        assert_eq!(slots.available_permits(), 2, "the slot is given back");

        let (mut client, server) = connected_pair().await;
        let slot = Arc::clone(&slots).try_acquire_owned().expect("a slot");
        let mut handshaken = GuardedConnection::new(server, slot, limits, false);
        let started = Instant::now();
        client.write_all(HTTP2_PREFACE).await.expect("write");
        client.write_all(&settings(&[])).await.expect("write");
        let mut read = 0;
        loop {
            let n = handshaken.read(&mut buffer).await.expect("read");
            if n == 0 {
                break;
            }
            read += n;
        }
        let closed = started.elapsed();
        assert_eq!(read, HANDSHAKE_HEAD);
        assert!(closed >= Duration::from_millis(600), "{closed:?}");
    }
}
