//! sink-writer: Kafka → PostgreSQL with exactly-once effects on the tables.
//!
//! A Kafka transaction cannot include an `INSERT`, so the sink protects itself
//! (docs/ARCHITECTURE.md "Boundaries": the external sink must take part in the protection):
//! - **idempotent inserts** keyed by a unique column (`ON CONFLICT DO NOTHING`); a row ignored
//!   with other content is a broken producer contract, kept in `sink_conflicts`, never hidden and
//!   never overwriting the stored row;
//! - **versioned upserts** applied only when `incoming_version > stored_version`;
//! - **the input checkpoint in the same database transaction** as the rows (`--offsets postgres`),
//!   fenced by an owner epoch that every new owner bumps before it reads the checkpoint.
//!
//! Guarantee (`--offsets postgres`): for every record of the input topic visible to a
//! `read_committed` reader, the target tables show exactly one effect — a row, a recognised
//! duplicate, a stale version, a `sink_conflicts` row, or a dead letter (with a
//! `sink_dead_letters` row) — through crashes, `kill -9`, rebalances, zombies and PostgreSQL
//! restarts. Dead letters in the Kafka topic are at-least-once (see [`dead_letters`]).
//! `--offsets kafka` is the weaker boundary: at-least-once delivery into idempotent targets.

mod backoff;
pub mod batch_plan;
mod batch_spans;
mod batch_writer;
pub mod checkpoint_rule;
pub mod checkpoint_store;
pub mod column_type;
pub mod config;
pub mod dead_letters;
pub mod decision;
pub mod error;
pub mod held_gauge;
mod lag_watch;
pub mod mapping;
pub mod metrics;
mod partition_positioning;
mod provider_settlement;
pub mod provider_target;
pub mod retention;
pub mod schema;
pub mod sink_loop;
pub mod table_writer;
pub mod targets;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use eos_core::{Boundary, Guarantee};
use eos_runtime::KafkaSettings;
use eos_runtime::kafka_errors::{ReportingContext, serve_pending_events};
use eos_runtime::ops_http::{OpsEndpoint, Readiness};
use eos_runtime::postgres_pool::PoolBuilder;
use eos_runtime::progress_watch::{ProgressWatch, StallState};
use eos_runtime::schema_migrations as migrations;
use eos_runtime::secrets::redact_url_userinfo;
use eos_runtime::topic_config::TopicReplicationFlags;
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::types::RDKafkaErrorCode;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

pub use config::{Config, MigrateArgs, OffsetsMode};
pub use error::SinkError;
use provider_target::ProviderTarget;
use schema::PreparedTarget;
use sink_loop::{LoopSettings, SinkLoop};
use targets::{TargetKind, Targets};

/// The embedded migrations: the sink's own tables and the default targets. They share
/// `_sqlx_migrations` with other services' migrations when those use the same database (the
/// demo's dedup-service does), so migrations this sink does not know are not an error.
pub fn migrator() -> sqlx::migrate::Migrator {
    let mut migrator = sqlx::migrate!();
    migrator.set_ignore_missing(true);
    migrator
}

/// The guarantee this configuration gives, for logs and `/boundary`.
pub fn boundary(config: &Config, targets: &Targets) -> Boundary {
    let input = format!(
        "kafka topic={} group={} (read_committed)",
        config.topic, config.group_id
    );
    let mut tables: Vec<String> = targets
        .tables
        .iter()
        .map(|spec| match spec.kind {
            TargetKind::Append => format!("{} (append by {})", spec.table, spec.key),
            TargetKind::Versioned => format!(
                "{} (versioned by {}, {})",
                spec.table,
                spec.key,
                spec.version_column.as_deref().unwrap_or("version")
            ),
        })
        .collect();
    // Logged and served on /boundary before the URLs are checked: a credential in either
    // (user information) must not reach them.
    tables.extend(targets.providers.iter().map(|p| {
        format!(
            "provider {} at {} (one charge per event_id, key {}:<event_id>, intents at \
             dedup-service {}; settled before the checkpoint)",
            p.name,
            redact_url_userinfo(&p.provider_url),
            p.name,
            redact_url_userinfo(&p.dedup_url)
        )
    }));
    let result = format!(
        "postgres tables {}; conflicts in sink_conflicts; dead letters to kafka topic={} and \
         sink_dead_letters",
        tables.join(", "),
        config.dlq_topic()
    );
    match config.offsets {
        OffsetsMode::Postgres => Boundary {
            guarantee: Guarantee::ExactlyOnce,
            input,
            result,
            checkpoint: format!(
                "postgres table=sink_checkpoints sink={} (same transaction as the rows, \
                 owner-epoch fenced); the kafka group offset follows for lag dashboards only",
                config.sink_name()
            ),
            recovery: "on every assignment the owner epoch is bumped (an older owner's batch can \
                       no longer commit), then the checkpoint committed with the rows is read and \
                       reading resumes there"
                .into(),
            transform: None,
        },
        OffsetsMode::Kafka => Boundary {
            guarantee: Guarantee::AtLeastOnce,
            input,
            result,
            checkpoint: "kafka group offset, committed after the database commit".into(),
            recovery: "resumes at the last committed group offset; records after it are written \
                       again and absorbed by ON CONFLICT and the version check, so rows stay \
                       exact but counters (duplicates, stale) count the replay"
                .into(),
            transform: None,
        },
    }
}

