//! One module per subcommand: each reads its arguments, runs the lab, prints the result (a table,
//! or `--json`) and says how the command ended.

pub mod bench;
pub mod demo;

use std::process::ExitCode;

use eosctl::Status;
use eosctl::kafka_client::KafkaSettings;

use crate::cli::{BenchArgs, BenchTarget, Cli, Command};

/// Runs the parsed command line. Errors are printed to stderr and become exit status 2, as in
/// eosctl.
pub async fn run(cli: Cli) -> ExitCode {
    eosctl::commands::finish(execute(cli).await)
}

async fn execute(cli: Cli) -> anyhow::Result<Status> {
    let kafka: KafkaSettings = cli.global.kafka.settings(&[])?;
    match cli.command {
        Command::Bench(BenchArgs { target }) => match target {
            BenchTarget::Processor(args) => bench::run_processor(kafka, args).await,
            BenchTarget::Sink(args) => bench::run_sink(&kafka, args).await,
            BenchTarget::Relay(args) => bench::run_relay(&kafka, args).await,
            BenchTarget::Dedup(args) => bench::run_dedup(args).await,
            BenchTarget::State(args) => bench::run_state(&kafka, args).await,
            BenchTarget::Pipeline(args) => bench::run_pipeline(kafka, args).await,
        },
        Command::Demo(args) => Ok(if demo::run(kafka, args).await? {
            Status::Success
        } else {
            Status::ViolationsFound
        }),
    }
}
