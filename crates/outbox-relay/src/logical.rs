//! The logical mode's source (docs/architecture/outbox.md): the outbox table's inserts in commit
//! order, decoded by `pgoutput` from a logical replication slot. Reads go through a replication
//! session on the slot (`logical_stream`: each change decoded once, as the WAL is written); the
//! first start's pass over the rows that were in the table before the slot existed peeks the slot
//! through the SQL interface (`pg_logical_slot_peek_binary_changes`), with no session open. Only
//! each insert's `position` is taken from the WAL; the rows are then loaded from the table, so
//! `eos_outbox_enqueue` and everything that reads the table stay as they are.
//!
//! The slot moves only to a position Kafka has committed (the session's standby status updates,
//! or `pg_replication_slot_advance` while no session is open), so a crash anywhere decodes again
//! what Kafka may not hold. A slot that lags behind Kafka's position is harmless: transactions
//! whose commit record starts before the position are skipped, exactly as PostgreSQL skips them
//! for a session started at that position.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use eos_runtime::backoff::{BackoffBuilder as _, ExponentialBackoff, doubling};

use futures::future::BoxFuture;
use sqlx::{PgPool, Row as _};
use tokio::sync::Mutex;

use eos_outbox::{OutboxCursor, OutboxRow, read_positions, read_visible_after};

use crate::error::RelayError;
use crate::logical_stream::{ReplicationTarget, WalStream, session_goes_on};
use crate::outbox_reader::OutboxReader;
use crate::pgoutput::Lsn;
use crate::position_topic::RelayPosition;
use crate::txn_assembler::OUTBOX_TABLE;
pub use crate::txn_assembler::{Decoded, DecodedTxn, TxnAssembler};

/// How long the first start waits for the WAL it read to be flushed (an asynchronous commit is
/// flushed within three `wal_writer_delay`s).
const FLUSH_WAIT: Duration = Duration::from_secs(30);
/// How long a stream read waits for the WAL's marks (a pool connection, one query) before it
/// reads without them: a server shutting down refuses connections, and waits for the session.
const MARKS_WAIT: Duration = Duration::from_millis(500);
/// How long a stream read may wait on PostgreSQL to load its rows with the replication session
/// kept open (`read_stream`).
const SESSION_HELD_AT_MOST: Duration = Duration::from_secs(2);
/// How long a decoded row may stay invisible (its transaction committed in the WAL, not yet in
/// the snapshots: a synchronous standby's confirmation) before the relay stops.
const VISIBLE_WAIT: Duration = Duration::from_secs(60);

/// What `pg_replication_slots` says of the slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotState {
    pub plugin: Option<String>,
    pub database: Option<String>,
    pub confirmed_flush: Option<Lsn>,
    /// `reserved`, `extended`, `unreserved` or `lost` (invalidated: its WAL is gone).
    pub wal_status: Option<String>,
    /// WAL the slot keeps from being recycled: the current WAL position minus its restart_lsn.
    pub retained_bytes: Option<i64>,
}

/// Where the WAL and the server's transactions were at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WalMarks {
    /// The snapshot's xmin: every transaction below it has ended.
    pub xmin: i64,
    /// Read after `xmin`: every transaction below `xmin` wrote its commit record before it.
    pub insert_lsn: Lsn,
    /// Read after `insert_lsn`: the end of the WAL a peek can decode.
    pub flush_lsn: Lsn,
}

pub use crate::outbox_reader::{OutboxRead, PurgeMark};

#[derive(Debug, Clone)]
pub struct LogicalSource {
    pool: PgPool,
    slot: String,
    publication: String,
    target: ReplicationTarget,
    /// PostgreSQL lets one backend at a time use a slot: the SQL calls on it (the first start's
    /// peeks, advances while no session is open) take turns, and a session is closed before
    /// them. It guards the slot's confirmed position as this relay last set or read it (`None`:
    /// not known yet); nothing else moves the slot while the relay holds it.
    slot_lock: Arc<Mutex<Option<Lsn>>>,
    /// The replication session the reads go on with (`None`: none open, or a read was cut off
    /// and the next starts a new one).
    stream: Arc<Mutex<Option<WalStream>>>,
    /// The highest position Kafka has committed that this relay was told of: what a session
    /// may confirm.
    committed: Arc<AtomicU64>,
}

