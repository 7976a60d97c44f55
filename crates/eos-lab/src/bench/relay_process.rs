//! `eos-lab bench relay --process <mode>`: the relay as users run it — the `outbox-relay` binary
//! next to eos-lab, in its own process with its logging — and what it costs, PostgreSQL's
//! backends counted (docs/BENCHMARKS.md, outbox-relay).
//!
//! - **Drain**: a backlog of `--events` rows written while the relay is down (in logical mode
//!   after its slot exists, so they come from the slot's stream), then the relay started: the
//!   time from its start to the last row published, and the CPU it and its backends spent.
//! - **Steady**: the relay caught up while writers commit at each of `--steady-rates` for
//!   `--steady-run`: whether it keeps up (the largest backlog seen, the time to drain after the
//!   writers stop) and the CPU per 100,000 rows, its backends counted.
//!
//! CPU times come from `/proc/<pid>/stat`: the relay's process, and the server processes whose
//! `application_name` is the relay's (its pool, including the logical decoding its queries do).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::bail;
use serde::Serialize;
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

use eos_runtime::kafka_settings::{ChildKafkaProperties, KafkaSettings};
use eos_testkit::{ChildProcess, LogMode};

/// How often the CPU times and the published count are sampled.
const SAMPLE_INTERVAL: Duration = Duration::from_millis(200);
/// How long a drain or a catch-up may take before the bench gives up.
const DRAIN_LIMIT: Duration = Duration::from_secs(600);
/// Rows per statement when the backlog is written.
const WRITE_CHUNK: usize = 2_000;
/// Rows per transaction of the steady writers: a payment's few rows, not a bulk load.
const ROWS_PER_TRANSACTION: usize = 5;
/// The steady writers' connections.
const WRITERS: usize = 4;

/// The relay's mode for `--process`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ProcessMode {
    Xmin,
    Logical,
}

impl ProcessMode {
    fn as_str(self) -> &'static str {
        match self {
            Self::Xmin => "xmin",
            Self::Logical => "logical",
        }
    }
}

/// What one `--process` run measured.
#[derive(Debug, Clone, Serialize)]
pub struct RelayProcessReport {
    pub mode: ProcessMode,
    pub events: usize,
    pub record_bytes: usize,
    pub batch_size: i64,
    pub cores: usize,
    pub load_before: Option<[f64; 3]>,
    pub drain_seconds: f64,
    pub drain_rows_per_second: f64,
    pub drain_relay_cpu_per_100k: f64,
    pub drain_postgres_cpu_per_100k: f64,
    /// The relay's peak resident memory over the whole run (VmHWM).
    pub relay_peak_rss_mib: f64,
    pub steady: Vec<SteadyRun>,
}

/// One steady-rate run.
#[derive(Debug, Clone, Serialize)]
pub struct SteadyRun {
    pub rate_asked: f64,
    pub rate_written: f64,
    pub seconds: f64,
    pub rows: u64,
    /// The most rows written and not yet published, sampled every 200 ms.
    pub largest_backlog: u64,
    /// From the writers' last commit to the last row published.
    pub drained_after_seconds: f64,
    /// Kafka transactions the relay committed for them: rows per transaction is what the
    /// per-row cost depends on most.
    pub transactions: u64,
    pub relay_cpu_per_100k: f64,
    pub postgres_cpu_per_100k: f64,
}

/// The settings of a `--process` run, from the bench's arguments.
#[derive(Debug)]
pub struct ProcessRun<'a> {
    pub database_url: &'a str,
    pub kafka: &'a KafkaSettings,
    pub relay_bin: PathBuf,
    pub mode: ProcessMode,
    pub events: usize,
    pub record_bytes: usize,
    pub batch_size: i64,
    pub steady_rates: &'a [f64],
    pub steady_run: Duration,
}

/// CPU seconds of a set of processes, as clock ticks read from `/proc`.
#[derive(Debug, Default)]
struct CpuTicks {
    /// pid → (ticks when first seen, ticks when last seen).
    seen: HashMap<i32, (u64, u64)>,
}

