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
//!
//! A dead letter is compared by its reason and by the transform's own code
//! (`eos-dlq-transform-reason`): a refusal with the wrong code is a refusal of another kind,
//! however right its reason.
//!
//! What a run committed is a [`CommittedRun`]: [`CommittedRun::from_records`] reads it from the
//! records of its topics, and, with the crate's `kafka` feature, `read_committed_run` reads
//! those from Kafka as a `read_committed` consumer sees them — the reader `eosctl audit --replay`
//! runs, for a user's own test of their transform (docs/TRANSFORMS.md "Prove it: the replay
//! audit"). The replay must decide under the contract the run had: take it from the run's own
//! configuration (the processor's `Config::event_contract(transform.contract())`, eosctl's
//! `--event-id`, `--entity`, `--occurred-at`), never from `transform.contract()` alone, which the
//! run's flags may have overridden.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::Serialize;
use serde_json::Value;

use eos_core::fingerprint::canonical_json;
use eos_core::{DeadLetterReason, EventContract, dead_letter};

use crate::partition_state::{Decision, DecisionPolicy, InputRecord, Overlay, PartitionState};
use crate::state_store::{StateStore, StoreError};
use crate::transform::{SourcePosition, Transform};

#[cfg(feature = "kafka")]
mod kafka;
#[cfg(feature = "kafka")]
pub use kafka::{CommittedRecords, ReadRunError, read_committed_records, read_committed_run};

/// A record as committed on one of a run's topics: its input, an output, the dead letters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommittedRecord {
    /// Its partition.
    pub partition: i32,
    /// Its offset.
    pub offset: i64,
    /// Its key.
    pub key: Option<Vec<u8>>,
    /// Its value.
    pub value: Option<Vec<u8>>,
    /// Its headers, in order: the input's decide the event id when the contract reads it from
    /// one (`header:event_id`) and whether a record is a re-drive (`eos-redrive-id`).
    pub headers: Vec<(String, Option<Vec<u8>>)>,
    /// Its Kafka timestamp, in Unix milliseconds.
    pub timestamp_ms: i64,
    /// A record decoded from a registry format: its decoded content, which the fingerprint is of
    /// (as the processor computes it), when it is not the value itself.
    pub content: Option<Vec<u8>>,
}

/// What the replay runs over: the input topic's committed records.
pub type ReplayInput = CommittedRecord;

impl CommittedRecord {
    /// The value of the last header named `name`, as UTF-8.
    pub fn last_header(&self, name: &str) -> Option<&str> {
        header_in(&self.headers, name)
    }
}

fn header_in<'a>(headers: &'a [(String, Option<Vec<u8>>)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .rev()
        .find(|(key, _)| key == name)
        .and_then(|(_, value)| value.as_deref())
        .and_then(|value| std::str::from_utf8(value).ok())
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

    /// A record of the topic of output `output`: its event id is its last `event_id` header,
    /// the one the processor writes after any a transform added.
    pub fn from_record(output: &str, record: &CommittedRecord) -> Self {
        Self::committed(
            record.last_header(EVENT_ID_HEADER).unwrap_or_default(),
            output,
            record.key.as_deref(),
            record.value.as_deref().unwrap_or_default(),
        )
    }
}

/// The header every output carries its event's id in.
const EVENT_ID_HEADER: &str = "event_id";

/// A dead letter as the replay compares it: its reason and the transform's own code.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct ReplayDeadLetter {
    /// `eos-dlq-reason`.
    pub reason: DeadLetterReason,
    /// `eos-dlq-transform-reason`: the code a transform refused or failed with (`not_payable`,
    /// `over_daily_limit`); `None` on a dead letter the processor's own checks wrote.
    pub code: Option<String>,
}

impl ReplayDeadLetter {
    /// A dead letter without a transform's code.
    pub fn reason(reason: DeadLetterReason) -> Self {
        Self { reason, code: None }
    }

    /// A dead letter with the transform's `code`.
    pub fn coded(reason: DeadLetterReason, code: &str) -> Self {
        Self {
            reason,
            code: Some(code.to_owned()),
        }
    }

