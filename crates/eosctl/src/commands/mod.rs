//! One module per subcommand: each reads its arguments, runs the library, prints the result
//! (a table, or `--json`) and says how the command ended.

pub mod audit;
pub mod bench;
pub mod demo;
pub mod held;
pub mod lag;
pub mod produce;
pub mod trace;

use std::io::IsTerminal;
use std::process::ExitCode;

use indicatif::{ProgressBar, ProgressStyle};

use crate::cli::{BenchArgs, BenchTarget, Cli, Command};
use crate::kafka_client::KafkaSettings;

/// How a command ended, when it ran to the end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Success,
    /// The audit ran and found a violation.
    ViolationsFound,
    /// `lag --wait` gave up before the group caught up.
    NotCaughtUp,
    /// `trace` found no trace carrying the event id.
    TraceNotFound,
}

impl Status {
    /// 0 for success, 1 for violations, a lag wait that timed out or an event without a trace;
    /// operational errors are 2 (see [`run`]).
    pub fn exit_code(self) -> ExitCode {
        match self {
            Self::Success => ExitCode::SUCCESS,
            Self::ViolationsFound | Self::NotCaughtUp | Self::TraceNotFound => ExitCode::from(1),
        }
    }
}

/// Runs the parsed command line. Errors are printed to stderr and become exit status 2.
pub async fn run(cli: Cli) -> ExitCode {
    match execute(cli).await {
        Ok(status) => status.exit_code(),
        Err(error) => {
            tracing::debug!(error = format!("{error:#}"), "command failed");
            eprintln!("error: {error:#}");
            ExitCode::from(2)
        }
    }
}

async fn execute(cli: Cli) -> anyhow::Result<Status> {
    let kafka: KafkaSettings = cli.kafka.settings(&[])?;
    match cli.command {
        Command::Produce(args) => produce::run(kafka, args).await,
        Command::Audit(args) => audit::run(kafka, *args).await,
        Command::Lag(args) => lag::run(kafka, args).await,
        Command::Bench(BenchArgs { target }) => match target {
            BenchTarget::Processor(args) => bench::run_processor(kafka, args).await,
            BenchTarget::Sink(args) => bench::run_sink(&kafka, args).await,
            BenchTarget::Relay(args) => bench::run_relay(&kafka, args).await,
            BenchTarget::Dedup(args) => bench::run_dedup(args).await,
            BenchTarget::Pipeline(args) => bench::run_pipeline(kafka, args).await,
        },
        Command::Trace(args) => trace::run(args).await,
        Command::Held(command) => held::run(command).await,
        Command::Demo(args) => Ok(if demo::run(kafka, args).await? {
            Status::Success
        } else {
            Status::ViolationsFound
        }),
    }
}

/// A bar on stderr when it is a terminal, hidden otherwise (pipes, CI logs).
pub(crate) fn progress_bar(length: u64, unit: &'static str) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let (bar, template) = if length > 0 {
        (
            ProgressBar::new(length),
            format!("{{bar:40}} {{human_pos}}/{{human_len}} {unit}, eta {{eta}}"),
        )
    } else {
        (
            ProgressBar::new_spinner(),
            format!("{{spinner}} {{human_pos}} {unit}"),
        )
    };
    if let Ok(style) = ProgressStyle::with_template(&template) {
        bar.set_style(style);
    }
    if length == 0 {
        bar.enable_steady_tick(std::time::Duration::from_millis(120));
    }
    bar
}
