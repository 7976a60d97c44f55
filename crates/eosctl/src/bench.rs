//! `eosctl bench processor`: measures the real `eos-processor` binary against the real broker and
//! prints figures (it is a benchmark, not a test: missing a target does not fail it).
//!
//! 1. Throughput, exactly-once vs at-least-once: one input topic per record size is written
//!    once; then rounds run interleaved (EO, ALO, EO, ALO, …), each a fresh processor process
//!    with a fresh group (so it reads the input from the beginning), output and changelog topics.
//!    A round's rate runs from the group's first commit to the commit that reaches the end of the
//!    input: process start-up, joining the group and restoring state are not throughput.
//! 2. Single-record transactions per second: exactly-once with `--max-batch 1` over a backlog.
//! 3. End-to-end latency at half the exactly-once peak: records produced at that rate; a
//!    `read_committed` reader of the output takes, for each output record, the time it arrived
//!    minus the Kafka timestamp of the input record it came from (its `source`). A run in which
//!    the pipeline falls behind measures a queue, so it is repeated at half the rate.
//!
//! Committed offsets are read with `read_committed` ([`crate::group_offsets`]) every 50 ms.
//! Everything the benchmark creates (topics, consumer groups) is deleted at the end unless
//! `--keep-topics`; each processor's stdout and stderr go to a log file whose path is part of any
//! error.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, anyhow, bail};
use comfy_table::presets::UTF8_FULL_CONDENSED;
use comfy_table::{CellAlignment, Table};
use eos_core::Guarantee;
use eos_testkit::{ChildProcess, LogMode, ProcessError};
use indicatif::ProgressBar;
use nix::sys::resource::{UsageWho, getrusage};
use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use tokio::runtime::Handle;

use crate::bench_figures::{
    CommitProgress, CommitSample, LatencySummary, LatencyTrend, median, megabytes_per_second,
    ratio, without_ramp_up,
};
use crate::cli::ProcessorBenchArgs;
use crate::group_offsets::{GroupOffsetReader, watermarks};
use crate::kafka_client::{KafkaSettings, TopicLayout, ensure_topic, topic_partitions};
use crate::produce::{self, ProduceOptions, ProduceSummary};
use crate::report::grouped;
use crate::workload::WorkloadSpec;

/// How often the group's committed offsets are sampled.
const SAMPLE_INTERVAL: Duration = Duration::from_millis(50);
/// How long one committed-offsets fetch may wait (it waits out open transactions).
const COMMITTED_FETCH_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a processor may take to finish its batch and exit after SIGTERM.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);
/// Records sent through the latency run's processor before measuring, so that its start-up
/// (joining the group, restoring state, the first transaction) is not counted as latency.
const WARMUP_RECORDS: u64 = 200;
/// The latency run's producer is new, and its first records wait for it to connect and get a
/// producer id: records sent in its first seconds are not measured.
pub const PRODUCER_RAMP_UP: Duration = Duration::from_secs(2);
/// How often a latency run that fell behind is repeated at half the rate.
pub const LATENCY_RETRIES: usize = 2;
/// Entities the benchmark's events are spread over.
const ENTITIES: u32 = 100;
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(120);
const ADMIN_TIMEOUT: Duration = Duration::from_secs(30);
/// A static group member does not leave its group when it stops; the group can be deleted once
/// the member's session (10 s in the processor) has expired.
const GROUP_DELETE_PATIENCE: Duration = Duration::from_secs(15);
/// Lines of a failed processor's log quoted in the error.
const LOG_TAIL_LINES: usize = 15;
/// The exactly-once/at-least-once throughput ratio the issue asks for, from this record size up.
const RATIO_TARGET: f64 = 0.90;
const RATIO_TARGET_MIN_BYTES: usize = 1024;
const SINGLE_RECORD_TARGET: f64 = 100.0;

/// What to run, resolved from the command line.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    pub processor_bin: PathBuf,
    pub records: u64,
    pub sizes: Vec<usize>,
    pub rounds: u32,
    pub commit_interval: Duration,
    pub max_batch: u32,
    pub partitions: i32,
    pub single_records: u64,
    pub latency_seconds: u64,
    /// Overrides half the exactly-once peak.
    pub latency_rate: Option<u64>,
    pub stall_timeout: Duration,
    pub keep_topics: bool,
    pub keep_logs: bool,
    /// CSV of every latency sample.
    pub latency_samples: Option<PathBuf>,
}

impl BenchOptions {
    /// The processor defaults to the `eos-processor` next to the running `eosctl` (the same
    /// cargo profile directory).
    pub fn from_args(args: &ProcessorBenchArgs) -> anyhow::Result<Self> {
        let processor_bin = match &args.processor_bin {
            Some(path) => path.clone(),
            None => std::env::current_exe()
                .context("cannot find the running executable")?
                .with_file_name("eos-processor"),
        };
        if !processor_bin.is_file() {
            bail!(
                "no eos-processor binary at {}: build it (cargo build --release -p eos-processor) \
                 or pass --processor-bin",
                processor_bin.display()
            );
        }
        if args.sizes.is_empty() {
            bail!("--sizes needs at least one size");
        }
        let mut distinct = args.sizes.clone();
        distinct.sort_unstable();
        distinct.dedup();
        if distinct.len() != args.sizes.len() {
            bail!("--sizes names a size twice");
        }
        if args.rounds == 0 && args.latency_seconds > 0 && args.latency_rate.is_none() {
            bail!(
                "--rounds 0 measures no exactly-once peak to base the latency run on: give \
                 --latency-rate or --latency-seconds 0"
            );
        }
        Ok(Self {
            processor_bin,
            records: args.records,
            sizes: args.sizes.clone(),
            rounds: args.rounds,
            commit_interval: args.commit_interval,
            max_batch: args.max_batch,
            partitions: args.partitions,
            single_records: args.single_records,
            latency_seconds: args.latency_seconds,
            latency_rate: args.latency_rate,
            stall_timeout: args.stall_timeout,
            keep_topics: args.keep_topics,
            keep_logs: args.keep_logs,
            latency_samples: args.latency_samples.clone(),
        })
    }

    /// A debug build of the processor measures the compiler's debug mode, not the design.
    pub fn is_debug_build(&self) -> bool {
        self.processor_bin.to_string_lossy().contains(&format!(
            "{}debug{}",
            std::path::MAIN_SEPARATOR,
            std::path::MAIN_SEPARATOR
        ))
    }
}

/// Everything the benchmark measured. Serialised as the `--json` output.
#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    pub processor_bin: String,
    pub debug_build: bool,
    pub partitions: i32,
    pub commit_interval_ms: u64,
    pub max_batch: u32,
    pub rounds: u32,
    pub throughput: Vec<SizeThroughput>,
    pub single_record: Option<SingleRecordFigures>,
    /// The latency runs in the order they ran: the first at half the exactly-once peak (or at
    /// `--latency-rate`); when the pipeline did not keep up, again at half that rate, at most
    /// [`LATENCY_RETRIES`] times.
    pub latency: Vec<LatencyFigures>,
    pub topics_deleted: bool,
    pub machine: MachineLoad,
}

