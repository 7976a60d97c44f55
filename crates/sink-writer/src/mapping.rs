//! From a Kafka record to the rows it becomes: decode the envelope, then map it into each target's
//! columns. Pure: no I/O, so every way a record can be refused is unit-tested.
//!
//! A record that cannot be decoded, or whose value does not fit some target's column, is refused
//! as a whole (dead-lettered): one input has exactly one outcome, never a row in one table and a
//! dead letter for another.

use eos_core::{DeadLetterReason, EnvelopeError, EventEnvelope, Fingerprint};
use serde_json::{Map, Value};

use crate::column_type::ColumnType;
use crate::targets::Source;

/// Fields eos-processor adds to the envelope on its output topic. They describe the processor's
/// running state, not the event, so they are left out of the fingerprint: an event keeps the
/// fingerprint it had at the processor's input, and "same event" means the same at both
/// boundaries.
pub const LEDGER_ADDED_FIELDS: [&str; 3] = ["entity_total", "entity_count", "source"];

/// One consumed record, owned.
#[derive(Debug, Clone)]
pub struct InputRecord {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub payload: Option<Vec<u8>>,
    /// Original headers, carried into a dead letter.
    pub headers: Vec<(String, Option<Vec<u8>>)>,
    /// The record's timestamp: an event's time when its envelope has no `occurred_at`.
    pub timestamp_ms: Option<i64>,
}

/// Why a record is refused: the dead-letter reason code and a detail naming the field or column.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub reason: DeadLetterReason,
    pub detail: String,
}

impl From<EnvelopeError> for Refusal {
    fn from(error: EnvelopeError) -> Self {
        Self {
            reason: error.reason(),
            detail: error.to_string(),
        }
    }
}

/// A record that decoded into a valid envelope.
#[derive(Debug, Clone)]
pub struct DecodedEvent {
    pub envelope: EventEnvelope,
    pub fingerprint: Fingerprint,
    /// The record value as JSON, for `record` and JSON-pointer sources.
    pub raw: Value,
}

/// Parses and validates a record value (docs/ARCHITECTURE.md "Wire format"), with the size limit.
pub fn decode(payload: Option<&[u8]>, max_record_bytes: usize) -> Result<DecodedEvent, Refusal> {
    let bytes = payload.unwrap_or_default();
    let envelope = EventEnvelope::parse_with_limit(bytes, max_record_bytes)?;
    // parse_with_limit has accepted the bytes as a JSON object, so this cannot fail.
    let raw: Value = serde_json::from_slice(bytes).unwrap_or(Value::Null);
    let fingerprint = event_fingerprint(&envelope);
    Ok(DecodedEvent {
        envelope,
        fingerprint,
        raw,
    })
}

/// The event's fingerprint, without the fields eos-processor adds when all of them are present.
pub fn event_fingerprint(envelope: &EventEnvelope) -> Fingerprint {
    let is_ledger_record = LEDGER_ADDED_FIELDS
        .iter()
        .all(|field| envelope.extra.contains_key(*field));
    if !is_ledger_record {
        return envelope.fingerprint();
    }
    let mut event = envelope.clone();
    for field in LEDGER_ADDED_FIELDS {
        event.extra.remove(field);
    }
    event.fingerprint()
}

/// One column the sink binds a value to.
#[derive(Debug, Clone)]
pub struct BoundColumn {
    pub name: String,
    pub source: Source,
    pub ty: ColumnType,
    /// NOT NULL without a default: a missing value refuses the record.
    pub required: bool,
}

/// What a target needs to map a record.
#[derive(Debug, Clone)]
pub struct RowShape {
    pub table: String,
    /// Columns with bound values, in parameter order (`now` columns are not here).
    pub columns: Vec<BoundColumn>,
    pub key_index: usize,
    /// Versioned targets only.
    pub version_index: Option<usize>,
    /// The columns that make up a row's content, for duplicate-versus-conflict decisions: the
    /// fingerprint column when one is mapped, else every bound column but the key and positions.
    pub content_indices: Vec<usize>,
}

/// One record's row for one target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MappedRow {
    pub key: String,
    /// One text value (or NULL) per bound column.
    pub values: Vec<Option<String>>,
    /// Versioned targets only.
    pub version: Option<i64>,
}

