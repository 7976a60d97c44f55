//! The command line: every flag, its environment fallback and its help text.

use eos_schema::{RecordFormat, RegistryFlags};
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use eos_core::envelope::DEFAULT_MAX_RECORD_BYTES;
use eos_runtime::KafkaFlags;
use eos_runtime::telemetry::LogFormat;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

const EXIT_STATUS: &str = "\
Exit status:
  0  success (for audit: every input accounted for exactly once)
  1  audit found a violation; lag --wait timed out before the group caught up
  2  operational error: bad arguments, Kafka unreachable, input topic missing, delivery failed;
     for audit also PostgreSQL or the provider unreachable, or a table missing";

/// The shared Kafka flags work before and after the subcommand, like eosctl's other global
/// options.
pub fn global_option(arg: clap::Arg) -> clap::Arg {
    arg.global(true).help_heading("Global options")
}

#[derive(Debug, Parser)]
#[command(
    name = "eosctl",
    version,
    about = "Produce at-least-once workloads, audit a pipeline's exactly-once result, watch its \
             lag, show an event's trace, settle held operations and re-drive dead letters",
    after_help = EXIT_STATUS,
    mut_arg("bootstrap_servers", global_option),
    mut_arg("kafka_properties", global_option),
    mut_arg("kafka_properties_list", global_option),
    mut_arg("kafka_properties_file", global_option)
)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalFlags,

    #[command(subcommand)]
    pub command: Command,
}

/// The options eosctl and eos-lab take before or after their subcommand. Each tool's `Cli` makes
/// the Kafka flags global with `mut_arg(…, global_option)`.
#[derive(Debug, Args)]
pub struct GlobalFlags {
    // --bootstrap-servers and the librdkafka property passthrough, the same flags as the
    // services' (eos-runtime).
    #[command(flatten)]
    pub kafka: KafkaFlags,

