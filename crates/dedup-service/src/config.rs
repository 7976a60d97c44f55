//! Command-line and environment configuration.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::builder::BoolishValueParser;
use clap::{ArgAction, Parser};
use eos_runtime::secrets::{DatabaseUrlFlags, Secret, parse_secret, parse_secret_file};
use eos_runtime::service_flags::{LogFlags, StallFlags};

use crate::group_commit::GroupCommitSettings;
use crate::grpc_connections::ConnectionLimits;
use crate::retention::RetentionPolicy;
use crate::target_policies::{ReconcileStrategy, TargetPolicies};
use crate::validation::{LeaseLimits, MAX_BATCH_ITEMS};

/// Durable intents over gRPC for exactly-once effects at an external provider.
///
/// A caller Begins an operation (its id is the provider's idempotency key) and calls the provider
/// only when the answer is ACQUIRED; it then reports Complete, Fail or MarkUnknown with its
/// fencing token. Intents live in PostgreSQL; a lease that runs out makes the intent UNKNOWN, and
/// the reconciler settles UNKNOWN intents by asking the provider with the same key. Retention is
/// checked against the replay horizon at start-up and operations older than the retained window
/// answer EXPIRED (fail closed).
#[derive(Debug, Clone, Parser)]
#[command(
    name = "dedup-service",
    version,
    about,
    long_about,
    // The shared log flag, under the variable dedup-service has always read (deploy/ sets it);
    // `migrate` takes it from here (eos_runtime::service_flags::Invocation).
    mut_args(|arg| if arg.get_id() == "log_format" { arg.env("DEDUP_LOG_FORMAT") } else { arg })
)]
pub struct Config {
    /// gRPC listen address (Dedup, grpc.health.v1, and server reflection with --reflection).
    /// Port 0 picks a free port; the bound address is logged as grpc_addr. A non-loopback
    /// address needs client credentials (tokens or --tls-client-ca) or --allow-unauthenticated.
    #[arg(long, env = "DEDUP_GRPC_ADDR", default_value = "127.0.0.1:50051")]
    pub listen: SocketAddr,

    #[command(flatten)]
    pub database: DatabaseUrlFlags,

    /// Do not apply the migrations at start-up; only check that `dedup-service migrate` has
    /// applied them (it runs with a role that owns the schema, so this service can run with one
    /// that only reads and writes rows).
    #[arg(long, env = "EOS_SKIP_MIGRATIONS", action = ArgAction::SetTrue, value_parser = BoolishValueParser::new())]
    pub skip_migrations: bool,

    /// Largest PostgreSQL connection pool.
    #[arg(long, env = "DEDUP_DB_MAX_CONNECTIONS", default_value_t = 16)]
    pub db_max_connections: u32,

    /// Group commit: most concurrent single Begin (or Complete) calls that go to PostgreSQL as
    /// one statement and one commit, each answered from its own row. A call that finds a group
    /// slot free goes at once; calls that arrive while every slot is committing wait and go
    /// together in the next group (two calls with one operation id never share a group).
    /// 1 turns grouping off: every single call is a statement of its own.
    #[arg(long, env = "DEDUP_GROUP_COMMIT_MAX_CALLS", default_value_t = 256)]
    pub group_commit_max_calls: usize,

    /// Group commits of each kind (Begin, Complete) in flight at once, each on a connection of
    /// its own: while one waits for its commit, the next forms and goes. More slots make groups
    /// smaller, and each statement and commit costs PostgreSQL CPU whatever its size: on a
    /// database whose cores are busy, 2 carried about 40% more single calls than 4
    /// (docs/BENCHMARKS.md "Group commit of single calls").
    #[arg(long, env = "DEDUP_GROUP_COMMIT_GROUPS", default_value_t = 2)]
    pub group_commit_groups: usize,

    /// Lease of a Begin that does not ask for one: how long the holder has to call the provider
    /// and report. Keep the holder's provider deadline below it.
    #[arg(long, env = "DEDUP_LEASE_TTL", default_value = "30s", value_parser = humantime::parse_duration)]
    pub lease_ttl: Duration,

    /// Longest lease a Begin may ask for.
    #[arg(long, env = "DEDUP_MAX_LEASE_TTL", default_value = "10m", value_parser = humantime::parse_duration)]
    pub max_lease_ttl: Duration,

    /// How long intents are kept, counted from the operation's occurred_at. Must be at least
    /// max(client retry horizon, broker replay retention, restore horizon) + margin.
    #[arg(long, env = "DEDUP_RETENTION", default_value = "30d", value_parser = humantime::parse_duration)]
    pub retention: Duration,

