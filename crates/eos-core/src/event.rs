//! The general event contract (docs/architecture/wire-format.md "Wire format"): an event is any
//! JSON object, parsed strictly, plus its Kafka key and headers. Each service is told where the
//! three things it needs are — the event id, the entity (the key that orders events and holds
//! state) and, optionally, the event time — as a header, a JSON pointer or the record key
//! ([`FieldLocation`]). Nothing else about the object's shape is assumed here: the ledger
//! envelope ([`crate::EventEnvelope`]) is one schema a transform may check, not the core's.
//!
//! A record whose id or entity is missing, not a string, empty, too long or holds control
//! characters is refused with an error that names the configured location, and so is its dead
//! letter's detail.

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;

use serde_json::{Map, Value};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::dead_letter::DeadLetterReason;
use crate::envelope::{
    DEFAULT_MAX_RECORD_BYTES, EntityId, EnvelopeError, EventId, MAX_ID_BYTES, parse_object,
};
use crate::fingerprint::Fingerprint;

/// Where a service finds one of an event's parts.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum FieldLocation {
    /// A Kafka header of this name (its bytes, UTF-8).
    Header(String),
    /// A JSON pointer (RFC 6901) into the record's value, such as `/id` or `/order/id`.
    Pointer(String),
    /// The Kafka record key (its bytes, UTF-8).
    Key,
}

/// A location that cannot be parsed from its text form.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{0:?} is not a field location: expected `key`, `header:<name>` or a JSON pointer such as `/id`"
)]
pub struct InvalidFieldLocation(String);

impl FromStr for FieldLocation {
    type Err = InvalidFieldLocation;

    /// `key`, `header:<name>` or a JSON pointer (`/…`).
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if text == "key" {
            return Ok(Self::Key);
        }
        if let Some(name) = text.strip_prefix("header:")
            && !name.is_empty()
        {
            return Ok(Self::Header(name.to_owned()));
        }
        if text.starts_with('/') && valid_pointer_escapes(text) {
            return Ok(Self::Pointer(text.to_owned()));
        }
        Err(InvalidFieldLocation(text.to_owned()))
    }
}

/// RFC 6901: `~` is only ever followed by `0` or `1`.
fn valid_pointer_escapes(pointer: &str) -> bool {
    let mut chars = pointer.chars();
    while let Some(c) = chars.next() {
        if c == '~' && !matches!(chars.next(), Some('0' | '1')) {
            return false;
        }
    }
    true
}

impl fmt::Display for FieldLocation {
    /// The form [`FieldLocation::from_str`] reads, which is also how errors name it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Header(name) => write!(f, "header:{name}"),
            Self::Pointer(pointer) => f.write_str(pointer),
            Self::Key => f.write_str("key"),
        }
    }
}

/// Where a service finds each part of an event, and how large a record may be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventContract {
    /// The event id: one logical fact. Default: the `event_id` header.
    pub event_id: FieldLocation,
    /// The entity: orders the entity's events and keys its state. Default: the record key.
    pub entity: FieldLocation,
    /// A JSON pointer to the event time (an RFC 3339 string), used for the replay horizon; without
    /// one (or when the field is absent) the record's timestamp is the event time.
    pub occurred_at: Option<String>,
    /// Larger record values are refused (`oversized_record`).
    pub max_record_bytes: usize,
}

impl Default for EventContract {
    fn default() -> Self {
        Self {
            event_id: FieldLocation::Header("event_id".to_owned()),
            entity: FieldLocation::Key,
            occurred_at: None,
            max_record_bytes: DEFAULT_MAX_RECORD_BYTES,
        }
    }
}

