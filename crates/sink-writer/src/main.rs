use std::process::ExitCode;

#[tokio::main]
async fn main() -> ExitCode {
    eos_runtime::serve_or_migrate("sink-writer", sink_writer::run, sink_writer::migrate).await
}