    /// Longest time a client may retry an operation.
    #[arg(long, env = "DEDUP_CLIENT_RETRY_HORIZON", default_value = "1d", value_parser = humantime::parse_duration)]
    pub client_retry_horizon: Duration,

    /// Longest time the broker keeps records that recovery may replay (e.g. Kafka retention.ms
    /// of the input topic).
    #[arg(long, env = "DEDUP_BROKER_REPLAY_RETENTION", default_value = "7d", value_parser = humantime::parse_duration)]
    pub broker_replay_retention: Duration,

    /// Oldest point a backup restore may replay from.
    #[arg(long, env = "DEDUP_RESTORE_HORIZON", default_value = "14d", value_parser = humantime::parse_duration)]
    pub restore_horizon: Duration,

    /// Clock and operational margin on top of the replay horizon.
    #[arg(long, env = "DEDUP_RETENTION_MARGIN", default_value = "1d", value_parser = humantime::parse_duration)]
    pub retention_margin: Duration,

    /// How often settled intents past retention are purged.
    #[arg(long, env = "DEDUP_PURGE_INTERVAL", default_value = "5m", value_parser = humantime::parse_duration)]
    pub purge_interval: Duration,

    /// Base URL of the provider's HTTP API (GET {url}/charges/{key}). Without it UNKNOWN intents
    /// are only settled by Resolve calls.
    // The value is hidden from --help: a URL with user:password@ is refused at start-up, but
    // --help shows the environment before anything is checked.
    #[arg(long, env = "DEDUP_PROVIDER_URL", hide_env_values = true)]
    pub provider_url: Option<String>,

    /// The value of the provider's credential header (e.g. "Bearer …"). Prefer
    /// --provider-auth-file: a value here is visible in the process list.
    #[arg(long, env = "DEDUP_PROVIDER_AUTH", hide_env_values = true, value_parser = parse_secret)]
    pub provider_auth: Option<Secret>,

