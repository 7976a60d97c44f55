//! What a transactional loop (eos-processor's, outbox-relay's) does after a transaction failed:
//! the one policy both follow, from the error classes [`TxnFailure`] already sorts librdkafka's
//! errors into (docs/architecture/pitfalls.md "Pitfalls" and docs/architecture/loop-invariants.md
//! "Loop invariants").
//!
//! The retries are the producer's own ([`crate::transactional_producer`]): a retriable call is
//! made again there, and a commit whose outcome is unknown is retried, never aborted. What is
//! left when they run out is decided here, without I/O:
//!
//! - abortable (nothing of the batch is visible) → abort, rewind to the committed position, redo;
//! - outcome unknown, or an abort that failed → a new producer, whose `init_transactions` settles
//!   the open transaction, then recovery from committed state;
//! - fenced or fatal → stop and exit non-zero, except a lost transaction (see
//!   [`lost_its_transaction`]) where the caller knows no newer instance holds its identity: a new
//!   producer, as for an unknown outcome.

use rdkafka::error::{KafkaError, RDKafkaErrorCode};

use crate::transactional_producer::TxnFailure;

/// What the loop does next after a transaction failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recovery {
    /// Nothing of the batch is visible: abort the transaction, rewind to the committed position
    /// and redo the batch.
    AbortAndRedo,
    /// The transaction's outcome is unknown, or the producer lost it: never abort; replace the
    /// producer (its `init_transactions` fences the old one and settles the transaction) and
    /// recover from what Kafka committed.
    ReplaceProducer,
    /// Fenced by a newer instance, or a fatal error: stop and exit non-zero; the orchestrator's
    /// restart fences whatever is left.
    Stop,
}

/// What the caller knows when its producer lost its transaction ([`lost_its_transaction`]):
/// whether that can only be the transaction coordinator's doing, not a newer instance's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LostTransaction {
    /// No newer instance holds this identity (eos-processor: its consumer still holds its
    /// static group membership, which a newer instance with the same `group.instance.id` would
    /// have fenced). The coordinator aborted a transaction that outlived
    /// `transaction.timeout.ms`, or a restarted coordinator no longer holds it: a new producer
    /// recovers, as Kafka Streams does.
    ReplaceProducer,
    /// Nothing tells the coordinator's fence from a newer instance's (outbox-relay, whose
    /// identity is only its `transactional.id`): stop, like any fence.
    Stop,
}

impl Recovery {
    /// After a transactional call (begin, send, sending the offsets, commit) failed.
    pub fn after_failure(failure: &TxnFailure, lost: LostTransaction) -> Self {
        match failure {
            TxnFailure::Abortable(_) => Self::AbortAndRedo,
            TxnFailure::Unknown(_) => Self::ReplaceProducer,
            TxnFailure::Fatal(error) => Self::after_fatal(error, lost),
        }
    }

    /// After the abort itself failed: it cannot be aborted again, so anything short of fatal
    /// leaves it to a new producer's `init_transactions`, which aborts whatever is still open.
    pub fn after_failed_abort(failure: &TxnFailure, lost: LostTransaction) -> Self {
        match failure {
            TxnFailure::Abortable(_) | TxnFailure::Unknown(_) => Self::ReplaceProducer,
            TxnFailure::Fatal(error) => Self::after_fatal(error, lost),
        }
    }

    /// After a fatal producer error (a failed call's, or the one the producer reports by
    /// itself): only a lost transaction the caller may recover from goes on.
    pub fn after_fatal(error: &KafkaError, lost: LostTransaction) -> Self {
        if lost == LostTransaction::ReplaceProducer && lost_its_transaction(error) {
            Self::ReplaceProducer
        } else {
            Self::Stop
        }
    }
}

/// The error a failed transaction ends with, whatever its class.
pub fn cause(failure: TxnFailure) -> KafkaError {
    match failure {
        TxnFailure::Abortable(error) | TxnFailure::Unknown(error) | TxnFailure::Fatal(error) => {
            error
        }
    }
}