    /// The input position a dead letter on the run's dead-letter topic stands for, and what it
    /// says, when it is a dead letter of `input` (`eos-source-topic`). The processor writes the
    /// original's own headers first and its own after them, from `eos-dlq-reason` on
    /// (`eos_core::dead_letter::build`), so only headers from the last `eos-dlq-reason` on are
    /// read: an original that carried a header of the same name cannot pass for the processor.
    pub fn from_record(input: &str, record: &CommittedRecord) -> Option<((i32, i64), Self)> {
        let start = record
            .headers
            .iter()
            .rposition(|(key, _)| key == dead_letter::REASON_HEADER)?;
        let own = &record.headers[start..];
        if header_in(own, dead_letter::SOURCE_TOPIC_HEADER)? != input {
            return None;
        }
        let partition = header_in(own, dead_letter::SOURCE_PARTITION_HEADER)?
            .parse()
            .ok()?;
        let offset = header_in(own, dead_letter::SOURCE_OFFSET_HEADER)?
            .parse()
            .ok()?;
        let letter = Self {
            reason: header_in(own, dead_letter::REASON_HEADER)?.parse().ok()?,
            code: header_in(own, dead_letter::TRANSFORM_REASON_HEADER).map(str::to_owned),
        };
        Some(((partition, offset), letter))
    }
}

impl fmt::Display for ReplayDeadLetter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.code {
            Some(code) => write!(f, "{} ({code})", self.reason.as_str()),
            None => f.write_str(self.reason.as_str()),
        }
    }
}

/// What a run committed, as a `read_committed` consumer sees it: the input the replay runs
/// over, the outputs and the dead letters it is compared with.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CommittedRun {
    /// Every committed input record, headers included.
    pub inputs: Vec<ReplayInput>,
    /// Every committed output, under the name of its output.
    pub outputs: Vec<ReplayOutput>,
    /// Every dead letter of the run's input, by the source position it names.
    pub dead_letters: BTreeMap<(i32, i64), ReplayDeadLetter>,
    /// Records on the dead-letter topic that are no dead letter of the run's input: another
    /// input's (a dead-letter topic shared by several processors), or a record without the
    /// headers a processor's dead letter carries. Not compared.
    pub other_dead_letters: usize,
}

impl CommittedRun {
    /// The run of `input` from the records of its topics: the input's, each output's under the
    /// output's name, and the dead-letter topic's.
    pub fn from_records(
        input: &str,
        inputs: Vec<CommittedRecord>,
        outputs: impl IntoIterator<Item = (String, Vec<CommittedRecord>)>,
        dead_letters: &[CommittedRecord],
    ) -> Self {
        let mut run = Self {
            inputs,
            ..Self::default()
        };
        for (name, records) in outputs {
            run.outputs.extend(
                records
                    .iter()
                    .map(|record| ReplayOutput::from_record(&name, record)),
            );
        }
        for record in dead_letters {
            match ReplayDeadLetter::from_record(input, record) {
                Some((position, letter)) => {
                    run.dead_letters.insert(position, letter);
                }
                None => run.other_dead_letters += 1,
            }
        }
        run
    }

    /// Compares the run with what the replay computed ([`compare`]).
    pub fn compare(&self, expected: &Expected) -> ReplayReport {
        compare(expected, &self.outputs, &self.dead_letters)
    }
}

/// Where a run read and wrote, as its processor was configured (`--input-topic`,
/// `--output-topic` and `--output NAME=TOPIC`, `--dlq-topic`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunTopics {
    /// The input topic.
    pub input: String,
    /// Each output's topic by the output's name, the default output's (`default`) included when
    /// the run had one.
    pub outputs: BTreeMap<String, String>,
    /// The dead-letter topic.
    pub dead_letters: String,
}

impl RunTopics {
    /// The names of the outputs: what [`expected`] takes.
    pub fn output_names(&self) -> BTreeSet<String> {
        self.outputs.keys().cloned().collect()
    }
}

