//! A TCP proxy in front of one service that can stop passing the service's answers on. From
//! [`AnswerDroppingProxy::drop_answers`] on, what the service sends back is read and discarded
//! while requests still reach it: the service does its work (commits to its database) but its
//! callers never hear of it — what they see when a process dies after committing and before its
//! answers leave. When the service's side of a connection ends (it was SIGKILLed), the caller's
//! side is closed too, so callers see the connection break, as they would without the proxy.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context as _;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

/// A running proxy; stops (closing every connection) when dropped.
#[derive(Debug)]
pub struct AnswerDroppingProxy {
    addr: SocketAddr,
    dropping: Arc<AtomicBool>,
    accepting: JoinHandle<()>,
}

impl AnswerDroppingProxy {
    /// Listens on a free port of 127.0.0.1 and relays each connection to `upstream` (host:port).
    pub async fn start(upstream: &str) -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("cannot bind the proxy")?;
        let addr = listener.local_addr()?;
        let dropping = Arc::new(AtomicBool::new(false));
        let accepting = tokio::spawn({
            let dropping = Arc::clone(&dropping);
            let upstream = upstream.to_owned();
            async move {
                // Owned by this task, so stopping the proxy aborts every relay with it.
                let mut relays = JoinSet::new();
                while let Ok((caller, _)) = listener.accept().await {
                    relays.spawn(relay(caller, upstream.clone(), Arc::clone(&dropping)));
                    // Reap finished relays so a long run does not accumulate them.
                    while relays.try_join_next().is_some() {}
                }
            }
        });
        Ok(Self {
            addr,
            dropping,
            accepting,
        })
    }

    /// Where callers connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// From now on every byte the service sends is discarded.
    pub fn drop_answers(&self) {
        self.dropping.store(true, Ordering::SeqCst);
    }
}

impl Drop for AnswerDroppingProxy {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

/// Relays one connection until either side ends it; then both are closed.
async fn relay(caller: TcpStream, upstream: String, dropping: Arc<AtomicBool>) {
    // A service that is down refuses the connection: dropping `caller` closes it, which the
    // caller sees as the service being unavailable.
    let Ok(service) = TcpStream::connect(&upstream).await else {
        return;
    };
    let _ = caller.set_nodelay(true);
    let _ = service.set_nodelay(true);
    let (mut caller_read, mut caller_write) = caller.into_split();
    let (mut service_read, mut service_write) = service.into_split();
    let requests = async {
        let _ = tokio::io::copy(&mut caller_read, &mut service_write).await;
    };
    let answers = async {
        let mut buffer = vec![0_u8; 16 * 1024];
        loop {
            match service_read.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(read) => {
                    if dropping.load(Ordering::SeqCst) {
                        continue;
                    }
                    if caller_write.write_all(&buffer[..read]).await.is_err() {
                        return;
                    }
                }
            }
        }
    };
    tokio::select! {
        () = requests => {}
        () = answers => {}
    }
}
