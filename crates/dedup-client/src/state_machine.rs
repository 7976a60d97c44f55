//! The intent state machine, as pure data: states, the transition table the store's conditional
//! statements are built from, and how a stored intent answers a `Begin`.
//!
//! ```text
//!            Begin (no row)                Complete(token)
//!   (none) ─────────────────▶ RESERVED ─────────────────────▶ SUCCEEDED
//!                              │   │  Fail(token)
//!                              │   └────────────────────────▶ FAILED ──┐ retryable: a later
//!        MarkUnknown(token) or │                                ▲      │ Begin acquires again
//!        lease ran out         ▼          Resolve / Complete /  │      │ (new fencing token)
//!                           UNKNOWN ─────────────────────────────┘      │
//!                              │          Fail(token)                   │
//!                              └──────────────▶ SUCCEEDED     RESERVED ◀┘
//! ```
//!
//! A lease that runs out turns the intent UNKNOWN, never FAILED: its holder may have called the
//! provider. Only evidence from the provider (or the holder reporting with the current token)
//! settles an UNKNOWN.

use std::fmt;

use time::OffsetDateTime;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IntentState {
    Reserved,
    Succeeded,
    Failed,
    Unknown,
}

impl IntentState {
    pub const ALL: [IntentState; 4] = [
        IntentState::Reserved,
        IntentState::Succeeded,
        IntentState::Failed,
        IntentState::Unknown,
    ];

    /// The spelling in the `state` column.
    pub fn as_db_str(self) -> &'static str {
        match self {
            Self::Reserved => "RESERVED",
            Self::Succeeded => "SUCCEEDED",
            Self::Failed => "FAILED",
            Self::Unknown => "UNKNOWN",
        }
    }

    pub fn from_db_str(value: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|state| state.as_db_str() == value)
    }

    /// SUCCEEDED and FAILED carry an outcome; RESERVED and UNKNOWN do not (yet).
    pub fn is_settled(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed)
    }

    /// The states the retention purge may delete, as the `state` column spells them (the
    /// purge statement's `state = ANY(..)`): the settled ones. A RESERVED or UNKNOWN row
    /// stands for a call whose outcome nobody knows yet, so it is never purged.
    pub fn purgeable_db_states() -> Vec<String> {
        Self::ALL
            .into_iter()
            .filter(|state| state.is_settled())
            .map(|state| state.as_db_str().to_owned())
            .collect()
    }
}

impl fmt::Display for IntentState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_db_str())
    }
}

/// Every way an intent changes state. The store turns each into one conditional statement whose
/// `WHERE state = ANY(..)` comes from [`Transition::from_states`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transition {
    /// Begin on an operation without a row.
    Acquire,
    /// Begin on a retryable FAILED operation with the same fingerprint: a new fencing token.
    Reacquire,
    /// The lease ran out without an outcome (lazily in Begin, or by the reconciler's sweep).
    ExpireLease,
    /// The holder reports that the provider applied the operation.
    Complete,
    /// The holder reports that the provider definitely did not apply it.
    Fail,
    /// The holder does not know whether the provider applied it.
    MarkUnknown,
    /// Evidence (the provider's record) shows it was applied.
    ResolveSucceeded,
    /// Evidence shows it was not applied.
    ResolveFailed,
}

impl Transition {
    pub const ALL: [Transition; 8] = [
        Transition::Acquire,
        Transition::Reacquire,
        Transition::ExpireLease,
        Transition::Complete,
        Transition::Fail,
        Transition::MarkUnknown,
        Transition::ResolveSucceeded,
        Transition::ResolveFailed,
    ];

