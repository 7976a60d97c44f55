//! What the demo's database says after a run: dedup-service's history, the outbox backlog.

use anyhow::Context as _;
use eos_runtime::postgres_pool::PoolBuilder;

/// (went UNKNOWN, settled out of UNKNOWN) for this run's operations, from dedup-service's history.
pub(super) async fn unknowns(
    database_url: &str,
    provider_name: &str,
) -> anyhow::Result<(i64, i64)> {
    let pool = PoolBuilder::new(1)
        .connect(database_url)
        .await
        .context("connecting to PostgreSQL for dedup-service's history")?;
    let pattern = format!("{provider_name}:%");
    let counts = sqlx::query!(
        r#"SELECT count(*) FILTER (WHERE to_state = 'UNKNOWN') AS "into_unknown!",
                  count(*) FILTER (WHERE from_state = 'UNKNOWN') AS "out_of_unknown!"
             FROM dedup_intent_history WHERE operation_id LIKE $1"#,
        pattern,
    )
    .fetch_one(&pool)
    .await?;
    pool.close().await;
    Ok((counts.into_unknown, counts.out_of_unknown))
}

/// Outbox rows `relay_name` has not published yet (0 once it has caught up).
pub(super) async fn outbox_backlog(database_url: &str, relay_name: &str) -> anyhow::Result<i64> {
    let pool = PoolBuilder::new(1)
        .connect(database_url)
        .await
        .context("connecting to PostgreSQL for the outbox")?;
    let backlog = sqlx::query_scalar::<_, i64>(
        "SELECT count(*) FROM eos_outbox AS row
          WHERE NOT EXISTS (SELECT 1 FROM eos_outbox_relay_positions AS relayed
                             WHERE relayed.relay_name = $1
                               AND (row.order_xid, row.position)
                                   <= (relayed.order_xid, relayed.position))",
    )
    .bind(relay_name)
    .fetch_one(&pool)
    .await?;
    pool.close().await;
    Ok(backlog)
}

/// Drops outbox-relay's replication slot `slot` if it exists (the logical mode's; none in xmin
/// mode).
pub(super) async fn drop_relay_slot(database_url: &str, slot: &str) -> anyhow::Result<()> {
    let pool = PoolBuilder::new(1)
        .connect(database_url)
        .await
        .context("connecting to PostgreSQL for the relay's slot")?;
    sqlx::query(
        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots
          WHERE slot_name = $1 AND NOT active",
    )
    .bind(slot)
    .execute(&pool)
    .await?;
    pool.close().await;
    Ok(())
}
