//! The dedup intent protocol as a [`stateright::Model`]: clients racing `Begin` on one operation
//! id, leases that run out, a provider that applies charges and loses answers (and, in one
//! configuration, forgets them), late and repeated holder reports, the reconciler, the
//! retention purge and Begins past the retained window, and dedup-service restarts.
//!
//! Every step that the services decide is decided by their own code:
//! - the `Begin` upsert acquires a missing row, or applies what [`begin_transition`] says
//!   (`ExpireLease` or `Reacquire`), then answers with [`begin_outcome`];
//! - the lease sweep applies [`next_state`] with `ExpireLease`;
//! - a holder sorts the provider's answer with [`classify`] and reports through the store's
//!   guard, [`holder_report_applies`]: the transition's [`Transition::from_states`], an equal
//!   fencing token and its secret. The secret is
//!   modelled as a value bound to each acquisition (`secret_of`): a holder has only the
//!   secret its own Begin answered, so a stale holder never has the current one;
//! - the reconciler asks the provider by key and settles with [`decide`], then resolves through
//!   [`resolution_applies`] with the token it read (`expected_fencing_token`), or, on `Stuck`, marks
//!   the attempt the way `mark_stuck`'s statement does (UNKNOWN, same token, not yet marked);
//! - a Begin is inside the retained window by [`in_retained_window`]; past it, it is answered
//!   by [`expired_outcome`] from the row as it is;
//! - the purge deletes a row exactly when [`purgeable`] says so.
//!
//! The store runs those same rules as SQL statements. That every statement decides every case
//! exactly as these functions do is checked against a real PostgreSQL by
//! `integration-tests/tests/it/dedup_transitions.rs`, so the model checks the code that runs.
//!
//! A restart of dedup-service loses what it keeps outside PostgreSQL: the reconciler's pass
//! between its look-up and its resolve, and the answers of handlers in flight. Every handler is
//! one statement, so a lost handler either changed nothing (as if never called) or committed
//! with its answer lost; for Begin the model takes that step (the client retries with the same
//! request id), for a report it is already a report followed by `MoveOn`. There is no cache.
//!
//! What is the model's own: the environment (who runs when, what the network loses, the clock)
//! and the rows' bookkeeping the SQL does around the state (token + 1, holder, timestamps).
//!
//! Timing assumption, the one `decide`'s in-flight window encodes: a holder sends its request
//! only while its lease is live, and a request lands within the in-flight window after it was
//! sent, or never. The provider itself is taken at its worst: it does **not** deduplicate by
//! key, so every request it applies is a separate effect, and only the protocol keeps them to one.

use dedup_client::provider_client::{ChargeLookup, ChargeOutcome, classify};
use dedup_client::state_machine::{
    BeginAsk, BeginOutcome, FencingSecret, Intent, IntentState, Transition, begin_outcome,
    begin_transition, expired_outcome, holder_report_applies, in_retained_window, next_state,
    purgeable, resolution_applies,
};
use dedup_service::reconciler::{Decision, ReconcilerSettings, decide};
use stateright::{Model, Property};
use time::OffsetDateTime;

/// The one operation id every client races on.
const OPERATION_ID: &str = "op-1";
/// Every client sends the same request (a retry of one event), so one fingerprint.
const FINGERPRINT: &[u8] = b"fingerprint-of-op-1";
/// Lease length in clock ticks.
const LEASE_TICKS: u8 = 1;
/// The reconciler's in-flight window in ticks: how long after it was sent a request may land.
const IN_FLIGHT_TICKS: u8 = 1;

/// A deliberately broken variant of one step, to show the checker finds what it must find.
/// The product code is never changed; the model takes the wrong step instead of calling it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Bug {
    /// A lease that runs out turns the intent FAILED (retryable) instead of UNKNOWN.
    ExpireToFailed,
    /// `Begin` acquires an UNKNOWN intent again, as if no call could have been made.
    BeginReacquiresUnknown,
    /// A holder's report is applied without comparing the fencing token.
    ReportIgnoresToken,
    /// The reconciler takes "no record" as failure at once, without waiting out the in-flight
    /// window.
    ReconcilerSkipsInFlightWindow,
    /// Not a code change but the timing assumption dropped: a holder (paused, slow) sends after
    /// its lease ran out. Kept to show the assumption carries weight: with it gone the protocol
    /// alone no longer keeps one effect, and only the provider's own deduplication by key
    /// (which this model leaves out) does.
    ClientSendsAfterLease,
    /// The purge deletes settled rows without waiting for the retained window to pass them.
    PurgeIgnoresRetention,
    /// The purge deletes UNKNOWN rows too (past retention, like settled ones).
    PurgeDeletesUnknown,
    /// A Begin past the retained window runs the upsert anyway (the statement's window filter
    /// dropped), instead of being answered by `expired_outcome`.
    ExpiredBeginAcquires,
    /// The reconciler never takes "no record" as failure, even after the in-flight window
    /// (`FailedRetryable` treated as `Wait`).
    ReconcilerWaitsForever,
    /// A later reconciler pass takes an attempt it already found stuck as a retryable failure
    /// (as if its verdict expired), although "no record" still proves nothing.
    ReconcilerRetriesStuck,
}

