//! Command-line and environment configuration.

use std::net::SocketAddr;
use std::time::Duration;

use clap::builder::BoolishValueParser;
use clap::{ArgAction, Parser};
use eos_core::Guarantee;
use eos_runtime::secrets::DatabaseUrlFlags;
use eos_runtime::service_flags::StallFlags;
use eos_runtime::topic_config::TopicReplicationFlags;
use eos_runtime::{KafkaFlags, LogFlags};
use eos_schema::{RecordFormat, RegistryConfig, RegistryFlags, TopicSubject};

/// Publishes the rows of the PostgreSQL outbox (table eos_outbox, filled by
/// eos_outbox_enqueue(...) inside the domain's own transactions) to Kafka.
///
/// Rows are read in an order that never skips a committed row and keeps each entity's events in
/// commit order. In exactly-once mode each batch and the relay's position are written in one
/// Kafka transaction, so a crash neither loses nor repeats a record for read_committed readers;
/// a restarted relay with the same name fences the old one. In at-least-once mode the position is
/// stored in PostgreSQL after Kafka acknowledged the batch, so a crash repeats records.
/// LISTEN/NOTIFY wakes the relay at each commit; it also polls, in case a notification is missed.
///
/// --mode logical (the default) reads the outbox's inserts in commit order from a logical
/// replication slot (needs wal_level=logical and a role with REPLICATION); --mode xmin reads the
/// table below the server's oldest running transaction, which needs neither but waits for every
/// long write transaction on the server.
#[derive(Debug, Clone, Parser)]
#[command(name = "outbox-relay", version, about, long_about)]
pub struct Config {
    // Kafka bootstrap servers and the librdkafka property passthrough (TLS, SASL, timeouts).
    #[command(flatten)]
    pub kafka: KafkaFlags,

    #[command(flatten)]
    pub topics: TopicReplicationFlags,

    #[command(flatten)]
    pub database: DatabaseUrlFlags,

    /// Do not apply the migrations at start-up; only check that `outbox-relay migrate` has applied
    /// them (it runs with a role that owns the schema, so this service can run with one that only
    /// reads and writes rows).
    #[arg(long, env = "EOS_SKIP_MIGRATIONS", action = ArgAction::SetTrue, value_parser = BoolishValueParser::new())]
    pub skip_migrations: bool,

    /// The relay's name: the key of its position, and its transactional.id is
    /// `outbox-relay-<name>`, so a second relay with the same name fences the first. Run one relay
    /// per outbox.
    #[arg(long, env = "OUTBOX_RELAY_NAME", default_value = "default")]
    pub relay_name: String,

    /// How committed rows are found: logical (commit order from a logical replication slot; needs
    /// wal_level=logical and the REPLICATION attribute) or xmin (rows below the server's oldest
    /// running transaction; needs neither, but one long write transaction anywhere on the server
    /// delays every row committed after it started). Default: logical; xmin with --guarantee
    /// at-least-once, whose position lives in PostgreSQL's eos_outbox_relay_positions.
    #[arg(long, env = "OUTBOX_RELAY_MODE", value_enum)]
    pub mode: Option<RelayMode>,

    /// Logical mode: the replication slot (created at the first start; default
    /// `eos_outbox_<relay name>`, lowercased, other characters than a-z, 0-9 and _ as _). It holds
    /// WAL while the relay is down: drop it (pg_drop_replication_slot) when the relay is retired.
    #[arg(long, env = "OUTBOX_SLOT")]
    pub slot: Option<String>,

    /// Logical mode: the publication of eos_outbox's inserts. The migrations create eos_outbox;
    /// another name is created when missing (the role then needs CREATE on the database and to
    /// own the table).
    #[arg(long, env = "OUTBOX_PUBLICATION", default_value = "eos_outbox")]
    pub publication: String,

    /// Logical mode: with nothing to publish, how often the position still moves to the end of
    /// the WAL decoded (a Kafka transaction holding only the position), so the slot releases the
    /// WAL other databases write.
    #[arg(long, env = "OUTBOX_IDLE_POSITION_INTERVAL", default_value = "5s", value_parser = humantime::parse_duration)]
    pub idle_position_interval: Duration,

    /// Logical mode: how often the replication session confirms the slot up to the position
    /// Kafka has committed (a standby status update). Longer: fewer updates, more WAL kept on
    /// the server; a restart reads from Kafka's position either way.
    #[arg(long, env = "OUTBOX_SLOT_CONFIRM_INTERVAL", default_value = "1s", value_parser = humantime::parse_duration)]
    pub slot_confirm_interval: Duration,