    /// The states this transition may start from (`Acquire` starts from no row at all).
    pub fn from_states(self) -> &'static [IntentState] {
        use IntentState::*;
        match self {
            Self::Acquire => &[],
            // Only when the stored failure is retryable.
            Self::Reacquire => &[Failed],
            Self::ExpireLease => &[Reserved],
            // A holder whose lease ran out (UNKNOWN) may still report what the provider said, as
            // long as nobody acquired a newer token: that settles the UNKNOWN with evidence.
            Self::Complete | Self::Fail => &[Reserved, Unknown],
            Self::MarkUnknown => &[Reserved],
            Self::ResolveSucceeded | Self::ResolveFailed => &[Unknown],
        }
    }

    pub fn to_state(self) -> IntentState {
        match self {
            Self::Acquire | Self::Reacquire => IntentState::Reserved,
            Self::ExpireLease | Self::MarkUnknown => IntentState::Unknown,
            Self::Complete | Self::ResolveSucceeded => IntentState::Succeeded,
            Self::Fail | Self::ResolveFailed => IntentState::Failed,
        }
    }

    /// Whether the caller must present the current fencing token.
    pub fn needs_token(self) -> bool {
        matches!(self, Self::Complete | Self::Fail | Self::MarkUnknown)
    }

    /// A verb for messages: "cannot complete operation … in state SUCCEEDED".
    pub fn verb(self) -> &'static str {
        match self {
            Self::Acquire => "acquire",
            Self::Reacquire => "re-acquire",
            Self::ExpireLease => "expire the lease of",
            Self::Complete => "complete",
            Self::Fail => "fail",
            Self::MarkUnknown => "mark unknown",
            Self::ResolveSucceeded | Self::ResolveFailed => "resolve",
        }
    }

    /// The `from_states` as the `state` column spells them, for `state = ANY($n)`.
    pub fn from_db_states(self) -> Vec<String> {
        self.from_states()
            .iter()
            .map(|state| state.as_db_str().to_owned())
            .collect()
    }
}

/// The state after `transition` from `from` (`None`: no row), or `None` when not allowed.
pub fn next_state(from: Option<IntentState>, transition: Transition) -> Option<IntentState> {
    let allowed = match from {
        None => transition == Transition::Acquire,
        Some(state) => transition.from_states().contains(&state),
    };
    allowed.then(|| transition.to_state())
}

/// Whether `row` is a reservation whose lease ran out at `now`: the lease sweep and any Begin
/// turn it UNKNOWN ([`Transition::ExpireLease`]).
pub fn lease_ran_out(row: &Intent, now: OffsetDateTime) -> bool {
    row.state == IntentState::Reserved && row.lease_expires_at <= now
}

/// The transition a Begin inside the retained window applies to the stored `row`, if any: an
/// expired lease first, else a retryable failure of the same request is acquired again. The
/// store's upsert spells this rule as the `CASE`s of its `ON CONFLICT` update, in this order;
/// the equivalence test (`integration-tests/tests/it/dedup_transitions.rs`) runs every case
/// through both.
pub fn begin_transition(
    row: &Intent,
    fingerprint: &[u8],
    now: OffsetDateTime,
) -> Option<Transition> {
    if lease_ran_out(row, now) {
        Some(Transition::ExpireLease)
    } else if row.state == IntentState::Failed && row.retryable && row.fingerprint == fingerprint {
        Some(Transition::Reacquire)
    } else {
        None
    }
}

/// Whether a holder's Complete, Fail or MarkUnknown with `fencing_token` and `fencing_secret`
/// moves `row` by `transition`: the token is the current one, its secret matches, and the
/// transition starts from the row's state. The guard of the store's report statements.
pub fn holder_report_applies(
    row: &Intent,
    transition: Transition,
    fencing_token: i64,
    fencing_secret: &[u8],
) -> bool {
    row.fencing_token == fencing_token
        && next_state(Some(row.state), transition).is_some()
        && row.fencing_secret.matches(fencing_secret)
}

/// Whether a Resolve moves `row` by `transition` (ResolveSucceeded or ResolveFailed): the
/// transition starts from the row's state, and the token is the one the caller expects, when it
/// names one. The guard of the store's resolve statement.
pub fn resolution_applies(
    row: &Intent,
    transition: Transition,
    expected_fencing_token: Option<i64>,
) -> bool {
    expected_fencing_token.is_none_or(|token| token == row.fencing_token)
        && next_state(Some(row.state), transition).is_some()
}

/// The random half of a fencing token: 256 bits drawn from the operating system's CSPRNG (via
/// `rand`'s thread RNG) at every acquisition and stored with the row. The counter orders the
/// history but is guessable; the secret is what proves the caller is the holder. Only the
/// acquiring Begin (and its retries with the same request id) is ever told it.
///
/// Equality is constant time, and `Debug` does not print it.
#[derive(Clone, Copy, Eq)]
pub struct FencingSecret([u8; FencingSecret::LEN]);

