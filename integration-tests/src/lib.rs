//! Harness for the integration tests: every test gets fresh topic names, group ids,
//! `transactional.id`s and a fresh PostgreSQL database, so tests run in parallel against the one
//! real broker and server that `deploy/local/stack up` starts. Nothing here is a fake: a test that
//! cannot reach the stack fails with a message saying how to start it.

pub mod aimed_kill;
pub mod answer_dropping_proxy;
pub mod eosctl;
pub mod fault_proxy;
pub mod http_api_doubles;
pub mod kafka_cluster;
pub mod otlp_collector;
pub mod prometheus_server;
pub mod proxied_kafka;
pub mod service_process;
pub mod test_certs;

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context as _, bail};
use eos_runtime::kafka_clients;
use eos_runtime::postgres_pool::PoolBuilder;
use rdkafka::ClientConfig;
use rdkafka::Message as _;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::OwnedMessage;
use rdkafka::producer::{DefaultProducerContext, ThreadedProducer};
use rdkafka::{Offset, TopicPartitionList};
use sqlx::postgres::PgPool;

pub const DEFAULT_BOOTSTRAP_SERVERS: &str = "127.0.0.1:9092";
pub const DEFAULT_DATABASE_URL: &str = "postgres://eos:eos@127.0.0.1:5432/eos";

const STACK_HINT: &str = "is the local stack up? run `deploy/local/stack up` (or `make test`)";

/// Owned arguments (an `eos_testkit::argv!` command line) as the borrowed ones a spawn helper's
/// `extra: &[&str]` takes.
pub fn arg_refs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

pub fn bootstrap_servers() -> String {
    std::env::var("KAFKA_BOOTSTRAP_SERVERS").unwrap_or_else(|_| DEFAULT_BOOTSTRAP_SERVERS.into())
}

pub fn database_url() -> String {
    std::env::var("DATABASE_URL").unwrap_or_else(|_| DEFAULT_DATABASE_URL.into())
}

