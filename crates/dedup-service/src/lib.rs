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
//!
//! The public surface is what the binary, the lab, the model checks and the tests use; the rest
//! is private (docs/CODE_STYLE.md "The shape of a service"):
//! - the binary: [`run`] ([`build`], then [`Service::run`]) and [`migrate`], with [`Config`] and
//!   [`MigrateArgs`] as the command line;
//! - the integration tests: [`Config`]'s fields (as the flags they spawn the binary with), and
//!   [`intent_store`] with the items of [`validation`] (the transition tests drive the store);
//! - eos-lab's dedup benchmark: [`intent_store`] and [`validation`]'s items, the store without
//!   gRPC;
//! - eos-model: [`reconciler::decide`], the reconciler's one decision, checked over every
//!   interleaving.

mod auth;
mod config;
mod error;
mod group_commit;
mod grpc_connections;
mod grpc_service;
pub mod intent_store;
mod lookups;
mod metrics;
mod purge;
pub mod reconciler;
mod retention;
mod service;
mod target_policies;
pub mod validation;
mod write_watch;

use eos_runtime::schema_migrations as migrations;
use tokio_util::sync::CancellationToken;

/// dedup-service's flags and their environment variables: each field's doc is its `--help`.
pub use config::Config;
/// The flags of `dedup-service migrate`, the ones every service with tables shares.
pub use config::MigrateArgs;
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
