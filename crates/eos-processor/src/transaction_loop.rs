//! The read-process-write loop. It runs on a dedicated thread because every transactional call
//! blocks up to its timeout.
//!
//! Exactly-once: records flow into the open transaction as they are decided, as Kafka Streams
//! produces them: the first record decided after a commit begins a transaction, each output and
//! dead letter is sent at once, and on the commit interval (counted from when the first record
//! was written, see `batch_deadline`) or a full batch the changelog records, the consumed
//! offsets and the commit follow. A `read_committed` reader sees them at the
//! commit either way; sending as decided takes the write of the whole batch off the time between
//! the interval's end and the commit (docs/ARCHITECTURE.md, "Latency").
//!
//! A transaction is therefore open while the consumer polls, and a rebalance (its callbacks run
//! inside `poll`) can revoke partitions whose outputs it holds. They are never committed: when
//! `poll` returns with partitions revoked or lost, the open transaction is aborted before anything
//! else happens, its undecided state changes are dropped, and whoever owns the partitions next
//! re-reads them from the committed offsets. A zombie that misses the revoke is still kept out by
//! the group generation in its offset commit (KIP-447), which fails the transaction.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use metrics::{counter, gauge, histogram};
use opentelemetry::trace::{SpanContext, TraceContextExt as _};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders, OwnedMessage};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, info_span, warn};
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use eos_core::{DeadLetterReason, Guarantee, dead_letter};
use eos_runtime::backoff::{BlockingRetryable as _, doubling};
use eos_runtime::kafka_errors::passes_by_itself;
use eos_runtime::ops_http::Readiness;
use eos_runtime::rebalance::{RebalanceEvent, RebalanceRecorder, subscribe_static_member};
use eos_runtime::trace_context;

use crate::changelog;
use crate::consumed_positions::ConsumedPositions;
use crate::error::ProcessorError;
use crate::metrics as m;
use crate::partition_state::{
    Decision, DecisionPolicy, EXPIRY_SWEEP_MAX, InputRecord, Overlay, PartitionState,
};
use crate::state_store::{StateChanges, StateStore};
use crate::transform::{DEFAULT_OUTPUT, SourcePosition, Transform};
use eos_runtime::transactional_producer::{PendingRecord, TransactionalProducer, TxnFailure};

/// How often committed ids past the horizon are swept into tombstones, per partition. A sweep
/// reads only the expired end of the store's expiry index, so it can be frequent.
const EXPIRY_SWEEP_INTERVAL: Duration = Duration::from_secs(1);

/// How often the local checkpoint of each changelog partition is moved up to what the store
/// holds (an fsync of the store each): what a restart on the same disk reads of the changelog is
/// about this much of its tail.
const CHECKPOINT_INTERVAL: Duration = Duration::from_secs(1);

/// A checkpoint with nothing written after it is rewritten this often, so its age (checked
/// against the changelog's `delete.retention.ms`) stays that of the last time it was true.
const CHECKPOINT_REFRESH: Duration = Duration::from_secs(3600);

/// What this instance knows of the end of one changelog partition it owns.
#[derive(Debug, Clone, Copy)]
struct ChangelogEnd {
    /// The store's checkpoint: it equals the changelog below this offset.
    checkpointed: i64,
    checkpointed_at: Instant,
    /// Where the changelog ends if only this instance wrote to it since the restore: each
    /// committed batch adds its records plus a commit marker (exactly-once). `None` after an
    /// abort (how much of an aborted batch reached the log is unknown): the checkpoint then
    /// stays until the next restore.
    expected_end: Option<i64>,
}

/// Everything the loop needs, resolved from the configuration.
#[derive(Debug, Clone)]
pub struct LoopSettings {
    pub guarantee: Guarantee,
    pub input_topic: String,
    /// Output name → topic; always holds [`crate::transform::DEFAULT_OUTPUT`].
    pub outputs: BTreeMap<String, String>,
    pub dlq_topic: String,
    pub changelog_topic: String,
    pub group_id: String,
    /// Static group membership: a restarted instance takes its partitions back at once instead of
    /// waiting out the dead member's session.
    pub instance_id: String,
    pub transactional_id: String,
    pub commit_interval: Duration,
    pub max_batch: usize,
    pub policy: DecisionPolicy,
    pub transaction_timeout: Duration,
    pub fault_abort_every: Option<u64>,
    /// The largest dead letter the producer can write: its `message.max.bytes`, or the dead-letter
    /// topic's `max.message.bytes` when smaller (see `eos_core::dead_letter::build`).
    pub dead_letter_max_bytes: usize,
    /// Connection settings shared by every client.
    pub client_config: ClientConfig,
    /// This instance's state store directory (see `state_store::instance_dir`).
    pub state_dir: PathBuf,
    /// The changelog's `delete.retention.ms`: a local checkpoint older than this is not trusted.
    pub changelog_delete_retention: Duration,
    /// This start created the changelog: local state of a changelog by that name is stale.
    pub changelog_created: bool,
}

impl LoopSettings {
    fn call_timeout(&self) -> Duration {
        self.transaction_timeout.max(Duration::from_secs(10))
    }

