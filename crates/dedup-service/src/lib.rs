//! dedup-service: durable intents in PostgreSQL behind gRPC, so that an external provider (a
//! payment API no database transaction can include) applies each operation at most once and
//! every ambiguous outcome is settled with evidence.
//!
//! Guarantee: for every operation id, at most one caller at a time holds a lease with the
//! current fencing token, and only such a caller calls the provider (with the operation id as
//! the idempotency key). The intent is durable before the call. A timeout or lost answer is
//! UNKNOWN, never failure: no new call happens until the reconciler has asked the provider with
//! the same key. Counted by operation id, the provider's effects are exactly one per completed
//! operation — through retries, crashes (`kill -9`) of callers and of this service, and expired
//! leases. Operations older than the retained window answer EXPIRED (fail closed), and the
//! service refuses to start when retention is shorter than the replay horizon.

pub mod auth;
pub mod config;
pub mod error;
pub mod group_commit;
pub mod grpc_connections;
pub mod grpc_service;
pub mod intent_store;
pub mod metrics;
pub mod purge;
pub mod reconciler;
pub mod retention;
mod service;
pub mod validation;
pub mod write_watch;

use eos_runtime::schema_migrations as migrations;
use tokio_util::sync::CancellationToken;

pub use config::{Config, MigrateArgs};
pub use error::DedupError;
pub use service::{Service, build};

/// `dedup-service migrate`: applies the embedded migrations to the database and logs each one
/// it applied; fails with the reason (and exit 1) when it cannot.
pub async fn migrate(args: MigrateArgs) -> anyhow::Result<()> {
    Ok(migrations::migrate_command(
        "dedup-service",
        args.database.url(),
        &intent_store::migrator(),
    )
    .await?)
}

/// Runs the service until `shutdown` is cancelled (then drains and returns `Ok`), or fails at
/// start-up (bad configuration, retention below the replay horizon, database, ports): [`build`],
/// then [`Service::run`]. The binary's whole `main` hands this to `eos_runtime::serve_or_migrate`.
pub async fn run(config: Config, shutdown: CancellationToken) -> anyhow::Result<()> {
    match build(config, &shutdown).await? {
        Some(service) => service.run(shutdown).await,
        // Stopped while waiting for PostgreSQL: nothing ran, nothing to drain.
        None => Ok(()),
    }
}