/// The bounds of one exhaustive run.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DedupModel {
    /// Clients racing on the operation id.
    pub clients: u8,
    /// How many times each client may call `Begin`.
    pub begins_per_client: u8,
    /// The clock runs from 0 to this tick (while faults happen; see `fair_suffix`).
    pub max_tick: u8,
    /// The retention in ticks; the operation occurred at tick 0, so Begins after tick
    /// `retention` are past the retained window (`expired_outcome`), and the purge may delete
    /// settled rows. `None`: the window outlasts the clock (no expiry, no purge).
    pub retention: Option<u8>,
    /// How many times dedup-service may restart (losing what it holds outside PostgreSQL).
    pub restarts: u8,
    /// The provider forgets a charge this many ticks after applying it, and the reconciler's
    /// `--provider-key-ttl` is as long: a "no record" from then on is `Stuck`. `None`: beyond
    /// the clock.
    pub key_ttl: Option<u8>,
    /// The liveness configuration: the faults may stop at any point (`FaultsStop`), and from
    /// then on time passes only when nothing else can happen (see [`FAIR_TICK_SLACK`]).
    pub fair_suffix: bool,
    /// `None`: the real protocol.
    pub bug: Option<Bug>,
}

impl DedupModel {
    /// The bounds `cargo test` checks exhaustively (see docs/MODEL_CHECKING.md).
    pub fn standard() -> Self {
        Self {
            clients: 2,
            begins_per_client: 2,
            max_tick: 4,
            retention: Some(2),
            restarts: 1,
            key_ttl: None,
            fair_suffix: false,
            bug: None,
        }
    }

    /// The standard bounds with a provider that forgets a charge after 2 ticks (lease +
    /// in-flight window): the reconciler's `Stuck` case. No purge (retention outlasts the
    /// clock) and no restart: both are checked at the standard bounds, and leaving them out
    /// here keeps this run as short as that one.
    pub fn stuck() -> Self {
        Self {
            retention: None,
            restarts: 0,
            key_ttl: Some(2),
            ..Self::standard()
        }
    }

    /// The liveness configuration: the faults (restarts, lost answers, crashes, everything the
    /// standard model allows) happen up to tick 3, then may stop at any point.
    pub fn liveness() -> Self {
        Self {
            clients: 2,
            begins_per_client: 2,
            max_tick: 3,
            retention: Some(2),
            restarts: 1,
            key_ttl: None,
            fair_suffix: true,
            bug: None,
        }
    }

    pub fn with_bug(self, bug: Bug) -> Self {
        Self {
            bug: Some(bug),
            ..self
        }
    }

    fn settings(&self) -> ReconcilerSettings {
        ReconcilerSettings {
            interval: std::time::Duration::from_secs(1),
            concurrency: 1,
            in_flight_window: std::time::Duration::from_secs(u64::from(IN_FLIGHT_TICKS)),
            // `None`: far beyond the clock's end, so a "no record" is always evidence.
            provider_key_ttl: std::time::Duration::from_secs(self.key_ttl.map_or(3600, u64::from)),
            rate_window: std::time::Duration::from_secs(60),
        }
    }
}

/// The `dedup_intents` row, reduced to what the protocol reads. Times are clock ticks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Row {
    pub state: IntentState,
    pub fencing_token: u8,
    pub holder: u8,
    /// The `request_id` of the Begin that acquired the current token: (client, its n-th Begin).
    pub request: (u8, u8),
    pub retryable: bool,
    pub acquired_at: u8,
    pub lease_expires_at: u8,
    pub updated_at: u8,
    /// `stuck_fencing_token = fencing_token`: the reconciler found this attempt stuck.
    pub stuck: bool,
}

/// Where a client is in one attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Client {
    /// May call `Begin` (again).
    Idle,
    /// `Begin` answered `Acquired`: may call the provider while the lease is live.
    Holding { token: u8, lease_expires_at: u8 },
    /// The request is out; no answer yet.
    Waiting { token: u8 },
    /// The provider's answer arrived (an HTTP status) or never will (`None`: timeout, lost
    /// connection). The holder reports it, possibly late and possibly more than once.
    Answered { token: u8, status: Option<u16> },
    /// Done with the operation: it has an answer that leads to no call, or gave up.
    Finished,
}

/// A charge request on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Request {
    pub client: u8,
    pub token: u8,
    /// It lands before this tick or never.
    pub lands_before: u8,
}

