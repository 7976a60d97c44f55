//! Finishing the open batch (`batch.rs`): when it is finished (full, due, or the loop idle past
//! transaction markers), the positions it commits, and what its commit's outcome does: a
//! committed batch's changes go to the owned states, a failed one's are dropped and every owned
//! partition is rewound (docs/architecture/loop-invariants.md, "Loop invariants"). How it is
//! written is the committer's (`committer/`).

use std::time::Duration;

use metrics::counter;
use rdkafka::consumer::Consumer;
use rdkafka::message::Message as _;
use rdkafka::{Offset, TopicPartitionList};
use tracing::{debug, info, warn};

use eos_runtime::backoff::{BlockingRetryable as _, doubling};
use eos_runtime::kafka_errors::passes_by_itself;

use eos_core::Guarantee;

use super::TransactionLoop;
use crate::batch::{Batch, CommittedBatch};
use crate::committer::{AfterFailure, CommitOutcome};
use crate::consumed_positions::ConsumedPositions;
use crate::error::ProcessorError;
use crate::metrics as m;
use crate::transform::Transform;

impl<T: Transform> TransactionLoop<T> {
    /// Writes the open batch with the configured guarantee.
    pub(super) fn finish_batch(&mut self) -> Result<(), ProcessorError> {
        if self.batch.is_empty() {
            return Ok(());
        }
        let mut batch = std::mem::take(&mut self.batch);
        for (partition, next) in self.owned_positions() {
            batch.advance_to(partition, next);
        }
        self.commit(batch)
    }

    /// Idle, with the consumer past transaction markers it has not committed yet: an
    /// offsets-only transaction moves the group there.
    pub(super) fn commit_markers_passed(&mut self) -> Result<(), ProcessorError> {
        let mut positions = ConsumedPositions::default();
        for (partition, next) in self.owned_positions() {
            if self
                .committed_next
                .get(&partition)
                .is_none_or(|&committed| next > committed)
            {
                positions.advance_to(partition, next);
            }
        }
        if positions.is_empty() {
            return Ok(());
        }
        debug!(
            ?positions,
            "committing the offsets past transaction markers"
        );
        self.commit(Batch::of_positions(positions))
    }

    /// The consumer's position on each owned partition. Past the last record returned it also
    /// counts what `read_committed` skipped (commit markers, aborted records), so committing it
    /// lets the group's lag reach zero on a transactional input (outbox-relay's or another
    /// processor's output). Every record before it was returned by `poll` and decided, since
    /// nothing is polled between deciding and committing, but a held one: the position stops at
    /// the first record held for the schema registry.
    fn owned_positions(&self) -> Vec<(i32, i64)> {
        let Ok(list) = self.consumer.position() else {
            return Vec::new();
        };
        list.elements_for_topic(&self.settings.input_topic)
            .iter()
            .filter(|elem| self.states.owns(elem.partition()))
            .filter_map(|elem| Some((elem.partition(), elem.offset().to_raw()?)))
            .filter(|&(_, next)| next >= 0)
            .map(|(partition, next)| (partition, next.min(self.first_held(partition))))
            .collect()
    }

    /// The offset of the first record of `partition` polled and not decided yet (the consumer's
    /// position is past it), or `i64::MAX`.
    fn first_held(&self, partition: i32) -> i64 {
        self.held
            .iter()
            .filter(|held| held.partition() == partition)
            .map(|held| held.offset())
            .min()
            .unwrap_or(i64::MAX)
    }

    /// Writes `batch` with its changelog records through the committer, then applies what its
    /// outcome says: the batch's state changes, or the recovery of a failure.
    fn commit(&mut self, batch: Batch<T::State>) -> Result<(), ProcessorError> {
        let changelog = self.states.changelog_records::<T>(&batch);
        match self.committer.commit(batch, &changelog, &self.consumer)? {
            CommitOutcome::Committed(batch) => self.apply_committed(*batch),
            CommitOutcome::Failed(after) => self.recover(after),
        }
    }

    /// A transactional call failed and the committer recovered the producer: the open batch's
    /// state changes go (and, when the transaction's outcome was settled by a new producer, the
    /// state is restored from the changelog), and every owned partition is read again from its
    /// committed offset.
    pub(super) fn recover(&mut self, after: AfterFailure) -> Result<(), ProcessorError> {
        match after {
            // How much of the aborted batch reached the changelog is unknown.
            AfterFailure::Rewind => self.states.forget_expected_ends(),
            AfterFailure::RestoreAndRewind => self.states.restore_all(&self.transform)?,
        }
        self.rewind_to_committed()
    }

    fn rewind_to_committed(&mut self) -> Result<(), ProcessorError> {
        self.batch = Batch::default();
        if self.states.is_empty() {
            // Nothing owned (every partition was just revoked): nothing to rewind.
            return Ok(());
        }
        let timeout = self.settings.call_timeout();
        // The group coordinator may be moving (its broker died): ask again until it answers.
        let committed = (|| self.consumer.committed(timeout))
            .retry(doubling(Duration::from_millis(100), Duration::from_secs(2)).with_max_times(20))
            .when(passes_by_itself)
            .notify(|error, delay| {
                warn!(%error, ?delay, "committed offsets not readable yet; asking again");
            })
            .call()?;
        let mut positions = TopicPartitionList::new();
        for elem in committed.elements() {
            let offset = match elem.offset() {
                Offset::Offset(offset) => Offset::Offset(offset),
                _ => Offset::Beginning,
            };
            positions.add_partition_offset(elem.topic(), elem.partition(), offset)?;
        }
        let sought = self.consumer.seek_partitions(positions, timeout)?;
        for elem in sought.elements() {
            if let Err(error) = elem.error() {
                // A partition we cannot rewind must not be read past its committed offset.
                return Err(ProcessorError::Fatal(error));
            }
        }
        info!(
            partitions = sought.count(),
            "rewound to the committed offsets"
        );
        Ok(())
    }

    /// The batch is committed in Kafka: its state changes go to the store. A store that
    /// cannot take them is fatal; the restart restores from the changelog, which has them.
    pub(super) fn apply_committed(&mut self, batch: Batch<T::State>) -> Result<(), ProcessorError> {
        self.progress.progressed();
        let CommittedBatch {
            counts,
            overlays,
            positions,
        } = batch.into_committed();
        for (partition, next) in positions.next_offsets() {
            // docs/architecture/loop-invariants.md "Loop invariants": a committed position only
            // moves forward (the map forgets a partition when it is revoked).
            debug_assert!(
                self.committed_next
                    .get(&partition)
                    .is_none_or(|&committed| next >= committed),
                "partition {partition}: committed position moved back from {:?} to {next}",
                self.committed_next.get(&partition)
            );
            self.committed_next.insert(partition, next);
        }
        let markers = match self.settings.guarantee {
            Guarantee::ExactlyOnce => 1,
            Guarantee::AtLeastOnce => 0,
        };
        self.states.apply_committed::<T>(overlays, markers)?;
        counter!(m::RECORDS_IN).increment(counts.records_in);
        counter!(m::RECORDS_OUT).increment(counts.outputs);
        counter!(m::DUPLICATES_DROPPED).increment(counts.duplicates);
        for (reason, n) in counts.dead_letters {
            counter!(m::DEAD_LETTERS, "reason" => reason.as_str()).increment(n);
        }
        counter!(m::TRANSACTIONS, "outcome" => "committed").increment(1);
        debug!(
            records_in = counts.records_in,
            outputs = counts.outputs,
            duplicates = counts.duplicates,
            "batch committed"
        );
        Ok(())
    }
}