fn slot_error(slot: &str, detail: impl Into<String>) -> RelayError {
    RelayError::Slot {
        slot: slot.to_owned(),
        detail: detail.into(),
    }
}

impl LogicalSource {
    pub fn new(pool: PgPool, slot: String, publication: String, target: ReplicationTarget) -> Self {
        Self {
            pool,
            slot,
            publication,
            target,
            slot_lock: Arc::new(Mutex::new(None)),
            stream: Arc::new(Mutex::new(None)),
            committed: Arc::new(AtomicU64::new(0)),
        }
    }

    pub fn slot(&self) -> &str {
        &self.slot
    }

    /// Ends the session holding the slot, when it is not this relay's: called once Kafka has
    /// confirmed that this relay owns its name, so that session belongs to a fenced relay or a
    /// dead one. Returns the ended backend's pid. A role may end its own sessions; ending another
    /// role's needs pg_signal_backend, and without it this is a warning and the wait goes on.
    pub async fn end_foreign_session(&self) -> Result<Option<i32>, RelayError> {
        let ended: Option<(i32, bool)> = sqlx::query_as(
            "SELECT active_pid, pg_terminate_backend(active_pid) FROM pg_replication_slots \
              WHERE slot_name = $1 AND active_pid IS NOT NULL AND active_pid <> pg_backend_pid()",
        )
        .bind(&self.slot)
        .fetch_optional(&self.pool)
        .await
        .or_else(|error| match privilege_error(&error) {
            true => {
                tracing::warn!(slot = %self.slot, %error, "cannot end the session holding the slot");
                Ok(None)
            }
            false => Err(error),
        })?;
        Ok(ended.and_then(|(pid, ended)| ended.then_some(pid)))
    }

