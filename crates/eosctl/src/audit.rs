//! The exactly-once audit: given every record of an input topic, the processor's output topic and
//! its dead-letter topic, decide whether each input was accounted for exactly once
//! (docs/architecture/bad-input.md "Bad input"): one output for each logical event, nothing for a
//! duplicate delivery, one DLQ entry for each malformed or conflicting record.
//!
//! Pure logic over in-memory [`SourceRecord`]s — no Kafka, no clock — so the rules are unit-tested.
//! The boundaries past the output (Postgres tables, a provider's effect list) are checked against
//! [`output_logical_set`] by [`boundary_audit`](crate::boundary_audit), into the same report.
//!
//! The logical set is keyed by `event_id` (cardinality by operation id, not by attempts):
//! - the first occurrence of an `event_id` defines the logical event (lowest offset; when
//!   occurrences span partitions, the one the output's `source` points at, else the lowest
//!   `(partition, offset)`);
//! - a later occurrence with the same fingerprint is a duplicate delivery and must appear nowhere;
//! - a later occurrence with a different fingerprint is a conflict and must be dead-lettered once
//!   with reason `event_id_conflict`;
//! - an occurrence older than the dedup horizon (by `occurred_at`, else the record timestamp) may
//!   instead be dead-lettered with reason `beyond_dedup_horizon` (the processor can no longer
//!   tell whether it is a duplicate);
//! - an occurrence whose value would take its entity's running total past a signed 64-bit
//!   integer, at its point in processing order, must be dead-lettered with reason
//!   `total_overflow`; it leaves the total as it was;
//! - an event's outcome is final (docs/TRANSFORMS.md "An event's outcome is final"): applied or
//!   dead-lettered by the processor's judgement (an overflow, or a record the ledger refused
//!   although its id was readable), later occurrences of the id are duplicates or conflicts of
//!   that first judged record, never judged again — except a re-drive record (`eos-redrive-id`)
//!   of a dead-lettered event, whose new outcome replaces the refusal, once per re-drive id;
//! - so an event id with two outcomes — two dead letters that judged it, or a judging dead
//!   letter and outputs, not explained by a re-drive — is a violation (`two_outcomes`).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;

use eos_core::dead_letter::{
    self, REASON_HEADER, SOURCE_OFFSET_HEADER, SOURCE_PARTITION_HEADER, SOURCE_TOPIC_HEADER,
};
use eos_core::redrive::{REDRIVE_ID_HEADER, check_redrive_id};
use eos_core::{DeadLetterReason, Event, EventContract, EventEnvelope, Fingerprint, RecordParts};
use serde::Serialize;
use serde_json::Value;
use time::OffsetDateTime;

use crate::source_record::{Decoding, Position, SourceRecord};

/// Fields the processor adds to each output record next to the input envelope. They are stripped
/// before fingerprinting, so an output's fingerprint is that of the original content.
pub const PROCESSOR_ADDED_FIELDS: [&str; 3] =
    [ENTITY_TOTAL_FIELD, ENTITY_COUNT_FIELD, SOURCE_FIELD];
/// Running sum of `value` over the entity's events, this one included (i64 cents).
pub const ENTITY_TOTAL_FIELD: &str = "entity_total";
/// Running number of the entity's events, this one included (u64).
pub const ENTITY_COUNT_FIELD: &str = "entity_count";
/// `{topic, partition, offset}` of the input record the output was made from.
pub const SOURCE_FIELD: &str = "source";

/// Examples kept per violation kind.
pub const DEFAULT_EXAMPLE_LIMIT: usize = 20;

/// The three topics to audit. Records may come in any order; the audit sorts them by position.
#[derive(Debug, Clone, Copy)]
pub struct AuditInput<'a> {
    pub input_topic: &'a str,
    pub input: &'a [SourceRecord],
    pub output: &'a [SourceRecord],
    pub dlq: &'a [SourceRecord],
}

#[derive(Debug, Clone)]
pub struct AuditConfig {
    /// When the audit runs; with `dedup_horizon` it decides which events may be dead-lettered as
    /// `beyond_dedup_horizon`.
    pub now: OffsetDateTime,
    pub dedup_horizon: std::time::Duration,
    /// The processor's record size limit: larger input records are malformed (`oversized_record`).
    pub max_record_bytes: usize,
    pub example_limit: usize,
}

/// One way the result can differ from exactly-once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Violation {
    /// A logical event with no output (and not dead-lettered for the horizon).
    MissingOutput,
    /// Extra output copies of a logical event (counted per extra copy).
    DuplicatedOutput,
    /// An output whose event id is not among the valid inputs, or that does not parse.
    UnexpectedOutput,
    /// An output whose content is neither its logical event's nor a known conflict's.
    ContentMismatch,
    /// Misrouted: a malformed input found in the output.
    BadInputInOutput,
    /// Misrouted: a conflicting input's content found in the output.
    ConflictInOutput,
    /// Misrouted: a valid event or duplicate delivery found in the DLQ without a horizon reason
    /// (a `total_overflow` for an event that does not overflow its entity's total is one).
    ValidEventInDlq,
    BadInputMissingFromDlq,
    ConflictMissingFromDlq,
    /// An event that would overflow its entity's running total, with no `total_overflow` dead
    /// letter.
    OverflowMissingFromDlq,
    /// Misrouted: an event that would overflow its entity's running total found in the output
    /// (applied with a saturated or wrapped total).
    OverflowInOutput,
    /// Dead-lettered, but with a reason other than the one the input deserves.
    WrongDlqReason,
    /// A DLQ record whose value is not the original input bytes.
    DlqNotOriginalBytes,
    /// Extra DLQ records for one input position (counted per extra copy).
    DuplicatedInDlq,
    /// A DLQ record whose source headers are missing or name no input record.
    UnexpectedDlqRecord,
    /// Entities whose running `entity_total` / `entity_count` are wrong.
    WrongEntityTotal,
    /// An entity's outputs out of its input order (counted per late output).
    OrderViolation,
    /// An event id judged again after its outcome was final: a second dead letter that judged
    /// it, or outputs and a judging dead letter, where no re-drive explains the later one
    /// (counted per extra outcome).
    TwoOutcomes,
    /// An output event with no row in the sink table.
    MissingRow,
    /// Extra rows for one event id, or extra state rows for one entity (counted per extra row).
    DuplicatedRow,
    /// A row for no output event: written from the output topic with an event id it does not
    /// carry, or a state row for an entity the output gives no version.
    UnexpectedRow,
    /// A row whose value or fingerprint is not its output event's, or a state row at the right
    /// version from another event.
    RowMismatch,
    /// An entity whose stored version is below the highest the output carries, or absent.
    StaleState,
    /// An entity whose stored version is above the highest the output carries.
    StateAhead,
    /// An output event with no provider effect.
    MissingEffect,
    /// Extra provider effects for one event (counted per extra effect).
    DuplicatedEffect,
    /// A provider effect under the operation prefix for no output event.
    UnexpectedEffect,
    /// A provider effect whose amount is not its event's value.
    EffectMismatch,
    /// A provider effect for an event the sink dead-lettered as not charged (`provider_rejected`,
    /// `beyond_dedup_horizon`): money moved that the sink says did not.
    RefusedButApplied,
    /// A committed domain row whose event is not on the input topic (the outbox lost it).
    DomainRowWithoutEvent,
    /// Extra records of one outbox event on the input topic (counted per extra copy).
    EventPublishedTwice,
    /// An event on the input topic with no committed domain row (a rolled-back change published).
    EventWithoutDomainRow,
}

impl Violation {
    /// The kinds every audit reports: the topics'.
    pub const TOPICS: [Violation; 18] = [
        Self::MissingOutput,
        Self::DuplicatedOutput,
        Self::UnexpectedOutput,
        Self::ContentMismatch,
        Self::BadInputInOutput,
        Self::ConflictInOutput,
        Self::ValidEventInDlq,
        Self::BadInputMissingFromDlq,
        Self::ConflictMissingFromDlq,
        Self::OverflowMissingFromDlq,
        Self::OverflowInOutput,
        Self::WrongDlqReason,
        Self::DlqNotOriginalBytes,
        Self::DuplicatedInDlq,
        Self::UnexpectedDlqRecord,
        Self::WrongEntityTotal,
        Self::OrderViolation,
        Self::TwoOutcomes,
    ];

    /// The kinds an audit with `--database-url` adds.
    pub const POSTGRES: [Violation; 6] = [
        Self::MissingRow,
        Self::DuplicatedRow,
        Self::UnexpectedRow,
        Self::RowMismatch,
        Self::StaleState,
        Self::StateAhead,
    ];

    /// The kinds an audit with `--provider-url` adds.
    pub const PROVIDER: [Violation; 5] = [
        Self::MissingEffect,
        Self::DuplicatedEffect,
        Self::UnexpectedEffect,
        Self::EffectMismatch,
        Self::RefusedButApplied,
    ];

