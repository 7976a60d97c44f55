//! Command-line and environment configuration.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use clap::builder::BoolishValueParser;
use clap::{ArgAction, Parser};
use eos_core::envelope::{DEFAULT_MAX_RECORD_BYTES, MAX_ID_BYTES};
use eos_core::{EventContract, FieldLocation};

use crate::mapping::{EventFormat, EventSchema};
use eos_runtime::secrets::DatabaseUrlFlags;
use eos_runtime::service_flags::StallFlags;
use eos_runtime::topic_config::TopicReplicationFlags;
use eos_runtime::{InstanceFlags, KafkaFlags, LogFlags};
use eos_schema::{RecordFormat, RegistryConfig, RegistryFlags};

/// Where the input position lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OffsetsMode {
    /// `sink_checkpoints`, in the same transaction as the rows (exactly-once).
    Postgres,
    /// The Kafka group offset, committed after the database commit (at-least-once delivery into
    /// an idempotent sink).
    Kafka,
}

impl FromStr for OffsetsMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "postgres" => Ok(Self::Postgres),
            "kafka" => Ok(Self::Kafka),
            other => Err(format!(
                "unknown offsets mode {other:?}: expected postgres or kafka"
            )),
        }
    }
}

impl fmt::Display for OffsetsMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Postgres => "postgres",
            Self::Kafka => "kafka",
        })
    }
}

/// Kafka → PostgreSQL with exactly-once effects on the tables.
///
/// Reads JSON events from a topic with read_committed (default `ledger`; --event-id, --entity and
/// --occurred-at say where any event keeps its id, entity and time) and writes
/// each batch in one PostgreSQL transaction: idempotent inserts (append targets, keyed by a unique
/// column), versioned upserts (only a higher version replaces a row), conflicts into
/// `sink_conflicts`, and — with `--offsets postgres` — the input checkpoint in
/// `sink_checkpoints`, fenced by an owner epoch. Records that cannot be parsed or mapped go to the
/// dead-letter topic. read_committed, manual offset commits and the fencing are not configurable:
/// exactly-once depends on them.
#[derive(Debug, Clone, Parser)]
#[command(name = "sink-writer", version, about, long_about)]
pub struct Config {
    // Kafka bootstrap servers and the librdkafka property passthrough (TLS, SASL, timeouts).
    #[command(flatten)]
    pub kafka: KafkaFlags,

    #[command(flatten)]
    pub topics: TopicReplicationFlags,

    /// Topic to read (the processor's output, or any topic of JSON events).
    #[arg(long, env = "EOS_SINK_TOPIC", default_value = "ledger")]
    pub topic: String,

    /// The topic's record format: json (a JSON object per record), or avro, protobuf or
    /// json-schema in a schema registry's wire format, decoded with the schema its id names into
    /// the JSON event the targets' columns read (logical types as JSON: decimals and timestamps
    /// as text; docs/schemas.md). A record that does not decode is a dead letter,
    /// undecodable_record, naming the subject and the schema id.
    #[arg(long, env = "EOS_INPUT_FORMAT", value_enum, default_value_t = RecordFormat::Json)]
    pub input_format: RecordFormat,

    /// The schema registry a registry format reads through.
    #[command(flatten)]
    pub registry: RegistryFlags,

    /// Consumer group id; also the sink's name in sink_checkpoints, sink_conflicts and
    /// sink_dead_letters (two sinks with different group ids keep separate checkpoints).
    #[arg(long, env = "EOS_SINK_GROUP_ID", default_value = "sink-writer")]
    pub group_id: String,

    #[command(flatten)]
    pub instance: InstanceFlags,

    #[command(flatten)]
    pub database: DatabaseUrlFlags,

    /// Do not apply the migrations at start-up; only check that `sink-writer migrate` has
    /// applied them (it runs with a role that owns the schema, so the sink can run with one that
    /// only reads and writes rows of its tables and targets).
    #[arg(long, env = "EOS_SKIP_MIGRATIONS", action = ArgAction::SetTrue, value_parser = BoolishValueParser::new())]
    pub skip_migrations: bool,

    /// TOML file listing the target tables and their column mappings [default: the
    /// event_sink (append by event_id) and entity_state (versioned by entity_id)].
    #[arg(long, env = "EOS_SINK_CONFIG")]
    pub config: Option<PathBuf>,

    /// Where the input position lives: postgres (in sink_checkpoints, in the same transaction as
    /// the rows: exactly-once) or kafka (group offset committed after the database commit:
    /// at-least-once delivery into an idempotent sink — the weaker boundary).
    #[arg(long, env = "EOS_SINK_OFFSETS", default_value = "postgres")]
    pub offsets: OffsetsMode,

