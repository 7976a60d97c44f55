//! Start-up apart from running (docs/CODE_STYLE.md): [`build`] does all the wiring, and every
//! failure it can meet happens there, before anything is published; [`Service::run`] publishes
//! until shutdown.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use rdkafka::ClientConfig;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use eos_core::Guarantee;
use eos_runtime::ops_http::OpsEndpoint;
use eos_runtime::postgres_pool::{PoolBuilder, START_MAX_BACKOFF};
use eos_runtime::progress_watch::ProgressWatch;
use eos_runtime::schema_migrations;
use eos_schema::{RegistryClient, TopicSchemas};

use crate::config::{self, Config, RelayMode};
use crate::error::RelayError;
use crate::logical::LogicalSource;
use crate::logical_stream::ReplicationTarget;
use crate::position_topic;
use crate::purge::{self, PurgeSettings};
use crate::relay_loop::{RelayLoop, RelaySettings};
use crate::{boundary, metrics};

/// A relay ready to publish: its producer has fenced every earlier relay with its name, and it
/// knows where it resumes.
pub struct Service {
    /// `/metrics`, `/healthz`, `/readyz` and `/boundary`, serving since start-up; stopped last.
    ops: OpsEndpoint,
    pool: PgPool,
    relay: RelayLoop,
    purge: PurgeSettings,
}

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service")
            .field("purge", &self.purge)
            .finish_non_exhaustive()
    }
}

/// Checks the configuration, serves the ops endpoint, connects to PostgreSQL (waiting for it)
/// and applies the migrations, checks that Kafka answers, creates the position topic, then
/// starts the loop (fencing, recovery). `None` when `shutdown` came while PostgreSQL was
/// awaited.
pub async fn build(
    config: Config,
    shutdown: &CancellationToken,
) -> anyhow::Result<Option<Service>> {
    config.validate().map_err(RelayError::Config)?;
    let kafka = config
        .kafka
        .settings(config::OWN_KAFKA_PROPERTIES)
        .context("Kafka settings")?;
    kafka.log_at_start();
    let ops = OpsEndpoint::start(config.metrics_addr, boundary(&config), metrics::describe).await?;
    let Some(pool) = PoolBuilder::new(4)
        .connect_at_start(config.database.url(), START_MAX_BACKOFF, shutdown)
        .await
        .context("connecting to PostgreSQL")?
    else {
        ops.stop().await;
        return Ok(None);
    };
    schema_migrations::prepare_at_start(
        &pool,
        &eos_outbox::migrator(),
        "outbox-relay",
        config.skip_migrations,
    )
    .await?;
    let client_config = kafka.client_config();
    check_kafka_answers(&client_config).await?;
    if config.guarantee == Guarantee::ExactlyOnce {
        position_topic::ensure_positions_topic(
            &client_config,
            &config.positions_topic,
            &config.topics,
        )
        .await?;
    }
    let settings = relay_settings(&config, client_config, &pool).await?;
    let progress = ProgressWatch::spawn("outbox-relay", config.stall.policy(), &ops.stalls)
        .context("starting the progress watch")?;
    let relay = RelayLoop::start(settings, pool.clone(), progress).await?;
    Ok(Some(Service {
        ops,
        pool,
        relay,
        purge: PurgeSettings {
            interval: config.purge_interval,
            retention: config.retention,
            batch: config.purge_batch,
        },
    }))
}

/// The first Kafka call of start-up is an admin request, which a refused client (a wrong
/// password) would wait on silently: a metadata request first names the refusal within 10 s.
async fn check_kafka_answers(client_config: &ClientConfig) -> anyhow::Result<()> {
    let probe_config = client_config.clone();
    tokio::task::spawn_blocking(move || {
        eos_runtime::kafka_errors::check_reachable(&probe_config, Duration::from_secs(10))
    })
    .await
    .context("the Kafka start-up check panicked")?
    .context("checking that Kafka answers")
}

async fn relay_settings(
    config: &Config,
    client_config: ClientConfig,
    pool: &PgPool,
) -> anyhow::Result<RelaySettings> {
    Ok(RelaySettings {
        client_config,
        guarantee: config.guarantee,
        relay_name: config.relay_name.clone(),
        transactional_id: config.transactional_id(),
        positions_topic: config.positions_topic.clone(),
        batch_size: config.batch_size,
        poll_interval: config.poll_interval,
        linger: config.linger,
        transaction_timeout: config.transaction_timeout,
        logical: match config.mode() {
            RelayMode::Logical => Some(LogicalSource::new(
                pool.clone(),
                config.slot_name(),
                config.publication_name(),
                ReplicationTarget::from_url(config.database.url())?
                    .with_confirm_interval(config.slot_confirm_interval)
                    .settle_preferred_tls(pool)
                    .await?,
            )),
            RelayMode::Xmin => None,
        },
        idle_position_interval: config.idle_position_interval,
        value_schemas: match config.registry_config().map_err(anyhow::Error::msg)? {
            Some(registry) => Some(Arc::new(TopicSchemas::new(
                config.value_format,
                RegistryClient::new(registry)?,
                config.value_subjects.clone(),
            ))),
            None => None,
        },
    })
}

impl Service {
    /// Publishes until `shutdown` is cancelled (the batch in flight finishes first) or a fatal
    /// error, with the purge beside it; then stops the purge, closes the pool and the ops
    /// endpoint.
    pub async fn run(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let Self {
            ops,
            pool,
            relay,
            purge,
        } = self;
        let purge = tokio::spawn(purge::run(pool.clone(), purge, shutdown.clone()));
        let result = relay.run(&shutdown, &ops.readiness).await;
        shutdown.cancel();
        let _ = purge.await;
        pool.close().await;
        ops.stop().await;
        result.map_err(anyhow::Error::from)
    }
}
