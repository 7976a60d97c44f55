use std::process::ExitCode;

use clap::Parser as _;

#[tokio::main]
async fn main() -> ExitCode {
    let config = dedup_service::Config::parse();
    let log_format = config.log_format;
    eos_runtime::service_main("dedup-service", log_format, |shutdown| {
        dedup_service::run(config, shutdown)
    })
    .await
}
