use std::process::ExitCode;

use clap::Parser as _;

#[tokio::main]
async fn main() -> ExitCode {
    let config = payments_api::Config::parse();
    let log_format = config.log.log_format;
    eos_runtime::service_main("payments-api", log_format, |shutdown| {
        payments_api::run(config, shutdown)
    })
    .await
}
