//! The state changelog: a compacted topic co-partitioned with the input (changelog partition N
//! holds the state of input partition N), written in the same transaction as the outputs and the
//! consumed offsets, and read back with `read_committed` before a partition is processed.
//!
//! Keys are `entity/<entity_id>` (value: the transform's entity state as JSON) and
//! `seen/<event_id>` (value: fingerprint, expiry and the event's final outcome, `SeenEvent`); a
//! tombstone deletes an expired id. A `seen/` record written before outcomes were recorded has
//! no outcome and reads as applied, which every id it holds was: a changelog of any age restores
//! without a migration. Every
//! record is an upsert or a delete by key, so replaying any part of the changelog over a store
//! that already holds it changes nothing: a restore may start at any offset at or before the
//! first one the local store does not cover.

use std::time::{Duration, Instant};

use crate::error::ProcessorError;
use crate::partition_state::{Overlay, SeenEvent};
use crate::state_format;
use crate::state_store::{Checkpoint, PartitionStore, StateChanges, now_unix_ms};
use crate::transform::Transform;
use eos_runtime::backoff::{BlockingRetryable as _, doubling};
use eos_runtime::kafka_clients::{self, Isolation::ReadCommitted};
use eos_runtime::kafka_errors::{ReportingContext, passes_by_itself};
use eos_runtime::log_end;
use rdkafka::Message as _;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

/// Changelog records written to the store per store transaction during a restore.
const RESTORE_CHUNK: usize = 20_000;

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
/// Entity state is stored in the transform's versioned format (`state_format`).
pub fn records_for<T: Transform>(overlay: &Overlay<T::State>) -> Vec<ChangelogRecord> {
    let entities = overlay.entities.iter().map(|(id, state)| ChangelogRecord {
        key: format!("{ENTITY_PREFIX}{id}"),
        value: state_format::encode::<T>(state).ok(),
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

/// Decodes one changelog record into `changes` during a restore.
pub fn decode_record<T: Transform>(
    transform: &T,
    changes: &mut StateChanges,
    key: &[u8],
    value: Option<&[u8]>,
) -> Result<(), String> {
    let key = std::str::from_utf8(key).map_err(|_| "changelog key is not UTF-8".to_owned())?;
    if let Some(entity_id) = key.strip_prefix(ENTITY_PREFIX) {
        // Checked to decode now, so a corrupt changelog, or one written by a transform with
        // another state format and no upgrade, stops the restore instead of the first event of
        // that entity; stored as it is (an upgrade is applied again when it is read).
        if let Some(stored) = value {
            state_format::decode(transform, stored)
                .map_err(|e| format!("entity state for {entity_id:?}: {e}"))?;
        }
        changes
            .entities
            .push((entity_id.to_owned(), value.map(<[u8]>::to_vec)));
        return Ok(());
    }
    if let Some(event_id) = key.strip_prefix(SEEN_PREFIX) {
        let seen: Option<SeenEvent> = value
            .map(serde_json::from_slice)
            .transpose()
            .map_err(|e| format!("seen id {event_id:?} does not decode: {e}"))?;
        changes.seen.push((event_id.to_owned(), seen));
        return Ok(());
    }
    Err(format!("unknown changelog key {key:?}"))
}

/// How a partition's state was restored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestoreMode {
    /// From the local checkpoint to the changelog's end.
    Warm,
    /// From the changelog's start into an emptied store.
    Cold,
}

impl RestoreMode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Warm => "warm",
            Self::Cold => "cold",
        }
    }
}

/// What a restore did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestoreOutcome {
    pub mode: RestoreMode,
    /// Why a cold restore (empty for a warm one).
    pub reason: &'static str,
    /// Changelog records read and applied.
    pub records: u64,
    /// The offset the read started at, and the one the store now covers up to (its checkpoint).
    pub from_offset: i64,
    pub next_offset: i64,
}

/// Where a restore starts: at the local checkpoint when it still describes this changelog,
/// else at the changelog's start (after emptying the store).
pub fn restore_start(
    checkpoint: Option<Checkpoint>,
    low: i64,
    high: i64,
    delete_retention: Duration,
    now_ms: i64,
) -> (RestoreMode, &'static str, i64) {
    let Some(checkpoint) = checkpoint else {
        return (RestoreMode::Cold, "no local checkpoint", low);
    };
    if checkpoint.next_offset > high {
        return (
            RestoreMode::Cold,
            "the local checkpoint is beyond the changelog's end (topic recreated)",
            low,
        );
    }
    if checkpoint.next_offset < low {
        return (
            RestoreMode::Cold,
            "the local checkpoint is below the changelog's log start offset",
            low,
        );
    }
    let age_ms = now_ms.saturating_sub(checkpoint.written_at_ms);
    if age_ms > i64::try_from(delete_retention.as_millis()).unwrap_or(i64::MAX) {
        return (
            RestoreMode::Cold,
            "the local checkpoint is older than the changelog's delete.retention.ms (tombstones \
             after it may be gone)",
            low,
        );
    }
    (RestoreMode::Warm, "", checkpoint.next_offset)
}

