//! Writes a batch's rows into the targets, and its conflicts and dead letters into the sink's
//! own tables — each as one statement per batch (text arrays through `UNNEST`), never a statement
//! per row. (A second statement per target only when another writer inserted a key between this
//! batch's read and its write.)

use std::collections::{HashMap, HashSet};

use eos_core::dead_letter::{MAX_DETAIL_BYTES, truncate_with_marker};
use sqlx::PgConnection;

use crate::batch_plan::{Candidate, Stored};
use crate::schema::PreparedTarget;

/// What was stored under a candidate's key before the write, as the database compared it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredRow {
    pub stored: Stored,
    /// The stored row as JSON text.
    pub row: String,
    pub fingerprint: Option<String>,
}

/// Result of one target's write.
#[derive(Debug, Default)]
pub struct TargetWrite {
    /// By candidate index: the row stored under its key before this batch.
    pub stored: HashMap<usize, StoredRow>,
    /// Keys inserted or (versioned) updated.
    pub applied: HashSet<String>,
}

/// A row stored now under a key, for a winner another writer got in before.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LateRow {
    pub row: String,
    pub content_differs: bool,
    pub same_version: bool,
    pub fingerprint: Option<String>,
}

fn column_arrays<'a>(
    rows: impl Iterator<Item = &'a Candidate>,
    columns: usize,
) -> Vec<Vec<Option<String>>> {
    let mut arrays: Vec<Vec<Option<String>>> = vec![Vec::new(); columns];
    for candidate in rows {
        for (array, value) in arrays.iter_mut().zip(&candidate.row.values) {
            array.push(value.clone());
        }
    }
    arrays
}

type WriteRow = (
    Option<i64>,
    Option<String>,
    Option<bool>,
    Option<i64>,
    Option<String>,
    Option<String>,
);

/// One statement: what is stored under every candidate's key (before the write), and the write
/// of the rows flagged in `send`.
pub async fn write_target(
    conn: &mut PgConnection,
    target: &PreparedTarget,
    candidates: &[Candidate],
    send: &[bool],
) -> Result<TargetWrite, sqlx::Error> {
    let mut result = TargetWrite::default();
    if candidates.is_empty() {
        return Ok(result);
    }
    let mut write = sqlx::query_as::<_, WriteRow>(&target.write_sql);
    for array in column_arrays(candidates.iter(), target.shape.columns.len()) {
        write = write.bind(array);
    }
    write = write.bind(send.to_vec());
    for (ord, row, differs, version, fingerprint, written) in write.fetch_all(&mut *conn).await? {
        if let Some(key) = written {
            result.applied.insert(key);
            continue;
        }
        // WITH ORDINALITY counts from 1.
        let Some(index) = ord.and_then(|o| usize::try_from(o - 1).ok()) else {
            continue;
        };
        result.stored.insert(
            index,
            StoredRow {
                stored: Stored {
                    version,
                    differs: differs.unwrap_or(true),
                },
                row: row.unwrap_or_default(),
                fingerprint,
            },
        );
    }
    Ok(result)
}

/// The rows stored now under the keys of `late` winners (another writer got in first).
pub async fn compare_late(
    conn: &mut PgConnection,
    target: &PreparedTarget,
    late: &[&Candidate],
) -> Result<HashMap<String, LateRow>, sqlx::Error> {
    let mut rows = HashMap::new();
    if late.is_empty() {
        return Ok(rows);
    }
    let mut compare =
        sqlx::query_as::<_, (String, String, bool, bool, Option<String>)>(&target.compare_sql);
    for array in column_arrays(late.iter().copied(), target.shape.columns.len()) {
        compare = compare.bind(array);
    }
    for (key, row, content_differs, same_version, fingerprint) in
        compare.fetch_all(&mut *conn).await?
    {
        rows.insert(
            key,
            LateRow {
                row,
                content_differs,
                same_version,
                fingerprint,
            },
        );
    }
    Ok(rows)
}

/// One `sink_conflicts` row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConflictRow {
    pub target: String,
    pub key: String,
    pub event_id: String,
    pub reason: String,
    pub stored_fingerprint: Option<String>,
    pub incoming_fingerprint: String,
    pub stored_row: Option<String>,
    /// JSON text; `None` when it cannot be stored as jsonb (a `\u0000` in a string).
    pub incoming_record: Option<String>,
    pub detail: String,
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
}

