//! `eos-lab bench relay`: the relay's figures, printed, not asserted.
//!
//! - Throughput: the relay publishing a backlog of 1 KB events (exactly-once, in transactions)
//!   ÷ a plain idempotent producer sending the same records to the same broker, in interleaved
//!   rounds so drift hits both alike. Target ≥ 0.6 in every round.
//! - Commit-to-visible latency at half the relay's peak: from a domain transaction's commit
//!   returning to the record reaching a `read_committed` consumer, p50 and p99. Target p99 ≤
//!   100 ms.
//! - With `--blocker <duration>`, instead: commit-to-visible of both relay modes side by side
//!   while a write transaction stays open in another database (`super::relay_staleness`).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Args;
use eos_runtime::postgres_pool::PoolBuilder;
use rdkafka::ClientConfig;
use rdkafka::producer::{BaseRecord, Producer as _, ThreadedProducer};
use serde::Serialize;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use eos_core::{EntityId, EventId, Guarantee};
use eos_outbox::OutboxEvent;
use eos_outbox::relay_positions::relayed_position;
use eos_runtime::kafka_clients::{self};
use eos_runtime::kafka_settings::KafkaSettings;
use eos_testkit::bench_figures::{Figure, load_average, load_text};

use outbox_relay::relay_loop::RelaySettings;

use crate::bench::relay_in_process::spawn_relay;
use crate::bench::visibility_reader::VisibilityReader;

/// Prints the relay's throughput against a plain producer, and its commit-to-visible latency.
/// Use a scratch database: the bench empties the outbox tables.
#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// A scratch PostgreSQL database (the outbox tables are emptied).
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: String,

    /// Events per throughput run. The plain producer sends 200,000 in under a second; with far
    /// fewer its connection and first batches are most of its time, and the ratio flatters the
    /// relay (docs/BENCHMARKS.md, outbox-relay).
    #[arg(long, default_value_t = 200_000)]
    pub events: usize,

    /// Size of each record value in bytes (about).
    #[arg(long, default_value_t = 1024)]
    pub record_bytes: usize,

    /// Rows per relay transaction (outbox-relay's default).
    #[arg(long, default_value_t = 5000)]
    pub batch_size: i64,

    /// Interleaved throughput rounds; the figure is the median.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,

    /// How long the latency run writes, at half the relay's measured peak.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub latency_run: Duration,

    /// Instead of the runs above: hold a write transaction open in another database of the
    /// server for this long, and print commit → visible p50/p99 of the xmin and logical modes
    /// side by side, each relay publishing its own outbox meanwhile (the server needs
    /// wal_level=logical, the role REPLICATION and CREATEDB).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub blocker: Option<Duration>,

    /// Events per second committed into each mode's outbox during --blocker.
    #[arg(long, default_value_t = 100.0)]
    pub staleness_rate: f64,

    /// Instead of the runs above: run the `outbox-relay` binary in this mode as users do, and
    /// print its drain of an --events backlog and its cost at each --steady-rates, PostgreSQL's
    /// backends counted (the server needs wal_level=logical for `logical`).
    #[arg(long, value_enum)]
    pub process: Option<super::relay_process::ProcessMode>,

    /// The outbox-relay binary for --process (default: the one next to eos-lab).
    #[arg(long)]
    pub relay_bin: Option<std::path::PathBuf>,

    /// Rows/s the writers commit, in transactions of 5 rows, for each steady run of --process.
    #[arg(long, value_delimiter = ',', default_value = "1000,5000")]
    pub steady_rates: Vec<f64>,

    /// How long each steady run of --process writes.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub steady_run: Duration,
}

/// What `eos-lab bench relay` measured: the throughput and latency runs, or, with `--blocker`,
/// the staleness run.
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum RelayBench {
    Throughput(Box<RelayBenchReport>),
    Staleness(super::relay_staleness::StalenessReport),
    Process(super::relay_process::RelayProcessReport),
}