/// Whatever else runs on the machine competes with the broker and the processor for CPU: the
/// figures are only comparable between quiet runs.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct MachineLoad {
    pub cpus: usize,
    /// 1-minute load average when the benchmark started (Linux only); later ones would mostly
    /// show the benchmark itself.
    pub load_average_at_start: Option<f64>,
}

fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[derive(Debug, Clone, Serialize)]
pub struct SizeThroughput {
    /// The requested value size (`--sizes`).
    pub value_bytes: usize,
    /// The mean size of the values actually written (the smallest envelope the workload
    /// generator writes is larger than 100 bytes).
    pub mean_value_bytes: f64,
    pub records: u64,
    pub exactly_once: GuaranteeThroughput,
    pub at_least_once: GuaranteeThroughput,
    /// Median exactly-once rate over median at-least-once rate.
    pub ratio_eo_to_alo: Option<f64>,
    pub ratio_target: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct GuaranteeThroughput {
    pub guarantee: Guarantee,
    /// In the order they ran.
    pub rounds: Vec<RoundFigures>,
    pub median_records_per_second: Option<f64>,
    pub median_megabytes_per_second: Option<f64>,
    pub median_processor_cpu_ms_per_1000_records: Option<f64>,
}

impl GuaranteeThroughput {
    fn new(guarantee: Guarantee, rounds: Vec<RoundFigures>, bytes_per_record: f64) -> Self {
        let rates: Vec<f64> = rounds.iter().map(|r| r.records_per_second).collect();
        let median_rate = median(&rates);
        let cpu: Option<Vec<f64>> = rounds
            .iter()
            .map(|r| r.processor_cpu_ms_per_1000_records)
            .collect();
        Self {
            guarantee,
            median_records_per_second: median_rate,
            median_megabytes_per_second: median_rate
                .map(|rate| megabytes_per_second(rate, bytes_per_record)),
            median_processor_cpu_ms_per_1000_records: cpu.as_deref().and_then(median),
            rounds,
        }
    }
}

#[derive(Debug, Clone, Copy, Serialize)]
pub struct RoundFigures {
    pub records_per_second: f64,
    /// From the first commit seen to the end of the input.
    pub measured_seconds: f64,
    /// From the process start to the first commit seen (not part of the rate).
    pub startup_seconds: f64,
    /// CPU time (user + system) of the processor over its whole life, start-up included, per
    /// 1,000 input records: unlike the rate, hardly affected by other work on the machine.
    pub processor_cpu_ms_per_1000_records: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct SingleRecordFigures {
    pub records: u64,
    pub value_bytes: usize,
    /// = records per second: one transaction per record.
    pub transactions_per_second: f64,
    pub target: f64,
}

/// Where a latency run's rate came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LatencyRateBasis {
    /// Half the exactly-once median rate of the first size.
    HalfPeak,
    /// `--latency-rate`.
    Flag,
    /// Half the rate of the previous run, which did not keep up.
    HalvedAfterFallingBehind,
}

#[derive(Debug, Clone, Serialize)]
pub struct LatencyFigures {
    /// The exactly-once median rate of the first size (absent with `--rounds 0`).
    pub peak_records_per_second: Option<f64>,
    pub rate_records_per_second: u64,
    pub rate_basis: LatencyRateBasis,
    pub value_bytes: usize,
    /// Measured; the first seconds of the producer's run are not (see [`PRODUCER_RAMP_UP`]).
    pub seconds: u64,
    /// `samples` is the number of output records measured.
    #[serde(flatten)]
    pub summary: LatencySummary,
    #[serde(flatten)]
    pub trend: LatencyTrend,
}

/// Runs the benchmark. The work is blocking (child processes, polling), so it runs on a blocking
/// thread; SIGINT/SIGTERM stop it early, still cleaning up.
pub async fn run(settings: KafkaSettings, options: BenchOptions) -> anyhow::Result<BenchReport> {
    let stop = Arc::new(AtomicBool::new(false));
    let signal = {
        let stop = Arc::clone(&stop);
        tokio::spawn(async move {
            eos_core::shutdown::wait_for_signal().await;
            tracing::warn!("interrupted: stopping the benchmark and cleaning up");
            stop.store(true, Ordering::Relaxed);
        })
    };
    let runtime = Handle::current();
    let result =
        tokio::task::spawn_blocking(move || Bench::new(settings, options, runtime, stop)?.run())
            .await
            .context("the benchmark task failed");
    signal.abort();
    result?
}

/// The names one processor run uses.
#[derive(Debug, Clone)]
struct ProcessorRun {
    label: String,
    guarantee: Guarantee,
    max_batch: u32,
    input: String,
    output: String,
    dlq: String,
    changelog: String,
    group: String,
}

struct Bench {
    settings: KafkaSettings,
    options: BenchOptions,
    runtime: Handle,
    stop: Arc<AtomicBool>,
    run_id: String,
    seed_base: u64,
    log_dir: PathBuf,
    /// Every topic this run created or had a processor create, not yet deleted.
    topics: Vec<String>,
    groups: Vec<String>,
    processes_started: u32,
}

impl Bench {
    fn new(
        settings: KafkaSettings,
        options: BenchOptions,
        runtime: Handle,
        stop: Arc<AtomicBool>,
    ) -> anyhow::Result<Self> {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |elapsed| elapsed.as_nanos());
        // Distinct per run, short enough to read in topic names.
        let seed_base = u64::from((nanos as u32) ^ std::process::id().rotate_left(16));
        let run_id = format!("{seed_base:08x}");
        let log_dir = std::env::temp_dir().join(format!("eosctl-bench-{run_id}"));
        std::fs::create_dir_all(&log_dir)
            .with_context(|| format!("cannot create the log directory {}", log_dir.display()))?;
        Ok(Self {
            settings,
            options,
            runtime,
            stop,
            run_id,
            seed_base,
            log_dir,
            topics: Vec::new(),
            groups: Vec::new(),
            processes_started: 0,
        })
    }