    /// Dead-letter topic [default: the --topic name with .sink-dlq appended].
    #[arg(long, env = "EOS_SINK_DLQ_TOPIC")]
    pub dlq_topic: Option<String>,

    /// A batch (one database transaction) closes after this many records.
    #[arg(long, env = "EOS_SINK_MAX_BATCH", default_value_t = 2000)]
    pub max_batch: usize,

    /// ... or once its records (payloads, keys and headers) hold this many bytes, so a burst of
    /// large records cannot grow one batch's memory to max-batch × max-record-bytes.
    #[arg(long, env = "EOS_SINK_MAX_BATCH_BYTES", default_value_t = 32 * 1024 * 1024)]
    pub max_batch_bytes: usize,

    /// A batch closes this long after its first record at the latest.
    #[arg(long, env = "EOS_SINK_BATCH_INTERVAL", default_value = "100ms", value_parser = humantime::parse_duration)]
    pub batch_interval: Duration,

    /// A batch also closes once no record has arrived for this long: the input is drained (a
    /// transactional input arrives a commit at a time), and waiting out the interval would add
    /// latency but no records. Set it to the --batch-interval to close batches by interval and
    /// size only.
    #[arg(long, env = "EOS_SINK_BATCH_IDLE", default_value = "5ms", value_parser = humantime::parse_duration)]
    pub batch_idle: Duration,

    /// Records larger than this many bytes are dead-lettered as oversized_record.
    #[arg(long, env = "EOS_MAX_RECORD_BYTES", default_value_t = DEFAULT_MAX_RECORD_BYTES)]
    pub max_record_bytes: usize,

    /// Where the event id is: `header:<name>`, `key` or a JSON pointer such as `/auth_id`
    /// (default: `/event_id`, the demo ledger's; eos-processor also writes it as the `event_id`
    /// header of every output).
    #[arg(
        long,
        env = "EOS_EVENT_ID",
        value_name = "LOCATION",
        default_value = "/event_id"
    )]
    pub event_id: FieldLocation,

    /// Where the entity is: `key`, `header:<name>` or a JSON pointer (default: `/entity_id`,
    /// the ledger's; eos-processor keys its outputs by entity, so `key` reads any of them).
    #[arg(
        long,
        env = "EOS_ENTITY",
        value_name = "LOCATION",
        default_value = "/entity_id"
    )]
    pub entity: FieldLocation,

    /// What else each event must be: `ledger`, the demo's envelope (`value` a signed 64-bit
    /// integer, `version` unsigned, field by field), or `any` JSON object, whose fields only the
    /// targets' columns ask for.
    #[arg(long, env = "EOS_EVENT_SCHEMA", value_enum, default_value = "ledger")]
    pub event_schema: EventSchema,

    /// JSON pointer to the event time (RFC 3339), for `occurred_at` columns and the provider
    /// targets' replay horizon; without it, or when absent, the record's timestamp is used.
    #[arg(
        long,
        env = "EOS_OCCURRED_AT",
        value_name = "POINTER",
        default_value = "/occurred_at"
    )]
    pub occurred_at: String,

    /// How far back the input can be replayed (broker retention, backup restores, client retry
    /// horizon). A target that purges rows must keep them longer than this plus
    /// --retention-margin, or the service refuses to start (see docs/ARCHITECTURE.md, "Retention
    /// and the replay horizon").
    #[arg(long, env = "EOS_SINK_REPLAY_HORIZON", default_value = "7d", value_parser = humantime::parse_duration)]
    pub replay_horizon: Duration,

    /// Clock and operational margin added to --replay-horizon in the retention check.
    #[arg(long, env = "EOS_SINK_RETENTION_MARGIN", default_value = "1d", value_parser = humantime::parse_duration)]
    pub retention_margin: Duration,

    /// How often the gauge of unresolved held operations is read again from
    /// sink_held_operations (also at start-up and after a batch that held an event), so an
    /// operator's `eosctl held resolve` shows within this long.
    #[arg(long, env = "EOS_SINK_HELD_REFRESH_INTERVAL", default_value = "30s", value_parser = humantime::parse_duration)]
    pub held_refresh_interval: Duration,

    /// How often targets with a retention purge their old rows.
    #[arg(long, env = "EOS_SINK_PURGE_INTERVAL", default_value = "1h", value_parser = humantime::parse_duration)]
    pub purge_interval: Duration,

    /// Longest wait between two attempts while PostgreSQL is unreachable (backoff doubles from
    /// 100 ms up to this).
    #[arg(long, env = "EOS_SINK_MAX_BACKOFF", default_value = "5s", value_parser = humantime::parse_duration)]
    pub max_backoff: Duration,

    /// On SIGTERM, how long to keep retrying the open batch while PostgreSQL is unreachable
    /// before exiting non-zero (nothing is lost: the checkpoint has not moved).
    #[arg(long, env = "EOS_SINK_SHUTDOWN_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration)]
    pub shutdown_timeout: Duration,

    /// Address for /metrics, /healthz, /readyz and /boundary.
    #[arg(long, env = "EOS_METRICS_ADDR", default_value = "127.0.0.1:9465")]
    pub metrics_addr: SocketAddr,

    #[command(flatten)]
    pub stall: StallFlags,

    #[command(flatten)]
    pub log: LogFlags,

    #[command(flatten)]
    pub dedup: DedupClientFlags,

    /// Test-only fault switch: sleep this long after a batch is decided and before its database
    /// transaction begins, so a test can freeze the process holding a batch (zombie tests).
    #[arg(long, env = "EOS_SINK_FAULT_STALL_BEFORE_COMMIT", hide = true, value_parser = humantime::parse_duration)]
    pub fault_stall_before_commit: Option<Duration>,
}

