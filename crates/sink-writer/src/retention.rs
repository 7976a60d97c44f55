//! The optional purge of old rows (docs/architecture/retention.md "Retention and the replay
//! horizon"). The unique key is the durable identity of an event, so rows are kept by default; a
//! target may purge rows older than its `retention`, which the start-up check has already compared
//! with the replay horizon.

use std::sync::Arc;
use std::time::Duration;

use eos_runtime::batched_purge::{self, Batch};
use metrics::counter;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::metrics as m;
use crate::schema::PreparedTarget;

/// Purges at start-up (a sink restarted more often than its interval still purges), then every
/// `interval`, in chunks so a purge never holds long locks or bloats one transaction.
pub(crate) async fn purge_loop(
    pool: PgPool,
    targets: Arc<Vec<PreparedTarget>>,
    interval: Duration,
    shutdown: CancellationToken,
) {
    if targets.iter().all(|t| t.purge_sql.is_none()) {
        return;
    }
    let mut one_chunk_each = || purge_batch(&pool, &targets);
    batched_purge::drain(PURGE, &shutdown, &mut one_chunk_each).await;
    batched_purge::every(interval, PURGE, shutdown.clone(), one_chunk_each).await;
}

const PURGE: &str = "sink rows past retention";

/// One chunk from each target with a retention: full while any target still had rows to delete.
/// A failing target is logged and left for the next interval; the others go on.
async fn purge_batch(
    pool: &PgPool,
    targets: &[PreparedTarget],
) -> Result<Batch, std::convert::Infallible> {
    let mut batch = Batch::Drained;
    for target in targets {
        let (Some(sql), Some(retention)) = (&target.purge_sql, &target.spec.retention) else {
            continue;
        };
        // Dynamic: the table and its retention column are user-configured.
        match sqlx::query(sql)
            .bind(retention.keep.as_secs_f64())
            .execute(pool)
            .await
        {
            Ok(done) if done.rows_affected() > 0 => {
                counter!(m::ROWS_PURGED, "target" => target.name().to_owned())
                    .increment(done.rows_affected());
                tracing::info!(
                    table = target.name(),
                    rows = done.rows_affected(),
                    "purged rows past the retention"
                );
                batch = Batch::Full;
            }
            Ok(_) => {}
            Err(error) => {
                tracing::warn!(table = target.name(), %error, "purge failed; retrying at the next interval");
            }
        }
    }
    Ok(batch)
}
