//! The committer: the one owner of the producer and of every transactional call. The loop hands
//! it what it decided and, when the batch is finished, the batch whole; the committer writes it
//! by the configured guarantee (`exactly_once.rs`, `at_least_once.rs`) and answers with one
//! outcome: committed, or failed and recovered (`recovery.rs`, by the policy eos-processor and
//! outbox-relay share, `eos_runtime::transaction_recovery`). What a failure means for the state
//! (drop the batch and rewind, or restore from the changelog first) is the outcome's
//! [`AfterFailure`]; the loop carries it out on the state it owns. Every failure of every call
//! goes through that one path, as Materialize's `retry_on_txn_error` does
//! (docs/architecture/loop-invariants.md, "Loop invariants").

mod at_least_once;
mod exactly_once;
mod recovery;

use eos_core::Guarantee;
use eos_runtime::transactional_producer::{PendingRecord, TransactionalProducer};
use tracing::warn;

use crate::batch::Batch;
use crate::error::ProcessorError;
use crate::loop_consumer::LoopConsumer;
use crate::loop_settings::LoopSettings;

/// Writes batches, and recovers the producer when a write fails.
pub(crate) struct Committer {
    settings: LoopSettings,
    producer: TransactionalProducer,
    /// Transactions written since the start, for `--fault-abort-every`.
    transactions_written: u64,
}

/// How a batch's commit ended.
pub(crate) enum CommitOutcome<S> {
    /// Kafka holds the batch: its state changes may be applied.
    Committed(Box<Batch<S>>),
    /// Kafka holds nothing of it, or its outcome was settled by a new producer.
    Failed(AfterFailure),
}

/// What the loop does to its state after a failed transactional call, once the committer has
/// recovered the producer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AfterFailure {
    /// The transaction was aborted: nothing of it is visible. Its state changes are dropped,
    /// and every owned partition is read again from its committed offset.
    Rewind,
    /// A new producer's `init_transactions` settled a transaction whose outcome was unknown:
    /// Kafka holds either both its outputs and its offsets or neither, so the state is restored
    /// from the changelog before the rewind.
    RestoreAndRewind,
}

impl Committer {
    /// Creates the producer; in exactly-once mode its `init_transactions` fences any earlier
    /// instance with the same `transactional.id` and aborts its open transaction.
    pub(crate) fn new(settings: &LoopSettings) -> Result<Self, ProcessorError> {
        Ok(Self {
            producer: settings.create_producer()?,
            settings: settings.clone(),
            transactions_written: 0,
        })
    }

    /// What was just decided goes out: exactly-once, into the open transaction, which the first
    /// record after a commit begins (nothing of it is visible before the commit); at-least-once,
    /// at once. `Some` when a failure ended the open transaction, as a failed commit would.
    pub(crate) fn send_decided<S>(
        &mut self,
        batch: &mut Batch<S>,
        consumer: &LoopConsumer,
    ) -> Result<Option<AfterFailure>, ProcessorError> {
        match self.settings.guarantee {
            Guarantee::ExactlyOnce => self.send_into_transaction(batch, consumer),
            Guarantee::AtLeastOnce => {
                for record in batch.take_unsent() {
                    self.producer.send(&record)?;
                }
                Ok(None)
            }
        }
    }

    /// Writes `batch` with its `changelog` records and its consumed offsets, by the configured
    /// guarantee.
    pub(crate) fn commit<S>(
        &mut self,
        batch: Batch<S>,
        changelog: &[PendingRecord],
        consumer: &LoopConsumer,
    ) -> Result<CommitOutcome<S>, ProcessorError> {
        match self.settings.guarantee {
            Guarantee::ExactlyOnce => self.commit_transaction(batch, changelog, consumer),
            Guarantee::AtLeastOnce => self.commit_at_least_once(batch, changelog, consumer),
        }
    }

    /// The shutdown interrupted a transform call: the open transaction (if `open`) is aborted
    /// and nothing more is written. A failure is left to the next instance, whose
    /// `init_transactions` aborts it, as after a crash.
    pub(crate) fn abort_on_interrupt(&mut self, open: bool) {
        if open && let Err(failure) = self.producer.abort() {
            warn!(?failure, "aborting the open transaction failed");
        }
    }
}
