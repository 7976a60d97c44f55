//! The workload generator: a deterministic stream of records shaped like what an at-least-once
//! producer really writes to an event topic — valid envelopes, exact re-deliveries, malformed
//! records and reused ids with different content.
//!
//! Pure: no I/O and no clock. The same [`WorkloadSpec`] yields byte-identical records in the same
//! order (keys, values, headers, event ids), so a failed audit can be reproduced from the seed.
//!
//! Counting: `count` is the number of distinct valid logical events. Duplicates, malformed records
//! and conflicts are *extra* physical records, each `round(count × ratio)`, interleaved at random
//! (a duplicate or conflict always after the event it repeats).

use std::collections::VecDeque;
use std::fmt;

use eos_core::DeadLetterReason;
use eos_core::envelope::MAX_ID_BYTES;
use eos_runtime::trace_context::{self, EVENT_ID_HEADER};
use opentelemetry::Context;
use opentelemetry::trace::{
    SpanContext, SpanId, TraceContextExt as _, TraceFlags, TraceId, TraceState,
};
use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use time::format_description::well_known::Rfc3339;
use time::{Duration, OffsetDateTime};

/// A duplicate re-sends one of this many most recent events, the way a producer retry repeats
/// something it sent moments ago rather than something from hours back.
const DUPLICATE_WINDOW: usize = 1000;
/// Largest absolute amount, in cents.
const MAX_AMOUNT_CENTS: i64 = 100_000;
/// One event in this many is a refund (a negative amount).
const REFUND_ONE_IN: u32 = 10;
/// Length of the over-long event id of [`MalformedKind::OversizedId`].
const OVERSIZED_ID_BYTES: usize = MAX_ID_BYTES + 32;

/// The malformed record shapes, used in this rotation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MalformedKind {
    /// A valid envelope cut short.
    TruncatedJson,
    MissingEventId,
    MissingValue,
    /// `"value":"12"`: the amount as a string.
    WrongType,
    /// An `event_id` longer than the envelope allows.
    OversizedId,
    /// A valid envelope with a byte that is not UTF-8 inside a string.
    NonUtf8,
    /// A JSON array holding an envelope.
    JsonArray,
    /// No bytes at all.
    EmptyValue,
    /// A valid envelope with a second `value` key: which amount was meant is ambiguous.
    DuplicateKey,
    /// A valid envelope whose `value` is 2^64: it fits no 64-bit integer and would be rounded.
    IntegerOutOfRange,
    /// A valid envelope with a payload number a 64-bit float cannot hold exactly.
    InexactNumber,
}

impl MalformedKind {
    pub const ALL: [MalformedKind; 11] = [
        Self::TruncatedJson,
        Self::MissingEventId,
        Self::MissingValue,
        Self::WrongType,
        Self::OversizedId,
        Self::NonUtf8,
        Self::JsonArray,
        Self::EmptyValue,
        Self::DuplicateKey,
        Self::IntegerOutOfRange,
        Self::InexactNumber,
    ];

    /// The kinds that are well-formed JSON with a meaning that is not unique: refused rather
    /// than guessed (docs/bad-input.md "Bad input").
    pub const AMBIGUOUS: [MalformedKind; 3] = [
        Self::DuplicateKey,
        Self::IntegerOutOfRange,
        Self::InexactNumber,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::TruncatedJson => "truncated_json",
            Self::MissingEventId => "missing_event_id",
            Self::MissingValue => "missing_value",
            Self::WrongType => "wrong_type",
            Self::OversizedId => "oversized_id",
            Self::NonUtf8 => "non_utf8",
            Self::JsonArray => "json_array",
            Self::EmptyValue => "empty_value",
            Self::DuplicateKey => "duplicate_key",
            Self::IntegerOutOfRange => "integer_out_of_range",
            Self::InexactNumber => "inexact_number",
        }
    }

    /// The reason code a correct consumer dead-letters this record with.
    pub fn expected_reason(self) -> DeadLetterReason {
        match self {
            Self::TruncatedJson | Self::JsonArray => DeadLetterReason::MalformedJson,
            Self::MissingEventId | Self::MissingValue => DeadLetterReason::MissingField,
            Self::WrongType => DeadLetterReason::InvalidField,
            Self::OversizedId => DeadLetterReason::FieldTooLong,
            Self::NonUtf8 => DeadLetterReason::InvalidUtf8,
            Self::EmptyValue => DeadLetterReason::EmptyRecord,
            Self::DuplicateKey => DeadLetterReason::DuplicateKey,
            Self::IntegerOutOfRange => DeadLetterReason::IntegerOutOfRange,
            Self::InexactNumber => DeadLetterReason::InexactNumber,
        }
    }
}

