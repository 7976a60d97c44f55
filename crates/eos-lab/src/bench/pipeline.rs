//! `eos-lab bench pipeline`: the whole chain as real child processes, with no faults — this
//! eos-lab's producer → eos-processor → sink-writer → its PostgreSQL tables, and sink-writer →
//! dedup-service → provider-sim for each event's charge.
//!
//! 1. Throughput, two chains in interleaved rounds (the order alternating): the tables alone, and
//!    the tables with the provider charge. Each run is a fresh processor and sink-writer on fresh
//!    topics (dedup-service and provider-sim live for the whole benchmark); after a warm-up batch
//!    has gone all the way through, `--records` events are written as fast as the broker takes
//!    them, and the run is timed from the first send to the commit of the last row. What the
//!    chain holds then is checked: one row per event, and in the charged chain one settled
//!    intent per event.
//! 2. End-to-end latency of the charged chain at half its median rate: each event from its input
//!    record's Kafka timestamp to the commit of the sink transaction that wrote its row. The
//!    sink's checkpoint commits with its rows, so the first poll of `sink_checkpoints` (every
//!    [`VISIBILITY_POLL`]) that shows the partition past the event's output offset is when the
//!    event became visible in PostgreSQL; the output topic names each output's input record. A
//!    run in which the chain falls behind measures a queue and is repeated at half the rate.
//!
//! Everything the benchmark creates (topics, groups, its database, its directory of logs) is
//! removed at the end unless `--keep`, and kept when it fails.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use eos_runtime::kafka_settings::ChildKafkaProperties;
use eos_runtime::postgres_pool::PoolBuilder;
use eos_testkit::bench_figures::{Figure, load_average, load_text};
use indicatif::ProgressBar;
use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use serde::Serialize;
use sqlx::PgPool;
use time::OffsetDateTime;
use tokio::task::JoinHandle;

use crate::bench::figures::{LatencySummary, LatencyTrend, without_ramp_up};
use crate::bench::latency_collector::{LATENCY_RETRIES, PRODUCER_RAMP_UP};
use crate::bench::latency_collector::{OutputSource, now_ms};
use crate::bench::run_id::seed_base_and_id;
use crate::chain::service::{Service, wait_listening};
use crate::chain::{ProviderTarget, create_database, drop_database, sink_targets};
use crate::cli::PipelineBenchArgs;
use eos_testkit::loopback_ports::free_loopback_addr;
use eosctl::kafka_client::{ClusterAccess as _, KafkaSettings, TopicLayout, ensure_topic};
use eosctl::produce::{self, ProduceOptions, ProduceSummary};
use eosctl::report::grouped;
use eosctl::topic_reader::read_topics;
use eosctl::workload::WorkloadSpec;

/// How often the sink's checkpoints are read in the latency run: the latency figures are late by
/// up to this much.
pub const VISIBILITY_POLL: Duration = Duration::from_millis(20);
/// How often the row count is read in the throughput rounds.
const COUNT_POLL: Duration = Duration::from_millis(50);
/// Events sent through a fresh chain before measuring, so that its start-up (joining groups,
/// the first transactions, connection pools) is not measured.
const WARMUP_EVENTS: u64 = 200;
/// The sink's --batch-interval (its default, named here because the latency run's queue check
/// counts it).
const SINK_BATCH_INTERVAL: Duration = Duration::from_millis(100);
const READY_TIMEOUT: Duration = Duration::from_secs(60);
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(120);
const ADMIN_TIMEOUT: Duration = Duration::from_secs(30);
const END_TIMEOUT: Duration = Duration::from_secs(60);
const ENTITIES: u32 = 100;

/// Which sink targets a chain writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Targets {
    /// `event_sink` and `entity_state`.
    Tables,
    /// The tables, and one charge per event through dedup-service at provider-sim.
    TablesAndCharge,
    /// The same charge through a `kind = "http"` target that spells the request out.
    TablesAndHttpCharge,
}

