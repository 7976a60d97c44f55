//! Metric names (Prometheus, via the `metrics` facade).

pub const RPC_SECONDS: &str = "eos_dedup_rpc_duration_seconds";
pub const RPC_ERRORS: &str = "eos_dedup_rpc_errors_total";
pub const BEGIN_OUTCOMES: &str = "eos_dedup_begin_outcomes_total";
pub const REPORTS: &str = "eos_dedup_reports_total";
pub const CONFLICTS: &str = "eos_dedup_fingerprint_conflicts_total";
pub const UNKNOWN_BACKLOG: &str = "eos_dedup_unknown_backlog";
pub const UNKNOWN_ARRIVALS: &str = "eos_dedup_unknown_arrivals_total";
pub const UNKNOWN_RESOLVED: &str = "eos_dedup_unknown_resolved_total";
pub const ARRIVAL_RATE: &str = "eos_dedup_unknown_arrival_rate";
pub const RECONCILE_RATE: &str = "eos_dedup_unknown_reconcile_rate";
pub const BACKLOG_UNSTABLE: &str = "eos_dedup_unknown_backlog_unstable";
pub const RECONCILE_ERRORS: &str = "eos_dedup_reconcile_errors_total";
pub const RECONCILE_STUCK: &str = "eos_dedup_reconcile_stuck_total";
pub const LEASES_EXPIRED: &str = "eos_dedup_leases_expired_total";
pub const PURGED: &str = "eos_dedup_purged_intents_total";
pub const AUTH_REFUSED: &str = "eos_dedup_auth_refused_total";

pub fn describe() {
    metrics::describe_histogram!(RPC_SECONDS, "gRPC handling time by method");
    metrics::describe_counter!(
        RPC_ERRORS,
        "gRPC calls answered with an error, by method and code"
    );
    metrics::describe_counter!(BEGIN_OUTCOMES, "Begin answers by outcome");
    metrics::describe_counter!(REPORTS, "Complete / Fail / MarkUnknown by transition");
    metrics::describe_counter!(
        CONFLICTS,
        "Begins with a known operation id and another fingerprint (a broken caller contract)"
    );
    metrics::describe_gauge!(UNKNOWN_BACKLOG, "intents in state UNKNOWN (all instances)");
    metrics::describe_counter!(
        UNKNOWN_ARRIVALS,
        "intents this instance moved into UNKNOWN (MarkUnknown or an expired lease)"
    );
    metrics::describe_counter!(
        UNKNOWN_RESOLVED,
        "UNKNOWN intents this instance's reconciler resolved, by outcome"
    );
    metrics::describe_gauge!(
        ARRIVAL_RATE,
        "u: transitions into UNKNOWN per second over the rate window (all instances)"
    );
    metrics::describe_gauge!(
        RECONCILE_RATE,
        "r: transitions out of UNKNOWN per second over the rate window (all instances)"
    );
    metrics::describe_gauge!(
        BACKLOG_UNSTABLE,
        "1 while the UNKNOWN backlog is non-empty and r <= u (it is not draining)"
    );
    metrics::describe_counter!(RECONCILE_ERRORS, "provider look-ups that failed");
    metrics::describe_counter!(
        RECONCILE_STUCK,
        "UNKNOWN intents the reconciler cannot settle (the provider may have forgotten the key)"
    );
    metrics::describe_counter!(LEASES_EXPIRED, "leases that ran out without an outcome");
    metrics::describe_counter!(PURGED, "settled intents deleted past retention");
    metrics::describe_counter!(
        AUTH_REFUSED,
        "gRPC calls refused before any handler ran, by reason (missing_token, unknown_token)"
    );
}
