//! Writes a batch's rows into the targets, and its conflicts and dead letters into the sink's
//! own tables — a few statements per batch, never a statement per row. A target's rows: a probe
//! of the keys, one `COPY` of the rows of fresh keys, one `UNNEST` statement for the keys already
//! stored (see [`write_target`]). The sink's own tables: text arrays through `UNNEST`. (One more
//! statement per target only when another writer inserted a key between this batch's read and
//! its write.)

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;

use eos_core::dead_letter::{MAX_DETAIL_BYTES, truncate_with_marker};
use sqlx::PgConnection;
use tracing::debug;

use crate::batch_plan::{Candidate, Stored};
use crate::error::{DbErrorClass, db_error_class};
use crate::schema::PreparedTarget;
use crate::targets::TargetKind;

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

/// How a batch's rows travel to the database. The sink uses [`WritePath::CopyFresh`]; the others
/// are kept so the bench can compare them on the same rows (docs/BENCHMARKS-sink.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WritePath {
    /// A probe of the keys, text `COPY` of the rows whose key nothing is stored under, and the
    /// `UNNEST` statement for the rest.
    CopyFresh,
    /// Every row through the one `UNNEST` statement (`write_sql`).
    Unnest,
}

impl WritePath {
    pub const ALL: [WritePath; 2] = [Self::CopyFresh, Self::Unnest];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::CopyFresh => "copy-fresh",
            Self::Unnest => "unnest",
        }
    }
}

/// What is stored under every candidate's key (before the write), and the write of the rows
/// flagged in `send` — the sink's write path, [`WritePath::CopyFresh`].
pub async fn write_target(
    conn: &mut PgConnection,
    target: &PreparedTarget,
    candidates: &[Candidate],
    send: &[bool],
) -> Result<TargetWrite, sqlx::Error> {
    write_target_via(conn, target, candidates, send, WritePath::CopyFresh).await
}

/// [`write_target`] by the given path; every path gives the same result.
pub async fn write_target_via(
    conn: &mut PgConnection,
    target: &PreparedTarget,
    candidates: &[Candidate],
    send: &[bool],
    path: WritePath,
) -> Result<TargetWrite, sqlx::Error> {
    if candidates.is_empty() {
        return Ok(TargetWrite::default());
    }
    let all: Vec<usize> = (0..candidates.len()).collect();
    match path {
        WritePath::CopyFresh => write_copy_fresh(conn, target, candidates, send).await,
        WritePath::Unnest => write_unnest(conn, target, candidates, send, &all).await,
    }
}

