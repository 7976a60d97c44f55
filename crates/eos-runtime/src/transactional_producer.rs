//! A Kafka producer for the services that write in Kafka transactions (eos-processor,
//! outbox-relay): its creation (transactional in exactly-once mode, idempotent only in
//! at-least-once mode), sending records, waiting for their delivery, and the transactional calls
//! with their errors classified into what the caller's loop does next ([`TxnFailure`]).
//!
//! Every call here blocks up to its timeout, so the producer is used only from the loop's
//! dedicated thread, never on the async reactor.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::consumer::ConsumerGroupMetadata;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::OwnedHeaders;
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::{ClientConfig, ClientContext, TopicPartitionList};
use tracing::{info, warn};

use eos_core::Guarantee;

use crate::backoff::{
    BackoffBuilder as _, BlockingRetryable as _, doubling, immediate, send_when_queue_has_room,
};
use crate::kafka_clients;
use crate::stuck_call_watchdog::{self, CallWatch};

/// How long librdkafka holds a record to fill a larger request, unless the operator sets
/// `linger.ms` (`--kafka-property`). A commit waits out the linger of its last records
/// (rust-rdkafka's flush, which would cut it short, is not used: see `wait_for_deliveries`), so
/// at one record per transaction librdkafka's 5 ms default was most of a commit's time; 1 ms
/// doubled single-record transactions and left batch throughput where it was
/// (docs/BENCHMARKS.md "Single-record transactions").
const DEFAULT_LINGER_MS: &str = "1";
/// Commit attempts whose outcome is unknown before the producer is replaced.
const COMMIT_ATTEMPTS: u32 = 5;
/// Attempts of a retriable call other than commit before giving up on it (sending offsets: the
/// batch is aborted; aborting: the producer is replaced).
const CALL_ATTEMPTS: u32 = 5;
/// How long past its own timeout one call may run before it is taken as hung and the process
/// stops ([`stuck_call_watchdog`]).
const STUCK_CALL_GRACE: Duration = Duration::from_secs(20);

/// A record decided in this batch, waiting to be written.
#[derive(Debug)]
pub struct PendingRecord {
    pub topic: String,
    pub partition: Option<i32>,
    pub key: Option<Vec<u8>>,
    pub payload: Option<Vec<u8>>,
    pub headers: OwnedHeaders,
}

/// Why the producer could not be created or its deliveries did not all succeed.
#[derive(Debug, thiserror::Error)]
pub enum ProducerError {
    /// Fenced by a newer instance, or a fatal producer error: stop producing and exit non-zero
    /// so the orchestrator restarts the service (and the restart fences whatever is left).
    #[error("fatal Kafka error, stopping: {0}")]
    Fatal(KafkaError),
    /// A call failed outside a transaction; the caller may try again.
    #[error("Kafka: {0}")]
    Kafka(#[from] KafkaError),
}

/// Why a transaction did not commit.
#[derive(Debug)]
pub enum TxnFailure {
    /// Nothing of the batch is visible: abort, rewind, redo.
    Abortable(KafkaError),
    /// The transaction's outcome is unknown (a commit that may have happened, or an abort that
    /// did not finish): never abort; replace the producer, whose `init_transactions` resolves the
    /// transaction, and recover.
    Unknown(KafkaError),
    /// Fenced or fatal: stop.
    Fatal(KafkaError),
}

/// A failed call before the commit: nothing of the batch is visible, unless the producer is dead.
impl From<KafkaError> for TxnFailure {
    fn from(error: KafkaError) -> Self {
        match ErrorKind::of(&error) {
            ErrorKind::Fatal => Self::Fatal(error),
            ErrorKind::RequiresAbort | ErrorKind::Retriable | ErrorKind::Other => {
                Self::Abortable(error)
            }
        }
    }
}

/// What librdkafka says a failed call still allows (at most one of its flags is set).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ErrorKind {
    /// Fenced or broken: the producer can do nothing more.
    Fatal,
    /// The open transaction can only be aborted.
    RequiresAbort,
    /// The same call may be made again.
    Retriable,
    /// Anything else, such as a timeout or an error outside a transactional call.
    Other,
}