    fn create_producer(&self) -> Result<TransactionalProducer, ProcessorError> {
        let mut config = self.client_config.clone();
        // The broker checks a topic's max.message.bytes against a whole record batch: batches of
        // at most the dead-letter limit, so that dead letters that each fit are never refused
        // together (an aborted transaction, then the same batch again). With the default limits
        // this is librdkafka's own default; a smaller -X batch.size stays.
        let batch_bytes = config
            .get("batch.size")
            .and_then(|value| value.parse::<usize>().ok())
            .map_or(self.dead_letter_max_bytes, |set| {
                set.min(self.dead_letter_max_bytes)
            });
        config.set("batch.size", batch_bytes.to_string());
        TransactionalProducer::new(
            &config,
            self.guarantee,
            &self.transactional_id,
            self.transaction_timeout,
            self.call_timeout(),
        )
        .map_err(ProcessorError::from)
    }

    fn restore_timeout(&self) -> Duration {
        // How long a restore may make no progress: a crashed owner's open transaction holds the
        // changelog's LSO until the broker aborts it.
        self.transaction_timeout * 3 + Duration::from_secs(30)
    }
}

type LoopConsumer = BaseConsumer<RebalanceRecorder>;

#[derive(Debug, Default)]
struct BatchCounts {
    records_in: u64,
    outputs: u64,
    duplicates: u64,
    dead_letters: HashMap<DeadLetterReason, u64>,
}

/// Span links a transaction span keeps: OpenTelemetry's default limit per span.
const MAX_SPAN_LINKS: usize = 128;

/// The open batch: decided but not yet written.
#[derive(Debug)]
struct Batch<S> {
    /// When the batch is committed at the latest (see [`batch_deadline`]); set by its first
    /// record.
    due: Option<Instant>,
    records: Vec<PendingRecord>,
    overlays: HashMap<i32, Overlay<S>>,
    positions: ConsumedPositions,
    counts: BatchCounts,
    /// The `process` spans of its first records: the transaction span links to them, since one
    /// transaction has many inputs (and so no single parent).
    links: Vec<SpanContext>,
    /// Exactly-once: a transaction is open with this batch's records sent so far (`records`
    /// then holds only what was decided since the last send).
    transaction_open: bool,
}

impl<S> Default for Batch<S> {
    fn default() -> Self {
        Self {
            due: None,
            records: Vec::new(),
            overlays: HashMap::new(),
            positions: ConsumedPositions::default(),
            counts: BatchCounts::default(),
            links: Vec::new(),
            transaction_open: false,
        }
    }
}

impl<S> Batch<S> {
    fn is_empty(&self) -> bool {
        self.counts.records_in == 0
    }
}

pub struct TransactionLoop<T: Transform> {
    settings: LoopSettings,
    transform: T,
    consumer: LoopConsumer,
    producer: TransactionalProducer,
    store: Arc<StateStore>,
    states: HashMap<i32, PartitionState<T::State>>,
    changelog_ends: HashMap<i32, ChangelogEnd>,
    last_checkpoint: Instant,
    last_sweep: HashMap<i32, Instant>,
    batch: Batch<T::State>,
    /// Per owned partition, the offset this instance last committed (unknown after assignment).
    committed_next: HashMap<i32, i64>,
    transactions_written: u64,
    readiness: Readiness,
}

