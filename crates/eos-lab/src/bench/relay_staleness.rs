//! `eos-lab bench relay --blocker 60s`: commit → visible of both relay modes side by side while a
//! write transaction stays open in another database of the same server — what the xmin mode
//! waits for and the logical mode does not (docs/architecture/outbox.md). Printed, not
//! asserted.
//!
//! One scratch database per mode plus one for the blocker, created next to `--database-url` and
//! dropped at the end (with the logical relay's slot). The relays run in this process, the
//! writers commit one event per transaction at `--staleness-rate` into each outbox for as long
//! as the blocker is open, and a `read_committed` consumer notes when each event arrives.

use std::collections::HashMap;
use std::str::FromStr as _;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use eos_runtime::postgres_pool::PoolBuilder;
use rdkafka::ClientConfig;
use serde::Serialize;
use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions as _, Connection as _, PgPool};

use eos_core::{EntityId, EventId, Guarantee};
use eos_outbox::OutboxEvent;
use eos_testkit::bench_figures::load_average;
use outbox_relay::logical::LogicalSource;

use crate::bench::relay_in_process::spawn_relay;
use crate::bench::visibility_reader::VisibilityReader;
use outbox_relay::logical_stream::ReplicationTarget;
use outbox_relay::relay_loop::RelaySettings;

/// What one mode measured.
#[derive(Debug, Clone, Serialize)]
pub struct ModeStaleness {
    pub mode: &'static str,
    pub events: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

/// The staleness run (`--json` prints it as is).
#[derive(Debug, Clone, Serialize)]
pub struct StalenessReport {
    pub blocker_seconds: f64,
    pub rate_per_mode: f64,
    pub cores: usize,
    pub load_before: Option<[f64; 3]>,
    pub modes: Vec<ModeStaleness>,
    /// The most WAL the logical relay's slot held during the run (its restart_lsn stays behind
    /// the blocker's first record).
    pub slot_retained_wal_bytes_max: i64,
}

/// The logical mode's commit → visible p99 target under the blocker, in milliseconds.
pub const TARGET_LOGICAL_P99_MS: f64 = 1000.0;

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

struct Scratch {
    server: PgConnectOptions,
    names: Vec<String>,
}

impl Scratch {
    async fn create(&mut self, name: String) -> anyhow::Result<PgPool> {
        let mut conn = self.server.connect().await?;
        sqlx::query(&format!("CREATE DATABASE \"{name}\""))
            .execute(&mut conn)
            .await
            .with_context(|| format!("creating database {name}"))?;
        conn.close().await.ok();
        self.names.push(name.clone());
        Ok(PoolBuilder::new(8)
            .connect_with(self.server.clone().database(&name))
            .await?)
    }

