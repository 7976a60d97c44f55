//! The consume → decide → write loop: polls, follows rebalances, decides when the open batch is
//! due and hands it to the batch writer (`batch_writer`), which settles provider charges first
//! (`provider_settlement`). Partitions are positioned by `partition_positioning`. It runs on a
//! dedicated thread: the Kafka consumer's calls block, and database work is driven with
//! `Handle::block_on` from here, never on the reactor.
//!
//! Invariants:
//! - A partition is read only after it is *positioned*: fenced (owner epoch bumped) and sought to
//!   the checkpoint read after the fence (`--offsets postgres`), or at the Kafka group offset
//!   (`--offsets kafka`). Until then it is paused and its records are dropped.
//! - A batch is decided in memory and written in one database transaction that first moves the
//!   checkpoints (guarded by the epoch), then writes rows, conflicts and dead-letter rows, then
//!   produces the dead letters and waits for them, then commits. Kafka group offsets are
//!   committed after that, for lag dashboards only.
//! - Any failure that may pass (PostgreSQL down or restarted, a deadlock, dead letters not
//!   delivered) rolls the batch back, drops it, and re-positions every partition: fence again,
//!   re-read the checkpoint, seek. The checkpoint never moves without the rows.
//! - A checkpoint update that matches no row means a newer owner fenced us: roll back and stop.
//! - A checkpoint is the consumer's position after the batch: past its last record, and past
//!   transaction markers and aborted records that `read_committed` skipped — never past a record
//!   that was returned but not written (records are only returned for positioned partitions, and
//!   every one of those goes into the batch).
//! - After a failure, re-fencing waits for the backoff while the consumer keeps polling, so a
//!   revocation that happened meanwhile is seen before this instance bumps any epoch again.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use metrics::{counter, gauge, histogram};
use rdkafka::consumer::{CommitMode, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};
use sqlx::PgPool;
use tokio::runtime::Handle;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use eos_core::Checkpoint;
use eos_runtime::ops_http::Readiness;
use eos_runtime::progress_watch::ProgressWatch;
use eos_runtime::rebalance::{RebalanceEvent, subscribe_static_member};
use eos_schema::{Decoded, RecordDecoder, RecordFormat, SchemaError};

use crate::backoff::Backoff;
use crate::batch_writer::BatchWriter;
use crate::checkpoint_rule;
use crate::checkpoint_store::Move;
use crate::config::OffsetsMode;
use crate::dead_letters;
use crate::decision;
use crate::error::SinkError;
use crate::lag_watch::{Checkpoints, LagWatch};
pub(crate) use crate::loop_settings::LoopConsumer;
pub(crate) use crate::loop_settings::LoopSettings;
use crate::mapping::InputRecord;
use crate::metrics as m;
use crate::partition_positioning::{Positioning, partition_list};
use crate::provider_target::ProviderTarget;
use crate::schema::PreparedTarget;

/// Longest single wait for records, so the shutdown signal is seen within it.
const POLL_SLICE: Duration = Duration::from_millis(200);

/// An owned partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    /// Assigned (or to be re-positioned after a failure): paused, its records dropped.
    Pending,
    Ready {
        /// The owner epoch this instance holds (`--offsets postgres`).
        epoch: Option<i64>,
        /// The next offset expected: records below it are stale fetches and dropped.
        next: Option<i64>,
        /// The last committed checkpoint, for Kafka offsets and the lag gauge (`lag_watch.rs`).
        committed: Option<i64>,
    },
}

pub(crate) struct SinkLoop {
    settings: LoopSettings,
    runtime: Handle,
    pool: PgPool,
    targets: Arc<Vec<PreparedTarget>>,
    providers: Arc<Vec<ProviderTarget>>,
    /// Cancels waits for provider outcomes on shutdown.
    shutdown: CancellationToken,
    /// Shared with the checkpoint lag's thread (`lag_watch.rs`).
    consumer: Arc<LoopConsumer>,
    dlq: dead_letters::DeadLetterProducer,
    /// The topic's records as JSON events; asks the registry once per schema id.
    decoder: RecordDecoder,
    slots: BTreeMap<i32, Slot>,
    batch: Vec<InputRecord>,
    /// What `batch` holds in payload, key and header bytes.
    batch_bytes: usize,
    batch_started: Option<Instant>,
    /// When the last record joined the batch: `--batch-idle` counts from it.
    last_accepted: Option<Instant>,
    backoff: Backoff,
    readiness: Readiness,
    /// Told when records wait in a batch and when a batch commits (docs/OBSERVABILITY.md
    /// "Liveness").
    progress: Arc<ProgressWatch>,
    /// What the checkpoint lag is measured from, beside the loop (`lag_watch.rs`).
    checkpoints: Checkpoints,
    _lag_watch: Option<LagWatch>,
}