    /// The server decodes logically, and the publication exists (created when missing: before
    /// the slot, since pgoutput looks the publication up as of each decoded transaction).
    pub async fn prepare(&self) -> Result<(), RelayError> {
        let wal_level: String = sqlx::query_scalar("SELECT current_setting('wal_level')")
            .fetch_one(&self.pool)
            .await?;
        if wal_level != "logical" {
            return Err(RelayError::Config(format!(
                "--mode logical needs wal_level=logical, the server has {wal_level}: set it \
                 (a restart) or run the relay with --mode xmin"
            )));
        }
        let exists: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)")
                .bind(&self.publication)
                .fetch_one(&self.pool)
                .await?;
        if !exists {
            let create = format!(
                "CREATE PUBLICATION \"{}\" FOR TABLE {OUTBOX_TABLE} WITH (publish = 'insert')",
                self.publication
            );
            match sqlx::query(&create).execute(&self.pool).await {
                Ok(_) => tracing::info!(publication = %self.publication, "created publication"),
                // Another relay created it meanwhile.
                Err(error)
                    if error
                        .as_database_error()
                        .and_then(|e| e.code())
                        .is_some_and(|code| code == "42710") => {}
                Err(error) => {
                    return Err(RelayError::Config(format!(
                        "cannot create publication {} (the role needs CREATE on the database \
                         and to own {OUTBOX_TABLE}, or an administrator creates it: {create}): \
                         {error}",
                        self.publication
                    )));
                }
            }
        }
        Ok(())
    }

    pub async fn slot_state(&self) -> Result<Option<SlotState>, RelayError> {
        let row = sqlx::query(
            "SELECT plugin::TEXT, database::TEXT, confirmed_flush_lsn::TEXT, wal_status,
                    (pg_current_wal_lsn() - restart_lsn)::BIGINT
               FROM pg_replication_slots WHERE slot_name = $1",
        )
        .bind(&self.slot)
        .fetch_optional(&self.pool)
        .await?;
        let Some(row) = row else {
            return Ok(None);
        };
        let confirmed: Option<String> = row.try_get(2)?;
        Ok(Some(SlotState {
            plugin: row.try_get(0)?,
            database: row.try_get(1)?,
            confirmed_flush: confirmed
                .map(|text| text.parse::<Lsn>())
                .transpose()
                .map_err(|detail| slot_error(&self.slot, detail))?,
            wal_status: row.try_get(3)?,
            retained_bytes: row.try_get(4)?,
        }))
    }

    /// The slot, usable by this relay: logical, pgoutput, on this database, not invalidated.
    /// A slot still being created has no position yet: this waits for its creation to end.
    pub async fn usable_slot(&self) -> Result<Option<(SlotState, Lsn)>, RelayError> {
        let Some(state) = self.created_slot_state().await? else {
            return Ok(None);
        };
        let database: String = sqlx::query_scalar("SELECT current_database()::TEXT")
            .fetch_one(&self.pool)
            .await?;
        if state.plugin.as_deref() != Some("pgoutput")
            || state.database.as_deref() != Some(&database)
        {
            return Err(slot_error(
                &self.slot,
                format!(
                    "is not a pgoutput logical slot on database {database} (plugin {:?}, \
                     database {:?}): name another slot with --slot",
                    state.plugin, state.database
                ),
            ));
        }
        if state.wal_status.as_deref() == Some("lost") {
            return Err(slot_error(
                &self.slot,
                "was invalidated (wal_status lost: the WAL it needed was removed, e.g. past \
                 max_slot_wal_keep_size), so the changes after its position are gone. Recover \
                 as for a dropped slot (docs/architecture/outbox.md)",
            ));
        }
        let confirmed = state
            .confirmed_flush
            .ok_or_else(|| slot_error(&self.slot, "has no confirmed_flush_lsn"))?;
        Ok(Some((state, confirmed)))
    }

    /// The slot's state once no session is still creating it. A relay killed inside
    /// `pg_create_logical_replication_slot` leaves its backend running until the transactions
    /// open at the time end (PostgreSQL notices the lost client only afterwards); meanwhile the
    /// slot is listed with no confirmed_flush_lsn. It then becomes a usable slot, or vanishes if
    /// its creation fails, so the successor waits for one or the other.
    async fn created_slot_state(&self) -> Result<Option<SlotState>, RelayError> {
        const POLL: Duration = Duration::from_millis(200);
        const WARN_EVERY: Duration = Duration::from_secs(10);
        let started = Instant::now();
        let mut warned: Option<Instant> = None;
        loop {
            let state = self.slot_state().await?;
            if state.as_ref().is_none_or(|s| s.confirmed_flush.is_some()) {
                return Ok(state);
            }
            if warned.is_none_or(|at| at.elapsed() >= WARN_EVERY) {
                tracing::warn!(
                    slot = %self.slot,
                    waited_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
                    "replication slot is still being created by another session (it waits for \
                     the transactions open at its start); waiting for its consistent point"
                );
                warned = Some(Instant::now());
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Creates the slot; returns its consistent point (its first confirmed position). Waits for
    /// the transactions running on the server to end, as PostgreSQL does for any new slot.
    pub async fn create_slot(&self) -> Result<Lsn, RelayError> {
        let _slot = self.slot_lock.lock().await;
        let lsn: String = sqlx::query_scalar(
            "SELECT lsn::TEXT FROM pg_create_logical_replication_slot($1, 'pgoutput')",
        )
        .bind(&self.slot)
        .fetch_one(&self.pool)
        .await
        .map_err(|error| match privilege_error(&error) {
            true => RelayError::Config(format!(
                "cannot create replication slot {}: the relay's role needs the REPLICATION \
                 attribute (ALTER ROLE ... REPLICATION): {error}",
                self.slot
            )),
            false => RelayError::Database(error),
        })?;
        let lsn = lsn
            .parse()
            .map_err(|detail: String| slot_error(&self.slot, detail))?;
        tracing::info!(slot = %self.slot, consistent_point = %lsn, "created replication slot");
        Ok(lsn)
    }

    /// Moves the slot to `to`, a position Kafka has committed; never back. With a session open,
    /// the session confirms it (within a second); a read in progress passes it on when it ends.
    pub async fn advance(&self, to: Lsn) -> Result<(), RelayError> {
        self.committed.fetch_max(to.0, Ordering::SeqCst);
        match self.stream.try_lock() {
            Ok(stream) => match stream.as_ref() {
                Some(stream) => {
                    stream.acknowledge(to);
                    return Ok(());
                }
                None => drop(stream),
            },
            Err(_) => return Ok(()),
        }
        let mut position = self.slot_lock.lock().await;
        let Some(state) = self.slot_state().await? else {
            return Err(slot_error(&self.slot, "was dropped while the relay ran"));
        };
        *position = state.confirmed_flush;
        if state
            .confirmed_flush
            .is_some_and(|confirmed| confirmed >= to)
        {
            return Ok(());
        }
        let advance = || {
            sqlx::query("SELECT pg_replication_slot_advance($1, $2::TEXT::pg_lsn)")
                .bind(&self.slot)
                .bind(to.to_string())
                .execute(&self.pool)
        };
        retry_while_slot_in_use(advance).await?;
        *position = Some(to);
        Ok(())
    }

    /// Ends the replication session, if one is open, so SQL calls can use the slot.
    async fn close_stream(&self) {
        if let Some(stream) = self.stream.lock().await.take() {
            stream.close().await;
        }
    }

    /// The slot's confirmed position: as this relay last moved it, or read from the server.
    async fn slot_position(&self) -> Result<Option<Lsn>, RelayError> {
        let mut position = self.slot_lock.lock().await;
        if position.is_none() {
            *position = self
                .slot_state()
                .await?
                .and_then(|state| state.confirmed_flush);
        }
        Ok(*position)
    }

    pub async fn marks(&self) -> Result<WalMarks, RelayError> {
        let row = sqlx::query(
            "SELECT pg_snapshot_xmin(pg_current_snapshot())::TEXT::BIGINT,
                    pg_current_wal_insert_lsn()::TEXT, pg_current_wal_flush_lsn()::TEXT",
        )
        .fetch_one(&self.pool)
        .await?;
        let lsn = |index: usize| -> Result<Lsn, RelayError> {
            let text: String = row.try_get(index)?;
            text.parse()
                .map_err(|detail: String| slot_error(&self.slot, detail))
        };
        Ok(WalMarks {
            xmin: row.try_get(0)?,
            insert_lsn: lsn(1)?,
            flush_lsn: lsn(2)?,
        })
    }

    /// The slot's transactions that commit before `upto` (the WAL must be flushed there), after
    /// the slot's position; with `limit`, decoding stops at the first commit past that many
    /// messages.
    pub async fn decode(&self, upto: Lsn, limit: Option<i32>) -> Result<Decoded, RelayError> {
        self.close_stream().await;
        let _slot = self.slot_lock.lock().await;
        let publications = format!("\"{}\"", self.publication);
        let peek = || {
            sqlx::query(
                "SELECT data FROM pg_logical_slot_peek_binary_changes($1, $2::TEXT::pg_lsn, $3,
                     'proto_version', '1', 'publication_names', $4)",
            )
            .bind(&self.slot)
            .bind(upto.to_string())
            .bind(limit)
            .bind(&publications)
            .fetch_all(&self.pool)
        };
        let rows = retry_while_slot_in_use(peek).await.map_err(|error| {
            let code = error
                .as_database_error()
                .and_then(|e| e.code())
                .map(|code| code.into_owned());
            match code.as_deref() {
                // undefined_object: the slot (or the publication) is gone.
                Some("42704") => slot_error(
                    &self.slot,
                    format!(
                        "cannot be read: {error}. The relay does not guess where to resume \
                         (docs/architecture/outbox.md)"
                    ),
                ),
                // object_not_in_prerequisite_state: invalidated, its WAL removed.
                Some("55000") => slot_error(&self.slot, format!("cannot be read: {error}")),
                _ => RelayError::Database(error),
            }
        })?;
        let mut assembler = TxnAssembler::default();
        for row in rows {
            let data: Vec<u8> = row.try_get(0)?;
            assembler
                .push(&data)
                .map_err(|detail| slot_error(&self.slot, detail))?;
        }
        assembler
            .finish()
            .map_err(|detail| slot_error(&self.slot, detail))
    }

    /// The next batch after `after` (a logical position), at most about `limit` rows in whole
    /// transactions.
    pub async fn read(&self, after: RelayPosition, limit: i64) -> Result<OutboxRead, RelayError> {
        match after {
            RelayPosition::Logical {
                lsn,
                table_after: Some(cursor),
            } => self.read_table(lsn, cursor, limit).await,
            RelayPosition::Logical {
                lsn,
                table_after: None,
            } => self.read_stream(lsn, limit).await,
            RelayPosition::Xmin(_) => Err(RelayError::Config(
                "an xmin position reached the logical reader".into(),
            )),
        }
    }

    /// The transactions after `after`, about `limit` rows of them, from the replication
    /// session (`logical_stream`): the one the last read left open if it ended at `after`, else
    /// a new one starting there.
    async fn read_stream(&self, after: Lsn, limit: i64) -> Result<OutboxRead, RelayError> {
        // The session goes on while PostgreSQL refuses queries: a server shutting down waits for
        // the session to confirm the end of its WAL, which takes an idle position committed to
        // Kafka, which takes reads (and loads nothing, with no rows).
        let marks = match tokio::time::timeout(MARKS_WAIT, self.marks()).await {
            Ok(Ok(marks)) => Some(marks),
            Ok(Err(error)) => {
                tracing::debug!(%error, "reading the stream without the WAL's marks");
                None
            }
            Err(_) => {
                tracing::debug!(wait = ?MARKS_WAIT, "reading the stream without the WAL's marks: no connection");
                None
            }
        };
        let upto = marks.map_or(after, |marks| marks.flush_lsn.max(after));
        let mut open = self.stream.lock().await;
        let mut stream = match open.take() {
            Some(stream) if session_goes_on(Some(stream.handed_over()), after) => stream,
            other => {
                if let Some(stream) = other {
                    stream.close().await;
                }
                let confirmed = self.confirmable().await?;
                WalStream::start(
                    &self.target,
                    (&self.slot, &self.publication),
                    after,
                    confirmed,
                )
                .await?
            }
        };
        // Taken out while it reads: a read dropped halfway leaves no session behind, and the
        // next read starts a new one where it is asked to.
        let read = stream
            .read(
                &self.slot,
                after,
                upto,
                usize::try_from(limit).unwrap_or(usize::MAX),
            )
            .await?;
        stream.acknowledge(Lsn(self.committed.load(Ordering::SeqCst)));
        *open = Some(stream);
        drop(open);
        let positions: Vec<i64> = read
            .txns
            .iter()
            .flat_map(|txn| txn.positions.iter().copied())
            .collect();
        // A server shutting down waits for the session to confirm what it sent, which takes
        // these rows published, which takes this load: one that waits on PostgreSQL lets the
        // session go (its walsender ends at once) rather than hold the shutdown until
        // wal_sender_timeout. The rows hold without it; the next read starts a new session.
        let load = self.load(&positions);
        tokio::pin!(load);
        let rows = tokio::select! {
            rows = &mut load => rows,
            () = tokio::time::sleep(SESSION_HELD_AT_MOST) => {
                self.close_stream().await;
                load.await
            }
        }?;
        Ok(OutboxRead {
            rows,
            position: RelayPosition::Logical {
                lsn: read.next,
                table_after: None,
            },
            more: read.more,
            purge_mark: marks.map(|marks| (marks.xmin, marks.insert_lsn)),
        })
    }

    /// What a new session may confirm: the highest position Kafka committed that this relay
    /// knows of, or the slot's own confirmed position (at or behind Kafka's: the relay checked
    /// at start-up).
    async fn confirmable(&self) -> Result<Lsn, RelayError> {
        let committed = Lsn(self.committed.load(Ordering::SeqCst));
        if committed.0 > 0 {
            return Ok(committed);
        }
        Ok(self.slot_position().await?.unwrap_or(committed))
    }

    /// First start (or a switch from xmin mode): rows committed before the slot's consistent
    /// point `consistent` are not in its stream, so they come from the table — those visible in
    /// a snapshot and not decoded by the slot up to a WAL position read after that snapshot,
    /// in (order_xid, position) order after `cursor`.
    async fn read_table(
        &self,
        consistent: Lsn,
        cursor: OutboxCursor,
        limit: i64,
    ) -> Result<OutboxRead, RelayError> {
        let deadline = Instant::now() + VISIBLE_WAIT;
        let mut polls = visibility_polls();
        let mut tx = loop {
            let mut tx = self.pool.begin().await?;
            sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                .execute(&mut *tx)
                .await?;
            // A transaction is committed in the WAL (and in pg_xact) before snapshots see it — for
            // as long as a synchronous standby takes to confirm it. One that committed before the
            // slot's consistent point and that this snapshot does not see would be in neither the
            // table pass nor the stream: so the snapshot must see every committed transaction.
            let unseen: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_snapshot_xip(pg_current_snapshot()) AS xip
                  WHERE pg_xact_status(xip) = 'committed'",
            )
            .fetch_one(&mut *tx)
            .await?;
            if unseen == 0 {
                break tx;
            }
            tx.rollback().await?;
            if Instant::now() > deadline {
                return Err(slot_error(
                    &self.slot,
                    format!(
                        "{unseen} committed transactions stayed invisible for {VISIBLE_WAIT:?}"
                    ),
                ));
            }
            tokio::time::sleep(polls.next().unwrap_or(LONGEST_POLL)).await;
        };
        let scanned = read_visible_after(&mut *tx, cursor, limit).await?;
        // Read after the snapshot: every transaction the snapshot sees committed before it.
        let after_snapshot: String = sqlx::query_scalar("SELECT pg_current_wal_insert_lsn()::TEXT")
            .fetch_one(&mut *tx)
            .await?;
        tx.commit().await?;
        let after_snapshot: Lsn = after_snapshot
            .parse()
            .map_err(|detail: String| slot_error(&self.slot, detail))?;
        self.wait_flushed(after_snapshot).await?;
        let decoded: HashSet<i64> = self
            .decode(after_snapshot, None)
            .await?
            .txns
            .into_iter()
            .flat_map(|txn| txn.positions)
            .collect();
        let last = scanned.last().map(|row| row.cursor);
        let done = (scanned.len() as i64) < limit;
        let rows: Vec<OutboxRow> = scanned
            .into_iter()
            .filter(|row| !decoded.contains(&row.cursor.position))
            .collect();
        Ok(OutboxRead {
            rows,
            position: RelayPosition::Logical {
                lsn: consistent,
                table_after: if done { None } else { last.or(Some(cursor)) },
            },
            more: !done,
            purge_mark: None,
        })
    }

    async fn wait_flushed(&self, lsn: Lsn) -> Result<(), RelayError> {
        let deadline = Instant::now() + FLUSH_WAIT;
        let mut polls = visibility_polls();
        loop {
            let marks = self.marks().await?;
            if marks.flush_lsn >= lsn {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(slot_error(
                    &self.slot,
                    format!("the WAL is not flushed to {lsn} after {FLUSH_WAIT:?}"),
                ));
            }
            tokio::time::sleep(polls.next().unwrap_or(LONGEST_POLL)).await;
        }
    }

    /// The rows at `positions`. A transaction's commit record is in the WAL (and decodable)
    /// before the transaction is visible to other snapshots — for as long as a synchronous
    /// standby takes to confirm it — so rows not found yet are looked for again; past
    /// `VISIBLE_WAIT` a row still missing was deleted before it was published, and the relay
    /// stops rather than skip it (the purge stays behind the position).
    async fn load(&self, positions: &[i64]) -> Result<Vec<OutboxRow>, RelayError> {
        if positions.is_empty() {
            return Ok(Vec::new());
        }
        let deadline = Instant::now() + VISIBLE_WAIT;
        let mut polls = visibility_polls();
        loop {
            let rows = read_positions(&self.pool, positions).await?;
            if rows.len() == positions.len() {
                return Ok(rows);
            }
            if Instant::now() < deadline {
                tokio::time::sleep(polls.next().unwrap_or(LONGEST_POLL)).await;
                continue;
            }
            let found: HashSet<i64> = rows.iter().map(|row| row.cursor.position).collect();
            let missing: Vec<i64> = positions
                .iter()
                .filter(|p| !found.contains(p))
                .take(5)
                .copied()
                .collect();
            return Err(slot_error(
                &self.slot,
                format!(
                    "decoded outbox rows that are not in {OUTBOX_TABLE} after {VISIBLE_WAIT:?} \
                     (positions {missing:?}...): deleted before they were published. Not \
                     skipping them"
                ),
            ));
        }
    }
}

