use std::process::ExitCode;

use clap::Parser as _;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = eos_lab::Cli::parse();
    let log_format = cli.global.log_format;
    eos_runtime::run_with_telemetry("eos-lab", log_format, || eos_lab::run(cli)).await
}
