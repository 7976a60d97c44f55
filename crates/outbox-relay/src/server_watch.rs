//! What the relay watches on the PostgreSQL server besides the outbox: in xmin mode, the oldest
//! transaction holding the server's xmin back (every row committed after it started waits for
//! it); in logical mode, the WAL the replication slot keeps.

use std::time::{Duration, Instant};

use metrics::gauge;
use sqlx::{PgPool, Row as _};
use tracing::{debug, warn};

use crate::logical::LogicalSource;
use crate::metrics as m;

/// A blocker younger than this is ordinary traffic, not worth a log line.
const BLOCKER_LOG_AFTER: Duration = Duration::from_secs(10);
/// While one session keeps blocking, it is named again this often.
const BLOCKER_LOG_EVERY: Duration = Duration::from_secs(60);

/// The last blocker named in the log, so a long one is not named every few seconds.
#[derive(Debug, Default)]
pub(crate) struct BlockerLog {
    last: Option<(i32, Instant)>,
}

/// xmin mode: sets `outbox_relay_xmin_blocker_age_seconds` to the age of the oldest transaction
/// with a transaction id on the server (0 when none), and names it in a warning past
/// `BLOCKER_LOG_AFTER`. A non-superuser sees the `backend_xid` of other roles' sessions only
/// with `pg_read_all_stats` (docs/outbox.md): without it those sessions are not found, and the
/// gauge may read 0 while the relay waits.
pub(crate) async fn report_xmin_blocker(pool: &PgPool, log: &mut BlockerLog) {
    let row = sqlx::query(
        "SELECT pid, datname::TEXT, usename::TEXT, application_name, state,
                EXTRACT(EPOCH FROM now() - xact_start)::FLOAT8
           FROM pg_stat_activity
          WHERE backend_xid IS NOT NULL AND pid <> pg_backend_pid()
          ORDER BY age(backend_xid) DESC
          LIMIT 1",
    )
    .fetch_optional(pool)
    .await;
    let row = match row {
        Ok(row) => row,
        Err(error) => {
            debug!(%error, "cannot look for the transaction holding the xmin back");
            return;
        }
    };
    let Some(row) = row else {
        gauge!(m::XMIN_BLOCKER_AGE).set(0.0);
        return;
    };
    let pid: i32 = row.try_get(0).unwrap_or_default();
    let database: Option<String> = row.try_get(1).unwrap_or_default();
    let user: Option<String> = row.try_get(2).unwrap_or_default();
    let application: Option<String> = row.try_get(3).unwrap_or_default();
    let state: Option<String> = row.try_get(4).unwrap_or_default();
    let age: f64 = row
        .try_get::<Option<f64>, _>(5)
        .ok()
        .flatten()
        .unwrap_or(0.0)
        .max(0.0);
    gauge!(m::XMIN_BLOCKER_AGE).set(age);
    if age < BLOCKER_LOG_AFTER.as_secs_f64() {
        return;
    }
    let named_lately = log
        .last
        .is_some_and(|(last_pid, at)| last_pid == pid && at.elapsed() < BLOCKER_LOG_EVERY);
    if named_lately {
        return;
    }
    log.last = Some((pid, Instant::now()));
    warn!(
        pid,
        database = database.as_deref().unwrap_or("?"),
        user = user.as_deref().unwrap_or("?"),
        application = application.as_deref().unwrap_or(""),
        state = state.as_deref().unwrap_or("?"),
        age_seconds = age.round(),
        "a transaction holds the server's xmin back: rows committed after it started wait \
         until it ends (xmin mode; --mode logical does not wait for it, \
         idle_in_transaction_session_timeout bounds idle ones)"
    );
}

/// logical mode: sets `outbox_relay_slot_retained_wal_bytes`.
pub(crate) async fn report_slot(source: &LogicalSource) {
    match source.slot_state().await {
        Ok(Some(state)) => {
            gauge!(m::SLOT_RETAINED_WAL).set(state.retained_bytes.unwrap_or(0).max(0) as f64);
            if state.wal_status.as_deref() == Some("unreserved") {
                warn!(
                    slot = source.slot(),
                    retained_bytes = state.retained_bytes,
                    "the replication slot retains more WAL than max_wal_size and will be \
                     invalidated at max_slot_wal_keep_size: the relay is behind"
                );
            }
        }
        Ok(None) => {}
        Err(error) => debug!(%error, "cannot read the replication slot's state"),
    }
}
