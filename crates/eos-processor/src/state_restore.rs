//! A partition's state restored before any of its records is processed: read from the
//! changelog with `read_committed`, from the local checkpoint when the store is still good
//! (`changelog.rs`; docs/ARCHITECTURE.md "Boundaries" and docs/architecture/processor-state.md
//! "Processor state on disk").

use std::time::Instant;

use metrics::{counter, histogram};
use tracing::info;

use crate::changelog;
use crate::changelog_end::ChangelogEnd;
use crate::error::ProcessorError;
use crate::metrics as m;
use crate::partition_state::PartitionState;
use crate::transaction_loop::TransactionLoop;
use crate::transform::Transform;

impl<T: Transform> TransactionLoop<T> {
    pub(crate) fn restore(&mut self, partition: i32) -> Result<(), ProcessorError> {
        let started = Instant::now();
        // A fresh handle: a cached read view of the old one must not outlive the restore.
        self.states.remove(&partition);
        let store = self
            .store
            .partition(&self.settings.changelog_topic, partition)?;
        let outcome = changelog::restore_partition(
            &self.transform,
            &self.settings.client_config,
            &self.settings.changelog_topic,
            partition,
            self.settings.restore_timeout(),
            &store,
            self.settings.changelog_delete_retention,
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
}