/// One charge the provider applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Effect {
    /// The fencing token of the request it came from.
    pub token: u8,
    /// When it was applied (kept only when the provider forgets: `key_ttl`; otherwise 0).
    pub applied_at: u8,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DedupState {
    pub now: u8,
    /// Restarts of dedup-service still allowed.
    pub restarts_left: u8,
    /// The liveness configuration's fair suffix has begun: no more faults.
    pub faults_over: bool,
    pub row: Option<Row>,
    pub clients: Vec<Client>,
    pub begins_left: Vec<u8>,
    /// Sorted, so that the same set is the same state.
    pub in_flight: Vec<Request>,
    /// The provider's charges for the key.
    pub effects: Vec<Effect>,
    /// The reconciler between its read and its resolve: the token it read and the decision.
    pub reconciling: Option<(u8, Settle)>,
    /// Ghost: a request was sent while an effect existed or another attempt's request could
    /// still land.
    pub call_while_effect_possible: bool,
    /// Ghost: a report with a token other than the row's changed the row.
    pub stale_token_changed_intent: bool,
    /// Ghost: a stale report reached the store and was refused.
    pub stale_report_refused: bool,
    /// Ghost: the reconciler settled an UNKNOWN as SUCCEEDED.
    pub reconciler_resolved_succeeded: bool,
    /// Ghost: the reconciler settled an UNKNOWN as a retryable FAILED.
    pub reconciler_resolved_failed: bool,
    /// Ghost: a holder's Complete settled an UNKNOWN (its lease had run out).
    pub late_complete_settled_unknown: bool,
    /// Ghost: a Begin answered `Acquired` while an effect of the operation existed.
    pub acquired_after_effect: bool,
    /// Ghost: a Begin past the retained window answered `Acquired`.
    pub acquired_past_window: bool,
    /// Ghost: the purge deleted the row.
    pub purged: bool,
    /// Ghost: the purge deleted a row that was not settled.
    pub purged_unsettled: bool,
    /// Ghost: a Begin answered `Expired` after the row was purged.
    pub expired_after_purge: bool,
    /// Ghost: a Begin retried with the request id of one whose answer a restart lost, and got
    /// that acquisition back.
    pub retried_begin_got_its_acquisition: bool,
    /// Ghost: a restart dropped the reconciler between its look-up and its resolve.
    pub restart_dropped_reconcile: bool,
    /// Ghost: after that, the reconciler settled the UNKNOWN on a later pass.
    pub reconciled_after_restart: bool,
    /// Ghost: the reconciler marked an attempt stuck.
    pub stuck_marked: bool,
    /// Ghost: the reconciler settled an attempt it had marked stuck.
    pub stuck_settled_by_reconciler: bool,
}

/// What the reconciler will resolve an UNKNOWN to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Settle {
    Succeeded,
    FailedRetryable,
    /// `mark_stuck`: the state stays UNKNOWN.
    Stuck,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    Tick,
    Begin(u8),
    /// The holder calls the provider.
    Send(u8),
    /// The holder gives up before calling (crash, shutdown); it never reports.
    Abandon(u8),
    /// The provider applies request `in_flight[i]` and answers with the status (a 5xx after
    /// applying is an answer that proves nothing).
    Apply {
        request: Request,
        status: u16,
    },
    /// The provider refuses request without applying it (429: retryable).
    Refuse {
        request: Request,
    },
    /// The client stops waiting (timeout); the request may still land.
    GiveUp(u8),
    /// The client reports its answer to dedup-service; it may do so again later.
    Report(u8),
    /// The client moves on after its report (or without one: the report never arrives).
    MoveOn(u8),
    /// The reconciler's lease sweep.
    SweepLeases,
    /// The reconciler reads the UNKNOWN row and asks the provider by key.
    ReconcileLookup,
    /// The reconciler's conditional resolve (or `mark_stuck`).
    ReconcileResolve,
    /// The retention purge.
    Purge,
    /// dedup-service restarts: the reconciler's pending look-up is lost, and with
    /// `lost_begin`, that client's Begin committed but its answer was lost.
    Restart {
        lost_begin: Option<u8>,
    },
    /// Liveness configuration: from here on, no more faults.
    FaultsStop,
}

fn at(tick: u8) -> OffsetDateTime {
    OffsetDateTime::UNIX_EPOCH + time::Duration::seconds(i64::from(tick))
}

fn request_id(request: (u8, u8)) -> String {
    format!("client-{}-begin-{}", request.0, request.1)
}

fn owner(client: u8) -> String {
    format!("client-{client}")
}

/// The secret the acquisition with counter `token` drew. In the service it is random; here one
/// value per acquisition is enough, since what matters is that a holder of another acquisition
/// does not have it.
fn secret_of(token: u8) -> FencingSecret {
    FencingSecret::from_bytes(&[token; FencingSecret::LEN]).expect("LEN bytes")
}

/// The row as the services see it.
fn intent(row: &Row) -> Intent {
    Intent {
        operation_id: OPERATION_ID.into(),
        state: row.state,
        fingerprint: FINGERPRINT.to_vec(),
        fencing_token: i64::from(row.fencing_token),
        fencing_secret: secret_of(row.fencing_token),
        holder: owner(row.holder),
        request_id: request_id(row.request),
        lease_expires_at: at(row.lease_expires_at),
        occurred_at: at(0),
        created_at: at(0),
        updated_at: at(row.updated_at),
        acquired_at: at(row.acquired_at),
        result: (row.state == IntentState::Succeeded).then(Vec::new),
        failure_reason: (row.state == IntentState::Failed).then(String::new),
        retryable: row.retryable,
        detail: String::new(),
        trace_context: None,
    }
}

