//! Metric names (Prometheus, via the `metrics` facade). Labels: `target` on row outcomes, `reason`
//! on dead letters, `outcome` on batches, `partition` on the checkpoint lag.

pub(crate) const RECORDS_IN: &str = "eos_sink_records_in_total";
pub(crate) const ROWS_WRITTEN: &str = "eos_sink_rows_written_total";
pub(crate) const DUPLICATES: &str = "eos_sink_duplicates_ignored_total";
pub(crate) const CONFLICTS: &str = "eos_sink_conflicts_total";
pub(crate) const STALE_VERSIONS: &str = "eos_sink_stale_versions_total";
pub(crate) const SKIPPED: &str = "eos_sink_rows_skipped_total";
pub(crate) const DEAD_LETTERS: &str = "eos_sink_dead_letters_total";
pub(crate) const BATCHES: &str = "eos_sink_batches_total";
pub(crate) const BATCH_SECONDS: &str = "eos_sink_batch_duration_seconds";
pub(crate) const BATCH_RECORDS: &str = "eos_sink_batch_records";
pub(crate) const CHECKPOINT_LAG: &str = "eos_sink_checkpoint_lag";
pub(crate) const DB_RETRIES: &str = "eos_sink_db_retries_total";
pub(crate) const FENCES: &str = "eos_sink_fences_total";
pub(crate) const ASSIGNED_PARTITIONS: &str = "eos_sink_assigned_partitions";
pub(crate) const ROWS_PURGED: &str = "eos_sink_rows_purged_total";
pub(crate) const PROVIDER_BEGINS: &str = "eos_sink_provider_begins_total";
pub(crate) const PROVIDER_CALLS: &str = "eos_sink_provider_calls_total";
pub(crate) const PROVIDER_EFFECTS: &str = "eos_sink_provider_effects_total";
/// [`PROVIDER_EFFECTS`]'s outcomes, every one registered at 0 for each target (the provider
/// target's `Settled` labels, and `duplicate`: an event settled twice in one batch).
pub(crate) const PROVIDER_EFFECT_OUTCOMES: [&str; 7] = [
    "charged",
    "already_charged",
    "rejected",
    "conflict",
    "expired",
    "held",
    "duplicate",
];
pub(crate) const PROVIDER_UNSETTLED: &str = "eos_sink_provider_unsettled_batches_total";
pub(crate) const PROVIDER_PACED_CALLS: &str = "eos_sink_provider_paced_calls_total";
pub(crate) const PROVIDER_PAUSES: &str = "eos_sink_provider_pauses_total";
pub(crate) const HELD_OPERATIONS: &str = "eos_sink_held_operations_total";
pub(crate) const HELD_UNRESOLVED: &str = "eos_sink_held_operations_unresolved";