    /// Log format on stderr (stdout carries only results): text or json. RUST_LOG filters.
    /// Traces are exported over OTLP/gRPC when OTEL_EXPORTER_OTLP_ENDPOINT is set.
    #[arg(
        long,
        env = "EOS_LOG_FORMAT",
        default_value = "text",
        global = true,
        help_heading = "Global options"
    )]
    pub log_format: LogFormat,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Write a deterministic at-least-once workload of event envelopes to a topic
    ///
    /// Writes COUNT distinct valid logical events keyed by entity_id, plus, as ratios of COUNT,
    /// exact re-deliveries, malformed records and reused event ids with other content — what a
    /// real at-least-once producer leaves on a topic. The same --seed (and --occurred-at-base)
    /// writes byte-identical records in the same order. Uses an idempotent producer (acks=all), so every duplicate on
    /// the topic is one the workload meant to write.
    #[command(after_help = EXIT_STATUS)]
    Produce(ProduceArgs),
    /// Prove a pipeline's result is exactly-once, or show where it is not
    ///
    /// Reads the input, output and dead-letter topics with read_committed, from the beginning to
    /// their end at the start of the run, and checks by event_id that every input is accounted
    /// for exactly once: one output per logical event with the content of its first occurrence,
    /// nothing for a duplicate delivery, one DLQ record with the right reason for each malformed
    /// or conflicting record; and that the output's running per-entity totals and order are
    /// right. Run it once the pipeline has caught up with its input.
    ///
    /// With --database-url and/or --provider-url it also audits the boundaries downstream of the
    /// output topic against the output's logical set (its events by event_id): the sink-writer's
    /// PostgreSQL tables and the provider's effects must each hold every output event exactly once,
    /// with its value. Violations there are reported as missing_row, duplicated_row,
    /// unexpected_row, row_mismatch, stale_state, state_ahead, missing_effect, duplicated_effect,
    /// unexpected_effect, effect_mismatch and refused_but_applied, in the same table, --json
    /// report and exit status.
    #[command(after_help = EXIT_STATUS)]
    Audit(Box<AuditArgs>),
    /// Show how far a consumer group is behind a topic, or wait until it has caught up
    ///
    /// For each partition of the topic: the group's committed offset (read with read_committed,
    /// so offsets a transaction is still committing are waited for, never read half-way), the
    /// end of the log (high watermark) and the lag between them. Offsets at the end of a
    /// partition that hold only transaction markers or aborted records, which no consumer ever
    /// receives, do not count as lag. The group is observed, never joined. With --wait, looks
    /// again every 250 ms until the total lag is 0: scripts use it to wait until a pipeline has
    /// drained.
    #[command(after_help = EXIT_STATUS)]
    Lag(LagArgs),
    /// Show an event's trace from Jaeger as a tree of spans
    ///
    /// Asks Jaeger's query API for the traces in which a span carries the tag `event_id=<ID>`
    /// (every service tags its spans of an event so; it searches each service Jaeger knows) and
    /// prints each trace as a tree: every span under its parent, with its service, name, duration,
    /// attempt number and status (ok/error), and what the step decided (eos.decision, eos.outcome).
    /// Attempt numbers count a step done again under the same parent (a record processed again
    /// after a SIGKILL or a re-delivery, a second dedup Begin). Spans reach Jaeger in batches, a
    /// few seconds after they end: --wait looks again until the trace is there and has stopped
    /// growing. A span whose parent Jaeger does not have (lost with a SIGKILLed process before it
    /// was exported) is shown as a root and says so.
    #[command(after_help = TRACE_EXIT_STATUS)]
    Trace(TraceArgs),
    /// List or settle events the sink-writer held because their provider operation is stuck
    ///
    /// A provider target's event is held (a row in sink_held_operations, written with the batch
    /// and its checkpoint) when dedup-service's reconciler cannot settle its operation: UNKNOWN,
    /// and older than the provider's key retention, so the provider's "no record" proves nothing.
    /// The event is neither charged again nor counted as charged. After finding out at the
    /// provider what happened, `held resolve` records it at dedup-service (Resolve, operator
    /// token) and marks the held rows resolved.
    #[command(subcommand)]
    Held(HeldCommand),
    /// List dead letters, or re-drive chosen ones through the processor, once, on the record
    ///
    /// An event's outcome is final: once the processor applied, refused or failed it, a
    /// re-delivery of its id is a duplicate (or, with other content, an event_id_conflict), never
    /// judged again. `list` shows the dead letters of a dead-letter topic by reason, transform
    /// reason, source topic, event id and time, and which re-drive took each. `redrive` is the
    /// operator's act of judging chosen ones again (the transform fixed, a limit raised): it
    /// sends each dead letter's original record, read back from its input partition, to that
    /// partition again with eos-redrive-id, eos-redriven-by and eos-redrive-reason, and writes a
    /// record of who re-drove which dead letter and why to the re-drive log topic, in one Kafka
    /// transaction. The processor judges a dead-lettered event again once per re-drive id; the
    /// new outcome replaces the refusal, exactly once, and a dead letter already re-driven is
    /// skipped.
    #[command(subcommand)]
    DeadLetters(DeadLettersCommand),
}

#[derive(Debug, Subcommand)]
pub enum DeadLettersCommand {
    /// Show the dead letters the filters choose, oldest first, with the re-drive that took each
    List(DeadLettersListArgs),
    /// Re-drive the dead letters the filters choose (at least one filter), as one act of --by
    /// for --why
    Redrive(DeadLettersRedriveArgs),
}

/// Which dead letters, and where they and their re-drive log are.
#[derive(Debug, Args)]
pub struct DeadLetterFilters {
    /// The dead-letter topic (the processor's --dlq-topic; by default <input topic>.dlq).
    #[arg(long, value_name = "TOPIC")]
    pub dlq: String,

    /// Only dead letters with this reason (eos-dlq-reason: transform_refused, transform_panic,
    /// transform_trap, transform_limit, total_overflow, …); repeat for several.
    #[arg(long = "reason", value_name = "REASON")]
    pub reasons: Vec<eos_core::DeadLetterReason>,

    /// Only those with this transform reason code (eos-dlq-transform-reason, such as
    /// over_daily_limit); repeat for several.
    #[arg(long = "transform-reason", value_name = "CODE")]
    pub transform_reasons: Vec<String>,

    /// Only those of records read from this input topic; repeat for several.
    #[arg(long = "source-topic", value_name = "TOPIC")]
    pub source_topics: Vec<String>,

    /// Only those of this event id (read where --event-id says); repeat for several.
    #[arg(long = "id", value_name = "EVENT_ID")]
    pub ids: Vec<String>,

    /// Only those dead-lettered at or after this time: RFC 3339, or how long ago (90m, 2h, 7d).
    #[arg(long, value_parser = parse_time_bound, value_name = "TIME")]
    pub since: Option<OffsetDateTime>,

