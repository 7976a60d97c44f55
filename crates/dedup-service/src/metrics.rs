//! Metric names (Prometheus, via the `metrics` facade).

use crate::retention::RetentionPolicy;

pub(crate) const RPC_SECONDS: &str = "eos_dedup_rpc_duration_seconds";
pub(crate) const RPC_ERRORS: &str = "eos_dedup_rpc_errors_total";
pub(crate) const BEGIN_OUTCOMES: &str = "eos_dedup_begin_outcomes_total";
pub(crate) const REPORTS: &str = "eos_dedup_reports_total";
pub(crate) const CONFLICTS: &str = "eos_dedup_fingerprint_conflicts_total";
pub(crate) const UNKNOWN_BACKLOG: &str = "eos_dedup_unknown_backlog";
pub(crate) const UNKNOWN_ARRIVALS: &str = "eos_dedup_unknown_arrivals_total";
pub(crate) const UNKNOWN_RESOLVED: &str = "eos_dedup_unknown_resolved_total";
pub(crate) const ARRIVAL_RATE: &str = "eos_dedup_unknown_arrival_rate";
pub(crate) const RECONCILE_RATE: &str = "eos_dedup_unknown_reconcile_rate";
pub(crate) const BACKLOG_UNSTABLE: &str = "eos_dedup_unknown_backlog_unstable";
pub(crate) const RECONCILE_ERRORS: &str = "eos_dedup_reconcile_errors_total";
pub(crate) const RECONCILE_STUCK: &str = "eos_dedup_reconcile_stuck_total";
pub(crate) const LEASES_EXPIRED: &str = "eos_dedup_leases_expired_total";
pub(crate) const PURGED: &str = "eos_dedup_purged_intents_total";
pub(crate) const AUTH_REFUSED: &str = "eos_dedup_auth_refused_total";
pub(crate) const CONNECTIONS_DROPPED: &str = "eos_dedup_connections_dropped_total";
/// [`AUTH_REFUSED`]'s reasons, every one registered at 0 (auth's `Refusal` labels).
pub(crate) const AUTH_REFUSAL_REASONS: [&str; 2] = ["missing_token", "unknown_token"];
/// [`CONNECTIONS_DROPPED`]'s reasons, every one registered at 0 (grpc_connections'
/// `DropReason` labels).
pub(crate) const CONNECTION_DROP_REASONS: [&str; 3] =
    ["connection_cap", "handshake_timeout", "idle_timeout"];
pub(crate) const RETENTION_SECONDS: &str = "eos_dedup_retention_seconds";
pub(crate) const REPLAY_HORIZON_SECONDS: &str = "eos_dedup_replay_horizon_seconds";
pub(crate) const GROUP_COMMIT_CALLS: &str = "eos_dedup_group_commit_calls";

pub(crate) fn describe() {
    // Counters of rare events start at 0, so a dashboard or an alert's rate() sees "none" rather
    // than no series (docs/OBSERVABILITY.md).
    for counter in [
        RECONCILE_ERRORS,
        RECONCILE_STUCK,
        PURGED,
        CONFLICTS,
        LEASES_EXPIRED,
        UNKNOWN_ARRIVALS,
    ] {
        metrics::counter!(counter).absolute(0);
    }
    for reason in AUTH_REFUSAL_REASONS {
        metrics::counter!(AUTH_REFUSED, "reason" => reason).absolute(0);
    }
    for reason in CONNECTION_DROP_REASONS {
        metrics::counter!(CONNECTIONS_DROPPED, "reason" => reason).absolute(0);
    }
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
    metrics::describe_counter!(
        CONNECTIONS_DROPPED,
        "gRPC connections closed by the server on its own, by reason: connection_cap (accepted \
         past --max-connections), handshake_timeout (no HTTP/2 preface and SETTINGS, or no TLS \
         handshake, within --handshake-timeout), idle_timeout (no call in flight for \
         --idle-timeout)"
    );
    metrics::describe_histogram!(
        GROUP_COMMIT_CALLS,
        "single calls per group commit (one statement, one commit), by method (Begin, Complete)"
    );
    metrics::describe_gauge!(
        RETENTION_SECONDS,
        "--retention: how long this instance keeps settled intents before its purge deletes them"
    );
    metrics::describe_gauge!(
        REPLAY_HORIZON_SECONDS,
        "max(--client-retry-horizon, --broker-replay-retention, --restore-horizon): how long an \
         operation can still come back"
    );
}

/// The two figures of the retention check, exported so that an alert can compare them across
/// instances: each instance checks only its own at start-up, and during a rolling change one
/// instance can purge by an old, shorter retention while another's horizon is already longer
/// (docs/architecture/retention.md, "Retention and the replay horizon").
pub(crate) fn record_retention(policy: &RetentionPolicy) {
    metrics::gauge!(RETENTION_SECONDS).set(policy.retention.as_secs_f64());
    metrics::gauge!(REPLAY_HORIZON_SECONDS).set(policy.replay_horizon().as_secs_f64());
}
