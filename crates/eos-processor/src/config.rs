//! Command-line and environment configuration.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use std::collections::BTreeMap;

use clap::{Parser, ValueEnum};
use eos_core::envelope::MAX_ID_BYTES;
use eos_core::{EventContract, FieldLocation, Guarantee};
use eos_runtime::service_flags::StallFlags;
use eos_runtime::topic_config::TopicReplicationFlags;
use eos_runtime::{InstanceFlags, KafkaFlags, LogFlags};
pub use eos_transform::transform::{BuiltinTransform, parse_named_output};

/// Records larger than this go to the dead-letter topic: an output (input + totals) or a dead
/// letter (input + headers) must still fit the broker's default 1 MiB message limit.
pub const DEFAULT_MAX_RECORD_BYTES: usize = 900 * 1024;

/// What `--transform` names: a built-in transform or a WebAssembly module.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TransformChoice {
    /// `ledger` or `pass-through`.
    Builtin(BuiltinTransform),
    /// `wasm:PATH`.
    Wasm(PathBuf),
}

/// `--transform`, as clap's value parser: a built-in's name, or `wasm:` and the path of a
/// module file (checked to exist here, so a typo is a usage error; the module itself is
/// checked when it is loaded).
pub fn parse_transform(text: &str) -> Result<TransformChoice, String> {
    if let Some(path) = text.strip_prefix("wasm:") {
        let path = PathBuf::from(path);
        if !path.is_file() {
            return Err(format!(
                "{} is not a file: wasm:PATH names a WebAssembly module",
                path.display()
            ));
        }
        return Ok(TransformChoice::Wasm(path));
    }
    BuiltinTransform::from_str(text, false)
        .map(TransformChoice::Builtin)
        .map_err(|_| format!("{text:?} is not ledger, pass-through or wasm:PATH"))
}

/// A size in bytes, optionally with a KiB, MiB or GiB suffix (`--wasm-max-memory`).
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let (number, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(at) => text.split_at(at),
        None => (text, ""),
    };
    let unit = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        _ => return Err(format!("{text:?} is not a size such as 256MiB")),
    };
    number
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(unit))
        .ok_or_else(|| format!("{text:?} is not a size such as 256MiB"))
}

/// `--wasm-timeout`, as clap's value parser: a duration of at least a millisecond (the host
/// counts whole milliseconds, and a zero limit would stop every call at once).
pub fn parse_wasm_timeout(text: &str) -> Result<Duration, String> {
    let timeout = humantime::parse_duration(text).map_err(|error| format!("{text:?}: {error}"))?;
    if timeout < Duration::from_millis(1) {
        return Err(format!("{text:?} is shorter than a millisecond"));
    }
    Ok(timeout)
}

/// Kafka → Kafka exactly-once read-process-write.
///
/// Reads events (JSON objects) from the input topic with read_committed, drops duplicate
/// deliveries by event id, applies the transform (--transform) with each entity's state, and
/// writes the outputs, the state changelog, the dead letters and the consumed offsets in one
/// Kafka transaction per batch. Idempotence, read_committed and manual offset commits are not
/// configurable: exactly-once depends on them.
#[derive(Debug, Clone, Parser)]
#[command(name = "eos-processor", version, about, long_about)]
pub struct Config {
    /// Kafka bootstrap servers and the librdkafka property passthrough (TLS, SASL, timeouts).
    #[command(flatten)]
    pub kafka: KafkaFlags,

    /// Replication of the topics this service creates.
    #[command(flatten)]
    pub topics: TopicReplicationFlags,

    /// Topic to read events from.
    #[arg(long, env = "EOS_INPUT_TOPIC", default_value = "payments")]
    pub input_topic: String,

    /// Topic of the default output (named "default").
    #[arg(long, env = "EOS_OUTPUT_TOPIC", default_value = "ledger")]
    pub output_topic: String,

