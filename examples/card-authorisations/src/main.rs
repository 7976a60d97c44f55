use std::process::ExitCode;

use clap::Parser as _;

#[tokio::main]
async fn main() -> ExitCode {
    let args = card_authorisations::Args::parse();
    let log_format = args.processor.log.log_format;
    eos_runtime::service_main("card-authorisations", log_format, |shutdown| {
        args.run(shutdown)
    })
    .await
}