impl EventContract {
    /// The fingerprint [`Event::parse`] gives `value`, computed as if the top-level fields
    /// `leave_out` were not there: a service that reads another service's output leaves out what
    /// that service added (the sink, the processor ledger's running totals), so an event keeps
    /// the fingerprint it had at the first boundary. The fields are put back.
    pub fn fingerprint_leaving_out(
        &self,
        value: &mut Map<String, Value>,
        leave_out: &[&str],
    ) -> Fingerprint {
        let taken: Vec<(String, Value)> = leave_out
            .iter()
            .filter_map(|field| value.remove_entry(*field))
            .collect();
        let fingerprint = match &self.event_id {
            FieldLocation::Pointer(pointer) => fingerprint_without(value, pointer),
            FieldLocation::Header(_) | FieldLocation::Key => Fingerprint::of_json_object(value),
        };
        value.extend(taken);
        fingerprint
    }

    /// The demo ledger's schema: id, entity and time in the JSON object itself.
    pub fn ledger() -> Self {
        Self {
            event_id: FieldLocation::Pointer("/event_id".to_owned()),
            entity: FieldLocation::Pointer("/entity_id".to_owned()),
            occurred_at: Some("/occurred_at".to_owned()),
            max_record_bytes: DEFAULT_MAX_RECORD_BYTES,
        }
    }
}

/// A Kafka record as the contract reads it.
#[derive(Debug, Clone, Copy)]
pub struct RecordParts<'a> {
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
    pub headers: &'a [(&'a str, Option<&'a [u8]>)],
}

/// Why a record is not an event under the contract. Each variant maps to one
/// [`DeadLetterReason`]; the located ones name the configured location.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EventError {
    /// The value is not a strictly parsed JSON object of the allowed size.
    #[error(transparent)]
    Record(#[from] EnvelopeError),
    #[error("{part} is missing at {location}")]
    Missing {
        part: &'static str,
        location: String,
    },
    #[error("{part} at {location} is invalid: {reason}")]
    Invalid {
        part: &'static str,
        location: String,
        reason: String,
    },
    #[error("{part} at {location} is {len} bytes, over the {MAX_ID_BYTES}-byte limit")]
    TooLong {
        part: &'static str,
        location: String,
        len: usize,
    },
}

impl EventError {
    pub fn reason(&self) -> DeadLetterReason {
        match self {
            Self::Record(error) => error.reason(),
            Self::Missing { .. } => DeadLetterReason::MissingField,
            Self::Invalid { .. } => DeadLetterReason::InvalidField,
            Self::TooLong { .. } => DeadLetterReason::FieldTooLong,
        }
    }
}

/// A record that is an event under its contract.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub id: EventId,
    pub entity: EntityId,
    /// From the contract's `occurred_at` pointer; `None` when there is none or it is absent.
    pub occurred_at: Option<OffsetDateTime>,
    /// The record's value, as parsed.
    pub value: Map<String, Value>,
    pub key: Option<Vec<u8>>,
    pub headers: Vec<(String, Option<Vec<u8>>)>,
    /// Of the value without the id's own field (see [`Event::parse`]).
    pub fingerprint: Fingerprint,
}

impl Event {
    /// Parses a record under `contract`. The value must be a JSON object, parsed strictly
    /// (duplicate keys, integers beyond 64 bits and inexact numbers are refused). The
    /// fingerprint is of the whole object, less the id's field when the id is read from the
    /// object: a re-delivery with other headers or another timestamp is the same event.
    pub fn parse(contract: &EventContract, record: RecordParts<'_>) -> Result<Self, EventError> {
        let value = parse_object(record.value.unwrap_or_default(), contract.max_record_bytes)?;
        let id = EventId::new(located_id("event id", &contract.event_id, &record, &value)?)
            .map_err(|error| at_location(error, "event id", &contract.event_id))?;
        let entity = EntityId::new(located_id("entity", &contract.entity, &record, &value)?)
            .map_err(|error| at_location(error, "entity", &contract.entity))?;
        let occurred_at = match &contract.occurred_at {
            None => None,
            Some(pointer) => occurred_at(pointer, &value)?,
        };
        let mut value = value;
        let fingerprint = contract.fingerprint_leaving_out(&mut value, &[]);
        Ok(Self {
            id,
            entity,
            occurred_at,
            value,
            key: record.key.map(<[u8]>::to_vec),
            headers: owned_headers(record.headers),
            fingerprint,
        })
    }

