//! `eos-lab demo`'s command line: what to run, under which faults, and how to report.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};
use serde::Serialize;

use crate::bench::record_format::RecordFormat;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DemoGuarantee {
    /// Transactions in the processor, checkpoints with the rows in the sink.
    ExactlyOnce,
    /// The processor without transactions (offsets committed after the output is flushed).
    AtLeastOnce,
}

/// Where the demo's events enter the pipeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DemoSource {
    /// HTTP clients of payments-api; outbox-relay publishes each committed payment's event.
    PaymentsApi,
    /// `eosctl produce` straight onto the topic, with re-deliveries, malformed records and reused
    /// ids for the processor to absorb.
    Producer,
}

impl DemoGuarantee {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::ExactlyOnce => "exactly-once",
            Self::AtLeastOnce => "at-least-once",
        }
    }
}

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// exactly-once, or at-least-once to see what the same faults do without transactions.
    #[arg(long, value_enum, default_value = "exactly-once")]
    pub guarantee: DemoGuarantee,

    /// payments-api (clients → outbox → outbox-relay → topic) or producer (straight onto the
    /// topic, with re-deliveries, malformed records and reused ids).
    #[arg(long, value_enum, default_value = "payments-api")]
    pub source: DemoSource,

    /// The records' format on the payments and ledger topics: json, or avro or protobuf in a
    /// schema registry's wire format (--schema-registry-url). The demo registers the payment's
    /// and the ledger entry's schemas under the topics' subjects; outbox-relay, eos-processor,
    /// sink-writer and the audit speak the format. With --source payments-api only.
    #[arg(long, value_enum, default_value = "json")]
    pub format: RecordFormat,

    /// The schema registry, for --format avro or protobuf: the services and the audit are given
    /// the same flags.
    #[command(flatten)]
    pub registry: eos_schema::RegistryFlags,

    /// Payments to make (payments-api: plus 5% resent with the same key, 0.1% keys reused with
    /// another amount, 0.5% malformed requests) or logical events to produce (producer: plus 5%
    /// re-deliveries, 0.5% malformed, 0.1% reused ids).
    #[arg(long, default_value_t = 20_000)]
    pub events: u64,

    /// Payments or records per second.
    #[arg(long, default_value_t = 2_000)]
    pub rate: u64,

    /// SIGKILLs of outbox-relay while the clients pay (each restarted at once).
    #[arg(long, default_value_t = 2)]
    pub relay_kills: usize,

    /// An outage of outbox-relay in the middle of the payments: SIGKILLed, kept down this long
    /// while the clients go on paying, then restarted, and SIGKILLed once more (restarted at
    /// once) when it has published half of the backlog it came back to. The default, at the
    /// default rate, leaves more than two of the relay's default batches waiting. 0s: none.
    #[arg(long, default_value = "6s", value_parser = humantime::parse_duration)]
    pub relay_outage: Duration,

    /// outbox-relay's --batch-size (most rows in one of its Kafka transactions); a small one
    /// makes a short outage leave a backlog of many batches [default: the relay's own].
    #[arg(long, value_name = "ROWS", value_parser = clap::value_parser!(i64).range(1..))]
    pub relay_batch_size: Option<i64>,

    /// SIGKILLs of eos-processor while the producer writes (each restarted at once). With
    /// at-least-once each is aimed: it lands while the processor has sent outputs that its
    /// restart will send again (see the report's faults).
    #[arg(long, default_value_t = 3)]
    pub processor_kills: usize,

    /// SIGKILLs of sink-writer while the producer writes (each restarted at once).
    #[arg(long, default_value_t = 3)]
    pub sink_kills: usize,

    /// Probability that provider-sim applies a charge and drops the connection.
    #[arg(long, default_value_t = 0.05)]
    pub provider_drop: f64,

    /// Probability that provider-sim applies a charge and answers 500.
    #[arg(long, default_value_t = 0.02)]
    pub provider_error: f64,

    /// Probability that provider-sim applies a charge and answers after the sink's deadline.
    #[arg(long, default_value_t = 0.02)]
    pub provider_late: f64,

    /// PostgreSQL server (and a database on it the role can connect to). Each run creates its
    /// own database there for the sink's tables and dedup-service's intents, and keeps it for
    /// inspection.
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://eos:eos@127.0.0.1:5432/eos",
        hide_env_values = true
    )]
    pub database_url: String,

    /// Where the service binaries are [default: the directory of this eos-lab].
    #[arg(long, env = "EOS_BIN_DIR")]
    pub bin_dir: Option<PathBuf>,

    /// The run's directory (logs, targets file, reports) is created under this one.
    #[arg(long, default_value = ".stack/demo")]
    pub runs_dir: PathBuf,

    /// How long the pipeline may take to drain once the workload is done: every service caught
    /// up (outbox-relay, eos-processor, sink-writer) within this of the last payment or record,
    /// or the run fails. The report gives each one's time and names this bound.
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    pub drain_timeout: Duration,

    /// Seed of the workload (its event ids are `evt-<seed>-<n>`) and of the fault schedule
    /// [default: the run's start time, so the tables and dedup-service, which outlive a run,
    /// see new event ids].
    #[arg(long)]
    pub seed: Option<u64>,

    /// Drop the run's database after the audit (tests do; people usually want to look).
    #[arg(long)]
    pub drop_database: bool,

    /// Print the report as one JSON object on stdout (progress goes to stderr).
    #[arg(long)]
    pub json: bool,

    /// After the report, print the trace of the report's sample event from this Jaeger query API
    /// (as `eosctl trace` does). The services export their spans when OTEL_EXPORTER_OTLP_ENDPOINT
    /// is set; `make demo` points both at the local stack's Jaeger.
    #[arg(long, value_name = "JAEGER_URL")]
    pub show_trace_from: Option<String>,

    /// Write every service's /metrics address to this file, in Prometheus's file-based service
    /// discovery format (`file_sd_configs`, job = the service's name), so a Prometheus can
    /// scrape the run while it goes (the dashboards and alerts in
    /// deploy/helm/eos-suite/files/ query those jobs).
    #[arg(long, value_name = "FILE")]
    pub prometheus_targets: Option<PathBuf>,
}
