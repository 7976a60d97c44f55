//! The reconciler: turns expired leases UNKNOWN, settles UNKNOWN intents by each target's
//! strategy (asking the provider with the same idempotency key, letting the caller send the same
//! request again, or holding it for an operator), and reports the backlog. The backlog is stable only
//! when the reconcile rate r exceeds the arrival rate u, so both are exported and a warning is
//! logged while the backlog is non-empty and r <= u.

use std::sync::Arc;
use std::time::{Duration, Instant};

use eos_runtime::progress_watch::ProgressWatch;
use eos_runtime::trace_context::{context_from_stored, event_id_in};
use futures::StreamExt as _;
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use crate::intent_store::{BacklogCounts, IntentStore};
use crate::lookups::{LookupFuture, Lookups};
use crate::metrics;
pub use crate::target_policies::{ReconcileStrategy, TargetPolicies, target_of};
use crate::validation::Resolution;
use dedup_client::provider_client::{ChargeLookup, ProviderClient};
use dedup_client::state_machine::{Intent, IntentState};

/// UNKNOWN intents read per page.
const PAGE: u32 = 500;
/// Leases expired per statement.
const SWEEP_BATCH: i64 = 1000;
/// At most one "backlog not draining" warning per this long.
const WARN_EVERY: Duration = Duration::from_secs(15);

/// The reconciler's flags (`--reconcile-interval` and the others named below).
#[derive(Debug, Clone, Copy)]
pub struct ReconcilerSettings {
    /// `--reconcile-interval`: the pause between passes.
    pub interval: Duration,
    /// `--reconcile-concurrency`: provider look-ups in flight at once.
    pub concurrency: usize,
    /// `--in-flight-window`: how long after an attempt's lease ends a request may still reach
    /// the provider; only after it does "no record" settle an UNKNOWN as a retryable failure.
    pub in_flight_window: Duration,
    /// `--provider-key-ttl`: how long the provider remembers a key; past it, "no record"
    /// proves nothing.
    pub provider_key_ttl: Duration,
    /// `--rate-window`: the window of the arrival and reconcile rates.
    pub rate_window: Duration,
}

/// What to do with one UNKNOWN intent after asking the provider.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// The provider has the charge: SUCCEEDED with its record.
    Succeeded {
        /// The provider's record of the charge.
        result: Vec<u8>,
        /// What the provider was asked and answered, for the intent's history.
        evidence: String,
    },
    /// No record although every request of the attempt must have landed by now: a retryable
    /// FAILED, so a later Begin may acquire again (same key, so even then no double charge).
    FailedRetryable {
        /// Why "no record" is evidence here, for the intent's history.
        evidence: String,
    },
    /// No record yet, but a request may still be in flight: ask again later.
    Wait,
    /// The provider has the request and refused it for good: FAILED, not retryable, so the
    /// caller dead-letters the event.
    Failed {
        /// What the provider answered, for the intent's history.
        evidence: String,
    },
    /// No record, but the provider may have forgotten the key: "no record" proves nothing.
    /// Leave it UNKNOWN for an operator.
    Stuck {
        /// Why "no record" is not evidence, for the operator.
        reason: String,
    },
}

