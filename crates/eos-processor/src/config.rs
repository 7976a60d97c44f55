//! The processor's own flags ([`Config`]): what every binary that runs a `Processor` has, the
//! eos-processor binary and a library user's own (docs/TRANSFORMS.md "The binary"). Nothing in
//! it is the demo's: the topics and the group have no defaults, and the default output is
//! optional for a transform that writes only to outputs it names. The eos-processor binary's
//! own flags (the transform's choice, the WebAssembly limits, the filter) and its demo defaults
//! are `crate::service`'s.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use eos_core::envelope::MAX_ID_BYTES;
use eos_core::{EventContract, FieldLocation, Guarantee};
use eos_runtime::service_flags::StallFlags;
use eos_runtime::topic_config::TopicReplicationFlags;
use eos_runtime::{InstanceFlags, KafkaFlags, LogFlags};
pub use eos_transform::transform::BuiltinTransform;
pub(crate) use eos_transform::transform::parse_named_output;

use crate::input_format::InputFormatFlags;
use crate::transform::DEFAULT_OUTPUT;

/// Records larger than this go to the dead-letter topic: an output (input + totals) or a dead
/// letter (input + headers) must still fit the broker's default 1 MiB message limit.
pub(crate) const DEFAULT_MAX_RECORD_BYTES: usize = 900 * 1024;

/// Kafka → Kafka exactly-once read-process-write of a transform's events.
///
/// Reads events (JSON objects, or Avro, Protobuf or JSON Schema through a schema registry) from
/// the input topic with read_committed, drops duplicate deliveries by event id, applies the
/// transform with each entity's state, and writes the outputs, the state changelog, the dead
/// letters and the consumed offsets in one Kafka transaction per batch. Idempotence, read_committed and manual offset commits are not
/// configurable: exactly-once depends on them.
#[derive(Debug, Clone, Parser)]
#[command(version, about, long_about)]
pub struct Config {
    /// Kafka bootstrap servers and the librdkafka property passthrough (TLS, SASL, timeouts).
    #[command(flatten)]
    pub kafka: KafkaFlags,

    /// Replication of the topics this service creates.
    #[command(flatten)]
    pub topics: TopicReplicationFlags,

    /// Topic to read events from.
    #[arg(long, env = "EOS_INPUT_TOPIC")]
    pub input_topic: String,

    /// The input's format, and the schema registry a registry format needs.
    #[command(flatten)]
    pub input_format: InputFormatFlags,

    /// Topic of the default output (named "default"); needed unless the transform writes only to
    /// outputs it names (then no default output exists, and none is created).
    #[arg(long, env = "EOS_OUTPUT_TOPIC")]
    pub output_topic: Option<String>,

    /// A further output the transform writes to, as NAME=TOPIC (repeat the flag, or separate
    /// them with commas in the environment variable).
    #[arg(long = "output", env = "EOS_OUTPUTS", value_name = "NAME=TOPIC", value_delimiter = ',', value_parser = parse_named_output)]
    pub outputs: Vec<(String, String)>,

    /// Where the event id is: `header:<name>`, `key` or a JSON pointer such as `/id`
    /// [default: the transform's; else header:event_id].
    #[arg(long, env = "EOS_EVENT_ID", value_name = "LOCATION")]
    pub event_id: Option<FieldLocation>,

    /// Where the entity is (orders its events and keys its state): `key`, `header:<name>` or a
    /// JSON pointer [default: the transform's; else key].
    #[arg(long, env = "EOS_ENTITY", value_name = "LOCATION")]
    pub entity: Option<FieldLocation>,

    /// JSON pointer to the event time (RFC 3339) used for the dedup horizon; without one the
    /// record's timestamp is used [default: the transform's].
    #[arg(long, env = "EOS_OCCURRED_AT", value_name = "POINTER")]
    pub occurred_at: Option<String>,

    /// Dead-letter topic (default: `<input-topic>.dlq`).
    #[arg(long, env = "EOS_DLQ_TOPIC")]
    pub dlq_topic: Option<String>,