impl CpuTicks {
    fn ticks_of(pid: i32) -> Option<u64> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // Fields after the command's closing parenthesis; utime and stime are the 14th and 15th.
        let after = stat.rsplit_once(')')?.1;
        let fields: Vec<&str> = after.split_whitespace().collect();
        Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
    }

    /// Samples `pids`; a pid first seen now counts from `from_zero` (a process that started
    /// during the measurement) or from its current ticks.
    fn sample(&mut self, pids: &[i32], from_zero: bool) {
        for &pid in pids {
            if let Some(ticks) = Self::ticks_of(pid) {
                let entry = self
                    .seen
                    .entry(pid)
                    .or_insert((if from_zero { 0 } else { ticks }, ticks));
                entry.1 = ticks;
            }
        }
    }

    fn seconds(&self) -> f64 {
        let ticks: u64 = self.seen.values().map(|(first, last)| last - first).sum();
        ticks as f64 / USER_HZ
    }
}

/// The unit of `/proc/<pid>/stat`'s times: the kernel reports them in USER_HZ, 100 on Linux
/// whatever the kernel's own tick rate.
const USER_HZ: f64 = 100.0;

/// The CPU of the relay and of its server backends over one measurement.
struct CpuWatch {
    relay: CpuTicks,
    postgres: CpuTicks,
}

impl CpuWatch {
    async fn start(pool: &PgPool, relay_pid: i32, relay_name: &str) -> anyhow::Result<Self> {
        let mut watch = Self {
            relay: CpuTicks::default(),
            postgres: CpuTicks::default(),
        };
        watch.relay.sample(&[relay_pid], false);
        watch
            .postgres
            .sample(&backends(pool, relay_name).await?, false);
        Ok(watch)
    }

    async fn sample(
        &mut self,
        pool: &PgPool,
        relay_pid: i32,
        relay_name: &str,
    ) -> anyhow::Result<()> {
        self.relay.sample(&[relay_pid], false);
        self.postgres
            .sample(&backends(pool, relay_name).await?, true);
        Ok(())
    }
}

/// The server processes of the relay's sessions.
async fn backends(pool: &PgPool, relay_name: &str) -> anyhow::Result<Vec<i32>> {
    Ok(
        sqlx::query_scalar("SELECT pid FROM pg_stat_activity WHERE application_name = $1")
            .bind(relay_name)
            .fetch_all(pool)
            .await?,
    )
}

/// The relay's process and how to read its count of published rows.
struct RelayProcess {
    process: ChildProcess,
    metrics: String,
}

impl RelayProcess {
    fn start(
        run: &ProcessRun<'_>,
        args: &[String],
        kafka: &ChildKafkaProperties,
        log: &Path,
        name: &str,
    ) -> anyhow::Result<Self> {
        let mut command = Command::new(&run.relay_bin);
        command
            .args(args)
            .env("PGAPPNAME", name)
            .env("EOS_LOG_FORMAT", "text");
        kafka.apply_to(&mut command);
        let mut process = ChildProcess::spawn("outbox-relay", command, log, LogMode::Truncate)?;
        let addr = process.wait_for_log_field("metrics_addr", Duration::from_secs(60))?;
        Ok(Self {
            process,
            metrics: format!("http://{addr}/metrics"),
        })
    }

    fn pid(&self) -> i32 {
        self.process.pid().as_raw()
    }

    /// `outbox_relay_records_published_total` (0 before the first batch).
    async fn published(&mut self) -> anyhow::Result<u64> {
        if let Some(status) = self.process.try_wait()? {
            bail!(
                "outbox-relay exited ({status})\n{}",
                self.process.log_tail(20)
            );
        }
        let text = reqwest::get(&self.metrics).await?.text().await?;
        Ok(metric_value(&text, outbox_relay::metrics::RECORDS_PUBLISHED).unwrap_or(0.0) as u64)
    }

    /// `outbox_relay_transactions_total{outcome="committed"}`.
    async fn transactions(&self) -> anyhow::Result<u64> {
        let text = reqwest::get(&self.metrics).await?.text().await?;
        Ok(Self::transactions_committed(&text) as u64)
    }

