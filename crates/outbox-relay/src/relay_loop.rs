//! The relay loop: read the next rows of the outbox, publish them, move the position; wait for a
//! notification (or the poll interval) when there is nothing to read.
//!
//! Exactly-once mode: the batch's records and the position record are one Kafka transaction
//! (`eos_runtime::transactional_producer` classifies its failures, and
//! `eos_runtime::transaction_recovery` says what follows each, docs/architecture/pitfalls.md).
//! Aborted: nothing of it is visible, and the same rows are read again. Outcome unknown: the
//! producer is replaced (its `init_transactions` settles the transaction) and the position is read
//! back from Kafka, which says whether the batch is in. Fenced or fatal: stop. At-least-once mode:
//! the position is stored in PostgreSQL after Kafka acknowledged the batch, so a crash in between
//! publishes the batch again.
//!
//! Rows are found in one of two ways (docs/architecture/outbox.md), each a reader behind one
//! trait (`outbox_reader.rs`) that the loop picks at start: `xmin` mode reads the table below the
//! server's oldest running transaction (`eos_outbox::reader`); `logical` mode decodes the
//! outbox's inserts in commit order from a replication slot ([`crate::logical`]), which moves
//! only after Kafka committed the position it moves to.
//!
//! The producer's calls block, so they run under `block_in_place`. Two things overlap with a
//! batch's Kafka transaction, since they do not depend on its outcome: reading (and building) the
//! next batch, which starts after this batch's position — safe at any time, because the xmin
//! order only ever returns rows no later transaction can precede, and the logical reader skips
//! every transaction that commits before the position it reads after — and dropped if the batch
//! does not commit; and recording the previous batch's position in PostgreSQL.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use metrics::{counter, gauge, histogram};
use sqlx::PgPool;
use sqlx::postgres::PgListener;
use time::OffsetDateTime;
use tokio::task::{JoinHandle, block_in_place};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use eos_core::Guarantee;
use eos_outbox::relay_positions::record_relayed;
use eos_outbox::{OutboxCursor, OutboxRow};
use eos_runtime::backoff::{BackoffBuilder as _, ExponentialBackoff, doubling};
use eos_runtime::ops_http::Readiness;
use eos_runtime::progress_watch::ProgressWatch;
use eos_runtime::transaction_recovery::{LostTransaction, Recovery, cause};
use eos_runtime::transactional_producer::{PendingRecord, TransactionalProducer, TxnFailure};
use eos_schema::{SubjectSchema, TopicSchemaError, TopicSchemas};

use crate::backlog_watch::{self, SharedPublished};
use crate::error::RelayError;
use crate::metrics as m;
use crate::outbox_reader::{OutboxRead, OutboxReader, PurgeMark, XminReader};
use crate::position_topic::{RelayPosition, position_record};
use crate::records::record_for;
use crate::recovery::{log_resuming, recover_position};
pub use crate::relay_settings::RelaySettings;

/// The channel `eos_outbox_enqueue` notifies at commit.
pub const NOTIFY_CHANNEL: &str = "eos_outbox";
/// Longest wait between attempts while PostgreSQL or the broker is unreachable.
const MAX_RETRY_BACKOFF: Duration = Duration::from_secs(5);
/// Logical mode, caught up: the slot is advanced at most this often (with a replication session
/// open an advance is only a position the session confirms; without one, the first start's table
/// pass, `pg_replication_slot_advance` reads the WAL from the slot's restart_lsn). A slot a little
/// behind the position costs only WAL kept a little longer. While catching up it moves every batch.
const ADVANCE_INTERVAL: Duration = Duration::from_secs(1);
/// Logical mode, while batches follow each other: the least time between two writes of the
/// published position to PostgreSQL.
const COPY_INTERVAL: Duration = Duration::from_secs(1);
/// Logical mode, the slot held by another session: how often the relay checks that Kafka has not
/// fenced it.
const OWNERSHIP_CHECK_INTERVAL: Duration = Duration::from_secs(5);
/// Purge marks waiting for the position to pass them; older ones are dropped past this many (a
/// later mark covers more).
const PURGE_MARKS_KEPT: usize = 64;

