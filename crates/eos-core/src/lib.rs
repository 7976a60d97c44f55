//! The pure core of eos-suite: the general event contract (any JSON object; where its id,
//! entity and time are is configured), the demo ledger's envelope and its validation, the canonical fingerprint,
//! the `Boundary` every service states its guarantee with, `Checkpoint`, dead-letter reason
//! codes and the headers of an operator's re-drive of a dead letter. Service plumbing (ops
//! endpoint, telemetry, shutdown, Kafka consumer set-up, trace context) is in `eos-runtime`.
//!
//! Guarantee: nothing here does I/O; every service parses, validates and fingerprints events
//! with this one implementation, so "same event" means the same thing at every boundary.

pub mod boundary;
pub mod dead_letter;
pub mod envelope;
pub mod event;
pub mod fingerprint;
pub mod json_text;
pub mod redrive;
pub mod strict_json;

pub use boundary::{Boundary, Checkpoint, Guarantee};
pub use dead_letter::DeadLetterReason;
pub use envelope::{EntityId, EnvelopeError, EventEnvelope, EventId};
pub use event::{Event, EventContract, EventError, FieldLocation, RecordParts};
pub use fingerprint::Fingerprint;
