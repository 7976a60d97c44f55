//! eos-processor: Kafka → Kafka read-process-write with exactly-once effects, for any
//! deterministic transform.
//!
//! Guarantee (exactly-once mode): for `read_committed` readers of the outputs, every input
//! event has exactly one visible effect — its outputs (zero or more) and one state change, or one
//! dead letter — through crashes, restarts, rebalances and broker restarts. Outputs, state
//! changelog records, dead letters and the consumed offsets of a batch are written in one Kafka
//! transaction; a restarted instance with the same `transactional.id` fences its zombie, and
//! consumer-group metadata fences a stale member of the group.
//!
//! As a library it runs a user's own [`Transform`] (docs/TRANSFORMS.md), with the processor's
//! flags ([`Config`]: no demo defaults, no flags of the eos-processor binary's own) in the
//! user's command line:
//!
//! ```no_run
//! use clap::Parser as _;
//! use eos_processor::{Config, Output, Processor, Refusal, SourcePosition, Transform};
//!
//! /// Counts each card's authorisations.
//! struct CountPerCard;
//!
//! impl Transform for CountPerCard {
//!     type State = u64;
//!
//!     fn apply(
//!         &self,
//!         count: &mut u64,
//!         event: eos_core::Event,
//!         _source: &SourcePosition,
//!     ) -> Result<Vec<Output>, Refusal> {
//!         *count += 1;
//!         let mut value = event.value;
//!         value.insert("count".into(), (*count).into());
//!         Ok(vec![Output::to_default(value)])
//!     }
//! }
//!
//! # async fn example() -> anyhow::Result<()> {
//! let config = Config::parse();
//! let shutdown = tokio_util::sync::CancellationToken::new();
//! Processor::new(config, CountPerCard).run(shutdown).await
//! # }
//! ```
#![warn(missing_docs)]

mod batch;
#[doc(hidden)]
pub mod changelog;
mod committer;
mod config;
#[doc(hidden)]
mod consumed_positions;
mod dead_letter_record;
mod error;
mod input_format;
mod lag_watch;
mod loop_consumer;
mod loop_settings;
#[doc(hidden)]
mod metrics;
mod output_format;
mod owned_states;
#[cfg(feature = "wasm")]
mod service;
mod start_up;
#[doc(hidden)]
mod topics;
#[doc(hidden)]
mod transaction_loop;

// The decision code without Kafka is eos-transform's (docs/ARCHITECTURE.md "Crates"), so that
// eosctl's replay runs it without linking this crate. Its modules and items stay here at the
// paths they had, so transforms, tests and tools written against eos-processor compile unchanged.
/// WebAssembly modules as transforms: the crate's `wasm` feature, off unless asked for, since it
/// builds wasmtime (docs/TRANSFORMS.md "The host: Extism on wasmtime").
#[cfg(feature = "wasm")]
#[doc(inline)]
pub use eos_transform::wasm;
#[doc(hidden)]
pub use eos_transform::{partition_state, state_format, state_store};
#[doc(inline)]
pub use eos_transform::{replay, transform};

use eos_core::{Boundary, Guarantee};
use tokio_util::sync::CancellationToken;

pub use config::{BuiltinTransform, Config};
pub use eos_schema::RecordFormat;
pub use error::ProcessorError;
pub use input_format::{InputFormatFlags, OutputSchemaFlag};
#[cfg(feature = "wasm")]
pub use service::{ServiceConfig, TransformChoice, run};
pub use transform::{
    DEFAULT_OUTPUT, LedgerTransform, Output, PassThroughTransform, Refusal, SourcePosition,
    StateUpgradeError, Transform,
};

/// The guarantee this configuration gives, for logs and `/boundary`.
pub fn boundary(config: &Config) -> Boundary {
    let input = format!(
        "kafka topic={} group={} format={}",
        config.input_topic,
        config.group_id,
        config.input_format.describe()
    );
    let outputs: Vec<String> = config
        .output_topics()
        .into_iter()
        .map(|(name, topic)| format!("{topic} (output {name})"))
        .collect();
    let result = format!(
        "kafka topics={} format={}, {} (dead letters), {} (state)",
        outputs.join(", "),
        config.input_format.describe_output(),
        config.dlq_topic(),
        config.changelog_topic()
    );
    match config.guarantee {
        Guarantee::ExactlyOnce => Boundary {
            guarantee: Guarantee::ExactlyOnce,
            input,
            result,
            checkpoint: format!(
                "consumer offsets committed inside the Kafka transaction (transactional.id={})",
                config.transactional_id()
            ),
            recovery: "init_transactions fences the previous instance and aborts its open \
                       transaction; state is restored from the changelog with read_committed and \
                       reading resumes at the offsets committed with it"
                .into(),
            transform: None,
        },
        Guarantee::AtLeastOnce => Boundary {
            guarantee: Guarantee::AtLeastOnce,
            input,
            result,
            checkpoint: "consumer offsets committed after the outputs are delivered".into(),
            recovery: "resumes at the last committed offset; records processed after it are \
                       processed again, so a crash can repeat effects"
                .into(),
            transform: None,
        },
    }
}

/// The processor with a transform: what a library user runs (see the crate's example).
#[derive(Debug)]
pub struct Processor<T> {
    config: Config,
    transform: T,
}

impl<T: Transform> Processor<T> {
    /// The processor configured by `config` (topics, group, guarantee, the event contract's
    /// flags), running `transform`.
    pub fn new(config: Config, transform: T) -> Self {
        Self { config, transform }
    }

    /// Runs until `shutdown` is cancelled (then commits the open batch and returns `Ok`) or a
    /// fatal error (fenced by a newer instance, unrecoverable Kafka state, bad topics, a state
    /// the transform cannot read).
    pub async fn run(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        match start_up::build(self.config, self.transform, &shutdown).await? {
            Some(ready) => ready.run(shutdown).await,
            // Stopped while the registry could not answer for an output's schema: nothing ran.
            None => Ok(()),
        }
    }
}
