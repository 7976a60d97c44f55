//! Dead letters as an operator sees them (`eosctl dead-letters list`), which of them a re-drive
//! takes (`eosctl dead-letters redrive`), the records a re-drive writes and its log
//! (docs/eosctl.md "Dead letters and re-drives").
//!
//! An event's outcome is final (docs/TRANSFORMS.md "An event's outcome is final"): a refused or
//! failed event re-delivered by its producer is a duplicate, never judged again. Judging it again
//! is the operator's act: a re-drive sends the original record (read back from its input
//! partition, with its key, value, headers and timestamp) to that partition again, with
//! `eos-redrive-id`, `eos-redriven-by`, `eos-redrive-reason` and `eos-redrive-dead-letter`, and
//! writes one [`RedriveLogRecord`] per dead letter to the re-drive log topic in the same Kafka
//! transaction: no re-drive without its record of who, why and which dead letter. The processor
//! judges a dead-lettered event again once per re-drive id (`eos_transform::partition_state`).
//!
//! Pure: records in, choices and records out. The Kafka side is [`crate::redrive`].

use std::collections::BTreeMap;
use std::fmt::Write as _;

use comfy_table::Table;
use comfy_table::presets::UTF8_FULL_CONDENSED;
use eos_core::dead_letter::{
    DETAIL_HEADER, REASON_HEADER, SOURCE_OFFSET_HEADER, SOURCE_PARTITION_HEADER,
    SOURCE_TOPIC_HEADER, TRANSFORM_REASON_HEADER, TRUNCATED_HEADER,
};
use eos_core::redrive::{
    REDRIVE_DEAD_LETTER_HEADER, REDRIVE_ID_HEADER, REDRIVE_REASON_HEADER, REDRIVEN_BY_HEADER,
};
use eos_core::{DeadLetterReason, FieldLocation};
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::source_record::SourceRecord;

/// The re-drive log of an input topic when `--redrive-log` does not name one.
pub fn default_redrive_log(input_topic: &str) -> String {
    format!("{input_topic}.redrives")
}

/// A record's place in a topic.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct RecordRef {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
}

impl RecordRef {
    fn of(record: &SourceRecord) -> Self {
        Self {
            topic: record.topic.clone(),
            partition: record.partition,
            offset: record.offset,
        }
    }
}

impl std::fmt::Display for RecordRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}@{}", self.topic, self.partition, self.offset)
    }
}

/// One dead letter, read from its dead-letter topic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeadLetterEntry {
    /// Where the dead letter is.
    pub letter: RecordRef,
    /// When it was dead-lettered (its record timestamp), RFC 3339.
    pub dead_lettered_at: Option<String>,
    #[serde(skip)]
    pub dead_lettered_at_time: Option<OffsetDateTime>,
    /// `eos-dlq-reason`.
    pub reason: String,
    /// A transform's own code (`eos-dlq-transform-reason`).
    pub transform_reason: Option<String>,
    pub detail: String,
    /// The input record it was made from (`eos-source-*`).
    pub source: Option<RecordRef>,
    /// The event id where `--event-id` says it is, when the original has one there.
    pub event_id: Option<String>,
    /// Its value is a prefix of the original (a record too large for the dead-letter topic).
    pub truncated: bool,
    /// The original was itself a re-drive: this dead letter is the re-drive's outcome.
    pub from_redrive: Option<String>,
    /// The re-drive that took this dead letter, from the re-drive log.
    pub redriven: Option<RedriveMark>,
}

/// Which re-drive took a dead letter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RedriveMark {
    pub redrive_id: String,
    pub redriven_by: String,
    pub at: String,
}

/// One record of the re-drive log (`<input>.redrives`): who re-drove which dead letter, why,
/// and where the re-drive record went. Keyed by the dead letter (`topic/partition@offset`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RedriveLogRecord {
    pub redrive_id: String,
    pub redriven_by: String,
    pub reason: String,
    /// When, RFC 3339.
    pub at: String,
    pub event_id: Option<String>,
    pub dead_letter: RecordRef,
    pub dead_letter_reason: String,
    pub dead_letter_transform_reason: Option<String>,
    /// The input record re-driven.
    pub original: RecordRef,
    /// The re-drive record written to the input.
    pub redrive_record: RecordRef,
}

