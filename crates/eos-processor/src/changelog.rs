//! The state changelog: a compacted topic co-partitioned with the input (changelog partition N
//! holds the state of input partition N), written in the same transaction as the outputs and the
//! consumed offsets, and read back with `read_committed` before a partition is processed.
//!
//! Keys are `entity/<entity_id>` (value: the transform's entity state as JSON) and
//! `seen/<event_id>` (value: fingerprint and expiry); a tombstone deletes an expired id.

use std::time::{Duration, Instant};

use eos_runtime::backoff::{BlockingRetryable as _, doubling};
use eos_runtime::kafka_errors::passes_by_itself;
use rdkafka::Message as _;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::ProcessorError;
use crate::partition_state::{Overlay, PartitionState, SeenEvent};

const ENTITY_PREFIX: &str = "entity/";
const SEEN_PREFIX: &str = "seen/";

/// One record to write to the changelog partition.
#[derive(Debug, Clone, PartialEq)]
pub struct ChangelogRecord {
    pub key: String,
    /// `None` is a tombstone.
    pub value: Option<Vec<u8>>,
}

/// The changelog records that carry `overlay` (last value per key only: the topic is compacted).
pub fn records_for<S: Serialize>(overlay: &Overlay<S>) -> Vec<ChangelogRecord> {
    let entities = overlay.entities.iter().map(|(id, state)| ChangelogRecord {
        key: format!("{ENTITY_PREFIX}{id}"),
        value: serde_json::to_vec(state).ok(),
    });
    let seen = overlay.seen.iter().map(|(id, seen)| ChangelogRecord {
        key: format!("{SEEN_PREFIX}{id}"),
        value: serde_json::to_vec(seen).ok(),
    });
    let expired = overlay.expired.iter().map(|id| ChangelogRecord {
        key: format!("{SEEN_PREFIX}{id}"),
        value: None,
    });
    entities.chain(seen).chain(expired).collect()
}

/// Applies one changelog record to `state` during a restore.
pub fn restore_record<S: DeserializeOwned + Clone + Default>(
    state: &mut PartitionState<S>,
    key: &[u8],
    value: Option<&[u8]>,
) -> Result<(), String> {
    let key = std::str::from_utf8(key).map_err(|_| "changelog key is not UTF-8".to_owned())?;
    if let Some(entity_id) = key.strip_prefix(ENTITY_PREFIX) {
        let entity_state = value
            .map(serde_json::from_slice)
            .transpose()
            .map_err(|e| format!("entity state for {entity_id:?} does not decode: {e}"))?;
        state.restore_entity(entity_id.to_owned(), entity_state);
        return Ok(());
    }
    if let Some(event_id) = key.strip_prefix(SEEN_PREFIX) {
        let seen: Option<SeenEvent> = value
            .map(serde_json::from_slice)
            .transpose()
            .map_err(|e| format!("seen id {event_id:?} does not decode: {e}"))?;
        state.restore_seen(event_id.to_owned(), seen);
        return Ok(());
    }
    Err(format!("unknown changelog key {key:?}"))
}