    /// The kinds an audit with `--outbox-database-url` adds.
    pub const OUTBOX: [Violation; 3] = [
        Self::DomainRowWithoutEvent,
        Self::EventPublishedTwice,
        Self::EventWithoutDomainRow,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::MissingOutput => "missing_output",
            Self::DuplicatedOutput => "duplicated_output",
            Self::UnexpectedOutput => "unexpected_output",
            Self::ContentMismatch => "content_mismatch",
            Self::BadInputInOutput => "bad_input_in_output",
            Self::ConflictInOutput => "conflict_in_output",
            Self::ValidEventInDlq => "valid_event_in_dlq",
            Self::BadInputMissingFromDlq => "bad_input_missing_from_dlq",
            Self::ConflictMissingFromDlq => "conflict_missing_from_dlq",
            Self::OverflowMissingFromDlq => "overflow_missing_from_dlq",
            Self::OverflowInOutput => "overflow_in_output",
            Self::WrongDlqReason => "wrong_dlq_reason",
            Self::DlqNotOriginalBytes => "dlq_not_original_bytes",
            Self::DuplicatedInDlq => "duplicated_in_dlq",
            Self::UnexpectedDlqRecord => "unexpected_dlq_record",
            Self::WrongEntityTotal => "wrong_entity_total",
            Self::OrderViolation => "order_violation",
            Self::TwoOutcomes => "two_outcomes",
            Self::MissingRow => "missing_row",
            Self::DuplicatedRow => "duplicated_row",
            Self::UnexpectedRow => "unexpected_row",
            Self::RowMismatch => "row_mismatch",
            Self::StaleState => "stale_state",
            Self::StateAhead => "state_ahead",
            Self::MissingEffect => "missing_effect",
            Self::DuplicatedEffect => "duplicated_effect",
            Self::UnexpectedEffect => "unexpected_effect",
            Self::EffectMismatch => "effect_mismatch",
            Self::RefusedButApplied => "refused_but_applied",
            Self::DomainRowWithoutEvent => "domain_row_without_event",
            Self::EventPublishedTwice => "event_published_twice",
            Self::EventWithoutDomainRow => "event_without_domain_row",
        }
    }

    /// The line name in the report's table.
    pub fn description(self) -> &'static str {
        match self {
            Self::MissingOutput => "missing: logical events without output",
            Self::DuplicatedOutput => "duplicated: extra output copies",
            Self::UnexpectedOutput => "unexpected output records",
            Self::ContentMismatch => "content mismatch with first occurrence",
            Self::BadInputInOutput => "misrouted: malformed input in output",
            Self::ConflictInOutput => "misrouted: conflicting input in output",
            Self::ValidEventInDlq => "misrouted: valid event in DLQ",
            Self::BadInputMissingFromDlq => "malformed inputs missing from DLQ",
            Self::ConflictMissingFromDlq => "conflicts missing from DLQ",
            Self::OverflowMissingFromDlq => "total overflows missing from DLQ",
            Self::OverflowInOutput => "misrouted: total overflow in output",
            Self::WrongDlqReason => "DLQ records with the wrong reason",
            Self::DlqNotOriginalBytes => "DLQ records without the original bytes",
            Self::DuplicatedInDlq => "DLQ records repeated for one input",
            Self::UnexpectedDlqRecord => "DLQ records not traceable to an input",
            Self::WrongEntityTotal => "entities with wrong running totals",
            Self::OrderViolation => "per-entity order violations",
            Self::TwoOutcomes => "event ids with two outcomes (judged again)",
            Self::MissingRow => "missing: output events without a row",
            Self::DuplicatedRow => "duplicated: extra rows for one event or entity",
            Self::UnexpectedRow => "rows for no output event",
            Self::RowMismatch => "rows whose content differs from the output",
            Self::StaleState => "entity states behind the output's latest version",
            Self::StateAhead => "entity states ahead of the output's latest version",
            Self::MissingEffect => "missing: output events without a provider effect",
            Self::DuplicatedEffect => "duplicated: extra provider effects for one event",
            Self::UnexpectedEffect => "provider effects for no output event",
            Self::EffectMismatch => "provider effects whose amount differs from the value",
            Self::RefusedButApplied => "provider effects for events dead-lettered as not charged",
            Self::DomainRowWithoutEvent => "missing: committed domain rows without an event",
            Self::EventPublishedTwice => "duplicated: extra records of one outbox event",
            Self::EventWithoutDomainRow => "events without a committed domain row",
        }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Physical versus logical figures of the three topics.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Figures {
    pub input_records: u64,
    pub valid_input_records: u64,
    pub logical_events: u64,
    /// Later occurrences with the first one's fingerprint: expected to be dropped.
    pub duplicate_deliveries: u64,
    pub malformed_inputs: u64,
    pub malformed_by_reason: BTreeMap<DeadLetterReason, u64>,
    pub conflicts: u64,
    /// Occurrences dead-lettered as `beyond_dedup_horizon` where that is allowed.
    pub beyond_dedup_horizon: u64,
    /// Valid occurrences that would take their entity's running total past a signed 64-bit
    /// integer where the processor meets them: each must be a `total_overflow` dead letter.
    pub total_overflows: u64,
    pub dlq_records: u64,
    pub output_records: u64,
    /// Sum of `value` over every valid input record, re-deliveries and conflicts included.
    pub sum_valid_input_values: i128,
    /// Sum of `value` over the logical events.
    pub sum_logical_values: i128,
    /// Logical events that must be in the output (all but those dead-lettered for the horizon).
    pub expected_output_events: u64,
    pub expected_output_sum: i128,
    /// Sum of `value` over every output record that parses.
    pub output_sum: i128,
    pub entities: u64,
    /// Whether the output carries running totals, and so whether they were checked.
    pub totals_checked: bool,
    /// Input records with exactly one correct disposition.
    pub inputs_accounted: u64,
    /// Sink-table rows in scope (`--database-url`): written from the output topic or carrying one
    /// of its event ids. Absent from the report when PostgreSQL was not audited.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub postgres_rows: Option<u64>,
    /// Sum of `value` over those rows.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub postgres_sum: Option<i128>,
    /// State-table rows in scope: for an entity the output versions, or from one of its events.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub entity_states: Option<u64>,
    /// Provider effects whose key has the operation prefix (`--provider-url`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider_effects: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider_sum: Option<i128>,
    /// Attempts beyond the first over those effects: physical retries the idempotency key turned
    /// into no second effect.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider_retries_absorbed: Option<u64>,
    /// Output events the sink dead-lettered as not charged (the provider refused them for good,
    /// or dedup-service answered EXPIRED): they must have no effect. Read with `--database-url`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider_refused: Option<u64>,
    /// Output events the sink held (`sink_held_operations`, unresolved): their operation is
    /// UNKNOWN at dedup-service and cannot be settled from the provider, so they are neither
    /// expected to have an effect nor to have none. Read with `--database-url`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider_held: Option<u64>,
    /// Committed domain rows (`--outbox-domain-query`) that must each have one event.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outbox_domain_rows: Option<u64>,
    /// Distinct event ids among the input records that parse.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outbox_events: Option<u64>,
}

/// One line of the report: a figure the exactly-once result must have, and the one found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    pub name: String,
    pub expected: i128,
    pub actual: i128,
    pub passed: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ViolationDetail {
    pub count: u64,
    /// Event ids (or `topic/partition@offset` for records without one), at most the example limit.
    pub examples: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AuditReport {
    pub passed: bool,
    pub figures: Figures,
    pub checks: Vec<Check>,
    pub violations: BTreeMap<Violation, ViolationDetail>,
    pub notes: Vec<String>,
}

impl AuditReport {
    pub fn violation_count(&self, kind: Violation) -> u64 {
        self.violations.get(&kind).map_or(0, |detail| detail.count)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Malformed(DeadLetterReason),
    Defining,
    Duplicate,
    Conflict,
    /// Refused because it would overflow its entity's running total where it is processed.
    Overflow,
}

#[derive(Debug)]
struct ValidEvent {
    event_id: String,
    entity_id: String,
    value: i64,
    fingerprint: Fingerprint,
    /// `occurred_at`, else the record's Kafka timestamp: what the processor ages events by.
    event_time: Option<OffsetDateTime>,
}

#[derive(Debug)]
struct InputEntry<'a> {
    record: &'a SourceRecord,
    event: Option<ValidEvent>,
    role: Role,
    /// Which group (logical event) a valid input belongs to.
    group: usize,
    /// A malformed record whose id (and so fingerprint) the ledger's contract reads: the ledger
    /// judged and refused it, and the processor keeps that outcome for the id.
    refused_id: Option<(String, Fingerprint)>,
    /// The record's re-drive id (`eos-redrive-id`), when it is a re-drive.
    redrive: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Totals {
    Absent,
    Present { count: u64, total: i64 },
    Invalid,
}

#[derive(Debug)]
struct OutputEvent {
    event_id: String,
    entity_id: String,
    value: i64,
    version: Option<u64>,
    fingerprint: Fingerprint,
    totals: Totals,
    source: Option<(String, Position)>,
}

#[derive(Debug)]
struct Group {
    /// Indices into the input entries, in `(partition, offset)` order.
    occurrences: Vec<usize>,
    defining: usize,
    /// Output indices whose content is the logical event's.
    matching_outputs: Vec<usize>,
    /// Whether some output carries this event id with other content.
    other_outputs: bool,
    beyond_horizon: bool,
    /// The event was dead-lettered although valid: reported as misrouted, not also as missing.
    misrouted_to_dlq: bool,
    /// Its final outcome is a `total_overflow`: no output is expected.
    overflowed: bool,
    /// A record the ledger refused had its id first: that refusal is the event's outcome, every
    /// valid occurrence a conflict, and no output is expected.
    refused_before: bool,
}

pub(crate) struct Recorder {
    limit: usize,
    pub(crate) details: BTreeMap<Violation, ViolationDetail>,
}

impl Recorder {
    /// Starts every kind of `kinds` at 0, so the report lists the checks that passed too.
    pub(crate) fn new(limit: usize, kinds: &[Violation]) -> Self {
        Self {
            limit,
            details: kinds
                .iter()
                .copied()
                .map(|kind| (kind, ViolationDetail::default()))
                .collect(),
        }
    }

    pub(crate) fn add(&mut self, kind: Violation, count: u64, example: impl FnOnce() -> String) {
        let detail = self.details.entry(kind).or_default();
        detail.count += count;
        if detail.examples.len() < self.limit {
            detail.examples.push(example());
        }
    }

    pub(crate) fn count(&self, kind: Violation) -> u64 {
        self.details.get(&kind).map_or(0, |detail| detail.count)
    }
}

fn parse_input(
    record: &SourceRecord,
    max_record_bytes: usize,
) -> Result<ValidEvent, DeadLetterReason> {
    if record.decoding == Decoding::Undecodable {
        return Err(DeadLetterReason::UndecodableRecord);
    }
    let envelope = EventEnvelope::parse_with_limit(record.value_bytes(), max_record_bytes)
        .map_err(|error| error.reason())?;
    Ok(ValidEvent {
        fingerprint: content_fingerprint(record, &[]).unwrap_or_else(|| envelope.fingerprint()),
        event_id: envelope.event_id.to_string(),
        entity_id: envelope.entity_id.to_string(),
        value: envelope.value,
        event_time: envelope.occurred_at.or_else(|| {
            record.timestamp_ms.and_then(|ms| {
                OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000).ok()
            })
        }),
    })
}

/// The record's re-drive id: `None` for no re-drive, an error for a header that is no id.
fn redrive_of(record: &SourceRecord) -> Result<Option<String>, ()> {
    match record.last_header_str(REDRIVE_ID_HEADER) {
        Some(id) => check_redrive_id(id)
            .map(|()| Some(id.to_owned()))
            .map_err(|_| ()),
        None if record
            .headers
            .iter()
            .any(|(name, _)| name == REDRIVE_ID_HEADER) =>
        {
            Err(())
        }
        None => Ok(None),
    }
}

/// The id and fingerprint of a record the ledger's contract reads an id from (as the processor
/// does before the ledger judges it), or `None` when it cannot.
fn event_under_contract(
    record: &SourceRecord,
    config: &AuditConfig,
) -> Option<(String, Fingerprint)> {
    if record.decoding == Decoding::Undecodable {
        return None;
    }
    let headers: Vec<(&str, Option<&[u8]>)> = record
        .headers
        .iter()
        .map(|(name, value)| (name.as_str(), value.as_deref()))
        .collect();
    let contract = EventContract {
        max_record_bytes: config.max_record_bytes,
        ..EventContract::ledger()
    };
    let event = Event::parse(
        &contract,
        RecordParts {
            key: record.key.as_deref(),
            value: record.value.as_deref(),
            headers: &headers,
        },
    )
    .ok()?;
    Some((event.id.to_string(), event.fingerprint))
}

fn parse_output(record: &SourceRecord) -> Option<OutputEvent> {
    // Outputs are larger than their inputs by the added fields; the intake limit does not apply.
    let mut envelope = EventEnvelope::parse_with_limit(record.value_bytes(), usize::MAX).ok()?;
    let total = envelope.extra.remove(ENTITY_TOTAL_FIELD);
    let count = envelope.extra.remove(ENTITY_COUNT_FIELD);
    let source = envelope.extra.remove(SOURCE_FIELD);
    let totals = match (total, count) {
        (None, None) => Totals::Absent,
        (Some(total), Some(count)) => match (total.as_i64(), count.as_u64()) {
            (Some(total), Some(count)) => Totals::Present { count, total },
            _ => Totals::Invalid,
        },
        _ => Totals::Invalid,
    };
    Some(OutputEvent {
        fingerprint: content_fingerprint(record, &PROCESSOR_ADDED_FIELDS)
            .unwrap_or_else(|| envelope.fingerprint()),
        event_id: envelope.event_id.to_string(),
        entity_id: envelope.entity_id.to_string(),
        value: envelope.value,
        version: envelope.version,
        totals,
        source: source.as_ref().and_then(parse_source),
    })
}

/// The fingerprint of a registry record's decoded content, without `leave_out`, as the processor
/// and the sink take it (docs/schemas.md "Schema evolution"); `None` when the value is the
/// content.
fn content_fingerprint(record: &SourceRecord, leave_out: &[&str]) -> Option<Fingerprint> {
    let Decoding::Decoded {
        content: Some(content),
    } = &record.decoding
    else {
        return None;
    };
    let mut content: serde_json::Map<String, Value> = serde_json::from_slice(content).ok()?;
    Some(EventContract::ledger().fingerprint_leaving_out(&mut content, leave_out))
}

/// The event ids of the output records at `positions` (partition, offset).
pub fn output_event_ids_at(
    output: &[SourceRecord],
    positions: &BTreeSet<(i32, i64)>,
) -> BTreeSet<String> {
    output
        .iter()
        .filter(|record| positions.contains(&(record.partition, record.offset)))
        .filter_map(parse_output)
        .map(|event| event.event_id)
        .collect()
}

/// One logical event of the output topic: what each boundary downstream of it must hold once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputFacts {
    pub entity_id: String,
    pub value: i64,
    pub version: Option<u64>,
    /// The event's fingerprint without the processor's added fields: the one the sink stores.
    pub fingerprint: Fingerprint,
}

