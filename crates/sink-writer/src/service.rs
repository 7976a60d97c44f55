//! Start-up apart from running (docs/CODE_STYLE.md): [`build`] does all the wiring, and every
//! failure it can meet (configuration, PostgreSQL, the targets' tables, the dead-letter topic)
//! happens there, before a record is read; [`Service::run`] sinks until shutdown.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use eos_runtime::kafka_errors::{ReportingContext, serve_pending_events};
use eos_runtime::ops_http::OpsEndpoint;
use eos_runtime::postgres_pool::PoolBuilder;
use eos_runtime::progress_watch::ProgressWatch;
use eos_runtime::schema_migrations as migrations;
use eos_runtime::secrets::redact_url_userinfo;
use eos_runtime::topic_config::TopicReplicationFlags;
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::types::RDKafkaErrorCode;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::effect_results::ResultsTable;
use crate::error::SinkError;
use crate::provider_target::ProviderTarget;
use crate::schema::{self, PreparedTarget};
use crate::sink_loop::{LoopSettings, SinkLoop};
use crate::targets::Targets;
use crate::{boundary, held_gauge, metrics, migrator, retention, target_specs};

/// A sink ready to run: its tables checked, its provider targets' clients made, its dead-letter
/// topic there.
pub struct Service {
    /// `/metrics`, `/healthz`, `/readyz` and `/boundary`, serving since start-up; stopped last.
    ops: OpsEndpoint,
    pool: PgPool,
    settings: LoopSettings,
    targets: Arc<Vec<PreparedTarget>>,
    providers: Arc<Vec<ProviderTarget>>,
    progress: Arc<ProgressWatch>,
    sink_name: String,
    purge_interval: Duration,
    held_refresh_interval: Duration,
}

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service")
            .field("sink_name", &self.sink_name)
            .field("tables", &self.targets.len())
            .field("providers", &self.providers.len())
            .finish_non_exhaustive()
    }
}

/// Checks the configuration and the targets file, serves the ops endpoint, connects to
/// PostgreSQL (waiting for it), applies the migrations, checks each target's table and makes
/// each provider target's clients, creates the dead-letter topic. `None` when `shutdown` came
/// while PostgreSQL was awaited.
pub async fn build(
    config: Config,
    shutdown: &CancellationToken,
) -> anyhow::Result<Option<Service>> {
    config.validate().map_err(SinkError::Config)?;
    let kafka = config.kafka.settings(&[]).context("Kafka settings")?;
    kafka.log_at_start();
    let specs = target_specs(&config)?;
    let ops = OpsEndpoint::start(
        config.metrics_addr,
        boundary(&config, &specs),
        metrics::describe,
    )
    .await?;
    let Some(pool) = connect(&config, shutdown).await? else {
        ops.stop().await;
        return Ok(None);
    };
    migrations::prepare_at_start(&pool, &migrator(), "sink-writer", config.skip_migrations)
        .await
        .context("preparing the sink's schema")?;
    let (targets, providers) = prepare_targets(&config, &pool, specs).await?;
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
        input_format: config.input_format,
        registry: config.registry_config().map_err(SinkError::Config)?,
        max_backoff: config.max_backoff,
        shutdown_timeout: config.shutdown_timeout,
        fault_stall_before_commit: config.fault_stall_before_commit,
        dead_letter_max_bytes,
        client_config,
        held_refresh: Arc::new(tokio::sync::Notify::new()),
    };
    let progress = ProgressWatch::spawn("sink-writer", config.stall.policy(), &ops.stalls)
        .context("starting the progress watch")?;
    Ok(Some(Service {
        ops,
        pool,
        settings,
        targets,
        providers,
        progress,
        sink_name: config.sink_name().to_owned(),
        purge_interval: config.purge_interval,
        held_refresh_interval: config.held_refresh_interval,
    }))
}

/// Each table target checked against its table, each provider target's clients made, and the
/// metrics of both registered.
async fn prepare_targets(
    config: &Config,
    pool: &PgPool,
    specs: Targets,
) -> anyhow::Result<(Arc<Vec<PreparedTarget>>, Arc<Vec<ProviderTarget>>)> {
    let mut prepared = Vec::with_capacity(specs.tables.len());
    for spec in specs.tables {
        prepared.push(schema::prepare(pool, spec).await?);
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
        let results = match &spec.results {
            Some(results) => Some(ResultsTable::prepare(pool, &spec.name, results).await?),
            None => None,
        };
        let target = ProviderTarget::new(spec, config.instance.instance_id(), &dedup_credentials)?;
        providers.push(match results {
            Some(results) => {
                tracing::info!(
                    target_name = %target.name(),
                    table = results.name(),
                    "the target's answers are written to a results table"
                );
                target.with_results(results)
            }
            None => target,
        });
    }
    metrics::register_targets(
        prepared
            .iter()
            .filter(|target| target.spec.retention.is_some())
            .map(PreparedTarget::name),
        providers.iter().map(ProviderTarget::name),
    );
    for target in &prepared {
        tracing::info!(
            table = target.name(),
            kind = %target.spec.kind,
            key = %target.spec.key,
            columns = target.shape.columns.len(),
            "target checked"
        );
    }
    Ok((Arc::new(prepared), Arc::new(providers)))
}

impl Service {
    /// Sinks until `shutdown` is cancelled (the open batch is committed first) or a fatal
    /// error, with the retention purge and the held-operations gauge beside the loop; then
    /// stops them, closes the pool and the ops endpoint.
    pub async fn run(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let Self {
            ops,
            pool,
            settings,
            targets,
            providers,
            progress,
            sink_name,
            purge_interval,
            held_refresh_interval,
        } = self;
        let background = CancellationToken::new();
        let purge_task = tokio::spawn(retention::purge_loop(
            pool.clone(),
            targets.clone(),
            purge_interval,
            background.clone(),
        ));
        let held_task = tokio::spawn(held_gauge::refresh_loop(
            pool.clone(),
            sink_name,
            providers
                .iter()
                .map(|target| target.name().to_owned())
                .collect(),
            held_refresh_interval,
            settings.held_refresh.clone(),
            background.clone(),
        ));
        let runtime = tokio::runtime::Handle::current();
        let loop_pool = pool.clone();
        let readiness = ops.readiness.clone();
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
        background.cancel();
        let _ = purge_task.await;
        let _ = held_task.await;
        pool.close().await;
        ops.stop().await;
        result?.map_err(anyhow::Error::from)
    }
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
    let admin: AdminClient<ReportingContext> =
        client_config.create_with_context(ReportingContext)?;
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
