//! `eos-lab bench dedup`: Begin+Complete throughput and latency of a running dedup-service, next
//! to the same SQL run directly against its PostgreSQL (no gRPC), at 1, 16 and 64 concurrent
//! clients, single and batched, in interleaved rounds (gRPC, SQL, gRPC, …); then p50/p99 at half
//! the single-pair peak, through the service and then straight to SQL at the same pace. A
//! command that prints figures, not a test.

use std::time::{Duration, Instant};

use clap::Args;
use dedup_client::state_machine::BeginOutcome as Outcome;
use dedup_client::{BeginOutcome, BeginParams, DedupClient, FencingToken};
use eos_testkit::bench_figures::{Figure, load_average, load_text};
use serde::Serialize;
use time::OffsetDateTime;

use dedup_service::intent_store::{self, HolderReport, IntentStore};
use dedup_service::validation::{BeginItem, CompleteItem};

/// The bench's arguments.
#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// The service under test (started without client tokens, e.g. on loopback).
    #[arg(long, default_value = "http://127.0.0.1:50051")]
    pub endpoint: String,
    /// Its database, for the direct-SQL baseline (the same statements, no gRPC).
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: String,
    /// Length of each measurement.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Items per BeginBatch.
    #[arg(long, default_value_t = 100)]
    pub batch: usize,
    /// Interleaved rounds; each figure is the median over them, with the spread.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
}

/// Concurrent clients of each measurement.
const CLIENTS: [usize; 3] = [1, 16, 64];
/// Clients of the latency run at half the peak, each pacing its share.
const HALF_PEAK_CLIENTS: usize = 16;

/// What one run of the bench measured (`--json` prints it as is).
#[derive(Debug, Clone, Serialize)]
pub struct DedupBenchReport {
    pub endpoint: String,
    pub batch: usize,
    pub rounds: usize,
    pub seconds_each: f64,
    /// `/proc/loadavg` (1, 5, 15 minutes) before the first round, where there is one.
    pub load_before: Option<[f64; 3]>,
    pub cores: usize,
    pub rows: Vec<DedupRow>,
    pub half_peak: HalfPeak,
}