impl Targets {
    fn label(self) -> &'static str {
        match self {
            Self::Tables => "tables",
            Self::TablesAndCharge => "charged",
            Self::TablesAndHttpCharge => "http-charged",
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct PipelineReport {
    pub records: u64,
    pub value_bytes: usize,
    pub partitions: i32,
    pub commit_interval_ms: u64,
    /// The provider target's `concurrency` in the charged chain.
    pub provider_concurrency: u64,
    pub rounds: u32,
    pub bin_dir: String,
    /// The services were debug builds (their figures mean little).
    pub debug_build: bool,
    pub cores: usize,
    pub load_before: Option<[f64; 3]>,
    /// Events per second, producer to committed row, with the tables alone.
    pub tables: Figure,
    /// ... with the tables and the provider charge.
    pub charged: Figure,
    /// Per round, charged ÷ tables: what the charge through dedup-service costs.
    pub charged_vs_tables: Figure,
    /// ... with the tables and the same charge as an `http` target.
    pub http_charged: Figure,
    /// Per round, http-charged ÷ charged: what the generic target costs against `provider`.
    pub http_vs_provider: Figure,
    pub latency: Vec<PipelineLatency>,
}

#[derive(Debug, Clone, Serialize)]
pub struct PipelineLatency {
    pub rate: u64,
    pub seconds: u64,
    pub events: u64,
    /// Sent within the producer's ramp-up, or whose output could not be matched: not measured.
    pub unmeasured: u64,
    pub poll_interval_ms: u64,
    pub summary: Option<LatencySummary>,
    pub trend: Option<LatencyTrend>,
}

impl PipelineReport {
    pub fn table(&self) -> String {
        use std::fmt::Write as _;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "pipeline bench: producer -> eos-processor -> sink-writer -> PostgreSQL (+ dedup-service \
             -> provider-sim); {} events of ~{} bytes per round, {} partitions, commit interval {} \
             ms, provider concurrency {}, {} interleaved rounds; {} cores, load before {}",
            grouped(self.records as i64),
            self.value_bytes,
            self.partitions,
            self.commit_interval_ms,
            self.provider_concurrency,
            self.rounds,
            self.cores,
            load_text(self.load_before)
        );
        if self.debug_build {
            let _ = writeln!(
                out,
                "  WARNING: debug builds of the services; use cargo build --release"
            );
        }
        let _ = writeln!(
            out,
            "  {:<47} {:>10} {:>15}  per round",
            "figure", "median", "spread"
        );
        for (name, figure, digits) in [
            ("tables: events/s producer -> row", &self.tables, 0),
            (
                "tables + charge: events/s producer -> row",
                &self.charged,
                0,
            ),
            ("  charged ÷ tables", &self.charged_vs_tables, 2),
            (
                "tables + http target: events/s producer -> row",
                &self.http_charged,
                0,
            ),
            ("  http target ÷ provider target", &self.http_vs_provider, 2),
        ] {
            let (median, spread, rounds) = figure.text(digits);
            let _ = writeln!(out, "  {name:<47} {median:>10} {spread:>15}  [{rounds}]");
        }
        for run in &self.latency {
            let figures = match (&run.summary, &run.trend) {
                (Some(summary), Some(trend)) => format!(
                    "p50 {} ms, p99 {} ms, max {} ms over {} events{}",
                    grouped(summary.p50_ms as i64),
                    grouped(summary.p99_ms as i64),
                    grouped(summary.max_ms as i64),
                    grouped(summary.samples as i64),
                    if trend.kept_up {
                        String::new()
                    } else {
                        format!(
                            "; FELL BEHIND (a queue: p50 {} ms in the first quarter, {} ms in \
                             the last)",
                            trend.first_quarter_p50_ms, trend.last_quarter_p50_ms
                        )
                    }
                ),
                _ => "too few events to measure".to_owned(),
            };
            let _ = writeln!(
                out,
                "  latency, input record -> committed row (charged) at {}/s for {} s: {figures} \
                 (checkpoints polled every {} ms)",
                grouped(run.rate as i64),
                run.seconds,
                run.poll_interval_ms
            );
        }
        out
    }
}

/// Runs the benchmark; SIGINT/SIGTERM stop it early, still cleaning up.
pub async fn run(kafka: KafkaSettings, args: PipelineBenchArgs) -> anyhow::Result<PipelineReport> {
    let load_before = load_average();
    let bin_dir = match &args.bin_dir {
        Some(dir) => dir.clone(),
        None => std::env::current_exe()
            .context("locating eos-lab")?
            .parent()
            .context("eos-lab has no directory")?
            .to_path_buf(),
    };
    for binary in [
        "eos-processor",
        "sink-writer",
        "dedup-service",
        "provider-sim",
    ] {
        if !bin_dir.join(binary).is_file() {
            bail!(
                "{} is missing: cargo build --release, or point --bin-dir at the binaries",
                bin_dir.join(binary).display()
            );
        }
    }
    let mut bench = Bench::start(kafka, &args, bin_dir, load_before).await?;
    let outcome = tokio::select! {
        outcome = bench.measure() => outcome,
        () = eos_runtime::shutdown::wait_for_signal() => Err(anyhow::anyhow!("interrupted")),
    };
    let keep = args.keep || outcome.is_err();
    if let Err(error) = bench.finish(keep).await {
        tracing::warn!(
            error = format!("{error:#}"),
            "cleaning up after the benchmark"
        );
    }
    if outcome.is_err() {
        eprintln!(
            "the benchmark failed; its database {}, topics and logs in {} are kept",
            bench.database,
            bench.dir.display()
        );
    }
    outcome
}

/// The topics, groups and processes of one chain.
struct Chain {
    targets: Targets,
    input: String,
    output: String,
    sink_group: String,
    processor: Service,
    sink: Service,
    /// The provider target's name: the prefix of its operation ids at dedup-service.
    provider_name: String,
}

struct Bench {
    kafka: KafkaSettings,
    args: PipelineBenchArgs,
    bin_dir: PathBuf,
    load_before: Option<[f64; 3]>,
    run_id: String,
    seed_base: u64,
    dir: PathBuf,
    kafka_for_services: Arc<ChildKafkaProperties>,
    database: String,
    database_url: String,
    pool: PgPool,
    provider: Service,
    provider_url: String,
    dedup: Service,
    dedup_url: String,
    /// Every topic and group a chain created, to delete at the end.
    topics: Vec<String>,
    groups: Vec<String>,
    chains_started: u64,
}

impl Bench {
    async fn start(
        kafka: KafkaSettings,
        args: &PipelineBenchArgs,
        bin_dir: PathBuf,
        load_before: Option<[f64; 3]>,
    ) -> anyhow::Result<Self> {
        let (seed_base, run_id) = seed_base_and_id();
        let dir = std::env::temp_dir().join(format!("eos-lab-bench-pipeline-{run_id}"));
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create the run directory {}", dir.display()))?;
        let kafka_for_services = Arc::new(
            kafka
                .write_for_children(&dir.join("kafka-client.properties"))
                .context("writing the Kafka properties for the services")?,
        );
        let database = format!("eos_bench_pipeline_{run_id}");
        let database_url = create_database(&args.database_url, &database).await?;
        let pool = PoolBuilder::new(2)
            .connect(&database_url)
            .await
            .with_context(|| format!("connecting to the benchmark's database {database}"))?;

        let provider_addr = free_loopback_addr()?;
        let mut provider = Service::new(
            "provider-sim",
            &bin_dir,
            &dir,
            strings(&["--addr", &provider_addr.to_string(), "--seed", "1"]),
            provider_addr,
        );
        let provider_url = format!("http://{provider_addr}");
        provider.start()?;
        wait_listening(&mut provider, provider_addr).await?;
        let dedup_addr = free_loopback_addr()?;
        let ops = free_loopback_addr()?;
        let mut dedup = Service::new(
            "dedup-service",
            &bin_dir,
            &dir,
            strings(&[
                "--listen",
                &dedup_addr.to_string(),
                "--provider-url",
                &provider_url,
                "--metrics-addr",
                &ops.to_string(),
            ]),
            ops,
        )
        .with_env("DATABASE_URL", &database_url);
        dedup.start()?;
        wait_listening(&mut dedup, dedup_addr).await?;
        Ok(Self {
            kafka,
            args: args.clone(),
            bin_dir,
            load_before,
            run_id,
            seed_base,
            dir,
            kafka_for_services,
            database,
            database_url,
            pool,
            provider,
            provider_url,
            dedup,
            dedup_url: format!("http://{dedup_addr}"),
            topics: Vec::new(),
            groups: Vec::new(),
            chains_started: 0,
        })
    }

