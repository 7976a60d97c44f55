//! provider-sim: a fake external payment provider, the test double of an API no database
//! transaction can include.
//!
//! Guarantee (of the double itself): a charge is applied at most once per idempotency key while
//! the key is remembered (`--key-ttl`), and `GET /effects` lists every effect ever applied, so a
//! test can check "one effect per operation id" by counting. Faults (lost answers, late answers,
//! 5xx after applying) are drawn from a seeded RNG. State lives in memory: a restart forgets
//! everything, like a provider that lost its database — never restart it inside a test that
//! counts effects.

mod config;
mod faults;
mod http_api;
mod ledger;
mod server;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use time::OffsetDateTime;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use config::Config;
use faults::Faults;
use http_api::AppState;
use ledger::Ledger;

const DRAIN: Duration = Duration::from_secs(5);

/// Serves until `shutdown` is cancelled.
pub async fn run(config: Config, shutdown: CancellationToken) -> anyhow::Result<()> {
    config
        .validate()
        .map_err(|problem| anyhow::anyhow!("configuration: {problem}"))?;
    let seed = config.seed.unwrap_or_else(rand::random);
    let plan = config.fault_plan();
    tracing::info!(
        seed,
        key_ttl = %humantime::format_duration(config.key_ttl),
        error_before_apply = plan.error_before_apply,
        drop_after_apply = plan.drop_after_apply,
        delay_after_apply = plan.delay_after_apply,
        delay = %humantime::format_duration(plan.delay),
        error_after_apply = plan.error_after_apply,
        "fault plan"
    );
    let metrics = eos_runtime::ops_http::install_prometheus_recorder()?;
    http_api::describe_metrics();
    let state = AppState {
        ledger: Arc::new(Mutex::new(Ledger::new(config.key_ttl))),
        faults: Arc::new(Mutex::new(Faults::new(plan, seed))),
        decline_above: config.decline_amounts_above,
        decline_body_bytes: config.decline_body_bytes,
        metrics: Some(metrics),
    };
    let listener = TcpListener::bind(config.addr)
        .await
        .with_context(|| format!("cannot listen on {}", config.addr))?;
    let http_addr = listener.local_addr()?;
    let tls = match (&config.tls_cert, &config.tls_key) {
        (Some(cert), Some(key)) => Some(server::tls_acceptor(cert, key)?),
        _ => None,
    };
    let scheme = if tls.is_some() { "https" } else { "http" };
    tracing::info!(
        %http_addr,
        scheme,
        auth_required = config.require_auth_file.is_some(),
        "provider-sim listening"
    );

    let forgetter = tokio::spawn(forget_keys(
        Arc::clone(&state.ledger),
        config.key_ttl,
        shutdown.clone(),
    ));
    let access = server::Access {
        tls,
        required_authorization: config.require_auth_file.clone(),
    };
    server::serve(listener, http_api::router(state), access, shutdown, DRAIN).await;
    forgetter.abort();
    tracing::info!("stopped");
    Ok(())
}

/// Drops keys past their TTL now and then, so memory stays bounded (lookups check the TTL too).
async fn forget_keys(ledger: Arc<Mutex<Ledger>>, key_ttl: Duration, shutdown: CancellationToken) {
    let every = key_ttl.clamp(Duration::from_millis(100), Duration::from_secs(60));
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
        let forgotten = ledger
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .forget_expired(OffsetDateTime::now_utc());
        if forgotten > 0 {
            tracing::debug!(forgotten, "forgot idempotency keys past their TTL");
        }
    }
}