/// The output topic's logical set by event id: the first occurrence (by position) of every event
/// id that parses. The boundaries downstream are audited against the output, not the input, so a
/// processor mistake is reported once, by the topic checks, and not again at every boundary.
pub fn output_logical_set(output: &[SourceRecord]) -> BTreeMap<String, OutputFacts> {
    let mut set = BTreeMap::new();
    for output in sorted(output).into_iter().filter_map(parse_output) {
        set.entry(output.event_id).or_insert(OutputFacts {
            entity_id: output.entity_id,
            value: output.value,
            version: output.version,
            fingerprint: output.fingerprint,
        });
    }
    set
}

fn parse_source(source: &Value) -> Option<(String, Position)> {
    let topic = source.get("topic")?.as_str()?.to_owned();
    let partition = i32::try_from(source.get("partition")?.as_i64()?).ok()?;
    let offset = source.get("offset")?.as_i64()?;
    Some((topic, Position { partition, offset }))
}

/// The input position a DLQ record says it came from.
fn dlq_source(record: &SourceRecord) -> Option<(&str, Position)> {
    let topic = record.last_header_str(SOURCE_TOPIC_HEADER)?;
    let partition = record
        .last_header_str(SOURCE_PARTITION_HEADER)?
        .parse()
        .ok()?;
    let offset = record.last_header_str(SOURCE_OFFSET_HEADER)?.parse().ok()?;
    Some((topic, Position { partition, offset }))
}

fn sorted(records: &[SourceRecord]) -> Vec<&SourceRecord> {
    let mut sorted: Vec<&SourceRecord> = records.iter().collect();
    sorted.sort_by_key(|record| record.position());
    sorted
}

/// Runs every check. Never fails: what cannot be parsed is itself a finding.
///
/// The phases run in this order, and each records its violations in it (the examples of a kind
/// are the first found): classify the inputs into logical events, trace the dead letters to the
/// inputs they name, judge the inputs in processing order (the running totals, which events
/// overflow them, each id's final outcome), check each input's dead letters, match the outputs to
/// the logical events, check that no id has two outcomes, check the running totals and the
/// per-entity order, and sum up.
pub fn audit(input: &AuditInput<'_>, config: &AuditConfig) -> AuditReport {
    let outputs = ParsedOutputs::new(input.output);
    let mut inputs = classify_inputs(input, config, &outputs);
    let mut recorder = Recorder::new(config.example_limit, &Violation::TOPICS);
    let traced = trace_dead_letters(input, config, &inputs, &mut recorder);
    judge_in_order(&mut inputs, &traced.horizon_allowed);
    let mut findings = Findings {
        figures: input_figures(&inputs),
        recorder,
        unaccounted: vec![false; inputs.entries.len()],
    };
    let dead_lettered = attach_dead_letters(&traced, &mut inputs, &mut findings);
    let exactly_once = match_outputs(&mut inputs, &outputs, &mut findings);
    check_final_outcomes(input.input_topic, &inputs, &traced, &outputs, &mut findings);
    check_totals(&inputs, &outputs, &mut findings);
    check_order(
        &inputs.entries,
        &inputs.groups,
        &outputs.records,
        &outputs.events,
        &mut findings.recorder,
    );
    summarise(findings, exactly_once, dead_lettered)
}

/// The output records in position order, each with its parse (`None`: it does not parse).
struct ParsedOutputs<'a> {
    records: Vec<&'a SourceRecord>,
    events: Vec<Option<OutputEvent>>,
}

impl<'a> ParsedOutputs<'a> {
    fn new(output: &'a [SourceRecord]) -> Self {
        let records = sorted(output);
        let events = records.iter().map(|record| parse_output(record)).collect();
        Self { records, events }
    }
}

/// Every input record with its role, and the valid ones grouped into logical events.
struct ClassifiedInputs<'a> {
    entries: Vec<InputEntry<'a>>,
    groups: Vec<Group>,
    group_by_id: HashMap<String, usize>,
    position_index: HashMap<Position, usize>,
}

/// What the phases found so far.
struct Findings {
    figures: Figures,
    recorder: Recorder,
    /// Per input entry: it has not exactly one correct disposition.
    unaccounted: Vec<bool>,
}

/// Inputs the DLQ holds with the right reason.
struct DeadLettered {
    malformed: u64,
    conflicts: u64,
    overflows: u64,
}

/// The DLQ records traced to the inputs they name.
struct TracedDeadLetters<'a> {
    records: u64,
    /// Per input entry, in position order.
    by_input: Vec<Vec<&'a SourceRecord>>,
    /// Per input entry: older than the dedup horizon and dead-lettered as `beyond_dedup_horizon`,
    /// which the processor may do instead of deciding anything else about it.
    horizon_allowed: Vec<bool>,
}

/// Phase 1: parses each input record, groups the valid ones by event id and gives each its role:
/// malformed, the defining occurrence of its logical event, a duplicate delivery or a conflict.
fn classify_inputs<'a>(
    input: &AuditInput<'a>,
    config: &AuditConfig,
    outputs: &ParsedOutputs<'_>,
) -> ClassifiedInputs<'a> {
    let mut entries: Vec<InputEntry<'a>> = Vec::with_capacity(input.input.len());
    let mut groups: Vec<Group> = Vec::new();
    let mut group_by_id: HashMap<String, usize> = HashMap::new();
    for record in sorted(input.input) {
        let index = entries.len();
        let redrive = redrive_of(record);
        // A record the processor reads an id from, but with a re-drive id that is none, is
        // refused for that before its id is looked up (and not remembered).
        let (parsed, refused_id) = match (parse_input(record, config.max_record_bytes), &redrive) {
            (Ok(event), Ok(_)) => (Ok(event), None),
            (Ok(_), Err(())) => (Err(DeadLetterReason::InvalidField), None),
            (Err(reason), redrive) => match (event_under_contract(record, config), redrive) {
                (Some(_), Err(())) => (Err(DeadLetterReason::InvalidField), None),
                (judged, _) => (Err(reason), judged),
            },
        };
        let redrive = redrive.unwrap_or_default();
        match parsed {
            Err(reason) => entries.push(InputEntry {
                record,
                event: None,
                role: Role::Malformed(reason),
                group: usize::MAX,
                refused_id,
                redrive,
            }),
            Ok(event) => {
                let group = *group_by_id
                    .entry(event.event_id.clone())
                    .or_insert_with(|| {
                        groups.push(Group {
                            occurrences: Vec::new(),
                            defining: index,
                            matching_outputs: Vec::new(),
                            other_outputs: false,
                            beyond_horizon: false,
                            misrouted_to_dlq: false,
                            overflowed: false,
                            refused_before: false,
                        });
                        groups.len() - 1
                    });
                groups[group].occurrences.push(index);
                entries.push(InputEntry {
                    record,
                    event: Some(event),
                    role: Role::Defining,
                    group,
                    refused_id: None,
                    redrive,
                });
            }
        }
    }
    let position_index: HashMap<Position, usize> = entries
        .iter()
        .enumerate()
        .map(|(index, entry)| (entry.record.position(), index))
        .collect();

    let mut outputs_by_id: HashMap<&str, Vec<&OutputEvent>> = HashMap::new();
    for output in outputs.events.iter().flatten() {
        outputs_by_id
            .entry(output.event_id.as_str())
            .or_default()
            .push(output);
    }

    // Defining occurrence: the first, unless occurrences span partitions and the output names one.
    for group in &mut groups {
        let first = group.occurrences[0];
        group.defining = first;
        let first_partition = entries[first].record.partition;
        let spans_partitions = group
            .occurrences
            .iter()
            .any(|&index| entries[index].record.partition != first_partition);
        if !spans_partitions {
            continue;
        }
        let Some(event_id) = entries[first]
            .event
            .as_ref()
            .map(|event| event.event_id.as_str())
        else {
            continue;
        };
        let outputs = outputs_by_id.get(event_id).map_or(&[][..], Vec::as_slice);
        let claimed = outputs.iter().find_map(|output| {
            let (topic, position) = output.source.as_ref()?;
            if topic != input.input_topic {
                return None;
            }
            position_index
                .get(position)
                .copied()
                .filter(|index| group.occurrences.contains(index))
        });
        if let Some(claimed) = claimed {
            group.defining = claimed;
        }
    }
    for group in &groups {
        let defining_fingerprint = entries[group.defining]
            .event
            .as_ref()
            .map(|event| event.fingerprint);
        for &index in &group.occurrences {
            let same = entries[index].event.as_ref().map(|event| event.fingerprint)
                == defining_fingerprint;
            entries[index].role = match (index == group.defining, same) {
                (true, _) => Role::Defining,
                (false, true) => Role::Duplicate,
                (false, false) => Role::Conflict,
            };
        }
    }
    ClassifiedInputs {
        entries,
        groups,
        group_by_id,
        position_index,
    }
}

