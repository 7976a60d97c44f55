//! The gauges that need a query of their own, measured every `AGE_INTERVAL` by a task beside the
//! relay loop, so they go on moving while the loop is stuck (docs/OBSERVABILITY.md "Liveness"):
//! the age of the oldest unpublished row, and what holds the server's xmin back (xmin mode) or
//! the WAL the slot keeps (logical mode).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use metrics::gauge;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::logical::LogicalSource;
use crate::metrics as m;
use crate::position_topic::RelayPosition;
use crate::server_watch;

/// How often the gauges are measured.
const AGE_INTERVAL: Duration = Duration::from_secs(5);
/// Logical mode, before this relay published its first row: how often to look whether it has.
/// Until then the oldest row not in Kafka is unknown, and a relay restarted into a backlog (the
/// moment the gauge matters most) should show it within a second of its first batch, not five.
const FIRST_AGE_INTERVAL: Duration = Duration::from_millis(500);
/// How many rows at the head of the xmin read order the age looks at.
const AGE_HEAD_ROWS: i64 = 1000;

/// What the loop has published, as the gauges need it.
#[derive(Debug, Default)]
pub(crate) struct Published {
    /// The relay's position (xmin mode: every row up to it is published).
    pub position: Option<RelayPosition>,
    /// Logical mode: the highest outbox position of a published row (or one below the first
    /// row read, before anything is published). Rows above it are not in Kafka.
    pub highest_position: Option<i64>,
}

pub(crate) type SharedPublished = Arc<Mutex<Published>>;

/// Measures until `shutdown` is cancelled.
pub(crate) async fn run(
    pool: PgPool,
    logical: Option<LogicalSource>,
    published: SharedPublished,
    shutdown: CancellationToken,
) {
    let mut blocker_log = server_watch::BlockerLog::default();
    loop {
        let now_published = published.lock().map(|p| (p.position, p.highest_position));
        let (position, highest) = now_published.unwrap_or((None, None));
        match &logical {
            None => {
                if let Some(RelayPosition::Xmin(cursor)) = position {
                    report_xmin_age(&pool, cursor).await;
                }
                server_watch::report_xmin_blocker(&pool, &mut blocker_log).await;
            }
            Some(source) => {
                if let Some(highest) = highest {
                    report_logical_age(&pool, highest).await;
                }
                server_watch::report_slot(source).await;
            }
        }
        let interval = match (&logical, highest) {
            (Some(_), None) => FIRST_AGE_INTERVAL,
            _ => AGE_INTERVAL,
        };
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(interval) => {}
        }
    }
}

/// xmin mode: the oldest committed row after the cursor, whether or not the read order may
/// return it yet. A long transaction anywhere on the server holds the read order back
/// (docs/architecture/outbox.md) while the rows committed after it wait; the batches alone
/// would not show them. Only the next `AGE_HEAD_ROWS` rows in read order are looked at, so a
/// large backlog costs no more: the order follows transaction ids, so the rows further back are
/// younger but for rare ones.
async fn report_xmin_age(pool: &PgPool, cursor: eos_outbox::OutboxCursor) {
    let age = sqlx::query_scalar!(
        r#"SELECT EXTRACT(EPOCH FROM now() - min(enqueued_at))::FLOAT8 AS "age"
                 FROM (SELECT enqueued_at FROM eos_outbox
                        WHERE (order_xid, position) > ($1, $2)
                        ORDER BY order_xid, position
                        LIMIT $3) AS head"#,
        cursor.order_xid,
        cursor.position,
        AGE_HEAD_ROWS,
    )
    .fetch_one(pool)
    .await;
    set_age(age.map(|age| age.unwrap_or(0.0)));
}

/// Logical mode: the oldest row above the highest position published. Positions are taken at
/// insert, so such a row is not in Kafka whatever the commit order; the lowest of them is the
/// oldest but for rare ones. A row below it whose transaction commits late is not counted, so
/// the gauge may read a little young, never old: it does not fire for rows already published,
/// and it grows for as long as rows wait and nothing is published.
async fn report_logical_age(pool: &PgPool, highest: i64) {
    let age = sqlx::query_scalar::<_, Option<f64>>(
        "SELECT EXTRACT(EPOCH FROM now() - enqueued_at)::FLOAT8 FROM eos_outbox
          WHERE position > $1 ORDER BY position LIMIT 1",
    )
    .bind(highest)
    .fetch_optional(pool)
    .await;
    set_age(age.map(|age| age.flatten().unwrap_or(0.0)));
}

fn set_age(age: Result<f64, sqlx::Error>) {
    match age {
        Ok(age) => gauge!(m::OLDEST_UNPUBLISHED_AGE).set(age.max(0.0)),
        // The loop's next read fails the same way and says so.
        Err(error) => tracing::debug!(%error, "cannot measure the oldest unpublished row"),
    }
}
