//! The optional purge of old rows (docs/ARCHITECTURE.md "Retention and the replay horizon"). The
//! unique key is the durable identity of an event, so rows are kept by default; a target may purge
//! rows older than its `retention`, which the start-up check has already compared with the replay
//! horizon.

use std::sync::Arc;
use std::time::Duration;

use metrics::counter;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::metrics as m;
use crate::schema::PreparedTarget;

/// Deletes in chunks so a purge never holds long locks or bloats one transaction.
pub async fn purge_loop(
    pool: PgPool,
    targets: Arc<Vec<PreparedTarget>>,
    interval: Duration,
    shutdown: CancellationToken,
) {
    if targets.iter().all(|t| t.purge_sql.is_none()) {
        return;
    }
    loop {
        for target in targets.iter() {
            let (Some(sql), Some(retention)) = (&target.purge_sql, &target.spec.retention) else {
                continue;
            };
            loop {
                if shutdown.is_cancelled() {
                    return;
                }
                // Dynamic: the table and its retention column are user-configured.
                match sqlx::query(sql)
                    .bind(retention.keep.as_secs_f64())
                    .execute(&pool)
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
                    }
                    Ok(_) => break,
                    Err(error) => {
                        tracing::warn!(table = target.name(), %error, "purge failed; retrying at the next interval");
                        break;
                    }
                }
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
    }
}
