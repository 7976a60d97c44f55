//! What `eos-lab bench processor` runs, resolved and checked from its command line.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};

use crate::bench::record_format::RecordFormat;
pub use crate::cli::BenchWorkload;
use crate::cli::ProcessorBenchArgs;

/// What to run, resolved from the command line.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    pub processor_bin: PathBuf,
    pub workload: BenchWorkload,
    /// The processor's `--transform`, when given.
    pub transform: Option<String>,
    /// The formats of the exactly-once throughput rounds: JSON first (always), then each other
    /// one asked for, once.
    pub formats: Vec<RecordFormat>,
    /// Where a registry format's schemas go; set whenever `formats` has one.
    pub schema_registry_url: Option<String>,
    pub records: u64,
    pub sizes: Vec<usize>,
    pub rounds: u32,
    pub commit_interval: Duration,
    pub max_batch: u32,
    pub partitions: i32,
    /// Processor instances in each throughput round.
    pub instances: u32,
    pub single_records: u64,
    pub latency_seconds: u64,
    /// Overrides half the exactly-once peak.
    pub latency_rate: Option<u64>,
    /// SIGKILLs of the kill-to-resume run (0 skips it) and its load.
    pub kill_resume_kills: u32,
    pub kill_resume_rate: u64,
    pub stall_timeout: Duration,
    pub keep_topics: bool,
    pub keep_logs: bool,
    /// CSV of every latency sample.
    pub latency_samples: Option<PathBuf>,
}

impl BenchOptions {
    /// The processor defaults to the `eos-processor` next to the running `eos-lab` (the same
    /// cargo profile directory).
    pub fn from_args(args: &ProcessorBenchArgs) -> anyhow::Result<Self> {
        let processor_bin = match &args.processor_bin {
            Some(path) => path.clone(),
            None => std::env::current_exe()
                .context("cannot find the running executable")?
                .with_file_name("eos-processor"),
        };
        if !processor_bin.is_file() {
            bail!(
                "no eos-processor binary at {}: build it (cargo build --release -p eos-processor \
                 --features wasm) or pass --processor-bin",
                processor_bin.display()
            );
        }
        if args.sizes.is_empty() {
            bail!("--sizes needs at least one size");
        }
        let mut distinct = args.sizes.clone();
        distinct.sort_unstable();
        distinct.dedup();
        if distinct.len() != args.sizes.len() {
            bail!("--sizes names a size twice");
        }
        if args.rounds == 0 && args.latency_seconds > 0 && args.latency_rate.is_none() {
            bail!(
                "--rounds 0 measures no exactly-once peak to base the latency run on: give \
                 --latency-rate or --latency-seconds 0"
            );
        }
        if i64::from(args.instances) > i64::from(args.partitions) {
            bail!(
                "--instances {} with --partitions {}: an instance without a partition measures \
                 nothing",
                args.instances,
                args.partitions
            );
        }
        if args.workload == BenchWorkload::CardAuthorisations
            && (args.single_records > 0 || args.latency_seconds > 0 || args.kill_resume_kills > 0)
        {
            bail!(
                "--workload card-authorisations measures throughput only: give \
                 --single-records 0 --latency-seconds 0 --kill-resume-kills 0"
            );
        }
        let formats = formats(args)?;
        Ok(Self {
            processor_bin,
            workload: args.workload,
            transform: args.transform.clone(),
            formats,
            schema_registry_url: args.schema_registry_url.clone(),
            records: args.records,
            sizes: args.sizes.clone(),
            rounds: args.rounds,
            commit_interval: args.commit_interval,
            max_batch: args.max_batch,
            partitions: args.partitions,
            instances: args.instances,
            single_records: args.single_records,
            latency_seconds: args.latency_seconds,
            latency_rate: args.latency_rate,
            kill_resume_kills: args.kill_resume_kills,
            kill_resume_rate: args.kill_resume_rate,
            stall_timeout: args.stall_timeout,
            keep_topics: args.keep_topics,
            keep_logs: args.keep_logs,
            latency_samples: args.latency_samples.clone(),
        })
    }

    /// The formats other than JSON, measured beside it.
    pub fn registry_formats(&self) -> impl Iterator<Item = RecordFormat> + '_ {
        self.formats
            .iter()
            .copied()
            .filter(|&format| format != RecordFormat::Json)
    }

    /// A debug build of the processor measures the compiler's debug mode, not the design.
    pub fn is_debug_build(&self) -> bool {
        self.processor_bin.to_string_lossy().contains(&format!(
            "{}debug{}",
            std::path::MAIN_SEPARATOR,
            std::path::MAIN_SEPARATOR
        ))
    }
}