/// How provider targets reach dedup-service (for every `dedup_url` in the targets file).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct DedupClientFlags {
    /// Bearer token sent to dedup-service with every call (its --client-token). Prefer the env
    /// var or --dedup-token-file: a flag shows in the process list.
    #[arg(long, env = "EOS_DEDUP_TOKEN", hide_env_values = true)]
    pub dedup_token: Option<String>,

    /// File holding the dedup-service token (trimmed), e.g. a mounted Secret.
    #[arg(long, env = "EOS_DEDUP_TOKEN_FILE")]
    pub dedup_token_file: Option<PathBuf>,

    #[command(flatten)]
    pub tls: dedup_client::DedupTlsFlags,
}

impl DedupClientFlags {
    /// The token (read from its file if so given) and TLS files; errors name the flag, never
    /// the token.
    pub fn credentials(
        &self,
    ) -> Result<dedup_client::ClientCredentials, dedup_client::CredentialError> {
        Ok(dedup_client::ClientCredentials {
            token: dedup_client::ClientCredentials::token_from(
                self.dedup_token.as_deref(),
                self.dedup_token_file.as_deref(),
                "--dedup-token",
            )?,
            tls: self.tls.files(),
        })
    }
}

pub use eos_runtime::service_flags::MigrateArgs;

impl Config {
    /// How the sink reads records as events, from the flags.
    pub fn event_format(&self) -> EventFormat {
        EventFormat {
            contract: EventContract {
                event_id: self.event_id.clone(),
                entity: self.entity.clone(),
                occurred_at: Some(self.occurred_at.clone()),
                max_record_bytes: self.max_record_bytes,
            },
            schema: self.event_schema,
        }
    }

    pub fn dlq_topic(&self) -> String {
        self.dlq_topic
            .clone()
            .unwrap_or_else(|| format!("{}.sink-dlq", self.topic))
    }

    /// The sink's name in its own tables.
    pub fn sink_name(&self) -> &str {
        &self.group_id
    }

    /// Checks what clap cannot: values that parse but make no sense together.
    /// The registry's settings for a registry `--input-format`, `None` for JSON.
    pub fn registry_config(&self) -> Result<Option<RegistryConfig>, String> {
        self.registry
            .registry_config(&[("--input-format", self.input_format)])
    }

    pub fn validate(&self) -> Result<(), String> {
        if self.topic.is_empty() {
            return Err("--topic must not be empty".into());
        }
        self.registry_config()?;
        if self.dlq_topic() == self.topic {
            return Err("--dlq-topic must differ from --topic".into());
        }
        if self.group_id.is_empty() {
            return Err("--group-id must not be empty".into());
        }
        if self.instance.instance_id().is_empty() {
            return Err("--instance-id must not be empty".into());
        }
        if self.max_batch == 0 {
            return Err("--max-batch must be at least 1".into());
        }
        if self.max_batch_bytes == 0 {
            return Err("--max-batch-bytes must be at least 1".into());
        }
        if self.batch_interval.is_zero() {
            return Err("--batch-interval must be positive".into());
        }
        if self.batch_idle.is_zero() {
            return Err("--batch-idle must be positive".into());
        }
        if !matches!(self.occurred_at.parse(), Ok(FieldLocation::Pointer(_))) {
            return Err(format!(
                "--occurred-at {:?} is not a JSON pointer (such as /occurred_at)",
                self.occurred_at
            ));
        }
        if self.max_record_bytes < 2 * MAX_ID_BYTES {
            return Err(format!(
                "--max-record-bytes must be at least {}",
                2 * MAX_ID_BYTES
            ));
        }
        if self.max_backoff < Duration::from_millis(100) {
            return Err("--max-backoff must be at least 100ms".into());
        }
        if self.purge_interval < Duration::from_secs(1) {
            return Err("--purge-interval must be at least 1s".into());
        }
        Ok(())
    }
}