    fn transactions_committed(text: &str) -> f64 {
        text.lines()
            .filter(|line| {
                line.starts_with(outbox_relay::metrics::TRANSACTIONS)
                    && line.contains("outcome=\"committed\"")
            })
            .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    fn peak_rss_mib(&self) -> f64 {
        std::fs::read_to_string(format!("/proc/{}/status", self.pid()))
            .ok()
            .and_then(|status| {
                status
                    .lines()
                    .find(|line| line.starts_with("VmHWM:"))?
                    .split_whitespace()
                    .nth(1)?
                    .parse::<f64>()
                    .ok()
            })
            .map_or(0.0, |kib| kib / 1024.0)
    }

    fn stop(mut self) -> anyhow::Result<()> {
        let status = self.process.terminate(Duration::from_secs(60))?;
        anyhow::ensure!(status.success(), "outbox-relay exited with {status}");
        Ok(())
    }
}

fn metric_value(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find(|line| {
            line.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
        })?
        .rsplit(' ')
        .next()?
        .parse()
        .ok()
}

fn deadlocked(error: &anyhow::Error) -> bool {
    error
        .downcast_ref::<sqlx::Error>()
        .and_then(|error| error.as_database_error())
        .and_then(|error| error.code())
        .is_some_and(|code| code == "40P01")
}

/// Writes `rows` outbox rows numbered from `first`, `per_statement` to a transaction.
async fn write_rows(
    pool: &PgPool,
    topic: &str,
    first: usize,
    rows: usize,
    filler: &str,
    per_statement: usize,
) -> anyhow::Result<()> {
    let mut start = first;
    while start < first + rows {
        let end = (start + per_statement).min(first + rows);
        sqlx::query(
            "SELECT count(eos_outbox_enqueue_event($1, 'acct-' || (g % 500), 'ev-' || g,
                 jsonb_build_object('event_id', 'ev-' || g, 'entity_id', 'acct-' || (g % 500),
                                    'value', g, 'filler', $2::TEXT)))
               FROM generate_series($3::BIGINT, $4::BIGINT) AS g",
        )
        .bind(topic)
        .bind(filler)
        .bind(start as i64)
        .bind(end as i64 - 1)
        .execute(pool)
        .await?;
        start = end;
    }
    Ok(())
}

/// Runs the drain and the steady runs on the scratch database `--database-url` names (its
/// outbox tables are emptied first).
pub async fn measure(run: &ProcessRun<'_>) -> anyhow::Result<RelayProcessReport> {
    if !run.relay_bin.is_file() {
        bail!(
            "no outbox-relay binary at {}: build it (cargo build --release -p outbox-relay)",
            run.relay_bin.display()
        );
    }
    let load_before = eos_testkit::bench_figures::load_average();
    measure_in(run, run.database_url, load_before).await
}