/// The store's guard for `transition` from `row`, as the services define it: a holder's report
/// presents its token and secret ([`holder_report_applies`]); a Resolve may name the token it
/// expects ([`resolution_applies`]); `None` checks the state only (a report that ignores its
/// token, under [`Bug::ReportIgnoresToken`]). `None` back: the statement matches no row and
/// changes nothing.
fn guarded(
    row: &Row,
    transition: Transition,
    token: Option<(u8, Option<FencingSecret>)>,
) -> Option<IntentState> {
    let intent = intent(row);
    let applies = match token {
        Some((token, Some(secret))) => {
            holder_report_applies(&intent, transition, i64::from(token), secret.as_bytes())
        }
        Some((token, None)) => resolution_applies(&intent, transition, Some(i64::from(token))),
        None => resolution_applies(&intent, transition, None),
    };
    applies.then(|| transition.to_state())
}

impl DedupModel {
    /// The start of the retained window at `now`, when the model has one.
    fn retained_since(&self, now: u8) -> Option<OffsetDateTime> {
        self.retention
            .map(|ticks| at(now) - time::Duration::seconds(i64::from(ticks)))
    }

    /// The `Begin` for one client: the upsert (or, past the retained window, the read that
    /// `expired_outcome` answers from), then the answer. `answer_lost`: dedup-service restarted
    /// after the statement committed and before the answer left, so the client learns nothing
    /// and retries later with the same request id (`grpc_client` keeps it across retries).
    fn begin(&self, state: &mut DedupState, client: u8, answer_lost: bool) {
        let now = state.now;
        let nth = self.begins_per_client - state.begins_left[usize::from(client)];
        let owner = owner(client);
        let request = request_id((client, nth));
        let ask = BeginAsk {
            fingerprint: FINGERPRINT,
            owner: &owner,
            request_id: &request,
        };
        let past_window = self
            .retained_since(now)
            .is_some_and(|since| !in_retained_window(at(0), since));
        let outcome = if past_window && self.bug != Some(Bug::ExpiredBeginAcquires) {
            // Left out of the upsert: the row (if any) is read as it is.
            let since = self.retained_since(now).unwrap_or(at(0));
            let row = state.row.map(|row| intent(&row));
            expired_outcome(row.as_ref(), &ask, since, at(now))
        } else {
            let row = self.upsert(state.row, client, nth, now);
            if let Some(before) = state.row
                && before.state == IntentState::Reserved
                && before.request == (client, nth)
                && row.state == IntentState::Reserved
            {
                state.retried_begin_got_its_acquisition = true;
            }
            state.row = Some(row);
            begin_outcome(&intent(&row), &ask)
        };
        if matches!(outcome, BeginOutcome::Acquired { .. }) {
            if !state.effects.is_empty() {
                state.acquired_after_effect = true;
            }
            if past_window {
                state.acquired_past_window = true;
            }
        }
        if matches!(outcome, BeginOutcome::Expired { .. }) && state.purged {
            state.expired_after_purge = true;
        }
        if answer_lost {
            return;
        }
        state.begins_left[usize::from(client)] -= 1;
        state.clients[usize::from(client)] = match outcome {
            BeginOutcome::Acquired {
                fencing_token,
                lease_expires_at,
            } => Client::Holding {
                // The holder keeps the counter; the secret that came with it is its
                // acquisition's, `secret_of(counter)`, presented again in `report`.
                token: u8::try_from(fencing_token.counter).unwrap_or(u8::MAX),
                lease_expires_at: u8::try_from((lease_expires_at - at(0)).whole_seconds())
                    .unwrap_or(u8::MAX),
            },
            // Someone else holds it, or a retryable failure: try again later.
            BeginOutcome::InProgress { .. }
            | BeginOutcome::Failed {
                retryable: true, ..
            } => Client::Idle,
            // An answer that leads to no call. UNKNOWN in particular is not a failure.
            BeginOutcome::Succeeded { .. }
            | BeginOutcome::Failed { .. }
            | BeginOutcome::Unknown { .. }
            | BeginOutcome::Conflict { .. }
            | BeginOutcome::Expired { .. } => Client::Finished,
        };
    }

    /// The Begin upsert's effect on the row (the `CASE`s of `upsert_begin`, in their order).
    fn upsert(&self, row: Option<Row>, client: u8, nth: u8, now: u8) -> Row {
        let fresh = |token: u8| Row {
            state: IntentState::Reserved,
            fencing_token: token,
            holder: client,
            request: (client, nth),
            retryable: false,
            acquired_at: now,
            lease_expires_at: now + LEASE_TICKS,
            updated_at: now,
            stuck: false,
        };
        match row {
            None => {
                let to = next_state(None, Transition::Acquire);
                debug_assert_eq!(to, Some(IntentState::Reserved));
                fresh(1)
            }
            Some(row) => match begin_transition(&intent(&row), FINGERPRINT, at(now)) {
                Some(Transition::ExpireLease) => {
                    let mut row = row;
                    if self.bug == Some(Bug::ExpireToFailed) {
                        row.state = IntentState::Failed;
                        row.retryable = true;
                    } else {
                        row.state = Transition::ExpireLease.to_state();
                    }
                    row.updated_at = now;
                    row
                }
                Some(transition) => {
                    debug_assert_eq!(transition, Transition::Reacquire);
                    fresh(row.fencing_token + 1)
                }
                None if row.state == IntentState::Unknown
                    && self.bug == Some(Bug::BeginReacquiresUnknown) =>
                {
                    fresh(row.fencing_token + 1)
                }
                None => row,
            },
        }
    }

