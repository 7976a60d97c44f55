//! `outbox-relay-bench`: the relay's figures, printed, not asserted.
//!
//! - Throughput: the relay publishing a backlog of 1 KB events (exactly-once, in transactions)
//!   ÷ a plain idempotent producer sending the same records to the same broker, in interleaved
//!   rounds so drift hits both alike. Target ≥ 0.5.
//! - Commit-to-visible latency at half the relay's peak: from a domain transaction's commit
//!   returning to the record reaching a `read_committed` consumer, p50 and p99. Target p99 ≤
//!   100 ms.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Parser;
use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::message::Headers as _;
use rdkafka::producer::{BaseRecord, Producer as _, ThreadedProducer};
use rdkafka::{ClientConfig, Message as _};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use tokio_util::sync::CancellationToken;

use eos_core::{EntityId, EventId, Guarantee};
use eos_outbox::OutboxEvent;
use eos_outbox::relay_positions::relayed_position;
use eos_runtime::ops_http::Readiness;

use crate::relay_loop::{RelayLoop, RelaySettings};

/// Prints the relay's throughput against a plain producer, and its commit-to-visible latency.
/// Use a scratch database: the bench empties the outbox tables.
#[derive(Debug, Clone, Parser)]
#[command(name = "outbox-relay-bench", version, about)]
pub struct BenchArgs {
    /// A scratch PostgreSQL database (the outbox tables are emptied).
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: String,

    #[arg(
        long,
        env = "KAFKA_BOOTSTRAP_SERVERS",
        default_value = "127.0.0.1:9092"
    )]
    pub bootstrap_servers: String,

    /// Events per throughput run.
    #[arg(long, default_value_t = 20_000)]
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
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

fn client_config(args: &BenchArgs) -> ClientConfig {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", &args.bootstrap_servers);
    config
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
fn plain_producer_rate(args: &BenchArgs, topic: &str, filler: &str) -> anyhow::Result<f64> {
    let producer: ThreadedProducer<rdkafka::producer::DefaultProducerContext> = client_config(args)
        .set("enable.idempotence", "true")
        .set("acks", "all")
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
        let mut record = BaseRecord::<str, [u8]>::to(topic).key(key).payload(value);
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((_, returned)) => {
                    record = returned;
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
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

fn settings(args: &BenchArgs, relay_name: &str) -> RelaySettings {
    RelaySettings {
        client_config: client_config(args),
        guarantee: Guarantee::ExactlyOnce,
        relay_name: relay_name.to_owned(),
        transactional_id: format!("outbox-relay-{relay_name}"),
        positions_topic: format!("{relay_name}-positions"),
        batch_size: args.batch_size,
        poll_interval: Duration::from_millis(100),
        transaction_timeout: Duration::from_secs(10),
    }
}

/// A relay of its own, running in this process until the returned token is cancelled.
async fn start_relay(
    args: &BenchArgs,
    pool: &PgPool,
    relay_name: &str,
) -> anyhow::Result<(
    CancellationToken,
    tokio::task::JoinHandle<anyhow::Result<()>>,
)> {
    let settings = settings(args, relay_name);
    crate::position_topic::ensure_positions_topic(
        &settings.client_config,
        &settings.positions_topic,
        &eos_runtime::topic_config::TopicReplicationFlags::default(),
    )
    .await?;
    let relay = RelayLoop::start(settings, pool.clone()).await?;
    let shutdown = CancellationToken::new();
    let token = shutdown.clone();
    let task = tokio::spawn(async move {
        relay
            .run(&token, &Readiness::default())
            .await
            .map_err(anyhow::Error::from)
    });
    Ok((shutdown, task))
}

/// The relay publishing a backlog of `events` rows, from its first read to its last commit.
async fn relay_rate(
    args: &BenchArgs,
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
    let (shutdown, task) = start_relay(args, pool, &relay_name).await?;
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
    pool: &PgPool,
    topic: &str,
    rate: f64,
    filler: &str,
) -> anyhow::Result<Vec<f64>> {
    reset(pool).await?;
    // The topic exists before the consumer subscribes, so it is assigned at once and reads from
    // the start of a topic with nothing in it yet.
    let admin: rdkafka::admin::AdminClient<rdkafka::client::DefaultClientContext> =
        client_config(args).create()?;
    let new_topic =
        rdkafka::admin::NewTopic::new(topic, 3, rdkafka::admin::TopicReplication::Fixed(-1));
    for result in admin
        .create_topics([&new_topic], &rdkafka::admin::AdminOptions::new())
        .await?
    {
        result.map_err(|(topic, code)| anyhow::anyhow!("cannot create {topic}: {code}"))?;
    }
    let (sender, receiver) = std::sync::mpsc::channel::<(String, Instant)>();
    let stop = Arc::new(AtomicBool::new(false));
    let consumer: BaseConsumer = client_config(args)
        .set("group.id", format!("outbox-bench-{}", std::process::id()))
        .set("isolation.level", "read_committed")
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .set("fetch.wait.max.ms", "5")
        .create()?;
    consumer.subscribe(&[topic])?;
    let reader_stop = Arc::clone(&stop);
    let reader = std::thread::spawn(move || {
        while !reader_stop.load(Ordering::Relaxed) {
            if let Some(Ok(message)) = consumer.poll(Duration::from_millis(20)) {
                let seen = Instant::now();
                let id = message.headers().and_then(|headers| {
                    headers
                        .iter()
                        .find(|h| h.key == "event_id")
                        .and_then(|h| h.value)
                        .map(|v| String::from_utf8_lossy(v).into_owned())
                });
                if let Some(id) = id {
                    let _ = sender.send((id, seen));
                }
            }
        }
    });
    let relay_name = format!("bench-{}-latency", std::process::id());
    let (shutdown, task) = start_relay(args, pool, &relay_name).await?;
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
    let mut seen: HashMap<String, Instant> = HashMap::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while seen.len() < committed.len() && Instant::now() < deadline {
        while let Ok((id, at)) = receiver.try_recv() {
            seen.entry(id).or_insert(at);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let _ = reader.join();
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

pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    let pool = PgPoolOptions::new()
        .max_connections(8)
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
            let (args, topic, filler) = (args.clone(), plain_topic.clone(), filler.clone());
            tokio::task::spawn_blocking(move || plain_producer_rate(&args, &topic, &filler))
                .await??
        };
        plain.push(rate);
        relayed.push(relay_rate(&args, &pool, &relay_topic, round, &filler).await?);
    }
    let (plain, relayed) = (median(plain), median(relayed));
    let latency_rate = relayed / 2.0;
    let latency_topic = format!("outbox-bench-latency-{pid}");
    let latencies = latencies(&args, &pool, &latency_topic, latency_rate, &filler).await?;
    reset(&pool).await?;
    pool.close().await;

    println!(
        "outbox-relay bench: {} events of ~{} bytes, {} rows per relay transaction, median of {} interleaved rounds",
        args.events, args.record_bytes, args.batch_size, args.rounds
    );
    println!("  plain idempotent producer        {plain:>10.0} records/s");
    println!(
        "  relay, exactly-once              {relayed:>10.0} records/s   ÷ plain = {:.2} (target ≥ 0.5)",
        relayed / plain
    );
    println!(
        "  commit → visible (read_committed) at {latency_rate:.0} events/s for {:?}: p50 {:.1} ms, p99 {:.1} ms over {} events (target p99 ≤ 100 ms)",
        args.latency_run,
        percentile(&latencies, 0.5) * 1e3,
        percentile(&latencies, 0.99) * 1e3,
        latencies.len()
    );
    Ok(())
}