impl MappedRow {
    /// The content compared between two rows with the same key.
    pub fn content(&self, shape: &RowShape) -> Vec<Option<&str>> {
        shape
            .content_indices
            .iter()
            .map(|&i| self.values[i].as_deref())
            .collect()
    }
}

/// Where the record was read, for `kafka.*` sources.
#[derive(Debug, Clone, Copy)]
pub struct Position<'a> {
    pub topic: &'a str,
    pub partition: i32,
    pub offset: i64,
    pub key: Option<&'a [u8]>,
}

fn source_value(
    source: &Source,
    event: &DecodedEvent,
    position: Position<'_>,
) -> Result<Value, String> {
    let envelope = &event.envelope;
    Ok(match source {
        Source::EventId => Value::String(envelope.event_id.to_string()),
        Source::EntityId => Value::String(envelope.entity_id.to_string()),
        Source::Value => Value::from(envelope.value),
        Source::Version => envelope.version.map(Value::from).unwrap_or(Value::Null),
        Source::Payload => envelope.payload.clone().unwrap_or(Value::Null),
        Source::OccurredAt => match envelope.occurred_at {
            Some(at) => Value::String(
                at.format(&time::format_description::well_known::Rfc3339)
                    .map_err(|e| format!("occurred_at cannot be formatted: {e}"))?,
            ),
            None => Value::Null,
        },
        Source::Fingerprint => Value::String(event.fingerprint.to_hex()),
        Source::Record => event.raw.clone(),
        Source::KafkaTopic => Value::String(position.topic.to_owned()),
        Source::KafkaPartition => Value::from(position.partition),
        Source::KafkaOffset => Value::from(position.offset),
        Source::KafkaKey => match position.key {
            None => Value::Null,
            Some(key) => Value::String(
                std::str::from_utf8(key)
                    .map_err(|_| "the record key is not UTF-8".to_owned())?
                    .to_owned(),
            ),
        },
        Source::Pointer(pointer) => event.raw.pointer(pointer).cloned().unwrap_or(Value::Null),
        // Never bound: written as now() in SQL.
        Source::Now => Value::Null,
    })
}

/// Maps a decoded event into one target's row. `Ok(None)`: the record is not for this target (a
/// versioned target and an event without a version — e.g. a plain payment event).
pub fn map_row(
    shape: &RowShape,
    event: &DecodedEvent,
    position: Position<'_>,
) -> Result<Option<MappedRow>, Refusal> {
    let mut values = Vec::with_capacity(shape.columns.len());
    for (i, column) in shape.columns.iter().enumerate() {
        let value = source_value(&column.source, event, position).map_err(|detail| Refusal {
            reason: DeadLetterReason::InvalidField,
            detail: format!("{}.{}: {detail}", shape.table, column.name),
        })?;
        if value.is_null() && shape.version_index == Some(i) {
            return Ok(None);
        }
        let text = column.ty.encode(&value).map_err(|detail| Refusal {
            reason: DeadLetterReason::InvalidField,
            detail: format!(
                "{}.{} (from {}): {detail}",
                shape.table, column.name, column.source
            ),
        })?;
        if text.is_none() && (column.required || i == shape.key_index) {
            return Err(Refusal {
                reason: DeadLetterReason::MissingField,
                detail: format!(
                    "{}.{} is required but {} is missing or null",
                    shape.table, column.name, column.source
                ),
            });
        }
        values.push(text);
    }
    let key = values[shape.key_index].clone().unwrap_or_default();
    let version = match shape.version_index {
        None => None,
        // Version columns are integer columns (checked at start-up), so the text is an i64.
        Some(i) => values[i].as_deref().and_then(|v| v.parse::<i64>().ok()),
    };
    Ok(Some(MappedRow {
        key,
        values,
        version,
    }))
}

