use std::process::ExitCode;

#[tokio::main]
async fn main() -> ExitCode {
    eos_runtime::serve_or_migrate("outbox-relay", outbox_relay::run, outbox_relay::migrate).await
}
