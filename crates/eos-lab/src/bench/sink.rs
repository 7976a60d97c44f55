//! `eos-lab bench sink`: figures for the sink's write path, printed, not asserted.
//!
//! On the same indexed table shape (`event_sink`), in interleaved rounds (the order of the
//! variants rotates every round) so drift (autovacuum, caches, other load) hits every variant
//! alike; each ratio is taken within a round, then its median and spread over the rounds:
//! - idempotent insert with the checkpoint in the same transaction (the sink's write path,
//!   `--offsets postgres`) rows/s ÷ raw `COPY` rows/s — and the same for the other write path
//!   ([`WritePath::Unnest`]: one `UNNEST` statement);
//! - a 100% duplicate replay ÷ a fresh insert (and the table must not grow);
//! - checkpoint mode (rows + the epoch-guarded checkpoint update in one transaction) ÷ the
//!   idempotent insert alone;
//! - end to end: records on a topic → rows in the table, with the real service in-process.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::{Args, Parser as _};
use eos_core::Checkpoint;
use eos_runtime::kafka_clients;
use eos_runtime::kafka_settings::KafkaSettings;
use eos_runtime::postgres_pool::PoolBuilder;
use eos_testkit::bench_figures::{Figure, load_average, load_text};
use rdkafka::producer::{BaseRecord, Producer as _, ThreadedProducer};
use serde::Serialize;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use sink_writer::checkpoint_store::{self, Move};
use sink_writer::decision::{self, TargetView};
use sink_writer::mapping::{self, EventFormat, InputRecord};
use sink_writer::schema::{self, PreparedTarget};
use sink_writer::table_writer::{self, WritePath};
use sink_writer::{migrator, targets};

/// Prints throughput figures of the sink's write path against a real PostgreSQL (and Kafka for
/// the end-to-end figure). Use a scratch database: the bench truncates event_sink.
#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// A scratch PostgreSQL database (event_sink and bench_raw are truncated).
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: String,

    /// Rows per run of each variant.
    #[arg(long, default_value_t = 20_000)]
    pub rows: usize,

    /// Rows per batch (one transaction).
    #[arg(long, default_value_t = 2_000)]
    pub batch: usize,

    /// Interleaved rounds; each figure is the median over them, with the spread.
    #[arg(long, default_value_t = 5)]
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
                decoded: None,
            }
        })
        .collect()
}