    fn run(mut self) -> anyhow::Result<BenchReport> {
        if self.options.is_debug_build() {
            tracing::warn!(
                processor = %self.options.processor_bin.display(),
                "this is a debug build of eos-processor: the figures will not mean much; build with \
                 --release and pass --processor-bin target/release/eos-processor"
            );
        }
        tracing::info!(run = %self.run_id, logs = %self.log_dir.display(), "benchmark started");
        let result = self.run_phases();
        let cleaned = if self.options.keep_topics {
            tracing::info!(topics = ?self.topics, groups = ?self.groups, "keeping topics and groups");
            Ok(false)
        } else {
            self.clean_up(result.is_ok()).map(|()| true)
        };
        match result {
            Ok(mut report) => {
                report.topics_deleted = cleaned?;
                if !self.options.keep_logs {
                    let _ = std::fs::remove_dir_all(&self.log_dir);
                } else {
                    tracing::info!(logs = %self.log_dir.display(), "processor logs kept");
                }
                Ok(report)
            }
            Err(error) => {
                if let Err(cleanup) = cleaned {
                    tracing::warn!(error = format!("{cleanup:#}"), "cleaning up failed");
                }
                Err(error.context(format!(
                    "benchmark failed; processor logs are in {}",
                    self.log_dir.display()
                )))
            }
        }
    }

    fn run_phases(&mut self) -> anyhow::Result<BenchReport> {
        let load_average_at_start = load_average();
        let sizes = self.options.sizes.clone();
        let mut throughput = Vec::with_capacity(sizes.len());
        if self.options.rounds > 0 {
            for &size in &sizes {
                throughput.push(self.throughput(size)?);
            }
        }
        let first_size = sizes[0];
        let single_record = if self.options.single_records > 0 {
            Some(self.single_record(first_size)?)
        } else {
            None
        };
        let latency = if self.options.latency_seconds > 0 {
            let peak = throughput
                .first()
                .and_then(|first| first.exactly_once.median_records_per_second);
            self.latency(peak, first_size)?
        } else {
            Vec::new()
        };
        Ok(BenchReport {
            processor_bin: self.options.processor_bin.display().to_string(),
            debug_build: self.options.is_debug_build(),
            partitions: self.options.partitions,
            commit_interval_ms: self.options.commit_interval.as_millis() as u64,
            max_batch: self.options.max_batch,
            rounds: self.options.rounds,
            throughput,
            single_record,
            latency,
            topics_deleted: false,
            machine: MachineLoad {
                cpus: std::thread::available_parallelism().map_or(0, usize::from),
                load_average_at_start,
            },
        })
    }

    /// Exactly-once and at-least-once rounds, interleaved, over one input of `size`-byte records.
    fn throughput(&mut self, size: usize) -> anyhow::Result<SizeThroughput> {
        let input = self.name(&format!("{size}b-in"));
        tracing::info!(topic = %input, records = self.options.records, value_bytes = size, "writing the input");
        let summary = self.produce(
            &input,
            self.options.records,
            size,
            0,
            self.seed_base + size as u64,
        )?;
        let bytes_per_record = mean_value_bytes(&summary);
        let (partitions, target) = self.input_extent(&input)?;

        let mut exactly_once = Vec::new();
        let mut at_least_once = Vec::new();
        for round in 1..=self.options.rounds {
            for guarantee in [Guarantee::ExactlyOnce, Guarantee::AtLeastOnce] {
                let short = match guarantee {
                    Guarantee::ExactlyOnce => "eo",
                    Guarantee::AtLeastOnce => "alo",
                };
                let run = self.processor_run(
                    &format!("{size}b-{short}-{round}"),
                    guarantee,
                    self.options.max_batch,
                    &input,
                );
                let figures = self.drain(&run, &partitions, target)?;
                tracing::info!(
                    value_bytes = size,
                    round,
                    %guarantee,
                    records_per_second = figures.records_per_second.round(),
                    measured_seconds = figures.measured_seconds,
                    "throughput round done"
                );
                match guarantee {
                    Guarantee::ExactlyOnce => exactly_once.push(figures),
                    Guarantee::AtLeastOnce => at_least_once.push(figures),
                }
            }
        }
        self.delete_now(&[input])?;

        let exactly_once =
            GuaranteeThroughput::new(Guarantee::ExactlyOnce, exactly_once, bytes_per_record);
        let at_least_once =
            GuaranteeThroughput::new(Guarantee::AtLeastOnce, at_least_once, bytes_per_record);
        let ratio_eo_to_alo = exactly_once
            .median_records_per_second
            .zip(at_least_once.median_records_per_second)
            .and_then(|(eo, alo)| ratio(eo, alo));
        Ok(SizeThroughput {
            value_bytes: size,
            mean_value_bytes: bytes_per_record,
            records: summary.physical_records,
            exactly_once,
            at_least_once,
            ratio_eo_to_alo,
            ratio_target: (size >= RATIO_TARGET_MIN_BYTES).then_some(RATIO_TARGET),
        })
    }

    /// Exactly-once with one record per transaction.
    fn single_record(&mut self, size: usize) -> anyhow::Result<SingleRecordFigures> {
        let records = self.options.single_records;
        let input = self.name("single-in");
        tracing::info!(topic = %input, records, "writing the single-record backlog");
        self.produce(&input, records, size, 0, self.seed_base + 1_000_000)?;
        let (partitions, target) = self.input_extent(&input)?;
        let run = self.processor_run("single", Guarantee::ExactlyOnce, 1, &input);
        let figures = self.drain(&run, &partitions, target)?;
        self.delete_now(&[input])?;
        tracing::info!(
            transactions_per_second = figures.records_per_second.round(),
            "single-record run done"
        );
        Ok(SingleRecordFigures {
            records,
            value_bytes: size,
            transactions_per_second: figures.records_per_second,
            target: SINGLE_RECORD_TARGET,
        })
    }

    /// Latency at half of `peak` (or at `--latency-rate`). A latency measured while the
    /// pipeline falls behind is the length of a queue, not the pipeline's latency: without
    /// `--latency-rate`, such a run is repeated at half the rate, up to [`LATENCY_RETRIES`] times.
    /// (The peak is measured with the processor alone; during the latency run the producer and
    /// the output reader share the machine, which on a small one can take more than half.)
    fn latency(&mut self, peak: Option<f64>, size: usize) -> anyhow::Result<Vec<LatencyFigures>> {
        let (mut rate, mut basis) = match (self.options.latency_rate, peak) {
            (Some(rate), _) => (rate, LatencyRateBasis::Flag),
            (None, Some(peak)) => (
                ((peak / 2.0).round() as u64).max(1),
                LatencyRateBasis::HalfPeak,
            ),
            (None, None) => bail!("no exactly-once rate was measured to base the latency run on"),
        };
        let mut runs = Vec::new();
        loop {
            let figures = self.latency_run(runs.len() + 1, rate, basis, peak, size)?;
            let kept_up = figures.trend.kept_up;
            runs.push(figures);
            let retries = runs.len() - 1;
            if kept_up || basis == LatencyRateBasis::Flag || retries >= LATENCY_RETRIES || rate < 2
            {
                return Ok(runs);
            }
            rate /= 2;
            basis = LatencyRateBasis::HalvedAfterFallingBehind;
            tracing::info!(
                rate,
                "the pipeline fell behind: measuring again at half the rate"
            );
        }
    }

