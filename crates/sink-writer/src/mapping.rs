//! From a Kafka record to the rows it becomes: decode the event under the configured contract
//! (docs/architecture/wire-format.md "Wire format": any JSON object, its id and entity where the
//! operator says), then map it into each target's columns. Pure: no I/O, so every way a record can
//! be refused is unit-tested.
//!
//! A record that cannot be decoded, or whose value does not fit some target's column, is refused
//! as a whole (dead-lettered): one input has exactly one outcome, never a row in one table and a
//! dead letter for another.

use eos_core::{
    DeadLetterReason, EntityId, Event, EventContract, EventEnvelope, EventError, EventId,
    Fingerprint, RecordParts,
};
use serde_json::{Map, Value};
use time::OffsetDateTime;

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
    /// A registry format's value as the JSON event model, or why it does not decode
    /// (`eos_schema::RecordDecoder`, naming the subject and schema id); `None` on a JSON topic,
    /// whose payload is the event. The payload stays the record's own bytes, for a dead letter.
    pub decoded: Option<Result<eos_schema::Decoded<'static>, String>>,
}

/// Why a record is refused: the dead-letter reason code and a detail naming the field or column.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub reason: DeadLetterReason,
    pub detail: String,
}

impl From<EventError> for Refusal {
    fn from(error: EventError) -> Self {
        Self {
            reason: error.reason(),
            detail: error.to_string(),
        }
    }
}

/// The schema a sink checks its events against, besides the contract's id and entity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum EventSchema {
    /// The demo's ledger envelope (docs/ARCHITECTURE.md "Wire format"): `value` a signed 64-bit
    /// integer, `version` unsigned, `occurred_at` RFC 3339, field by field.
    Ledger,
    /// Any JSON object: the targets' columns say what they need of it.
    Any,
}

/// How a sink reads records as events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventFormat {
    /// Where each event keeps its id, entity and time, and the record size limit.
    pub contract: EventContract,
    pub schema: EventSchema,
}

impl EventFormat {
    /// The demo ledger's records, as the sink reads them by default.
    pub fn ledger() -> Self {
        Self {
            contract: EventContract::ledger(),
            schema: EventSchema::Ledger,
        }
    }
}

/// A record that is an event under the contract.
#[derive(Debug, Clone)]
pub struct DecodedEvent {
    pub event_id: EventId,
    pub entity_id: EntityId,
    /// From the contract's event-time pointer, when it has one and the event carries it.
    pub occurred_at: Option<OffsetDateTime>,
    pub fingerprint: Fingerprint,
    /// The record value as JSON, for named fields, `record` and JSON-pointer sources.
    pub raw: Value,
}

/// [`decode`] of a bare value (no key, no headers): what the audit and the benchmarks read the
/// ledger's records with.
pub fn decode_value(value: Option<&[u8]>, format: &EventFormat) -> Result<DecodedEvent, Refusal> {
    decode(
        &InputRecord {
            topic: String::new(),
            partition: 0,
            offset: 0,
            key: None,
            payload: value.map(<[u8]>::to_vec),
            headers: Vec::new(),
            timestamp_ms: None,
            decoded: None,
        },
        format,
    )
}