/// The input's figures: records, logical events, and what kind each record is.
fn input_figures(inputs: &ClassifiedInputs<'_>) -> Figures {
    let mut figures = Figures {
        input_records: inputs.entries.len() as u64,
        logical_events: inputs.groups.len() as u64,
        ..Figures::default()
    };
    for (index, entry) in inputs.entries.iter().enumerate() {
        match (entry.role, &entry.event) {
            (Role::Malformed(reason), _) => {
                figures.malformed_inputs += 1;
                *figures.malformed_by_reason.entry(reason).or_default() += 1;
            }
            (role, Some(event)) => {
                figures.valid_input_records += 1;
                figures.sum_valid_input_values += i128::from(event.value);
                let group = &inputs.groups[entry.group];
                if group.defining == index && !group.refused_before {
                    figures.sum_logical_values += i128::from(event.value);
                }
                match role {
                    Role::Duplicate => figures.duplicate_deliveries += 1,
                    Role::Conflict => figures.conflicts += 1,
                    Role::Overflow => figures.total_overflows += 1,
                    Role::Defining | Role::Malformed(_) => {}
                }
            }
            // A record the ledger refused, met again after its id's outcome was final.
            (Role::Duplicate, None) => figures.duplicate_deliveries += 1,
            (Role::Conflict, None) => figures.conflicts += 1,
            (_, None) => {}
        }
    }
    figures
}

/// Phase 2: traces each DLQ record to the input position its headers name, and tells which
/// inputs were dead-lettered for the dedup horizon where that is allowed.
fn trace_dead_letters<'a>(
    input: &AuditInput<'a>,
    config: &AuditConfig,
    inputs: &ClassifiedInputs<'_>,
    recorder: &mut Recorder,
) -> TracedDeadLetters<'a> {
    let horizon_cutoff = time::Duration::try_from(config.dedup_horizon)
        .ok()
        .and_then(|horizon| config.now.checked_sub(horizon));
    let beyond_horizon = |event: &ValidEvent| match (event.event_time, horizon_cutoff) {
        (Some(at), Some(cutoff)) => at < cutoff,
        _ => false,
    };

    let dlq = sorted(input.dlq);
    let mut by_input: Vec<Vec<&SourceRecord>> = vec![Vec::new(); inputs.entries.len()];
    for record in &dlq {
        let traced = dlq_source(record)
            .filter(|(topic, _)| *topic == input.input_topic)
            .and_then(|(_, position)| inputs.position_index.get(&position));
        match traced {
            Some(&index) => by_input[index].push(record),
            None => recorder.add(Violation::UnexpectedDlqRecord, 1, || record.locator()),
        }
    }
    let horizon_allowed = inputs
        .entries
        .iter()
        .zip(&by_input)
        .map(|(entry, copies)| {
            entry.event.as_ref().is_some_and(&beyond_horizon)
                && copies
                    .first()
                    .and_then(|copy| copy.last_header_str(REASON_HEADER))
                    == Some(DeadLetterReason::BeyondDedupHorizon.as_str())
        })
        .collect();
    TracedDeadLetters {
        records: dlq.len() as u64,
        by_input,
        horizon_allowed,
    }
}

/// Phase 3: judges the inputs in processing order, as the processor does (docs/TRANSFORMS.md
/// "An event's outcome is final"), replaying the running totals (docs/architecture/bad-input.md
/// "Bad input"). The first record of an id the processor judges decides its outcome: a valid
/// envelope is applied, or refused (`total_overflow`) when its value would take its entity's total
/// past a signed 64-bit integer (the total stays as it was); a record the ledger refuses although
/// its id is readable is refused. Every later record of the id is a duplicate (same content) or a
/// conflict (other content) of that record, whatever the outcome was — except a re-drive record
/// of a refused event with a re-drive id the event has not met, which is judged again and whose
/// outcome replaces the refusal. Occurrences dead-lettered for the dedup horizon are decided
/// before any of this, so they take no part; an occurrence before the defining one (in another
/// partition, which the output's source chose) keeps the role it has.
fn judge_in_order(inputs: &mut ClassifiedInputs<'_>, horizon_allowed: &[bool]) {
    /// What the processor compares a record of an id with: a valid envelope's fingerprint, or
    /// that of a record the ledger refused (never the same content as a valid envelope).
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Content {
        Envelope(Fingerprint),
        Refused(Fingerprint),
    }
    struct Outcome {
        content: Content,
        applied: bool,
        redrives: Vec<String>,
    }
    let mut outcomes: HashMap<&str, Outcome> = HashMap::new();
    let mut totals: HashMap<&str, i64> = HashMap::new();
    let mut roles: Vec<(usize, Role)> = Vec::new();
    let mut redefined = Vec::new();
    for (index, entry) in inputs.entries.iter().enumerate() {
        if horizon_allowed[index] {
            continue;
        }
        let (event_id, content) = match (&entry.event, &entry.refused_id) {
            (Some(event), _) => {
                let group = &inputs.groups[entry.group];
                if horizon_allowed[group.defining] || index < group.defining {
                    continue;
                }
                (
                    event.event_id.as_str(),
                    Content::Envelope(event.fingerprint),
                )
            }
            (None, Some((event_id, fingerprint))) => {
                (event_id.as_str(), Content::Refused(*fingerprint))
            }
            (None, None) => continue,
        };
        let redrive = entry.redrive.as_deref();
        if let Some(outcome) = outcomes.get(event_id) {
            if outcome.content != content {
                roles.push((index, Role::Conflict));
                continue;
            }
            let admitted = redrive.is_some_and(|id| {
                !outcome.applied && !outcome.redrives.iter().any(|seen| seen == id)
            });
            if !admitted {
                roles.push((index, Role::Duplicate));
                continue;
            }
        }
        let mut redrives = outcomes
            .remove(event_id)
            .map(|outcome| outcome.redrives)
            .unwrap_or_default();
        redrives.extend(redrive.map(str::to_owned));
        let applied = match (&entry.event, content) {
            (Some(event), Content::Envelope(_)) => {
                let total = totals.entry(event.entity_id.as_str()).or_default();
                match total.checked_add(event.value) {
                    Some(sum) => {
                        *total = sum;
                        if index != inputs.groups[entry.group].defining {
                            redefined.push((entry.group, index));
                        }
                        true
                    }
                    None => {
                        roles.push((index, Role::Overflow));
                        false
                    }
                }
            }
            // Refused by the ledger: its role is the malformed one it has.
            _ => false,
        };
        outcomes.insert(
            event_id,
            Outcome {
                content,
                applied,
                redrives,
            },
        );
    }
    let finals: HashMap<String, (Content, bool)> = outcomes
        .into_iter()
        .map(|(event_id, outcome)| (event_id.to_owned(), (outcome.content, outcome.applied)))
        .collect();
    for (index, role) in roles {
        inputs.entries[index].role = role;
    }
    for (group_index, defining) in redefined {
        let group = &mut inputs.groups[group_index];
        inputs.entries[group.defining].role = match inputs.entries[group.defining].role {
            Role::Defining => Role::Duplicate,
            role => role,
        };
        group.defining = defining;
        inputs.entries[defining].role = Role::Defining;
    }
    for group in &mut inputs.groups {
        let event_id = inputs.entries[group.defining]
            .event
            .as_ref()
            .map(|event| event.event_id.as_str())
            .unwrap_or_default();
        match finals.get(event_id) {
            Some((Content::Envelope(_), applied)) => group.overflowed = !applied,
            Some((Content::Refused(_), _)) => group.refused_before = true,
            None => {}
        }
    }
}

/// Phase 4: checks each input's dead letters against its role (malformed, conflicting and
/// overflowing inputs must be there once, with their reason and original bytes; valid events only
/// for the dedup horizon).
fn attach_dead_letters(
    traced: &TracedDeadLetters<'_>,
    inputs: &mut ClassifiedInputs<'_>,
    findings: &mut Findings,
) -> DeadLettered {
    let Findings {
        figures,
        recorder,
        unaccounted,
    } = findings;
    figures.dlq_records = traced.records;
    let dlq_by_input = &traced.by_input;

    let mut dead_lettered = DeadLettered {
        malformed: 0,
        conflicts: 0,
        overflows: 0,
    };
    let groups = &mut inputs.groups;
    for (index, entry) in inputs.entries.iter().enumerate() {
        let name = || example_name(entry);
        let copies = &dlq_by_input[index];
        if copies.len() > 1 {
            recorder.add(Violation::DuplicatedInDlq, copies.len() as u64 - 1, name);
            unaccounted[index] = true;
        }
        for copy in copies {
            // A dead letter too big for its producer holds a prefix with the original's size
            // and SHA-256 (eos_core::dead_letter::build); anything else must be the same bytes.
            let header = |name: &str| copy.last_header_str(name).map(str::as_bytes);
            if !dead_letter::stands_for(copy.value_bytes(), header, entry.record.value_bytes()) {
                recorder.add(Violation::DlqNotOriginalBytes, 1, name);
                unaccounted[index] = true;
            }
        }
        let reason = copies
            .first()
            .map(|copy| copy.last_header_str(REASON_HEADER).unwrap_or_default());
        let horizon_allowed = traced.horizon_allowed[index];
        if horizon_allowed {
            figures.beyond_dedup_horizon += 1;
        }
        match entry.role {
            Role::Malformed(expected) => match reason {
                None => {
                    recorder.add(Violation::BadInputMissingFromDlq, 1, name);
                    unaccounted[index] = true;
                }
                Some(reason) if reason != expected.as_str() => {
                    recorder.add(Violation::WrongDlqReason, 1, || {
                        format!("{} ({reason}, expected {expected})", name())
                    });
                    unaccounted[index] = true;
                }
                Some(_) => dead_lettered.malformed += 1,
            },
            Role::Conflict => match reason {
                None => {
                    recorder.add(Violation::ConflictMissingFromDlq, 1, name);
                    unaccounted[index] = true;
                }
                Some(_) if horizon_allowed => dead_lettered.conflicts += 1,
                Some(reason) if reason != DeadLetterReason::EventIdConflict.as_str() => {
                    recorder.add(Violation::WrongDlqReason, 1, || {
                        format!(
                            "{} ({reason}, expected {})",
                            name(),
                            DeadLetterReason::EventIdConflict
                        )
                    });
                    unaccounted[index] = true;
                }
                Some(_) => dead_lettered.conflicts += 1,
            },
            Role::Overflow => match reason {
                None => {
                    recorder.add(Violation::OverflowMissingFromDlq, 1, name);
                    unaccounted[index] = true;
                }
                Some(reason) if reason != DeadLetterReason::TotalOverflow.as_str() => {
                    recorder.add(Violation::WrongDlqReason, 1, || {
                        format!(
                            "{} ({reason}, expected {})",
                            name(),
                            DeadLetterReason::TotalOverflow
                        )
                    });
                    unaccounted[index] = true;
                }
                Some(_) => dead_lettered.overflows += 1,
            },
            Role::Duplicate | Role::Defining => match reason {
                None => {}
                Some(_) if horizon_allowed && entry.role == Role::Defining => {
                    groups[entry.group].beyond_horizon = true;
                }
                Some(_) if horizon_allowed => {}
                Some(reason) if reason == DeadLetterReason::TotalOverflow.as_str() => {
                    recorder.add(Violation::ValidEventInDlq, 1, || {
                        format!(
                            "{} (total_overflow, but its entity's total does not overflow there)",
                            name()
                        )
                    });
                    unaccounted[index] = true;
                    if entry.role == Role::Defining {
                        groups[entry.group].misrouted_to_dlq = true;
                    }
                }
                Some(_) => {
                    recorder.add(Violation::ValidEventInDlq, 1, name);
                    unaccounted[index] = true;
                    if entry.role == Role::Defining {
                        groups[entry.group].misrouted_to_dlq = true;
                    }
                }
            },
        }
    }
    dead_lettered
}