    /// A file holding the provider's credential header value, read at start-up.
    #[arg(
        long,
        env = "DEDUP_PROVIDER_AUTH_FILE",
        value_parser = parse_secret_file,
        conflicts_with = "provider_auth"
    )]
    pub provider_auth_file: Option<Secret>,

    /// The header the provider's credential goes in.
    #[arg(
        long,
        env = "DEDUP_PROVIDER_AUTH_HEADER",
        default_value = "Authorization"
    )]
    pub provider_auth_header: String,

    /// PEM CA certificates trusted for an https:// provider, in addition to the built-in web
    /// roots (a private provider's CA).
    #[arg(long, env = "DEDUP_PROVIDER_CA_FILE")]
    pub provider_ca_file: Option<PathBuf>,

    /// Deadline of one provider look-up.
    #[arg(long, env = "DEDUP_PROVIDER_TIMEOUT", default_value = "5s", value_parser = humantime::parse_duration)]
    pub provider_timeout: Duration,

    /// How long after an attempt's lease ends a request may still reach the provider and be
    /// applied. Only after it does "no record at the provider" settle an UNKNOWN as a retryable
    /// failure.
    #[arg(long, env = "DEDUP_IN_FLIGHT_WINDOW", default_value = "60s", value_parser = humantime::parse_duration)]
    pub in_flight_window: Duration,

    /// How long the provider remembers idempotency keys. An UNKNOWN older than this is never
    /// settled as failed from "no record" (the provider may have forgotten it): it waits for
    /// an operator's Resolve.
    #[arg(long, env = "DEDUP_PROVIDER_KEY_TTL", default_value = "24h", value_parser = humantime::parse_duration)]
    pub provider_key_ttl: Duration,

    /// How a target's UNKNOWN intents are settled, as TARGET=lookup|replay|none (repeat the flag,
    /// or separate them with commas in the environment variable): lookup asks --provider-url
    /// for the key (every target not named), replay lets the caller send the same request with
    /// the same key again after --in-flight-window (for APIs that answer a repeated key with the
    /// first result, and only while they keep it: --provider-key-ttl), none holds the intent for
    /// an operator (docs/guarantees.md).
    #[arg(long = "reconcile-strategy", env = "DEDUP_RECONCILE_STRATEGIES", value_name = "TARGET=STRATEGY", value_delimiter = ',', value_parser = parse_reconcile_strategy)]
    pub reconcile_strategies: Vec<(String, ReconcileStrategy)>,

    /// How long one target's API keeps idempotency keys, as TARGET=DURATION (repeat the flag, or
    /// separate them with commas in the environment variable); a target not named has
    /// --provider-key-ttl. A replay target's must cover the replay horizon plus
    /// --retention-margin, since its next attempt may come that late (checked at start).
    #[arg(long = "key-ttl", env = "DEDUP_KEY_TTLS", value_name = "TARGET=DURATION", value_delimiter = ',', value_parser = parse_key_ttl)]
    pub key_ttls: Vec<(String, Duration)>,

    /// A TOML file of per-target look-ups: for each `[[lookups]]` target, the request that asks
    /// its API about a key and how the answers are sorted (docs/dedup-service.md "Look-ups of
    /// any API"). A lookup target without one asks --provider-url.
    #[arg(long, env = "DEDUP_LOOKUPS")]
    pub lookups: Option<PathBuf>,

    /// Pause between reconciler passes (lease sweep, provider look-ups, backlog figures).
    #[arg(long, env = "DEDUP_RECONCILE_INTERVAL", default_value = "1s", value_parser = humantime::parse_duration)]
    pub reconcile_interval: Duration,

    /// Provider look-ups in flight at once.
    #[arg(long, env = "DEDUP_RECONCILE_CONCURRENCY", default_value_t = 16)]
    pub reconcile_concurrency: usize,

    /// Window over which the arrival rate u and the reconcile rate r are computed.
    #[arg(long, env = "DEDUP_RATE_WINDOW", default_value = "60s", value_parser = humantime::parse_duration)]
    pub rate_window: Duration,

    /// Address for /metrics, /healthz, /readyz and /boundary.
    #[arg(long, env = "DEDUP_METRICS_ADDR", default_value = "127.0.0.1:9466")]
    pub metrics_addr: SocketAddr,

    /// When a reconciler pass, or intent writes, that make no progress are warned of and fail the
    /// health check (docs/OBSERVABILITY.md "Liveness").
    #[command(flatten)]
    pub stall: StallFlags,

    /// How long SIGTERM waits for in-flight calls and background tasks.
    #[arg(long, env = "DEDUP_SHUTDOWN_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub shutdown_timeout: Duration,

    #[command(flatten)]
    pub log: LogFlags,

    /// PEM certificate chain: with --tls-key, serve gRPC over TLS (rustls).
    #[arg(long, env = "DEDUP_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,

    /// PEM private key for --tls-cert.
    #[arg(long, env = "DEDUP_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,

    /// PEM CA certificate(s): require every gRPC client to present a certificate signed by it
    /// (mTLS). Needs --tls-cert. Health checks need a certificate too, on this port.
    #[arg(long, env = "DEDUP_TLS_CLIENT_CA", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,

    /// Bearer token of clients (Begin, Complete, Fail, MarkUnknown, Get and their batches).
    /// Repeat it (or separate by commas in the env var) to accept several during a rotation.
    /// Prefer the env var or --client-token-file: a flag shows in the process list.
    #[arg(
        long = "client-token",
        env = "DEDUP_CLIENT_TOKEN",
        hide_env_values = true,
        value_delimiter = ','
    )]
    pub client_tokens: Vec<String>,

    /// File of client tokens, one per line (trimmed; blank and '#' lines skipped), e.g. a
    /// mounted Secret.
    #[arg(
        long = "client-token-file",
        env = "DEDUP_CLIENT_TOKEN_FILE",
        value_delimiter = ','
    )]
    pub client_token_files: Vec<PathBuf>,

    /// Bearer token of operators: Resolve and ListUnknown (and everything a client may call).
    /// Repeatable, like --client-token.
    #[arg(
        long = "operator-token",
        env = "DEDUP_OPERATOR_TOKEN",
        hide_env_values = true,
        value_delimiter = ','
    )]
    pub operator_tokens: Vec<String>,

    /// File of operator tokens, one per line.
    #[arg(
        long = "operator-token-file",
        env = "DEDUP_OPERATOR_TOKEN_FILE",
        value_delimiter = ','
    )]
    pub operator_token_files: Vec<PathBuf>,

    /// Serve without client credentials on a non-loopback address (anyone who reaches the port
    /// may report outcomes). Logged as a warning.
    #[arg(long, env = "DEDUP_ALLOW_UNAUTHENTICATED", action = ArgAction::SetTrue, value_parser = BoolishValueParser::new())]
    pub allow_unauthenticated: bool,

    /// Serve gRPC server reflection (grpc.reflection.v1), behind the same credentials as Dedup.
    #[arg(long, env = "DEDUP_REFLECTION", action = ArgAction::SetTrue, value_parser = BoolishValueParser::new())]
    pub reflection: bool,

    /// Requests served at once on one connection; more wait their turn (HTTP/2 multiplexes
    /// a client's calls on one connection, so this bounds what one client can take).
    #[arg(long, env = "DEDUP_CONCURRENCY_PER_CONNECTION", default_value_t = 256)]
    pub concurrency_per_connection: usize,

    /// Longest a request may run on the server (a client's shorter grpc-timeout wins); then
    /// it is cancelled with DEADLINE_EXCEEDED.
    #[arg(long, env = "DEDUP_REQUEST_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration)]
    pub request_timeout: Duration,

    /// Interval of HTTP/2 PING frames on idle connections, so dead peers are found and their
    /// connection closed.
    #[arg(long, env = "DEDUP_HTTP2_KEEPALIVE_INTERVAL", default_value = "30s", value_parser = humantime::parse_duration)]
    pub http2_keepalive_interval: Duration,

    /// How long a PING may go unanswered before the connection is closed.
    #[arg(long, env = "DEDUP_HTTP2_KEEPALIVE_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub http2_keepalive_timeout: Duration,

    /// Most open gRPC connections; one more is closed as soon as it is accepted (counted as
    /// connection_cap in eos_dedup_connections_dropped_total). Keep it below the process's
    /// file-descriptor limit, with room for the database pool and the ops endpoint.
    #[arg(long, env = "DEDUP_MAX_CONNECTIONS", default_value_t = 1024)]
    pub max_connections: usize,

    /// How long a new gRPC connection has to finish its handshake — send the HTTP/2 preface and
    /// its SETTINGS frame, or with --tls-cert finish the TLS handshake — before it is closed.
    #[arg(long, env = "DEDUP_HANDSHAKE_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub handshake_timeout: Duration,

    /// How long a gRPC connection may go with no call in flight (from its handshake or its last
    /// answer) before it is closed; its client connects again for its next call. Keep-alive
    /// PINGs do not count as calls.
    #[arg(long, env = "DEDUP_IDLE_TIMEOUT", default_value = "5m", value_parser = humantime::parse_duration)]
    pub idle_timeout: Duration,

    /// Largest request message accepted, in bytes (larger: OUT_OF_RANGE, as tonic answers). 4 MiB holds a
    /// batch of 1000 Begins or typical Completes.
    #[arg(long, env = "DEDUP_MAX_DECODING_MESSAGE_SIZE", default_value_t = 4 * 1024 * 1024)]
    pub max_decoding_message_size: usize,

    /// Largest response message sent, in bytes. 64 MiB holds ListUnknown's 1000 intents with
    /// 64 KiB results each.
    #[arg(long, env = "DEDUP_MAX_ENCODING_MESSAGE_SIZE", default_value_t = 64 * 1024 * 1024)]
    pub max_encoding_message_size: usize,
}

