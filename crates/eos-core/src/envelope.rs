//! The event envelope (docs/architecture/wire-format.md "Wire format"): parsing, validation and the
//! identifier newtypes.
//!
//! Parsing never panics and every error names the field it is about, so a dead-letter record says
//! exactly what was wrong with the original bytes.

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::dead_letter::DeadLetterReason;
use crate::fingerprint::Fingerprint;
use crate::strict_json::{self, StrictJsonError};

/// Longest `event_id` / `entity_id` accepted, in bytes.
pub const MAX_ID_BYTES: usize = 128;
/// Default limit on a whole record value; larger records are dead-lettered.
pub const DEFAULT_MAX_RECORD_BYTES: usize = 1024 * 1024;

/// Why bytes are not a valid envelope. Each variant maps to one [`DeadLetterReason`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvelopeError {
    #[error("record has no value")]
    Empty,
    #[error("record is {size} bytes, over the {limit}-byte limit")]
    Oversized { size: usize, limit: usize },
    #[error("record is not valid UTF-8 (first bad byte at {valid_up_to})")]
    InvalidUtf8 { valid_up_to: usize },
    #[error("record is not valid JSON: {0}")]
    MalformedJson(String),
    #[error("record is JSON but not an object")]
    NotAnObject,
    #[error("field `{0}` is missing")]
    MissingField(&'static str),
    #[error("field `{field}` is invalid: {reason}")]
    InvalidField { field: &'static str, reason: String },
    #[error("field `{field}` is {len} bytes, over the {MAX_ID_BYTES}-byte limit")]
    FieldTooLong { field: &'static str, len: usize },
    #[error("record is ambiguous JSON: {0}")]
    DuplicateKey(String),
    #[error("record is ambiguous JSON: {0}")]
    IntegerOutOfRange(String),
    #[error("record is ambiguous JSON: {0}")]
    InexactNumber(String),
}

impl EnvelopeError {
    pub fn reason(&self) -> DeadLetterReason {
        match self {
            Self::Empty => DeadLetterReason::EmptyRecord,
            Self::Oversized { .. } => DeadLetterReason::OversizedRecord,
            Self::InvalidUtf8 { .. } => DeadLetterReason::InvalidUtf8,
            Self::MalformedJson(_) | Self::NotAnObject => DeadLetterReason::MalformedJson,
            Self::MissingField(_) => DeadLetterReason::MissingField,
            Self::InvalidField { .. } => DeadLetterReason::InvalidField,
            Self::FieldTooLong { .. } => DeadLetterReason::FieldTooLong,
            Self::DuplicateKey(_) => DeadLetterReason::DuplicateKey,
            Self::IntegerOutOfRange(_) => DeadLetterReason::IntegerOutOfRange,
            Self::InexactNumber(_) => DeadLetterReason::InexactNumber,
        }
    }

    fn invalid(field: &'static str, reason: impl Into<String>) -> Self {
        Self::InvalidField {
            field,
            reason: reason.into(),
        }
    }
}

fn validate_id(field: &'static str, id: &str) -> Result<(), EnvelopeError> {
    if id.is_empty() {
        return Err(EnvelopeError::invalid(field, "must not be empty"));
    }
    if id.len() > MAX_ID_BYTES {
        return Err(EnvelopeError::FieldTooLong {
            field,
            len: id.len(),
        });
    }
    if id.chars().any(char::is_control) {
        return Err(EnvelopeError::invalid(
            field,
            "must not contain control characters",
        ));
    }
    Ok(())
}

/// A record value as a JSON object: at most `max_record_bytes`, UTF-8, and parsed strictly
/// (duplicate keys and numbers that would round are refused, not guessed at).
pub(crate) fn parse_object(
    bytes: &[u8],
    max_record_bytes: usize,
) -> Result<Map<String, Value>, EnvelopeError> {
    if bytes.is_empty() {
        return Err(EnvelopeError::Empty);
    }
    if bytes.len() > max_record_bytes {
        return Err(EnvelopeError::Oversized {
            size: bytes.len(),
            limit: max_record_bytes,
        });
    }
    let text = std::str::from_utf8(bytes).map_err(|e| EnvelopeError::InvalidUtf8 {
        valid_up_to: e.valid_up_to(),
    })?;
    let value = strict_json::parse(text).map_err(|error| match error {
        StrictJsonError::Malformed(detail) => EnvelopeError::MalformedJson(detail),
        StrictJsonError::DuplicateKey(detail) => {
            EnvelopeError::DuplicateKey(format!("duplicate key {detail}"))
        }
        StrictJsonError::IntegerOutOfRange(detail) => EnvelopeError::IntegerOutOfRange(detail),
        StrictJsonError::InexactNumber(detail) => EnvelopeError::InexactNumber(detail),
    })?;
    match value {
        Value::Object(object) => Ok(object),
        _ => Err(EnvelopeError::NotAnObject),
    }
}

macro_rules! id_newtype {
    ($name:ident, $field:literal, $doc:literal) => {
        #[doc = $doc]
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            pub fn new(id: impl Into<String>) -> Result<Self, EnvelopeError> {
                let id = id.into();
                validate_id($field, &id)?;
                Ok(Self(id))
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl TryFrom<String> for $name {
            type Error = EnvelopeError;
            fn try_from(id: String) -> Result<Self, Self::Error> {
                Self::new(id)
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> String {
                id.0
            }
        }
    };
}

id_newtype!(
    EventId,
    "event_id",
    "One logical fact. Two records with the same `EventId` describe the same fact."
);
id_newtype!(
    EntityId,
    "entity_id",
    "The entity an event belongs to; also the Kafka record key, so per-entity order is kept."
);

/// A validated event. Unknown top-level fields are kept in `extra` (and so in the fingerprint),
/// so a newer producer's fields survive a round trip through an older service.
#[derive(Debug, Clone, PartialEq)]
pub struct EventEnvelope {
    pub event_id: EventId,
    pub entity_id: EntityId,
    /// Minor units (cents).
    pub value: i64,
    pub version: Option<u64>,
    pub payload: Option<Value>,
    pub occurred_at: Option<OffsetDateTime>,
    pub extra: Map<String, Value>,
}

/// The envelope's typed fields, read from an object without taking it apart.
struct Fields {
    event_id: EventId,
    entity_id: EntityId,
    value: i64,
    version: Option<u64>,
    occurred_at: Option<OffsetDateTime>,
}

impl Fields {
    fn of(object: &Map<String, Value>) -> Result<Self, EnvelopeError> {
        let event_id = match object.get("event_id") {
            None | Some(Value::Null) => return Err(EnvelopeError::MissingField("event_id")),
            Some(Value::String(id)) => EventId::new(id.clone())?,
            Some(_) => return Err(EnvelopeError::invalid("event_id", "must be a string")),
        };
        let entity_id = match object.get("entity_id") {
            None | Some(Value::Null) => return Err(EnvelopeError::MissingField("entity_id")),
            Some(Value::String(id)) => EntityId::new(id.clone())?,
            Some(Value::Number(n)) if n.is_i64() || n.is_u64() => EntityId::new(n.to_string())?,
            Some(_) => {
                return Err(EnvelopeError::invalid(
                    "entity_id",
                    "must be a string or an integer",
                ));
            }
        };
        let value = match object.get("value") {
            None | Some(Value::Null) => return Err(EnvelopeError::MissingField("value")),
            Some(Value::Number(n)) => n.as_i64().ok_or_else(|| {
                EnvelopeError::invalid("value", "must be a signed 64-bit integer")
            })?,
            Some(_) => {
                return Err(EnvelopeError::invalid(
                    "value",
                    "must be a signed 64-bit integer",
                ));
            }
        };
        let version = match object.get("version") {
            None | Some(Value::Null) => None,
            Some(Value::Number(n)) => Some(n.as_u64().ok_or_else(|| {
                EnvelopeError::invalid("version", "must be an unsigned 64-bit integer")
            })?),
            Some(_) => {
                return Err(EnvelopeError::invalid(
                    "version",
                    "must be an unsigned 64-bit integer",
                ));
            }
        };
        let occurred_at = match object.get("occurred_at") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(OffsetDateTime::parse(s, &Rfc3339).map_err(|e| {
                EnvelopeError::invalid("occurred_at", format!("not an RFC 3339 timestamp: {e}"))
            })?),
            Some(_) => {
                return Err(EnvelopeError::invalid(
                    "occurred_at",
                    "must be an RFC 3339 string",
                ));
            }
        };
        Ok(Self {
            event_id,
            entity_id,
            value,
            version,
            occurred_at,
        })
    }
}

const KNOWN_FIELDS: [&str; 6] = [
    "event_id",
    "entity_id",
    "value",
    "version",
    "payload",
    "occurred_at",
];

impl EventEnvelope {
    /// Parses a record value with the default size limit.
    pub fn parse(bytes: &[u8]) -> Result<Self, EnvelopeError> {
        Self::parse_with_limit(bytes, DEFAULT_MAX_RECORD_BYTES)
    }

    pub fn parse_with_limit(bytes: &[u8], max_record_bytes: usize) -> Result<Self, EnvelopeError> {
        Self::from_object(parse_object(bytes, max_record_bytes)?)
    }

    /// Validates an already-decoded JSON object.
    pub fn from_object(mut object: Map<String, Value>) -> Result<Self, EnvelopeError> {
        let Fields {
            event_id,
            entity_id,
            value,
            version,
            occurred_at,
        } = Fields::of(&object)?;
        for field in ["event_id", "entity_id", "value", "version", "occurred_at"] {
            object.remove(field);
        }
        let payload = object.remove("payload");
        Ok(Self {
            event_id,
            entity_id,
            value,
            version,
            payload,
            occurred_at,
            extra: object,
        })
    }

    /// Whether `object` is a valid envelope, without taking it apart: what a service that reads
    /// the ledger's records as plain events checks them with.
    pub fn check_object(object: &Map<String, Value>) -> Result<(), EnvelopeError> {
        Fields::of(object).map(|_| ())
    }

    /// The normalised JSON object: `entity_id` as a string, `occurred_at` in RFC 3339.
    pub fn to_json(&self) -> Map<String, Value> {
        self.clone().into_json()
    }

    /// [`EventEnvelope::to_json`], moving `extra` and `payload` into the object instead of
    /// copying them: the processor builds every output this way, and the copy of a 1 KB record's
    /// fields (and its free) showed in its profile.
    pub fn into_json(self) -> Map<String, Value> {
        let mut object = self.extra;
        object.insert(
            "entity_id".to_owned(),
            Value::String(self.entity_id.to_string()),
        );
        object.insert("value".to_owned(), Value::from(self.value));
        if let Some(version) = self.version {
            object.insert("version".to_owned(), Value::from(version));
        }
        if let Some(payload) = self.payload {
            object.insert("payload".to_owned(), payload);
        }
        if let Some(occurred_at) = self.occurred_at
            && let Ok(formatted) = occurred_at.format(&Rfc3339)
        {
            object.insert("occurred_at".to_owned(), Value::String(formatted));
        }
        object.insert(
            "event_id".to_owned(),
            Value::String(self.event_id.to_string()),
        );
        object
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        // Serialising a Map of Values cannot fail.
        serde_json::to_vec(&self.to_json()).unwrap_or_default()
    }

    /// The fingerprint of everything but `event_id` (docs/architecture/wire-format.md "Wire
    /// format").
    pub fn fingerprint(&self) -> Fingerprint {
        // The fields of `content_json`, borrowed: no copy of `extra` and `payload` per record.
        let entity_id = Value::String(self.entity_id.to_string());
        let value = Value::from(self.value);
        let version = self.version.map(Value::from);
        let occurred_at = self
            .occurred_at
            .and_then(|occurred_at| occurred_at.format(&Rfc3339).ok())
            .map(Value::String);
        let known = [
            ("entity_id", Some(&entity_id)),
            ("value", Some(&value)),
            ("version", version.as_ref()),
            ("payload", self.payload.as_ref()),
            ("occurred_at", occurred_at.as_ref()),
        ];
        let mut fields: Vec<(&str, &Value)> = Vec::with_capacity(self.extra.len() + known.len());
        // A known field replaces an `extra` entry of the same name, as in `content_json`.
        fields.extend(
            self.extra
                .iter()
                .map(|(key, value)| (key.as_str(), value))
                .filter(|(key, _)| {
                    !known
                        .iter()
                        .any(|(name, field)| name == key && field.is_some())
                }),
        );
        fields.extend(
            known
                .iter()
                .filter_map(|(name, field)| field.map(|field| (*name, field))),
        );
        Fingerprint::of_json_fields(fields)
    }

    /// Every field but `event_id`, normalised: the object of [`EventEnvelope::to_json`] without
    /// its `event_id` (an `extra` field of that name, possible in an envelope built in code,
    /// stays). The tests' reference for the fingerprint, which borrows the fields instead.
    #[cfg(test)]
    fn content_json(&self) -> Map<String, Value> {
        let mut object = self.to_json();
        match self.extra.get("event_id") {
            Some(extra) => object.insert("event_id".to_owned(), extra.clone()),
            None => object.remove("event_id"),
        };
        object
    }

    /// Whether `name` is one of the envelope's own fields rather than an extra one.
    pub fn is_known_field(name: &str) -> bool {
        KNOWN_FIELDS.contains(&name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<EventEnvelope, EnvelopeError> {
        EventEnvelope::parse(text.as_bytes())
    }

    #[test]
    fn parses_a_full_envelope() -> Result<(), EnvelopeError> {
        let envelope = parse(
            r#"{"event_id":"e-102","entity_id":17,"value":12500,"version":3,
                "payload":{"note":"c"},"occurred_at":"2026-01-02T03:04:05Z","extra":true}"#,
        )?;
        assert_eq!(envelope.event_id.as_str(), "e-102");
        assert_eq!(envelope.entity_id.as_str(), "17");
        assert_eq!(envelope.value, 12500);
        assert_eq!(envelope.version, Some(3));
        assert_eq!(envelope.extra.get("extra"), Some(&Value::Bool(true)));
        let reparsed = EventEnvelope::parse(&envelope.to_bytes())?;
        assert_eq!(reparsed, envelope);
        Ok(())
    }

    #[test]
    fn errors_name_the_field() {
        let cases = [
            (
                r#"{"entity_id":"a","value":1}"#,
                "event_id",
                DeadLetterReason::MissingField,
            ),
            (
                r#"{"event_id":"e","value":1}"#,
                "entity_id",
                DeadLetterReason::MissingField,
            ),
            (
                r#"{"event_id":"e","entity_id":"a"}"#,
                "value",
                DeadLetterReason::MissingField,
            ),
            (
                r#"{"event_id":"e","entity_id":"a","value":1.5}"#,
                "value",
                DeadLetterReason::InvalidField,
            ),
            (
                r#"{"event_id":"e","entity_id":"a","value":"1"}"#,
                "value",
                DeadLetterReason::InvalidField,
            ),
            (
                r#"{"event_id":"e","entity_id":"a","value":9223372036854775808}"#,
                "value",
                DeadLetterReason::InvalidField,
            ),
            (
                r#"{"event_id":"e","entity_id":"a","value":1,"version":-1}"#,
                "version",
                DeadLetterReason::InvalidField,
            ),
            (
                r#"{"event_id":"e","entity_id":"a","value":1,"occurred_at":"yesterday"}"#,
                "occurred_at",
                DeadLetterReason::InvalidField,
            ),
            (
                r#"{"event_id":"","entity_id":"a","value":1}"#,
                "event_id",
                DeadLetterReason::InvalidField,
            ),
            (
                r#"{"event_id":"a\u0007b","entity_id":"a","value":1}"#,
                "event_id",
                DeadLetterReason::InvalidField,
            ),
            (
                r#"{"event_id":7,"entity_id":"a","value":1}"#,
                "event_id",
                DeadLetterReason::InvalidField,
            ),
            (
                r#"{"event_id":"e","entity_id":1.5,"value":1}"#,
                "entity_id",
                DeadLetterReason::InvalidField,
            ),
        ];
        for (text, field, reason) in cases {
            let error = parse(text).expect_err(text);
            assert_eq!(error.reason(), reason, "{text}");
            assert!(error.to_string().contains(field), "{text}: {error}");
        }
    }

    #[test]
    fn rejects_long_ids() {
        let long = "x".repeat(MAX_ID_BYTES + 1);
        let error = parse(&format!(
            r#"{{"event_id":"{long}","entity_id":"a","value":1}}"#
        ))
        .expect_err("too long");
        assert_eq!(error.reason(), DeadLetterReason::FieldTooLong);
        let exact = "x".repeat(MAX_ID_BYTES);
        assert!(
            parse(&format!(
                r#"{{"event_id":"{exact}","entity_id":"a","value":1}}"#
            ))
            .is_ok()
        );
    }

    #[test]
    fn rejects_bad_bytes() {
        assert_eq!(
            EventEnvelope::parse(b"").map_err(|e| e.reason()),
            Err(DeadLetterReason::EmptyRecord)
        );
        assert_eq!(
            EventEnvelope::parse(b"{\"event_id\":\"\xff\"}").map_err(|e| e.reason()),
            Err(DeadLetterReason::InvalidUtf8)
        );
        assert_eq!(
            EventEnvelope::parse(b"{\"event_id\":").map_err(|e| e.reason()),
            Err(DeadLetterReason::MalformedJson)
        );
        assert_eq!(
            EventEnvelope::parse(b"[1,2]").map_err(|e| e.reason()),
            Err(DeadLetterReason::MalformedJson)
        );
        let big = format!(
            r#"{{"event_id":"e","entity_id":"a","value":1,"payload":"{}"}}"#,
            "x".repeat(100)
        );
        assert_eq!(
            EventEnvelope::parse_with_limit(big.as_bytes(), 64).map_err(|e| e.reason()),
            Err(DeadLetterReason::OversizedRecord)
        );
    }

    #[test]
    fn ambiguous_json_is_refused_with_its_own_reason() {
        let cases = [
            (
                r#"{"event_id":"e","entity_id":"a","value":1,"value":2}"#,
                DeadLetterReason::DuplicateKey,
            ),
            (
                r#"{"event_id":"e","entity_id":"a","value":1,"payload":{"x":1,"x":1}}"#,
                DeadLetterReason::DuplicateKey,
            ),
            (
                r#"{"event_id":"e","event_id":"f","entity_id":"a","value":1}"#,
                DeadLetterReason::DuplicateKey,
            ),
            (
                r#"{"event_id":"e","entity_id":"a","value":1,"payload":{"n":18446744073709551616}}"#,
                DeadLetterReason::IntegerOutOfRange,
            ),
            (
                r#"{"event_id":"e","entity_id":"a","value":99999999999999999999999}"#,
                DeadLetterReason::IntegerOutOfRange,
            ),
            (
                r#"{"event_id":"e","entity_id":"a","value":1,"amount":0.10000000000000000001}"#,
                DeadLetterReason::InexactNumber,
            ),
        ];
        for (text, reason) in cases {
            let error = parse(text).expect_err(text);
            assert_eq!(error.reason(), reason, "{text}: {error}");
        }
        // Two inputs serde_json alone would read as the same document now get different answers.
        let a = parse(r#"{"event_id":"e","entity_id":"a","value":1,"amount":0.1}"#);
        let b = parse(
            r#"{"event_id":"e","entity_id":"a","value":1,"amount":0.1000000000000000000001}"#,
        );
        assert!(a.is_ok() && b.is_err());
    }

    #[test]
    fn integer_entity_id_is_the_same_entity_as_its_string() -> Result<(), EnvelopeError> {
        let a = parse(r#"{"event_id":"e","entity_id":17,"value":1}"#)?;
        let b = parse(r#"{"event_id":"e","entity_id":"17","value":1}"#)?;
        assert_eq!(a, b);
        assert_eq!(a.fingerprint(), b.fingerprint());
        Ok(())
    }

    /// The fingerprint is part of the wire format (stored by every sink and by dedup-service):
    /// this one was computed outside Rust, as SHA-256 of the canonical text in the comment.
    #[test]
    fn fingerprint_is_sha256_of_the_canonical_text() -> Result<(), EnvelopeError> {
        let envelope = parse(
            r#"{"value":-5,"payload":{"b":[1.5,2.0,"x\"\n\u00e9"],"a":null},"event_id":"e-1","entity_id":"é"}"#,
        )?;
        // {"entity_id":"é","payload":{"a":null,"b":[1.5,2,"x\"\né"]},"value":-5}
        assert_eq!(
            envelope.fingerprint().to_hex(),
            "8f57c4b06ec890629f91b5fd3b5ac474a5dfd787233fa0d5218a0351dc83f561"
        );
        Ok(())
    }

    /// The fingerprint borrows the fields instead of building `content_json`: the same bytes,
    /// also for an envelope built in code whose `extra` repeats a known field's name.
    #[test]
    fn the_borrowed_fingerprint_is_the_one_of_the_content_object() -> Result<(), EnvelopeError> {
        let mut envelope = parse(
            r#"{"event_id":"e-1","entity_id":"a","value":1,"version":3,"payload":{"k":[1,"x"]},"occurred_at":"2026-01-02T03:04:05Z","note":"n"}"#,
        )?;
        let same = |envelope: &EventEnvelope| {
            assert_eq!(
                envelope.fingerprint(),
                Fingerprint::of_json_object(&envelope.content_json())
            );
        };
        same(&envelope);
        for (key, value) in [
            ("value", Value::from(9)),
            ("entity_id", Value::from("b")),
            ("version", Value::from(7)),
            ("event_id", Value::from("e-9")),
        ] {
            envelope.extra.insert(key.into(), value);
        }
        same(&envelope);
        envelope.version = None;
        envelope.payload = None;
        envelope.occurred_at = None;
        same(&envelope);
        Ok(())
    }

    #[test]
    fn fingerprint_ignores_event_id_but_not_content() -> Result<(), EnvelopeError> {
        let a = parse(r#"{"event_id":"e-1","entity_id":"a","value":1}"#)?;
        let b = parse(r#"{"event_id":"e-2","entity_id":"a","value":1}"#)?;
        let c = parse(r#"{"event_id":"e-1","entity_id":"a","value":2}"#)?;
        assert_eq!(a.fingerprint(), b.fingerprint());
        assert_ne!(a.fingerprint(), c.fingerprint());
        Ok(())
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        /// Arbitrary JSON, numbers of every kind included (64-bit integers, floats, decimals).
        fn arb_json() -> impl Strategy<Value = Value> {
            json_with_floats(any::<f64>().boxed())
        }

        /// JSON whose numbers are all exactly what their text says: floats m / 2^e with at most
        /// 15 significant decimal digits, which the shortest round-trip form prints exactly.
        /// (An arbitrary f64 prints as a shorter decimal that is not its exact value, which an
        /// envelope refuses as inexact_number.)
        fn arb_exact_json() -> impl Strategy<Value = Value> {
            json_with_floats(
                (-(1i32 << 30)..(1i32 << 30), 0i32..=5)
                    .prop_map(|(mantissa, exponent)| f64::from(mantissa) / 2f64.powi(exponent))
                    .boxed(),
            )
        }

        fn json_with_floats(floats: BoxedStrategy<f64>) -> impl Strategy<Value = Value> {
            let leaf = prop_oneof![
                Just(Value::Null),
                any::<bool>().prop_map(Value::Bool),
                any::<i64>().prop_map(Value::from),
                any::<u64>().prop_map(Value::from),
                floats.prop_map(Value::from),
                ".{0,12}".prop_map(Value::String),
            ];
            leaf.prop_recursive(3, 24, 5, |inner| {
                prop_oneof![
                    prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                    prop::collection::btree_map(".{0,4}", inner, 0..4)
                        .prop_map(|m| Value::Object(m.into_iter().collect())),
                ]
            })
        }

        /// An object that is often a valid envelope: the required fields, sometimes of the wrong
        /// type, plus arbitrary others.
        fn arb_envelope_json() -> impl Strategy<Value = Value> {
            (
                prop_oneof![".{1,8}".prop_map(Value::String), arb_json()],
                prop_oneof![
                    ".{1,8}".prop_map(Value::String),
                    any::<i64>().prop_map(Value::from),
                    arb_json()
                ],
                prop_oneof![any::<i64>().prop_map(Value::from), arb_json()],
                prop::collection::btree_map("[a-z_]{1,10}", arb_json(), 0..4),
            )
                .prop_map(|(event_id, entity_id, value, extra)| {
                    let mut object: Map<String, Value> = extra.into_iter().collect();
                    object.insert("event_id".into(), event_id);
                    object.insert("entity_id".into(), entity_id);
                    object.insert("value".into(), value);
                    Value::Object(object)
                })
        }

        /// Every input is accepted, or refused with a reason and a detail; an accepted one keeps
        /// its fingerprint through re-encoding.
        fn check(bytes: &[u8]) -> Result<(), TestCaseError> {
            match EventEnvelope::parse(bytes) {
                Ok(envelope) => {
                    let reparsed = EventEnvelope::parse(&envelope.to_bytes());
                    prop_assert!(reparsed.is_ok(), "re-encoding refused: {:?}", reparsed);
                    let reparsed = reparsed.unwrap_or_else(|_| envelope.clone());
                    prop_assert_eq!(reparsed.fingerprint(), envelope.fingerprint());
                    prop_assert_eq!(
                        envelope.fingerprint(),
                        Fingerprint::of_json_object(&envelope.content_json())
                    );
                    prop_assert_eq!(reparsed, envelope);
                }
                Err(error) => {
                    prop_assert!(DeadLetterReason::ALL.contains(&error.reason()));
                    prop_assert!(!error.to_string().is_empty());
                }
            }
            Ok(())
        }

        proptest! {
            #[test]
            fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
                check(&bytes)?;
            }

            #[test]
            fn arbitrary_json_is_accepted_or_refused_with_a_reason(value in arb_json()) {
                check(value.to_string().as_bytes())?;
            }

            #[test]
            fn envelopes_keep_their_fingerprint_through_re_encoding(value in arb_envelope_json()) {
                check(value.to_string().as_bytes())?;
                check(serde_json::to_string_pretty(&value).unwrap_or_default().as_bytes())?;
            }

            /// Valid by construction, so the re-encoding property is checked on every case.
            #[test]
            fn valid_envelopes_are_accepted_and_keep_their_fingerprint(
                event_id in "[a-z0-9-]{1,16}",
                entity_id in prop_oneof!["[a-z0-9-]{1,16}".prop_map(Value::from), any::<i64>().prop_map(Value::from)],
                value in any::<i64>(),
                payload in arb_exact_json(),
                extra in prop::collection::btree_map("x_[a-z]{1,6}", arb_exact_json(), 0..3),
            ) {
                let mut object: Map<String, Value> = extra.into_iter().collect();
                object.insert("event_id".into(), Value::from(event_id));
                object.insert("entity_id".into(), entity_id);
                object.insert("value".into(), Value::from(value));
                object.insert("payload".into(), payload);
                let text = Value::Object(object).to_string();
                let envelope = EventEnvelope::parse(text.as_bytes());
                prop_assert!(envelope.is_ok(), "{}: {:?}", text, envelope);
                check(text.as_bytes())?;
            }

            #[test]
            fn json_text_with_edits_never_panics(value in arb_envelope_json(), cut in any::<prop::sample::Index>(), byte in any::<u8>()) {
                let mut bytes = value.to_string().into_bytes();
                let at = cut.index(bytes.len().max(1)).min(bytes.len());
                bytes.insert(at, byte);
                check(&bytes)?;
                bytes.truncate(at);
                check(&bytes)?;
            }
        }
    }
}