async fn measure_in(
    run: &ProcessRun<'_>,
    url: &str,
    load_before: Option<[f64; 3]>,
) -> anyhow::Result<RelayProcessReport> {
    let pool = PgPoolOptions::new()
        .max_connections(WRITERS as u32 + 2)
        .connect(url)
        .await?;
    eos_outbox::migrator().run(&pool).await?;
    sqlx::raw_sql(
        "TRUNCATE eos_outbox; TRUNCATE eos_outbox_entity_order; TRUNCATE eos_outbox_relay_positions;",
    )
    .execute(&pool)
    .await?;
    let pid = std::process::id();
    let name = format!("bench-process-{pid}");
    let topic = format!("outbox-bench-process-{pid}");
    let slot = format!("eos_bench_process_{pid}");
    let dir = std::env::temp_dir().join(format!("eos-lab-relay-bench-{pid}"));
    std::fs::create_dir_all(&dir)?;
    // One log per start: a start waits for the metrics address in its own log.
    let first_log = dir.join("outbox-relay-first-start.log");
    let log = dir.join("outbox-relay.log");
    let kafka_file = run
        .kafka
        .write_for_children(&dir.join("kafka.properties"))?;
    let mut args = vec![
        "--bootstrap-servers".to_owned(),
        run.kafka.bootstrap_servers.clone(),
        "--database-url".to_owned(),
        url.to_owned(),
        "--relay-name".to_owned(),
        name.clone(),
        "--positions-topic".to_owned(),
        format!("{name}-positions"),
        "--mode".to_owned(),
        run.mode.as_str().to_owned(),
        "--batch-size".to_owned(),
        run.batch_size.to_string(),
        "--metrics-addr".to_owned(),
        "127.0.0.1:0".to_owned(),
    ];
    if run.mode == ProcessMode::Logical {
        args.extend(["--slot".to_owned(), slot.clone()]);
    }
    let result = async {
        if run.mode == ProcessMode::Logical {
            // First start: the slot and a first committed position, on an empty outbox, so the
            // backlog comes from the slot's stream (a first start's table pass is another path).
            let mut relay = RelayProcess::start(run, &args, &kafka_file, &first_log, &name)?;
            let deadline = Instant::now() + Duration::from_secs(120);
            loop {
                let text = reqwest::get(&relay.metrics).await?.text().await?;
                if RelayProcess::transactions_committed(&text) >= 1.0 {
                    break;
                }
                relay.published().await?;
                anyhow::ensure!(
                    Instant::now() < deadline,
                    "the relay committed no first position in 120 s"
                );
                tokio::time::sleep(SAMPLE_INTERVAL).await;
            }
            relay.stop()?;
        }

        let filler = "x".repeat(run.record_bytes.saturating_sub(100));
        write_rows(&pool, &topic, 0, run.events, &filler, WRITE_CHUNK).await?;
        let started = Instant::now();
        let mut relay = RelayProcess::start(run, &args, &kafka_file, &log, &name)?;
        let mut cpu = CpuWatch::start(&pool, relay.pid(), &name).await?;
        while relay.published().await? < run.events as u64 {
            cpu.sample(&pool, relay.pid(), &name).await?;
            anyhow::ensure!(
                started.elapsed() < DRAIN_LIMIT,
                "the backlog did not drain in {DRAIN_LIMIT:?}"
            );
            tokio::time::sleep(SAMPLE_INTERVAL / 4).await;
        }
        let drain_seconds = started.elapsed().as_secs_f64();
        cpu.sample(&pool, relay.pid(), &name).await?;
        let per_100k = |seconds: f64, rows: u64| seconds * 100_000.0 / rows.max(1) as f64;
        let drain_relay = per_100k(cpu.relay.seconds(), run.events as u64);
        let drain_postgres = per_100k(cpu.postgres.seconds(), run.events as u64);

        let mut steady = Vec::new();
        let mut written = run.events;
        for &rate in run.steady_rates {
            let measured = steady_run(
                &pool,
                &mut relay,
                &name,
                &topic,
                &filler,
                rate,
                run.steady_run,
                written,
            )
            .await?;
            written += measured.rows as usize;
            steady.push(measured);
        }
        let relay_peak_rss_mib = relay.peak_rss_mib();
        relay.stop()?;
        Ok(RelayProcessReport {
            mode: run.mode,
            events: run.events,
            record_bytes: run.record_bytes,
            batch_size: run.batch_size,
            cores: std::thread::available_parallelism().map_or(0, usize::from),
            load_before,
            drain_seconds,
            drain_rows_per_second: run.events as f64 / drain_seconds,
            drain_relay_cpu_per_100k: drain_relay,
            drain_postgres_cpu_per_100k: drain_postgres,
            relay_peak_rss_mib,
            steady,
        })
    }
    .await;
    if run.mode == ProcessMode::Logical {
        // A slot left behind would hold the server's WAL for good.
        let _ = sqlx::query("SELECT pg_drop_replication_slot($1)")
            .bind(&slot)
            .execute(&pool)
            .await;
    }
    pool.close().await;
    if result.is_err() {
        eprintln!("the relay's log: {}", log.display());
    } else {
        let _ = std::fs::remove_dir_all(&dir);
    }
    result
}

