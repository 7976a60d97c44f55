//! `sink_checkpoints`: the input positions in `--offsets postgres` mode, and the owner epoch that
//! fences a zombie: fence first, then read the checkpoint.
//!
//! Why this is enough: every batch transaction starts by updating its partitions' rows *with the
//! owner epoch it was given* (`WHERE owner_epoch = mine`). That update takes the row lock, so a new
//! owner's fence waits for a batch in flight to commit or roll back, then bumps the epoch, and
//! only then reads `next_offset` — which therefore includes every batch the old owner committed.
//! From then on the old owner's update matches no row: it rolls back and stops.

use std::collections::HashMap;

use eos_core::Checkpoint;
use sqlx::{PgConnection, PgPool};

/// Bumps the owner epoch of `partitions` (creating their rows on first use) in its own
/// transaction, and returns the new epoch of each. Waits at most `lock_timeout` for a batch in
/// flight to release a row. The new epoch is [`crate::checkpoint_rule::fenced_epoch`] of the row's; the
/// statement repeats that rule in SQL, and `integration-tests`' `sink_rules` checks the two agree.
pub async fn fence(
    pool: &PgPool,
    sink: &str,
    topic: &str,
    partitions: &[i32],
    owner: &str,
) -> Result<HashMap<i32, i64>, sqlx::Error> {
    let mut tx = pool.begin().await?;
    // A zombie frozen inside its transaction must not block a new owner forever: give up after
    // a while and retry, polling Kafka in between.
    sqlx::query!("SET LOCAL lock_timeout = '5s'")
        .execute(&mut *tx)
        .await?;
    let rows = sqlx::query!(
        "INSERT INTO sink_checkpoints (sink, topic, partition, owner_epoch, owner)
         SELECT $1, $2, p, 1, $4 FROM UNNEST($3::int[]) AS p
         ON CONFLICT (sink, topic, partition) DO UPDATE
             SET owner_epoch = sink_checkpoints.owner_epoch + 1,
                 owner = EXCLUDED.owner,
                 updated_at = now()
         RETURNING partition, owner_epoch",
        sink,
        topic,
        partitions,
        owner,
    )
    .fetch_all(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(rows
        .into_iter()
        .map(|row| (row.partition, row.owner_epoch))
        .collect())
}

/// The committed checkpoint of each of `partitions` that has one (none: nothing committed yet).
/// Read after [`fence`], never before.
pub async fn read(
    pool: &PgPool,
    sink: &str,
    topic: &str,
    partitions: &[i32],
) -> Result<Vec<Checkpoint>, sqlx::Error> {
    let rows = sqlx::query!(
        "SELECT partition, next_offset FROM sink_checkpoints
         WHERE sink = $1 AND topic = $2 AND partition = ANY($3::int[])",
        sink,
        topic,
        partitions,
    )
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .filter_map(|row| {
            Some(Checkpoint {
                topic: topic.to_owned(),
                partition: row.partition,
                next_offset: row.next_offset?,
            })
        })
        .collect())
}

/// A checkpoint move of one batch: the new position, under the epoch this owner holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Move {
    pub to: Checkpoint,
    pub epoch: i64,
}

/// Moves the checkpoints inside the batch transaction; returns the partitions whose epoch still
/// matched ([`crate::checkpoint_rule::may_advance`], which the `WHERE` repeats in SQL; `sink_rules` in
/// `integration-tests` checks the two agree). A partition missing from the result
/// ([`crate::checkpoint_rule::fenced_partitions`]) means this instance was fenced.
pub async fn advance(
    conn: &mut PgConnection,
    sink: &str,
    moves: &[Move],
) -> Result<Vec<i32>, sqlx::Error> {
    let topics: Vec<&str> = moves.iter().map(|m| m.to.topic.as_str()).collect();
    let partitions: Vec<i32> = moves.iter().map(|m| m.to.partition).collect();
    let offsets: Vec<i64> = moves.iter().map(|m| m.to.next_offset).collect();
    let epochs: Vec<i64> = moves.iter().map(|m| m.epoch).collect();
    sqlx::query_scalar!(
        "UPDATE sink_checkpoints AS c
         SET next_offset = m.next_offset, updated_at = now()
         FROM UNNEST($2::text[], $3::int[], $4::bigint[], $5::bigint[])
             AS m(topic, partition, next_offset, epoch)
         WHERE c.sink = $1 AND c.topic = m.topic AND c.partition = m.partition
           AND c.owner_epoch = m.epoch
         RETURNING c.partition",
        sink,
        &topics as &[&str],
        &partitions,
        &offsets,
        &epochs,
    )
    .fetch_all(conn)
    .await
}