#[derive(Debug)]
pub struct RelayLoop {
    settings: RelaySettings,
    pool: PgPool,
    producer: TransactionalProducer,
    /// Where the next read starts: the last position published, or one past rows that need no
    /// publishing (logical mode).
    position: RelayPosition,
    /// The last position committed to Kafka (exactly-once) or acknowledged (at-least-once).
    committed: RelayPosition,
    committed_at: Instant,
    /// Logical mode: purge marks of published batches, oldest first.
    purge_marks: VecDeque<PurgeMark>,
    /// Logical mode: when the slot was last advanced.
    advanced_at: Option<Instant>,
    /// When the last read that found rows started: the next read waits out the linger from it.
    rows_read_at: Option<Instant>,
    /// The write of the last published position to PostgreSQL, if still running.
    recording: Option<JoinHandle<()>>,
    /// Logical mode: when the last such write started, and the newest position not written yet.
    copied_at: Option<Instant>,
    pending_copy: Option<OutboxCursor>,
    /// What the backlog gauges' task reads of the published position.
    published: SharedPublished,
    /// Told what the loop does while rows wait, and when they move (docs/OBSERVABILITY.md
    /// "Liveness").
    progress: Arc<ProgressWatch>,
    /// Where the rows come from: the mode's reader (`outbox_reader.rs`).
    reader: Arc<dyn OutboxReader>,
}

/// Rows read after a position, with the records they become.
#[derive(Debug)]
struct Batch {
    after: RelayPosition,
    /// The position once the batch is published.
    position: RelayPosition,
    rows: Vec<OutboxRow>,
    records: Vec<PendingRecord>,
    /// The read stopped at its limit: more may be there already.
    more: bool,
    purge_mark: Option<PurgeMark>,
}

impl Batch {
    async fn read(
        reader: Arc<dyn OutboxReader>,
        value_schemas: Option<Arc<TopicSchemas>>,
        after: RelayPosition,
        limit: i64,
    ) -> Result<Self, RelayError> {
        let OutboxRead {
            rows,
            position,
            more,
            purge_mark,
        } = reader.read(after, limit).await?;
        let schemas = topic_schemas(value_schemas.as_deref(), &rows).await?;
        let records = rows
            .iter()
            .map(|row| record_for(row, schemas.get(row.topic.as_str()).map(Arc::as_ref)))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            after,
            position,
            rows,
            records,
            more,
            purge_mark,
        })
    }
}

/// The schema of each topic among `rows`, when values are written in a registry format. A
/// registry that cannot answer now is retried with the read; a topic without a usable schema
/// stops the relay, naming it.
async fn topic_schemas<'a>(
    value_schemas: Option<&TopicSchemas>,
    rows: &'a [OutboxRow],
) -> Result<HashMap<&'a str, Arc<SubjectSchema>>, RelayError> {
    let mut found = HashMap::new();
    let Some(value_schemas) = value_schemas else {
        return Ok(found);
    };
    for row in rows {
        if found.contains_key(row.topic.as_str()) {
            continue;
        }
        let schema = value_schemas
            .schema_for(&row.topic)
            .await
            .map_err(|error| match error {
                TopicSchemaError::Registry(error) if error.is_transient() => {
                    RelayError::Registry(error)
                }
                other => RelayError::InvalidRow {
                    position: row.cursor.position,
                    event_id: row.event_id.clone(),
                    detail: other.to_string(),
                },
            })?;
        found.insert(row.topic.as_str(), schema);
    }
    Ok(found)
}

impl RelayLoop {
    /// Creates the producer (fencing an earlier relay of the same name) and finds where to
    /// resume.
    pub async fn start(
        settings: RelaySettings,
        pool: PgPool,
        progress: Arc<ProgressWatch>,
    ) -> Result<Self, RelayError> {
        let producer = block_in_place(|| settings.create_producer())?;
        if let Some(source) = &settings.logical
            && settings.guarantee == Guarantee::ExactlyOnce
        {
            // Its init_transactions has just fenced every earlier relay with its name: a session
            // still on the slot is one of theirs (a zombie's, or a killed relay's walsender), and
            // would keep this relay from the slot. An idle zombie would never let go of it.
            if let Some(pid) = source.end_foreign_session().await? {
                warn!(
                    slot = source.slot(),
                    ended_pid = pid,
                    "ended the session of a fenced relay holding the slot"
                );
            }
        }
        let position = recover_position(&settings, &pool).await?;
        log_resuming(&settings, position);
        let reader: Arc<dyn OutboxReader> = match &settings.logical {
            Some(source) => Arc::new(source.clone()),
            None => Arc::new(XminReader { pool: pool.clone() }),
        };
        Ok(Self {
            reader,
            settings,
            pool,
            producer,
            position,
            committed: position,
            committed_at: Instant::now(),
            purge_marks: VecDeque::new(),
            advanced_at: None,
            rows_read_at: None,
            recording: None,
            copied_at: None,
            pending_copy: None,
            progress,
            published: SharedPublished::default(),
        })
    }

