//! The retention purge: deletes settled intents (and their history) whose operation occurred
//! before the retained window. Begin answers EXPIRED for exactly those operations, so purging a
//! row never re-opens its operation.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::intent_store::IntentStore;
use crate::metrics;

const BATCH: i64 = 5_000;

/// Purges every `interval` until `shutdown`.
pub async fn run(store: IntentStore, interval: Duration, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
        purge_once(&store, &shutdown).await;
    }
}

/// Deletes in batches until nothing is due; the number deleted.
pub async fn purge_once(store: &IntentStore, shutdown: &CancellationToken) -> u64 {
    let mut total = 0;
    while !shutdown.is_cancelled() {
        match store.purge(BATCH).await {
            Ok(deleted) => {
                total += deleted;
                ::metrics::counter!(metrics::PURGED).increment(deleted);
                if deleted < BATCH as u64 {
                    break;
                }
            }
            Err(error) => {
                tracing::warn!(%error, "purge failed; will try again");
                break;
            }
        }
    }
    if total > 0 {
        tracing::info!(deleted = total, "purged settled intents past retention");
    }
    total
}