impl FencingSecret {
    pub const LEN: usize = 32;

    /// A fresh secret for a new acquisition.
    pub fn random() -> Self {
        Self(rand::random())
    }

    /// `None` unless exactly [`FencingSecret::LEN`] bytes.
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        <[u8; Self::LEN]>::try_from(bytes).ok().map(Self)
    }

    pub fn as_bytes(&self) -> &[u8; Self::LEN] {
        &self.0
    }

    /// Constant time: the time taken does not depend on where the bytes differ, so a caller
    /// cannot learn the secret byte by byte from how fast it is refused.
    pub fn matches(&self, presented: &[u8]) -> bool {
        let Some(presented) = Self::from_bytes(presented) else {
            return false;
        };
        constant_time_eq(&self.0, &presented.0)
    }
}

impl PartialEq for FencingSecret {
    fn eq(&self, other: &Self) -> bool {
        constant_time_eq(&self.0, &other.0)
    }
}

impl fmt::Debug for FencingSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("FencingSecret(<redacted>)")
    }
}

/// Equality of two equally long byte strings in time independent of their contents.
pub fn constant_time_eq<const N: usize>(a: &[u8; N], b: &[u8; N]) -> bool {
    let difference = a
        .iter()
        .zip(b.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y));
    // black_box keeps the optimiser from turning the fold into an early-exit comparison.
    std::hint::black_box(difference) == 0
}

/// What a holder presents to Complete / Fail / MarkUnknown: the counter of its acquisition and
/// that acquisition's secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FencingToken {
    pub counter: i64,
    pub secret: FencingSecret,
}

/// One row of `dedup_intents`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Intent {
    pub operation_id: String,
    pub state: IntentState,
    pub fingerprint: Vec<u8>,
    pub fencing_token: i64,
    /// The secret of the current acquisition (never sent to anyone but its holder).
    pub fencing_secret: FencingSecret,
    pub holder: String,
    /// The `request_id` of the Begin that acquired the current token.
    pub request_id: String,
    pub lease_expires_at: OffsetDateTime,
    pub occurred_at: OffsetDateTime,
    pub created_at: OffsetDateTime,
    pub updated_at: OffsetDateTime,
    /// When the current fencing token was issued.
    pub acquired_at: OffsetDateTime,
    pub result: Option<Vec<u8>>,
    pub failure_reason: Option<String>,
    pub retryable: bool,
    pub detail: String,
    /// The trace context of the Begin that acquired the current token, if it had one.
    pub trace_context: Option<String>,
}

/// What a Begin asked for, as far as the answer depends on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BeginAsk<'a> {
    pub fingerprint: &'a [u8],
    pub owner: &'a str,
    pub request_id: &'a str,
}

/// The answer to a Begin. Only `Acquired` allows a call to the provider.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BeginOutcome {
    Acquired {
        fencing_token: FencingToken,
        lease_expires_at: OffsetDateTime,
    },
    InProgress {
        holder: String,
        lease_expires_at: OffsetDateTime,
    },
    Succeeded {
        result: Vec<u8>,
    },
    Failed {
        reason: String,
        retryable: bool,
    },
    Unknown {
        detail: String,
        /// Set when the reconciler found the operation stuck for good: no record at the provider
        /// after its key retention. Only an operator's Resolve settles it.
        stuck_reason: Option<String>,
    },
    Conflict {
        stored_fingerprint: Vec<u8>,
    },
    Expired {
        retained_since: OffsetDateTime,
    },
}

impl BeginOutcome {
    /// A label for metrics and logs.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Acquired { .. } => "acquired",
            Self::InProgress { .. } => "in_progress",
            Self::Succeeded { .. } => "succeeded",
            Self::Failed { .. } => "failed",
            Self::Unknown {
                stuck_reason: Some(_),
                ..
            } => "stuck",
            Self::Unknown { .. } => "unknown",
            Self::Conflict { .. } => "conflict",
            Self::Expired { .. } => "expired",
        }
    }
}