    /// Publishes until `shutdown` is cancelled (the batch in flight finishes first) or a fatal
    /// error.
    pub async fn run(
        mut self,
        shutdown: &CancellationToken,
        readiness: &Readiness,
    ) -> Result<(), RelayError> {
        let mut listener = PgListener::connect_with(&self.pool).await?;
        listener.listen(NOTIFY_CHANNEL).await?;
        readiness.set(true);
        let gauges = tokio::spawn(backlog_watch::run(
            self.pool.clone(),
            self.settings.logical.clone(),
            self.published.clone(),
            shutdown.child_token(),
        ));
        let result = self.publish_until(shutdown, readiness, listener).await;
        gauges.abort();
        result
    }

    async fn publish_until(
        &mut self,
        shutdown: &CancellationToken,
        readiness: &Readiness,
        mut listener: PgListener,
    ) -> Result<(), RelayError> {
        if let Ok(mut published) = self.published.lock() {
            published.position = Some(self.position);
        }
        let mut outages = ReadOutages::new();
        let mut next: Option<JoinHandle<Result<Batch, RelayError>>> = None;
        while !shutdown.is_cancelled() {
            // A read that never returns is a stall whether or not rows wait: nothing else moves.
            self.progress.working("a read of the outbox");
            let read = match next.take() {
                // Never aborted while awaited here: an error is the read task's panic.
                Some(prefetched) => prefetched
                    .await
                    .unwrap_or_else(|error| std::panic::resume_unwind(error.into_panic())),
                None => self.read_now(shutdown).await,
            };
            let batch = match read {
                Ok(batch) => batch,
                Err(error) => {
                    self.read_failed(error, &mut outages, readiness, shutdown)
                        .await?;
                    continue;
                }
            };
            outages.ended(readiness);
            debug_assert_eq!(batch.after, self.position);
            if batch.rows.is_empty() {
                if let Some(cursor) = self.pending_copy.take() {
                    self.record_copy(cursor);
                }
                match (batch.more, batch.position == batch.after) {
                    // Caught up.
                    (false, _) => self.progress.idle(),
                    // Read past rows that need no publishing.
                    (true, false) => self.progress.progressed(),
                    // A full read that found nothing new: the next read must go further.
                    (true, true) => self.progress.working("a read of the outbox to move on"),
                }
                if self.idle_position_due(&batch) {
                    // Nothing to publish, but the slot would hold the WAL written since.
                    self.publish(&batch).await?;
                } else {
                    // Nothing decoded needs publishing up to there; Kafka's position catches up
                    // with the next batch (a restart reads that stretch again).
                    self.position = batch.position;
                }
                if !batch.more {
                    self.wait_for_rows(&mut listener, shutdown).await;
                }
                continue;
            }
            self.progress
                .working("Kafka to commit a batch of the outbox's rows");
            if let Ok(mut published) = self.published.lock() {
                // Before anything is published: rows from the first one read on are not.
                let lowest = batch.rows.iter().map(|row| row.cursor.position).min();
                if published.highest_position.is_none() {
                    published.highest_position = lowest.map(|lowest| lowest - 1);
                }
            }
            // Only behind (a full read) is the next batch worth reading now: caught up, a read
            // after the commit also finds the rows committed meanwhile, a cycle sooner.
            next = batch.more.then(|| {
                tokio::spawn(Batch::read(
                    Arc::clone(&self.reader),
                    self.settings.value_schemas.clone(),
                    batch.position,
                    self.settings.batch_size,
                ))
            });
            self.publish(&batch).await?;
            if self.position != batch.position {
                // Not published (aborted, or recovered to an earlier position): read again from
                // where Kafka says the relay is.
                if let Some(prefetched) = next.take() {
                    prefetched.abort();
                }
            }
        }
        if let Some(prefetched) = next.take() {
            prefetched.abort();
        }
        // The newest copy of the position, once the write in flight has ended.
        self.copy_written().await;
        if let Some(cursor) = self.pending_copy.take() {
            self.record_copy(cursor);
        }
        self.copy_written().await;
        info!("shutting down: the last batch is published");
        Ok(())
    }

