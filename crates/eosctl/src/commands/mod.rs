//! One module per subcommand: each reads its arguments, runs the library, prints the result
//! (a table, or `--json`) and says how the command ended.

pub mod audit;
pub mod dead_letters;
pub mod held;
pub mod lag;
pub mod produce;
pub mod trace;

use std::io::IsTerminal;
use std::process::ExitCode;

use indicatif::{ProgressBar, ProgressStyle};

use crate::cli::{Cli, Command};
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
    finish(execute(cli).await)
}

/// How a command's outcome ends the process: its status's exit code, or the error on stderr and
/// exit status 2. eos-lab's commands end the same way.
pub fn finish(outcome: anyhow::Result<Status>) -> ExitCode {
    match outcome {
        Ok(status) => status.exit_code(),
        Err(error) => {
            tracing::debug!(error = format!("{error:#}"), "command failed");
            eprintln!("error: {error:#}");
            ExitCode::from(2)
        }
    }
}

async fn execute(cli: Cli) -> anyhow::Result<Status> {
    let kafka: KafkaSettings = cli.global.kafka.settings(&[])?;
    match cli.command {
        Command::Produce(args) => produce::run(kafka, args).await,
        Command::Audit(args) => audit::run(kafka, *args).await,
        Command::Lag(args) => lag::run(kafka, args).await,
        Command::Trace(args) => trace::run(args).await,
        Command::Held(command) => held::run(command).await,
        Command::DeadLetters(command) => dead_letters::run(kafka, command).await,
    }
}

/// A bar on stderr when it is a terminal, hidden otherwise (pipes, CI logs).
pub fn progress_bar(length: u64, unit: &'static str) -> ProgressBar {
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