/// What the command line asks for: serve (the flags of [`Config`]) or the `migrate` step. Only the
/// tests parse it here; the binary's `main` has `eos_runtime::serve_or_migrate` do it.
/// `TARGET=lookup|replay|none`.
fn parse_reconcile_strategy(text: &str) -> Result<(String, ReconcileStrategy), String> {
    use clap::ValueEnum as _;
    let (target, strategy) = text
        .split_once('=')
        .filter(|(target, _)| !target.is_empty() && !target.contains(':'))
        .ok_or_else(|| format!("{text:?} is not TARGET=lookup, TARGET=replay or TARGET=none"))?;
    let strategy = ReconcileStrategy::from_str(strategy, false)
        .map_err(|_| format!("{text:?}: {strategy:?} is not lookup, replay or none"))?;
    Ok((target.to_owned(), strategy))
}

/// `TARGET=DURATION`.
fn parse_key_ttl(text: &str) -> Result<(String, Duration), String> {
    let (target, ttl) = text
        .split_once('=')
        .filter(|(target, _)| !target.is_empty() && !target.contains(':'))
        .ok_or_else(|| format!("{text:?} is not TARGET=DURATION"))?;
    let ttl = humantime::parse_duration(ttl).map_err(|e| format!("{text:?}: {e}"))?;
    Ok((target.to_owned(), ttl))
}

#[cfg(test)]
pub(crate) type Invocation = eos_runtime::service_flags::Invocation<Config>;
pub use eos_runtime::service_flags::MigrateArgs;