    async fn measure(&mut self) -> anyhow::Result<PipelineReport> {
        let mut rates: BTreeMap<&'static str, Vec<f64>> = BTreeMap::new();
        for round in 0..self.args.rounds {
            // Each kind goes first in turn, so a drift of the machine is spread over all three.
            let mut order = [
                Targets::Tables,
                Targets::TablesAndCharge,
                Targets::TablesAndHttpCharge,
            ];
            order.rotate_left(round as usize % 3);
            for targets in order {
                let rate = self.throughput_run(targets).await?;
                eprintln!(
                    "round {}: {} {} events/s",
                    round + 1,
                    targets.label(),
                    grouped(rate as i64)
                );
                rates.entry(targets.label()).or_default().push(rate);
            }
        }
        let tables = rates.remove(Targets::Tables.label()).unwrap_or_default();
        let charged = rates
            .remove(Targets::TablesAndCharge.label())
            .unwrap_or_default();
        let http_charged = rates
            .remove(Targets::TablesAndHttpCharge.label())
            .unwrap_or_default();
        let charged_figure = Figure::new(charged.clone());
        let latency = if self.args.latency_seconds > 0 {
            let rate = self
                .args
                .latency_rate
                .unwrap_or_else(|| (charged_figure.median / 2.0).max(1.0) as u64);
            self.latency_runs(rate).await?
        } else {
            Vec::new()
        };
        Ok(PipelineReport {
            records: self.args.records,
            value_bytes: self.args.value_bytes,
            partitions: self.args.partitions,
            commit_interval_ms: self.args.commit_interval.as_millis() as u64,
            provider_concurrency: self
                .args
                .provider_concurrency
                .unwrap_or(sink_writer::targets::DEFAULT_PROVIDER_CONCURRENCY as u64),
            rounds: self.args.rounds,
            bin_dir: self.bin_dir.display().to_string(),
            debug_build: is_debug_build(&self.bin_dir),
            cores: std::thread::available_parallelism().map_or(0, usize::from),
            load_before: self.load_before,
            charged_vs_tables: Figure::ratio(&charged, &tables),
            http_vs_provider: Figure::ratio(&http_charged, &charged),
            http_charged: Figure::new(http_charged),
            tables: Figure::new(tables),
            charged: charged_figure,
            latency,
        })
    }