/// Decides from the provider's answer. Pure.
pub fn decide(
    intent: &Intent,
    lookup: &ChargeLookup,
    now: OffsetDateTime,
    settings: &ReconcilerSettings,
) -> Decision {
    match lookup {
        ChargeLookup::Found(record) => {
            return Decision::Succeeded {
                result: record.clone(),
                evidence: format!("provider has a charge for key {:?}", intent.operation_id),
            };
        }
        ChargeLookup::Failed(answer) => {
            return Decision::Failed {
                evidence: format!(
                    "provider refused key {:?} for good: {answer}",
                    intent.operation_id
                ),
            };
        }
        // It has the request: it settles it, however long that takes.
        ChargeLookup::Pending => return Decision::Wait,
        ChargeLookup::NotFound => {}
    }
    // A request of this attempt can be sent until its lease ends (or until the holder gave up,
    // if that was later), and applied up to the in-flight window after that.
    let attempt_end = intent.lease_expires_at.max(intent.updated_at);
    let settled_after = attempt_end + settings.in_flight_window;
    let forgotten_after = intent.acquired_at + settings.provider_key_ttl;
    if now >= forgotten_after {
        return Decision::Stuck {
            reason: format!(
                "attempt acquired at {} is older than the provider's key TTL; its \"no record\" \
                 is not evidence",
                intent.acquired_at
            ),
        };
    }
    if now < settled_after {
        return Decision::Wait;
    }
    Decision::FailedRetryable {
        evidence: format!(
            "provider has no charge for key {:?} {}s after the attempt ended",
            intent.operation_id,
            (now - attempt_end).whole_seconds()
        ),
    }
}

/// Decides for a target that is not asked (`replay`, `none`). Pure.
pub fn decide_without_lookup(
    intent: &Intent,
    strategy: ReconcileStrategy,
    now: OffsetDateTime,
    settings: &ReconcilerSettings,
) -> Decision {
    let attempt_end = intent.lease_expires_at.max(intent.updated_at);
    match strategy {
        ReconcileStrategy::Lookup | ReconcileStrategy::None => Decision::Stuck {
            reason: "the target's reconcile strategy is none: an operator resolves it".into(),
        },
        ReconcileStrategy::Replay if now >= intent.acquired_at + settings.provider_key_ttl => {
            Decision::Stuck {
                reason: format!(
                    "attempt acquired at {} is older than the API's key TTL: a replay could \
                     apply it a second time",
                    intent.acquired_at
                ),
            }
        }
        // A request of this attempt may still be on its way: a replay now could race it.
        ReconcileStrategy::Replay if now < attempt_end + settings.in_flight_window => {
            Decision::Wait
        }
        ReconcileStrategy::Replay => Decision::FailedRetryable {
            evidence: format!(
                "reconcile strategy replay: the next attempt sends the same request with key \
                 {:?}, which the API answers with its first result; the attempt ended {}s ago",
                intent.operation_id,
                (now - attempt_end).whole_seconds()
            ),
        },
    }
}

/// u and r over the window, and whether the backlog is draining.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct BacklogRates {
    pub(crate) backlog: i64,
    /// Arrivals into UNKNOWN per second.
    pub(crate) arrival_rate: f64,
    /// Departures from UNKNOWN per second.
    pub(crate) reconcile_rate: f64,
}

impl BacklogRates {
    pub(crate) fn from_counts(counts: BacklogCounts, window: Duration) -> Self {
        let seconds = window.as_secs_f64().max(f64::EPSILON);
        Self {
            backlog: counts.backlog,
            arrival_rate: counts.arrivals as f64 / seconds,
            reconcile_rate: counts.cleared as f64 / seconds,
        }
    }

    /// Stable only when r > u (docs/architecture/retention.md "Retention and the replay horizon").
    /// A non-empty backlog with r <= u is not draining.
    pub(crate) fn is_unstable(&self) -> bool {
        self.backlog > 0 && self.reconcile_rate <= self.arrival_rate
    }
}

/// Runs passes every `settings.interval` until `shutdown`.
/// A pass that never ends (a look-up or a statement that does not return) is a stall of the
/// progress watch (docs/OBSERVABILITY.md "Liveness"); a backlog that passes do not clear is
/// `EosDedupUnknownBacklogGrowing`'s.
pub(crate) async fn run(
    store: IntentStore,
    (asked, progress): (Asked, Arc<ProgressWatch>),
    settings: ReconcilerSettings,
    shutdown: CancellationToken,
) {
    let mut last_warning: Option<Instant> = None;
    loop {
        progress.working("a reconcile pass to end");
        let pass = async {
            sweep_leases(&store).await;
            reconcile_unknown(&store, &asked, &settings, &shutdown).await;
            report_backlog(&store, &settings, &mut last_warning).await;
        };
        pass.instrument(tracing::debug_span!("reconcile_pass"))
            .await;
        progress.idle();
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(settings.interval) => {}
        }
    }
}