impl RelayBench {
    pub fn table(&self) -> String {
        match self {
            Self::Throughput(report) => report.table(),
            Self::Staleness(report) => report.table(),
            Self::Process(report) => report.table(),
        }
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

fn event(topic: &str, id: &str, n: usize, filler: &str) -> anyhow::Result<OutboxEvent> {
    let mut event = OutboxEvent::new(
        topic,
        EventId::new(id)?,
        EntityId::new(format!("acct-{}", n % 500))?,
        1 + n as i64,
    );
    event.payload = Some(serde_json::json!({ "filler": filler }));
    Ok(event)
}

/// A plain idempotent producer sending `count` records of the envelope's size: the broker's own
/// rate on this machine, for the ratio.
fn plain_producer_rate(
    args: &BenchArgs,
    kafka: &ClientConfig,
    topic: &str,
    filler: &str,
) -> anyhow::Result<f64> {
    let producer: ThreadedProducer<rdkafka::producer::DefaultProducerContext> =
        kafka_clients::idempotent_producer(kafka)
            .set("linger.ms", "5")
            .create()?;
    let values: Vec<(String, Vec<u8>)> = (0..args.events)
        .map(|n| {
            let value = serde_json::json!({
                "event_id": format!("plain-{n}"), "entity_id": format!("acct-{}", n % 500),
                "value": 1 + n, "payload": { "filler": filler },
            });
            (format!("acct-{}", n % 500), value.to_string().into_bytes())
        })
        .collect();
    let started = Instant::now();
    for (key, value) in &values {
        let record = BaseRecord::<str, [u8]>::to(topic).key(key).payload(value);
        #[expect(
            clippy::result_large_err,
            reason = "rdkafka's send hands the record back inside its error"
        )]
        let sent = eos_runtime::backoff::send_when_queue_has_room(
            record,
            |record| producer.send(record),
            std::thread::sleep,
        );
        sent.map_err(|(error, _)| error)?;
    }
    producer.flush(Duration::from_secs(120))?;
    Ok(args.events as f64 / started.elapsed().as_secs_f64())
}

async fn reset(pool: &PgPool) -> anyhow::Result<()> {
    sqlx::raw_sql(
        "TRUNCATE eos_outbox; TRUNCATE eos_outbox_entity_order; TRUNCATE eos_outbox_relay_positions;",
    )
    .execute(pool)
    .await?;
    Ok(())
}

fn settings(args: &BenchArgs, kafka: &ClientConfig, relay_name: &str) -> RelaySettings {
    RelaySettings {
        client_config: kafka.clone(),
        guarantee: Guarantee::ExactlyOnce,
        relay_name: relay_name.to_owned(),
        transactional_id: format!("outbox-relay-{relay_name}"),
        positions_topic: format!("{relay_name}-positions"),
        batch_size: args.batch_size,
        poll_interval: Duration::from_millis(100),
        // outbox-relay's default (--linger).
        linger: Duration::from_millis(20),
        transaction_timeout: Duration::from_secs(10),
        logical: None,
        idle_position_interval: Duration::from_secs(5),
        value_schemas: None,
    }
}

/// A relay of its own, running in this process until the returned token is cancelled.
async fn start_relay(
    args: &BenchArgs,
    kafka: &ClientConfig,
    pool: &PgPool,
    relay_name: &str,
) -> anyhow::Result<(
    CancellationToken,
    tokio::task::JoinHandle<anyhow::Result<()>>,
)> {
    spawn_relay(settings(args, kafka, relay_name), pool).await
}

