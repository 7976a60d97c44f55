use std::process::ExitCode;

use outbox_relay::config::Invocation;

#[tokio::main]
async fn main() -> ExitCode {
    match Invocation::parse() {
        Invocation::Serve(config) => {
            let log_format = config.log.log_format;
            eos_runtime::service_main("outbox-relay", log_format, |shutdown| {
                outbox_relay::run(*config, shutdown)
            })
            .await
        }
        Invocation::Migrate(args) => {
            let log_format = args.log.log_format;
            eos_runtime::service_main("outbox-relay", log_format, |_shutdown| {
                outbox_relay::migrate(args)
            })
            .await
        }
    }
}