    /// A further output the transform writes to, as NAME=TOPIC (repeat the flag, or separate
    /// them with commas in the environment variable).
    #[arg(long = "output", env = "EOS_OUTPUTS", value_name = "NAME=TOPIC", value_delimiter = ',', value_parser = parse_named_output)]
    pub outputs: Vec<(String, String)>,

    /// The transform to run (ignored by a library user's `Processor`).
    ///
    /// ledger: the demo's ledger: checks the ledger envelope and keeps per-entity running
    /// totals.
    ///
    /// pass-through: each new event's value to the default output as it came, or only those
    /// whose value at --filter-pointer equals --filter-equals.
    ///
    /// wasm:PATH: the WebAssembly module at PATH, written in any language (docs/TRANSFORMS.md
    /// "WebAssembly transforms"; see --wasm-fuel, --wasm-max-memory, --wasm-timeout,
    /// --wasm-state-compatible).
    #[arg(long, env = "EOS_TRANSFORM", default_value = "ledger", value_parser = parse_transform)]
    pub transform: TransformChoice,

    /// wasm: fuel per call to the module, about one unit per instruction; a call that uses it
    /// all is dead-lettered with reason transform_limit.
    #[arg(long, env = "EOS_WASM_FUEL", default_value_t = crate::wasm::Limits::default().fuel)]
    pub wasm_fuel: u64,

    /// wasm: the most memory the module may grow to, in bytes or with a KiB, MiB or GiB
    /// suffix; a call that would pass it is dead-lettered with reason transform_limit.
    #[arg(long, env = "EOS_WASM_MAX_MEMORY", default_value = "256MiB", value_parser = parse_bytes)]
    pub wasm_max_memory: u64,

    /// wasm: the longest one call to the module may run, by the wall clock (e.g. 500ms, 2s); a
    /// call still running then is dead-lettered with reason transform_limit. Fuel alone does
    /// not bound time (a bulk-memory instruction costs one unit whatever its length); at most
    /// half of --transaction-timeout.
    #[arg(long, env = "EOS_WASM_TIMEOUT", default_value = "2s", value_parser = parse_wasm_timeout)]
    pub wasm_timeout: Duration,

    /// wasm: accept entity state written by a module with another digest (the new module reads
    /// the old one's state format as it is); without it, and unless the module exports
    /// eos_upgrade_state, such state stops the restore with an error naming both digests.
    #[arg(long, env = "EOS_WASM_STATE_COMPATIBLE")]
    pub wasm_state_compatible: bool,

    /// Where the event id is: `header:<name>`, `key` or a JSON pointer such as `/id`
    /// [default: the transform's; ledger: /event_id, others: header:event_id].
    #[arg(long, env = "EOS_EVENT_ID", value_name = "LOCATION")]
    pub event_id: Option<FieldLocation>,

    /// Where the entity is (orders its events and keys its state): `key`, `header:<name>` or a
    /// JSON pointer [default: the transform's; ledger: /entity_id, others: key].
    #[arg(long, env = "EOS_ENTITY", value_name = "LOCATION")]
    pub entity: Option<FieldLocation>,

    /// JSON pointer to the event time (RFC 3339) used for the dedup horizon; without one the
    /// record's timestamp is used [default: the transform's; ledger: /occurred_at].
    #[arg(long, env = "EOS_OCCURRED_AT", value_name = "POINTER")]
    pub occurred_at: Option<String>,

    /// pass-through: pass only events whose value at this JSON pointer equals --filter-equals.
    #[arg(long, env = "EOS_FILTER_POINTER", requires = "filter_equals")]
    pub filter_pointer: Option<String>,

    /// pass-through: the value to compare with, as JSON (`true`, `3`, `"EUR"`) or a plain
    /// string (`EUR`).
    #[arg(long, env = "EOS_FILTER_EQUALS", requires = "filter_pointer")]
    pub filter_equals: Option<String>,