    /// exactly-once (Kafka transactions with the position inside) or at-least-once (position in
    /// PostgreSQL after delivery: a crash repeats records, consumers must dedup by event_id).
    #[arg(long, env = "EOS_GUARANTEE", default_value = "exactly-once")]
    pub guarantee: Guarantee,

    /// Compacted topic holding the relay's position (exactly-once mode), created when missing.
    #[arg(
        long,
        env = "OUTBOX_POSITIONS_TOPIC",
        default_value = "eos-outbox-relay-positions"
    )]
    pub positions_topic: String,

    /// Most rows published in one Kafka transaction. Each transaction has a fixed cost in Kafka
    /// (registering its partitions waits for the previous transaction's markers), so a backlog
    /// drains faster in large ones; caught up, a transaction carries what arrived meanwhile.
    #[arg(long, env = "OUTBOX_BATCH_SIZE", default_value_t = 5000)]
    pub batch_size: i64,

    /// Caught up, the least time from one read that found rows to the next read: rows committed
    /// meanwhile go out in one Kafka transaction instead of one each, which is most of the
    /// relay's and PostgreSQL's CPU at a steady rate (docs/BENCHMARKS.md, outbox-relay). A row
    /// committed after a quiet spell is read at once (0s: never wait).
    #[arg(long, env = "OUTBOX_LINGER", default_value = "20ms", value_parser = humantime::parse_duration)]
    pub linger: Duration,

    /// How often to look for rows when no notification came.
    #[arg(long, env = "OUTBOX_POLL_INTERVAL", default_value = "1s", value_parser = humantime::parse_duration)]
    pub poll_interval: Duration,

    /// Kafka transaction timeout: how long a crashed relay's open transaction blocks readers.
    #[arg(long, env = "OUTBOX_TRANSACTION_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub transaction_timeout: Duration,

    /// How long published rows stay in the outbox before they are purged.
    #[arg(long, env = "OUTBOX_RETENTION", default_value = "1h", value_parser = humantime::parse_duration)]
    pub retention: Duration,

    /// How often published rows past the retention are purged (0s: never).
    #[arg(long, env = "OUTBOX_PURGE_INTERVAL", default_value = "10s", value_parser = humantime::parse_duration)]
    pub purge_interval: Duration,

    /// Most rows deleted by one purge statement, so a purge never holds long locks.
    #[arg(long, env = "OUTBOX_PURGE_BATCH", default_value_t = 1000)]
    pub purge_batch: i64,

    /// Address of /metrics, /healthz, /readyz and /boundary (port 0: any free port, logged).
    #[arg(long, env = "OUTBOX_METRICS_ADDR", default_value = "127.0.0.1:9467")]
    pub metrics_addr: SocketAddr,

    /// How each row's value is written: json (as it was enqueued), or in a schema registry's
    /// format, encoded against its topic's subject (`<topic>-value`, or the one --value-subject
    /// names) found at the topic's first row (docs/schemas.md "The outbox in a registry
    /// format"). A row whose value does not fit stops the relay, naming it: nothing is skipped.
    #[arg(long, env = "OUTBOX_VALUE_FORMAT", value_enum, default_value = "json")]
    pub value_format: RecordFormat,

    /// A topic's subject other than `<topic>-value` (e.g. a record's full name, as
    /// RecordNameStrategy names it), and a pinned version: TOPIC=SUBJECT or TOPIC=SUBJECT@VERSION
    /// (repeat the flag, or separate them with commas in the environment variable). Without a
    /// version, the subject's latest when the relay first writes to the topic.
    #[arg(long = "value-subject", env = "OUTBOX_VALUE_SUBJECTS", value_name = "TOPIC=SUBJECT[@VERSION]", value_delimiter = ',', value_parser = TopicSubject::parse)]
    pub value_subjects: Vec<TopicSubject>,

    #[command(flatten)]
    pub registry: RegistryFlags,

    #[command(flatten)]
    pub stall: StallFlags,

    #[command(flatten)]
    pub log: LogFlags,
}

/// How the relay finds committed rows (docs/architecture/outbox.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RelayMode {
    /// Commit order from a logical replication slot (pgoutput).
    Logical,
    /// (order_xid, position) order below the snapshot's xmin.
    Xmin,
}

impl RelayMode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Logical => "logical",
            Self::Xmin => "xmin",
        }
    }
}