/// The answer to a Begin inside the retained window, from the row as the upsert left it.
///
/// The upsert already applied whatever transition was due (acquire, re-acquire, lease expiry),
/// so the row is the truth; what is left is to say what it means for this caller. The caller
/// acquired exactly when the row holds a live reservation made by its own request id.
pub fn begin_outcome(row: &Intent, ask: &BeginAsk<'_>) -> BeginOutcome {
    if row.fingerprint != ask.fingerprint {
        return BeginOutcome::Conflict {
            stored_fingerprint: row.fingerprint.clone(),
        };
    }
    match row.state {
        IntentState::Reserved => {
            let ours = row.holder == ask.owner && row.request_id == ask.request_id;
            if ours {
                BeginOutcome::Acquired {
                    fencing_token: FencingToken {
                        counter: row.fencing_token,
                        secret: row.fencing_secret,
                    },
                    lease_expires_at: row.lease_expires_at,
                }
            } else {
                BeginOutcome::InProgress {
                    holder: row.holder.clone(),
                    lease_expires_at: row.lease_expires_at,
                }
            }
        }
        IntentState::Succeeded => BeginOutcome::Succeeded {
            result: row.result.clone().unwrap_or_default(),
        },
        IntentState::Failed => BeginOutcome::Failed {
            reason: row.failure_reason.clone().unwrap_or_default(),
            retryable: row.retryable,
        },
        IntentState::Unknown => BeginOutcome::Unknown {
            detail: row.detail.clone(),
            stuck_reason: None,
        },
    }
}

/// Whether an operation that occurred at `occurred_at` is inside the retained window, which
/// starts at `retained_since` (now − retention): a Begin acquires only such operations; older
/// ones are answered by [`expired_outcome`]. The Begin statement's
/// `WHERE occurred_at >= now() - retention` says the same.
pub fn in_retained_window(occurred_at: OffsetDateTime, retained_since: OffsetDateTime) -> bool {
    occurred_at >= retained_since
}

/// Whether the retention purge deletes `row` when the retained window starts at
/// `retained_since`: a settled intent ([`IntentState::purgeable_db_states`]) whose operation
/// occurred, and whose last change happened, before the window. The purge statement's `WHERE`
/// is these three conditions. Its operation is then outside the window, so a Begin for it gets
/// [`expired_outcome`] and is never acquired: purging the row cannot re-open the operation.
pub fn purgeable(row: &Intent, retained_since: OffsetDateTime) -> bool {
    row.state.is_settled()
        && !in_retained_window(row.occurred_at, retained_since)
        && row.updated_at < retained_since
}

/// The answer to a Begin for an operation that occurred before the retained window.
///
/// Such an operation is never acquired (its dedup row may already have been purged, so a new
/// call could be a second effect). A surviving row still answers when its answer leads to no
/// call: a stored result, a final failure, an UNKNOWN, a live lease, a conflict.
pub fn expired_outcome(
    row: Option<&Intent>,
    ask: &BeginAsk<'_>,
    retained_since: OffsetDateTime,
    now: OffsetDateTime,
) -> BeginOutcome {
    let expired = BeginOutcome::Expired { retained_since };
    let Some(row) = row else {
        return expired;
    };
    if row.fingerprint != ask.fingerprint {
        return BeginOutcome::Conflict {
            stored_fingerprint: row.fingerprint.clone(),
        };
    }
    match row.state {
        IntentState::Failed if row.retryable => expired,
        IntentState::Reserved if row.lease_expires_at <= now => BeginOutcome::Unknown {
            detail: "lease expired without an outcome".into(),
            stuck_reason: None,
        },
        IntentState::Reserved => BeginOutcome::InProgress {
            holder: row.holder.clone(),
            lease_expires_at: row.lease_expires_at,
        },
        _ => begin_outcome(row, ask),
    }
}

#[cfg(test)]
mod tests {
    use time::macros::datetime;

    use super::*;
    use IntentState::*;
    use Transition::*;

    fn row(state: IntentState) -> Intent {
        Intent {
            operation_id: "op-1".into(),
            state,
            fingerprint: vec![1; 32],
            fencing_token: 3,
            fencing_secret: FencingSecret([7; FencingSecret::LEN]),
            holder: "worker-a".into(),
            request_id: "req-a".into(),
            lease_expires_at: datetime!(2026-01-01 0:00:30 UTC),
            occurred_at: datetime!(2026-01-01 0:00 UTC),
            created_at: datetime!(2026-01-01 0:00 UTC),
            updated_at: datetime!(2026-01-01 0:00 UTC),
            acquired_at: datetime!(2026-01-01 0:00 UTC),
            result: None,
            failure_reason: None,
            retryable: false,
            detail: String::new(),
            trace_context: None,
        }
    }

