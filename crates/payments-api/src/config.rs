//! Command-line and environment configuration.

use std::net::SocketAddr;

use clap::builder::BoolishValueParser;
use clap::{ArgAction, Parser};
use eos_runtime::LogFlags;
use eos_runtime::secrets::DatabaseUrlFlags;

/// A domain service built on the outbox: POST /payments with an Idempotency-Key header records
/// the payment, bumps the account, and enqueues the payment's event in the same PostgreSQL
/// transaction, so the event exists if and only if the payment does; outbox-relay publishes it.
///
/// A retry with the same key returns the original answer and writes nothing; the same key with
/// another body is refused (409); a malformed request is refused (400) and writes nothing.
#[derive(Debug, Clone, Parser)]
#[command(name = "payments-api", version, about, long_about)]
pub struct Config {
    /// Address of the HTTP API.
    #[arg(long, env = "PAYMENTS_API_ADDR", default_value = "127.0.0.1:8090")]
    pub addr: SocketAddr,

    #[command(flatten)]
    pub database: DatabaseUrlFlags,

    /// Do not apply the migrations at start-up; only check that `payments-api migrate` has applied
    /// them (it runs with a role that owns the schema, so this service can run with one that only
    /// reads and writes rows).
    #[arg(long, env = "EOS_SKIP_MIGRATIONS", action = ArgAction::SetTrue, value_parser = BoolishValueParser::new())]
    pub skip_migrations: bool,

    /// Kafka topic the payment events are published to (by outbox-relay).
    #[arg(long, env = "PAYMENTS_API_TOPIC", default_value = "payments")]
    pub topic: String,

    /// Most open database connections.
    #[arg(long, env = "PAYMENTS_API_DB_MAX_CONNECTIONS", default_value_t = 16)]
    pub db_max_connections: u32,

    /// Address of /metrics, /healthz, /readyz and /boundary (port 0: any free port, logged).
    #[arg(
        long,
        env = "PAYMENTS_API_METRICS_ADDR",
        default_value = "127.0.0.1:9468"
    )]
    pub metrics_addr: SocketAddr,

    #[command(flatten)]
    pub log: LogFlags,
}

/// What the command line asks for: run the service (the flags of [`Config`]) or `payments-api migrate`.
pub type Invocation = eos_runtime::service_flags::Invocation<Config>;

impl eos_runtime::service_flags::LogFormatFlag for Config {
    fn log_format(&self) -> eos_runtime::LogFormat {
        self.log.log_format
    }
}
