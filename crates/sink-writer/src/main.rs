use std::process::ExitCode;

use sink_writer::config::Invocation;

#[tokio::main]
async fn main() -> ExitCode {
    match Invocation::parse() {
        Invocation::Serve(config) => {
            let log_format = config.log.log_format;
            eos_runtime::service_main("sink-writer", log_format, |shutdown| {
                sink_writer::run(*config, shutdown)
            })
            .await
        }
        Invocation::Migrate(args) => {
            let log_format = args.log.log_format;
            eos_runtime::service_main("sink-writer", log_format, |_shutdown| {
                sink_writer::migrate(args)
            })
            .await
        }
    }
}