impl fmt::Display for MalformedKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SpecError {
    #[error("{name} must be a number between 0 and 1, got {value}")]
    RatioOutOfRange { name: &'static str, value: f64 },
    #[error("entities must be at least 1")]
    NoEntities,
}

/// Everything that determines the generated records.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkloadSpec {
    pub seed: u64,
    /// Distinct valid logical events.
    pub count: u64,
    /// Entities the events are spread over (`ent-0` … `ent-<entities-1>`).
    pub entities: u32,
    /// Exact re-deliveries, relative to `count`.
    pub duplicate_ratio: f64,
    /// Malformed records, relative to `count`.
    pub bad_ratio: f64,
    /// Reused event ids with different content, relative to `count`.
    pub conflict_ratio: f64,
    /// Target size of a valid record's value; the payload is padded up to it.
    pub value_bytes: usize,
    /// `occurred_at` of event `n` is this plus `n` milliseconds.
    pub occurred_at_base: OffsetDateTime,
}

impl WorkloadSpec {
    pub fn validate(&self) -> Result<(), SpecError> {
        for (name, value) in [
            ("duplicate ratio", self.duplicate_ratio),
            ("bad ratio", self.bad_ratio),
            ("conflict ratio", self.conflict_ratio),
        ] {
            // Written so that NaN fails too.
            if !(0.0..=1.0).contains(&value) {
                return Err(SpecError::RatioOutOfRange { name, value });
            }
        }
        if self.entities == 0 {
            return Err(SpecError::NoEntities);
        }
        Ok(())
    }

    pub fn duplicates(&self) -> u64 {
        scaled(self.count, self.duplicate_ratio)
    }

    pub fn malformed(&self) -> u64 {
        scaled(self.count, self.bad_ratio)
    }

    pub fn conflicts(&self) -> u64 {
        scaled(self.count, self.conflict_ratio)
    }

    /// Every record the workload writes.
    pub fn physical_records(&self) -> u64 {
        self.count + self.duplicates() + self.malformed() + self.conflicts()
    }

    pub fn event_id(&self, sequence: u64) -> String {
        format!("evt-{}-{sequence}", self.seed)
    }
}

fn scaled(count: u64, ratio: f64) -> u64 {
    // The ratio is validated to 0..=1, so the product fits back into a u64.
    (count as f64 * ratio).round() as u64
}

/// What a generated record is, for the producer's summary and for tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordKind {
    /// The first (and canonical) record of logical event `sequence`.
    Logical {
        sequence: u64,
        value: i64,
    },
    /// A byte-identical re-send of logical event `sequence`.
    Duplicate {
        sequence: u64,
        value: i64,
    },
    /// Logical event `sequence`'s id and entity with a different value.
    Conflict {
        sequence: u64,
        value: i64,
    },
    Malformed(MalformedKind),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GeneratedRecord {
    pub key: Vec<u8>,
    pub value: Vec<u8>,
    /// `traceparent` of [`Self::send`], `baggage` and `event_id` (when the record has an id).
    pub headers: Vec<(&'static str, Vec<u8>)>,
    pub kind: RecordKind,
    /// The trace of the send. A re-delivery has its original's: a retry is the same send.
    pub send: SendTrace,
}

impl GeneratedRecord {
    /// The `event_id` header, when the record has one.
    pub fn event_id(&self) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| *key == EVENT_ID_HEADER)
            .and_then(|(_, value)| std::str::from_utf8(value).ok())
    }

    /// A re-delivery of an earlier record (same key, value and headers).
    pub fn is_redelivery(&self) -> bool {
        matches!(self.kind, RecordKind::Duplicate { .. })
    }
}

/// What is remembered of a logical event so that it can be re-sent byte for byte or contradicted
/// later, without keeping every encoded record in memory.
#[derive(Debug, Clone, Copy)]
struct LogicalEvent {
    sequence: u64,
    entity: u32,
    value: i64,
    version: u64,
    pad_seed: u64,
    trace: SendTrace,
}

