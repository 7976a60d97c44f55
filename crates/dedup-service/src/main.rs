use std::process::ExitCode;

use dedup_service::config::Invocation;

#[tokio::main]
async fn main() -> ExitCode {
    match Invocation::parse() {
        Invocation::Serve(config) => {
            let log_format = config.log_format;
            eos_runtime::service_main("dedup-service", log_format, |shutdown| {
                dedup_service::run(*config, shutdown)
            })
            .await
        }
        Invocation::Migrate(args) => {
            let log_format = args.log_format;
            eos_runtime::service_main("dedup-service", log_format, |_shutdown| {
                dedup_service::migrate(args)
            })
            .await
        }
    }
}