impl std::fmt::Display for RelayMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The logical mode's default slot for a relay name. A replication slot's name may hold only
/// lowercase letters, digits and underscores, at most 63.
pub fn slot_name_from(relay_name: &str) -> String {
    let mut name: String = format!("eos_outbox_{relay_name}")
        .chars()
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_lowercase() || c.is_ascii_digit() {
                c
            } else {
                '_'
            }
        })
        .collect();
    name.truncate(63);
    name
}

/// Kafka properties the relay takes from its own flags (--transaction-timeout), refused in the
/// passthrough on top of eos-runtime's list of what exactly-once depends on.
pub const OWN_KAFKA_PROPERTIES: &[&str] = &["transaction.timeout.ms"];

impl Config {
    pub fn transactional_id(&self) -> String {
        format!("outbox-relay-{}", self.relay_name)
    }

    /// The mode the relay runs in (`--mode`, or its default for the guarantee).
    pub fn mode(&self) -> RelayMode {
        self.mode.unwrap_or(match self.guarantee {
            Guarantee::ExactlyOnce => RelayMode::Logical,
            Guarantee::AtLeastOnce => RelayMode::Xmin,
        })
    }

    /// The replication slot of the logical mode.
    pub fn slot_name(&self) -> String {
        self.slot
            .clone()
            .unwrap_or_else(|| slot_name_from(&self.relay_name))
    }

    /// The publication of the logical mode.
    pub fn publication_name(&self) -> String {
        self.publication.clone()
    }

    /// The registry the values are written through, when `--value-format` is a registry
    /// format.
    pub fn registry_config(&self) -> Result<Option<RegistryConfig>, String> {
        let config = self
            .registry
            .registry_config(&[("--value-format", self.value_format)])?;
        if config.is_none() && !self.value_subjects.is_empty() {
            return Err("--value-subject needs a registry --value-format".into());
        }
        Ok(config)
    }

    pub fn validate(&self) -> Result<(), String> {
        self.registry_config()?;
        if self.relay_name.is_empty() {
            return Err("--relay-name must not be empty".into());
        }
        if self.batch_size < 1 {
            return Err("--batch-size must be at least 1".into());
        }
        if self.purge_batch < 1 {
            return Err("--purge-batch must be at least 1".into());
        }
        if self.poll_interval.is_zero() {
            return Err("--poll-interval must be above 0".into());
        }
        if self.positions_topic.is_empty() {
            return Err("--positions-topic must not be empty".into());
        }
        let slot = self.slot_name();
        if slot.is_empty()
            || slot.len() > 63
            || !slot
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        {
            return Err(format!(
                "--slot {slot:?}: a replication slot's name is 1 to 63 of a-z, 0-9 and _"
            ));
        }
        let publication = self.publication_name();
        if publication.is_empty() || publication.len() > 63 || publication.contains('"') {
            return Err(format!(
                "--publication {publication:?}: 1 to 63 characters, no double quote"
            ));
        }
        if self.mode() == RelayMode::Logical && self.guarantee == Guarantee::AtLeastOnce {
            return Err(
                "--mode logical runs exactly-once only (its position is kept in Kafka with the \
                 records); at-least-once runs in --mode xmin"
                    .into(),
            );
        }
        if self.idle_position_interval.is_zero() {
            return Err("--idle-position-interval must be above 0".into());
        }
        if self.slot_confirm_interval.is_zero() {
            return Err("--slot-confirm-interval must be above 0".into());
        }
        Ok(())
    }
}

/// What the command line asks for: run the service (the flags of [`Config`]) or `outbox-relay migrate`.
pub type Invocation = eos_runtime::service_flags::Invocation<Config>;

