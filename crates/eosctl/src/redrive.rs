//! `eosctl dead-letters redrive`, the Kafka side: reads the chosen dead letters' originals back
//! from their input partitions (`read_committed`), then writes each re-drive record to its
//! original's partition and one log record per dead letter in **one Kafka transaction**, so a
//! re-drive is never written without its record of who, why and which dead letter, and a crash
//! of this tool leaves neither (docs/eosctl.md "Dead letters and re-drives"). What to write is
//! [`crate::dead_letters`]'.
//!
//! The transactional id is `eosctl-redrive-<dead-letter topic>`: two re-drives of one dead-letter
//! topic at once fence each other (the older one's commit fails) instead of interleaving.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use eos_runtime::kafka_clients::{self, Isolation::ReadCommitted};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, Headers as _, Message as _, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer as _};
use rdkafka::util::Timeout;
use rdkafka::{Offset, TopicPartitionList};
use serde::Serialize;

use crate::dead_letters::{self, DeadLetterEntry, RecordRef, RedriveAct};
use crate::kafka_client::{
    ClusterAccess as _, ClusterError, KafkaSettings, METADATA_TIMEOUT, ReportingContext,
    TopicLayout, ensure_topic,
};
use crate::source_record::SourceRecord;

/// How long one transactional call (init, commit, abort) or one delivery may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
const POLL_TIMEOUT: Duration = Duration::from_millis(200);

#[derive(Debug, thiserror::Error)]
pub enum RedriveError {
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    #[error(
        "the original of dead letter {letter} ({source_record}) is no longer in its topic \
         (deleted by retention, or the topic was recreated): it cannot be re-driven"
    )]
    OriginalGone {
        letter: String,
        source_record: String,
    },
    #[error("reading the originals from {topic:?}: no progress for {waited:?}")]
    Stalled { topic: String, waited: Duration },
    #[error("{context}")]
    Kafka { context: String, source: KafkaError },
    #[error("background task failed")]
    Task(#[from] tokio::task::JoinError),
}

fn kafka(context: impl Into<String>) -> impl FnOnce(KafkaError) -> RedriveError {
    let context = context.into();
    move |source| RedriveError::Kafka { context, source }
}

/// One dead letter re-driven.
#[derive(Debug, Clone, Serialize)]
pub struct Redriven {
    pub dead_letter: RecordRef,
    pub event_id: Option<String>,
    /// Where its re-drive record was written.
    pub redrive_record: RecordRef,
    /// The log topic its log record went to.
    pub log_topic: String,
}

/// Re-drives `letters` (each with a source position; see `dead_letters::not_redrivable`) under
/// `act`, logging each to `log_topic`, or by default to its source topic's re-drive log.
pub async fn redrive(
    settings: &KafkaSettings,
    dlq_topic: &str,
    letters: &[DeadLetterEntry],
    act: &RedriveAct,
    log_topic: Option<&str>,
    end_timeout: Duration,
) -> Result<Vec<Redriven>, RedriveError> {
    let mut wanted: BTreeMap<String, BTreeSet<(i32, i64)>> = BTreeMap::new();
    for source in letters.iter().filter_map(|entry| entry.source.as_ref()) {
        wanted
            .entry(source.topic.clone())
            .or_default()
            .insert((source.partition, source.offset));
    }
    let mut originals: BTreeMap<RecordRef, SourceRecord> = BTreeMap::new();
    for (topic, positions) in wanted {
        let settings = settings.clone();
        let read = tokio::task::spawn_blocking(move || {
            read_positions(&settings, &topic, &positions, end_timeout)
        })
        .await??;
        originals.extend(read.into_iter().map(|record| {
            (
                RecordRef {
                    topic: record.topic.clone(),
                    partition: record.partition,
                    offset: record.offset,
                },
                record,
            )
        }));
    }
    let mut plan = Vec::with_capacity(letters.len());
    for entry in letters {
        let Some(source) = &entry.source else {
            continue;
        };
        let original = originals
            .get(source)
            .ok_or_else(|| RedriveError::OriginalGone {
                letter: entry.letter.to_string(),
                source_record: source.to_string(),
            })?;
        let log = log_topic.map_or_else(
            || dead_letters::default_redrive_log(&source.topic),
            str::to_owned,
        );
        plan.push((entry, original, log));
    }
    let logs: BTreeSet<&str> = plan.iter().map(|(_, _, log)| log.as_str()).collect();
    for log in logs {
        let layout = TopicLayout {
            partitions: 1,
            replication_factor: -1,
        };
        ensure_topic(settings, log, layout).await?;
    }

    let producer: FutureProducer<ReportingContext> =
        kafka_clients::idempotent_producer(&settings.client_config())
            .set("transactional.id", format!("eosctl-redrive-{dlq_topic}"))
            .create_with_context(ReportingContext)
            .map_err(kafka("cannot create the transactional producer"))?;
    // The transactional calls block: off the reactor's own threads.
    tokio::task::block_in_place(|| producer.init_transactions(CALL_TIMEOUT))
        .map_err(kafka("init_transactions"))?;
    producer
        .begin_transaction()
        .map_err(kafka("begin_transaction"))?;
    match write_all(&producer, &plan, act).await {
        Ok(redriven) => {
            tokio::task::block_in_place(|| producer.commit_transaction(CALL_TIMEOUT))
                .map_err(kafka("commit_transaction: the re-drive may not have happened; list the dead letters to see"))?;
            Ok(redriven)
        }
        Err(error) => {
            // Nothing of it reaches a read_committed reader, the processor included.
            if let Err(abort) =
                tokio::task::block_in_place(|| producer.abort_transaction(CALL_TIMEOUT))
            {
                tracing::warn!(%abort, "aborting the re-drive's transaction failed; it times out");
            }
            Err(error)
        }
    }
}