    /// One throughput run on a fresh chain: events per second from the first send to the commit
    /// of the last row.
    async fn throughput_run(&mut self, targets: Targets) -> anyhow::Result<f64> {
        let mut chain = self.start_chain(targets).await?;
        let outcome = async {
            let records = self.args.records;
            let started = Instant::now();
            let mut producer = self.spawn_producer(&chain, records, 0);
            let elapsed = self
                .wait_for_rows(&mut chain, WARMUP_EVENTS + records, &mut producer)
                .await?
                .duration_since(started);
            producer.finish().await?;
            self.check_charges(&chain, WARMUP_EVENTS + records).await?;
            Ok(records as f64 / elapsed.as_secs_f64())
        }
        .await;
        self.stop_chain(chain).await?;
        outcome
    }

    /// Latency runs on one charged chain: at `rate`, and while the chain falls behind (and the
    /// rate was not given), again at half the rate.
    async fn latency_runs(&mut self, mut rate: u64) -> anyhow::Result<Vec<PipelineLatency>> {
        let mut chain = self.start_chain(Targets::TablesAndCharge).await?;
        let mut runs = Vec::new();
        let outcome = async {
            let mut expected = WARMUP_EVENTS;
            for attempt in 0..=LATENCY_RETRIES {
                let run = self.latency_run(&mut chain, rate, &mut expected).await?;
                let kept_up = run.trend.as_ref().is_none_or(|trend| trend.kept_up);
                runs.push(run);
                if kept_up || self.args.latency_rate.is_some() || attempt == LATENCY_RETRIES {
                    break;
                }
                rate = (rate / 2).max(1);
            }
            anyhow::Ok(())
        }
        .await;
        self.stop_chain(chain).await?;
        outcome?;
        Ok(runs)
    }

