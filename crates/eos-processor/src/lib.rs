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

mod at_least_once;
mod batch_commit;
mod batch_recovery;
#[doc(hidden)]
pub mod changelog;
pub mod config;
#[doc(hidden)]
pub mod consumed_positions;
mod dead_letter_record;
pub mod error;
mod input_format;
mod lag_watch;
mod local_checkpoint;
#[doc(hidden)]
pub mod metrics;
mod open_batch;
mod output_format;
mod rebalance_handling;
mod record_decision;
#[cfg(feature = "wasm")]
pub mod service;
mod state_restore;
#[doc(hidden)]
pub mod topics;
#[doc(hidden)]
pub mod transaction_loop;

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

use std::collections::BTreeSet;
use std::sync::Arc;

use anyhow::Context as _;
use eos_core::{Boundary, Guarantee};
use eos_runtime::ops_http::OpsEndpoint;
use eos_runtime::progress_watch::ProgressWatch;
use tokio_util::sync::CancellationToken;

pub use config::{BuiltinTransform, Config};
pub use error::ProcessorError;
pub use input_format::{InputFormat, InputFormatFlags};
use partition_state::DecisionPolicy;
#[cfg(feature = "wasm")]
pub use service::{ServiceConfig, TransformChoice, run};
use transaction_loop::{LoopSettings, TransactionLoop};
pub use transform::{
    DEFAULT_OUTPUT, LedgerTransform, Output, PassThroughTransform, Refusal, SourcePosition,
    StateUpgradeError, Transform,
};

/// Where the contract finds each part, for the start-up log.
fn describe(contract: &eos_core::EventContract) -> String {
    let place = |location: &eos_core::FieldLocation| location.to_string();
    format!(
        "event id at {}, entity at {}{}",
        place(&contract.event_id),
        place(&contract.entity),
        contract
            .occurred_at
            .as_ref()
            .map(|pointer| format!(", event time at {pointer}"))
            .unwrap_or_default()
    )
}

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
        run_transform(self.config, self.transform, shutdown).await
    }
}

async fn run_transform<T: Transform>(
    config: Config,
    transform: T,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    config.validate().map_err(ProcessorError::Config)?;
    config
        .check_outputs(transform.writes_default_output(), &transform.outputs())
        .map_err(ProcessorError::Config)?;
    let outputs = config.output_topics();
    let contract = config.event_contract(transform.contract());
    tracing::info!(
        contract = describe(&contract),
        state_version = T::STATE_VERSION,
        "event contract"
    );
    let kafka = config
        .kafka
        .settings(config::OWN_KAFKA_PROPERTIES)
        .context("Kafka settings")?;
    kafka.log_at_start();
    let mut boundary = boundary(&config);
    let module_digest = transform.module_digest();
    boundary.transform = module_digest
        .as_ref()
        .map(|digest| format!("webassembly module {digest}"));
    let ops = OpsEndpoint::start(config.metrics_addr, boundary, metrics::describe).await?;
    if let Some(digest) = module_digest {
        ::metrics::gauge!(metrics::TRANSFORM_MODULE_INFO, "digest" => digest).set(1.0);
    }
    let readiness = ops.readiness.clone();

    let client_config = kafka.client_config();
    let plan = topics::TopicPlan {
        input: config.input_topic.clone(),
        outputs: outputs.values().cloned().collect(),
        dlq: config.dlq_topic(),
        changelog: config.changelog_topic(),
        partitions: config.partitions,
    };
    let topics = topics::ensure_topics(&client_config, &plan, &config.topics)
        .await
        .context("checking topics")?;
    tracing::info!(
        input_partitions = topics.input_partitions,
        changelog_delete_retention = ?topics.changelog_delete_retention,
        "topics ready"
    );
    let dead_letter_max_bytes = eos_core::dead_letter::message_limit(
        client_config.get("message.max.bytes"),
        eos_runtime::topic_config::max_message_bytes(
            &client_config,
            &plan.dlq,
            std::time::Duration::from_secs(10),
        )
        .await,
    );
    tracing::info!(
        dead_letter_max_bytes,
        "largest dead letter the producer can write"
    );

    let registry = config
        .input_format
        .registry_config()
        .map_err(ProcessorError::Config)?;
    let output_encoder = match (config.input_format.output_format, &registry) {
        (InputFormat::Json, _) | (_, None) => None,
        (format, Some(registry)) => {
            match output_format::OutputEncoder::load(format, &outputs, registry.clone(), &shutdown)
                .await
                .map_err(ProcessorError::Config)?
            {
                Some(encoder) => Some(Arc::new(encoder)),
                // Stopped while the registry could not answer: nothing ran.
                None => {
                    ops.stop().await;
                    return Ok(());
                }
            }
        }
    };
    let settings = LoopSettings {
        guarantee: config.guarantee,
        input_topic: config.input_topic.clone(),
        outputs: outputs.clone(),
        dlq_topic: config.dlq_topic(),
        changelog_topic: config.changelog_topic(),
        group_id: config.group_id.clone(),
        instance_id: config.instance.instance_id(),
        transactional_id: config.transactional_id(),
        commit_interval: config.commit_interval,
        max_batch: config.max_batch,
        policy: DecisionPolicy {
            horizon_secs: config.dedup_horizon.as_secs() as i64,
            contract,
            outputs: outputs.keys().cloned().collect::<BTreeSet<_>>(),
            output_fit: output_encoder
                .clone()
                .map(|encoder| encoder as Arc<dyn eos_transform::partition_state::OutputFit>),
        },
        transaction_timeout: config.transaction_timeout,
        fault_abort_every: config.fault_abort_every,
        dead_letter_max_bytes,
        client_config,
        state_dir: config.instance_state_dir(),
        changelog_delete_retention: topics.changelog_delete_retention,
        changelog_created: topics.changelog_created,
    };
    let input = input_format::InputDecoder::new(
        config.input_format.input_format,
        &config.input_topic,
        registry,
    )
    .context("the schema registry's client")?;
    let progress = ProgressWatch::spawn("eos-processor", config.stall.policy(), &ops.stalls)
        .context("starting the progress watch")?;
    let loop_shutdown = shutdown.clone();
    let result = tokio::task::spawn_blocking(move || {
        TransactionLoop::new(settings, transform, (readiness, progress))?
            .with_input(input)
            .with_output(output_encoder)
            .run(&loop_shutdown)
    })
    .await
    .context("the transaction loop panicked");
    ops.stop().await;
    result?.map_err(anyhow::Error::from)
}