    /// Waits for the copy of the position being written, if one is.
    async fn copy_written(&mut self) {
        if let Some(recording) = self.recording.take() {
            recording.await.ok();
        }
    }

    /// A read from the relay's position, after the linger when caught up: rows that arrive
    /// together go out in one transaction.
    async fn read_now(&mut self, shutdown: &CancellationToken) -> Result<Batch, RelayError> {
        let linger = self.rows_read_at.map_or(Duration::ZERO, |at| {
            self.settings.linger.saturating_sub(at.elapsed())
        });
        if !linger.is_zero() {
            sleep_or_shutdown(linger, shutdown).await;
        }
        let started = Instant::now();
        let read = Batch::read(
            Arc::clone(&self.reader),
            self.settings.value_schemas.clone(),
            self.position,
            self.settings.batch_size,
        )
        .await;
        if read.as_ref().is_ok_and(|batch| !batch.rows.is_empty()) {
            self.rows_read_at = Some(started);
        }
        read
    }

    /// A read failed: an outage of PostgreSQL, the replication session or the schema registry
    /// is waited out (not ready meanwhile, the progress watch told what it waits for) and
    /// `Ok` lets the loop read again; anything else is returned, and stops the relay.
    async fn read_failed(
        &mut self,
        error: RelayError,
        outages: &mut ReadOutages,
        readiness: &Readiness,
        shutdown: &CancellationToken,
    ) -> Result<(), RelayError> {
        let waiting_for = if error.is_registry_outage() {
            "the schema registry to answer for a topic's schema"
        } else if !error.is_database_outage() {
            return Err(error);
        } else {
            if matches!(error, RelayError::Replication { .. }) || error.is_slot_held_elsewhere() {
                // Its session ended or was refused, or its table pass found the slot held: a
                // zombie learns it here, before it takes the slot back from the relay that ended
                // its session (one in its table pass would retry the slot forever).
                let slot_held_elsewhere = error.is_slot_held_elsewhere();
                self.still_owner(&mut outages.ownership_checked_at, slot_held_elsewhere)
                    .await?;
            }
            if error.is_slot_held_elsewhere() {
                "the replication slot, held by another session"
            } else {
                "PostgreSQL to answer a read of the outbox"
            }
        };
        outages.failures += 1;
        readiness.set(false);
        self.progress.waiting_for_outage(waiting_for);
        let delay = outages.delays.next().unwrap_or(MAX_RETRY_BACKOFF);
        warn!(%error, attempt = outages.failures, ?delay, waiting_for, "cannot read the outbox; retrying");
        sleep_or_shutdown(delay, shutdown).await;
        Ok(())
    }

    /// The replication session ended or was refused. Its end may be a newer relay with this
    /// name taking the slot, and a refusal may be another session holding it: a newer relay's,
    /// a fenced one's, or the walsender of one that died. Only Kafka's fencing tells which; an
    /// idle zombie commits nothing, so it would never learn it, and its live session never times
    /// out. So a transaction holding the position Kafka already has is committed, at most once
    /// per `OWNERSHIP_CHECK_INTERVAL`: fenced, this relay stops; committed, it owns the name
    /// (and changed nothing), and when `end_other` another session holds the slot, which is
    /// then not a live owner's and is ended.
    async fn still_owner(
        &mut self,
        checked_at: &mut Option<Instant>,
        end_other: bool,
    ) -> Result<(), RelayError> {
        if self.settings.guarantee != Guarantee::ExactlyOnce
            || checked_at.is_some_and(|at| at.elapsed() < OWNERSHIP_CHECK_INTERVAL)
        {
            return Ok(());
        }
        *checked_at = Some(Instant::now());
        let position = position_record(
            &self.settings.positions_topic,
            &self.settings.relay_name,
            self.committed,
        );
        let outcome = block_in_place(|| {
            self.producer.begin()?;
            self.producer.send(&position).map_err(TxnFailure::from)?;
            self.producer.commit()
        });
        match outcome {
            Ok(()) => {
                let Some(source) = self.settings.logical.as_ref().filter(|_| end_other) else {
                    return Ok(());
                };
                // Not ended now (PostgreSQL went away meanwhile): asked again at the next check.
                match source.end_foreign_session().await {
                    Ok(ended) => warn!(
                        slot = source.slot(),
                        ended_pid = ended,
                        "the replication slot was held by another session while this relay \
                         owns its name in Kafka (a fenced relay's, or a dead one's walsender); \
                         ended it"
                    ),
                    Err(error) => {
                        warn!(%error, "cannot end the session holding the replication slot");
                    }
                }
                Ok(())
            }
            Err(failure) => self.batch_failed(failure, 0).await,
        }
    }