    /// Dead-letter topic (default: `<input-topic>.dlq`).
    #[arg(long, env = "EOS_DLQ_TOPIC")]
    pub dlq_topic: Option<String>,

    /// Compacted state changelog topic, co-partitioned with the input
    /// (default: `<group-id>-<input-topic>-changelog`).
    #[arg(long, env = "EOS_CHANGELOG_TOPIC")]
    pub changelog_topic: Option<String>,

    /// Consumer group id; also the prefix of the transactional.id.
    #[arg(long, env = "EOS_GROUP_ID", default_value = "eos-processor")]
    pub group_id: String,

    /// This instance's id (static group membership, transactional.id, state directory).
    #[command(flatten)]
    pub instance: InstanceFlags,

    /// exactly-once (Kafka transactions) or at-least-once (no transactions; offsets committed
    /// after delivery — for benchmarks and to show what goes wrong without transactions).
    #[arg(long, env = "EOS_GUARANTEE", default_value = "exactly-once")]
    pub guarantee: Guarantee,

    /// A batch (one transaction) closes this long after its first record was written (its
    /// Kafka timestamp; the whole interval after it was read when that record is older than
    /// half the interval: a backlog).
    #[arg(long, env = "EOS_COMMIT_INTERVAL", default_value = "100ms", value_parser = humantime::parse_duration)]
    pub commit_interval: Duration,

    /// A batch closes after this many input records.
    #[arg(long, env = "EOS_MAX_BATCH", default_value_t = 2000)]
    pub max_batch: usize,

    /// Event ids are remembered this long for dedup; an event older than this (by occurred_at)
    /// is dead-lettered as beyond_dedup_horizon instead of applied.
    #[arg(long, env = "EOS_DEDUP_HORIZON", default_value = "7d", value_parser = humantime::parse_duration)]
    pub dedup_horizon: Duration,

    /// Partitions for topics this service creates (input, output, dead letters, changelog).
    #[arg(long, env = "EOS_PARTITIONS", default_value_t = 3)]
    pub partitions: i32,

    /// transaction.timeout.ms: how long a crashed instance's open transaction can hold back
    /// read_committed readers before the broker aborts it.
    #[arg(long, env = "EOS_TRANSACTION_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub transaction_timeout: Duration,

    /// Records larger than this many bytes are dead-lettered as oversized_record.
    #[arg(long, env = "EOS_MAX_RECORD_BYTES", default_value_t = DEFAULT_MAX_RECORD_BYTES)]
    pub max_record_bytes: usize,

    /// Where the state store lives: a directory `<group-id>.<instance-id>` under this one holds
    /// this instance's store (state larger than memory, restored at a restart from its local
    /// checkpoint) (default: `<system temp dir>/eos-processor-state`).
    #[arg(long, env = "EOS_STATE_DIR")]
    pub state_dir: Option<PathBuf>,

    /// Address for /metrics, /healthz, /readyz and /boundary.
    #[arg(long, env = "EOS_METRICS_ADDR", default_value = "127.0.0.1:9464")]
    pub metrics_addr: SocketAddr,

    /// When a loop that makes no progress is warned of and fails the health check.
    #[command(flatten)]
    pub stall: StallFlags,

    /// Log format.
    #[command(flatten)]
    pub log: LogFlags,

    /// Test-only fault switch: abort every Nth transaction after writing it, to exercise the
    /// abort-and-rewind path.
    #[arg(long, env = "EOS_FAULT_ABORT_EVERY", hide = true)]
    pub fault_abort_every: Option<u64>,
}

/// Kafka properties the processor takes from its own flags (--transaction-timeout), refused in the
/// passthrough on top of eos-runtime's list of what exactly-once depends on.
pub const OWN_KAFKA_PROPERTIES: &[&str] = &["transaction.timeout.ms"];

impl Config {
    /// The dead-letter topic: `--dlq-topic`, else `<input-topic>.dlq`.
    pub fn dlq_topic(&self) -> String {
        self.dlq_topic
            .clone()
            .unwrap_or_else(|| format!("{}.dlq", self.input_topic))
    }

