//! Reads whole topics, as they stand when the read starts, the way an exactly-once consumer sees
//! them: `read_committed`, from the beginning of every partition to the high watermark taken at
//! the start. No consumer group is joined and nothing is committed, so the audit leaves no trace
//! on the cluster.
//!
//! A `read_committed` reader cannot pass the last stable offset: while a transaction is open
//! (say, a crashed transactional producer's, until `transaction.timeout.ms`), the partition's end
//! is out of reach. Rather than wait forever, the read fails after `end_timeout` without progress
//! and says so.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use eos_runtime::kafka_clients::{self, Isolation::ReadCommitted};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};

use crate::kafka_client::{
    ClusterAccess as _, ClusterError, KafkaSettings, METADATA_TIMEOUT, ReportingContext,
    topic_partitions,
};
use crate::source_record::SourceRecord;

/// How often positions are re-read to notice partitions that end in control records (commit or
/// abort markers), which are never returned as messages.
const POSITION_CHECK_INTERVAL: Duration = Duration::from_millis(500);
const POLL_TIMEOUT: Duration = Duration::from_millis(200);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionSpan {
    pub partition: i32,
    /// First offset still in the log (records before it were deleted by retention).
    pub low: i64,
    /// The high watermark at the start of the read: the read stops there.
    pub high: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicSnapshot {
    pub topic: String,
    pub exists: bool,
    pub spans: Vec<PartitionSpan>,
    /// Committed records in `(partition, offset)` order within each partition.
    pub records: Vec<SourceRecord>,
}

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    #[error(
        "topic {topic:?} partition {partition}: read_committed readers cannot pass offset {last_stable} \
         but the log ends at {high_watermark}; an open transaction is holding the last stable offset \
         (no progress for {}). It ends when its producer commits or aborts, when a new producer \
         with the same transactional.id starts, or after transaction.timeout.ms; audit again then",
        whole_seconds(*waited)
    )]
    OpenTransaction {
        topic: String,
        partition: i32,
        last_stable: i64,
        high_watermark: i64,
        waited: Duration,
    },
    #[error(
        "topic {topic:?} partition {partition}: stuck at offset {position} of {high_watermark} for {}{}",
        whole_seconds(*waited),
        last_error.as_ref().map(|e| format!(" (last error: {e})")).unwrap_or_default()
    )]
    Stalled {
        topic: String,
        partition: i32,
        position: i64,
        high_watermark: i64,
        waited: Duration,
        last_error: Option<String>,
    },
}

fn whole_seconds(duration: Duration) -> humantime::FormattedDuration {
    humantime::format_duration(Duration::from_secs(duration.as_secs()))
}

#[derive(Debug)]
struct Pending {
    end: i64,
    position: i64,
}