    async fn latency_run(
        &mut self,
        chain: &mut Chain,
        rate: u64,
        expected: &mut u64,
    ) -> anyhow::Result<PipelineLatency> {
        let events = rate * self.args.latency_seconds;
        let from = self.input_ends(&chain.input).await?;
        let poller = CheckpointPoller::start(self.pool.clone(), &chain.sink_group, &chain.output);
        let mut producer = self.spawn_producer(chain, events, rate);
        *expected += events;
        let waited = self.wait_for_rows(chain, *expected, &mut producer).await;
        let visible = poller.finish().await;
        waited?;
        producer.finish().await?;
        let visible = visible?;
        let snapshots = {
            let kafka = self.kafka.clone();
            let topics = [chain.input.clone(), chain.output.clone()];
            tokio::task::spawn_blocking(move || {
                let names = [topics[0].as_str(), topics[1].as_str()];
                read_topics(&kafka, &names, END_TIMEOUT, &mut |_| {})
            })
            .await
            .context("the topic reader task")?
            .context("reading the input and output topics")?
        };
        let sent_at: HashMap<(i32, i64), i64> = snapshots[0]
            .records
            .iter()
            .filter(|record| record.offset >= from.get(&record.partition).copied().unwrap_or(0))
            .filter_map(|record| Some(((record.partition, record.offset), record.timestamp_ms?)))
            .collect();
        let mut samples = Vec::with_capacity(sent_at.len());
        for record in &snapshots[1].records {
            let Some(source) = record
                .value
                .as_deref()
                .and_then(|value| serde_json::from_slice::<OutputSource>(value).ok())
                .map(|output| output.source)
            else {
                continue;
            };
            let Some(&sent_ms) = sent_at.get(&(source.partition, source.offset)) else {
                continue;
            };
            if let Some(visible_ms) = visible.first_past(record.partition, record.offset) {
                samples.push((sent_ms, visible_ms - sent_ms));
            }
        }
        let samples = without_ramp_up(samples, PRODUCER_RAMP_UP.as_millis() as i64);
        let queue_check_interval = self.args.commit_interval + SINK_BATCH_INTERVAL;
        Ok(PipelineLatency {
            rate,
            seconds: self.args.latency_seconds,
            events,
            unmeasured: events.saturating_sub(samples.len() as u64),
            poll_interval_ms: VISIBILITY_POLL.as_millis() as u64,
            summary: LatencySummary::from_millis(samples.iter().map(|&(_, latency)| latency)),
            trend: LatencyTrend::from_samples(samples, queue_check_interval.as_millis() as u64),
        })
    }