/// The trace and span id of an event's first send, drawn from the seed: the producer's span of
/// that send has these ids, and every delivery of the event — re-deliveries included — names it
/// as the parent in `traceparent`, so all of an event's spans share one trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendTrace {
    pub trace_id: TraceId,
    pub span_id: SpanId,
}

impl SendTrace {
    /// A new send's ids, drawn from `rng`.
    pub fn random(rng: &mut ChaCha8Rng) -> Self {
        // All-zero ids are invalid in W3C trace context; `| 1` keeps them valid.
        Self {
            trace_id: TraceId::from(rng.random::<u128>() | 1),
            span_id: SpanId::from(rng.random::<u64>() | 1),
        }
    }

    /// The send as a sampled remote parent.
    pub fn span_context(self) -> SpanContext {
        SpanContext::new(
            self.trace_id,
            self.span_id,
            TraceFlags::SAMPLED,
            true,
            TraceState::NONE,
        )
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct Remaining {
    logical: u64,
    duplicates: u64,
    malformed: u64,
    conflicts: u64,
}

#[derive(Serialize)]
struct WireEnvelope<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    event_id: Option<&'a str>,
    entity_id: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    value: Option<WireValue>,
    version: u64,
    occurred_at: &'a str,
    payload: WirePayload<'a>,
}

#[derive(Serialize)]
#[serde(untagged)]
enum WireValue {
    Cents(i64),
    Text(String),
}

#[derive(Serialize)]
struct WirePayload<'a> {
    kind: &'static str,
    pad: &'a str,
}

/// An iterator over the workload's records, in the order they are to be written.
#[derive(Debug)]
pub struct Workload {
    spec: WorkloadSpec,
    rng: ChaCha8Rng,
    remaining: Remaining,
    events: Vec<LogicalEvent>,
    next_version: Vec<u64>,
    malformed_sent: u64,
    conflicts_sent: u64,
    recent: VecDeque<usize>,
}

impl Workload {
    pub fn new(spec: WorkloadSpec) -> Result<Self, SpecError> {
        spec.validate()?;
        let remaining = Remaining {
            logical: spec.count,
            duplicates: spec.duplicates(),
            malformed: spec.malformed(),
            conflicts: spec.conflicts(),
        };
        let entities = usize::try_from(spec.entities).unwrap_or(usize::MAX);
        Ok(Self {
            rng: ChaCha8Rng::seed_from_u64(spec.seed),
            remaining,
            events: Vec::new(),
            next_version: vec![1; entities],
            malformed_sent: 0,
            conflicts_sent: 0,
            recent: VecDeque::with_capacity(DUPLICATE_WINDOW),
            spec,
        })
    }

    pub fn spec(&self) -> &WorkloadSpec {
        &self.spec
    }

    fn remaining_total(&self) -> u64 {
        let r = self.remaining;
        r.logical + r.duplicates + r.malformed + r.conflicts
    }

    fn next_logical(&mut self) -> GeneratedRecord {
        self.remaining.logical -= 1;
        let sequence = u64::try_from(self.events.len()).unwrap_or(u64::MAX);
        let entity = self.rng.random_range(0..self.spec.entities);
        let magnitude = self.rng.random_range(1..=MAX_AMOUNT_CENTS);
        let value = if self.rng.random_ratio(1, REFUND_ONE_IN) {
            -magnitude
        } else {
            magnitude
        };
        let slot = &mut self.next_version[entity as usize];
        let version = *slot;
        *slot += 1;
        let event = LogicalEvent {
            sequence,
            entity,
            value,
            version,
            pad_seed: self.rng.random(),
            trace: SendTrace::random(&mut self.rng),
        };
        self.events.push(event);
        if self.recent.len() == DUPLICATE_WINDOW {
            self.recent.pop_front();
        }
        self.recent.push_back(self.events.len() - 1);
        GeneratedRecord {
            key: entity_key(entity),
            value: self.encode(&event, value),
            headers: self.headers(event.trace, Some(&self.spec.event_id(sequence))),
            kind: RecordKind::Logical { sequence, value },
            send: event.trace,
        }
    }

