//! `sink-writer-bench`: figures for the sink's write path, printed, not asserted.
//!
//! On the same indexed table shape (`event_sink`), in interleaved rounds so drift (autovacuum,
//! caches, other load) hits every variant alike:
//! - idempotent batch insert (the sink's statement) rows/s ÷ raw `COPY` rows/s;
//! - a 100% duplicate replay ÷ a fresh insert (and the table must not grow);
//! - checkpoint mode (rows + the epoch-guarded checkpoint update in one transaction) ÷ the
//!   idempotent insert alone;
//! - end to end: records on a topic → rows in the table, with the real service in-process.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Parser;
use eos_core::Checkpoint;
use rdkafka::ClientConfig;
use rdkafka::producer::{BaseRecord, Producer as _, ThreadedProducer};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use tokio_util::sync::CancellationToken;

use crate::checkpoint_store::{self, Move};
use crate::decision::{self, TargetView};
use crate::mapping::InputRecord;
use crate::schema::{self, PreparedTarget};
use crate::{migrator, targets};

/// Prints throughput figures of the sink's write path against a real PostgreSQL (and Kafka for
/// the end-to-end figure). Use a scratch database: the bench truncates event_sink.
#[derive(Debug, Clone, Parser)]
#[command(name = "sink-writer-bench", version, about)]
pub struct BenchArgs {
    /// A scratch PostgreSQL database (event_sink and bench_raw are truncated).
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: String,

    /// Kafka bootstrap servers, for the end-to-end figure.
    #[arg(
        long,
        env = "KAFKA_BOOTSTRAP_SERVERS",
        default_value = "127.0.0.1:9092"
    )]
    pub bootstrap_servers: String,

    /// Rows per run of each variant.
    #[arg(long, default_value_t = 20_000)]
    pub rows: usize,

    /// Rows per batch (one transaction).
    #[arg(long, default_value_t = 2_000)]
    pub batch: usize,

    /// Interleaved rounds; the figure is the median.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,

    /// Records for the end-to-end figure; 0 to skip it.
    #[arg(long, default_value_t = 50_000)]
    pub end_to_end: usize,
}

fn records(prefix: &str, count: usize) -> Vec<InputRecord> {
    (0..count)
        .map(|i| {
            let body = format!(
                r#"{{"event_id":"{prefix}-{i}","entity_id":"ent-{}","value":{},"payload":{{"n":{i}}}}}"#,
                i % 500,
                i + 1
            );
            InputRecord {
                topic: "bench".into(),
                partition: 0,
                offset: i as i64,
                key: None,
                payload: Some(body.into_bytes()),
                headers: Vec::new(),
                timestamp_ms: None,
            }
        })
        .collect()
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}

/// The sink's own statement, batch by batch; with `checkpoint`, each transaction also moves a
/// fenced checkpoint row, as `--offsets postgres` does.
async fn idempotent(
    pool: &PgPool,
    target: &PreparedTarget,
    rows: &[InputRecord],
    batch: usize,
    checkpoint: Option<i64>,
) -> anyhow::Result<f64> {
    let views = [TargetView {
        shape: &target.shape,
        kind: target.spec.kind,
    }];
    let started = Instant::now();
    for chunk in rows.chunks(batch) {
        let decided = decision::decide(chunk, &views, 1 << 20);
        let mut tx = pool.begin().await?;
        if let Some(epoch) = checkpoint {
            let next_offset = chunk.last().map(|r| r.offset + 1).unwrap_or(0);
            let moves = [Move {
                to: Checkpoint {
                    topic: "bench".into(),
                    partition: 0,
                    next_offset,
                },
                epoch,
            }];
            let moved = checkpoint_store::advance(&mut tx, "bench", &moves).await?;
            anyhow::ensure!(moved.len() == 1, "bench checkpoint not fenced to us");
        }
        crate::table_writer::write_target(
            &mut tx,
            target,
            &decided.candidates[0],
            &decided.send[0],
        )
        .await?;
        tx.commit().await?;
    }
    Ok(rows.len() as f64 / started.elapsed().as_secs_f64())
}

/// Raw `COPY` of the same rows into a table of the same shape and indexes.
async fn raw_copy(pool: &PgPool, rows: &[InputRecord], batch: usize) -> anyhow::Result<f64> {
    let started = Instant::now();
    for chunk in rows.chunks(batch) {
        let mut text = String::new();
        for record in chunk {
            let event = crate::mapping::decode(record.payload.as_deref(), 1 << 20)
                .map_err(|r| anyhow::anyhow!("{r:?}"))?;
            let payload = event
                .envelope
                .payload
                .as_ref()
                .map(eos_core::fingerprint::canonical_json)
                .unwrap_or_default();
            text.push_str(&format!(
                "{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\n",
                event.envelope.event_id,
                event.envelope.entity_id,
                event.envelope.value,
                payload,
                event.fingerprint,
                record.topic,
                record.partition,
                record.offset
            ));
        }
        let mut conn = pool.acquire().await?;
        let mut copy = conn
            .copy_in_raw(
                "COPY bench_raw (event_id, entity_id, value, payload, fingerprint, source_topic, \
                 source_partition, source_offset) FROM STDIN",
            )
            .await?;
        copy.send(text.into_bytes()).await?;
        copy.finish().await?;
    }
    Ok(rows.len() as f64 / started.elapsed().as_secs_f64())
}

async fn count(pool: &PgPool, table: &str) -> anyhow::Result<i64> {
    Ok(sqlx::query_scalar(&format!("SELECT COUNT(*) FROM {table}"))
        .fetch_one(pool)
        .await?)
}

