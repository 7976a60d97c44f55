//! What follows a failed transaction or a fatal client error, by the one policy eos-processor
//! and outbox-relay share (`eos_runtime::transaction_recovery`; docs/architecture/pitfalls.md
//! "Pitfalls" and docs/architecture/loop-invariants.md "Loop invariants"): abort, drop the
//! batch's state changes and rewind every owned partition to its committed offset; or replace the
//! producer (its `init_transactions` settles the open transaction) and restore state and positions
//! from what Kafka committed; or stop with a non-zero exit. A lost producer transaction is
//! recovered from, not stopped at, while this instance's consumer still holds its static group
//! membership (see [`TransactionLoop::replace_lost_producer`]).

use std::time::Duration;

use metrics::counter;
use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaError;
use rdkafka::{Offset, TopicPartitionList};
use tracing::{info, warn};

use eos_runtime::backoff::{BlockingRetryable as _, doubling};
use eos_runtime::kafka_errors::passes_by_itself;
use eos_runtime::transaction_recovery::{LostTransaction, Recovery, cause};
use eos_runtime::transactional_producer::TxnFailure;

use crate::batch::Batch;
use crate::error::ProcessorError;
use crate::metrics as m;
use crate::transaction_loop::TransactionLoop;
use crate::transform::Transform;

impl<T: Transform> TransactionLoop<T> {
    /// A fatal client error (e.g. this static member or transactional id was fenced by a newer
    /// instance) ends the loop: a zombie must not go on. A producer that lost its transaction
    /// while the consumer still holds the membership is replaced instead (see
    /// [`Self::replace_lost_producer`]).
    pub(crate) fn check_fatal(&mut self) -> Result<(), ProcessorError> {
        if let Some((code, _)) = self.producer.fatal_error() {
            let error = KafkaError::Global(code);
            if Recovery::after_fatal(&error, self.lost_transaction()) == Recovery::ReplaceProducer {
                return self.replace_lost_producer(&error);
            }
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

    /// A transactional call failed: abort and redo, settle an unknown outcome with a new
    /// producer, or stop (or replace a producer that lost its transaction, see
    /// [`Self::replace_lost_producer`]).
    pub(crate) fn transaction_failed(&mut self, failure: TxnFailure) -> Result<(), ProcessorError> {
        let recovery = Recovery::after_failure(&failure, self.lost_transaction());
        self.recover(recovery, failure)
    }

    /// Carries `recovery` out for `failure`.
    fn recover(&mut self, recovery: Recovery, failure: TxnFailure) -> Result<(), ProcessorError> {
        match (recovery, failure) {
            (Recovery::AbortAndRedo, failure) => self.abort_and_rewind(&cause(failure)),
            // After a fatal error only a lost transaction is recovered from.
            (Recovery::ReplaceProducer, TxnFailure::Fatal(error)) => {
                self.replace_lost_producer(&error)
            }
            (Recovery::ReplaceProducer, failure) => {
                self.replace_producer_and_recover(&cause(failure))
            }
            (Recovery::Stop, failure) => Err(ProcessorError::Fatal(cause(failure))),
        }
    }

    /// What a lost producer transaction is taken for. While this instance's consumer still holds
    /// its static group membership, no newer instance took over: the fence is the transaction
    /// coordinator's, which aborts a transaction left open longer than transaction.timeout.ms
    /// and bumps the producer epoch — what a network partition longer than the timeout causes;
    /// or the transaction was lost to a broker restart (see
    /// `eos_runtime::transaction_recovery::lost_its_transaction`). A newer instance with this
    /// `group.instance.id` fences the consumer too (FencedInstanceId, fatal), and the group
    /// generation in every offset commit keeps a zombie's batches out meanwhile
    /// (docs/architecture/loop-invariants.md, "Loop invariants").
    fn lost_transaction(&self) -> LostTransaction {
        if self.consumer.client().fatal_error().is_none() {
            LostTransaction::ReplaceProducer
        } else {
            LostTransaction::Stop
        }
    }

    /// The producer lost its transaction while this instance still holds its group membership
    /// (see [`Self::lost_transaction`]). As Kafka Streams does on a producer fence, a new producer
    /// (whose `init_transactions` takes the next epoch) and a recovery from committed state go
    /// on, instead of an exit that needs an orchestrator's restart.
    fn replace_lost_producer(&mut self, error: &KafkaError) -> Result<(), ProcessorError> {
        warn!(
            %error,
            "producer lost its transaction while this instance still holds its group membership \
             (the transaction outlived transaction.timeout.ms, e.g. cut off from the broker; its \
             coordinator restarted; or an abort came while the previous commit was completing)"
        );
        self.replace_producer_and_recover(error)
    }

    /// Nothing of the batch became visible: abort, drop its state changes, rewind the consumer.
    fn abort_and_rewind(&mut self, cause: &KafkaError) -> Result<(), ProcessorError> {
        warn!(error = %cause, "aborting transaction");
        self.abort_open_transaction()
    }

    pub(crate) fn abort_open_transaction(&mut self) -> Result<(), ProcessorError> {
        counter!(m::TRANSACTIONS, "outcome" => "aborted").increment(1);
        self.states.forget_expected_ends();
        match self.producer.abort() {
            Ok(()) => self.rewind_to_committed(),
            // A fresh producer's init_transactions aborts whatever is still open.
            Err(failure) => {
                let recovery = Recovery::after_failed_abort(&failure, self.lost_transaction());
                self.recover(recovery, failure)
            }
        }
    }

    /// The commit's outcome is unknown. A new producer with the same transactional.id fences the
    /// old one and resolves the transaction; then state and positions are re-read from Kafka,
    /// which holds either both the batch's outputs and offsets or neither.
    pub(crate) fn replace_producer_and_recover(
        &mut self,
        cause: &KafkaError,
    ) -> Result<(), ProcessorError> {
        warn!(error = %cause, "replacing the producer and recovering from committed state");
        counter!(m::TRANSACTIONS, "outcome" => "recovered").increment(1);
        self.producer = self.settings.create_producer()?;
        self.states.restore_all(&self.transform)?;
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
}
