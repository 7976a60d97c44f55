//! Command-line and environment configuration.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use eos_core::Guarantee;
use eos_core::envelope::MAX_ID_BYTES;
use eos_runtime::topic_config::TopicReplicationFlags;
use eos_runtime::{InstanceFlags, KafkaFlags, LogFlags};

/// Records larger than this go to the dead-letter topic: an output (input + totals) or a dead
/// letter (input + headers) must still fit the broker's default 1 MiB message limit.
pub const DEFAULT_MAX_RECORD_BYTES: usize = 900 * 1024;

/// Kafka → Kafka exactly-once read-process-write.
///
/// Reads envelopes from the input topic with read_committed, applies the "ledger" transform
/// (per-entity running totals), drops duplicate deliveries by event_id, and writes the outputs,
/// the state changelog, the dead letters and the consumed offsets in one Kafka transaction per
/// batch. Idempotence, read_committed and manual offset commits are not configurable: exactly-once
/// depends on them.
#[derive(Debug, Clone, Parser)]
#[command(name = "eos-processor", version, about, long_about)]
pub struct Config {
    // Kafka bootstrap servers and the librdkafka property passthrough (TLS, SASL, timeouts).
    #[command(flatten)]
    pub kafka: KafkaFlags,

    #[command(flatten)]
    pub topics: TopicReplicationFlags,

    /// Topic to read envelopes from.
    #[arg(long, env = "EOS_INPUT_TOPIC", default_value = "payments")]
    pub input_topic: String,

    /// Topic to write ledger records to.
    #[arg(long, env = "EOS_OUTPUT_TOPIC", default_value = "ledger")]
    pub output_topic: String,

    /// Dead-letter topic [default: <input-topic>.dlq].
    #[arg(long, env = "EOS_DLQ_TOPIC")]
    pub dlq_topic: Option<String>,

    /// Compacted state changelog topic, co-partitioned with the input
    /// [default: <group-id>-<input-topic>-changelog].
    #[arg(long, env = "EOS_CHANGELOG_TOPIC")]
    pub changelog_topic: Option<String>,

    /// Consumer group id; also the prefix of the transactional.id.
    #[arg(long, env = "EOS_GROUP_ID", default_value = "eos-processor")]
    pub group_id: String,

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
    /// checkpoint) [default: <system temp dir>/eos-processor-state].
    #[arg(long, env = "EOS_STATE_DIR")]
    pub state_dir: Option<PathBuf>,

    /// Address for /metrics, /healthz, /readyz and /boundary.
    #[arg(long, env = "EOS_METRICS_ADDR", default_value = "127.0.0.1:9464")]
    pub metrics_addr: SocketAddr,

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
    pub fn dlq_topic(&self) -> String {
        self.dlq_topic
            .clone()
            .unwrap_or_else(|| format!("{}.dlq", self.input_topic))
    }

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

    pub fn transactional_id(&self) -> String {
        format!("{}-{}", self.group_id, self.instance.instance_id())
    }

    /// Checks what clap cannot: values that parse but make no sense together.
    pub fn validate(&self) -> Result<(), String> {
        let topics = [
            ("--input-topic", self.input_topic.clone()),
            ("--output-topic", self.output_topic.clone()),
            ("--dlq-topic", self.dlq_topic()),
            ("--changelog-topic", self.changelog_topic()),
        ];
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