impl Config {
    pub(crate) fn retention_policy(&self) -> RetentionPolicy {
        RetentionPolicy {
            retention: self.retention,
            client_retry_horizon: self.client_retry_horizon,
            broker_replay_retention: self.broker_replay_retention,
            restore_horizon: self.restore_horizon,
            margin: self.retention_margin,
        }
    }

    pub(crate) fn group_commit_settings(&self) -> GroupCommitSettings {
        GroupCommitSettings {
            max_calls: self.group_commit_max_calls,
            groups: self.group_commit_groups,
        }
    }

    pub(crate) fn connection_limits(&self) -> ConnectionLimits {
        ConnectionLimits {
            max_connections: self.max_connections,
            handshake_timeout: self.handshake_timeout,
            idle_timeout: self.idle_timeout,
        }
    }

    pub(crate) fn lease_limits(&self) -> LeaseLimits {
        LeaseLimits {
            default_ttl: self.lease_ttl,
            max_ttl: self.max_lease_ttl,
        }
    }

    /// The credentials the flags name, read and checked (tokens from their files too).
    pub(crate) fn auth_policy(&self) -> Result<crate::auth::AuthPolicy, String> {
        use dedup_client::credentials::token_set;
        let client_tokens = token_set(
            &self.client_tokens,
            &self.client_token_files,
            "--client-token",
        )
        .map_err(|e| e.to_string())?;
        let operator_tokens = token_set(
            &self.operator_tokens,
            &self.operator_token_files,
            "--operator-token",
        )
        .map_err(|e| e.to_string())?;
        // One secret in both roles would make every client an operator.
        for operator in &operator_tokens {
            if client_tokens
                .iter()
                .any(|client| client.matches(operator.expose()))
            {
                return Err("a token is both a client and an operator token".into());
            }
        }
        Ok(crate::auth::AuthPolicy {
            client_tokens,
            operator_tokens,
            mtls: self.tls_client_ca.is_some(),
        })
    }

    /// Each target's reconcile strategy and key TTL, as the reconciler reads them.
    pub(crate) fn target_policies(&self) -> TargetPolicies {
        TargetPolicies::new(
            self.reconcile_strategies.iter().cloned(),
            self.key_ttls.iter().cloned(),
            self.provider_key_ttl,
        )
    }

    /// Every key TTL must outlive an attempt, so a look-up can still prove "not applied" before
    /// the API forgets the key; a replay target's must also cover the replay horizon, since its
    /// next attempt (a Kafka replay, a restore) may send the same key that late.
    fn check_key_ttls(&self) -> Result<(), String> {
        let shown = |ttl| humantime::format_duration(ttl).to_string();
        let needed = self.max_lease_ttl + self.in_flight_window;
        let own = self
            .key_ttls
            .iter()
            .map(|(target, ttl)| (format!("--key-ttl {target}={}", shown(*ttl)), *ttl));
        let global = (
            "--provider-key-ttl ".to_owned() + &shown(self.provider_key_ttl),
            self.provider_key_ttl,
        );
        for (flag, ttl) in own.chain([global]) {
            if ttl <= needed {
                return Err(format!(
                    "{flag} must exceed --max-lease-ttl {} + --in-flight-window {}",
                    shown(self.max_lease_ttl),
                    shown(self.in_flight_window)
                ));
            }
        }
        let policies = self.target_policies();
        let required = self.retention_policy().required_retention();
        for (target, strategy) in &self.reconcile_strategies {
            let ttl = policies.key_ttl_of_target(target);
            if *strategy == ReconcileStrategy::Replay && ttl < required {
                return Err(format!(
                    "target {target} settles UNKNOWN by replay, but its API keeps keys for {} \
                     (--key-ttl {target}=… or --provider-key-ttl), shorter than the replay \
                     horizon plus margin, {}: a later attempt could send the key after the API \
                     forgot it and be applied twice. Give the API's real key TTL, or settle the \
                     target by lookup or none (docs/guarantees.md)",
                    shown(ttl),
                    shown(required)
                ));
            }
        }
        Ok(())
    }

