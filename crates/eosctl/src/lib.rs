//! `eosctl`, the command-line tool of eos-suite: it writes realistic at-least-once workloads to
//! Kafka (`produce`), proves — or refutes — a pipeline's exactly-once result (`audit`), tells how
//! far a consumer group is behind (`lag`) and benchmarks the services (`bench`).
//!
//! Guarantee of the audit: it passes only when every input record is accounted for exactly once
//! (DESIGN.md §2.3) — one output per logical event (cardinality by `event_id`, never by delivery
//! attempts), nothing for a duplicate delivery, one dead-letter entry with the right reason for
//! each malformed or conflicting record — and the running per-entity totals in the output add up.
//! It reads with `read_committed`, so it sees what a downstream exactly-once consumer sees. Given
//! a database and a provider, it also passes only when the sink's tables and the provider's
//! effects hold each output event exactly once.
//!
//! The audit's rules ([`audit`], [`boundary_audit`]), the workload generator ([`workload`]) and
//! the benchmark's figures ([`bench::figures`]) are pure and unit-tested; [`topic_reader`],
//! [`kafka_client`], [`group_offsets`] and [`produce`] are the Kafka adapters,
//! [`boundary_reader`] the PostgreSQL and provider one; [`bench`](mod@bench) runs the real
//! binaries.

pub mod audit;
pub mod bench;
pub mod boundary_audit;
pub mod boundary_reader;
pub mod cli;
pub mod demo;
pub mod group_offsets;
pub mod kafka_client;
pub mod lag;
pub mod produce;
pub mod report;
pub mod source_record;
pub mod topic_reader;
pub mod workload;

#[cfg(test)]
mod test_support;

use std::collections::BTreeSet;
use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use indicatif::{ProgressBar, ProgressStyle};
use time::OffsetDateTime;

pub use cli::{AuditArgs, BenchArgs, BenchTarget, Cli, Command, LagArgs, ProduceArgs};

use crate::audit::{AuditConfig, AuditInput, DEFAULT_EXAMPLE_LIMIT};
use crate::bench::BenchOptions;
use crate::boundary_reader::PostgresScope;
use crate::kafka_client::{KafkaSettings, TopicLayout};
use crate::lag::LagWatcher;
use crate::produce::ProduceOptions;
use crate::report::AuditOutcome;
use crate::topic_reader::TopicSnapshot;
use crate::workload::WorkloadSpec;

/// How a command ended, when it ran to the end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Success,
    /// The audit ran and found a violation.
    ViolationsFound,
    /// `lag --wait` gave up before the group caught up.
    NotCaughtUp,
}