    /// The holder's report through the store's guard.
    fn report(&self, state: &mut DedupState, token: u8, status: Option<u16>) {
        let outcome = match status {
            Some(status) => classify(status, Vec::new()),
            None => ChargeOutcome::Ambiguous {
                detail: "timeout".into(),
            },
        };
        let (transition, retryable) = match outcome {
            ChargeOutcome::Applied { .. } => (Transition::Complete, false),
            ChargeOutcome::Rejected { retryable, .. } => (Transition::Fail, retryable),
            ChargeOutcome::Ambiguous { .. } => (Transition::MarkUnknown, false),
        };
        let Some(row) = state.row else { return };
        let presented = if self.bug == Some(Bug::ReportIgnoresToken) {
            None
        } else {
            transition
                .needs_token()
                .then_some((token, Some(secret_of(token))))
        };
        let stale = token != row.fencing_token;
        match guarded(&row, transition, presented) {
            Some(to) => {
                if stale {
                    state.stale_token_changed_intent = true;
                }
                if row.state == IntentState::Unknown && to == IntentState::Succeeded {
                    state.late_complete_settled_unknown = true;
                }
                state.row = Some(Row {
                    state: to,
                    retryable,
                    updated_at: state.now,
                    ..row
                });
            }
            None => {
                if stale {
                    state.stale_report_refused = true;
                }
            }
        }
    }
}

/// In the fair suffix, the clock runs on past `max_tick` by at most this many ticks per Begin:
/// enough for every attempt to run out its lease and in-flight window and be settled, since
/// time passes there only when nothing else can happen. An UNKNOWN left at that clock's end is
/// one the reconciler never settles.
pub const FAIR_TICK_SLACK: u8 = LEASE_TICKS + IN_FLIGHT_TICKS + 1;

impl DedupModel {
    /// The last tick the clock may reach in `state`.
    fn clock_end(&self, state: &DedupState) -> u8 {
        if state.faults_over {
            let begins = self.clients * self.begins_per_client;
            self.max_tick + begins * FAIR_TICK_SLACK
        } else {
            self.max_tick
        }
    }

    /// Something only time can move on: a lease or the in-flight window to run out, a request
    /// on the wire.
    fn waits_on_time(state: &DedupState) -> bool {
        !state.in_flight.is_empty()
            || state.row.is_some_and(|row| {
                matches!(row.state, IntentState::Reserved | IntentState::Unknown) && !row.stuck
            })
    }

    /// Whether the purge deletes `row` at `now`.
    fn purges(&self, row: &Row, now: u8) -> bool {
        let Some(since) = self.retained_since(now) else {
            return false;
        };
        match self.bug {
            Some(Bug::PurgeIgnoresRetention) => row.state.is_settled(),
            Some(Bug::PurgeDeletesUnknown) if row.state == IntentState::Unknown => {
                // As old as the real rule asks, only the state check dropped.
                purgeable(
                    &Intent {
                        state: IntentState::Failed,
                        ..intent(row)
                    },
                    since,
                )
            }
            _ => purgeable(&intent(row), since),
        }
    }

    /// The actions the model allows in `state`, before the fair suffix's rule for the clock.
    fn actions_but_tick(&self, state: &DedupState, actions: &mut Vec<Action>) {
        for client in 0..self.clients {
            match state.clients[usize::from(client)] {
                Client::Idle if state.begins_left[usize::from(client)] > 0 => {
                    actions.push(Action::Begin(client));
                    if state.restarts_left > 0 && !state.faults_over {
                        actions.push(Action::Restart {
                            lost_begin: Some(client),
                        });
                    }
                }
                Client::Idle | Client::Finished => {}
                Client::Holding {
                    lease_expires_at, ..
                } => {
                    if state.now < lease_expires_at || self.bug == Some(Bug::ClientSendsAfterLease)
                    {
                        actions.push(Action::Send(client));
                    }
                    actions.push(Action::Abandon(client));
                }
                Client::Waiting { .. } => actions.push(Action::GiveUp(client)),
                Client::Answered { .. } => {
                    actions.push(Action::Report(client));
                    actions.push(Action::MoveOn(client));
                }
            }
        }
        for request in &state.in_flight {
            if state.now < request.lands_before {
                // 201: applied and answered; 503: applied, but the answer proves nothing.
                for status in [201, 503] {
                    actions.push(Action::Apply {
                        request: *request,
                        status,
                    });
                }
                actions.push(Action::Refuse { request: *request });
            }
        }
        if let Some(row) = state.row {
            if row.state == IntentState::Reserved && row.lease_expires_at <= state.now {
                actions.push(Action::SweepLeases);
            }
            if row.state == IntentState::Unknown && state.reconciling.is_none() {
                actions.push(Action::ReconcileLookup);
            }
            if self.purges(&row, state.now) {
                actions.push(Action::Purge);
            }
        }
        if state.reconciling.is_some() {
            actions.push(Action::ReconcileResolve);
            // A restart with nothing volatile to lose changes nothing the protocol reads: the
            // service being down a while is already any stretch without its actions.
            if state.restarts_left > 0 && !state.faults_over {
                actions.push(Action::Restart { lost_begin: None });
            }
        }
        if self.fair_suffix && !state.faults_over {
            actions.push(Action::FaultsStop);
        }
    }
}

