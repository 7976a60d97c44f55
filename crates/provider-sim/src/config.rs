//! Command-line and environment configuration.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use eos_runtime::secrets::{Secret, parse_secret_file};
use eos_runtime::service_flags::LogFlags;

use crate::faults::FaultPlan;

/// A fake external payment provider for tests and the demo.
///
/// POST /charges with an Idempotency-Key header applies a charge once per key (keys are
/// forgotten after --key-ttl, as real providers do); GET /charges/{key} answers the record of a
/// key; GET /effects lists every effect ever applied, with attempt counts. Faults are injected by
/// probability from a seeded RNG: answer 503 before applying, or apply and then drop the
/// connection, answer late, or answer 500.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "provider-sim",
    version,
    about,
    long_about,
    // The shared log flag, under the variable provider-sim has always read (deploy/ sets it).
    mut_args(|arg| if arg.get_id() == "log_format" { arg.env("PROVIDER_SIM_LOG_FORMAT") } else { arg })
)]
pub struct Config {
    /// HTTP listen address. Port 0 picks a free port; the bound address is logged as http_addr.
    #[arg(long, env = "PROVIDER_SIM_ADDR", default_value = "127.0.0.1:8081")]
    pub addr: SocketAddr,

    /// PEM certificate chain: with --tls-key, serve HTTPS (rustls) instead of HTTP.
    #[arg(long, env = "PROVIDER_SIM_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,

    /// PEM private key for --tls-cert.
    #[arg(long, env = "PROVIDER_SIM_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,

    /// A file holding the exact `Authorization` header value every /charges request must carry
    /// (others are answered 401, nothing applied), as a real provider's API key works.
    #[arg(long, env = "PROVIDER_SIM_REQUIRE_AUTH_FILE", value_parser = parse_secret_file)]
    pub require_auth_file: Option<Secret>,

    /// How long an idempotency key is remembered after its charge was applied.
    #[arg(long, env = "PROVIDER_SIM_KEY_TTL", default_value = "24h", value_parser = humantime::parse_duration)]
    pub key_ttl: Duration,

    /// Seed of the fault RNG [default: random, logged].
    #[arg(long, env = "PROVIDER_SIM_SEED")]
    pub seed: Option<u64>,

    /// Probability of answering 503 without applying the charge.
    #[arg(
        long,
        env = "PROVIDER_SIM_ERROR_BEFORE_APPLY_PROBABILITY",
        default_value_t = 0.0
    )]
    pub error_before_apply_probability: f64,

    /// Probability of applying the charge and then closing the connection without an answer.
    #[arg(
        long,
        env = "PROVIDER_SIM_DROP_RESPONSE_AFTER_APPLY_PROBABILITY",
        default_value_t = 0.0
    )]
    pub drop_response_after_apply_probability: f64,

    /// How late a delayed answer comes (make it longer than the caller's deadline).
    #[arg(long, env = "PROVIDER_SIM_DELAY_AFTER_APPLY", default_value = "0s", value_parser = humantime::parse_duration)]
    pub delay_after_apply: Duration,

    /// Probability of applying the charge and answering only after --delay-after-apply.
    #[arg(
        long,
        env = "PROVIDER_SIM_DELAY_AFTER_APPLY_PROBABILITY",
        default_value_t = 0.0
    )]
    pub delay_after_apply_probability: f64,

    /// Probability of applying the charge and then answering 500.
    #[arg(
        long,
        env = "PROVIDER_SIM_ERROR_AFTER_APPLY_PROBABILITY",
        default_value_t = 0.0
    )]
    pub error_after_apply_probability: f64,

    /// Decline every charge whose amount is above this (402, nothing applied), as a card limit
    /// would: a refusal that asking again does not change.
    #[arg(long, env = "PROVIDER_SIM_DECLINE_AMOUNTS_ABOVE")]
    pub decline_amounts_above: Option<i64>,

    /// Pad every decline's body to this many bytes, as a provider with verbose errors would: the
    /// caller must still record the refusal (its reason is cut to fit) and not ask again.
    #[arg(
        long,
        env = "PROVIDER_SIM_DECLINE_BODY_BYTES",
        requires = "decline_amounts_above"
    )]
    pub decline_body_bytes: Option<usize>,

    #[command(flatten)]
    pub log: LogFlags,
}

impl Config {
    pub fn fault_plan(&self) -> FaultPlan {
        FaultPlan {
            error_before_apply: self.error_before_apply_probability,
            drop_after_apply: self.drop_response_after_apply_probability,
            delay_after_apply: self.delay_after_apply_probability,
            delay: self.delay_after_apply,
            error_after_apply: self.error_after_apply_probability,
        }
    }

    pub fn validate(&self) -> Result<(), String> {
        if self.key_ttl.is_zero() {
            return Err("--key-ttl must be positive".into());
        }
        self.fault_plan().validate()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shared log flag keeps the variable deploy/ sets for provider-sim.
    #[test]
    fn logs_by_provider_sim_log_format() {
        let command = <Config as clap::CommandFactory>::command();
        let flag = command
            .get_arguments()
            .find(|arg| arg.get_id() == "log_format");
        let env = flag.and_then(|arg| arg.get_env());
        assert_eq!(env, Some("PROVIDER_SIM_LOG_FORMAT".as_ref()));
    }

    #[test]
    fn defaults_inject_nothing() {
        let config = Config::try_parse_from(["provider-sim"]).expect("defaults");
        assert_eq!(config.addr.to_string(), "127.0.0.1:8081");
        assert_eq!(
            config.fault_plan(),
            FaultPlan {
                delay: Duration::ZERO,
                ..FaultPlan::NONE
            }
        );
        assert!(config.validate().is_ok());
        let bad = Config::try_parse_from([
            "provider-sim",
            "--drop-response-after-apply-probability",
            "1.5",
        ])
        .expect("parses");
        assert!(bad.validate().is_err());
        assert_eq!(config.decline_amounts_above, None);
        let declining =
            Config::try_parse_from(["provider-sim", "--decline-amounts-above", "50000"])
                .expect("parses");
        assert_eq!(declining.decline_amounts_above, Some(50_000));
    }
}
