//! Reads where a consumer group stands without joining it: its committed offsets (with
//! `read_committed`, so offsets a transaction is committing are waited for rather than read
//! half-way) and the ends of the topic's partitions.
//!
//! Nothing here joins the group or commits, so observing a running pipeline never triggers a
//! rebalance of it.

use std::collections::BTreeMap;
use std::time::Duration;

use eos_runtime::kafka_clients::{self, Isolation::ReadCommitted};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};

use crate::kafka_client::{
    ClusterAccess as _, ClusterError, KafkaSettings, METADATA_TIMEOUT, ReportingContext,
};

/// Where one partition stands for the group, read at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionOffsets {
    pub partition: i32,
    /// The group's committed offset: the next offset it will read. `None`: never committed.
    pub committed: Option<i64>,
    /// First offset still in the log.
    pub low: i64,
    /// The high watermark: one past the last offset written.
    pub end: i64,
}

/// A client bound to one group id that only ever fetches that group's committed offsets.
pub struct GroupOffsetReader {
    group: String,
    consumer: BaseConsumer<ReportingContext>,
}

impl std::fmt::Debug for GroupOffsetReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupOffsetReader")
            .field("group", &self.group)
            .finish_non_exhaustive()
    }
}

impl GroupOffsetReader {
    pub fn new(settings: &KafkaSettings, group: &str) -> Result<Self, ClusterError> {
        // librdkafka asks the broker for *stable* offsets when it is read_committed (KIP-447):
        // while a transaction holds pending offsets for the group, the fetch is retried until
        // that transaction ends instead of returning the offsets from before it.
        let consumer = kafka_clients::consumer(&settings.client_config(), group, ReadCommitted)
            .set("allow.auto.create.topics", "false")
            // Those retries back off: keep them short so a poll every few tens of milliseconds
            // sees a commit soon after it lands.
            .set("retry.backoff.ms", "10")
            .set("retry.backoff.max.ms", "50")
            .create_with_context(ReportingContext)
            .map_err(|e| ClusterError::client("cannot create the Kafka consumer", e))?;
        Ok(Self {
            group: group.to_owned(),
            consumer,
        })
    }

    pub fn group(&self) -> &str {
        &self.group
    }

    /// The group's committed offset of each partition of `topic` (`None`: nothing committed).
    /// Blocking, up to `timeout`.
    pub fn committed(
        &self,
        topic: &str,
        partitions: &[i32],
        timeout: Duration,
    ) -> Result<BTreeMap<i32, Option<i64>>, ClusterError> {
        let mut request = TopicPartitionList::new();
        for &partition in partitions {
            request.add_partition(topic, partition);
        }
        let context = || {
            format!(
                "cannot read the committed offsets of group {:?} on topic {topic:?}",
                self.group
            )
        };
        let answer = self
            .consumer
            .committed_offsets(request, timeout)
            .map_err(|e| ClusterError::client(context(), e))?;
        let mut committed = BTreeMap::new();
        for element in answer.elements_for_topic(topic) {
            element
                .error()
                .map_err(|e| ClusterError::client(context(), e))?;
            let offset = match element.offset() {
                Offset::Offset(offset) => Some(offset),
                _ => None,
            };
            committed.insert(element.partition(), offset);
        }
        Ok(committed)
    }

    /// The group's committed offsets next to the partitions' watermarks. The committed offsets
    /// are read first, so a lag computed from the pair can be too high, never too low.
    pub fn observe(
        &self,
        settings: &KafkaSettings,
        metadata: &BaseConsumer<ReportingContext>,
        topic: &str,
        partitions: &[i32],
    ) -> Result<Vec<PartitionOffsets>, ClusterError> {
        let committed = self.committed(topic, partitions, METADATA_TIMEOUT)?;
        let watermarks = watermarks(settings, metadata, topic, partitions)?;
        Ok(watermarks
            .into_iter()
            .map(|(partition, (low, end))| PartitionOffsets {
                partition,
                committed: committed.get(&partition).copied().flatten(),
                low,
                end,
            })
            .collect())
    }
}

/// `(low, high)` watermarks of each partition. `metadata` must be a read_uncommitted client
/// (`ClusterAccess::metadata_client`) so that `high` is the true end of the log rather than
/// the last stable offset.
pub fn watermarks(
    settings: &KafkaSettings,
    metadata: &BaseConsumer<ReportingContext>,
    topic: &str,
    partitions: &[i32],
) -> Result<BTreeMap<i32, (i64, i64)>, ClusterError> {
    partitions
        .iter()
        .map(|&partition| {
            metadata
                .fetch_watermarks(topic, partition, METADATA_TIMEOUT)
                .map(|marks| (partition, marks))
                .map_err(|e| settings.unreachable(e))
        })
        .collect()
}