    /// A fresh processor and sink-writer on fresh topics, ready, with a warm-up batch of events
    /// already through.
    async fn start_chain(&mut self, targets: Targets) -> anyhow::Result<Chain> {
        self.chains_started += 1;
        let label = format!("{:02}-{}", self.chains_started, targets.label());
        let name = |what: &str| format!("eos-lab-bench-pipeline-{}-{label}-{what}", self.run_id);
        let (input, output) = (name("in"), name("out"));
        let (dlq, changelog, sink_dlq) =
            (name("dlq"), name("changelog"), format!("{output}.sink-dlq"));
        let (processor_group, sink_group) = (name("processor"), name("sink"));
        // Recorded before anything creates them, so that a failure still cleans them up.
        self.topics.extend([
            input.clone(),
            output.clone(),
            dlq.clone(),
            changelog.clone(),
            sink_dlq,
        ]);
        self.groups
            .extend([processor_group.clone(), sink_group.clone()]);
        let layout = TopicLayout {
            partitions: self.args.partitions,
            replication_factor: -1,
        };
        for topic in [&input, &output] {
            ensure_topic(&self.kafka, topic, layout)
                .await
                .with_context(|| format!("creating topic {topic}"))?;
        }
        // Each chain counts its own rows.
        sqlx::query("TRUNCATE event_sink, entity_state")
            .execute(&self.pool)
            .await
            .ok();

        let provider_name = format!("bench_{}_{}", self.run_id, self.chains_started);
        let targets_path = self.dir.join(format!("{label}-targets.toml"));
        let provider = ProviderTarget {
            name: &provider_name,
            dedup_url: &self.dedup_url,
            provider_url: &self.provider_url,
            concurrency: self.args.provider_concurrency,
            as_http: targets == Targets::TablesAndHttpCharge,
        };
        std::fs::write(
            &targets_path,
            sink_targets(
                "eos-lab bench pipeline",
                (targets != Targets::Tables).then_some(&provider),
            ),
        )?;
        let bootstrap = self.kafka.bootstrap_servers.clone();
        let ops = free_loopback_addr()?;
        let mut processor = Service::new(
            "eos-processor",
            &self.bin_dir,
            &self.dir,
            strings(&[
                "--bootstrap-servers",
                &bootstrap,
                "--input-topic",
                &input,
                "--output-topic",
                &output,
                "--dlq-topic",
                &dlq,
                "--changelog-topic",
                &changelog,
                "--group-id",
                &processor_group,
                "--instance-id",
                &format!("bench-{label}"),
                "--commit-interval",
                &humantime::format_duration(self.args.commit_interval).to_string(),
                "--partitions",
                &self.args.partitions.to_string(),
                "--metrics-addr",
                &ops.to_string(),
                "--state-dir",
                &self.dir.join("state").display().to_string(),
            ]),
            ops,
        )
        .with_log_name(&format!("{label}-eos-processor"))
        .with_kafka_properties(&self.kafka_for_services);
        let ops = free_loopback_addr()?;
        let mut sink = Service::new(
            "sink-writer",
            &self.bin_dir,
            &self.dir,
            strings(&[
                "--bootstrap-servers",
                &bootstrap,
                "--topic",
                &output,
                "--group-id",
                &sink_group,
                "--instance-id",
                &format!("bench-{label}"),
                "--config",
                &targets_path.display().to_string(),
                "--batch-interval",
                &humantime::format_duration(SINK_BATCH_INTERVAL).to_string(),
                "--metrics-addr",
                &ops.to_string(),
            ]),
            ops,
        )
        .with_log_name(&format!("{label}-sink-writer"))
        .with_env("DATABASE_URL", &self.database_url)
        .with_kafka_properties(&self.kafka_for_services);
        processor.start()?;
        sink.start()?;
        let mut chain = Chain {
            targets,
            input,
            output,
            sink_group,
            processor,
            sink,
            provider_name,
        };
        for service in [&mut chain.processor, &mut chain.sink] {
            if !service.wait_ready(READY_TIMEOUT).await? {
                bail!(
                    "{} was not ready within {READY_TIMEOUT:?}; log: {}",
                    service.name,
                    service.log.display()
                );
            }
        }
        let mut warmup = self.spawn_producer(&chain, WARMUP_EVENTS, 0);
        self.wait_for_rows(&mut chain, WARMUP_EVENTS, &mut warmup)
            .await?;
        warmup.finish().await?;
        Ok(chain)
    }

    async fn stop_chain(&mut self, mut chain: Chain) -> anyhow::Result<()> {
        for service in [&mut chain.sink, &mut chain.processor] {
            if !service.stop().await? {
                tracing::warn!(
                    service = service.name,
                    log = %service.log.display(),
                    "did not exit 0 on SIGTERM"
                );
            }
        }
        Ok(())
    }

    /// Writes `count` distinct, valid events to the chain's input at `rate` (0: as fast as the
    /// broker takes them), each producer with seeds of its own so event ids never repeat.
    fn spawn_producer(&mut self, chain: &Chain, count: u64, rate: u64) -> ProducerTask {
        self.seed_base += 1;
        let options = ProduceOptions {
            topic: chain.input.clone(),
            layout: TopicLayout {
                partitions: self.args.partitions,
                replication_factor: -1,
            },
            rate,
            delivery_timeout: DELIVERY_TIMEOUT,
            spec: WorkloadSpec {
                seed: self.seed_base,
                count,
                entities: ENTITIES,
                duplicate_ratio: 0.0,
                bad_ratio: 0.0,
                conflict_ratio: 0.0,
                value_bytes: self.args.value_bytes,
                occurred_at_base: OffsetDateTime::now_utc(),
            },
        };
        let kafka = self.kafka.clone();
        let task = tokio::spawn(async move {
            produce::run(
                &kafka,
                options,
                ProgressBar::hidden(),
                Arc::new(AtomicBool::new(false)),
            )
            .await
        });
        ProducerTask {
            task: Some(task),
            topic: chain.input.clone(),
        }
    }