impl Model for DedupModel {
    type State = DedupState;
    type Action = Action;

    fn init_states(&self) -> Vec<Self::State> {
        let n = usize::from(self.clients);
        vec![DedupState {
            now: 0,
            restarts_left: self.restarts,
            faults_over: false,
            row: None,
            clients: vec![Client::Idle; n],
            begins_left: vec![self.begins_per_client; n],
            in_flight: Vec::new(),
            effects: Vec::new(),
            reconciling: None,
            call_while_effect_possible: false,
            stale_token_changed_intent: false,
            stale_report_refused: false,
            reconciler_resolved_succeeded: false,
            reconciler_resolved_failed: false,
            late_complete_settled_unknown: false,
            acquired_after_effect: false,
            acquired_past_window: false,
            purged: false,
            purged_unsettled: false,
            expired_after_purge: false,
            retried_begin_got_its_acquisition: false,
            restart_dropped_reconcile: false,
            reconciled_after_restart: false,
            stuck_marked: false,
            stuck_settled_by_reconciler: false,
        }]
    }

    fn actions(&self, state: &Self::State, actions: &mut Vec<Self::Action>) {
        let before = actions.len();
        self.actions_but_tick(state, actions);
        if state.now >= self.clock_end(state) {
            return;
        }
        if !state.faults_over {
            actions.push(Action::Tick);
            return;
        }
        // The fair suffix: everyone acts before time passes (the reconciler runs at least once
        // a tick, clients do not dawdle), and time passes while something waits on it.
        let something_else_moves = actions[before..].iter().any(|action| {
            self.next_state(state, *action)
                .is_some_and(|next| next != *state)
        });
        if !something_else_moves && Self::waits_on_time(state) {
            actions.push(Action::Tick);
        }
    }

