//! The replay proof: what a deterministic transform must have written for a given input, computed
//! by the processor's own decision code, and a comparison with what was committed.
//!
//! Counting event ids shows that each input had one outcome; it cannot show that the outcome is
//! right. The replay runs the same transform over the input again — each partition in offset
//! order, as the loop reads it, with the same dedup, contract and state handling
//! (`PartitionState::decide` over an in-memory store), one record per commit, which the loop's
//! batching cannot change — and compares the outputs it computes with the committed ones after
//! canonicalising their JSON. A transform applied twice to an event (a repeated effect), an
//! output lost or doubled, or a transform that is not deterministic shows up as a difference,
//! whatever the logic is.
//!
//! An event's outcome is final (docs/TRANSFORMS.md "An event's outcome is final"), and the replay
//! decides as the processor does, so a run that judged a re-delivered event again — refused it a
//! second time, or applied what it had refused — differs at those records; the report names such
//! event ids as having two outcomes. A re-drive's new outcome is no second one: it is what the
//! replay computes for the re-drive record.
//!
//! The dedup horizon is checked against each record's own timestamp, not the clock of the run:
//! an event already past the horizon when it was read is reported as a difference, to be
//! explained by the operator (the audit's dead-letter check shows the reason).

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;
use serde_json::Value;

use eos_core::fingerprint::canonical_json;
use eos_core::{DeadLetterReason, EventContract};

use crate::partition_state::{Decision, DecisionPolicy, InputRecord, Overlay, PartitionState};
use crate::state_store::{StateStore, StoreError};
use crate::transform::{SourcePosition, Transform};

/// An input record as read from the input topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayInput {
    /// Its partition.
    pub partition: i32,
    /// Its offset.
    pub offset: i64,
    /// Its key.
    pub key: Option<Vec<u8>>,
    /// Its value.
    pub value: Option<Vec<u8>>,
    /// Its headers, in order.
    pub headers: Vec<(String, Option<Vec<u8>>)>,
    /// Its Kafka timestamp, in Unix milliseconds.
    pub timestamp_ms: i64,
}

/// One output: where it went, its key and its value (canonical JSON), for one event.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct ReplayOutput {
    /// The event id it was written for (its `event_id` header).
    pub event_id: String,
    /// The output's name.
    pub output: String,
    /// Its key, as text (lossy for non-UTF-8 keys).
    pub key: String,
    /// Its value as canonical JSON.
    pub value: String,
}

impl ReplayOutput {
    /// An output as committed: `value` is parsed and canonicalised (field order and whitespace
    /// do not matter); a value that is not JSON is kept as its text, and differs.
    pub fn committed(event_id: &str, output: &str, key: Option<&[u8]>, value: &[u8]) -> Self {
        let value = serde_json::from_slice::<Value>(value)
            .map(|json| canonical_json(&json))
            .unwrap_or_else(|_| String::from_utf8_lossy(value).into_owned());
        Self {
            event_id: event_id.to_owned(),
            output: output.to_owned(),
            key: String::from_utf8_lossy(key.unwrap_or_default()).into_owned(),
            value,
        }
    }
}

/// What the transform must have written for the input.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Expected {
    /// Every output, sorted.
    pub outputs: Vec<ReplayOutput>,
    /// Every dead letter: source (partition, offset) and reason.
    pub dead_letters: BTreeMap<(i32, i64), DeadLetterReason>,
    /// Logical events applied (new event ids), whether or not they wrote anything.
    pub applied: u64,
    /// Re-deliveries dropped as duplicates.
    pub duplicates: u64,
    /// The event id of every input record that has one, by source (partition, offset): what a
    /// committed dead letter's source position says about which event it judged.
    pub event_ids: BTreeMap<(i32, i64), String>,
}