    /// Waits until `event_sink` holds `expected` rows; the moment it saw them. Fails when a
    /// service exits, the producer fails, or no row is committed for the stall timeout.
    async fn wait_for_rows(
        &mut self,
        chain: &mut Chain,
        expected: u64,
        producer: &mut ProducerTask,
    ) -> anyhow::Result<Instant> {
        let mut last = (0, Instant::now());
        loop {
            let rows = count_rows(&self.pool).await?;
            let now = Instant::now();
            if rows >= expected {
                return Ok(now);
            }
            if rows != last.0 {
                last = (rows, now);
            } else if now.duration_since(last.1) >= self.args.stall_timeout {
                bail!(
                    "{} of {expected} rows after no progress for {}; logs: {} and {}",
                    rows,
                    humantime::format_duration(self.args.stall_timeout),
                    chain.processor.log.display(),
                    chain.sink.log.display()
                );
            }
            producer.check().await?;
            for service in [
                &mut chain.processor,
                &mut chain.sink,
                &mut self.dedup,
                &mut self.provider,
            ] {
                service.check_running()?;
            }
            tokio::time::sleep(COUNT_POLL).await;
        }
    }

    /// In the charged chains, every event's charge settled once at dedup-service.
    async fn check_charges(&self, chain: &Chain, expected: u64) -> anyhow::Result<()> {
        if chain.targets == Targets::Tables {
            return Ok(());
        }
        let settled: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM dedup_intents WHERE operation_id LIKE $1 AND state = 'SUCCEEDED'",
        )
        .bind(format!("{}:%", chain.provider_name))
        .fetch_one(&self.pool)
        .await
        .context("counting the settled charges")?;
        if settled as u64 != expected {
            bail!(
                "{expected} rows were committed but {settled} charges settled; sink log: {}",
                chain.sink.log.display()
            );
        }
        Ok(())
    }

    async fn input_ends(&self, topic: &str) -> anyhow::Result<BTreeMap<i32, i64>> {
        let kafka = self.kafka.clone();
        let topic = topic.to_owned();
        tokio::task::spawn_blocking(move || {
            let metadata = kafka.metadata_client()?;
            let partitions = eosctl::kafka_client::topic_partitions(&metadata, &kafka, &topic)?
                .with_context(|| format!("topic {topic:?} disappeared"))?;
            let ends = eosctl::group_offsets::watermarks(&kafka, &metadata, &topic, &partitions)?;
            anyhow::Ok(ends.into_iter().map(|(p, (_, end))| (p, end)).collect())
        })
        .await
        .context("the watermark task")?
    }

    /// Stops the services and, unless `keep`, deletes the topics, groups, database and run
    /// directory.
    async fn finish(&mut self, keep: bool) -> anyhow::Result<()> {
        self.dedup.stop().await.ok();
        self.provider.stop().await.ok();
        self.pool.close().await;
        if keep {
            return Ok(());
        }
        let admin: AdminClient<DefaultClientContext> = self
            .kafka
            .client_config()
            .create()
            .context("cannot create a Kafka admin client")?;
        let options = AdminOptions::new().operation_timeout(Some(ADMIN_TIMEOUT));
        let topics: Vec<&str> = self.topics.iter().map(String::as_str).collect();
        if !topics.is_empty() {
            admin
                .delete_topics(&topics, &options)
                .await
                .context("deleting the benchmark's topics")?;
        }
        // Static members keep a group non-empty until their session expires; such a group is
        // left to the broker's offset retention.
        let groups: Vec<&str> = self.groups.iter().map(String::as_str).collect();
        if !groups.is_empty() {
            admin.delete_groups(&groups, &options).await.ok();
        }
        drop_database(&self.args.database_url, &self.database).await?;
        std::fs::remove_dir_all(&self.dir)
            .with_context(|| format!("removing {}", self.dir.display()))?;
        Ok(())
    }
}

async fn count_rows(pool: &PgPool) -> anyhow::Result<u64> {
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM event_sink")
        .fetch_one(pool)
        .await
        .context("counting the sink's rows")?;
    Ok(rows as u64)
}