    fn next_duplicate(&mut self) -> GeneratedRecord {
        self.remaining.duplicates -= 1;
        let pick = self.rng.random_range(0..self.recent.len());
        let event = self.events[self.recent[pick]];
        // The same trace context too: a retry is the same send, not a new one.
        GeneratedRecord {
            key: entity_key(event.entity),
            value: self.encode(&event, event.value),
            headers: self.headers(event.trace, Some(&self.spec.event_id(event.sequence))),
            kind: RecordKind::Duplicate {
                sequence: event.sequence,
                value: event.value,
            },
            send: event.trace,
        }
    }

    fn next_conflict(&mut self) -> GeneratedRecord {
        self.remaining.conflicts -= 1;
        let pick = self.rng.random_range(0..self.events.len());
        let event = self.events[pick];
        // Offset by the running conflict count so no conflict equals its original or another
        // conflict of the same event: each one is its own broken-contract record.
        let shift = i64::try_from(self.conflicts_sent).unwrap_or(i64::MAX - 1) + 1;
        let value = event.value.saturating_add(shift);
        self.conflicts_sent += 1;
        let trace = SendTrace::random(&mut self.rng);
        GeneratedRecord {
            key: entity_key(event.entity),
            value: self.encode(&event, value),
            headers: self.headers(trace, Some(&self.spec.event_id(event.sequence))),
            kind: RecordKind::Conflict {
                sequence: event.sequence,
                value,
            },
            send: trace,
        }
    }

    fn next_malformed(&mut self) -> GeneratedRecord {
        self.remaining.malformed -= 1;
        let index = self.malformed_sent;
        let kind = MalformedKind::ALL[(index % MalformedKind::ALL.len() as u64) as usize];
        self.malformed_record(kind)
    }

    /// One record of each ambiguous kind ([`MalformedKind::AMBIGUOUS`]), made by a workload of
    /// `seed` that writes nothing else: for a source that cannot make them itself (the demo's
    /// payments-api refuses bad requests, so these come from a producer writing next to it).
    pub fn ambiguous_records(
        seed: u64,
        occurred_at_base: OffsetDateTime,
    ) -> Result<Vec<GeneratedRecord>, SpecError> {
        let spec = WorkloadSpec {
            seed,
            count: 0,
            entities: 1,
            duplicate_ratio: 0.0,
            bad_ratio: 0.0,
            conflict_ratio: 0.0,
            value_bytes: 0,
            occurred_at_base,
        };
        let mut workload = Self::new(spec)?;
        Ok(MalformedKind::AMBIGUOUS
            .iter()
            .map(|&kind| workload.malformed_record(kind))
            .collect())
    }

