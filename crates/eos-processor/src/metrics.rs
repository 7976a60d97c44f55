//! Metric names (Prometheus, via the `metrics` facade). Labels: `reason` on dead letters,
//! `outcome` on transactions, `mode` on restores, `partition` on the consumer lag.

pub(crate) const RECORDS_IN: &str = "eos_processor_records_in_total";
pub(crate) const RECORDS_OUT: &str = "eos_processor_records_out_total";
pub(crate) const DUPLICATES_DROPPED: &str = "eos_processor_duplicates_dropped_total";
pub(crate) const DEAD_LETTERS: &str = "eos_processor_dead_letters_total";
pub(crate) const TRANSACTIONS: &str = "eos_processor_transactions_total";
pub(crate) const TRANSACTION_SECONDS: &str = "eos_processor_transaction_duration_seconds";
pub(crate) const RESTORE_SECONDS: &str = "eos_processor_state_restore_seconds";
pub(crate) const RESTORED_RECORDS: &str = "eos_processor_state_restored_records_total";
pub(crate) const ASSIGNED_PARTITIONS: &str = "eos_processor_assigned_partitions";
pub(crate) const CONSUMER_LAG: &str = "eos_processor_consumer_lag";
pub(crate) const TRANSFORM_MODULE_INFO: &str = "eos_processor_transform_module_info";

pub(crate) fn describe() {
    // Counters of rare events start at 0, so a dashboard's or an alert's rate() sees "none"
    // rather than no series before this process's first (docs/OBSERVABILITY.md).
    for reason in eos_core::DeadLetterReason::ALL {
        metrics::counter!(DEAD_LETTERS, "reason" => reason.as_str()).absolute(0);
    }
    for outcome in ["committed", "aborted", "recovered"] {
        metrics::counter!(TRANSACTIONS, "outcome" => outcome).absolute(0);
    }
    metrics::describe_counter!(RECORDS_IN, "input records read and decided");
    metrics::describe_counter!(RECORDS_OUT, "output records committed");
    metrics::describe_counter!(
        DUPLICATES_DROPPED,
        "duplicate deliveries dropped (same event_id, same fingerprint)"
    );
    metrics::describe_counter!(
        DEAD_LETTERS,
        "records committed to the dead-letter topic, by reason"
    );
    metrics::describe_counter!(
        TRANSACTIONS,
        "batches by outcome: committed, aborted, recovered"
    );
    metrics::describe_histogram!(
        TRANSACTION_SECONDS,
        "time from the first write of a batch to its commit"
    );
    metrics::describe_histogram!(
        RESTORE_SECONDS,
        "time to bring one partition's state up to the changelog's end, by mode (warm: from the \
         local checkpoint; cold: from the changelog's start)"
    );
    metrics::describe_counter!(
        RESTORED_RECORDS,
        "changelog records read by restores, by mode (warm, cold)"
    );
    metrics::describe_gauge!(ASSIGNED_PARTITIONS, "input partitions currently owned");
    metrics::describe_gauge!(
        TRANSFORM_MODULE_INFO,
        "1, labelled with the digest of the WebAssembly module the transform runs (absent for a \
         transform compiled into the binary)"
    );
    metrics::describe_gauge!(
        CONSUMER_LAG,
        "records between the consumer's position and the partition's last stable offset, by \
         owned partition (0 once a partition is revoked)"
    );
}
