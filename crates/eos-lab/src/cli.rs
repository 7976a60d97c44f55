//! The command line: every flag, its environment fallback and its help text.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use eosctl::cli::{GlobalFlags, global_option};

const EXIT_STATUS: &str = "\
Exit status:
  0  success (for demo: the audit found every event's effect exactly once)
  1  demo: the audit found a violation
  2  operational error: bad arguments, Kafka or PostgreSQL unreachable, a service binary missing
     or failing, a benchmark run that stalled";

#[derive(Debug, Parser)]
#[command(
    name = "eos-lab",
    version,
    about = "Run the whole pipeline under faults (demo) and benchmark the services (bench), with \
             the real binaries against the real broker and PostgreSQL",
    after_help = EXIT_STATUS,
    mut_arg("bootstrap_servers", global_option),
    mut_arg("kafka_properties", global_option),
    mut_arg("kafka_properties_list", global_option),
    mut_arg("kafka_properties_file", global_option)
)]
pub struct Cli {
    // --bootstrap-servers and the librdkafka property passthrough, as eosctl takes them; the
    // services the lab starts get the same settings.
    #[command(flatten)]
    pub global: GlobalFlags,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Measure a service against the real broker and print the figures (a benchmark, not a test)
    #[command(after_help = EXIT_STATUS)]
    Bench(BenchArgs),
    /// Run the whole pipeline under faults and print one report, boundary by boundary
    ///
    /// Starts provider-sim, dedup-service, eos-processor and sink-writer (the binaries next to
    /// this eos-lab, or --bin-dir) against the running Kafka and PostgreSQL, produces a workload
    /// with re-deliveries, malformed records and reused ids, SIGKILLs the processor and the sink
    /// while it is written (restarting them at once), lets provider-sim lose answers after
    /// applying charges, waits for the pipeline to drain, stops every service with SIGTERM, and
    /// runs `eosctl audit` over the topics, the PostgreSQL tables and the provider's effects.
    /// With --guarantee at-least-once the processor runs without transactions under the same
    /// faults, and the report shows the duplicates the audit catches.
    #[command(after_help = EXIT_STATUS)]
    Demo(crate::commands::demo::DemoArgs),
}

#[derive(Debug, Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub target: BenchTarget,
}

