//! The exactly-once write of the open batch: records go into the open transaction as they are
//! decided (the first one begins it), and the commit adds the changelog records and the consumed
//! offsets (with the group generation, KIP-447) before `commit_transaction`
//! (docs/architecture/loop-invariants.md, "Loop invariants" and "Latency"). A failure goes to
//! `batch_recovery.rs`.

use std::time::Instant;

use metrics::histogram;
use rdkafka::consumer::Consumer;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use tracing::{debug, info_span, warn};
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use eos_runtime::transactional_producer::{PendingRecord, TxnFailure};

use crate::batch::Batch;
use crate::error::ProcessorError;
use crate::metrics as m;
use crate::transaction_loop::TransactionLoop;
use crate::transform::Transform;

impl<T: Transform> TransactionLoop<T> {
    /// Exactly-once: what was just decided goes into the open transaction, which the first
    /// record after a commit begins (see the module doc). Nothing of it is visible before the
    /// commit; a failure here ends the transaction as a failed commit would.
    pub(crate) fn send_decided_in_transaction(&mut self) -> Result<(), ProcessorError> {
        if self.batch.unsent().is_empty() {
            return Ok(());
        }
        match self.send_into_transaction() {
            Ok(()) => Ok(()),
            Err(failure) => self.transaction_failed(failure),
        }
    }

    fn send_into_transaction(&mut self) -> Result<(), TxnFailure> {
        if !self.batch.transaction_open() {
            self.producer.begin()?;
            self.batch.mark_transaction_open();
        }
        for record in self.batch.take_unsent() {
            self.producer.send(&record)?;
        }
        Ok(())
    }

    pub(crate) fn commit_transactional(
        &mut self,
        batch: Batch<T::State>,
    ) -> Result<(), ProcessorError> {
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
        let changelog = self.states.changelog_records::<T>(&batch);
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
        if !batch.transaction_open() {
            self.producer.begin()?;
        }
        for record in batch.unsent().iter().chain(changelog) {
            self.producer.send(record)?;
        }
        let offsets = batch.positions().to_offsets(&self.settings.input_topic)?;
        let group_metadata = self
            .consumer
            .group_metadata()
            .ok_or_else(|| TxnFailure::Abortable(KafkaError::Global(RDKafkaErrorCode::State)))?;
        self.producer.send_offsets(&offsets, &group_metadata)
    }
}
