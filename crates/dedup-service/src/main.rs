use std::process::ExitCode;

#[tokio::main]
async fn main() -> ExitCode {
    eos_runtime::serve_or_migrate("dedup-service", dedup_service::run, dedup_service::migrate).await
}