    /// Logical mode, nothing to publish: whether to commit the position alone, so the slot can
    /// release the WAL decoded meanwhile (other databases' writes, rolled-back transactions).
    fn idle_position_due(&self, batch: &Batch) -> bool {
        matches!(
            batch.position,
            RelayPosition::Logical {
                table_after: None,
                ..
            }
        ) && batch.position != self.committed
            && self.committed_at.elapsed() >= self.settings.idle_position_interval
            && self.settings.guarantee == Guarantee::ExactlyOnce
    }

    /// Until a notification, the poll interval, or shutdown.
    async fn wait_for_rows(&self, listener: &mut PgListener, shutdown: &CancellationToken) {
        tokio::select! {
            () = shutdown.cancelled() => {}
            () = tokio::time::sleep(self.settings.poll_interval) => {}
            notification = listener.try_recv() => {
                if let Err(error) = notification {
                    // The listener reconnects on its next call; poll meanwhile.
                    warn!(%error, "outbox notifications interrupted; polling");
                    sleep_or_shutdown(self.settings.poll_interval, shutdown).await;
                }
            }
        }
    }

    async fn publish(&mut self, batch: &Batch) -> Result<(), RelayError> {
        match self.settings.guarantee {
            Guarantee::ExactlyOnce => self.publish_in_transaction(batch).await,
            Guarantee::AtLeastOnce => self.publish_then_record(batch).await,
        }
    }

    async fn publish_in_transaction(&mut self, batch: &Batch) -> Result<(), RelayError> {
        let position = position_record(
            &self.settings.positions_topic,
            &self.settings.relay_name,
            batch.position,
        );
        let outcome = block_in_place(|| {
            self.producer.begin()?;
            for record in batch.records.iter().chain(std::iter::once(&position)) {
                self.producer.send(record).map_err(TxnFailure::from)?;
            }
            self.producer.commit()
        });
        match outcome {
            Ok(()) => {
                counter!(m::TRANSACTIONS, "outcome" => "committed").increment(1);
                self.published(batch).await;
                Ok(())
            }
            Err(failure) => self.batch_failed(failure, batch.rows.len()).await,
        }
    }

    /// The batch's transaction did not commit. A lost transaction stops the relay like any
    /// fence: its identity is only its `transactional.id`, so nothing tells the coordinator's
    /// fence from a newer relay's.
    async fn batch_failed(&mut self, failure: TxnFailure, rows: usize) -> Result<(), RelayError> {
        match Recovery::after_failure(&failure, LostTransaction::Stop) {
            Recovery::AbortAndRedo => {
                let error = cause(failure);
                counter!(m::TRANSACTIONS, "outcome" => "aborted").increment(1);
                warn!(%error, rows, "batch aborted; publishing it again");
                match block_in_place(|| self.producer.abort()) {
                    Ok(()) => Ok(()),
                    Err(failure) => self.abort_failed(failure).await,
                }
            }
            Recovery::ReplaceProducer => {
                let error = cause(failure);
                counter!(m::TRANSACTIONS, "outcome" => "recovered").increment(1);
                warn!(%error, rows, "commit outcome unknown; replacing the producer and reading the position back");
                self.recover().await
            }
            Recovery::Stop => Err(RelayError::Fatal(cause(failure))),
        }
    }

