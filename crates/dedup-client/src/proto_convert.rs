//! Domain values ↔ `eos.dedup.v1` messages. Pure.

use eos_proto::dedup::v1 as pb;
use pb::begin_response::Outcome;
use time::OffsetDateTime;

use crate::state_machine::{BeginOutcome, FencingSecret, FencingToken, Intent, IntentState};

pub fn timestamp(at: OffsetDateTime) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: at.unix_timestamp(),
        nanos: at.nanosecond() as i32,
    }
}

pub fn from_timestamp(at: &prost_types::Timestamp) -> Option<OffsetDateTime> {
    let nanos = i128::from(at.seconds) * 1_000_000_000 + i128::from(at.nanos);
    OffsetDateTime::from_unix_timestamp_nanos(nanos).ok()
}

pub fn state(state: IntentState) -> pb::IntentState {
    match state {
        IntentState::Reserved => pb::IntentState::Reserved,
        IntentState::Succeeded => pb::IntentState::Succeeded,
        IntentState::Failed => pb::IntentState::Failed,
        IntentState::Unknown => pb::IntentState::Unknown,
    }
}

pub fn from_state(state: pb::IntentState) -> Option<IntentState> {
    match state {
        pb::IntentState::Reserved => Some(IntentState::Reserved),
        pb::IntentState::Succeeded => Some(IntentState::Succeeded),
        pb::IntentState::Failed => Some(IntentState::Failed),
        pb::IntentState::Unknown => Some(IntentState::Unknown),
        pb::IntentState::Unspecified => None,
    }
}

/// The intent as any authorised caller may see it: without its fencing secret.
pub fn intent(intent: Intent) -> pb::Intent {
    pb::Intent {
        operation_id: intent.operation_id,
        state: state(intent.state) as i32,
        fingerprint: intent.fingerprint,
        fencing_token: intent.fencing_token,
        holder: intent.holder,
        lease_expires_at: Some(timestamp(intent.lease_expires_at)),
        occurred_at: Some(timestamp(intent.occurred_at)),
        created_at: Some(timestamp(intent.created_at)),
        updated_at: Some(timestamp(intent.updated_at)),
        result: intent.result.unwrap_or_default(),
        failure_reason: intent.failure_reason.unwrap_or_default(),
        retryable: intent.retryable,
        detail: intent.detail,
        // The reconciler's verdict is kept next to the state machine's intent, not in it:
        // dedup-service adds it to Get and ListUnknown answers.
        stuck_reason: String::new(),
    }
}

pub fn begin_response(operation_id: String, outcome: BeginOutcome) -> pb::BeginResponse {
    let outcome = match outcome {
        BeginOutcome::Acquired {
            fencing_token,
            lease_expires_at,
        } => Outcome::Acquired(pb::Acquired {
            fencing_token: fencing_token.counter,
            lease_expires_at: Some(timestamp(lease_expires_at)),
            fencing_secret: fencing_token.secret.as_bytes().to_vec(),
        }),
        BeginOutcome::InProgress {
            holder,
            lease_expires_at,
        } => Outcome::InProgress(pb::InProgress {
            holder,
            lease_expires_at: Some(timestamp(lease_expires_at)),
        }),
        BeginOutcome::Succeeded { result } => Outcome::Succeeded(pb::Succeeded { result }),
        BeginOutcome::Failed { reason, retryable } => {
            Outcome::Failed(pb::Failed { reason, retryable })
        }
        BeginOutcome::Unknown {
            detail,
            stuck_reason,
        } => Outcome::Unknown(pb::Unknown {
            detail,
            stuck_reason: stuck_reason.unwrap_or_default(),
        }),
        BeginOutcome::Conflict { stored_fingerprint } => {
            Outcome::Conflict(pb::Conflict { stored_fingerprint })
        }
        BeginOutcome::Expired { retained_since } => Outcome::Expired(pb::Expired {
            retained_since: Some(timestamp(retained_since)),
        }),
    };
    pb::BeginResponse {
        operation_id,
        outcome: Some(outcome),
    }
}

/// The outcome of a Begin answer; `None` for an answer without one, or an ACQUIRED without a
/// well-formed secret (a protocol error).
pub fn begin_outcome(response: pb::BeginResponse) -> Option<BeginOutcome> {
    let at = |t: Option<prost_types::Timestamp>| {
        t.as_ref()
            .and_then(from_timestamp)
            .unwrap_or(OffsetDateTime::UNIX_EPOCH)
    };
    Some(match response.outcome? {
        Outcome::Acquired(a) => BeginOutcome::Acquired {
            fencing_token: FencingToken {
                counter: a.fencing_token,
                secret: FencingSecret::from_bytes(&a.fencing_secret)?,
            },
            lease_expires_at: at(a.lease_expires_at),
        },
        Outcome::InProgress(p) => BeginOutcome::InProgress {
            holder: p.holder,
            lease_expires_at: at(p.lease_expires_at),
        },
        Outcome::Succeeded(s) => BeginOutcome::Succeeded { result: s.result },
        Outcome::Failed(f) => BeginOutcome::Failed {
            reason: f.reason,
            retryable: f.retryable,
        },
        Outcome::Unknown(u) => BeginOutcome::Unknown {
            detail: u.detail,
            stuck_reason: Some(u.stuck_reason).filter(|reason| !reason.is_empty()),
        },
        Outcome::Conflict(c) => BeginOutcome::Conflict {
            stored_fingerprint: c.stored_fingerprint,
        },
        Outcome::Expired(e) => BeginOutcome::Expired {
            retained_since: at(e.retained_since),
        },
    })
}

#[cfg(test)]
mod tests {
    use time::macros::datetime;

    use super::*;

    #[test]
    fn begin_outcomes_round_trip() {
        let at = datetime!(2026-03-01 12:00:00.123456 UTC);
        let outcomes = [
            BeginOutcome::Acquired {
                fencing_token: FencingToken {
                    counter: 7,
                    secret: FencingSecret::random(),
                },
                lease_expires_at: at,
            },
            BeginOutcome::InProgress {
                holder: "w".into(),
                lease_expires_at: at,
            },
            BeginOutcome::Succeeded {
                result: b"r".to_vec(),
            },
            BeginOutcome::Failed {
                reason: "no".into(),
                retryable: true,
            },
            BeginOutcome::Unknown {
                detail: "d".into(),
                stuck_reason: None,
            },
            BeginOutcome::Unknown {
                detail: "d".into(),
                stuck_reason: Some("older than the provider's key TTL".into()),
            },
            BeginOutcome::Conflict {
                stored_fingerprint: vec![1],
            },
            BeginOutcome::Expired { retained_since: at },
        ];
        for outcome in outcomes {
            let response = begin_response("op".into(), outcome.clone());
            assert_eq!(begin_outcome(response), Some(outcome));
        }
        assert_eq!(
            begin_outcome(pb::BeginResponse {
                operation_id: "op".into(),
                outcome: None
            }),
            None
        );
        let without_secret = pb::BeginResponse {
            operation_id: "op".into(),
            outcome: Some(Outcome::Acquired(pb::Acquired {
                fencing_token: 1,
                lease_expires_at: None,
                fencing_secret: Vec::new(),
            })),
        };
        assert_eq!(begin_outcome(without_secret), None);
    }
}