impl Status {
    /// 0 for success, 1 for violations or a lag wait that timed out; operational errors are 2
    /// (see [`run`]).
    pub fn exit_code(self) -> ExitCode {
        match self {
            Self::Success => ExitCode::SUCCESS,
            Self::ViolationsFound | Self::NotCaughtUp => ExitCode::from(1),
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
    let kafka = KafkaSettings::new(&cli.bootstrap_servers, &cli.kafka_properties)?;
    match cli.command {
        Command::Produce(args) => run_produce(kafka, args).await,
        Command::Audit(args) => run_audit(kafka, args).await,
        Command::Lag(args) => run_lag(kafka, args).await,
        Command::Bench(BenchArgs {
            target: BenchTarget::Processor(args),
        }) => run_bench_processor(kafka, args).await,
        Command::Demo(args) => Ok(if demo::run(&cli.bootstrap_servers, args).await? {
            Status::Success
        } else {
            Status::ViolationsFound
        }),
    }
}

async fn run_lag(kafka: KafkaSettings, args: LagArgs) -> anyhow::Result<Status> {
    let wait = args.wait.then_some(args.timeout);
    let progress = if args.wait {
        progress_bar(0, "records behind")
    } else {
        ProgressBar::hidden()
    };
    let outcome = {
        let progress = progress.clone();
        let (group, topic) = (args.group.clone(), args.topic.clone());
        tokio::task::spawn_blocking(move || {
            let watcher = LagWatcher::new(&kafka, &group, &topic)?;
            lag::observe_or_wait(&watcher, wait, &mut |total| {
                progress.set_position(u64::try_from(total).unwrap_or(0));
            })
        })
        .await
        .context("watching the lag")?
        .with_context(|| {
            format!(
                "reading the lag of group {:?} on topic {:?}",
                args.group, args.topic
            )
        })?
    };
    progress.finish_and_clear();
    if args.json {
        println!("{}", serde_json::to_string(&outcome)?);
    } else {
        print!("{}", lag::lag_text(&outcome));
    }
    if outcome.timed_out {
        eprintln!(
            "timed out after {}: group {:?} is still {} records behind on topic {:?}",
            humantime::format_duration(args.timeout),
            args.group,
            report::grouped(outcome.report.total_lag),
            args.topic
        );
        return Ok(Status::NotCaughtUp);
    }
    Ok(Status::Success)
}

async fn run_bench_processor(
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

async fn run_produce(kafka: KafkaSettings, args: ProduceArgs) -> anyhow::Result<Status> {
    let spec = WorkloadSpec {
        seed: args.seed.unwrap_or_else(random_seed),
        count: args.count,
        entities: args.entities,
        duplicate_ratio: args.duplicate_ratio,
        bad_ratio: args.bad_ratio,
        conflict_ratio: args.conflict_ratio,
        value_bytes: args.value_bytes,
        occurred_at_base: args.occurred_at_base.unwrap_or_else(now_to_the_millisecond),
    };
    spec.validate()?;
    let progress = progress_bar(spec.physical_records(), "delivered");
    let options = ProduceOptions {
        topic: args.topic.clone(),
        layout: TopicLayout {
            partitions: args.partitions,
            replication_factor: args.replication_factor,
        },
        rate: args.rate,
        delivery_timeout: args.delivery_timeout,
        spec,
    };

    // Ctrl-C stops sending but still waits for what was sent, so the summary is true.
    let stop = Arc::new(AtomicBool::new(false));
    let signal = {
        let stop = Arc::clone(&stop);
        tokio::spawn(async move {
            eos_core::shutdown::wait_for_signal().await;
            tracing::warn!("interrupted: waiting for records already sent");
            stop.store(true, Ordering::Relaxed);
        })
    };
    let result = produce::run(&kafka, options, progress, stop).await;
    signal.abort();
    let summary = result.with_context(|| format!("producing to topic {:?}", args.topic))?;

    if args.json {
        println!("{}", serde_json::to_string(&summary)?);
    } else {
        print!("{}", report::produce_text(&summary));
    }
    Ok(Status::Success)
}

async fn run_audit(kafka: KafkaSettings, args: AuditArgs) -> anyhow::Result<Status> {
    let dlq = args
        .dlq
        .clone()
        .unwrap_or_else(|| format!("{}.dlq", args.input));
    let topics = [args.input.clone(), args.output.clone(), dlq.clone()];
    let progress = progress_bar(0, "records read");
    let end_timeout = args.end_timeout;
    let snapshots = {
        let progress = progress.clone();
        tokio::task::spawn_blocking(move || {
            let names: Vec<&str> = topics.iter().map(String::as_str).collect();
            topic_reader::read_topics(&kafka, &names, end_timeout, &mut |read| {
                progress.set_position(read);
            })
        })
        .await
        .context("reading the topics")?
        .context("reading the topics")?
    };
    progress.finish_and_clear();
    let [input, output, dead_letters] = <[TopicSnapshot; 3]>::try_from(snapshots)
        .map_err(|_| anyhow::anyhow!("the reader returned the wrong number of topics"))?;
    if !input.exists {
        bail!("input topic {:?} does not exist", args.input);
    }

    let config = AuditConfig {
        now: OffsetDateTime::now_utc(),
        dedup_horizon: args.dedup_horizon,
        max_record_bytes: args.max_record_bytes,
        example_limit: DEFAULT_EXAMPLE_LIMIT,
    };
    let mut report = audit::audit(
        &AuditInput {
            input_topic: &input.topic,
            input: &input.records,
            output: &output.records,
            dlq: &dead_letters.records,
        },
        &config,
    );
    for snapshot in [&input, &output, &dead_letters] {
        report.notes.extend(snapshot_notes(snapshot));
    }
    let expected = audit::output_logical_set(&output.records);
    let mut refused = BTreeSet::new();
    if let Some(database_url) = &args.database_url {
        let scope = PostgresScope {
            sink_table: &args.sink_table,
            state_table: &args.state_table,
            output_topic: &output.topic,
            expected: &expected,
        };
        let targets = boundary_reader::read_postgres(database_url, &scope).await?;
        boundary_audit::audit_postgres(
            &mut report,
            &expected,
            &targets.rows,
            &targets.states,
            DEFAULT_EXAMPLE_LIMIT,
        );
        refused = audit::output_event_ids_at(&output.records, &targets.refused_positions);
    }
    if let Some(provider_url) = &args.provider_url {
        let effects = boundary_reader::read_provider_effects(provider_url).await?;
        boundary_audit::audit_provider(
            &mut report,
            &expected,
            &refused,
            &effects,
            &args.provider_operation_prefix,
            DEFAULT_EXAMPLE_LIMIT,
        );
    }
    let passed = report.passed;
    let outcome = AuditOutcome {
        input_topic: input.topic,
        output_topic: output.topic,
        dlq_topic: dead_letters.topic,
        sink_table: args.database_url.is_some().then_some(args.sink_table),
        state_table: args.database_url.is_some().then_some(args.state_table),
        provider_operation_prefix: args
            .provider_url
            .is_some()
            .then_some(args.provider_operation_prefix),
        report,
    };
    if args.json {
        println!("{}", serde_json::to_string(&outcome)?);
    } else {
        print!("{}", report::audit_text(&outcome));
    }
    Ok(if passed {
        Status::Success
    } else {
        Status::ViolationsFound
    })
}

/// What the reader saw that limits what the audit can prove.
fn snapshot_notes(snapshot: &TopicSnapshot) -> Vec<String> {
    if !snapshot.exists {
        return vec![format!(
            "topic {:?} does not exist; read as empty",
            snapshot.topic
        )];
    }
    snapshot
        .spans
        .iter()
        .filter(|span| span.low > 0)
        .map(|span| {
            format!(
                "topic {:?} partition {} starts at offset {}: earlier records were deleted by retention and are not audited",
                snapshot.topic, span.partition, span.low
            )
        })
        .collect()
}

/// A bar on stderr when it is a terminal, hidden otherwise (pipes, CI logs).
fn progress_bar(length: u64, unit: &'static str) -> ProgressBar {
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

fn random_seed() -> u64 {
    // Only distinct per run, and short enough to read in event ids; the summary prints it so the
    // run can be reproduced.
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| {
            elapsed.subsec_nanos() ^ elapsed.as_secs() as u32
        });
    u64::from(nanos ^ std::process::id().rotate_left(16))
}

fn now_to_the_millisecond() -> OffsetDateTime {
    let now = OffsetDateTime::now_utc();
    now.replace_millisecond(now.millisecond()).unwrap_or(now)
}