pub(crate) fn describe() {
    // Counters of rare events start at 0, so a dashboard or an alert's rate() sees "none" rather
    // than no series (docs/OBSERVABILITY.md).
    metrics::counter!(DB_RETRIES).absolute(0);
    for outcome in ["committed", "rolled_back", "fenced", "isolated"] {
        metrics::counter!(BATCHES, "outcome" => outcome).absolute(0);
    }
    for reason in eos_core::DeadLetterReason::ALL {
        metrics::counter!(DEAD_LETTERS, "reason" => reason.as_str()).absolute(0);
    }
    metrics::describe_counter!(
        PROVIDER_BEGINS,
        "dedup-service Begin answers for provider targets, by target and answer (acquired, \
         succeeded, unknown, stuck, in_progress, failed, conflict, expired)"
    );
    metrics::describe_counter!(
        PROVIDER_CALLS,
        "provider calls (only after ACQUIRED), by target and outcome: applied, rejected, ambiguous"
    );
    metrics::describe_counter!(
        PROVIDER_EFFECTS,
        "events settled at a provider target, by outcome: charged (by this sink now), \
         already_charged (a replay: duplicate suppressed), rejected, conflict, expired, held"
    );
    metrics::describe_counter!(
        PROVIDER_UNSETTLED,
        "batches given up (and retried from the checkpoint) because an operation was not final \
         after settle_timeout"
    );
    metrics::describe_counter!(
        PROVIDER_PACED_CALLS,
        "provider calls held back by the target's rate_limit or a Retry-After pause, by target"
    );
    metrics::describe_counter!(
        PROVIDER_PAUSES,
        "answers whose Retry-After paused the target's calls, by target"
    );
    metrics::describe_counter!(
        HELD_OPERATIONS,
        "events held (not charged, not recorded as charged) because their provider operation is \
         UNKNOWN and older than the provider's key retention, by target; each needs an \
         operator's `eosctl held resolve` (alert on any increase)"
    );
    metrics::describe_gauge!(
        HELD_UNRESOLVED,
        "held events of this sink not resolved yet (sink_held_operations), by target; read at \
         start-up, after a batch that held one and every --held-refresh-interval (alert while \
         above 0)"
    );
    metrics::describe_counter!(RECORDS_IN, "input records committed (any outcome)");
    metrics::describe_counter!(
        ROWS_WRITTEN,
        "rows inserted (append) or applied over a lower version (versioned), by target"
    );
    metrics::describe_counter!(
        DUPLICATES,
        "rows ignored because the same content is already stored, by target"
    );
    metrics::describe_counter!(
        CONFLICTS,
        "same key with other content, recorded in sink_conflicts, by target"
    );
    metrics::describe_counter!(
        STALE_VERSIONS,
        "versioned rows not applied because a version at least as high is stored, by target"
    );
    metrics::describe_counter!(
        SKIPPED,
        "records that do not apply to a versioned target (no version), by target"
    );
    metrics::describe_counter!(
        DEAD_LETTERS,
        "records sent to the dead-letter topic, by reason"
    );
    metrics::describe_counter!(
        BATCHES,
        "batches by outcome: committed, rolled_back, fenced, isolated"
    );
    metrics::describe_histogram!(
        BATCH_SECONDS,
        "time from the start of a batch's database transaction to its commit"
    );
    metrics::describe_histogram!(BATCH_RECORDS, "records per committed batch");
    metrics::describe_gauge!(
        CHECKPOINT_LAG,
        "records between the committed checkpoint and the partition's end, by partition"
    );
    metrics::describe_counter!(
        DB_RETRIES,
        "attempts that failed because PostgreSQL was unavailable"
    );
    metrics::describe_counter!(FENCES, "partitions fenced (owner epoch bumped)");
    metrics::describe_gauge!(ASSIGNED_PARTITIONS, "input partitions currently owned");
    metrics::describe_counter!(
        ROWS_PURGED,
        "rows deleted by the retention purge, by target"
    );
}

/// Starts the per-target counters of rare events at 0: purges of the tables with a retention,
/// and the provider targets' held operations, unsettled batches and effects by outcome.
pub(crate) fn register_targets<'a>(
    purged_tables: impl IntoIterator<Item = &'a str>,
    providers: impl IntoIterator<Item = &'a str>,
) {
    for table in purged_tables {
        metrics::counter!(ROWS_PURGED, "target" => table.to_owned()).absolute(0);
    }
    for provider in providers {
        metrics::counter!(HELD_OPERATIONS, "target" => provider.to_owned()).absolute(0);
        metrics::counter!(PROVIDER_UNSETTLED, "target" => provider.to_owned()).absolute(0);
        metrics::counter!(PROVIDER_PACED_CALLS, "target" => provider.to_owned()).absolute(0);
        metrics::counter!(PROVIDER_PAUSES, "target" => provider.to_owned()).absolute(0);
        for outcome in PROVIDER_EFFECT_OUTCOMES {
            metrics::counter!(PROVIDER_EFFECTS, "target" => provider.to_owned(), "outcome" => outcome)
                .absolute(0);
        }
    }
}