impl<T: Transform> std::fmt::Debug for TransactionLoop<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransactionLoop")
            .field("settings", &self.settings)
            .field("partitions", &self.states.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl<T: Transform> TransactionLoop<T> {
    /// Creates the clients; in exactly-once mode `init_transactions` fences any earlier instance
    /// with the same `transactional.id` and aborts its open transaction.
    pub fn new(
        settings: LoopSettings,
        transform: T,
        readiness: Readiness,
    ) -> Result<Self, ProcessorError> {
        let store = match StateStore::open(&settings.state_dir) {
            Ok(store) => store,
            // A paused or hung predecessor with the same identity still holds the store (it is
            // fenced as soon as this instance starts): a store of this process's own, restored
            // cold from the changelog, instead of refusing to take over.
            Err(crate::state_store::StoreError::Open { path, detail })
                if detail.contains("another process") =>
            {
                let own = PathBuf::from(format!(
                    "{}.pid{}",
                    settings.state_dir.display(),
                    std::process::id()
                ));
                warn!(
                    held = %path.display(),
                    store = %own.display(),
                    "the state store is held by another process; using a store of this process"
                );
                StateStore::open(&own)?
            }
            Err(error) => return Err(error.into()),
        };
        let keep = if settings.changelog_created {
            None
        } else {
            Some(settings.changelog_topic.as_str())
        };
        let dropped = store.drop_changelogs_except(keep)?;
        info!(
            store = store.location(),
            dropped_tables = dropped,
            "state store open"
        );
        let producer = settings.create_producer()?;
        let consumer = subscribe_static_member(
            &settings.client_config,
            &settings.group_id,
            &settings.instance_id,
            &settings.input_topic,
        )?;
        Ok(Self {
            settings,
            transform,
            consumer,
            producer,
            store,
            states: HashMap::new(),
            changelog_ends: HashMap::new(),
            last_checkpoint: Instant::now(),
            last_sweep: HashMap::new(),
            batch: Batch::default(),
            committed_next: HashMap::new(),
            transactions_written: 0,
            readiness,
        })
    }

    /// Runs until `shutdown` is cancelled (then commits the open batch) or a fatal error.
    pub fn run(mut self, shutdown: &CancellationToken) -> Result<(), ProcessorError> {
        let result = self.run_until(shutdown);
        self.readiness.set(false);
        if result.is_ok() {
            self.checkpoint_on_shutdown();
            // Leave the group now rather than after the session timeout.
            self.consumer.unsubscribe();
            info!("stopped after committing the open batch");
        }
        result
    }

    fn run_until(&mut self, shutdown: &CancellationToken) -> Result<(), ProcessorError> {
        loop {
            if shutdown.is_cancelled() {
                return self.finish_batch();
            }
            self.check_fatal()?;
            let wait = match self.batch.due {
                Some(due) => due.saturating_duration_since(Instant::now()),
                None => self.settings.commit_interval,
            };
            let polled = self
                .consumer
                .poll(wait)
                .map(|result| result.map(|message| message.detach()));
            self.handle_rebalance_events()?;
            match polled {
                Some(Ok(message)) => {
                    self.decide(&message)?;
                    match self.settings.guarantee {
                        Guarantee::ExactlyOnce => self.send_decided_in_transaction()?,
                        Guarantee::AtLeastOnce => self.send_decided_now()?,
                    }
                }
                Some(Err(error)) => self.consumer_error(error)?,
                None if self.batch.is_empty() => self.commit_markers_passed()?,
                None => {}
            }
            if self.batch.is_empty() && self.last_checkpoint.elapsed() >= CHECKPOINT_INTERVAL {
                self.advance_checkpoints()?;
            }
            let full = self.batch.counts.records_in as usize >= self.settings.max_batch;
            let due = self.batch.due.is_some_and(|due| Instant::now() >= due);
            if full || due {
                self.finish_batch()?;
            }
        }
    }

    /// A fatal client error (e.g. this static member or transactional id was fenced by a newer
    /// instance) ends the loop: a zombie must not go on. A producer fence while the consumer
    /// still holds the membership is recovered from instead (see [`Self::fenced_or_fatal`]).
    fn check_fatal(&mut self) -> Result<(), ProcessorError> {
        if self.consumer.client().fatal_error().is_none()
            && let Some((code, _)) = self.producer.fatal_error()
            && lost_its_transaction(code)
        {
            return self.fenced_or_fatal(KafkaError::Global(code));
        }
        let fatal = self
            .consumer
            .client()
            .fatal_error()
            .or_else(|| self.producer.fatal_error());
        match fatal {
            Some((code, reason)) => {
                tracing::error!(%code, reason, "fatal client error; this instance is fenced or broken");
                Err(ProcessorError::Fatal(KafkaError::MessageConsumptionFatal(
                    code,
                )))
            }
            None => Ok(()),
        }
    }

    fn consumer_error(&self, error: KafkaError) -> Result<(), ProcessorError> {
        if let KafkaError::MessageConsumptionFatal(_) = error {
            return Err(ProcessorError::Fatal(error));
        }
        // Broker disconnects and the like: librdkafka retries by itself.
        warn!(%error, "consumer error");
        Ok(())
    }

    fn handle_rebalance_events(&mut self) -> Result<(), ProcessorError> {
        for event in self.consumer.context().take() {
            match event {
                RebalanceEvent::Revoked { partitions, lost } => {
                    // The uncommitted batch goes (see the module doc), and with it the open
                    // transaction holding its outputs.
                    let transaction_open = self.batch.transaction_open;
                    if !self.batch.is_empty() {
                        info!(
                            records = self.batch.counts.records_in,
                            lost,
                            transaction_open,
                            "dropping the uncommitted batch: partitions revoked"
                        );
                    }
                    self.batch = Batch::default();
                    for partition in &partitions {
                        // Its store and checkpoint stay: if it comes back, the restore reads the
                        // changelog from that checkpoint.
                        self.states.remove(partition);
                        self.changelog_ends.remove(partition);
                        self.committed_next.remove(partition);
                    }
                    if transaction_open {
                        warn!(
                            ?partitions,
                            lost,
                            "aborting the open transaction: it holds outputs of revoked \
                             partitions, which their next owner writes"
                        );
                        self.abort_open_transaction()?;
                    }
                    info!(?partitions, lost, "partitions revoked");
                    self.readiness.set(false);
                }
                RebalanceEvent::Assigned { partitions } => {
                    info!(?partitions, "partitions assigned; restoring state");
                    for &partition in &partitions {
                        self.restore(partition)?;
                    }
                    self.readiness.set(true);
                }
            }
        }
        gauge!(m::ASSIGNED_PARTITIONS).set(self.states.len() as f64);
        Ok(())
    }

    fn restore(&mut self, partition: i32) -> Result<(), ProcessorError> {
        let started = Instant::now();
        // A fresh handle: a cached read view of the old one must not outlive the restore.
        self.states.remove(&partition);
        let store = self
            .store
            .partition(&self.settings.changelog_topic, partition)?;
        let outcome = changelog::restore_partition(
            &self.transform,
            &self.settings.client_config,
            &self.settings.changelog_topic,
            partition,
            self.settings.restore_timeout(),
            &store,
            self.settings.changelog_delete_retention,
        )?;
        let (entities, seen_ids) = store.counts()?;
        histogram!(m::RESTORE_SECONDS, "mode" => outcome.mode.as_str())
            .record(started.elapsed().as_secs_f64());
        counter!(m::RESTORED_RECORDS, "mode" => outcome.mode.as_str()).increment(outcome.records);
        info!(
            partition,
            restore = outcome.mode.as_str(),
            cold_reason = outcome.reason,
            changelog_records = outcome.records,
            from_offset = outcome.from_offset,
            next_offset = outcome.next_offset,
            entities,
            seen_ids,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "state restored"
        );
        self.changelog_ends.insert(
            partition,
            ChangelogEnd {
                checkpointed: outcome.next_offset,
                checkpointed_at: Instant::now(),
                expected_end: Some(outcome.next_offset),
            },
        );
        self.states.insert(partition, PartitionState::new(store));
        Ok(())
    }

    /// Moves each owned partition's local checkpoint up to the changelog's end, when that end is
    /// exactly where this instance's own committed batches put it: then every record below it
    /// is in the store. Any other end (a commit marker not written yet, or records of another
    /// writer, such as a zombie's or a former owner's late abort marker) leaves the checkpoint
    /// where it is: too low is only more to read at a restart, too high would skip state.
    fn advance_checkpoints(&mut self) -> Result<(), ProcessorError> {
        self.last_checkpoint = Instant::now();
        for (&partition, end) in &mut self.changelog_ends {
            let Some(expected_end) = end.expected_end else {
                continue;
            };
            if expected_end == end.checkpointed
                && end.checkpointed_at.elapsed() < CHECKPOINT_REFRESH
            {
                continue;
            }
            let Some(state) = self.states.get(&partition) else {
                continue;
            };
            let high = match self.consumer.fetch_watermarks(
                &self.settings.changelog_topic,
                partition,
                Duration::from_secs(5),
            ) {
                Ok((_, high)) => high,
                Err(error) => {
                    debug!(partition, %error, "changelog end not readable; checkpoint later");
                    continue;
                }
            };
            if high != expected_end {
                debug!(
                    partition,
                    high, expected_end, "changelog end not (yet) where this instance left it"
                );
                continue;
            }
            state.store().write(&StateChanges::default(), Some(high))?;
            end.checkpointed = high;
            end.checkpointed_at = Instant::now();
        }
        Ok(())
    }

    /// After the last commit: the commit markers are written a moment after the commit returns,
    /// so a few tries to leave checkpoints at the very end.
    fn checkpoint_on_shutdown(&mut self) {
        for _ in 0..10 {
            if let Err(error) = self.advance_checkpoints() {
                warn!(%error, "cannot write the local checkpoint at shutdown");
                return;
            }
            let behind = self
                .changelog_ends
                .values()
                .any(|end| end.expected_end.is_some_and(|e| e != end.checkpointed));
            if !behind {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn decide(&mut self, message: &OwnedMessage) -> Result<(), ProcessorError> {
        let partition = message.partition();
        let Some(state) = self.states.get(&partition) else {
            // Only possible for a partition revoked in the same poll; its new owner reads it.
            debug!(
                partition,
                offset = message.offset(),
                "record of an unowned partition skipped"
            );
            return Ok(());
        };
        let now = time::OffsetDateTime::now_utc().unix_timestamp();
        let batch = &mut self.batch;
        batch.due.get_or_insert_with(|| {
            batch_deadline(
                Instant::now(),
                record_age(message.timestamp()),
                self.settings.commit_interval,
            )
        });
        let overlay = match batch.overlays.entry(partition) {
            std::collections::hash_map::Entry::Occupied(entry) => entry.into_mut(),
            std::collections::hash_map::Entry::Vacant(entry) => {
                let mut overlay = Overlay::default();
                let last = self
                    .last_sweep
                    .entry(partition)
                    .or_insert_with(Instant::now);
                if last.elapsed() >= EXPIRY_SWEEP_INTERVAL {
                    *last = Instant::now();
                    let expired = state.expire(&mut overlay, now)?;
                    if expired > 0 {
                        info!(partition, expired, "dedup ids past the horizon tombstoned");
                    }
                    if expired >= EXPIRY_SWEEP_MAX {
                        // More are due: sweep again in the next batch.
                        if let Some(earlier) = last.checked_sub(EXPIRY_SWEEP_INTERVAL) {
                            *last = earlier;
                        }
                    }
                }
                entry.insert(overlay)
            }
        };
        let source = SourcePosition {
            topic: message.topic().to_owned(),
            partition,
            offset: message.offset(),
        };
        let event_id_header = message
            .headers()
            .and_then(trace_context::event_id_header)
            .unwrap_or_default()
            .to_owned();
        // The event id as baggage too, so the output's headers carry it to the next service even
        // when the producer sent no baggage.
        let parent = message
            .headers()
            .map(trace_context::extract_kafka)
            .unwrap_or_default();
        let parent = if event_id_header.is_empty() {
            parent
        } else {
            trace_context::context_with_event_id(&parent, &event_id_header)
        };
        let span = info_span!(
            "process",
            otel.name = "eos-processor process",
            otel.kind = "consumer",
            event_id = %event_id_header,
            messaging.system = "kafka",
            messaging.operation.type = "process",
            messaging.destination.name = %source.topic,
            messaging.destination.partition.id = %partition,
            messaging.consumer.group.name = %self.settings.group_id,
            messaging.kafka.offset = source.offset,
            eos.decision = tracing::field::Empty,
        );
        let _ = span.set_parent(parent.clone());
        let headers: Vec<(&str, Option<&[u8]>)> = message
            .headers()
            .map(|headers| {
                headers
                    .iter()
                    .map(|header| (header.key, header.value))
                    .collect()
            })
            .unwrap_or_default();
        let record = InputRecord {
            key: message.key(),
            value: message.payload(),
            headers: &headers,
            timestamp_secs: message.timestamp().to_millis().unwrap_or(0) / 1000,
        };
        let decision = state.decide(
            overlay,
            &self.transform,
            record,
            &source,
            now,
            &self.settings.policy,
        )?;
        batch.counts.records_in += 1;
        batch.positions.read(partition, message.offset());
        if batch.links.len() < MAX_SPAN_LINKS {
            let span_context = span.context().span().span_context().clone();
            if span_context.is_valid() {
                batch.links.push(span_context);
            }
        }
        match decision {
            Decision::Emit {
                event_id,
                entity_id,
                outputs,
            } => {
                span.record("eos.decision", "emit");
                // Without an exporter the span has no context of its own: pass the input's on.
                let span_cx = span.context();
                let cx = if span_cx.span().span_context().is_valid() {
                    span_cx
                } else {
                    parent
                };
                let cx = trace_context::context_with_event_id(&cx, &event_id);
                for output in outputs {
                    let mut headers = OwnedHeaders::new_with_capacity(output.headers.len() + 4);
                    for (key, value) in &output.headers {
                        headers = headers.insert(Header {
                            key,
                            value: Some(value),
                        });
                    }
                    let headers = trace_context::with_event_id(
                        trace_context::inject_kafka(&cx, headers),
                        &event_id,
                    );
                    let topic = self.settings.outputs[&output.output].clone();
                    batch.counts.outputs += 1;
                    batch.records.push(PendingRecord {
                        topic,
                        partition: None,
                        key: Some(output.key.unwrap_or_else(|| entity_id.clone().into_bytes())),
                        payload: serde_json::to_vec(&output.value).ok(),
                        headers,
                    });
                }
            }
            Decision::Duplicate { event_id } => {
                span.record("eos.decision", "duplicate");
                debug!(
                    event_id,
                    partition,
                    offset = source.offset,
                    "duplicate delivery dropped"
                );
                batch.counts.duplicates += 1;
            }
            Decision::DeadLetter {
                reason,
                code,
                detail,
                event_id,
            } => {
                span.record("eos.decision", "dead_letter");
                warn!(
                    partition,
                    offset = source.offset,
                    event_id = event_id.as_deref().unwrap_or(""),
                    %reason,
                    detail,
                    "record dead-lettered"
                );
                *batch.counts.dead_letters.entry(reason).or_default() += 1;
                let record = dead_letter_record(
                    &self.settings.dlq_topic,
                    message,
                    (reason, code.as_deref()),
                    &detail,
                    self.settings.dead_letter_max_bytes,
                );
                if record.truncated {
                    warn!(
                        partition,
                        offset = source.offset,
                        size = message.payload().map_or(0, <[u8]>::len),
                        limit = self.settings.dead_letter_max_bytes,
                        "dead letter too big for the producer: a prefix is kept, with the \
                         original's size and SHA-256"
                    );
                }
                batch.records.push(record.record);
            }
        }
        Ok(())
    }

    /// The consumer's position on each owned partition. Past the last record returned it also
    /// counts what `read_committed` skipped (commit markers, aborted records), so committing it
    /// lets the group's lag reach zero on a transactional input (outbox-relay's or another
    /// processor's output). Every record before it was returned by `poll` and decided, since
    /// nothing is polled between deciding and committing.
    fn owned_positions(&self) -> Vec<(i32, i64)> {
        let Ok(list) = self.consumer.position() else {
            return Vec::new();
        };
        list.elements_for_topic(&self.settings.input_topic)
            .iter()
            .filter(|elem| self.states.contains_key(&elem.partition()))
            .filter_map(|elem| Some((elem.partition(), elem.offset().to_raw()?)))
            .filter(|&(_, next)| next >= 0)
            .collect()
    }

    /// Idle, with the consumer past transaction markers it has not committed yet: an
    /// offsets-only transaction moves the group there.
    fn commit_markers_passed(&mut self) -> Result<(), ProcessorError> {
        let mut positions = ConsumedPositions::default();
        for (partition, next) in self.owned_positions() {
            if self
                .committed_next
                .get(&partition)
                .is_none_or(|&committed| next > committed)
            {
                positions.advance_to(partition, next);
            }
        }
        if positions.is_empty() {
            return Ok(());
        }
        debug!(
            ?positions,
            "committing the offsets past transaction markers"
        );
        let batch = Batch {
            positions,
            ..Batch::default()
        };
        self.commit(batch)
    }

    /// Writes the open batch with the configured guarantee.
    fn finish_batch(&mut self) -> Result<(), ProcessorError> {
        if self.batch.is_empty() {
            return Ok(());
        }
        let mut batch = std::mem::take(&mut self.batch);
        for (partition, next) in self.owned_positions() {
            batch.positions.advance_to(partition, next);
        }
        self.commit(batch)
    }

    fn commit(&mut self, batch: Batch<T::State>) -> Result<(), ProcessorError> {
        match self.settings.guarantee {
            Guarantee::ExactlyOnce => self.commit_transactional(batch),
            Guarantee::AtLeastOnce => self.commit_at_least_once(batch),
        }
    }

    fn changelog_records(&self, batch: &Batch<T::State>) -> Vec<PendingRecord> {
        let mut records = Vec::new();
        for (&partition, overlay) in &batch.overlays {
            for record in changelog::records_for::<T>(overlay) {
                records.push(PendingRecord {
                    topic: self.settings.changelog_topic.clone(),
                    partition: Some(partition),
                    key: Some(record.key.into_bytes()),
                    payload: record.value,
                    headers: OwnedHeaders::new(),
                });
            }
        }
        records
    }

    fn commit_transactional(&mut self, batch: Batch<T::State>) -> Result<(), ProcessorError> {
        let span = info_span!(
            "transaction",
            otel.name = "eos-processor transaction",
            otel.kind = "producer",
            messaging.system = "kafka",
            messaging.operation.type = "send",
            messaging.destination.name = %self.settings.outputs[DEFAULT_OUTPUT],
            eos.records = batch.counts.records_in,
            eos.outcome = tracing::field::Empty,
        );
        for link in &batch.links {
            span.add_link(link.clone());
        }
        let _entered = span.enter();
        let started = Instant::now();
        let changelog = self.changelog_records(&batch);
        let written = self.write_transaction(&batch, &changelog);
        let write_ms = started.elapsed().as_millis() as u64;
        self.transactions_written += 1;
        let outcome = match written {
            Err(failure) => Err(failure),
            Ok(()) if self.fault_abort_due() => {
                warn!("fault injection (EOS_FAULT_ABORT_EVERY): failing this transaction");
                Err(TxnFailure::Abortable(KafkaError::Global(
                    RDKafkaErrorCode::Fail,
                )))
            }
            Ok(()) => self.producer.commit(),
        };
        span.record(
            "eos.outcome",
            match &outcome {
                Ok(()) => "committed",
                Err(TxnFailure::Abortable(_)) => "aborted",
                Err(TxnFailure::Unknown(_)) => "unknown",
                Err(TxnFailure::Fatal(_)) => "fatal",
            },
        );
        match outcome {
            Ok(()) => {
                histogram!(m::TRANSACTION_SECONDS).record(started.elapsed().as_secs_f64());
                debug!(
                    write_ms,
                    total_ms = started.elapsed().as_millis() as u64,
                    "transaction committed"
                );
                self.apply_committed(batch)
            }
            Err(failure) => self.transaction_failed(failure),
        }
    }

    /// A transactional call failed: abort and redo, settle an unknown outcome with a new
    /// producer, or stop (or recover from a lost transaction, see [`Self::fenced_or_fatal`]).
    fn transaction_failed(&mut self, failure: TxnFailure) -> Result<(), ProcessorError> {
        match failure {
            TxnFailure::Abortable(error) => self.abort_and_rewind(&error),
            TxnFailure::Unknown(error) => self.replace_producer_and_recover(&error),
            TxnFailure::Fatal(error) => self.fenced_or_fatal(error),
        }
    }

    /// Exactly-once: what was just decided goes into the open transaction, which the first
    /// record after a commit begins (see the module doc). Nothing of it is visible before the
    /// commit; a failure here ends the transaction as a failed commit would.
    fn send_decided_in_transaction(&mut self) -> Result<(), ProcessorError> {
        if self.batch.records.is_empty() {
            return Ok(());
        }
        match self.send_into_transaction() {
            Ok(()) => Ok(()),
            Err(failure) => self.transaction_failed(failure),
        }
    }

    fn send_into_transaction(&mut self) -> Result<(), TxnFailure> {
        if !self.batch.transaction_open {
            self.producer.begin()?;
            self.batch.transaction_open = true;
        }
        for record in self.batch.records.drain(..) {
            self.producer.send(&record)?;
        }
        Ok(())
    }

    /// A fatal producer error. When it is a fence and this instance's consumer still holds its
    /// static group membership, no newer instance took over: the fence is the transaction
    /// coordinator's, which aborts a transaction left open longer than transaction.timeout.ms
    /// and bumps the producer epoch — what a network partition longer than the timeout causes;
    /// or the transaction was lost to a broker restart (see [`lost_its_transaction`]).
    /// Then, as Kafka Streams does on a producer fence, a new producer (whose
    /// `init_transactions` takes the next epoch) and a recovery from committed state go on,
    /// instead of an exit that needs an orchestrator's restart. A newer instance with this
    /// `group.instance.id` fences the consumer too (FencedInstanceId, fatal), and the group
    /// generation in every offset commit keeps a zombie's batches out meanwhile
    /// (docs/ARCHITECTURE.md).
    fn fenced_or_fatal(&mut self, error: KafkaError) -> Result<(), ProcessorError> {
        let fence = match &error {
            KafkaError::Transaction(rd) => lost_its_transaction(rd.code()),
            KafkaError::Global(code) => lost_its_transaction(*code),
            _ => false,
        };
        if !fence || self.consumer.client().fatal_error().is_some() {
            return Err(ProcessorError::Fatal(error));
        }
        warn!(
            %error,
            "producer lost its transaction while this instance still holds its group membership \
             (the transaction outlived transaction.timeout.ms, e.g. cut off from the broker; its \
             coordinator restarted; or an abort came while the previous commit was completing)"
        );
        self.replace_producer_and_recover(&error)
    }

    fn fault_abort_due(&self) -> bool {
        self.settings
            .fault_abort_every
            .is_some_and(|every| self.transactions_written.is_multiple_of(every))
    }

    /// The rest of the transaction: begin (unless records already opened it), whatever is not
    /// sent yet, the changelog records, then the consumed offsets. Nothing is committed yet.
    fn write_transaction(
        &self,
        batch: &Batch<T::State>,
        changelog: &[PendingRecord],
    ) -> Result<(), TxnFailure> {
        if !batch.transaction_open {
            self.producer.begin()?;
        }
        for record in batch.records.iter().chain(changelog) {
            self.producer.send(record)?;
        }
        let offsets = batch.positions.to_offsets(&self.settings.input_topic)?;
        let group_metadata = self
            .consumer
            .group_metadata()
            .ok_or_else(|| TxnFailure::Abortable(KafkaError::Global(RDKafkaErrorCode::State)))?;
        self.producer.send_offsets(&offsets, &group_metadata)
    }

    /// The batch is committed in Kafka: its state changes go to the store. A store that
    /// cannot take them is fatal; the restart restores from the changelog, which has them.
    fn apply_committed(&mut self, batch: Batch<T::State>) -> Result<(), ProcessorError> {
        self.committed_next.extend(batch.positions.next_offsets());
        let counts = batch.counts;
        let markers = match self.settings.guarantee {
            Guarantee::ExactlyOnce => 1,
            Guarantee::AtLeastOnce => 0,
        };
        for (partition, overlay) in batch.overlays {
            let written = overlay.changelog_record_count() as i64;
            if let Some(state) = self.states.get(&partition) {
                state.apply::<T>(overlay)?;
            }
            if written > 0
                && let Some(end) = self.changelog_ends.get_mut(&partition)
            {
                end.expected_end = end.expected_end.map(|e| e + written + markers);
            }
        }
        counter!(m::RECORDS_IN).increment(counts.records_in);
        counter!(m::RECORDS_OUT).increment(counts.outputs);
        counter!(m::DUPLICATES_DROPPED).increment(counts.duplicates);
        for (reason, n) in counts.dead_letters {
            counter!(m::DEAD_LETTERS, "reason" => reason.as_str()).increment(n);
        }
        counter!(m::TRANSACTIONS, "outcome" => "committed").increment(1);
        debug!(
            records_in = counts.records_in,
            outputs = counts.outputs,
            duplicates = counts.duplicates,
            "batch committed"
        );
        Ok(())
    }

    /// Nothing of the batch became visible: abort, drop its state changes, rewind the consumer.
    fn abort_and_rewind(&mut self, cause: &KafkaError) -> Result<(), ProcessorError> {
        warn!(error = %cause, "aborting transaction");
        self.abort_open_transaction()
    }

    fn abort_open_transaction(&mut self) -> Result<(), ProcessorError> {
        counter!(m::TRANSACTIONS, "outcome" => "aborted").increment(1);
        for end in self.changelog_ends.values_mut() {
            end.expected_end = None;
        }
        match self.producer.abort() {
            Ok(()) => self.rewind_to_committed(),
            Err(TxnFailure::Fatal(error)) => self.fenced_or_fatal(error),
            // A fresh producer's init_transactions aborts whatever is still open.
            Err(TxnFailure::Abortable(error) | TxnFailure::Unknown(error)) => {
                self.replace_producer_and_recover(&error)
            }
        }
    }

    /// The commit's outcome is unknown. A new producer with the same transactional.id fences the
    /// old one and resolves the transaction; then state and positions are re-read from Kafka,
    /// which holds either both the batch's outputs and offsets or neither.
    fn replace_producer_and_recover(&mut self, cause: &KafkaError) -> Result<(), ProcessorError> {
        warn!(error = %cause, "replacing the producer and recovering from committed state");
        counter!(m::TRANSACTIONS, "outcome" => "recovered").increment(1);
        self.producer = self.settings.create_producer()?;
        let partitions: Vec<i32> = self.states.keys().copied().collect();
        for partition in partitions {
            self.restore(partition)?;
        }
        self.rewind_to_committed()
    }

    fn rewind_to_committed(&mut self) -> Result<(), ProcessorError> {
        self.batch = Batch::default();
        if self.states.is_empty() {
            // Nothing owned (every partition was just revoked): nothing to rewind.
            return Ok(());
        }
        let timeout = self.settings.call_timeout();
        // The group coordinator may be moving (its broker died): ask again until it answers.
        let committed = (|| self.consumer.committed(timeout))
            .retry(doubling(Duration::from_millis(100), Duration::from_secs(2)).with_max_times(20))
            .when(passes_by_itself)
            .notify(|error, delay| {
                warn!(%error, ?delay, "committed offsets not readable yet; asking again");
            })
            .call()?;
        let mut positions = TopicPartitionList::new();
        for elem in committed.elements() {
            let offset = match elem.offset() {
                Offset::Offset(offset) => Offset::Offset(offset),
                _ => Offset::Beginning,
            };
            positions.add_partition_offset(elem.topic(), elem.partition(), offset)?;
        }
        let sought = self.consumer.seek_partitions(positions, timeout)?;
        for elem in sought.elements() {
            if let Err(error) = elem.error() {
                // A partition we cannot rewind must not be read past its committed offset.
                return Err(ProcessorError::Fatal(error));
            }
        }
        info!(
            partitions = sought.count(),
            "rewound to the committed offsets"
        );
        Ok(())
    }

    /// At-least-once streams outputs and dead letters as they are decided, like a plain
    /// consumer-producer pipeline: they become visible before the offsets that cover them are
    /// committed.
    fn send_decided_now(&mut self) -> Result<(), ProcessorError> {
        for record in self.batch.records.drain(..) {
            self.producer.send(&record)?;
        }
        Ok(())
    }

    /// At-least-once commit: outputs (already sent), then state, then offsets, each after the
    /// previous is delivered. A crash before the offsets are committed repeats effects on restart.
    fn commit_at_least_once(&mut self, batch: Batch<T::State>) -> Result<(), ProcessorError> {
        let started = Instant::now();
        self.producer.flush_delivered()?;
        for record in &self.changelog_records(&batch) {
            self.producer.send(record)?;
        }
        self.producer.flush_delivered()?;
        let offsets = batch.positions.to_offsets(&self.settings.input_topic)?;
        self.consumer.commit(&offsets, CommitMode::Sync)?;
        histogram!(m::TRANSACTION_SECONDS).record(started.elapsed().as_secs_f64());
        self.apply_committed(batch)
    }
}

/// A dead letter to write, and whether its value had to be cut to fit.
struct DeadLetterRecord {
    record: PendingRecord,
    truncated: bool,
}

/// When a batch whose first record is `first_record_age` old is committed at the latest: one
/// commit interval after that record was written, so that a record that waited behind the
/// previous commit (or in the producer's linger) does not wait a whole interval more, and the
/// interval bounds its latency as Kafka Streams' commit cadence does. A first record older than
/// half the interval is a backlog being read, not a wait behind one commit: its batch gets the
/// whole interval, which keeps throughput (batch sizes) where a backlog needs it. A record
/// timestamp from the future (another clock) or absent counts as just written.
fn batch_deadline(
    now: Instant,
    first_record_age: Option<Duration>,
    commit_interval: Duration,
) -> Instant {
    let waited = first_record_age
        .filter(|age| *age <= commit_interval / 2)
        .unwrap_or_default();
    now + (commit_interval - waited)
}

/// How long ago a record was written, by its Kafka timestamp; `None` without one or when the
/// timestamp is ahead of this clock.
fn record_age(timestamp: rdkafka::Timestamp) -> Option<Duration> {
    let written = time::OffsetDateTime::from_unix_timestamp_nanos(
        i128::from(timestamp.to_millis()?) * 1_000_000,
    )
    .ok()?;
    // A negative age (a timestamp ahead of this clock) does not convert.
    Duration::try_from(time::OffsetDateTime::now_utc() - written).ok()
}

/// The original bytes and headers plus the reason and the source position, in the
/// `eos_core::dead_letter` headers — cut to fit `max_bytes` when the original is too big for the
/// producer, so a dead letter can never fail to be written and stall the partition.
fn dead_letter_record(
    dlq_topic: &str,
    message: &OwnedMessage,
    (reason, transform_reason): (DeadLetterReason, Option<&str>),
    detail: &str,
    max_bytes: usize,
) -> DeadLetterRecord {
    let headers = message
        .headers()
        .map(|original| {
            original
                .iter()
                .map(|header| (header.key, header.value))
                .collect()
        })
        .unwrap_or_default();
    let letter = dead_letter::build(
        &dead_letter::DeadLetterInput {
            key: message.key(),
            value: message.payload(),
            headers,
            source_topic: message.topic(),
            source_partition: message.partition(),
            source_offset: message.offset(),
            reason,
            transform_reason,
            detail,
        },
        max_bytes,
    );
    let mut headers = OwnedHeaders::new_with_capacity(letter.headers.len());
    for (key, value) in &letter.headers {
        headers = headers.insert(Header {
            key,
            value: value.as_deref(),
        });
    }
    DeadLetterRecord {
        truncated: letter.truncated,
        record: PendingRecord {
            topic: dlq_topic.to_owned(),
            partition: None,
            key: letter.key,
            payload: letter.value,
            headers,
        },
    }
}

/// The producer lost its transaction: its epoch was taken away (by a newer producer with the
/// same `transactional.id`, or by the transaction coordinator after a transaction timed out), or
/// the coordinator no longer holds the transaction in the state the producer expects. The last
/// is what a broker SIGKILLed and restarted answers a retried EndTxn with
/// (INVALID_TXN_STATE): the reloaded coordinator may have aborted the transaction meanwhile. It
/// is also the answer to an abort sent while the previous transaction's commit markers are still
/// being written: the new transaction's first AddPartitionsToTxn was told CONCURRENT_TRANSACTIONS
/// and waits to be retried, so nothing of it reached a partition, but librdkafka sends the EndTxn
/// anyway and takes the refusal as fatal (a rebalance right after a commit does this).
/// Either way the outcome is settled by a new producer's `init_transactions`, as after a commit
/// whose outcome is unknown.
fn lost_its_transaction(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::Fenced
            | RDKafkaErrorCode::ProducerFenced
            | RDKafkaErrorCode::InvalidProducerEpoch
            | RDKafkaErrorCode::InvalidTransactionalState
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const INTERVAL: Duration = Duration::from_millis(100);

    #[test]
    fn a_record_that_waited_behind_a_commit_shortens_its_batch_by_the_wait() {
        let now = Instant::now();
        let due = batch_deadline(now, Some(Duration::from_millis(30)), INTERVAL);
        assert_eq!(due - now, Duration::from_millis(70));
    }

    #[test]
    fn a_backlog_or_an_unknown_age_gets_the_whole_interval() {
        let now = Instant::now();
        for age in [
            None,
            Some(Duration::from_millis(51)),
            Some(Duration::from_secs(3600)),
        ] {
            assert_eq!(
                batch_deadline(now, age, INTERVAL) - now,
                INTERVAL,
                "{age:?}"
            );
        }
        let half = batch_deadline(now, Some(INTERVAL / 2), INTERVAL);
        assert_eq!(half - now, INTERVAL / 2);
    }

    #[test]
    fn record_age_is_none_without_a_timestamp_or_from_the_future() {
        assert_eq!(record_age(rdkafka::Timestamp::NotAvailable), None);
        let ahead = std::time::SystemTime::now() + Duration::from_secs(60);
        let ahead_ms = ahead
            .duration_since(std::time::UNIX_EPOCH)
            .expect("the clock is after 1970")
            .as_millis() as i64;
        assert_eq!(record_age(rdkafka::Timestamp::CreateTime(ahead_ms)), None);
        let age = record_age(rdkafka::Timestamp::LogAppendTime(ahead_ms - 90_000))
            .expect("a timestamp 30 s in the past has an age");
        assert!(
            (Duration::from_secs(29)..Duration::from_secs(31)).contains(&age),
            "{age:?}"
        );
    }
}
