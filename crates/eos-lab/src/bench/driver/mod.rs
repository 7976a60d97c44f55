//! The benchmark's driver: writes the inputs, runs one processor after another over them,
//! follows their committed offsets, and cleans up the topics and groups it created.

mod cleanup;
mod kill_resume;
mod latency;
mod throughput;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use eos_core::Guarantee;
use eos_runtime::kafka_settings::ChildKafkaProperties;
use indicatif::ProgressBar;
use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use rdkafka::types::RDKafkaErrorCode;
use time::OffsetDateTime;
use tokio::runtime::Handle;

use crate::bench::card_workload;
use crate::bench::figures::{
    CommitProgress, CommitSample, LatencySummary, LatencyTrend, ratio, without_ramp_up,
};
use crate::bench::latency_collector::{
    ArrivalCollector, append_samples, latency_samples, read_timestamps,
};
use crate::bench::latency_collector::{LATENCY_RETRIES, PRODUCER_RAMP_UP};
use crate::bench::options::{BenchOptions, BenchWorkload};
use crate::bench::pass_through;
use crate::bench::processor_process::{ProcessorProcess, children_cpu};
use crate::bench::record_format::{
    ExpectedOutputs, RecordFormat, RunFormat, SchemaRegistry, WORKLOAD, encode_workload,
    verify_outputs,
};
use crate::bench::report::{
    BenchReport, FormatThroughput, KillResumeFigures, LatencyFigures, LatencyRateBasis,
    MachineLoad, PASS_THROUGH_RATIO_TARGET, PathThroughput, RATIO_TARGET, RATIO_TARGET_MIN_BYTES,
    RoundFigures, SINGLE_RECORD_TARGET, SingleRecordFigures, SizeThroughput, WritePath,
};
use crate::bench::run_id::seed_base_and_id;
use eosctl::group_offsets::{GroupOffsetReader, watermarks};
use eosctl::kafka_client::{
    ClusterAccess as _, KafkaSettings, TopicLayout, ensure_topic, topic_partitions,
};
use eosctl::produce::{self, ProduceOptions, ProduceSummary, SendOptions};
use eosctl::workload::{GeneratedRecord, WorkloadSpec};

/// How often the group's committed offsets are sampled.
const SAMPLE_INTERVAL: Duration = Duration::from_millis(50);
/// How long one committed-offsets fetch may wait (it waits out open transactions).
const COMMITTED_FETCH_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a processor may take to finish its batch and exit after SIGTERM.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);
/// Records sent through the latency run's processor before measuring, so that its start-up
/// (joining the group, restoring state, the first transaction) is not counted as latency.
const WARMUP_RECORDS: u64 = 200;
/// How long the kill-to-resume run's processor commits steadily before each SIGKILL.
const KILL_SETTLE: Duration = Duration::from_secs(3);
/// How often the restarted processor's counters are read during the kill-to-resume run.
const RESUME_POLL_INTERVAL: Duration = Duration::from_millis(10);
/// Entities the benchmark's events are spread over.
const ENTITIES: u32 = 100;
/// Cards of the card-authorisations workload: enough that no card reaches its daily limit.
const CARDS: u32 = 10_000;
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(120);
const ADMIN_TIMEOUT: Duration = Duration::from_secs(30);
/// A static group member does not leave its group when it stops; the group can be deleted once
/// the member's session (10 s in the processor) has expired.
const GROUP_DELETE_PATIENCE: Duration = Duration::from_secs(15);

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
    /// The card-authorisations workload's second output.
    flagged: Option<String>,
    group: String,
    /// How its input and outputs are written.
    format: RunFormat,
}

/// A registry format's throughput input: the JSON input's events in that format.
struct FormatInput {
    format: RecordFormat,
    topic: String,
    partitions: Vec<i32>,
    mean_value_bytes: f64,
}

/// The figures of a size's throughput rounds, each list in the order the rounds ran.
#[derive(Default)]
struct RoundsOfSize {
    exactly_once: Vec<RoundFigures>,
    at_least_once: Vec<RoundFigures>,
    pass_through: Vec<RoundFigures>,
    /// One list per registry format, in `--format`'s order.
    formats: Vec<Vec<RoundFigures>>,
}

impl ProcessorRun {
    /// The topics the run's processor creates (its input is the benchmark's).
    fn created_topics(&self) -> Vec<String> {
        [&self.output, &self.dlq, &self.changelog]
            .into_iter()
            .chain(&self.flagged)
            .cloned()
            .collect()
    }
}