async fn sweep_leases(store: &IntentStore) {
    loop {
        match store.expire_leases(SWEEP_BATCH).await {
            Ok(ids) => {
                let count = ids.len();
                if count > 0 {
                    ::metrics::counter!(metrics::LEASES_EXPIRED).increment(count as u64);
                    ::metrics::counter!(metrics::UNKNOWN_ARRIVALS).increment(count as u64);
                    tracing::warn!(
                        count,
                        first = %ids[0],
                        "leases ran out without an outcome; intents are UNKNOWN"
                    );
                }
                if (count as i64) < SWEEP_BATCH {
                    return;
                }
            }
            Err(error) => {
                tracing::warn!(%error, "lease sweep failed");
                return;
            }
        }
    }
}

/// Who is asked about an UNKNOWN intent, and each target's policy, as built at start-up: a
/// `lookup` target asks its own look-up (`--lookups`), else the provider (when there is one).
#[derive(Debug)]
pub(crate) struct Asked {
    pub(crate) provider: Option<ProviderClient>,
    pub(crate) lookups: Lookups,
    pub(crate) policies: TargetPolicies,
}

async fn reconcile_unknown(
    store: &IntentStore,
    asked: &Asked,
    settings: &ReconcilerSettings,
    shutdown: &CancellationToken,
) {
    let mut after: Option<(OffsetDateTime, String)> = None;
    loop {
        if shutdown.is_cancelled() {
            return;
        }
        let page = match store.list_unknown_page(after.as_ref(), PAGE).await {
            Ok(page) => page,
            Err(error) => {
                tracing::warn!(%error, "cannot list UNKNOWN intents");
                return;
            }
        };
        let Some(last) = page.last() else {
            return;
        };
        after = Some((last.updated_at, last.operation_id.clone()));
        let full = page.len() as u32 == PAGE;
        futures::stream::iter(page)
            .for_each_concurrent(settings.concurrency, |intent| {
                reconcile_one(store, asked, settings, intent)
            })
            .await;
        if !full {
            return;
        }
    }
}

/// The span of one reconciliation. Its parent is the trace context kept with the intent (the Begin
/// that acquired it), so the look-up at the provider and the resolution appear in the trace of
/// the event whose outcome went UNKNOWN, next to the attempt that lost it.
fn reconcile_span(intent: &Intent) -> tracing::Span {
    let span = tracing::info_span!(
        "reconcile",
        otel.name = "dedup-service reconcile",
        operation_id = %intent.operation_id,
        fencing_token = intent.fencing_token,
        event_id = tracing::field::Empty,
    );
    if let Some(stored) = &intent.trace_context {
        let parent = context_from_stored(stored);
        if let Some(event_id) = event_id_in(&parent) {
            span.record("event_id", event_id);
        }
        let _ = span.set_parent(parent);
    }
    span
}

/// Whether an UNKNOWN intent's target is asked about it.
enum Asking<'a> {
    /// A `lookup` target: its look-up, in flight.
    Ask(LookupFuture<'a>),
    /// A `lookup` target with no one to ask (no look-up of its own, no `--provider-url`).
    NoOne,
    /// A `replay` or `none` target: never asked.
    NotAsked,
}

impl Asked {
    /// Asks about `operation_id` as its target's strategy says: its own look-up, else the
    /// provider.
    fn asking<'a>(&'a self, operation_id: &'a str, strategy: ReconcileStrategy) -> Asking<'a> {
        match (strategy, self.lookups.of(operation_id), &self.provider) {
            (ReconcileStrategy::Lookup, Some(lookup), _) => Asking::Ask(lookup.ask(operation_id)),
            (ReconcileStrategy::Lookup, None, Some(provider)) => {
                Asking::Ask(Box::pin(provider.lookup(operation_id)))
            }
            (ReconcileStrategy::Lookup, None, None) => Asking::NoOne,
            (ReconcileStrategy::Replay | ReconcileStrategy::None, _, _) => Asking::NotAsked,
        }
    }
}

