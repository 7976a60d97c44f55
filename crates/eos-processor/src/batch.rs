//! The open batch: the records decided since the last commit, with their state changes, consumed
//! positions, counts and span links (docs/architecture/loop-invariants.md, "Loop invariants").
//! Its fields are its own: deciding adds to it through the methods below, committing takes it
//! whole, and nothing else changes it.

use std::collections::HashMap;
use std::time::Instant;

use opentelemetry::trace::SpanContext;

use eos_core::DeadLetterReason;
use eos_runtime::transactional_producer::PendingRecord;

use crate::consumed_positions::ConsumedPositions;
use crate::partition_state::Overlay;

/// Span links a transaction span keeps: OpenTelemetry's default limit per span.
const MAX_SPAN_LINKS: usize = 128;

/// What a batch decided, counted for the metrics once it is committed.
#[derive(Debug, Default)]
pub(crate) struct BatchCounts {
    pub(crate) records_in: u64,
    pub(crate) outputs: u64,
    pub(crate) duplicates: u64,
    pub(crate) dead_letters: HashMap<DeadLetterReason, u64>,
}

/// A committed batch taken apart: what the store and the metrics take from it.
pub(crate) struct CommittedBatch<S> {
    pub(crate) counts: BatchCounts,
    pub(crate) overlays: HashMap<i32, Overlay<S>>,
    pub(crate) positions: ConsumedPositions,
}

/// The open batch: decided but not yet written.
#[derive(Debug)]
pub(crate) struct Batch<S> {
    /// When the batch is committed at the latest (see `record_decision::batch_deadline`); set by
    /// its first record.
    due: Option<Instant>,
    /// Decided and not sent yet.
    unsent: Vec<PendingRecord>,
    overlays: HashMap<i32, Overlay<S>>,
    positions: ConsumedPositions,
    counts: BatchCounts,
    /// The `process` spans of its first records: the transaction span links to them, since one
    /// transaction has many inputs (and so no single parent).
    links: Vec<SpanContext>,
    /// Exactly-once: a transaction is open with this batch's records sent so far (`unsent`
    /// then holds only what was decided since the last send).
    transaction_open: bool,
}

impl<S> Default for Batch<S> {
    fn default() -> Self {
        Self {
            due: None,
            unsent: Vec::new(),
            overlays: HashMap::new(),
            positions: ConsumedPositions::default(),
            counts: BatchCounts::default(),
            links: Vec::new(),
            transaction_open: false,
        }
    }
}

impl<S> Batch<S> {
    /// A batch of positions only: the offsets past transaction markers, nothing decided.
    pub(crate) fn of_positions(positions: ConsumedPositions) -> Self {
        Self {
            positions,
            ..Self::default()
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.counts.records_in == 0
    }

    /// Records decided into it.
    pub(crate) fn records_in(&self) -> u64 {
        self.counts.records_in
    }

    /// When it is committed at the latest, once it has a record.
    pub(crate) fn due(&self) -> Option<Instant> {
        self.due
    }

    /// Sets when it is committed at the latest, if its first record has not set it yet.
    pub(crate) fn set_due_once(&mut self, deadline: impl FnOnce() -> Instant) {
        self.due.get_or_insert_with(deadline);
    }

    /// The state changes by input partition, for the decisions to build on.
    pub(crate) fn overlays_mut(&mut self) -> &mut HashMap<i32, Overlay<S>> {
        &mut self.overlays
    }

    /// The state changes by input partition.
    pub(crate) fn overlays(&self) -> impl Iterator<Item = (i32, &Overlay<S>)> {
        self.overlays
            .iter()
            .map(|(&partition, overlay)| (partition, overlay))
    }

    /// A record read at `partition`/`offset` joins it, with its `process` span's context.
    pub(crate) fn read(&mut self, partition: i32, offset: i64, span: SpanContext) {
        self.counts.records_in += 1;
        self.positions.read(partition, offset);
        if self.links.len() < MAX_SPAN_LINKS && span.is_valid() {
            self.links.push(span);
        }
    }

    pub(crate) fn count_duplicate(&mut self) {
        self.counts.duplicates += 1;
    }

    pub(crate) fn push_output(&mut self, record: PendingRecord) {
        self.counts.outputs += 1;
        self.unsent.push(record);
    }

    pub(crate) fn push_dead_letter(&mut self, reason: DeadLetterReason, record: PendingRecord) {
        *self.counts.dead_letters.entry(reason).or_default() += 1;
        self.unsent.push(record);
    }

    /// Moves the committed position of `partition` up to `next` (the consumer's position).
    pub(crate) fn advance_to(&mut self, partition: i32, next: i64) {
        self.positions.advance_to(partition, next);
    }

    pub(crate) fn positions(&self) -> &ConsumedPositions {
        &self.positions
    }

    pub(crate) fn links(&self) -> &[SpanContext] {
        &self.links
    }

    /// Exactly-once: whether a transaction holds what was sent of it.
    pub(crate) fn transaction_open(&self) -> bool {
        self.transaction_open
    }

    pub(crate) fn mark_transaction_open(&mut self) {
        self.transaction_open = true;
    }

    /// Decided and not sent yet.
    pub(crate) fn unsent(&self) -> &[PendingRecord] {
        &self.unsent
    }

    /// What is not sent yet, taken out to be sent.
    pub(crate) fn take_unsent(&mut self) -> Vec<PendingRecord> {
        std::mem::take(&mut self.unsent)
    }

    /// Its parts, once it is committed.
    pub(crate) fn into_committed(self) -> CommittedBatch<S> {
        CommittedBatch {
            counts: self.counts,
            overlays: self.overlays,
            positions: self.positions,
        }
    }
}