/// What a read makes of one peek of the slot (pure, so eos-model's relay model decides each of
/// its reads with it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeekJudgement {
    /// The outbox positions to publish (those of transactions committing at or after the read's
    /// position: a commit before it is in Kafka already), the position once they are published,
    /// and whether the peek stopped at its limit (read again at once).
    Read {
        positions: Vec<i64>,
        next: Lsn,
        more: bool,
    },
    /// The peek stopped at its limit before passing the read's position: it decoded only what
    /// Kafka holds (the slot is behind), and the same peek would find the same. Peek further.
    DecodeFurther,
}

/// Judges a peek of at most `peek_limit` messages up to `upto`, for a read after `after`.
pub fn judge_peek(decoded: &Decoded, peek_limit: i32, after: Lsn, upto: Lsn) -> PeekJudgement {
    // Stopped by the limit: what follows the last commit returned is not read yet.
    let cut = decoded.messages >= usize::try_from(peek_limit).unwrap_or(usize::MAX);
    let last = decoded.txns.last();
    let passed = last.is_some_and(|txn| txn.commit_lsn >= after);
    if cut && !passed && peek_limit < i32::MAX {
        return PeekJudgement::DecodeFurther;
    }
    let positions = decoded
        .txns
        .iter()
        .filter(|txn| txn.commit_lsn >= after)
        .flat_map(|txn| txn.positions.iter().copied())
        .collect();
    let next = match (cut, last) {
        (true, Some(last)) => last.end_lsn.max(after),
        (true, None) => after,
        (false, _) => upto,
    };
    PeekJudgement::Read {
        positions,
        next,
        more: cut,
    }
}

