//! Positioning a partition before it is read. `--offsets postgres`: fence it (bump its owner
//! epoch, so an older owner's batch can no longer commit), then read the checkpoint committed with
//! the rows — after the fence, never before — and refuse one that retention has passed.
//! `--offsets kafka`: read the group offset. Then seek the consumer there.

use std::time::Duration;

use eos_core::Checkpoint;
use metrics::counter;
use rdkafka::consumer::Consumer;
use rdkafka::{Offset, TopicPartitionList};
use sqlx::PgPool;
use tokio::runtime::Handle;
use tracing::{info, warn};

use crate::backoff::Backoff;
use crate::checkpoint_store;
use crate::config::OffsetsMode;
use crate::error::SinkError;
use crate::loop_settings::{LoopConsumer, LoopSettings};
use crate::metrics as m;

const KAFKA_TIMEOUT: Duration = Duration::from_secs(10);

/// Where a partition starts reading once positioned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PartitionStart {
    pub(crate) partition: i32,
    /// The owner epoch this instance holds (`--offsets postgres`).
    pub(crate) epoch: Option<i64>,
    /// The checkpoint (or group offset) to resume at; `None`: the beginning of the partition.
    pub(crate) resume_at: Option<Checkpoint>,
}

impl PartitionStart {
    pub(crate) fn next_offset(&self) -> Option<i64> {
        self.resume_at.as_ref().map(|position| position.next_offset)
    }
}

/// The clients positioning needs, borrowed from the loop for one attempt.
pub(crate) struct Positioning<'a> {
    pub(crate) settings: &'a LoopSettings,
    pub(crate) runtime: &'a Handle,
    pub(crate) pool: &'a PgPool,
    pub(crate) consumer: &'a LoopConsumer,
}

impl Positioning<'_> {
    /// Where each of `partitions` starts reading. A PostgreSQL failure is `Transient`: nothing
    /// was read, the caller retries after the backoff.
    pub(crate) fn starts(
        &self,
        partitions: &[i32],
        backoff: &mut Backoff,
    ) -> Result<Vec<PartitionStart>, SinkError> {
        match self.settings.offsets {
            OffsetsMode::Postgres => self.fence_and_read(partitions, backoff),
            OffsetsMode::Kafka => self.kafka_committed(partitions),
        }
    }

    /// Seeks the consumer to every start; returns the starts it reached. A failed seek is
    /// retried after the backoff: its partition stays paused and pending.
    pub(crate) fn seek(
        &self,
        starts: &[PartitionStart],
        backoff: &mut Backoff,
    ) -> Result<Vec<PartitionStart>, SinkError> {
        let mut seek = TopicPartitionList::new();
        for start in starts {
            let offset = match start.next_offset() {
                Some(next) => Offset::Offset(next),
                None => Offset::Beginning,
            };
            seek.add_partition_offset(&self.settings.topic, start.partition, offset)?;
        }
        let sought = match self.consumer.seek_partitions(seek, KAFKA_TIMEOUT) {
            Ok(sought) => sought,
            Err(error) => {
                warn!(%error, "seek failed; retrying");
                backoff.failed();
                return Ok(Vec::new());
            }
        };
        let mut reached = Vec::new();
        for elem in sought.elements() {
            let partition = elem.partition();
            if let Err(error) = elem.error() {
                warn!(partition, %error, "seek failed; retrying");
                backoff.failed();
                continue;
            }
            if let Some(start) = starts.iter().find(|start| start.partition == partition) {
                reached.push(start.clone());
            }
        }
        Ok(reached)
    }

    /// Postgres mode: fence first (bump the owner epoch), then read the checkpoint.
    fn fence_and_read(
        &self,
        partitions: &[i32],
        backoff: &mut Backoff,
    ) -> Result<Vec<PartitionStart>, SinkError> {
        let settings = self.settings;
        let pool = self.pool;
        let (epochs, checkpoints) = self
            .runtime
            .block_on(async {
                let epochs = checkpoint_store::fence(
                    pool,
                    &settings.group_id,
                    &settings.topic,
                    partitions,
                    &settings.instance_id,
                )
                .await?;
                let checkpoints =
                    checkpoint_store::read(pool, &settings.group_id, &settings.topic, partitions)
                        .await?;
                Ok::<_, sqlx::Error>((epochs, checkpoints))
            })
            .map_err(SinkError::from_db)?;
        counter!(m::FENCES).increment(partitions.len() as u64);
        if backoff.attempts() > 0 {
            info!(
                attempts = backoff.attempts(),
                "postgres reachable again; re-fenced and re-read checkpoints"
            );
        }
        backoff.reset();
        let mut starts = Vec::with_capacity(partitions.len());
        for &partition in partitions {
            let start = PartitionStart {
                partition,
                epoch: epochs.get(&partition).copied(),
                resume_at: checkpoints
                    .iter()
                    .find(|checkpoint| checkpoint.partition == partition)
                    .cloned(),
            };
            let (epoch, next) = (start.epoch, start.next_offset());
            if let Some(next) = next {
                self.check_not_beyond_retention(partition, next)?;
            }
            info!(partition, ?epoch, next_offset = ?next, "fenced; checkpoint read after the fence");
            starts.push(start);
        }
        Ok(starts)
    }

    /// A checkpoint below the partition's first offset means records were deleted by retention
    /// before this sink wrote them. Skipping ahead silently would hide the loss: refuse.
    fn check_not_beyond_retention(&self, partition: i32, next: i64) -> Result<(), SinkError> {
        let (low, _) =
            self.consumer
                .fetch_watermarks(&self.settings.topic, partition, KAFKA_TIMEOUT)?;
        if next < low {
            return Err(SinkError::Config(format!(
                "{}[{partition}]: the checkpoint is at offset {next} but the partition starts at \
                 {low}: {} records were deleted by retention before this sink wrote them. \
                 Investigate, then move the checkpoint in sink_checkpoints deliberately",
                self.settings.topic,
                low - next
            )));
        }
        Ok(())
    }

    /// Kafka mode: the group offsets (committed after each database commit).
    fn kafka_committed(&self, partitions: &[i32]) -> Result<Vec<PartitionStart>, SinkError> {
        let committed = self.consumer.committed_offsets(
            partition_list(&self.settings.topic, partitions),
            KAFKA_TIMEOUT,
        )?;
        Ok(partitions
            .iter()
            .map(|&partition| PartitionStart {
                partition,
                epoch: None,
                resume_at: committed
                    .find_partition(&self.settings.topic, partition)
                    .and_then(|elem| elem.offset().to_raw())
                    .filter(|offset| *offset >= 0)
                    .map(|next_offset| Checkpoint {
                        topic: self.settings.topic.clone(),
                        partition,
                        next_offset,
                    }),
            })
            .collect())
    }
}

/// `partitions` of `topic`, for the consumer's calls.
pub(crate) fn partition_list(topic: &str, partitions: &[i32]) -> TopicPartitionList {
    let mut list = TopicPartitionList::new();
    for &partition in partitions {
        list.add_partition(topic, partition);
    }
    list
}