    /// The abort of a failed batch failed too: a new producer's `init_transactions` aborts
    /// whatever is still open, unless the producer is fenced or broken.
    async fn abort_failed(&mut self, failure: TxnFailure) -> Result<(), RelayError> {
        let recovery = Recovery::after_failed_abort(&failure, LostTransaction::Stop);
        let error = cause(failure);
        if recovery == Recovery::Stop {
            return Err(RelayError::Fatal(error));
        }
        warn!(%error, "abort failed; replacing the producer");
        self.recover().await
    }

    async fn publish_then_record(&mut self, batch: &Batch) -> Result<(), RelayError> {
        block_in_place(|| -> Result<(), RelayError> {
            for record in &batch.records {
                self.producer.send(record)?;
            }
            Ok(self.producer.flush_delivered()?)
        })?;
        self.published(batch).await;
        Ok(())
    }

    /// After Kafka has the batch: move the position, then the slot (logical mode), and tell
    /// PostgreSQL (the authority in at-least-once mode; in exactly-once mode a lagging copy that
    /// bounds the purge).
    async fn published(&mut self, batch: &Batch) {
        self.progress.progressed();
        self.position = batch.position;
        if let Ok(mut published) = self.published.lock() {
            published.position = Some(batch.position);
            let highest = batch.rows.iter().map(|row| row.cursor.position).max();
            published.highest_position = published.highest_position.max(highest);
        }
        self.committed = batch.position;
        self.committed_at = Instant::now();
        counter!(m::RECORDS_PUBLISHED).increment(batch.rows.len() as u64);
        if let Some(row) = batch.rows.last() {
            gauge!(m::POSITION).set(row.cursor.position as f64);
        }
        let now = OffsetDateTime::now_utc();
        for row in &batch.rows {
            histogram!(m::ENQUEUE_TO_PUBLISH_SECONDS)
                .record((now - row.enqueued_at).as_seconds_f64().max(0.0));
        }
        let purge_cursor = match batch.position {
            RelayPosition::Xmin(cursor) => Some(cursor),
            RelayPosition::Logical { lsn, table_after } => {
                gauge!(m::POSITION_LSN).set(lsn.0 as f64);
                let due = slot_advance_due(batch.more, self.advanced_at.map(|at| at.elapsed()));
                if let (Some(source), true) = (&self.settings.logical, due) {
                    // A slot that lags is harmless (the next read skips what Kafka holds), so a
                    // failed advance only waits for the next batch.
                    self.advanced_at = Some(Instant::now());
                    if let Err(error) = source.advance(lsn).await {
                        warn!(%error, slot = source.slot(), %lsn, "cannot advance the replication slot; it moves with the next batch");
                    }
                }
                if table_after.is_none() {
                    self.purge_cursor(batch.purge_mark, lsn)
                } else {
                    None
                }
            }
        };
        let Some(cursor) = purge_cursor else {
            return;
        };
        // Logical mode: the copy only bounds the purge, so it is written at most once per
        // COPY_INTERVAL while batches follow each other (a statement per batch was a fifth of
        // the backends' CPU at 1,000 rows/s), and the newest is written once the relay is idle.
        if self.settings.logical.is_some()
            && self
                .copied_at
                .is_some_and(|at| at.elapsed() < COPY_INTERVAL)
        {
            self.pending_copy = Some(cursor);
            return;
        }
        self.record_copy(cursor);
    }

    /// Writes `cursor` as the published position in PostgreSQL, in a task of its own.
    fn record_copy(&mut self, cursor: OutboxCursor) {
        // One write in flight at a time; they only move the recorded position forwards. While
        // one waits (PostgreSQL slow or gone), the newest cursor waits for the next batch and the
        // loop goes on: a loop waiting on this write would hold its replication session unread,
        // which a server shutting down waits for (docs/architecture/outbox.md).
        if self
            .recording
            .as_ref()
            .is_some_and(|write| !write.is_finished())
        {
            self.pending_copy = Some(cursor);
            return;
        }
        self.pending_copy = None;
        self.copied_at = Some(Instant::now());
        let (pool, relay_name) = (self.pool.clone(), self.settings.relay_name.clone());
        self.recording = Some(tokio::spawn(async move {
            if let Err(error) = record_relayed(&pool, &relay_name, cursor).await {
                warn!(%error, order_xid = cursor.order_xid, position = cursor.position, "cannot record the published position in PostgreSQL; it catches up with the next batch");
            }
        }));
    }