/// Runs `call` again while the slot is still held by a replication session this relay just
/// closed (SQLSTATE 55006, object_in_use: its walsender has not exited yet), for up to
/// `SLOT_RELEASE_WAIT`.
async fn retry_while_slot_in_use<T, F, Fut>(call: F) -> Result<T, sqlx::Error>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<T, sqlx::Error>>,
{
    let deadline = Instant::now() + SLOT_RELEASE_WAIT;
    let mut polls = visibility_polls();
    loop {
        match call().await {
            Err(error)
                if Instant::now() < deadline
                    && error
                        .as_database_error()
                        .and_then(|e| e.code())
                        .is_some_and(|code| code == "55006") =>
            {
                tokio::time::sleep(polls.next().unwrap_or(LONGEST_POLL)).await;
            }
            result => return result,
        }
    }
}

/// How long a closed session's walsender may take to let go of the slot.
const SLOT_RELEASE_WAIT: Duration = Duration::from_secs(10);

/// SQLSTATE 42501 (insufficient_privilege).
fn privilege_error(error: &sqlx::Error) -> bool {
    error
        .as_database_error()
        .and_then(|db| db.code())
        .is_some_and(|code| code == "42501")
}

/// The longest wait between two looks at something PostgreSQL finishes on its own (a commit
/// becoming visible, the WAL flushed).
const LONGEST_POLL: Duration = Duration::from_millis(20);

