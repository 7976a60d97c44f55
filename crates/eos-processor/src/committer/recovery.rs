//! What follows a failed transactional call or a fatal client error, by the one policy
//! eos-processor and outbox-relay share (`eos_runtime::transaction_recovery`;
//! docs/architecture/pitfalls.md "Pitfalls" and docs/architecture/loop-invariants.md "Loop
//! invariants"): abort ([`AfterFailure::Rewind`]); or replace the producer, whose
//! `init_transactions` settles the open transaction ([`AfterFailure::RestoreAndRewind`]); or stop
//! with a non-zero exit. A lost producer transaction is recovered from, not stopped at, while
//! this instance's consumer still holds its static group membership (see
//! [`Committer::replace_lost_producer`]).

use metrics::counter;
use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaError;
use tracing::warn;

use eos_runtime::transaction_recovery::{LostTransaction, Recovery, cause};
use eos_runtime::transactional_producer::TxnFailure;

use super::{AfterFailure, Committer};
use crate::error::ProcessorError;
use crate::loop_consumer::LoopConsumer;
use crate::metrics as m;

impl Committer {
    /// A fatal client error (e.g. this static member or transactional id was fenced by a newer
    /// instance) ends the loop: a zombie must not go on. A producer that lost its transaction
    /// while the consumer still holds the membership is replaced instead (see
    /// [`Self::replace_lost_producer`]).
    pub(crate) fn check_fatal(
        &mut self,
        consumer: &LoopConsumer,
    ) -> Result<Option<AfterFailure>, ProcessorError> {
        if let Some((code, _)) = self.producer.fatal_error() {
            let error = KafkaError::Global(code);
            if Recovery::after_fatal(&error, lost_transaction(consumer))
                == Recovery::ReplaceProducer
            {
                return self.replace_lost_producer(&error).map(Some);
            }
        }
        let fatal = consumer
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
            None => Ok(None),
        }
    }

    /// Ends the open transaction: nothing of it becomes visible.
    pub(crate) fn abort(
        &mut self,
        consumer: &LoopConsumer,
    ) -> Result<AfterFailure, ProcessorError> {
        counter!(m::TRANSACTIONS, "outcome" => "aborted").increment(1);
        match self.producer.abort() {
            Ok(()) => Ok(AfterFailure::Rewind),
            // A fresh producer's init_transactions aborts whatever is still open.
            Err(failure) => {
                let recovery = Recovery::after_failed_abort(&failure, lost_transaction(consumer));
                self.recover(recovery, failure, consumer)
            }
        }
    }

    /// A transactional call failed: abort and redo, settle an unknown outcome with a new
    /// producer, or stop (or replace a producer that lost its transaction, see
    /// [`Self::replace_lost_producer`]).
    pub(super) fn failed(
        &mut self,
        failure: TxnFailure,
        consumer: &LoopConsumer,
    ) -> Result<AfterFailure, ProcessorError> {
        let recovery = Recovery::after_failure(&failure, lost_transaction(consumer));
        self.recover(recovery, failure, consumer)
    }

    /// Carries `recovery` out for `failure`.
    fn recover(
        &mut self,
        recovery: Recovery,
        failure: TxnFailure,
        consumer: &LoopConsumer,
    ) -> Result<AfterFailure, ProcessorError> {
        match (recovery, failure) {
            (Recovery::AbortAndRedo, failure) => {
                warn!(error = %cause(failure), "aborting transaction");
                self.abort(consumer)
            }
            // After a fatal error only a lost transaction is recovered from.
            (Recovery::ReplaceProducer, TxnFailure::Fatal(error)) => {
                self.replace_lost_producer(&error)
            }
            (Recovery::ReplaceProducer, failure) => self.replace_producer(&cause(failure)),
            (Recovery::Stop, failure) => Err(ProcessorError::Fatal(cause(failure))),
        }
    }

    /// The producer lost its transaction while this instance still holds its group membership
    /// (see [`lost_transaction`]). As Kafka Streams does on a producer fence, a new producer
    /// (whose `init_transactions` takes the next epoch) and a recovery from committed state go
    /// on, instead of an exit that needs an orchestrator's restart.
    fn replace_lost_producer(
        &mut self,
        error: &KafkaError,
    ) -> Result<AfterFailure, ProcessorError> {
        warn!(
            %error,
            "producer lost its transaction while this instance still holds its group membership \
             (the transaction outlived transaction.timeout.ms, e.g. cut off from the broker; its \
             coordinator restarted; or an abort came while the previous commit was completing)"
        );
        self.replace_producer(error)
    }

    /// The transaction's outcome is unknown. A new producer with the same transactional.id
    /// fences the old one and resolves the transaction; then state and positions are re-read
    /// from Kafka, which holds either both the batch's outputs and offsets or neither.
    fn replace_producer(&mut self, cause: &KafkaError) -> Result<AfterFailure, ProcessorError> {
        warn!(error = %cause, "replacing the producer and recovering from committed state");
        counter!(m::TRANSACTIONS, "outcome" => "recovered").increment(1);
        self.producer = self.settings.create_producer()?;
        Ok(AfterFailure::RestoreAndRewind)
    }
}

/// What a lost producer transaction is taken for. While this instance's consumer still holds its
/// static group membership, no newer instance took over: the fence is the transaction
/// coordinator's, which aborts a transaction left open longer than transaction.timeout.ms and
/// bumps the producer epoch — what a network partition longer than the timeout causes; or the
/// transaction was lost to a broker restart (see
/// `eos_runtime::transaction_recovery::lost_its_transaction`). A newer instance with this
/// `group.instance.id` fences the consumer too (FencedInstanceId, fatal), and the group
/// generation in every offset commit keeps a zombie's batches out meanwhile
/// (docs/architecture/loop-invariants.md, "Loop invariants").
fn lost_transaction(consumer: &LoopConsumer) -> LostTransaction {
    if consumer.client().fatal_error().is_none() {
        LostTransaction::ReplaceProducer
    } else {
        LostTransaction::Stop
    }
}
