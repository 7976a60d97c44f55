//! Reading a committed run from Kafka (the crate's `kafka` feature): the input, every output and
//! the dead-letter topic, each partition from its start to its end, as a `read_committed`
//! consumer sees them — what `eosctl audit --replay` reads, and what a user's test of their own
//! transform reads (docs/TRANSFORMS.md "Prove it: the replay audit").
//!
//! Each partition is read until the consumer's position passes the end a `read_uncommitted`
//! client sees when the read starts (`eos_runtime::log_end`): by then every transaction below it
//! is decided, and read if it committed. A position that stops short of it for `stall_timeout`
//! ends the read with an error that says why, rather than a run read in part: an open
//! transaction (a crashed processor's, until `transaction.timeout.ms`) holds `read_committed`
//! readers back.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use eos_runtime::kafka_clients::{self, Isolation};
use eos_runtime::kafka_errors::ReportingContext;
use eos_runtime::log_end::EndQuery;
use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::error::KafkaError;
use rdkafka::message::{Headers as _, Message as _};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use super::{CommittedRecord, CommittedRun, RunTopics};

/// How long one metadata or watermark request may take.
const METADATA_TIMEOUT: Duration = Duration::from_secs(10);
const POLL_TIMEOUT: Duration = Duration::from_millis(200);

/// Why a run could not be read whole.
#[derive(Debug, thiserror::Error)]
pub enum ReadRunError {
    /// The input topic is not there: there is no run to read.
    #[error("input topic {topic:?} does not exist")]
    InputMissing {
        /// The input topic.
        topic: String,
    },
    /// The cluster did not answer, or refused a request.
    #[error("{context}")]
    Kafka {
        /// What was being done.
        context: String,
        /// The client's error.
        source: KafkaError,
    },
    /// An open transaction holds the partition's last stable offset below its end.
    #[error(
        "topic {topic:?} partition {partition}: read_committed readers cannot pass offset \
         {last_stable} but the log ends at {end}; an open transaction is holding the last \
         stable offset (no progress for {waited:?}). It ends when its producer commits or \
         aborts, when a new producer with the same transactional.id starts, or after \
         transaction.timeout.ms; read the run again then"
    )]
    OpenTransaction {
        /// The topic.
        topic: String,
        /// The partition.
        partition: i32,
        /// Where `read_committed` readers stop.
        last_stable: i64,
        /// The end of the log when the read started.
        end: i64,
        /// How long the read waited.
        waited: Duration,
    },
    /// The partition did not move towards its end.
    #[error(
        "topic {topic:?} partition {partition}: stuck at offset {position} of {end} for \
         {waited:?}{}",
        last_error.as_ref().map(|e| format!(" (last error: {e})")).unwrap_or_default()
    )]
    Stalled {
        /// The topic.
        topic: String,
        /// The partition.
        partition: i32,
        /// How far the read came.
        position: i64,
        /// The end of the log when the read started.
        end: i64,
        /// How long the read waited.
        waited: Duration,
        /// The last error the consumer reported, if any.
        last_error: Option<String>,
    },
}

impl ReadRunError {
    fn kafka(context: impl Into<String>, source: KafkaError) -> Self {
        Self::Kafka {
            context: context.into(),
            source,
        }
    }
}

/// Reads what the run on `topics` committed, with the cluster settings of `client_config` (the
/// bootstrap servers and whatever TLS or SASL the cluster needs; the reader sets its own
/// isolation, group and offsets). The input topic must exist; an output or dead-letter topic
/// that does not reads as empty. Gives up when a partition makes no progress towards its end
/// for `stall_timeout`. Blocking: from async code, run it with `spawn_blocking`.
///
/// ```no_run
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::collections::BTreeMap;
/// use std::time::Duration;
/// use eos_transform::replay::{self, RunTopics};
///
/// let mut kafka = rdkafka::ClientConfig::new();
/// kafka.set("bootstrap.servers", "127.0.0.1:9092");
/// let topics = RunTopics {
///     input: "card-auths".into(),
///     outputs: BTreeMap::from([("default".into(), "card-approved".into())]),
///     dead_letters: "card-auths.dlq".into(),
/// };
/// let run = replay::read_committed_run(&kafka, &topics, Duration::from_secs(30))?;
/// # Ok(()) }
/// ```
pub fn read_committed_run(
    client_config: &ClientConfig,
    topics: &RunTopics,
    stall_timeout: Duration,
) -> Result<CommittedRun, ReadRunError> {
    let records = read_committed_records(client_config, topics, stall_timeout)?;
    Ok(records.into_run(&topics.input))
}

