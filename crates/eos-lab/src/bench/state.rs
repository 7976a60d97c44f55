//! The state benchmark (docs/BENCHMARKS-state.md): a changelog with N distinct event ids, then
//! the processor's own restore (cold into an empty store, warm from the local checkpoint after a
//! 1% tail), the resident memory while it holds that state, and the throughput of the state path
//! (decide every record, write each committed batch to the store) with that state versus an
//! empty store. Runs against a real broker; `eos-lab bench state` prints it as a table or
//! JSON.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Args;
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer as _, ThreadedProducer};
use serde::Serialize;

use eos_core::Fingerprint;
use eos_runtime::kafka_settings::KafkaSettings;
use eos_runtime::topic_config::KEYED_STATE_TOPIC_CONFIG;
use eos_testkit::bench_figures::{self, Figure};

use eos_processor::changelog::{self, RestoreOutcome};
use eos_processor::partition_state::{
    DecisionPolicy, InputRecord, Overlay, PartitionState, SeenEvent,
};
use eos_processor::state_store::{StateStore, StoreError};
use eos_processor::transform::{LedgerTotals, LedgerTransform, SourcePosition};

/// Entities the benchmark's events are spread over.
const ENTITIES: u64 = 1_000;
/// Records per batch in the throughput runs: the processor's default --max-batch.
const BATCH: usize = 2_000;
const HORIZON_SECS: i64 = 7 * 24 * 3600;
/// Throughput rounds per store, interleaved (empty then full, then full then empty, ...): the
/// first run in a process pays for warming it (allocator, page cache), which a single run of
/// each put entirely on the empty store.
const THROUGHPUT_ROUNDS: usize = 3;

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("Kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    #[error("{0}")]
    Store(#[from] StoreError),
    #[error("{0}")]
    Processor(#[from] eos_processor::ProcessorError),
    #[error("{0}")]
    Setup(String),
}

/// Restore time (cold, warm), resident memory and state-path throughput with N ids in state.
#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// Distinct event ids in state.
    #[arg(long, default_value_t = 1_000_000)]
    pub ids: u64,
    /// Events per throughput round and store (three interleaved rounds of each).
    #[arg(long, default_value_t = 200_000)]
    pub throughput_events: u64,
    /// Where the stores go during the run (removed at the end).
    #[arg(long)]
    pub work_dir: Option<PathBuf>,
}

#[derive(Debug, Clone)]
pub struct BenchConfig {
    /// The Kafka clients' settings: eos-lab's `--bootstrap-servers` and properties.
    pub client: ClientConfig,
    /// Distinct event ids in state.
    pub ids: u64,
    /// Changelog records written after the checkpoint, for the warm restore.
    pub tail: u64,
    /// New events decided and written per throughput round and store.
    pub throughput_events: u64,
    /// Where the benchmark's stores go (removed at the end).
    pub work_dir: PathBuf,
}

#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    pub ids: u64,
    pub changelog_records: u64,
    pub produce_secs: f64,
    pub cold_restore_secs: f64,
    pub cold_restore_records: u64,
    pub warm_restore_secs: f64,
    pub warm_restore_records: u64,
    /// Resident memory of this process holding the state (after the cold restore), and its peak
    /// during the restores (the peak is reset after producing).
    pub vm_rss_mib: f64,
    pub vm_hwm_mib: f64,
    pub store_file_mib: f64,
    /// The machine's load average before the run.
    pub load_before: Option<[f64; 3]>,
    /// Events per second through the state path in each interleaved round.
    pub empty_state_events_per_sec: Figure,
    pub full_state_events_per_sec: Figure,
    /// full / empty within each round: the target is a median of at least 0.9.
    pub throughput_ratio: Figure,
}

/// A well-spread 64-bit mix (SplitMix64), so ids arrive in no particular key order, as UUIDs do.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

fn event_id(prefix: &str, i: u64) -> String {
    format!("{prefix}-{:016x}-{i}", mix(i))
}

fn status_kib(field: &str) -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find(|line| line.starts_with(field))?
                .split_whitespace()
                .nth(1)?
                .parse::<f64>()
                .ok()
        })
        .unwrap_or(0.0)
}

fn dir_mib(dir: &Path) -> f64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter_map(|entry| entry.metadata().ok())
                .map(|meta| meta.len())
                .sum::<u64>()
        })
        .unwrap_or(0) as f64
        / (1024.0 * 1024.0)
}