/// Runs `sql` with psql as the `postgres` superuser (over the local socket; the tests run as root
/// against the local stack's PostgreSQL) in `database` [default: postgres]; its unaligned output.
pub fn superuser_sql(database: Option<&str>, sql: &str) -> anyhow::Result<String> {
    let port = database_url()
        .rsplit_once(':')
        .and_then(|(_, rest)| rest.split('/').next().map(str::to_owned))
        .unwrap_or_else(|| "5432".into());
    let output = Command::new("runuser")
        .args([
            "-u",
            "postgres",
            "--",
            "psql",
            "-XAtq",
            "-v",
            "ON_ERROR_STOP=1",
        ])
        .args(["-p", &port, "-d", database.unwrap_or("postgres"), "-c", sql])
        .current_dir("/")
        .output()
        .context("runuser not found: running SQL as the postgres superuser needs root")?;
    anyhow::ensure!(
        output.status.success(),
        "as postgres: {sql}: {} (needs root and the local stack's PostgreSQL)",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

/// A name no other test, in this run or an earlier one, has used: `<prefix>-<pid>-<n>-<random>`.
pub fn unique_name(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let salt: u32 = rand::random();
    format!("{prefix}-{}-{n}-{salt:08x}", std::process::id())
}

/// Client settings every test client shares.
pub fn client_config() -> ClientConfig {
    client_config_for(&bootstrap_servers())
}

/// Client settings for another broker (a test's private one).
pub fn client_config_for(bootstrap_servers: &str) -> ClientConfig {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", bootstrap_servers)
        .set("socket.timeout.ms", "10000");
    config
}

pub fn admin() -> anyhow::Result<AdminClient<DefaultClientContext>> {
    client_config()
        .create()
        .context("cannot create a Kafka admin client")
}

/// Creates `name` with `partitions` partitions and waits until its leaders are known.
pub async fn create_topic(name: &str, partitions: i32) -> anyhow::Result<()> {
    create_topic_on(&bootstrap_servers(), name, partitions).await
}

/// [`create_topic`] on another broker (a test's private one).
pub async fn create_topic_on(
    bootstrap_servers: &str,
    name: &str,
    partitions: i32,
) -> anyhow::Result<()> {
    let admin: AdminClient<DefaultClientContext> = client_config_for(bootstrap_servers)
        .create()
        .context("cannot create a Kafka admin client")?;
    // The broker's default replication factor: 1 on the stack's broker, 3 on a test cluster.
    let topic = NewTopic::new(name, partitions, TopicReplication::Fixed(-1));
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    let results = admin
        .create_topics([&topic], &options)
        .await
        .with_context(|| format!("cannot create topic {name}: {STACK_HINT}"))?;
    for result in results {
        if let Err((topic, code)) = result {
            bail!("cannot create topic {topic}: {code}");
        }
    }
    wait_for_leaders(bootstrap_servers, name, partitions)
}

fn wait_for_leaders(bootstrap_servers: &str, topic: &str, partitions: i32) -> anyhow::Result<()> {
    let consumer: BaseConsumer = client_config_for(bootstrap_servers).create()?;
    for _ in 0..100 {
        let metadata = consumer.fetch_metadata(Some(topic), Duration::from_secs(5))?;
        let ready = metadata.topics().iter().any(|t| {
            t.error().is_none()
                && t.partitions().len() == partitions as usize
                && t.partitions().iter().all(|p| p.leader() >= 0)
        });
        if ready {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!("topic {topic} has no leader for every partition after 10 s")
}

/// A producer that polls its delivery reports on a background thread, as transactions need.
pub type TestProducer = ThreadedProducer<DefaultProducerContext>;

/// A transactional producer with `init_transactions` done.
pub fn transactional_producer(transactional_id: &str) -> anyhow::Result<TestProducer> {
    let producer: TestProducer = kafka_clients::idempotent_producer(&client_config())
        .set("transactional.id", transactional_id)
        .set("transaction.timeout.ms", "30000")
        .create()?;
    rdkafka::producer::Producer::init_transactions(&producer, Duration::from_secs(30))
        .with_context(|| format!("init_transactions failed: {STACK_HINT}"))?;
    Ok(producer)
}

pub use eos_runtime::kafka_clients::Isolation;

/// Every record of `topic` from the beginning to the end, as read with `isolation`.
///
/// The end is each partition's high watermark; a `read_committed` reader reaches it only once no
/// transaction is open there, so the wait is bounded and a failure says so.
pub fn read_topic(topic: &str, isolation: Isolation) -> anyhow::Result<Vec<OwnedMessage>> {
    read_topic_on(&bootstrap_servers(), topic, isolation)
}

/// [`read_topic`] on another broker (a test's private one).
pub fn read_topic_on(
    bootstrap_servers: &str,
    topic: &str,
    isolation: Isolation,
) -> anyhow::Result<Vec<OwnedMessage>> {
    let consumer: BaseConsumer = kafka_clients::consumer(
        &client_config_for(bootstrap_servers),
        &unique_name("reader"),
        isolation,
    )
    .create()?;
    let metadata = consumer.fetch_metadata(Some(topic), Duration::from_secs(10))?;
    let partitions: Vec<i32> = metadata
        .topics()
        .iter()
        .flat_map(|t| t.partitions().iter().map(|p| p.id()))
        .collect();
    if partitions.is_empty() {
        bail!("topic {topic} has no partitions (does it exist?)");
    }
    let mut assignment = TopicPartitionList::new();
    let mut remaining = Vec::new();
    for &partition in &partitions {
        let (low, high) = consumer.fetch_watermarks(topic, partition, Duration::from_secs(10))?;
        assignment.add_partition_offset(topic, partition, Offset::Offset(low))?;
        if high > low {
            remaining.push((partition, high));
        }
    }
    consumer.assign(&assignment)?;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut records = Vec::new();
    while !remaining.is_empty() {
        if std::time::Instant::now() > deadline {
            bail!("reading {topic} ({isolation:?}) did not reach the end of {remaining:?} in 60 s");
        }
        if let Some(message) = consumer.poll(Duration::from_millis(200)) {
            records.push(message?.detach());
        }
        // Control records and aborted data advance the position without being returned.
        let positions = consumer.position()?;
        remaining.retain(|&(partition, high)| {
            positions
                .find_partition(topic, partition)
                .and_then(|elem| elem.offset().to_raw())
                .is_none_or(|position| position < high)
        });
    }
    records.sort_by_key(|m| (m.partition(), m.offset()));
    Ok(records)
}

/// Waits until `group` has committed, for every partition of `topic`, the topic's end offset:
/// everything produced so far has been consumed and its effects committed.
///
/// A lookup that times out is asked again until `timeout`: after a member is SIGKILLed, its open
/// transaction holds the group's offsets "unstable" until the broker aborts it
/// (transaction.timeout.ms plus the broker's abort sweep), and a read_committed offset fetch waits
/// on them.
/// How many records `topic` holds (the sum of its partitions' high watermarks); 0 while it does
/// not exist yet, and a partition whose leader is not yet elected counts 0 too.
///
/// A topic just created answers metadata before every partition has a leader: its watermark
/// fetch is refused with NotLeaderForPartition or LeaderNotAvailable for a moment (this failed a
/// CI run of `processor::a_broker_killed_mid_run_and_restarted_loses_and_doubles_nothing`).
/// Callers poll, so "none yet" is the honest answer; any other error is still an error.
pub fn records_in_topic(bootstrap_servers: &str, topic: &str) -> anyhow::Result<i64> {
    use rdkafka::error::RDKafkaErrorCode;
    let consumer: BaseConsumer = kafka_clients::reader(
        &client_config_for(bootstrap_servers),
        "records-in-topic",
        Isolation::ReadUncommitted,
    )
    .create()?;
    let metadata = consumer.fetch_metadata(Some(topic), Duration::from_secs(10))?;
    let mut records = 0;
    for partition in metadata
        .topics()
        .iter()
        .filter(|t| t.name() == topic && t.error().is_none())
        .flat_map(|t| t.partitions())
    {
        match consumer.fetch_watermarks(topic, partition.id(), Duration::from_secs(10)) {
            Ok((low, high)) => records += high - low,
            Err(error)
                if matches!(
                    error.rdkafka_error_code(),
                    Some(
                        RDKafkaErrorCode::NotLeaderForPartition
                            | RDKafkaErrorCode::LeaderNotAvailable
                    )
                ) => {}
            Err(error) => {
                return Err(error).with_context(|| {
                    format!("cannot read partition {} of {topic}", partition.id())
                });
            }
        }
    }
    Ok(records)
}

pub fn wait_until_consumed(
    bootstrap_servers: &str,
    group: &str,
    topic: &str,
    timeout: Duration,
) -> anyhow::Result<()> {
    let consumer: BaseConsumer = kafka_clients::consumer(
        &client_config_for(bootstrap_servers),
        group,
        Isolation::ReadCommitted,
    )
    .create()?;
    let metadata = consumer.fetch_metadata(Some(topic), Duration::from_secs(10))?;
    let partitions: Vec<i32> = metadata
        .topics()
        .iter()
        .flat_map(|t| t.partitions().iter().map(|p| p.id()))
        .collect();
    let behind_now = || -> anyhow::Result<Vec<(i32, i64, i64)>> {
        let mut list = TopicPartitionList::new();
        for &partition in &partitions {
            list.add_partition(topic, partition);
        }
        let committed = consumer.committed_offsets(list, Duration::from_secs(10))?;
        let mut behind = Vec::new();
        for &partition in &partitions {
            let (_, high) = consumer.fetch_watermarks(topic, partition, Duration::from_secs(10))?;
            let at = committed
                .find_partition(topic, partition)
                .and_then(|elem| elem.offset().to_raw())
                // No commit (-1001) on a partition that never had a record is nothing behind.
                .filter(|offset| *offset >= 0)
                .unwrap_or(0);
            if at < high {
                behind.push((partition, at, high));
            }
        }
        Ok(behind)
    };
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let last = match behind_now() {
            Ok(behind) if behind.is_empty() => return Ok(()),
            Ok(behind) => format!("(partition, committed, end) {behind:?}"),
            Err(error) => format!("last lookup failed: {error:#}"),
        };
        if std::time::Instant::now() > deadline {
            bail!("group {group} still behind on {topic} after {timeout:?}: {last}");
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// A fresh PostgreSQL database owned by the test role; dropped by [`TestDatabase::drop_database`].
///
/// It holds a shared lock on the PostgreSQL server for its lifetime, so a test that restarts the
/// server ([`PostgresRestartGuard`]) waits until no other test uses it, in this process or another.
#[derive(Debug)]
pub struct TestDatabase {
    pub name: String,
    pub url: String,
    pub pool: PgPool,
    _server_lock: Option<File>,
}

/// The lock file that serialises PostgreSQL restarts against every test using the server.
fn postgres_lock_file() -> anyhow::Result<File> {
    let path = std::env::temp_dir().join("eos-it-postgres.lock");
    OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("cannot open {}", path.display()))
}

/// Holds the shared PostgreSQL lock (as a [`TestDatabase`] does) for a test that uses the server
/// through a child process of its own — `eos-lab demo`, which creates its database itself — so a
/// test that restarts the server waits for it instead of cutting its connections mid-run.
pub fn postgres_in_use() -> anyhow::Result<File> {
    let file = postgres_lock_file()?;
    file.lock_shared()
        .context("cannot take the shared PostgreSQL lock")?;
    Ok(file)
}

impl TestDatabase {
    pub async fn create() -> anyhow::Result<Self> {
        let lock = tokio::task::spawn_blocking(|| -> anyhow::Result<File> {
            let file = postgres_lock_file()?;
            file.lock_shared()
                .context("cannot take the shared PostgreSQL lock")?;
            Ok(file)
        })
        .await??;
        Self::create_locked(Some(lock)).await
    }

    async fn create_locked(server_lock: Option<File>) -> anyhow::Result<Self> {
        let admin_url = database_url();
        let name = unique_name("eos_it").replace('-', "_");
        let admin = PoolBuilder::new(1)
            .connect(&admin_url)
            .await
            .with_context(|| format!("cannot connect to {admin_url}: {STACK_HINT}"))?;
        sqlx::query(&format!("CREATE DATABASE \"{name}\""))
            .execute(&admin)
            .await
            .with_context(|| format!("cannot create database {name}"))?;
        admin.close().await;
        let url = database_url_for(&admin_url, &name);
        let pool = PoolBuilder::new(20)
            .connect(&url)
            .await
            .with_context(|| format!("cannot connect to {url}"))?;
        Ok(Self {
            name,
            url,
            pool,
            _server_lock: server_lock,
        })
    }

    pub async fn drop_database(self) -> anyhow::Result<()> {
        self.pool.close().await;
        eos_testkit::scratch_database::drop_database(&database_url(), &self.name)
            .await
            .with_context(|| format!("cannot drop database {}", self.name))
    }
}

/// Exclusive use of the PostgreSQL server, for a test that stops and starts it. Acquiring waits
/// until every [`TestDatabase`] (of any test process) is gone; while held, new ones wait.
#[derive(Debug)]
pub struct PostgresRestartGuard {
    _lock: File,
    cluster: (String, String),
    /// Set between `stop` and `start`, so a test that fails in between still leaves the server
    /// running for the tests after it (see `Drop`).
    stopped: std::sync::atomic::AtomicBool,
}

impl PostgresRestartGuard {
    pub async fn acquire() -> anyhow::Result<Self> {
        let lock = tokio::task::spawn_blocking(|| -> anyhow::Result<File> {
            let file = postgres_lock_file()?;
            file.lock()
                .context("cannot take the exclusive PostgreSQL lock")?;
            Ok(file)
        })
        .await??;
        let cluster = local_cluster()?;
        Ok(Self {
            _lock: lock,
            cluster,
            stopped: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// A fresh database for the test holding the server (no shared lock: it has the exclusive one).
    pub async fn create_database(&self) -> anyhow::Result<TestDatabase> {
        TestDatabase::create_locked(None).await
    }

    /// `pg_ctlcluster <cluster> <action...>`.
    fn pg_ctlcluster(&self, action: &[&str]) -> anyhow::Result<()> {
        let (version, name) = &self.cluster;
        let mut args = vec![version.as_str(), name.as_str()];
        args.extend(action);
        let output = Command::new("pg_ctlcluster").args(&args).output()?;
        anyhow::ensure!(
            output.status.success(),
            "pg_ctlcluster {args:?} failed (needs root): {}",
            String::from_utf8_lossy(&output.stderr)
        );
        Ok(())
    }

    /// Stops the server (fast: open connections are cut, open transactions roll back). One
    /// still shutting down when pg_ctl gives up (60 s: a replication session that never confirms
    /// the end of its WAL holds it until `wal_sender_timeout`) is stopped at once, so the tests
    /// after this one find a server they can start; the stop still fails.
    pub fn stop(&self) -> anyhow::Result<()> {
        self.stopped
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.pg_ctlcluster(&["stop", "-m", "fast"])
            .inspect_err(|_| {
                if let Err(error) = self.pg_ctlcluster(&["stop", "-m", "immediate"]) {
                    eprintln!("could not stop PostgreSQL at once either: {error:#}");
                }
            })
    }

    pub fn start(&self) -> anyhow::Result<()> {
        self.pg_ctlcluster(&["start"])?;
        self.stopped
            .store(false, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }
}

impl Drop for PostgresRestartGuard {
    fn drop(&mut self) {
        if self.stopped.load(std::sync::atomic::Ordering::SeqCst)
            && let Err(error) = self.pg_ctlcluster(&["start"])
        {
            eprintln!("could not restart PostgreSQL after a failed test: {error:#}");
        }
    }
}

/// `(version, name)` of the Debian cluster serving the test database's port.
fn local_cluster() -> anyhow::Result<(String, String)> {
    let url = database_url();
    let port = url
        .rsplit_once(':')
        .and_then(|(_, rest)| rest.split('/').next())
        .and_then(|p| p.parse::<u16>().ok())
        .unwrap_or(5432)
        .to_string();
    let output = Command::new("pg_lsclusters")
        .arg("--no-header")
        .output()
        .context("pg_lsclusters not found: restarting PostgreSQL needs Debian's cluster tools")?;
    let listing = String::from_utf8_lossy(&output.stdout);
    for line in listing.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() >= 3 && fields[2] == port {
            return Ok((fields[0].to_owned(), fields[1].to_owned()));
        }
    }
    bail!("no PostgreSQL cluster on port {port} in pg_lsclusters:\n{listing}")
}

/// Writes `(key, value)` records to `topic` with an idempotent producer and waits for delivery.
pub fn produce_records(topic: &str, records: &[(Option<String>, Vec<u8>)]) -> anyhow::Result<()> {
    use rdkafka::producer::{BaseRecord, Producer as _};
    let producer: TestProducer = kafka_clients::idempotent_producer(&client_config())
        .set("linger.ms", "5")
        .create()?;
    for (key, value) in records {
        let mut record = BaseRecord::<[u8], [u8]>::to(topic).payload(value.as_slice());
        if let Some(key) = key {
            record = record.key(key.as_bytes());
        }
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
    producer.flush(Duration::from_secs(60))?;
    Ok(())
}

/// The end offset (high watermark) of every partition of `topic`.
pub fn end_offsets(topic: &str) -> anyhow::Result<Vec<(i32, i64)>> {
    end_offsets_on(&bootstrap_servers(), topic)
}

/// [`end_offsets`] on another cluster (a test's private one).
pub fn end_offsets_on(bootstrap_servers: &str, topic: &str) -> anyhow::Result<Vec<(i32, i64)>> {
    let consumer: BaseConsumer = client_config_for(bootstrap_servers).create()?;
    let metadata = consumer.fetch_metadata(Some(topic), Duration::from_secs(10))?;
    let mut ends = Vec::new();
    for t in metadata.topics() {
        for p in t.partitions() {
            let (_, high) = consumer.fetch_watermarks(topic, p.id(), Duration::from_secs(10))?;
            ends.push((p.id(), high));
        }
    }
    ends.sort();
    Ok(ends)
}

/// `url` with its database name replaced by `database`.
fn database_url_for(url: &str, database: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (url, None),
    };
    let base = match base.rfind('/') {
        Some(slash) if slash > "postgres://".len() => &base[..slash],
        _ => base,
    };
    match query {
        Some(query) => format!("{base}/{database}?{query}"),
        None => format!("{base}/{database}"),
    }
}

/// The profile the workspace's binaries are built and run in: the test binary's own, so a
/// `cargo test --release` run (the long soak, docs/faults.md "Soak") runs release services, not debug ones.
const BINARY_PROFILE: &str = if cfg!(debug_assertions) {
    "debug"
} else {
    "release"
};

/// The path of one of the workspace's binaries, built once per test run if it is missing or stale.
pub fn workspace_binary(name: &str) -> anyhow::Result<PathBuf> {
    static BUILT: OnceLock<Result<(), String>> = OnceLock::new();
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .context("integration-tests lives inside the workspace")?;
    BUILT
        .get_or_init(|| {
            // Building is cheap when nothing changed, and guarantees tests never run a stale binary.
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let mut build = Command::new(cargo);
            build
                .args(["build", "--quiet", "--workspace", "--bins"])
                .current_dir(workspace);
            if BINARY_PROFILE == "release" {
                build.arg("--release");
            }
            // cargo gives a test the variables of its own package (CARGO_MANIFEST_DIR,
            // CARGO_PKG_NAME, ...). Build scripts that watch them (ring's) would see them
            // "changed" against `make test`'s own build and rebuild ring and everything above it
            // (rustls, sqlx, tonic: minutes), here and again in the next plain build.
            for (name, _) in std::env::vars_os() {
                let name = name.to_string_lossy();
                if name.starts_with("CARGO_PKG_")
                    || matches!(
                        name.as_ref(),
                        "CARGO_MANIFEST_DIR"
                            | "CARGO_MANIFEST_PATH"
                            | "CARGO_MANIFEST_LINKS"
                            | "CARGO_CRATE_NAME"
                            | "CARGO_PRIMARY_PACKAGE"
                            | "CARGO_TARGET_TMPDIR"
                            | "OUT_DIR"
                    )
                {
                    build.env_remove(name.as_ref());
                }
            }
            let status = build
                .status()
                .map_err(|e| format!("cannot run cargo build: {e}"))?;
            if status.success() {
                Ok(())
            } else {
                Err(format!(
                    "cargo build --workspace --bins ({BINARY_PROFILE}) failed: {status}"
                ))
            }
        })
        .clone()
        .map_err(anyhow::Error::msg)?;
    let target_dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace.join("target"));
    let path = target_dir.join(BINARY_PROFILE).join(name);
    if !path.exists() {
        bail!(
            "{} does not exist after building the workspace",
            path.display()
        );
    }
    Ok(path)
}

/// The sink's committed PostgreSQL checkpoints of `topic` (`sink_checkpoints`), by partition.
/// Before its first batch the sink may not have created the table yet: no checkpoints then.
pub async fn sink_checkpoints(
    pool: &PgPool,
    sink: &str,
    topic: &str,
) -> std::collections::BTreeMap<i32, i64> {
    sqlx::query_as::<_, (i32, i64)>(
        "SELECT partition, next_offset FROM sink_checkpoints \
         WHERE sink = $1 AND topic = $2 AND next_offset IS NOT NULL",
    )
    .bind(sink)
    .bind(topic)
    .fetch_all(pool)
    .await
    .unwrap_or_default()
    .into_iter()
    .collect()
}

/// A sink-writer targets file: the append and versioned tables `eosctl audit --database-url`
/// reads, and the provider charge through dedup-service, as `eos-lab demo` configures them.
pub fn tables_and_provider_targets(
    provider_name: &str,
    dedup_url: &str,
    provider_url: &str,
) -> String {
    let provider = eos_testkit::sink_targets::ProviderTarget {
        name: provider_name,
        dedup_url,
        provider_url,
        concurrency: None,
        as_http: false,
    };
    eos_testkit::sink_targets::sink_targets("integration-tests", Some(&provider))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn database_url_swaps_the_database() {
        assert_eq!(
            database_url_for("postgres://eos:eos@127.0.0.1:5432/eos", "x"),
            "postgres://eos:eos@127.0.0.1:5432/x"
        );
        assert_eq!(
            database_url_for("postgres://eos:eos@h/eos?sslmode=disable", "x"),
            "postgres://eos:eos@h/x?sslmode=disable"
        );
    }

    #[test]
    fn unique_names_differ() {
        assert_ne!(unique_name("t"), unique_name("t"));
    }
}