impl ErrorKind {
    fn of(error: &KafkaError) -> Self {
        match error {
            KafkaError::Transaction(rd) if rd.is_fatal() => Self::Fatal,
            KafkaError::Transaction(rd) if rd.txn_requires_abort() => Self::RequiresAbort,
            KafkaError::Transaction(rd) if rd.is_retriable() => Self::Retriable,
            _ => Self::Other,
        }
    }
}

/// Makes `call` up to `attempts` times, again only after a failure `may_repeat` accepts, and
/// returns the first success or the failure it stopped at. No wait in between: librdkafka
/// already backs off between its own requests (`retry.backoff.ms`).
fn retry<E: std::fmt::Display>(
    attempts: u32,
    retrying: &str,
    may_repeat: impl Fn(&E) -> bool,
    call: impl FnMut() -> Result<(), E>,
) -> Result<(), E> {
    let mut attempt = 1;
    call.retry(immediate(attempts.saturating_sub(1) as usize))
        .when(may_repeat)
        .notify(|error, _delay| {
            warn!(%error, attempt, "{retrying}");
            attempt += 1;
        })
        .call()
}

/// Counts failed deliveries (at-least-once mode has no transaction to fail instead).
#[derive(Debug, Default)]
struct DeliveryTracker {
    failures: Mutex<Vec<String>>,
}

impl ClientContext for DeliveryTracker {
    fn error(&self, error: KafkaError, reason: &str) {
        crate::kafka_errors::report_client_error(&error, reason);
    }
}

impl ProducerContext for DeliveryTracker {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _opaque: ()) {
        if let Err((error, _)) = result
            && let Ok(mut failures) = self.failures.lock()
        {
            failures.push(error.to_string());
        }
    }
}

/// The producer of a service's outputs (and, in eos-processor, its dead letters and changelog
/// records).
pub struct TransactionalProducer {
    producer: ThreadedProducer<DeliveryTracker>,
    /// How long one blocking call may take.
    call_timeout: Duration,
    /// The blocking call in progress, for the watchdog that stops a process whose call hangs.
    watch: Arc<CallWatch>,
}

impl std::fmt::Debug for TransactionalProducer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransactionalProducer")
            .field("call_timeout", &self.call_timeout)
            .finish_non_exhaustive()
    }
}