/// The dead letters of `letters` (the records of one dead-letter topic), with the re-drives the
/// re-drive `log` records against each, oldest dead letter first. `event_id_at` says where the
/// events keep their id.
pub fn entries(
    letters: &[SourceRecord],
    log: &[SourceRecord],
    event_id_at: &FieldLocation,
) -> Vec<DeadLetterEntry> {
    let mut redriven: BTreeMap<RecordRef, RedriveMark> = BTreeMap::new();
    for record in log {
        // A record that is not ours is left out; the log is written only by this tool.
        let Ok(logged) = serde_json::from_slice::<RedriveLogRecord>(record.value_bytes()) else {
            continue;
        };
        redriven.insert(
            logged.dead_letter,
            RedriveMark {
                redrive_id: logged.redrive_id,
                redriven_by: logged.redriven_by,
                at: logged.at,
            },
        );
    }
    let mut entries: Vec<DeadLetterEntry> = letters
        .iter()
        .map(|record| {
            let letter = RecordRef::of(record);
            let header = |name: &str| record.last_header_str(name).map(str::to_owned);
            let dead_lettered_at_time = record.timestamp_ms.and_then(|ms| {
                OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000).ok()
            });
            let source = (|| {
                Some(RecordRef {
                    topic: header(SOURCE_TOPIC_HEADER)?,
                    partition: header(SOURCE_PARTITION_HEADER)?.parse().ok()?,
                    offset: header(SOURCE_OFFSET_HEADER)?.parse().ok()?,
                })
            })();
            DeadLetterEntry {
                dead_lettered_at: dead_lettered_at_time.and_then(|at| at.format(&Rfc3339).ok()),
                dead_lettered_at_time,
                reason: header(REASON_HEADER).unwrap_or_default(),
                transform_reason: header(TRANSFORM_REASON_HEADER),
                detail: header(DETAIL_HEADER).unwrap_or_default(),
                source,
                event_id: event_id(record, event_id_at),
                truncated: header(TRUNCATED_HEADER).as_deref() == Some("true"),
                from_redrive: original_header(record, REDRIVE_ID_HEADER),
                redriven: redriven.get(&letter).cloned(),
                letter,
            }
        })
        .collect();
    entries.sort_by(|a, b| {
        (a.dead_lettered_at_time, &a.letter).cmp(&(b.dead_lettered_at_time, &b.letter))
    });
    entries
}

/// The first header named `name`: the original's, which the dead letter's own headers follow.
fn original_header(record: &SourceRecord, name: &str) -> Option<String> {
    record.header_str(name).map(str::to_owned)
}

/// The event id of a dead letter's original, where `at` says: a header (the original's, first),
/// the key, or a JSON pointer into the value (a truncated value is no JSON: none).
fn event_id(record: &SourceRecord, at: &FieldLocation) -> Option<String> {
    match at {
        FieldLocation::Header(name) => original_header(record, name),
        FieldLocation::Key => record
            .key
            .as_deref()
            .and_then(|key| std::str::from_utf8(key).ok())
            .map(str::to_owned),
        FieldLocation::Pointer(pointer) => {
            let value: serde_json::Value = serde_json::from_slice(record.value_bytes()).ok()?;
            value.pointer(pointer)?.as_str().map(str::to_owned)
        }
    }
}

/// Which dead letters a command takes: every list given must match (any of its values), and
/// the time bounds hold.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    pub reasons: Vec<DeadLetterReason>,
    pub transform_reasons: Vec<String>,
    pub source_topics: Vec<String>,
    pub event_ids: Vec<String>,
    /// Dead-lettered at or after.
    pub since: Option<OffsetDateTime>,
    /// Dead-lettered before.
    pub until: Option<OffsetDateTime>,
    /// Only dead letters no re-drive took yet.
    pub not_redriven: bool,
}

impl Selection {
    pub fn matches(&self, entry: &DeadLetterEntry) -> bool {
        let any = |wanted: &[String], value: Option<&str>| {
            wanted.is_empty() || value.is_some_and(|value| wanted.iter().any(|w| w == value))
        };
        (self.reasons.is_empty() || self.reasons.iter().any(|r| r.as_str() == entry.reason))
            && any(&self.transform_reasons, entry.transform_reason.as_deref())
            && any(
                &self.source_topics,
                entry.source.as_ref().map(|s| s.topic.as_str()),
            )
            && any(&self.event_ids, entry.event_id.as_deref())
            && self
                .since
                .is_none_or(|since| entry.dead_lettered_at_time.is_some_and(|at| at >= since))
            && self
                .until
                .is_none_or(|until| entry.dead_lettered_at_time.is_some_and(|at| at < until))
            && !(self.not_redriven && entry.redriven.is_some())
    }
}

