//! A watchdog for Kafka calls that should return within their timeout and may not.
//!
//! librdkafka does not always honour a transactional call's timeout: while the group coordinator
//! is away (its broker was SIGKILLed), `send_offsets_to_transaction` can block for good, because
//! the coordinator request's own timeout is never checked (librdkafka issue 5456, open in 2.12
//! and 2.14). A service thread stuck inside librdkafka can neither retry nor recover, and the
//! service looks alive while its partitions make no progress. A call still running this long
//! past its timeout is taken as hung: the process stops with an error, as a crash would, and its
//! restarted successor's `init_transactions` fences it and aborts its open transaction. Nothing
//! of the stuck transaction is visible to `read_committed` readers, so exactly-once holds.

use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// How often the watchdog looks.
const CHECK_INTERVAL: Duration = Duration::from_millis(500);

/// The call in progress, if any: its name and when it started.
#[derive(Debug, Default)]
pub struct CallWatch {
    current: Mutex<Option<(&'static str, Instant)>>,
}

/// Marks a call in progress until dropped.
#[derive(Debug)]
pub struct WatchedCall<'a> {
    watch: &'a CallWatch,
}

impl CallWatch {
    /// Watches `name` until the returned guard is dropped.
    pub fn enter(&self, name: &'static str) -> WatchedCall<'_> {
        if let Ok(mut current) = self.current.lock() {
            *current = Some((name, Instant::now()));
        }
        WatchedCall { watch: self }
    }

    /// The call that has been running longer than `limit`, and for how long.
    fn stuck(&self, limit: Duration) -> Option<(&'static str, Duration)> {
        let current = self.current.lock().ok()?;
        let (name, started) = (*current)?;
        let running = started.elapsed();
        (running > limit).then_some((name, running))
    }
}

impl Drop for WatchedCall<'_> {
    fn drop(&mut self) {
        if let Ok(mut current) = self.watch.current.lock() {
            *current = None;
        }
    }
}

/// Starts a thread that calls `on_stuck` once with the call's name and running time when a call
/// watched by `watch` runs longer than `limit`. The thread ends when `watch` is dropped.
pub fn spawn(
    watch: &Arc<CallWatch>,
    limit: Duration,
    on_stuck: impl FnOnce(&'static str, Duration) + Send + 'static,
) -> std::io::Result<()> {
    let watch: Weak<CallWatch> = Arc::downgrade(watch);
    std::thread::Builder::new()
        .name("kafka-call-watchdog".into())
        .spawn(move || {
            loop {
                std::thread::sleep(CHECK_INTERVAL);
                let Some(watch) = watch.upgrade() else {
                    return;
                };
                if let Some((name, running)) = watch.stuck(limit) {
                    on_stuck(name, running);
                    return;
                }
            }
        })
        .map(drop)
}

/// What a service does about a hung call: says so, then exits non-zero. The line has the shape
/// of `service_main`'s own "`<program> stopped`" error, so supervisors and log searches find it.
pub fn exit_on_stuck_call(name: &'static str, running: Duration) {
    let program = std::env::args()
        .next()
        .and_then(|path| {
            std::path::Path::new(&path)
                .file_name()
                .map(|file| file.to_string_lossy().into_owned())
        })
        .unwrap_or_else(|| "service".to_owned());
    tracing::error!(
        error = format!(
            "the Kafka call {name} has not returned for {:.0?}, past its timeout (librdkafka \
             issue 5456: a coordinator request can ignore its timeout while the coordinator is \
             away); stopping so that a restarted instance fences this one",
            running
        ),
        "{program} stopped"
    );
    std::process::exit(1);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    #[test]
    fn a_call_running_past_the_limit_is_reported_once_with_its_name() {
        let watch = Arc::new(CallWatch::default());
        let (sender, stuck) = mpsc::channel();
        spawn(&watch, Duration::from_millis(200), move |name, running| {
            let _ = sender.send((name, running));
        })
        .expect("thread");
        let call = watch.enter("send_offsets_to_transaction");
        let (name, running) = stuck
            .recv_timeout(Duration::from_secs(5))
            .expect("the watchdog reports the hung call");
        drop(call);
        assert_eq!(name, "send_offsets_to_transaction");
        assert!(running > Duration::from_millis(200), "{running:?}");
    }

    #[test]
    fn calls_that_return_in_time_are_never_reported() {
        let watch = Arc::new(CallWatch::default());
        let (sender, stuck) = mpsc::channel::<&'static str>();
        spawn(&watch, Duration::from_millis(700), move |name, _| {
            let _ = sender.send(name);
        })
        .expect("thread");
        for _ in 0..6 {
            let _call = watch.enter("commit_transaction");
            std::thread::sleep(Duration::from_millis(300));
        }
        // Idle (no call in progress) for longer than the limit is not a hung call either.
        std::thread::sleep(Duration::from_millis(1_000));
        assert!(stuck.try_recv().is_err());
    }

    #[test]
    fn the_watchdog_ends_with_its_watch() {
        let watch = Arc::new(CallWatch::default());
        let (sender, stuck) = mpsc::channel::<&'static str>();
        spawn(&watch, Duration::from_millis(100), move |name, _| {
            let _ = sender.send(name);
        })
        .expect("thread");
        drop(watch);
        // The thread saw the watch gone and returned, dropping its sender.
        assert!(matches!(
            stuck.recv_timeout(Duration::from_secs(5)),
            Err(mpsc::RecvTimeoutError::Disconnected)
        ));
    }
}