/// Waits between those looks: they usually take a millisecond or two, so start small.
fn visibility_polls() -> ExponentialBackoff {
    doubling(Duration::from_millis(1), LONGEST_POLL).build()
}

impl OutboxReader for LogicalSource {
    fn read(
        &self,
        after: RelayPosition,
        limit: i64,
    ) -> BoxFuture<'_, Result<OutboxRead, RelayError>> {
        Box::pin(LogicalSource::read(self, after, limit))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pgoutput::tests::{begin, commit, insert, relation};

    const COLUMNS: &[&str] = &["position", "order_xid", "topic"];

    fn assemble(messages: &[Vec<u8>]) -> Result<Decoded, String> {
        let mut assembler = TxnAssembler::default();
        for message in messages {
            assembler.push(message)?;
        }
        assembler.finish()
    }

    #[test]
    fn transactions_come_out_in_commit_order_with_their_positions_and_lsns() {
        let decoded = assemble(&[
            begin(0x200, 11),
            relation(7, "eos_outbox", COLUMNS),
            insert(7, &[Some("12"), Some("11"), Some("t")]),
            insert(7, &[Some("10"), Some("11"), Some("t")]),
            vec![b'Y', 0, 0],
            commit(0x200, 0x230),
            begin(0x300, 9),
            commit(0x300, 0x330),
        ])
        .expect("decodes");
        assert_eq!(decoded.messages, 8);
        assert_eq!(
            decoded.txns,
            vec![
                DecodedTxn {
                    xid: 11,
                    commit_lsn: Lsn(0x200),
                    end_lsn: Lsn(0x230),
                    commit_time: 789_000_001,
                    positions: vec![12, 10],
                },
                DecodedTxn {
                    xid: 9,
                    commit_lsn: Lsn(0x300),
                    end_lsn: Lsn(0x330),
                    commit_time: 789_000_001,
                    positions: vec![],
                },
            ]
        );
    }

