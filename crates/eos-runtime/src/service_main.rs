//! The body of every binary's `main`: telemetry first (so start-up errors are logged), the
//! shutdown signal, the work, then a telemetry flush so the last spans reach the collector.

use std::future::Future;
use std::process::ExitCode;

use tokio_util::sync::CancellationToken;

use crate::service_flags::{Invocation, LogFormatFlag};
use crate::shutdown::shutdown_token;
use crate::telemetry::{self, LogFormat};

/// Runs a tool's work with telemetry around it and returns its exit code. A telemetry set-up
/// error (e.g. a bad OTLP endpoint) exits 2 before any work starts.
pub async fn run_with_telemetry<Work>(
    name: &'static str,
    log_format: LogFormat,
    work: impl FnOnce() -> Work,
) -> ExitCode
where
    Work: Future<Output = ExitCode>,
{
    let telemetry = match telemetry::init(name, log_format) {
        Ok(telemetry) => telemetry,
        Err(error) => {
            eprintln!("{name}: {error}");
            return ExitCode::from(2);
        }
    };
    let code = work().await;
    telemetry.shutdown().await;
    code
}

/// Runs a service until SIGINT/SIGTERM cancels the token it is given (it then drains and
/// returns `Ok`, exit 0) or it fails (logged with its causes, exit 1 — an orchestrator restarts
/// it, and for the Kafka services the restarted instance fences this one).
pub async fn service_main<Service>(
    name: &'static str,
    log_format: LogFormat,
    run: impl FnOnce(CancellationToken) -> Service,
) -> ExitCode
where
    Service: Future<Output = anyhow::Result<()>>,
{
    run_with_telemetry(name, log_format, || async move {
        match run(shutdown_token()).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                // A Kafka call that timed out says only that; a broker that refused the
                // client's credentials or certificate is the likely cause, so it is named.
                match crate::kafka_errors::last_refusal() {
                    Some(refusal) => tracing::error!(
                        error = format!("{error:#}"),
                        kafka_refusal = refusal,
                        "{name} stopped"
                    ),
                    None => tracing::error!(error = format!("{error:#}"), "{name} stopped"),
                }
                ExitCode::FAILURE
            }
        }
    })
    .await
}

/// The whole `main` of a service with PostgreSQL tables: parses the command line, then runs the
/// service (`serve`, as [`service_main`] does) or its `migrate` step, and returns the exit code.
pub async fn serve_or_migrate<Config, Migrate, Serving, Migrating>(
    name: &'static str,
    serve: impl FnOnce(Config, CancellationToken) -> Serving,
    migrate: impl FnOnce(Migrate) -> Migrating,
) -> ExitCode
where
    Config: clap::Parser + LogFormatFlag,
    Migrate: clap::Parser + LogFormatFlag,
    Serving: Future<Output = anyhow::Result<()>>,
    Migrating: Future<Output = anyhow::Result<()>>,
{
    match Invocation::<Config, Migrate>::parse() {
        Invocation::Serve(config) => {
            let log_format = config.log_format();
            service_main(name, log_format, |shutdown| serve(*config, shutdown)).await
        }
        Invocation::Migrate(args) => {
            let log_format = args.log_format();
            // The step ends by itself; a signal ends the process as usual.
            service_main(name, log_format, |_shutdown| migrate(args)).await
        }
    }
}
