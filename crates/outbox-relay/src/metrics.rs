//! Metric names (Prometheus, via the `metrics` facade). Labels: `outcome` on transactions.

pub const RECORDS_PUBLISHED: &str = "outbox_relay_records_published_total";
pub const TRANSACTIONS: &str = "outbox_relay_transactions_total";
pub const ENQUEUE_TO_PUBLISH_SECONDS: &str = "outbox_relay_enqueue_to_publish_seconds";
pub const PURGED_ROWS: &str = "outbox_relay_purged_rows_total";
pub const POSITION: &str = "outbox_relay_position";
pub const OLDEST_UNPUBLISHED_AGE: &str = "eos_outbox_oldest_unpublished_age_seconds";
pub const POSITION_LSN: &str = "outbox_relay_position_lsn";
pub const SLOT_RETAINED_WAL: &str = "outbox_relay_slot_retained_wal_bytes";
pub const XMIN_BLOCKER_AGE: &str = "outbox_relay_xmin_blocker_age_seconds";

pub fn describe() {
    // Counters start at 0, so a dashboard's or an alert's rate() sees "none" rather than no
    // series before the first purge, abort or batch of this process (docs/OBSERVABILITY.md).
    metrics::counter!(PURGED_ROWS).absolute(0);
    metrics::counter!(RECORDS_PUBLISHED).absolute(0);
    for outcome in ["committed", "aborted", "recovered"] {
        metrics::counter!(TRANSACTIONS, "outcome" => outcome).absolute(0);
    }
    metrics::describe_counter!(
        RECORDS_PUBLISHED,
        "outbox rows published (committed in exactly-once mode, acknowledged in at-least-once)"
    );
    metrics::describe_counter!(
        TRANSACTIONS,
        "batches by outcome: committed, aborted, recovered"
    );
    metrics::describe_histogram!(
        ENQUEUE_TO_PUBLISH_SECONDS,
        "time from a row's enqueue to its batch's commit in Kafka"
    );
    metrics::describe_counter!(PURGED_ROWS, "published rows purged after the retention");
    metrics::describe_gauge!(POSITION, "the outbox position of the last published row");
    metrics::describe_gauge!(
        OLDEST_UNPUBLISHED_AGE,
        "age of the oldest committed outbox row after the relay's position (0 when there is \
         none), by PostgreSQL's clock; grows while a long transaction holds the read order back \
         (xmin mode) or while what a read found is not published (logical mode)"
    );
    metrics::describe_gauge!(
        POSITION_LSN,
        "logical mode: the WAL position committed with the last batch, in bytes"
    );
    metrics::describe_gauge!(
        SLOT_RETAINED_WAL,
        "logical mode: WAL the replication slot keeps from being removed (the current WAL \
         position minus the slot's restart_lsn), in bytes"
    );
    metrics::describe_gauge!(
        XMIN_BLOCKER_AGE,
        "xmin mode: age of the oldest transaction with a transaction id on the server, which \
         every row committed after it started waits for (0 when none)"
    );
}
