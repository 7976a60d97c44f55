//! payments-api: an example domain service on the outbox (docs/architecture/outbox.md "Outbox").
//!
//! Guarantee: a payment row exists if and only if its event is in the outbox — both are written
//! in one PostgreSQL transaction — and one Idempotency-Key records at most one payment: a retry
//! answers from the stored payment, a reuse with another body is refused, and a failed request
//! writes nothing.

mod config;
mod http_api;
mod http_server;
pub mod payment_request;
mod payment_store;
mod request_span;
mod request_watch;

use std::time::Duration;

use anyhow::Context as _;
use sqlx::PgPool;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use eos_core::{Boundary, Guarantee};
use eos_runtime::ops_http::{OpsEndpoint, Readiness};
use eos_runtime::postgres_pool::{PoolBuilder, START_MAX_BACKOFF};
use eos_runtime::progress_watch::ProgressWatch;
use eos_runtime::schema_migrations;
use eos_runtime::service_flags::MigrateArgs;

pub use config::Config;

/// The embedded migrations of the domain tables; they share `_sqlx_migrations` with the
/// outbox's.
pub fn migrator() -> sqlx::migrate::Migrator {
    let mut migrator = sqlx::migrate!();
    migrator.set_ignore_missing(true);
    migrator
}

pub fn boundary(config: &Config) -> Boundary {
    Boundary {
        guarantee: Guarantee::ExactlyOnce,
        input: "http POST /payments with an Idempotency-Key".into(),
        result: format!(
            "postgres tables=payments_api_accounts, payments_api_payments and eos_outbox (topic \
             {}) in one transaction",
            config.topic
        ),
        checkpoint: "postgres unique idempotency_key of payments_api_payments".into(),
        recovery: "a request that fails writes nothing; a retry with the same key answers from \
                   the stored payment"
            .into(),
        transform: None,
    }
}

/// `payments-api migrate`: applies the outbox's migrations and the payments tables.
pub async fn migrate(args: MigrateArgs) -> anyhow::Result<()> {
    for migrator in [eos_outbox::migrator(), migrator()] {
        schema_migrations::migrate_command("payments-api", args.database.url(), &migrator).await?;
    }
    Ok(())
}

/// Serves until `shutdown` is cancelled; requests in flight finish first.
pub async fn run(config: Config, shutdown: CancellationToken) -> anyhow::Result<()> {
    let limits = config.connection_limits().context("configuration")?;
    // Before the ops endpoint: on port 0 it could be handed the fixed HTTP port, free since the
    // process this one replaces died a moment ago.
    let listener = TcpListener::bind(config.addr)
        .await
        .with_context(|| format!("cannot listen on {}", config.addr))?;
    let ops = OpsEndpoint::start(config.metrics_addr, boundary(&config), || {
        http_api::describe_metrics();
        http_server::describe_metrics();
    })
    .await?;
    let Some(pool) = PoolBuilder::new(config.db_max_connections)
        .connect_at_start(config.database.url(), START_MAX_BACKOFF, &shutdown)
        .await
        .context("connecting to PostgreSQL")?
    else {
        ops.stop().await;
        return Ok(());
    };
    for migrator in [eos_outbox::migrator(), migrator()] {
        schema_migrations::prepare_at_start(
            &pool,
            &migrator,
            "payments-api",
            config.skip_migrations,
        )
        .await?;
    }
    let http_addr = listener.local_addr()?;
    tracing::info!(%http_addr, topic = %config.topic, "payments-api listening");
    let readiness = tokio::spawn(report_readiness(
        pool.clone(),
        ops.readiness.clone(),
        shutdown.clone(),
    ));
    let requests = ProgressWatch::spawn(request_watch::LOOP, config.stall.policy(), &ops.stalls)
        .context("starting the progress watch")?;
    let app = http_api::router(http_api::AppState {
        pool: pool.clone(),
        topic: config.topic.clone(),
        body_read_timeout: limits.body_read_timeout,
        requests: request_watch::RequestWatch::new(requests, pool.clone()),
    });
    http_server::serve(listener, app, limits, shutdown.clone()).await;
    readiness.await.ok();
    pool.close().await;
    ops.stop().await;
    tracing::info!("stopped");
    Ok(())
}

/// How often /readyz asks PostgreSQL whether it can still record payments.
const READINESS_CHECK_INTERVAL: Duration = Duration::from_secs(2);

/// Ready while PostgreSQL answers (a payment needs it), and not from the moment shutdown starts,
/// so a load balancer stops sending requests while those in flight finish.
async fn report_readiness(pool: PgPool, readiness: Readiness, shutdown: CancellationToken) {
    loop {
        let answered = tokio::time::timeout(
            READINESS_CHECK_INTERVAL,
            sqlx::query("SELECT 1").execute(&pool),
        )
        .await
        .is_ok_and(|result| result.is_ok());
        if answered != readiness.is_ready() && !shutdown.is_cancelled() {
            if answered {
                tracing::info!("ready: PostgreSQL answers");
            } else {
                tracing::warn!("not ready: PostgreSQL does not answer");
            }
        }
        readiness.set(answered && !shutdown.is_cancelled());
        tokio::select! {
            () = shutdown.cancelled() => {
                readiness.set(false);
                return;
            }
            () = tokio::time::sleep(READINESS_CHECK_INTERVAL) => {}
        }
    }
}
