//! The read-process-write loop. It runs on a dedicated thread because every transactional call
//! blocks up to its timeout.
//!
//! Exactly-once: records flow into the open transaction as they are decided, as Kafka Streams
//! produces them: the first record decided after a commit begins a transaction, each output and
//! dead letter is sent at once, and on the commit interval (counted from when the first record
//! was written, see `record_decision::batch_deadline`) or a full batch the changelog records, the
//! consumed offsets and the commit follow. A `read_committed` reader sees them at the commit
//! either way; sending as decided takes the write of the whole batch off the time between the
//! interval's end and the commit (docs/architecture/loop-invariants.md, "Latency").
//!
//! A transaction is therefore open while the consumer polls, and a rebalance (its callbacks run
//! inside `poll`) can revoke partitions whose outputs it holds. They are never committed: when
//! `poll` returns with partitions revoked or lost, the open transaction is aborted before anything
//! else happens, its undecided state changes are dropped, and whoever owns the partitions next
//! re-reads them from the committed offsets. A zombie that misses the revoke is still kept out by
//! the group generation in its offset commit (KIP-447), which fails the transaction.
//!
//! This module holds the loop and its state; each of its jobs has a module of its own (the
//! invariants they keep are docs/architecture/loop-invariants.md's "Loop invariants"):
//! `rebalance_handling.rs` (partitions revoked and assigned while `poll` ran), `owned_states/`
//! (the component that owns each partition's state: restored before it is read, changed by
//! committed batches, and checkpointed locally to bound how much of the changelog
//! a restart reads again), `record_decision.rs` (one record into the open batch, with its span),
//! `dead_letter_record.rs` (the record a dead letter becomes), `open_batch.rs` (the batch and
//! what its commit applies), `batch_commit.rs` (the exactly-once transaction),
//! `batch_recovery.rs` (what follows its failure), `at_least_once.rs` (the other mode) and
//! `lag_watch.rs` (the consumer lag, measured beside the loop so that it moves while the loop is
//! stuck).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaError;
use rdkafka::message::OwnedMessage;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use eos_core::Guarantee;
use eos_runtime::ops_http::Readiness;
use eos_runtime::progress_watch::ProgressWatch;
use eos_runtime::rebalance::subscribe_static_member;
use eos_runtime::transactional_producer::TransactionalProducer;

use crate::batch::Batch;
use crate::error::ProcessorError;
use crate::lag_watch::LagWatch;
pub(crate) use crate::loop_consumer::LoopConsumer;
use crate::loop_settings::LoopSettings;
use crate::output_format::OutputEncoder;
use crate::owned_states::OwnedStates;
use crate::transform::Transform;
use eos_schema::RecordDecoder;

pub(crate) struct TransactionLoop<T: Transform> {
    pub(crate) settings: LoopSettings,
    pub(crate) transform: T,
    /// Shared with the consumer lag's thread (`lag_watch.rs`).
    pub(crate) consumer: Arc<LoopConsumer>,
    pub(crate) producer: TransactionalProducer,
    /// The owned partitions' state: restored, applied, checkpointed (`owned_states/`).
    pub(crate) states: OwnedStates<T::State>,
    pub(crate) last_sweep: HashMap<i32, Instant>,
    pub(crate) batch: Batch<T::State>,
    /// Per owned partition, the offset this instance last committed (unknown after assignment).
    pub(crate) committed_next: HashMap<i32, i64>,
    pub(crate) transactions_written: u64,
    pub(crate) readiness: Readiness,
    /// Told when input waits in an open batch and when a batch commits (docs/OBSERVABILITY.md
    /// "Liveness").
    pub(crate) progress: Arc<ProgressWatch>,
    /// Turns input values into the JSON event model (plain JSON unless [`Self::with_input`]).
    pub(crate) input: RecordDecoder,
    /// Records polled and not decided yet, taken before polling again: they wait for the
    /// schema registry (`record_decision.rs`). No committed position passes one.
    pub(crate) held: VecDeque<OwnedMessage>,
    /// Writes the outputs in their topics' registry format (plain JSON when `None`).
    pub(crate) output: Option<Arc<OutputEncoder>>,
    /// Measures `eos_processor_consumer_lag` beside the loop, while it lives.
    _lag_watch: Option<LagWatch>,
}

impl<T: Transform> std::fmt::Debug for TransactionLoop<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransactionLoop")
            .field("settings", &self.settings)
            .field("partitions", &self.states.partitions())
            .finish_non_exhaustive()
    }
}

