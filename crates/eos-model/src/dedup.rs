//! The dedup intent protocol as a [`stateright::Model`]: clients racing `Begin` on one operation
//! id, leases that run out, a provider that applies charges and loses answers, late and repeated
//! holder reports, and the reconciler.
//!
//! Every step that the services decide is decided by their own code:
//! - the `Begin` upsert applies [`next_state`] with `Acquire`, `ExpireLease` or `Reacquire`
//!   (in the order of the `CASE` in `intent_store.rs`), then answers with [`begin_outcome`];
//! - the lease sweep applies [`next_state`] with `ExpireLease`;
//! - a holder sorts the provider's answer with [`classify`] and reports through the store's
//!   guard: the transition's [`Transition::from_states`] (via [`next_state`]) and, when
//!   [`Transition::needs_token`], an equal fencing token and its secret — the `WHERE state =
//!   ANY(..) AND fencing_token = .. AND <secret matches>` of the SQL statement. The secret is
//!   modelled as a value bound to each acquisition ([`secret_of`]): a holder has only the
//!   secret its own Begin answered, so a stale holder never has the current one;
//! - the reconciler asks the provider by key and settles with [`decide`], then resolves through
//!   the same guard with the token it read (`expected_fencing_token`).
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
    next_state,
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
}

/// The bounds of one exhaustive run.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DedupModel {
    /// Clients racing on the operation id.
    pub clients: u8,
    /// How many times each client may call `Begin`.
    pub begins_per_client: u8,
    /// The clock runs from 0 to this tick.
    pub max_tick: u8,
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
            // Far beyond the clock's end: a "no record" is always evidence here (the key TTL
            // is a separate check, `config.rs`).
            provider_key_ttl: std::time::Duration::from_secs(3600),
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

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DedupState {
    pub now: u8,
    pub row: Option<Row>,
    pub clients: Vec<Client>,
    pub begins_left: Vec<u8>,
    /// Sorted, so that the same set is the same state.
    pub in_flight: Vec<Request>,
    /// The provider's charges for the key: the fencing token of the request each came from.
    pub effects: Vec<u8>,
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
}

/// What the reconciler will resolve an UNKNOWN to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Settle {
    Succeeded,
    FailedRetryable,
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
    /// The reconciler's conditional resolve.
    ReconcileResolve,
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

/// The store's guard for `transition` from `row`: the state must be one the transition starts
/// from, and the token equal when the transition needs one (or when the caller expects one) —
/// for a holder's report, with the secret of its acquisition matching the row's.
/// `None`: the statement matches no row and changes nothing.
fn guarded(
    row: &Row,
    transition: Transition,
    token: Option<(u8, Option<FencingSecret>)>,
) -> Option<IntentState> {
    let token_ok = token.is_none_or(|(token, secret)| {
        token == row.fencing_token
            && secret.is_none_or(|secret| secret_of(row.fencing_token).matches(secret.as_bytes()))
    });
    let to = next_state(Some(row.state), transition)?;
    token_ok.then_some(to)
}

