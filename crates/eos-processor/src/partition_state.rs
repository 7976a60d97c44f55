//! The state of one input partition — per-entity transform state and the event ids seen within
//! the dedup horizon — and the pure decision for each record. No I/O here.
//!
//! A batch never mutates the committed state directly: its changes go to an [`Overlay`], which is
//! merged only after the Kafka transaction that carries the same changes to the changelog has
//! committed, and simply dropped on abort. So in-memory state always equals the changelog.

use std::collections::{HashMap, HashSet};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use eos_core::{DeadLetterReason, EventEnvelope, Fingerprint};

use crate::transform::{SourcePosition, Transform};

/// An event id remembered for dedup, until `expires_at` (unix seconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeenEvent {
    #[serde(rename = "fp")]
    pub fingerprint: Fingerprint,
    #[serde(rename = "exp")]
    pub expires_at: i64,
}

/// Committed state of one partition.
#[derive(Debug, Clone)]
pub struct PartitionState<S> {
    entities: HashMap<String, S>,
    seen: HashMap<String, SeenEvent>,
}

impl<S> Default for PartitionState<S> {
    fn default() -> Self {
        Self {
            entities: HashMap::new(),
            seen: HashMap::new(),
        }
    }
}

/// Uncommitted changes of the open batch for one partition.
#[derive(Debug, Clone)]
pub struct Overlay<S> {
    pub entities: HashMap<String, S>,
    pub seen: HashMap<String, SeenEvent>,
    pub expired: HashSet<String>,
}

impl<S> Default for Overlay<S> {
    fn default() -> Self {
        Self {
            entities: HashMap::new(),
            seen: HashMap::new(),
            expired: HashSet::new(),
        }
    }
}

impl<S> Overlay<S> {
    pub fn is_empty(&self) -> bool {
        self.entities.is_empty() && self.seen.is_empty() && self.expired.is_empty()
    }
}

/// What to do with one input record.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// A new event: write this output value, keyed by the entity.
    Emit {
        event_id: String,
        entity_id: String,
        output: Map<String, Value>,
    },
    /// The same event again (same id, same fingerprint): drop it, count it.
    Duplicate { event_id: String },
    /// Quarantine the original bytes with this reason.
    DeadLetter {
        reason: DeadLetterReason,
        detail: String,
        event_id: Option<String>,
    },
}

/// The limits the decision needs.
#[derive(Debug, Clone, Copy)]
pub struct DedupPolicy {
    pub horizon_secs: i64,
    pub max_record_bytes: usize,
}

/// One input record as the decision sees it.
#[derive(Debug, Clone, Copy)]
pub struct InputRecord<'a> {
    pub value: Option<&'a [u8]>,
    /// The record's timestamp (unix seconds), the event time when the envelope has no
    /// `occurred_at`.
    pub timestamp_secs: i64,
}

impl<S: Clone + Default> PartitionState<S> {
    pub fn entity_count(&self) -> usize {
        self.entities.len()
    }

    pub fn seen_count(&self) -> usize {
        self.seen.len()
    }

    fn seen<'a>(&'a self, overlay: &'a Overlay<S>, event_id: &str) -> Option<&'a SeenEvent> {
        if let Some(seen) = overlay.seen.get(event_id) {
            return Some(seen);
        }
        if overlay.expired.contains(event_id) {
            return None;
        }
        self.seen.get(event_id)
    }

