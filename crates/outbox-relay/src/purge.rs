//! The purge task: published rows past the retention go in small batches, so the outbox does
//! not grow without bound and no statement holds long locks. Rows no relay has published are
//! never touched (`eos_outbox::relay_positions::purge_relayed`).

use std::time::Duration;

use metrics::counter;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use eos_outbox::relay_positions::purge_relayed;
use eos_runtime::batched_purge::{self, Batch};

use crate::metrics as m;

#[derive(Debug, Clone, Copy)]
pub(crate) struct PurgeSettings {
    /// Zero: never purge.
    pub interval: Duration,
    pub retention: Duration,
    pub batch: i64,
}

pub(crate) async fn run(pool: PgPool, settings: PurgeSettings, shutdown: CancellationToken) {
    batched_purge::every(settings.interval, "published outbox rows", shutdown, || {
        purge_batch(&pool, settings)
    })
    .await;
}

async fn purge_batch(pool: &PgPool, settings: PurgeSettings) -> Result<Batch, sqlx::Error> {
    let purged = purge_relayed(pool, settings.retention, settings.batch).await?;
    counter!(m::PURGED_ROWS).increment(purged.rows);
    if purged.rows > 0 || purged.entities > 0 {
        debug!(
            rows = purged.rows,
            entities = purged.entities,
            "purged published rows"
        );
    }
    Ok(if (purged.rows as i64) < settings.batch {
        Batch::Drained
    } else {
        Batch::Full
    })
}
