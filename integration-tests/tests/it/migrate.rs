//! The schema as its own step (README, "Deploy with Helm"): `dedup-service migrate` and
//! `sink-writer migrate` apply the migrations to a fresh database, and the services started with
//! --skip-migrations then work on it without changing the schema — and refuse a database nobody
//! migrated instead of creating tables themselves.

use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use dedup_client::{BeginOutcome, BeginParams};
use integration_tests::eosctl::{self, Workload};
use integration_tests::service_process::ServiceProcess;
use integration_tests::{TestDatabase, unique_name};
use time::OffsetDateTime;

use crate::dedup_service::Dedup;
use crate::sink_writer::{Sink, stop_gracefully};

const MIGRATE_TIMEOUT: Duration = Duration::from_secs(60);

/// Runs `<binary> migrate` against `database_url` and returns its log; fails unless it exits 0.
fn run_migrate(binary: &str, database_url: &str) -> anyhow::Result<String> {
    let args = ["migrate", "--database-url", database_url].map(str::to_owned);
    let mut process = ServiceProcess::spawn(binary, &args, &[])?;
    let status = process
        .wait_timeout(MIGRATE_TIMEOUT)?
        .with_context(|| format!("{binary} migrate still running\n{}", process.log_tail(30)))?;
    ensure!(
        status.success(),
        "{binary} migrate exited with {status}\n{}",
        process.log_tail(30)
    );
    Ok(process.log())
}

/// Every relation in the public schema with its kind, and the applied migration versions: what
/// a service that changes no schema leaves exactly as it found it.
async fn schema_snapshot(db: &TestDatabase) -> anyhow::Result<(Vec<String>, Vec<i64>)> {
    let relations: Vec<String> = sqlx::query_scalar(
        "SELECT c.relname::text || ':' || c.relkind::text FROM pg_class c
         JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = 'public' ORDER BY 1",
    )
    .fetch_all(&db.pool)
    .await?;
    let versions: Vec<i64> = if table_exists(db, "_sqlx_migrations").await? {
        sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success ORDER BY version")
            .fetch_all(&db.pool)
            .await?
    } else {
        Vec::new()
    };
    Ok((relations, versions))
}

async fn table_exists(db: &TestDatabase, table: &str) -> anyhow::Result<bool> {
    Ok(sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
        .bind(table)
        .fetch_one(&db.pool)
        .await?)
}

#[tokio::test(flavor = "multi_thread")]
async fn migrate_prepares_a_fresh_database_for_services_that_skip_migrations() -> anyhow::Result<()>
{
    let db = TestDatabase::create().await?;
    assert!(
        !table_exists(&db, "dedup_intents").await?,
        "a fresh database"
    );

    let log = run_migrate("dedup-service", &db.url)?;
    assert_eq!(
        log.matches("migration applied").count(),
        2,
        "both dedup-service migrations are applied and logged\n{log}"
    );
    let log = run_migrate("sink-writer", &db.url)?;
    assert_eq!(
        log.matches("migration applied").count(),
        1,
        "the sink's migration is applied and logged (the other crate's are ignored)\n{log}"
    );
    for table in [
        "dedup_intents",
        "dedup_intent_history",
        "sink_checkpoints",
        "sink_conflicts",
        "sink_dead_letters",
        "event_sink",
        "entity_state",
    ] {
        assert!(table_exists(&db, table).await?, "migrate created {table}");
    }
    // A second run (every helm upgrade runs the job again) applies nothing and still succeeds.
    let log = run_migrate("dedup-service", &db.url)?;
    assert!(
        !log.contains("migration applied") && log.contains("schema is current"),
        "a current schema is left alone\n{log}"
    );
    let migrated = schema_snapshot(&db).await?;
    assert_eq!(migrated.1.len(), 3, "{migrated:?}");

    // dedup-service without migrations: a Begin is acquired, so the store works on this schema.
    let mut dedup = Dedup::spawn(&db, &["--skip-migrations"])?;
    let client = dedup.client()?;
    let params = BeginParams {
        operation_id: unique_name("migrate-op"),
        fingerprint: vec![7; 32],
        owner: "migrate-test".into(),
        occurred_at: OffsetDateTime::now_utc(),
        lease_ttl: None,
    };
    match client.begin(&params).await? {
        BeginOutcome::Acquired { .. } => {}
        other => bail!(
            "expected ACQUIRED, got {other:?}\n{}",
            dedup.process.log_tail(30)
        ),
    }
    assert!(
        dedup
            .process
            .log()
            .contains("--skip-migrations: the schema is current"),
        "{}",
        dedup.process.log_tail(30)
    );
    let status = dedup.process.terminate(Duration::from_secs(30))?;
    ensure!(status.success(), "{}", dedup.process.log_tail(30));

    // sink-writer without migrations: drains a workload into the migrated tables.
    let topic = unique_name("migrate-sink");
    let workload_topic = topic.clone();
    tokio::task::spawn_blocking(move || {
        eosctl::produce(&workload_topic, &Workload::chaos(300, 93))
    })
    .await??;
    let sink = Sink::new(&topic, &db.url);
    let mut process = sink.spawn("member-a", &["--skip-migrations"], &[])?;
    sink.wait_drained(&db.pool, &mut process).await?;
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM event_sink")
        .fetch_one(&db.pool)
        .await?;
    assert!(rows > 0, "the sink wrote rows\n{}", process.log_tail(30));
    stop_gracefully(&mut process)?;

    assert_eq!(
        schema_snapshot(&db).await?,
        migrated,
        "services started with --skip-migrations changed no relation and applied no migration"
    );
    db.drop_database().await
}

#[tokio::test(flavor = "multi_thread")]
async fn services_that_skip_migrations_refuse_an_unmigrated_database() -> anyhow::Result<()> {
    let db = TestDatabase::create().await?;
    let untouched = schema_snapshot(&db).await?;

    // By the environment variable, as the Helm chart sets it.
    let args = [
        "--database-url",
        &db.url,
        "--listen",
        "127.0.0.1:0",
        "--metrics-addr",
        "127.0.0.1:0",
    ]
    .map(str::to_owned);
    let mut dedup =
        ServiceProcess::spawn("dedup-service", &args, &[("EOS_SKIP_MIGRATIONS", "true")])?;
    let sink = Sink::new(&unique_name("migrate-refused"), &db.url);
    let mut sink_process = sink.spawn("member-a", &["--skip-migrations"], &[])?;
    for (binary, process) in [
        ("dedup-service", &mut dedup),
        ("sink-writer", &mut sink_process),
    ] {
        let status = process
            .wait_timeout(MIGRATE_TIMEOUT)?
            .with_context(|| format!("{binary} kept running\n{}", process.log_tail(30)))?;
        let log = process.log();
        assert!(!status.success(), "{binary} exits non-zero\n{log}");
        assert!(
            log.contains(&format!("run `{binary} migrate`")),
            "{binary} says what to do\n{log}"
        );
    }
    assert_eq!(
        schema_snapshot(&db).await?,
        untouched,
        "a service started with --skip-migrations creates nothing"
    );
    db.drop_database().await
}
