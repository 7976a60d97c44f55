//! The one way a PostgreSQL pool is opened in eos-suite. A service opens its pool with
//! [`PoolBuilder::connect_at_start`]: it waits, with backoff, for a database that is not
//! reachable yet (a service started before its database must wait, not crash-loop) and fails at
//! once on what waiting cannot fix (a wrong password, a missing database). A tool or a migration
//! step uses [`PoolBuilder::connect`], which fails at once, so it reports the problem and its
//! caller (a person, a job's orchestrator) decides.

use std::sync::Arc;
use std::time::Duration;

use sqlx::Executor as _;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use tokio_util::sync::CancellationToken;

use crate::backoff::{Retryable as _, doubling};

/// The longest wait between a service's start-up connect attempts, where no flag sets it.
pub const START_MAX_BACKOFF: Duration = Duration::from_secs(5);

/// How to open a pool: its size, how long a caller waits for a connection, and the session
/// settings every new connection gets.
#[derive(Debug, Clone)]
pub struct PoolBuilder {
    max_connections: u32,
    acquire_timeout: Duration,
    session_settings: Vec<&'static str>,
}

impl PoolBuilder {
    /// A pool of at most `max_connections`; a caller waits at most 30 s for one (sqlx's
    /// default).
    pub fn new(max_connections: u32) -> Self {
        Self {
            max_connections,
            acquire_timeout: Duration::from_secs(30),
            session_settings: Vec::new(),
        }
    }

    pub fn acquire_timeout(mut self, timeout: Duration) -> Self {
        self.acquire_timeout = timeout;
        self
    }

    /// A statement every new connection runs before it is used, e.g.
    /// `SET statement_timeout = '30s'`. A statement that fails fails the connection, so a typo
    /// shows at start-up.
    pub fn session_setting(mut self, statement: &'static str) -> Self {
        self.session_settings.push(statement);
        self
    }

    fn options(&self) -> PgPoolOptions {
        let options = PgPoolOptions::new()
            .max_connections(self.max_connections)
            .acquire_timeout(self.acquire_timeout);
        if self.session_settings.is_empty() {
            return options;
        }
        let settings: Arc<str> = self.session_settings.join(";\n").into();
        options.after_connect(move |connection, _| {
            let settings = Arc::clone(&settings);
            Box::pin(async move {
                // A plain string runs unprepared (the simple protocol), so the settings may be
                // several statements.
                connection.execute(&*settings).await?;
                Ok(())
            })
        })
    }

    /// Opens the pool with one attempt.
    pub async fn connect(&self, database_url: &str) -> Result<PgPool, sqlx::Error> {
        self.options().connect(database_url).await
    }

    /// [`connect`](Self::connect) with options built in code rather than a URL.
    pub async fn connect_with(&self, options: PgConnectOptions) -> Result<PgPool, sqlx::Error> {
        self.options().connect_with(options).await
    }

    /// Opens the pool, retrying with backoff (up to `max_backoff` between attempts, each retry
    /// logged) while PostgreSQL is unreachable. `Ok(None)` when `shutdown` is cancelled while
    /// waiting; any other error at once.
    pub async fn connect_at_start(
        &self,
        database_url: &str,
        max_backoff: Duration,
        shutdown: &CancellationToken,
    ) -> Result<Option<PgPool>, sqlx::Error> {
        let connecting = (|| self.connect(database_url))
            .retry(doubling(Duration::from_millis(100), max_backoff))
            .when(is_unreachable)
            .notify(|error, delay| {
                tracing::warn!(
                    retry_in_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
                    %error,
                    "PostgreSQL unreachable at start; retrying"
                );
            });
        tokio::select! {
            () = shutdown.cancelled() => Ok(None),
            connected = connecting => connected.map(Some),
        }
    }
}

/// Whether waiting may fix a failed connect: the server is not there yet, is starting or
/// shutting down, or has no connection slot free. A refused login or a missing database is not.
pub fn is_unreachable(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut => true,
        // SQLSTATE classes 08 (connection exception), 53 (insufficient resources, e.g. too many
        // connections) and 57 (operator intervention, e.g. cannot_connect_now while starting).
        sqlx::Error::Database(db) => db
            .code()
            .is_some_and(|code| matches!(code.get(..2), Some("08" | "53" | "57"))),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_what_waiting_can_fix_is_retried() {
        let io = sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert!(is_unreachable(&io));
        assert!(is_unreachable(&sqlx::Error::PoolTimedOut));
        assert!(!is_unreachable(&sqlx::Error::RowNotFound));
        assert!(!is_unreachable(&sqlx::Error::Configuration(
            "bad url".into()
        )));
    }

    #[tokio::test(start_paused = true)]
    async fn a_cancelled_start_stops_waiting() {
        // Port 1 on loopback refuses at once: unreachable, so it would be retried forever.
        let shutdown = CancellationToken::new();
        let cancel = shutdown.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(3)).await;
            cancel.cancel();
        });
        let pool = PoolBuilder::new(1)
            .connect_at_start(
                "postgres://eos@127.0.0.1:1/eos",
                Duration::from_millis(500),
                &shutdown,
            )
            .await
            .expect("no other error than unreachable");
        assert!(pool.is_none());
    }
}