/// The targets of this run: from `--config`, or the default tables of the reference practice.
pub fn target_specs(config: &Config) -> Result<Targets, SinkError> {
    let targets = match &config.config {
        Some(path) => targets::load(path).map_err(|e| SinkError::Config(e.to_string()))?,
        None => Targets {
            tables: targets::defaults(),
            providers: Vec::new(),
        },
    };
    targets::check_retention(
        &targets.tables,
        config.replay_horizon,
        config.retention_margin,
    )
    .map_err(SinkError::Config)?;
    Ok(targets)
}

/// `sink-writer migrate`: applies the embedded migrations to the database and logs each one it
/// applied; fails with the reason (and exit 1) when it cannot.
pub async fn migrate(args: MigrateArgs) -> anyhow::Result<()> {
    Ok(migrations::migrate_command("sink-writer", args.database.url(), &migrator()).await?)
}

/// Runs the sink until `shutdown` is cancelled (exit 0 after committing the open batch) or a
/// fatal error (fenced, bad configuration or schema, a permanent database error).
pub async fn run(config: Config, shutdown: CancellationToken) -> anyhow::Result<()> {
    config.validate().map_err(SinkError::Config)?;
    let kafka = config.kafka.settings(&[]).context("Kafka settings")?;
    kafka.log_at_start();
    let specs = target_specs(&config)?;
    let boundary = boundary(&config, &specs);
    let ops = OpsEndpoint::start(config.metrics_addr, boundary, metrics::describe).await?;
    let result = serve(
        config,
        kafka,
        specs,
        (ops.readiness.clone(), ops.stalls.clone()),
        shutdown,
    )
    .await;
    ops.stop().await;
    result
}

async fn serve(
    config: Config,
    kafka: KafkaSettings,
    specs: Targets,
    (readiness, stalls): (Readiness, StallState),
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let Some(pool) = connect(&config, &shutdown).await? else {
        return Ok(());
    };
    migrations::prepare_at_start(&pool, &migrator(), "sink-writer", config.skip_migrations)
        .await
        .context("preparing the sink's schema")?;
    let mut prepared = Vec::with_capacity(specs.tables.len());
    for spec in specs.tables {
        prepared.push(schema::prepare(&pool, spec).await?);
    }
    let mut providers = Vec::with_capacity(specs.providers.len());
    let dedup_credentials = config
        .dedup
        .credentials()
        .context("dedup-service credentials")?;
    for spec in specs.providers {
        tracing::info!(
            target_name = %spec.name,
            dedup_url = %redact_url_userinfo(&spec.dedup_url),
            provider_url = %redact_url_userinfo(&spec.provider_url),
            call_timeout_ms = spec.call_timeout.as_millis() as u64,
            lease_ttl_ms = spec.lease_ttl.as_millis() as u64,
            "provider target"
        );
        providers.push(ProviderTarget::new(
            spec,
            config.instance.instance_id(),
            &dedup_credentials,
        )?);
    }
    crate::metrics::register_targets(
        prepared
            .iter()
            .filter(|target| target.spec.retention.is_some())
            .map(PreparedTarget::name),
        providers.iter().map(ProviderTarget::name),
    );
    let providers = Arc::new(providers);
    for target in &prepared {
        tracing::info!(
            table = target.name(),
            kind = %target.spec.kind,
            key = %target.spec.key,
            columns = target.shape.columns.len(),
            "target checked"
        );
    }
    let targets: Arc<Vec<PreparedTarget>> = Arc::new(prepared);

    let client_config = kafka.client_config();
    ensure_dlq_topic(
        &client_config,
        &config.topic,
        &config.dlq_topic(),
        &config.topics,
    )
    .await
    .context("checking the dead-letter topic")?;
    // A dead letter must fit both the producer's message.max.bytes and the dead-letter topic's
    // own max.message.bytes, which may be smaller: a letter above either is never delivered and
    // the batch would roll back forever.
    let dead_letter_max_bytes = eos_core::dead_letter::message_limit(
        client_config.get("message.max.bytes"),
        eos_runtime::topic_config::max_message_bytes(
            &client_config,
            &config.dlq_topic(),
            Duration::from_secs(10),
        )
        .await,
    );
    tracing::info!(
        dead_letter_max_bytes,
        "largest dead letter the producer can write"
    );

    let purge_shutdown = CancellationToken::new();
    let purge_task = tokio::spawn(retention::purge_loop(
        pool.clone(),
        targets.clone(),
        config.purge_interval,
        purge_shutdown.clone(),
    ));

    let held_refresh = Arc::new(tokio::sync::Notify::new());
    let held_task = tokio::spawn(held_gauge::refresh_loop(
        pool.clone(),
        config.sink_name().to_owned(),
        providers
            .iter()
            .map(|target| target.name().to_owned())
            .collect(),
        config.held_refresh_interval,
        held_refresh.clone(),
        purge_shutdown.clone(),
    ));

    let settings = LoopSettings {
        topic: config.topic.clone(),
        dlq_topic: config.dlq_topic(),
        group_id: config.group_id.clone(),
        instance_id: config.instance.instance_id(),
        offsets: config.offsets,
        max_batch: config.max_batch,
        max_batch_bytes: config.max_batch_bytes,
        batch_interval: config.batch_interval,
        batch_idle: config.batch_idle,
        events: config.event_format(),
        max_backoff: config.max_backoff,
        shutdown_timeout: config.shutdown_timeout,
        fault_stall_before_commit: config.fault_stall_before_commit,
        dead_letter_max_bytes,
        client_config,
        held_refresh,
    };
    let progress = ProgressWatch::spawn("sink-writer", config.stall.policy(), &stalls)
        .context("starting the progress watch")?;
    let runtime = tokio::runtime::Handle::current();
    let loop_pool = pool.clone();
    let result = tokio::task::spawn_blocking(move || {
        SinkLoop::new(
            settings,
            runtime,
            loop_pool,
            targets,
            providers,
            (readiness, progress),
            shutdown.clone(),
        )?
        .run(&shutdown)
    })
    .await
    .context("the sink loop panicked");
    purge_shutdown.cancel();
    let _ = purge_task.await;
    let _ = held_task.await;
    pool.close().await;
    result?.map_err(anyhow::Error::from)
}

