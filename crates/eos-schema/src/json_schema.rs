//! JSON records checked against a registered JSON Schema: the Confluent wire header (magic byte,
//! schema id) and the value as JSON text. The event model is the JSON itself; the schema only
//! says which values may pass, on the way out (encode) and on the way in (decode).
//!
//! The schema is compiled once per schema id ([`crate::RegistryClient::json_schema`] keeps it)
//! by the `jsonschema` crate, built without remote `$ref` resolution: a schema refers only to
//! itself, so validating a record never reaches the network or the file system.

use serde_json::Value as Json;

use crate::error::SchemaError;
use crate::schema_id::SchemaId;
use crate::wire;

/// A compiled JSON Schema, ready to validate values.
#[derive(Debug)]
pub struct JsonSchema {
    validator: jsonschema::Validator,
    label: String,
}

impl JsonSchema {
    /// Compiles a JSON Schema's text (its `$schema` picks the draft; 2020-12 without one);
    /// `label` names it in errors (`id 7`).
    pub fn parse(text: &str, label: impl Into<String>) -> Result<Self, SchemaError> {
        let label = label.into();
        let invalid = |detail: String| SchemaError::InvalidSchema {
            schema: label.clone(),
            detail,
        };
        let schema: Json =
            serde_json::from_str(text).map_err(|error| invalid(format!("not JSON: {error}")))?;
        let validator =
            jsonschema::validator_for(&schema).map_err(|error| invalid(error.to_string()))?;
        Ok(JsonSchema { validator, label })
    }

    /// What errors call this schema.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// `Ok` when `value` fits the schema; otherwise the first misfit, with where.
    pub fn validate(&self, value: &Json) -> Result<(), SchemaError> {
        match self.validator.validate(value) {
            Ok(()) => Ok(()),
            Err(error) => Err(SchemaError::DoesNotFit {
                schema: self.label.clone(),
                path: json_path(error.instance_path()),
                detail: error.to_string(),
            }),
        }
    }

    /// The JSON text of `value`, which must fit the schema.
    pub fn encode(&self, value: &Json) -> Result<Vec<u8>, SchemaError> {
        self.validate(value)?;
        serde_json::to_vec(value).map_err(|error| SchemaError::DoesNotFit {
            schema: self.label.clone(),
            path: "$".into(),
            detail: error.to_string(),
        })
    }

    /// `value` checked and framed with `schema_id`, as Confluent's `JSONSerializer` writes it.
    pub fn encode_framed(&self, schema_id: SchemaId, value: &Json) -> Result<Vec<u8>, SchemaError> {
        Ok(wire::frame(schema_id, &self.encode(value)?))
    }

    /// The value of a payload after the wire header: JSON text that fits the schema. A record
    /// that does not fit is [`SchemaError::Undecodable`] (a dead letter), naming where.
    pub fn decode(&self, payload: &[u8]) -> Result<Json, SchemaError> {
        let undecodable = |detail: String| SchemaError::Undecodable {
            schema: self.label.clone(),
            detail,
        };
        let value: Json = serde_json::from_slice(payload)
            .map_err(|error| undecodable(format!("not JSON: {error}")))?;
        match self.validate(&value) {
            Ok(()) => Ok(value),
            Err(SchemaError::DoesNotFit { path, detail, .. }) => {
                Err(undecodable(format!("at {path}: {detail}")))
            }
            Err(other) => Err(other),
        }
    }
}

/// A JSON Pointer (`/items/2/name`) as the path the other codecs give (`$.items[2].name`).
fn json_path(pointer: &jsonschema::paths::Location) -> String {
    let mut path = String::from("$");
    for segment in pointer.iter() {
        match segment {
            jsonschema::paths::LocationSegment::Index(i) => path.push_str(&format!("[{i}]")),
            jsonschema::paths::LocationSegment::Property(name) => {
                path.push('.');
                path.push_str(&name);
            }
        }
    }
    path
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const PAYMENT: &str = r#"{
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": "Payment",
        "type": "object",
        "properties": {
            "id": {"type": "string"},
            "amount": {"type": "number", "minimum": 0},
            "items": {"type": "array", "items": {
                "type": "object",
                "properties": {"sku": {"type": "string"}},
                "required": ["sku"]
            }}
        },
        "required": ["id", "amount"],
        "additionalProperties": false
    }"#;

    fn schema() -> JsonSchema {
        JsonSchema::parse(PAYMENT, "test").expect("compiles")
    }

    #[test]
    fn a_value_that_fits_round_trips_with_the_header() {
        let payment = schema();
        let value = json!({"id": "p-1", "amount": 12.5, "items": [{"sku": "a"}]});
        let framed = payment.encode_framed(SchemaId(3), &value).expect("fits");
        assert_eq!(&framed[..5], b"\x00\x00\x00\x00\x03");
        let unframed = wire::unframe(&framed).expect("framed");
        assert_eq!(unframed.schema_id, SchemaId(3));
        assert_eq!(payment.decode(unframed.payload).expect("decodes"), value);
    }

    #[test]
    fn a_value_that_does_not_fit_is_refused_with_where() {
        let payment = schema();
        for (value, path) in [
            (json!({"id": "p", "amount": -1}), "$.amount"),
            (
                json!({"id": "p", "amount": 1, "items": [{"sku": "a"}, {"sku": 7}]}),
                "$.items[1].sku",
            ),
            (json!({"id": "p"}), "$"),
            (json!({"id": "p", "amount": 1, "extra": true}), "$"),
        ] {
            match payment.encode(&value) {
                Err(SchemaError::DoesNotFit { path: at, .. }) => assert_eq!(at, path, "{value}"),
                other => panic!("{value}: {other:?}"),
            }
        }
    }

    #[test]
    fn a_payload_that_is_not_json_or_does_not_fit_does_not_decode() {
        let payment = schema();
        for payload in [&b"{\"id\":"[..], b"{\"id\": \"p\", \"amount\": \"1\"}"] {
            let error = payment.decode(payload).expect_err("refused");
            assert!(matches!(error, SchemaError::Undecodable { .. }), "{error}");
        }
        let error = payment
            .decode(br#"{"id": "p", "amount": "1"}"#)
            .expect_err("a string amount");
        assert!(error.to_string().contains("at $.amount"), "{error}");
    }

    #[test]
    fn a_schema_that_does_not_compile_says_which() {
        for text in ["{", r#"{"type": "no-such-type"}"#] {
            let error = JsonSchema::parse(text, "id 9").expect_err("invalid");
            assert!(error.to_string().starts_with("schema id 9: "), "{error}");
        }
    }
}
