use std::process::ExitCode;

use clap::Parser as _;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = eosctl::Cli::parse();
    let log_format = cli.global.log_format;
    eos_runtime::run_with_telemetry("eosctl", log_format, || eosctl::run(cli)).await
}