/// Computes what `transform` writes for `inputs` (in any order: they are replayed per partition
/// in offset order). `outputs` are the configured output names.
pub fn expected<T: Transform>(
    transform: &T,
    contract: &EventContract,
    outputs: &BTreeSet<String>,
    inputs: &[ReplayInput],
) -> Result<Expected, StoreError> {
    let store = StateStore::in_memory()?;
    let mut by_partition: BTreeMap<i32, Vec<&ReplayInput>> = BTreeMap::new();
    for input in inputs {
        by_partition.entry(input.partition).or_default().push(input);
    }
    let policy = DecisionPolicy {
        // The horizon is taken from each record's own time (see the module doc), so only an
        // event time far before its record's is refused.
        horizon_secs: i64::MAX / 4,
        contract: contract.clone(),
        outputs: outputs.clone(),
    };
    let mut expected = Expected::default();
    for (partition, mut records) in by_partition {
        records.sort_by_key(|record| record.offset);
        let state = PartitionState::<T::State>::new(store.partition("replay", partition)?);
        for record in records {
            let headers: Vec<(&str, Option<&[u8]>)> = record
                .headers
                .iter()
                .map(|(key, value)| (key.as_str(), value.as_deref()))
                .collect();
            let timestamp_secs = record.timestamp_ms.div_euclid(1000);
            let mut overlay = Overlay::default();
            let decision = state.decide(
                &mut overlay,
                transform,
                InputRecord {
                    key: record.key.as_deref(),
                    value: record.value.as_deref(),
                    headers: &headers,
                    timestamp_secs,
                },
                &SourcePosition {
                    topic: String::new(),
                    partition,
                    offset: record.offset,
                },
                timestamp_secs,
                &policy,
            )?;
            state.apply::<T>(overlay)?;
            let event_id = match &decision {
                Decision::Emit { event_id, .. } | Decision::Duplicate { event_id } => {
                    Some(event_id)
                }
                Decision::DeadLetter { event_id, .. } => event_id.as_ref(),
            };
            if let Some(event_id) = event_id {
                expected
                    .event_ids
                    .insert((partition, record.offset), event_id.clone());
            }
            match decision {
                Decision::Emit {
                    event_id,
                    entity_id,
                    outputs,
                    ..
                } => {
                    expected.applied += 1;
                    for output in outputs {
                        let key = output.key.unwrap_or_else(|| entity_id.clone().into_bytes());
                        expected.outputs.push(ReplayOutput {
                            event_id: event_id.clone(),
                            output: output.output,
                            key: String::from_utf8_lossy(&key).into_owned(),
                            value: canonical_json(&output.value),
                        });
                    }
                }
                Decision::Duplicate { .. } => expected.duplicates += 1,
                Decision::DeadLetter { reason, .. } => {
                    expected
                        .dead_letters
                        .insert((partition, record.offset), reason);
                }
            }
        }
    }
    expected.outputs.sort();
    Ok(expected)
}

/// Where the committed outputs and the replay disagree.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ReplayReport {
    /// Outputs the replay computes and the committed outputs hold, once each.
    pub matched: u64,
    /// Computed but not committed (an effect lost, or computed differently).
    pub missing: Vec<ReplayOutput>,
    /// Committed but not computed, or committed more often than computed (a repeated effect, or
    /// an output computed differently).
    pub unexpected: Vec<ReplayOutput>,
    /// Dead letters at a source position where the replay has another outcome, or none:
    /// (partition, offset, committed reason, replayed reason).
    pub dead_letter_differences: Vec<(i32, i64, String, String)>,
    /// Event ids the run judged more often than the replay (an outcome is final): dead letters
    /// that judged the event at two positions, or a judging dead letter and outputs, where the
    /// replay has one outcome.
    pub two_outcomes: Vec<String>,
}

impl ReplayReport {
    /// Every committed output is exactly the replay's, once, and so is every dead letter.
    pub fn exact(&self) -> bool {
        self.missing.is_empty()
            && self.unexpected.is_empty()
            && self.dead_letter_differences.is_empty()
            && self.two_outcomes.is_empty()
    }
}

/// Compares the committed outputs and dead letters (source position → reason) with the replay's,
/// as multisets: an output committed twice where the replay computes it once is unexpected once.
pub fn compare(
    expected: &Expected,
    committed: &[ReplayOutput],
    committed_dead_letters: &BTreeMap<(i32, i64), DeadLetterReason>,
) -> ReplayReport {
    // Per distinct output: (computed, committed) copies.
    let mut counts: BTreeMap<&ReplayOutput, (u64, u64)> = BTreeMap::new();
    for output in &expected.outputs {
        counts.entry(output).or_default().0 += 1;
    }
    for output in committed {
        counts.entry(output).or_default().1 += 1;
    }
    let mut report = ReplayReport::default();
    for (output, (computed, written)) in counts {
        report.matched += computed.min(written);
        for _ in written..computed {
            report.missing.push(output.clone());
        }
        for _ in computed..written {
            report.unexpected.push(output.clone());
        }
    }
    let positions: BTreeSet<&(i32, i64)> = expected
        .dead_letters
        .keys()
        .chain(committed_dead_letters.keys())
        .collect();
    for &&(partition, offset) in &positions {
        let replayed = expected.dead_letters.get(&(partition, offset));
        let written = committed_dead_letters.get(&(partition, offset));
        if replayed != written {
            let name = |reason: Option<&DeadLetterReason>| {
                reason.map_or_else(|| "none".to_owned(), |r| r.as_str().to_owned())
            };
            report
                .dead_letter_differences
                .push((partition, offset, name(written), name(replayed)));
        }
    }
    let committed_outcomes = outcomes_by_event(expected, committed, committed_dead_letters);
    let replayed_outcomes = outcomes_by_event(expected, &expected.outputs, &expected.dead_letters);
    report.two_outcomes = committed_outcomes
        .into_iter()
        .filter(|(event_id, outcomes)| {
            *outcomes > 1 && *outcomes > replayed_outcomes.get(event_id).copied().unwrap_or(0)
        })
        .map(|(event_id, _)| event_id.to_owned())
        .collect();
    report
}