/// One mode at one number of clients, over the rounds.
#[derive(Debug, Clone, Serialize)]
pub struct DedupRow {
    pub mode: Mode,
    pub clients: usize,
    /// Begin+Complete pairs per second through the service.
    pub grpc_pairs_per_second: Figure,
    /// The same statements straight to PostgreSQL.
    pub sql_pairs_per_second: Figure,
    /// gRPC ÷ SQL within each round: what the service costs on top of its database.
    pub grpc_vs_sql: Figure,
    /// Over every round's round trips (a pair, or a batch with its completes).
    pub grpc_p50_ms: f64,
    pub grpc_p99_ms: f64,
    pub sql_p50_ms: f64,
    pub sql_p99_ms: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct HalfPeak {
    pub target_pairs_per_second: f64,
    pub pairs_per_second: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// The same paced pairs straight to PostgreSQL right after: a pair's two commits on this
    /// database at this rate, the floor under the service's latency.
    pub sql_pairs_per_second: f64,
    pub sql_p50_ms: f64,
    pub sql_p99_ms: f64,
}

#[derive(Debug, Clone)]
enum Target {
    Grpc(Box<DedupClient>),
    Sql(IntentStore),
}

#[derive(Debug, Default)]
struct Figures {
    pairs: usize,
    /// One sample per round trip unit: a pair (single) or a batch with its completes (batched).
    latencies: Vec<Duration>,
    elapsed: Duration,
}

impl Figures {
    fn rate(&self) -> f64 {
        self.pairs as f64 / self.elapsed.as_secs_f64()
    }
}

fn percentile_ms(latencies: &[Duration], p: f64) -> f64 {
    if latencies.is_empty() {
        return 0.0;
    }
    let mut sorted = latencies.to_vec();
    sorted.sort_unstable();
    let index = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[index].as_secs_f64() * 1000.0
}

/// Runs the rounds and the half-peak run against `args.endpoint` and its database.
pub async fn measure(args: &BenchArgs) -> anyhow::Result<DedupBenchReport> {
    anyhow::ensure!(args.rounds > 0, "--rounds must be at least 1");
    let load_before = load_average();
    let grpc = Target::Grpc(Box::new(DedupClient::connect_lazy(&args.endpoint)?));
    let pool = intent_store::connect(&args.database_url, 32).await?;
    let sql = Target::Sql(IntentStore::new(pool, Duration::from_secs(30 * 24 * 3600)));
    let tag = format!("bench-{:x}", rand::random::<u32>());

    let configs: Vec<(Mode, usize)> = [Mode::Single, Mode::Batched]
        .into_iter()
        .flat_map(|mode| CLIENTS.map(|clients| (mode, clients)))
        .collect();
    // Per config: the rates of each round and every latency, of gRPC and of SQL.
    let mut grpc_rates = vec![Vec::new(); configs.len()];
    let mut sql_rates = vec![Vec::new(); configs.len()];
    let mut grpc_latencies = vec![Vec::new(); configs.len()];
    let mut sql_latencies = vec![Vec::new(); configs.len()];
    for round in 0..args.rounds {
        for (slot, &(mode, clients)) in configs.iter().enumerate() {
            let run = format!("{tag}-{round}-{mode:?}-{clients}");
            let g = run_workers(
                &grpc,
                mode,
                clients,
                args.batch,
                args.duration,
                None,
                &format!("{run}-g"),
            )
            .await?;
            let s = run_workers(
                &sql,
                mode,
                clients,
                args.batch,
                args.duration,
                None,
                &format!("{run}-s"),
            )
            .await?;
            tracing::info!(
                round,
                ?mode,
                clients,
                grpc_pairs_per_second = g.rate().round(),
                sql_pairs_per_second = s.rate().round(),
                "dedup bench measurement done"
            );
            grpc_rates[slot].push(g.rate());
            sql_rates[slot].push(s.rate());
            grpc_latencies[slot].extend(g.latencies);
            sql_latencies[slot].extend(s.latencies);
        }
    }
    let rows: Vec<DedupRow> = configs
        .iter()
        .enumerate()
        .map(|(slot, &(mode, clients))| DedupRow {
            mode,
            clients,
            grpc_vs_sql: Figure::ratio(&grpc_rates[slot], &sql_rates[slot]),
            grpc_pairs_per_second: Figure::new(grpc_rates[slot].clone()),
            sql_pairs_per_second: Figure::new(sql_rates[slot].clone()),
            grpc_p50_ms: percentile_ms(&grpc_latencies[slot], 0.5),
            grpc_p99_ms: percentile_ms(&grpc_latencies[slot], 0.99),
            sql_p50_ms: percentile_ms(&sql_latencies[slot], 0.5),
            sql_p99_ms: percentile_ms(&sql_latencies[slot], 0.99),
        })
        .collect();
    // Latency at half the single-pair peak (the best median over the client counts).
    let peak_single = rows
        .iter()
        .filter(|row| row.mode == Mode::Single)
        .map(|row| row.grpc_pairs_per_second.median)
        .fold(0.0, f64::max);
    let target_rate = peak_single / 2.0;
    let pace = Duration::from_secs_f64(HALF_PEAK_CLIENTS as f64 / target_rate.max(1.0));
    let half = run_workers(
        &grpc,
        Mode::Single,
        HALF_PEAK_CLIENTS,
        1,
        args.duration,
        Some(pace),
        &format!("{tag}-half"),
    )
    .await?;
    let half_sql = run_workers(
        &sql,
        Mode::Single,
        HALF_PEAK_CLIENTS,
        1,
        args.duration,
        Some(pace),
        &format!("{tag}-half-s"),
    )
    .await?;
    Ok(DedupBenchReport {
        endpoint: args.endpoint.clone(),
        batch: args.batch,
        rounds: args.rounds,
        seconds_each: args.duration.as_secs_f64(),
        load_before,
        cores: std::thread::available_parallelism().map_or(0, usize::from),
        rows,
        half_peak: HalfPeak {
            target_pairs_per_second: target_rate,
            pairs_per_second: half.rate(),
            p50_ms: percentile_ms(&half.latencies, 0.5),
            p99_ms: percentile_ms(&half.latencies, 0.99),
            sql_pairs_per_second: half_sql.rate(),
            sql_p50_ms: percentile_ms(&half_sql.latencies, 0.5),
            sql_p99_ms: percentile_ms(&half_sql.latencies, 0.99),
        },
    })
}

impl DedupBenchReport {
    /// The human table: medians with their spread, and the latencies.
    pub fn table(&self) -> String {
        use std::fmt::Write as _;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "dedup-service bench: {}, Begin+Complete pairs, {} s per measurement, batches of {}, \
             {} interleaved rounds (gRPC, SQL, ...); {} cores, load before {}",
            self.endpoint,
            self.seconds_each,
            self.batch,
            self.rounds,
            self.cores,
            load_text(self.load_before)
        );
        let _ = writeln!(
            out,
            "  {:<8} {:>7} {:>12} {:>15} {:>8} {:>8} {:>12} {:>8} {:>8} {:>12}",
            "mode",
            "clients",
            "grpc pairs/s",
            "spread",
            "p50 ms",
            "p99 ms",
            "sql pairs/s",
            "p50 ms",
            "p99 ms",
            "grpc ÷ sql"
        );
        for row in &self.rows {
            let (grpc, grpc_spread, _) = row.grpc_pairs_per_second.text(0);
            let (sql, _, _) = row.sql_pairs_per_second.text(0);
            let (ratio, ratio_spread, _) = row.grpc_vs_sql.text(2);
            let _ = writeln!(
                out,
                "  {:<8} {:>7} {grpc:>12} {grpc_spread:>15} {:>8.2} {:>8.2} {sql:>12} {:>8.2} \
                 {:>8.2} {:>12}",
                match row.mode {
                    Mode::Single => "single",
                    Mode::Batched => "batched",
                },
                row.clients,
                row.grpc_p50_ms,
                row.grpc_p99_ms,
                row.sql_p50_ms,
                row.sql_p99_ms,
                format!("{ratio} ({ratio_spread})"),
            );
        }
        let half = &self.half_peak;
        let _ = writeln!(
            out,
            "  single at half the peak ({:.0} pairs/s target, {HALF_PEAK_CLIENTS} clients): {:.0} \
             pairs/s, p50 {:.2} ms, p99 {:.2} ms; the same pace straight to SQL: {:.0} pairs/s, \
             p50 {:.2} ms, p99 {:.2} ms",
            half.target_pairs_per_second,
            half.pairs_per_second,
            half.p50_ms,
            half.p99_ms,
            half.sql_pairs_per_second,
            half.sql_p50_ms,
            half.sql_p99_ms
        );
        out
    }
}

