//! The local checkpoint of each owned changelog partition: how far the state store is known to
//! equal the changelog, so that a restart on the same disk reads only the changelog's tail
//! (docs/architecture/processor-state.md, "Processor state on disk").

use std::time::{Duration, Instant};

use eos_runtime::backoff::{BackoffBuilder as _, doubling};
use rdkafka::consumer::Consumer;
use tracing::{debug, warn};

use super::OwnedStates;
use crate::error::ProcessorError;
use crate::loop_consumer::LoopConsumer;
use crate::state_store::StateChanges;

/// How often the local checkpoint of each changelog partition is moved up to what the store
/// holds (an fsync of the store each): what a restart on the same disk reads of the changelog is
/// about this much of its tail.
const CHECKPOINT_INTERVAL: Duration = Duration::from_secs(1);

/// A checkpoint with nothing written after it is rewritten this often, so its age (checked
/// against the changelog's `delete.retention.ms`) stays that of the last time it was true.
const CHECKPOINT_REFRESH: Duration = Duration::from_secs(3600);

impl<S: Clone + Default> OwnedStates<S> {
    /// Moves the local checkpoints up (see [`Self::advance_checkpoints`]) when the last move is
    /// `CHECKPOINT_INTERVAL` old.
    pub(crate) fn checkpoint_if_due(
        &mut self,
        consumer: &LoopConsumer,
    ) -> Result<(), ProcessorError> {
        if self.last_checkpoint.elapsed() < CHECKPOINT_INTERVAL {
            return Ok(());
        }
        self.advance_checkpoints(consumer)
    }

    /// Moves each owned partition's local checkpoint up to the changelog's end, when that end is
    /// exactly where this instance's own committed batches put it: then every record below it
    /// is in the store. Any other end (a commit marker not written yet, or records of another
    /// writer, such as a zombie's or a former owner's late abort marker) leaves the checkpoint
    /// where it is: too low is only more to read at a restart, too high would skip state.
    fn advance_checkpoints(&mut self, consumer: &LoopConsumer) -> Result<(), ProcessorError> {
        self.last_checkpoint = Instant::now();
        for (&partition, end) in &mut self.changelog_ends {
            let Some(expected_end) = end.expected_end else {
                continue;
            };
            if expected_end == end.checkpointed
                && end.checkpointed_at.elapsed() < CHECKPOINT_REFRESH
            {
                continue;
            }
            let Some(state) = self.states.get(&partition) else {
                continue;
            };
            let high = match consumer.fetch_watermarks(
                &self.changelog.topic,
                partition,
                Duration::from_secs(5),
            ) {
                Ok((_, high)) => high,
                Err(error) => {
                    debug!(partition, %error, "changelog end not readable; checkpoint later");
                    continue;
                }
            };
            if high != expected_end {
                debug!(
                    partition,
                    high, expected_end, "changelog end not (yet) where this instance left it"
                );
                continue;
            }
            // docs/architecture/processor-state.md "Processor state on disk": the checkpoint only
            // moves forward, to an end this instance's own committed batches put there.
            debug_assert!(
                high >= end.checkpointed,
                "partition {partition}: local checkpoint moved back from {} to {high}",
                end.checkpointed
            );
            state.store().write(&StateChanges::default(), Some(high))?;
            end.checkpointed = high;
            end.checkpointed_at = Instant::now();
        }
        Ok(())
    }

    /// After the last commit: the commit markers are written a moment after the commit returns,
    /// so a few tries to leave checkpoints at the very end.
    pub(crate) fn checkpoint_on_shutdown(&mut self, consumer: &LoopConsumer) {
        // About a second in all (20 + 40 + … + 320 ms, then 320 ms each).
        let delays = doubling(Duration::from_millis(20), Duration::from_millis(320)).build();
        for delay in delays.take(6) {
            if let Err(error) = self.advance_checkpoints(consumer) {
                warn!(%error, "cannot write the local checkpoint at shutdown");
                return;
            }
            let behind = self
                .changelog_ends
                .values()
                .any(|end| end.expected_end.is_some_and(|e| e != end.checkpointed));
            if !behind {
                return;
            }
            std::thread::sleep(delay);
        }
    }
}