    fn next_state(&self, last: &Self::State, action: Self::Action) -> Option<Self::State> {
        let mut state = last.clone();
        match action {
            Action::Tick => {
                state.now += 1;
                // A request not landed within the in-flight window never lands.
                let now = state.now;
                state.in_flight.retain(|r| now < r.lands_before);
            }
            Action::Begin(client) => self.begin(&mut state, client, false),
            Action::Send(client) => {
                let Client::Holding { token, .. } = state.clients[usize::from(client)] else {
                    return None;
                };
                if !state.effects.is_empty() || state.in_flight.iter().any(|r| r.token != token) {
                    state.call_while_effect_possible = true;
                }
                state.in_flight.push(Request {
                    client,
                    token,
                    lands_before: state.now + IN_FLIGHT_TICKS,
                });
                state.in_flight.sort();
                state.clients[usize::from(client)] = Client::Waiting { token };
            }
            Action::Abandon(client) => state.clients[usize::from(client)] = Client::Finished,
            Action::Apply { request, status } => {
                state.in_flight.retain(|r| *r != request);
                state.effects.push(Effect {
                    token: request.token,
                    applied_at: if self.key_ttl.is_some() { state.now } else { 0 },
                });
                let slot = &mut state.clients[usize::from(request.client)];
                if *slot
                    == (Client::Waiting {
                        token: request.token,
                    })
                {
                    *slot = Client::Answered {
                        token: request.token,
                        status: Some(status),
                    };
                }
            }
            Action::Refuse { request } => {
                state.in_flight.retain(|r| *r != request);
                let slot = &mut state.clients[usize::from(request.client)];
                if *slot
                    == (Client::Waiting {
                        token: request.token,
                    })
                {
                    *slot = Client::Answered {
                        token: request.token,
                        status: Some(429),
                    };
                }
            }
            Action::GiveUp(client) => {
                let Client::Waiting { token } = state.clients[usize::from(client)] else {
                    return None;
                };
                state.clients[usize::from(client)] = Client::Answered {
                    token,
                    status: None,
                };
            }
            Action::Report(client) => {
                let Client::Answered { token, status } = state.clients[usize::from(client)] else {
                    return None;
                };
                self.report(&mut state, token, status);
            }
            Action::MoveOn(client) => {
                let Client::Answered { status, .. } = state.clients[usize::from(client)] else {
                    return None;
                };
                // After a retryable refusal the client may Begin again; otherwise it is done.
                let retry = matches!(
                    status.map(|s| classify(s, Vec::new())),
                    Some(ChargeOutcome::Rejected {
                        retryable: true,
                        ..
                    })
                );
                state.clients[usize::from(client)] = if retry {
                    Client::Idle
                } else {
                    Client::Finished
                };
            }
            Action::SweepLeases => {
                let mut row = state.row?;
                if self.bug == Some(Bug::ExpireToFailed) {
                    row.state = IntentState::Failed;
                    row.retryable = true;
                } else {
                    row.state = next_state(Some(row.state), Transition::ExpireLease)?;
                }
                row.updated_at = state.now;
                state.row = Some(row);
            }
            Action::ReconcileLookup => {
                let row = state.row?;
                // The provider keeps a charge for `key_ttl` ticks (or for good).
                let now = state.now;
                let remembered = state
                    .effects
                    .iter()
                    .any(|e| self.key_ttl.is_none_or(|ttl| now < e.applied_at + ttl));
                let lookup = if remembered {
                    ChargeLookup::Found(Vec::new())
                } else {
                    ChargeLookup::NotFound
                };
                let decision = decide(&intent(&row), &lookup, at(state.now), &self.settings());
                let settle = match decision {
                    Decision::Succeeded { .. } => Settle::Succeeded,
                    Decision::FailedRetryable { .. }
                        if self.bug == Some(Bug::ReconcilerWaitsForever) =>
                    {
                        return None;
                    }
                    Decision::FailedRetryable { .. } => Settle::FailedRetryable,
                    Decision::Wait if self.bug == Some(Bug::ReconcilerSkipsInFlightWindow) => {
                        Settle::FailedRetryable
                    }
                    Decision::Wait => return None,
                    Decision::Stuck { .. }
                        if row.stuck && self.bug == Some(Bug::ReconcilerRetriesStuck) =>
                    {
                        Settle::FailedRetryable
                    }
                    // `mark_stuck` changes nothing once the attempt is marked.
                    Decision::Stuck { .. } if row.stuck => return None,
                    Decision::Stuck { .. } => Settle::Stuck,
                    // The modelled look-up answers found or not found only (the provider
                    // refuses nothing it has applied), so this decision is not reached.
                    Decision::Failed { .. } => return None,
                };
                state.reconciling = Some((row.fencing_token, settle));
            }
            Action::ReconcileResolve => {
                let (token, settle) = state.reconciling.take()?;
                let Some(row) = state.row else {
                    return Some(state);
                };
                let transition = match settle {
                    Settle::Succeeded => Transition::ResolveSucceeded,
                    Settle::FailedRetryable => Transition::ResolveFailed,
                    Settle::Stuck => {
                        // `mark_stuck`: UNKNOWN, the token read, not marked yet.
                        if row.state == IntentState::Unknown
                            && row.fencing_token == token
                            && !row.stuck
                        {
                            state.stuck_marked = true;
                            state.row = Some(Row { stuck: true, ..row });
                        }
                        return Some(state);
                    }
                };
                if let Some(to) = guarded(&row, transition, Some((token, None))) {
                    match settle {
                        Settle::Succeeded => state.reconciler_resolved_succeeded = true,
                        Settle::FailedRetryable | Settle::Stuck => {
                            state.reconciler_resolved_failed = true;
                        }
                    }
                    if row.stuck {
                        state.stuck_settled_by_reconciler = true;
                    }
                    if state.restart_dropped_reconcile {
                        state.reconciled_after_restart = true;
                    }
                    state.row = Some(Row {
                        state: to,
                        retryable: settle == Settle::FailedRetryable,
                        updated_at: state.now,
                        ..row
                    });
                }
            }
            Action::Purge => {
                let row = state.row?;
                if !self.purges(&row, state.now) {
                    return None;
                }
                if !row.state.is_settled() {
                    state.purged_unsettled = true;
                }
                state.purged = true;
                state.row = None;
            }
            Action::Restart { lost_begin } => {
                state.restarts_left = state.restarts_left.checked_sub(1)?;
                if state.reconciling.take().is_some() {
                    state.restart_dropped_reconcile = true;
                }
                if let Some(client) = lost_begin {
                    self.begin(&mut state, client, true);
                }
            }
            Action::FaultsStop => state.faults_over = true,
        }
        Some(state)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(AT_MOST_ONE_EFFECT, |_, s: &DedupState| s.effects.len() <= 1),
            Property::always(NO_SUCCEEDED_WITHOUT_EFFECT, |_, s: &DedupState| {
                s.row.is_none_or(|row| row.state != IntentState::Succeeded) || !s.effects.is_empty()
            }),
            Property::always(NO_CALL_WHILE_EFFECT_POSSIBLE, |_, s: &DedupState| {
                !s.call_while_effect_possible
            }),
            Property::always(STALE_TOKEN_CHANGES_NOTHING, |_, s: &DedupState| {
                !s.stale_token_changed_intent
            }),
            Property::always(NO_ACQUISITION_AFTER_EFFECT, |_, s: &DedupState| {
                !s.acquired_after_effect
            }),
            Property::always(PAST_WINDOW_FAILS_CLOSED, |_, s: &DedupState| {
                !s.acquired_past_window
            }),
            Property::always(STUCK_STAYS_UNKNOWN, |_, s: &DedupState| {
                !s.stuck_settled_by_reconciler
            }),
            Property::sometimes(REACHES_RECONCILED_SUCCEEDED, |_, s: &DedupState| {
                s.reconciler_resolved_succeeded
                    && s.row.is_some_and(|r| r.state == IntentState::Succeeded)
            }),
            Property::sometimes(REACHES_SECOND_TOKEN_EFFECT, |_, s: &DedupState| {
                s.effects.iter().any(|e| e.token == 2)
                    && s.row
                        .is_some_and(|r| r.state == IntentState::Succeeded && r.fencing_token == 2)
            }),
            Property::sometimes(REACHES_STALE_REPORT_REFUSED, |_, s: &DedupState| {
                s.stale_report_refused
            }),
            Property::sometimes(
                REACHES_LATE_COMPLETE_SETTLES_UNKNOWN,
                |_, s: &DedupState| s.late_complete_settled_unknown,
            ),
            Property::sometimes(REACHES_EFFECT_WITH_UNKNOWN_ANSWER, |_, s: &DedupState| {
                s.effects.len() == 1
                    && s.row.is_some_and(|r| r.state == IntentState::Unknown)
                    && s.clients.iter().all(|c| *c == Client::Finished)
            }),
            Property::sometimes(REACHES_EXPIRED_AFTER_PURGE, |_, s: &DedupState| {
                s.expired_after_purge && s.effects.len() == 1
            }),
            Property::sometimes(REACHES_LOST_BEGIN_ANSWER_RETRIED, |_, s: &DedupState| {
                s.retried_begin_got_its_acquisition
            }),
            Property::sometimes(REACHES_RECONCILED_AFTER_RESTART, |_, s: &DedupState| {
                s.reconciled_after_restart
            }),
            Property::sometimes(REACHES_STUCK, |_, s: &DedupState| {
                s.stuck_marked
                    && s.effects.len() == 1
                    && s.row
                        .is_some_and(|r| r.stuck && r.state == IntentState::Unknown)
                    && s.clients.iter().all(|c| *c == Client::Finished)
            }),
        ]
    }
}