    /// The value of the first header named `name`.
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(key, _)| key == name)
            .and_then(|(_, value)| value.as_deref())
    }
}

fn owned_headers(headers: &[(&str, Option<&[u8]>)]) -> Vec<(String, Option<Vec<u8>>)> {
    headers
        .iter()
        .map(|(key, value)| ((*key).to_owned(), value.map(<[u8]>::to_vec)))
        .collect()
}

/// The text at `location`, before the id rules are checked.
fn located_id(
    part: &'static str,
    location: &FieldLocation,
    record: &RecordParts<'_>,
    value: &Map<String, Value>,
) -> Result<String, EventError> {
    let missing = || EventError::Missing {
        part,
        location: location.to_string(),
    };
    let utf8 = |bytes: &[u8]| {
        String::from_utf8(bytes.to_vec()).map_err(|_| EventError::Invalid {
            part,
            location: location.to_string(),
            reason: "is not UTF-8".to_owned(),
        })
    };
    match location {
        FieldLocation::Key => utf8(record.key.ok_or_else(missing)?),
        FieldLocation::Header(name) => {
            let found = record
                .headers
                .iter()
                .find(|(key, _)| key == name)
                .and_then(|(_, value)| *value)
                .ok_or_else(missing)?;
            utf8(found)
        }
        FieldLocation::Pointer(pointer) => match pointer_in(value, pointer) {
            None | Some(Value::Null) => Err(missing()),
            Some(Value::String(text)) => Ok(text.clone()),
            Some(_) => Err(EventError::Invalid {
                part,
                location: location.to_string(),
                reason: "must be a string".to_owned(),
            }),
        },
    }
}

/// The id rules' error ([`EventId::new`]), told at the configured location.
fn at_location(error: EnvelopeError, part: &'static str, location: &FieldLocation) -> EventError {
    let location = location.to_string();
    match error {
        EnvelopeError::FieldTooLong { len, .. } => EventError::TooLong {
            part,
            location,
            len,
        },
        EnvelopeError::InvalidField { reason, .. } => EventError::Invalid {
            part,
            location,
            reason,
        },
        other => EventError::Invalid {
            part,
            location,
            reason: other.to_string(),
        },
    }
}

fn occurred_at(
    pointer: &str,
    value: &Map<String, Value>,
) -> Result<Option<OffsetDateTime>, EventError> {
    let invalid = |reason: String| EventError::Invalid {
        part: "occurred_at",
        location: pointer.to_owned(),
        reason,
    };
    match pointer_in(value, pointer) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => OffsetDateTime::parse(text, &Rfc3339)
            .map(Some)
            .map_err(|e| invalid(format!("not an RFC 3339 timestamp: {e}"))),
        Some(_) => Err(invalid("must be an RFC 3339 string".to_owned())),
    }
}

/// `serde_json`'s pointer lookup, from an object rather than a `Value`.
fn pointer_in<'a>(object: &'a Map<String, Value>, pointer: &str) -> Option<&'a Value> {
    let (first, rest) = split_pointer(pointer)?;
    let value = object.get(first.as_ref())?;
    if rest.is_empty() {
        Some(value)
    } else {
        value.pointer(rest)
    }
}

/// The first token of a pointer (unescaped) and the pointer of the rest.
fn split_pointer(pointer: &str) -> Option<(Cow<'_, str>, &str)> {
    let tail = pointer.strip_prefix('/')?;
    let (first, rest) = match tail.find('/') {
        Some(end) => (&tail[..end], &tail[end..]),
        None => (tail, ""),
    };
    Some((unescape_token(first), rest))
}

/// A pointer token with its RFC 6901 escapes undone; most have none, and are not copied (three
/// lookups per record: the copies showed in the processor's profile).
fn unescape_token(token: &str) -> Cow<'_, str> {
    if token.contains('~') {
        Cow::Owned(token.replace("~1", "/").replace("~0", "~"))
    } else {
        Cow::Borrowed(token)
    }
}