    /// Decides what `record` becomes, recording a new event's effects in `overlay`.
    pub fn decide<T: Transform<EntityState = S>>(
        &self,
        overlay: &mut Overlay<S>,
        transform: &T,
        record: InputRecord<'_>,
        source: &SourcePosition,
        now_secs: i64,
        policy: DedupPolicy,
    ) -> Decision {
        let envelope = match record.value {
            None => Err(eos_core::EnvelopeError::Empty),
            Some(bytes) => EventEnvelope::parse_with_limit(bytes, policy.max_record_bytes),
        };
        let envelope = match envelope {
            Ok(envelope) => envelope,
            Err(error) => {
                return Decision::DeadLetter {
                    reason: error.reason(),
                    detail: error.to_string(),
                    event_id: None,
                };
            }
        };
        let event_id = envelope.event_id.to_string();
        let event_time = envelope
            .occurred_at
            .map(|t| t.unix_timestamp())
            .unwrap_or(record.timestamp_secs);
        // Fail closed: past the horizon a duplicate could no longer be recognised.
        if event_time < now_secs.saturating_sub(policy.horizon_secs) {
            return Decision::DeadLetter {
                reason: DeadLetterReason::BeyondDedupHorizon,
                detail: format!(
                    "event time {event_time} is older than the dedup horizon of {} s",
                    policy.horizon_secs
                ),
                event_id: Some(event_id),
            };
        }
        let fingerprint = envelope.fingerprint();
        if let Some(seen) = self.seen(overlay, &event_id) {
            if seen.fingerprint == fingerprint {
                return Decision::Duplicate { event_id };
            }
            return Decision::DeadLetter {
                reason: DeadLetterReason::EventIdConflict,
                detail: format!(
                    "event_id already applied with fingerprint {}, this record has {fingerprint}",
                    seen.fingerprint
                ),
                event_id: Some(event_id),
            };
        }
        let entity_id = envelope.entity_id.to_string();
        let mut entity_state = overlay
            .entities
            .get(&entity_id)
            .or_else(|| self.entities.get(&entity_id))
            .cloned()
            .unwrap_or_default();
        let output = match transform.apply(&mut entity_state, &envelope, source) {
            Ok(output) => output,
            // Nothing recorded: the state stays as it was and the id is not remembered, so a
            // redelivery is refused the same way.
            Err(refusal) => {
                return Decision::DeadLetter {
                    reason: refusal.reason,
                    detail: refusal.detail,
                    event_id: Some(event_id),
                };
            }
        };
        overlay.entities.insert(entity_id.clone(), entity_state);
        overlay.seen.insert(
            event_id.clone(),
            SeenEvent {
                fingerprint,
                expires_at: event_time.saturating_add(policy.horizon_secs),
            },
        );
        Decision::Emit {
            event_id,
            entity_id,
            output,
        }
    }

    /// Marks every committed id whose horizon has passed as expired in `overlay` (it becomes a
    /// changelog tombstone); returns how many.
    pub fn expire(&self, overlay: &mut Overlay<S>, now_secs: i64) -> usize {
        let mut expired = 0;
        for (event_id, seen) in &self.seen {
            if seen.expires_at < now_secs && !overlay.seen.contains_key(event_id) {
                expired += usize::from(overlay.expired.insert(event_id.clone()));
            }
        }
        expired
    }

    /// Merges a committed batch's changes.
    pub fn apply(&mut self, overlay: Overlay<S>) {
        for event_id in overlay.expired {
            self.seen.remove(&event_id);
        }
        self.entities.extend(overlay.entities);
        self.seen.extend(overlay.seen);
    }

    /// Restore: one entity's state as read from the changelog.
    pub fn restore_entity(&mut self, entity_id: String, state: Option<S>) {
        match state {
            Some(state) => self.entities.insert(entity_id, state),
            None => self.entities.remove(&entity_id),
        };
    }

    /// Restore: one seen id as read from the changelog (`None` = tombstone).
    pub fn restore_seen(&mut self, event_id: String, seen: Option<SeenEvent>) {
        match seen {
            Some(seen) => self.seen.insert(event_id, seen),
            None => self.seen.remove(&event_id),
        };
    }