/// The liveness goal, judged where a fair path ends: no UNKNOWN is left, and none was purged
/// away unsettled.
pub fn every_unknown_settled(state: &DedupState) -> bool {
    state
        .row
        .is_none_or(|row| row.state != IntentState::Unknown)
        && !state.purged_unsettled
}

/// Whether `state` is in the liveness configuration's fair suffix.
pub fn in_fair_suffix(state: &DedupState) -> bool {
    state.faults_over
}

pub const AT_MOST_ONE_EFFECT: &str = "at most one provider effect per operation id";
pub const NO_SUCCEEDED_WITHOUT_EFFECT: &str = "never SUCCEEDED without an effect";
pub const NO_CALL_WHILE_EFFECT_POSSIBLE: &str =
    "the provider is called only while no other attempt's effect may exist";
pub const STALE_TOKEN_CHANGES_NOTHING: &str = "a stale fencing token never changes the intent";
pub const REACHES_RECONCILED_SUCCEEDED: &str =
    "reachable: the reconciler settles an UNKNOWN as SUCCEEDED";
pub const REACHES_SECOND_TOKEN_EFFECT: &str =
    "reachable: a retryable failure, a second token, and its charge SUCCEEDED";
pub const REACHES_STALE_REPORT_REFUSED: &str = "reachable: a stale holder's report is refused";
pub const REACHES_LATE_COMPLETE_SETTLES_UNKNOWN: &str =
    "reachable: a holder's late Complete settles an UNKNOWN";
pub const REACHES_EFFECT_WITH_UNKNOWN_ANSWER: &str =
    "reachable: charged, every client done, the intent UNKNOWN (the reconciler's job)";

pub const NO_ACQUISITION_AFTER_EFFECT: &str =
    "a Begin never acquires once the operation's effect exists (no purge re-opens it)";
pub const PAST_WINDOW_FAILS_CLOSED: &str =
    "a Begin past the retained window is never acquired (fails closed)";
pub const STUCK_STAYS_UNKNOWN: &str = "the reconciler never settles an attempt it found stuck";
pub const REACHES_EXPIRED_AFTER_PURGE: &str =
    "reachable: charged, settled, purged, and a later Begin answers EXPIRED";
pub const REACHES_LOST_BEGIN_ANSWER_RETRIED: &str =
    "reachable: a restart loses a Begin's answer and the retry gets the same acquisition";
pub const REACHES_RECONCILED_AFTER_RESTART: &str =
    "reachable: a restart drops the reconciler's pending resolve and a later pass settles it";
pub const REACHES_STUCK: &str =
    "reachable: charged, the provider forgot, every client done, the attempt stuck UNKNOWN";

/// The always-properties, for tests that check each one.
pub const SAFETY_PROPERTIES: [&str; 7] = [
    AT_MOST_ONE_EFFECT,
    NO_SUCCEEDED_WITHOUT_EFFECT,
    NO_CALL_WHILE_EFFECT_POSSIBLE,
    STALE_TOKEN_CHANGES_NOTHING,
    NO_ACQUISITION_AFTER_EFFECT,
    PAST_WINDOW_FAILS_CLOSED,
    STUCK_STAYS_UNKNOWN,
];

/// The sometimes-properties of the standard bounds: states the model must reach, or it
/// proves nothing.
pub const REACHABILITY_PROPERTIES: [&str; 8] = [
    REACHES_RECONCILED_SUCCEEDED,
    REACHES_SECOND_TOKEN_EFFECT,
    REACHES_STALE_REPORT_REFUSED,
    REACHES_LATE_COMPLETE_SETTLES_UNKNOWN,
    REACHES_EFFECT_WITH_UNKNOWN_ANSWER,
    REACHES_EXPIRED_AFTER_PURGE,
    REACHES_LOST_BEGIN_ANSWER_RETRIED,
    REACHES_RECONCILED_AFTER_RESTART,
];

/// The sometimes-properties of [`DedupModel::stuck`].
pub const STUCK_REACHABILITY_PROPERTIES: [&str; 2] = [REACHES_STUCK, REACHES_RECONCILED_SUCCEEDED];
