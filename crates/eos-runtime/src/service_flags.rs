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

/// The log format a command line asks for, so that one main
/// ([`serve_or_migrate`](crate::service_main::serve_or_migrate)) sets telemetry up before either
/// of a service's commands runs.
pub trait LogFormatFlag {
    fn log_format(&self) -> LogFormat;
}

impl LogFormatFlag for MigrateArgs {
    fn log_format(&self) -> LogFormat {
        self.log.log_format
    }
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
        let serve = Config::command();
        // `migrate` logs by the service's own log flag (its variable, dedup-service's
        // DEDUP_LOG_FORMAT included), so one environment sets both commands' log format.
        let log_flag = serve
            .get_arguments()
            .find(|arg| arg.get_id() == "log_format")
            .cloned();
        let migrate = Migrate::command().mut_args(|arg| match &log_flag {
            Some(log_flag) if arg.get_id() == "log_format" => log_flag.clone(),
            _ => arg,
        });
        serve
            .subcommand(migrate)
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
        let mut command = Self::command();
        let mut matches = command.try_get_matches_from_mut(args)?;
        // A check made while building the values (a database password twice) gives a bare
        // error: it gets the usage line of the command it belongs to, like the parser's own.
        match matches.remove_subcommand() {
            Some((name, mut migrate)) => Migrate::from_arg_matches_mut(&mut migrate)
                .map(Self::Migrate)
                .map_err(|error| match command.find_subcommand_mut(&name) {
                    Some(subcommand) => error.format(subcommand),
                    None => error.format(&mut command),
                }),
            None => Config::from_arg_matches_mut(&mut matches)
                .map(|config| Self::Serve(Box::new(config)))
                .map_err(|error| error.format(&mut command)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, clap::Parser)]
    #[command(name = "svc")]
    struct Serve {
        #[command(flatten)]
        database: DatabaseUrlFlags,
    }

    #[test]
    fn a_password_twice_is_a_usage_error_of_the_command_it_was_given_to() {
        let url = "postgres://app:inline@db/eos";
        for (args, usage) in [
            (
                vec!["svc", "--database-url", url, "--database-password", "pw"],
                "Usage: svc [OPTIONS]",
            ),
            (
                vec![
                    "svc",
                    "migrate",
                    "--database-url",
                    url,
                    "--database-password",
                    "pw",
                ],
                "Usage: svc migrate",
            ),
        ] {
            let error = Invocation::<Serve>::try_parse_from(args).expect_err("a password twice");
            assert_eq!(error.kind(), clap::error::ErrorKind::ArgumentConflict);
            let shown = error.render().to_string();
            assert!(shown.contains("has a password already"), "{shown}");
            assert!(shown.contains(usage), "{shown}");
        }
    }
}

/// When a loop with work waiting and no progress is warned of, and when `/healthz` fails for it
/// (docs/OBSERVABILITY.md "Liveness"; [`crate::progress_watch`]).
#[derive(Debug, Clone, clap::Args)]
pub struct StallFlags {
    /// Warn (log, `eos_loop_stalled_seconds`, `/readyz` 503) once a loop has had work waiting
    /// this long without progress, e.g. 30s.
    #[arg(long = "stall-warning", env = "EOS_STALL_WARNING", default_value = "30s", value_parser = humantime::parse_duration)]
    pub stall_warning: std::time::Duration,

    /// `/healthz` answers 503 (an orchestrator restarts the process) once a loop has had work
    /// waiting this long without progress while its dependencies answer; 0 never.
    #[arg(long = "stall-restart", env = "EOS_STALL_RESTART", default_value = "5m", value_parser = humantime::parse_duration)]
    pub stall_restart: std::time::Duration,
}

impl StallFlags {
    pub fn policy(&self) -> crate::progress_watch::StallPolicy {
        crate::progress_watch::StallPolicy {
            warn_after: self.stall_warning,
            restart_after: (!self.stall_restart.is_zero()).then_some(self.stall_restart),
        }
    }
}
