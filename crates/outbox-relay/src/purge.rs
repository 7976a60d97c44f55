//! The purge task: published rows past the retention go in small batches, so the outbox does
//! not grow without bound and no statement holds long locks. Rows no relay has published are
//! never touched (`eos_outbox::relay_positions::purge_relayed`).

use std::time::Duration;

use metrics::counter;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use eos_outbox::relay_positions::purge_relayed;

use crate::metrics as m;

#[derive(Debug, Clone, Copy)]
pub struct PurgeSettings {
    /// Zero: never purge.
    pub interval: Duration,
    pub retention: Duration,
    pub batch: i64,
}

pub async fn run(pool: PgPool, settings: PurgeSettings, shutdown: CancellationToken) {
    if settings.interval.is_zero() {
        return;
    }
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(settings.interval) => {}
        }
        // Batch after batch while batches come back full, so a backlog drains between ticks.
        loop {
            match purge_relayed(&pool, settings.retention, settings.batch).await {
                Ok(purged) => {
                    counter!(m::PURGED_ROWS).increment(purged.rows);
                    if purged.rows > 0 || purged.entities > 0 {
                        debug!(
                            rows = purged.rows,
                            entities = purged.entities,
                            "purged published rows"
                        );
                    }
                    if (purged.rows as i64) < settings.batch || shutdown.is_cancelled() {
                        break;
                    }
                }
                Err(error) => {
                    warn!(%error, "purging published outbox rows failed; trying again next interval");
                    break;
                }
            }
        }
    }
}