    /// Logical mode: the xmin-order cursor behind which every row is published, for the purge.
    /// A mark `(xmin, lsn)` holds once the position reaches `lsn`: every transaction below `xmin`
    /// had written its commit record by then, so its rows are decoded and published (or, from
    /// before the slot, published from the table first).
    fn purge_cursor(
        &mut self,
        mark: Option<PurgeMark>,
        position: crate::pgoutput::Lsn,
    ) -> Option<OutboxCursor> {
        if let Some(mark) = mark {
            if self.purge_marks.len() >= PURGE_MARKS_KEPT {
                self.purge_marks.pop_front();
            }
            self.purge_marks.push_back(mark);
        }
        let mut reached = None;
        while let Some(&(xmin, lsn)) = self.purge_marks.front() {
            if lsn > position {
                break;
            }
            reached = Some(xmin);
            self.purge_marks.pop_front();
        }
        reached.map(|xmin| OutboxCursor {
            order_xid: xmin,
            position: 0,
        })
    }

    /// A new producer (whose `init_transactions` settles the open transaction) and the position
    /// read back from where it is authoritative. While the broker or PostgreSQL is unreachable
    /// this keeps trying: only a fatal error or a position that cannot be trusted stops it.
    async fn recover(&mut self) -> Result<(), RelayError> {
        let mut attempt = 0u32;
        let mut delays = retry_delays();
        loop {
            attempt += 1;
            let recovered = match block_in_place(|| self.settings.create_producer()) {
                Ok(producer) => {
                    self.producer = producer;
                    recover_position(&self.settings, &self.pool).await
                }
                Err(error) => Err(error),
            };
            match recovered {
                Ok(position) => {
                    self.position = position;
                    self.committed = position;
                    info!(?position, attempt, "recovered; resuming");
                    return Ok(());
                }
                Err(error)
                    if matches!(error, RelayError::Kafka(_)) || error.is_database_outage() =>
                {
                    self.progress
                        .waiting_for_outage("Kafka and PostgreSQL to recover the position");
                    let delay = delays.next().unwrap_or(MAX_RETRY_BACKOFF);
                    warn!(%error, attempt, ?delay, "cannot recover yet; retrying");
                    tokio::time::sleep(delay).await;
                }
                Err(error) => return Err(error),
            }
        }
    }
}

/// Logical mode, after a batch committed: whether to move the slot to it now. Catching up (the
/// batch was a full read), every batch: each read decodes from the slot, so a slot left behind
/// would have every read decode again what Kafka holds. Caught up, at most every
/// `ADVANCE_INTERVAL`. Pure, so eos-model's relay model decides its advances with it.
pub fn slot_advance_due(full_read: bool, since_last_advance: Option<Duration>) -> bool {
    full_read || since_last_advance.is_none_or(|since| since >= ADVANCE_INTERVAL)
}

/// The waits between attempts while PostgreSQL or the broker is unreachable.
/// The outages the reads are waiting out: how many reads failed in a row, the backoff, and when
/// the relay last checked it still owns its name (logical mode).
struct ReadOutages {
    failures: u32,
    delays: ExponentialBackoff,
    ownership_checked_at: Option<Instant>,
}

impl ReadOutages {
    fn new() -> Self {
        Self {
            failures: 0,
            delays: retry_delays(),
            ownership_checked_at: None,
        }
    }

    /// A read succeeded: ready again, and the next outage starts its backoff afresh.
    fn ended(&mut self, readiness: &Readiness) {
        if self.failures > 0 {
            self.failures = 0;
            self.delays = retry_delays();
            readiness.set(true);
            info!("reading the outbox again");
        }
    }
}

fn retry_delays() -> ExponentialBackoff {
    doubling(Duration::from_millis(200), MAX_RETRY_BACKOFF)
        .with_jitter()
        .build()
}

async fn sleep_or_shutdown(delay: Duration, shutdown: &CancellationToken) {
    tokio::select! {
        () = shutdown.cancelled() => {}
        () = tokio::time::sleep(delay) => {}
    }
}
