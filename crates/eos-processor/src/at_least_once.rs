//! The at-least-once mode: outputs and dead letters are sent as they are decided, and a batch's
//! commit waits for them, then writes its changelog records and waits again, then commits the
//! consumed offsets. Effects become visible before the offsets that cover them are committed, so
//! a crash in between repeats them on restart (docs/ARCHITECTURE.md, "Boundaries").

use std::time::Instant;

use metrics::histogram;
use rdkafka::consumer::{CommitMode, Consumer};

use crate::batch::Batch;
use crate::error::ProcessorError;
use crate::metrics as m;
use crate::transaction_loop::TransactionLoop;
use crate::transform::Transform;

impl<T: Transform> TransactionLoop<T> {
    /// At-least-once streams outputs and dead letters as they are decided, like a plain
    /// consumer-producer pipeline: they become visible before the offsets that cover them are
    /// committed.
    pub(crate) fn send_decided_now(&mut self) -> Result<(), ProcessorError> {
        for record in self.batch.take_unsent() {
            self.producer.send(&record)?;
        }
        Ok(())
    }

    /// At-least-once commit: outputs (already sent), then state, then offsets, each after the
    /// previous is delivered. A crash before the offsets are committed repeats effects on restart.
    pub(crate) fn commit_at_least_once(
        &mut self,
        batch: Batch<T::State>,
    ) -> Result<(), ProcessorError> {
        let started = Instant::now();
        self.producer.flush_delivered()?;
        for record in &self.states.changelog_records::<T>(&batch) {
            self.producer.send(record)?;
        }
        self.producer.flush_delivered()?;
        let offsets = batch.positions().to_offsets(&self.settings.input_topic)?;
        self.consumer.commit(&offsets, CommitMode::Sync)?;
        histogram!(m::TRANSACTION_SECONDS).record(started.elapsed().as_secs_f64());
        self.apply_committed(batch)
    }
}
