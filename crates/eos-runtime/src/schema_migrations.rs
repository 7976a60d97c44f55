//! The schema as its own step, for every service with PostgreSQL tables. `<service> migrate`
//! applies the service's embedded migrations with a role that owns the schema (a deployment's
//! migration job); a service started with `--skip-migrations` changes no table and only checks
//! that every embedded migration is applied, so it can run with a role that only reads and writes
//! rows (docs/deploy-helm.md "The schema step").

use std::collections::HashMap;
use std::time::Duration;

use sqlx::migrate::{Migrate as _, MigrateError, Migrator};
use sqlx::{Connection as _, PgPool};

use crate::postgres_pool::PoolBuilder;

/// Why the schema step failed; each message says what to do.
#[derive(Debug, thiserror::Error)]
pub enum MigrationError {
    #[error("cannot connect to PostgreSQL")]
    Connect(#[source] sqlx::Error),
    #[error("cannot apply the migrations (the role must be allowed to create and alter tables)")]
    Apply(#[source] MigrateError),
    #[error(
        "cannot read the applied migrations from _sqlx_migrations: with --skip-migrations run \
         `{service} migrate` with a role that owns the schema first, and let this role read \
         _sqlx_migrations"
    )]
    ReadApplied {
        service: &'static str,
        #[source]
        source: MigrateError,
    },
    #[error(
        "migration {version} ({description}) is not applied; run `{service} migrate` with a role \
         that owns the schema first, or start without --skip-migrations"
    )]
    NotApplied {
        service: &'static str,
        version: i64,
        description: String,
    },
    #[error(
        "migration {version} ({description}) was applied with other content than this build's; \
         the database belongs to another version of {service}"
    )]
    Changed {
        service: &'static str,
        version: i64,
        description: String,
    },
}

/// One migration this run applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppliedMigration {
    pub version: i64,
    pub description: String,
}

/// A one-connection pool for the schema step: it fails (rather than waits) when PostgreSQL is
/// unreachable, so a migration job reports the problem and its orchestrator retries.
pub async fn connect(database_url: &str) -> Result<PgPool, MigrationError> {
    PoolBuilder::new(1)
        .acquire_timeout(Duration::from_secs(30))
        .connect(database_url)
        .await
        .map_err(MigrationError::Connect)
}

/// Applies every embedded migration not applied yet and returns those it applied (none when
/// the schema is current). Concurrent runs are safe: sqlx takes an advisory lock.
pub async fn apply(
    pool: &PgPool,
    migrator: &Migrator,
) -> Result<Vec<AppliedMigration>, MigrationError> {
    let before = {
        // Under sqlx's advisory lock, as the migrator itself creates the table: two services
        // starting on a fresh database must not both create it. A connection of its own, closed
        // afterwards (which releases the lock), so the lock never stays behind in the pool.
        let mut conn = pool
            .acquire()
            .await
            .map_err(MigrationError::Connect)?
            .detach();
        let listed = match conn.lock().await {
            Ok(()) => match conn.ensure_migrations_table().await {
                Ok(()) => applied_checksums(&mut conn).await,
                Err(error) => Err(error),
            },
            Err(error) => Err(error),
        };
        let _ = conn.close().await;
        listed.map_err(MigrationError::Apply)?
    };
    migrator.run(pool).await.map_err(MigrationError::Apply)?;
    Ok(migrator
        .iter()
        .filter(|m| !m.migration_type.is_down_migration() && !before.contains_key(&m.version))
        .map(|m| AppliedMigration {
            version: m.version,
            description: m.description.to_string(),
        })
        .collect())
}

/// Checks, without changing anything, that every embedded migration is applied with the same
/// content: what a service started with `--skip-migrations` needs before it touches a row.
pub async fn check_applied(
    pool: &PgPool,
    migrator: &Migrator,
    service: &'static str,
) -> Result<(), MigrationError> {
    let mut conn = pool.acquire().await.map_err(MigrationError::Connect)?;
    let applied = applied_checksums(&mut conn)
        .await
        .map_err(|source| MigrationError::ReadApplied { service, source })?;
    for migration in migrator
        .iter()
        .filter(|m| !m.migration_type.is_down_migration())
    {
        let description = migration.description.to_string();
        match applied.get(&migration.version) {
            None => {
                return Err(MigrationError::NotApplied {
                    service,
                    version: migration.version,
                    description,
                });
            }
            Some(checksum) if checksum.as_slice() != &*migration.checksum => {
                return Err(MigrationError::Changed {
                    service,
                    version: migration.version,
                    description,
                });
            }
            Some(_) => {}
        }
    }
    Ok(())
}

async fn applied_checksums(
    conn: &mut sqlx::PgConnection,
) -> Result<HashMap<i64, Vec<u8>>, MigrateError> {
    Ok(conn
        .list_applied_migrations()
        .await?
        .into_iter()
        .map(|m| (m.version, m.checksum.into_owned()))
        .collect())
}

/// The whole `<service> migrate` command: connect, apply, log each migration applied.
pub async fn migrate_command(
    service: &'static str,
    database_url: &str,
    migrator: &Migrator,
) -> Result<(), MigrationError> {
    let pool = connect(database_url).await?;
    let result = apply(&pool, migrator).await;
    pool.close().await;
    let applied = result?;
    for migration in &applied {
        tracing::info!(
            version = migration.version,
            description = %migration.description,
            "migration applied"
        );
    }
    tracing::info!(applied = applied.len(), "{service} schema is current");
    Ok(())
}

/// At a service's start: apply the migrations, or with `--skip-migrations` only check them.
pub async fn prepare_at_start(
    pool: &PgPool,
    migrator: &Migrator,
    service: &'static str,
    skip_migrations: bool,
) -> Result<(), MigrationError> {
    if skip_migrations {
        check_applied(pool, migrator, service).await?;
        tracing::info!("--skip-migrations: the schema is current");
    } else {
        let applied = apply(pool, migrator).await?;
        tracing::info!(applied = applied.len(), "migrations applied at start-up");
    }
    Ok(())
}