    /// The state changelog topic: `--changelog-topic`, else
    /// `<group-id>-<input-topic>-changelog`.
    pub fn changelog_topic(&self) -> String {
        self.changelog_topic
            .clone()
            .unwrap_or_else(|| format!("{}-{}-changelog", self.group_id, self.input_topic))
    }

    /// This instance's state store directory: named by group and instance id, so two processes
    /// never share one.
    pub fn instance_state_dir(&self) -> PathBuf {
        let base = self
            .state_dir
            .clone()
            .unwrap_or_else(|| std::env::temp_dir().join("eos-processor-state"));
        crate::state_store::instance_dir(&base, &self.group_id, &self.instance.instance_id())
    }

    /// Every output by name, the default one (`--output-topic`) included.
    pub fn output_topics(&self) -> BTreeMap<String, String> {
        std::iter::once((
            crate::transform::DEFAULT_OUTPUT.to_owned(),
            self.output_topic.clone(),
        ))
        .chain(self.outputs.iter().cloned())
        .collect()
    }

    /// `base` (the transform's own contract) with what the flags say instead.
    pub fn event_contract(&self, base: EventContract) -> EventContract {
        EventContract {
            event_id: self.event_id.clone().unwrap_or(base.event_id),
            entity: self.entity.clone().unwrap_or(base.entity),
            occurred_at: self.occurred_at.clone().or(base.occurred_at),
            max_record_bytes: self.max_record_bytes,
        }
    }

    /// The transactional.id of this instance: group id and instance id.
    pub fn transactional_id(&self) -> String {
        format!("{}-{}", self.group_id, self.instance.instance_id())
    }