/// One Begin and one Complete per call, or `--batch` of each per call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    Single,
    Batched,
}

fn item(id: &str) -> BeginItem {
    BeginItem {
        operation_id: id.to_owned(),
        fingerprint: vec![7; 32],
        owner: "bench".into(),
        request_id: format!("bench-{id}"),
        lease_ttl: Duration::from_secs(30),
        occurred_at: OffsetDateTime::now_utc(),
        trace_context: None,
    }
}

/// Begins `ids` and completes every acquired one (one call each way when batched); the number
/// of pairs.
async fn pairs(target: &Target, ids: Vec<String>) -> anyhow::Result<usize> {
    let acquired: Vec<(String, FencingToken, Vec<u8>)> = match target {
        Target::Grpc(client) => {
            let params: Vec<(BeginParams, opentelemetry::Context)> = ids
                .iter()
                .map(|id| {
                    let params = BeginParams {
                        operation_id: id.clone(),
                        fingerprint: vec![7; 32],
                        owner: "bench".into(),
                        occurred_at: OffsetDateTime::now_utc(),
                        lease_ttl: None,
                    };
                    (params, opentelemetry::Context::new())
                })
                .collect();
            let outcomes = if let [(params, _)] = params.as_slice() {
                vec![client.begin(params).await?]
            } else {
                client.begin_batch(&params).await?
            };
            ids.into_iter()
                .zip(outcomes)
                .filter_map(|(id, outcome)| match outcome {
                    BeginOutcome::Acquired { fencing_token, .. } => {
                        Some((id, fencing_token, b"ok".to_vec()))
                    }
                    _ => None,
                })
                .collect()
        }
        Target::Sql(store) => {
            let items: Vec<BeginItem> = ids.iter().map(|id| item(id)).collect();
            store
                .begin_batch(&items)
                .await?
                .into_iter()
                .filter_map(|answer| match answer.outcome {
                    Outcome::Acquired { fencing_token, .. } => {
                        Some((answer.operation_id, fencing_token, b"ok".to_vec()))
                    }
                    _ => None,
                })
                .collect()
        }
    };
    match (target, acquired.as_slice()) {
        (_, []) => Ok(0),
        (Target::Grpc(client), [(id, token, result)]) => {
            client.complete(id, *token, result.clone()).await?;
            Ok(1)
        }
        (Target::Sql(store), [(id, token, result)]) => {
            let report = HolderReport::Complete {
                result: result.clone(),
            };
            store
                .report(id, token.counter, token.secret.as_bytes(), report)
                .await?;
            Ok(1)
        }
        (Target::Grpc(client), many) => {
            let items: Vec<dedup_client::CompleteItem> = many
                .iter()
                .map(|(id, token, result)| dedup_client::CompleteItem {
                    operation_id: id.clone(),
                    fencing_token: *token,
                    result: result.clone(),
                    trace: opentelemetry::Context::new(),
                })
                .collect();
            let done = client.complete_batch(&items).await?;
            Ok(done.into_iter().filter(Result::is_ok).count())
        }
        (Target::Sql(store), many) => {
            let items: Vec<CompleteItem> = many
                .iter()
                .map(|(id, token, result)| CompleteItem {
                    operation_id: id.clone(),
                    fencing_token: token.counter,
                    fencing_secret: token.secret.as_bytes().to_vec(),
                    result: result.clone(),
                })
                .collect();
            let done = store.complete_batch(&items).await?;
            Ok(done.into_iter().filter(Result::is_ok).count())
        }
    }
}

