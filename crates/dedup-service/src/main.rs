use std::process::ExitCode;

use clap::Parser as _;

#[tokio::main]
async fn main() -> ExitCode {
    let config = dedup_service::Config::parse();
    let telemetry = match eos_core::telemetry::init("dedup-service", config.log_format) {
        Ok(telemetry) => telemetry,
        Err(error) => {
            eprintln!("dedup-service: {error}");
            return ExitCode::from(2);
        }
    };
    let result = dedup_service::run(config, eos_core::shutdown::shutdown_token()).await;
    if let Err(error) = &result {
        tracing::error!(error = format!("{error:#}"), "dedup-service stopped");
    }
    telemetry.shutdown().await;
    if result.is_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
