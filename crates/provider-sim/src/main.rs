use std::process::ExitCode;

use clap::Parser as _;

#[tokio::main]
async fn main() -> ExitCode {
    let config = provider_sim::Config::parse();
    let log_format = config.log.log_format;
    eos_runtime::service_main("provider-sim", log_format, |shutdown| {
        provider_sim::run(config, shutdown)
    })
    .await
}
