//! Prints Begin+Complete throughput and latency of a running dedup-service, next to the same SQL
//! run directly against its PostgreSQL (no gRPC), at 1, 16 and 64 concurrent clients, single and
//! batched; then p50/p99 at half the peak rate. A command that prints figures, not a test:
//!
//! ```text
//! cargo run --release -p dedup-service --example bench -- \
//!     --endpoint http://127.0.0.1:50051 --database-url postgres://eos:eos@127.0.0.1:5432/dedup
//! ```

use std::time::{Duration, Instant};

use clap::Parser;
use dedup_client::state_machine::BeginOutcome as Outcome;
use dedup_client::{BeginOutcome, BeginParams, DedupClient, FencingToken};
use dedup_service::intent_store::{self, HolderReport, IntentStore};
use dedup_service::validation::{BeginItem, CompleteItem};
use time::OffsetDateTime;

#[derive(Debug, Parser)]
struct Args {
    /// The service under test.
    #[arg(long, default_value = "http://127.0.0.1:50051")]
    endpoint: String,
    /// Its database, for the direct-SQL baseline (the same statements, no gRPC).
    #[arg(long, env = "DATABASE_URL")]
    database_url: String,
    /// Length of each measurement.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Items per BeginBatch.
    #[arg(long, default_value_t = 100)]
    batch: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Single,
    Batched,
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

    fn percentile(&self, p: f64) -> Duration {
        if self.latencies.is_empty() {
            return Duration::ZERO;
        }
        let mut sorted = self.latencies.clone();
        sorted.sort_unstable();
        let index = ((sorted.len() - 1) as f64 * p).round() as usize;
        sorted[index]
    }
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
            let params: Vec<BeginParams> = ids
                .iter()
                .map(|id| BeginParams {
                    operation_id: id.clone(),
                    fingerprint: vec![7; 32],
                    owner: "bench".into(),
                    occurred_at: OffsetDateTime::now_utc(),
                    lease_ttl: None,
                })
                .collect();
            let outcomes = if params.len() == 1 {
                vec![client.begin(&params[0]).await?]
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
            let done = client.complete_batch(many).await?;
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
async fn measure(
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

fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1000.0)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let grpc = Target::Grpc(Box::new(DedupClient::connect_lazy(&args.endpoint)?));
    let pool = intent_store::connect(&args.database_url, 32).await?;
    let sql = Target::Sql(IntentStore::new(pool, Duration::from_secs(30 * 24 * 3600)));
    let tag = format!("bench-{:x}", rand::random::<u32>());

    println!(
        "{:<8} {:>7} {:>12} {:>9} {:>9} {:>12} {:>9} {:>9} {:>7}",
        "mode",
        "clients",
        "grpc pairs/s",
        "p50 ms",
        "p99 ms",
        "sql pairs/s",
        "p50 ms",
        "p99 ms",
        "ratio"
    );
    let mut peak_single = 0.0f64;
    for mode in [Mode::Single, Mode::Batched] {
        for clients in [1, 16, 64] {
            let run = format!("{tag}-{mode:?}-{clients}");
            let g = measure(
                &grpc,
                mode,
                clients,
                args.batch,
                args.duration,
                None,
                &format!("{run}-g"),
            )
            .await?;
            let s = measure(
                &sql,
                mode,
                clients,
                args.batch,
                args.duration,
                None,
                &format!("{run}-s"),
            )
            .await?;
            if mode == Mode::Single {
                peak_single = peak_single.max(g.rate());
            }
            println!(
                "{:<8} {:>7} {:>12.0} {:>9} {:>9} {:>12.0} {:>9} {:>9} {:>7.2}",
                format!("{mode:?}").to_lowercase(),
                clients,
                g.rate(),
                ms(g.percentile(0.5)),
                ms(g.percentile(0.99)),
                s.rate(),
                ms(s.percentile(0.5)),
                ms(s.percentile(0.99)),
                g.rate() / s.rate().max(f64::EPSILON),
            );
        }
    }
    // Latency at half the single-pair peak, 16 clients each pacing its share.
    let clients = 16;
    let target_rate = peak_single / 2.0;
    let pace = Duration::from_secs_f64(clients as f64 / target_rate.max(1.0));
    let half = measure(
        &grpc,
        Mode::Single,
        clients,
        1,
        args.duration,
        Some(pace),
        &format!("{tag}-half"),
    )
    .await?;
    println!(
        "single at half the peak ({target_rate:.0} pairs/s target): {:.0} pairs/s, p50 {} ms, p99 {} ms",
        half.rate(),
        ms(half.percentile(0.5)),
        ms(half.percentile(0.99))
    );
    Ok(())
}