    /// Compacted state changelog topic, co-partitioned with the input
    /// (default: `<group-id>-<input-topic>-changelog`).
    #[arg(long, env = "EOS_CHANGELOG_TOPIC")]
    pub changelog_topic: Option<String>,

    /// Consumer group id; also the prefix of the transactional.id, so two applications must
    /// never share one.
    #[arg(long, env = "EOS_GROUP_ID")]
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
pub(crate) const OWN_KAFKA_PROPERTIES: &[&str] = &["transaction.timeout.ms"];

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

    /// Every output by name, the default one (`--output-topic`) included when it is given.
    pub fn output_topics(&self) -> BTreeMap<String, String> {
        self.output_topic
            .iter()
            .map(|topic| (DEFAULT_OUTPUT.to_owned(), topic.clone()))
            .chain(self.outputs.iter().cloned())
            .collect()
    }

    /// Checks that every output the transform writes to has a topic: the default output
    /// (`--output-topic`) when `writes_default`, and each of `named` (`--output NAME=TOPIC`).
    /// Refused at start-up, not found at run time as whole events become `unknown_output` dead
    /// letters.
    pub fn check_outputs(&self, writes_default: bool, named: &[String]) -> Result<(), String> {
        if writes_default && self.output_topic.is_none() {
            return Err(
                "--output-topic is required: the transform writes to the default output \
                 (a transform that writes only to outputs it names says so with \
                 Transform::writes_default_output)"
                    .into(),
            );
        }
        let configured = self.output_topics();
        match named
            .iter()
            .find(|name| *name != DEFAULT_OUTPUT && !configured.contains_key(*name))
        {
            Some(missing) => Err(format!(
                "the transform writes to output {missing:?}: configure it with --output \
                 {missing}=TOPIC"
            )),
            None => Ok(()),
        }
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
        let mut topics = vec![("--input-topic", self.input_topic.clone())];
        topics.extend(
            self.output_topic
                .clone()
                .map(|topic| ("--output-topic", topic)),
        );
        topics.extend([
            ("--dlq-topic", self.dlq_topic()),
            ("--changelog-topic", self.changelog_topic()),
        ]);
        if self.group_id.is_empty() {
            return Err("--group-id must not be empty".into());
        }
        self.input_format.registry_config()?;
        let mut names = std::collections::BTreeSet::from([DEFAULT_OUTPUT]);
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
        if self.fault_abort_every == Some(0) {
            return Err("EOS_FAULT_ABORT_EVERY must be at least 1".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    use super::*;

    /// What every library binary must be told: its topic and its group.
    const REQUIRED: [&str; 4] = ["--input-topic", "auths", "--group-id", "cards"];

    fn parse(args: &[&str]) -> Config {
        Config::try_parse_from(
            std::iter::once("processor")
                .chain(REQUIRED)
                .chain(args.iter().copied()),
        )
        .expect("valid flags")
    }

    #[test]
    fn a_library_binary_has_no_demo_defaults() {
        let error = Config::try_parse_from(["processor"]).expect_err("no topic, no group");
        assert_eq!(
            error.kind(),
            clap::error::ErrorKind::MissingRequiredArgument
        );
        let message = error.to_string();
        assert!(
            message.contains("--input-topic") && message.contains("--group-id"),
            "{message}"
        );
        // Nothing of the eos-processor binary's own: no transform to choose, no module, no
        // filter.
        let command = Config::command();
        for flag in ["transform", "wasm-fuel", "wasm-timeout", "filter-pointer"] {
            assert!(
                command
                    .get_arguments()
                    .all(|arg| arg.get_long() != Some(flag)),
                "--{flag}"
            );
        }
        let config = parse(&["--instance-id", "pod-0"]);
        assert_eq!(config.output_topic, None);
        assert!(config.output_topics().is_empty());
        assert_eq!(config.dlq_topic(), "auths.dlq");
        assert_eq!(config.changelog_topic(), "cards-auths-changelog");
        assert_eq!(config.transactional_id(), "cards-pod-0");
        assert_eq!(config.commit_interval, Duration::from_millis(100));
        assert_eq!(config.dedup_horizon, Duration::from_secs(7 * 24 * 3600));
        assert_eq!(config.guarantee, Guarantee::ExactlyOnce);
        assert_eq!(
            config.instance_state_dir(),
            std::env::temp_dir().join("eos-processor-state/cards.pod-0")
        );
        assert_eq!(
            parse(&["--instance-id", "a/b", "--state-dir", "/var/lib/eos"]).instance_state_dir(),
            std::path::Path::new("/var/lib/eos/cards.a_b")
        );
        assert!(config.validate().is_ok(), "{:?}", config.validate());
        // No location flags: the transform's own contract.
        assert_eq!(
            config.event_contract(EventContract::ledger()).event_id,
            FieldLocation::Pointer("/event_id".into())
        );
    }

    #[test]
    fn the_default_output_is_needed_only_by_a_transform_that_writes_to_it() {
        let tiers = ["tier".to_owned()];
        let named_only = parse(&["--output", "tier=loyalty-tiers"]);
        assert_eq!(named_only.check_outputs(false, &tiers), Ok(()));
        assert_eq!(
            named_only.output_topics(),
            BTreeMap::from([("tier".to_owned(), "loyalty-tiers".to_owned())])
        );
        let error = named_only
            .check_outputs(true, &tiers)
            .expect_err("no --output-topic");
        assert!(error.starts_with("--output-topic is required"), "{error}");
        let error = parse(&["--output-topic", "approved"])
            .check_outputs(true, &tiers)
            .expect_err("no --output tier=");
        assert!(error.contains("--output tier=TOPIC"), "{error}");
        let both = parse(&["--output-topic", "approved", "--output", "tier=t"]);
        assert_eq!(both.check_outputs(true, &tiers), Ok(()));
        assert_eq!(both.output_topics()[DEFAULT_OUTPUT], "approved");
    }

    #[test]
    fn event_locations_and_outputs_come_from_flags() {
        let config = parse(&[
            "--event-id",
            "/id",
            "--entity",
            "header:card",
            "--occurred-at",
            "/at",
            "--output-topic",
            "card-approved",
            "--output",
            "flagged=card-flagged",
            "--output",
            "approved=card-approved-too",
        ]);
        assert!(config.validate().is_ok(), "{:?}", config.validate());
        let contract = config.event_contract(EventContract::default());
        assert_eq!(contract.event_id, FieldLocation::Pointer("/id".into()));
        assert_eq!(contract.entity, FieldLocation::Header("card".into()));
        assert_eq!(contract.occurred_at.as_deref(), Some("/at"));
        assert_eq!(config.output_topics().len(), 3);
        assert_eq!(config.output_topics()["flagged"], "card-flagged");
        for bad in [&["--event-id", "id"][..], &["--output", "flagged"]] {
            assert!(
                Config::try_parse_from(
                    std::iter::once("processor")
                        .chain(REQUIRED)
                        .chain(bad.iter().copied())
                )
                .is_err(),
                "{bad:?}"
            );
        }
        let twice = parse(&["--output", "a=t1", "--output", "a=t2"]);
        assert!(twice.validate().expect_err("twice").contains("--output a="));
        let same_topic = parse(&["--output", "a=auths"]);
        assert!(same_topic.validate().is_err());
        let not_a_pointer = parse(&["--occurred-at", "at"]);
        assert!(not_a_pointer.validate().is_err());
    }

    #[test]
    fn nonsense_is_refused_with_the_flag_named() {
        let config = parse(&["--output-topic", "auths"]);
        let error = config.validate().expect_err("same topic twice");
        assert!(error.contains("--output-topic"), "{error}");
        let error = Config {
            group_id: String::new(),
            ..parse(&[])
        }
        .validate()
        .expect_err("empty group");
        assert!(error.contains("--group-id"), "{error}");
        assert!(
            Config::try_parse_from(
                std::iter::once("processor")
                    .chain(REQUIRED)
                    .chain(["--guarantee", "maybe"])
            )
            .is_err()
        );
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