    /// One latency run: a warmed-up exactly-once processor, records produced at `rate`, and a
    /// read_committed reader of the output noting when each input's output arrives.
    fn latency_run(
        &mut self,
        attempt: usize,
        rate: u64,
        basis: LatencyRateBasis,
        peak: Option<f64>,
        size: usize,
    ) -> anyhow::Result<LatencyFigures> {
        let seconds = self.options.latency_seconds;
        let records = rate * seconds;
        // Sent before the measured records, through the same producer, and not measured.
        let ramp_up_records = rate * PRODUCER_RAMP_UP.as_secs();
        let label = format!("latency-{attempt}");
        let input = self.name(&format!("{label}-in"));
        self.topics.push(input.clone());
        self.runtime
            .block_on(ensure_topic(&self.settings, &input, self.layout()))
            .with_context(|| format!("creating topic {input:?}"))?;
        let run = self.processor_run(
            &label,
            Guarantee::ExactlyOnce,
            self.options.max_batch,
            &input,
        );
        let offsets = GroupOffsetReader::new(&self.settings, &run.group)?;
        let mut process = self.spawn(&run)?;
        let started = Instant::now();

        tracing::info!(
            records = WARMUP_RECORDS,
            "warming up the latency run's processor"
        );
        let seed = self.seed_base + 2_000_000 + 2 * attempt as u64;
        self.produce(&input, WARMUP_RECORDS, size, 0, seed)?;
        let (partitions, warm_target) = self.input_extent(&input)?;
        self.follow_commits(
            &mut process,
            &offsets,
            &run,
            &partitions,
            warm_target,
            started,
        )?;
        let metadata = self.settings.metadata_client()?;
        let warm_ends: BTreeMap<i32, i64> =
            watermarks(&self.settings, &metadata, &input, &partitions)?
                .into_iter()
                .map(|(partition, (_, end))| (partition, end))
                .collect();
        let output_partitions = topic_partitions(&metadata, &self.settings, &run.output)?
            .ok_or_else(|| {
                anyhow!(
                    "the processor did not create its output topic {:?}",
                    run.output
                )
            })?;

        let collector = ArrivalCollector::start(
            &self.settings,
            &run.output,
            &output_partitions,
            warm_ends.clone(),
            ramp_up_records + records,
        )?;
        tracing::info!(rate, seconds, records, "producing for the latency run");
        let produced = self.produce(&input, ramp_up_records + records, size, rate, seed + 1);
        let arrivals = match produced {
            Ok(_) => collector.finish(&mut process, &self.stop, self.options.stall_timeout),
            Err(error) => {
                collector.abandon();
                Err(error)
            }
        }?;
        process.stop(STOP_TIMEOUT)?;
        let ends: BTreeMap<i32, i64> = watermarks(&self.settings, &metadata, &input, &partitions)?
            .into_iter()
            .map(|(partition, (_, end))| (partition, end))
            .collect();
        let sent_at = read_timestamps(
            &self.settings,
            &input,
            &warm_ends,
            &ends,
            self.options.stall_timeout,
        )?;
        let (samples, unmatched) = latency_samples(&arrivals, &sent_at);
        if unmatched > 0 {
            tracing::warn!(unmatched, "output records whose input record was not found");
        }
        let ramp_up_ms = PRODUCER_RAMP_UP.as_millis() as i64;
        let samples = without_ramp_up(samples, ramp_up_ms);
        if let Some(path) = &self.options.latency_samples {
            append_samples(path, rate, &samples)
                .with_context(|| format!("writing latency samples to {}", path.display()))?;
        }
        let summary = LatencySummary::from_millis(samples.iter().map(|&(_, latency)| latency))
            .ok_or_else(|| anyhow!("no output record arrived during the latency run"))?;
        let commit_interval_ms = self.options.commit_interval.as_millis() as u64;
        let trend = LatencyTrend::from_samples(samples, commit_interval_ms)
            .ok_or_else(|| anyhow!("too few output records to judge the latency run"))?;
        if !trend.kept_up {
            tracing::warn!(
                rate,
                first_quarter_p50_ms = trend.first_quarter_p50_ms,
                last_quarter_p50_ms = trend.last_quarter_p50_ms,
                "the pipeline did not keep up with this rate: the latency is a queue's"
            );
        }
        self.delete_now(&[
            input,
            run.output.clone(),
            run.changelog.clone(),
            run.dlq.clone(),
        ])?;
        tracing::info!(
            p50_ms = summary.p50_ms,
            p99_ms = summary.p99_ms,
            "latency run done"
        );
        Ok(LatencyFigures {
            peak_records_per_second: peak,
            rate_records_per_second: rate,
            rate_basis: basis,
            value_bytes: size,
            seconds,
            summary,
            trend,
        })
    }

    /// Runs a processor from the start of `run.input` to its end and measures the rate.
    fn drain(
        &mut self,
        run: &ProcessorRun,
        partitions: &[i32],
        target: i64,
    ) -> anyhow::Result<RoundFigures> {
        let offsets = GroupOffsetReader::new(&self.settings, &run.group)?;
        let mut process = self.spawn(run)?;
        let started = Instant::now();
        let progress =
            self.follow_commits(&mut process, &offsets, run, partitions, target, started)?;
        let cpu = process.stop(STOP_TIMEOUT)?;
        self.delete_now(&[run.output.clone(), run.changelog.clone(), run.dlq.clone()])?;
        let records_per_second = progress.rate().ok_or_else(|| {
            anyhow!(
                "{}: the whole input was committed at once, too fast to measure; give more records",
                run.label
            )
        })?;
        Ok(RoundFigures {
            records_per_second,
            measured_seconds: progress.measured_seconds(),
            startup_seconds: progress
                .first_commit_seen_at()
                .map_or(0.0, |at| at.as_secs_f64()),
            processor_cpu_ms_per_1000_records: cpu
                .and_then(|cpu| ratio(cpu.as_secs_f64() * 1e6, target as f64)),
        })
    }

    /// Samples the group's committed offsets until they reach `target` in total.
    fn follow_commits(
        &self,
        process: &mut ProcessorProcess,
        offsets: &GroupOffsetReader,
        run: &ProcessorRun,
        partitions: &[i32],
        target: i64,
        started: Instant,
    ) -> anyhow::Result<CommitProgress> {
        let mut progress = CommitProgress::new(target);
        loop {
            let tick = Instant::now();
            self.check_interrupted()?;
            process.ensure_running()?;
            match offsets.committed(&run.input, partitions, COMMITTED_FETCH_TIMEOUT) {
                Ok(committed) => {
                    let total: i64 = committed.values().flatten().sum();
                    let sample = CommitSample {
                        at: started.elapsed(),
                        committed: total,
                    };
                    if progress.observe(sample) {
                        return Ok(progress);
                    }
                }
                Err(error) => tracing::debug!(%error, "committed offsets not read; retrying"),
            }
            let stalled = started.elapsed().saturating_sub(progress.last_change());
            if stalled >= self.options.stall_timeout {
                bail!(
                    "{}: the group's committed offsets stayed at {} of {target} for {}; processor \
                     log: {}",
                    run.label,
                    progress.committed(),
                    humantime::format_duration(self.options.stall_timeout),
                    process.log().display()
                );
            }
            if let Some(pause) = SAMPLE_INTERVAL.checked_sub(tick.elapsed()) {
                std::thread::sleep(pause);
            }
        }
    }

