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
mod error;
pub mod logical;
pub mod logical_stream;
pub mod metrics;
mod outbox_reader;
mod pgoutput;
pub mod position_topic;
mod purge;
mod records;
mod recovery;
pub mod relay_loop;
mod relay_settings;
mod server_watch;
mod service;
mod txn_assembler;

use tokio_util::sync::CancellationToken;

use eos_core::{Boundary, Guarantee};
use eos_runtime::schema_migrations;
use eos_runtime::service_flags::MigrateArgs;

pub use config::{Config, RelayMode};
pub use error::RelayError;
/// A WAL position, as the logical reader's public functions (and eos-model's models) take it.
pub use pgoutput::Lsn;
pub use service::{Service, build};

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
    let result = format!(
        "kafka topics named by each row, keyed by each row's key, values in {}",
        config.registry.describe(config.value_format)
    );
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
    match build(config, &shutdown).await? {
        Some(relay) => relay.run(shutdown).await,
        // Stopped while waiting for PostgreSQL: nothing ran, nothing to drain.
        None => Ok(()),
    }
}