/// Parses a record under the format's contract (docs/architecture/wire-format.md "Wire format"),
/// with its size limit, and checks the format's schema.
pub fn decode(record: &InputRecord, format: &EventFormat) -> Result<DecodedEvent, Refusal> {
    let contract = &format.contract;
    let headers: Vec<(&str, Option<&[u8]>)> = record
        .headers
        .iter()
        .map(|(key, value)| (key.as_str(), value.as_deref()))
        .collect();
    let (value, content) = match &record.decoded {
        None => (record.payload.as_deref(), None),
        Some(Ok(decoded)) => (Some(&*decoded.value), decoded.content.as_deref()),
        Some(Err(why)) => {
            return Err(Refusal {
                reason: DeadLetterReason::UndecodableRecord,
                detail: why.clone(),
            });
        }
    };
    let mut event = Event::parse(
        contract,
        RecordParts {
            key: record.key.as_deref(),
            value,
            headers: &headers,
        },
    )?;
    if format.schema == EventSchema::Ledger {
        EventEnvelope::check_object(&event.value).map_err(|error| Refusal {
            reason: error.reason(),
            detail: error.to_string(),
        })?;
    }
    // A ledger record keeps the fingerprint of the event the processor read.
    let leave_out: &[&str] = if LEDGER_ADDED_FIELDS
        .iter()
        .all(|field| event.value.contains_key(*field))
    {
        &LEDGER_ADDED_FIELDS
    } else {
        &[]
    };
    // A registry record's fingerprint is of its content (its fields not at their default), so
    // the same event written with a newer compatible schema is not a conflict (docs/schemas.md
    // "Schema evolution").
    match content.and_then(|content| serde_json::from_slice::<Map<String, Value>>(content).ok()) {
        Some(mut content) => {
            event.fingerprint = contract.fingerprint_leaving_out(&mut content, leave_out);
        }
        None if !leave_out.is_empty() => {
            event.fingerprint = contract.fingerprint_leaving_out(&mut event.value, leave_out);
        }
        None => {}
    }
    Ok(DecodedEvent {
        event_id: event.id,
        entity_id: event.entity,
        occurred_at: event.occurred_at,
        fingerprint: event.fingerprint,
        raw: Value::Object(event.value),
    })
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
    let field = |name: &str| event.raw.get(name).cloned().unwrap_or(Value::Null);
    Ok(match source {
        Source::EventId => Value::String(event.event_id.to_string()),
        Source::EntityId => Value::String(event.entity_id.to_string()),
        // The ledger envelope's other fields by name: any event may carry them.
        Source::Value => field("value"),
        Source::Version => field("version"),
        Source::Payload => field("payload"),
        Source::OccurredAt => match event.occurred_at {
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

/// The incoming event's value, stored with a conflict so its content can be inspected.
pub fn incoming_json(event: &DecodedEvent) -> Map<String, Value> {
    event.raw.as_object().cloned().unwrap_or_default()
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

    fn record(payload: Option<&[u8]>) -> InputRecord {
        InputRecord {
            topic: "t".into(),
            partition: 0,
            offset: 7,
            key: None,
            payload: payload.map(<[u8]>::to_vec),
            headers: Vec::new(),
            timestamp_ms: None,
            decoded: None,
        }
    }

    fn decoded(text: &str) -> DecodedEvent {
        decode(&record(Some(text.as_bytes())), &EventFormat::ledger()).expect("valid")
    }

    #[test]
    fn maps_fields_and_pointers() -> Result<(), Refusal> {
        let event = decoded(
            r#"{"event_id":"e-1","entity_id":"17","value":5,"version":3,"payload":{"note":"c"}}"#,
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
        let event = decoded(r#"{"event_id":"e-102","entity_id":"17","value":12500}"#);
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
        let ledger = EventFormat::ledger();
        let refusal = decode(&record(Some(b"{\"event_id\":")), &ledger).expect_err("truncated");
        assert_eq!(refusal.reason, DeadLetterReason::MalformedJson);
        let refusal = decode(&record(None), &ledger).expect_err("tombstone");
        assert_eq!(refusal.reason, DeadLetterReason::EmptyRecord);
        let refusal = decode(&record(Some(br#"{"event_id":"e"}"#)), &ledger).expect_err("entity");
        assert_eq!(refusal.reason, DeadLetterReason::MissingField);
        assert!(refusal.detail.contains("/entity_id"), "{refusal:?}");
    }

    #[test]
    fn any_event_maps_by_its_configured_id_and_pointers() -> Result<(), Refusal> {
        let contract = EventFormat {
            contract: EventContract {
                event_id: eos_core::FieldLocation::Pointer("/auth_id".into()),
                entity: eos_core::FieldLocation::Key,
                occurred_at: Some("/at".into()),
                ..EventContract::default()
            },
            schema: EventSchema::Any,
        };
        let mut input = record(Some(
            br#"{"auth_id":"a-1","amount":"12.50","at":"2026-12-04T10:00:00Z"}"#,
        ));
        input.key = Some(b"card-7".to_vec());
        let event = decode(&input, &contract)?;
        let shape = RowShape {
            table: "card_approvals".into(),
            columns: vec![
                column("event_id", Source::EventId, "text", true),
                column("card", Source::EntityId, "text", true),
                column("amount", Source::Pointer("/amount".into()), "text", true),
                column("at", Source::OccurredAt, "timestamptz", true),
            ],
            key_index: 0,
            version_index: None,
            content_indices: vec![1, 2, 3],
        };
        let row = map_row(&shape, &event, position())?.expect("a row");
        assert_eq!(row.key, "a-1");
        assert_eq!(row.values[1].as_deref(), Some("card-7"));
        assert_eq!(row.values[2].as_deref(), Some("12.50"));
        // Without the key the event has no entity: refused, naming where it was looked for.
        input.key = None;
        let refusal = decode(&input, &contract).expect_err("no entity");
        assert!(refusal.detail.contains("at key"), "{refusal:?}");
        Ok(())
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
