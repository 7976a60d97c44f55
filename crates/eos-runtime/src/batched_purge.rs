//! The periodic purge every service with a retention runs (dedup-service's settled intents,
//! the outbox's published rows, the sink's rows past a target's retention): every interval,
//! batch after batch while batches come back full, so a backlog drains between ticks and no
//! statement holds long locks or bloats one transaction.

use std::fmt::Display;
use std::future::Future;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// What one purge batch did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Batch {
    /// Rows are left that are due now: purge again at once.
    Full,
    /// Nothing more is due until the next interval.
    Drained,
}

/// Runs `purge_batch` every `interval` (the first time after one interval) until `shutdown`,
/// repeating it at once while it answers [`Batch::Full`]. A failed batch is logged (naming
/// `what`) and tried again at the next interval. A zero interval never purges.
pub async fn every<F, Fut, E>(
    interval: Duration,
    what: &'static str,
    shutdown: CancellationToken,
    mut purge_batch: F,
) where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Batch, E>>,
    E: Display,
{
    if interval.is_zero() {
        return;
    }
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(interval) => {}
        }
        drain(what, &shutdown, &mut purge_batch).await;
    }
}

/// Purges batch after batch until one is not full, a batch fails, or `shutdown`.
pub async fn drain<F, Fut, E>(what: &'static str, shutdown: &CancellationToken, purge_batch: &mut F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Batch, E>>,
    E: Display,
{
    while !shutdown.is_cancelled() {
        match purge_batch().await {
            Ok(Batch::Full) => {}
            Ok(Batch::Drained) => return,
            Err(error) => {
                tracing::warn!(purge = what, %error, "purge failed; trying again at the next interval");
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn full_batches_repeat_at_once_and_a_failure_waits_for_the_next_interval() {
        let calls = Arc::new(AtomicUsize::new(0));
        let shutdown = CancellationToken::new();
        let task = tokio::spawn({
            let calls = Arc::clone(&calls);
            let shutdown = shutdown.clone();
            every(Duration::from_secs(10), "test", shutdown, move || {
                let call = calls.fetch_add(1, Ordering::SeqCst);
                async move {
                    match call {
                        0 | 1 => Ok(Batch::Full),
                        2 => Ok(Batch::Drained),
                        3 => Err("database gone"),
                        _ => Ok(Batch::Drained),
                    }
                }
            })
        });
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(
            calls.load(Ordering::SeqCst),
            0,
            "nothing before the first interval"
        );
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(
            calls.load(Ordering::SeqCst),
            3,
            "full, full, drained in one tick"
        );
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(calls.load(Ordering::SeqCst), 4, "the failure ends the tick");
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(calls.load(Ordering::SeqCst), 5);
        shutdown.cancel();
        task.await.expect("the purge task ends on shutdown");
    }
}