/// Why a chosen dead letter is not re-driven.
pub fn not_redrivable(entry: &DeadLetterEntry) -> Option<String> {
    if let Some(mark) = &entry.redriven {
        return Some(format!(
            "already re-driven by {} at {} (re-drive {})",
            mark.redriven_by, mark.at, mark.redrive_id
        ));
    }
    if entry.source.is_none() {
        return Some("it names no input record (no eos-source-* headers)".to_owned());
    }
    // These judge the record, not the event: the event's outcome is another record's, and a
    // re-drive would meet the same conflict or horizon again.
    if entry.reason == DeadLetterReason::EventIdConflict.as_str()
        || entry.reason == DeadLetterReason::BeyondDedupHorizon.as_str()
    {
        return Some(format!(
            "{} is no outcome of the event; a re-drive changes nothing",
            entry.reason
        ));
    }
    None
}

/// The operator's act: who, why and under which id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedriveAct {
    pub redrive_id: String,
    pub by: String,
    pub why: String,
    pub at: OffsetDateTime,
}

/// A record to write: topic and partition (a re-drive goes to its original's partition, where
/// the event's outcome is kept), key, value, headers and timestamp.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordToWrite {
    pub topic: String,
    pub partition: i32,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub headers: Vec<(String, Option<Vec<u8>>)>,
    pub timestamp_ms: Option<i64>,
}

/// The re-drive record of `original` for `entry`: the original's key, value, headers and
/// timestamp (so its event time and dedup horizon are the original's), to its partition, with
/// the act's headers last. Re-drive headers the original carried (it was a re-drive itself) are
/// left out, so the record names this act only.
pub fn redrive_record(
    original: &SourceRecord,
    entry: &DeadLetterEntry,
    act: &RedriveAct,
) -> RecordToWrite {
    let act_headers = [
        REDRIVE_ID_HEADER,
        REDRIVEN_BY_HEADER,
        REDRIVE_REASON_HEADER,
        REDRIVE_DEAD_LETTER_HEADER,
    ];
    let mut headers: Vec<(String, Option<Vec<u8>>)> = original
        .headers
        .iter()
        .filter(|(name, _)| !act_headers.contains(&name.as_str()))
        .cloned()
        .collect();
    headers.extend([
        (
            REDRIVE_ID_HEADER.to_owned(),
            Some(act.redrive_id.clone().into_bytes()),
        ),
        (
            REDRIVEN_BY_HEADER.to_owned(),
            Some(act.by.clone().into_bytes()),
        ),
        (
            REDRIVE_REASON_HEADER.to_owned(),
            Some(act.why.clone().into_bytes()),
        ),
        (
            REDRIVE_DEAD_LETTER_HEADER.to_owned(),
            Some(entry.letter.to_string().into_bytes()),
        ),
    ]);
    RecordToWrite {
        topic: original.topic.clone(),
        partition: original.partition,
        key: original.key.clone(),
        value: original.value.clone(),
        headers,
        timestamp_ms: original.timestamp_ms,
    }
}

/// The log record of one re-driven dead letter, once its re-drive record is at `written`.
pub fn log_record(
    entry: &DeadLetterEntry,
    original: &SourceRecord,
    act: &RedriveAct,
    written: RecordRef,
) -> RedriveLogRecord {
    RedriveLogRecord {
        redrive_id: act.redrive_id.clone(),
        redriven_by: act.by.clone(),
        reason: act.why.clone(),
        at: act.at.format(&Rfc3339).unwrap_or_default(),
        event_id: entry.event_id.clone(),
        dead_letter: entry.letter.clone(),
        dead_letter_reason: entry.reason.clone(),
        dead_letter_transform_reason: entry.transform_reason.clone(),
        original: RecordRef::of(original),
        redrive_record: written,
    }
}

/// A re-drive id for an act without `--redrive-id`: the time and a random suffix, unique enough
/// that two operators never share one.
pub fn new_redrive_id(at: OffsetDateTime, random: u32) -> String {
    format!(
        "rd-{:04}{:02}{:02}T{:02}{:02}{:02}-{random:08x}",
        at.year(),
        u8::from(at.month()),
        at.day(),
        at.hour(),
        at.minute(),
        at.second()
    )
}