/// The reconciler's resolution of `intent`'s attempt (only that attempt: its fencing token).
fn resolution(
    intent: &Intent,
    (outcome, retryable): (IntentState, bool),
    evidence: String,
    result: Vec<u8>,
) -> Resolution {
    Resolution {
        operation_id: intent.operation_id.clone(),
        outcome,
        evidence,
        result,
        retryable,
        expected_fencing_token: Some(intent.fencing_token),
    }
}

async fn reconcile_one(
    store: &IntentStore,
    asked: &Asked,
    settings: &ReconcilerSettings,
    intent: Intent,
) {
    let span = reconcile_span(&intent);
    async {
        let strategy = asked.policies.of(&intent.operation_id);
        let lookup = match asked.asking(&intent.operation_id, strategy) {
            Asking::Ask(asking) => match asking.await {
                Ok(lookup) => Some(lookup),
                Err(error) => {
                    ::metrics::counter!(metrics::RECONCILE_ERRORS).increment(1);
                    // reqwest's message ("error sending request") leaves out whether the
                    // connection was refused, reset or timed out; anyhow's `{:#}` adds the
                    // sources, which say which.
                    let error = format!("{:#}", anyhow::Error::new(error));
                    tracing::warn!(error, "provider look-up failed; will ask again");
                    return;
                }
            },
            // The intent waits for a provider, or for an operator, as it is.
            Asking::NoOne => return,
            Asking::NotAsked => None,
        };
        let now = match store.db_now().await {
            Ok(now) => now,
            Err(error) => {
                tracing::warn!(%error, "cannot read the database clock");
                return;
            }
        };
        let settings = &ReconcilerSettings {
            provider_key_ttl: asked.policies.key_ttl_of(&intent.operation_id),
            ..*settings
        };
        let decision = match &lookup {
            Some(lookup) => decide(&intent, lookup, now, settings),
            None => decide_without_lookup(&intent, strategy, now, settings),
        };
        let resolution = match decision {
            Decision::Wait => return,
            Decision::Stuck { reason } => {
                // Recorded once per attempt, so Begin can tell callers to stop waiting (the sink
                // holds the event); logged and counted only the first time.
                match store
                    .mark_stuck(&intent.operation_id, intent.fencing_token, &reason)
                    .await
                {
                    Ok(true) => {
                        ::metrics::counter!(metrics::RECONCILE_STUCK).increment(1);
                        tracing::error!(%reason, "UNKNOWN intent needs an operator's Resolve");
                    }
                    Ok(false) => {}
                    Err(error) => tracing::warn!(%error, "cannot record a stuck intent"),
                }
                return;
            }
            Decision::Succeeded { result, evidence } => {
                resolution(&intent, (IntentState::Succeeded, false), evidence, result)
            }
            Decision::FailedRetryable { evidence } => {
                resolution(&intent, (IntentState::Failed, true), evidence, Vec::new())
            }
            Decision::Failed { evidence } => {
                resolution(&intent, (IntentState::Failed, false), evidence, Vec::new())
            }
        };
        match store.resolve(&resolution).await {
            Ok(resolved) => {
                let outcome = resolved.state.as_db_str();
                ::metrics::counter!(metrics::UNKNOWN_RESOLVED, "outcome" => outcome).increment(1);
                tracing::info!(
                    outcome,
                    fencing_token = resolved.fencing_token,
                    evidence = %resolution.evidence,
                    "reconciled"
                );
            }
            // The holder reported (or another instance resolved) in the meantime: nothing to do.
            Err(error) => tracing::debug!(%error, "not resolved"),
        }
    }
    .instrument(span)
    .await;
}