#[derive(Debug, Subcommand)]
pub enum BenchTarget {
    /// Throughput (exactly-once vs at-least-once), single-record transactions/s and end-to-end
    /// latency of the real eos-processor binary
    ///
    /// Runs eos-processor as a child process against topics it creates with fresh names (and
    /// deletes at the end unless --keep-topics). Throughput: for each of --sizes, writes
    /// --records records once, then runs --rounds rounds of each guarantee interleaved (EO, ALO,
    /// EO, ALO, ...), each a fresh processor with a fresh group reading that input from the
    /// beginning; a round's rate runs from the group's first commit to the commit that reaches the
    /// end of the input (read_committed offsets sampled every 50 ms), so start-up is not counted.
    /// Each round's outputs are read back: one per input record and no dead letter, or the
    /// benchmark fails. Prints the median rate of each guarantee and their ratio, and with
    /// --format avro,protobuf the exactly-once rate of each format beside JSON's. Then: exactly-once with
    /// --max-batch 1 over a backlog of --single-records (transactions per second), beside the
    /// same backlog copied one record per transaction with nothing else in it (the floor), and the
    /// end-to-end latency (input record timestamp to arrival at a read_committed reader of the
    /// output) while producing at half the exactly-once median rate of the first size for
    /// --latency-seconds; a run in which the pipeline falls behind (its latency is then a queue's)
    /// is repeated at half the rate, up to twice. Last, --kill-resume-kills times under a steady
    /// --kill-resume-rate: SIGKILL of the processor and an immediate restart under the same
    /// instance id, timed from the kill to the new process's first committed output (median and
    /// worst). Use a release build of eos-processor; a debug build is warned about.
    #[command(after_help = EXIT_STATUS)]
    Processor(ProcessorBenchArgs),
    /// sink-writer's idempotent write with its checkpoint against a raw COPY, a duplicate
    /// replay, and a topic -> table run of the real service
    ///
    /// Against a scratch PostgreSQL database (event_sink and bench_raw are truncated): each
    /// round runs both write paths (copy-fresh is the sink's, unnest for contrast)
    /// on an empty table, the order rotating; each ratio is taken within its round, then the
    /// median and the spread over the rounds. docs/BENCHMARKS.md explains each ratio.
    #[command(after_help = EXIT_STATUS)]
    Sink(SinkBenchArgs),
    /// outbox-relay's throughput against a plain idempotent producer, and its commit-to-visible
    /// latency at half its peak
    ///
    /// Against a scratch PostgreSQL database (the outbox tables are emptied) and the broker, in
    /// interleaved rounds (plain, relay, plain, ...).
    #[command(after_help = EXIT_STATUS)]
    Relay(RelayBenchArgs),
    /// dedup-service's Begin+Complete pairs/s through gRPC against the same SQL straight to its
    /// database, at 1, 16 and 64 clients, single and batched, and the latency at half the peak
    /// (through the service, then straight to SQL at the same pace)
    ///
    /// Needs a running dedup-service that takes calls without a client token (e.g. on
    /// loopback) and its database. Intents it creates are named bench-*.
    #[command(after_help = EXIT_STATUS)]
    Dedup(DedupBenchArgs),
    /// eos-processor's state on disk: restore time (cold, warm), resident memory and the state
    /// path's throughput with N event ids in state against an empty store
    ///
    /// Produces a changelog of --ids distinct event ids to a topic it creates (and deletes),
    /// restores it with the processor's own code, in this process, and measures the state path
    /// in interleaved rounds. docs/BENCHMARKS-state.md explains the figures.
    #[command(after_help = EXIT_STATUS)]
    State(StateBenchArgs),
    /// The whole chain: this eos-lab's producer -> eos-processor -> sink-writer -> PostgreSQL,
    /// and sink-writer -> dedup-service -> provider-sim for each event's charge
    ///
    /// Runs the four services as child processes of the binaries next to this eos-lab, on the
    /// broker and on a database it creates for the run (dropped at the end unless --keep), with
    /// no faults. Throughput: --rounds rounds of two chains interleaved, the tables alone and the
    /// tables with the provider charge, each a fresh processor and sink on fresh topics; a round
    /// writes --records events as fast as the broker takes them and is timed from the first send
    /// to the moment the last event's row is committed in PostgreSQL. Latency: the charged chain
    /// at half its median rate for --latency-seconds; each event from its input record's Kafka
    /// timestamp to the commit of the sink transaction that wrote it (the sink's checkpoint,
    /// polled every 20 ms).
    #[command(after_help = EXIT_STATUS)]
    Pipeline(PipelineBenchArgs),
}

#[derive(Debug, Args)]
pub struct SinkBenchArgs {
    #[command(flatten)]
    pub bench: crate::bench::sink::BenchArgs,
    /// Print the figures as one JSON object on stdout instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct RelayBenchArgs {
    #[command(flatten)]
    pub bench: crate::bench::relay::BenchArgs,
    /// Print the figures as one JSON object on stdout instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct DedupBenchArgs {
    #[command(flatten)]
    pub bench: crate::bench::dedup::BenchArgs,
    /// Print the figures as one JSON object on stdout instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct StateBenchArgs {
    #[command(flatten)]
    pub bench: crate::bench::state::BenchArgs,
    /// Print the figures as one JSON object on stdout instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, Args)]
pub struct PipelineBenchArgs {
    /// Events each throughput round writes (distinct, valid: one row and one charge each).
    #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub records: u64,

    /// Rounds of each chain (tables alone, tables and charge), interleaved; the median is
    /// reported.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    pub rounds: u32,

    /// Approximate size of each input record's value in bytes.
    #[arg(long, default_value_t = 200)]
    pub value_bytes: usize,

    /// Partitions of the input and output topics.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(i32).range(1..))]
    pub partitions: i32,

    /// The processor's --commit-interval (e.g. 100ms).
    #[arg(long, default_value = "100ms", value_parser = humantime::parse_duration)]
    pub commit_interval: Duration,

    /// How long the latency run produces; 0 skips it.
    #[arg(long, default_value_t = 20)]
    pub latency_seconds: u64,

    /// Events per second of the latency run, run once [default: half the charged chain's
    /// median rate, halved again while the chain falls behind].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub latency_rate: Option<u64>,

