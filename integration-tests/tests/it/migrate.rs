//! The schema as its own step (docs/deploy-helm.md "The schema step"): `dedup-service migrate` and
//! `sink-writer migrate` apply the migrations to a fresh database with the owner role, and the
//! services started with --skip-migrations then work on it with a runtime role that has only the
//! row privileges the guide lists (it cannot create, alter or drop a table) — and refuse a
//! database nobody migrated instead of creating tables themselves. The outbox's services
//! (`payments-api`, `outbox-relay`) likewise.

use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use dedup_client::{BeginOutcome, BeginParams};
use eos_testkit::argv;
use integration_tests::eosctl::{self, Workload};
use integration_tests::service_process::ServiceProcess;
use integration_tests::{Isolation, TestDatabase, arg_refs, create_topic, read_topic, unique_name};
use rdkafka::Message as _;
use time::OffsetDateTime;

use crate::dedup_service::Dedup;
use crate::payments_api::{PaymentsApi, spawn_relay};
use crate::secrets::assert_no_secret;
use crate::sink_writer::Sink;

const MIGRATE_TIMEOUT: Duration = Duration::from_secs(60);

/// sink-writer's `--skip-migrations`.
fn skip_sink_migrations() -> Vec<String> {
    argv!(sink_writer::Config {
        skip_migrations: true
    })
}

