use std::process::ExitCode;

#[tokio::main]
async fn main() -> ExitCode {
    eos_runtime::serve_or_migrate("payments-api", payments_api::run, payments_api::migrate).await
}
