//! A TCP fault proxy for one network link (a service and one of its upstreams: Kafka,
//! PostgreSQL, dedup-service): it listens on 127.0.0.1, relays every connection to the upstream
//! address, and can be told, while running, to
//!
//! - add latency, separately for each direction ([`FaultProxy::set_latency`]);
//! - limit the link's bandwidth ([`FaultProxy::set_bandwidth`]);
//! - reset every open connection with an RST ([`FaultProxy::reset_connections`]);
//! - partition the link ([`FaultProxy::partition`]) until [`FaultProxy::heal`].
//!
//! A partition behaves as a real one: nothing is refused and nothing is closed. Open connections
//! stall (bytes are read and held, not forwarded, until the proxy's buffers fill and TCP flow
//! control pushes back on the sender); a new connection is accepted and held too, its upstream
//! connection made only once the partition ends. Healing lets the held bytes flow on, in order,
//! FINs included. That is what TCP does when the network comes back while neither endpoint has
//! given up on a connection (retransmission outlasts a 30-second partition by minutes), and it
//! is the harder case for exactly-once: requests sent before the partition arrive late, after
//! their sender may have timed out, retried or been fenced. An endpoint that does give up closes
//! its side, which reaches the other end after the partition as it would on a real network. The
//! connection-loss case (a middlebox forgetting the connection) is [`FaultProxy::reset_connections`].

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::tcp::{ReadHalf, WriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Mutex, mpsc, watch};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

/// Bytes read from a socket at once. Small enough that a bandwidth limit paces smoothly.
const CHUNK_BYTES: usize = 16 * 1024;
/// Chunks held per direction of a connection before the proxy stops reading (as a full TCP
/// window would): a stalled link holds at most this much per connection.
const CHUNKS_HELD: usize = 64;

/// Which way bytes travel through the proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// From the caller (the service) to the upstream (Kafka, PostgreSQL, dedup-service).
    ToUpstream,
    /// From the upstream back to the caller.
    ToCaller,
}

impl Direction {
    fn index(self) -> usize {
        match self {
            Self::ToUpstream => 0,
            Self::ToCaller => 1,
        }
    }
}

/// The faults in force; every connection watches them.
#[derive(Debug, Clone, Default)]
struct Faults {
    latency: [Duration; 2],
    /// Bytes per second per direction, for the whole link.
    bandwidth: Option<u64>,
    partitioned: bool,
    /// Bumped by every reset: a connection opened before the bump is reset.
    resets: u64,
}

/// When the link's next byte may leave, per direction, under a bandwidth limit.
#[derive(Debug)]
struct Pacing {
    next_free: [Mutex<Instant>; 2],
}

/// A running proxy (see the module docs); stops, dropping every connection, when dropped.
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    upstream: String,
    faults: watch::Sender<Faults>,
    open_connections: Arc<AtomicUsize>,
    accepting: JoinHandle<()>,
}