    fn malformed_record(&mut self, kind: MalformedKind) -> GeneratedRecord {
        let index = self.malformed_sent;
        self.malformed_sent += 1;
        let entity = self.rng.random_range(0..self.spec.entities);
        let event = LogicalEvent {
            sequence: 0,
            entity,
            value: self.rng.random_range(1..=MAX_AMOUNT_CENTS),
            version: 1,
            pad_seed: self.rng.random(),
            trace: SendTrace::random(&mut self.rng),
        };
        let mut event_id = format!("evt-{}-bad-{index}", self.spec.seed);
        if kind == MalformedKind::OversizedId {
            event_id.push('-');
            while event_id.len() < OVERSIZED_ID_BYTES {
                event_id.push('x');
            }
        }
        let entity_id = entity_name(entity);
        let occurred_at = self.occurred_at(self.spec.count + index);
        let pad = pad_string(event.pad_seed, self.spec.value_bytes / 2);
        let envelope = |event_id: Option<&str>, value: Option<WireValue>| {
            encode_wire(&WireEnvelope {
                event_id,
                entity_id: &entity_id,
                value,
                version: event.version,
                occurred_at: &occurred_at,
                payload: WirePayload {
                    kind: "payment",
                    pad: &pad,
                },
            })
        };
        let cents = Some(WireValue::Cents(event.value));
        let value = match kind {
            MalformedKind::TruncatedJson => {
                let mut bytes = envelope(Some(&event_id), cents);
                // Any proper prefix of a JSON object is unbalanced; keeping at least one byte
                // keeps it from being an *empty* record instead.
                let cut = self.rng.random_range(1..bytes.len() - 1);
                bytes.truncate(cut);
                bytes
            }
            MalformedKind::MissingEventId => envelope(None, cents),
            MalformedKind::MissingValue => envelope(Some(&event_id), None),
            MalformedKind::WrongType => envelope(
                Some(&event_id),
                Some(WireValue::Text(event.value.to_string())),
            ),
            MalformedKind::OversizedId => envelope(Some(&event_id), cents),
            MalformedKind::NonUtf8 => {
                let mut bytes = envelope(Some(&event_id), cents);
                let marker = b"\"pad\":\"";
                let at = bytes
                    .windows(marker.len())
                    .position(|window| window == marker)
                    .map_or(bytes.len() / 2, |start| start + marker.len());
                bytes.insert(at, 0xFF);
                bytes
            }
            MalformedKind::JsonArray => {
                let mut bytes = vec![b'['];
                bytes.extend(envelope(Some(&event_id), cents));
                bytes.push(b']');
                bytes
            }
            MalformedKind::EmptyValue => Vec::new(),
            MalformedKind::DuplicateKey => {
                let second = format!("\"value\":{},", event.value + 1);
                splice_after(envelope(Some(&event_id), cents), b"{", second.as_bytes())
            }
            MalformedKind::IntegerOutOfRange => {
                let mut bytes = envelope(Some(&event_id), None);
                // 2^64: one past u64::MAX, so neither i64 nor u64 holds it.
                bytes = splice_after(bytes, b"{", b"\"value\":18446744073709551616,");
                bytes
            }
            MalformedKind::InexactNumber => splice_after(
                envelope(Some(&event_id), cents),
                b"\"payload\":{",
                b"\"rate\":0.10000000000000000001,",
            ),
        };
        let has_event_id = !matches!(
            kind,
            MalformedKind::MissingEventId | MalformedKind::EmptyValue
        );
        GeneratedRecord {
            key: entity_key(entity),
            value,
            headers: self.headers(event.trace, has_event_id.then_some(event_id.as_str())),
            kind: RecordKind::Malformed(kind),
            send: event.trace,
        }
    }

    fn headers(&self, send: SendTrace, event_id: Option<&str>) -> Vec<(&'static str, Vec<u8>)> {
        let cx = Context::new().with_remote_span_context(send.span_context());
        let cx = match event_id {
            Some(event_id) => trace_context::context_with_event_id(&cx, event_id),
            None => cx,
        };
        let mut headers: Vec<(&'static str, Vec<u8>)> = trace_context::context_headers(&cx)
            .into_iter()
            .map(|(key, value)| (key, value.into_bytes()))
            .collect();
        if let Some(event_id) = event_id {
            headers.push((EVENT_ID_HEADER, event_id.as_bytes().to_vec()));
        }
        headers
    }

    fn occurred_at(&self, sequence: u64) -> String {
        let millis = i64::try_from(sequence).unwrap_or(i64::MAX);
        let at = self
            .spec
            .occurred_at_base
            .checked_add(Duration::milliseconds(millis))
            .unwrap_or(self.spec.occurred_at_base);
        // Formatting a UTC timestamp within the year 0..=9999 cannot fail; the base comes from
        // the clock or a parsed RFC 3339 string.
        at.format(&Rfc3339).unwrap_or_default()
    }

    /// The value of a valid envelope: deterministic in `event` and `value`, padded so the record
    /// is `value_bytes` long (or as short as it can be).
    fn encode(&self, event: &LogicalEvent, value: i64) -> Vec<u8> {
        let event_id = self.spec.event_id(event.sequence);
        let entity_id = entity_name(event.entity);
        let occurred_at = self.occurred_at(event.sequence);
        let kind = if event.value < 0 { "refund" } else { "payment" };
        let wire = |pad: &str| {
            encode_wire(&WireEnvelope {
                event_id: Some(&event_id),
                entity_id: &entity_id,
                value: Some(WireValue::Cents(value)),
                version: event.version,
                occurred_at: &occurred_at,
                payload: WirePayload { kind, pad },
            })
        };
        let unpadded = wire("");
        let pad_len = self.spec.value_bytes.saturating_sub(unpadded.len());
        if pad_len == 0 {
            return unpadded;
        }
        // Alphanumeric padding needs no JSON escaping, so it adds exactly `pad_len` bytes.
        wire(&pad_string(event.pad_seed, pad_len))
    }
}

impl Iterator for Workload {
    type Item = GeneratedRecord;

