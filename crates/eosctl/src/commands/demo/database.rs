//! The run's own PostgreSQL database, and what dedup-service's history says about it.

use anyhow::Context as _;

/// Creates `database` on the server of `server_url`; the URL of the new database.
pub(super) async fn create_database(server_url: &str, database: &str) -> anyhow::Result<String> {
    use sqlx::Connection as _;
    let mut conn = sqlx::PgConnection::connect(server_url)
        .await
        .context("connecting to PostgreSQL (is the stack up? deploy/local/stack up)")?;
    sqlx::query(&format!("CREATE DATABASE \"{database}\""))
        .execute(&mut conn)
        .await
        .with_context(|| format!("creating database {database}"))?;
    conn.close().await.ok();
    let mut url = reqwest::Url::parse(server_url).context("--database-url is not a URL")?;
    url.set_path(&format!("/{database}"));
    Ok(url.to_string())
}

pub(super) async fn drop_database(server_url: &str, database: &str) -> anyhow::Result<()> {
    eos_runtime::scratch_database::drop_database(server_url, database)
        .await
        .with_context(|| format!("dropping database {database}"))
}

/// (went UNKNOWN, settled out of UNKNOWN) for this run's operations, from dedup-service's history.
pub(super) async fn unknowns(
    database_url: &str,
    provider_name: &str,
) -> anyhow::Result<(i64, i64)> {
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(database_url)
        .await
        .context("connecting to PostgreSQL for dedup-service's history")?;
    let pattern = format!("{provider_name}:%");
    let counts = sqlx::query!(
        r#"SELECT count(*) FILTER (WHERE to_state = 'UNKNOWN') AS "into_unknown!",
                  count(*) FILTER (WHERE from_state = 'UNKNOWN') AS "out_of_unknown!"
             FROM dedup_intent_history WHERE operation_id LIKE $1"#,
        pattern,
    )
    .fetch_one(&pool)
    .await?;
    pool.close().await;
    Ok((counts.into_unknown, counts.out_of_unknown))
}

/// Outbox rows `relay_name` has not published yet (0 once it has caught up).
pub(super) async fn outbox_backlog(database_url: &str, relay_name: &str) -> anyhow::Result<i64> {
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(database_url)
        .await
        .context("connecting to PostgreSQL for the outbox")?;
    let backlog = sqlx::query_scalar::<_, i64>(
        "SELECT count(*) FROM eos_outbox AS row
          WHERE NOT EXISTS (SELECT 1 FROM eos_outbox_relay_positions AS relayed
                             WHERE relayed.relay_name = $1
                               AND (row.order_xid, row.position)
                                   <= (relayed.order_xid, relayed.position))",
    )
    .bind(relay_name)
    .fetch_one(&pool)
    .await?;
    pool.close().await;
    Ok(backlog)
}