/// Phase 5: matches each output record to its logical event by id and content, then checks
/// that each logical event has exactly one output (none when dead-lettered for the horizon).
/// Returns the logical events output exactly once.
fn match_outputs(
    inputs: &mut ClassifiedInputs<'_>,
    outputs: &ParsedOutputs<'_>,
    findings: &mut Findings,
) -> u64 {
    let Findings {
        figures,
        recorder,
        unaccounted,
    } = findings;
    let entries = &inputs.entries;
    figures.output_records = outputs.records.len() as u64;
    let mut malformed_by_bytes: HashMap<&[u8], usize> = HashMap::new();
    for (index, entry) in entries.iter().enumerate() {
        if matches!(entry.role, Role::Malformed(_)) {
            malformed_by_bytes
                .entry(entry.record.value_bytes())
                .or_insert(index);
        }
    }
    for (output_index, (record, parsed)) in outputs.records.iter().zip(&outputs.events).enumerate()
    {
        let Some(output) = parsed else {
            match malformed_by_bytes.get(record.value_bytes()) {
                Some(&index) => {
                    recorder.add(Violation::BadInputInOutput, 1, || {
                        format!(
                            "{} (as {})",
                            example_name(&entries[index]),
                            record.locator()
                        )
                    });
                    unaccounted[index] = true;
                }
                None => recorder.add(Violation::UnexpectedOutput, 1, || record.locator()),
            }
            continue;
        };
        figures.output_sum += i128::from(output.value);
        let Some(&group_index) = inputs.group_by_id.get(&output.event_id) else {
            recorder.add(Violation::UnexpectedOutput, 1, || output.event_id.clone());
            continue;
        };
        let group = &mut inputs.groups[group_index];
        let defining_fingerprint = entries[group.defining]
            .event
            .as_ref()
            .map(|event| event.fingerprint);
        if Some(output.fingerprint) == defining_fingerprint {
            group.matching_outputs.push(output_index);
            continue;
        }
        group.other_outputs = true;
        let conflict = group.occurrences.iter().copied().find(|&index| {
            entries[index].role == Role::Conflict
                && entries[index].event.as_ref().map(|event| event.fingerprint)
                    == Some(output.fingerprint)
        });
        match conflict {
            Some(index) => {
                recorder.add(Violation::ConflictInOutput, 1, || output.event_id.clone());
                unaccounted[index] = true;
            }
            None => {
                recorder.add(Violation::ContentMismatch, 1, || output.event_id.clone());
                unaccounted[group.defining] = true;
            }
        }
    }

    let mut exactly_once = 0u64;
    for group in &inputs.groups {
        let defining = &entries[group.defining];
        let Some(event) = defining.event.as_ref() else {
            continue;
        };
        let copies = group.matching_outputs.len() as u64;
        if group.refused_before {
            if copies > 0 {
                // Its id was refused first: every valid record of it is a conflict.
                recorder.add(Violation::ConflictInOutput, copies, || {
                    event.event_id.clone()
                });
                unaccounted[group.defining] = true;
            }
            continue;
        }
        if group.overflowed {
            if copies > 0 {
                // Applied although its entity's total cannot hold it: a saturated or wrapped total.
                recorder.add(Violation::OverflowInOutput, copies, || {
                    event.event_id.clone()
                });
                unaccounted[group.defining] = true;
            }
            continue;
        }
        if group.beyond_horizon {
            if copies > 0 {
                // Dead-lettered for the horizon *and* applied: one of the two is wrong.
                recorder.add(Violation::ValidEventInDlq, 1, || event.event_id.clone());
                unaccounted[group.defining] = true;
            }
        } else {
            figures.expected_output_events += 1;
            figures.expected_output_sum += i128::from(event.value);
            if copies == 0 && !group.other_outputs && !group.misrouted_to_dlq {
                recorder.add(Violation::MissingOutput, 1, || event.event_id.clone());
                unaccounted[group.defining] = true;
            }
            if copies == 1 && !unaccounted[group.defining] {
                exactly_once += 1;
            }
        }
        if copies > 1 {
            recorder.add(Violation::DuplicatedOutput, copies - 1, || {
                event.event_id.clone()
            });
            unaccounted[group.defining] = true;
        }
    }
    exactly_once
}

/// Phase 6: an event's outcome is final. Per event id, its outcomes in input order: each dead
/// letter that judged a record of it (any reason but `event_id_conflict` and
/// `beyond_dedup_horizon`, which leave the event's outcome as it was), and its outputs (one
/// outcome per input record they were made from, by their `source`; last when they name none).
/// The first is the event's outcome; each later one is a violation unless a re-drive made it —
/// its record carries a re-drive id the event had not met, after a dead letter.
fn check_final_outcomes(
    input_topic: &str,
    inputs: &ClassifiedInputs<'_>,
    traced: &TracedDeadLetters<'_>,
    outputs: &ParsedOutputs<'_>,
    findings: &mut Findings,
) {
    /// Where an outcome came from: an input record, or an output naming none.
    const NO_SOURCE: usize = usize::MAX;
    let mut by_id: BTreeMap<&str, BTreeSet<(usize, bool)>> = BTreeMap::new();
    for (index, letters) in traced.by_input.iter().enumerate() {
        let entry = &inputs.entries[index];
        let event_id = match (&entry.event, &entry.refused_id) {
            (Some(event), _) => event.event_id.as_str(),
            (None, Some((event_id, _))) => event_id.as_str(),
            (None, None) => continue,
        };
        for letter in letters {
            let reason = letter.last_header_str(REASON_HEADER).unwrap_or_default();
            if reason == DeadLetterReason::EventIdConflict.as_str()
                || reason == DeadLetterReason::BeyondDedupHorizon.as_str()
            {
                continue;
            }
            by_id.entry(event_id).or_default().insert((index, true));
        }
    }
    for output in outputs.events.iter().flatten() {
        let source = output
            .source
            .as_ref()
            .filter(|(topic, _)| topic == input_topic)
            .and_then(|(_, position)| inputs.position_index.get(position))
            .copied()
            .unwrap_or(NO_SOURCE);
        by_id
            .entry(output.event_id.as_str())
            .or_default()
            .insert((source, false));
    }
    for (event_id, outcomes) in by_id {
        let mut redrives: Vec<&str> = Vec::new();
        let mut previous_dead_letter = None;
        for (index, dead_letter) in outcomes {
            if let Some(after_dead_letter) = previous_dead_letter {
                let redrive = inputs
                    .entries
                    .get(index)
                    .and_then(|entry| entry.redrive.as_deref());
                let admitted =
                    after_dead_letter && redrive.is_some_and(|id| !redrives.contains(&id));
                if admitted {
                    redrives.extend(redrive);
                } else {
                    findings
                        .recorder
                        .add(Violation::TwoOutcomes, 1, || event_id.to_owned());
                    if let Some(flag) = findings.unaccounted.get_mut(index) {
                        *flag = true;
                    }
                }
            }
            previous_dead_letter = Some(dead_letter);
        }
    }
}

/// Phase 7: the running per-entity totals, walked in output order, when the output carries
/// them.
fn check_totals(
    inputs: &ClassifiedInputs<'_>,
    outputs: &ParsedOutputs<'_>,
    findings: &mut Findings,
) {
    let figures = &mut findings.figures;
    figures.totals_checked = outputs
        .events
        .iter()
        .flatten()
        .any(|output| output.totals != Totals::Absent);
    let mut expected_totals: BTreeMap<&str, (u64, i128)> = BTreeMap::new();
    for group in inputs
        .groups
        .iter()
        .filter(|group| !group.beyond_horizon && !group.overflowed && !group.refused_before)
    {
        if let Some(event) = inputs.entries[group.defining].event.as_ref() {
            let slot = expected_totals.entry(&event.entity_id).or_default();
            slot.0 += 1;
            slot.1 += i128::from(event.value);
        }
    }
    figures.entities = expected_totals.len() as u64;
    if figures.totals_checked {
        check_entity_chains(&outputs.events, &expected_totals, &mut findings.recorder);
    }
}

/// The last phase: the report's lines, from the figures and the violations found.
fn summarise(findings: Findings, exactly_once: u64, dead_lettered: DeadLettered) -> AuditReport {
    let Findings {
        mut figures,
        recorder,
        unaccounted,
    } = findings;
    figures.inputs_accounted = unaccounted.iter().filter(|&&bad| !bad).count() as u64;

    let mut checks = vec![
        check(
            "logical events in output exactly once",
            figures.expected_output_events.into(),
            exactly_once.into(),
        ),
        check(
            "sum of output values (cents)",
            figures.expected_output_sum,
            figures.output_sum,
        ),
        check(
            "malformed inputs dead-lettered",
            figures.malformed_inputs.into(),
            dead_lettered.malformed.into(),
        ),
        check(
            "conflicts dead-lettered",
            figures.conflicts.into(),
            dead_lettered.conflicts.into(),
        ),
        check(
            "total overflows dead-lettered",
            figures.total_overflows.into(),
            dead_lettered.overflows.into(),
        ),
    ];
    let mut notes = Vec::new();
    for kind in Violation::TOPICS {
        if kind == Violation::WrongEntityTotal && !figures.totals_checked {
            notes.push(format!(
                "the output carries no `{ENTITY_TOTAL_FIELD}`/`{ENTITY_COUNT_FIELD}`; running totals were not checked"
            ));
            continue;
        }
        checks.push(check(kind.description(), 0, recorder.count(kind).into()));
    }
    checks.push(check(
        "inputs accounted for exactly once",
        figures.input_records.into(),
        figures.inputs_accounted.into(),
    ));
    AuditReport {
        passed: checks.iter().all(|check| check.passed),
        figures,
        checks,
        violations: recorder.details,
        notes,
    }
}

pub(crate) fn check(name: &str, expected: i128, actual: i128) -> Check {
    Check {
        name: name.to_owned(),
        expected,
        actual,
        passed: expected == actual,
    }
}

fn example_name(entry: &InputEntry<'_>) -> String {
    match &entry.event {
        Some(event) => format!("{} ({})", event.event_id, entry.record.locator()),
        None => entry.record.locator(),
    }
}

