//! The retention purge: deletes settled intents (and their history) whose operation occurred
//! before the retained window. Begin answers EXPIRED for exactly those operations, so purging a
//! row never re-opens its operation.

use std::time::Duration;

use eos_runtime::batched_purge::{self, Batch};
use tokio_util::sync::CancellationToken;

use crate::intent_store::IntentStore;
use crate::metrics;

const BATCH: i64 = 5_000;

/// Purges every `interval` until `shutdown`.
pub(crate) async fn run(store: IntentStore, interval: Duration, shutdown: CancellationToken) {
    batched_purge::every(interval, "settled intents past retention", shutdown, || {
        purge_batch(&store)
    })
    .await;
}

/// Deletes one batch of settled intents past retention.
async fn purge_batch(store: &IntentStore) -> Result<Batch, crate::DedupError> {
    let deleted = store.purge(BATCH).await?;
    ::metrics::counter!(metrics::PURGED).increment(deleted);
    if deleted > 0 {
        tracing::info!(deleted, "purged settled intents past retention");
    }
    Ok(if deleted < BATCH as u64 {
        Batch::Drained
    } else {
        Batch::Full
    })
}
