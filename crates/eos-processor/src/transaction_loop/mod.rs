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
//! The loop composes three components, each the one owner of its state, with private fields:
//! the open batch (`batch.rs`: what deciding adds, taken whole by its commit), the owned states
//! (`owned_states/`: each partition's state, restored before it is read, changed only by
//! committed batches, checkpointed on the local disk) and the committer (`committer/`: the
//! producer and every transactional call; one `commit(batch)` path whose outcome is committed,
//! or failed and recovered with what the loop must do to its state). The loop's own fields are
//! private to this module and its children, one per job: `record_decision.rs` (one record into
//! the open batch, with its span), `open_batch.rs` (finishing the batch, applying its outcome,
//! rewinding after a failure) and `rebalance_handling.rs` (partitions revoked and assigned while
//! `poll` ran). Beside it, `dead_letter_record.rs` (the record a dead letter becomes) and
//! `lag_watch.rs` (the consumer lag, measured beside the loop so that it moves while the loop is
//! stuck). The invariants they keep are docs/architecture/loop-invariants.md's "Loop
//! invariants".

mod open_batch;
mod rebalance_handling;
mod record_decision;

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaError;
use rdkafka::message::OwnedMessage;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use eos_runtime::ops_http::Readiness;
use eos_runtime::progress_watch::ProgressWatch;
use eos_runtime::rebalance::subscribe_static_member;

use crate::batch::Batch;
use crate::committer::Committer;
use crate::error::ProcessorError;
use crate::lag_watch::LagWatch;
use crate::loop_consumer::LoopConsumer;
use crate::loop_settings::LoopSettings;
use crate::output_format::OutputEncoder;
use crate::owned_states::OwnedStates;
use crate::transform::Transform;
use eos_schema::RecordDecoder;

pub(crate) struct TransactionLoop<T: Transform> {
    settings: LoopSettings,
    transform: T,
    /// Shared with the consumer lag's thread (`lag_watch.rs`).
    consumer: Arc<LoopConsumer>,
    /// Writes the batches and recovers from failed writes (`committer/`).
    committer: Committer,
    /// The owned partitions' state: restored, applied, checkpointed (`owned_states/`).
    states: OwnedStates<T::State>,
    last_sweep: HashMap<i32, Instant>,
    batch: Batch<T::State>,
    /// Per owned partition, the offset this instance last committed (unknown after assignment).
    committed_next: HashMap<i32, i64>,
    readiness: Readiness,
    /// Told when input waits in an open batch and when a batch commits (docs/OBSERVABILITY.md
    /// "Liveness").
    progress: Arc<ProgressWatch>,
    /// Turns input values into the JSON event model (plain JSON unless [`Self::with_input`]).
    input: RecordDecoder,
    /// Records polled and not decided yet, taken before polling again: they wait for the
    /// schema registry (`record_decision.rs`). No committed position passes one.
    held: VecDeque<OwnedMessage>,
    /// Writes the outputs in their topics' registry format (plain JSON when `None`).
    output: Option<Arc<OutputEncoder>>,
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
        let committer = Committer::new(&settings)?;
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
            committer,
            states,
            last_sweep: HashMap::new(),
            batch: Batch::default(),
            committed_next: HashMap::new(),
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
        self.committer.abort_on_interrupt(batch.transaction_open());
    }

    fn run_until(&mut self, shutdown: &CancellationToken) -> Result<(), ProcessorError> {
        loop {
            if shutdown.is_cancelled() {
                return self.finish_batch();
            }
            if let Some(after) = self.committer.check_fatal(&self.consumer)? {
                self.recover(after)?;
            }
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
                    if let Some(after) = self
                        .committer
                        .send_decided(&mut self.batch, &self.consumer)?
                    {
                        self.recover(after)?;
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