    /// Only those dead-lettered before this time: RFC 3339, or how long ago.
    #[arg(long, value_parser = parse_time_bound, value_name = "TIME")]
    pub until: Option<OffsetDateTime>,

    /// Where the events keep their id, as the processor's --event-id: header:NAME, key or a
    /// JSON pointer into the original value such as /auth_id.
    #[arg(long, default_value = "header:event_id", value_name = "LOCATION")]
    pub event_id: eos_core::FieldLocation,

    /// The re-drive log topic [default: <source topic>.redrives, for each source topic].
    #[arg(long, value_name = "TOPIC")]
    pub redrive_log: Option<String>,

    /// Give up when a topic makes no progress towards its end for this long.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub end_timeout: Duration,
}

#[derive(Debug, Args)]
pub struct DeadLettersListArgs {
    #[command(flatten)]
    pub filters: DeadLetterFilters,

    /// Only dead letters no re-drive took yet.
    #[arg(long)]
    pub not_redriven: bool,

    /// Print the dead letters as one JSON array on stdout instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct DeadLettersRedriveArgs {
    #[command(flatten)]
    pub filters: DeadLetterFilters,

    /// Who re-drives them (a name the audit trail keeps: eos-redriven-by and the log).
    #[arg(long, env = "EOSCTL_OPERATOR", value_name = "NAME")]
    pub by: String,

    /// Why (the transform fixed, a limit raised, a ticket): eos-redrive-reason and the log.
    #[arg(long, value_name = "TEXT")]
    pub why: String,

    /// The re-drive's id [default: rd-UTCTIME-RANDOM]: give the id of an earlier run to
    /// repeat it, which the processor then takes as a duplicate wherever it was judged.
    #[arg(long, value_name = "ID")]
    pub redrive_id: Option<String>,

    /// Show what would be re-driven, and write nothing.
    #[arg(long)]
    pub dry_run: bool,

    /// Print the result as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

/// `--since`/`--until`: an RFC 3339 time, or a duration meaning that long before now.
fn parse_time_bound(text: &str) -> Result<OffsetDateTime, String> {
    if let Ok(at) = OffsetDateTime::parse(text, &Rfc3339) {
        return Ok(at);
    }
    let ago = humantime::parse_duration(text)
        .map_err(|_| format!("{text:?} is neither an RFC 3339 time nor a duration such as 2h"))?;
    let ago = time::Duration::try_from(ago).map_err(|e| e.to_string())?;
    OffsetDateTime::now_utc()
        .checked_sub(ago)
        .ok_or_else(|| format!("{text} ago is before any time"))
}

#[derive(Debug, Subcommand)]
pub enum HeldCommand {
    /// Show the held events (unresolved ones; --all for every row), oldest first
    List(HeldListArgs),
    /// Settle a held operation at dedup-service with the operator's outcome and evidence, then
    /// mark its held rows resolved
    Resolve(HeldResolveArgs),
}

#[derive(Debug, Args)]
pub struct HeldListArgs {
    #[command(flatten)]
    pub database: eos_runtime::secrets::DatabaseUrlFlags,

    /// Resolved rows too.
    #[arg(long)]
    pub all: bool,

    /// Print the rows as one JSON array on stdout instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct HeldResolveArgs {
    /// The held operation id (`<target>:<event_id>`, the operation_id column of `held list`).
    #[arg(value_name = "OPERATION_ID")]
    pub operation_id: String,

    /// What the provider did: succeeded (it applied the charge) or failed (it did not; final,
    /// the event is not charged later).
    #[arg(long, value_enum)]
    pub outcome: crate::held::HeldOutcome,

    /// What shows the outcome (a provider record, a ticket); kept in the intent's history.
    #[arg(long, value_name = "TEXT")]
    pub evidence: String,

    #[command(flatten)]
    pub database: eos_runtime::secrets::DatabaseUrlFlags,

    /// dedup-service's gRPC endpoint (https:// needs --dedup-tls-ca).
    // Hidden from --help, as every URL that can carry user:password@ is.
    #[arg(
        long,
        env = "EOS_DEDUP_URL",
        hide_env_values = true,
        default_value = "http://127.0.0.1:50051"
    )]
    pub dedup_url: String,

    /// A file holding one of dedup-service's operator tokens (its --operator-token-file):
    /// Resolve needs the operator role.
    #[arg(long, env = "EOS_DEDUP_OPERATOR_TOKEN_FILE", value_name = "PATH")]
    pub operator_token_file: Option<PathBuf>,

    /// dedup-service's TLS: the same flags as sink-writer's (a CA, and a client certificate
    /// when dedup-service asks for mTLS).
    #[command(flatten)]
    pub dedup_tls: dedup_client::DedupTlsFlags,

    /// Print the result as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