/// `COPY` cannot skip a row whose key is taken, but it writes rows several times faster than an
/// `INSERT … ON CONFLICT` (PostgreSQL inserts them in bulk, not one speculative insertion each).
/// So, for an append target, the winners are first copied as they are. When that is refused (a
/// key is stored: a replay), and always for a versioned target (its keys are mostly stored), a
/// probe finds the candidates whose key is stored; for those the `UNNEST` statement's
/// comparison classifies duplicates and conflicts (an append target: the comparison alone, as
/// `ON CONFLICT DO NOTHING` would write none of them; a versioned one: with its upsert); the
/// winners of the other keys are copied in one `COPY`, in a savepoint. Nothing was stored under
/// those keys when the probe ran, so `COPY` inserts exactly what `ON CONFLICT` would have — unless
/// another writer inserted one of them since, or PostgreSQL refuses a row: then the `COPY` fails
/// whole, the savepoint undoes it, and those keys go through the `UNNEST` statement instead, which
/// sees the other writer's row (or fails the same way, and the batch writer isolates the refused
/// record).
async fn write_copy_fresh(
    conn: &mut PgConnection,
    target: &PreparedTarget,
    candidates: &[Candidate],
    send: &[bool],
) -> Result<TargetWrite, sqlx::Error> {
    let winners: Vec<usize> = (0..candidates.len()).filter(|&i| send[i]).collect();
    // After a refusal, probe first until a probe finds nothing stored: a replay comes in runs of
    // batches, and a refused `COPY` costs more than a probe.
    let replaying = target.replaying.load(Ordering::Relaxed);
    if target.spec.kind == TargetKind::Append && !winners.is_empty() && !replaying {
        // A stream of new events (the usual case) needs no probe: if the `COPY` of every winner
        // goes through, nothing was stored under any of their keys — what the probe would have
        // said. A replay fails it, and takes the probe's way.
        match copy_rows(conn, target, candidates, &winners).await {
            Ok(()) => {
                let mut result = TargetWrite::default();
                result
                    .applied
                    .extend(winners.iter().map(|&i| candidates[i].row.key.clone()));
                return Ok(result);
            }
            Err(error) if db_error_class(&error) == DbErrorClass::Data => {
                debug!(target = target.name(), %error, "COPY refused; probing the keys");
                target.replaying.store(true, Ordering::Relaxed);
            }
            Err(error) => return Err(error),
        }
    }
    let keys: Vec<&str> = candidates.iter().map(|c| c.row.key.as_str()).collect();
    let positions: Vec<i64> = sqlx::query_scalar(&target.probe_sql)
        .bind(&keys)
        .fetch_all(&mut *conn)
        .await?;
    // WITH ORDINALITY counts from 1.
    let stored_keys: HashSet<&str> = positions
        .iter()
        .filter_map(|&ord| usize::try_from(ord - 1).ok())
        .filter_map(|i| keys.get(i).copied())
        .collect();
    if stored_keys.is_empty() {
        target.replaying.store(false, Ordering::Relaxed);
    }
    let (stored, mut fresh): (Vec<usize>, Vec<usize>) =
        (0..candidates.len()).partition(|&i| stored_keys.contains(keys[i]));
    let mut result = TargetWrite::default();
    if !stored.is_empty() {
        let write = match target.spec.kind {
            TargetKind::Versioned => write_unnest(conn, target, candidates, send, &stored).await?,
            TargetKind::Append => {
                let read = read_stored(conn, target, candidates, &stored).await?;
                // A key deleted since the probe is fresh again: its winner is copied.
                let vanished: HashSet<&str> = stored
                    .iter()
                    .filter(|&&i| !read.stored.contains_key(&i))
                    .map(|&i| keys[i])
                    .collect();
                fresh.extend(stored.iter().filter(|&&i| vanished.contains(keys[i])));
                fresh.sort_unstable();
                read
            }
        };
        result.merge(write);
    }
    let rows: Vec<usize> = fresh.iter().copied().filter(|&i| send[i]).collect();
    if rows.is_empty() {
        return Ok(result);
    }
    match copy_rows(conn, target, candidates, &rows).await {
        Ok(()) => {
            result
                .applied
                .extend(rows.iter().map(|&i| candidates[i].row.key.clone()));
        }
        Err(error) if db_error_class(&error) == DbErrorClass::Data => {
            debug!(
                target = target.name(),
                %error,
                "COPY of fresh keys refused; writing them with ON CONFLICT instead"
            );
            let write = write_unnest(conn, target, candidates, send, &fresh).await?;
            result.merge(write);
        }
        Err(error) => return Err(error),
    }
    Ok(result)
}

/// The rows `rows` (indices into `candidates`) by text `COPY`, in key order (so concurrent
/// writers take key locks in the same order), in a savepoint undone if PostgreSQL refuses them.
async fn copy_rows(
    conn: &mut PgConnection,
    target: &PreparedTarget,
    candidates: &[Candidate],
    rows: &[usize],
) -> Result<(), sqlx::Error> {
    let mut ordered: Vec<&Candidate> = rows.iter().map(|&i| &candidates[i]).collect();
    ordered.sort_by(|a, b| a.row.key.cmp(&b.row.key));
    let mut data = Vec::with_capacity(rows.len() * 256);
    for candidate in ordered {
        push_copy_text_row(&candidate.row.values, target.now_columns, &mut data);
    }
    let mut savepoint = sqlx::Connection::begin(&mut *conn).await?;
    let copied = async {
        let mut copy = savepoint.copy_in_raw(&target.copy_sql).await?;
        copy.send(data).await?;
        copy.finish().await
    }
    .await;
    match copied {
        Ok(_) => savepoint.commit().await,
        Err(error) => {
            savepoint.rollback().await?;
            Err(error)
        }
    }
}

