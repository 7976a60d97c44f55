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
//! restarts. Dead letters in the Kafka topic are at-least-once (see `dead_letters.rs`).
//! `--offsets kafka` is the weaker boundary: at-least-once delivery into idempotent targets.

mod backoff;
pub mod batch_plan;
mod batch_spans;
mod batch_writer;
mod call_pacing;
pub mod checkpoint_rule;
pub mod checkpoint_store;
pub mod column_type;
mod config;
mod dead_letters;
pub mod decision;
mod effect_results;
mod error;
mod held_gauge;
mod http_target;
mod lag_watch;
mod loop_settings;
pub mod mapping;
mod metrics;
mod partition_positioning;
mod provider_settlement;
mod provider_target;
mod provider_target_error;
mod retention;
pub mod schema;
mod service;
mod sink_loop;
pub mod table_writer;
pub mod targets;

use eos_core::{Boundary, Guarantee};
use eos_runtime::schema_migrations as migrations;
use eos_runtime::secrets::redact_url_userinfo;
use tokio_util::sync::CancellationToken;

pub use config::{Config, MigrateArgs, OffsetsMode};
pub use error::SinkError;
pub use service::{Service, build};
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
        "kafka topic={} group={} format={} (read_committed)",
        config.topic,
        config.group_id,
        config.registry.describe(config.input_format)
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
    match build(config, &shutdown).await? {
        Some(sink) => sink.run(shutdown).await,
        // Stopped while waiting for PostgreSQL: nothing ran, nothing to drain.
        None => Ok(()),
    }
}