impl<T: Transform> TransactionLoop<T> {
    /// Creates the clients; in exactly-once mode `init_transactions` fences any earlier instance
    /// with the same `transactional.id` and aborts its open transaction.
    pub(crate) fn new(
        settings: LoopSettings,
        transform: T,
        (readiness, progress): (Readiness, Arc<ProgressWatch>),
    ) -> Result<Self, ProcessorError> {
        let states = OwnedStates::open(&settings)?;
        let producer = settings.create_producer()?;
        let consumer = Arc::new(subscribe_static_member(
            &settings.client_config,
            &settings.group_id,
            &settings.instance_id,
            &settings.input_topic,
        )?);
        let lag_watch = LagWatch::spawn(&consumer, settings.input_topic.clone());
        Ok(Self {
            settings,
            transform,
            consumer,
            producer,
            states,
            last_sweep: HashMap::new(),
            batch: Batch::default(),
            committed_next: HashMap::new(),
            transactions_written: 0,
            readiness,
            progress,
            input: RecordDecoder::json(),
            held: VecDeque::new(),
            output: None,
            _lag_watch: lag_watch,
        })
    }

    /// Reads the input through `input` (a schema registry's format) instead of as plain JSON.
    pub(crate) fn with_input(mut self, input: RecordDecoder) -> Self {
        self.input = input;
        self
    }

    /// Outputs in a registry format, by `encoder` (the decision checks them with it too).
    pub(crate) fn with_output(mut self, encoder: Option<Arc<OutputEncoder>>) -> Self {
        self.output = encoder;
        self
    }

    /// Runs until `shutdown` is cancelled (then commits the open batch) or a fatal error.
    pub(crate) fn run(mut self, shutdown: &CancellationToken) -> Result<(), ProcessorError> {
        let mut result = self.run_until(shutdown);
        let interrupted = matches!(result, Err(ProcessorError::Interrupted));
        if interrupted {
            self.abort_on_interrupt();
            result = Ok(());
        }
        self.readiness.set(false);
        if result.is_ok() {
            self.states.checkpoint_on_shutdown(&self.consumer);
            // Leave the group now rather than after the session timeout.
            self.consumer.unsubscribe();
            if !interrupted {
                info!("stopped after committing the open batch");
            }
        }
        result
    }

    /// The shutdown interrupted a transform call in the middle of a batch: that event is
    /// undecided, so the batch is aborted rather than committed (committing it would move the
    /// offsets past an event with no outcome). Its records are read again at the next start,
    /// where a call that hangs again meets its wall-clock limit and becomes a dead letter.
    fn abort_on_interrupt(&mut self) {
        let batch = std::mem::take(&mut self.batch);
        warn!(
            decided_before = batch.records_in(),
            "shutdown interrupted a transform call: the open batch is aborted, not committed; \
             its records are read again at the next start"
        );
        if batch.transaction_open()
            && let Err(failure) = self.producer.abort()
        {
            // The next instance's init_transactions aborts it, as after a crash.
            warn!(?failure, "aborting the open transaction failed");
        }
    }

    fn run_until(&mut self, shutdown: &CancellationToken) -> Result<(), ProcessorError> {
        loop {
            if shutdown.is_cancelled() {
                return self.finish_batch();
            }
            self.check_fatal()?;
            let wait = match self.batch.due() {
                Some(due) => due.saturating_duration_since(Instant::now()),
                None => self.settings.commit_interval,
            };
            let polled = match self.held.pop_front() {
                Some(held) => Some(Ok(held)),
                None => self
                    .consumer
                    .poll(wait)
                    .map(|result| result.map(|message| message.detach())),
            };
            self.handle_rebalance_events()?;
            match polled {
                Some(Ok(message)) => {
                    // Until the batch commits; a call that never returns shows here.
                    let Some(message) = self.schema_at_hand(message, shutdown)? else {
                        continue;
                    };
                    self.progress
                        .working("a transform call or its batch's commit");
                    self.decide(&message)?;
                    match self.settings.guarantee {
                        Guarantee::ExactlyOnce => self.send_decided_in_transaction()?,
                        Guarantee::AtLeastOnce => self.send_decided_now()?,
                    }
                }
                Some(Err(error)) => self.consumer_error(error)?,
                None if self.batch.is_empty() => {
                    self.commit_markers_passed()?;
                    self.progress.idle();
                }
                None => {}
            }
            if self.batch.is_empty() {
                self.states.checkpoint_if_due(&self.consumer)?;
            }
            let full = self.batch.records_in() as usize >= self.settings.max_batch;
            let due = self.batch.due().is_some_and(|due| Instant::now() >= due);
            if full || due {
                self.finish_batch()?;
            }
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
}