impl FaultProxy {
    /// Listens on a free port of 127.0.0.1 and relays each connection to `upstream`
    /// (host:port), without faults until told otherwise.
    pub async fn start(upstream: &str) -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("cannot bind the fault proxy")?;
        let addr = listener.local_addr()?;
        let (faults, _) = watch::channel(Faults::default());
        let open_connections = Arc::new(AtomicUsize::new(0));
        let link = Arc::new(Link {
            upstream: upstream.to_owned(),
            faults: faults.clone(),
            pacing: Pacing {
                next_free: [Mutex::new(Instant::now()), Mutex::new(Instant::now())],
            },
            open_connections: Arc::clone(&open_connections),
        });
        let accepting = tokio::spawn(async move {
            // Owned by this task, so stopping the proxy aborts every connection with it.
            let mut connections = JoinSet::new();
            while let Ok((caller, _)) = listener.accept().await {
                connections.spawn(Arc::clone(&link).serve(caller));
                // Reap finished connections so a long run does not accumulate them.
                while connections.try_join_next().is_some() {}
            }
        });
        Ok(Self {
            addr,
            upstream: upstream.to_owned(),
            faults,
            open_connections,
            accepting,
        })
    }

    /// Where callers connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `host:port` of [`FaultProxy::addr`], as a client setting wants it.
    pub fn endpoint(&self) -> String {
        self.addr.to_string()
    }

    /// Where the proxy relays to.
    pub fn upstream(&self) -> &str {
        &self.upstream
    }

    /// Connections relayed right now (held ones in a partition included).
    pub fn open_connections(&self) -> usize {
        self.open_connections.load(Ordering::SeqCst)
    }

    /// Every byte travelling `direction` is delivered `latency` after the proxy read it.
    pub fn set_latency(&self, direction: Direction, latency: Duration) {
        self.faults
            .send_modify(|faults| faults.latency[direction.index()] = latency);
    }

    /// At most `bytes_per_second` in each direction over the whole link; `None` lifts the limit.
    pub fn set_bandwidth(&self, bytes_per_second: Option<u64>) {
        self.faults
            .send_modify(|faults| faults.bandwidth = bytes_per_second.filter(|rate| *rate > 0));
    }

    /// Resets every open connection: both ends get an RST (SO_LINGER 0, then close).
    /// Connections made afterwards are not affected.
    pub fn reset_connections(&self) {
        self.faults.send_modify(|faults| faults.resets += 1);
    }

    /// From now on nothing crosses the link (see the module docs) until [`FaultProxy::heal`].
    pub fn partition(&self) {
        self.faults.send_modify(|faults| faults.partitioned = true);
    }

    /// Ends a partition: held bytes and held connections go on, in order.
    pub fn heal(&self) {
        self.faults.send_modify(|faults| faults.partitioned = false);
    }

    /// No latency, no bandwidth limit, no partition.
    pub fn clear(&self) {
        self.faults.send_modify(|faults| {
            faults.latency = [Duration::ZERO; 2];
            faults.bandwidth = None;
            faults.partitioned = false;
        });
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

/// What every connection of one proxy shares.
#[derive(Debug)]
struct Link {
    upstream: String,
    faults: watch::Sender<Faults>,
    pacing: Pacing,
    open_connections: Arc<AtomicUsize>,
}

/// Why a relay ended abnormally: the other side gets an RST, as it would have from the peer.
#[derive(Debug)]
struct Broken;

impl Link {
    /// Relays one caller's connection until both directions ended, or until a reset.
    async fn serve(self: Arc<Self>, mut caller: TcpStream) {
        self.open_connections.fetch_add(1, Ordering::SeqCst);
        let _ = caller.set_nodelay(true);
        let mut faults = self.faults.subscribe();
        let resets_at_start = faults.borrow().resets;
        let mut upstream: Option<TcpStream> = None;
        let outcome = tokio::select! {
            outcome = self.relay(&mut caller, &mut upstream) => outcome,
            _ = faults.wait_for(|f| f.resets != resets_at_start) => Err(Broken),
        };
        if outcome.is_err() {
            // SO_LINGER 0: close sends an RST instead of a FIN and drops unsent data.
            let _ = caller.set_zero_linger();
            if let Some(upstream) = &upstream {
                let _ = upstream.set_zero_linger();
            }
        }
        drop(caller);
        drop(upstream);
        self.open_connections.fetch_sub(1, Ordering::SeqCst);
    }

    async fn relay(
        &self,
        caller: &mut TcpStream,
        upstream: &mut Option<TcpStream>,
    ) -> Result<(), Broken> {
        let (mut caller_read, mut caller_write) = caller.split();
        let (to_upstream, to_upstream_held) = mpsc::channel(CHUNKS_HELD);
        // The caller may speak first, even while the upstream connection is held back.
        let reading_caller = read_into(&mut caller_read, to_upstream);
        let rest = async {
            self.until_open().await;
            // A refused upstream (it is down) resets the caller, as the refusal would have.
            let stream = TcpStream::connect(&self.upstream)
                .await
                .map_err(|_| Broken)?;
            let _ = stream.set_nodelay(true);
            let (mut upstream_read, mut upstream_write) = upstream.insert(stream).split();
            let (to_caller, to_caller_held) = mpsc::channel(CHUNKS_HELD);
            tokio::try_join!(
                self.write_from(to_upstream_held, &mut upstream_write, Direction::ToUpstream),
                read_into(&mut upstream_read, to_caller),
                self.write_from(to_caller_held, &mut caller_write, Direction::ToCaller),
            )
            .map(|_| ())
        };
        tokio::try_join!(reading_caller, rest).map(|_| ())
    }

    /// Waits while the link is partitioned.
    async fn until_open(&self) {
        let mut faults = self.faults.subscribe();
        let _ = faults.wait_for(|f| !f.partitioned).await;
    }

    /// Writes each held chunk to `to` once the faults let it: after its latency, within the
    /// bandwidth, outside a partition. The end of the stream (a FIN) is held the same way.
    async fn write_from(
        &self,
        mut held: mpsc::Receiver<(Instant, Vec<u8>)>,
        to: &mut WriteHalf<'_>,
        direction: Direction,
    ) -> Result<(), Broken> {
        while let Some((read_at, chunk)) = held.recv().await {
            let latency = self.faults.borrow().latency[direction.index()];
            tokio::time::sleep_until(read_at + latency).await;
            self.until_open().await;
            let bandwidth = self.faults.borrow().bandwidth;
            if let Some(rate) = bandwidth {
                let starts_at = {
                    let mut next_free = self.pacing.next_free[direction.index()].lock().await;
                    let starts_at = (*next_free).max(Instant::now());
                    *next_free =
                        starts_at + Duration::from_secs_f64(chunk.len() as f64 / rate as f64);
                    starts_at
                };
                tokio::time::sleep_until(starts_at).await;
            }
            to.write_all(&chunk).await.map_err(|_| Broken)?;
        }
        self.until_open().await;
        // The source ended cleanly: pass its FIN on. The peer may already be gone; fine.
        let _ = to.shutdown().await;
        Ok(())
    }
}

/// Reads `from` chunk by chunk into `held`, stamped with when each was read, until a clean end
/// (then `held` closes) or an error (the connection is broken). Stops reading when `held` is
/// full, which TCP turns into back-pressure on the sender.
async fn read_into(
    from: &mut ReadHalf<'_>,
    held: mpsc::Sender<(Instant, Vec<u8>)>,
) -> Result<(), Broken> {
    let mut buffer = vec![0_u8; CHUNK_BYTES];
    loop {
        let read = from.read(&mut buffer).await.map_err(|_| Broken)?;
        if read == 0 {
            return Ok(());
        }
        held.send((Instant::now(), buffer[..read].to_vec()))
            .await
            .map_err(|_| Broken)?;
    }
}

#[cfg(test)]
mod tests {
    use std::io::ErrorKind;

    use super::*;

    /// An upstream that echoes every byte back and counts the connections it accepted.
    struct Echo {
        addr: SocketAddr,
        accepted: Arc<AtomicUsize>,
        task: JoinHandle<()>,
    }

    impl Echo {
        async fn start() -> anyhow::Result<Self> {
            let listener = TcpListener::bind("127.0.0.1:0").await?;
            let addr = listener.local_addr()?;
            let accepted = Arc::new(AtomicUsize::new(0));
            let task = tokio::spawn({
                let accepted = Arc::clone(&accepted);
                async move {
                    let mut connections = JoinSet::new();
                    while let Ok((mut stream, _)) = listener.accept().await {
                        accepted.fetch_add(1, Ordering::SeqCst);
                        connections.spawn(async move {
                            let (mut read, mut write) = stream.split();
                            let _ = tokio::io::copy(&mut read, &mut write).await;
                        });
                    }
                }
            });
            Ok(Self {
                addr,
                accepted,
                task,
            })
        }
    }

    impl Drop for Echo {
        fn drop(&mut self) {
            self.task.abort();
        }
    }

    async fn proxy_to(echo: &Echo) -> anyhow::Result<FaultProxy> {
        FaultProxy::start(&echo.addr.to_string()).await
    }

    /// Sends `bytes` and reads the echo back; how long that took.
    async fn round_trip(stream: &mut TcpStream, bytes: usize) -> std::io::Result<Duration> {
        let started = Instant::now();
        let payload = vec![7_u8; bytes];
        let (mut read, mut write) = stream.split();
        let mut echoed = vec![0_u8; bytes];
        let (written, echoed) =
            tokio::join!(write.write_all(&payload), read.read_exact(&mut echoed));
        written?;
        echoed?;
        Ok(started.elapsed())
    }

    #[tokio::test]
    async fn relays_both_ways_without_faults() -> anyhow::Result<()> {
        let echo = Echo::start().await?;
        let proxy = proxy_to(&echo).await?;
        let mut stream = TcpStream::connect(proxy.addr()).await?;
        let took = round_trip(&mut stream, 100_000).await?;
        assert!(took < Duration::from_secs(2), "{took:?}");
        assert_eq!(proxy.open_connections(), 1);
        assert_eq!(proxy.upstream(), echo.addr.to_string());
        Ok(())
    }

    #[tokio::test]
    async fn latency_delays_each_direction() -> anyhow::Result<()> {
        let echo = Echo::start().await?;
        let proxy = proxy_to(&echo).await?;
        let mut stream = TcpStream::connect(proxy.addr()).await?;
        round_trip(&mut stream, 10).await?;
        proxy.set_latency(Direction::ToUpstream, Duration::from_millis(200));
        let took = round_trip(&mut stream, 10).await?;
        assert!(took >= Duration::from_millis(200), "one way: {took:?}");
        assert!(took < Duration::from_millis(390), "one way only: {took:?}");
        proxy.set_latency(Direction::ToCaller, Duration::from_millis(200));
        let took = round_trip(&mut stream, 10).await?;
        assert!(took >= Duration::from_millis(400), "both ways: {took:?}");
        proxy.clear();
        let took = round_trip(&mut stream, 10).await?;
        assert!(took < Duration::from_millis(200), "cleared: {took:?}");
        Ok(())
    }

    #[tokio::test]
    async fn bandwidth_limit_paces_the_link() -> anyhow::Result<()> {
        let echo = Echo::start().await?;
        let proxy = proxy_to(&echo).await?;
        let mut stream = TcpStream::connect(proxy.addr()).await?;
        proxy.set_bandwidth(Some(256 * 1024));
        // 384 KiB each way at 256 KiB/s: at least 1.5 s less the first chunk's free start.
        let took = round_trip(&mut stream, 384 * 1024).await?;
        assert!(took >= Duration::from_millis(1_400), "{took:?}");
        proxy.set_bandwidth(None);
        let took = round_trip(&mut stream, 384 * 1024).await?;
        assert!(took < Duration::from_millis(1_000), "unlimited: {took:?}");
        Ok(())
    }

    #[tokio::test]
    async fn reset_sends_an_rst_on_every_open_connection_only() -> anyhow::Result<()> {
        let echo = Echo::start().await?;
        let proxy = proxy_to(&echo).await?;
        let mut first = TcpStream::connect(proxy.addr()).await?;
        let mut second = TcpStream::connect(proxy.addr()).await?;
        round_trip(&mut first, 10).await?;
        round_trip(&mut second, 10).await?;
        proxy.reset_connections();
        for stream in [&mut first, &mut second] {
            let mut byte = [0_u8; 1];
            let error = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut byte))
                .await
                .expect("the reset reaches the caller")
                .expect_err("an RST, not a clean end");
            assert_eq!(error.kind(), ErrorKind::ConnectionReset);
        }
        let mut after = TcpStream::connect(proxy.addr()).await?;
        round_trip(&mut after, 10).await?;
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(proxy.open_connections(), 1);
        Ok(())
    }

    #[tokio::test]
    async fn partition_holds_open_and_new_connections_and_healing_delivers() -> anyhow::Result<()> {
        let echo = Echo::start().await?;
        let proxy = proxy_to(&echo).await?;
        let mut open = TcpStream::connect(proxy.addr()).await?;
        round_trip(&mut open, 10).await?;
        assert_eq!(echo.accepted.load(Ordering::SeqCst), 1);

        proxy.partition();
        // Nothing is refused: a new connection is accepted, but not passed on.
        let mut new = TcpStream::connect(proxy.addr()).await?;
        let stalled = tokio::time::timeout(Duration::from_millis(700), async {
            tokio::join!(round_trip(&mut open, 10), round_trip(&mut new, 10))
        })
        .await;
        assert!(stalled.is_err(), "bytes crossed a partitioned link");
        assert_eq!(
            echo.accepted.load(Ordering::SeqCst),
            1,
            "no upstream connect"
        );
        assert_eq!(proxy.open_connections(), 2);

        // Healing delivers what was held, in order, on both connections.
        proxy.heal();
        for stream in [&mut open, &mut new] {
            let mut echoed = vec![0_u8; 10];
            tokio::time::timeout(Duration::from_secs(5), stream.read_exact(&mut echoed))
                .await
                .expect("held bytes flow after healing")?;
            assert_eq!(echoed, vec![7_u8; 10]);
        }
        assert_eq!(echo.accepted.load(Ordering::SeqCst), 2);
        Ok(())
    }

    #[tokio::test]
    async fn a_caller_closing_during_a_partition_closes_upstream_after_it() -> anyhow::Result<()> {
        let echo = Echo::start().await?;
        let proxy = proxy_to(&echo).await?;
        let mut stream = TcpStream::connect(proxy.addr()).await?;
        round_trip(&mut stream, 10).await?;
        proxy.partition();
        stream.shutdown().await?;
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(proxy.open_connections(), 1, "the FIN is held");
        proxy.heal();
        // The echo server sees the FIN, ends its side, and the caller reads a clean end.
        let mut rest = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut rest))
            .await
            .expect("the close crosses after healing")?;
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(proxy.open_connections(), 0);
        Ok(())
    }

    #[tokio::test]
    async fn a_refused_upstream_resets_the_caller() -> anyhow::Result<()> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let proxy = FaultProxy::start(&format!("127.0.0.1:{port}")).await?;
        let mut stream = TcpStream::connect(proxy.addr()).await?;
        let mut byte = [0_u8; 1];
        let outcome = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut byte))
            .await
            .expect("the caller hears of the refusal");
        assert!(
            matches!(&outcome, Err(e) if e.kind() == ErrorKind::ConnectionReset),
            "{outcome:?}"
        );
        Ok(())
    }
}