    fn ask<'a>(fingerprint: &'a [u8], owner: &'a str, request_id: &'a str) -> BeginAsk<'a> {
        BeginAsk {
            fingerprint,
            owner,
            request_id,
        }
    }

    /// The whole table, written out: (from, transition) → to. Anything not listed is refused.
    #[test]
    fn transition_table() {
        let allowed: &[(Option<IntentState>, Transition, IntentState)] = &[
            (None, Acquire, Reserved),
            (Some(Failed), Reacquire, Reserved),
            (Some(Reserved), ExpireLease, Unknown),
            (Some(Reserved), Complete, Succeeded),
            (Some(Unknown), Complete, Succeeded),
            (Some(Reserved), Fail, Failed),
            (Some(Unknown), Fail, Failed),
            (Some(Reserved), MarkUnknown, Unknown),
            (Some(Unknown), ResolveSucceeded, Succeeded),
            (Some(Unknown), ResolveFailed, Failed),
        ];
        let froms = std::iter::once(None).chain(IntentState::ALL.into_iter().map(Some));
        for from in froms {
            for transition in Transition::ALL {
                let expected = allowed
                    .iter()
                    .find(|(f, t, _)| *f == from && *t == transition)
                    .map(|(_, _, to)| *to);
                assert_eq!(
                    next_state(from, transition),
                    expected,
                    "{from:?} --{transition:?}-->"
                );
            }
        }
    }

    #[test]
    fn settled_states_are_never_left_except_a_retryable_failure() {
        for transition in Transition::ALL {
            assert_eq!(
                next_state(Some(Succeeded), transition),
                None,
                "{transition:?}"
            );
        }
        let leaving_failed: Vec<_> = Transition::ALL
            .into_iter()
            .filter(|t| next_state(Some(Failed), *t).is_some())
            .collect();
        assert_eq!(leaving_failed, vec![Reacquire]);
    }

    #[test]
    fn an_unknown_is_never_acquired_again_without_evidence() {
        for transition in Transition::ALL {
            assert_ne!(
                next_state(Some(Unknown), transition),
                Some(Reserved),
                "{transition:?} must not re-reserve an UNKNOWN"
            );
        }
    }

    #[test]
    fn only_holder_reports_need_the_token() {
        let with_token: Vec<_> = Transition::ALL
            .into_iter()
            .filter(|t| t.needs_token())
            .collect();
        assert_eq!(with_token, vec![Complete, Fail, MarkUnknown]);
    }

    #[test]
    fn db_spelling_round_trips() {
        for state in IntentState::ALL {
            assert_eq!(IntentState::from_db_str(state.as_db_str()), Some(state));
        }
        assert_eq!(IntentState::from_db_str("reserved"), None);
        assert_eq!(Complete.from_db_states(), vec!["RESERVED", "UNKNOWN"]);
    }

    #[test]
    fn the_acquiring_request_gets_acquired_and_others_in_progress() {
        let reserved = row(Reserved);
        let fp = vec![1; 32];
        assert!(matches!(
            begin_outcome(&reserved, &ask(&fp, "worker-a", "req-a")),
            BeginOutcome::Acquired {
                fencing_token: FencingToken { counter: 3, secret },
                ..
            } if secret == reserved.fencing_secret
        ));
        for (owner, request) in [("worker-b", "req-a"), ("worker-a", "req-b")] {
            assert!(matches!(
                begin_outcome(&reserved, &ask(&fp, owner, request)),
                BeginOutcome::InProgress { ref holder, .. } if holder == "worker-a"
            ));
        }
    }

    #[test]
    fn only_the_acquiring_request_learns_the_secret() {
        let reserved = row(Reserved);
        let fp = vec![1; 32];
        let other = begin_outcome(&reserved, &ask(&fp, "worker-b", "req-b"));
        assert!(
            !format!("{other:?}").contains("7, 7"),
            "an InProgress answer carries no secret: {other:?}"
        );
        assert!(
            !format!("{reserved:?}").contains("7, 7"),
            "Debug of a row redacts the secret"
        );
    }

    #[test]
    fn secrets_are_random_and_compared_whole() {
        let a = FencingSecret::random();
        let b = FencingSecret::random();
        assert_ne!(a, b, "256 random bits never repeat");
        assert!(a.matches(a.as_bytes()));
        let mut one_bit_off = *a.as_bytes();
        one_bit_off[FencingSecret::LEN - 1] ^= 1;
        assert!(!a.matches(&one_bit_off));
        assert!(
            !a.matches(&a.as_bytes()[..16]),
            "a prefix is not the secret"
        );
        assert!(!a.matches(&[]), "no secret is not the secret");
        assert!(FencingSecret::from_bytes(&[0; 31]).is_none());
    }

    #[test]
    fn another_fingerprint_is_a_conflict_in_every_state() {
        let other = vec![2; 32];
        for state in IntentState::ALL {
            assert!(matches!(
                begin_outcome(&row(state), &ask(&other, "worker-a", "req-a")),
                BeginOutcome::Conflict { .. }
            ));
        }
    }

    #[test]
    fn settled_and_unknown_rows_answer_without_a_call() {
        let fp = vec![1; 32];
        let a = ask(&fp, "worker-a", "req-a");
        let mut succeeded = row(Succeeded);
        succeeded.result = Some(b"{\"ok\":true}".to_vec());
        assert_eq!(
            begin_outcome(&succeeded, &a),
            BeginOutcome::Succeeded {
                result: b"{\"ok\":true}".to_vec()
            }
        );
        let mut failed = row(Failed);
        failed.failure_reason = Some("card declined".into());
        assert_eq!(
            begin_outcome(&failed, &a),
            BeginOutcome::Failed {
                reason: "card declined".into(),
                retryable: false
            }
        );
        assert!(matches!(
            begin_outcome(&row(Unknown), &a),
            BeginOutcome::Unknown { .. }
        ));
    }

    #[test]
    fn expired_operations_are_never_acquired() {
        let fp = vec![1; 32];
        let a = ask(&fp, "worker-a", "req-a");
        let since = datetime!(2025-12-01 0:00 UTC);
        let now = datetime!(2026-01-01 0:00:10 UTC);
        assert_eq!(
            expired_outcome(None, &a, since, now),
            BeginOutcome::Expired {
                retained_since: since
            }
        );
        let mut retryable = row(Failed);
        retryable.retryable = true;
        assert!(matches!(
            expired_outcome(Some(&retryable), &a, since, now),
            BeginOutcome::Expired { .. }
        ));
        // Even the holder's own live reservation is reported, not handed out again.
        assert!(matches!(
            expired_outcome(Some(&row(Reserved)), &a, since, now),
            BeginOutcome::InProgress { .. }
        ));
        let late = datetime!(2026-01-01 0:01 UTC);
        assert!(matches!(
            expired_outcome(Some(&row(Reserved)), &a, since, late),
            BeginOutcome::Unknown { .. }
        ));
        assert!(matches!(
            expired_outcome(Some(&row(Succeeded)), &a, since, now),
            BeginOutcome::Succeeded { .. }
        ));
    }

    #[test]
    fn only_settled_rows_older_than_the_window_are_purged() {
        // row(..) occurred and was last changed at 2026-01-01 0:00.
        let after = datetime!(2026-01-01 0:00:01 UTC);
        let at = datetime!(2026-01-01 0:00 UTC);
        assert!(purgeable(&row(Succeeded), after));
        assert!(purgeable(&row(Failed), after));
        // Inside the window (occurred exactly at its start) is kept.
        assert!(!purgeable(&row(Succeeded), at));
        // An outcome nobody knows yet is kept however old.
        assert!(!purgeable(&row(Unknown), after));
        assert!(!purgeable(&row(Reserved), after));
        // Changed inside the window (a late resolve) is kept.
        let mut late = row(Succeeded);
        late.updated_at = datetime!(2026-01-01 0:00:02 UTC);
        assert!(!purgeable(&late, after));
        assert_eq!(
            IntentState::purgeable_db_states(),
            vec!["SUCCEEDED".to_owned(), "FAILED".to_owned()]
        );
        assert!(in_retained_window(at, at));
        assert!(!in_retained_window(at, after));
    }
}
