//! How far each relay has published, as PostgreSQL knows it, and the purge of what is behind
//! every relay. The outbox is a ledger, not a queue: relayed rows stay for a retention (to
//! audit and to replay from), then go in small batches so the table does not grow without bound.

use std::time::Duration;

use sqlx::PgExecutor;

use crate::reader::OutboxCursor;

/// The position recorded for `relay_name`, if any.
pub async fn relayed_position<'c>(
    executor: impl PgExecutor<'c>,
    relay_name: &str,
) -> Result<Option<OutboxCursor>, sqlx::Error> {
    let row = sqlx::query!(
        "SELECT order_xid, position FROM eos_outbox_relay_positions WHERE relay_name = $1",
        relay_name,
    )
    .fetch_optional(executor)
    .await?;
    Ok(row.map(|row| OutboxCursor {
        order_xid: row.order_xid,
        position: row.position,
    }))
}

/// Records that `relay_name` has published everything up to `cursor`. Never moves back.
pub async fn record_relayed<'c>(
    executor: impl PgExecutor<'c>,
    relay_name: &str,
    cursor: OutboxCursor,
) -> Result<(), sqlx::Error> {
    sqlx::query!(
        r#"INSERT INTO eos_outbox_relay_positions AS relay (relay_name, order_xid, position)
           VALUES ($1, $2, $3)
           ON CONFLICT (relay_name) DO UPDATE
              SET order_xid = excluded.order_xid, position = excluded.position, updated_at = now()
            WHERE (excluded.order_xid, excluded.position) > (relay.order_xid, relay.position)"#,
        relay_name,
        cursor.order_xid,
        cursor.position,
    )
    .execute(executor)
    .await?;
    Ok(())
}

/// What one purge pass removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Purged {
    pub rows: u64,
    pub entities: u64,
}

/// Deletes up to `batch` outbox rows that every relay has published and that were enqueued more
/// than `retention` ago, and up to `batch` entity order rows whose every event is published.
/// Nothing is deleted while no relay has recorded a position.
///
/// An entity's order row may go once all its events are behind every relay: a transaction that
/// enqueues for it later has a transaction id above every published row's order_xid (it was
/// running, or not yet started, when those rows were read), so its event still sorts after them.
pub async fn purge_relayed<'c>(
    executor: impl PgExecutor<'c> + Copy,
    retention: Duration,
    batch: i64,
) -> Result<Purged, sqlx::Error> {
    let rows = sqlx::query!(
        r#"WITH lowest AS (
               SELECT order_xid, position FROM eos_outbox_relay_positions
                ORDER BY order_xid, position LIMIT 1),
           doomed AS (
               SELECT outbox.position FROM eos_outbox AS outbox, lowest
                WHERE (outbox.order_xid, outbox.position) <= (lowest.order_xid, lowest.position)
                  AND outbox.enqueued_at < now() - make_interval(secs => $1)
                ORDER BY outbox.order_xid, outbox.position
                LIMIT $2)
           DELETE FROM eos_outbox WHERE position IN (SELECT position FROM doomed)"#,
        retention.as_secs_f64(),
        batch,
    )
    .execute(executor)
    .await?
    .rows_affected();
    let entities = sqlx::query!(
        r#"WITH lowest AS (
               SELECT order_xid FROM eos_outbox_relay_positions
                ORDER BY order_xid, position LIMIT 1),
           doomed AS (
               SELECT entity.entity_id FROM eos_outbox_entity_order AS entity, lowest
                WHERE entity.last_order_xid < lowest.order_xid
                LIMIT $1)
           DELETE FROM eos_outbox_entity_order
            WHERE entity_id IN (SELECT entity_id FROM doomed)
              AND last_order_xid < (SELECT order_xid FROM lowest)"#,
        batch,
    )
    .execute(executor)
    .await?
    .rows_affected();
    Ok(Purged { rows, entities })
}
