//! The exactly-once write of the open batch: records go into the open transaction as they are
//! decided (the first one begins it), and the commit adds the changelog records and the consumed
//! offsets (with the group generation, KIP-447) before `commit_transaction`
//! (docs/architecture/loop-invariants.md, "Loop invariants" and "Latency"). A failure goes to
//! `recovery.rs`.

use std::time::Instant;

use metrics::histogram;
use rdkafka::consumer::Consumer;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use tracing::{debug, info_span, warn};
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use eos_runtime::transactional_producer::{PendingRecord, TxnFailure};

use super::{AfterFailure, CommitOutcome, Committer};
use crate::batch::Batch;
use crate::error::ProcessorError;
use crate::loop_consumer::LoopConsumer;
use crate::metrics as m;

impl Committer {
    /// What was decided goes into the open transaction, begun by the first record after a
    /// commit.
    pub(super) fn send_into_transaction<S>(
        &mut self,
        batch: &mut Batch<S>,
        consumer: &LoopConsumer,
    ) -> Result<Option<AfterFailure>, ProcessorError> {
        if batch.unsent().is_empty() {
            return Ok(None);
        }
        let sent = (|| {
            if !batch.transaction_open() {
                self.producer.begin()?;
                batch.mark_transaction_open();
            }
            for record in batch.take_unsent() {
                self.producer.send(&record)?;
            }
            Ok(())
        })();
        match sent {
            Ok(()) => Ok(None),
            Err(failure) => self.failed(failure, consumer).map(Some),
        }
    }

    /// The rest of the transaction (see [`Self::write_transaction`]), then its commit, under
    /// the batch's `transaction` span linked to each record's `process` span.
    pub(super) fn commit_transaction<S>(
        &mut self,
        batch: Batch<S>,
        changelog: &[PendingRecord],
        consumer: &LoopConsumer,
    ) -> Result<CommitOutcome<S>, ProcessorError> {
        let span = info_span!(
            "transaction",
            otel.name = "eos-processor transaction",
            otel.kind = "producer",
            messaging.system = "kafka",
            messaging.operation.type = "send",
            messaging.destination.name = %self.settings.destination(),
            eos.records = batch.records_in(),
            eos.outcome = tracing::field::Empty,
        );
        for link in batch.links() {
            span.add_link(link.clone());
        }
        let _entered = span.enter();
        let started = Instant::now();
        let written = self.write_transaction(&batch, changelog, consumer);
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
                Ok(CommitOutcome::Committed(Box::new(batch)))
            }
            Err(failure) => self.failed(failure, consumer).map(CommitOutcome::Failed),
        }
    }

    fn fault_abort_due(&self) -> bool {
        self.settings
            .fault_abort_every
            .is_some_and(|every| self.transactions_written.is_multiple_of(every))
    }

    /// The rest of the transaction: begin (unless records already opened it), whatever is not
    /// sent yet, the changelog records, then the consumed offsets. Nothing is committed yet.
    fn write_transaction<S>(
        &self,
        batch: &Batch<S>,
        changelog: &[PendingRecord],
        consumer: &LoopConsumer,
    ) -> Result<(), TxnFailure> {
        if !batch.transaction_open() {
            self.producer.begin()?;
        }
        for record in batch.unsent().iter().chain(changelog) {
            self.producer.send(record)?;
        }
        let offsets = batch.positions().to_offsets(&self.settings.input_topic)?;
        let group_metadata = consumer
            .group_metadata()
            .ok_or_else(|| TxnFailure::Abortable(KafkaError::Global(RDKafkaErrorCode::State)))?;
        self.producer.send_offsets(&offsets, &group_metadata)
    }
}
