//! Shared types of eos-suite: the event envelope and its validation, the canonical fingerprint,
//! the `Boundary` every service states its guarantee with, `Checkpoint`, dead-letter reason codes,
//! W3C trace-context and baggage propagation over Kafka headers, gRPC metadata and HTTP headers
//! (the event id rides in the baggage), telemetry set-up and the shutdown signal.
//!
//! Guarantee: nothing here does I/O against Kafka or Postgres; every service parses, validates and
//! fingerprints events with this one implementation, so "same event" means the same thing at every
//! boundary.

pub mod boundary;
pub mod dead_letter;
pub mod envelope;
pub mod fingerprint;
pub mod ops_http;
pub mod rebalance;
pub mod shutdown;
pub mod telemetry;
pub mod trace_context;

pub use boundary::{Boundary, Checkpoint, Guarantee};
pub use dead_letter::DeadLetterReason;
pub use envelope::{EntityId, EnvelopeError, EventEnvelope, EventId};
pub use fingerprint::Fingerprint;
