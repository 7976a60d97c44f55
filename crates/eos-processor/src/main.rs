use std::process::ExitCode;

use clap::Parser as _;

#[tokio::main]
async fn main() -> ExitCode {
    let config = eos_processor::Config::parse();
    let telemetry = match eos_core::telemetry::init("eos-processor", config.log_format) {
        Ok(telemetry) => telemetry,
        Err(error) => {
            eprintln!("eos-processor: {error}");
            return ExitCode::from(2);
        }
    };
    let result = eos_processor::run(config, eos_core::shutdown::shutdown_token()).await;
    if let Err(error) = &result {
        tracing::error!(error = format!("{error:#}"), "eos-processor stopped");
    }
    telemetry.shutdown().await;
    if result.is_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