/// Writers commit `rate` rows/s for `run` while the relay (caught up) publishes them.
#[expect(
    clippy::too_many_arguments,
    reason = "one run's settings, each used once; a struct would only repeat them"
)]
async fn steady_run(
    pool: &PgPool,
    relay: &mut RelayProcess,
    relay_name: &str,
    topic: &str,
    filler: &str,
    rate: f64,
    run: Duration,
    first: usize,
) -> anyhow::Result<SteadyRun> {
    anyhow::ensure!(rate > 0.0, "a steady rate must be above 0");
    let published_before = relay.published().await?;
    let transactions_before = relay.transactions().await?;
    let transactions_per_writer = rate / (ROWS_PER_TRANSACTION * WRITERS) as f64;
    let started = Instant::now();
    let mut writers = Vec::new();
    for writer in 0..WRITERS {
        let (pool, topic, filler) = (pool.clone(), topic.to_owned(), filler.to_owned());
        writers.push(tokio::spawn(async move {
            let mut n = 0usize;
            let mut rows = 0u64;
            while started.elapsed() < run {
                let due = started + Duration::from_secs_f64(n as f64 / transactions_per_writer);
                tokio::time::sleep_until(due.into()).await;
                let from = first + (n * WRITERS + writer) * ROWS_PER_TRANSACTION;
                // Two writers' rows can lock the same entities in opposite orders (the keys wrap
                // around): PostgreSQL then cancels one of them, which is written again.
                loop {
                    match write_rows(
                        &pool,
                        &topic,
                        from,
                        ROWS_PER_TRANSACTION,
                        &filler,
                        ROWS_PER_TRANSACTION,
                    )
                    .await
                    {
                        Err(error) if deadlocked(&error) => continue,
                        written => break written?,
                    }
                }
                rows += ROWS_PER_TRANSACTION as u64;
                n += 1;
            }
            anyhow::Ok(rows)
        }));
    }
    let mut cpu = CpuWatch::start(pool, relay.pid(), relay_name).await?;
    let mut largest_backlog = 0u64;
    while !writers.iter().all(|writer| writer.is_finished()) {
        tokio::time::sleep(SAMPLE_INTERVAL).await;
        cpu.sample(pool, relay.pid(), relay_name).await?;
        let outbox: i64 = sqlx::query_scalar("SELECT count(*) FROM eos_outbox")
            .fetch_one(pool)
            .await?;
        let published = relay.published().await?;
        let written = outbox as u64 - published_before.min(outbox as u64);
        largest_backlog = largest_backlog.max(written.saturating_sub(published - published_before));
    }
    let stopped = Instant::now();
    let mut rows = 0u64;
    for writer in writers {
        rows += writer.await??;
    }
    let seconds = stopped.duration_since(started).as_secs_f64();
    while relay.published().await? < published_before + rows {
        anyhow::ensure!(
            stopped.elapsed() < DRAIN_LIMIT,
            "the relay did not catch up with {rate} rows/s within {DRAIN_LIMIT:?} of the end"
        );
        cpu.sample(pool, relay.pid(), relay_name).await?;
        tokio::time::sleep(SAMPLE_INTERVAL / 4).await;
    }
    let drained_after_seconds = stopped.elapsed().as_secs_f64();
    cpu.sample(pool, relay.pid(), relay_name).await?;
    let transactions = relay.transactions().await? - transactions_before;
    Ok(SteadyRun {
        rate_asked: rate,
        rate_written: rows as f64 / seconds,
        seconds,
        rows,
        largest_backlog,
        drained_after_seconds,
        transactions,
        relay_cpu_per_100k: cpu.relay.seconds() * 100_000.0 / rows.max(1) as f64,
        postgres_cpu_per_100k: cpu.postgres.seconds() * 100_000.0 / rows.max(1) as f64,
    })
}

impl RelayProcessReport {
    /// The human table.
    pub fn table(&self) -> String {
        use std::fmt::Write as _;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "outbox-relay process bench, {} mode: {} events of ~{} bytes, {} rows per \
             transaction; {} cores, load before {}",
            self.mode.as_str(),
            self.events,
            self.record_bytes,
            self.batch_size,
            self.cores,
            eos_testkit::bench_figures::load_text(self.load_before)
        );
        let _ = writeln!(
            out,
            "  drain of the backlog: {:.1} s, {:.0} rows/s; CPU per 100k rows: relay {:.2} s, \
             PostgreSQL backends {:.2} s, together {:.2} s",
            self.drain_seconds,
            self.drain_rows_per_second,
            self.drain_relay_cpu_per_100k,
            self.drain_postgres_cpu_per_100k,
            self.drain_relay_cpu_per_100k + self.drain_postgres_cpu_per_100k
        );
        for run in &self.steady {
            let _ = writeln!(
                out,
                "  steady {:.0} rows/s asked ({:.0} written, {:.0} s): largest backlog {} rows, \
                 drained {:.2} s after the writers stopped; {:.1} rows per transaction; CPU per \
                 100k rows: relay {:.2} s, PostgreSQL backends {:.2} s, together {:.2} s",
                run.rate_asked,
                run.rate_written,
                run.seconds,
                run.largest_backlog,
                run.drained_after_seconds,
                run.rows as f64 / run.transactions.max(1) as f64,
                run.relay_cpu_per_100k,
                run.postgres_cpu_per_100k,
                run.relay_cpu_per_100k + run.postgres_cpu_per_100k
            );
        }
        let _ = writeln!(out, "  relay peak RSS {:.0} MiB", self.relay_peak_rss_mib);
        out
    }
}