    /// Checks what clap cannot: values that parse but do not fit together. The retention
    /// formula is checked first, naming every figure.
    pub(crate) fn validate(&self) -> Result<(), String> {
        self.retention_policy().check().map_err(|e| e.to_string())?;
        let positive = [
            ("--lease-ttl", self.lease_ttl),
            ("--in-flight-window", self.in_flight_window),
            ("--reconcile-interval", self.reconcile_interval),
            ("--rate-window", self.rate_window),
            ("--purge-interval", self.purge_interval),
            ("--provider-timeout", self.provider_timeout),
        ];
        for (flag, value) in positive {
            if value.is_zero() {
                return Err(format!("{flag} must be positive"));
            }
        }
        if self.lease_ttl > self.max_lease_ttl {
            return Err(format!(
                "--lease-ttl {} is longer than --max-lease-ttl {}",
                humantime::format_duration(self.lease_ttl),
                humantime::format_duration(self.max_lease_ttl)
            ));
        }
        self.check_key_ttls()?;
        if self.db_max_connections < 2 {
            return Err("--db-max-connections must be at least 2".into());
        }
        if self.group_commit_max_calls == 0 || self.group_commit_max_calls > MAX_BATCH_ITEMS {
            return Err(format!(
                "--group-commit-max-calls must be between 1 and {MAX_BATCH_ITEMS} (a batch's limit)"
            ));
        }
        if self.group_commit_groups == 0 {
            return Err("--group-commit-groups must be at least 1".into());
        }
        // Both kinds' groups at once still leave a connection for batches, Get, the reconciler
        // and the purge.
        if self.group_commit_max_calls > 1
            && 2 * self.group_commit_groups >= self.db_max_connections as usize
        {
            return Err(format!(
                "--group-commit-groups {} needs --db-max-connections above {} (Begin and \
                 Complete groups at once, and one more)",
                self.group_commit_groups,
                2 * self.group_commit_groups
            ));
        }
        if self.reconcile_concurrency == 0 {
            return Err("--reconcile-concurrency must be at least 1".into());
        }
        if self.max_connections == 0 {
            return Err("--max-connections must be at least 1".into());
        }
        if self.concurrency_per_connection == 0 {
            return Err("--concurrency-per-connection must be at least 1".into());
        }
        let limits = [
            ("--request-timeout", self.request_timeout),
            ("--http2-keepalive-interval", self.http2_keepalive_interval),
            ("--http2-keepalive-timeout", self.http2_keepalive_timeout),
            ("--handshake-timeout", self.handshake_timeout),
            ("--idle-timeout", self.idle_timeout),
        ];
        for (flag, value) in limits {
            if value.is_zero() {
                return Err(format!("{flag} must be positive"));
            }
        }
        if self.max_decoding_message_size < 64 * 1024 || self.max_encoding_message_size < 64 * 1024
        {
            return Err(
                "--max-decoding-message-size and --max-encoding-message-size must be at least 65536 (one 64 KiB result)"
                    .into(),
            );
        }
        if let Some(url) = &self.provider_url {
            let shown = eos_runtime::secrets::redact_url_userinfo(url);
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(format!(
                    "--provider-url {shown:?} must be an http:// or https:// URL"
                ));
            }
            // Refused here, before anything logs the URL (docs/security.md "Provider URLs").
            if eos_runtime::secrets::url_has_userinfo(url) {
                return Err(format!(
                    "--provider-url {shown:?} has a credential in it: give the credential with \
                     --provider-auth-file or --provider-auth instead"
                ));
            }
        }
        Ok(())
    }
}