impl TransactionalProducer {
    /// Creates the producer; in exactly-once mode `init_transactions` fences any earlier instance
    /// with the same `transactional_id` and aborts its open transaction.
    pub fn new(
        client_config: &ClientConfig,
        guarantee: Guarantee,
        transactional_id: &str,
        transaction_timeout: Duration,
        call_timeout: Duration,
    ) -> Result<Self, ProducerError> {
        let mut config = kafka_clients::idempotent_producer(client_config);
        if client_config.get("linger.ms").is_none() {
            config.set("linger.ms", DEFAULT_LINGER_MS);
        }
        config
            // librdkafka's default backoff makes back-to-back transactions slow: the next
            // AddOffsetsToTxn meets the previous transaction's markers ("concurrent transactions")
            // and waits a backoff that doubles up to retry.backoff.max.ms.
            .set("retry.backoff.ms", "1")
            .set("retry.backoff.max.ms", "10");
        if guarantee == Guarantee::ExactlyOnce {
            config.set("transactional.id", transactional_id).set(
                "transaction.timeout.ms",
                transaction_timeout.as_millis().to_string(),
            );
        }
        let producer: ThreadedProducer<DeliveryTracker> =
            config.create_with_context(DeliveryTracker::default())?;
        let watch = Arc::new(CallWatch::default());
        stuck_call_watchdog::spawn(
            &watch,
            call_timeout + STUCK_CALL_GRACE,
            stuck_call_watchdog::exit_on_stuck_call,
        )
        .map_err(|error| {
            ProducerError::Kafka(KafkaError::ClientCreation(format!(
                "cannot start the call watchdog thread: {error}"
            )))
        })?;
        if guarantee == Guarantee::ExactlyOnce {
            // A timeout while the transaction coordinator moves (its broker died, the
            // `__transaction_state` partition elects a new leader) is retriable: librdkafka
            // resumes the same initialisation on the next call.
            retry(
                CALL_ATTEMPTS,
                "init_transactions did not finish; retrying",
                |error| ErrorKind::of(error) == ErrorKind::Retriable,
                || {
                    let _call = watch.enter("init_transactions");
                    producer.init_transactions(call_timeout)
                },
            )
            .map_err(|error| match ErrorKind::of(&error) {
                ErrorKind::Fatal => ProducerError::Fatal(error),
                ErrorKind::RequiresAbort | ErrorKind::Retriable | ErrorKind::Other => {
                    ProducerError::Kafka(error)
                }
            })?;
            info!(%transactional_id, "transactions initialised; earlier instances with this id are fenced");
        }
        Ok(Self {
            producer,
            call_timeout,
            watch,
        })
    }

    /// The producer's fatal error, if it has one (e.g. fenced by a newer instance).
    pub fn fatal_error(&self) -> Option<(RDKafkaErrorCode, String)> {
        self.producer.client().fatal_error()
    }

    pub fn begin(&self) -> Result<(), TxnFailure> {
        Ok(self.producer.begin_transaction()?)
    }