pub(super) struct Bench {
    settings: KafkaSettings,
    options: BenchOptions,
    runtime: Handle,
    stop: Arc<AtomicBool>,
    run_id: String,
    seed_base: u64,
    log_dir: PathBuf,
    /// eos-lab's Kafka properties for the processors it starts (a file in `log_dir`, owner-only:
    /// it may hold a SASL password).
    kafka_for_processors: ChildKafkaProperties,
    /// Every topic this run created or had a processor create, not yet deleted.
    topics: Vec<String>,
    groups: Vec<String>,
    processes_started: u32,
    /// Where the registry formats' schemas go (with `--format` other than json).
    registry: Option<SchemaRegistry>,
}

impl Bench {
    pub(super) fn new(
        settings: KafkaSettings,
        options: BenchOptions,
        runtime: Handle,
        stop: Arc<AtomicBool>,
    ) -> anyhow::Result<Self> {
        let (seed_base, run_id) = seed_base_and_id();
        let log_dir = std::env::temp_dir().join(format!("eos-lab-bench-{run_id}"));
        std::fs::create_dir_all(&log_dir)
            .with_context(|| format!("cannot create the log directory {}", log_dir.display()))?;
        let kafka_for_processors = settings
            .write_for_children(&log_dir.join("kafka-client.properties"))
            .context("writing the Kafka properties for the processors")?;
        let registry = match (
            options.registry_formats().next(),
            &options.schema_registry_url,
        ) {
            (Some(_), Some(url)) => Some(SchemaRegistry::new(
                eos_schema::RegistryConfig::new(url),
                runtime.clone(),
            )?),
            (Some(format), None) => bail!("--format {format} needs --schema-registry-url"),
            (None, _) => None,
        };
        Ok(Self {
            settings,
            options,
            runtime,
            stop,
            run_id,
            seed_base,
            log_dir,
            kafka_for_processors,
            topics: Vec::new(),
            groups: Vec::new(),
            processes_started: 0,
            registry,
        })
    }

    pub(super) fn run(mut self) -> anyhow::Result<BenchReport> {
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
            let subjects = self.registry.as_ref().map(SchemaRegistry::subjects);
            tracing::info!(topics = ?self.topics, groups = ?self.groups, ?subjects, "keeping topics, groups and schema subjects");
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
        let kill_resume = if self.options.kill_resume_kills > 0 {
            Some(self.kill_resume(first_size)?)
        } else {
            None
        };
        Ok(BenchReport {
            processor_bin: self.options.processor_bin.display().to_string(),
            debug_build: self.options.is_debug_build(),
            partitions: self.options.partitions,
            instances: self.options.instances,
            commit_interval_ms: self.options.commit_interval.as_millis() as u64,
            max_batch: self.options.max_batch,
            rounds: self.options.rounds,
            throughput,
            single_record,
            latency,
            kill_resume,
            topics_deleted: false,
            machine: MachineLoad {
                cpus: std::thread::available_parallelism().map_or(0, usize::from),
                load_average_at_start,
            },
        })
    }

