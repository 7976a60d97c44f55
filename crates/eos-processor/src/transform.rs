//! The per-event business logic, behind a small trait so another transform can be plugged in
//! without touching the transaction loop. A transform sees only new events (duplicates are
//! dropped before it) and its per-entity state; the loop makes both exactly-once.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use eos_core::EventEnvelope;

/// Where an input record was read from; carried into every output as `source`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourcePosition {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
}

pub trait Transform: Send + 'static {
    /// State kept per entity, stored in the changelog topic as JSON.
    type EntityState: Clone + Default + Serialize + DeserializeOwned + Send + std::fmt::Debug;

    /// Applies one new event to its entity's state and returns the output record's JSON value.
    fn apply(
        &self,
        state: &mut Self::EntityState,
        event: &EventEnvelope,
        source: &SourcePosition,
    ) -> Map<String, Value>;
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
        event: &EventEnvelope,
        source: &SourcePosition,
    ) -> Map<String, Value> {
        // Saturating: a total that would overflow i64 is not representable in minor units anyway,
        // and a panic here would wedge the partition forever.
        state.total = state.total.saturating_add(event.value);
        state.count += 1;
        let mut output = event.to_json();
        output.insert("entity_total".into(), Value::from(state.total));
        output.insert("entity_count".into(), Value::from(state.count));
        output.insert(
            "source".into(),
            serde_json::to_value(source).unwrap_or(Value::Null),
        );
        output
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
        LedgerTransform.apply(&mut totals, &event("e-102", 12500), &source);
        let output = LedgerTransform.apply(&mut totals, &event("e-103", 7000), &source);
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
}