    fn txn(commit: u64, end: u64, positions: &[i64]) -> DecodedTxn {
        DecodedTxn {
            xid: 1,
            commit_lsn: Lsn(commit),
            end_lsn: Lsn(end),
            commit_time: 0,
            positions: positions.to_vec(),
        }
    }

    #[test]
    fn a_full_peek_that_only_decodes_what_kafka_holds_decodes_further() {
        // The slot is a batch behind the position 0x300: the peek of 4 messages returns that
        // batch only. Reading on from there would find it again, for ever.
        let behind = Decoded {
            txns: vec![txn(0x100, 0x130, &[1]), txn(0x200, 0x230, &[2])],
            messages: 6,
        };
        assert_eq!(
            judge_peek(&behind, 4, Lsn(0x300), Lsn(0x900)),
            PeekJudgement::DecodeFurther
        );
        // Twice as far, it passes the position: only what follows it is published.
        let further = Decoded {
            txns: vec![
                txn(0x100, 0x130, &[1]),
                txn(0x200, 0x230, &[2]),
                txn(0x300, 0x330, &[3, 4]),
            ],
            messages: 10,
        };
        assert_eq!(
            judge_peek(&further, 8, Lsn(0x300), Lsn(0x900)),
            PeekJudgement::Read {
                positions: vec![3, 4],
                next: Lsn(0x330),
                more: true
            }
        );
        // Not stopped by the limit: everything up to `upto` is read.
        assert_eq!(
            judge_peek(&behind, 16, Lsn(0x300), Lsn(0x900)),
            PeekJudgement::Read {
                positions: vec![],
                next: Lsn(0x900),
                more: false
            }
        );
    }