    fn processor_run(
        &mut self,
        label: &str,
        guarantee: Guarantee,
        max_batch: u32,
        input: &str,
    ) -> ProcessorRun {
        let run = ProcessorRun {
            label: label.to_owned(),
            guarantee,
            max_batch,
            input: input.to_owned(),
            output: self.name(&format!("{label}-out")),
            dlq: self.name(&format!("{label}-dlq")),
            changelog: self.name(&format!("{label}-changelog")),
            group: self.name(label),
        };
        // Recorded before the processor creates them, so that a failure still cleans them up.
        self.topics
            .extend([run.output.clone(), run.dlq.clone(), run.changelog.clone()]);
        self.groups.push(run.group.clone());
        run
    }

    fn spawn(&mut self, run: &ProcessorRun) -> anyhow::Result<ProcessorProcess> {
        self.processes_started += 1;
        let log = self
            .log_dir
            .join(format!("{:02}-{}.log", self.processes_started, run.label));
        let args: Vec<String> = vec![
            "--bootstrap-servers".into(),
            self.settings.bootstrap_servers.clone(),
            "--input-topic".into(),
            run.input.clone(),
            "--output-topic".into(),
            run.output.clone(),
            "--dlq-topic".into(),
            run.dlq.clone(),
            "--changelog-topic".into(),
            run.changelog.clone(),
            "--group-id".into(),
            run.group.clone(),
            "--instance-id".into(),
            format!("bench-{}", run.label),
            "--guarantee".into(),
            run.guarantee.to_string(),
            "--commit-interval".into(),
            humantime::format_duration(self.options.commit_interval).to_string(),
            "--max-batch".into(),
            run.max_batch.to_string(),
            "--partitions".into(),
            self.options.partitions.to_string(),
            "--metrics-addr".into(),
            "127.0.0.1:0".into(),
        ];
        tracing::debug!(label = %run.label, log = %log.display(), ?args, "starting eos-processor");
        ProcessorProcess::spawn(&self.options.processor_bin, &args, log, &run.label)
    }

    /// Writes `count` valid, distinct events (no duplicates, malformed records or conflicts).
    fn produce(
        &mut self,
        topic: &str,
        count: u64,
        value_bytes: usize,
        rate: u64,
        seed: u64,
    ) -> anyhow::Result<ProduceSummary> {
        if !self.topics.iter().any(|t| t == topic) {
            self.topics.push(topic.to_owned());
        }
        let options = ProduceOptions {
            topic: topic.to_owned(),
            layout: self.layout(),
            rate,
            delivery_timeout: DELIVERY_TIMEOUT,
            spec: WorkloadSpec {
                seed,
                count,
                entities: ENTITIES,
                duplicate_ratio: 0.0,
                bad_ratio: 0.0,
                conflict_ratio: 0.0,
                value_bytes,
                occurred_at_base: OffsetDateTime::now_utc(),
            },
        };
        self.runtime
            .block_on(produce::run(
                &self.settings,
                options,
                ProgressBar::hidden(),
                Arc::clone(&self.stop),
            ))
            .with_context(|| format!("producing to topic {topic:?}"))
    }

    /// The partitions of a freshly written input and the sum of their ends: the committed total
    /// at which a group has read all of it.
    fn input_extent(&self, topic: &str) -> anyhow::Result<(Vec<i32>, i64)> {
        let metadata = self.settings.metadata_client()?;
        let partitions = topic_partitions(&metadata, &self.settings, topic)?
            .ok_or_else(|| anyhow!("topic {topic:?} disappeared"))?;
        let ends = watermarks(&self.settings, &metadata, topic, &partitions)?;
        let target = ends.values().map(|&(_, end)| end).sum();
        Ok((partitions, target))
    }

    fn layout(&self) -> TopicLayout {
        TopicLayout {
            partitions: self.options.partitions,
            replication_factor: -1,
        }
    }

    fn name(&self, what: &str) -> String {
        format!("eosctl-bench-{}-{what}", self.run_id)
    }

    fn check_interrupted(&self) -> anyhow::Result<()> {
        if self.stop.load(Ordering::Relaxed) {
            bail!("interrupted");
        }
        Ok(())
    }

    /// Deletes topics as soon as a run is done with them (the 1 KB rounds write gigabytes).
    fn delete_now(&mut self, topics: &[String]) -> anyhow::Result<()> {
        if self.options.keep_topics {
            return Ok(());
        }
        self.delete_topics(topics)?;
        self.topics.retain(|t| !topics.contains(t));
        Ok(())
    }

    fn delete_topics(&self, topics: &[String]) -> anyhow::Result<()> {
        if topics.is_empty() {
            return Ok(());
        }
        let admin = self.admin()?;
        let names: Vec<&str> = topics.iter().map(String::as_str).collect();
        let options = AdminOptions::new().operation_timeout(Some(ADMIN_TIMEOUT));
        let results = self
            .runtime
            .block_on(admin.delete_topics(&names, &options))
            .map_err(|e| self.settings.unreachable(e))?;
        for result in results {
            match result {
                Ok(topic) => tracing::debug!(topic, "deleted topic"),
                // Never created (the run failed before the processor got to it): nothing to do.
                Err((_, RDKafkaErrorCode::UnknownTopicOrPartition)) => {}
                Err((topic, code)) => bail!("cannot delete topic {topic:?}: {code}"),
            }
        }
        Ok(())
    }

    /// Deletes the remaining topics and the consumer groups. A group whose static member's
    /// session has not expired yet cannot be deleted: that is retried for a while after a
    /// successful run, and left to the broker's offset retention otherwise.
    fn clean_up(&mut self, patient: bool) -> anyhow::Result<()> {
        let topics = std::mem::take(&mut self.topics);
        self.delete_topics(&topics)?;
        let admin = self.admin()?;
        let options = AdminOptions::new().operation_timeout(Some(ADMIN_TIMEOUT));
        let deadline = Instant::now() + GROUP_DELETE_PATIENCE;
        let mut remaining = std::mem::take(&mut self.groups);
        while !remaining.is_empty() {
            let names: Vec<&str> = remaining.iter().map(String::as_str).collect();
            let results = self
                .runtime
                .block_on(admin.delete_groups(&names, &options))
                .map_err(|e| self.settings.unreachable(e))?;
            let mut busy = Vec::new();
            for result in results {
                match result {
                    Ok(_) | Err((_, RDKafkaErrorCode::GroupIdNotFound)) => {}
                    Err((group, RDKafkaErrorCode::NonEmptyGroup)) => busy.push(group),
                    Err((group, code)) => {
                        tracing::warn!(group, %code, "cannot delete consumer group");
                    }
                }
            }
            remaining = busy;
            if remaining.is_empty() || !patient || Instant::now() >= deadline {
                break;
            }
            std::thread::sleep(Duration::from_secs(1));
        }
        if !remaining.is_empty() {
            tracing::info!(
                groups = ?remaining,
                "consumer groups still had a member's session open and were left to expire"
            );
        }
        tracing::info!("deleted the benchmark's topics");
        Ok(())
    }