/// A run's topics as committed, record by record, before they are compared: for a run whose
/// records are not JSON (a schema registry's formats), decoded by the caller first.
#[derive(Debug, Clone, Default)]
pub struct CommittedRecords {
    /// The input's records.
    pub inputs: Vec<CommittedRecord>,
    /// Each output's records, under the output's name.
    pub outputs: Vec<(String, Vec<CommittedRecord>)>,
    /// The dead-letter topic's records.
    pub dead_letters: Vec<CommittedRecord>,
}

impl CommittedRecords {
    /// The run of `input` these records are ([`CommittedRun::from_records`]).
    pub fn into_run(self, input: &str) -> CommittedRun {
        let run = CommittedRun::from_records(input, self.inputs, self.outputs, &self.dead_letters);
        tracing::info!(
            input,
            input_records = run.inputs.len(),
            outputs = run.outputs.len(),
            dead_letters = run.dead_letters.len(),
            other_dead_letters = run.other_dead_letters,
            "committed run read"
        );
        run
    }
}

/// Every committed record of the run's topics, read as [`read_committed_run`] reads them.
pub fn read_committed_records(
    client_config: &ClientConfig,
    topics: &RunTopics,
    stall_timeout: Duration,
) -> Result<CommittedRecords, ReadRunError> {
    let mut names = vec![topics.input.as_str()];
    names.extend(topics.outputs.values().map(String::as_str));
    names.push(&topics.dead_letters);
    let mut read = read_topics(client_config, &names, stall_timeout)?;
    let mut take = |topic: &str| read.remove(topic);
    let inputs = take(&topics.input).ok_or_else(|| ReadRunError::InputMissing {
        topic: topics.input.clone(),
    })?;
    let outputs: Vec<(String, Vec<CommittedRecord>)> = topics
        .outputs
        .iter()
        .map(|(name, topic)| (name.clone(), take(topic).unwrap_or_default()))
        .collect();
    let dead_letters = take(&topics.dead_letters).unwrap_or_default();
    Ok(CommittedRecords {
        inputs,
        outputs,
        dead_letters,
    })
}

/// Where the read of one partition stands.
struct Pending {
    /// The end of the log when the read started: the read stops there.
    end: i64,
    position: i64,
}

/// Every committed record of each of `topics` that exists, by topic, in offset order within each
/// partition. A topic named twice is read once.
fn read_topics(
    client_config: &ClientConfig,
    topics: &[&str],
    stall_timeout: Duration,
) -> Result<HashMap<String, Vec<CommittedRecord>>, ReadRunError> {
    let ends = EndQuery::new(client_config)
        .map_err(|e| ReadRunError::kafka("cannot create a Kafka client", e))?;
    let consumer: BaseConsumer<ReportingContext> =
        kafka_clients::reader(client_config, "eos-replay", Isolation::ReadCommitted)
            .set("allow.auto.create.topics", "false")
            .create_with_context(ReportingContext)
            .map_err(|e| ReadRunError::kafka("cannot create a Kafka consumer", e))?;
    let mut records: HashMap<String, Vec<CommittedRecord>> = HashMap::new();
    let mut pending: BTreeMap<(String, i32), Pending> = BTreeMap::new();
    let mut assignment = TopicPartitionList::new();
    for &topic in topics {
        if records.contains_key(topic) {
            continue;
        }
        let Some(partitions) = partitions(&consumer, topic)? else {
            continue;
        };
        records.insert(topic.to_owned(), Vec::new());
        for partition in partitions {
            let (low, end) = ends
                .watermarks(topic, partition, METADATA_TIMEOUT)
                .map_err(|e| {
                    ReadRunError::kafka(format!("cannot read the end of {topic}/{partition}"), e)
                })?;
            if end > low {
                assignment
                    .add_partition_offset(topic, partition, Offset::Beginning)
                    .map_err(|e| ReadRunError::kafka("cannot build the assignment", e))?;
                pending.insert(
                    (topic.to_owned(), partition),
                    Pending { end, position: low },
                );
            }
        }
    }
    if pending.is_empty() {
        return Ok(records);
    }
    consumer
        .assign(&assignment)
        .map_err(|e| ReadRunError::kafka("cannot assign the partitions to read", e))?;
    let mut last_progress = Instant::now();
    let mut last_error: Option<KafkaError> = None;
    while !pending.is_empty() {
        match consumer.poll(POLL_TIMEOUT) {
            Some(Ok(message)) => {
                let key = (message.topic().to_owned(), message.partition());
                if let Some(state) = pending.get_mut(&key)
                    && message.offset() < state.end
                {
                    state.position = message.offset() + 1;
                    last_progress = Instant::now();
                    records.entry(key.0).or_default().push(CommittedRecord {
                        partition: message.partition(),
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
                        timestamp_ms: message.timestamp().to_millis().unwrap_or_default(),
                        content: None,
                    });
                }
            }
            // librdkafka retries what passes by itself; what does not ends as a stall.
            Some(Err(error)) => {
                tracing::warn!(%error, "error while reading the run");
                last_error = Some(error);
            }
            // Transaction markers and aborted records move the position without being
            // returned: asked for when a poll returns nothing.
            None => {
                if advance(&consumer, &mut pending)? {
                    last_progress = Instant::now();
                }
            }
        }
        pending.retain(|_, state| state.position < state.end);
        if !pending.is_empty() && last_progress.elapsed() >= stall_timeout {
            return Err(stalled(
                &consumer,
                &pending,
                last_progress.elapsed(),
                last_error,
            ));
        }
    }
    Ok(records)
}