/// `--format`'s formats, JSON first (the baseline always runs) and each once; a registry format
/// needs the registry, the ledger workload and throughput rounds.
fn formats(args: &ProcessorBenchArgs) -> anyhow::Result<Vec<RecordFormat>> {
    let mut formats = vec![RecordFormat::Json];
    for &format in &args.formats {
        if !formats.contains(&format) {
            formats.push(format);
        }
    }
    let Some(&registry_format) = formats.get(1) else {
        return Ok(formats);
    };
    if args.schema_registry_url.is_none() {
        bail!(
            "--format {registry_format} needs a schema registry: give --schema-registry-url or \
             set EOS_SCHEMA_REGISTRY_URL (`deploy/local/stack env` prints the local stack's)"
        );
    }
    if args.workload != BenchWorkload::Ledger {
        bail!("--format {registry_format} has schemas for the ledger workload only");
    }
    if args.rounds == 0 {
        bail!("--format {registry_format} measures throughput rounds: give --rounds 1 or more");
    }
    Ok(formats)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_builds_are_recognised() {
        let options = |path: &str| BenchOptions {
            processor_bin: PathBuf::from(path),
            workload: BenchWorkload::Ledger,
            transform: None,
            formats: vec![RecordFormat::Json],
            schema_registry_url: None,
            records: 1,
            sizes: vec![100],
            rounds: 1,
            commit_interval: Duration::from_millis(100),
            max_batch: 1,
            partitions: 1,
            instances: 1,
            single_records: 0,
            latency_seconds: 0,
            latency_rate: None,
            kill_resume_kills: 0,
            kill_resume_rate: 1,
            stall_timeout: Duration::from_secs(1),
            keep_topics: false,
            keep_logs: false,
            latency_samples: None,
        };
        assert!(options("/w/target/debug/eos-processor").is_debug_build());
        assert!(!options("/w/target/release/eos-processor").is_debug_build());
    }

    #[test]
    fn more_instances_than_partitions_are_refused() {
        use crate::cli::{BenchArgs, BenchTarget, Cli, Command};
        use clap::Parser as _;
        // Any existing file stands in for the processor binary.
        let bin = std::env::current_exe().expect("the test binary exists");
        let args = |instances: &str, partitions: &str| {
            let cli = Cli::try_parse_from([
                "eos-lab",
                "bench",
                "processor",
                "--processor-bin",
                &bin.display().to_string(),
                "--instances",
                instances,
                "--partitions",
                partitions,
            ])
            .expect("parses");
            let Command::Bench(BenchArgs {
                target: BenchTarget::Processor(args),
            }) = cli.command
            else {
                panic!("parsed as another command");
            };
            args
        };
        let resolved = BenchOptions::from_args(&args("2", "4")).expect("2 instances, 4 partitions");
        assert_eq!(resolved.instances, 2);
        let refused =
            BenchOptions::from_args(&args("4", "3")).expect_err("4 instances, 3 partitions");
        assert!(refused.to_string().contains("--instances 4"), "{refused}");
        assert_eq!(args("1", "1").instances, 1);
    }

    #[test]
    fn formats_put_json_first_once_and_need_the_registry() {
        use crate::cli::{BenchArgs, BenchTarget, Cli, Command};
        use clap::Parser as _;
        let args = |extra: &[&str]| {
            let cli = Cli::try_parse_from(["eos-lab", "bench", "processor"].iter().chain(extra))
                .expect("parses");
            let Command::Bench(BenchArgs {
                target: BenchTarget::Processor(mut args),
            }) = cli.command
            else {
                panic!("parsed as another command");
            };
            // Whatever the environment's EOS_SCHEMA_REGISTRY_URL.
            args.schema_registry_url = extra
                .contains(&"--schema-registry-url")
                .then(|| "http://127.0.0.1:8085".to_owned());
            args
        };
        let registry = ["--schema-registry-url", "x"];
        let with_registry = |list: &str| {
            let mut extra = vec!["--format", list];
            extra.extend(registry);
            formats(&args(&extra))
        };
        use RecordFormat::{Avro, Json, Protobuf};
        assert_eq!(formats(&args(&[])).expect("json"), [Json]);
        assert_eq!(
            with_registry("protobuf,avro,protobuf").expect("valid"),
            [Json, Protobuf, Avro]
        );
        assert_eq!(
            with_registry("json,avro,protobuf").expect("valid"),
            [Json, Avro, Protobuf]
        );
        let refused = formats(&args(&["--format", "avro"])).expect_err("no registry");
        assert!(
            refused.to_string().contains("--schema-registry-url"),
            "{refused}"
        );
        let mut extra = vec!["--format", "avro", "--rounds", "0"];
        extra.extend(registry);
        let refused = formats(&args(&extra)).expect_err("no rounds");
        assert!(refused.to_string().contains("--rounds"), "{refused}");
    }
}
