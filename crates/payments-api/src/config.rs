//! Command-line and environment configuration.

use std::net::SocketAddr;
use std::time::Duration;

use clap::builder::BoolishValueParser;
use clap::{ArgAction, Parser};
use eos_runtime::LogFlags;
use eos_runtime::secrets::DatabaseUrlFlags;
use eos_runtime::service_flags::StallFlags;

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

    /// Longest a client may take to send a request's headers, counted from the connection's
    /// start or, on a keep-alive connection, from the previous answer; then the connection is
    /// closed (docs/security.md "payments-api").
    #[arg(long, env = "PAYMENTS_API_HEADER_READ_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub header_read_timeout: Duration,

    /// Longest a client may take to send a request's whole body, counted from its headers; then
    /// the request is answered 408 and the connection closed.
    #[arg(long, env = "PAYMENTS_API_BODY_READ_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub body_read_timeout: Duration,

    /// Longest a keep-alive connection is kept open with no request in progress.
    #[arg(long, env = "PAYMENTS_API_IDLE_TIMEOUT", default_value = "5s", value_parser = humantime::parse_duration)]
    pub idle_timeout: Duration,

    /// Most open HTTP connections; one more is closed at once (counted as connection_cap in
    /// payments_api_connections_dropped_total). Keep it below the process's file-descriptor
    /// limit.
    #[arg(long, env = "PAYMENTS_API_MAX_CONNECTIONS", default_value_t = 512)]
    pub max_connections: usize,

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

    /// When a request waiting on PostgreSQL with none answered is warned of, and when
    /// `/healthz` fails for it (docs/OBSERVABILITY.md "Liveness").
    #[command(flatten)]
    pub stall: StallFlags,

    #[command(flatten)]
    pub log: LogFlags,
}

impl Config {
    /// The HTTP connection limits these flags give, or which flag is out of range.
    pub fn connection_limits(&self) -> anyhow::Result<crate::http_server::ConnectionLimits> {
        for (flag, value) in [
            ("--header-read-timeout", self.header_read_timeout),
            ("--body-read-timeout", self.body_read_timeout),
            ("--idle-timeout", self.idle_timeout),
        ] {
            anyhow::ensure!(!value.is_zero(), "{flag} must be positive");
        }
        anyhow::ensure!(
            self.max_connections > 0,
            "--max-connections must be positive"
        );
        Ok(crate::http_server::ConnectionLimits {
            header_read_timeout: self.header_read_timeout,
            body_read_timeout: self.body_read_timeout,
            idle_timeout: self.idle_timeout,
            max_connections: self.max_connections,
        })
    }
}

impl eos_runtime::service_flags::LogFormatFlag for Config {
    fn log_format(&self) -> eos_runtime::LogFormat {
        self.log.log_format
    }
}