/// What the transform must have written for the input.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Expected {
    /// Every output, sorted.
    pub outputs: Vec<ReplayOutput>,
    /// Every dead letter by its source (partition, offset).
    pub dead_letters: BTreeMap<(i32, i64), ReplayDeadLetter>,
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
        output_fit: None,
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
                    content: record.content.as_deref(),
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
                Decision::DeadLetter { reason, code, .. } => {
                    expected.dead_letters.insert(
                        (partition, record.offset),
                        ReplayDeadLetter { reason, code },
                    );
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
    /// Dead letters at a source position where the replay has another outcome, or none.
    pub dead_letter_differences: Vec<DeadLetterDifference>,
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

/// How many of each difference [`ReplayReport`]'s text shows.
const SHOWN: usize = 10;

impl fmt::Display for ReplayReport {
    /// The verdict and the figures, then the first few of each difference: what a test prints
    /// when the replay is not exact.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} outputs as replayed, {} missing, {} unexpected; {} dead letters differ; {} \
             event ids with two outcomes",
            if self.exact() { "exact" } else { "NOT exact" },
            self.matched,
            self.missing.len(),
            self.unexpected.len(),
            self.dead_letter_differences.len(),
            self.two_outcomes.len(),
        )?;
        for output in self.missing.iter().take(SHOWN) {
            write!(f, "\n  missing    {output}")?;
        }
        for output in self.unexpected.iter().take(SHOWN) {
            write!(f, "\n  unexpected {output}")?;
        }
        for difference in self.dead_letter_differences.iter().take(SHOWN) {
            write!(f, "\n  {difference}")?;
        }
        for event_id in self.two_outcomes.iter().take(SHOWN) {
            write!(
                f,
                "\n  two outcomes for {event_id}: judged again after its outcome was final"
            )?;
        }
        Ok(())
    }
}

impl fmt::Display for ReplayOutput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} → {} key {:?}: {}",
            self.event_id, self.output, self.key, self.value
        )
    }
}

/// A source position whose dead letter the run and the replay disagree on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeadLetterDifference {
    /// The input partition.
    pub partition: i32,
    /// The input offset.
    pub offset: i64,
    /// The dead letter the run committed there; `None`: none.
    pub committed: Option<ReplayDeadLetter>,
    /// The dead letter the replay computes there; `None`: none (the event applied, consumed or
    /// a duplicate).
    pub replayed: Option<ReplayDeadLetter>,
}

impl fmt::Display for DeadLetterDifference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = |letter: &Option<ReplayDeadLetter>| {
            letter
                .as_ref()
                .map_or_else(|| "none".to_owned(), ToString::to_string)
        };
        write!(
            f,
            "dead letter at {}@{}: committed {}, replayed {}",
            self.partition,
            self.offset,
            name(&self.committed),
            name(&self.replayed)
        )
    }
}

