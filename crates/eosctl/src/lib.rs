//! `eosctl`, the command-line tool of eos-suite: it writes realistic at-least-once workloads to
//! Kafka (`produce`), proves — or refutes — a pipeline's exactly-once result (`audit`), tells how
//! far a consumer group is behind (`lag`), shows an event's trace from Jaeger as a tree (`trace`),
//! settles the operations the sink held (`held`) and lists and re-drives dead letters
//! (`dead-letters`). The demo and the benchmarks are eos-lab's:
//! it runs this crate's producer, lag watch, audit and trace in-process.
//!
//! Guarantee of the audit: it passes only when every input record is accounted for exactly once —
//! one output per logical event (cardinality by `event_id`, never by delivery attempts), nothing for a duplicate delivery, one dead-letter entry with the right reason for
//! each malformed or conflicting record — and the running per-entity totals in the output add up.
//! It reads with `read_committed`, so it sees what a downstream exactly-once consumer sees. Given
//! a database and a provider, it also passes only when the sink's tables and the provider's
//! effects hold each output event exactly once.
//!
//! The audit's rules ([`audit`], [`boundary_audit`]), the workload generator ([`workload`]) and
//! the choice of dead letters and their re-drive records ([`dead_letters`]) are pure and
//! unit-tested; [`topic_reader`], [`kafka_client`], [`group_offsets`], [`produce`] and
//! [`redrive`] are the Kafka adapters, [`boundary_reader`] the PostgreSQL and provider one,
//! [`jaeger`] the Jaeger query API's (its spans become trees in the pure [`trace_tree`]).
//! [`commands`] holds one module per subcommand, which puts these together and prints the
//! result.

pub mod audit;
pub mod boundary_audit;
pub mod boundary_reader;
pub mod cli;
pub mod commands;
pub mod dead_letters;
pub mod group_offsets;
pub mod held;
pub mod jaeger;
pub mod kafka_client;
pub mod lag;
pub mod produce;
pub mod redrive;
pub mod replay_audit;
pub mod report;
pub mod run_formats;
pub mod source_record;
pub mod topic_reader;
pub mod trace_tree;
pub mod workload;

#[cfg(test)]
mod test_support;

pub use cli::{AuditArgs, Cli, Command, LagArgs, ProduceArgs};
pub use commands::{Status, run};
