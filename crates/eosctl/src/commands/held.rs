//! `eosctl held list` and `eosctl held resolve`: the events the sink-writer held because their
//! provider operation is stuck UNKNOWN at dedup-service.

use anyhow::Context as _;
use dedup_client::{ClientCredentials, DedupClient};
use eos_runtime::postgres_pool::PoolBuilder;
use sqlx::PgPool;

use crate::cli::{HeldCommand, HeldResolveArgs};
use crate::commands::Status;
use crate::held;

pub(crate) async fn run(command: HeldCommand) -> anyhow::Result<Status> {
    match command {
        HeldCommand::List(args) => {
            let pool = connect(&args.database).await?;
            let rows = held::list(&pool, args.all).await?;
            if args.json {
                println!("{}", serde_json::to_string(&rows)?);
            } else {
                print!("{}", held::held_text(&rows));
            }
            Ok(Status::Success)
        }
        HeldCommand::Resolve(args) => resolve(args).await,
    }
}

async fn resolve(args: HeldResolveArgs) -> anyhow::Result<Status> {
    let pool = connect(&args.database).await?;
    let credentials = ClientCredentials {
        token: ClientCredentials::token_from(
            None,
            args.operator_token_file.as_deref(),
            "--operator-token",
        )?,
        tls: args.dedup_tls.files(),
    };
    let dedup =
        DedupClient::connect_lazy_with(&args.dedup_url, &credentials).with_context(|| {
            format!(
                "dedup-service at {}",
                eos_runtime::secrets::redact_url_userinfo(&args.dedup_url)
            )
        })?;
    let resolved = held::resolve(
        &pool,
        &dedup,
        &args.operation_id,
        args.outcome,
        &args.evidence,
    )
    .await?;
    if args.json {
        println!("{}", serde_json::to_string(&resolved)?);
    } else {
        println!(
            "operation {:?} resolved {} at dedup-service (now {}); {} held row(s) marked resolved",
            resolved.operation_id,
            resolved.outcome.as_str(),
            resolved.intent_state,
            resolved.rows_resolved
        );
    }
    Ok(Status::Success)
}

async fn connect(database: &eos_runtime::secrets::DatabaseUrlFlags) -> anyhow::Result<PgPool> {
    PoolBuilder::new(1)
        .acquire_timeout(std::time::Duration::from_secs(10))
        .connect(database.url())
        .await
        .with_context(|| format!("connecting to PostgreSQL at {}", database.redacted()))
}
