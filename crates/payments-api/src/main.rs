use std::process::ExitCode;

use payments_api::config::Invocation;

#[tokio::main]
async fn main() -> ExitCode {
    match Invocation::parse() {
        Invocation::Serve(config) => {
            let log_format = config.log.log_format;
            eos_runtime::service_main("payments-api", log_format, |shutdown| {
                payments_api::run(*config, shutdown)
            })
            .await
        }
        Invocation::Migrate(args) => {
            let log_format = args.log.log_format;
            eos_runtime::service_main("payments-api", log_format, |_shutdown| {
                payments_api::migrate(args)
            })
            .await
        }
    }
}