impl eos_runtime::service_flags::LogFormatFlag for Config {
    fn log_format(&self) -> eos_runtime::LogFormat {
        self.log.log_format
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Config, clap::Error> {
        let mut argv = vec!["outbox-relay", "--database-url", "postgres://x/y"];
        argv.extend_from_slice(args);
        Config::try_parse_from(argv)
    }

    #[test]
    fn defaults_are_exactly_once_with_a_stable_transactional_id() {
        let config = parse(&[]).expect("defaults parse");
        assert_eq!(config.guarantee, Guarantee::ExactlyOnce);
        assert_eq!(config.transactional_id(), "outbox-relay-default");
        assert_eq!(config.mode(), RelayMode::Logical);
        assert_eq!(config.slot_name(), "eos_outbox_default");
        assert_eq!(config.publication_name(), "eos_outbox");
        assert_eq!(config.validate(), Ok(()));
    }

    #[test]
    fn a_registry_value_format_needs_the_registry_and_names_subjects_per_topic() {
        // An empty URL is none, whatever the environment holds.
        let no_url = ["--schema-registry-url="];
        let config = parse(&[&no_url[..], &["--value-format", "avro"]].concat()).expect("parses");
        let error = config.validate().expect_err("no registry");
        assert!(
            error.contains("--value-format avro needs --schema-registry-url"),
            "{error}"
        );
        let config =
            parse(&[&no_url[..], &["--value-subject", "orders=o-value"]].concat()).expect("parses");
        let error = config.validate().expect_err("a subject for json");
        assert!(error.contains("needs a registry --value-format"), "{error}");
        let config = parse(&[
            "--value-format",
            "protobuf",
            "--schema-registry-url",
            "http://127.0.0.1:8085/apis/ccompat/v7",
            "--value-subject",
            "orders=com.example.Order@2,refunds=refunds-value",
        ])
        .expect("parses");
        assert_eq!(config.validate(), Ok(()));
        assert_eq!(config.value_subjects.len(), 2);
        assert!(
            crate::boundary(&config)
                .result
                .contains("protobuf via http://127.0.0.1:8085"),
            "{}",
            crate::boundary(&config).result
        );
        assert!(parse(&["--value-subject", "orders"]).is_err());
    }

    #[test]
    fn the_slot_is_named_after_the_relay_in_the_characters_a_slot_allows() {
        let config = parse(&["--relay-name", "Payments-EU.1"]).expect("parses");
        assert_eq!(config.slot_name(), "eos_outbox_payments_eu_1");
        let long = "r".repeat(80);
        let config = parse(&["--relay-name", &long]).expect("parses");
        assert_eq!(config.slot_name().len(), 63);
        assert_eq!(config.validate(), Ok(()));
        let config = parse(&["--slot", "Bad-Slot"]).expect("parses");
        assert!(config.validate().is_err());
        let config =
            parse(&["--mode", "xmin", "--slot", "mine", "--publication", "pub"]).expect("parses");
        assert_eq!(
            (config.mode(), config.slot_name(), config.publication_name()),
            (RelayMode::Xmin, "mine".to_owned(), "pub".to_owned())
        );
        assert!(parse(&["--mode", "wal"]).is_err());
        let config = parse(&["--guarantee", "at-least-once"]).expect("parses");
        assert_eq!(
            (config.mode(), config.validate()),
            (RelayMode::Xmin, Ok(()))
        );
        let config = parse(&["--guarantee", "at-least-once", "--mode", "logical"]).expect("parses");
        assert!(config.validate().is_err());
    }

    #[test]
    fn migrate_is_a_subcommand_that_needs_only_the_database_url() {
        let invocation =
            Invocation::try_parse_from(["outbox-relay", "migrate", "--database-url", "pg://a/b"])
                .expect("parses");
        assert!(
            matches!(invocation, Invocation::Migrate(args) if args.database.url() == "pg://a/b")
        );
        assert!(
            Invocation::try_parse_from(["outbox-relay", "--batch-size", "5", "migrate"]).is_err(),
            "service flags and migrate do not mix"
        );
    }

    #[test]
    fn nonsense_is_refused_with_the_flag_named() {
        let error = parse(&["--guarantee", "maybe"]).expect_err("refused");
        assert!(error.to_string().contains("guarantee"), "{error}");
        let config = parse(&["--batch-size", "0"]).expect("parses");
        assert_eq!(
            config.validate(),
            Err("--batch-size must be at least 1".into())
        );
        let config = parse(&["--relay-name", ""]).expect("parses");
        assert!(config.validate().is_err());
    }

    #[test]
    fn kafka_properties_pass_through_except_what_the_relay_sets() -> anyhow::Result<()> {
        let settings = parse(&[
            "--kafka-properties",
            "security.protocol=SSL;ssl.ca.location=/ca.pem",
        ])?
        .kafka
        .settings(OWN_KAFKA_PROPERTIES)?;
        assert_eq!(
            settings.client_config().get("security.protocol"),
            Some("SSL")
        );
        for refused in ["transaction.timeout.ms=60000", "enable.idempotence=false"] {
            assert!(
                parse(&["-X", refused])?
                    .kafka
                    .settings(OWN_KAFKA_PROPERTIES)
                    .is_err(),
                "{refused}"
            );
        }
        Ok(())
    }
}