    fn next(&mut self) -> Option<GeneratedRecord> {
        let total = self.remaining_total();
        if total == 0 {
            return None;
        }
        // Drawing against the remaining counts interleaves the kinds uniformly and still hits
        // each count exactly.
        let r = self.remaining;
        let mut pick = self.rng.random_range(0..total);
        let nothing_to_repeat = self.events.is_empty();
        if pick < r.logical
            || (nothing_to_repeat && r.logical > 0 && pick >= r.logical + r.malformed)
        {
            return Some(self.next_logical());
        }
        pick -= r.logical;
        if pick < r.malformed {
            return Some(self.next_malformed());
        }
        pick -= r.malformed;
        if pick < r.duplicates {
            return Some(self.next_duplicate());
        }
        Some(self.next_conflict())
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let total = usize::try_from(self.remaining_total()).unwrap_or(usize::MAX);
        (total, Some(total))
    }
}

/// `bytes` with `insert` right after the first `marker` (at the end when there is none).
fn splice_after(mut bytes: Vec<u8>, marker: &[u8], insert: &[u8]) -> Vec<u8> {
    let at = bytes
        .windows(marker.len())
        .position(|window| window == marker)
        .map_or(bytes.len(), |start| start + marker.len());
    bytes.splice(at..at, insert.iter().copied());
    bytes
}

fn encode_wire(wire: &WireEnvelope<'_>) -> Vec<u8> {
    // Serialising plain strings and integers cannot fail.
    serde_json::to_vec(wire).unwrap_or_default()
}

fn entity_name(entity: u32) -> String {
    format!("ent-{entity}")
}

fn entity_key(entity: u32) -> Vec<u8> {
    entity_name(entity).into_bytes()
}

/// `len` characters of padding drawn from `seed` (letters and digits): what pads a record to its
/// size, here and in eos-lab's card-authorisations workload.
pub fn pad_string(seed: u64, len: usize) -> String {
    const ALPHABET: &[u8; 62] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    // Bulk random bytes mapped onto the alphabet: several times faster than sampling character
    // by character, and the slight modulo bias does not matter for padding.
    let mut bytes = vec![0u8; len];
    ChaCha8Rng::seed_from_u64(seed).fill_bytes(&mut bytes);
    bytes
        .iter()
        .map(|byte| char::from(ALPHABET[usize::from(*byte) % ALPHABET.len()]))
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashMap, HashSet};

    use eos_core::{EnvelopeError, EventEnvelope};
    use eos_runtime::trace_context::{BAGGAGE_HEADER, TRACEPARENT_HEADER};
    use time::macros::datetime;

    use super::*;

    fn spec(seed: u64, count: u64) -> WorkloadSpec {
        WorkloadSpec {
            seed,
            count,
            entities: 20,
            duplicate_ratio: 0.05,
            bad_ratio: 0.02,
            conflict_ratio: 0.01,
            value_bytes: 200,
            occurred_at_base: datetime!(2026-01-02 03:04:05 UTC),
        }
    }

    fn generate(spec: WorkloadSpec) -> Result<Vec<GeneratedRecord>, SpecError> {
        Ok(Workload::new(spec)?.collect())
    }