/// Runs `<binary> migrate` against `database_url` and returns its log; fails unless it exits 0.
/// Every service's `migrate` takes the same flags (eos-runtime's).
fn run_migrate(binary: &str, database_url: &str) -> anyhow::Result<String> {
    let args = argv!(subcommand eos_runtime::service_flags::MigrateArgs {
        database[database_url]: database_url
    });
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

/// A login role with no privileges of its own, made by the PostgreSQL superuser (over the local
/// socket, as the `postgres` OS user: the test role cannot create roles) and dropped again, with
/// whatever it was granted in `database`, even when the test fails and leaves the database.
struct RuntimeRole {
    name: String,
    password: String,
    database: String,
}

impl RuntimeRole {
    fn create(database: &str) -> anyhow::Result<Self> {
        let role = Self {
            name: unique_name("eos_it_runtime").replace('-', "_"),
            password: unique_name("pw").replace('-', ""),
            database: database.to_owned(),
        };
        role.superuser_sql(
            None,
            &format!(
                "CREATE ROLE \"{}\" LOGIN PASSWORD '{}'",
                role.name, role.password
            ),
        )?;
        Ok(role)
    }

    /// `url` (of the owner role) with this role's credentials.
    fn url(&self, url: &str) -> anyhow::Result<String> {
        let (scheme, rest) = url.split_once("://").context("a postgres:// URL")?;
        let (_, host_and_database) = rest.split_once('@').context("a URL with credentials")?;
        Ok(format!(
            "{scheme}://{}:{}@{host_and_database}",
            self.name, self.password
        ))
    }

    fn superuser_sql(&self, database: Option<&str>, sql: &str) -> anyhow::Result<()> {
        integration_tests::superuser_sql(database, sql).map(drop)
    }
}

impl Drop for RuntimeRole {
    fn drop(&mut self) {
        // The grants and default privileges naming the role keep it from being dropped; they go
        // with the database, or here when a failed test left the database behind.
        let revoke = format!("DROP OWNED BY \"{}\"", self.name);
        let _ = self.superuser_sql(Some(&self.database), &revoke);
        let drop_role = format!("DROP ROLE IF EXISTS \"{}\"", self.name);
        if let Err(error) = self.superuser_sql(None, &drop_role) {
            eprintln!("could not drop role {}: {error:#}", self.name);
        }
    }
}

/// Whether `role_url` may run `sql`; the error text when it may not.
async fn refused(role_url: &str, sql: &str) -> anyhow::Result<Option<String>> {
    let pool = eos_runtime::postgres_pool::PoolBuilder::new(1)
        .connect(role_url)
        .await?;
    let result = sqlx::raw_sql(sql).execute(&pool).await;
    pool.close().await;
    Ok(result.err().map(|error| error.to_string()))
}

/// The guide's grants (docs/deploy-helm.md), given by the owner before the first migrate.
async fn grant_row_privileges(db: &TestDatabase, role: &RuntimeRole) -> anyhow::Result<()> {
    sqlx::raw_sql(&format!(
        "GRANT USAGE ON SCHEMA public TO \"{0}\";
         ALTER DEFAULT PRIVILEGES IN SCHEMA public
             GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO \"{0}\";
         ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT USAGE ON SEQUENCES TO \"{0}\";",
        role.name
    ))
    .execute(&db.pool)
    .await?;
    Ok(())
}

fn assert_refused(sql: &str, error: Option<String>) {
    assert!(
        error
            .as_deref()
            .is_some_and(|e| e.contains("permission denied") || e.contains("must be owner")),
        "the runtime role must not run {sql}: {error:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn migrate_prepares_a_fresh_database_for_services_that_skip_migrations() -> anyhow::Result<()>
{
    let db = TestDatabase::create().await?;
    let role = RuntimeRole::create(&db.name)?;
    let runtime_url = role.url(&db.url)?;
    grant_row_privileges(&db, &role).await?;
    assert!(
        !table_exists(&db, "dedup_intents").await?,
        "a fresh database"
    );

    let log = run_migrate("dedup-service", &db.url)?;
    assert_eq!(
        log.matches("migration applied").count(),
        5,
        "the five dedup-service migrations are applied and logged\n{log}"
    );
    let log = run_migrate("sink-writer", &db.url)?;
    assert_eq!(
        log.matches("migration applied").count(),
        2,
        "the sink's two migrations are applied and logged (the other crate's are ignored)\n{log}"
    );
    for table in [
        "dedup_intents",
        "dedup_intent_history",
        "sink_checkpoints",
        "sink_conflicts",
        "sink_dead_letters",
        "sink_held_operations",
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
    assert_eq!(
        migrated.1.len(),
        7,
        "five of dedup-service, two of the sink: {migrated:?}"
    );

    // The runtime role can change no table.
    for sql in [
        "CREATE TABLE runtime_made (id INT)",
        "DROP TABLE event_sink",
        "ALTER TABLE dedup_intents ADD COLUMN runtime_made INT",
    ] {
        assert_refused(sql, refused(&runtime_url, sql).await?);
    }

    // dedup-service without migrations, as the runtime role: a Begin is acquired, so the store
    // works on this schema with row privileges only.
    let mut dedup = Dedup::spawn_on(
        &runtime_url,
        "127.0.0.1:0",
        &arg_refs(&argv!(dedup_service::Config {
            skip_migrations: true
        })),
    )?;
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
    // The runtime role's password is a unique string: it is in no log line or ops body.
    assert_no_secret(&mut dedup.process, &role.password).await?;
    let status = dedup.process.terminate(Duration::from_secs(30))?;
    ensure!(status.success(), "{}", dedup.process.log_tail(30));

    // sink-writer without migrations, as the runtime role: drains a workload (rows, conflicts,
    // dead letters, checkpoints) into the migrated tables.
    let topic = unique_name("migrate-sink");
    let workload_topic = topic.clone();
    tokio::task::spawn_blocking(move || {
        eosctl::produce(&workload_topic, &Workload::chaos(300, 93))
    })
    .await??;
    let sink = Sink::new(&topic, &runtime_url);
    let mut process = sink.spawn("member-a", &arg_refs(&skip_sink_migrations()), &[])?;
    sink.wait_drained(&db.pool, &mut process).await?;
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM event_sink")
        .fetch_one(&db.pool)
        .await?;
    assert!(rows > 0, "the sink wrote rows\n{}", process.log_tail(30));
    assert_no_secret(&mut process, &role.password).await?;
    process.stop_gracefully()?;

    assert_eq!(
        schema_snapshot(&db).await?,
        migrated,
        "services started with --skip-migrations changed no relation and applied no migration"
    );
    db.drop_database().await?;
    drop(role);
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn services_that_skip_migrations_refuse_an_unmigrated_database() -> anyhow::Result<()> {
    let db = TestDatabase::create().await?;
    let untouched = schema_snapshot(&db).await?;

    // By the environment variable, as the Helm chart sets it.
    let args = argv!(dedup_service::Config {
        database[database_url]: &db.url,
        listen: "127.0.0.1:0",
        metrics_addr: "127.0.0.1:0",
    });
    let mut dedup =
        ServiceProcess::spawn("dedup-service", &args, &[("EOS_SKIP_MIGRATIONS", "true")])?;
    let sink = Sink::new(&unique_name("migrate-refused"), &db.url);
    let mut sink_process = sink.spawn("member-a", &arg_refs(&skip_sink_migrations()), &[])?;
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

/// `payments-api migrate` and `outbox-relay migrate` as the owner, then both services with
/// --skip-migrations as the runtime role: a payment is recorded with its outbox row
/// (`eos_outbox_enqueue` needs only row privileges), the relay publishes it and records its
/// position, and neither changes the schema. The relay runs in its default logical mode, for
/// which the role has the REPLICATION attribute and nothing more (the migration made the
/// publication).
#[tokio::test(flavor = "multi_thread")]
async fn the_outbox_services_run_with_row_privileges_after_migrate() -> anyhow::Result<()> {
    let db = TestDatabase::create().await?;
    let role = RuntimeRole::create(&db.name)?;
    let runtime_url = role.url(&db.url)?;
    grant_row_privileges(&db, &role).await?;
    role.superuser_sql(None, &format!("ALTER ROLE \"{}\" REPLICATION", role.name))?;
    run_migrate("outbox-relay", &db.url)?;
    run_migrate("payments-api", &db.url)?;
    for table in [
        "eos_outbox",
        "eos_outbox_entity_order",
        "eos_outbox_relay_positions",
        "payments_api_payments",
        "payments_api_accounts",
    ] {
        assert!(table_exists(&db, table).await?, "migrate created {table}");
    }
    let migrated = schema_snapshot(&db).await?;
    for sql in [
        "DROP TABLE eos_outbox",
        "CREATE TABLE runtime_made (id INT)",
    ] {
        assert_refused(sql, refused(&runtime_url, sql).await?);
    }

    let topic = unique_name("migrate-outbox");
    create_topic(&topic, 1).await?;
    let mut api = PaymentsApi::start_on(
        &runtime_url,
        &topic,
        &arg_refs(&argv!(payments_api::Config {
            skip_migrations: true
        })),
        &[],
    )?;
    let body = r#"{"account_id": "acct-1", "amount": 700, "currency": "EUR"}"#;
    let (status, _, payment) = api.pay(Some("migrate-1"), body).await?;
    ensure!(
        status == 201,
        "{status} {payment}\n{}",
        api.process.log_tail(30)
    );

    let mut relay = spawn_relay(
        &runtime_url,
        &arg_refs(&argv!(outbox_relay::Config {
            poll_interval: "200ms",
            skip_migrations: true,
        })),
        &[],
    )?;
    let deadline = std::time::Instant::now() + MIGRATE_TIMEOUT;
    let published = loop {
        let read_from = topic.clone();
        let records =
            tokio::task::spawn_blocking(move || read_topic(&read_from, Isolation::ReadCommitted))
                .await??;
        let recorded: i64 = sqlx::query_scalar("SELECT count(*) FROM eos_outbox_relay_positions")
            .fetch_one(&db.pool)
            .await?;
        if !records.is_empty() && recorded == 1 {
            break records;
        }
        ensure!(
            std::time::Instant::now() < deadline,
            "the relay did not publish and record the payment\n{}",
            relay.log_tail(30)
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    assert_eq!(published.len(), 1, "one payment, one event");
    let envelope: serde_json::Value =
        serde_json::from_slice(published[0].payload().unwrap_or_default())?;
    assert_eq!(envelope["event_id"], payment["event_id"]);

    assert_no_secret(&mut api.process, &role.password).await?;
    assert_no_secret(&mut relay, &role.password).await?;
    api.process.stop_gracefully()?;
    relay.stop_gracefully()?;
    assert_eq!(
        schema_snapshot(&db).await?,
        migrated,
        "services started with --skip-migrations changed no relation and applied no migration"
    );
    db.drop_database().await?;
    drop(role);
    Ok(())
}