impl std::fmt::Debug for SinkLoop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SinkLoop")
            .field("settings", &self.settings)
            .field("slots", &self.slots)
            .finish_non_exhaustive()
    }
}

impl SinkLoop {
    pub(crate) fn new(
        settings: LoopSettings,
        runtime: Handle,
        pool: PgPool,
        targets: Arc<Vec<PreparedTarget>>,
        providers: Arc<Vec<ProviderTarget>>,
        (readiness, progress): (Readiness, Arc<ProgressWatch>),
        shutdown: CancellationToken,
    ) -> Result<Self, SinkError> {
        let consumer = Arc::new(subscribe_static_member(
            &settings.client_config,
            &settings.group_id,
            &settings.instance_id,
            &settings.topic,
        )?);
        let checkpoints = Checkpoints::default();
        let lag_watch = LagWatch::spawn(&consumer, settings.topic.clone(), checkpoints.clone());
        let dlq =
            dead_letters::create_producer(&settings.client_config, settings.dead_letter_max_bytes)?;
        let backoff = Backoff::new(settings.max_backoff);
        let decoder = RecordDecoder::new(
            settings.input_format,
            &settings.topic,
            settings.registry.clone(),
        )
        .map_err(|error| SinkError::Config(error.to_string()))?;
        Ok(Self {
            settings,
            runtime,
            pool,
            targets,
            providers,
            shutdown,
            consumer,
            dlq,
            decoder,
            slots: BTreeMap::new(),
            batch: Vec::new(),
            batch_bytes: 0,
            batch_started: None,
            last_accepted: None,
            backoff,
            readiness,
            progress,
            checkpoints,
            _lag_watch: lag_watch,
        })
    }

    /// Runs until `shutdown` is cancelled (then commits the open batch and exits cleanly) or a
    /// fatal error (fenced, a permanent database error).
    pub(crate) fn run(mut self, shutdown: &CancellationToken) -> Result<(), SinkError> {
        let result = self.run_until(shutdown);
        self.readiness.set(false);
        if result.is_ok() {
            self.commit_kafka_offsets(CommitMode::Sync);
            // Leave the group now rather than after the session timeout.
            self.consumer.unsubscribe();
            info!("stopped after committing the open batch");
        }
        result
    }

    fn run_until(&mut self, shutdown: &CancellationToken) -> Result<(), SinkError> {
        loop {
            if shutdown.is_cancelled() {
                return self.finish_on_shutdown();
            }
            self.check_fatal()?;
            if self.batch_is_due() {
                self.flush_or_recover()?;
            }
            self.position_pending()?;
            // An open batch waits for its next record only as long as the idle bound: a poll that
            // returns nothing then closes it (below).
            let wait = match self.batch_started {
                Some(started) => self
                    .settings
                    .batch_interval
                    .saturating_sub(started.elapsed())
                    .min(self.settings.batch_idle),
                None => self.settings.batch_interval,
            };
            let polled = self
                .consumer
                // At most POLL_SLICE at a time: a long --batch-interval must not delay SIGTERM.
                .poll(wait.clamp(Duration::from_millis(1), POLL_SLICE))
                .map(|result| result.map(|message| message.detach()));
            self.handle_rebalance_events();
            match polled {
                Some(Ok(message)) => self.accept(&message),
                Some(Err(error)) => self.consumer_error(error)?,
                // Nothing arrived within the wait: an open batch has all the input there is
                // (docs/architecture/loop-invariants.md "Latency"), and an empty one may still have
                // markers to commit past.
                None => {
                    let idle = self
                        .last_accepted
                        .is_some_and(|at| at.elapsed() >= self.settings.batch_idle);
                    if (idle && !self.batch.is_empty()) || self.markers_to_commit() {
                        self.flush_or_recover()?;
                    }
                    // Caught up: every partition positioned, nothing in a batch, nothing polled.
                    if self.batch.is_empty()
                        && self.slots.values().all(|slot| *slot != Slot::Pending)
                    {
                        self.progress.idle();
                    }
                }
            }
        }
    }