/// One line of `COPY … FROM STDIN` text format: the values tab-separated, NULL as `\N`, then
/// `now` for each `now` column.
fn push_copy_text_row(values: &[Option<String>], now_columns: usize, out: &mut Vec<u8>) {
    let fields = values
        .iter()
        .map(|value| value.as_deref())
        .chain(std::iter::repeat_n(Some("now"), now_columns));
    for (i, value) in fields.enumerate() {
        if i > 0 {
            out.push(b'\t');
        }
        match value {
            None => out.extend_from_slice(b"\\N"),
            Some(text) => push_copy_text(text, out),
        }
    }
    out.push(b'\n');
}

/// A value escaped for `COPY` text format: backslash and the delimiters. Byte by byte is safe in
/// UTF-8: these bytes never occur inside a multi-byte character.
fn push_copy_text(text: &str, out: &mut Vec<u8>) {
    for byte in text.bytes() {
        match byte {
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'\t' => out.extend_from_slice(b"\\t"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            other => out.push(other),
        }
    }
}

/// The `UNNEST` statement over the candidates `subset` (indices into `candidates`).
async fn write_unnest(
    conn: &mut PgConnection,
    target: &PreparedTarget,
    candidates: &[Candidate],
    send: &[bool],
    subset: &[usize],
) -> Result<TargetWrite, sqlx::Error> {
    let mut write = sqlx::query_as::<_, WriteRow>(&target.write_sql);
    for array in column_arrays(
        subset.iter().map(|&i| &candidates[i]),
        target.shape.columns.len(),
    ) {
        write = write.bind(array);
    }
    write = write.bind(subset.iter().map(|&i| send[i]).collect::<Vec<_>>());
    let rows = write.fetch_all(&mut *conn).await?;
    Ok(TargetWrite::from_rows(rows, subset))
}

/// What is stored under the keys of the candidates `subset`, without writing (`read_stored_sql`).
async fn read_stored(
    conn: &mut PgConnection,
    target: &PreparedTarget,
    candidates: &[Candidate],
    subset: &[usize],
) -> Result<TargetWrite, sqlx::Error> {
    let mut read = sqlx::query_as::<_, WriteRow>(&target.read_stored_sql);
    for array in column_arrays(
        subset.iter().map(|&i| &candidates[i]),
        target.shape.columns.len(),
    ) {
        read = read.bind(array);
    }
    let rows = read.fetch_all(&mut *conn).await?;
    Ok(TargetWrite::from_rows(rows, subset))
}

impl TargetWrite {
    /// From the rows of the write statement run over `subset` (indices into the batch's
    /// candidates, in the order they were sent).
    fn from_rows(rows: Vec<WriteRow>, subset: &[usize]) -> Self {
        let mut result = Self::default();
        for (ord, row, differs, version, fingerprint, written) in rows {
            if let Some(key) = written {
                result.applied.insert(key);
                continue;
            }
            // WITH ORDINALITY counts from 1.
            let Some(index) = ord
                .and_then(|o| usize::try_from(o - 1).ok())
                .and_then(|o| subset.get(o).copied())
            else {
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
        result
    }

    fn merge(&mut self, other: Self) {
        self.stored.extend(other.stored);
        self.applied.extend(other.applied);
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_text_escapes_the_delimiters_and_writes_null_and_now() {
        let mut out = Vec::new();
        push_copy_text_row(
            &[
                Some("a\tb\nc\rd\\e".into()),
                None,
                Some("{\"k\": \"é\\\\n\"}".into()),
                Some(String::new()),
            ],
            1,
            &mut out,
        );
        assert_eq!(
            String::from_utf8(out).expect("utf-8"),
            "a\\tb\\nc\\rd\\\\e\t\\N\t{\"k\": \"é\\\\\\\\n\"}\t\tnow\n"
        );
    }
}