    /// Enqueues one record, waiting while the local queue is full.
    #[expect(
        clippy::result_large_err,
        reason = "rdkafka's send hands the record back inside its error"
    )]
    pub fn send(&self, record: &PendingRecord) -> Result<(), KafkaError> {
        let mut base = BaseRecord::to(&record.topic).headers(record.headers.clone());
        if let Some(partition) = record.partition {
            base = base.partition(partition);
        }
        if let Some(key) = &record.key {
            base = base.key(key.as_slice());
        }
        if let Some(payload) = &record.payload {
            base = base.payload(payload.as_slice());
        }
        send_when_queue_has_room(base, |base| self.producer.send(base), std::thread::sleep)
            .map_err(|(error, _)| error)
    }

    /// Adds the consumed `offsets` to the open transaction.
    pub fn send_offsets(
        &self,
        offsets: &TopicPartitionList,
        group_metadata: &ConsumerGroupMetadata,
    ) -> Result<(), TxnFailure> {
        retry(
            CALL_ATTEMPTS,
            "send_offsets_to_transaction failed; retrying",
            |error| ErrorKind::of(error) == ErrorKind::Retriable,
            || {
                let _call = self.watch.enter("send_offsets_to_transaction");
                self.producer.send_offsets_to_transaction(
                    offsets,
                    group_metadata,
                    self.call_timeout,
                )
            },
        )
        .map_err(TxnFailure::from)
    }

    /// Waits for the deliveries, then commits. Unless the failure is fatal or requires an abort,
    /// the outcome is unknown (the commit may have happened), so only the commit is retried.
    pub fn commit(&self) -> Result<(), TxnFailure> {
        self.wait_for_deliveries();
        retry(
            COMMIT_ATTEMPTS,
            "commit outcome unknown; retrying the commit",
            |error| {
                matches!(
                    ErrorKind::of(error),
                    ErrorKind::Retriable | ErrorKind::Other
                )
            },
            || {
                let _call = self.watch.enter("commit_transaction");
                self.producer.commit_transaction(self.call_timeout)
            },
        )
        .map_err(|error| match ErrorKind::of(&error) {
            ErrorKind::Fatal => TxnFailure::Fatal(error),
            ErrorKind::RequiresAbort => TxnFailure::Abortable(error),
            ErrorKind::Retriable | ErrorKind::Other => TxnFailure::Unknown(error),
        })
    }

    /// Aborts the open transaction. `Unknown` when it could not: a fresh producer's
    /// `init_transactions` aborts whatever is still open.
    pub fn abort(&self) -> Result<(), TxnFailure> {
        retry(
            CALL_ATTEMPTS,
            "abort failed; retrying",
            |error| ErrorKind::of(error) == ErrorKind::Retriable,
            || {
                let _call = self.watch.enter("abort_transaction");
                self.producer.abort_transaction(self.call_timeout)
            },
        )
        .map_err(|error| match ErrorKind::of(&error) {
            ErrorKind::Fatal => TxnFailure::Fatal(error),
            ErrorKind::RequiresAbort | ErrorKind::Retriable | ErrorKind::Other => {
                TxnFailure::Unknown(error)
            }
        })
    }

    /// At-least-once: waits until everything sent so far is delivered; a failed delivery is fatal.
    pub fn flush_delivered(&self) -> Result<(), ProducerError> {
        if !self.wait_for_deliveries() {
            self.producer.flush(Duration::ZERO)?;
        }
        let failures = self
            .producer
            .context()
            .failures
            .lock()
            .map(|mut failures| std::mem::take(&mut *failures))
            .unwrap_or_default();
        if let Some(first) = failures.first() {
            return Err(ProducerError::Fatal(KafkaError::Global(
                RDKafkaErrorCode::Fail,
            )))
            .inspect_err(|_| warn!(failed = failures.len(), first, "deliveries failed"));
        }
        Ok(())
    }

    /// Waits until every enqueued record is acknowledged; false on timeout.
    ///
    /// rust-rdkafka's `flush` (also called inside `commit_transaction`) polls in 100 ms slices,
    /// and with a `ThreadedProducer` the background thread takes the delivery events, so each
    /// flush would sleep a full slice: 100 ms per transaction. Waiting on the queue length here
    /// makes that inner flush a no-op.
    fn wait_for_deliveries(&self) -> bool {
        let deadline = Instant::now() + self.call_timeout;
        // Acknowledgements take a few milliseconds: poll often at first, never slower than 0.5 ms.
        let mut delays = doubling(Duration::from_micros(50), Duration::from_micros(500)).build();
        while self.producer.in_flight_count() > 0 {
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(delays.next().unwrap_or(Duration::from_micros(500)));
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `retry` with 5 attempts, repeating only "busy", over a call that fails with `failures` in
    /// turn and then succeeds: its result and how many calls it made.
    fn retry_over(failures: &[&'static str]) -> (Result<(), &'static str>, usize) {
        let mut calls = 0;
        let result = retry(
            5,
            "retrying",
            |error| *error == "busy",
            || {
                calls += 1;
                failures
                    .get(calls - 1)
                    .map_or(Ok(()), |&failure| Err(failure))
            },
        );
        (result, calls)
    }

    #[test]
    fn repeats_a_repeatable_failure_until_success() {
        assert_eq!(retry_over(&["busy", "busy"]), (Ok(()), 3));
    }

    #[test]
    fn stops_at_a_failure_it_may_not_repeat() {
        assert_eq!(retry_over(&["busy", "fenced", "busy"]), (Err("fenced"), 2));
    }

    #[test]
    fn gives_up_after_the_last_attempt() {
        assert_eq!(retry_over(&["busy"; 9]), (Err("busy"), 5));
    }

    #[test]
    fn an_error_outside_a_transactional_call_aborts_the_batch() {
        let error = KafkaError::Global(RDKafkaErrorCode::Fail);
        assert_eq!(ErrorKind::of(&error), ErrorKind::Other);
        assert!(matches!(TxnFailure::from(error), TxnFailure::Abortable(_)));
    }
}