/// Connects, retrying with backoff while PostgreSQL is unreachable (a sink started before its
/// database must wait, not crash-loop). `None` when shut down while waiting.
async fn connect(config: &Config, shutdown: &CancellationToken) -> anyhow::Result<Option<PgPool>> {
    // A frozen owner must not hold its checkpoint rows' locks forever: the server ends a
    // transaction left idle this long, and the fence proceeds. And no statement may block the
    // loop past Kafka's max.poll.interval.ms (5 min) waiting on a lock: a cancelled statement is
    // retried like any transient failure.
    PoolBuilder::new(4)
        .acquire_timeout(Duration::from_secs(5))
        .session_setting("SET idle_in_transaction_session_timeout = '60s'")
        .session_setting("SET statement_timeout = '120s'")
        .connect_at_start(config.database.url(), config.max_backoff, shutdown)
        .await
        .context("connecting to PostgreSQL")
}

/// Creates the dead-letter topic when missing, with as many partitions as the input has (3 when
/// the input does not exist yet).
async fn ensure_dlq_topic(
    client_config: &ClientConfig,
    input: &str,
    dlq: &str,
    replication: &TopicReplicationFlags,
) -> Result<(), SinkError> {
    let consumer: BaseConsumer<ReportingContext> =
        client_config.create_with_context(ReportingContext)?;
    let metadata_timeout = Duration::from_secs(10);
    let partitions_of = |topic: &str| -> Result<usize, SinkError> {
        let metadata = consumer
            .fetch_metadata(Some(topic), metadata_timeout)
            .inspect_err(|_| serve_pending_events(&consumer))?;
        Ok(metadata
            .topics()
            .iter()
            .filter(|t| t.error().is_none())
            .map(|t| t.partitions().len())
            .sum())
    };
    if partitions_of(dlq)? > 0 {
        return Ok(());
    }
    let partitions = match partitions_of(input)? {
        0 => 3,
        n => i32::try_from(n).unwrap_or(3),
    };
    let admin: AdminClient<DefaultClientContext> = client_config.create()?;
    let options = AdminOptions::new().operation_timeout(Some(metadata_timeout));
    replication.warn_if_under_replicated(client_config).await;
    let settings = replication.topic_settings();
    let topic = replication.new_topic(
        dlq,
        partitions,
        settings.iter().map(|(key, value)| (*key, value.as_str())),
    );
    for result in admin.create_topics([&topic], &options).await? {
        match result {
            Ok(topic) => tracing::info!(topic, partitions, "created the dead-letter topic"),
            Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((topic, code)) => {
                return Err(SinkError::Config(format!(
                    "cannot create dead-letter topic {topic}: {code}"
                )));
            }
        }
    }
    Ok(())
}