    fn admin(&self) -> anyhow::Result<AdminClient<DefaultClientContext>> {
        self.settings
            .client_config()
            .create()
            .context("cannot create a Kafka admin client")
    }
}

fn mean_value_bytes(summary: &ProduceSummary) -> f64 {
    ratio(summary.bytes as f64, summary.physical_records as f64).unwrap_or(0.0)
}

/// One `eos-processor` child process, its output going to a log file.
struct ProcessorProcess {
    process: ChildProcess,
    /// CPU time of this process's waited-for children before this one started: one processor
    /// runs at a time, so the growth after it is waited for is its own.
    children_cpu_before: Option<Duration>,
}

impl ProcessorProcess {
    fn spawn(bin: &Path, args: &[String], log: PathBuf, label: &str) -> anyhow::Result<Self> {
        let children_cpu_before = children_cpu();
        let mut command = Command::new(bin);
        // A fault switch must never leak into a benchmark from the environment.
        command.args(args).env_remove("EOS_FAULT_ABORT_EVERY");
        let process = ChildProcess::spawn(label, command, &log, LogMode::Truncate)?;
        Ok(Self {
            process,
            children_cpu_before,
        })
    }

    fn log(&self) -> &Path {
        self.process.log_path()
    }

    fn ensure_running(&mut self) -> anyhow::Result<()> {
        match self.process.try_wait()? {
            None => Ok(()),
            Some(status) => Err(self.failure(&format!("exited early ({status})"))),
        }
    }

    /// SIGTERM, then waits for the processor to finish its batch and exit. Returns the CPU
    /// time (user + system) it used over its life, where the platform tells.
    fn stop(mut self, timeout: Duration) -> anyhow::Result<Option<Duration>> {
        match self.process.terminate(timeout) {
            Ok(status) => self.check_exit(status),
            Err(ProcessError::StillRunning { .. }) => Err(self.failure(&format!(
                "did not exit within {} of SIGTERM",
                humantime::format_duration(timeout)
            ))),
            Err(error) => Err(error.into()),
        }
    }

    fn check_exit(&self, status: ExitStatus) -> anyhow::Result<Option<Duration>> {
        if status.success() {
            Ok(children_cpu()
                .zip(self.children_cpu_before)
                .map(|(after, before)| after.saturating_sub(before)))
        } else {
            Err(self.failure(&format!("stopped with {status}")))
        }
    }

    fn failure(&self, what: &str) -> anyhow::Error {
        anyhow!(
            "eos-processor ({}) {what}; log: {}\n{}",
            self.process.name(),
            self.log().display(),
            self.process.last_log_lines(LOG_TAIL_LINES)
        )
    }
}

/// Appends `rate,sent_ms,latency_ms` lines, with a header when the file is new.
fn append_samples(path: &Path, rate: u64, samples: &[(i64, i64)]) -> std::io::Result<()> {
    use std::io::Write as _;
    let new = !path.exists();
    let mut file = std::io::BufWriter::new(
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?,
    );
    if new {
        writeln!(file, "rate,sent_ms,latency_ms")?;
    }
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    for (sent_ms, latency_ms) in sorted {
        writeln!(file, "{rate},{sent_ms},{latency_ms}")?;
    }
    file.flush()
}

/// User plus system CPU time of this process's terminated and waited-for children.
fn children_cpu() -> Option<Duration> {
    let usage = getrusage(UsageWho::RUSAGE_CHILDREN).ok()?;
    let micros = |time: nix::sys::time::TimeVal| -> Option<u64> {
        Some(u64::try_from(time.tv_sec()).ok()? * 1_000_000 + u64::try_from(time.tv_usec()).ok()?)
    };
    let total = micros(usage.user_time())? + micros(usage.system_time())?;
    Some(Duration::from_micros(total))
}

/// The part of a ledger output record the latency run needs: where its input came from.
#[derive(Debug, Deserialize)]
struct OutputSource {
    source: SourceRef,
}

#[derive(Debug, Deserialize)]
struct SourceRef {
    partition: i32,
    offset: i64,
}

/// An output record as it reached the reader.
#[derive(Debug, Clone, Copy)]
struct Arrival {
    /// Of the input record.
    partition: i32,
    offset: i64,
    received_ms: i64,
}

/// `(send time, latency)` of each arrival whose input record's timestamp is known, and how many
/// were not.
fn latency_samples(
    arrivals: &[Arrival],
    sent_at: &HashMap<(i32, i64), i64>,
) -> (Vec<(i64, i64)>, u64) {
    let mut unmatched = 0;
    let samples = arrivals
        .iter()
        .filter_map(|arrival| {
            let sent = sent_at.get(&(arrival.partition, arrival.offset));
            if sent.is_none() {
                unmatched += 1;
            }
            sent.map(|&sent_ms| (sent_ms, arrival.received_ms - sent_ms))
        })
        .collect();
    (samples, unmatched)
}

/// A read_committed reader of the output topic on its own thread, noting when each output
/// record arrives.
struct ArrivalCollector {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Vec<Arrival>>,
    expected: u64,
}