/// Each output carrying totals must continue its entity's chain from 0/0 by one event and its
/// value; the last must equal the entity's logical events. Counted once per entity.
fn check_entity_chains(
    outputs: &[Option<OutputEvent>],
    expected: &BTreeMap<&str, (u64, i128)>,
    recorder: &mut Recorder,
) {
    #[derive(Default)]
    struct Chain {
        count: u64,
        total: i128,
        broken: bool,
    }
    let mut chains: BTreeMap<&str, Chain> = BTreeMap::new();
    for output in outputs.iter().flatten() {
        let chain = chains.entry(&output.entity_id).or_default();
        let (count, total) = match output.totals {
            Totals::Absent => continue,
            Totals::Invalid => (u64::MAX, i128::MAX),
            Totals::Present { count, total } => (count, i128::from(total)),
        };
        let fits = Some(count) == chain.count.checked_add(1)
            && total == chain.total + i128::from(output.value);
        if !fits && !chain.broken {
            chain.broken = true;
            recorder.add(Violation::WrongEntityTotal, 1, || {
                format!(
                    "{} at {}: count {count} total {total} after {}/{}",
                    output.entity_id, output.event_id, chain.count, chain.total
                )
            });
        }
        // Continue from what the processor claims, so one slip is not reported for every later
        // output of the entity.
        chain.count = count;
        chain.total = total;
    }
    let entities: std::collections::BTreeSet<&str> =
        chains.keys().chain(expected.keys()).copied().collect();
    for entity in entities {
        let (count, total) = chains
            .get(entity)
            .map_or((0, 0), |chain| (chain.count, chain.total));
        let (expected_count, expected_total) = expected.get(entity).copied().unwrap_or_default();
        let broken = chains.get(entity).is_some_and(|chain| chain.broken);
        if !broken && (count, total) != (expected_count, expected_total) {
            recorder.add(Violation::WrongEntityTotal, 1, || {
                format!(
                    "{entity}: ends at count {count} total {total}, its events make {expected_count}/{expected_total}"
                )
            });
        }
    }
}

