//! The state of each input partition this instance owns, with one owner: restored from the
//! changelog before the partition is read (`restore.rs`), changed only by batches Kafka has
//! committed ([`OwnedStates::apply_committed`]), and checkpointed on the local disk so that a
//! restart reads only the changelog's tail (`local_checkpoint.rs`;
//! docs/architecture/processor-state.md "Processor state on disk"). The loop decides against it
//! ([`OwnedStates::get`]) and tells it what the group and the commits did; nothing else changes
//! it.

mod local_checkpoint;
mod restore;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::message::OwnedHeaders;
use tracing::{info, warn};

use eos_runtime::transactional_producer::PendingRecord;

use crate::batch::Batch;
use crate::changelog;
use crate::error::ProcessorError;
use crate::loop_settings::LoopSettings;
use crate::partition_state::{Overlay, PartitionState};
use crate::state_store::{StateStore, StoreError};
use crate::transform::Transform;

/// The state of every owned partition, its changelog's end and its local checkpoint.
pub(crate) struct OwnedStates<S> {
    store: Arc<StateStore>,
    changelog: ChangelogSettings,
    states: HashMap<i32, PartitionState<S>>,
    changelog_ends: HashMap<i32, ChangelogEnd>,
    last_checkpoint: Instant,
}

/// What a restore and a checkpoint read of the configuration.
struct ChangelogSettings {
    topic: String,
    client_config: ClientConfig,
    restore_timeout: Duration,
    delete_retention: Duration,
}

/// What this instance knows of the end of one changelog partition it owns.
#[derive(Debug, Clone, Copy)]
struct ChangelogEnd {
    /// The store's checkpoint: it equals the changelog below this offset.
    checkpointed: i64,
    checkpointed_at: Instant,
    /// Where the changelog ends if only this instance wrote to it since the restore: each
    /// committed batch adds its records plus a commit marker (exactly-once). `None` after an
    /// abort (how much of an aborted batch reached the log is unknown): the checkpoint then
    /// stays until the next restore.
    expected_end: Option<i64>,
}

impl<S: Clone + Default> OwnedStates<S> {
    /// Opens this instance's state store, owning no partition yet.
    pub(crate) fn open(settings: &LoopSettings) -> Result<Self, ProcessorError> {
        let store = match StateStore::open(&settings.state_dir) {
            Ok(store) => store,
            // A paused or hung predecessor with the same identity still holds the store (it is
            // fenced as soon as this instance starts): a store of this process's own, restored
            // cold from the changelog, instead of refusing to take over.
            Err(StoreError::Open { path, detail }) if detail.contains("another process") => {
                let own = PathBuf::from(format!(
                    "{}.pid{}",
                    settings.state_dir.display(),
                    std::process::id()
                ));
                warn!(
                    held = %path.display(),
                    store = %own.display(),
                    "the state store is held by another process; using a store of this process"
                );
                StateStore::open(&own)?
            }
            Err(error) => return Err(error.into()),
        };
        let keep = if settings.changelog_created {
            None
        } else {
            Some(settings.changelog_topic.as_str())
        };
        let dropped = store.drop_changelogs_except(keep)?;
        info!(
            store = store.location(),
            dropped_tables = dropped,
            "state store open"
        );
        Ok(Self {
            store,
            changelog: ChangelogSettings {
                topic: settings.changelog_topic.clone(),
                client_config: settings.client_config.clone(),
                restore_timeout: settings.restore_timeout(),
                delete_retention: settings.changelog_delete_retention,
            },
            states: HashMap::new(),
            changelog_ends: HashMap::new(),
            last_checkpoint: Instant::now(),
        })
    }

    /// The state of `partition`, when this instance owns it.
    pub(crate) fn get(&self, partition: i32) -> Option<&PartitionState<S>> {
        self.states.get(&partition)
    }

    pub(crate) fn owns(&self, partition: i32) -> bool {
        self.states.contains_key(&partition)
    }

    pub(crate) fn partitions(&self) -> Vec<i32> {
        let mut partitions: Vec<i32> = self.states.keys().copied().collect();
        partitions.sort_unstable();
        partitions
    }

    pub(crate) fn len(&self) -> usize {
        self.states.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.states.is_empty()
    }

    /// `partition` was revoked. Its store and checkpoint stay: if it comes back, the restore
    /// reads the changelog from that checkpoint.
    pub(crate) fn revoke(&mut self, partition: i32) {
        self.states.remove(&partition);
        self.changelog_ends.remove(&partition);
    }

    /// A transaction was aborted: how much of it reached the changelog is unknown, so no
    /// checkpoint moves until the next restore.
    pub(crate) fn forget_expected_ends(&mut self) {
        for end in self.changelog_ends.values_mut() {
            end.expected_end = None;
        }
    }

    /// The changelog records of a batch's state changes, each to its input partition's
    /// changelog partition.
    pub(crate) fn changelog_records<T: Transform<State = S>>(
        &self,
        batch: &Batch<S>,
    ) -> Vec<PendingRecord> {
        let mut records = Vec::new();
        for (partition, overlay) in batch.overlays() {
            for record in changelog::records_for::<T>(overlay) {
                records.push(PendingRecord {
                    topic: self.changelog.topic.clone(),
                    partition: Some(partition),
                    key: Some(record.key.into_bytes()),
                    payload: record.value,
                    headers: OwnedHeaders::new(),
                });
            }
        }
        records
    }

    /// A batch is committed in Kafka: its state changes go to the store, and each changelog's
    /// expected end moves past its records and `markers` commit markers. A store that cannot
    /// take them is fatal; the restart restores from the changelog, which has them.
    pub(crate) fn apply_committed<T: Transform<State = S>>(
        &mut self,
        overlays: HashMap<i32, Overlay<S>>,
        markers: i64,
    ) -> Result<(), ProcessorError> {
        for (partition, overlay) in overlays {
            let written = overlay.changelog_record_count() as i64;
            if let Some(state) = self.states.get(&partition) {
                state.apply::<T>(overlay)?;
            }
            if written > 0
                && let Some(end) = self.changelog_ends.get_mut(&partition)
            {
                end.expected_end = end.expected_end.map(|e| e + written + markers);
            }
        }
        Ok(())
    }
}