    /// Runs `instances` processors in one group from the start of `run.input` to its end and
    /// measures the group's rate and their CPU time together.
    fn drain(
        &mut self,
        run: &ProcessorRun,
        instances: u32,
        partitions: &[i32],
        target: i64,
    ) -> anyhow::Result<RoundFigures> {
        let offsets = GroupOffsetReader::new(&self.settings, &run.group)?;
        let cpu_before = children_cpu();
        let mut processes = Vec::new();
        for instance in 0..instances {
            let suffix = (instances > 1).then(|| format!("-{instance}"));
            processes.push(self.spawn_instance(run, suffix.as_deref())?);
        }
        let started = Instant::now();
        let progress =
            self.follow_commits(&mut processes, &offsets, run, partitions, target, started)?;
        for process in processes {
            process.stop(STOP_TIMEOUT)?;
        }
        // A child's CPU time is counted once it is waited for: after all of them, the growth is
        // theirs together.
        let cpu = children_cpu()
            .zip(cpu_before)
            .map(|(after, before)| after.saturating_sub(before));
        self.verify_outputs(run, target)?;
        self.delete_now(&run.created_topics())?;
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
            cpu_ms_per_1000_records: cpu
                .and_then(|cpu| ratio(cpu.as_secs_f64() * 1e6, target as f64)),
        })
    }

    /// Checks that a finished run over `target` input records wrote one output for each and
    /// dead-lettered none ([`verify_outputs`]). The ledger's only: the card-authorisations
    /// transforms write some events to a second output and refuse those over a card's limit.
    fn verify_outputs(&self, run: &ProcessorRun, target: i64) -> anyhow::Result<()> {
        if self.options.workload != BenchWorkload::Ledger {
            return Ok(());
        }
        let expected = ExpectedOutputs {
            records: target,
            exactly_once: run.guarantee == Guarantee::ExactlyOnce,
        };
        verify_outputs(
            &self.settings,
            &run.label,
            (&run.output, &run.dlq),
            &run.format,
            expected,
            self.options.stall_timeout,
        )
    }

    /// Samples the group's committed offsets until they reach `target` in total.
    fn follow_commits(
        &self,
        processes: &mut [ProcessorProcess],
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
            for process in processes.iter_mut() {
                process.ensure_running()?;
            }
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
                    processes
                        .iter()
                        .map(|process| process.log().display().to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
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
            flagged: (self.options.workload == BenchWorkload::CardAuthorisations)
                .then(|| self.name(&format!("{label}-flagged"))),
            group: self.name(label),
            format: RunFormat::Json,
        };
        // Recorded before the processor creates them, so that a failure still cleans them up.
        self.topics.extend(run.created_topics());
        self.groups.push(run.group.clone());
        run
    }

    fn spawn(&mut self, run: &ProcessorRun) -> anyhow::Result<ProcessorProcess> {
        self.spawn_instance(run, None)
    }

    /// One processor of `run`; `suffix` tells apart the instances of one group.
    fn spawn_instance(
        &mut self,
        run: &ProcessorRun,
        suffix: Option<&str>,
    ) -> anyhow::Result<ProcessorProcess> {
        self.processes_started += 1;
        let label = format!("{}{}", run.label, suffix.unwrap_or_default());
        let log = self
            .log_dir
            .join(format!("{:02}-{label}.log", self.processes_started));
        let mut args: Vec<String> = vec![
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
            format!("bench-{label}"),
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
            // Inside the log directory, so the stores go with it at the end.
            "--state-dir".into(),
            self.log_dir.join("state").display().to_string(),
        ];
        if let Some(transform) = &self.options.transform {
            args.extend(["--transform".into(), transform.clone()]);
        }
        args.extend(run.format.processor_args());
        if let Some(flagged) = &run.flagged {
            // Where card authorisations keep their id, card and time, and the flagged output
            // (card_workload::card_authorisations).
            args.extend(
                [
                    "--event-id",
                    "/auth_id",
                    "--entity",
                    "/card",
                    "--occurred-at",
                    "/at",
                    "--output",
                ]
                .map(String::from),
            );
            args.push(format!("flagged={flagged}"));
        }
        tracing::debug!(%label, log = %log.display(), ?args, "starting eos-processor");
        ProcessorProcess::spawn(
            &self.options.processor_bin,
            &args,
            &self.kafka_for_processors,
            log,
            &label,
        )
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
        let spec = self.workload_spec(count, value_bytes, seed);
        self.produce_spec(topic, spec, rate)
    }

    /// Writes the events `spec` makes (of the workload's kind) at `rate`.
    fn produce_spec(
        &mut self,
        topic: &str,
        spec: WorkloadSpec,
        rate: u64,
    ) -> anyhow::Result<ProduceSummary> {
        if !self.topics.iter().any(|t| t == topic) {
            self.topics.push(topic.to_owned());
        }
        if self.options.workload == BenchWorkload::CardAuthorisations {
            let records = card_workload::card_authorisations(
                spec.seed,
                spec.count,
                CARDS,
                spec.value_bytes,
                spec.occurred_at_base,
            );
            return self
                .write_records(topic, rate, spec.seed, records)
                .with_context(|| format!("producing card authorisations to topic {topic:?}"));
        }
        let options = self.produce_options(topic, spec, rate);
        self.runtime
            .block_on(produce::run(
                &self.settings,
                options,
                ProgressBar::hidden(),
                Arc::clone(&self.stop),
            ))
            .with_context(|| format!("producing to topic {topic:?}"))
    }

    /// Writes `records` (made with `seed`) at `rate` to `topic`, created first if need be.
    fn write_records(
        &self,
        topic: &str,
        rate: u64,
        seed: u64,
        records: Vec<GeneratedRecord>,
    ) -> anyhow::Result<ProduceSummary> {
        let layout = self.layout();
        let send = SendOptions {
            topic: topic.to_owned(),
            rate,
            delivery_timeout: DELIVERY_TIMEOUT,
        };
        self.runtime.block_on(async {
            ensure_topic(&self.settings, topic, layout).await?;
            produce::write_records(&self.settings, send, seed, records)
                .await
                .map_err(anyhow::Error::from)
        })
    }

    /// `count` valid, distinct events of `value_bytes` (no duplicates, malformed records or
    /// conflicts), occurring from now on.
    fn workload_spec(&self, count: u64, value_bytes: usize, seed: u64) -> WorkloadSpec {
        WorkloadSpec {
            seed,
            count,
            entities: ENTITIES,
            duplicate_ratio: 0.0,
            bad_ratio: 0.0,
            conflict_ratio: 0.0,
            value_bytes,
            occurred_at_base: OffsetDateTime::now_utc(),
        }
    }

    fn produce_options(&self, topic: &str, spec: WorkloadSpec, rate: u64) -> ProduceOptions {
        ProduceOptions {
            topic: topic.to_owned(),
            layout: self.layout(),
            rate,
            delivery_timeout: DELIVERY_TIMEOUT,
            spec,
        }
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
        format!("eos-lab-bench-{}-{what}", self.run_id)
    }
}