    fn batch_is_due(&self) -> bool {
        self.batch.len() >= self.settings.max_batch
            || self.batch_bytes >= self.settings.max_batch_bytes
            || self
                .batch_started
                .is_some_and(|started| started.elapsed() >= self.settings.batch_interval)
    }

    /// A fatal client error (e.g. this static member was fenced by a newer instance with the same
    /// id) ends the loop: a zombie must not go on.
    fn check_fatal(&self) -> Result<(), SinkError> {
        match self.consumer.client().fatal_error() {
            Some((code, reason)) => {
                error!(%code, reason, "fatal Kafka client error; this instance is fenced or broken");
                Err(SinkError::Fatal(KafkaError::MessageConsumptionFatal(code)))
            }
            None => Ok(()),
        }
    }

    fn consumer_error(&self, error: KafkaError) -> Result<(), SinkError> {
        if let KafkaError::MessageConsumptionFatal(_) = error {
            return Err(SinkError::Fatal(error));
        }
        // Broker disconnects and the like: librdkafka retries by itself.
        warn!(%error, "consumer error");
        Ok(())
    }

    fn accept(&mut self, message: &rdkafka::message::OwnedMessage) {
        let partition = message.partition();
        let offset = message.offset();
        let Some(Slot::Ready { next, .. }) = self.slots.get_mut(&partition) else {
            // Not positioned yet (or revoked in the same poll): whoever positions it reads it.
            debug!(
                partition,
                offset, "record of an unpositioned partition dropped"
            );
            return;
        };
        if !checkpoint_rule::accepts_record(*next, offset) {
            debug!(partition, offset, "stale record from before a seek dropped");
            return;
        }
        if let Err(error) = self.decoder.prepare(message.payload()) {
            self.registry_unreachable(partition, offset, &error);
            return;
        }
        let Some(Slot::Ready { next, .. }) = self.slots.get_mut(&partition) else {
            return;
        };
        *next = Some(offset + 1);
        let headers = message
            .headers()
            .map(|headers| {
                headers
                    .iter()
                    .map(|h| (h.key.to_owned(), h.value.map(<[u8]>::to_vec)))
                    .collect()
            })
            .unwrap_or_default();
        let record = InputRecord {
            topic: message.topic().to_owned(),
            partition,
            offset,
            key: message.key().map(<[u8]>::to_vec),
            payload: message.payload().map(<[u8]>::to_vec),
            headers,
            timestamp_ms: message.timestamp().to_millis(),
            decoded: self.decoded(message.payload()),
        };
        self.progress
            .working("a batch to be committed to PostgreSQL");
        self.batch_bytes += record_bytes(&record);
        self.batch.push(record);
        let now = Instant::now();
        self.batch_started.get_or_insert(now);
        self.last_accepted = Some(now);
    }

    fn handle_rebalance_events(&mut self) {
        let events = self.consumer.context().take();
        let rebalanced = !events.is_empty();
        for event in events {
            match event {
                RebalanceEvent::Revoked { partitions, lost } => {
                    // The undecided records of these partitions go: their next owner reads them
                    // again from the checkpoint. Nothing of them was written.
                    let before = self.batch.len();
                    self.batch.retain(|r| !partitions.contains(&r.partition));
                    self.batch_bytes = self.batch.iter().map(record_bytes).sum();
                    if self.batch.is_empty() {
                        self.batch_started = None;
                    }
                    for partition in &partitions {
                        self.slots.remove(partition);
                    }
                    info!(
                        ?partitions,
                        lost,
                        dropped_records = before - self.batch.len(),
                        "partitions revoked"
                    );
                }
                RebalanceEvent::Assigned { partitions } => {
                    info!(
                        ?partitions,
                        "partitions assigned; fencing and reading checkpoints"
                    );
                    self.pause(&partitions);
                    for partition in partitions {
                        self.slots.insert(partition, Slot::Pending);
                    }
                    // A new assignment is worth an immediate attempt even while backing off.
                    self.backoff.try_now();
                }
            }
        }
        gauge!(m::ASSIGNED_PARTITIONS).set(self.slots.len() as f64);
        self.readiness
            .set(!self.slots.is_empty() && self.slots.values().all(|s| *s != Slot::Pending));
        if rebalanced {
            self.publish_checkpoints();
        }
    }