const TRACE_EXIT_STATUS: &str = "\
Exit status:
  0  at least one trace carries the event id (printed)
  1  no trace carries the event id, even after --wait
  2  operational error: bad arguments, Jaeger not reachable or answering with an error";

#[derive(Debug, Args)]
pub struct TraceArgs {
    /// The event id whose trace to show (the envelope's event_id, e.g. evt-42-0).
    #[arg(value_name = "EVENT_ID")]
    pub event_id: String,

    /// Base URL of Jaeger's query API (its HTTP port; `deploy/local/stack up` starts one).
    // Hidden from --help: a Jaeger behind basic authentication takes user:password@.
    #[arg(
        long,
        env = "EOS_JAEGER_URL",
        hide_env_values = true,
        default_value = "http://127.0.0.1:16686"
    )]
    pub jaeger_url: String,

    /// Look again every 500 ms, for up to this long, until a trace carries the id and its spans
    /// stopped arriving for a second; 0 looks once.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub wait: Duration,

    /// Search traces that started this long ago at most.
    #[arg(long, default_value = "24h", value_parser = humantime::parse_duration)]
    pub lookback: Duration,

    /// Print the traces as one JSON object on stdout (a tree of spans per trace) instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct LagArgs {
    /// The consumer group.
    #[arg(long)]
    pub group: String,

    /// The topic the group consumes.
    #[arg(long)]
    pub topic: String,

    /// Look again every 250 ms until the total lag is 0 (exit 0), or until --timeout passes
    /// (exit 1, with the last table).
    #[arg(long)]
    pub wait: bool,

    /// How long --wait waits for the group to catch up (e.g. 120s, 5m).
    #[arg(long, default_value = "120s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,

    /// Print the result as one JSON object on stdout instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ProduceArgs {
    /// Topic to write to; created with --partitions if it does not exist.
    #[arg(long)]
    pub topic: String,

    /// Distinct valid logical events to write. Duplicates, malformed records and conflicts are
    /// written on top, each as a ratio of COUNT.
    #[arg(long)]
    pub count: u64,

    /// Number of entities (`ent-0` ... `ent-<N-1>`) the events are spread over; the record key.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..))]
    pub entities: u32,

    /// Exact re-deliveries (same key, value and headers as an earlier record), as a ratio of COUNT.
    #[arg(long, default_value_t = 0.0, value_parser = parse_ratio)]
    pub duplicate_ratio: f64,

    /// Malformed records (truncated JSON, missing event_id, missing value, wrong type, oversized
    /// id, non-UTF-8, JSON array, empty value, in rotation), as a ratio of COUNT.
    #[arg(long, default_value_t = 0.0, value_parser = parse_ratio)]
    pub bad_ratio: f64,

    /// Reused event ids with a different value (same entity, so after the original in the same
    /// partition), as a ratio of COUNT.
    #[arg(long, default_value_t = 0.0, value_parser = parse_ratio)]
    pub conflict_ratio: f64,

    /// Approximate size of each record value in bytes; the payload is padded up to it.
    #[arg(long, default_value_t = 200)]
    pub value_bytes: usize,

    /// Records per second; 0 for as fast as the broker acknowledges.
    #[arg(long, default_value_t = 0)]
    pub rate: u64,

    /// Seed of the workload: the same seed and --occurred-at-base write byte-identical records in
    /// the same order. Event ids are `evt-<seed>-<n>`. Random (and printed) when not given.
    #[arg(long)]
    pub seed: Option<u64>,

    /// occurred_at of event n is this RFC 3339 time plus n milliseconds. Default: now.
    #[arg(long, value_parser = parse_rfc3339)]
    pub occurred_at_base: Option<OffsetDateTime>,

    /// Partitions of the topic when this command creates it.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(i32).range(1..))]
    pub partitions: i32,

    /// Replication factor of the topic when this command creates it; -1 for the broker's default.
    #[arg(long, default_value_t = -1, allow_negative_numbers = true)]
    pub replication_factor: i32,

    /// How long a record may wait for its acknowledgement before the run fails (e.g. 60s, 5m).
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    pub delivery_timeout: Duration,

    /// Print the summary as one JSON object on stdout instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct AuditArgs {
    /// The topic the pipeline consumed.
    #[arg(long)]
    pub input: String,

    /// The topic the pipeline wrote its results to (a missing topic reads as empty).
    #[arg(long)]
    pub output: String,

    /// The dead-letter topic. Default: <input>.dlq (a missing topic reads as empty).
    #[arg(long)]
    pub dlq: Option<String>,

    /// The processor's dedup horizon: events older than this (by occurred_at, else the record
    /// timestamp) may be dead-lettered as beyond_dedup_horizon instead of processed (e.g. 7d, 12h).
    #[arg(long, default_value = "7d", value_parser = humantime::parse_duration)]
    pub dedup_horizon: Duration,

    /// The processor's record size limit: larger input records count as malformed
    /// (oversized_record).
    #[arg(long, default_value_t = DEFAULT_MAX_RECORD_BYTES)]
    pub max_record_bytes: usize,

    /// Give up when a partition makes no progress towards its end for this long (an open
    /// transaction holds read_committed readers back).
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub end_timeout: Duration,

    /// Print the report as one JSON object on stdout instead of tables.
    #[arg(long)]
    pub json: bool,

    /// Also audit the sink-writer's PostgreSQL targets in this database
    /// (postgres://user:password@host:port/database). DATABASE_URL is not read: without this flag
    /// the audit is topic-only. Only rows of this pipeline are read: sink-table rows whose
    /// source_topic is --output or whose event_id is one of the output's, and state rows of an
    /// entity the output versions or written from one of its events. Checks: one row per output
    /// event (missing_row, duplicated_row), none for another event_id (unexpected_row), each
    /// with the output event's value and fingerprint (row_mismatch), and the sum of values; per
    /// entity, the stored version is the highest the output carries (stale_state when lower or
    /// absent, state_ahead when higher, row_mismatch when it comes from another event).
    #[arg(long, value_name = "URL", help_heading = "PostgreSQL targets")]
    pub database_url: Option<String>,

    /// The sink-writer's append table (one row per event_id; columns event_id, value,
    /// fingerprint, source_topic), optionally schema-qualified. A missing table is exit status 2.
    #[arg(
        long,
        value_name = "TABLE",
        default_value = "event_sink",
        requires = "database_url",
        help_heading = "PostgreSQL targets"
    )]
    pub sink_table: String,

    /// The sink-writer's versioned table (one row per entity; columns entity_id, version,
    /// event_id), optionally schema-qualified. A missing table is exit status 2.
    #[arg(
        long,
        value_name = "TABLE",
        default_value = "entity_state",
        requires = "database_url",
        help_heading = "PostgreSQL targets"
    )]
    pub state_table: String,

    /// Also audit the effects of the provider at this base URL (provider-sim; reads GET
    /// /effects). Checks: exactly one effect per output event (missing_effect; a second effect for
    /// one event, as when the provider forgot its idempotency key, is duplicated_effect), none for
    /// an event_id not in the output (unexpected_effect), each with the event's value as its
    /// amount (effect_mismatch), and the sum of amounts. Also reports the attempts beyond the
    /// first: retries the idempotency key absorbed. With --database-url, events the sink
    /// dead-lettered as not charged (provider_rejected, beyond_dedup_horizon in
    /// sink_dead_letters) must have no effect instead (refused_but_applied).
    #[arg(long, value_name = "URL", help_heading = "Provider effects")]
    pub provider_url: Option<String>,

    /// Effects of this pipeline are those whose idempotency key starts with this prefix; the
    /// rest of the key is the event_id (the sink's operation id is `<name>:<event_id>`). Effects
    /// with other keys are not audited.
    #[arg(
        long,
        value_name = "PREFIX",
        default_value = "payments:",
        requires = "provider_url",
        help_heading = "Provider effects"
    )]
    pub provider_operation_prefix: String,

    /// Also audit the outbox boundary, in this database (the one holding the domain rows and
    /// the outbox): every committed domain row has exactly one event on --input
    /// (domain_row_without_event, event_published_twice), and no event there lacks a committed
    /// row (event_without_domain_row).
    #[arg(long, value_name = "URL", help_heading = "Outbox")]
    pub outbox_database_url: Option<String>,

    /// SQL returning the event_id (one text column) of every committed domain row.
    #[arg(
        long,
        value_name = "SQL",
        default_value = "SELECT payment_id FROM payments_api_payments",
        requires = "outbox_database_url",
        help_heading = "Outbox"
    )]
    pub outbox_domain_query: String,

    /// Prove the outputs instead of counting ids: run --transform again over the input, with
    /// the processor's own dedup and state code, and compare every committed output (as
    /// canonical JSON) and dead letter (its reason and the transform's code,
    /// eos-dlq-transform-reason) with what it computes (docs/TRANSFORMS.md "Prove it: the
    /// replay audit"). Give it the processor's own flags for the transform, the event's parts
    /// and the outputs, so that it replays what the run ran. Reads the topics only. Exit
    /// status 1 when any output or dead letter differs.
    #[arg(
        long,
        conflicts_with_all = ["database_url", "provider_url", "outbox_database_url"],
        help_heading = "Replay proof"
    )]
    pub replay: bool,

    /// The processor's --transform: ledger, pass-through, or wasm:PATH, the WebAssembly module
    /// the run ran (an eosctl built with its `wasm` feature), loaded by the processor's host
    /// under the limits of --wasm-fuel, --wasm-max-memory and --wasm-timeout.
    #[arg(
        long,
        default_value = "ledger",
        value_parser = parse_replay_transform,
        requires = "replay",
        help_heading = "Replay proof"
    )]
    pub transform: ReplayTransform,

    /// wasm: the processor's --wasm-fuel.
    #[arg(long, default_value = "200000000", help_heading = "Replay proof")]
    pub wasm_fuel: u64,

    /// wasm: the processor's --wasm-max-memory (bytes, or with a KiB, MiB or GiB suffix).
    #[arg(long, default_value = "256MiB", value_parser = parse_bytes, help_heading = "Replay proof")]
    pub wasm_max_memory: u64,

    /// wasm: the processor's --wasm-timeout.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration, help_heading = "Replay proof")]
    pub wasm_timeout: Duration,

    /// Where the event id is, as the processor was told (`header:<name>`, `key` or a JSON
    /// pointer; default: the transform's).
    #[arg(
        long,
        value_name = "LOCATION",
        requires = "replay",
        help_heading = "Replay proof"
    )]
    pub event_id: Option<eos_core::FieldLocation>,

    /// Where the entity is, as the processor was told (default: the transform's).
    #[arg(
        long,
        value_name = "LOCATION",
        requires = "replay",
        help_heading = "Replay proof"
    )]
    pub entity: Option<eos_core::FieldLocation>,

    /// JSON pointer to the event time, as the processor was told (default: the transform's).
    #[arg(
        long,
        value_name = "POINTER",
        requires = "replay",
        help_heading = "Replay proof"
    )]
    pub occurred_at: Option<String>,

    /// A further output of the processor, as NAME=TOPIC (its --output); --output is the default
    /// output's topic.
    #[arg(
        long = "named-output",
        value_name = "NAME=TOPIC",
        value_parser = eos_transform::transform::parse_named_output,
        requires = "replay",
        help_heading = "Replay proof"
    )]
    pub named_outputs: Vec<(String, String)>,

    /// The processor's --input-format: json, or avro, protobuf or json-schema through the schema
    /// registry (--schema-registry-url). The input and its dead letters are decoded as the
    /// processor decoded them before they are counted (or replayed); a record that does not
    /// decode is expected as an undecodable_record dead letter.
    #[arg(long, value_enum, default_value_t = RecordFormat::Json, help_heading = "Record formats")]
    pub input_format: RecordFormat,

    /// The processor's --output-format: the outputs are decoded into JSON before they are
    /// counted or compared.
    #[arg(long, value_enum, default_value_t = RecordFormat::Json, help_heading = "Record formats")]
    pub output_format: RecordFormat,

    /// The schema registry the run's formats are read through.
    #[command(flatten, next_help_heading = "Record formats")]
    pub registry: RegistryFlags,

    /// pass-through: the processor's --filter-pointer.
    #[arg(long, requires = "filter_equals", help_heading = "Replay proof")]
    pub filter_pointer: Option<String>,

    /// pass-through: the processor's --filter-equals.
    #[arg(long, requires = "filter_pointer", help_heading = "Replay proof")]
    pub filter_equals: Option<String>,
}

