use std::process::ExitCode;

use clap::Parser;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = eosctl::Cli::parse();
    let telemetry = match eos_core::telemetry::init("eosctl", cli.log_format) {
        Ok(telemetry) => telemetry,
        Err(error) => {
            eprintln!("error: {error}");
            return ExitCode::from(2);
        }
    };
    let status = eosctl::run(cli).await;
    telemetry.shutdown().await;
    status
}
