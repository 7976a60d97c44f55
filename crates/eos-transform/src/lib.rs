//! eos-transform: the processor's decision code, without Kafka — the [`Transform`] trait a user
//! implements and the built-in transforms, the per-partition decision (dedup by event id and
//! fingerprint, the dedup horizon, the transform's state per entity), the redb store the
//! committed state lives in, the stored state's format, and the replay proof of a transform's
//! outputs (docs/TRANSFORMS.md).
//!
//! It is a crate of its own so that the replay proof runs the processor's own code without
//! linking the processor: eos-processor (the Kafka transaction loop around this code) and eosctl
//! (`audit --replay`) both depend on it, and the operator's tool depends on no service crate
//! (docs/ARCHITECTURE.md "Crates"). No decision talks to Kafka, spawns a task or reads the
//! clock; the only I/O of the decision code is the state store's file.
//!
//! eos-processor re-exports every module and item at its old path (`eos_processor::Transform`,
//! `eos_processor::transform`, `eos_processor::replay`, …), so a transform written against the
//! processor library compiles unchanged.
//!
//! With the `wasm` feature, the `wasm` module runs a WebAssembly module as a transform
//! (docs/TRANSFORMS.md "WebAssembly transforms"). The crate's name is not the modules' interface
//! version, `eos-transform/2`, which is `wasm-transform`'s.
//!
//! With the `kafka` feature, `replay::read_committed_run` reads what a run committed from Kafka,
//! for the replay proof: the one part of the crate that talks to Kafka, and only to read.
#![warn(missing_docs)]

// Public for eos-processor's transaction loop and restore (and eos-lab's state benchmark), not
// part of the transform API: hidden from the docs, as they were in eos-processor.
#[doc(hidden)]
pub mod partition_state;
pub mod replay;
mod seen_event;
#[doc(hidden)]
pub mod state_format;
#[doc(hidden)]
pub mod state_store;
pub mod transform;
#[cfg(feature = "wasm")]
pub mod wasm;

pub use transform::{
    BuiltinTransform, DEFAULT_OUTPUT, LedgerTransform, Output, PassThroughTransform, Refusal,
    SourcePosition, StateUpgradeError, Transform,
};
