//! The processor's state benchmark against a real broker (docs/BENCHMARKS-state.md):
//!
//!     cargo run --release -p eos-processor --example state_bench -- --ids 10000000 [--json]

use std::path::PathBuf;

use clap::Parser;
use eos_processor::state_bench::{self, BenchConfig};

/// Restore time (cold, warm), resident memory and state-path throughput with N ids in state.
#[derive(Debug, Parser)]
struct Args {
    #[arg(
        long,
        env = "KAFKA_BOOTSTRAP_SERVERS",
        default_value = "127.0.0.1:9092"
    )]
    bootstrap_servers: String,
    /// Distinct event ids in state.
    #[arg(long, default_value_t = 1_000_000)]
    ids: u64,
    /// Events per throughput round and store (three interleaved rounds of each).
    #[arg(long, default_value_t = 200_000)]
    throughput_events: u64,
    /// Where the stores go during the run (removed at the end).
    #[arg(long)]
    work_dir: Option<PathBuf>,
    /// Print the report as JSON instead of a table.
    #[arg(long)]
    json: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let work_dir = args.work_dir.unwrap_or_else(|| {
        std::env::temp_dir().join(format!("eos-state-bench-{}", std::process::id()))
    });
    let config = BenchConfig {
        bootstrap_servers: args.bootstrap_servers,
        ids: args.ids,
        tail: (args.ids / 100).max(1),
        throughput_events: args.throughput_events,
        work_dir,
    };
    let report = state_bench::run(&config).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.table());
    }
    Ok(())
}