/// The fingerprint of `object` without the field at `pointer`, which is taken out for it and put
/// back after (no copy of the object per record), so the transform sees the record as it came.
/// A top-level field is just skipped while the canonical text is written.
fn fingerprint_without(object: &mut Map<String, Value>, pointer: &str) -> Fingerprint {
    if let Some((field, "")) = split_pointer(pointer) {
        return Fingerprint::of_json_fields(
            object
                .iter()
                .filter(|(key, _)| key.as_str() != field)
                .map(|(key, value)| (key.as_str(), value))
                .collect(),
        );
    }
    let mut content = Value::Object(std::mem::take(object));
    let removed = remove_at(&mut content, pointer);
    let fingerprint = Fingerprint::of_json(&content);
    if let Value::Object(content) = content {
        *object = content;
    }
    if let Some(removed) = removed {
        insert_at(object, pointer, removed);
    }
    fingerprint
}

/// Removes the value at `pointer` and returns it, if there is one.
fn remove_at(value: &mut Value, pointer: &str) -> Option<Value> {
    let cut = pointer.rfind('/')?;
    let (parent, last) = (&pointer[..cut], &pointer[cut + 1..]);
    let last = unescape_token(last);
    match value.pointer_mut(parent)? {
        Value::Object(object) => object.remove(last.as_ref()),
        Value::Array(items) => {
            let index = last.parse::<usize>().ok().filter(|i| *i < items.len())?;
            Some(items.remove(index))
        }
        _ => None,
    }
}

