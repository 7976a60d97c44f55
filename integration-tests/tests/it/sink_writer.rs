//! sink-writer against the real broker and the real PostgreSQL, as a real child process:
//! SIGKILLed, paused into a zombie, cut off by a PostgreSQL restart — then checked in SQL against
//! what the topic holds (rows = distinct event_ids, sums, checkpoints = end offsets, conflicts =
//! the injected ones).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use eos_testkit::argv;
use integration_tests::eosctl::{self, Workload};
use integration_tests::service_process::ServiceProcess;
use integration_tests::{
    Isolation, PostgresRestartGuard, TestDatabase, arg_refs, create_topic, end_offsets,
    produce_records, read_topic, unique_name,
};
use rand::seq::SliceRandom as _;
use rand::{Rng as _, SeedableRng as _};
use rdkafka::Message as _;
use serde_json::{Value, json};
use sqlx::PgPool;

const DRAIN_TIMEOUT: Duration = Duration::from_secs(240);

/// One sink run's names.
pub(crate) struct Sink {
    pub(crate) topic: String,
    pub(crate) group: String,
    database_url: String,
}

impl Sink {
    pub(crate) fn new(topic: &str, database_url: &str) -> Self {
        Self {
            topic: topic.to_owned(),
            group: unique_name("sink"),
            database_url: database_url.to_owned(),
        }
    }

    fn dlq(&self) -> String {
        format!("{}.sink-dlq", self.topic)
    }

    pub(crate) fn spawn(
        &self,
        instance: &str,
        extra: &[&str],
        envs: &[(&str, &str)],
    ) -> anyhow::Result<ServiceProcess> {
        let mut args = argv!(sink_writer::Config {
            topic: &self.topic,
            group_id: &self.group,
            instance.instance_id: instance,
            database[database_url]: &self.database_url,
            metrics_addr: "127.0.0.1:0",
            max_backoff: "1s",
        });
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        ServiceProcess::spawn("sink-writer", &args, envs)
    }