impl ArrivalCollector {
    /// Collects outputs of inputs at or after `from` (per input partition) until `expected` of
    /// them have arrived.
    fn start(
        settings: &KafkaSettings,
        output: &str,
        output_partitions: &[i32],
        from: BTreeMap<i32, i64>,
        expected: u64,
    ) -> anyhow::Result<Self> {
        let consumer: BaseConsumer = settings
            .client_config()
            .set("group.id", reader_group("output"))
            .set("isolation.level", "read_committed")
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("allow.auto.create.topics", "false")
            // Answer as soon as a transaction's records become readable.
            .set("fetch.wait.max.ms", "10")
            .create()
            .context("cannot create the output reader")?;
        let mut assignment = TopicPartitionList::new();
        for &partition in output_partitions {
            assignment.add_partition_offset(output, partition, Offset::Beginning)?;
        }
        consumer
            .assign(&assignment)
            .context("cannot assign the output partitions")?;
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || collect_arrivals(&consumer, &from, expected, &stop))
        };
        Ok(Self {
            stop,
            thread,
            expected,
        })
    }

    /// Waits for every expected output; fails when none arrives for `stall_timeout`.
    fn finish(
        self,
        process: &mut ProcessorProcess,
        interrupted: &AtomicBool,
        stall_timeout: Duration,
    ) -> anyhow::Result<Vec<Arrival>> {
        let deadline = Instant::now() + stall_timeout;
        while !self.thread.is_finished() {
            if interrupted.load(Ordering::Relaxed) {
                self.abandon();
                bail!("interrupted");
            }
            if let Err(error) = process.ensure_running() {
                self.abandon();
                return Err(error);
            }
            if Instant::now() >= deadline {
                self.stop.store(true, Ordering::Relaxed);
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let arrivals = self
            .thread
            .join()
            .map_err(|_| anyhow!("the output reader panicked"))?;
        if (arrivals.len() as u64) < self.expected {
            bail!(
                "only {} of {} output records arrived within {} after the last input was sent; \
                 processor log: {}",
                arrivals.len(),
                self.expected,
                humantime::format_duration(stall_timeout),
                process.log().display()
            );
        }
        Ok(arrivals)
    }

    fn abandon(self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.thread.join();
    }
}

fn collect_arrivals(
    consumer: &BaseConsumer,
    from: &BTreeMap<i32, i64>,
    expected: u64,
    stop: &AtomicBool,
) -> Vec<Arrival> {
    let mut arrivals = Vec::with_capacity(usize::try_from(expected).unwrap_or(0));
    while (arrivals.len() as u64) < expected && !stop.load(Ordering::Relaxed) {
        match consumer.poll(Duration::from_millis(20)) {
            Some(Ok(message)) => {
                let received_ms = now_ms();
                let Some(source) = message
                    .payload()
                    .and_then(|payload| serde_json::from_slice::<OutputSource>(payload).ok())
                    .map(|output| output.source)
                else {
                    continue;
                };
                // Outputs of the warm-up records are not measured.
                if source.offset < from.get(&source.partition).copied().unwrap_or(0) {
                    continue;
                }
                arrivals.push(Arrival {
                    partition: source.partition,
                    offset: source.offset,
                    received_ms,
                });
            }
            Some(Err(error)) => tracing::debug!(%error, "output read error"),
            None => {}
        }
    }
    arrivals
}

/// The Kafka timestamps (the producer's send time) of the input records in `[from, end)` of
/// each partition, keyed by (partition, offset).
fn read_timestamps(
    settings: &KafkaSettings,
    topic: &str,
    from: &BTreeMap<i32, i64>,
    end: &BTreeMap<i32, i64>,
    stall_timeout: Duration,
) -> anyhow::Result<HashMap<(i32, i64), i64>> {
    let consumer: BaseConsumer = settings
        .client_config()
        .set("group.id", reader_group("input"))
        .set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("allow.auto.create.topics", "false")
        .create()
        .context("cannot create the input reader")?;
    let mut assignment = TopicPartitionList::new();
    let mut pending: HashMap<i32, i64> = HashMap::new();
    for (&partition, &end) in end {
        let start = from.get(&partition).copied().unwrap_or(0);
        if end > start {
            assignment.add_partition_offset(topic, partition, Offset::Offset(start))?;
            pending.insert(partition, end);
        }
    }
    let mut timestamps = HashMap::new();
    if pending.is_empty() {
        return Ok(timestamps);
    }
    consumer
        .assign(&assignment)
        .context("cannot assign the input partitions")?;
    let mut last_progress = Instant::now();
    while !pending.is_empty() {
        if last_progress.elapsed() >= stall_timeout {
            bail!("reading the input's timestamps made no progress for {stall_timeout:?}");
        }
        let Some(result) = consumer.poll(Duration::from_millis(100)) else {
            continue;
        };
        let message = result.context("reading the input's timestamps")?;
        let partition = message.partition();
        let Some(&end) = pending.get(&partition) else {
            continue;
        };
        if message.offset() >= end {
            continue;
        }
        last_progress = Instant::now();
        if let Some(ms) = message.timestamp().to_millis() {
            timestamps.insert((partition, message.offset()), ms);
        }
        if message.offset() + 1 >= end {
            pending.remove(&partition);
        }
    }
    Ok(timestamps)
}

/// librdkafka assigns partitions only in a consumer with a group id. The benchmark's readers
/// never join or commit, so a throw-away id leaves no trace.
fn reader_group(purpose: &str) -> String {
    format!(
        "eosctl-bench-reader-{purpose}-{}-{}",
        std::process::id(),
        now_ms()
    )
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| {
            i64::try_from(elapsed.as_millis()).unwrap_or(i64::MAX)
        })
}

fn rate_text(rate: Option<f64>) -> String {
    rate.map_or_else(|| "-".to_owned(), |rate| grouped(rate.round() as i64))
}

/// One decimal, or `-` for a figure that could not be taken.
fn mb_text(value: Option<f64>) -> String {
    value.map_or_else(|| "-".to_owned(), |value| format!("{value:.1}"))
}

fn verdict(value: f64, target: f64) -> &'static str {
    if value >= target { "met" } else { "NOT met" }
}

pub fn bench_text(report: &BenchReport) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "eos-processor benchmark: {}", report.processor_bin);
    if report.debug_build {
        let _ = writeln!(
            out,
            "WARNING: a debug build; build with --release for meaningful figures"
        );
    }
    let _ = writeln!(
        out,
        "{} partitions, commit interval {} ms, max batch {}, {} round{} of each guarantee \
         (interleaved EO, ALO, ...), fresh group per round; rates from the first commit to the end \
         of the input; CPU ms/1k = the processor's CPU time per 1,000 records",
        report.partitions,
        report.commit_interval_ms,
        report.max_batch,
        report.rounds,
        if report.rounds == 1 { "" } else { "s" }
    );
    if !report.throughput.is_empty() {
        let _ = writeln!(out, "{}", throughput_table(report));
    }
    if let Some(single) = &report.single_record {
        let _ = writeln!(
            out,
            "single-record transactions/s: {:.0}  ({} records of {} B, exactly-once, \
             --max-batch 1; target >= {:.0}: {})",
            single.transactions_per_second,
            grouped(single.records),
            single.value_bytes,
            single.target,
            verdict(single.transactions_per_second, single.target)
        );
    }
    for latency in &report.latency {
        let basis = match (latency.rate_basis, latency.peak_records_per_second) {
            (LatencyRateBasis::HalfPeak, Some(peak)) => format!(
                "half of the exactly-once peak of {}/s",
                grouped(peak.round() as i64)
            ),
            (LatencyRateBasis::HalvedAfterFallingBehind, _) => {
                "half the rate of the run before".to_owned()
            }
            _ => "--latency-rate".to_owned(),
        };
        let _ = writeln!(
            out,
            "latency at {} records/s ({basis}), {} B, {} records over {} s: p50 {} ms, p99 {} ms, \
             max {} ms",
            grouped(latency.rate_records_per_second),
            latency.value_bytes,
            grouped(latency.summary.samples),
            latency.seconds,
            latency.summary.p50_ms,
            latency.summary.p99_ms,
            latency.summary.max_ms
        );
        if !latency.trend.kept_up {
            let _ = writeln!(
                out,
                "  the pipeline did not keep up at this rate (median latency {} ms over the first \
                 quarter of the run, {} ms over the last): these figures measure a queue, not \
                 the pipeline",
                latency.trend.first_quarter_p50_ms, latency.trend.last_quarter_p50_ms
            );
        }
    }
    let machine = &report.machine;
    if let Some(load) = machine.load_average_at_start {
        let _ = writeln!(
            out,
            "machine: {} CPUs, 1-minute load average {load:.2} before the benchmark (other work \
             on the machine skews the figures)",
            machine.cpus
        );
    }
    if !report.topics_deleted {
        let _ = writeln!(out, "the benchmark's topics were kept (--keep-topics)");
    }
    out
}

