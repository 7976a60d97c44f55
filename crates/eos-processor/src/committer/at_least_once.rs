//! The at-least-once mode: outputs and dead letters are sent as they are decided
//! ([`Committer::send_decided`]), and a batch's commit waits for them, then writes its changelog
//! records and waits again, then commits the consumed offsets. Effects become visible before the
//! offsets that cover them are committed, so a crash in between repeats them on restart
//! (docs/ARCHITECTURE.md, "Boundaries").

use std::time::Instant;

use metrics::histogram;
use rdkafka::consumer::{CommitMode, Consumer};

use eos_runtime::transactional_producer::PendingRecord;

use super::{CommitOutcome, Committer};
use crate::batch::Batch;
use crate::error::ProcessorError;
use crate::loop_consumer::LoopConsumer;
use crate::metrics as m;

impl Committer {
    /// Outputs (already sent), then state, then offsets, each after the previous is delivered.
    /// A crash before the offsets are committed repeats effects on restart.
    pub(super) fn commit_at_least_once<S>(
        &mut self,
        batch: Batch<S>,
        changelog: &[PendingRecord],
        consumer: &LoopConsumer,
    ) -> Result<CommitOutcome<S>, ProcessorError> {
        let started = Instant::now();
        self.producer.flush_delivered()?;
        for record in changelog {
            self.producer.send(record)?;
        }
        self.producer.flush_delivered()?;
        let offsets = batch.positions().to_offsets(&self.settings.input_topic)?;
        consumer.commit(&offsets, CommitMode::Sync)?;
        histogram!(m::TRANSACTION_SECONDS).record(started.elapsed().as_secs_f64());
        Ok(CommitOutcome::Committed(Box::new(batch)))
    }
}