/// The producer lost its transaction: its epoch was taken away (by a newer producer with the
/// same `transactional.id`, or by the transaction coordinator after a transaction timed out), or
/// the coordinator no longer holds the transaction in the state the producer expects. The last
/// is what a broker SIGKILLed and restarted answers a retried EndTxn with (INVALID_TXN_STATE):
/// the reloaded coordinator may have aborted the transaction meanwhile. It is also the answer to
/// an abort sent while the previous transaction's commit markers are still being written: the
/// new transaction's first AddPartitionsToTxn was told CONCURRENT_TRANSACTIONS and waits to be
/// retried, so nothing of it reached a partition, but librdkafka sends the EndTxn anyway and
/// takes the refusal as fatal (a rebalance right after a commit does this). Either way the
/// outcome is settled by a new producer's `init_transactions`, as after a commit whose outcome
/// is unknown.
pub fn lost_its_transaction(error: &KafkaError) -> bool {
    let code = match error {
        KafkaError::Transaction(rd) => rd.code(),
        KafkaError::Global(code) => *code,
        _ => return false,
    };
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

    const BOTH: [LostTransaction; 2] = [LostTransaction::ReplaceProducer, LostTransaction::Stop];

    fn error(code: RDKafkaErrorCode) -> KafkaError {
        KafkaError::Global(code)
    }

    #[test]
    fn an_abortable_failure_is_aborted_and_redone() {
        for lost in BOTH {
            let failure = TxnFailure::Abortable(error(RDKafkaErrorCode::Fail));
            assert_eq!(
                Recovery::after_failure(&failure, lost),
                Recovery::AbortAndRedo
            );
        }
    }

    #[test]
    fn an_unknown_outcome_is_never_aborted_but_settled_by_a_new_producer() {
        for lost in BOTH {
            let failure = TxnFailure::Unknown(error(RDKafkaErrorCode::RequestTimedOut));
            assert_eq!(
                Recovery::after_failure(&failure, lost),
                Recovery::ReplaceProducer
            );
        }
    }

    #[test]
    fn a_failed_abort_is_left_to_a_new_producer_unless_fatal() {
        for lost in BOTH {
            for failure in [
                TxnFailure::Abortable(error(RDKafkaErrorCode::Fail)),
                TxnFailure::Unknown(error(RDKafkaErrorCode::RequestTimedOut)),
            ] {
                assert_eq!(
                    Recovery::after_failed_abort(&failure, lost),
                    Recovery::ReplaceProducer
                );
            }
            let fatal = TxnFailure::Fatal(error(RDKafkaErrorCode::Fail));
            assert_eq!(Recovery::after_failed_abort(&fatal, lost), Recovery::Stop);
        }
    }

    #[test]
    fn a_lost_transaction_is_recovered_only_where_the_caller_allows_it() {
        for code in [
            RDKafkaErrorCode::Fenced,
            RDKafkaErrorCode::ProducerFenced,
            RDKafkaErrorCode::InvalidProducerEpoch,
            RDKafkaErrorCode::InvalidTransactionalState,
        ] {
            let failure = TxnFailure::Fatal(error(code));
            assert_eq!(
                Recovery::after_failure(&failure, LostTransaction::ReplaceProducer),
                Recovery::ReplaceProducer,
                "{code:?}"
            );
            assert_eq!(
                Recovery::after_failed_abort(&failure, LostTransaction::ReplaceProducer),
                Recovery::ReplaceProducer,
                "{code:?}"
            );
            assert_eq!(
                Recovery::after_failure(&failure, LostTransaction::Stop),
                Recovery::Stop,
                "{code:?}"
            );
        }
    }

    #[test]
    fn any_other_fatal_error_stops() {
        for lost in BOTH {
            for fatal in [
                error(RDKafkaErrorCode::Fail),
                error(RDKafkaErrorCode::FencedInstanceId),
                // A lost transaction's code, but not from a transactional call or the producer.
                KafkaError::MessageProduction(RDKafkaErrorCode::ProducerFenced),
            ] {
                assert_eq!(Recovery::after_fatal(&fatal, lost), Recovery::Stop);
            }
        }
    }

    #[test]
    fn the_cause_is_the_failures_error_whatever_its_class() {
        for failure in [
            TxnFailure::Abortable(error(RDKafkaErrorCode::Fail)),
            TxnFailure::Unknown(error(RDKafkaErrorCode::Fail)),
            TxnFailure::Fatal(error(RDKafkaErrorCode::Fail)),
        ] {
            assert_eq!(cause(failure), error(RDKafkaErrorCode::Fail));
        }
    }
}