/// The changelog partition's low and high watermarks.
///
/// Read up to the high watermark, not the last stable offset: the previous owner's last batch
/// may be committed with its markers not yet written, while this owner's consumer already
/// resumes after its offsets (see `eos_runtime::log_end`). A changelog created moments ago may
/// not have a leader yet on every broker's metadata, and a broker that stalled past its session
/// with the controller leaves its partitions without one until it is unfenced
/// (NotLeaderForPartition, LeaderNotAvailable, UnknownPartition): that passes, so ask again for
/// as long as a restore may go without progress.
fn changelog_watermarks(
    client_config: &ClientConfig,
    (topic, partition): (&str, i32),
    timeout: Duration,
) -> Result<(i64, i64), String> {
    let end_query = log_end::EndQuery::new(client_config).map_err(|e| e.to_string())?;
    let end = || end_query.watermarks(topic, partition, Duration::from_secs(10));
    end.retry(
        doubling(Duration::from_millis(100), Duration::from_secs(2))
            .with_total_delay(Some(timeout)),
    )
    .when(passes_by_itself)
    .notify(|error, delay| {
        tracing::warn!(topic, partition, %error, ?delay, "changelog leader not reachable yet; asking again");
    })
    .call()
    .map_err(|e| format!("cannot read watermarks: {e}"))
}

/// A changelog partition assigned from the restore's start, read to its high watermark.
struct ChangelogRead<'a> {
    consumer: &'a BaseConsumer<ReportingContext>,
    topic: &'a str,
    partition: i32,
    high: i64,
    timeout: Duration,
}

impl ChangelogRead<'_> {
    /// Reads every change into `store` in chunks, the last with the checkpoint that covers it
    /// (`outcome.next_offset`); `Err` when the read fails for good or makes no progress for
    /// `timeout`.
    fn to_store<T: Transform>(
        &self,
        transform: &T,
        store: &PartitionStore,
        outcome: &mut RestoreOutcome,
    ) -> Result<(), ProcessorError> {
        let restore_error = |detail: String| ProcessorError::Restore {
            topic: self.topic.to_owned(),
            partition: self.partition,
            detail,
        };
        let (consumer, topic, partition, high, timeout) = (
            self.consumer,
            self.topic,
            self.partition,
            self.high,
            self.timeout,
        );
        let mut changes = StateChanges::default();
        let mut last_progress = (outcome.from_offset, Instant::now());
        let mut last_error: Option<KafkaError> = None;
        let mut position = outcome.from_offset;
        loop {
            let polled = consumer.poll(Duration::from_millis(100));
            let returned_a_record = matches!(polled, Some(Ok(_)));
            if let Some(message) = polled {
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
                decode_record(
                    transform,
                    &mut changes,
                    message.key().unwrap_or_default(),
                    message.payload(),
                )
                .map_err(|detail| {
                    restore_error(format!("offset {}: {detail}", message.offset()))
                })?;
                outcome.records += 1;
                position = position.max(message.offset() + 1);
                if changes.len() >= RESTORE_CHUNK {
                    store.write(&std::mem::take(&mut changes), None)?;
                }
            }
            // Aborted records and transaction markers advance the consumer's position without
            // being returned, so it is asked for whenever a poll returns no record. Not after
            // every record: the call (a lock and a partition list) cost more than the record.
            if !returned_a_record {
                position = consumer
                    .position()
                    .ok()
                    .and_then(|list| {
                        list.find_partition(topic, partition)
                            .and_then(|elem| elem.offset().to_raw())
                    })
                    .unwrap_or(position)
                    .max(position);
            }
            if position >= high {
                // The last records and the checkpoint that covers them, in one store
                // transaction.
                outcome.next_offset = position;
                store.write(&changes, Some(position))?;
                return Ok(());
            }
            if position > last_progress.0 {
                last_progress = (position, Instant::now());
            } else if last_progress.1.elapsed() > timeout {
                let why = match &last_error {
                    Some(error) => format!("the last read failed with: {error}"),
                    None => "an open transaction of a crashed instance holds the last stable \
                             offset until transaction.timeout.ms"
                        .to_owned(),
                };
                return Err(restore_error(format!(
                    "no progress at offset {position} of {high} for {timeout:?}: {why}"
                )));
            }
        }
    }
}

