use std::process::ExitCode;

use clap::Parser as _;

/// The loop allocates and frees a few small buffers per record (headers, keys, the output);
/// mimalloc's thread-local free lists take a measured share of that off glibc's malloc
/// (docs/BENCHMARKS.md, eos-processor).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> ExitCode {
    let config = eos_processor::ServiceConfig::parse();
    let log_format = config.processor.log.log_format;
    eos_runtime::service_main("eos-processor", log_format, |shutdown| {
        eos_processor::run(config, shutdown)
    })
    .await
}