/// What `audit --replay --transform` names, as the processor's `--transform` does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplayTransform {
    /// `ledger` or `pass-through`.
    Builtin(eos_transform::BuiltinTransform),
    /// `wasm:PATH`.
    Wasm(PathBuf),
}

/// `--transform`: a built-in's name, or `wasm:` and the path of a module file. An eosctl built
/// without its `wasm` feature has no WebAssembly host: `wasm:` is then a usage error that says
/// how to build one that has.
fn parse_replay_transform(text: &str) -> Result<ReplayTransform, String> {
    if let Some(path) = text.strip_prefix("wasm:") {
        if !cfg!(feature = "wasm") {
            return Err(
                "this eosctl was built without its `wasm` feature, so it cannot load a \
                        WebAssembly module: build it with `cargo build -p eosctl --features wasm`"
                    .into(),
            );
        }
        let path = PathBuf::from(path);
        if !path.is_file() {
            return Err(format!(
                "{} is not a file: wasm:PATH names a WebAssembly module",
                path.display()
            ));
        }
        return Ok(ReplayTransform::Wasm(path));
    }
    <eos_transform::BuiltinTransform as clap::ValueEnum>::from_str(text, false)
        .map(ReplayTransform::Builtin)
        .map_err(|_| format!("{text:?} is not ledger, pass-through or wasm:PATH"))
}