    /// Checks what clap cannot: values that parse but make no sense together.
    pub fn validate(&self) -> Result<(), String> {
        let mut topics = vec![
            ("--input-topic", self.input_topic.clone()),
            ("--output-topic", self.output_topic.clone()),
            ("--dlq-topic", self.dlq_topic()),
            ("--changelog-topic", self.changelog_topic()),
        ];
        let mut names = std::collections::BTreeSet::from([crate::transform::DEFAULT_OUTPUT]);
        for (name, topic) in &self.outputs {
            if !names.insert(name) {
                return Err(format!(
                    "--output {name}= is given twice (or names the default)"
                ));
            }
            topics.push(("--output", topic.clone()));
        }
        for (i, (flag, topic)) in topics.iter().enumerate() {
            if topic.is_empty() {
                return Err(format!("{flag} must not be empty"));
            }
            if let Some((other_flag, _)) = topics[..i].iter().find(|(_, t)| t == topic) {
                return Err(format!("{flag} and {other_flag} are both {topic:?}"));
            }
        }
        if self.max_batch == 0 {
            return Err("--max-batch must be at least 1".into());
        }
        if self.partitions < 1 {
            return Err("--partitions must be at least 1".into());
        }
        if self.commit_interval.is_zero() {
            return Err("--commit-interval must be positive".into());
        }
        if self.dedup_horizon.as_secs() == 0 {
            return Err("--dedup-horizon must be at least one second".into());
        }
        if self.max_record_bytes < 2 * MAX_ID_BYTES {
            return Err(format!(
                "--max-record-bytes must be at least {}",
                2 * MAX_ID_BYTES
            ));
        }
        if self.instance.instance_id().is_empty() {
            return Err("--instance-id must not be empty".into());
        }
        if let Some(pointer) = &self.occurred_at
            && !matches!(pointer.parse(), Ok(FieldLocation::Pointer(_)))
        {
            return Err(format!(
                "--occurred-at {pointer:?} is not a JSON pointer (such as /occurred_at)"
            ));
        }
        if self.filter_pointer.is_some()
            && self.transform != TransformChoice::Builtin(BuiltinTransform::PassThrough)
        {
            return Err("--filter-pointer is for --transform pass-through".into());
        }
        // A call that hangs to its limit keeps the batch's transaction open that long, with the
        // commit interval and the commit still to come: past --transaction-timeout the
        // coordinator would abort it, and the redone batch would hang on the same call again,
        // for ever, instead of dead-lettering it.
        if matches!(self.transform, TransformChoice::Wasm(_))
            && self.wasm_timeout * 2 > self.transaction_timeout
        {
            return Err(format!(
                "--wasm-timeout ({}) must be at most half of --transaction-timeout ({})",
                humantime::format_duration(self.wasm_timeout),
                humantime::format_duration(self.transaction_timeout)
            ));
        }
        if self.fault_abort_every == Some(0) {
            return Err("EOS_FAULT_ABORT_EVERY must be at least 1".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Config {
        Config::try_parse_from(std::iter::once("eos-processor").chain(args.iter().copied()))
            .expect("valid flags")
    }

    #[test]
    fn defaults_follow_the_design() {
        let config = parse(&["--instance-id", "pod-0"]);
        assert_eq!(config.input_topic, "payments");
        assert_eq!(config.output_topic, "ledger");
        assert_eq!(config.dlq_topic(), "payments.dlq");
        assert_eq!(config.changelog_topic(), "eos-processor-payments-changelog");
        assert_eq!(config.transactional_id(), "eos-processor-pod-0");
        assert_eq!(config.commit_interval, Duration::from_millis(100));
        assert_eq!(config.dedup_horizon, Duration::from_secs(7 * 24 * 3600));
        assert_eq!(config.guarantee, Guarantee::ExactlyOnce);
        assert_eq!(
            config.instance_state_dir(),
            std::env::temp_dir().join("eos-processor-state/eos-processor.pod-0")
        );
        assert_eq!(
            parse(&["--instance-id", "a/b", "--state-dir", "/var/lib/eos"]).instance_state_dir(),
            std::path::Path::new("/var/lib/eos/eos-processor.a_b")
        );
        assert!(config.validate().is_ok());
        assert_eq!(
            config.transform,
            TransformChoice::Builtin(BuiltinTransform::Ledger)
        );
        assert_eq!(
            config.output_topics(),
            BTreeMap::from([("default".to_owned(), "ledger".to_owned())])
        );
        // No location flags: the transform's own contract.
        assert_eq!(
            config.event_contract(EventContract::ledger()).event_id,
            FieldLocation::Pointer("/event_id".into())
        );
    }

    #[test]
    fn event_locations_and_outputs_come_from_flags() {
        let config = parse(&[
            "--transform",
            "pass-through",
            "--event-id",
            "/id",
            "--entity",
            "header:card",
            "--occurred-at",
            "/at",
            "--output",
            "flagged=card-flagged",
            "--output",
            "approved=card-approved",
        ]);
        assert!(config.validate().is_ok(), "{:?}", config.validate());
        let contract = config.event_contract(EventContract::default());
        assert_eq!(contract.event_id, FieldLocation::Pointer("/id".into()));
        assert_eq!(contract.entity, FieldLocation::Header("card".into()));
        assert_eq!(contract.occurred_at.as_deref(), Some("/at"));
        assert_eq!(config.output_topics().len(), 3);
        assert_eq!(config.output_topics()["flagged"], "card-flagged");
        for bad in [
            &["--event-id", "id"][..],
            &["--transform", "wasm"],
            &["--output", "flagged"],
            &["--filter-pointer", "/a"],
        ] {
            assert!(
                Config::try_parse_from(std::iter::once("eos-processor").chain(bad.iter().copied()))
                    .is_err(),
                "{bad:?}"
            );
        }
        let twice = parse(&["--output", "a=t1", "--output", "a=t2"]);
        assert!(twice.validate().expect_err("twice").contains("--output a="));
        let same_topic = parse(&["--output", "a=ledger"]);
        assert!(same_topic.validate().is_err());
        let not_a_pointer = parse(&["--occurred-at", "at"]);
        assert!(not_a_pointer.validate().is_err());
    }

    #[test]
    fn a_webassembly_transform_is_a_path_with_its_limits() {
        // Per process: two test runs at once must not remove each other's file.
        let module = std::env::temp_dir().join(format!(
            "eos-processor-config-test-{}.wasm",
            std::process::id()
        ));
        std::fs::write(&module, b"\0asm").expect("writes");
        let config = parse(&[
            "--transform",
            &format!("wasm:{}", module.display()),
            "--wasm-fuel",
            "1000",
            "--wasm-max-memory",
            "64MiB",
            "--wasm-state-compatible",
            "--wasm-timeout",
            "750ms",
        ]);
        assert_eq!(config.transform, TransformChoice::Wasm(module.clone()));
        assert_eq!(config.wasm_fuel, 1000);
        assert_eq!(config.wasm_max_memory, 64 << 20);
        assert!(config.wasm_state_compatible);
        assert_eq!(config.wasm_timeout, Duration::from_millis(750));
        assert!(config.validate().is_ok(), "{:?}", config.validate());
        let defaults = parse(&[]);
        assert_eq!(defaults.wasm_max_memory, 256 << 20);
        assert!(!defaults.wasm_state_compatible);
        assert_eq!(
            defaults.wasm_timeout,
            crate::wasm::Limits::default().timeout
        );
        // A hanging call must not outlive the transaction it holds open.
        let outliving = parse(&[
            "--transform",
            &format!("wasm:{}", module.display()),
            "--wasm-timeout",
            "6s",
        ]);
        let error = outliving.validate().expect_err("6 s against 10 s");
        assert!(error.contains("--wasm-timeout (6s)"), "{error}");
        for bad in [
            &["--transform", "wasm:/no/such/module.wasm"][..],
            &["--transform", "wasm:"],
            &["--transform", "lua"],
            &["--wasm-max-memory", "lots"],
            &["--wasm-max-memory", "1TB"],
            &["--wasm-timeout", "0s"],
            &["--wasm-timeout", "soon"],
        ] {
            assert!(
                Config::try_parse_from(std::iter::once("eos-processor").chain(bad.iter().copied()))
                    .is_err(),
                "{bad:?}"
            );
        }
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert_eq!(parse_bytes("2GiB"), Ok(2 << 30));
        std::fs::remove_file(&module).expect("removes the test module");
    }

    #[test]
    fn nonsense_is_refused_with_the_flag_named() {
        let config = parse(&["--output-topic", "payments"]);
        let error = config.validate().expect_err("same topic twice");
        assert!(error.contains("--output-topic"), "{error}");
        assert!(Config::try_parse_from(["eos-processor", "--guarantee", "maybe"]).is_err());
        let error = parse(&["--max-batch", "0"])
            .validate()
            .expect_err("zero batch");
        assert!(error.contains("--max-batch"));
    }

    #[test]
    fn kafka_properties_pass_through_except_what_the_processor_sets() -> anyhow::Result<()> {
        let settings = parse(&[
            "-X",
            "security.protocol=SSL",
            "-X",
            "ssl.ca.location=/ca.pem",
        ])
        .kafka
        .settings(OWN_KAFKA_PROPERTIES)?;
        let client = settings.client_config();
        assert_eq!(client.get("security.protocol"), Some("SSL"));
        assert_eq!(client.get("ssl.ca.location"), Some("/ca.pem"));
        for refused in [
            "transaction.timeout.ms=60000",
            "transactional.id=other",
            "isolation.level=read_uncommitted",
        ] {
            assert!(
                parse(&["-X", refused])
                    .kafka
                    .settings(OWN_KAFKA_PROPERTIES)
                    .is_err(),
                "{refused}"
            );
        }
        Ok(())
    }
}