/// The partitions of `topic`, or `None` when it does not exist.
fn partitions(
    consumer: &BaseConsumer<ReportingContext>,
    topic: &str,
) -> Result<Option<Vec<i32>>, ReadRunError> {
    let metadata = consumer
        .fetch_metadata(Some(topic), METADATA_TIMEOUT)
        .map_err(|e| ReadRunError::kafka(format!("cannot read the metadata of {topic:?}"), e))?;
    let Some(found) = metadata.topics().iter().find(|t| t.name() == topic) else {
        return Ok(None);
    };
    match found.error().map(RDKafkaErrorCode::from) {
        None => {}
        Some(RDKafkaErrorCode::UnknownTopicOrPartition) => return Ok(None),
        Some(code) => {
            return Err(ReadRunError::kafka(
                format!("cannot read the metadata of {topic:?}"),
                KafkaError::MetadataFetch(code),
            ));
        }
    }
    let mut partitions: Vec<i32> = found.partitions().iter().map(|p| p.id()).collect();
    partitions.sort_unstable();
    Ok((!partitions.is_empty()).then_some(partitions))
}

/// Moves the pending partitions to the consumer's positions; whether any moved.
fn advance(
    consumer: &BaseConsumer<ReportingContext>,
    pending: &mut BTreeMap<(String, i32), Pending>,
) -> Result<bool, ReadRunError> {
    let positions = consumer
        .position()
        .map_err(|e| ReadRunError::kafka("cannot read the consumer's position", e))?;
    let mut moved = false;
    for element in positions.elements() {
        let Offset::Offset(position) = element.offset() else {
            continue;
        };
        let key = (element.topic().to_owned(), element.partition());
        if let Some(state) = pending.get_mut(&key)
            && position > state.position
        {
            state.position = position;
            moved = true;
        }
    }
    Ok(moved)
}

/// Why the first pending partition did not reach its end: an open transaction when the
/// `read_committed` consumer's end (the last stable offset) is below it.
fn stalled(
    consumer: &BaseConsumer<ReportingContext>,
    pending: &BTreeMap<(String, i32), Pending>,
    waited: Duration,
    last_error: Option<KafkaError>,
) -> ReadRunError {
    for ((topic, partition), state) in pending {
        if let Ok((_, last_stable)) = consumer.fetch_watermarks(topic, *partition, METADATA_TIMEOUT)
            && last_stable < state.end
        {
            return ReadRunError::OpenTransaction {
                topic: topic.clone(),
                partition: *partition,
                last_stable,
                end: state.end,
                waited,
            };
        }
    }
    let ((topic, partition), state) = pending
        .iter()
        .next()
        .map(|(key, state)| (key.clone(), (state.position, state.end)))
        .unwrap_or_default();
    ReadRunError::Stalled {
        topic,
        partition,
        position: state.0,
        end: state.1,
        waited,
        last_error: last_error.map(|e| e.to_string()),
    }
}