/// The normalised envelope, stored with a conflict so the incoming content can be inspected.
pub fn incoming_json(event: &DecodedEvent) -> Map<String, Value> {
    event.envelope.to_json()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn ty(name: &str) -> ColumnType {
        ColumnType::from_catalog(name, name, -1).expect("supported")
    }

    fn column(name: &str, source: Source, ty_name: &str, required: bool) -> BoundColumn {
        BoundColumn {
            name: name.into(),
            source,
            ty: ty(ty_name),
            required,
        }
    }

    fn state_shape() -> RowShape {
        RowShape {
            table: "entity_state".into(),
            columns: vec![
                column("entity_id", Source::EntityId, "text", true),
                column("version", Source::Version, "int8", true),
                column("payload", Source::Payload, "jsonb", false),
                column(
                    "note",
                    Source::Pointer("/payload/note".into()),
                    "text",
                    true,
                ),
            ],
            key_index: 0,
            version_index: Some(1),
            content_indices: vec![1, 2, 3],
        }
    }

    fn position() -> Position<'static> {
        Position {
            topic: "t",
            partition: 0,
            offset: 7,
            key: None,
        }
    }

    fn decoded(text: &str) -> DecodedEvent {
        decode(Some(text.as_bytes()), 1 << 20).expect("valid")
    }

    #[test]
    fn maps_fields_and_pointers() -> Result<(), Refusal> {
        let event = decoded(
            r#"{"event_id":"e-1","entity_id":17,"value":5,"version":3,"payload":{"note":"c"}}"#,
        );
        let row = map_row(&state_shape(), &event, position())?.expect("versioned");
        assert_eq!(row.key, "17");
        assert_eq!(row.version, Some(3));
        assert_eq!(row.values[2].as_deref(), Some(r#"{"note":"c"}"#));
        assert_eq!(row.values[3].as_deref(), Some("c"));
        Ok(())
    }

    #[test]
    fn an_event_without_a_version_is_not_a_state_update() -> Result<(), Refusal> {
        let event = decoded(r#"{"event_id":"e-102","entity_id":17,"value":12500}"#);
        assert_eq!(map_row(&state_shape(), &event, position())?, None);
        Ok(())
    }

    #[test]
    fn refusals_name_the_column() {
        let event = decoded(r#"{"event_id":"e","entity_id":"a","value":1,"version":1}"#);
        let refusal = map_row(&state_shape(), &event, position()).expect_err("note missing");
        assert_eq!(refusal.reason, DeadLetterReason::MissingField);
        assert!(refusal.detail.contains("entity_state.note"), "{refusal:?}");

        let event = decoded(
            r#"{"event_id":"e","entity_id":"a","value":1,"version":18446744073709551615,"payload":{"note":"x"}}"#,
        );
        let refusal = map_row(&state_shape(), &event, position()).expect_err("too big");
        assert_eq!(refusal.reason, DeadLetterReason::InvalidField);
        assert!(
            refusal.detail.contains("entity_state.version"),
            "{refusal:?}"
        );
    }

    #[test]
    fn bad_bytes_are_refused_with_the_envelope_reason() {
        let refusal = decode(Some(b"{\"event_id\":"), 1 << 20).expect_err("truncated");
        assert_eq!(refusal.reason, DeadLetterReason::MalformedJson);
        let refusal = decode(None, 1 << 20).expect_err("tombstone");
        assert_eq!(refusal.reason, DeadLetterReason::EmptyRecord);
    }

    #[test]
    fn a_ledger_record_has_the_fingerprint_of_its_input_event() {
        let input = r#"{"event_id":"e-1","entity_id":"a","value":5,"payload":{"k":1}}"#;
        let ledger = r#"{"event_id":"e-1","entity_id":"a","value":5,"payload":{"k":1},
            "entity_total":12,"entity_count":2,"source":{"topic":"payments","partition":0,"offset":9}}"#;
        assert_eq!(decoded(input).fingerprint, decoded(ledger).fingerprint);
        let other = r#"{"event_id":"e-1","entity_id":"a","value":6,"payload":{"k":1},
            "entity_total":12,"entity_count":2,"source":{"topic":"payments","partition":0,"offset":9}}"#;
        assert_ne!(decoded(input).fingerprint, decoded(other).fingerprint);
        // A plain envelope that only happens to carry one of the fields keeps it in its content.
        let partial =
            r#"{"event_id":"e-1","entity_id":"a","value":5,"payload":{"k":1},"source":"x"}"#;
        assert_ne!(decoded(input).fingerprint, decoded(partial).fingerprint);
        let _ = json!(null);
    }
}