    fn header<'a>(record: &'a GeneratedRecord, name: &str) -> Option<&'a [u8]> {
        record
            .headers
            .iter()
            .find(|(key, _)| *key == name)
            .map(|(_, value)| value.as_slice())
    }

    #[test]
    fn same_seed_same_bytes_other_seed_other_ids() -> Result<(), SpecError> {
        let first = generate(spec(7, 2000))?;
        let again = generate(spec(7, 2000))?;
        assert_eq!(first, again);

        let other = generate(spec(8, 2000))?;
        assert_ne!(first, other);
        let ids = |records: &[GeneratedRecord]| -> HashSet<Vec<u8>> {
            records
                .iter()
                .filter_map(|r| header(r, EVENT_ID_HEADER).map(<[u8]>::to_vec))
                .collect()
        };
        assert!(ids(&first).is_disjoint(&ids(&other)));
        assert!(ids(&first).contains(b"evt-7-0".as_slice()));
        Ok(())
    }

    #[test]
    fn counts_follow_the_ratios_and_interleave() -> Result<(), SpecError> {
        let spec = spec(3, 10_000);
        let records = generate(spec.clone())?;
        let mut counts: BTreeMap<&str, u64> = BTreeMap::new();
        for record in &records {
            let kind = match record.kind {
                RecordKind::Logical { .. } => "logical",
                RecordKind::Duplicate { .. } => "duplicate",
                RecordKind::Conflict { .. } => "conflict",
                RecordKind::Malformed(_) => "malformed",
            };
            *counts.entry(kind).or_default() += 1;
        }
        assert_eq!(counts.get("logical"), Some(&10_000));
        assert_eq!(counts.get("duplicate"), Some(&500));
        assert_eq!(counts.get("malformed"), Some(&200));
        assert_eq!(counts.get("conflict"), Some(&100));
        assert_eq!(records.len() as u64, spec.physical_records());

        // Spread through the run, not bunched at one end.
        let first_half = &records[..records.len() / 2];
        let duplicates_early = first_half
            .iter()
            .filter(|r| matches!(r.kind, RecordKind::Duplicate { .. }))
            .count();
        assert!(
            (150..=350).contains(&duplicates_early),
            "{duplicates_early}"
        );
        Ok(())
    }

    #[test]
    fn zero_ratios_write_only_logical_events() -> Result<(), SpecError> {
        let mut spec = spec(1, 300);
        spec.duplicate_ratio = 0.0;
        spec.bad_ratio = 0.0;
        spec.conflict_ratio = 0.0;
        let records = generate(spec)?;
        assert_eq!(records.len(), 300);
        assert!(
            records
                .iter()
                .all(|r| matches!(r.kind, RecordKind::Logical { .. }))
        );
        Ok(())
    }

    #[test]
    fn logical_events_are_valid_sized_and_versioned() -> Result<(), Box<dyn std::error::Error>> {
        let records = generate(spec(11, 1000))?;
        let mut versions: HashMap<String, u64> = HashMap::new();
        let mut sequence = 0u64;
        let mut refunds = 0;
        for record in &records {
            let RecordKind::Logical { sequence: n, value } = record.kind else {
                continue;
            };
            assert_eq!(n, sequence);
            sequence += 1;
            let envelope = EventEnvelope::parse(&record.value)?;
            assert_eq!(envelope.event_id.as_str(), format!("evt-11-{n}"));
            assert_eq!(
                envelope.entity_id.as_str().as_bytes(),
                record.key.as_slice()
            );
            assert_eq!(envelope.value, value);
            assert!(value != 0 && value.abs() <= MAX_AMOUNT_CENTS);
            refunds += usize::from(value < 0);
            let expected_version = versions.entry(envelope.entity_id.to_string()).or_insert(0);
            *expected_version += 1;
            assert_eq!(envelope.version, Some(*expected_version));
            assert_eq!(record.value.len(), 200);
            assert_eq!(
                header(record, EVENT_ID_HEADER),
                Some(envelope.event_id.as_str().as_bytes())
            );
            let traceparent =
                std::str::from_utf8(header(record, TRACEPARENT_HEADER).unwrap_or_default())?;
            assert_eq!(
                traceparent,
                format!("00-{}-{}-01", record.send.trace_id, record.send.span_id)
            );
            assert_eq!(
                header(record, BAGGAGE_HEADER),
                Some(format!("event_id=evt-11-{n}").as_bytes())
            );
            assert_eq!(record.event_id(), Some(envelope.event_id.as_str()));
        }
        assert_eq!(sequence, 1000);
        assert!((50..=150).contains(&refunds), "{refunds} refunds");
        Ok(())
    }

    #[test]
    fn every_malformed_record_fails_with_its_intended_reason() -> Result<(), SpecError> {
        let mut spec = spec(5, 80);
        spec.bad_ratio = 1.0;
        let records = generate(spec)?;
        let mut kinds = HashSet::new();
        for record in &records {
            let RecordKind::Malformed(kind) = record.kind else {
                continue;
            };
            kinds.insert(kind);
            let error: EnvelopeError =
                EventEnvelope::parse(&record.value).expect_err(kind.as_str());
            assert_eq!(error.reason(), kind.expected_reason(), "{kind}: {error}");
            assert!(!record.key.is_empty());
            assert!(header(record, TRACEPARENT_HEADER).is_some());
        }
        assert_eq!(kinds.len(), MalformedKind::ALL.len());
        Ok(())
    }

    #[test]
    fn ambiguous_records_are_one_of_each_kind_and_refused_with_its_reason() -> Result<(), SpecError>
    {
        let records = Workload::ambiguous_records(7, datetime!(2026-02-27 00:00:00 UTC))?;
        let mut ids = HashSet::new();
        for (record, kind) in records.iter().zip(MalformedKind::AMBIGUOUS) {
            assert_eq!(record.kind, RecordKind::Malformed(kind));
            // Well-formed JSON, so only the strict reading tells it apart.
            assert!(serde_json::from_slice::<serde_json::Value>(&record.value).is_ok());
            let error = EventEnvelope::parse(&record.value).expect_err(kind.as_str());
            assert_eq!(error.reason(), kind.expected_reason(), "{kind}: {error}");
            assert!(ids.insert(record.event_id().map(str::to_owned)));
        }
        assert_eq!(records.len(), 3);
        Ok(())
    }

    #[test]
    fn duplicates_repeat_an_earlier_record_byte_for_byte() -> Result<(), SpecError> {
        let records = generate(spec(9, 3000))?;
        let mut originals: HashMap<u64, &GeneratedRecord> = HashMap::new();
        let mut duplicates = 0;
        for record in &records {
            match record.kind {
                RecordKind::Logical { sequence, .. } => {
                    originals.insert(sequence, record);
                }
                RecordKind::Duplicate { sequence, .. } => {
                    duplicates += 1;
                    let original = originals
                        .get(&sequence)
                        .expect("a duplicate comes after its original");
                    assert_eq!(original.key, record.key);
                    assert_eq!(original.value, record.value);
                    assert_eq!(original.headers, record.headers);
                    assert_eq!(original.send, record.send);
                    assert!(record.is_redelivery() && !original.is_redelivery());
                }
                _ => {}
            }
        }
        assert_eq!(duplicates, 150);
        Ok(())
    }

    #[test]
    fn conflicts_reuse_id_and_entity_with_other_content() -> Result<(), Box<dyn std::error::Error>>
    {
        let mut spec = spec(13, 2000);
        spec.conflict_ratio = 0.05;
        let records = generate(spec)?;
        let mut originals: HashMap<u64, EventEnvelope> = HashMap::new();
        let mut conflict_fingerprints = HashSet::new();
        for record in &records {
            match record.kind {
                RecordKind::Logical { sequence, .. } => {
                    originals.insert(sequence, EventEnvelope::parse(&record.value)?);
                }
                RecordKind::Conflict { sequence, value } => {
                    let original = originals
                        .get(&sequence)
                        .expect("a conflict comes after its original");
                    let conflict = EventEnvelope::parse(&record.value)?;
                    assert_eq!(conflict.event_id, original.event_id);
                    assert_eq!(conflict.entity_id, original.entity_id);
                    assert_eq!(record.key, original.entity_id.as_str().as_bytes());
                    assert_eq!(conflict.value, value);
                    assert_ne!(conflict.value, original.value);
                    assert_ne!(conflict.fingerprint(), original.fingerprint());
                    assert!(conflict_fingerprints.insert(conflict.fingerprint()));
                }
                _ => {}
            }
        }
        assert_eq!(conflict_fingerprints.len(), 100);
        Ok(())
    }

    #[test]
    fn bad_specs_are_refused() {
        for ratio in [-0.1, 1.01, f64::NAN] {
            let mut bad = spec(1, 10);
            bad.bad_ratio = ratio;
            assert!(matches!(
                Workload::new(bad),
                Err(SpecError::RatioOutOfRange { .. })
            ));
        }
        let mut no_entities = spec(1, 10);
        no_entities.entities = 0;
        assert_eq!(no_entities.validate(), Err(SpecError::NoEntities));
    }

    #[test]
    fn small_value_bytes_still_make_valid_records() -> Result<(), Box<dyn std::error::Error>> {
        let mut spec = spec(2, 50);
        spec.value_bytes = 0;
        for record in generate(spec)? {
            if let RecordKind::Logical { .. } = record.kind {
                EventEnvelope::parse(&record.value)?;
            }
        }
        Ok(())
    }
}