    async fn drop_all(self, server_url: &str) {
        for name in self.names {
            if let Err(error) =
                eos_testkit::scratch_database::drop_database(server_url, &name).await
            {
                tracing::warn!(%error, database = %name, "cannot drop the bench's database");
            }
        }
    }
}

/// Runs both modes under one blocker of `blocker`, writing `rate` events/s into each outbox.
pub async fn measure(
    database_url: &str,
    kafka: &ClientConfig,
    blocker: Duration,
    rate: f64,
) -> anyhow::Result<StalenessReport> {
    let load_before = load_average();
    let mut scratch = Scratch {
        server: PgConnectOptions::from_str(database_url)?,
        names: Vec::new(),
    };
    let result = run(
        &mut scratch,
        database_url,
        kafka,
        blocker,
        rate,
        load_before,
    )
    .await;
    scratch.drop_all(database_url).await;
    result
}

async fn run(
    scratch: &mut Scratch,
    database_url: &str,
    kafka: &ClientConfig,
    blocker: Duration,
    rate: f64,
    load_before: Option<[f64; 3]>,
) -> anyhow::Result<StalenessReport> {
    let pid = std::process::id();
    let modes = ["xmin", "logical"];
    let mut outboxes = Vec::new();
    for mode in modes {
        let pool = scratch
            .create(format!("eos_bench_stale_{mode}_{pid}"))
            .await?;
        eos_outbox::migrator().run(&pool).await?;
        outboxes.push((mode, pool, format!("outbox-bench-stale-{mode}-{pid}")));
    }
    let blocker_pool = scratch
        .create(format!("eos_bench_stale_blocker_{pid}"))
        .await?;
    let replication_target = ReplicationTarget::from_url(database_url)?
        .with_database(format!("eos_bench_stale_logical_{pid}"));

    let topics: Vec<String> = outboxes.iter().map(|(_, _, topic)| topic.clone()).collect();
    let visibility = VisibilityReader::start(kafka, "outbox-bench-stale", &topics).await?;

    // The relays start before the blocker: a new slot waits for the transactions running then.
    let mut relays = Vec::new();
    for (mode, pool, _) in &outboxes {
        let settings = relay_settings(kafka, mode, pool, &replication_target, pid);
        relays.push(spawn_relay(settings, pool).await?);
    }
    // Let the consumer join its group before the first commit.
    tokio::time::sleep(Duration::from_secs(3)).await;

    // A write, as a migration or a batch job makes: its first WAL record is what the slot's
    // restart_lsn stays behind (an xid taken with no write holds the xmin but writes no WAL).
    let mut held = blocker_pool.acquire().await?;
    sqlx::query("CREATE TABLE blocker (n BIGINT)")
        .execute(&mut *held)
        .await?;
    sqlx::query("BEGIN").execute(&mut *held).await?;
    sqlx::query("INSERT INTO blocker VALUES (1)")
        .execute(&mut *held)
        .await?;
    let blocked_at = Instant::now();
    let writers: Vec<_> = outboxes
        .iter()
        .map(|(mode, pool, topic)| {
            let writer = OutboxWriter {
                mode,
                pool: pool.clone(),
                topic: topic.clone(),
                rate,
            };
            tokio::spawn(writer.write(blocked_at, blocker))
        })
        .collect();
    // What the slot holds, and what one read costs, while the blocker is open.
    let logical_pool = outboxes[1].1.clone();
    let slot = outbox_relay::config::slot_name_from(&format!("bench-stale-logical-{pid}"));
    let source = LogicalSource::new(
        logical_pool,
        slot,
        "eos_outbox".into(),
        replication_target.clone(),
    );
    let mut retained_max = 0i64;
    while blocked_at.elapsed() < blocker {
        if let Ok(Some(state)) = source.slot_state().await {
            retained_max = retained_max.max(state.retained_bytes.unwrap_or(0));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let mut committed: Vec<(&'static str, HashMap<String, Instant>)> = Vec::new();
    for writer in writers {
        let (mode, list) = writer.await??;
        committed.push((mode, list.into_iter().collect()));
    }
    sqlx::query("COMMIT").execute(&mut *held).await?;
    drop(held);

    let total: usize = committed.iter().map(|(_, list)| list.len()).sum();
    let seen = visibility.collect(total, Duration::from_secs(120)).await;
    for (shutdown, task) in relays {
        shutdown.cancel();
        task.await??;
    }
    anyhow::ensure!(
        seen.len() >= total,
        "only {} of {total} committed events became visible",
        seen.len()
    );
    let modes = committed
        .into_iter()
        .map(|(mode, list)| mode_staleness(mode, &list, &seen))
        .collect();
    Ok(StalenessReport {
        blocker_seconds: blocker.as_secs_f64(),
        rate_per_mode: rate,
        cores: std::thread::available_parallelism().map_or(0, usize::from),
        load_before,
        modes,
        slot_retained_wal_bytes_max: retained_max,
    })
}

/// A relay of `mode` ("xmin" or "logical") over `pool`'s outbox, with outbox-relay's defaults.
fn relay_settings(
    kafka: &ClientConfig,
    mode: &str,
    pool: &PgPool,
    replication_target: &ReplicationTarget,
    pid: u32,
) -> RelaySettings {
    let relay_name = format!("bench-stale-{mode}-{pid}");
    RelaySettings {
        client_config: kafka.clone(),
        guarantee: Guarantee::ExactlyOnce,
        transactional_id: format!("outbox-relay-{relay_name}"),
        positions_topic: format!("{relay_name}-positions"),
        batch_size: 5000,
        poll_interval: Duration::from_secs(1),
        // outbox-relay's default (--linger).
        linger: Duration::from_millis(20),
        transaction_timeout: Duration::from_secs(10),
        logical: (mode == "logical").then(|| {
            LogicalSource::new(
                pool.clone(),
                outbox_relay::config::slot_name_from(&relay_name),
                "eos_outbox".into(),
                replication_target.clone(),
            )
        }),
        idle_position_interval: Duration::from_secs(5),
        value_schemas: None,
        relay_name,
    }
}

/// Commits one event at a time into one mode's outbox, at a fixed rate.
struct OutboxWriter {
    mode: &'static str,
    pool: PgPool,
    topic: String,
    rate: f64,
}

impl OutboxWriter {
    /// Writes for `length` from `from`; each event id with the moment its transaction committed.
    async fn write(
        self,
        from: Instant,
        length: Duration,
    ) -> anyhow::Result<(&'static str, Vec<(String, Instant)>)> {
        let mut committed = Vec::new();
        let mut n = 0usize;
        while from.elapsed() < length {
            let due = from + Duration::from_secs_f64(n as f64 / self.rate);
            tokio::time::sleep_until(due.into()).await;
            let id = format!("stale-{}-{n}", self.mode);
            let mut event = OutboxEvent::new(
                &self.topic,
                EventId::new(id.clone())?,
                EntityId::new(format!("acct-{}", n % 50))?,
                1 + n as i64,
            );
            event.payload = Some(serde_json::json!({ "n": n }));
            let mut tx = self.pool.begin().await?;
            eos_outbox::enqueue(&mut tx, &event).await?;
            tx.commit().await?;
            committed.push((id, Instant::now()));
            n += 1;
        }
        Ok((self.mode, committed))
    }
}

/// One mode's commit → visible latencies.
fn mode_staleness(
    mode: &'static str,
    committed: &HashMap<String, Instant>,
    seen: &HashMap<String, Instant>,
) -> ModeStaleness {
    let mut latencies: Vec<f64> = committed
        .iter()
        .filter_map(|(id, at)| {
            seen.get(id)
                .map(|seen| seen.saturating_duration_since(*at).as_secs_f64() * 1e3)
        })
        .collect();
    latencies.sort_by(f64::total_cmp);
    ModeStaleness {
        mode,
        events: latencies.len(),
        p50_ms: percentile(&latencies, 0.5),
        p99_ms: percentile(&latencies, 0.99),
        max_ms: latencies.last().copied().unwrap_or(f64::NAN),
    }
}

impl StalenessReport {
    pub fn table(&self) -> String {
        use std::fmt::Write as _;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "outbox-relay staleness: a write transaction open in another database for {:.0} s; \
             one-event transactions at {:.0}/s into each mode's outbox meanwhile; {} cores, load \
             before {}",
            self.blocker_seconds,
            self.rate_per_mode,
            self.cores,
            eos_testkit::bench_figures::load_text(self.load_before)
        );
        let _ = writeln!(
            out,
            "  {:<8} {:>7} {:>12} {:>12} {:>12}",
            "mode", "events", "p50 ms", "p99 ms", "max ms"
        );
        for mode in &self.modes {
            let _ = writeln!(
                out,
                "  {:<8} {:>7} {:>12.1} {:>12.1} {:>12.1}",
                mode.mode, mode.events, mode.p50_ms, mode.p99_ms, mode.max_ms
            );
        }
        let _ = writeln!(
            out,
            "  logical target: p99 ≤ {TARGET_LOGICAL_P99_MS:.0} ms; its slot held up to {:.1} MiB \
             of WAL (its restart_lsn stays behind the blocker's first record)",
            self.slot_retained_wal_bytes_max as f64 / (1024.0 * 1024.0),
        );
        out
    }
}
