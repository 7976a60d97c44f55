use std::process::ExitCode;

use clap::Parser as _;

#[tokio::main]
async fn main() -> ExitCode {
    let args = sink_writer::bench::BenchArgs::parse();
    let telemetry = match eos_runtime::telemetry::init("sink-writer-bench", Default::default()) {
        Ok(telemetry) => telemetry,
        Err(error) => {
            eprintln!("sink-writer-bench: {error}");
            return ExitCode::from(2);
        }
    };
    let result = sink_writer::bench::run(args).await;
    if let Err(error) = &result {
        eprintln!("sink-writer-bench: {error:#}");
    }
    telemetry.shutdown().await;
    if result.is_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