/// Writes `count` seen-id changelog records (and one per entity) to partition 0 of `topic`.
fn produce_state(
    client: &ClientConfig,
    topic: &str,
    prefix: &str,
    count: u64,
) -> Result<u64, BenchError> {
    let producer: ThreadedProducer<DefaultProducerContext> = client
        .clone()
        .set("linger.ms", "50")
        .set("batch.size", "1000000")
        .set("compression.type", "lz4")
        .set("queue.buffering.max.messages", "1000000")
        .create()?;
    let expires_at = time::OffsetDateTime::now_utc().unix_timestamp() + HORIZON_SECS;
    let mut written = 0;
    let send = |key: String, value: Vec<u8>| -> Result<(), BenchError> {
        let record = BaseRecord::<String, Vec<u8>>::to(topic)
            .partition(0)
            .key(&key)
            .payload(&value);
        #[expect(
            clippy::result_large_err,
            reason = "rdkafka's send hands the record back inside its error"
        )]
        let sent = eos_runtime::backoff::send_when_queue_has_room(
            record,
            |record| producer.send(record),
            std::thread::sleep,
        );
        sent.map_err(|(error, _)| error.into())
    };
    for entity in 0..ENTITIES {
        let state = LedgerTotals {
            total: entity as i64,
            count: 1,
        };
        send(
            format!("entity/e-{entity}"),
            serde_json::to_vec(&state).map_err(|e| BenchError::Setup(e.to_string()))?,
        )?;
        written += 1;
    }
    for i in 0..count {
        let id = event_id(prefix, i);
        let seen = SeenEvent::applied(
            Fingerprint::of_json(&serde_json::Value::String(id.clone())),
            expires_at,
        );
        send(
            format!("seen/{id}"),
            serde_json::to_vec(&seen).map_err(|e| BenchError::Setup(e.to_string()))?,
        )?;
        written += 1;
    }
    producer.flush(Duration::from_secs(300))?;
    Ok(written)
}

/// Events per second through the state path: decide each record against the store, write each
/// batch's overlay to it (what `apply_committed` does after a commit). 5% of the records are
/// re-deliveries of an earlier one.
fn state_path_rate(
    state: &PartitionState<LedgerTotals>,
    prefix: &str,
    events: u64,
) -> Result<f64, BenchError> {
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    let policy = DecisionPolicy {
        horizon_secs: HORIZON_SECS,
        contract: eos_core::EventContract {
            max_record_bytes: 1 << 20,
            ..eos_core::EventContract::ledger()
        },
        outputs: [eos_processor::transform::DEFAULT_OUTPUT.to_owned()].into(),
        output_fit: None,
    };
    let source = SourcePosition {
        topic: "bench".into(),
        partition: 0,
        offset: 0,
    };
    let started = Instant::now();
    let mut overlay = Overlay::default();
    let mut in_batch = 0;
    for i in 0..events {
        let n = if i % 20 == 19 { i / 2 } else { i };
        let value = format!(
            r#"{{"event_id":"{}","entity_id":"e-{}","value":1}}"#,
            event_id(prefix, n),
            n % ENTITIES
        );
        state.decide(
            &mut overlay,
            &LedgerTransform,
            InputRecord {
                key: None,
                value: Some(value.as_bytes()),
                headers: &[],
                timestamp_secs: now,
                content: None,
            },
            &source,
            now,
            &policy,
        )?;
        in_batch += 1;
        if in_batch == BATCH {
            state.apply::<LedgerTransform>(std::mem::take(&mut overlay))?;
            in_batch = 0;
        }
    }
    state.apply::<LedgerTransform>(overlay)?;
    Ok(events as f64 / started.elapsed().as_secs_f64())
}

fn restore(
    client: &ClientConfig,
    topic: &str,
    state: &PartitionState<LedgerTotals>,
) -> Result<(RestoreOutcome, f64), BenchError> {
    let started = Instant::now();
    let outcome = changelog::restore_partition(
        &LedgerTransform,
        client,
        topic,
        0,
        Duration::from_secs(120),
        state.store(),
        Duration::from_secs(86_400),
    )?;
    Ok((outcome, started.elapsed().as_secs_f64()))
}

impl BenchConfig {
    /// What `args` asks for, on the lab's Kafka; the warm restore's tail is 1% of the ids.
    pub fn new(args: &BenchArgs, kafka: &KafkaSettings) -> Self {
        Self {
            client: kafka.client_config(),
            ids: args.ids,
            tail: (args.ids / 100).max(1),
            throughput_events: args.throughput_events,
            work_dir: args.work_dir.clone().unwrap_or_else(|| {
                std::env::temp_dir().join(format!("eos-state-bench-{}", std::process::id()))
            }),
        }
    }
}

/// Runs the benchmark; creates and deletes its own changelog topic and stores.
pub async fn run(config: &BenchConfig) -> Result<BenchReport, BenchError> {
    let client = config.client.clone();
    let topic = format!(
        "eos-state-bench-{}-{}",
        std::process::id(),
        eos_processor::state_store::now_unix_ms()
    );
    let admin: AdminClient<DefaultClientContext> = client.create()?;
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let mut new_topic = NewTopic::new(&topic, 1, TopicReplication::Fixed(1));
    for (key, value) in KEYED_STATE_TOPIC_CONFIG {
        new_topic = new_topic.set(key, value);
    }
    for result in admin.create_topics([&new_topic], &options).await? {
        result.map_err(|(topic, code)| BenchError::Setup(format!("creating {topic}: {code}")))?;
    }
    let result = measure(config, &client, &topic);
    let _ = admin.delete_topics(&[&topic], &options).await;
    let _ = std::fs::remove_dir_all(&config.work_dir);
    result
}