/// Reads one changelog partition from the beginning to its end with `read_committed` and
/// rebuilds the partition's state. Gives up only when the position has not moved for `timeout`
/// (an open transaction of a crashed owner that never resolves, or a partition that stays
/// unreachable): a large changelog takes as long as it takes, and a broker that is restarting
/// (its partitions moving to another replica) is waited for, as the processing loop waits.
pub fn restore_partition<S: DeserializeOwned + Clone + Default>(
    client_config: &ClientConfig,
    topic: &str,
    partition: i32,
    timeout: Duration,
) -> Result<(PartitionState<S>, u64), ProcessorError> {
    let restore_error = |detail: String| ProcessorError::Restore {
        topic: topic.to_owned(),
        partition,
        detail,
    };
    let consumer: BaseConsumer = client_config
        .clone()
        // librdkafka refuses to fetch without a group id even for a manual assignment; this group
        // never commits anything.
        .set("group.id", format!("{topic}-restore"))
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .create()
        .map_err(|e| restore_error(e.to_string()))?;
    // A changelog created moments ago may not have a leader yet on every broker's metadata
    // (NotLeaderForPartition, LeaderNotAvailable, UnknownTopicOrPartition): that passes, so ask
    // again for a while instead of failing the start-up.
    let (low, high) = (|| consumer.fetch_watermarks(topic, partition, Duration::from_secs(10)))
        .retry(doubling(Duration::from_millis(100), Duration::from_secs(2)).with_max_times(8))
        .when(passes_by_itself)
        .notify(|error, delay| {
            tracing::warn!(topic, partition, %error, ?delay, "changelog leader not reachable yet; asking again");
        })
        .call()
        .map_err(|e| restore_error(format!("cannot read watermarks: {e}")))?;
    let mut state = PartitionState::default();
    let mut records = 0u64;
    if high <= low {
        return Ok((state, records));
    }
    let mut assignment = TopicPartitionList::new();
    assignment
        .add_partition_offset(topic, partition, Offset::Offset(low))
        .map_err(|e| restore_error(e.to_string()))?;
    consumer
        .assign(&assignment)
        .map_err(|e| restore_error(e.to_string()))?;
    let mut last_progress = (low, Instant::now());
    let mut last_error: Option<KafkaError> = None;
    loop {
        if let Some(message) = consumer.poll(Duration::from_millis(100)) {
            let message = match message {
                Ok(message) => message,
                Err(error @ KafkaError::MessageConsumptionFatal(_)) => {
                    return Err(restore_error(error.to_string()));
                }
                // A broker going away and the like: librdkafka reconnects and follows the
                // partition to its new leader by itself.
                Err(error) => {
                    tracing::warn!(topic, partition, %error, "changelog read interrupted; waiting for the broker");
                    last_error = Some(error);
                    continue;
                }
            };
            restore_record(
                &mut state,
                message.key().unwrap_or_default(),
                message.payload(),
            )
            .map_err(|detail| restore_error(format!("offset {}: {detail}", message.offset())))?;
            records += 1;
        }
        // Aborted records and transaction markers advance the position without being returned.
        let position = consumer
            .position()
            .ok()
            .and_then(|list| {
                list.find_partition(topic, partition)
                    .and_then(|elem| elem.offset().to_raw())
            })
            .unwrap_or(low);
        if position >= high {
            return Ok((state, records));
        }
        if position > last_progress.0 {
            last_progress = (position, Instant::now());
        } else if last_progress.1.elapsed() > timeout {
            let why = match &last_error {
                Some(error) => format!("the last read failed with: {error}"),
                None => "an open transaction of a crashed instance holds the last stable offset \
                         until transaction.timeout.ms"
                    .to_owned(),
            };
            return Err(restore_error(format!(
                "no progress at offset {position} of {high} for {timeout:?}: {why}"
            )));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transform::LedgerTotals;
    use eos_core::Fingerprint;

    #[test]
    fn records_round_trip_through_a_restore() {
        let mut overlay = Overlay::<LedgerTotals>::default();
        overlay.entities.insert(
            "17".into(),
            LedgerTotals {
                total: 19500,
                count: 2,
            },
        );
        overlay.seen.insert(
            "e-102".into(),
            SeenEvent {
                fingerprint: Fingerprint::of_json(&serde_json::Value::Null),
                expires_at: 42,
            },
        );
        overlay.expired.insert("e-001".into());
        let records = records_for(&overlay);
        assert_eq!(records.len(), 3);

        let mut state = PartitionState::<LedgerTotals>::default();
        state.restore_seen(
            "e-001".into(),
            Some(SeenEvent {
                fingerprint: Fingerprint::of_json(&serde_json::Value::Null),
                expires_at: 1,
            }),
        );
        for record in &records {
            restore_record(&mut state, record.key.as_bytes(), record.value.as_deref())
                .expect("own records decode");
        }
        assert_eq!(
            state.entity("17"),
            Some(&LedgerTotals {
                total: 19500,
                count: 2
            })
        );
        assert_eq!(state.seen_count(), 1, "e-102 kept, e-001 tombstoned");
    }

    #[test]
    fn a_corrupt_changelog_is_an_error_not_a_silent_reset() {
        let mut state = PartitionState::<LedgerTotals>::default();
        assert!(restore_record(&mut state, b"entity/17", Some(b"not json")).is_err());
        assert!(restore_record(&mut state, b"mystery/17", Some(b"{}")).is_err());
    }
}