async fn report_backlog(
    store: &IntentStore,
    settings: &ReconcilerSettings,
    last_warning: &mut Option<Instant>,
) {
    let counts = match store.backlog_counts(settings.rate_window).await {
        Ok(counts) => counts,
        Err(error) => {
            tracing::warn!(%error, "cannot count the UNKNOWN backlog");
            return;
        }
    };
    let rates = BacklogRates::from_counts(counts, settings.rate_window);
    ::metrics::gauge!(metrics::UNKNOWN_BACKLOG).set(rates.backlog as f64);
    ::metrics::gauge!(metrics::ARRIVAL_RATE).set(rates.arrival_rate);
    ::metrics::gauge!(metrics::RECONCILE_RATE).set(rates.reconcile_rate);
    let unstable = rates.is_unstable();
    ::metrics::gauge!(metrics::BACKLOG_UNSTABLE).set(if unstable { 1.0 } else { 0.0 });
    let due = last_warning.is_none_or(|at| at.elapsed() >= WARN_EVERY);
    if unstable && due {
        *last_warning = Some(Instant::now());
        tracing::warn!(
            backlog = rates.backlog,
            arrival_rate_u = rates.arrival_rate,
            reconcile_rate_r = rates.reconcile_rate,
            window_secs = settings.rate_window.as_secs(),
            "UNKNOWN backlog is not draining: reconcile rate r <= arrival rate u"
        );
    }
}

#[cfg(test)]
mod tests {
    use time::macros::datetime;

    use super::*;

    const SETTINGS: ReconcilerSettings = ReconcilerSettings {
        interval: Duration::from_secs(1),
        concurrency: 4,
        in_flight_window: Duration::from_secs(60),
        provider_key_ttl: Duration::from_secs(24 * 3600),
        rate_window: Duration::from_secs(60),
    };

    fn unknown() -> Intent {
        Intent {
            operation_id: "sink:e-1".into(),
            state: IntentState::Unknown,
            fingerprint: vec![1; 32],
            fencing_token: 2,
            fencing_secret: dedup_client::FencingSecret::random(),
            holder: "w".into(),
            request_id: "r".into(),
            lease_expires_at: datetime!(2026-01-01 0:00:30 UTC),
            acquired_at: datetime!(2026-01-01 0:00 UTC),
            occurred_at: datetime!(2026-01-01 0:00 UTC),
            created_at: datetime!(2026-01-01 0:00 UTC),
            updated_at: datetime!(2026-01-01 0:00:05 UTC),
            result: None,
            failure_reason: None,
            retryable: false,
            detail: String::new(),
            trace_context: None,
        }
    }

    #[test]
    fn a_record_at_the_provider_settles_as_succeeded_at_once() {
        let decision = decide(
            &unknown(),
            &ChargeLookup::Found(b"{}".to_vec()),
            datetime!(2026-01-01 0:00:06 UTC),
            &SETTINGS,
        );
        assert!(matches!(decision, Decision::Succeeded { .. }));
    }

    #[test]
    fn no_record_waits_out_the_in_flight_window_after_the_lease() {
        let intent = unknown();
        // Lease ends 00:30; window 60 s: not before 01:30.
        for (now, expected_wait) in [
            (datetime!(2026-01-01 0:00:10 UTC), true),
            (datetime!(2026-01-01 0:01:29 UTC), true),
            (datetime!(2026-01-01 0:01:30 UTC), false),
        ] {
            let decision = decide(&intent, &ChargeLookup::NotFound, now, &SETTINGS);
            assert_eq!(
                decision == Decision::Wait,
                expected_wait,
                "{now}: {decision:?}"
            );
        }
        let decision = decide(
            &intent,
            &ChargeLookup::NotFound,
            datetime!(2026-01-01 0:05 UTC),
            &SETTINGS,
        );
        assert!(matches!(decision, Decision::FailedRetryable { .. }));
    }