/// Brings the local store of one changelog partition up to the changelog's end with
/// `read_committed`: from the local checkpoint (warm), or from the start into an emptied store
/// (cold, see [`restore_start`]). Gives up only when the position has not moved for `timeout`
/// (an open transaction of a crashed owner that never resolves, or a partition that stays
/// unreachable): a large changelog takes as long as it takes, and a broker that is restarting
/// (its partitions moving to another replica) is waited for, as the processing loop waits.
pub fn restore_partition<T: Transform>(
    transform: &T,
    client_config: &ClientConfig,
    topic: &str,
    partition: i32,
    timeout: Duration,
    store: &PartitionStore,
    delete_retention: Duration,
) -> Result<RestoreOutcome, ProcessorError> {
    let restore_error = |detail: String| ProcessorError::Restore {
        topic: topic.to_owned(),
        partition,
        detail,
    };
    let consumer: BaseConsumer<ReportingContext> =
        kafka_clients::reader(client_config, &format!("{topic}-restore"), ReadCommitted)
            .create_with_context(ReportingContext)
            .map_err(|e| restore_error(e.to_string()))?;
    // Read up to the high watermark, not the last stable offset: the previous owner's last
    // batch may be committed with its markers not yet written, while this owner's consumer
    // already resumes after its offsets (see `eos_runtime::log_end`).
    //
    // A changelog created moments ago may not have a leader yet on every broker's metadata, and
    // a broker that stalled past its session with the controller leaves its partitions without
    // one until it is unfenced (NotLeaderForPartition, LeaderNotAvailable, UnknownPartition):
    // that passes, so ask again for as long as a restore may go without progress.
    let (low, high) =
        changelog_watermarks(client_config, (topic, partition), timeout).map_err(restore_error)?;
    let (mode, reason, start) = restore_start(
        store.checkpoint()?,
        low,
        high,
        delete_retention,
        now_unix_ms(),
    );
    if mode == RestoreMode::Cold {
        store.clear()?;
    }
    let mut outcome = RestoreOutcome {
        mode,
        reason,
        records: 0,
        from_offset: start,
        next_offset: start,
    };
    let changes = StateChanges::default();
    if high <= start {
        outcome.next_offset = high.max(start);
        store.write(&changes, Some(outcome.next_offset))?;
        return Ok(outcome);
    }
    let mut assignment = TopicPartitionList::new();
    assignment
        .add_partition_offset(topic, partition, Offset::Offset(start))
        .map_err(|e| restore_error(e.to_string()))?;
    consumer
        .assign(&assignment)
        .map_err(|e| restore_error(e.to_string()))?;
    let read = ChangelogRead {
        consumer: &consumer,
        topic,
        partition,
        high,
        timeout,
    };
    read.to_store(transform, store, &mut outcome)?;
    Ok(outcome)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::partition_state::PartitionState;
    use crate::state_store::StateStore;
    use crate::transform::{LedgerTotals, LedgerTransform};
    use eos_core::Fingerprint;

    #[test]
    fn records_round_trip_through_a_restore_and_replay_is_idempotent() {
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
            SeenEvent::applied(Fingerprint::of_json(&serde_json::Value::Null), 42),
        );
        overlay.expired.insert("e-001".into());
        let records = records_for::<LedgerTransform>(&overlay);
        assert_eq!(records.len(), 3);

        let store = StateStore::in_memory().expect("store");
        let state = PartitionState::<LedgerTotals>::new(store.partition("c", 0).expect("tables"));
        state
            .store()
            .write(
                &StateChanges {
                    entities: vec![],
                    seen: vec![(
                        "e-001".into(),
                        Some(SeenEvent::applied(
                            Fingerprint::of_json(&serde_json::Value::Null),
                            1,
                        )),
                    )],
                },
                None,
            )
            .expect("writes");
        // Applied twice, as a warm restore from a checkpoint below the end would: same result.
        for _ in 0..2 {
            let mut changes = StateChanges::default();
            for record in &records {
                decode_record(
                    &LedgerTransform,
                    &mut changes,
                    record.key.as_bytes(),
                    record.value.as_deref(),
                )
                .expect("own records decode");
            }
            state.store().write(&changes, None).expect("writes");
            let totals: LedgerTotals = serde_json::from_slice(
                &state.store().entity("17").expect("reads").expect("present"),
            )
            .expect("JSON");
            assert_eq!(
                totals,
                LedgerTotals {
                    total: 19500,
                    count: 2
                }
            );
            assert_eq!(
                state.store().counts().expect("counts"),
                (1, 1),
                "e-102 kept, e-001 tombstoned"
            );
            assert_eq!(
                state.store().expired_ids(i64::MAX, 10).expect("reads"),
                ["e-102"],
                "one expiry entry per live id"
            );
        }
    }

    /// A `seen/` record as every changelog held before outcomes were recorded restores as an
    /// applied event; a refused and re-driven one keeps its outcome through the changelog and
    /// the local store, and an applied one is still written in the old form.
    #[test]
    fn seen_records_of_before_outcomes_restore_as_applied_and_outcomes_round_trip() {
        let fingerprint = Fingerprint::of_json(&serde_json::json!({"n": 1}));
        let old = format!(r#"{{"fp":"{fingerprint}","exp":1800000000}}"#);
        let refused = SeenEvent {
            dead_letter: Some(eos_core::DeadLetterReason::TransformRefused),
            redrives: vec!["rd-1".into()],
            ..SeenEvent::applied(fingerprint, 1_800_000_001)
        };
        let mut overlay = Overlay::<LedgerTotals>::default();
        overlay.seen.insert("e-refused".into(), refused.clone());
        overlay.seen.insert(
            "e-applied".into(),
            SeenEvent::applied(fingerprint, 1_800_000_000),
        );
        let mut records = records_for::<LedgerTransform>(&overlay);
        records.sort_by(|a, b| a.key.cmp(&b.key));
        assert_eq!(
            records[0].value.as_deref(),
            Some(old.as_bytes()),
            "an applied id is written as before"
        );
        let mut changes = StateChanges::default();
        for (key, value) in [
            ("seen/e-old".as_bytes(), old.as_bytes()),
            (
                records[1].key.as_bytes(),
                records[1].value.as_deref().unwrap_or_default(),
            ),
        ] {
            decode_record(&LedgerTransform, &mut changes, key, Some(value)).expect("decodes");
        }
        assert_eq!(
            changes.seen,
            [
                (
                    "e-old".to_owned(),
                    Some(SeenEvent::applied(fingerprint, 1_800_000_000))
                ),
                ("e-refused".to_owned(), Some(refused.clone())),
            ]
        );
        let store = StateStore::in_memory().expect("store");
        let partition = store.partition("c", 0).expect("tables");
        partition.write(&changes, Some(2)).expect("writes");
        assert_eq!(partition.seen("e-refused").expect("reads"), Some(refused));
        assert_eq!(
            partition.seen("e-old").expect("reads"),
            Some(SeenEvent::applied(fingerprint, 1_800_000_000))
        );
    }

    #[test]
    fn a_corrupt_changelog_is_an_error_not_a_silent_reset() {
        let mut changes = StateChanges::default();
        let mut decode = |key: &[u8], value: &[u8]| {
            decode_record(&LedgerTransform, &mut changes, key, Some(value))
        };
        assert!(decode(b"entity/17", b"not json").is_err());
        assert!(decode(b"mystery/17", b"{}").is_err());
        // State of another format version, which the ledger cannot upgrade, stops the restore.
        let refused = decode(
            b"entity/17",
            br#"{"eos_state_version":2,"state":{"total":1,"count":1}}"#,
        )
        .expect_err("another version");
        assert!(refused.contains("version 2"), "{refused}");
    }

    #[test]
    fn a_restore_is_warm_only_from_a_checkpoint_that_still_describes_the_changelog() {
        let day = Duration::from_secs(86_400);
        let now = 1_800_000_000_000;
        let at = |next_offset, age_ms| {
            Some(Checkpoint {
                next_offset,
                written_at_ms: now - age_ms,
            })
        };
        assert_eq!(
            restore_start(at(500, 1000), 0, 900, day, now),
            (RestoreMode::Warm, "", 500)
        );
        assert_eq!(
            restore_start(at(900, 1000), 0, 900, day, now).0,
            RestoreMode::Warm,
            "at the end: nothing to read"
        );
        for (checkpoint, low, high, why) in [
            (None, 10, 900, "no local checkpoint"),
            (at(950, 1000), 0, 900, "beyond the changelog's end"),
            (at(5, 1000), 10, 900, "below the changelog's log start"),
            (
                at(500, 86_400_001),
                0,
                900,
                "older than the changelog's delete.retention.ms",
            ),
        ] {
            let (mode, reason, start) = restore_start(checkpoint, low, high, day, now);
            assert_eq!((mode, start), (RestoreMode::Cold, low), "{why}");
            assert!(reason.contains(why), "{reason} / {why}");
        }
    }
}
