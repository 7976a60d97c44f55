//! outbox-relay: publishes the PostgreSQL outbox (`eos-outbox`) to Kafka.
//!
//! Guarantee (exactly-once mode): every committed outbox row becomes exactly one record for
//! `read_committed` readers, in each entity's commit order, through relay crashes, zombie relays
//! and restarts of PostgreSQL or the broker. The rows are read in an order that never skips a
//! committed row — commit order from a logical replication slot (`logical` mode, [`logical`]) or
//! the xmin order of `eos_outbox::reader` (`xmin` mode); each batch and the relay's position are
//! one Kafka transaction; a restarted relay with the same name fences its zombie. In
//! at-least-once mode a crash repeats records, which consumers absorb by `event_id`
//! (eos-processor does).

mod backlog_watch;
pub mod config;
pub mod error;
pub mod logical;
pub mod logical_stream;
pub mod metrics;
pub mod pgoutput;
pub mod position_topic;
pub mod purge;
mod records;
mod recovery;
pub mod relay_loop;
pub mod server_watch;

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;

use eos_core::{Boundary, Guarantee};
use eos_runtime::ops_http::OpsEndpoint;
use eos_runtime::postgres_pool::{PoolBuilder, START_MAX_BACKOFF};
use eos_runtime::progress_watch::ProgressWatch;
use eos_runtime::schema_migrations;
use eos_runtime::service_flags::MigrateArgs;

pub use config::{Config, RelayMode};
pub use error::RelayError;
use relay_loop::{RelayLoop, RelaySettings};

/// The guarantee this configuration gives, for logs and `/boundary`.
pub fn boundary(config: &Config) -> Boundary {
    let input = match config.mode() {
        RelayMode::Xmin => {
            "postgres table=eos_outbox, read by (order_xid, position) below the snapshot's xmin"
                .to_owned()
        }
        RelayMode::Logical => format!(
            "postgres table=eos_outbox, its inserts in commit order from replication slot {} \
             (pgoutput, publication {})",
            config.slot_name(),
            config.publication_name()
        ),
    };
    let result = "kafka topics named by each row, keyed by each row's key".to_owned();
    match config.guarantee {
        Guarantee::ExactlyOnce => Boundary {
            guarantee: Guarantee::ExactlyOnce,
            input,
            result,
            checkpoint: format!(
                "kafka topic={} key={}, written inside each batch's transaction \
                 (transactional.id={})",
                config.positions_topic,
                config.relay_name,
                config.transactional_id()
            ) + match config.mode() {
                RelayMode::Xmin => "",
                RelayMode::Logical => {
                    "; the slot is advanced to a position only after Kafka committed it"
                }
            },
            recovery: "init_transactions fences the previous relay and aborts its open \
                       transaction; the position is read back with read_committed and reading \
                       resumes after it"
                .into(),
            transform: None,
        },
        Guarantee::AtLeastOnce => Boundary {
            guarantee: Guarantee::AtLeastOnce,
            input,
            result,
            checkpoint: "postgres table=eos_outbox_relay_positions, written after Kafka \
                         acknowledged the batch"
                .into(),
            recovery: "resumes after the recorded position; rows published after it are \
                       published again, so consumers must be idempotent by event_id"
                .into(),
            transform: None,
        },
    }
}

/// `outbox-relay migrate`: applies the outbox's migrations (table, function, relay positions).
pub async fn migrate(args: MigrateArgs) -> anyhow::Result<()> {
    Ok(schema_migrations::migrate_command(
        "outbox-relay",
        args.database.url(),
        &eos_outbox::migrator(),
    )
    .await?)
}

/// Runs the relay until `shutdown` is cancelled (exit 0 after the batch in flight) or a fatal
/// error (fenced, a position that disagrees with PostgreSQL, a row that is not an envelope).
pub async fn run(config: Config, shutdown: CancellationToken) -> anyhow::Result<()> {
    config.validate().map_err(RelayError::Config)?;
    let kafka = config
        .kafka
        .settings(config::OWN_KAFKA_PROPERTIES)
        .context("Kafka settings")?;
    kafka.log_at_start();
    let ops = OpsEndpoint::start(config.metrics_addr, boundary(&config), metrics::describe).await?;
    let readiness = ops.readiness.clone();

    let Some(pool) = PoolBuilder::new(4)
        .connect_at_start(config.database.url(), START_MAX_BACKOFF, &shutdown)
        .await
        .context("connecting to PostgreSQL")?
    else {
        ops.stop().await;
        return Ok(());
    };
    schema_migrations::prepare_at_start(
        &pool,
        &eos_outbox::migrator(),
        "outbox-relay",
        config.skip_migrations,
    )
    .await?;

    let client_config = kafka.client_config();
    // The first Kafka call below is an admin request, which a refused client (a wrong password)
    // would wait on silently: a metadata request first names the refusal within 10 s.
    let probe_config = client_config.clone();
    tokio::task::spawn_blocking(move || {
        eos_runtime::kafka_errors::check_reachable(
            &probe_config,
            std::time::Duration::from_secs(10),
        )
    })
    .await
    .context("the Kafka start-up check panicked")?
    .context("checking that Kafka answers")?;
    if config.guarantee == Guarantee::ExactlyOnce {
        position_topic::ensure_positions_topic(
            &client_config,
            &config.positions_topic,
            &config.topics,
        )
        .await?;
    }
    let settings = RelaySettings {
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
            RelayMode::Logical => Some(logical::LogicalSource::new(
                pool.clone(),
                config.slot_name(),
                config.publication_name(),
                logical_stream::ReplicationTarget::from_url(config.database.url())?
                    .with_confirm_interval(config.slot_confirm_interval),
            )),
            RelayMode::Xmin => None,
        },
        idle_position_interval: config.idle_position_interval,
    };
    let progress = ProgressWatch::spawn("outbox-relay", config.stall.policy(), &ops.stalls)
        .context("starting the progress watch")?;
    let relay = RelayLoop::start(settings, pool.clone(), progress).await?;
    let purge = tokio::spawn(purge::run(
        pool.clone(),
        purge::PurgeSettings {
            interval: config.purge_interval,
            retention: config.retention,
            batch: config.purge_batch,
        },
        shutdown.clone(),
    ));
    let result = relay.run(&shutdown, &readiness).await;
    shutdown.cancel();
    let _ = purge.await;
    pool.close().await;
    ops.stop().await;
    result.map_err(anyhow::Error::from)
}