/// An entity's outputs must come in the order of its input records (within one input and one
/// output partition: across partitions Kafka defines no order).
fn check_order(
    entries: &[InputEntry<'_>],
    groups: &[Group],
    records: &[&SourceRecord],
    outputs: &[Option<OutputEvent>],
    recorder: &mut Recorder,
) {
    let mut first_copy: HashMap<usize, usize> = HashMap::new();
    for (group_index, group) in groups.iter().enumerate() {
        if let Some(&output_index) = group.matching_outputs.first() {
            first_copy.insert(output_index, group_index);
        }
    }
    let mut latest: HashMap<(&str, i32, i32), Position> = HashMap::new();
    for (output_index, (record, output)) in records.iter().zip(outputs).enumerate() {
        let (Some(output), Some(&group_index)) = (output, first_copy.get(&output_index)) else {
            continue;
        };
        let defining = entries[groups[group_index].defining].record.position();
        let key = (
            output.entity_id.as_str(),
            defining.partition,
            record.partition,
        );
        let latest = latest.entry(key).or_insert(defining);
        if defining < *latest {
            recorder.add(Violation::OrderViolation, 1, || output.event_id.clone());
        } else {
            *latest = defining;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use eos_runtime::trace_context::EVENT_ID_HEADER;
    use time::macros::datetime;

    use super::*;
    use crate::test_support::{
        DLQ, INPUT, InputLog, OUTPUT, Processed, envelope, output_value, record, reference_process,
        workload_input,
    };
    use crate::workload::{Workload, WorkloadSpec};

    fn config() -> AuditConfig {
        AuditConfig {
            now: datetime!(2026-03-01 00:00:00 UTC),
            dedup_horizon: Duration::from_secs(7 * 24 * 3600),
            max_record_bytes: eos_core::envelope::DEFAULT_MAX_RECORD_BYTES,
            example_limit: DEFAULT_EXAMPLE_LIMIT,
        }
    }

    fn run(input: &[SourceRecord], processed: &Processed) -> AuditReport {
        audit(
            &AuditInput {
                input_topic: INPUT,
                input,
                output: &processed.output,
                dlq: &processed.dlq,
            },
            &config(),
        )
    }

    /// Every kind of input in small: two entities, a retried payment, a malformed record and a
    /// reused id with another amount.
    fn scenario() -> Vec<SourceRecord> {
        let mut log = InputLog::default();
        log.push(0, &envelope("e-1", "a", 10_000))
            .push(0, &envelope("e-2", "a", 2_500))
            .push(0, &envelope("e-1", "a", 10_000)) // retry: a duplicate delivery
            .push(0, b"{\"event_id\":\"e-9\",") // truncated
            .push(0, &envelope("e-3", "a", -500))
            .push(1, &envelope("e-4", "b", 7_000))
            .push(1, &envelope("e-4", "b", 7_000)) // retry
            .push(1, &envelope("e-4", "b", 9_999)) // conflict
            .push(1, b"") // empty
            .push(1, &envelope("e-5", "b", 500));
        log.records
    }

    fn find_output(processed: &Processed, event_id: &str) -> usize {
        processed
            .output
            .iter()
            .position(|r| {
                EventEnvelope::parse(r.value_bytes()).is_ok_and(|e| e.event_id.as_str() == event_id)
            })
            .expect("event in output")
    }

    fn failing_checks(report: &AuditReport) -> Vec<&str> {
        report
            .checks
            .iter()
            .filter(|check| !check.passed)
            .map(|check| check.name.as_str())
            .collect()
    }

    /// Asserts the report fails and that `kind` is among the reasons, with an example.
    fn assert_violation(report: &AuditReport, kind: Violation, count: u64) {
        assert!(!report.passed, "{kind} should fail the audit");
        assert_eq!(
            report.violation_count(kind),
            count,
            "{kind}: {:?}",
            report.violations
        );
        assert!(
            report
                .violations
                .get(&kind)
                .is_some_and(|detail| !detail.examples.is_empty())
        );
        assert!(
            report
                .checks
                .iter()
                .any(|check| check.name == kind.description() && !check.passed),
            "{kind} has a failing line: {:?}",
            failing_checks(report)
        );
    }

    #[test]
    fn exact_result_passes_with_duplicates_dropped_and_bad_input_dead_lettered() {
        let input = scenario();
        let processed = reference_process(&input);
        let report = run(&input, &processed);
        assert!(report.passed, "{:?}", failing_checks(&report));
        let figures = &report.figures;
        assert_eq!(figures.input_records, 10);
        assert_eq!(figures.valid_input_records, 8);
        assert_eq!(figures.logical_events, 5);
        assert_eq!(figures.duplicate_deliveries, 2);
        assert_eq!(figures.malformed_inputs, 2);
        assert_eq!(
            figures.malformed_by_reason,
            BTreeMap::from([
                (DeadLetterReason::MalformedJson, 1),
                (DeadLetterReason::EmptyRecord, 1)
            ])
        );
        assert_eq!(figures.conflicts, 1);
        assert_eq!(figures.dlq_records, 3);
        assert_eq!(figures.output_records, 5);
        // Over all attempts versus over unique events: the gap is the double count avoided.
        assert_eq!(
            figures.sum_valid_input_values,
            10_000 + 2_500 + 10_000 - 500 + 7_000 + 7_000 + 9_999 + 500
        );
        assert_eq!(
            figures.sum_logical_values,
            10_000 + 2_500 - 500 + 7_000 + 500
        );
        assert_eq!(figures.output_sum, figures.sum_logical_values);
        assert!(figures.totals_checked);
        assert_eq!(figures.inputs_accounted, 10);
        assert!(report.violations.values().all(|detail| detail.count == 0));
    }

    #[test]
    fn generated_workload_through_a_correct_processor_passes()
    -> Result<(), Box<dyn std::error::Error>> {
        let spec = WorkloadSpec {
            seed: 42,
            count: 3000,
            entities: 25,
            duplicate_ratio: 0.1,
            bad_ratio: 0.03,
            conflict_ratio: 0.02,
            value_bytes: 120,
            occurred_at_base: datetime!(2026-02-27 00:00:00 UTC),
        };
        let input = workload_input(Workload::new(spec.clone())?, 3);
        let processed = reference_process(&input);
        let report = run(&input, &processed);
        assert!(report.passed, "{:?}", failing_checks(&report));
        let figures = &report.figures;
        assert_eq!(figures.logical_events, spec.count);
        assert_eq!(figures.duplicate_deliveries, spec.duplicates());
        assert_eq!(figures.malformed_inputs, spec.malformed());
        assert_eq!(figures.conflicts, spec.conflicts());
        assert_eq!(figures.input_records, spec.physical_records());
        assert_eq!(figures.output_records, spec.count);
        Ok(())
    }

    #[test]
    fn nothing_processed_reports_everything_missing() {
        let input = scenario();
        let report = run(&input, &Processed::default());
        assert_violation(&report, Violation::MissingOutput, 5);
        assert_violation(&report, Violation::BadInputMissingFromDlq, 2);
        assert_violation(&report, Violation::ConflictMissingFromDlq, 1);
        // No output carries totals, so there are none to check.
        assert!(!report.figures.totals_checked);
        // Duplicate deliveries are the only inputs correctly accounted for.
        assert_eq!(report.figures.inputs_accounted, 2);
    }

    #[test]
    fn missing_event_is_reported() {
        let input = scenario();
        let mut processed = reference_process(&input);
        let index = find_output(&processed, "e-5");
        processed.output.remove(index);
        let report = run(&input, &processed);
        assert_violation(&report, Violation::MissingOutput, 1);
        assert_eq!(
            report.violations[&Violation::MissingOutput].examples,
            vec!["e-5".to_owned()]
        );
        // The entity's last total no longer includes it either.
        assert_violation(&report, Violation::WrongEntityTotal, 1);
    }

    #[test]
    fn duplicated_output_is_reported() {
        let input = scenario();
        let mut processed = reference_process(&input);
        let copy = processed.output[find_output(&processed, "e-2")].clone();
        processed.push_output(copy.partition, copy.value.unwrap_or_default());
        let report = run(&input, &processed);
        assert_violation(&report, Violation::DuplicatedOutput, 1);
        assert_eq!(
            report.violations[&Violation::DuplicatedOutput].examples,
            vec!["e-2".to_owned()]
        );
    }

    #[test]
    fn unexpected_outputs_are_reported() {
        let input = scenario();
        let mut processed = reference_process(&input);
        processed.push_output(0, envelope("e-never-sent", "a", 1));
        processed.push_output(0, b"not an envelope".to_vec());
        let report = run(&input, &processed);
        assert_violation(&report, Violation::UnexpectedOutput, 2);
        assert_eq!(
            report.violations[&Violation::UnexpectedOutput].examples[0],
            "e-never-sent"
        );
    }

    #[test]
    fn malformed_input_in_output_is_misrouted() {
        let input = scenario();
        let mut processed = reference_process(&input);
        processed.push_output(0, b"{\"event_id\":\"e-9\",".to_vec());
        let report = run(&input, &processed);
        assert_violation(&report, Violation::BadInputInOutput, 1);
        assert_eq!(report.violation_count(Violation::UnexpectedOutput), 0);
    }

    #[test]
    fn valid_event_in_dlq_is_misrouted() {
        let input = scenario();
        let mut processed = reference_process(&input);
        // e-3 is dead-lettered as if malformed, though it is also in the output.
        let source = input[4].clone();
        processed.dlq_record(&source, DeadLetterReason::MalformedJson);
        let report = run(&input, &processed);
        assert_violation(&report, Violation::ValidEventInDlq, 1);
        assert_eq!(report.violation_count(Violation::MissingOutput), 0);
    }

    #[test]
    fn valid_event_only_in_dlq_is_misrouted_not_also_missing() {
        let input = scenario();
        let mut processed = reference_process(&input);
        processed.output.remove(find_output(&processed, "e-3"));
        processed.dlq_record(&input[4], DeadLetterReason::InvalidField);
        let report = run(&input, &processed);
        assert_violation(&report, Violation::ValidEventInDlq, 1);
        assert_eq!(report.violation_count(Violation::MissingOutput), 0);
        assert!(!report.passed);
    }

    #[test]
    fn dead_lettered_duplicate_delivery_is_misrouted() {
        let input = scenario();
        let mut processed = reference_process(&input);
        processed.dlq_record(&input[2], DeadLetterReason::EventIdConflict);
        let report = run(&input, &processed);
        assert_violation(&report, Violation::ValidEventInDlq, 1);
    }

    #[test]
    fn conflict_not_in_dlq_is_reported() {
        let input = scenario();
        let mut processed = reference_process(&input);
        processed
            .dlq
            .retain(|r| r.header_str(REASON_HEADER) != Some("event_id_conflict"));
        let report = run(&input, &processed);
        assert_violation(&report, Violation::ConflictMissingFromDlq, 1);
        assert_eq!(
            report.violations[&Violation::ConflictMissingFromDlq].examples,
            vec![format!("e-4 ({INPUT}/1@2)")]
        );
    }

    #[test]
    fn conflict_in_output_instead_of_first_occurrence_is_misrouted() {
        let input = scenario();
        let mut processed = reference_process(&input);
        let index = find_output(&processed, "e-4");
        let conflict = EventEnvelope::parse(input[7].value_bytes()).expect("conflict parses");
        processed.output[index].value = Some(output_value(&conflict, &input[7], 1, 9_999));
        let report = run(&input, &processed);
        assert_violation(&report, Violation::ConflictInOutput, 1);
        assert_eq!(report.violation_count(Violation::MissingOutput), 0);
    }

    #[test]
    fn changed_content_is_a_mismatch() {
        let input = scenario();
        let mut processed = reference_process(&input);
        let index = find_output(&processed, "e-2");
        let changed = EventEnvelope::parse(&envelope("e-2", "a", 2_501)).expect("parses");
        processed.output[index].value = Some(output_value(&changed, &input[1], 2, 12_501));
        let report = run(&input, &processed);
        assert_violation(&report, Violation::ContentMismatch, 1);
    }

    #[test]
    fn malformed_input_missing_from_dlq_or_with_wrong_reason() {
        let input = scenario();
        let mut processed = reference_process(&input);
        processed
            .dlq
            .retain(|r| r.header_str(REASON_HEADER) != Some("empty_record"));
        for dead in &mut processed.dlq {
            if dead.header_str(REASON_HEADER) == Some("malformed_json") {
                dead.headers[0].1 = Some(b"invalid_field".to_vec());
            }
        }
        let report = run(&input, &processed);
        assert_violation(&report, Violation::BadInputMissingFromDlq, 1);
        assert_violation(&report, Violation::WrongDlqReason, 1);
        assert_eq!(
            report.violations[&Violation::WrongDlqReason].examples,
            vec![format!(
                "{INPUT}/0@3 (invalid_field, expected malformed_json)"
            )]
        );
    }

    /// A run in a registry format, decoded before it is counted: a record that did not decode is
    /// the processor's `undecodable_record`, and a decoded record's fingerprint is its content's.
    #[test]
    fn registry_records_are_judged_as_the_processor_decoded_them() {
        let mut input = scenario();
        // Not JSON either: read as it is, the audit would expect invalid_utf8.
        let mut undecodable = record(INPUT, 1, 10, &[0, 0, 0, 0, 9, 0xff]);
        undecodable.decoding = Decoding::Undecodable;
        input.push(undecodable);
        let mut processed = reference_process(&input);
        let report = run(&input, &processed);
        assert_violation(&report, Violation::WrongDlqReason, 1);
        assert_eq!(
            report.violations[&Violation::WrongDlqReason].examples,
            vec![format!(
                "{INPUT}/1@10 (invalid_utf8, expected undecodable_record)"
            )]
        );
        for dead in &mut processed.dlq {
            if dead.header_str(SOURCE_OFFSET_HEADER) == Some("10") {
                dead.headers[0].1 = Some(b"undecodable_record".to_vec());
            }
        }
        let report = run(&input, &processed);
        assert!(report.passed, "{:?}", failing_checks(&report));
        assert_eq!(
            report.figures.malformed_by_reason[&DeadLetterReason::UndecodableRecord],
            1
        );

        // e-5 decoded from a record whose content (its fields not at their default, here its
        // entity) is less than its value: the fingerprint is the content's, so an output read
        // as it is differs, and one whose content is the same (the added fields left out)
        // matches.
        let content = serde_json::to_vec(&serde_json::json!({"value": 500})).ok();
        let e5 = find_output(&processed, "e-5");
        for record in input.iter_mut().filter(|record| {
            EventEnvelope::parse(record.value_bytes()).is_ok_and(|e| e.event_id.as_str() == "e-5")
        }) {
            record.decoding = Decoding::Decoded {
                content: content.clone(),
            };
        }
        let report = run(&input, &processed);
        assert_violation(&report, Violation::ContentMismatch, 1);
        let mut output_content: serde_json::Map<String, Value> =
            serde_json::from_slice(processed.output[e5].value_bytes()).unwrap_or_default();
        output_content.remove("event_id");
        output_content.remove("entity_id");
        processed.output[e5].decoding = Decoding::Decoded {
            content: serde_json::to_vec(&output_content).ok(),
        };
        let report = run(&input, &processed);
        assert!(report.passed, "{:?}", failing_checks(&report));
    }

    #[test]
    fn dlq_records_must_be_traceable_unique_and_original() {
        let input = scenario();
        let mut processed = reference_process(&input);
        let truncated = input[3].clone();
        processed.dlq_record(&truncated, DeadLetterReason::MalformedJson);
        processed.dlq.push(record(DLQ, 0, 99, b"no headers"));
        processed.dlq_record(&input[8], DeadLetterReason::EmptyRecord);
        let last = processed.dlq.len() - 1;
        processed.dlq[last].value = Some(b"rewritten".to_vec());
        let report = run(&input, &processed);
        assert_violation(&report, Violation::DuplicatedInDlq, 2);
        assert_violation(&report, Violation::UnexpectedDlqRecord, 1);
        assert_violation(&report, Violation::DlqNotOriginalBytes, 1);
    }

    #[test]
    fn wrong_running_total_is_reported() {
        let input = scenario();
        let mut processed = reference_process(&input);
        let index = find_output(&processed, "e-2");
        let event = EventEnvelope::parse(input[1].value_bytes()).expect("parses");
        // Count right, total off by one cent.
        processed.output[index].value = Some(output_value(&event, &input[1], 2, 12_501));
        let report = run(&input, &processed);
        assert_violation(&report, Violation::WrongEntityTotal, 1);
        assert!(
            report.violations[&Violation::WrongEntityTotal].examples[0].starts_with("a at e-2")
        );
        // Content is still the event's: only the totals are wrong.
        assert_eq!(report.violation_count(Violation::ContentMismatch), 0);
    }

    #[test]
    fn totals_are_not_checked_when_the_output_has_none() {
        let input = scenario();
        let mut processed = reference_process(&input);
        for output in &mut processed.output {
            let mut event = EventEnvelope::parse(output.value_bytes()).expect("parses");
            for field in PROCESSOR_ADDED_FIELDS {
                event.extra.remove(field);
            }
            output.value = Some(event.to_bytes());
        }
        let report = run(&input, &processed);
        assert!(report.passed, "{:?}", failing_checks(&report));
        assert!(!report.figures.totals_checked);
        assert_eq!(report.notes.len(), 1);
    }

    #[test]
    fn order_violation_is_reported() {
        let input = scenario();
        let mut processed = reference_process(&input);
        // e-1 and e-2 of entity `a` come out swapped, with totals that add up in that order.
        let first = find_output(&processed, "e-1");
        let second = find_output(&processed, "e-2");
        let e1 = EventEnvelope::parse(input[0].value_bytes()).expect("parses");
        let e2 = EventEnvelope::parse(input[1].value_bytes()).expect("parses");
        processed.output[first].value = Some(output_value(&e2, &input[1], 1, 2_500));
        processed.output[second].value = Some(output_value(&e1, &input[0], 2, 12_500));
        let report = run(&input, &processed);
        assert_violation(&report, Violation::OrderViolation, 1);
        assert_eq!(
            report.violations[&Violation::OrderViolation].examples,
            vec!["e-1".to_owned()]
        );
        assert_eq!(report.violation_count(Violation::WrongEntityTotal), 0);
    }

    #[test]
    fn old_events_may_be_dead_lettered_for_the_horizon() {
        let old = json_event("e-old", "a", 100, "2026-01-01T00:00:00Z");
        let recent = json_event("e-new", "a", 200, "2026-02-28T00:00:00Z");
        let mut log = InputLog::default();
        log.push(0, &old).push(0, &recent).push(0, &old);
        let input = log.records;
        let mut processed = Processed::default();
        processed.dlq_record(&input[0], DeadLetterReason::BeyondDedupHorizon);
        processed.dlq_record(&input[2], DeadLetterReason::BeyondDedupHorizon);
        let event = EventEnvelope::parse(&recent).expect("parses");
        processed.push_output(0, output_value(&event, &input[1], 1, 200));
        let report = run(&input, &processed);
        assert!(report.passed, "{:?}", failing_checks(&report));
        assert_eq!(report.figures.beyond_dedup_horizon, 2);
        assert_eq!(report.figures.expected_output_events, 1);

        // A recent event is no candidate for the horizon.
        let mut wrong = processed.clone();
        wrong.dlq_record(&input[1], DeadLetterReason::BeyondDedupHorizon);
        let report = run(&input, &wrong);
        assert_violation(&report, Violation::ValidEventInDlq, 1);
    }

    #[test]
    fn without_occurred_at_the_record_timestamp_ages_the_event() {
        let mut log = InputLog::default();
        log.push(0, &envelope("e-untimed", "a", 5));
        let mut input = log.records;
        let mut processed = Processed::default();
        processed.dlq_record(&input[0], DeadLetterReason::BeyondDedupHorizon);
        // No time at all: nothing says it is old.
        assert_violation(&run(&input, &processed), Violation::ValidEventInDlq, 1);
        // A record timestamp of 2026-01-01, two months before the audit.
        input[0].timestamp_ms = Some(1_767_225_600_000);
        let report = run(&input, &processed);
        assert!(report.passed, "{:?}", failing_checks(&report));
        assert_eq!(report.figures.beyond_dedup_horizon, 1);
    }

    #[test]
    fn occurrences_across_partitions_follow_the_outputs_source() {
        // The same id under two keys: whichever the processor saw first defines the event.
        let mut log = InputLog::default();
        log.push(0, &envelope("e-x", "a", 1))
            .push(1, &envelope("e-x", "b", 2));
        let input = log.records;
        let mut processed = Processed::default();
        let second = EventEnvelope::parse(input[1].value_bytes()).expect("parses");
        processed.push_output(1, output_value(&second, &input[1], 1, 2));
        processed.dlq_record(&input[0], DeadLetterReason::EventIdConflict);
        let report = run(&input, &processed);
        assert!(report.passed, "{:?}", failing_checks(&report));
        assert_eq!(report.figures.sum_logical_values, 2);

        // Without a source the first by (partition, offset) defines it, and `b`'s is the conflict.
        let mut no_source = Processed::default();
        no_source.push_output(1, envelope("e-x", "b", 2));
        no_source.dlq_record(&input[0], DeadLetterReason::EventIdConflict);
        let report = run(&input, &no_source);
        assert_violation(&report, Violation::ConflictInOutput, 1);
    }

    #[test]
    fn examples_are_capped() {
        let mut log = InputLog::default();
        for n in 0..50 {
            log.push(0, &envelope(&format!("e-{n}"), "a", 1));
        }
        let report = run(&log.records, &Processed::default());
        let missing = &report.violations[&Violation::MissingOutput];
        assert_eq!(missing.count, 50);
        assert_eq!(missing.examples.len(), DEFAULT_EXAMPLE_LIMIT);
    }

    #[test]
    fn headers_do_not_change_the_logical_event() {
        // The event_id header is for tracing; the audit keys on the value's event_id.
        let mut input = scenario();
        input[0]
            .headers
            .push((EVENT_ID_HEADER.to_owned(), Some(b"something-else".to_vec())));
        let processed = reference_process(&input);
        assert!(run(&input, &processed).passed);
        let _ = OUTPUT;
    }

    /// Running totals near the edges of i64: `big` overflows, comes down with a refund (after
    /// which the refused event's re-deliveries would fit, but are duplicates: its outcome is
    /// final), and overflows again; `neg` overflows downwards; `small` never.
    fn overflow_scenario() -> Vec<SourceRecord> {
        let mut log = InputLog::default();
        log.push(0, &envelope("e-a", "big", i64::MAX - 10))
            .push(0, &envelope("e-b", "big", 100)) // overflows: total_overflow
            .push(0, &envelope("e-c", "big", -200))
            .push(0, &envelope("e-b", "big", 100)) // would fit now: a duplicate all the same
            .push(0, &envelope("e-b", "big", 100)) // and again
            .push(0, &envelope("e-d", "big", 500)) // overflows
            .push(0, &envelope("e-s", "small", 1))
            .push(1, &envelope("e-n1", "neg", i64::MIN + 5))
            .push(1, &envelope("e-n2", "neg", -10)); // overflows downwards
        log.records
    }

    #[test]
    fn total_overflows_dead_lettered_where_they_overflow_pass() {
        let input = overflow_scenario();
        let processed = reference_process(&input);
        let reasons: Vec<_> = processed
            .dlq
            .iter()
            .map(|dead| {
                dead.header_str(REASON_HEADER)
                    .unwrap_or_default()
                    .to_owned()
            })
            .collect();
        assert_eq!(reasons, vec!["total_overflow"; 3]);
        let report = run(&input, &processed);
        assert!(report.passed, "{:?}", failing_checks(&report));
        let figures = &report.figures;
        assert_eq!(figures.total_overflows, 3);
        assert_eq!(figures.logical_events, 7);
        assert_eq!(figures.expected_output_events, 4);
        assert_eq!(figures.duplicate_deliveries, 2);
        assert_eq!(figures.output_records, 4);
        assert_eq!(figures.malformed_inputs, 0);
        assert!(figures.totals_checked);
        assert_eq!(figures.inputs_accounted, 9);
        assert!(
            report
                .checks
                .iter()
                .any(|check| check.name == "total overflows dead-lettered" && check.actual == 3)
        );
    }

    #[test]
    fn a_total_overflow_for_an_event_that_fits_is_misrouted() {
        let input = overflow_scenario();
        let mut processed = reference_process(&input);
        // e-s (1 cent on an empty total) dead-lettered as an overflow instead of applied.
        processed.output.remove(find_output(&processed, "e-s"));
        processed.dlq_record(&input[6], DeadLetterReason::TotalOverflow);
        let report = run(&input, &processed);
        assert_violation(&report, Violation::ValidEventInDlq, 1);
        assert!(
            report.violations[&Violation::ValidEventInDlq].examples[0]
                .contains("does not overflow"),
            "{:?}",
            report.violations
        );
        assert_eq!(report.violation_count(Violation::MissingOutput), 0);

        // A processor that forgot the refused e-b (as eos-processor did before an event's
        // outcome was final) applies its re-delivery, which fits by then: e-b has two outcomes,
        // the refusal and an output.
        let mut processed = reference_process(&input);
        let e_b = EventEnvelope::parse(input[3].value_bytes()).expect("parses");
        processed.push_output(0, output_value(&e_b, &input[3], 3, i64::MAX - 110));
        let report = run(&input, &processed);
        assert_violation(&report, Violation::TwoOutcomes, 1);
        assert_eq!(
            report.violations[&Violation::TwoOutcomes].examples,
            vec!["e-b".to_owned()]
        );
        assert_violation(&report, Violation::OverflowInOutput, 1);
    }

    /// A record the ledger refuses although its id is readable (a `value` of the wrong type) is
    /// that id's final outcome: its re-delivery is a duplicate, and a valid envelope with the id
    /// afterwards a conflict. A processor that judged them again refuses twice and applies the
    /// envelope: two outcomes.
    #[test]
    fn a_refused_record_with_a_readable_id_is_that_ids_outcome() {
        let refused = br#"{"event_id":"e-m","entity_id":"a","value":"12"}"#;
        let mut log = InputLog::default();
        log.push(0, refused)
            .push(0, refused)
            .push(0, &envelope("e-m", "a", 12))
            .push(0, &envelope("e-n", "a", 1));
        let input = log.records;
        let processed = reference_process(&input);
        let reasons: Vec<_> = processed
            .dlq
            .iter()
            .map(|dead| dead.header_str(REASON_HEADER).unwrap_or_default())
            .collect();
        assert_eq!(reasons, ["invalid_field", "event_id_conflict"]);
        let report = run(&input, &processed);
        assert!(report.passed, "{:?}", failing_checks(&report));
        let figures = &report.figures;
        assert_eq!(
            (
                figures.malformed_inputs,
                figures.duplicate_deliveries,
                figures.conflicts
            ),
            (1, 1, 1)
        );
        assert_eq!(figures.expected_output_events, 1);
        assert_eq!(figures.inputs_accounted, 4);

        let mut judged_again = Processed::default();
        judged_again.dlq_record(&input[0], DeadLetterReason::InvalidField);
        judged_again.dlq_record(&input[1], DeadLetterReason::InvalidField);
        let e_m = EventEnvelope::parse(input[2].value_bytes()).expect("parses");
        judged_again.push_output(0, output_value(&e_m, &input[2], 1, 12));
        let e_n = EventEnvelope::parse(input[3].value_bytes()).expect("parses");
        judged_again.push_output(0, output_value(&e_n, &input[3], 2, 13));
        let report = run(&input, &judged_again);
        assert_violation(&report, Violation::TwoOutcomes, 2);
        assert_violation(&report, Violation::ConflictInOutput, 1);
    }

    /// The limit raised, an operator re-drives the overflowed e-b (a record with
    /// `eos-redrive-id`): its output replaces the refusal, once — the same re-drive delivered
    /// again and another re-drive of the applied event are duplicates. An output for a re-drive
    /// id used before is a second outcome.
    #[test]
    fn a_redrive_replaces_a_refusal_once() {
        let redriven = |id: &str| {
            let mut record = record(INPUT, 0, 0, &envelope("e-b", "big", 100));
            record.headers = vec![(REDRIVE_ID_HEADER.to_owned(), Some(id.as_bytes().to_vec()))];
            record
        };
        let mut log = InputLog::default();
        log.push(0, &envelope("e-a", "big", i64::MAX - 10))
            .push(0, &envelope("e-b", "big", 100)) // overflows
            .push(0, &envelope("e-c", "big", -200))
            .push(0, &envelope("e-b", "big", 100)) // a plain re-delivery: a duplicate
            .push(0, b"") // placeholders for the re-drives, below
            .push(0, b"")
            .push(0, b"");
        let mut input = log.records;
        for (offset, id) in [(4, "rd-1"), (5, "rd-1"), (6, "rd-2")] {
            input[offset] = SourceRecord {
                offset: offset as i64,
                ..redriven(id)
            };
        }
        let processed = reference_process(&input);
        assert_eq!(processed.dlq.len(), 1, "only the first overflow");
        assert_eq!(processed.output.len(), 3, "e-a, e-c and the re-driven e-b");
        let report = run(&input, &processed);
        assert!(report.passed, "{:?}", failing_checks(&report));
        assert_eq!(report.figures.total_overflows, 1);
        assert_eq!(report.figures.expected_output_events, 3);
        assert_eq!(report.figures.duplicate_deliveries, 3);

        // The same re-drive applied twice (the second delivery of rd-1 judged again).
        let mut twice = processed.clone();
        let e_b = EventEnvelope::parse(input[5].value_bytes()).expect("parses");
        twice.push_output(0, output_value(&e_b, &input[5], 4, i64::MAX - 10));
        let report = run(&input, &twice);
        assert_violation(&report, Violation::TwoOutcomes, 1);
    }

    #[test]
    fn an_overflowing_event_not_dead_lettered_is_reported() {
        let input = overflow_scenario();
        let mut processed = reference_process(&input);
        // A saturating processor: e-d is applied with the total stuck at i64::MAX.
        processed
            .dlq
            .retain(|dead| dead.header_str(SOURCE_OFFSET_HEADER) != Some("5"));
        let e_d = EventEnvelope::parse(input[5].value_bytes()).expect("parses");
        processed.push_output(0, output_value(&e_d, &input[5], 4, i64::MAX));
        let report = run(&input, &processed);
        assert_violation(&report, Violation::OverflowMissingFromDlq, 1);
        assert_violation(&report, Violation::OverflowInOutput, 1);
        assert_eq!(
            report.violations[&Violation::OverflowInOutput].examples,
            vec!["e-d".to_owned()]
        );
        assert!(!report.passed);

        // Dead-lettered, but for another reason.
        let mut processed = reference_process(&input);
        for dead in &mut processed.dlq {
            if dead.header_str(SOURCE_OFFSET_HEADER) == Some("5") {
                dead.headers[0].1 = Some(b"invalid_field".to_vec());
            }
        }
        let report = run(&input, &processed);
        assert_violation(&report, Violation::WrongDlqReason, 1);
        assert!(
            report.violations[&Violation::WrongDlqReason].examples[0]
                .contains("expected total_overflow")
        );
    }

    fn json_event(event_id: &str, entity_id: &str, value: i64, occurred_at: &str) -> Vec<u8> {
        serde_json::json!({
            "event_id": event_id,
            "entity_id": entity_id,
            "value": value,
            "occurred_at": occurred_at,
        })
        .to_string()
        .into_bytes()
    }
}