/// Compares the committed outputs and dead letters (by source position) with the replay's,
/// outputs as multisets (an output committed twice where the replay computes it once is
/// unexpected once), dead letters by reason and transform code.
pub fn compare(
    expected: &Expected,
    committed: &[ReplayOutput],
    committed_dead_letters: &BTreeMap<(i32, i64), ReplayDeadLetter>,
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
            report.dead_letter_differences.push(DeadLetterDifference {
                partition,
                offset,
                committed: written.cloned(),
                replayed: replayed.cloned(),
            });
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
    dead_letters: &BTreeMap<(i32, i64), ReplayDeadLetter>,
) -> BTreeMap<&'a str, u64> {
    let mut outcomes: BTreeMap<&str, u64> = BTreeMap::new();
    let with_outputs: BTreeSet<&str> = outputs
        .iter()
        .map(|output| output.event_id.as_str())
        .collect();
    for event_id in with_outputs {
        *outcomes.entry(event_id).or_default() += 1;
    }
    for (position, letter) in dead_letters {
        if matches!(
            letter.reason,
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
            content: None,
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
            BTreeMap::from([(
                (0, 3),
                ReplayDeadLetter::coded(DeadLetterReason::TransformRefused, "negative")
            )])
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
        refused_twice.insert(
            (0, 5),
            ReplayDeadLetter::coded(DeadLetterReason::TransformRefused, "negative"),
        );
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
        letters.insert(
            (0, 4),
            ReplayDeadLetter::reason(DeadLetterReason::InvalidField),
        );
        let report = compare(&expected, &[], &letters);
        assert_eq!(
            report.dead_letter_differences,
            [DeadLetterDifference {
                partition: 0,
                offset: 4,
                committed: Some(ReplayDeadLetter::reason(DeadLetterReason::InvalidField)),
                replayed: None,
            }]
        );
        assert_eq!(report.missing.len(), 3);
        Ok(())
    }

    /// A refusal with the right reason and the wrong code (issue 51: `not_paid` for
    /// `not_payable`) is a refusal of another kind: the replay is not exact, and says which.
    #[test]
    fn a_refusal_with_another_code_is_a_difference() -> Result<(), StoreError> {
        let expected = expected(&Counter, &EventContract::default(), &outputs(), &inputs())?;
        let run = [
            committed("e-1", "a", 1, 5),
            committed("e-2", "a", 2, 7),
            committed("e-4", "b", 1, 1),
        ];
        let mut letters = expected.dead_letters.clone();
        letters.insert(
            (0, 3),
            ReplayDeadLetter::coded(DeadLetterReason::TransformRefused, "not_negative"),
        );
        let report = compare(&expected, &run, &letters);
        assert!(!report.exact());
        assert_eq!(report.matched, 3);
        assert_eq!(
            report.dead_letter_differences[0].to_string(),
            "dead letter at 0@3: committed transform_refused (not_negative), replayed \
             transform_refused (negative)"
        );
        assert!(
            report
                .to_string()
                .starts_with("NOT exact: 3 outputs as replayed")
        );
        // Without a code where the transform gave one: a difference too.
        letters.insert(
            (0, 3),
            ReplayDeadLetter::reason(DeadLetterReason::TransformRefused),
        );
        assert_eq!(
            compare(&expected, &run, &letters)
                .dead_letter_differences
                .len(),
            1
        );
        Ok(())
    }

    fn record(headers: &[(&str, &str)]) -> CommittedRecord {
        CommittedRecord {
            partition: 1,
            offset: 9,
            key: Some(b"a".to_vec()),
            value: Some(br#"{"amount": 5, "count": 1, "id": "e-1"}"#.to_vec()),
            headers: headers
                .iter()
                .map(|(key, value)| ((*key).to_owned(), Some(value.as_bytes().to_vec())))
                .collect(),
            timestamp_ms: 0,
            content: None,
        }
    }

    /// The processor's own dead-letter headers, after the original's: `eos-dlq-reason`, the
    /// transform's code when there is one, the detail and the source position.
    fn letter(own: &[(&str, &str)], original: &[(&str, &str)]) -> CommittedRecord {
        let mut headers = original.to_vec();
        headers.extend_from_slice(own);
        record(&headers)
    }

    #[test]
    fn a_run_is_read_from_its_records_by_the_processor_s_own_headers() {
        use eos_core::dead_letter::{
            DETAIL_HEADER, REASON_HEADER, SOURCE_OFFSET_HEADER, SOURCE_PARTITION_HEADER,
            SOURCE_TOPIC_HEADER, TRANSFORM_REASON_HEADER,
        };
        let refused = [
            (REASON_HEADER, "transform_refused"),
            (TRANSFORM_REASON_HEADER, "negative"),
            (DETAIL_HEADER, "negative amount"),
            (SOURCE_TOPIC_HEADER, "in"),
            (SOURCE_PARTITION_HEADER, "0"),
            (SOURCE_OFFSET_HEADER, "3"),
        ];
        let malformed = [
            (REASON_HEADER, "missing_field"),
            (DETAIL_HEADER, "no event_id"),
            (SOURCE_TOPIC_HEADER, "in"),
            (SOURCE_PARTITION_HEADER, "2"),
            (SOURCE_OFFSET_HEADER, "41"),
        ];
        let letters = [
            letter(&refused, &[]),
            // The original carried headers of the processor's names: only those after the last
            // eos-dlq-reason are the processor's, so no code is read from the original.
            letter(
                &malformed,
                &[
                    (REASON_HEADER, "nonsense"),
                    (TRANSFORM_REASON_HEADER, "forged"),
                    (SOURCE_OFFSET_HEADER, "7"),
                ],
            ),
            // Another input's dead letter on a shared topic, and a record that is none.
            letter(
                &[
                    (REASON_HEADER, "missing_field"),
                    (SOURCE_TOPIC_HEADER, "other"),
                    (SOURCE_PARTITION_HEADER, "0"),
                    (SOURCE_OFFSET_HEADER, "1"),
                ],
                &[],
            ),
            record(&[(REASON_HEADER, "missing_field")]),
        ];
        let output = record(&[("event_id", "forged-by-the-transform"), ("event_id", "e-1")]);
        let run = CommittedRun::from_records(
            "in",
            vec![record(&[("event_id", "e-1")])],
            [(DEFAULT_OUTPUT.to_owned(), vec![output])],
            &letters,
        );
        assert_eq!(
            run.dead_letters,
            BTreeMap::from([
                (
                    (0, 3),
                    ReplayDeadLetter::coded(DeadLetterReason::TransformRefused, "negative")
                ),
                (
                    (2, 41),
                    ReplayDeadLetter::reason(DeadLetterReason::MissingField)
                ),
            ])
        );
        assert_eq!(run.other_dead_letters, 2);
        assert_eq!(run.outputs, [committed("e-1", "a", 1, 5)]);
        assert_eq!(run.inputs[0].last_header("event_id"), Some("e-1"));
    }
}
