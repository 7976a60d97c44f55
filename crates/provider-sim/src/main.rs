use std::process::ExitCode;

use clap::Parser as _;

#[tokio::main]
async fn main() -> ExitCode {
    let config = provider_sim::Config::parse();
    let telemetry = match eos_core::telemetry::init("provider-sim", config.log_format) {
        Ok(telemetry) => telemetry,
        Err(error) => {
            eprintln!("provider-sim: {error}");
            return ExitCode::from(2);
        }
    };
    let result = provider_sim::run(config, eos_core::shutdown::shutdown_token()).await;
    if let Err(error) = &result {
        tracing::error!(error = format!("{error:#}"), "provider-sim stopped");
    }
    telemetry.shutdown().await;
    if result.is_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
