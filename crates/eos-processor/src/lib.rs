//! eos-processor: Kafka → Kafka read-process-write with exactly-once effects.
//!
//! Guarantee (exactly-once mode): for `read_committed` readers of the output topic, every input
//! event has exactly one visible effect — one output record and one state change, or one dead
//! letter — through crashes, restarts, rebalances and broker restarts. Outputs, state changelog
//! records, dead letters and the consumed offsets of a batch are written in one Kafka transaction;
//! a restarted instance with the same `transactional.id` fences its zombie, and consumer-group
//! metadata fences a stale member of the group.

pub mod changelog;
pub mod config;
pub mod consumed_positions;
pub mod error;
pub mod metrics;
pub mod partition_state;
pub mod state_bench;
pub mod state_store;
pub mod topics;
pub mod transaction_loop;
pub mod transform;

use anyhow::Context as _;
use eos_core::{Boundary, Guarantee};
use eos_runtime::ops_http::OpsEndpoint;
use tokio_util::sync::CancellationToken;

pub use config::Config;
pub use error::ProcessorError;
use partition_state::DedupPolicy;
use transaction_loop::{LoopSettings, TransactionLoop};
use transform::LedgerTransform;

/// The guarantee this configuration gives, for logs and `/boundary`.
pub fn boundary(config: &Config) -> Boundary {
    let input = format!(
        "kafka topic={} group={}",
        config.input_topic, config.group_id
    );
    let result = format!(
        "kafka topics={} (output), {} (dead letters), {} (state)",
        config.output_topic,
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
        },
        Guarantee::AtLeastOnce => Boundary {
            guarantee: Guarantee::AtLeastOnce,
            input,
            result,
            checkpoint: "consumer offsets committed after the outputs are delivered".into(),
            recovery: "resumes at the last committed offset; records processed after it are \
                       processed again, so a crash can repeat effects"
                .into(),
        },
    }
}

/// Runs the processor until `shutdown` is cancelled (exit 0 after committing the open batch) or a
/// fatal error (fenced, unrecoverable Kafka state, bad topics).
pub async fn run(config: Config, shutdown: CancellationToken) -> anyhow::Result<()> {
    config.validate().map_err(ProcessorError::Config)?;
    let kafka = config
        .kafka
        .settings(config::OWN_KAFKA_PROPERTIES)
        .context("Kafka settings")?;
    kafka.log_at_start();
    let boundary = boundary(&config);
    let ops = OpsEndpoint::start(config.metrics_addr, boundary, metrics::describe).await?;
    let readiness = ops.readiness.clone();

    let client_config = kafka.client_config();
    let plan = topics::TopicPlan {
        input: config.input_topic.clone(),
        output: config.output_topic.clone(),
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

    let settings = LoopSettings {
        guarantee: config.guarantee,
        input_topic: config.input_topic.clone(),
        output_topic: config.output_topic.clone(),
        dlq_topic: config.dlq_topic(),
        changelog_topic: config.changelog_topic(),
        group_id: config.group_id.clone(),
        instance_id: config.instance.instance_id(),
        transactional_id: config.transactional_id(),
        commit_interval: config.commit_interval,
        max_batch: config.max_batch,
        policy: DedupPolicy {
            horizon_secs: config.dedup_horizon.as_secs() as i64,
            max_record_bytes: config.max_record_bytes,
        },
        transaction_timeout: config.transaction_timeout,
        fault_abort_every: config.fault_abort_every,
        dead_letter_max_bytes,
        client_config,
        state_dir: config.instance_state_dir(),
        changelog_delete_retention: topics.changelog_delete_retention,
        changelog_created: topics.changelog_created,
    };
    let loop_shutdown = shutdown.clone();
    let result = tokio::task::spawn_blocking(move || {
        TransactionLoop::new(settings, LedgerTransform, readiness)?.run(&loop_shutdown)
    })
    .await
    .context("the transaction loop panicked");
    ops.stop().await;
    result?.map_err(anyhow::Error::from)
}