    /// Waits until the checkpoint of every partition in `sink_checkpoints` is the topic's end.
    pub(crate) async fn wait_drained(
        &self,
        pool: &PgPool,
        process: &mut ServiceProcess,
    ) -> anyhow::Result<()> {
        let deadline = Instant::now() + DRAIN_TIMEOUT;
        loop {
            let (ends, stored) = self.checkpoints(pool).await?;
            if !ends.is_empty() && ends.iter().all(|(p, end)| stored.get(p) == Some(end)) {
                return Ok(());
            }
            if !process.is_running() {
                anyhow::bail!(
                    "sink {} exited before draining: ends {ends:?}, checkpoints {stored:?}\n{}",
                    self.group,
                    process.log_tail(40)
                );
            }
            if Instant::now() > deadline {
                anyhow::bail!(
                    "sink {} not drained after {DRAIN_TIMEOUT:?}: ends {ends:?}, checkpoints \
                     {stored:?}\n{}",
                    self.group,
                    process.log_tail(40)
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Waits until the sink has committed a checkpoint for every partition of the topic: it is
    /// past start-up, every partition is positioned, and batches are being written.
    async fn wait_writing_every_partition(
        &self,
        pool: &PgPool,
        process: &mut ServiceProcess,
    ) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let (ends, stored) = self.checkpoints(pool).await?;
            if !ends.is_empty()
                && ends
                    .iter()
                    .all(|(p, _)| stored.get(p).is_some_and(|&n| n > 0))
            {
                return Ok(());
            }
            if !process.is_running() || Instant::now() > deadline {
                anyhow::bail!(
                    "sink {} not writing every partition: ends {ends:?}, checkpoints \
                     {stored:?}\n{}",
                    self.group,
                    process.log_tail(40)
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// (topic end offsets, stored checkpoints) by partition.
    async fn checkpoints(
        &self,
        pool: &PgPool,
    ) -> anyhow::Result<(Vec<(i32, i64)>, BTreeMap<i32, i64>)> {
        let topic = self.topic.clone();
        let ends = tokio::task::spawn_blocking(move || end_offsets(&topic)).await??;
        let stored: Vec<(i32, Option<i64>)> = sqlx::query_as(
            "SELECT partition, next_offset FROM sink_checkpoints WHERE sink = $1 AND topic = $2",
        )
        .bind(&self.group)
        .bind(&self.topic)
        .fetch_all(pool)
        .await
        .unwrap_or_default();
        let stored = stored
            .into_iter()
            .filter_map(|(p, next)| next.map(|n| (p, n)))
            .collect();
        Ok((ends, stored))
    }
}

/// sink-writer's `--offsets kafka`.
fn kafka_offsets() -> Vec<String> {
    argv!(sink_writer::Config { offsets: "kafka" })
}

/// What the topic says the sink must have written, decided independently of the sink's code
/// paths (only the envelope parser and fingerprint are shared, as they are the contract).
#[derive(Debug, Default)]
pub(crate) struct TopicTruth {
    physical: usize,
    physical_sum: i64,
    /// event_id → (value, fingerprint) of its first occurrence.
    pub(crate) logical: HashMap<String, (i64, String)>,
    /// Positions of records reusing an event_id with another fingerprint.
    pub(crate) conflicts: HashSet<(i32, i64)>,
    /// Positions of records that are not valid envelopes.
    pub(crate) malformed: HashSet<(i32, i64)>,
    /// entity_id → (highest version, its event_id, its payload): what `entity_state` holds.
    latest: HashMap<String, (u64, String, Option<Value>)>,
    /// Positions of records with an entity's current version but another event or payload (two
    /// workloads both numbering an entity's versions from 1): conflicts in `entity_state`.
    state_conflicts: HashSet<(i32, i64)>,
}

impl TopicTruth {
    pub(crate) fn read(topic: &str) -> anyhow::Result<Self> {
        let mut truth = Self::default();
        for message in read_topic(topic, Isolation::ReadCommitted)? {
            truth.physical += 1;
            let position = (message.partition(), message.offset());
            // What the sink must accept: a ledger envelope under the sink's default contract.
            let (Ok(envelope), Ok(event)) = (
                eos_core::EventEnvelope::parse(message.payload().unwrap_or_default()),
                sink_writer::mapping::decode_value(
                    message.payload(),
                    &sink_writer::mapping::EventFormat::ledger(),
                ),
            ) else {
                truth.malformed.insert(position);
                continue;
            };
            let envelope = &envelope;
            truth.physical_sum += envelope.value;
            let fingerprint = event.fingerprint.to_hex();
            match truth.logical.get(envelope.event_id.as_str()) {
                None => {
                    truth
                        .logical
                        .insert(envelope.event_id.to_string(), (envelope.value, fingerprint));
                }
                Some((_, first)) if *first != fingerprint => {
                    truth.conflicts.insert(position);
                }
                Some(_) => {}
            }
            if let Some(version) = envelope.version {
                let incoming = (
                    version,
                    envelope.event_id.to_string(),
                    envelope.payload.clone(),
                );
                match truth.latest.get_mut(envelope.entity_id.as_str()) {
                    None => {
                        truth
                            .latest
                            .insert(envelope.entity_id.to_string(), incoming);
                    }
                    Some(latest) if version > latest.0 => *latest = incoming,
                    Some(latest) if version == latest.0 && *latest != incoming => {
                        truth.state_conflicts.insert(position);
                    }
                    Some(_) => {}
                }
            }
        }
        Ok(truth)
    }

    fn logical_sum(&self) -> i64 {
        self.logical.values().map(|(value, _)| value).sum()
    }
}

/// Every exactly-once check that can be made in SQL against the topic's truth.
async fn assert_exact(pool: &PgPool, sink: &Sink, truth: &TopicTruth) -> anyhow::Result<()> {
    let (rows, distinct, sum): (i64, i64, Option<i64>) = sqlx::query_as(
        "SELECT COUNT(*), COUNT(DISTINCT event_id), SUM(value)::BIGINT FROM event_sink",
    )
    .fetch_one(pool)
    .await?;
    assert_eq!(
        rows,
        truth.logical.len() as i64,
        "rows = distinct event_ids"
    );
    assert_eq!(distinct, rows);
    assert_eq!(
        sum.unwrap_or(0),
        truth.logical_sum(),
        "sum of first occurrences"
    );
    let stored: Vec<(String, i64, String)> =
        sqlx::query_as("SELECT event_id, value, fingerprint FROM event_sink")
            .fetch_all(pool)
            .await?;
    for (event_id, value, fingerprint) in &stored {
        let expected = truth
            .logical
            .get(event_id)
            .context("a row for an unknown event_id")?;
        assert_eq!(
            (value, fingerprint),
            (&expected.0, &expected.1),
            "{event_id} holds its first content"
        );
    }

    let conflicts: Vec<(String, i32, i64)> = sqlx::query_as(
        "SELECT target, source_partition, source_offset FROM sink_conflicts WHERE sink = $1",
    )
    .bind(&sink.group)
    .fetch_all(pool)
    .await?;
    let positions = |table: &str| -> HashSet<(i32, i64)> {
        conflicts
            .iter()
            .filter(|(target, _, _)| target == table)
            .map(|(_, p, o)| (*p, *o))
            .collect()
    };
    assert_eq!(
        conflicts.len(),
        truth.conflicts.len() + truth.state_conflicts.len(),
        "one conflict row per conflicting record"
    );
    assert_eq!(
        positions("event_sink"),
        truth.conflicts,
        "event_sink conflicts are the injected ones"
    );
    assert_eq!(positions("entity_state"), truth.state_conflicts);

    let dead: Vec<(i32, i64)> = sqlx::query_as(
        "SELECT source_partition, source_offset FROM sink_dead_letters WHERE sink = $1",
    )
    .bind(&sink.group)
    .fetch_all(pool)
    .await?;
    let dead: HashSet<(i32, i64)> = dead.into_iter().collect();
    assert_eq!(
        dead, truth.malformed,
        "one dead-letter row per malformed record"
    );
    let dlq = sink.dlq();
    let letters =
        tokio::task::spawn_blocking(move || read_topic(&dlq, Isolation::ReadCommitted)).await??;
    let mut dlq_positions = HashSet::new();
    for letter in &letters {
        let headers = letter.headers().context("dead letter without headers")?;
        let header = |name: &str| {
            eos_runtime::trace_context::header_str(headers, name)
                .and_then(|v| v.parse::<i64>().ok())
                .unwrap_or(-1)
        };
        dlq_positions.insert((
            header(eos_core::dead_letter::SOURCE_PARTITION_HEADER) as i32,
            header(eos_core::dead_letter::SOURCE_OFFSET_HEADER),
        ));
    }
    assert_eq!(
        dlq_positions, truth.malformed,
        "every malformed record is in the DLQ topic"
    );

    let states: Vec<(String, i64, String)> =
        sqlx::query_as("SELECT entity_id, version, event_id FROM entity_state")
            .fetch_all(pool)
            .await?;
    assert_eq!(states.len(), truth.latest.len(), "one state row per entity");
    for (entity, version, event_id) in &states {
        let (latest, latest_id, _) = truth.latest.get(entity).context("unknown entity")?;
        assert_eq!(
            (*version as u64, event_id),
            (*latest, latest_id),
            "entity {entity}"
        );
    }

    let (ends, stored) = sink.checkpoints(pool).await?;
    let ends: BTreeMap<i32, i64> = ends.into_iter().collect();
    assert_eq!(stored, ends, "stored checkpoint = topic end offsets");
    Ok(())
}

/// The chaos workload's figures must match what the topic holds, so the checks above compare
/// against the workload the issue asks for.
fn assert_workload(summary: &Value, truth: &TopicTruth, logical: i64) {
    assert_eq!(summary["logical_events"], logical);
    assert_eq!(truth.logical.len() as i64, logical);
    assert_eq!(
        summary["conflicts"].as_u64(),
        Some(truth.conflicts.len() as u64)
    );
    assert_eq!(
        summary["malformed"].as_u64(),
        Some(truth.malformed.len() as u64)
    );
    assert_eq!(
        summary["sum_logical_values"].as_i64(),
        Some(truth.logical_sum())
    );
}

fn envelope(event_id: &str, entity: i64, value: i64) -> (Option<String>, Vec<u8>) {
    let body = json!({"event_id": event_id, "entity_id": entity.to_string(), "value": value});
    (Some(entity.to_string()), body.to_string().into_bytes())
}

fn versioned(entity: i64, version: u64, payload: &str) -> (Option<String>, Vec<u8>) {
    let body = json!({
        "event_id": format!("v-{entity}-{version}"),
        "entity_id": entity.to_string(),
        "value": 0,
        "version": version,
        "payload": payload,
    });
    (Some(entity.to_string()), body.to_string().into_bytes())
}

/// The reference practice's pre-existing e-102 row, as the sink itself would have written it.
async fn preload_e102(pool: &PgPool) -> anyhow::Result<String> {
    sink_writer::migrator().run(pool).await?;
    let (_, bytes) = envelope("e-102", 17, 12500);
    let event = sink_writer::mapping::decode_value(
        Some(&bytes),
        &sink_writer::mapping::EventFormat::ledger(),
    )
    .map_err(|r| anyhow::anyhow!("{r:?}"))?;
    let fingerprint = event.fingerprint.to_hex();
    sqlx::query(
        "INSERT INTO event_sink (event_id, entity_id, value, fingerprint, written_at)
         VALUES ('e-102', '17', 12500, $1, '2026-01-01T00:00:00Z')",
    )
    .bind(&fingerprint)
    .execute(pool)
    .await?;
    Ok(fingerprint)
}

async fn fresh_topic(prefix: &str, partitions: i32) -> anyhow::Result<String> {
    let topic = unique_name(prefix);
    create_topic(&topic, partitions).await?;
    Ok(topic)
}

async fn produce(topic: &str, records: Vec<(Option<String>, Vec<u8>)>) -> anyhow::Result<()> {
    let topic = topic.to_owned();
    tokio::task::spawn_blocking(move || produce_records(&topic, &records)).await?
}

#[tokio::test(flavor = "multi_thread")]
async fn sink_seed_practice_two_rows_19500_and_e102_unchanged() -> anyhow::Result<()> {
    let db = TestDatabase::create().await?;
    let fingerprint = preload_e102(&db.pool).await?;
    let before: String = sqlx::query_scalar("SELECT row_to_json(e)::text FROM event_sink e")
        .fetch_one(&db.pool)
        .await?;
    let topic = fresh_topic("seed-attempts", 1).await?;
    produce(
        &topic,
        vec![
            envelope("e-102", 17, 12500),
            envelope("e-102", 17, 12500),
            envelope("e-103", 28, 7000),
        ],
    )
    .await?;

    let sink = Sink::new(&topic, &db.url);
    let mut process = sink.spawn("seed", &[], &[])?;
    sink.wait_drained(&db.pool, &mut process).await?;
    process.stop_gracefully()?;

    // The audit: 3 physical attempts (32000) on the topic, 2 logical events (19500) in the table.
    let truth = TopicTruth::read(&topic)?;
    assert_eq!((truth.physical, truth.physical_sum), (3, 32_000));
    // eosctl audit reports the same physical-vs-logical figures (its Kafka output side is empty
    // here, so it exits 1 for the missing outputs; only the input figures matter).
    let audit = integration_tests::eosctl::audit(
        &topic,
        &format!("{topic}-none"),
        &format!("{topic}-none.dlq"),
    )?;
    assert_eq!(audit.figure("valid_input_records"), 3);
    assert_eq!(audit.figure("sum_valid_input_values"), 32_000);
    assert_eq!(audit.figure("logical_events"), 2);
    assert_eq!(audit.figure("sum_logical_values"), 19_500);
    let (rows, sum): (i64, i64) =
        sqlx::query_as("SELECT COUNT(*), SUM(value)::BIGINT FROM event_sink")
            .fetch_one(&db.pool)
            .await?;
    assert_eq!((rows, sum), (2, 19_500));
    let after: String = sqlx::query_scalar(
        "SELECT row_to_json(e)::text FROM event_sink e WHERE event_id = 'e-102'",
    )
    .fetch_one(&db.pool)
    .await?;
    assert_eq!(after, before, "the stored e-102 row is unchanged");
    let conflicts: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM sink_conflicts")
        .fetch_one(&db.pool)
        .await?;
    assert_eq!(
        conflicts, 0,
        "a repeat with the same content is a duplicate, not a conflict"
    );
    let stored: String =
        sqlx::query_scalar("SELECT fingerprint FROM event_sink WHERE event_id = 'e-103'")
            .fetch_one(&db.pool)
            .await?;
    assert_ne!(stored, fingerprint, "e-103 has its own content");
    db.drop_database().await
}

#[tokio::test(flavor = "multi_thread")]
async fn sink_seed_versions_apply_only_when_higher_in_any_arrival_order() -> anyhow::Result<()> {
    let incoming = vec![
        versioned(17, 1, "a"),
        versioned(17, 2, "b"),
        versioned(28, 2, "y"),
        versioned(39, 1, "m"),
        versioned(39, 2, "n"),
    ];
    let mut shuffled = incoming.clone();
    shuffled.shuffle(&mut rand::rngs::StdRng::seed_from_u64(17));
    let mut reversed = incoming.clone();
    reversed.reverse();
    // Only the versioned target: the reference practice's entity_state on its own, through
    // --config.
    let config_path = std::env::temp_dir().join(format!("{}.toml", unique_name("sink-config")));
    std::fs::write(
        &config_path,
        r#"
[[targets]]
table = "entity_state"
kind = "versioned"
key = "entity_id"
version_column = "version"
[targets.columns]
entity_id = "entity_id"
version = "version"
payload = "payload"
event_id = "event_id"
updated_at = "now"
"#,
    )?;
    let config = config_path.display().to_string();

    for (name, order) in [
        ("forward", incoming),
        ("reversed", reversed),
        ("shuffled", shuffled),
    ] {
        let db = TestDatabase::create().await?;
        sink_writer::migrator().run(&db.pool).await?;
        sqlx::query(
            "INSERT INTO entity_state (entity_id, version, payload, event_id)
             VALUES ('17', 3, '\"c\"', 'v-17-3'), ('28', 1, '\"x\"', 'v-28-1')",
        )
        .execute(&db.pool)
        .await?;
        // One partition per order so the arrival order is exactly the one produced.
        let topic = fresh_topic("seed-versions", 1).await?;
        produce(&topic, order).await?;
        let sink = Sink::new(&topic, &db.url);
        let mut process = sink.spawn(
            name,
            &arg_refs(&argv!(sink_writer::Config { config: &config })),
            &[],
        )?;
        sink.wait_drained(&db.pool, &mut process).await?;
        process.stop_gracefully()?;
        let states: Vec<(String, i64, String)> = sqlx::query_as(
            "SELECT entity_id, version, payload #>> '{}' FROM entity_state ORDER BY entity_id",
        )
        .fetch_all(&db.pool)
        .await?;
        assert_eq!(
            states,
            vec![
                ("17".to_owned(), 3, "c".to_owned()),
                ("28".to_owned(), 2, "y".to_owned()),
                ("39".to_owned(), 2, "n".to_owned()),
            ],
            "arrival order {name}"
        );
        let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM event_sink")
            .fetch_one(&db.pool)
            .await?;
        assert_eq!(rows, 0, "the config names only entity_state");
        db.drop_database().await?;
    }
    let _ = std::fs::remove_file(&config_path);
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn sink_conflict_is_recorded_and_the_stored_row_is_kept() -> anyhow::Result<()> {
    let db = TestDatabase::create().await?;
    let stored_fingerprint = preload_e102(&db.pool).await?;
    let topic = fresh_topic("seed-conflict", 1).await?;
    produce(&topic, vec![envelope("e-102", 17, 99_999)]).await?;
    let sink = Sink::new(&topic, &db.url);
    let mut process = sink.spawn("conflict", &[], &[])?;
    sink.wait_drained(&db.pool, &mut process).await?;
    process.stop_gracefully()?;

    let value: i64 = sqlx::query_scalar("SELECT value FROM event_sink WHERE event_id = 'e-102'")
        .fetch_one(&db.pool)
        .await?;
    assert_eq!(value, 12_500, "never overwritten");
    let conflicts: Vec<(String, String, String, Option<String>, String, i64)> = sqlx::query_as(
        "SELECT target, event_id, reason, stored_fingerprint, incoming_fingerprint, source_offset
         FROM sink_conflicts",
    )
    .fetch_all(&db.pool)
    .await?;
    assert_eq!(conflicts.len(), 1, "{conflicts:?}");
    let (target, event_id, reason, stored, incoming, offset) = &conflicts[0];
    assert_eq!(
        (target.as_str(), event_id.as_str(), reason.as_str(), *offset),
        ("event_sink", "e-102", "event_id_conflict", 0)
    );
    assert_eq!(stored.as_deref(), Some(stored_fingerprint.as_str()));
    assert_ne!(incoming, &stored_fingerprint);
    assert!(process.log().contains("conflict: same key, other content"));
    db.drop_database().await
}

/// `--max-batch-bytes` closes a batch by size even when neither the count nor the interval would
/// (the 20 records arrive within the 5 s interval, far under the count, and all are waiting in the
/// consumer, so the idle bound does not close a batch either): with a 1-byte bound every committed
/// batch holds one record.
#[tokio::test(flavor = "multi_thread")]
async fn sink_batches_close_at_max_batch_bytes() -> anyhow::Result<()> {
    let db = TestDatabase::create().await?;
    let topic = fresh_topic("sink-batch-bytes", 1).await?;
    let events: Vec<(Option<String>, Vec<u8>)> = (0..20)
        .map(|n| envelope(&format!("bytes-{n}"), 1, n))
        .collect();
    produce(&topic, events).await?;
    let sink = Sink::new(&topic, &db.url);
    let mut process = sink.spawn(
        "bytes",
        &arg_refs(&argv!(sink_writer::Config {
            max_batch: 100_000usize,
            batch_interval: "5s",
            max_batch_bytes: 1usize,
        })),
        &[],
    )?;
    sink.wait_drained(&db.pool, &mut process).await?;
    let addr = process.wait_for_log_field("metrics_addr", Duration::from_secs(10))?;
    let metrics = reqwest::get(format!("http://{addr}/metrics"))
        .await?
        .text()
        .await?;
    process.stop_gracefully()?;
    let figure = |name: &str| -> Option<f64> {
        metrics
            .lines()
            .find_map(|line| line.strip_prefix(name)?.trim().parse().ok())
    };
    let largest = figure("eos_sink_batch_records{quantile=\"1\"}")
        .context("the batch-size summary's maximum")?;
    let written = figure("eos_sink_batch_records_sum").context("records in batches")?;
    assert_eq!(
        written, 20.0,
        "every record went through a batch\n{metrics}"
    );
    assert_eq!(largest, 1.0, "no batch held more than one record");
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM event_sink")
        .fetch_one(&db.pool)
        .await?;
    assert_eq!(rows, 20);
    db.drop_database().await
}

/// An open batch closes once no record arrives for `--batch-idle` (5 ms by default), not only at
/// `--batch-interval`: with a ten-minute interval and a count no input reaches, the sink still
/// commits every record, twice (two bursts, the second after the first is committed), long before
/// the interval could close a batch.
#[tokio::test(flavor = "multi_thread")]
async fn sink_batch_closes_once_its_input_is_idle() -> anyhow::Result<()> {
    let db = TestDatabase::create().await?;
    let topic = fresh_topic("sink-batch-idle", 1).await?;
    let burst = |from: i64| -> Vec<(Option<String>, Vec<u8>)> {
        (from..from + 10)
            .map(|n| envelope(&format!("idle-{n}"), 1, n))
            .collect()
    };
    produce(&topic, burst(0)).await?;
    let sink = Sink::new(&topic, &db.url);
    let mut process = sink.spawn(
        "idle",
        &arg_refs(&argv!(sink_writer::Config {
            max_batch: 100_000usize,
            batch_interval: "10m",
        })),
        &[],
    )?;
    // A minute is ample for 20 rows, and a tenth of the interval.
    for next in [Some(10), None] {
        tokio::time::timeout(
            Duration::from_secs(60),
            sink.wait_drained(&db.pool, &mut process),
        )
        .await
        .context(
            "a burst not committed within a minute: the idle bound did not close the batch",
        )??;
        if let Some(from) = next {
            produce(&topic, burst(from)).await?;
        }
    }
    process.stop_gracefully()?;
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM event_sink")
        .fetch_one(&db.pool)
        .await?;
    assert_eq!(rows, 20);
    db.drop_database().await
}

#[tokio::test(flavor = "multi_thread")]
async fn sink_exactly_once_survives_repeated_sigkill() -> anyhow::Result<()> {
    const KILLS: usize = 12;
    let db = TestDatabase::create().await?;
    let topic = unique_name("sink-chaos");
    let sink = Sink::new(&topic, &db.url);
    let workload = Workload {
        rate: 1_500,
        ..Workload::chaos(20_000, 61)
    };
    let producer = {
        let topic = topic.clone();
        std::thread::spawn(move || eosctl::produce(&topic, &workload))
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(61);
    let started = Instant::now();
    let mut kills = 0;
    for _ in 0..KILLS {
        let mut process = sink.spawn("chaos", &[], &[])?;
        tokio::time::sleep(Duration::from_millis(rng.random_range(700..2_200))).await;
        let status = process.kill_hard()?;
        assert!(
            status.code().is_none(),
            "killed by a signal, not exited: {status}\n{}",
            process.log_tail(30)
        );
        kills += 1;
    }
    let mut last = sink.spawn("chaos", &[], &[])?;
    // Up before anything else: when the killed instances drained it all, the drain check passes
    // at once, and a SIGTERM sent before the sink has its handler would kill it instead.
    last.wait_for_log_field("metrics_addr", Duration::from_secs(60))?;
    let summary = tokio::task::spawn_blocking(move || producer.join())
        .await?
        .map_err(|_| anyhow::anyhow!("producer thread panicked"))??;
    sink.wait_drained(&db.pool, &mut last).await?;
    last.stop_gracefully()?;
    eprintln!(
        "sink chaos: {kills} SIGKILLs, drained in {:?}",
        started.elapsed()
    );
    assert!(kills >= 10);

    let truth = TopicTruth::read(&topic)?;
    assert_workload(&summary, &truth, 20_000);
    assert_eq!(truth.conflicts.len(), 20);
    assert_eq!(
        truth.state_conflicts.len(),
        0,
        "one workload: versions never collide"
    );
    assert_eq!(truth.malformed.len(), 100);
    assert_exact(&db.pool, &sink, &truth).await?;
    db.drop_database().await
}

#[tokio::test(flavor = "multi_thread")]
async fn sink_postgres_restart_mid_run_resumes_exactly() -> anyhow::Result<()> {
    // Exclusive use of the server: every other test's database is gone, new ones wait.
    let server = PostgresRestartGuard::acquire().await?;
    let db = server.create_database().await?;
    let topic = unique_name("sink-pg-restart");
    let sink = Sink::new(&topic, &db.url);
    // Ten seconds of input: the sink is writing well before the producer finishes.
    let workload = Workload {
        rate: 1_000,
        ..Workload::chaos(10_000, 71)
    };
    let producer = {
        let topic = topic.clone();
        std::thread::spawn(move || eosctl::produce(&topic, &workload))
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut process = sink.spawn("pg-restart", &[], &[])?;
    // The stop must cut off a sink that is writing: started (its own start-up retries say
    // "at start" and need no re-fencing), every partition positioned and checkpointed, and input
    // still arriving, so batches fail while the server is down and the partitions are fenced
    // again after it.
    sink.wait_writing_every_partition(&db.pool, &mut process)
        .await?;
    anyhow::ensure!(
        !producer.is_finished(),
        "the producer finished before the sink was writing: the stop would cut off an idle \
         sink\n{}",
        process.log_tail(30)
    );
    server.stop()?;
    // Longer than the sink's 5 s connection-acquire timeout, so it sees errors and retries
    // rather than merely waiting for a connection.
    tokio::time::sleep(Duration::from_secs(9)).await;
    assert!(
        process.is_running(),
        "the sink waits for PostgreSQL\n{}",
        process.log_tail(30)
    );
    server.start()?;
    let summary = tokio::task::spawn_blocking(move || producer.join())
        .await?
        .map_err(|_| anyhow::anyhow!("producer thread panicked"))??;
    // The pool of this test was cut by the restart too: a fresh one.
    let pool = eos_runtime::postgres_pool::PoolBuilder::new(4)
        .connect(&db.url)
        .await?;
    sink.wait_drained(&pool, &mut process).await?;
    process.stop_gracefully()?;
    let log = process.log();
    assert!(
        log.contains("postgres unavailable"),
        "every retry is logged\n{}",
        process.log_tail(40)
    );
    assert!(log.contains("re-fenced and re-read checkpoints"));

    let truth = TopicTruth::read(&topic)?;
    assert_workload(&summary, &truth, 10_000);
    assert_exact(&pool, &sink, &truth).await?;
    pool.close().await;
    db.drop_database().await
}

/// Waits until `process` has logged `needle` more than `seen` times.
async fn wait_for_log(
    process: &ServiceProcess,
    needle: &str,
    seen: usize,
    timeout: Duration,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    while process.log().matches(needle).count() <= seen {
        if Instant::now() > deadline {
            anyhow::bail!("no new {needle:?} in {timeout:?}\n{}", process.log_tail(30));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn sink_paused_zombie_is_rejected_by_the_epoch_fence() -> anyhow::Result<()> {
    const STALL: &str = "fault injection: stalling before the batch transaction";
    let db = TestDatabase::create().await?;
    let topic = unique_name("sink-zombie");
    let sink = Sink::new(&topic, &db.url);
    let produce_chaos = |count: u64, seed: u64| {
        let topic = topic.clone();
        tokio::task::spawn_blocking(move || eosctl::produce(&topic, &Workload::chaos(count, seed)))
    };
    produce_chaos(2_000, 81).await??;
    // A decides each batch, then stalls 3 s before its database transaction: a window in which
    // the test freezes it holding a batch, as a GC pause or a stopped VM would.
    let mut zombie = sink.spawn(
        "member-a",
        &arg_refs(&argv!(sink_writer::Config {
            max_batch: 100_000usize
        })),
        &[("EOS_SINK_FAULT_STALL_BEFORE_COMMIT", "3s")],
    )?;
    sink.wait_drained(&db.pool, &mut zombie).await?;

    let stalls = zombie.log().matches(STALL).count();
    produce_chaos(500, 82).await??;
    wait_for_log(&zombie, STALL, stalls, Duration::from_secs(30)).await?;
    zombie.pause()?;
    let epochs_before: i64 =
        sqlx::query_scalar("SELECT MIN(owner_epoch) FROM sink_checkpoints WHERE sink = $1")
            .bind(&sink.group)
            .fetch_one(&db.pool)
            .await?;

    // B joins; A's session times out while it is frozen; B gets every partition, fences them and
    // writes what A was holding.
    let mut successor = sink.spawn("member-b", &[], &[])?;
    sink.wait_drained(&db.pool, &mut successor).await?;
    let owners: Vec<(String, i64)> =
        sqlx::query_as("SELECT owner, owner_epoch FROM sink_checkpoints WHERE sink = $1")
            .bind(&sink.group)
            .fetch_all(&db.pool)
            .await?;
    assert!(
        owners
            .iter()
            .all(|(owner, epoch)| owner == "member-b" && *epoch > epochs_before),
        "B fenced every partition: {owners:?}"
    );

    zombie.resume()?;
    let status = zombie
        .wait_timeout(Duration::from_secs(60))?
        .with_context(|| format!("the zombie kept running\n{}", zombie.log_tail(40)))?;
    assert!(
        !status.success(),
        "a fenced zombie exits non-zero\n{}",
        zombie.log_tail(40)
    );
    assert!(
        zombie.log().contains("batch rejected by the epoch fence"),
        "the zombie's write was rejected by the fence\n{}",
        zombie.log_tail(40)
    );

    produce_chaos(500, 83).await??;
    sink.wait_drained(&db.pool, &mut successor).await?;
    successor.stop_gracefully()?;
    let truth = TopicTruth::read(&topic)?;
    assert_eq!(truth.logical.len(), 3_000);
    assert_eq!(truth.conflicts.len(), 4);
    // Each workload numbers every entity's versions from 1 again: version collisions, which the
    // versioned target must report as conflicts, not hide.
    assert!(!truth.state_conflicts.is_empty());
    assert_exact(&db.pool, &sink, &truth).await?;
    db.drop_database().await
}

#[tokio::test(flavor = "multi_thread")]
async fn sink_shuffled_versions_replayed_by_several_writers_never_go_down() -> anyhow::Result<()> {
    const ENTITIES: i64 = 1_000;
    const VERSIONS: u64 = 20;
    const REPLAYS: usize = 3;
    let db = TestDatabase::create().await?;
    sink_writer::migrator().run(&db.pool).await?;
    // The audit: every change of a stored version, recorded by the database itself.
    sqlx::raw_sql(
        "CREATE TABLE version_audit (entity_id TEXT, old_version BIGINT, new_version BIGINT);
         CREATE FUNCTION audit_version() RETURNS trigger AS $$
         BEGIN
             INSERT INTO version_audit VALUES (NEW.entity_id, OLD.version, NEW.version);
             RETURN NEW;
         END $$ LANGUAGE plpgsql;
         CREATE TRIGGER entity_state_version_audit BEFORE UPDATE ON entity_state
             FOR EACH ROW EXECUTE FUNCTION audit_version();",
    )
    .execute(&db.pool)
    .await?;

    let topic = fresh_topic("sink-versions", 3).await?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(91);
    let mut records = Vec::new();
    for _ in 0..REPLAYS {
        let mut round: Vec<_> = (0..ENTITIES)
            .flat_map(|entity| {
                (1..=VERSIONS).map(move |version| {
                    let body = json!({
                        "event_id": format!("ver-{entity}-{version}"),
                        "entity_id": format!("ent-{entity}"),
                        "value": version,
                        "version": version,
                        "payload": {"entity": entity, "version": version},
                    });
                    (Some(format!("ent-{entity}")), body.to_string().into_bytes())
                })
            })
            .collect();
        round.shuffle(&mut rng);
        records.extend(round);
    }
    assert_eq!(records.len(), 60_000);
    // Writers: three sinks (their own groups and checkpoints) racing on the same rows, one of
    // them with two instances splitting the partitions.
    let sinks: Vec<Sink> = (0..3).map(|_| Sink::new(&topic, &db.url)).collect();
    let mut processes = vec![
        sinks[0].spawn("w0", &[], &[])?,
        sinks[1].spawn("w1", &[], &[])?,
        sinks[2].spawn("w2-a", &[], &[])?,
        sinks[2].spawn("w2-b", &[], &[])?,
    ];
    produce(&topic, records).await?;
    for (i, sink) in sinks.iter().enumerate() {
        sink.wait_drained(&db.pool, &mut processes[i]).await?;
    }
    for process in &mut processes {
        process.stop_gracefully()?;
    }

    let (rows, wrong): (i64, i64) = sqlx::query_as(
        "SELECT COUNT(*), COUNT(*) FILTER (WHERE version <> 20
             OR payload <> jsonb_build_object('entity', substr(entity_id, 5)::int, 'version', 20)
             OR event_id <> 'ver-' || substr(entity_id, 5) || '-20')
         FROM entity_state",
    )
    .fetch_one(&db.pool)
    .await?;
    assert_eq!(
        (rows, wrong),
        (ENTITIES, 0),
        "every row holds its highest version"
    );
    let (changes, down, flat): (i64, i64, i64) = sqlx::query_as(
        "SELECT COUNT(*), COUNT(*) FILTER (WHERE new_version < old_version),
                COUNT(*) FILTER (WHERE new_version = old_version)
         FROM version_audit",
    )
    .fetch_one(&db.pool)
    .await?;
    assert_eq!(down, 0, "no stored version ever went down");
    assert_eq!(flat, 0, "an equal version is never re-applied");
    assert!(
        changes > 0 && changes < ENTITIES * VERSIONS as i64,
        "{changes} updates"
    );
    let (events, sum): (i64, i64) =
        sqlx::query_as("SELECT COUNT(*), SUM(value)::BIGINT FROM event_sink")
            .fetch_one(&db.pool)
            .await?;
    assert_eq!(events, ENTITIES * VERSIONS as i64);
    assert_eq!(sum, ENTITIES * (1..=VERSIONS as i64).sum::<i64>());
    let conflicts: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM sink_conflicts")
        .fetch_one(&db.pool)
        .await?;
    assert_eq!(conflicts, 0);
    db.drop_database().await
}

#[tokio::test(flavor = "multi_thread")]
async fn sink_refuses_to_start_on_a_bad_config_naming_the_problem() -> anyhow::Result<()> {
    let db = TestDatabase::create().await?;
    sqlx::query("CREATE TABLE payments_by_id (id TEXT PRIMARY KEY, amount BIGINT NOT NULL, note TEXT NOT NULL)")
        .execute(&db.pool)
        .await?;
    let cases = [
        (
            "[[targets]]\ntable = \"payments_by_id\"\nkind = \"append\"\nkey = \"id\"\nretention = \"1d\"\nretention_column = \"written_at\"\n[targets.columns]\nid = \"event_id\"\namount = \"value\"\nnote = \"/payload/note\"\n",
            "retention 1day is shorter than --replay-horizon 7days plus --retention-margin 1day",
        ),
        (
            "[[targets]]\ntable = \"payments_by_id\"\nkind = \"append\"\nkey = \"id\"\n[targets.columns]\nid = \"event_id\"\namount = \"value\"\n",
            "NOT NULL without a default but have no source",
        ),
        (
            "[[targets]]\ntable = \"payments_by_id\"\nkind = \"append\"\nkey = \"amount\"\n[targets.columns]\nid = \"event_id\"\namount = \"value\"\nnote = \"payload\"\n",
            "no unique constraint",
        ),
        (
            "[[targets]]\ntable = \"no_such_table\"\nkind = \"append\"\n[targets.columns]\nevent_id = \"event_id\"\n",
            "no_such_table: does not exist",
        ),
        // An http target's results table (docs/sink-writer.md "The answer in a table"): its
        // event_id must be unique, its columns text or jsonb.
        (
            "[[targets]]\nkind = \"http\"\nname = \"partner\"\ndedup_url = \"http://127.0.0.1:9\"\nurl = \"http://127.0.0.1:9/v1\"\n[targets.results]\ntable = \"payments_by_id\"\ncolumns = { note = \"/id\" }\n",
            "results table payments_by_id: has no event_id column",
        ),
        (
            "[[targets]]\nkind = \"http\"\nname = \"partner\"\ndedup_url = \"http://127.0.0.1:9\"\nurl = \"http://127.0.0.1:9/v1\"\n[targets.results]\ntable = \"partner_results\"\ncolumns = { amount = \"/amount\" }\n",
            "column amount is bigint: results go in text or jsonb columns",
        ),
    ];
    sqlx::query(
        "CREATE TABLE partner_results (event_id TEXT PRIMARY KEY, operation_id TEXT NOT NULL, \
         amount BIGINT)",
    )
    .execute(&db.pool)
    .await?;
    let topic = unique_name("sink-bad-config");
    for (text, expected) in cases {
        let path = std::env::temp_dir().join(format!("{}.toml", unique_name("sink-config")));
        std::fs::write(&path, text)?;
        let sink = Sink::new(&topic, &db.url);
        let mut process = sink.spawn(
            "bad",
            &arg_refs(&argv!(sink_writer::Config {
                config: path.display().to_string()
            })),
            &[],
        )?;
        let status = process
            .wait_timeout(Duration::from_secs(30))?
            .with_context(|| format!("started anyway\n{}", process.log_tail(20)))?;
        assert!(!status.success());
        assert!(
            process.log().contains(expected),
            "expected {expected:?}\n{}",
            process.log_tail(20)
        );
        let _ = std::fs::remove_file(&path);
    }
    db.drop_database().await
}

#[tokio::test(flavor = "multi_thread")]
async fn sink_rows_postgres_refuses_are_dead_lettered_and_the_rest_written() -> anyhow::Result<()> {
    let db = TestDatabase::create().await?;
    sqlx::query(
        "CREATE TABLE credits (
             id TEXT PRIMARY KEY,
             account TEXT NOT NULL,
             cents BIGINT NOT NULL CHECK (cents > 0),
             note VARCHAR(8),
             seen_at TIMESTAMPTZ NOT NULL
         )",
    )
    .execute(&db.pool)
    .await?;
    let path = std::env::temp_dir().join(format!("{}.toml", unique_name("sink-config")));
    std::fs::write(
        &path,
        r#"
[[targets]]
table = "credits"
kind = "append"
key = "id"
[targets.columns]
id = "event_id"
account = "entity_id"
cents = "value"
note = "/payload/note"
seen_at = "now"
"#,
    )?;
    let topic = fresh_topic("sink-refused", 1).await?;
    let record = |id: &str, value: i64, note: &str| {
        let body =
            json!({"event_id": id, "entity_id": "acct", "value": value, "payload": {"note": note}});
        (Some("acct".to_owned()), body.to_string().into_bytes())
    };
    produce(
        &topic,
        vec![
            record("c-1", 100, "ok"),
            record("c-2", -5, "refund"), // the CHECK refuses it: only PostgreSQL knows
            record("c-3", 300, "much too long"), // over varchar(8): refused before sending
            record("c-4", 400, "ok"),
        ],
    )
    .await?;
    let sink = Sink::new(&topic, &db.url);
    let mut process = sink.spawn(
        "refused",
        &arg_refs(&argv!(sink_writer::Config {
            config: path.display().to_string()
        })),
        &[],
    )?;
    sink.wait_drained(&db.pool, &mut process).await?;
    process.stop_gracefully()?;
    let _ = std::fs::remove_file(&path);

    let ids: Vec<String> = sqlx::query_scalar("SELECT id FROM credits ORDER BY id")
        .fetch_all(&db.pool)
        .await?;
    assert_eq!(ids, ["c-1", "c-4"]);
    let dead: Vec<(i64, String, String)> = sqlx::query_as(
        "SELECT source_offset, reason, detail FROM sink_dead_letters ORDER BY source_offset",
    )
    .fetch_all(&db.pool)
    .await?;
    assert_eq!(dead.len(), 2, "{dead:?}");
    assert_eq!((dead[0].0, dead[0].1.as_str()), (1, "invalid_field"));
    assert!(dead[0].2.contains("postgres refused the row"), "{dead:?}");
    assert_eq!((dead[1].0, dead[1].1.as_str()), (2, "invalid_field"));
    assert!(dead[1].2.contains("credits.note"), "{dead:?}");
    let dlq = sink.dlq();
    let letters =
        tokio::task::spawn_blocking(move || read_topic(&dlq, Isolation::ReadCommitted)).await??;
    assert_eq!(letters.len(), 2);
    assert!(process.log().contains("redoing it one record at a time"));
    db.drop_database().await
}

#[tokio::test(flavor = "multi_thread")]
async fn sink_kafka_offsets_mode_is_at_least_once_into_idempotent_tables() -> anyhow::Result<()> {
    let db = TestDatabase::create().await?;
    let topic = unique_name("sink-kafka-offsets");
    let sink = Sink::new(&topic, &db.url);
    let workload = Workload {
        rate: 2_000,
        ..Workload::chaos(6_000, 101)
    };
    let producer = {
        let topic = topic.clone();
        std::thread::spawn(move || eosctl::produce(&topic, &workload))
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(101);
    for _ in 0..4 {
        let mut process = sink.spawn("kafka-mode", &arg_refs(&kafka_offsets()), &[])?;
        tokio::time::sleep(Duration::from_millis(rng.random_range(800..2_000))).await;
        process.kill_hard()?;
    }
    let mut last = sink.spawn("kafka-mode", &arg_refs(&kafka_offsets()), &[])?;
    let summary = tokio::task::spawn_blocking(move || producer.join())
        .await?
        .map_err(|_| anyhow::anyhow!("producer thread panicked"))??;
    let group = sink.group.clone();
    let wait_topic = topic.clone();
    tokio::task::spawn_blocking(move || {
        integration_tests::wait_until_consumed(
            &integration_tests::bootstrap_servers(),
            &group,
            &wait_topic,
            DRAIN_TIMEOUT,
        )
    })
    .await??;
    last.stop_gracefully()?;
    assert!(
        last.log().contains("at-least-once"),
        "the weaker boundary is stated"
    );

    let truth = TopicTruth::read(&topic)?;
    assert_workload(&summary, &truth, 6_000);
    // Replays after the kills are absorbed by the unique key and the version check: rows exact.
    let (rows, sum): (i64, i64) =
        sqlx::query_as("SELECT COUNT(*), SUM(value)::BIGINT FROM event_sink")
            .fetch_one(&db.pool)
            .await?;
    assert_eq!((rows, sum), (6_000, truth.logical_sum()));
    let conflicts: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM sink_conflicts WHERE target = 'event_sink'")
            .fetch_one(&db.pool)
            .await?;
    assert_eq!(
        conflicts,
        truth.conflicts.len() as i64,
        "keyed by position: never twice"
    );
    let checkpoints: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM sink_checkpoints")
        .fetch_one(&db.pool)
        .await?;
    assert_eq!(checkpoints, 0, "kafka mode keeps no Postgres checkpoint");
    db.drop_database().await
}

#[tokio::test(flavor = "multi_thread")]
async fn sink_purges_rows_past_a_retention_longer_than_the_replay_horizon() -> anyhow::Result<()> {
    let db = TestDatabase::create().await?;
    sink_writer::migrator().run(&db.pool).await?;
    sqlx::query(
        "INSERT INTO event_sink (event_id, entity_id, value, fingerprint, written_at)
         VALUES ('old', 'a', 1, 'f', now() - interval '40 days'),
                ('recent', 'a', 2, 'f', now() - interval '20 days')",
    )
    .execute(&db.pool)
    .await?;
    let path = std::env::temp_dir().join(format!("{}.toml", unique_name("sink-config")));
    std::fs::write(
        &path,
        r#"
[[targets]]
table = "event_sink"
kind = "append"
retention = "30d"
retention_column = "written_at"
[targets.columns]
event_id = "event_id"
entity_id = "entity_id"
value = "value"
payload = "payload"
fingerprint = "fingerprint"
written_at = "now"
"#,
    )?;
    let topic = fresh_topic("sink-purge", 1).await?;
    produce(&topic, vec![envelope("new", 5, 3)]).await?;
    let sink = Sink::new(&topic, &db.url);
    let mut process = sink.spawn(
        "purge",
        &arg_refs(&argv!(sink_writer::Config {
            config: path.display().to_string(),
            replay_horizon: "14d",
            purge_interval: "1s",
        })),
        &[],
    )?;
    sink.wait_drained(&db.pool, &mut process).await?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let ids: Vec<String> =
            sqlx::query_scalar("SELECT event_id FROM event_sink ORDER BY event_id")
                .fetch_all(&db.pool)
                .await?;
        if ids == ["new", "recent"] {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "rows past the retention not purged: {ids:?}\n{}",
            process.log_tail(20)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    process.stop_gracefully()?;
    let _ = std::fs::remove_file(&path);
    assert!(process.log().contains("purged rows past the retention"));
    db.drop_database().await
}

#[tokio::test(flavor = "multi_thread")]
async fn sink_reads_only_committed_records_and_checkpoints_past_markers() -> anyhow::Result<()> {
    use rdkafka::producer::{BaseRecord, Producer as _};
    let db = TestDatabase::create().await?;
    let topic = fresh_topic("sink-transactional", 1).await?;
    let send_topic = topic.clone();
    // Like eos-processor's output: records inside transactions, one of them aborted.
    tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
        let producer = integration_tests::transactional_producer(&unique_name("sink-txn"))?;
        let timeout = Duration::from_secs(30);
        for (prefix, count, commit) in [("e", 5, true), ("x", 3, false), ("f", 3, true)] {
            producer.begin_transaction()?;
            for i in 0..count {
                let (key, value) = envelope(&format!("{prefix}-{i}"), 7, 100);
                let key = key.unwrap_or_default();
                producer
                    .send(BaseRecord::to(&send_topic).key(&key).payload(&value))
                    .map_err(|(e, _)| e)?;
            }
            // Delivered before the abort, so the aborted records are in the log (and skipped).
            producer.flush(timeout)?;
            if commit {
                producer.commit_transaction(timeout)?;
            } else {
                producer.abort_transaction(timeout)?;
            }
        }
        Ok(())
    })
    .await??;
    let sink = Sink::new(&topic, &db.url);
    let mut process = sink.spawn("transactional", &[], &[])?;
    // Waits for the checkpoint to equal the end offset, which lies past three control records.
    sink.wait_drained(&db.pool, &mut process).await?;
    process.stop_gracefully()?;
    let ids: Vec<String> = sqlx::query_scalar("SELECT event_id FROM event_sink ORDER BY event_id")
        .fetch_all(&db.pool)
        .await?;
    assert_eq!(
        ids,
        ["e-0", "e-1", "e-2", "e-3", "e-4", "f-0", "f-1", "f-2"]
    );
    let (ends, _) = sink.checkpoints(&db.pool).await?;
    assert_eq!(ends, vec![(0, 14)], "11 records and 3 control records");
    db.drop_database().await
}