impl DedupModel {
    /// The `Begin` upsert for one client, then its answer.
    fn begin(&self, state: &mut DedupState, client: u8) {
        let now = state.now;
        let nth = self.begins_per_client - state.begins_left[usize::from(client)];
        state.begins_left[usize::from(client)] -= 1;
        let fresh = |token: u8| Row {
            state: IntentState::Reserved,
            fencing_token: token,
            holder: client,
            request: (client, nth),
            retryable: false,
            acquired_at: now,
            lease_expires_at: now + LEASE_TICKS,
            updated_at: now,
        };
        let row = match state.row {
            None => {
                let to = next_state(None, Transition::Acquire);
                debug_assert_eq!(to, Some(IntentState::Reserved));
                fresh(1)
            }
            Some(row) if row.state == IntentState::Reserved && row.lease_expires_at <= now => {
                let mut row = row;
                if self.bug == Some(Bug::ExpireToFailed) {
                    row.state = IntentState::Failed;
                    row.retryable = true;
                } else if let Some(to) = next_state(Some(row.state), Transition::ExpireLease) {
                    row.state = to;
                }
                row.updated_at = now;
                row
            }
            Some(row) if row.state == IntentState::Failed && row.retryable => {
                match next_state(Some(row.state), Transition::Reacquire) {
                    Some(_) => fresh(row.fencing_token + 1),
                    None => row,
                }
            }
            Some(row)
                if row.state == IntentState::Unknown
                    && self.bug == Some(Bug::BeginReacquiresUnknown) =>
            {
                fresh(row.fencing_token + 1)
            }
            Some(row) => row,
        };
        state.row = Some(row);
        let owner = owner(client);
        let request = request_id((client, nth));
        let ask = BeginAsk {
            fingerprint: FINGERPRINT,
            owner: &owner,
            request_id: &request,
        };
        state.clients[usize::from(client)] = match begin_outcome(&intent(&row), &ask) {
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

impl Model for DedupModel {
    type State = DedupState;
    type Action = Action;

    fn init_states(&self) -> Vec<Self::State> {
        let n = usize::from(self.clients);
        vec![DedupState {
            now: 0,
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
        }]
    }

    fn actions(&self, state: &Self::State, actions: &mut Vec<Self::Action>) {
        if state.now < self.max_tick {
            actions.push(Action::Tick);
        }
        for client in 0..self.clients {
            match state.clients[usize::from(client)] {
                Client::Idle if state.begins_left[usize::from(client)] > 0 => {
                    actions.push(Action::Begin(client));
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
        }
        if state.reconciling.is_some() {
            actions.push(Action::ReconcileResolve);
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
            Action::Begin(client) => self.begin(&mut state, client),
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
                state.effects.push(request.token);
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
                let lookup = if state.effects.is_empty() {
                    ChargeLookup::NotFound
                } else {
                    ChargeLookup::Found(Vec::new())
                };
                let decision = decide(&intent(&row), &lookup, at(state.now), &self.settings());
                let settle = match decision {
                    Decision::Succeeded { .. } => Settle::Succeeded,
                    Decision::FailedRetryable { .. } => Settle::FailedRetryable,
                    Decision::Wait if self.bug == Some(Bug::ReconcilerSkipsInFlightWindow) => {
                        Settle::FailedRetryable
                    }
                    Decision::Wait | Decision::Stuck { .. } => return None,
                };
                state.reconciling = Some((row.fencing_token, settle));
            }
            Action::ReconcileResolve => {
                let (token, settle) = state.reconciling.take()?;
                let transition = match settle {
                    Settle::Succeeded => Transition::ResolveSucceeded,
                    Settle::FailedRetryable => Transition::ResolveFailed,
                };
                if let Some(row) = state.row
                    && let Some(to) = guarded(&row, transition, Some((token, None)))
                {
                    match settle {
                        Settle::Succeeded => state.reconciler_resolved_succeeded = true,
                        Settle::FailedRetryable => state.reconciler_resolved_failed = true,
                    }
                    state.row = Some(Row {
                        state: to,
                        retryable: settle == Settle::FailedRetryable,
                        updated_at: state.now,
                        ..row
                    });
                }
            }
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
            Property::sometimes(REACHES_RECONCILED_SUCCEEDED, |_, s: &DedupState| {
                s.reconciler_resolved_succeeded
                    && s.row.is_some_and(|r| r.state == IntentState::Succeeded)
            }),
            Property::sometimes(REACHES_SECOND_TOKEN_EFFECT, |_, s: &DedupState| {
                s.effects.contains(&2)
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
        ]
    }
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

/// The always-properties, for tests that check each one.
pub const SAFETY_PROPERTIES: [&str; 4] = [
    AT_MOST_ONE_EFFECT,
    NO_SUCCEEDED_WITHOUT_EFFECT,
    NO_CALL_WHILE_EFFECT_POSSIBLE,
    STALE_TOKEN_CHANGES_NOTHING,
];

/// The sometimes-properties: states the model must reach, or it proves nothing.
pub const REACHABILITY_PROPERTIES: [&str; 5] = [
    REACHES_RECONCILED_SUCCEEDED,
    REACHES_SECOND_TOKEN_EFFECT,
    REACHES_STALE_REPORT_REFUSED,
    REACHES_LATE_COMPLETE_SETTLES_UNKNOWN,
    REACHES_EFFECT_WITH_UNKNOWN_ANSWER,
];