/// Produces `count` envelopes to a fresh topic, runs the service in-process until its checkpoint
/// reaches the end, and returns rows/s (including start-up: fence, seek, first fetch).
async fn end_to_end(args: &BenchArgs, pool: &PgPool) -> anyhow::Result<(f64, Duration)> {
    let topic = format!("sink-bench-{}-{}", std::process::id(), rand_suffix());
    let producer: ThreadedProducer<rdkafka::producer::DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", &args.bootstrap_servers)
        .set("enable.idempotence", "true")
        .set("linger.ms", "20")
        .create()?;
    for record in records(&topic, args.end_to_end) {
        let key = format!("k{}", record.offset % 500);
        let payload = record.payload.unwrap_or_default();
        let mut base = BaseRecord::to(&topic).key(&key).payload(&payload);
        loop {
            match producer.send(base) {
                Ok(()) => break,
                Err((_, returned)) => {
                    base = returned;
                    std::thread::sleep(Duration::from_millis(2));
                }
            }
        }
    }
    producer.flush(Duration::from_secs(60))?;
    let group = format!("{topic}-sink");
    let config = crate::Config::try_parse_from([
        "sink-writer",
        "--database-url",
        &args.database_url,
        "--bootstrap-servers",
        &args.bootstrap_servers,
        "--topic",
        &topic,
        "--group-id",
        &group,
        "--instance-id",
        "bench",
        "--metrics-addr",
        "127.0.0.1:0",
    ])?;
    let shutdown = CancellationToken::new();
    let started = Instant::now();
    let service = tokio::spawn(crate::run(config, shutdown.clone()));
    let deadline = started + Duration::from_secs(600);
    loop {
        let done: Option<i64> = sqlx::query_scalar!(
            "SELECT SUM(next_offset)::BIGINT FROM sink_checkpoints WHERE sink = $1",
            group,
        )
        .fetch_one(pool)
        .await?;
        if done.unwrap_or(0) >= args.end_to_end as i64 {
            break;
        }
        anyhow::ensure!(Instant::now() < deadline, "end-to-end run did not finish");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let elapsed = started.elapsed();
    shutdown.cancel();
    service.await??;
    Ok((args.end_to_end as f64 / elapsed.as_secs_f64(), elapsed))
}

fn rand_suffix() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .connect(&args.database_url)
        .await
        .context("connecting to PostgreSQL")?;
    migrator().run(&pool).await?;
    sqlx::raw_sql(
        "DROP TABLE IF EXISTS bench_raw;
         CREATE TABLE bench_raw (LIKE event_sink INCLUDING ALL);
         INSERT INTO sink_checkpoints (sink, topic, partition, owner_epoch)
         VALUES ('bench', 'bench', 0, 1)
         ON CONFLICT (sink, topic, partition) DO UPDATE SET owner_epoch = 1;",
    )
    .execute(&pool)
    .await?;
    let target = schema::prepare(&pool, targets::defaults().remove(0)).await?;

    let (mut copy, mut fresh, mut duplicate, mut checkpointed) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut grew = 0;
    for round in 0..args.rounds {
        sqlx::raw_sql("TRUNCATE event_sink; TRUNCATE bench_raw;")
            .execute(&pool)
            .await?;
        let rows = records(&format!("r{round}"), args.rows);
        copy.push(raw_copy(&pool, &rows, args.batch).await?);
        // Both variants start from an empty table, and take turns going first.
        for variant in [round % 2, 1 - round % 2] {
            sqlx::raw_sql("TRUNCATE event_sink;").execute(&pool).await?;
            if variant == 0 {
                fresh.push(idempotent(&pool, &target, &rows, args.batch, None).await?);
                let before = count(&pool, "event_sink").await?;
                duplicate.push(idempotent(&pool, &target, &rows, args.batch, None).await?);
                grew += count(&pool, "event_sink").await? - before;
            } else {
                checkpointed.push(idempotent(&pool, &target, &rows, args.batch, Some(1)).await?);
            }
        }
    }
    let (copy, fresh, duplicate, checkpointed) = (
        median(copy),
        median(fresh),
        median(duplicate),
        median(checkpointed),
    );
    println!(
        "sink-writer bench: {} rows per run, {} rows per batch, median of {} interleaved rounds",
        args.rows, args.batch, args.rounds
    );
    println!("  raw COPY                         {copy:>10.0} rows/s");
    println!(
        "  idempotent batch insert          {fresh:>10.0} rows/s   ÷ COPY      = {:.2} (target ≥ 0.35)",
        fresh / copy
    );
    println!(
        "  100% duplicate replay            {duplicate:>10.0} rows/s   ÷ fresh     = {:.2} (target ≥ 1.0); table grew by {grew} rows",
        duplicate / fresh
    );
    println!(
        "  insert + checkpoint (one tx)     {checkpointed:>10.0} rows/s   ÷ insert    = {:.2} (target ≥ 0.95)",
        checkpointed / fresh
    );
    if args.end_to_end > 0 {
        sqlx::raw_sql("TRUNCATE event_sink; TRUNCATE entity_state;")
            .execute(&pool)
            .await?;
        let (rate, elapsed) = end_to_end(&args, &pool).await?;
        println!(
            "  end to end topic → table         {rate:>10.0} rows/s   ({} records in {:.1}s, start-up included)",
            args.end_to_end,
            elapsed.as_secs_f64()
        );
    }
    sqlx::raw_sql(
        "DROP TABLE IF EXISTS bench_raw; DELETE FROM sink_checkpoints WHERE sink = 'bench';",
    )
    .execute(&pool)
    .await?;
    Ok(())
}
