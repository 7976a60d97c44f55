//! A partition's state restored before any of its records is processed: read from the
//! changelog with `read_committed`, from the local checkpoint when the store is still good
//! (`changelog.rs`; docs/ARCHITECTURE.md "Boundaries" and docs/architecture/processor-state.md
//! "Processor state on disk").

use std::time::Instant;

use metrics::{counter, histogram};
use tracing::info;

use super::{ChangelogEnd, OwnedStates};
use crate::changelog;
use crate::error::ProcessorError;
use crate::metrics as m;
use crate::partition_state::PartitionState;
use crate::transform::Transform;

impl<S: Clone + Default> OwnedStates<S> {
    /// Brings `partition`'s state up to the changelog's committed end; from then on this
    /// instance owns it.
    pub(crate) fn restore<T: Transform<State = S>>(
        &mut self,
        partition: i32,
        transform: &T,
    ) -> Result<(), ProcessorError> {
        let started = Instant::now();
        // A fresh handle: a cached read view of the old one must not outlive the restore.
        self.states.remove(&partition);
        let store = self.store.partition(&self.changelog.topic, partition)?;
        let outcome = changelog::restore_partition(
            transform,
            &self.changelog.client_config,
            &self.changelog.topic,
            partition,
            self.changelog.restore_timeout,
            &store,
            self.changelog.delete_retention,
        )?;
        let (entities, seen_ids) = store.counts()?;
        histogram!(m::RESTORE_SECONDS, "mode" => outcome.mode.as_str())
            .record(started.elapsed().as_secs_f64());
        counter!(m::RESTORED_RECORDS, "mode" => outcome.mode.as_str()).increment(outcome.records);
        info!(
            partition,
            restore = outcome.mode.as_str(),
            cold_reason = outcome.reason,
            changelog_records = outcome.records,
            from_offset = outcome.from_offset,
            next_offset = outcome.next_offset,
            entities,
            seen_ids,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "state restored"
        );
        self.changelog_ends.insert(
            partition,
            ChangelogEnd {
                checkpointed: outcome.next_offset,
                checkpointed_at: Instant::now(),
                expected_end: Some(outcome.next_offset),
            },
        );
        self.states.insert(partition, PartitionState::new(store));
        Ok(())
    }

    /// Every owned partition's state again, from what Kafka committed: after a transaction whose
    /// outcome was unknown.
    pub(crate) fn restore_all<T: Transform<State = S>>(
        &mut self,
        transform: &T,
    ) -> Result<(), ProcessorError> {
        for partition in self.partitions() {
            self.restore(partition, transform)?;
        }
        Ok(())
    }
}