    /// Tells the lag's thread the committed checkpoint of each owned partition.
    fn publish_checkpoints(&self) {
        self.checkpoints
            .publish(self.slots.iter().map(|(&partition, slot)| match slot {
                Slot::Pending => (partition, None),
                Slot::Ready { committed, .. } => (partition, Some(*committed)),
            }));
    }

    fn pause(&self, partitions: &[i32]) {
        if partitions.is_empty() {
            return;
        }
        if let Err(error) = self
            .consumer
            .pause(&partition_list(&self.settings.topic, partitions))
        {
            warn!(%error, ?partitions, "cannot pause partitions; their records are dropped until positioned");
        }
    }

    fn pending(&self) -> Vec<i32> {
        self.slots
            .iter()
            .filter(|(_, slot)| **slot == Slot::Pending)
            .map(|(partition, _)| *partition)
            .collect()
    }

    /// A registry format's value as the JSON event model, or why it does not decode; `None` on a
    /// JSON topic (the payload is the event) and for a tombstone.
    fn decoded(&self, value: Option<&[u8]>) -> Option<Result<Decoded<'static>, String>> {
        if self.settings.input_format == RecordFormat::Json {
            return None;
        }
        self.decoder
            .decode(value)
            .map(|decoded| decoded.map(Decoded::into_owned))
            .transpose()
    }

    /// Fences, reads checkpoints and seeks every pending partition (when the backoff allows).
    fn position_pending(&mut self) -> Result<(), SinkError> {
        let pending = self.pending();
        if pending.is_empty() || !self.backoff.due() {
            return Ok(());
        }
        let positioning = Positioning {
            settings: &self.settings,
            runtime: &self.runtime,
            pool: &self.pool,
            consumer: &self.consumer,
        };
        let starts = match positioning.starts(&pending, &mut self.backoff) {
            Ok(starts) => starts,
            Err(SinkError::Transient(error)) => {
                self.retry_later("fencing and reading checkpoints", &error);
                return Ok(());
            }
            Err(error) => return Err(error),
        };
        let mut ready = Vec::new();
        for start in positioning.seek(&starts, &mut self.backoff)? {
            let (partition, epoch, next) = (start.partition, start.epoch, start.next_offset());
            // Only a partition still assigned (no revoke in between) becomes ready.
            if let Some(slot) = self.slots.get_mut(&partition) {
                *slot = Slot::Ready {
                    epoch,
                    next,
                    committed: next,
                };
                ready.push(partition);
                info!(partition, ?epoch, next_offset = ?next, "partition positioned");
            }
        }
        if !ready.is_empty() {
            self.publish_checkpoints();
        }
        if !ready.is_empty()
            && let Err(error) = self
                .consumer
                .resume(&partition_list(&self.settings.topic, &ready))
        {
            warn!(%error, "cannot resume partitions");
        }
        self.readiness
            .set(!self.slots.is_empty() && self.slots.values().all(|s| *s != Slot::Pending));
        Ok(())
    }

    /// The registry cannot name a record's schema (transient): nothing of the record is decided.
    /// The open batch is dropped and every partition read again from its checkpoint once the
    /// backoff allows, so the record is asked for again and never skipped; meanwhile `/readyz`
    /// fails and the stall watch names the registry.
    fn registry_unreachable(&mut self, partition: i32, offset: i64, error: &SchemaError) {
        self.progress
            .waiting_for_outage("the schema registry to answer");
        let (attempt, delay) = self.backoff.failed();
        warn!(
            partition,
            offset,
            attempt,
            retry_in_ms = delay.as_millis() as u64,
            %error,
            "the schema registry does not answer; reading again from the checkpoint"
        );
        self.rewind_all();
    }

    fn retry_later(&mut self, what: &str, error: &sqlx::Error) {
        self.progress.waiting_for_outage("PostgreSQL to answer");
        counter!(m::DB_RETRIES).increment(1);
        let (attempt, delay) = self.backoff.failed();
        warn!(
            attempt,
            retry_in_ms = delay.as_millis() as u64,
            %error,
            "postgres unavailable while {what}; retrying"
        );
    }

    /// Rolls back (already done by the caller), drops the batch and re-positions every partition:
    /// whatever was not committed is read again from the checkpoint.
    fn rewind_all(&mut self) {
        let partitions: Vec<i32> = self.slots.keys().copied().collect();
        self.pause(&partitions);
        for slot in self.slots.values_mut() {
            *slot = Slot::Pending;
        }
        self.batch.clear();
        self.batch_bytes = 0;
        self.batch_started = None;
        self.readiness.set(false);
    }

    fn flush_or_recover(&mut self) -> Result<(), SinkError> {
        match self.flush() {
            Ok(()) => Ok(()),
            Err(SinkError::Transient(error)) => {
                counter!(m::BATCHES, "outcome" => "rolled_back").increment(1);
                self.retry_later("writing a batch", &error);
                self.rewind_all();
                Ok(())
            }
            Err(SinkError::DeadLetter(error)) => {
                counter!(m::BATCHES, "outcome" => "rolled_back").increment(1);
                warn!(%error, "dead letters not delivered; batch rolled back, retrying");
                self.backoff.failed();
                self.rewind_all();
                Ok(())
            }
            Err(SinkError::Provider(error)) => {
                // The provider (or dedup-service) does not settle: a restart would not help.
                self.progress
                    .waiting_for_outage("final outcomes from a provider target");
                counter!(m::BATCHES, "outcome" => "rolled_back").increment(1);
                warn!(%error, "provider outcomes not final; batch not committed, retrying from the checkpoint");
                self.backoff.failed();
                self.rewind_all();
                Ok(())
            }
            Err(error) => Err(error),
        }
    }

    /// SIGTERM: commit the open batch (retrying while PostgreSQL is briefly away), then stop.
    fn finish_on_shutdown(&mut self) -> Result<(), SinkError> {
        let deadline = Instant::now() + self.settings.shutdown_timeout;
        loop {
            match self.flush() {
                Ok(()) => return Ok(()),
                Err(SinkError::Transient(error)) if Instant::now() < deadline => {
                    self.retry_later("committing the last batch", &error);
                    std::thread::sleep(self.backoff.remaining());
                }
                Err(SinkError::Provider(error)) => {
                    // Nothing of the open batch is committed; the next owner replays it and
                    // dedup-service answers what this run already settled.
                    warn!(%error, records = self.batch.len(), "stopping with the open batch uncommitted");
                    self.batch.clear();
                    self.batch_bytes = 0;
                    return Ok(());
                }
                Err(error) => return Err(error),
            }
        }
    }

    /// The consumer's position per owned partition: the offset after the last record returned,
    /// or past transaction markers and aborted records that `read_committed` skipped.
    fn consumer_positions(&self) -> Vec<Checkpoint> {
        let Ok(list) = self.consumer.position() else {
            return Vec::new();
        };
        list.elements_for_topic(&self.settings.topic)
            .iter()
            .filter_map(|elem| {
                let next_offset = elem.offset().to_raw().filter(|offset| *offset >= 0)?;
                Some(Checkpoint {
                    topic: self.settings.topic.clone(),
                    partition: elem.partition(),
                    next_offset,
                })
            })
            .collect()
    }

    /// Where each partition's checkpoint goes with this batch: past its last record, and past any
    /// control records (commit markers) and aborted records behind it. Without the latter, a sink
    /// on a transactional topic (eos-processor's output) would stop one short of the end of every
    /// partition, and its lag would never reach zero.
    fn checkpoint_moves(&self) -> Vec<Move> {
        let mut next_offsets = decision::next_offsets(&self.batch);
        for position in self.consumer_positions() {
            let Some(Slot::Ready { committed, .. }) = self.slots.get(&position.partition) else {
                continue;
            };
            let floor = next_offsets
                .get(&position.partition)
                .copied()
                .or(*committed);
            if floor.is_none_or(|floor| position.next_offset > floor) {
                next_offsets.insert(position.partition, position.next_offset);
            }
        }
        next_offsets
            .into_iter()
            .map(|(partition, next_offset)| {
                let epoch = match self.slots.get(&partition) {
                    Some(Slot::Ready { epoch, .. }) => *epoch,
                    _ => None,
                };
                // docs/architecture/loop-invariants.md "Loop invariants": with checkpoints in
                // PostgreSQL a checkpoint moves only under the owner epoch this instance holds for
                // its partition, taken when it was positioned.
                debug_assert!(
                    self.settings.offsets != OffsetsMode::Postgres || epoch.is_some(),
                    "partition {partition}: a checkpoint move without an owner epoch"
                );
                let epoch = epoch.unwrap_or(0);
                Move {
                    to: Checkpoint {
                        topic: self.settings.topic.clone(),
                        partition,
                        next_offset,
                    },
                    epoch,
                }
            })
            .collect()
    }

    /// An idle partition whose position moved past what is committed (only markers or aborted
    /// records arrived): worth a checkpoint-only transaction.
    fn markers_to_commit(&self) -> bool {
        self.batch.is_empty()
            && self.consumer_positions().into_iter().any(|position| {
                matches!(
                    self.slots.get(&position.partition),
                    Some(Slot::Ready { committed, .. })
                        if committed.is_none_or(|committed| position.next_offset > committed)
                )
            })
    }

    /// Writes the open batch in one transaction. On success the batch is cleared and the Kafka
    /// group offsets follow; on error the batch is kept for the caller to retry or drop.
    fn flush(&mut self) -> Result<(), SinkError> {
        let moves = self.checkpoint_moves();
        if self.batch.is_empty() && moves.is_empty() {
            self.batch_started = None;
            return Ok(());
        }
        if let Some(stall) = self
            .settings
            .fault_stall_before_commit
            .filter(|_| !self.batch.is_empty())
        {
            info!(
                records = self.batch.len(),
                stall_ms = stall.as_millis() as u64,
                "fault injection: stalling before the batch transaction"
            );
            std::thread::sleep(stall);
        }
        let started = Instant::now();
        let report = {
            let writer = BatchWriter {
                settings: &self.settings,
                pool: &self.pool,
                targets: &self.targets,
                providers: &self.providers,
                shutdown: &self.shutdown,
                dlq: &self.dlq,
            };
            let records = &self.batch;
            let moves = &moves;
            self.runtime.block_on(writer.write(records, moves))?
        };
        histogram!(m::BATCH_SECONDS).record(started.elapsed().as_secs_f64());
        histogram!(m::BATCH_RECORDS).record(report.records as f64);
        report.record_metrics();
        if report.held_any() {
            self.settings.held_refresh.notify_one();
        }
        for Move { to, .. } in &moves {
            if let Some(Slot::Ready { committed, .. }) = self.slots.get_mut(&to.partition) {
                // docs/architecture/loop-invariants.md "Loop invariants": a checkpoint only moves
                // forward.
                debug_assert!(
                    committed.is_none_or(|committed| to.next_offset >= committed),
                    "partition {}: checkpoint moved back from {committed:?} to {}",
                    to.partition,
                    to.next_offset
                );
                *committed = Some(to.next_offset);
            }
        }
        self.publish_checkpoints();
        debug!(
            records = report.records,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "batch committed"
        );
        self.batch.clear();
        self.batch_bytes = 0;
        self.batch_started = None;
        self.backoff.reset();
        self.progress.progressed();
        self.commit_kafka_offsets(CommitMode::Async);
        Ok(())
    }

    /// After the database commit: the group offsets follow the checkpoints (`--offsets kafka`:
    /// they are the checkpoints).
    fn commit_kafka_offsets(&self, mode: CommitMode) {
        let mut list = TopicPartitionList::new();
        for (&partition, slot) in &self.slots {
            if let Slot::Ready {
                committed: Some(next),
                ..
            } = slot
                && list
                    .add_partition_offset(&self.settings.topic, partition, Offset::Offset(*next))
                    .is_err()
            {
                return;
            }
        }
        if list.count() == 0 {
            return;
        }
        if let Err(error) = self.consumer.commit(&list, mode) {
            warn!(%error, "cannot commit Kafka group offsets (lag dashboards lag)");
        }
    }
}

/// The bytes a record holds beyond its fixed fields.
fn record_bytes(record: &InputRecord) -> usize {
    let headers: usize = record
        .headers
        .iter()
        .map(|(key, value)| key.len() + value.as_ref().map_or(0, Vec::len))
        .sum();
    record.key.as_ref().map_or(0, Vec::len) + record.payload.as_ref().map_or(0, Vec::len) + headers
}
