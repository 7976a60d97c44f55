use std::process::ExitCode;

use clap::Parser as _;

#[tokio::main]
async fn main() -> ExitCode {
    let args = outbox_relay::bench::BenchArgs::parse();
    let telemetry = match eos_runtime::telemetry::init("outbox-relay-bench", Default::default()) {
        Ok(telemetry) => telemetry,
        Err(error) => {
            eprintln!("outbox-relay-bench: {error}");
            return ExitCode::from(2);
        }
    };
    let result = outbox_relay::bench::run(args).await;
    if let Err(error) = &result {
        eprintln!("outbox-relay-bench: {error:#}");
    }
    telemetry.shutdown().await;
    if result.is_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