impl eos_runtime::service_flags::LogFormatFlag for Config {
    fn log_format(&self) -> eos_runtime::LogFormat {
        self.log.log_format
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the command line asks for: run the sink or `sink-writer migrate`.
    type Invocation = eos_runtime::service_flags::Invocation<Config>;

    fn parse(args: &[&str]) -> Config {
        Config::try_parse_from(
            ["sink-writer", "--database-url", "postgres://x@h/db"]
                .into_iter()
                .chain(args.iter().copied()),
        )
        .expect("valid flags")
    }

    #[test]
    fn defaults_follow_the_issue() {
        let config = parse(&["--instance-id", "pod-0"]);
        assert_eq!(config.topic, "ledger");
        assert_eq!(config.group_id, "sink-writer");
        assert_eq!(config.dlq_topic(), "ledger.sink-dlq");
        assert_eq!(config.offsets, OffsetsMode::Postgres);
        assert_eq!(config.metrics_addr.port(), 9465);
        assert_eq!(config.replay_horizon, Duration::from_secs(7 * 24 * 3600));
        assert!(
            !config.skip_migrations,
            "migrations run at start-up by default"
        );
        assert!(config.validate().is_ok());
    }

    #[test]
    fn migrate_is_a_subcommand_that_needs_only_the_database_url() {
        let invocation =
            Invocation::try_parse_from(["sink-writer", "migrate", "--database-url", "pg://a/b"])
                .expect("migrate parses");
        let Invocation::Migrate(args) = invocation else {
            panic!("expected migrate, got {invocation:?}");
        };
        assert_eq!(args.database.url(), "pg://a/b");

        let invocation = Invocation::try_parse_from([
            "sink-writer",
            "--database-url",
            "pg://a/b",
            "--skip-migrations",
        ])
        .expect("sink flags parse");
        let Invocation::Serve(config) = invocation else {
            panic!("expected serve, got {invocation:?}");
        };
        assert!(config.skip_migrations);

        let mixed = Invocation::try_parse_from([
            "sink-writer",
            "--topic",
            "t",
            "migrate",
            "--database-url",
            "pg://a/b",
        ]);
        assert!(mixed.is_err(), "sink flags and migrate do not mix");
        let help = Invocation::command().render_long_help().to_string();
        assert!(
            help.contains("migrate") && help.contains("--skip-migrations"),
            "{help}"
        );
    }

    #[test]
    fn nonsense_is_refused_with_the_flag_named() {
        assert!(
            Config::try_parse_from(["sink-writer", "--database-url", "x", "--offsets", "redis"])
                .is_err()
        );
        let error = parse(&["--dlq-topic", "ledger"])
            .validate()
            .expect_err("same topic");
        assert!(error.contains("--dlq-topic"), "{error}");
        let error = parse(&["--max-batch", "0"])
            .validate()
            .expect_err("zero batch");
        assert!(error.contains("--max-batch"), "{error}");
        let error = parse(&["--batch-idle", "0s"])
            .validate()
            .expect_err("zero idle bound");
        assert!(error.contains("--batch-idle"), "{error}");
        assert!(
            Config::try_parse_from(["sink-writer"]).is_err()
                || std::env::var("DATABASE_URL").is_ok()
        );
    }

    #[test]
    fn kafka_properties_pass_through_except_what_the_sink_sets() -> anyhow::Result<()> {
        let settings = parse(&[
            "-X",
            "security.protocol=SASL_SSL",
            "-X",
            "sasl.mechanism=SCRAM-SHA-512",
        ])
        .kafka
        .settings(&[])?;
        assert_eq!(
            settings.client_config().get("sasl.mechanism"),
            Some("SCRAM-SHA-512")
        );
        for refused in [
            "group.id=other",
            "enable.auto.commit=true",
            "auto.offset.reset=latest",
        ] {
            assert!(
                parse(&["-X", refused]).kafka.settings(&[]).is_err(),
                "{refused}"
            );
        }
        Ok(())
    }
}