/// Puts `value` back at `pointer`, whose parent exists (it held the value a moment ago).
fn insert_at(object: &mut Map<String, Value>, pointer: &str, value: Value) {
    let Some(cut) = pointer.rfind('/') else {
        return;
    };
    let (parent, last) = (&pointer[..cut], &pointer[cut + 1..]);
    let last = unescape_token(last).into_owned();
    if parent.is_empty() {
        object.insert(last, value);
        return;
    }
    let Some((first, rest)) = split_pointer(parent) else {
        return;
    };
    let Some(child) = object.get_mut(first.as_ref()) else {
        return;
    };
    let parent_value = if rest.is_empty() {
        Some(child)
    } else {
        child.pointer_mut(rest)
    };
    match parent_value {
        Some(Value::Object(parent)) => {
            parent.insert(last, value);
        }
        Some(Value::Array(items)) => {
            if let Ok(index) = last.parse::<usize>()
                && index <= items.len()
            {
                items.insert(index, value);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(
        contract: &EventContract,
        key: Option<&str>,
        value: &str,
        headers: &[(&str, Option<&[u8]>)],
    ) -> Result<Event, EventError> {
        Event::parse(
            contract,
            RecordParts {
                key: key.map(str::as_bytes),
                value: Some(value.as_bytes()),
                headers,
            },
        )
    }

    #[test]
    fn locations_read_and_print_the_same() -> Result<(), InvalidFieldLocation> {
        for (text, location) in [
            ("key", FieldLocation::Key),
            ("header:event_id", FieldLocation::Header("event_id".into())),
            ("/id", FieldLocation::Pointer("/id".into())),
            ("/order/a~1b", FieldLocation::Pointer("/order/a~1b".into())),
        ] {
            assert_eq!(text.parse::<FieldLocation>()?, location);
            assert_eq!(location.to_string(), text);
        }
        for bad in ["", "id", "header:", "/a~2", "/a~", "Key"] {
            let error = bad.parse::<FieldLocation>().expect_err(bad);
            assert!(error.to_string().contains("JSON pointer"), "{error}");
        }
        Ok(())
    }

    #[test]
    fn the_default_contract_reads_the_id_header_and_the_key() -> Result<(), EventError> {
        let event = parse(
            &EventContract::default(),
            Some("card-7"),
            r#"{"amount":"12.50","currency":"EUR"}"#,
            &[
                ("traceparent", Some(b"00-x")),
                ("event_id", Some(b"auth-1")),
            ],
        )?;
        assert_eq!(event.id.as_str(), "auth-1");
        assert_eq!(event.entity.as_str(), "card-7");
        assert_eq!(event.occurred_at, None);
        assert_eq!(event.value["amount"], "12.50");
        assert_eq!(event.header("traceparent"), Some(&b"00-x"[..]));
        Ok(())
    }

    #[test]
    fn pointers_read_nested_fields_and_the_time() -> Result<(), EventError> {
        let contract = EventContract {
            event_id: "/meta/id".parse().map_err(|_| EventError::Missing {
                part: "test",
                location: String::new(),
            })?,
            entity: FieldLocation::Pointer("/card".into()),
            occurred_at: Some("/meta/at".into()),
            ..EventContract::default()
        };
        let event = parse(
            &contract,
            None,
            r#"{"card":"c-1","meta":{"id":"a-9","at":"2026-12-01T10:00:00Z"},"n":1}"#,
            &[],
        )?;
        assert_eq!(event.id.as_str(), "a-9");
        assert_eq!(event.entity.as_str(), "c-1");
        assert_eq!(
            event.occurred_at.map(OffsetDateTime::unix_timestamp),
            Some(1_796_119_200)
        );
        // The id stays in the value the transform sees.
        assert_eq!(event.value["meta"]["id"], "a-9");
        Ok(())
    }

    #[test]
    fn the_fingerprint_leaves_out_the_id_field_only() -> Result<(), EventError> {
        let contract = EventContract {
            event_id: FieldLocation::Pointer("/id".into()),
            ..EventContract::default()
        };
        let one = parse(&contract, Some("k"), r#"{"id":"a","n":1}"#, &[])?;
        let again = parse(
            &contract,
            Some("k"),
            r#"{ "n" : 1, "id" : "b" }"#,
            &[("traceparent", Some(b"other"))],
        )?;
        let changed = parse(&contract, Some("k"), r#"{"id":"a","n":2}"#, &[])?;
        assert_eq!(one.fingerprint, again.fingerprint);
        assert_ne!(one.fingerprint, changed.fingerprint);
        // A top-level id is skipped, a nested one taken out: both are the rest's fingerprint.
        let rest = Fingerprint::of_json(&serde_json::json!({"n": 1}));
        assert_eq!(one.fingerprint, rest);
        let escaped = EventContract {
            event_id: FieldLocation::Pointer("/a~1b".into()),
            ..EventContract::default()
        };
        let escaped = parse(&escaped, Some("k"), r#"{"a/b":"a","n":1}"#, &[])?;
        assert_eq!(escaped.fingerprint, rest);
        let nested = EventContract {
            event_id: FieldLocation::Pointer("/m/id".into()),
            ..EventContract::default()
        };
        let nested = parse(&nested, Some("k"), r#"{"m":{"id":"a"},"n":1}"#, &[])?;
        assert_eq!(
            nested.fingerprint,
            Fingerprint::of_json(&serde_json::json!({"m": {}, "n": 1}))
        );
        assert_eq!(nested.value["m"]["id"], "a");
        // The ledger envelope's fingerprint is the same for the same (normalised) object, so
        // stored fingerprints stay valid when the ledger is read through its contract.
        let text = r#"{"event_id":"e-1","entity_id":"17","value":5,"payload":{"x":[1,2]}}"#;
        let envelope = crate::EventEnvelope::parse(text.as_bytes())?;
        let event = parse(&EventContract::ledger(), None, text, &[])?;
        assert_eq!(event.fingerprint, envelope.fingerprint());
        // Read from a header, the id is not part of the value: the whole object counts.
        let by_header = parse(
            &EventContract::default(),
            Some("k"),
            r#"{"n":1}"#,
            &[("event_id", Some(b"a"))],
        )?;
        assert_eq!(
            by_header.fingerprint,
            Fingerprint::of_json(&serde_json::json!({"n": 1}))
        );
        // Fields another service added can be left out, and are put back.
        let mut added = serde_json::json!({"id": "a", "n": 1, "total": 9})
            .as_object()
            .cloned()
            .unwrap_or_default();
        assert_eq!(
            contract.fingerprint_leaving_out(&mut added, &["total"]),
            one.fingerprint
        );
        assert_eq!(added["total"], 9);
        Ok(())
    }

    #[test]
    fn a_missing_or_bad_id_or_entity_names_its_location() {
        let contract = EventContract::default();
        let long = "x".repeat(MAX_ID_BYTES + 1);
        type Headers<'a> = &'a [(&'a str, Option<&'a [u8]>)];
        let cases: [(Option<&str>, Headers<'_>, DeadLetterReason, &str); 6] = [
            (
                Some("k"),
                &[],
                DeadLetterReason::MissingField,
                "header:event_id",
            ),
            (
                Some("k"),
                &[("event_id", None)],
                DeadLetterReason::MissingField,
                "header:event_id",
            ),
            (
                Some("k"),
                &[("event_id", Some(b"\xff"))],
                DeadLetterReason::InvalidField,
                "header:event_id",
            ),
            (
                Some("k"),
                &[("event_id", Some(b""))],
                DeadLetterReason::InvalidField,
                "header:event_id",
            ),
            (
                None,
                &[("event_id", Some(b"e"))],
                DeadLetterReason::MissingField,
                "key",
            ),
            (
                Some(&long),
                &[("event_id", Some(b"e"))],
                DeadLetterReason::FieldTooLong,
                "key",
            ),
        ];
        for (key, headers, reason, location) in cases {
            let error = parse(&contract, key, "{}", headers).expect_err(location);
            assert_eq!(error.reason(), reason, "{error}");
            assert!(error.to_string().contains(location), "{error}");
        }
        let by_pointer = EventContract {
            event_id: FieldLocation::Pointer("/id".into()),
            entity: FieldLocation::Pointer("/card".into()),
            occurred_at: Some("/at".into()),
            ..EventContract::default()
        };
        for (value, reason, location) in [
            (r#"{"card":"c"}"#, DeadLetterReason::MissingField, "/id"),
            (
                r#"{"id":null,"card":"c"}"#,
                DeadLetterReason::MissingField,
                "/id",
            ),
            (
                r#"{"id":7,"card":"c"}"#,
                DeadLetterReason::InvalidField,
                "/id",
            ),
            (
                r#"{"id":"a","card":17}"#,
                DeadLetterReason::InvalidField,
                "/card",
            ),
            (
                r#"{"id":"a\u0007","card":"c"}"#,
                DeadLetterReason::InvalidField,
                "/id",
            ),
            (
                r#"{"id":"a","card":"c","at":"noon"}"#,
                DeadLetterReason::InvalidField,
                "/at",
            ),
            (
                r#"{"id":"a","card":"c","at":5}"#,
                DeadLetterReason::InvalidField,
                "/at",
            ),
        ] {
            let error = parse(&by_pointer, None, value, &[]).expect_err(value);
            assert_eq!(error.reason(), reason, "{value}: {error}");
            assert!(error.to_string().contains(location), "{error}");
        }
    }

    #[test]
    fn the_value_is_still_parsed_strictly() {
        let headers: &[(&str, Option<&[u8]>)] = &[("event_id", Some(b"e"))];
        for (value, reason) in [
            (r#"{"a":1,"a":2}"#, DeadLetterReason::DuplicateKey),
            (
                r#"{"a":18446744073709551616}"#,
                DeadLetterReason::IntegerOutOfRange,
            ),
            (
                r#"{"a":0.10000000000000000001}"#,
                DeadLetterReason::InexactNumber,
            ),
            ("[1]", DeadLetterReason::MalformedJson),
            ("{", DeadLetterReason::MalformedJson),
            ("", DeadLetterReason::EmptyRecord),
        ] {
            let error =
                parse(&EventContract::default(), Some("k"), value, headers).expect_err(value);
            assert_eq!(error.reason(), reason, "{value}");
        }
        let small = EventContract {
            max_record_bytes: 8,
            ..EventContract::default()
        };
        let error =
            parse(&small, Some("k"), r#"{"a":"0123456789"}"#, headers).expect_err("over the limit");
        assert_eq!(error.reason(), DeadLetterReason::OversizedRecord);
    }
}