/// A size's figures from its rounds.
fn size_throughput(
    size: usize,
    summary: &ProduceSummary,
    rounds: RoundsOfSize,
    format_inputs: &[FormatInput],
) -> SizeThroughput {
    let bytes_per_record = mean_value_bytes(summary);
    let exactly_once = PathThroughput::new(
        WritePath::ExactlyOnce,
        rounds.exactly_once,
        bytes_per_record,
    );
    let at_least_once = PathThroughput::new(
        WritePath::AtLeastOnce,
        rounds.at_least_once,
        bytes_per_record,
    );
    let pass_through = PathThroughput::new(
        WritePath::PassThrough,
        rounds.pass_through,
        bytes_per_record,
    );
    let median_ratio = |over: &PathThroughput| {
        exactly_once
            .median_records_per_second
            .zip(over.median_records_per_second)
            .and_then(|(eo, other)| ratio(eo, other))
    };
    let ratio_eo_to_alo = median_ratio(&at_least_once);
    let ratio_eo_to_pass_through = median_ratio(&pass_through);
    let formats = format_inputs
        .iter()
        .zip(rounds.formats)
        .map(|(input, figures)| {
            FormatThroughput::new(input.format, figures, input.mean_value_bytes, &exactly_once)
        })
        .collect();
    let targeted = size >= RATIO_TARGET_MIN_BYTES;
    SizeThroughput {
        value_bytes: size,
        mean_value_bytes: bytes_per_record,
        records: summary.physical_records,
        exactly_once,
        at_least_once,
        pass_through,
        ratio_eo_to_alo,
        ratio_target: targeted.then_some(RATIO_TARGET),
        ratio_eo_to_pass_through,
        pass_through_ratio_target: targeted.then_some(PASS_THROUGH_RATIO_TARGET),
        formats,
    }
}

fn mean_value_bytes(summary: &ProduceSummary) -> f64 {
    ratio(summary.bytes as f64, summary.physical_records as f64).unwrap_or(0.0)
}

/// The 1-minute load average (the report keeps only that one).
fn load_average() -> Option<f64> {
    eos_testkit::bench_figures::load_average().map(|[one_minute, _, _]| one_minute)
}

/// eos-processor's counter of committed output records.
const RECORDS_OUT_METRIC: &str = "eos_processor_records_out_total";

/// The value of an unlabelled sample in Prometheus text format.
fn prometheus_value(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| {
            let (metric, value) = line.split_once(' ')?;
            (metric == name).then(|| value.trim().parse().ok())?
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prometheus_value_reads_the_named_sample_only() {
        let text = "# HELP eos_processor_records_out_total output records committed\n\
                    # TYPE eos_processor_records_out_total counter\n\
                    eos_processor_records_out_total_other 9\n\
                    eos_processor_records_out_total 1234\n";
        assert_eq!(prometheus_value(text, RECORDS_OUT_METRIC), Some(1234.0));
        assert_eq!(prometheus_value("", RECORDS_OUT_METRIC), None);
        assert_eq!(
            prometheus_value("eos_processor_records_in_total 5\n", RECORDS_OUT_METRIC),
            None
        );
    }
}
