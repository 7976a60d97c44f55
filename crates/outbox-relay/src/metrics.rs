//! Metric names (Prometheus, via the `metrics` facade). Labels: `outcome` on transactions.

pub const RECORDS_PUBLISHED: &str = "outbox_relay_records_published_total";
pub const TRANSACTIONS: &str = "outbox_relay_transactions_total";
pub const ENQUEUE_TO_PUBLISH_SECONDS: &str = "outbox_relay_enqueue_to_publish_seconds";
pub const PURGED_ROWS: &str = "outbox_relay_purged_rows_total";
pub const POSITION: &str = "outbox_relay_position";
pub const OLDEST_UNPUBLISHED_AGE: &str = "eos_outbox_oldest_unpublished_age_seconds";

pub fn describe() {
    // Starts at 0, so a dashboard's rate() sees "none" before the first purge.
    metrics::counter!(PURGED_ROWS).absolute(0);
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
         none), by PostgreSQL's clock; grows while a long transaction holds the read order back"
    );
}