impl eos_runtime::service_flags::LogFormatFlag for Config {
    fn log_format(&self) -> eos_runtime::LogFormat {
        self.log.log_format
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Config {
        Config::try_parse_from(
            ["dedup-service", "--database-url", "postgres://x/y"]
                .into_iter()
                .chain(args.iter().copied()),
        )
        .expect("valid flags")
    }

    #[test]
    fn defaults_are_consistent() {
        let config = parse(&[]);
        assert_eq!(config.listen.to_string(), "127.0.0.1:50051");
        assert_eq!(config.retention, Duration::from_secs(30 * 24 * 3600));
        assert!(
            !config.skip_migrations,
            "migrations run at start-up by default"
        );
        assert!(config.validate().is_ok(), "{:?}", config.validate());
    }

    #[test]
    fn migrate_is_a_subcommand_that_needs_only_the_database_url() {
        let invocation =
            Invocation::try_parse_from(["dedup-service", "migrate", "--database-url", "pg://a/b"])
                .expect("migrate parses");
        let Invocation::Migrate(args) = invocation else {
            panic!("expected migrate, got {invocation:?}");
        };
        assert_eq!(args.database.url(), "pg://a/b");

        let invocation = Invocation::try_parse_from([
            "dedup-service",
            "--database-url",
            "pg://a/b",
            "--skip-migrations",
        ])
        .expect("serve parses");
        let Invocation::Serve(config) = invocation else {
            panic!("expected serve, got {invocation:?}");
        };
        assert!(config.skip_migrations);

        let mixed = Invocation::try_parse_from([
            "dedup-service",
            "--listen",
            "127.0.0.1:1",
            "migrate",
            "--database-url",
            "pg://a/b",
        ]);
        assert!(mixed.is_err(), "serving flags and migrate do not mix");
        let help = Invocation::command().render_long_help().to_string();
        assert!(
            help.contains("migrate") && help.contains("--skip-migrations"),
            "{help}"
        );
    }

    /// The shared log flag keeps the variable deploy/ sets for dedup-service, in both commands.
    #[test]
    fn both_commands_log_by_dedup_log_format() {
        fn log_env(command: &clap::Command) -> Option<std::ffi::OsString> {
            let flag = command
                .get_arguments()
                .find(|arg| arg.get_id() == "log_format");
            flag.and_then(|arg| arg.get_env()).map(ToOwned::to_owned)
        }
        let command = Invocation::command();
        assert_eq!(log_env(&command), Some("DEDUP_LOG_FORMAT".into()));
        let migrate = command.find_subcommand("migrate").expect("migrate");
        assert_eq!(log_env(migrate), Some("DEDUP_LOG_FORMAT".into()));
    }

    /// Issue 50: the start-up `boundary` line printed `--provider-url` whole, so a credential in
    /// it reached the log before the provider client refused it.
    #[test]
    fn a_provider_url_with_a_credential_is_refused_and_never_shown() {
        let config = parse(&[
            "--provider-url",
            "http://eos-user:PASSWORD-MARKER@provider.internal:8080/v1",
        ]);
        let boundary = format!("{:?}", crate::service::boundary(&config));
        assert!(!boundary.contains("PASSWORD-MARKER"), "{boundary}");
        assert!(!boundary.contains("eos-user"), "{boundary}");
        assert!(boundary.contains("provider.internal:8080"), "{boundary}");
        let refusal = config.validate().expect_err("a credential in the URL");
        assert!(refusal.contains("--provider-auth"), "{refusal}");
        assert!(!refusal.contains("PASSWORD-MARKER"), "{refusal}");
        assert!(!refusal.contains("eos-user"), "{refusal}");

        let config = parse(&["--provider-url", "http://token-only@provider.internal/"]);
        assert!(!format!("{:?}", crate::service::boundary(&config)).contains("token-only"));
        assert!(config.validate().is_err());
    }

    #[test]
    fn secure_defaults_and_limits() {
        let config = parse(&[]);
        assert!(!config.reflection, "reflection is off by default");
        assert!(!config.allow_unauthenticated);
        assert!(config.client_tokens.is_empty() && config.operator_tokens.is_empty());
        assert_eq!(config.request_timeout, Duration::from_secs(30));
        assert_eq!(config.max_decoding_message_size, 4 * 1024 * 1024);
        let policy = config.auth_policy().expect("no tokens is a valid policy");
        assert!(policy.is_unauthenticated());

        let config = parse(&[
            "--client-token",
            "client-a-0123456789abcdef",
            "--client-token",
            "client-b-0123456789abcdef",
            "--operator-token",
            "operator-0123456789abcdef",
        ]);
        let policy = config.auth_policy().expect("valid tokens");
        assert_eq!(
            (policy.client_tokens.len(), policy.operator_tokens.len()),
            (2, 1)
        );
        let same = parse(&[
            "--client-token",
            "shared-0123456789abcdef",
            "--operator-token",
            "shared-0123456789abcdef",
        ]);
        assert!(same.auth_policy().is_err(), "one token in both roles");
        let short = parse(&["--operator-token", "admin"]);
        let error = short.auth_policy().expect_err("too short");
        assert!(
            !error.contains("admin"),
            "the value is never echoed: {error}"
        );
        assert!(
            Config::try_parse_from([
                "dedup-service",
                "--database-url",
                "postgres://x/y",
                "--tls-client-ca",
                "/ca.pem"
            ])
            .is_err(),
            "mTLS needs the server's own TLS"
        );
        let error = parse(&["--request-timeout", "0s"])
            .validate()
            .expect_err("zero timeout");
        assert!(error.contains("--request-timeout"), "{error}");
    }

    #[test]
    fn connections_are_capped_and_timed_out_by_default() {
        let limits = parse(&[]).connection_limits();
        assert_eq!(limits.max_connections, 1024);
        assert_eq!(limits.handshake_timeout, Duration::from_secs(10));
        assert_eq!(limits.idle_timeout, Duration::from_secs(300));
        let limits = parse(&[
            "--max-connections",
            "8",
            "--handshake-timeout",
            "1s",
            "--idle-timeout",
            "2s",
        ])
        .connection_limits();
        assert_eq!(
            (
                limits.max_connections,
                limits.handshake_timeout,
                limits.idle_timeout
            ),
            (8, Duration::from_secs(1), Duration::from_secs(2))
        );
        for (flag, value) in [
            ("--max-connections", "0"),
            ("--handshake-timeout", "0s"),
            ("--idle-timeout", "0s"),
        ] {
            let error = parse(&[flag, value]).validate().expect_err(flag);
            assert!(error.contains(flag), "{error}");
        }
    }

    #[test]
    fn group_commit_is_on_by_default_and_fits_the_pool() {
        let config = parse(&[]);
        assert!(config.group_commit_settings().enabled());
        let off = parse(&["--group-commit-max-calls", "1"]);
        assert!(!off.group_commit_settings().enabled());
        assert!(off.validate().is_ok(), "{:?}", off.validate());
        let error = parse(&["--group-commit-groups", "8"])
            .validate()
            .expect_err("16 of 16 connections");
        assert!(error.contains("--db-max-connections"), "{error}");
        assert!(
            parse(&["--group-commit-max-calls", "0"])
                .validate()
                .is_err()
        );
        assert!(
            parse(&["--group-commit-max-calls", "1001"])
                .validate()
                .is_err()
        );
    }

    #[test]
    fn short_retention_is_refused_naming_the_figures() {
        let error = parse(&["--retention", "2d"])
            .validate()
            .expect_err("2d < 15d");
        assert!(error.contains("--retention 2days"), "{error}");
        assert!(error.contains("--restore-horizon 14days"), "{error}");
    }

    #[test]
    fn key_ttl_must_outlive_lease_and_in_flight_window() {
        let error = parse(&["--provider-key-ttl", "5m"])
            .validate()
            .expect_err("5m < 10m + 60s");
        assert!(error.contains("--provider-key-ttl"), "{error}");
        let error = parse(&["--lease-ttl", "1h"])
            .validate()
            .expect_err("lease > max");
        assert!(error.contains("--max-lease-ttl"), "{error}");
        let error = parse(&["--key-ttl", "partner=5m"])
            .validate()
            .expect_err("a target's own TTL is checked too");
        assert!(error.contains("--key-ttl partner=5m"), "{error}");
    }

    #[test]
    fn a_replay_target_s_keys_must_outlive_the_replay_horizon() {
        // The horizon by default: max(1d, 7d, 14d) + 1d margin = 15 days.
        let error = parse(&["--reconcile-strategy", "stripe=replay"])
            .validate()
            .expect_err("Stripe-like keys kept for the default 24h do not cover 15 days");
        assert!(
            error.contains("target stripe") && error.contains("15days"),
            "{error}"
        );
        let error = parse(&[
            "--reconcile-strategy",
            "stripe=replay",
            "--key-ttl",
            "stripe=14d",
        ])
        .validate()
        .expect_err("14 days < 15 days");
        assert!(error.contains("14days"), "{error}");
        for covered in [
            &[
                "--reconcile-strategy",
                "stripe=replay",
                "--key-ttl",
                "stripe=15d",
            ][..],
            &[
                "--reconcile-strategy",
                "stripe=replay",
                "--provider-key-ttl",
                "30d",
            ],
            // A lookup or none target's keys need only outlive an attempt.
            &["--reconcile-strategy", "stripe=lookup,hook=none"],
            // A shorter horizon is a shorter need.
            &[
                "--reconcile-strategy",
                "stripe=replay",
                "--key-ttl",
                "stripe=2d",
                "--broker-replay-retention",
                "1d",
                "--restore-horizon",
                "1d",
                "--retention-margin",
                "1h",
            ],
        ] {
            let config = parse(covered);
            assert_eq!(config.validate(), Ok(()), "{covered:?}");
        }
        let config = parse(&["--key-ttl", "stripe=30d,hook=2d"]);
        assert_eq!(
            config.key_ttls,
            [
                ("stripe".to_owned(), Duration::from_secs(30 * 86_400)),
                ("hook".to_owned(), Duration::from_secs(2 * 86_400))
            ]
        );
        for bad in ["stripe", "=1d", "a:b=1d", "stripe=soon"] {
            assert!(
                Config::try_parse_from([
                    "dedup-service",
                    "--database-url",
                    "postgres://x/y",
                    "--key-ttl",
                    bad
                ])
                .is_err(),
                "{bad}"
            );
        }
    }
}