/// How many outcomes each event id has: one for its outputs (all of an event's outputs are one
/// decision), one per dead letter that judged it — every dead letter of a record with an id but
/// a conflict's and a horizon's, which leave the event's outcome as it was.
fn outcomes_by_event<'a>(
    expected: &'a Expected,
    outputs: &'a [ReplayOutput],
    dead_letters: &BTreeMap<(i32, i64), DeadLetterReason>,
) -> BTreeMap<&'a str, u64> {
    let mut outcomes: BTreeMap<&str, u64> = BTreeMap::new();
    let with_outputs: BTreeSet<&str> = outputs
        .iter()
        .map(|output| output.event_id.as_str())
        .collect();
    for event_id in with_outputs {
        *outcomes.entry(event_id).or_default() += 1;
    }
    for (position, reason) in dead_letters {
        if matches!(
            reason,
            DeadLetterReason::EventIdConflict | DeadLetterReason::BeyondDedupHorizon
        ) {
            continue;
        }
        if let Some(event_id) = expected.event_ids.get(position) {
            *outcomes.entry(event_id.as_str()).or_default() += 1;
        }
    }
    outcomes
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;
    use crate::transform::{DEFAULT_OUTPUT, Output, Refusal};
    use eos_core::Event;

    /// Per-entity running count; refuses negative amounts.
    struct Counter;

    impl Transform for Counter {
        type State = u64;

        fn apply(
            &self,
            count: &mut u64,
            event: Event,
            _source: &SourcePosition,
        ) -> Result<Vec<Output>, Refusal> {
            let amount = event.value["amount"].as_i64().unwrap_or_default();
            if amount < 0 {
                return Err(Refusal::new("negative", "negative amount"));
            }
            *count += 1;
            Ok(vec![Output::to_default(serde_json::json!({
                "id": event.id.as_str(), "count": *count, "amount": amount
            }))])
        }
    }

    /// Like `Counter`, but its output depends on how often it ran: not deterministic.
    struct CallCounter(AtomicU64);

    impl Transform for CallCounter {
        type State = u64;

        fn apply(
            &self,
            count: &mut u64,
            event: Event,
            _source: &SourcePosition,
        ) -> Result<Vec<Output>, Refusal> {
            *count += 1;
            let calls = self.0.fetch_add(1, Ordering::Relaxed);
            Ok(vec![Output::to_default(serde_json::json!({
                "id": event.id.as_str(), "calls": calls
            }))])
        }
    }

    fn input(offset: i64, id: &str, entity: &str, amount: i64) -> ReplayInput {
        ReplayInput {
            partition: 0,
            offset,
            key: Some(entity.as_bytes().to_vec()),
            value: Some(format!(r#"{{"amount":{amount}}}"#).into_bytes()),
            headers: vec![("event_id".into(), Some(id.as_bytes().to_vec()))],
            timestamp_ms: 1_800_000_000_000,
        }
    }

    fn outputs() -> BTreeSet<String> {
        BTreeSet::from([DEFAULT_OUTPUT.to_owned()])
    }

    fn committed(id: &str, entity: &str, count: u64, amount: i64) -> ReplayOutput {
        ReplayOutput::committed(
            id,
            DEFAULT_OUTPUT,
            Some(entity.as_bytes()),
            format!(r#"{{ "amount": {amount}, "count": {count}, "id": "{id}" }}"#).as_bytes(),
        )
    }

    fn inputs() -> Vec<ReplayInput> {
        vec![
            input(0, "e-1", "a", 5),
            input(1, "e-1", "a", 5), // a re-delivery
            input(2, "e-2", "a", 7),
            input(3, "e-3", "b", -1), // refused
            input(4, "e-4", "b", 1),
        ]
    }

    #[test]
    fn the_outputs_of_an_exactly_once_run_replay_exactly() -> Result<(), StoreError> {
        let expected = expected(&Counter, &EventContract::default(), &outputs(), &inputs())?;
        assert_eq!((expected.applied, expected.duplicates), (3, 1));
        assert_eq!(
            expected.dead_letters,
            BTreeMap::from([((0, 3), DeadLetterReason::TransformRefused)])
        );
        // Field order and whitespace differ from the replay's; the committed set is exact.
        let run = [
            committed("e-2", "a", 2, 7),
            committed("e-1", "a", 1, 5),
            committed("e-4", "b", 1, 1),
        ];
        let report = compare(&expected, &run, &expected.dead_letters);
        assert!(report.exact(), "{report:?}");
        assert_eq!(report.matched, 3);
        Ok(())
    }

    #[test]
    fn an_event_applied_twice_is_caught_even_with_every_id_present() -> Result<(), StoreError> {
        let expected = expected(&Counter, &EventContract::default(), &outputs(), &inputs())?;
        // What a run that repeated e-1 after a crash (without transactions) commits: e-1 twice,
        // and e-2 counted on top of the repeat. Every id is there; counting ids would pass.
        let run = [
            committed("e-1", "a", 1, 5),
            committed("e-1", "a", 2, 5),
            committed("e-2", "a", 3, 7),
            committed("e-4", "b", 1, 1),
        ];
        let report = compare(&expected, &run, &expected.dead_letters);
        assert!(!report.exact());
        assert_eq!(report.matched, 2);
        assert_eq!(report.missing, [committed("e-2", "a", 2, 7)]);
        assert_eq!(
            report.unexpected,
            [committed("e-1", "a", 2, 5), committed("e-2", "a", 3, 7)]
        );
        Ok(())
    }

    #[test]
    fn a_transform_that_is_not_deterministic_is_caught() -> Result<(), StoreError> {
        let transform = CallCounter(AtomicU64::new(0));
        let contract = EventContract::default();
        let inputs = [input(0, "e-1", "a", 1), input(1, "e-2", "a", 1)];
        // The "run": the outputs the transform wrote the first time.
        let run = expected(&transform, &contract, &outputs(), &inputs)?;
        // The replay computes other values from the same inputs and state.
        let replayed = expected(&transform, &contract, &outputs(), &inputs)?;
        let report = compare(&replayed, &run.outputs, &run.dead_letters);
        assert!(!report.exact());
        assert_eq!((report.missing.len(), report.unexpected.len()), (2, 2));
        Ok(())
    }

    /// What a processor that forgot refusals committed (issue 51): the refused e-3 refused again
    /// when re-delivered, or applied once a re-delivery found room. Both are an event id with
    /// two outcomes where the replay, deciding as the processor now does, has one.
    #[test]
    fn a_refused_event_judged_again_has_two_outcomes() -> Result<(), StoreError> {
        let mut inputs = inputs();
        inputs.push(input(5, "e-3", "b", -1)); // the refused e-3 again
        let expected = expected(&Counter, &EventContract::default(), &outputs(), &inputs)?;
        assert_eq!(expected.duplicates, 2, "the re-delivery is a duplicate");
        let run = [
            committed("e-1", "a", 1, 5),
            committed("e-2", "a", 2, 7),
            committed("e-4", "b", 1, 1),
        ];
        assert!(compare(&expected, &run, &expected.dead_letters).exact());
        let mut refused_twice = expected.dead_letters.clone();
        refused_twice.insert((0, 5), DeadLetterReason::TransformRefused);
        let report = compare(&expected, &run, &refused_twice);
        assert_eq!(report.two_outcomes, ["e-3"]);
        assert_eq!(report.dead_letter_differences.len(), 1);
        // Refused, then applied: a dead letter and an output for one id.
        let mut applied_later = run.to_vec();
        applied_later.push(committed("e-3", "b", 2, -1));
        let report = compare(&expected, &applied_later, &expected.dead_letters);
        assert!(!report.exact());
        assert_eq!(report.two_outcomes, ["e-3"]);
        Ok(())
    }

    #[test]
    fn a_dead_letter_where_the_replay_applies_the_event_is_a_difference() -> Result<(), StoreError>
    {
        let expected = expected(&Counter, &EventContract::default(), &outputs(), &inputs())?;
        let mut letters = expected.dead_letters.clone();
        letters.insert((0, 4), DeadLetterReason::InvalidField);
        let report = compare(&expected, &[], &letters);
        assert_eq!(
            report.dead_letter_differences,
            [(0, 4, "invalid_field".to_owned(), "none".to_owned())]
        );
        assert_eq!(report.missing.len(), 3);
        Ok(())
    }
}
