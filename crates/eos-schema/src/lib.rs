//! Schema-registry formats for eos-suite's boundaries (docs/schemas.md): a client of the
//! Confluent-compatible registry API ([`registry`]: Confluent's own, or Apicurio's
//! `/apis/ccompat/v7`, which the local stack runs), the Confluent wire format ([`wire`]: magic
//! byte, schema id, payload; Protobuf's message-index list), and records to and from the JSON
//! event model that transforms already see, whatever the topic's format: Avro datums ([`avro`],
//! with schema resolution from the writer's schema to a reader's), Protobuf messages
//! ([`protobuf`]) and JSON checked against a JSON Schema ([`json_schema`]).
//!
//! Guarantees: the registry is asked once per schema, never once per record, and a schema's text
//! is parsed once per id (ids, subjects' schemas and parsed schemas are cached; a subject's latest
//! version for a set time); a value is encoded only when all of it fits its schema, nothing
//! rounded or dropped, and a misfit says where; bytes decode only when they are exactly the
//! record of the schema their id names. Every failure is a [`SchemaError`] whose variant says
//! whether to retry (the registry unreachable) or to dead-letter the record (bytes or ids that
//! are wrong).

pub mod avro;
mod avro_references;
pub mod error;
pub mod json_schema;
pub mod protobuf;
pub mod record_decoder;
pub mod registry;
mod schema_id;
pub mod topic_schemas;
pub mod wire;

pub use avro::AvroSchema;
pub use error::SchemaError;
pub use json_schema::JsonSchema;
pub use protobuf::ProtobufSchema;
pub use record_decoder::{Decoded, ReaderSchema, RecordDecoder, RecordFormat, RegistryFlags};
pub use registry::{
    ParsedSchema, RegistryClient, RegistryConfig, Schema, SchemaReference, SchemaType,
    SubjectVersion,
};
pub use schema_id::SchemaId;
pub use topic_schemas::{
    SchemaVersion, SubjectSchema, TopicSchemaError, TopicSchemas, TopicSubject,
};

/// What kind of JSON value `json` is, as a misfit's message names it ("a string is not …").
fn json_kind(json: &serde_json::Value) -> &'static str {
    use serde_json::Value as Json;
    match json {
        Json::Null => "null",
        Json::Bool(_) => "a boolean",
        Json::Number(_) => "a number",
        Json::String(_) => "a string",
        Json::Array(_) => "an array",
        Json::Object(_) => "an object",
    }
}