    #[cfg(test)]
    pub fn entity(&self, entity_id: &str) -> Option<&S> {
        self.entities.get(entity_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transform::{LedgerTotals, LedgerTransform};

    const NOW: i64 = 1_800_000_000;
    const POLICY: DedupPolicy = DedupPolicy {
        horizon_secs: 7 * 24 * 3600,
        max_record_bytes: 4096,
    };

    fn source(offset: i64) -> SourcePosition {
        SourcePosition {
            topic: "payments".into(),
            partition: 0,
            offset,
        }
    }

    fn decide(
        state: &PartitionState<LedgerTotals>,
        overlay: &mut Overlay<LedgerTotals>,
        value: &str,
        offset: i64,
    ) -> Decision {
        state.decide(
            overlay,
            &LedgerTransform,
            InputRecord {
                value: Some(value.as_bytes()),
                timestamp_secs: NOW,
            },
            &source(offset),
            NOW,
            POLICY,
        )
    }

    #[test]
    fn the_seed_practice_counts_each_event_once() {
        // e-102 delivered twice, e-103 once: 32000 over attempts, 19500 over unique events.
        let mut state = PartitionState::default();
        let mut overlay = Overlay::default();
        let e102 = r#"{"event_id":"e-102","entity_id":"17","value":12500}"#;
        let e103 = r#"{"event_id":"e-103","entity_id":"17","value":7000}"#;
        assert!(matches!(
            decide(&state, &mut overlay, e102, 0),
            Decision::Emit { .. }
        ));
        assert!(matches!(
            decide(&state, &mut overlay, e102, 1),
            Decision::Duplicate { .. }
        ));
        assert!(matches!(
            decide(&state, &mut overlay, e103, 2),
            Decision::Emit { .. }
        ));
        state.apply(overlay);
        assert_eq!(
            state.entity("17"),
            Some(&LedgerTotals {
                total: 19500,
                count: 2
            })
        );
        // A replay of the whole input after the commit adds nothing.
        let mut replay = Overlay::default();
        for (offset, value) in [e102, e102, e103].into_iter().enumerate() {
            assert!(matches!(
                decide(&state, &mut replay, value, offset as i64),
                Decision::Duplicate { .. }
            ));
        }
        assert!(replay.is_empty());
    }

    #[test]
    fn an_aborted_batch_leaves_no_trace() {
        let state = PartitionState::<LedgerTotals>::default();
        let mut overlay = Overlay::default();
        let e = r#"{"event_id":"e-1","entity_id":"a","value":5}"#;
        assert!(matches!(
            decide(&state, &mut overlay, e, 0),
            Decision::Emit { .. }
        ));
        drop(overlay);
        // Redoing the batch sees the event as new again.
        let mut redo = Overlay::default();
        assert!(matches!(
            decide(&state, &mut redo, e, 0),
            Decision::Emit { .. }
        ));
    }

    #[test]
    fn same_id_other_content_is_a_conflict() {
        let mut state = PartitionState::default();
        let mut overlay = Overlay::default();
        decide(
            &state,
            &mut overlay,
            r#"{"event_id":"e-102","entity_id":"17","value":12500}"#,
            0,
        );
        state.apply(overlay);
        let mut overlay = Overlay::default();
        let decision = decide(
            &state,
            &mut overlay,
            r#"{"event_id":"e-102","entity_id":"17","value":99999}"#,
            1,
        );
        assert!(
            matches!(
                decision,
                Decision::DeadLetter {
                    reason: DeadLetterReason::EventIdConflict,
                    ..
                }
            ),
            "{decision:?}"
        );
        assert!(overlay.is_empty(), "a conflict changes no state");
    }

    #[test]
    fn bad_input_is_dead_lettered_with_its_reason() {
        let state = PartitionState::<LedgerTotals>::default();
        let mut overlay = Overlay::default();
        for (value, reason) in [
            ("{not json", DeadLetterReason::MalformedJson),
            (
                r#"{"entity_id":"a","value":1}"#,
                DeadLetterReason::MissingField,
            ),
            (
                r#"{"event_id":"e","entity_id":"a","value":"1"}"#,
                DeadLetterReason::InvalidField,
            ),
        ] {
            let decision = decide(&state, &mut overlay, value, 0);
            assert!(
                matches!(decision, Decision::DeadLetter { reason: r, .. } if r == reason),
                "{value}: {decision:?}"
            );
        }
        let big = format!(
            r#"{{"event_id":"e","entity_id":"a","value":1,"payload":"{}"}}"#,
            "x".repeat(5000)
        );
        assert!(matches!(
            decide(&state, &mut overlay, &big, 0),
            Decision::DeadLetter {
                reason: DeadLetterReason::OversizedRecord,
                ..
            }
        ));
        let empty = state.decide(
            &mut overlay,
            &LedgerTransform,
            InputRecord {
                value: None,
                timestamp_secs: NOW,
            },
            &source(0),
            NOW,
            POLICY,
        );
        assert!(matches!(
            empty,
            Decision::DeadLetter {
                reason: DeadLetterReason::EmptyRecord,
                ..
            }
        ));
        assert!(overlay.is_empty());
    }

    #[test]
    fn an_overflowing_total_is_dead_lettered_and_changes_nothing() {
        let mut state = PartitionState::default();
        let mut overlay = Overlay::default();
        let max = format!(
            r#"{{"event_id":"e-1","entity_id":"a","value":{}}}"#,
            i64::MAX
        );
        assert!(matches!(
            decide(&state, &mut overlay, &max, 0),
            Decision::Emit { .. }
        ));
        state.apply(overlay);
        let mut overlay = Overlay::default();
        let one_more = r#"{"event_id":"e-2","entity_id":"a","value":1}"#;
        let decision = decide(&state, &mut overlay, one_more, 1);
        assert!(
            matches!(
                decision,
                Decision::DeadLetter {
                    reason: DeadLetterReason::TotalOverflow,
                    ..
                }
            ),
            "{decision:?}"
        );
        assert!(overlay.is_empty(), "a refused event changes no state");
        assert_eq!(
            state.entity("a"),
            Some(&LedgerTotals {
                total: i64::MAX,
                count: 1
            })
        );
        // Another entity is unaffected: the partition moves on.
        assert!(matches!(
            decide(
                &state,
                &mut overlay,
                r#"{"event_id":"e-3","entity_id":"b","value":1}"#,
                2
            ),
            Decision::Emit { .. }
        ));
    }

    #[test]
    fn ambiguous_input_is_dead_lettered_with_its_own_reason() {
        let state = PartitionState::<LedgerTotals>::default();
        let mut overlay = Overlay::default();
        for (value, reason) in [
            (
                r#"{"event_id":"e","entity_id":"a","value":1,"value":2}"#,
                DeadLetterReason::DuplicateKey,
            ),
            (
                r#"{"event_id":"e","entity_id":"a","value":1,"n":123456789012345678901}"#,
                DeadLetterReason::IntegerOutOfRange,
            ),
            (
                r#"{"event_id":"e","entity_id":"a","value":1,"n":1.00000000000000000001}"#,
                DeadLetterReason::InexactNumber,
            ),
        ] {
            let decision = decide(&state, &mut overlay, value, 0);
            assert!(
                matches!(decision, Decision::DeadLetter { reason: r, .. } if r == reason),
                "{value}: {decision:?}"
            );
        }
        assert!(overlay.is_empty());
    }

    #[test]
    fn events_beyond_the_horizon_fail_closed() {
        let state = PartitionState::<LedgerTotals>::default();
        let mut overlay = Overlay::default();
        let old = r#"{"event_id":"e-old","entity_id":"a","value":1,"occurred_at":"2020-01-01T00:00:00Z"}"#;
        assert!(matches!(
            decide(&state, &mut overlay, old, 0),
            Decision::DeadLetter {
                reason: DeadLetterReason::BeyondDedupHorizon,
                ..
            }
        ));
    }

    #[test]
    fn expired_ids_are_tombstoned_and_forgotten() {
        let mut state = PartitionState::<LedgerTotals>::default();
        state.restore_seen(
            "e-old".into(),
            Some(SeenEvent {
                fingerprint: Fingerprint::of_json(&Value::Null),
                expires_at: NOW - 1,
            }),
        );
        state.restore_seen(
            "e-new".into(),
            Some(SeenEvent {
                fingerprint: Fingerprint::of_json(&Value::Null),
                expires_at: NOW + 100,
            }),
        );
        let mut overlay = Overlay::default();
        assert_eq!(state.expire(&mut overlay, NOW), 1);
        assert!(overlay.expired.contains("e-old"));
        state.apply(overlay);
        assert_eq!(state.seen_count(), 1);
    }
}
