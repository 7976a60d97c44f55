//! `eosctl bench`: runs a benchmark and prints its figures.

use crate::bench::{self, BenchOptions};
use crate::cli;
use crate::commands::Status;
use crate::kafka_client::KafkaSettings;

pub(crate) async fn run_processor(
    kafka: KafkaSettings,
    args: cli::ProcessorBenchArgs,
) -> anyhow::Result<Status> {
    let options = BenchOptions::from_args(&args)?;
    let report = bench::run(kafka, options).await?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{}", bench::bench_text(&report));
    }
    Ok(Status::Success)
}