/// Runs `clients` workers for `duration`; `pace` spaces each worker's units (rate limiting).
async fn run_workers(
    target: &Target,
    mode: Mode,
    clients: usize,
    batch: usize,
    duration: Duration,
    pace: Option<Duration>,
    run: &str,
) -> anyhow::Result<Figures> {
    let per_unit = if mode == Mode::Single { 1 } else { batch };
    let started = Instant::now();
    let workers = (0..clients).map(|worker| {
        let target = target.clone();
        let run = run.to_owned();
        tokio::spawn(async move {
            let mut figures = Figures::default();
            // Paced workers start spread over one pace, so arrivals come at a steady rate rather
            // than in bursts of `clients` at once.
            let mut next = Instant::now()
                + pace.map_or(Duration::ZERO, |pace| {
                    pace.mul_f64(worker as f64 / clients as f64)
                });
            let mut n = 0usize;
            while started.elapsed() < duration {
                if let Some(pace) = pace {
                    tokio::time::sleep_until(next.into()).await;
                    next += pace;
                }
                let ids = (0..per_unit)
                    .map(|i| format!("{run}-{worker}-{n}-{i}"))
                    .collect();
                n += 1;
                let unit = Instant::now();
                figures.pairs += pairs(&target, ids).await?;
                figures.latencies.push(unit.elapsed());
            }
            Ok::<_, anyhow::Error>(figures)
        })
    });
    let mut total = Figures::default();
    for worker in futures::future::join_all(workers).await {
        let figures = worker??;
        total.pairs += figures.pairs;
        total.latencies.extend(figures.latencies);
    }
    total.elapsed = started.elapsed();
    Ok(total)
}