fn measure(
    config: &BenchConfig,
    client: &ClientConfig,
    topic: &str,
) -> Result<BenchReport, BenchError> {
    let load_before = bench_figures::load_average();
    let started = Instant::now();
    let mut changelog_records = produce_state(client, topic, "state", config.ids)?;
    let produce_secs = started.elapsed().as_secs_f64();
    // The producer's buffers are gone: measure the peak of what the restore needs.
    let _ = std::fs::write("/proc/self/clear_refs", "5");

    let full_dir = config.work_dir.join("full");
    let store = StateStore::open(&full_dir)?;
    let state = PartitionState::<LedgerTotals>::new(store.partition(topic, 0)?);
    let (cold, cold_restore_secs) = restore(client, topic, &state)?;
    let vm_rss_mib = status_kib("VmRSS:") / 1024.0;

    changelog_records += produce_state(client, topic, "tail", config.tail)?;
    let (warm, warm_restore_secs) = restore(client, topic, &state)?;
    let vm_hwm_mib = status_kib("VmHWM:") / 1024.0;
    let store_file_mib = dir_mib(&full_dir);

    let empty_store = StateStore::open(&config.work_dir.join("empty"))?;
    let empty = PartitionState::<LedgerTotals>::new(empty_store.partition(topic, 0)?);
    let (mut empty_rates, mut full_rates) = (Vec::new(), Vec::new());
    for round in 0..THROUGHPUT_ROUNDS {
        // Fresh ids each round, so every round decides new events against its store.
        let prefix = format!("new{round}");
        let events = config.throughput_events;
        if round % 2 == 0 {
            empty_rates.push(state_path_rate(&empty, &prefix, events)?);
            full_rates.push(state_path_rate(&state, &prefix, events)?);
        } else {
            full_rates.push(state_path_rate(&state, &prefix, events)?);
            empty_rates.push(state_path_rate(&empty, &prefix, events)?);
        }
    }
    Ok(BenchReport {
        ids: config.ids,
        changelog_records,
        produce_secs,
        cold_restore_secs,
        cold_restore_records: cold.records,
        warm_restore_secs,
        warm_restore_records: warm.records,
        vm_rss_mib,
        vm_hwm_mib,
        store_file_mib,
        load_before,
        throughput_ratio: Figure::ratio(&full_rates, &empty_rates),
        empty_state_events_per_sec: Figure::new(empty_rates),
        full_state_events_per_sec: Figure::new(full_rates),
    })
}

impl BenchReport {
    /// The report as a two-column table.
    pub fn table(&self) -> String {
        let rows = [
            ("distinct ids in state", self.ids.to_string()),
            ("changelog records", self.changelog_records.to_string()),
            ("produce", format!("{:.1} s", self.produce_secs)),
            (
                "cold restore (changelog from the start)",
                format!(
                    "{:.1} s, {} records ({:.0} records/s)",
                    self.cold_restore_secs,
                    self.cold_restore_records,
                    self.cold_restore_records as f64 / self.cold_restore_secs
                ),
            ),
            (
                "warm restore (from the local checkpoint)",
                format!(
                    "{:.2} s, {} records",
                    self.warm_restore_secs, self.warm_restore_records
                ),
            ),
            (
                "VmRSS holding the state",
                format!("{:.0} MiB", self.vm_rss_mib),
            ),
            (
                "VmHWM during the restores",
                format!("{:.0} MiB", self.vm_hwm_mib),
            ),
            ("store file", format!("{:.0} MiB", self.store_file_mib)),
            (
                "state path, empty state",
                figure_text(&self.empty_state_events_per_sec, 0, "events/s"),
            ),
            (
                "state path, full state",
                figure_text(&self.full_state_events_per_sec, 0, "events/s"),
            ),
            (
                "full / empty",
                figure_text(&self.throughput_ratio, 2, "(target: median >= 0.90)"),
            ),
            (
                "load before the run",
                bench_figures::load_text(self.load_before),
            ),
        ];
        let width = rows.iter().map(|(name, _)| name.len()).max().unwrap_or(0);
        rows.iter()
            .map(|(name, value)| format!("{name:<width$}  {value}\n"))
            .collect()
    }
}

/// `median unit (lowest–highest; each round)`.
fn figure_text(figure: &Figure, digits: usize, unit: &str) -> String {
    let (median, spread, rounds) = figure.text(digits);
    format!("{median} {unit} (spread {spread}; rounds {rounds})")
}
