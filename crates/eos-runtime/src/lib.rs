//! What every eos-suite binary runs on, apart from its own work: [`service_main()`] (telemetry,
//! the shutdown signal, the exit code), the flag groups the services share, the operations
//! endpoint (`/metrics`, `/healthz`, `/readyz`, `/boundary`, with the boundary logged at
//! start-up), the consumer set-up and rebalance recording of the Kafka services, and W3C trace
//! context and baggage propagation over Kafka headers, gRPC metadata and HTTP headers.
//!
//! Guarantee: every Kafka client is set up through [`kafka_clients`], so the settings
//! exactly-once depends on are set here once and are not configurable — a consumer never commits
//! or stores an offset by itself and says which isolation it reads at, a producer is idempotent;
//! the group consumer of eos-processor and sink-writer
//! ([`rebalance::subscribe_static_member`]) adds `read_committed` and static group membership. Every service states its guarantee the same way: logged, and served on
//! `/boundary`. The event envelope and the other pure types live in `eos-core`, which does no
//! I/O.

pub mod backoff;
pub mod batched_purge;
pub mod kafka_clients;
pub mod kafka_errors;
pub mod kafka_settings;
pub mod log_end;
pub mod measuring_thread;
pub mod ops_http;
#[cfg(feature = "postgres")]
pub mod postgres_pool;
pub mod progress_watch;
pub mod rebalance;
#[cfg(feature = "postgres")]
pub mod schema_migrations;
pub mod secrets;
pub mod service_flags;
pub mod service_main;
pub mod shutdown;
pub mod span_export;
pub mod stuck_call_watchdog;
pub mod telemetry;
pub mod topic_config;
pub mod trace_context;
pub mod transaction_recovery;
pub mod transactional_producer;

pub use kafka_settings::{KafkaFlags, KafkaSettings};
pub use service_flags::{InstanceFlags, LogFlags};
pub use service_main::{run_with_telemetry, serve_or_migrate, service_main};
pub use telemetry::LogFormat;