/// The sink's own statement, batch by batch; with `checkpoint`, each transaction also moves a
/// fenced checkpoint row, as `--offsets postgres` does.
async fn idempotent(
    pool: &PgPool,
    target: &PreparedTarget,
    rows: &[InputRecord],
    batch: usize,
    checkpoint: Option<i64>,
    path: WritePath,
) -> anyhow::Result<f64> {
    let views = [TargetView {
        shape: &target.shape,
        kind: target.spec.kind,
    }];
    let started = Instant::now();
    for chunk in rows.chunks(batch) {
        let decided = decision::decide(chunk, &views, &EventFormat::ledger());
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
        table_writer::write_target_via(
            &mut tx,
            target,
            &decided.candidates[0],
            &decided.send[0],
            path,
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
            let event = mapping::decode(record, &EventFormat::ledger())
                .map_err(|r| anyhow::anyhow!("{r:?}"))?;
            let payload = event
                .raw
                .get("payload")
                .map(eos_core::fingerprint::canonical_json)
                .unwrap_or_default();
            text.push_str(&format!(
                "{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\n",
                event.event_id,
                event.entity_id,
                event
                    .raw
                    .get("value")
                    .and_then(serde_json::Value::as_i64)
                    .unwrap_or_default(),
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
async fn end_to_end(
    args: &BenchArgs,
    kafka: &KafkaSettings,
    pool: &PgPool,
) -> anyhow::Result<(f64, Duration)> {
    let topic = format!("sink-bench-{}-{}", std::process::id(), rand_suffix());
    let producer: ThreadedProducer<rdkafka::producer::DefaultProducerContext> =
        kafka_clients::idempotent_producer(&kafka.client_config())
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
    let properties: Vec<String> = kafka
        .properties
        .iter()
        .flat_map(|(key, value)| ["-X".to_owned(), format!("{key}={value}")])
        .collect();
    let config = sink_writer::Config::try_parse_from(
        [
            "sink-writer",
            "--database-url",
            &args.database_url,
            "--bootstrap-servers",
            &kafka.bootstrap_servers,
            "--topic",
            &topic,
            "--group-id",
            &group,
            "--instance-id",
            "bench",
            "--metrics-addr",
            "127.0.0.1:0",
        ]
        .into_iter()
        .map(str::to_owned)
        .chain(properties),
    )?;
    let shutdown = CancellationToken::new();
    let started = Instant::now();
    let service = tokio::spawn(sink_writer::run(config, shutdown.clone()));
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

/// The interleaved measurements of one run of the bench.
#[derive(Debug, Clone, Serialize)]
pub struct SinkBenchReport {
    pub rows: usize,
    pub batch: usize,
    pub rounds: usize,
    /// `/proc/loadavg` (1, 5, 15 minutes) before the first round, where there is one.
    pub load_before: Option<[f64; 3]>,
    pub cores: usize,
    /// rows/s of raw `COPY`.
    pub copy: Figure,
    /// By write path (`copy-fresh` is the sink's): rows/s of the idempotent insert with the
    /// checkpoint in the same transaction, and that ÷ raw `COPY` of the same round.
    pub paths: Vec<PathFigures>,
    /// The sink's path without the checkpoint, rows/s.
    pub insert_alone: Figure,
    /// The sink's path re-inserting the same rows (100% duplicates), rows/s.
    pub duplicate_replay: Figure,
    /// How many rows the duplicate replays added to the table in all (must be 0).
    pub duplicate_rows_added: i64,
    /// duplicate replay ÷ insert alone.
    pub duplicate_vs_fresh: Figure,
    /// insert with checkpoint ÷ insert alone (the sink's path).
    pub checkpoint_vs_insert: Figure,
    /// End to end, topic → table, rows/s (start-up included) and seconds; `None` when skipped.
    pub end_to_end: Option<(f64, f64)>,
}

#[derive(Debug, Clone, Serialize)]
pub struct PathFigures {
    pub path: &'static str,
    pub rows_per_second: Figure,
    pub vs_copy: Figure,
}

/// The sink's target: idempotent insert with the checkpoint ÷ raw COPY (docs/BENCHMARKS-sink.md).
pub const TARGET_VS_COPY: f64 = 0.6;

/// One variant of a round.
#[derive(Debug, Clone, Copy)]
enum Variant {
    Copy,
    Checkpointed(WritePath),
    /// The sink's path without the checkpoint, then the same rows again (all duplicates).
    InsertThenReplay,
}

/// Runs the interleaved rounds (and the end-to-end figure) against a scratch database.
pub async fn measure(args: &BenchArgs, kafka: &KafkaSettings) -> anyhow::Result<SinkBenchReport> {
    anyhow::ensure!(args.rounds > 0, "--rounds must be at least 1");
    anyhow::ensure!(
        args.rows > 0 && args.batch > 0,
        "--rows and --batch must be positive"
    );
    let load_before = load_average();
    let pool = PoolBuilder::new(4)
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

    let mut variants = vec![Variant::Copy, Variant::InsertThenReplay];
    variants.extend(WritePath::ALL.map(Variant::Checkpointed));
    let mut copy = Vec::new();
    let mut checkpointed: Vec<Vec<f64>> = vec![Vec::new(); WritePath::ALL.len()];
    let (mut alone, mut duplicate) = (Vec::new(), Vec::new());
    let mut grew = 0;
    for round in 0..args.rounds {
        let rows = records(&format!("r{round}"), args.rows);
        // Every variant starts from an empty table; the order rotates so each goes first once
        // in a while.
        let shift = round % variants.len();
        for variant in variants[shift..].iter().chain(&variants[..shift]) {
            sqlx::raw_sql("TRUNCATE event_sink; TRUNCATE bench_raw;")
                .execute(&pool)
                .await?;
            match *variant {
                Variant::Copy => copy.push(raw_copy(&pool, &rows, args.batch).await?),
                Variant::Checkpointed(path) => {
                    let rate = idempotent(&pool, &target, &rows, args.batch, Some(1), path).await?;
                    let slot = WritePath::ALL.iter().position(|p| *p == path).unwrap_or(0);
                    checkpointed[slot].push(rate);
                    anyhow::ensure!(
                        count(&pool, "event_sink").await? == args.rows as i64,
                        "{} wrote a different number of rows",
                        path.as_str()
                    );
                }
                Variant::InsertThenReplay => {
                    let path = WritePath::CopyFresh;
                    alone.push(idempotent(&pool, &target, &rows, args.batch, None, path).await?);
                    let before = count(&pool, "event_sink").await?;
                    duplicate
                        .push(idempotent(&pool, &target, &rows, args.batch, None, path).await?);
                    grew += count(&pool, "event_sink").await? - before;
                }
            }
        }
    }
    let paths: Vec<PathFigures> = WritePath::ALL
        .iter()
        .zip(&checkpointed)
        .map(|(path, rates)| PathFigures {
            path: path.as_str(),
            rows_per_second: Figure::new(rates.clone()),
            vs_copy: Figure::ratio(rates, &copy),
        })
        .collect();
    let end_to_end = if args.end_to_end > 0 {
        sqlx::raw_sql("TRUNCATE event_sink; TRUNCATE entity_state;")
            .execute(&pool)
            .await?;
        let (rate, elapsed) = end_to_end(args, kafka, &pool).await?;
        Some((rate, elapsed.as_secs_f64()))
    } else {
        None
    };
    sqlx::raw_sql(
        "DROP TABLE IF EXISTS bench_raw; DELETE FROM sink_checkpoints WHERE sink = 'bench';",
    )
    .execute(&pool)
    .await?;
    Ok(SinkBenchReport {
        rows: args.rows,
        batch: args.batch,
        rounds: args.rounds,
        load_before,
        cores: std::thread::available_parallelism().map_or(0, usize::from),
        checkpoint_vs_insert: Figure::ratio(&checkpointed[0], &alone),
        duplicate_vs_fresh: Figure::ratio(&duplicate, &alone),
        copy: Figure::new(copy),
        paths,
        insert_alone: Figure::new(alone),
        duplicate_replay: Figure::new(duplicate),
        duplicate_rows_added: grew,
        end_to_end,
    })
}

impl SinkBenchReport {
    /// The human table: per-round ratios, then median and spread, with the targets.
    pub fn table(&self) -> String {
        use std::fmt::Write as _;
        let mut out = String::new();
        let load = load_text(self.load_before);
        let _ = writeln!(
            out,
            "sink-writer bench: {} rows per run, {} rows per batch, {} interleaved rounds; \
             {} cores, load before {load}",
            self.rows, self.batch, self.rounds, self.cores
        );
        let rounds = |figure: &Figure, digits: usize| {
            figure
                .rounds
                .iter()
                .map(|v| format!("{v:.digits$}"))
                .collect::<Vec<_>>()
                .join(" ")
        };
        let _ = writeln!(
            out,
            "  {:<44} {:>10} {:>15}  per round",
            "figure", "median", "spread"
        );
        let mut line = |name: &str, figure: &Figure, digits: usize, target: &str| {
            let _ = writeln!(
                out,
                "  {name:<44} {:>10.digits$} {:>15}  [{}]{target}",
                figure.median,
                format!("{:.digits$}–{:.digits$}", figure.min, figure.max),
                rounds(figure, digits),
            );
        };
        line("raw COPY rows/s", &self.copy, 0, "");
        for path in &self.paths {
            let sink = if path.path == WritePath::CopyFresh.as_str() {
                " (the sink's)"
            } else {
                ""
            };
            line(
                &format!("{}{sink} + checkpoint rows/s", path.path),
                &path.rows_per_second,
                0,
                "",
            );
            line(
                "  ÷ raw COPY",
                &path.vs_copy,
                2,
                if sink.is_empty() {
                    ""
                } else {
                    "   target ≥ 0.60"
                },
            );
        }
        line("insert alone rows/s", &self.insert_alone, 0, "");
        line(
            "100% duplicate replay rows/s",
            &self.duplicate_replay,
            0,
            "",
        );
        line(
            "  duplicate replay ÷ insert",
            &self.duplicate_vs_fresh,
            2,
            "   target ≥ 1.0",
        );
        line(
            "  insert + checkpoint ÷ insert alone",
            &self.checkpoint_vs_insert,
            2,
            "   target ≥ 0.95",
        );
        let _ = writeln!(
            out,
            "  duplicate replays added {} rows (must be 0)",
            self.duplicate_rows_added
        );
        if let Some((rate, seconds)) = self.end_to_end {
            let _ = writeln!(
                out,
                "  end to end topic → table {rate:>10.0} rows/s   ({seconds:.1}s, start-up included)"
            );
        }
        out
    }
}
