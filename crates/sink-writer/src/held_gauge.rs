//! The gauge of unresolved held operations per provider target
//! (`eos_sink_held_operations_unresolved{target}`), read from `sink_held_operations`
//! (docs/architecture/held-operations.md "Held operations"). The counter says that events were
//! held; this says how many still wait for an operator, which is what an alert should stay on until
//! it is 0.
//!
//! Refreshed at start-up, after every committed batch that held an event, and every
//! `--held-refresh-interval`: an operator's `eosctl held resolve` is another process, so the sink
//! sees a resolution at the next periodic refresh.

use std::sync::Arc;
use std::time::Duration;

use metrics::gauge;
use sqlx::PgPool;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::metrics as m;

/// Sets the gauge of every target in `targets` (0 when none of its rows is unresolved) from this
/// sink's rows.
pub(crate) async fn refresh(
    pool: &PgPool,
    sink: &str,
    targets: &[String],
) -> Result<(), sqlx::Error> {
    let counts: Vec<(String, i64)> = sqlx::query_as(
        "SELECT target, count(*) FROM sink_held_operations
         WHERE sink = $1 AND resolved_at IS NULL GROUP BY target",
    )
    .bind(sink)
    .fetch_all(pool)
    .await?;
    for target in targets {
        let unresolved = counts
            .iter()
            .find(|(name, _)| name == target)
            .map_or(0, |(_, count)| *count);
        gauge!(m::HELD_UNRESOLVED, "target" => target.clone()).set(unresolved as f64);
    }
    Ok(())
}

/// Refreshes at once, then whenever `poked` (a batch held an event) or `interval` passed, until
/// `shutdown`. A failed read keeps the last values and is retried at the next refresh.
pub(crate) async fn refresh_loop(
    pool: PgPool,
    sink: String,
    targets: Vec<String>,
    interval: Duration,
    poked: Arc<Notify>,
    shutdown: CancellationToken,
) {
    if targets.is_empty() {
        return;
    }
    loop {
        if let Err(error) = refresh(&pool, &sink, &targets).await {
            tracing::warn!(%error, "cannot count the unresolved held operations; retrying at the next refresh");
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = poked.notified() => {}
            _ = tokio::time::sleep(interval) => {}
        }
    }
}
