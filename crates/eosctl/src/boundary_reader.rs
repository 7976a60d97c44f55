//! Reads what the boundaries past the output topic hold, for [`boundary_audit`]: the sink's rows
//! in PostgreSQL and the provider's effect list. Read-only: nothing is written, locked or
//! consumed.
//!
//! One database may hold many pipelines' rows, so only rows in scope are read: sink rows written
//! from the output topic or carrying one of its event ids (a row the sink skipped as a duplicate of
//! an earlier backfill still counts), and state rows of an entity the output versions or written
//! from one of its events.
//!
//! [`boundary_audit`]: crate::boundary_audit

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{Context as _, bail};
use eos_core::dead_letter::DeadLetterReason;
use eos_runtime::postgres_pool::PoolBuilder;
use serde::Deserialize;
use sqlx::PgPool;

use crate::boundary_audit::{OutputSet, ProviderEffect, SinkRow, StateRow};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const PROVIDER_TIMEOUT: Duration = Duration::from_secs(30);

/// Which tables to read, and for which pipeline.
#[derive(Debug, Clone, Copy)]
pub struct PostgresScope<'a> {
    pub sink_table: &'a str,
    pub state_table: &'a str,
    pub output_topic: &'a str,
    pub expected: &'a OutputSet,
}

#[derive(Debug, Clone, Default)]
pub struct PostgresTargets {
    pub rows: Vec<SinkRow>,
    pub states: Vec<StateRow>,
    /// Output positions (partition, offset) the sink dead-lettered as not charged by a provider
    /// target: `provider_rejected` or `beyond_dedup_horizon` in `sink_dead_letters`.
    pub refused_positions: BTreeSet<(i32, i64)>,
    /// Output positions the sink held (`sink_held_operations`, not resolved yet). A held event an
    /// operator resolved as failed is in `refused_positions`; one resolved as succeeded is an
    /// ordinary charged event.
    pub held_positions: BTreeSet<(i32, i64)>,
}

/// The sink's dead-letter reasons that mean "this event was not charged".
const REFUSAL_REASONS: [DeadLetterReason; 2] = [
    DeadLetterReason::ProviderRejected,
    DeadLetterReason::BeyondDedupHorizon,
];

/// Reads the rows in scope of both tables; a table that does not exist is an error naming it.
pub async fn read_postgres(
    database_url: &str,
    scope: &PostgresScope<'_>,
) -> anyhow::Result<PostgresTargets> {
    // The URL may carry a password: errors name the flag, never the URL.
    let pool = PoolBuilder::new(1)
        .acquire_timeout(CONNECT_TIMEOUT)
        .connect(database_url)
        .await
        .context("connecting to PostgreSQL (--database-url)")?;
    let result = read_tables(&pool, scope).await;
    pool.close().await;
    result
}

async fn read_tables(pool: &PgPool, scope: &PostgresScope<'_>) -> anyhow::Result<PostgresTargets> {
    let sink_table = existing_table(pool, scope.sink_table, "--sink-table").await?;
    let state_table = existing_table(pool, scope.state_table, "--state-table").await?;
    let event_ids: Vec<&str> = scope.expected.keys().map(String::as_str).collect();
    let versioned_entities: Vec<&str> = scope
        .expected
        .values()
        .filter(|event| event.version.is_some())
        .map(|event| event.entity_id.as_str())
        .collect();

    let rows: Vec<(String, i64, String)> = sqlx::query_as(&format!(
        "SELECT event_id, value, fingerprint FROM {sink_table} \
         WHERE source_topic = $1 OR event_id = ANY($2)"
    ))
    .bind(scope.output_topic)
    .bind(&event_ids)
    .fetch_all(pool)
    .await
    .with_context(|| {
        format!(
            "reading table {:?} (needs columns event_id text, value bigint, fingerprint text, \
             source_topic text)",
            scope.sink_table
        )
    })?;
    let states: Vec<(String, i64, String)> = sqlx::query_as(&format!(
        "SELECT entity_id, version, event_id FROM {state_table} \
         WHERE entity_id = ANY($1) OR event_id = ANY($2)"
    ))
    .bind(&versioned_entities)
    .bind(&event_ids)
    .fetch_all(pool)
    .await
    .with_context(|| {
        format!(
            "reading table {:?} (needs columns entity_id text, version bigint, event_id text)",
            scope.state_table
        )
    })?;
    // The sink's own table; a database it never migrated has no refusals to read.
    let refused_positions: Vec<(i32, i64)> = if table_exists(pool, "sink_dead_letters").await? {
        let reasons: Vec<&str> = REFUSAL_REASONS.iter().map(|r| r.as_str()).collect();
        sqlx::query!(
            "SELECT source_partition, source_offset FROM sink_dead_letters \
             WHERE source_topic = $1 AND reason = ANY($2)",
            scope.output_topic,
            &reasons as &[&str],
        )
        .fetch_all(pool)
        .await
        .context("reading sink_dead_letters")?
        .into_iter()
        .map(|row| (row.source_partition, row.source_offset))
        .collect()
    } else {
        Vec::new()
    };
    let mut refused_positions: BTreeSet<(i32, i64)> = refused_positions.into_iter().collect();
    let mut held_positions = BTreeSet::new();
    if table_exists(pool, "sink_held_operations").await? {
        let held: Vec<(i32, i64, Option<String>)> = sqlx::query_as(
            "SELECT source_partition, source_offset, resolution FROM sink_held_operations \
             WHERE source_topic = $1",
        )
        .bind(scope.output_topic)
        .fetch_all(pool)
        .await
        .context("reading sink_held_operations")?;
        for (partition, offset, resolution) in held {
            match resolution.as_deref() {
                None => {
                    held_positions.insert((partition, offset));
                }
                Some("failed") => {
                    refused_positions.insert((partition, offset));
                }
                Some(_) => {}
            }
        }
    }
    Ok(PostgresTargets {
        refused_positions,
        held_positions,
        rows: rows
            .into_iter()
            .map(|(event_id, value, fingerprint)| SinkRow {
                event_id,
                value,
                fingerprint,
            })
            .collect(),
        states: states
            .into_iter()
            .map(|(entity_id, version, event_id)| StateRow {
                entity_id,
                version,
                event_id,
            })
            .collect(),
    })
}

