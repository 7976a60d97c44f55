//! The transactional outbox (docs/architecture/outbox.md "Outbox"): a service enqueues an event in
//! the same PostgreSQL transaction as its domain change ([`enqueue()`]), so the event exists if and
//! only if the change committed; `outbox-relay` reads the rows back ([`reader`]) and publishes
//! them to Kafka.
//!
//! Guarantee: no dual-write gap. A committed domain change has its outbox row and a rolled-back
//! one has none, because both are one transaction. The read order never skips a committed row
//! and keeps each entity's events in commit order (see [`reader`] and the migration's comment on
//! `eos_outbox_enqueue`). Services in other languages call the SQL function
//! `eos_outbox_enqueue(...)` in their own transactions; [`enqueue()`] is a thin wrapper over it.
//! Any JSON event, published as it is with its own key and headers, goes through
//! `eos_outbox_enqueue_event(...)` and [`enqueue_message()`].

pub mod enqueue;
pub mod reader;
pub mod relay_positions;

pub use enqueue::{OutboxError, OutboxEvent, OutboxMessage, enqueue, enqueue_message};
pub use reader::{OutboxCursor, OutboxRow, read_after, read_positions, read_visible_after};

/// The embedded migrations: the outbox table, the entity order table, the relay positions and
/// the `eos_outbox_enqueue` and `eos_outbox_enqueue_event` functions. They share `_sqlx_migrations` with other services'
/// migrations when those use the same database, so migrations this crate does not know are not
/// an error.
pub fn migrator() -> sqlx::migrate::Migrator {
    let mut migrator = sqlx::migrate!();
    migrator.set_ignore_missing(true);
    migrator
}
