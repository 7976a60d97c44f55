use std::process::ExitCode;

use clap::Parser as _;

#[tokio::main]
async fn main() -> ExitCode {
    let config = eos_processor::Config::parse();
    let log_format = config.log.log_format;
    eos_runtime::service_main("eos-processor", log_format, |shutdown| {
        eos_processor::run(config, shutdown)
    })
    .await
}