/// A producer writing a chain's input in the background.
struct ProducerTask {
    task: Option<JoinHandle<Result<ProduceSummary, produce::ProduceError>>>,
    topic: String,
}

impl ProducerTask {
    /// Fails once the producer has failed; Ok while it runs or after it succeeded.
    async fn check(&mut self) -> anyhow::Result<()> {
        if self.task.as_ref().is_some_and(JoinHandle::is_finished) {
            self.finish().await?;
        }
        Ok(())
    }

    /// Waits for the producer to finish.
    async fn finish(&mut self) -> anyhow::Result<()> {
        if let Some(task) = self.task.take() {
            task.await
                .context("the producer task")?
                .with_context(|| format!("producing to topic {:?}", self.topic))?;
        }
        Ok(())
    }
}

/// When each output partition's checkpoint moved: `(seen at, next offset)` in time order.
#[derive(Debug, Default)]
struct CheckpointHistory {
    by_partition: HashMap<i32, Vec<(i64, i64)>>,
}

impl CheckpointHistory {
    fn observe(&mut self, seen_ms: i64, partition: i32, next_offset: i64) {
        let history = self.by_partition.entry(partition).or_default();
        if history.last().is_none_or(|&(_, last)| next_offset > last) {
            history.push((seen_ms, next_offset));
        }
    }

    /// When the record at `offset` was first seen committed: the first sample past it.
    fn first_past(&self, partition: i32, offset: i64) -> Option<i64> {
        let history = self.by_partition.get(&partition)?;
        let index = history.partition_point(|&(_, next)| next <= offset);
        history.get(index).map(|&(seen_ms, _)| seen_ms)
    }
}

/// Reads the sink's checkpoints of one topic every [`VISIBILITY_POLL`] until finished.
struct CheckpointPoller {
    stop: Arc<AtomicBool>,
    task: JoinHandle<anyhow::Result<CheckpointHistory>>,
}

impl CheckpointPoller {
    fn start(pool: PgPool, sink: &str, topic: &str) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let (sink, topic) = (sink.to_owned(), topic.to_owned());
        let task = {
            let stop = Arc::clone(&stop);
            tokio::spawn(async move {
                let mut history = CheckpointHistory::default();
                let mut ticks = tokio::time::interval(VISIBILITY_POLL);
                while !stop.load(Ordering::Relaxed) {
                    ticks.tick().await;
                    let rows: Vec<(i32, Option<i64>)> = sqlx::query_as(
                        "SELECT partition, next_offset FROM sink_checkpoints
                          WHERE sink = $1 AND topic = $2",
                    )
                    .bind(&sink)
                    .bind(&topic)
                    .fetch_all(&pool)
                    .await
                    .context("reading the sink's checkpoints")?;
                    let seen_ms = now_ms();
                    for (partition, next_offset) in rows {
                        if let Some(next_offset) = next_offset {
                            history.observe(seen_ms, partition, next_offset);
                        }
                    }
                }
                Ok(history)
            })
        };
        Self { stop, task }
    }

    async fn finish(self) -> anyhow::Result<CheckpointHistory> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.context("the checkpoint poller")?
    }
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| (*s).to_owned()).collect()
}

/// Whether the binaries are a debug build: cargo puts those under `target/debug`.
fn is_debug_build(bin_dir: &Path) -> bool {
    bin_dir.components().any(|part| part.as_os_str() == "debug")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_is_visible_at_the_first_checkpoint_past_it() {
        let mut history = CheckpointHistory::default();
        history.observe(1_000, 0, 10);
        history.observe(1_020, 0, 10); // unchanged: not a new sample
        history.observe(1_040, 0, 25);
        history.observe(1_020, 1, 3);
        assert_eq!(history.first_past(0, 0), Some(1_000));
        assert_eq!(history.first_past(0, 9), Some(1_000));
        assert_eq!(history.first_past(0, 10), Some(1_040));
        assert_eq!(history.first_past(0, 24), Some(1_040));
        assert_eq!(history.first_past(0, 25), None, "not committed yet");
        assert_eq!(history.first_past(1, 2), Some(1_020));
        assert_eq!(history.first_past(2, 0), None, "a partition never seen");
    }
}