/// The relay publishing a backlog of `events` rows, from its first read to its last commit.
async fn relay_rate(
    args: &BenchArgs,
    kafka: &ClientConfig,
    pool: &PgPool,
    topic: &str,
    round: usize,
    filler: &str,
) -> anyhow::Result<f64> {
    reset(pool).await?;
    for chunk in (0..args.events).collect::<Vec<_>>().chunks(100) {
        let mut tx = pool.begin().await?;
        for &n in chunk {
            eos_outbox::enqueue(&mut tx, &event(topic, &format!("r{round}-{n}"), n, filler)?)
                .await?;
        }
        tx.commit().await?;
    }
    let relay_name = format!("bench-{}-{round}", std::process::id());
    let (shutdown, task) = start_relay(args, kafka, pool, &relay_name).await?;
    let started = Instant::now();
    let (order_xid, position): (i64, i64) = sqlx::query_as(
        "SELECT order_xid, position FROM eos_outbox ORDER BY order_xid DESC, position DESC LIMIT 1",
    )
    .fetch_one(pool)
    .await
    .context("the backlog is empty")?;
    let last = eos_outbox::OutboxCursor {
        order_xid,
        position,
    };
    loop {
        if relayed_position(pool, &relay_name)
            .await?
            .is_some_and(|at| at >= last)
        {
            break;
        }
        anyhow::ensure!(!task.is_finished(), "the relay stopped early");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let rate = args.events as f64 / started.elapsed().as_secs_f64();
    shutdown.cancel();
    task.await??;
    Ok(rate)
}

/// Commit-to-visible latencies (seconds, sorted) of one-row transactions written at `rate`.
async fn latencies(
    args: &BenchArgs,
    kafka: &ClientConfig,
    pool: &PgPool,
    topic: &str,
    rate: f64,
    filler: &str,
) -> anyhow::Result<Vec<f64>> {
    reset(pool).await?;
    // The topic exists before the consumer subscribes, so it is assigned at once and reads from
    // the start of a topic with nothing in it yet.
    let visibility = VisibilityReader::start(kafka, "outbox-bench", &[topic.to_owned()]).await?;
    let relay_name = format!("bench-{}-latency", std::process::id());
    let (shutdown, task) = start_relay(args, kafka, pool, &relay_name).await?;
    // Let the consumer join its group before the first commit.
    tokio::time::sleep(Duration::from_secs(3)).await;

    let writers = 4usize;
    let per_writer = rate / writers as f64;
    let mut handles = Vec::new();
    for writer in 0..writers {
        let (pool, topic, filler) = (pool.clone(), topic.to_owned(), filler.to_owned());
        let run = args.latency_run;
        handles.push(tokio::spawn(async move {
            let mut committed = Vec::new();
            let started = Instant::now();
            let mut n = 0usize;
            while started.elapsed() < run {
                let due = started + Duration::from_secs_f64(n as f64 / per_writer);
                tokio::time::sleep_until(due.into()).await;
                let id = format!("lat-{writer}-{n}");
                let mut tx = pool.begin().await?;
                eos_outbox::enqueue(&mut tx, &event(&topic, &id, n, &filler)?).await?;
                tx.commit().await?;
                committed.push((id, Instant::now()));
                n += 1;
            }
            anyhow::Ok(committed)
        }));
    }
    let mut committed: HashMap<String, Instant> = HashMap::new();
    for handle in handles {
        committed.extend(handle.await??);
    }
    let seen = visibility
        .collect(committed.len(), Duration::from_secs(30))
        .await;
    shutdown.cancel();
    task.await??;
    anyhow::ensure!(
        seen.len() >= committed.len(),
        "only {} of {} committed events became visible",
        seen.len(),
        committed.len()
    );
    let mut latencies: Vec<f64> = committed
        .iter()
        .filter_map(|(id, at)| {
            seen.get(id)
                .map(|seen| seen.saturating_duration_since(*at).as_secs_f64())
        })
        .collect();
    latencies.sort_by(f64::total_cmp);
    Ok(latencies)
}

/// The relay's throughput target: relayed ÷ plain producer.
pub const TARGET_VS_PLAIN: f64 = 0.6;
/// The commit-to-visible p99 target, in milliseconds.
pub const TARGET_P99_MS: f64 = 100.0;

/// What one run of the bench measured (`--json` prints it as is).
#[derive(Debug, Clone, Serialize)]
pub struct RelayBenchReport {
    pub events: usize,
    pub record_bytes: usize,
    pub batch_size: i64,
    pub rounds: usize,
    /// `/proc/loadavg` (1, 5, 15 minutes) before the first round, where there is one.
    pub load_before: Option<[f64; 3]>,
    pub cores: usize,
    /// records/s of a plain idempotent producer sending the same records.
    pub plain: Figure,
    /// records/s of the relay publishing the same number of outbox rows, exactly-once.
    pub relayed: Figure,
    /// relayed ÷ plain, within each round.
    pub vs_plain: Figure,
    /// The commit-to-visible run: its rate (half the median relayed rate) and seconds.
    pub latency_rate: f64,
    pub latency_seconds: f64,
    pub latency_events: usize,
    pub latency_p50_ms: f64,
    pub latency_p99_ms: f64,
}

/// Runs the interleaved rounds and the latency run against a scratch database, or the staleness
/// run with `--blocker`.
pub async fn measure(args: &BenchArgs, kafka: &KafkaSettings) -> anyhow::Result<RelayBench> {
    if let Some(blocker) = args.blocker {
        anyhow::ensure!(
            args.staleness_rate > 0.0,
            "--staleness-rate must be above 0"
        );
        let report = super::relay_staleness::measure(
            &args.database_url,
            &kafka.client_config(),
            blocker,
            args.staleness_rate,
        )
        .await?;
        return Ok(RelayBench::Staleness(report));
    }
    if let Some(mode) = args.process {
        let relay_bin = match &args.relay_bin {
            Some(path) => path.clone(),
            None => std::env::current_exe()
                .context("cannot find the running executable")?
                .with_file_name("outbox-relay"),
        };
        let run = super::relay_process::ProcessRun {
            database_url: &args.database_url,
            kafka,
            relay_bin,
            mode,
            events: args.events,
            record_bytes: args.record_bytes,
            batch_size: args.batch_size,
            steady_rates: &args.steady_rates,
            steady_run: args.steady_run,
        };
        return Ok(RelayBench::Process(
            super::relay_process::measure(&run).await?,
        ));
    }
    Ok(RelayBench::Throughput(Box::new(
        measure_throughput(args, kafka).await?,
    )))
}

async fn measure_throughput(
    args: &BenchArgs,
    kafka: &KafkaSettings,
) -> anyhow::Result<RelayBenchReport> {
    anyhow::ensure!(args.rounds > 0, "--rounds must be at least 1");
    let kafka = kafka.client_config();
    let load_before = load_average();
    let pool = PoolBuilder::new(8)
        .connect(&args.database_url)
        .await
        .context("connecting to PostgreSQL")?;
    eos_outbox::migrator().run(&pool).await?;
    // The envelope around the filler is about 100 bytes.
    let filler = "x".repeat(args.record_bytes.saturating_sub(100));
    let pid = std::process::id();
    let (mut plain, mut relayed) = (Vec::new(), Vec::new());
    for round in 0..args.rounds {
        let plain_topic = format!("outbox-bench-plain-{pid}-{round}");
        let relay_topic = format!("outbox-bench-relay-{pid}-{round}");
        let rate = {
            let (args, kafka, topic, filler) = (
                args.clone(),
                kafka.clone(),
                plain_topic.clone(),
                filler.clone(),
            );
            tokio::task::spawn_blocking(move || plain_producer_rate(&args, &kafka, &topic, &filler))
                .await??
        };
        plain.push(rate);
        relayed.push(relay_rate(args, &kafka, &pool, &relay_topic, round, &filler).await?);
    }
    let vs_plain = Figure::ratio(&relayed, &plain);
    let (plain, relayed) = (Figure::new(plain), Figure::new(relayed));
    let latency_rate = relayed.median / 2.0;
    let latency_topic = format!("outbox-bench-latency-{pid}");
    let latencies = latencies(args, &kafka, &pool, &latency_topic, latency_rate, &filler).await?;
    reset(&pool).await?;
    pool.close().await;
    Ok(RelayBenchReport {
        events: args.events,
        record_bytes: args.record_bytes,
        batch_size: args.batch_size,
        rounds: args.rounds,
        load_before,
        cores: std::thread::available_parallelism().map_or(0, usize::from),
        plain,
        relayed,
        vs_plain,
        latency_rate,
        latency_seconds: args.latency_run.as_secs_f64(),
        latency_events: latencies.len(),
        latency_p50_ms: percentile(&latencies, 0.5) * 1e3,
        latency_p99_ms: percentile(&latencies, 0.99) * 1e3,
    })
}

impl RelayBenchReport {
    /// The human table: median, spread and each round, with the targets.
    pub fn table(&self) -> String {
        use std::fmt::Write as _;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "outbox-relay bench: {} events of ~{} bytes, {} rows per relay transaction, {} \
             interleaved rounds; {} cores, load before {}",
            self.events,
            self.record_bytes,
            self.batch_size,
            self.rounds,
            self.cores,
            load_text(self.load_before)
        );
        let _ = writeln!(
            out,
            "  {:<40} {:>10} {:>15}  per round",
            "figure", "median", "spread"
        );
        for (name, figure, digits, target) in [
            (
                "plain idempotent producer records/s",
                &self.plain,
                0,
                String::new(),
            ),
            (
                "relay, exactly-once records/s",
                &self.relayed,
                0,
                String::new(),
            ),
            (
                "  ÷ plain",
                &self.vs_plain,
                2,
                format!("   target ≥ {TARGET_VS_PLAIN:.2}"),
            ),
        ] {
            let (median, spread, rounds) = figure.text(digits);
            let _ = writeln!(
                out,
                "  {name:<40} {median:>10} {spread:>15}  [{rounds}]{target}"
            );
        }
        if self.latency_events == 0 {
            let _ = writeln!(out, "  commit → visible: not measured (no latency run)");
            return out;
        }
        let _ = writeln!(
            out,
            "  commit → visible (read_committed) at {:.0} events/s for {:.0} s: p50 {:.1} ms, \
             p99 {:.1} ms over {} events (target p99 ≤ {TARGET_P99_MS:.0} ms)",
            self.latency_rate,
            self.latency_seconds,
            self.latency_p50_ms,
            self.latency_p99_ms,
            self.latency_events
        );
        out
    }
}