/// Reads `topics` to their ends. A topic that does not exist comes back empty with
/// `exists: false`; the caller decides whether that is an error. Blocking: run it off the async
/// reactor. `on_progress` is called now and then with the number of records read so far.
pub fn read_topics(
    settings: &KafkaSettings,
    topics: &[&str],
    end_timeout: Duration,
    on_progress: &mut dyn FnMut(u64),
) -> Result<Vec<TopicSnapshot>, ReadError> {
    // Watermarks come from a read_uncommitted client: its high watermark is the true end of the
    // log, so an open transaction shows up as a partition that cannot be finished.
    let metadata = settings.metadata_client()?;
    let mut snapshots = Vec::with_capacity(topics.len());
    let mut assignment = TopicPartitionList::new();
    let mut pending: HashMap<(String, i32), Pending> = HashMap::new();
    for &topic in topics {
        let Some(partitions) = topic_partitions(&metadata, settings, topic)? else {
            snapshots.push(TopicSnapshot {
                topic: topic.to_owned(),
                exists: false,
                spans: Vec::new(),
                records: Vec::new(),
            });
            continue;
        };
        let mut spans = Vec::with_capacity(partitions.len());
        for partition in partitions {
            let (low, high) = metadata
                .fetch_watermarks(topic, partition, METADATA_TIMEOUT)
                .map_err(|e| settings.unreachable(e))?;
            spans.push(PartitionSpan {
                partition,
                low,
                high,
            });
            if high > low {
                assignment
                    .add_partition_offset(topic, partition, Offset::Beginning)
                    .map_err(|e| ClusterError::client("cannot build the assignment", e))?;
                pending.insert(
                    (topic.to_owned(), partition),
                    Pending {
                        end: high,
                        position: low,
                    },
                );
            }
        }
        let expected: i64 = spans.iter().map(|span| span.high - span.low).sum();
        tracing::debug!(
            topic,
            partitions = spans.len(),
            records_at_most = expected,
            "reading topic"
        );
        snapshots.push(TopicSnapshot {
            topic: topic.to_owned(),
            exists: true,
            spans,
            records: Vec::with_capacity(usize::try_from(expected).unwrap_or(0)),
        });
    }
    if pending.is_empty() {
        return Ok(snapshots);
    }

    let consumer = reader(settings)?;
    consumer
        .assign(&assignment)
        .map_err(|e| ClusterError::client("cannot assign the partitions to read", e))?;
    let snapshot_index: HashMap<String, usize> = snapshots
        .iter()
        .enumerate()
        .map(|(index, snapshot)| (snapshot.topic.clone(), index))
        .collect();

    let mut read = 0u64;
    let mut last_progress = Instant::now();
    let mut last_position_check = Instant::now();
    let mut last_error: Option<KafkaError> = None;
    while !pending.is_empty() {
        match consumer.poll(POLL_TIMEOUT) {
            Some(Ok(message)) => {
                let key = (message.topic().to_owned(), message.partition());
                let Some(state) = pending.get_mut(&key) else {
                    // A partition already read to its end at start: later records are not ours.
                    continue;
                };
                if message.offset() >= state.end {
                    continue;
                }
                state.position = message.offset() + 1;
                last_progress = Instant::now();
                let done = state.position >= state.end;
                if let Some(&index) = snapshot_index.get(&key.0) {
                    snapshots[index].records.push(SourceRecord {
                        topic: key.0.clone(),
                        partition: key.1,
                        offset: message.offset(),
                        key: message.key().map(<[u8]>::to_vec),
                        value: message.payload().map(<[u8]>::to_vec),
                        headers: message
                            .headers()
                            .map(|headers| {
                                headers
                                    .iter()
                                    .map(|h| (h.key.to_owned(), h.value.map(<[u8]>::to_vec)))
                                    .collect()
                            })
                            .unwrap_or_default(),
                        timestamp_ms: message.timestamp().to_millis(),
                        decoding: Default::default(),
                    });
                }
                if done {
                    pending.remove(&key);
                }
                read += 1;
                if read.is_multiple_of(1000) {
                    on_progress(read);
                }
            }
            Some(Err(error)) => {
                // librdkafka retries transient failures itself; a persistent one ends as a stall.
                tracing::warn!(%error, "error while reading");
                last_error = Some(error);
            }
            None => {}
        }
        if last_position_check.elapsed() >= POSITION_CHECK_INTERVAL {
            last_position_check = Instant::now();
            if advance_positions(&consumer, &mut pending)? {
                last_progress = Instant::now();
            }
            if !pending.is_empty() && last_progress.elapsed() >= end_timeout {
                return Err(diagnose_stall(
                    &consumer,
                    &pending,
                    last_progress.elapsed(),
                    last_error,
                ));
            }
        }
    }
    on_progress(read);
    Ok(snapshots)
}

fn reader(settings: &KafkaSettings) -> Result<BaseConsumer<ReportingContext>, ClusterError> {
    // A group id of its own per run: the audit never commits, and never shares a position.
    kafka_clients::reader(&settings.client_config(), "eosctl-audit", ReadCommitted)
        .set("auto.offset.reset", "earliest")
        .set("allow.auto.create.topics", "false")
        .create_with_context(ReportingContext)
        .map_err(|e| ClusterError::client("cannot create the Kafka consumer", e))
}

/// Moves pending partitions forward by the consumer's position, which also passes control
/// records. Returns whether any partition moved.
fn advance_positions(
    consumer: &BaseConsumer<ReportingContext>,
    pending: &mut HashMap<(String, i32), Pending>,
) -> Result<bool, ClusterError> {
    let positions = consumer
        .position()
        .map_err(|e| ClusterError::client("cannot read the consumer position", e))?;
    let mut moved = false;
    for element in positions.elements() {
        let Offset::Offset(position) = element.offset() else {
            continue;
        };
        let key = (element.topic().to_owned(), element.partition());
        let Some(state) = pending.get_mut(&key) else {
            continue;
        };
        if position > state.position {
            state.position = position;
            moved = true;
        }
        if state.position >= state.end {
            pending.remove(&key);
        }
    }
    Ok(moved)
}

fn diagnose_stall(
    consumer: &BaseConsumer<ReportingContext>,
    pending: &HashMap<(String, i32), Pending>,
    waited: Duration,
    last_error: Option<KafkaError>,
) -> ReadError {
    let mut stuck: Vec<(&(String, i32), &Pending)> = pending.iter().collect();
    stuck.sort_by(|a, b| a.0.cmp(b.0));
    // The reader is read_committed, so its "high" watermark is the last stable offset.
    for ((topic, partition), state) in &stuck {
        if let Ok((_, last_stable)) = consumer.fetch_watermarks(topic, *partition, METADATA_TIMEOUT)
            && last_stable < state.end
        {
            return ReadError::OpenTransaction {
                topic: topic.clone(),
                partition: *partition,
                last_stable,
                high_watermark: state.end,
                waited,
            };
        }
    }
    let ((topic, partition), (position, high_watermark)) = stuck
        .first()
        .map(|(key, state)| ((*key).clone(), (state.position, state.end)))
        .unwrap_or_default();
    ReadError::Stalled {
        topic,
        partition,
        position,
        high_watermark,
        waited,
        last_error: last_error.map(|e| e.to_string()),
    }
}