/// The dead letters as a table, for people.
pub fn list_text(entries: &[&DeadLetterEntry]) -> String {
    if entries.is_empty() {
        return "no dead letters match\n".to_owned();
    }
    let mut table = Table::new();
    table.load_preset(UTF8_FULL_CONDENSED).set_header([
        "dead letter",
        "at",
        "reason",
        "event id",
        "source",
        "re-driven",
        "detail",
    ]);
    for entry in entries {
        let reason = match &entry.transform_reason {
            Some(code) => format!("{} ({code})", entry.reason),
            None => entry.reason.clone(),
        };
        let mut redriven = entry
            .redriven
            .as_ref()
            .map(|mark| format!("{} by {}", mark.redrive_id, mark.redriven_by))
            .unwrap_or_default();
        if let Some(redrive) = &entry.from_redrive {
            let _ = write!(redriven, "(outcome of {redrive})");
        }
        table.add_row([
            entry.letter.to_string(),
            entry.dead_lettered_at.clone().unwrap_or_default(),
            reason,
            entry.event_id.clone().unwrap_or_default(),
            entry
                .source
                .as_ref()
                .map(ToString::to_string)
                .unwrap_or_default(),
            redriven,
            entry.detail.chars().take(80).collect(),
        ]);
    }
    format!("{table}\n{} dead letters\n", entries.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::macros::datetime;

    fn letter(offset: i64, reason: &str, code: Option<&str>, source_offset: i64) -> SourceRecord {
        let mut headers = vec![
            (
                "event_id".to_owned(),
                Some(format!("e-{source_offset}").into_bytes()),
            ),
            (REASON_HEADER.to_owned(), Some(reason.as_bytes().to_vec())),
        ];
        if let Some(code) = code {
            headers.push((
                TRANSFORM_REASON_HEADER.to_owned(),
                Some(code.as_bytes().to_vec()),
            ));
        }
        headers.extend([
            (DETAIL_HEADER.to_owned(), Some(b"why".to_vec())),
            (SOURCE_TOPIC_HEADER.to_owned(), Some(b"auths".to_vec())),
            (SOURCE_PARTITION_HEADER.to_owned(), Some(b"1".to_vec())),
            (
                SOURCE_OFFSET_HEADER.to_owned(),
                Some(source_offset.to_string().into_bytes()),
            ),
            (TRUNCATED_HEADER.to_owned(), Some(b"false".to_vec())),
        ]);
        SourceRecord {
            topic: "auths.dlq".into(),
            partition: 0,
            offset,
            key: Some(b"card-1".to_vec()),
            value: Some(format!(r#"{{"auth_id":"e-{source_offset}"}}"#).into_bytes()),
            headers,
            timestamp_ms: Some(1_800_000_000_000 + offset * 60_000),
            decoding: Default::default(),
        }
    }

    fn act() -> RedriveAct {
        RedriveAct {
            redrive_id: "rd-1".into(),
            by: "alice".into(),
            why: "limit raised".into(),
            at: datetime!(2027-01-15 08:00:00 UTC),
        }
    }

    #[test]
    fn dead_letters_are_listed_with_their_reason_source_event_and_redrive() {
        let letters = [
            letter(0, "transform_refused", Some("over_daily_limit"), 4),
            letter(1, "event_id_conflict", None, 9),
            letter(2, "transform_panic", None, 11),
        ];
        let original = SourceRecord {
            topic: "auths".into(),
            partition: 1,
            offset: 4,
            key: None,
            value: None,
            headers: Vec::new(),
            timestamp_ms: None,
            decoding: Default::default(),
        };
        let all = entries(&letters, &[], &FieldLocation::Header("event_id".into()));
        let logged = log_record(&all[0], &original, &act(), all[0].letter.clone());
        let log = [SourceRecord {
            value: Some(serde_json::to_vec(&logged).expect("serialises")),
            ..original.clone()
        }];
        let all = entries(&letters, &log, &FieldLocation::Pointer("/auth_id".into()));
        assert_eq!(all.len(), 3);
        assert_eq!(all[0].event_id.as_deref(), Some("e-4"));
        assert_eq!(all[0].transform_reason.as_deref(), Some("over_daily_limit"));
        assert_eq!(
            all[0].source.as_ref().map(ToString::to_string).as_deref(),
            Some("auths/1@4")
        );
        assert_eq!(
            all[0]
                .redriven
                .as_ref()
                .map(|mark| mark.redriven_by.as_str()),
            Some("alice")
        );
        assert!(not_redrivable(&all[0]).is_some_and(|why| why.contains("already re-driven")));
        assert!(not_redrivable(&all[1]).is_some_and(|why| why.contains("no outcome")));
        assert_eq!(not_redrivable(&all[2]), None);
        let text = list_text(&all.iter().collect::<Vec<_>>());
        assert!(
            text.contains("transform_refused (over_daily_limit)"),
            "{text}"
        );
        assert!(text.contains("rd-1 by alice"), "{text}");
    }

    #[test]
    fn a_selection_needs_every_list_given_and_the_time_bounds() {
        let all = entries(
            &[
                letter(0, "transform_refused", Some("over_daily_limit"), 4),
                letter(1, "transform_refused", Some("invalid_amount"), 5),
                letter(2, "transform_limit", None, 6),
            ],
            &[],
            &FieldLocation::Header("event_id".into()),
        );
        let chosen = |selection: Selection| -> Vec<i64> {
            all.iter()
                .filter(|entry| selection.matches(entry))
                .map(|entry| entry.letter.offset)
                .collect()
        };
        assert_eq!(chosen(Selection::default()), [0, 1, 2]);
        assert_eq!(
            chosen(Selection {
                reasons: vec![DeadLetterReason::TransformRefused],
                transform_reasons: vec!["invalid_amount".into()],
                ..Selection::default()
            }),
            [1]
        );
        assert_eq!(
            chosen(Selection {
                event_ids: vec!["e-6".into(), "e-4".into()],
                source_topics: vec!["auths".into()],
                ..Selection::default()
            }),
            [0, 2]
        );
        let minute = |n: i64| {
            OffsetDateTime::from_unix_timestamp(1_800_000_000 + n * 60).expect("a valid time")
        };
        assert_eq!(
            chosen(Selection {
                since: Some(minute(1)),
                until: Some(minute(2)),
                ..Selection::default()
            }),
            [1]
        );
        assert!(
            chosen(Selection {
                source_topics: vec!["other".into()],
                ..Selection::default()
            })
            .is_empty()
        );
    }

    #[test]
    fn a_redrive_record_is_the_original_to_its_partition_with_the_act_last() {
        let all = entries(
            &[letter(0, "transform_refused", Some("over_daily_limit"), 4)],
            &[],
            &FieldLocation::Header("event_id".into()),
        );
        let original = SourceRecord {
            topic: "auths".into(),
            partition: 1,
            offset: 4,
            key: Some(b"card-1".to_vec()),
            value: Some(br#"{"auth_id":"e-4"}"#.to_vec()),
            headers: vec![
                ("traceparent".into(), Some(b"00-ab".to_vec())),
                // It was a re-drive itself: that act is not this one's.
                (REDRIVE_ID_HEADER.into(), Some(b"rd-0".to_vec())),
            ],
            timestamp_ms: Some(1_700_000_000_000),
            decoding: Default::default(),
        };
        let record = redrive_record(&original, &all[0], &act());
        assert_eq!(
            (record.topic.as_str(), record.partition, record.timestamp_ms),
            ("auths", 1, Some(1_700_000_000_000))
        );
        assert_eq!(
            (&record.key, &record.value),
            (&original.key, &original.value)
        );
        let names: Vec<&str> = record.headers.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "traceparent",
                REDRIVE_ID_HEADER,
                REDRIVEN_BY_HEADER,
                REDRIVE_REASON_HEADER,
                REDRIVE_DEAD_LETTER_HEADER
            ]
        );
        let headers: Vec<(&str, Option<&[u8]>)> = record
            .headers
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_deref()))
            .collect();
        assert_eq!(eos_core::redrive::redrive_id(&headers), Ok(Some("rd-1")));
        assert_eq!(
            new_redrive_id(datetime!(2027-01-15 08:00:09 UTC), 0xab),
            "rd-20270115T080009-000000ab"
        );
        assert!(
            eos_core::redrive::check_redrive_id(&new_redrive_id(
                datetime!(2027-01-15 08:00:09 UTC),
                u32::MAX
            ))
            .is_ok()
        );
    }
}