/// Writes the re-drive records, then the log records naming where each went.
async fn write_all(
    producer: &FutureProducer<ReportingContext>,
    plan: &[(&DeadLetterEntry, &SourceRecord, String)],
    act: &RedriveAct,
) -> Result<Vec<Redriven>, RedriveError> {
    let mut redriven = Vec::with_capacity(plan.len());
    for (entry, original, log_topic) in plan {
        let record = dead_letters::redrive_record(original, entry, act);
        let mut headers = OwnedHeaders::new_with_capacity(record.headers.len());
        for (name, value) in &record.headers {
            headers = headers.insert(Header {
                key: name,
                value: value.as_deref(),
            });
        }
        let mut future = FutureRecord::<[u8], [u8]>::to(&record.topic)
            .partition(record.partition)
            .headers(headers);
        if let Some(key) = &record.key {
            future = future.key(key.as_slice());
        }
        if let Some(value) = &record.value {
            future = future.payload(value.as_slice());
        }
        if let Some(timestamp) = record.timestamp_ms {
            future = future.timestamp(timestamp);
        }
        let delivery = producer
            .send(future, Timeout::After(CALL_TIMEOUT))
            .await
            .map_err(|(error, _)| {
                kafka(format!("writing the re-drive record of {}", entry.letter))(error)
            })?;
        let written = RecordRef {
            topic: record.topic.clone(),
            partition: delivery.partition,
            offset: delivery.offset,
        };
        let logged = dead_letters::log_record(entry, original, act, written.clone());
        let value = serde_json::to_vec(&logged).unwrap_or_default();
        let key = entry.letter.to_string();
        producer
            .send(
                FutureRecord::to(log_topic).key(&key).payload(&value),
                Timeout::After(CALL_TIMEOUT),
            )
            .await
            .map_err(|(error, _)| {
                kafka(format!("writing the log record to {log_topic:?}"))(error)
            })?;
        tracing::info!(
            dead_letter = %entry.letter,
            event_id = entry.event_id.as_deref().unwrap_or(""),
            redrive_record = %written,
            redrive_id = act.redrive_id,
            "dead letter re-driven"
        );
        redriven.push(Redriven {
            dead_letter: entry.letter.clone(),
            event_id: entry.event_id.clone(),
            redrive_record: written,
            log_topic: log_topic.clone(),
        });
    }
    Ok(redriven)
}

/// The committed records of `topic` at `positions`, read with `read_committed` from the lowest
/// wanted offset of each partition to the highest. Positions no longer in the log are missing
/// from the answer. Blocking.
fn read_positions(
    settings: &KafkaSettings,
    topic: &str,
    positions: &BTreeSet<(i32, i64)>,
    end_timeout: Duration,
) -> Result<Vec<SourceRecord>, RedriveError> {
    let metadata = settings.metadata_client()?;
    let mut by_partition: BTreeMap<i32, (i64, i64)> = BTreeMap::new();
    for &(partition, offset) in positions {
        let (low, high) = by_partition.entry(partition).or_insert((offset, offset));
        *low = (*low).min(offset);
        *high = (*high).max(offset);
    }
    let mut assignment = TopicPartitionList::new();
    // Per partition: the last wanted offset, where the read of it ends.
    let mut pending: BTreeMap<i32, i64> = BTreeMap::new();
    for (&partition, &(first, last)) in &by_partition {
        let (low, high) = metadata
            .fetch_watermarks(topic, partition, METADATA_TIMEOUT)
            .map_err(|e| settings.unreachable(e))?;
        let first = first.max(low);
        if first > last || first >= high {
            continue;
        }
        assignment
            .add_partition_offset(topic, partition, Offset::Offset(first))
            .map_err(|e| ClusterError::client("cannot build the assignment", e))?;
        pending.insert(partition, last.min(high - 1));
    }
    let mut records = Vec::new();
    if pending.is_empty() {
        return Ok(records);
    }
    let consumer: BaseConsumer<ReportingContext> =
        kafka_clients::reader(&settings.client_config(), "eosctl-redrive", ReadCommitted)
            .set("allow.auto.create.topics", "false")
            .create_with_context(ReportingContext)
            .map_err(|e| ClusterError::client("cannot create the Kafka consumer", e))?;
    consumer
        .assign(&assignment)
        .map_err(|e| ClusterError::client("cannot assign the partitions to read", e))?;
    let mut last_progress = Instant::now();
    while !pending.is_empty() {
        if let Some(Ok(message)) = consumer.poll(POLL_TIMEOUT) {
            let (partition, offset) = (message.partition(), message.offset());
            let Some(&last) = pending.get(&partition) else {
                continue;
            };
            last_progress = Instant::now();
            if positions.contains(&(partition, offset)) {
                records.push(SourceRecord {
                    topic: topic.to_owned(),
                    partition,
                    offset,
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
            if offset >= last {
                pending.remove(&partition);
            }
            continue;
        }
        // A wanted offset that is a transaction marker or an aborted record is never returned:
        // the position passing it ends the partition too.
        if let Ok(list) = consumer.position() {
            for element in list.elements() {
                if let Offset::Offset(position) = element.offset()
                    && pending
                        .get(&element.partition())
                        .is_some_and(|&last| position > last)
                {
                    pending.remove(&element.partition());
                }
            }
        }
        if last_progress.elapsed() > end_timeout {
            return Err(RedriveError::Stalled {
                topic: topic.to_owned(),
                waited: end_timeout,
            });
        }
    }
    Ok(records)
}