    /// The charged chain's provider target `concurrency`: charges in a round at once, and the
    /// items of each `BeginBatch` [default: sink-writer's].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub provider_concurrency: Option<u64>,

    /// PostgreSQL server (and a database on it the role can connect to); the benchmark creates
    /// its own database there.
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

    /// A round fails when no row is committed for this long.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    pub stall_timeout: Duration,

    /// Keep the run's database, topics and service logs (they are kept when the benchmark
    /// fails).
    #[arg(long)]
    pub keep: bool,

    /// Print the figures as one JSON object on stdout instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ProcessorBenchArgs {
    /// Records in each throughput input (every round of one size reads the same input).
    #[arg(long, default_value_t = 200_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub records: u64,

    /// Record value sizes in bytes to measure throughput at, comma-separated, in order. The
    /// single-record and latency runs use the first. (The smallest envelope the workload writes
    /// is about 160 bytes; the report shows the real mean size.)
    #[arg(
        long,
        visible_alias = "value-bytes",
        value_name = "BYTES",
        value_delimiter = ',',
        num_args = 1..,
        default_values_t = [1024_usize, 100]
    )]
    pub sizes: Vec<usize>,

    /// Rounds of each guarantee per size; the median is reported. 0 skips the throughput runs
    /// (the latency run then needs --latency-rate).
    #[arg(long, default_value_t = 3)]
    pub rounds: u32,

    /// The processor's --commit-interval (e.g. 100ms).
    #[arg(long, default_value = "100ms", value_parser = humantime::parse_duration)]
    pub commit_interval: Duration,

    /// The processor's --max-batch in the throughput and latency runs.
    #[arg(long, default_value_t = 5000, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_batch: u32,

    /// Partitions of every topic the benchmark creates.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(i32).range(1..))]
    pub partitions: i32,

    /// eos-processor instances in each throughput round, one process each in the same group
    /// (each its own instance id, transactional id and state store), as a deployment scales out.
    /// The rate is the group's; the CPU figure is all of them together. Give at least as many
    /// --partitions, a multiple for an even share. The other runs use one instance.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=16))]
    pub instances: u32,

    /// Backlog of the single-record transactions run (exactly-once, --max-batch 1) and of its
    /// floor, a copy one record per transaction; 0 skips both.
    #[arg(long, default_value_t = 2000)]
    pub single_records: u64,

    /// How long the latency run produces at half the exactly-once peak rate; 0 skips it.
    #[arg(long, default_value_t = 10)]
    pub latency_seconds: u64,

    /// Records per second of the latency run, run once [default: half the exactly-once median
    /// rate of the first size, halved again while the pipeline falls behind].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub latency_rate: Option<u64>,

    /// SIGKILLs of the kill-to-resume run: under a steady load, the processor is killed and
    /// started again at once under the same instance id, and the time from the kill to the new
    /// process's first committed output is taken; 0 skips it.
    #[arg(long, default_value_t = 10)]
    pub kill_resume_kills: u32,

    /// Records per second produced during the kill-to-resume run.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u64).range(1..))]
    pub kill_resume_rate: u64,

    /// The eos-processor binary [default: the eos-processor next to this eos-lab]; any binary
    /// built on the processor library takes its flags (e.g. the card-authorisations example).
    #[arg(long, value_name = "PATH")]
    pub processor_bin: Option<PathBuf>,

    /// The events written: `ledger` (the demo's envelopes) or `card-authorisations` (the
    /// example of docs/TRANSFORMS.md, for its native and WebAssembly transforms; throughput
    /// rounds only: give --single-records 0 --latency-seconds 0 --kill-resume-kills 0).
    #[arg(long, value_enum, default_value = "ledger")]
    pub workload: BenchWorkload,

    /// Passed to the processor as its --transform, e.g. `wasm:target/wasm/card.wasm` [default:
    /// the binary's own].
    #[arg(long, value_name = "TRANSFORM")]
    pub transform: Option<String>,

    /// Record formats to measure exactly-once throughput in, comma-separated: json, avro,
    /// protobuf. JSON's rounds always run (EO, ALO, pass-through: the baseline); each other
    /// format adds an exactly-once round to every round, interleaved, over its own input of the
    /// same events in the schema registry's wire format, the processor started with
    /// --input-format and --output-format set to it. The benchmark registers the input and
    /// output schemas under each topic's subject (TOPIC-value) and deletes them at the end.
    /// Prints records/s and CPU per 1,000 records of each format beside JSON's. The other runs
    /// stay JSON; ledger workload only.
    #[arg(
        long = "format",
        value_name = "FORMAT",
        value_enum,
        value_delimiter = ',',
        num_args = 1..,
        default_values_t = [crate::bench::record_format::RecordFormat::Json]
    )]
    pub formats: Vec<crate::bench::record_format::RecordFormat>,

    /// The schema registry a --format other than json registers its schemas in and the
    /// processor reads them from (Confluent's API or a compatible one, e.g. Apicurio's
    /// /apis/ccompat/v7).
    #[arg(
        long,
        env = "EOS_SCHEMA_REGISTRY_URL",
        value_name = "URL",
        hide_env_values = true
    )]
    pub schema_registry_url: Option<String>,

    /// A run fails when the group's committed offsets (or the latency run's outputs) do not
    /// move for this long.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    pub stall_timeout: Duration,

    /// Keep the topics and consumer groups the benchmark created.
    #[arg(long)]
    pub keep_topics: bool,

    /// Keep the processors' log files (they are always kept when the benchmark fails).
    #[arg(long)]
    pub keep_logs: bool,

    /// Also write every latency sample to this CSV file (rate,sent_ms,latency_ms; appended), to
    /// see how the latency moves through a run.
    #[arg(long, value_name = "PATH")]
    pub latency_samples: Option<PathBuf>,

    /// Print the figures as one JSON object on stdout instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// The events a benchmark writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BenchWorkload {
    /// The demo's ledger envelopes, for the built-in ledger transform.
    Ledger,
    /// The card-authorisations example's events, for its transforms (native or WebAssembly).
    CardAuthorisations,
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
    fn bench_processor_defaults_and_sizes() -> Result<(), clap::Error> {
        let cli = Cli::try_parse_from(["eos-lab", "bench", "processor"])?;
        let Command::Bench(BenchArgs {
            target: BenchTarget::Processor(args),
        }) = cli.command
        else {
            panic!("parsed as another command");
        };
        assert_eq!(args.records, 200_000);
        assert_eq!(args.sizes, vec![1024, 100]);
        assert_eq!(args.rounds, 3);
        assert_eq!(args.commit_interval, Duration::from_millis(100));
        assert_eq!(args.max_batch, 5000);
        assert_eq!(args.single_records, 2000);
        assert_eq!(args.kill_resume_kills, 10);
        assert_eq!(args.kill_resume_rate, 500);

        let cli = Cli::try_parse_from(["eos-lab", "bench", "processor", "--value-bytes", "512"])?;
        let Command::Bench(BenchArgs {
            target: BenchTarget::Processor(args),
        }) = cli.command
        else {
            panic!("parsed as another command");
        };
        assert_eq!(args.sizes, vec![512]);
        assert!(
            Cli::try_parse_from(["eos-lab", "bench", "processor", "--latency-rate", "0"]).is_err()
        );
        Ok(())
    }

    #[test]
    fn bench_processor_formats_default_to_json_and_take_a_list() -> Result<(), clap::Error> {
        use crate::bench::record_format::RecordFormat;
        let formats = |args: &[&str]| -> Result<Vec<RecordFormat>, clap::Error> {
            let cli = Cli::try_parse_from(["eos-lab", "bench", "processor"].iter().chain(args))?;
            let Command::Bench(BenchArgs {
                target: BenchTarget::Processor(args),
            }) = cli.command
            else {
                panic!("parsed as another command");
            };
            Ok(args.formats)
        };
        assert_eq!(formats(&[])?, [RecordFormat::Json]);
        assert_eq!(
            formats(&["--format", "json,avro,protobuf"])?,
            [
                RecordFormat::Json,
                RecordFormat::Avro,
                RecordFormat::Protobuf
            ]
        );
        assert_eq!(formats(&["--format", "avro"])?, [RecordFormat::Avro]);
        assert!(formats(&["--format", "xml"]).is_err());
        Ok(())
    }
}
