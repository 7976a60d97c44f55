use std::process::ExitCode;

use clap::Parser;

/// The bench's arguments, and how to print its figures.
#[derive(Debug, Parser)]
#[command(name = "sink-writer-bench", version, about)]
struct Cli {
    #[command(flatten)]
    bench: sink_writer::bench::BenchArgs,
    /// Print the figures as one JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

#[tokio::main]
async fn main() -> ExitCode {
    let Cli { bench: args, json } = Cli::parse();
    let telemetry = match eos_runtime::telemetry::init("sink-writer-bench", Default::default()) {
        Ok(telemetry) => telemetry,
        Err(error) => {
            eprintln!("sink-writer-bench: {error}");
            return ExitCode::from(2);
        }
    };
    let result = sink_writer::bench::measure(&args).await.and_then(|report| {
        if json {
            println!("{}", serde_json::to_string_pretty(&report)?);
        } else {
            print!("{}", report.table());
        }
        Ok(())
    });
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
