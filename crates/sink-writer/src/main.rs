use std::process::ExitCode;

use clap::Parser as _;

#[tokio::main]
async fn main() -> ExitCode {
    let config = sink_writer::Config::parse();
    let log_format = config.log.log_format;
    eos_runtime::service_main("sink-writer", log_format, |shutdown| {
        sink_writer::run(config, shutdown)
    })
    .await
}
