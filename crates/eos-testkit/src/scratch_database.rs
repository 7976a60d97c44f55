//! Dropping a throw-away database (a demo run's, an integration test's) that services may still
//! be connected to.
//!
//! `DROP DATABASE … WITH (FORCE)` terminates the other sessions first, with the permissions of
//! `pg_terminate_backend`: on PostgreSQL 15 an autovacuum worker busy in that database has no
//! role, so a role that is not a superuser (and not in `pg_signal_backend`) is refused with
//! "must be a member of the role whose process is being terminated". A plain `DROP DATABASE`
//! stops autovacuum workers by itself, and waits a few seconds for other sessions; so each
//! attempt tries both, and a few attempts cover sessions of killed services that are still
//! closing.
//!
//! A logical replication slot on the database (outbox-relay's logical mode creates one) keeps
//! `DROP DATABASE` from running and would hold WAL on the server for good: the database's
//! inactive slots are dropped first.

use std::time::Duration;

use sqlx::Connection as _;

const ATTEMPTS: u32 = 10;
const PAUSE: Duration = Duration::from_millis(300);

/// Drops `database` on the server `server_url` names (any database there to connect to).
pub async fn drop_database(server_url: &str, database: &str) -> Result<(), sqlx::Error> {
    let mut conn = sqlx::PgConnection::connect(server_url).await?;
    let forced = format!("DROP DATABASE IF EXISTS \"{database}\" WITH (FORCE)");
    let plain = format!("DROP DATABASE IF EXISTS \"{database}\"");
    let mut attempt = 1;
    let outcome = loop {
        // Only slots no session uses: a service still decoding is ended by FORCE, then its slot
        // goes on the next attempt.
        let slots = sqlx::query(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots
              WHERE database = $1 AND NOT active",
        )
        .bind(database)
        .execute(&mut conn)
        .await;
        if let (Err(error), true) = (slots, attempt == ATTEMPTS) {
            break Err(error);
        }
        let error = match sqlx::query(&forced).execute(&mut conn).await {
            Ok(_) => break Ok(()),
            Err(error) => error,
        };
        let error = match sqlx::query(&plain).execute(&mut conn).await {
            Ok(_) => break Ok(()),
            Err(plain_error) if is_autovacuum_refusal(&error) => plain_error,
            Err(_) => error,
        };
        if attempt == ATTEMPTS {
            break Err(error);
        }
        attempt += 1;
        tokio::time::sleep(PAUSE).await;
    };
    conn.close().await.ok();
    outcome
}

/// SQLSTATE 42501 (insufficient_privilege): FORCE met a session this role may not terminate.
fn is_autovacuum_refusal(error: &sqlx::Error) -> bool {
    error
        .as_database_error()
        .and_then(|db| db.code())
        .is_some_and(|code| code == "42501")
}
