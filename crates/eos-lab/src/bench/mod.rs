//! `eos-lab bench processor`: measures the real `eos-processor` binary against the real broker and
//! prints figures (it is a benchmark, not a test: missing a target does not fail it).
//!
//! 1. Throughput, exactly-once vs at-least-once vs a pass-through copy: one input topic per record
//!    size is written once; then rounds run interleaved (EO, ALO, pass-through, EO, …), each
//!    processor round a fresh processor process with a fresh group (so it reads the input from the
//!    beginning), output and changelog topics. A round's rate runs from the group's first commit
//!    to the commit that reaches the end of the input: process start-up, joining the group and
//!    restoring state are not throughput. The pass-through round (`pass_through`) is a plain
//!    consumer → producer copy of the same input in this process: the broker's own limit here.
//!    With `--format avro,protobuf`, each round also runs exactly-once over each format's input
//!    of the same events, in and out in the schema registry's wire format ([`record_format`]).
//!    Every processor round's outputs are read back afterwards: one per input and no dead letter,
//!    or the benchmark fails.
//! 2. Single-record transactions per second: exactly-once with `--max-batch 1` over a backlog,
//!    and the same backlog copied one record per transaction with nothing else in it (the floor).
//! 3. End-to-end latency at half the exactly-once peak: records produced at that rate; a
//!    `read_committed` reader of the output takes, for each output record, the time it arrived
//!    minus the Kafka timestamp of the input record it came from (its `source`). A run in which
//!    the pipeline falls behind measures a queue, so it is repeated at half the rate.
//! 4. Kill to resume: under a steady load the processor is SIGKILLed and started again at once
//!    under the same instance id, ten times; each time from the kill to the new process's first
//!    committed output (its records-out counter, which moves only after a commit), reported as
//!    the median and the worst.
//!
//! Committed offsets are read with `read_committed` ([`eosctl::group_offsets`]) every 50 ms.
//! Everything the benchmark creates (topics, consumer groups) is deleted at the end unless
//! `--keep-topics`; each processor's stdout and stderr go to a log file whose path is part of any
//! error.
//!
//! [`options`] resolves what to run, the driver runs it, the latency collector times the
//! latency run's outputs, [`figures`] does the arithmetic and [`report`] holds and prints the
//! result.

pub mod card_workload;
pub mod dedup;
mod driver;
pub mod figures;
mod latency_collector;
pub mod options;
mod pass_through;
pub mod pipeline;
mod processor_process;
pub mod record_format;
pub mod relay;
mod relay_in_process;
pub mod relay_process;
pub mod relay_staleness;
pub mod report;
mod run_id;
pub mod sink;
pub mod state;
mod visibility_reader;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context;
use tokio::runtime::Handle;

use crate::bench::driver::Bench;
pub use crate::bench::latency_collector::{LATENCY_RETRIES, PRODUCER_RAMP_UP};
pub use crate::bench::options::BenchOptions;
pub use crate::bench::report::{BenchReport, bench_text};
use eosctl::kafka_client::KafkaSettings;

/// Runs the benchmark. The work is blocking (child processes, polling), so it runs on a blocking
/// thread; SIGINT/SIGTERM stop it early, still cleaning up.
pub async fn run(settings: KafkaSettings, options: BenchOptions) -> anyhow::Result<BenchReport> {
    let stop = Arc::new(AtomicBool::new(false));
    let signal = {
        let stop = Arc::clone(&stop);
        tokio::spawn(async move {
            eos_runtime::shutdown::wait_for_signal().await;
            tracing::warn!("interrupted: stopping the benchmark and cleaning up");
            stop.store(true, Ordering::Relaxed);
        })
    };
    let runtime = Handle::current();
    let result =
        tokio::task::spawn_blocking(move || Bench::new(settings, options, runtime, stop)?.run())
            .await
            .context("the benchmark task failed");
    signal.abort();
    result?
}