/// A size in bytes, optionally with a KiB, MiB or GiB suffix, as the processor's
/// `--wasm-max-memory` takes it.
fn parse_bytes(text: &str) -> Result<u64, String> {
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

fn parse_ratio(text: &str) -> Result<f64, String> {
    let ratio: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a number"))?;
    if (0.0..=1.0).contains(&ratio) {
        Ok(ratio)
    } else {
        Err(format!("{text} is outside 0..=1"))
    }
}

fn parse_rfc3339(text: &str) -> Result<OffsetDateTime, String> {
    OffsetDateTime::parse(text, &Rfc3339)
        .map_err(|e| format!("{text:?} is not an RFC 3339 time (e.g. 2026-01-02T03:04:05Z): {e}"))
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn cli_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn held_resolve_takes_the_sinks_dedup_tls_flags_for_mtls() -> anyhow::Result<()> {
        let resolve = [
            "eosctl",
            "held",
            "resolve",
            "payments:e-1",
            "--outcome",
            "failed",
            "--evidence",
            "ticket 7",
            "--database-url",
            "postgres://127.0.0.1/eos",
            "--dedup-url",
            "https://dedup:50051",
            "--dedup-tls-ca",
            "/ca.pem",
            "--dedup-tls-cert",
            "/client.pem",
            "--dedup-tls-key",
            "/client.key",
            "--dedup-tls-domain",
            "dedup.internal",
        ];
        let Command::Held(HeldCommand::Resolve(args)) = Cli::try_parse_from(resolve)?.command
        else {
            anyhow::bail!("not held resolve");
        };
        let files = args.dedup_tls.files();
        assert_eq!(files.ca, Some(PathBuf::from("/ca.pem")));
        assert_eq!(files.cert, Some(PathBuf::from("/client.pem")));
        assert_eq!(files.key, Some(PathBuf::from("/client.key")));
        assert_eq!(files.domain.as_deref(), Some("dedup.internal"));
        // A certificate without its key (or the reverse) is refused, as by sink-writer.
        assert!(Cli::try_parse_from(&resolve[..resolve.len() - 4]).is_err());
        Ok(())
    }

    #[test]
    fn ratios_outside_zero_to_one_are_refused() {
        assert_eq!(parse_ratio("0.25"), Ok(0.25));
        assert_eq!(parse_ratio("1"), Ok(1.0));
        assert!(parse_ratio("1.5").is_err());
        assert!(parse_ratio("-0.1").is_err());
        assert!(parse_ratio("NaN").is_err());
        assert!(parse_ratio("lots").is_err());
        let parsed = Cli::try_parse_from([
            "eosctl",
            "produce",
            "--topic",
            "t",
            "--count",
            "10",
            "--bad-ratio",
            "2",
        ]);
        assert!(parsed.is_err());
    }

    #[test]
    fn kafka_properties_are_eos_runtime_s_shared_flags_before_or_after_the_command()
    -> anyhow::Result<()> {
        let expected = [
            ("security.protocol".to_owned(), "SSL".to_owned()),
            ("ssl.ca.location".to_owned(), "/ca.pem".to_owned()),
        ];
        let lag = ["lag", "--group", "g", "--topic", "t"];
        let kafka = [
            "-X",
            "security.protocol=SSL",
            "--kafka-property",
            "ssl.ca.location=/ca.pem",
            "--bootstrap-servers",
            "broker:9093",
        ];
        let before = std::iter::once("eosctl").chain(kafka).chain(lag);
        let after = std::iter::once("eosctl").chain(lag).chain(kafka);
        for argv in [before.collect::<Vec<_>>(), after.collect()] {
            let settings = Cli::try_parse_from(&argv)?.global.kafka.settings(&[])?;
            assert_eq!(settings.bootstrap_servers, "broker:9093", "{argv:?}");
            assert_eq!(settings.properties, expected, "{argv:?}");
        }
        let cli = Cli::try_parse_from([
            "eosctl",
            "-X",
            "enable.idempotence=false",
            "lag",
            "--group",
            "g",
            "--topic",
            "t",
        ])?;
        assert!(cli.global.kafka.settings(&[]).is_err(), "refused");
        let help = Cli::command().render_long_help().to_string();
        assert!(help.contains("--kafka-properties-file"), "{help}");
        Ok(())
    }

    #[test]
    fn lag_defaults() -> Result<(), clap::Error> {
        let cli = Cli::try_parse_from(["eosctl", "lag", "--group", "g", "--topic", "t"])?;
        let Command::Lag(args) = cli.command else {
            panic!("parsed as another command");
        };
        assert!(!args.wait);
        assert_eq!(args.timeout, Duration::from_secs(120));
        Ok(())
    }

    #[test]
    fn audit_defaults() -> Result<(), clap::Error> {
        let cli = Cli::try_parse_from(["eosctl", "audit", "--input", "in", "--output", "out"])?;
        let Command::Audit(args) = cli.command else {
            panic!("parsed as another command");
        };
        assert_eq!(args.dedup_horizon, Duration::from_secs(7 * 24 * 3600));
        assert_eq!(args.dlq, None);
        assert_eq!(args.max_record_bytes, DEFAULT_MAX_RECORD_BYTES);
        assert_eq!(args.database_url, None);
        assert_eq!(args.sink_table, "event_sink");
        assert_eq!(args.state_table, "entity_state");
        assert_eq!(args.provider_url, None);
        assert_eq!(args.provider_operation_prefix, "payments:");
        assert_eq!(
            args.transform,
            ReplayTransform::Builtin(eos_transform::BuiltinTransform::Ledger)
        );
        Ok(())
    }

    /// The replay runs a module under the processor's limits: the same defaults.
    #[cfg(feature = "wasm")]
    #[test]
    fn the_replay_s_module_limits_default_to_the_processor_s() -> Result<(), clap::Error> {
        let cli = Cli::try_parse_from(["eosctl", "audit", "--input", "in", "--output", "out"])?;
        let Command::Audit(args) = cli.command else {
            panic!("parsed as another command");
        };
        let limits = eos_transform::wasm::Limits::default();
        assert_eq!(
            (args.wasm_fuel, args.wasm_max_memory, args.wasm_timeout),
            (limits.fuel, limits.max_memory_bytes, limits.timeout)
        );
        Ok(())
    }

    #[test]
    fn the_replay_takes_a_builtin_or_a_module() {
        assert_eq!(
            parse_replay_transform("pass-through"),
            Ok(ReplayTransform::Builtin(
                eos_transform::BuiltinTransform::PassThrough
            ))
        );
        assert!(parse_replay_transform("lua").is_err());
        let missing = parse_replay_transform("wasm:/no/such/module.wasm");
        if cfg!(feature = "wasm") {
            assert!(missing.expect_err("no file").contains("is not a file"));
        } else {
            assert!(missing.expect_err("no host").contains("--features wasm"));
        }
        assert_eq!(parse_bytes("256MiB"), Ok(256 << 20));
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert!(parse_bytes("1TB").is_err());
    }

    #[test]
    fn audit_boundary_options_need_their_boundary() {
        let audit = |extra: &[&str]| {
            let mut args = vec!["eosctl", "audit", "--input", "in", "--output", "out"];
            args.extend_from_slice(extra);
            Cli::try_parse_from(args)
        };
        assert!(audit(&["--sink-table", "rows"]).is_err());
        assert!(audit(&["--provider-operation-prefix", "refunds:"]).is_err());
        assert!(audit(&["--outbox-domain-query", "SELECT 1"]).is_err());
        assert!(audit(&["--database-url", "postgres://h/db", "--state-table", "s"]).is_ok());
        assert!(
            audit(&[
                "--provider-url",
                "http://h",
                "--provider-operation-prefix",
                "r:"
            ])
            .is_ok()
        );
    }
}
