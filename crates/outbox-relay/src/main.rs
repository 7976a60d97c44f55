use std::process::ExitCode;

use clap::Parser as _;

#[tokio::main]
async fn main() -> ExitCode {
    let config = outbox_relay::Config::parse();
    let log_format = config.log.log_format;
    eos_runtime::service_main("outbox-relay", log_format, |shutdown| {
        outbox_relay::run(config, shutdown)
    })
    .await
}