/// Conflicts are keyed by source position, so a replay (`--offsets kafka`) does not repeat one.
pub async fn insert_conflicts(
    conn: &mut PgConnection,
    sink: &str,
    conflicts: &[ConflictRow],
) -> Result<(), sqlx::Error> {
    if conflicts.is_empty() {
        return Ok(());
    }
    let text = |f: fn(&ConflictRow) -> String| conflicts.iter().map(f).collect::<Vec<_>>();
    let optional =
        |f: fn(&ConflictRow) -> Option<String>| conflicts.iter().map(f).collect::<Vec<_>>();
    sqlx::query!(
        "INSERT INTO sink_conflicts (sink, target, key, event_id, reason, stored_fingerprint,
             incoming_fingerprint, stored_row, incoming_record, detail, source_topic,
             source_partition, source_offset)
         SELECT $1, u.target, u.key, u.event_id, u.reason, u.sfp, u.ifp, u.srow::jsonb,
                u.irec::jsonb, u.detail, u.topic, u.part, u.off
         FROM UNNEST($2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[],
                     $8::text[], $9::text[], $10::text[], $11::text[], $12::int[], $13::bigint[])
              AS u(target, key, event_id, reason, sfp, ifp, srow, irec, detail, topic, part, off)
         ON CONFLICT (sink, target, source_topic, source_partition, source_offset) DO NOTHING",
        sink,
        &text(|c| c.target.clone()),
        &text(|c| c.key.clone()),
        &text(|c| c.event_id.clone()),
        &text(|c| c.reason.clone()),
        &optional(|c| c.stored_fingerprint.clone()) as &[Option<String>],
        &text(|c| c.incoming_fingerprint.clone()),
        &optional(|c| c.stored_row.clone()) as &[Option<String>],
        &optional(|c| c.incoming_record.clone()) as &[Option<String>],
        &text(|c| c.detail.clone()),
        &text(|c| c.topic.clone()),
        &conflicts.iter().map(|c| c.partition).collect::<Vec<_>>(),
        &conflicts.iter().map(|c| c.offset).collect::<Vec<_>>(),
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// One `sink_held_operations` row: an event whose provider operation is stuck UNKNOWN.
#[derive(Debug, Clone)]
pub struct HeldRow {
    pub target: String,
    pub operation_id: String,
    pub event_id: String,
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub reason: String,
}

/// Records held events in the batch's transaction. A replay of the same records (`--offsets
/// kafka`) finds their rows and adds nothing.
pub async fn insert_held(
    conn: &mut PgConnection,
    sink: &str,
    held: &[HeldRow],
) -> Result<(), sqlx::Error> {
    if held.is_empty() {
        return Ok(());
    }
    let text = |f: fn(&HeldRow) -> String| held.iter().map(f).collect::<Vec<_>>();
    sqlx::query(
        "INSERT INTO sink_held_operations (sink, target, operation_id, event_id, source_topic,
             source_partition, source_offset, reason)
         SELECT $1, u.target, u.operation_id, u.event_id, u.topic, u.part, u.off, u.reason
         FROM UNNEST($2::text[], $3::text[], $4::text[], $5::text[], $6::int[], $7::bigint[],
                     $8::text[])
              AS u(target, operation_id, event_id, topic, part, off, reason)
         ON CONFLICT (sink, target, source_topic, source_partition, source_offset) DO NOTHING",
    )
    .bind(sink)
    .bind(text(|h| h.target.clone()))
    .bind(text(|h| h.operation_id.clone()))
    .bind(text(|h| h.event_id.clone()))
    .bind(text(|h| h.topic.clone()))
    .bind(held.iter().map(|h| h.partition).collect::<Vec<_>>())
    .bind(held.iter().map(|h| h.offset).collect::<Vec<_>>())
    .bind(text(|h| h.reason.clone()))
    .execute(conn)
    .await?;
    Ok(())
}

/// One `sink_dead_letters` row (the Kafka dead letter is produced before the commit).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetterRow {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub reason: String,
    pub detail: String,
}

pub async fn insert_dead_letters(
    conn: &mut PgConnection,
    sink: &str,
    dlq_topic: &str,
    dead_letters: &[DeadLetterRow],
) -> Result<(), sqlx::Error> {
    if dead_letters.is_empty() {
        return Ok(());
    }
    let text = |f: fn(&DeadLetterRow) -> String| dead_letters.iter().map(f).collect::<Vec<_>>();
    sqlx::query!(
        "INSERT INTO sink_dead_letters (sink, source_topic, source_partition, source_offset,
             reason, detail, dlq_topic)
         SELECT $1, u.topic, u.part, u.off, u.reason, u.detail, $2
         FROM UNNEST($3::text[], $4::int[], $5::bigint[], $6::text[], $7::text[])
              AS u(topic, part, off, reason, detail)
         ON CONFLICT (sink, source_topic, source_partition, source_offset) DO NOTHING",
        sink,
        dlq_topic,
        &text(|d| d.topic.clone()),
        &dead_letters.iter().map(|d| d.partition).collect::<Vec<_>>(),
        &dead_letters.iter().map(|d| d.offset).collect::<Vec<_>>(),
        &text(|d| d.reason.clone()),
        // Bounded like the Kafka dead letter's detail header: a detail quoting a huge value (a
        // database error, say) must not make the row itself a problem.
        &text(|d| truncate_with_marker(&d.detail, MAX_DETAIL_BYTES).into_owned()),
    )
    .execute(conn)
    .await?;
    Ok(())
}
