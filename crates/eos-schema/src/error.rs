//! The one error type at this crate's boundary. Its variants are what a caller does differently:
//! retry later ([`SchemaError::is_transient`]: the registry unreachable or failing), dead-letter
//! the record (bytes that are not the wire format or do not decode, an unknown schema id, a
//! value that does not fit its schema), or stop and fix the configuration (an unknown subject, a
//! schema the registry refuses).

use crate::schema_id::SchemaId;

#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    /// The registry did not answer: connection refused, timed out, or a broken answer body.
    /// Transient: nothing is known about the schema, so the record waits, it is never skipped.
    #[error("schema registry {url} unreachable: {detail}")]
    Unreachable { url: String, detail: String },
    /// The registry answered with a server error (5xx). Transient, as above.
    #[error("schema registry {url} failed ({status}): {message}")]
    RegistryFailed {
        url: String,
        status: u16,
        message: String,
    },
    /// No schema has this id (Confluent error 40403).
    #[error("schema id {id} is not in the registry")]
    UnknownSchemaId { id: SchemaId },
    /// The subject has no versions (40401), or not the one asked for (40402).
    #[error("subject {subject:?} {detail}")]
    UnknownSubject { subject: String, detail: String },
    /// The schema is not registered under the subject (a lookup's 40403).
    #[error("the schema is not registered under subject {subject:?}")]
    NotRegistered { subject: String },
    /// Registering was refused: incompatible with the subject's earlier versions (409) or an
    /// invalid schema (422).
    #[error(
        "schema registry refused the schema for subject {subject:?} ({status}, error {error_code}): {message}"
    )]
    Refused {
        subject: String,
        status: u16,
        error_code: i64,
        message: String,
    },
    /// Any other answer the client does not expect (a 4xx such as 401 or 403).
    #[error("schema registry {url} answered {status} (error {error_code}): {message}")]
    Unexpected {
        url: String,
        status: u16,
        error_code: i64,
        message: String,
    },
    /// The registry's URL is not one (a configuration mistake: stop and fix it).
    #[error("schema registry URL: {0}")]
    InvalidUrl(String),
    /// The bytes are not the Confluent wire format (too short, another magic byte, a broken
    /// Protobuf message-index list).
    #[error("not the schema registry's wire format: {0}")]
    WireFormat(String),
    /// A schema's text does not parse, or is of a type this crate does not decode. `schema` names
    /// the schema in these three variants: `id 7` for one from the registry.
    #[error("schema {schema}: {detail}")]
    InvalidSchema { schema: String, detail: String },
    /// The payload does not decode with the schema it names.
    #[error("payload does not decode with schema {schema}: {detail}")]
    Undecodable { schema: String, detail: String },
    /// The value does not fit the schema; `path` says where (`$.amount`, `$.items[2]`).
    #[error("value does not fit schema {schema} at {path}: {detail}")]
    DoesNotFit {
        schema: String,
        path: String,
        detail: String,
    },
}

impl SchemaError {
    /// True when the same call may succeed later (the registry unreachable or failing): retry it
    /// with backoff rather than dead-lettering the record.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            SchemaError::Unreachable { .. } | SchemaError::RegistryFailed { .. }
        )
    }
}