    #[test]
    fn the_position_column_is_found_by_name() {
        let decoded = assemble(&[
            begin(0x10, 1),
            relation(7, "eos_outbox", &["order_xid", "topic", "position"]),
            insert(7, &[Some("99"), Some("t"), Some("5")]),
            commit(0x10, 0x20),
        ])
        .expect("decodes");
        assert_eq!(decoded.txns[0].positions, vec![5]);
    }

    #[test]
    fn anything_unexpected_is_an_error_not_a_skipped_row() {
        // An insert into another table: the publication is not the relay's.
        assert!(
            assemble(&[
                begin(0x10, 1),
                relation(8, "payments", &["position"]),
                insert(8, &[Some("1")]),
                commit(0x10, 0x20),
            ])
            .is_err()
        );
        // An insert with no relation described, outside a transaction, a null position.
        assert!(assemble(&[begin(0x10, 1), insert(7, &[Some("1")])]).is_err());
        assert!(
            assemble(&[
                relation(7, "eos_outbox", COLUMNS),
                insert(7, &[Some("1"), None, None])
            ])
            .is_err()
        );
        assert!(
            assemble(&[
                begin(0x10, 1),
                relation(7, "eos_outbox", COLUMNS),
                insert(7, &[None, None, None]),
            ])
            .is_err()
        );
        // A peek that ends mid-transaction, a commit with no begin, a begin inside one.
        assert!(assemble(&[begin(0x10, 1)]).is_err());
        assert!(assemble(&[commit(0x10, 0x20)]).is_err());
        assert!(assemble(&[begin(0x10, 1), begin(0x20, 2)]).is_err());
    }
}