    #[test]
    fn a_late_mark_unknown_extends_the_wait() {
        let mut intent = unknown();
        intent.updated_at = datetime!(2026-01-01 0:02 UTC);
        let decision = decide(
            &intent,
            &ChargeLookup::NotFound,
            datetime!(2026-01-01 0:02:30 UTC),
            &SETTINGS,
        );
        assert_eq!(decision, Decision::Wait);
    }

    #[test]
    fn no_record_after_the_key_ttl_proves_nothing() {
        let decision = decide(
            &unknown(),
            &ChargeLookup::NotFound,
            datetime!(2026-01-02 0:00 UTC),
            &SETTINGS,
        );
        assert!(matches!(decision, Decision::Stuck { .. }));
    }

    #[test]
    fn replay_settles_after_the_in_flight_window_within_the_key_ttl_and_none_holds() {
        let intent = unknown();
        let replay =
            |now| decide_without_lookup(&intent, ReconcileStrategy::Replay, now, &SETTINGS);
        // The lease ended at 0:00:30; the window is 60 s.
        assert_eq!(replay(datetime!(2026-01-01 0:01:29 UTC)), Decision::Wait);
        let Decision::FailedRetryable { evidence } = replay(datetime!(2026-01-01 0:01:31 UTC))
        else {
            panic!("a replay is due");
        };
        assert!(
            evidence.contains("replay") && evidence.contains("sink:e-1"),
            "{evidence}"
        );
        assert!(
            matches!(
                replay(datetime!(2026-01-02 0:00 UTC)),
                Decision::Stuck { .. }
            ),
            "past the API's key TTL a replay could charge twice"
        );
        for now in [
            datetime!(2026-01-01 0:00:31 UTC),
            datetime!(2026-01-01 1:00 UTC),
        ] {
            assert!(matches!(
                decide_without_lookup(&intent, ReconcileStrategy::None, now, &SETTINGS),
                Decision::Stuck { .. }
            ));
        }
    }

    #[test]
    fn each_target_has_its_strategy_and_the_rest_look_up() {
        let day = Duration::from_secs(24 * 3600);
        let policies = TargetPolicies::new(
            [
                ("webhook".to_owned(), ReconcileStrategy::None),
                ("stripe".to_owned(), ReconcileStrategy::Replay),
            ],
            [("stripe".to_owned(), 30 * day)],
            day,
        );
        assert_eq!(policies.of("webhook:e:1"), ReconcileStrategy::None);
        assert_eq!(policies.of("stripe:e-2"), ReconcileStrategy::Replay);
        assert_eq!(policies.of("payments:e-3"), ReconcileStrategy::Lookup);
        assert_eq!(policies.of("no-target-prefix"), ReconcileStrategy::Lookup);
        assert_eq!(policies.key_ttl_of("stripe:e-2"), 30 * day);
        assert_eq!(policies.key_ttl_of("webhook:e:1"), day);
        assert_eq!(policies.key_ttl_of("no-target-prefix"), day);
    }

    #[test]
    fn backlog_is_stable_only_when_r_exceeds_u() {
        let window = Duration::from_secs(60);
        let rates = |backlog, arrivals, cleared| {
            BacklogRates::from_counts(
                BacklogCounts {
                    backlog,
                    arrivals,
                    cleared,
                },
                window,
            )
        };
        assert!(rates(10, 60, 60).is_unstable());
        assert!(rates(10, 60, 30).is_unstable());
        assert!(rates(10, 0, 0).is_unstable());
        assert!(!rates(10, 60, 61).is_unstable());
        assert!(!rates(0, 60, 0).is_unstable());
        let r = rates(5, 120, 60);
        assert!((r.arrival_rate - 2.0).abs() < 1e-9);
        assert!((r.reconcile_rate - 1.0).abs() < 1e-9);
    }
}