async fn table_exists(pool: &PgPool, table: &str) -> anyhow::Result<bool> {
    sqlx::query_scalar!(
        r#"SELECT to_regclass($1) IS NOT NULL AS "exists!""#,
        quote_table(table)
    )
    .fetch_one(pool)
    .await
    .with_context(|| format!("looking up table {table:?}"))
}

/// `table` (optionally `schema.table`) quoted for SQL, once PostgreSQL confirms it exists.
async fn existing_table(pool: &PgPool, table: &str, flag: &str) -> anyhow::Result<String> {
    let quoted = quote_table(table);
    if !table_exists(pool, table).await? {
        bail!(
            "table {table:?} ({flag}) does not exist in the database given by --database-url; \
             has the sink-writer run its migrations there?"
        );
    }
    Ok(quoted)
}

/// A possibly schema-qualified table name, quoted part by part as sink-writer quotes its targets
/// (so both name the same table), and so a flag can name any table but never inject SQL.
fn quote_table(table: &str) -> String {
    let quote = |name: &str| format!("\"{}\"", name.replace('"', "\"\""));
    match table.split_once('.') {
        Some((schema, name)) => format!("{}.{}", quote(schema), quote(name)),
        None => quote(table),
    }
}

#[derive(Debug, Deserialize)]
struct EffectList {
    effects: Vec<ProviderEffect>,
}

/// `GET {provider_url}/effects`: every effect the provider ever applied.
pub async fn read_provider_effects(provider_url: &str) -> anyhow::Result<Vec<ProviderEffect>> {
    let url = format!("{}/effects", provider_url.trim_end_matches('/'));
    // The URL's user information may be the provider's credential: errors show it without.
    let shown = eos_runtime::secrets::redact_url_userinfo(&url);
    let client = reqwest::Client::builder()
        .timeout(PROVIDER_TIMEOUT)
        .build()
        .context("building the HTTP client")?;
    let list: EffectList = client
        .get(&url)
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .with_context(|| format!("GET {shown} (--provider-url)"))?
        .json()
        .await
        .with_context(|| format!("GET {shown}: not an effect list"))?;
    Ok(list.effects)
}

/// The event ids of the committed domain rows: `query` (one text column) on `database_url`.
/// The query is the user's, so it is not compile-checked.
pub async fn read_domain_event_ids(
    database_url: &str,
    query: &str,
) -> anyhow::Result<BTreeSet<String>> {
    let pool = PoolBuilder::new(1)
        .connect(database_url)
        .await
        .context("connecting to PostgreSQL (--outbox-database-url)")?;
    let ids = sqlx::query_scalar::<_, String>(query)
        .fetch_all(&pool)
        .await
        .with_context(|| format!("running --outbox-domain-query {query:?}"));
    pool.close().await;
    Ok(ids?.into_iter().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_are_quoted_part_by_part() {
        assert_eq!(quote_table("event_sink"), "\"event_sink\"");
        assert_eq!(quote_table("ledger.Rows"), "\"ledger\".\"Rows\"");
        assert_eq!(quote_table("x\"; DROP"), "\"x\"\"; DROP\"");
    }

    #[test]
    fn the_effect_list_parses_as_provider_sim_answers_it() -> Result<(), serde_json::Error> {
        let body = r#"{"count":1,"effects":[{"key":"payments:e-1","charge_id":"ch_1",
            "amount":-250,"applied_at":"2026-01-01T00:00:00Z","attempts":3}]}"#;
        let list: EffectList = serde_json::from_str(body)?;
        assert_eq!(
            list.effects,
            vec![ProviderEffect {
                key: "payments:e-1".into(),
                amount: -250,
                attempts: 3,
            }]
        );
        Ok(())
    }
}
