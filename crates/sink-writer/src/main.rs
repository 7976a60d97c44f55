use std::process::ExitCode;

use clap::Parser as _;

#[tokio::main]
async fn main() -> ExitCode {
    let config = sink_writer::Config::parse();
    let telemetry = match eos_core::telemetry::init("sink-writer", config.log_format) {
        Ok(telemetry) => telemetry,
        Err(error) => {
            eprintln!("sink-writer: {error}");
            return ExitCode::from(2);
        }
    };
    let result = sink_writer::run(config, eos_core::shutdown::shutdown_token()).await;
    if let Err(error) = &result {
        tracing::error!(error = format!("{error:#}"), "sink-writer stopped");
    }
    telemetry.shutdown().await;
    if result.is_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
