//! The per-event business logic, behind a small trait so another transform can be plugged in
//! without touching the transaction loop. A transform sees only new events (duplicates are
//! dropped before it) and its per-entity state; the loop makes both exactly-once.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use eos_core::{DeadLetterReason, EventEnvelope};

/// Where an input record was read from; carried into every output as `source`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourcePosition {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
}

/// Why a transform refuses a well-formed event: it becomes a dead letter with this reason, and
/// its entity's state is left as it was.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{detail}")]
pub struct TransformRefusal {
    pub reason: DeadLetterReason,
    pub detail: String,
}

pub trait Transform: Send + 'static {
    /// State kept per entity, stored in the changelog topic as JSON.
    type EntityState: Clone + Default + Serialize + DeserializeOwned + Send + std::fmt::Debug;

    /// Applies one new event to its entity's state and returns the output record's JSON value.
    /// The event is the transform's to move into its output (its id and entity are read
    /// before). On a refusal `state` may be partly changed: the caller drops it.
    fn apply(
        &self,
        state: &mut Self::EntityState,
        event: EventEnvelope,
        source: &SourcePosition,
    ) -> Result<Map<String, Value>, TransformRefusal>;
}

/// Per-entity running totals: the reference practice's `counter = counter + 1`
/// (docs/ARCHITECTURE.md "The reference practice"), which a replay must not repeat.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerTotals {
    pub total: i64,
    pub count: u64,
}

/// The built-in transform: emits the envelope plus `entity_total`, `entity_count` and `source`.
#[derive(Debug, Clone, Copy, Default)]
pub struct LedgerTransform;

/// Fields the ledger transform adds to the input envelope.
pub const LEDGER_ADDED_FIELDS: [&str; 3] = ["entity_total", "entity_count", "source"];

impl Transform for LedgerTransform {
    type EntityState = LedgerTotals;

    fn apply(
        &self,
        state: &mut LedgerTotals,
        event: EventEnvelope,
        source: &SourcePosition,
    ) -> Result<Map<String, Value>, TransformRefusal> {
        // A total past i64 cannot be represented; saturating would silently make every later
        // total wrong, and a panic would wedge the partition. So the event is refused, explicitly.
        let total = state
            .total
            .checked_add(event.value)
            .ok_or_else(|| TransformRefusal {
                reason: DeadLetterReason::TotalOverflow,
                detail: format!(
                    "entity {} total {} plus value {} overflows a signed 64-bit integer",
                    event.entity_id, state.total, event.value
                ),
            })?;
        let count = state.count.checked_add(1).ok_or_else(|| TransformRefusal {
            reason: DeadLetterReason::TotalOverflow,
            detail: format!("entity {} event count overflows", event.entity_id),
        })?;
        state.total = total;
        state.count = count;
        let mut output = event.into_json();
        output.insert("entity_total".into(), Value::from(state.total));
        output.insert("entity_count".into(), Value::from(state.count));
        output.insert(
            "source".into(),
            serde_json::to_value(source).unwrap_or(Value::Null),
        );
        Ok(output)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(id: &str, value: i64) -> EventEnvelope {
        EventEnvelope::parse(
            format!(r#"{{"event_id":"{id}","entity_id":"17","value":{value}}}"#).as_bytes(),
        )
        .expect("valid test event")
    }

    #[test]
    fn ledger_accumulates_and_reports_the_source() {
        let source = SourcePosition {
            topic: "payments".into(),
            partition: 2,
            offset: 41,
        };
        let mut totals = LedgerTotals::default();
        LedgerTransform
            .apply(&mut totals, event("e-102", 12500), &source)
            .expect("applies");
        let output = LedgerTransform
            .apply(&mut totals, event("e-103", 7000), &source)
            .expect("applies");
        assert_eq!(
            totals,
            LedgerTotals {
                total: 19500,
                count: 2
            }
        );
        assert_eq!(output["entity_total"], 19500);
        assert_eq!(output["entity_count"], 2);
        assert_eq!(output["event_id"], "e-103");
        assert_eq!(output["source"]["offset"], 41);
        // The output is still a valid envelope with the input's content.
        let reparsed = EventEnvelope::parse(&serde_json::to_vec(&output).expect("json"))
            .expect("output parses as an envelope");
        assert_eq!(reparsed.value, 7000);
    }

    #[test]
    fn a_total_that_would_overflow_is_refused_and_the_state_kept() {
        let source = SourcePosition {
            topic: "payments".into(),
            partition: 0,
            offset: 0,
        };
        for (start, value) in [(i64::MAX - 5, 6), (i64::MIN + 5, -6)] {
            let mut totals = LedgerTotals {
                total: start,
                count: 3,
            };
            let refusal = LedgerTransform
                .apply(&mut totals, event("e-big", value), &source)
                .expect_err("overflow");
            assert_eq!(refusal.reason, DeadLetterReason::TotalOverflow);
            assert!(refusal.detail.contains("overflows"), "{refusal}");
            assert_eq!(
                totals,
                LedgerTotals {
                    total: start,
                    count: 3
                }
            );
        }
        // Up to the edge is fine.
        let mut totals = LedgerTotals {
            total: i64::MAX - 5,
            count: 0,
        };
        assert!(
            LedgerTransform
                .apply(&mut totals, event("e-edge", 5), &source)
                .is_ok()
        );
        assert_eq!(totals.total, i64::MAX);
    }
}
