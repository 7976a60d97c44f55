//! `eos-lab bench processor|sink|relay|dedup|state|pipeline`: runs a benchmark and prints its
//! figures, as a table or `--json`.

use crate::bench::{self, BenchOptions};
use crate::cli;
use eosctl::Status;
use eosctl::kafka_client::KafkaSettings;

pub(crate) async fn run_processor(
    kafka: KafkaSettings,
    args: cli::ProcessorBenchArgs,
) -> anyhow::Result<Status> {
    let options = BenchOptions::from_args(&args)?;
    let report = bench::run(kafka, options).await?;
    print_report(&report, args.json, || bench::bench_text(&report))
}

pub(crate) async fn run_sink(
    kafka: &KafkaSettings,
    args: cli::SinkBenchArgs,
) -> anyhow::Result<Status> {
    let report = bench::sink::measure(&args.bench, kafka).await?;
    print_report(&report, args.json, || report.table())
}

pub(crate) async fn run_relay(
    kafka: &KafkaSettings,
    args: cli::RelayBenchArgs,
) -> anyhow::Result<Status> {
    let report = bench::relay::measure(&args.bench, kafka).await?;
    print_report(&report, args.json, || report.table())
}

pub(crate) async fn run_dedup(args: cli::DedupBenchArgs) -> anyhow::Result<Status> {
    let report = bench::dedup::measure(&args.bench).await?;
    print_report(&report, args.json, || report.table())
}

pub(crate) async fn run_state(
    kafka: &KafkaSettings,
    args: cli::StateBenchArgs,
) -> anyhow::Result<Status> {
    let report = bench::state::run(&bench::state::BenchConfig::new(&args.bench, kafka)).await?;
    print_report(&report, args.json, || report.table())
}

pub(crate) async fn run_pipeline(
    kafka: KafkaSettings,
    args: cli::PipelineBenchArgs,
) -> anyhow::Result<Status> {
    let json = args.json;
    let report = bench::pipeline::run(kafka, args).await?;
    print_report(&report, json, || report.table())
}

fn print_report(
    report: &impl serde::Serialize,
    json: bool,
    table: impl FnOnce() -> String,
) -> anyhow::Result<Status> {
    if json {
        println!("{}", serde_json::to_string(report)?);
    } else {
        print!("{}", table());
    }
    Ok(Status::Success)
}