fn throughput_table(report: &BenchReport) -> Table {
    let mut table = Table::new();
    table.load_preset(UTF8_FULL_CONDENSED);
    table.set_header([
        "size".to_owned(),
        "guarantee".to_owned(),
        format!("records/s (median of {})", report.rounds),
        "MB/s".to_owned(),
        "CPU ms/1k".to_owned(),
        "each round (records/s)".to_owned(),
    ]);
    for size in &report.throughput {
        let label = if (size.mean_value_bytes - size.value_bytes as f64).abs()
            > 0.1 * size.value_bytes as f64
        {
            format!("{} B (~{:.0} B)", size.value_bytes, size.mean_value_bytes)
        } else {
            format!("{} B", size.value_bytes)
        };
        for (index, figures) in [&size.exactly_once, &size.at_least_once]
            .into_iter()
            .enumerate()
        {
            let rounds = figures
                .rounds
                .iter()
                .map(|r| grouped(r.records_per_second.round() as i64))
                .collect::<Vec<_>>()
                .join("  ");
            table.add_row([
                if index == 0 {
                    label.clone()
                } else {
                    String::new()
                },
                figures.guarantee.to_string(),
                rate_text(figures.median_records_per_second),
                mb_text(figures.median_megabytes_per_second),
                mb_text(figures.median_processor_cpu_ms_per_1000_records),
                rounds,
            ]);
        }
        let target = match (size.ratio_eo_to_alo, size.ratio_target) {
            (Some(value), Some(target)) => {
                format!("target >= {target:.2}: {}", verdict(value, target))
            }
            _ => String::new(),
        };
        table.add_row([
            String::new(),
            "ratio EO/ALO".to_owned(),
            size.ratio_eo_to_alo
                .map_or_else(|| "-".to_owned(), |r| format!("{r:.2}")),
            String::new(),
            String::new(),
            target,
        ]);
    }
    for index in [2, 3, 4] {
        if let Some(column) = table.column_mut(index) {
            column.set_cell_alignment(CellAlignment::Right);
        }
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round(rate: f64) -> RoundFigures {
        RoundFigures {
            records_per_second: rate,
            measured_seconds: 1.0,
            startup_seconds: 2.0,
            processor_cpu_ms_per_1000_records: Some(20.0),
        }
    }

    #[test]
    fn text_report_shows_medians_ratio_and_targets() {
        let exactly_once = GuaranteeThroughput::new(
            Guarantee::ExactlyOnce,
            vec![round(9_000.0), round(9_500.0), round(8_000.0)],
            1024.0,
        );
        let at_least_once = GuaranteeThroughput::new(
            Guarantee::AtLeastOnce,
            vec![round(10_000.0), round(11_000.0), round(9_000.0)],
            1024.0,
        );
        assert_eq!(exactly_once.median_records_per_second, Some(9_000.0));
        let report = BenchReport {
            processor_bin: "/x/target/release/eos-processor".into(),
            debug_build: false,
            partitions: 3,
            commit_interval_ms: 100,
            max_batch: 5000,
            rounds: 3,
            throughput: vec![SizeThroughput {
                value_bytes: 1024,
                mean_value_bytes: 1024.0,
                records: 200_000,
                ratio_eo_to_alo: Some(0.9),
                ratio_target: Some(RATIO_TARGET),
                exactly_once,
                at_least_once,
            }],
            single_record: Some(SingleRecordFigures {
                records: 2000,
                value_bytes: 1024,
                transactions_per_second: 80.0,
                target: SINGLE_RECORD_TARGET,
            }),
            latency: Vec::new(),
            topics_deleted: true,
            machine: MachineLoad::default(),
        };
        let text = bench_text(&report);
        assert!(text.contains("9,000"), "{text}");
        assert!(text.contains("9.2"), "{text}"); // 9,000 × 1024 B = 9.2 MB/s
        assert!(text.contains("0.90"), "{text}");
        assert!(text.contains("target >= 0.90: met"), "{text}");
        assert!(text.contains("target >= 100: NOT met"), "{text}");
        let json = serde_json::to_value(&report).expect("serialisable");
        assert_eq!(
            json["throughput"][0]["exactly_once"]["guarantee"],
            "exactly-once"
        );
    }

    #[test]
    fn latency_is_arrival_minus_the_input_timestamp() {
        let arrival = |partition, offset, received_ms| Arrival {
            partition,
            offset,
            received_ms,
        };
        let arrivals = [
            arrival(0, 7, 1_100),
            arrival(1, 7, 1_250),
            arrival(2, 1, 900),
        ];
        let sent_at = HashMap::from([((0, 7), 1_000), ((1, 7), 1_010)]);
        let (samples, unmatched) = latency_samples(&arrivals, &sent_at);
        assert_eq!(samples, vec![(1_000, 100), (1_010, 240)]);
        assert_eq!(unmatched, 1);
    }

    #[test]
    fn output_records_name_their_source() -> Result<(), serde_json::Error> {
        let output = br#"{"event_id":"e-1","entity_id":"ent-3","value":5,"entity_total":5,
            "entity_count":1,"source":{"topic":"payments","partition":2,"offset":41}}"#;
        let parsed: OutputSource = serde_json::from_slice(output)?;
        assert_eq!((parsed.source.partition, parsed.source.offset), (2, 41));
        Ok(())
    }

    #[test]
    fn debug_builds_are_recognised() {
        let options = |path: &str| BenchOptions {
            processor_bin: PathBuf::from(path),
            records: 1,
            sizes: vec![100],
            rounds: 1,
            commit_interval: Duration::from_millis(100),
            max_batch: 1,
            partitions: 1,
            single_records: 0,
            latency_seconds: 0,
            latency_rate: None,
            stall_timeout: Duration::from_secs(1),
            keep_topics: false,
            keep_logs: false,
            latency_samples: None,
        };
        assert!(options("/w/target/debug/eos-processor").is_debug_build());
        assert!(!options("/w/target/release/eos-processor").is_debug_build());
    }
}
