//! Flag groups that mean the same in every service that has them, flattened into each service's
//! `Config` (`#[command(flatten)]`), so their names, environment variables and defaults cannot
//! drift apart. Flags whose default differs per service (the metrics port) stay in each `Config`.

use crate::secrets::DatabaseUrlFlags;
use crate::telemetry::LogFormat;

/// The identity of an instance of a Kafka service that keeps its own positions (eos-processor,
/// sink-writer).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct InstanceFlags {
    /// Stable identity of this instance [default: the host name]. It is the static group
    /// membership id (group.instance.id), so a restarted instance takes its partitions back at
    /// once; eos-processor's transactional.id is `<group-id>-<instance-id>`, so a restarted
    /// instance with the same id fences its zombie. Keep it stable across restarts (e.g. the pod
    /// name) and unique per running instance.
    #[arg(long = "instance-id", env = "EOS_INSTANCE_ID")]
    pub instance_id: Option<String>,
}

impl InstanceFlags {
    /// The configured id, else the host name (a StatefulSet pod's name), else `localhost`.
    pub fn instance_id(&self) -> String {
        self.instance_id.clone().unwrap_or_else(|| {
            hostname::get()
                .ok()
                .and_then(|name| name.into_string().ok())
                .unwrap_or_else(|| "localhost".into())
        })
    }
}

/// How eos-processor and sink-writer log.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct LogFlags {
    /// Log format on stderr: text or json. RUST_LOG filters. Traces are exported over OTLP/gRPC
    /// when OTEL_EXPORTER_OTLP_ENDPOINT is set.
    #[arg(long = "log-format", env = "EOS_LOG_FORMAT", default_value = "text")]
    pub log_format: LogFormat,
}

/// `<service> migrate`: applies the service's schema migrations to DATABASE_URL and exits.
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "migrate",
    about = "Apply the schema migrations to DATABASE_URL and exit (run it with a role that owns \
             the schema, before services started with --skip-migrations)"
)]
pub struct MigrateArgs {
    /// PostgreSQL URL (or file) of a role that may create and alter the service's tables.
    #[command(flatten)]
    pub database: DatabaseUrlFlags,

    #[command(flatten)]
    pub log: LogFlags,
}

/// What the command line of a service with PostgreSQL tables asks for: run the service (the
/// flags of `Config`) or the `migrate` step (the flags of `Migrate`, [`MigrateArgs`] unless the
/// service names its own).
#[derive(Debug, Clone)]
pub enum Invocation<Config, Migrate = MigrateArgs> {
    Serve(Box<Config>),
    Migrate(Migrate),
}

impl<Config: clap::Parser, Migrate: clap::Parser> Invocation<Config, Migrate> {
    /// The command line: `Config`'s flags, plus the `migrate` subcommand. Service flags and the
    /// subcommand do not mix, and `migrate` does not need the service flags' required values.
    pub fn command() -> clap::Command {
        Config::command()
            .subcommand(Migrate::command())
            .subcommand_negates_reqs(true)
            .args_conflicts_with_subcommands(true)
    }

    pub fn parse() -> Self {
        Self::try_parse_from(std::env::args_os()).unwrap_or_else(|error| error.exit())
    }

    pub fn try_parse_from<I, T>(args: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        let mut matches = Self::command().try_get_matches_from(args)?;
        match matches.remove_subcommand() {
            Some((_, mut migrate)) => {
                Ok(Self::Migrate(Migrate::from_arg_matches_mut(&mut migrate)?))
            }
            None => Ok(Self::Serve(Box::new(Config::from_arg_matches_mut(
                &mut matches,
            )?))),
        }
    }
}
