//! The state of one input partition — per-entity transform state and the event ids seen within
//! the dedup horizon — and the decision for each record. The committed state is on disk
//! ([`crate::state_store`]); the decision only reads it.
//!
//! A batch never mutates the committed state directly: its changes go to an [`Overlay`], which is
//! written to the store only after the Kafka transaction that carries the same changes to the
//! changelog has committed, and simply dropped on abort. So the store never holds uncommitted
//! state: it always equals a prefix of the changelog.
//!
//! Event time and the dedup horizon (docs/architecture/processor-state.md, "Event time and the
//! dedup horizon"): an event's time is its `occurred_at`, else the Kafka record's timestamp. An
//! event older than the horizon fails closed (dead letter `beyond_dedup_horizon`); a new event's id
//! is remembered until its event time plus the horizon. So a re-delivery of the same record after
//! its id expired carries the same record timestamp, which is by then past the horizon too: it is
//! dead-lettered, never counted again. The same event re-sent as a new record without
//! `occurred_at` gets a new record timestamp: after the id expired it is a new event.
//!
//! An event's outcome is final (docs/TRANSFORMS.md "An event's outcome is final"): applied
//! (outputs written, or consumed with none), refused or failed (a panic, a WebAssembly trap or
//! limit, an unknown output), its id is remembered with that outcome, so a re-delivery with the
//! same fingerprint is a duplicate and with another an `event_id_conflict` — a refused event is
//! never judged again by itself, not even when the entity's state would now let it through. The
//! one way to judge it again is an operator's re-drive (`eos_core::redrive`): a record carrying a
//! re-drive id that this event's outcome has not met yet, and only while the outcome is a dead
//! letter; its new outcome replaces the old one, and the id is kept with it, so the same re-drive
//! delivered twice is a duplicate.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::marker::PhantomData;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use eos_core::{DeadLetterReason, Event, EventContract, Fingerprint, RecordParts, redrive};

use crate::state_format;
use crate::state_store::{PartitionStore, StateChanges, StoreError};
use crate::transform::{Output, Refusal, SourcePosition, Transform};

pub use crate::seen_event::SeenEvent;

/// The most ids one sweep tombstones in a partition; the rest wait for the next batch, so a
/// burst of expiries never makes one huge transaction.
pub const EXPIRY_SWEEP_MAX: usize = 10_000;

/// Committed state of one partition, on disk.
#[derive(Debug)]
pub struct PartitionState<S> {
    store: PartitionStore,
    entity_state: PhantomData<fn() -> S>,
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

    /// How many changelog records carry this overlay (one per key; `seen` and `expired` never
    /// share an id).
    pub fn changelog_record_count(&self) -> usize {
        self.entities.len() + self.seen.len() + self.expired.len()
    }
}

/// What to do with one input record.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// A new event: write these records (none: consumed on purpose); an output without a key of
    /// its own is keyed by the entity.
    Emit {
        event_id: String,
        entity_id: String,
        outputs: Vec<Output>,
        /// The re-drive that had it judged again, whose id its outputs carry.
        redrive: Option<String>,
    },
    /// The same event again (same id, same fingerprint): drop it, count it.
    Duplicate { event_id: String },
    /// Quarantine the original bytes with this reason.
    DeadLetter {
        reason: DeadLetterReason,
        /// A transform's own reason code (`transform_refused`).
        code: Option<String>,
        detail: String,
        event_id: Option<String>,
    },
}

impl Decision {
    fn dead_letter(reason: DeadLetterReason, detail: String, event_id: Option<String>) -> Self {
        Self::DeadLetter {
            reason,
            code: None,
            detail,
            event_id,
        }
    }
}

/// What the decision needs to know: where the events' parts are, the dedup horizon, and the
/// outputs a transform may write to.
#[derive(Debug, Clone)]
pub struct DecisionPolicy {
    pub horizon_secs: i64,
    pub contract: EventContract,
    /// The configured output names (`--output NAME=TOPIC` and the default output).
    pub outputs: BTreeSet<String>,
    /// Whether each output's value can be written to its topic; `None`: any JSON can (plain
    /// JSON outputs).
    pub output_fit: Option<Arc<dyn OutputFit>>,
}

/// Whether an output's value can be written to its topic: an output in a schema registry's
/// format must fit its subject's schema. Asked before the event's effects are kept, so a value
/// that does not fit makes the event a dead letter (`output_schema_misfit`) with nothing of it
/// written and its entity's state as it was, never a half-written event.
pub trait OutputFit: Send + Sync {
    /// `Err` with where `value` does not fit `output`'s schema (the detail of the dead letter).
    fn check(&self, output: &str, value: &serde_json::Value) -> Result<(), String>;
}

impl std::fmt::Debug for dyn OutputFit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OutputFit")
    }
}

/// The first output whose value does not fit its topic's schema: the dead letter's detail.
/// A record read as an event: its id, time, content's fingerprint and re-drive id.
struct Identified {
    event: Event,
    event_id: String,
    event_time: i64,
    fingerprint: Fingerprint,
    redrive: Option<String>,
}

/// `record` as an event the decision can judge, or its dead letter: parts the contract cannot
/// find, an event time past the dedup horizon (fail closed: a duplicate could no longer be
/// recognised), a malformed re-drive header. The fingerprint is of the decoded content when the
/// record was in a registry format, so a re-encoding with a newer schema is the same event.
fn identify(
    record: &InputRecord<'_>,
    now_secs: i64,
    policy: &DecisionPolicy,
) -> Result<Identified, Decision> {
    let parts = RecordParts {
        key: record.key,
        value: record.value,
        headers: record.headers,
    };
    let event = Event::parse(&policy.contract, parts)
        .map_err(|error| Decision::dead_letter(error.reason(), error.to_string(), None))?;
    let event_id = event.id.to_string();
    let event_time = event
        .occurred_at
        .map(|t| t.unix_timestamp())
        .unwrap_or(record.timestamp_secs);
    if event_time < now_secs.saturating_sub(policy.horizon_secs) {
        return Err(Decision::dead_letter(
            DeadLetterReason::BeyondDedupHorizon,
            format!(
                "event time {event_time} is older than the dedup horizon of {} s",
                policy.horizon_secs
            ),
            Some(event_id),
        ));
    }
    let fingerprint = record
        .content
        .and_then(|content| serde_json::from_slice::<serde_json::Map<_, _>>(content).ok())
        .map_or(event.fingerprint, |mut content| {
            policy.contract.fingerprint_leaving_out(&mut content, &[])
        });
    let redrive = match redrive::redrive_id(record.headers) {
        Ok(redrive) => redrive.map(str::to_owned),
        Err(error) => {
            return Err(Decision::dead_letter(
                DeadLetterReason::InvalidField,
                error.to_string(),
                Some(event_id),
            ));
        }
    };
    Ok(Identified {
        event,
        event_id,
        event_time,
        fingerprint,
        redrive,
    })
}

/// What the transform's answer for one event comes to: its outputs, or why the event is a dead
/// letter: the transform's refusal, its panic (its bug on this one event), an output that is not
/// configured, or a value that does not fit its output's schema. Nothing of a refused event is
/// written.
fn judge_applied(
    applied: std::thread::Result<Result<Vec<Output>, Refusal>>,
    policy: &DecisionPolicy,
) -> Result<Vec<Output>, Refusal> {
    let refused = |reason, code: Option<&str>, detail| Refusal {
        reason,
        code: code.map(str::to_owned),
        detail,
    };
    match applied {
        Ok(Ok(outputs)) => {
            if let Some(unknown) = outputs
                .iter()
                .find(|output| !policy.outputs.contains(&output.output))
            {
                return Err(refused(
                    DeadLetterReason::TransformRefused,
                    Some("unknown_output"),
                    format!(
                        "the transform wrote to output {:?}, which is not configured \
                         (--output NAME=TOPIC)",
                        unknown.output
                    ),
                ));
            }
            match misfit(policy, &outputs) {
                Some(detail) => Err(refused(DeadLetterReason::OutputSchemaMisfit, None, detail)),
                None => Ok(outputs),
            }
        }
        Ok(Err(refusal)) => Err(refusal),
        Err(panic) => {
            let message = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".to_owned());
            Err(refused(
                DeadLetterReason::TransformPanic,
                None,
                format!("the transform panicked: {message}"),
            ))
        }
    }
}

fn misfit(policy: &DecisionPolicy, outputs: &[Output]) -> Option<String> {
    let fit = policy.output_fit.as_deref()?;
    outputs.iter().find_map(|output| {
        fit.check(&output.output, &output.value)
            .err()
            .map(|detail| format!("output {:?}: {detail}", output.output))
    })
}

/// One input record as the decision sees it.
#[derive(Debug, Clone, Copy)]
pub struct InputRecord<'a> {
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
    pub headers: &'a [(&'a str, Option<&'a [u8]>)],
    /// The record's timestamp (unix seconds), the event time when the contract finds none in
    /// the event.
    pub timestamp_secs: i64,
    /// The JSON object whose fingerprint tells this event's content from another's, when it is
    /// not `value`: a schema-registry record's decoded value without the fields at their
    /// schema's default (`eos_schema::ParsedSchema::decode_with_content`), so the same event
    /// written with a newer compatible schema is not taken for another with the same id.
    pub content: Option<&'a [u8]>,
}

impl<S: Clone + Default> PartitionState<S> {
    pub fn new(store: PartitionStore) -> Self {
        Self {
            store,
            entity_state: PhantomData,
        }
    }

    pub fn store(&self) -> &PartitionStore {
        &self.store
    }

    fn seen(&self, overlay: &Overlay<S>, event_id: &str) -> Result<Option<SeenEvent>, StoreError> {
        if let Some(seen) = overlay.seen.get(event_id) {
            return Ok(Some(seen.clone()));
        }
        if overlay.expired.contains(event_id) {
            return Ok(None);
        }
        self.store.seen(event_id)
    }

    fn entity<T: Transform<State = S>>(
        &self,
        overlay: &Overlay<S>,
        transform: &T,
        entity_id: &str,
    ) -> Result<S, StoreError> {
        if let Some(state) = overlay.entities.get(entity_id) {
            return Ok(state.clone());
        }
        match self.store.entity(entity_id)? {
            Some(stored) => state_format::decode(transform, &stored)
                .map_err(|e| StoreError::Corrupt(format!("entity {entity_id:?}: {e}"))),
            None => Ok(S::default()),
        }
    }

    /// Decides what `record` becomes, recording a new event's effects in `overlay`.
    pub fn decide<T: Transform<State = S>>(
        &self,
        overlay: &mut Overlay<S>,
        transform: &T,
        record: InputRecord<'_>,
        source: &SourcePosition,
        now_secs: i64,
        policy: &DecisionPolicy,
    ) -> Result<Decision, StoreError> {
        let Identified {
            event,
            event_id,
            event_time,
            fingerprint,
            redrive,
        } = match identify(&record, now_secs, policy) {
            Ok(identified) => identified,
            Err(dead_letter) => return Ok(dead_letter),
        };
        // The re-drives this event met before, kept with whatever outcome it gets now.
        let mut redrives = Vec::new();
        if let Some(seen) = self.seen(overlay, &event_id)? {
            if seen.fingerprint != fingerprint {
                return Ok(Decision::dead_letter(
                    DeadLetterReason::EventIdConflict,
                    format!(
                        "event_id already {} with fingerprint {}, this record has {fingerprint}",
                        seen.outcome(),
                        seen.fingerprint
                    ),
                    Some(event_id),
                ));
            }
            if !seen.admits_redrive(redrive.as_deref()) {
                return Ok(Decision::Duplicate { event_id });
            }
            redrives = seen.redrives;
        }
        redrives.extend(redrive.iter().cloned());
        let expires_at = event_time.saturating_add(policy.horizon_secs);
        // Whatever the transform makes of it, the outcome is remembered with the id, in this
        // batch's changelog records: so it commits or aborts with the dead letter or outputs.
        let mut remember = |overlay: &mut Overlay<S>, dead_letter: Option<DeadLetterReason>| {
            // Swept earlier in this batch and seen again: the id stays, so no tombstone for it
            // (the changelog would otherwise delete what the store keeps).
            overlay.expired.remove(&event_id);
            overlay.seen.insert(
                event_id.clone(),
                SeenEvent {
                    fingerprint,
                    expires_at,
                    dead_letter,
                    redrives: std::mem::take(&mut redrives),
                },
            );
        };
        let entity_id = event.entity.to_string();
        let mut entity_state = self.entity(overlay, transform, &entity_id)?;
        // A panic in the transform is the transform's bug on this one event: the event is set
        // aside as a dead letter and the loop goes on (docs/architecture/bad-input.md "Bad input").
        // The state it may have half changed is this call's copy, dropped with it.
        let applied = std::panic::catch_unwind(AssertUnwindSafe(|| {
            transform.apply(&mut entity_state, event, source)
        }));
        let outputs = match judge_applied(applied, policy) {
            Ok(outputs) => outputs,
            // The state stays as it was; the id is remembered with the refusal, so a
            // re-delivery is a duplicate even once the state would let it through.
            Err(refusal) => {
                remember(overlay, Some(refusal.reason));
                return Ok(Decision::DeadLetter {
                    reason: refusal.reason,
                    code: refusal.code,
                    detail: refusal.detail,
                    event_id: Some(event_id),
                });
            }
        };
        overlay.entities.insert(entity_id.clone(), entity_state);
        remember(overlay, None);
        Ok(Decision::Emit {
            event_id,
            entity_id,
            outputs,
            redrive,
        })
    }

    /// Marks up to [`EXPIRY_SWEEP_MAX`] committed ids whose horizon has passed as expired in
    /// `overlay` (each becomes a changelog tombstone); returns how many. Reads only the expired
    /// end of the expiry index, not the whole seen-set.
    pub fn expire(&self, overlay: &mut Overlay<S>, now_secs: i64) -> Result<usize, StoreError> {
        let mut expired = 0;
        for event_id in self.store.expired_ids(now_secs, EXPIRY_SWEEP_MAX)? {
            if !overlay.seen.contains_key(&event_id) {
                expired += usize::from(overlay.expired.insert(event_id));
            }
        }
        Ok(expired)
    }

    /// Writes a committed batch's changes to the store.
    pub fn apply<T: Transform<State = S>>(&self, overlay: Overlay<S>) -> Result<(), StoreError> {
        if overlay.is_empty() {
            return Ok(());
        }
        let mut changes = StateChanges::default();
        for (entity_id, state) in overlay.entities {
            let json = state_format::encode::<T>(&state)
                .map_err(|e| StoreError::Corrupt(format!("entity {entity_id:?}: {e}")))?;
            changes.entities.push((entity_id, Some(json)));
        }
        changes
            .seen
            .extend(overlay.expired.into_iter().map(|event_id| (event_id, None)));
        changes.seen.extend(
            overlay
                .seen
                .into_iter()
                .map(|(event_id, seen)| (event_id, Some(seen))),
        );
        self.store.write(&changes, None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state_store::StateStore;
    use crate::transform::{LedgerTotals, LedgerTransform};

    const NOW: i64 = 1_800_000_000;
    const HORIZON_SECS: i64 = 7 * 24 * 3600;

    fn policy() -> DecisionPolicy {
        DecisionPolicy {
            horizon_secs: HORIZON_SECS,
            contract: EventContract {
                max_record_bytes: 4096,
                ..EventContract::ledger()
            },
            outputs: BTreeSet::from([crate::transform::DEFAULT_OUTPUT.to_owned()]),
            output_fit: None,
        }
    }

    fn source(offset: i64) -> SourcePosition {
        SourcePosition {
            topic: "payments".into(),
            partition: 0,
            offset,
        }
    }

    fn fresh() -> PartitionState<LedgerTotals> {
        let store = StateStore::in_memory().expect("in-memory store");
        PartitionState::new(store.partition("changelog", 0).expect("tables"))
    }

    fn entity(state: &PartitionState<LedgerTotals>, entity_id: &str) -> Option<LedgerTotals> {
        state
            .store()
            .entity(entity_id)
            .expect("store reads")
            .map(|json| serde_json::from_slice(&json).expect("entity JSON"))
    }

    fn decide_at(
        state: &PartitionState<LedgerTotals>,
        overlay: &mut Overlay<LedgerTotals>,
        value: &str,
        record_timestamp: i64,
        now: i64,
    ) -> Decision {
        state
            .decide(
                overlay,
                &LedgerTransform,
                InputRecord {
                    key: None,
                    headers: &[],
                    value: Some(value.as_bytes()),
                    timestamp_secs: record_timestamp,
                    content: None,
                },
                &source(0),
                now,
                &policy(),
            )
            .expect("store reads")
    }

    fn decide(
        state: &PartitionState<LedgerTotals>,
        overlay: &mut Overlay<LedgerTotals>,
        value: &str,
        offset: i64,
    ) -> Decision {
        state
            .decide(
                overlay,
                &LedgerTransform,
                InputRecord {
                    key: None,
                    headers: &[],
                    value: Some(value.as_bytes()),
                    timestamp_secs: NOW,
                    content: None,
                },
                &source(offset),
                NOW,
                &policy(),
            )
            .expect("store reads")
    }

    #[test]
    fn the_seed_practice_counts_each_event_once() {
        // e-102 delivered twice, e-103 once: 32000 over attempts, 19500 over unique events.
        let state = fresh();
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
        state.apply::<LedgerTransform>(overlay).expect("applies");
        assert_eq!(
            entity(&state, "17"),
            Some(LedgerTotals {
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
        let state = fresh();
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
        let state = fresh();
        let mut overlay = Overlay::default();
        decide(
            &state,
            &mut overlay,
            r#"{"event_id":"e-102","entity_id":"17","value":12500}"#,
            0,
        );
        state.apply::<LedgerTransform>(overlay).expect("applies");
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
        let state = fresh();
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
        let empty = state
            .decide(
                &mut overlay,
                &LedgerTransform,
                InputRecord {
                    key: None,
                    headers: &[],
                    value: None,
                    timestamp_secs: NOW,
                    content: None,
                },
                &source(0),
                NOW,
                &policy(),
            )
            .expect("store reads");
        assert!(matches!(
            empty,
            Decision::DeadLetter {
                reason: DeadLetterReason::EmptyRecord,
                ..
            }
        ));
        // Only the record the ledger judged (its id and entity were there) is remembered, with
        // its refusal; a record without an id cannot be.
        assert!(overlay.entities.is_empty());
        assert_eq!(
            overlay
                .seen
                .iter()
                .map(|(id, seen)| (id.as_str(), seen.dead_letter))
                .collect::<Vec<_>>(),
            [("e", Some(DeadLetterReason::InvalidField))]
        );
    }

    #[test]
    fn an_overflowing_total_is_dead_lettered_and_changes_nothing() {
        let state = fresh();
        let mut overlay = Overlay::default();
        let max = format!(
            r#"{{"event_id":"e-1","entity_id":"a","value":{}}}"#,
            i64::MAX
        );
        assert!(matches!(
            decide(&state, &mut overlay, &max, 0),
            Decision::Emit { .. }
        ));
        state.apply::<LedgerTransform>(overlay).expect("applies");
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
        assert!(
            overlay.entities.is_empty(),
            "a refused event changes no state"
        );
        assert_eq!(
            overlay.seen["e-2"].dead_letter,
            Some(DeadLetterReason::TotalOverflow),
            "its outcome is remembered"
        );
        assert_eq!(
            entity(&state, "a"),
            Some(LedgerTotals {
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
        let state = fresh();
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
        let state = fresh();
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
        let state = fresh();
        let null = Fingerprint::of_json(&serde_json::Value::Null);
        state
            .store()
            .write(
                &StateChanges {
                    entities: vec![],
                    seen: vec![
                        ("e-old".into(), Some(SeenEvent::applied(null, NOW - 1))),
                        ("e-new".into(), Some(SeenEvent::applied(null, NOW + 100))),
                    ],
                },
                None,
            )
            .expect("writes");
        let mut overlay = Overlay::default();
        assert_eq!(state.expire(&mut overlay, NOW).expect("sweeps"), 1);
        assert!(overlay.expired.contains("e-old"));
        state.apply::<LedgerTransform>(overlay).expect("applies");
        assert_eq!(state.store().counts().expect("counts"), (0, 1));
        // Nothing else is due: a second sweep finds nothing.
        let mut overlay = Overlay::default();
        assert_eq!(state.expire(&mut overlay, NOW).expect("sweeps"), 0);
    }

    #[test]
    fn an_id_swept_and_seen_again_in_one_batch_is_kept_not_tombstoned() {
        // Ids expire by event time + horizon; a record of the same event sent again later
        // without occurred_at has a later event time and is a new event once the id expired.
        let state = fresh();
        let e = r#"{"event_id":"e-1","entity_id":"a","value":5}"#;
        let mut overlay = Overlay::default();
        let first_time = NOW - HORIZON_SECS;
        assert!(matches!(
            decide_at(&state, &mut overlay, e, first_time, first_time),
            Decision::Emit { .. }
        ));
        state.apply::<LedgerTransform>(overlay).expect("applies");
        let mut overlay = Overlay::default();
        assert_eq!(state.expire(&mut overlay, NOW + 1).expect("sweeps"), 1);
        assert!(matches!(
            decide_at(&state, &mut overlay, e, NOW + 1, NOW + 1),
            Decision::Emit { .. }
        ));
        assert!(overlay.expired.is_empty(), "no tombstone for a live id");
        state.apply::<LedgerTransform>(overlay).expect("applies");
        assert_eq!(state.store().counts().expect("counts"), (1, 1));
    }

    /// A re-delivery of the same Kafka record (same record timestamp, no `occurred_at`) after
    /// its id expired: its event time is past the horizon as well, so it fails closed instead of
    /// being counted again.
    #[test]
    fn a_redelivered_record_after_its_id_expired_fails_closed() {
        let state = fresh();
        let e = r#"{"event_id":"e-1","entity_id":"a","value":5}"#;
        let record_time = NOW;
        let mut overlay = Overlay::default();
        assert!(matches!(
            decide_at(&state, &mut overlay, e, record_time, NOW),
            Decision::Emit { .. }
        ));
        state.apply::<LedgerTransform>(overlay).expect("applies");
        let later = NOW + HORIZON_SECS + 1;
        let mut overlay = Overlay::default();
        assert_eq!(state.expire(&mut overlay, later).expect("sweeps"), 1);
        state.apply::<LedgerTransform>(overlay).expect("applies");
        let mut overlay = Overlay::default();
        let decision = decide_at(&state, &mut overlay, e, record_time, later);
        assert!(
            matches!(
                decision,
                Decision::DeadLetter {
                    reason: DeadLetterReason::BeyondDedupHorizon,
                    ..
                }
            ),
            "{decision:?}"
        );
        assert!(overlay.is_empty());
        assert_eq!(entity(&state, "a").map(|t| t.count), Some(1));
    }

    /// The same event (same id and content, no `occurred_at`) re-sent as a new record after its
    /// id expired: the new record's timestamp is its event time, within the horizon, and the id
    /// is no longer remembered, so it is applied as a new event. Within the horizon it is a
    /// duplicate.
    #[test]
    fn the_same_event_resent_as_a_new_record_after_its_id_expired_is_new() {
        let state = fresh();
        let e = r#"{"event_id":"e-1","entity_id":"a","value":5}"#;
        let mut overlay = Overlay::default();
        assert!(matches!(
            decide_at(&state, &mut overlay, e, NOW, NOW),
            Decision::Emit { .. }
        ));
        state.apply::<LedgerTransform>(overlay).expect("applies");
        let mut overlay = Overlay::default();
        assert!(matches!(
            decide_at(&state, &mut overlay, e, NOW + 60, NOW + 60),
            Decision::Duplicate { .. }
        ));
        let later = NOW + HORIZON_SECS + 1;
        let mut overlay = Overlay::default();
        assert_eq!(state.expire(&mut overlay, later).expect("sweeps"), 1);
        state.apply::<LedgerTransform>(overlay).expect("applies");
        let mut overlay = Overlay::default();
        assert!(matches!(
            decide_at(&state, &mut overlay, e, later, later),
            Decision::Emit { .. }
        ));
        state.apply::<LedgerTransform>(overlay).expect("applies");
        assert_eq!(entity(&state, "a").map(|t| t.count), Some(2));
    }

    /// With `occurred_at` the event time travels with the event: re-sent as a new record after
    /// its id expired, it is past the horizon and fails closed.
    #[test]
    fn an_event_with_occurred_at_resent_after_its_id_expired_fails_closed() {
        let state = fresh();
        let e =
            r#"{"event_id":"e-1","entity_id":"a","value":5,"occurred_at":"2027-01-15T08:00:00Z"}"#;
        let event_time = time::OffsetDateTime::parse(
            "2027-01-15T08:00:00Z",
            &time::format_description::well_known::Rfc3339,
        )
        .expect("valid time")
        .unix_timestamp();
        let mut overlay = Overlay::default();
        assert!(matches!(
            decide_at(&state, &mut overlay, e, event_time, event_time),
            Decision::Emit { .. }
        ));
        state.apply::<LedgerTransform>(overlay).expect("applies");
        let later = event_time + HORIZON_SECS + 1;
        let mut overlay = Overlay::default();
        assert_eq!(state.expire(&mut overlay, later).expect("sweeps"), 1);
        state.apply::<LedgerTransform>(overlay).expect("applies");
        let mut overlay = Overlay::default();
        assert!(matches!(
            decide_at(&state, &mut overlay, e, later, later),
            Decision::DeadLetter {
                reason: DeadLetterReason::BeyondDedupHorizon,
                ..
            }
        ));
    }

    /// Splits each event by its `n`: even to two outputs with keys of their own, a multiple of 5
    /// nowhere (dropped on purpose), 13 panics, 7 goes to an output nobody configured.
    struct Splitter;

    impl Transform for Splitter {
        type State = u64;

        fn contract(&self) -> EventContract {
            EventContract::default()
        }

        fn apply(
            &self,
            seen: &mut u64,
            event: Event,
            _source: &SourcePosition,
        ) -> Result<Vec<Output>, crate::transform::Refusal> {
            *seen += 1;
            let n = event.value["n"].as_i64().unwrap_or_default();
            match n {
                13 => panic!("unlucky {n}"),
                7 => Ok(vec![Output::new("nowhere", n)]),
                n if n % 5 == 0 => Ok(Vec::new()),
                n if n % 2 == 0 => Ok(vec![
                    Output::to_default(n).with_key("even"),
                    Output::new("audit", n).with_header("kind", "even"),
                ]),
                n => Err(crate::transform::Refusal::new("odd", format!("{n} is odd"))),
            }
        }
    }

    fn split(
        state: &PartitionState<u64>,
        overlay: &mut Overlay<u64>,
        id: &str,
        n: i64,
    ) -> Decision {
        let value = format!(r#"{{"n":{n}}}"#);
        let headers: [(&str, Option<&[u8]>); 1] = [("event_id", Some(id.as_bytes()))];
        let policy = DecisionPolicy {
            outputs: BTreeSet::from(["default".to_owned(), "audit".to_owned()]),
            contract: EventContract::default(),
            ..policy()
        };
        state
            .decide(
                overlay,
                &Splitter,
                InputRecord {
                    key: Some(b"card-1"),
                    value: Some(value.as_bytes()),
                    headers: &headers,
                    timestamp_secs: NOW,
                    content: None,
                },
                &source(0),
                NOW,
                &policy,
            )
            .expect("store reads")
    }

    #[test]
    fn a_transform_writes_any_outputs_or_none_and_its_failures_change_nothing() {
        let store = StateStore::in_memory().expect("in-memory store");
        let state = PartitionState::<u64>::new(store.partition("changelog", 0).expect("tables"));
        let mut overlay = Overlay::default();
        let Decision::Emit {
            entity_id, outputs, ..
        } = split(&state, &mut overlay, "a-2", 2)
        else {
            panic!("an even n is emitted");
        };
        assert_eq!(entity_id, "card-1");
        assert_eq!(outputs.len(), 2);
        assert_eq!(outputs[0].key.as_deref(), Some(&b"even"[..]));
        assert_eq!(outputs[1].output, "audit");
        assert_eq!(outputs[1].headers, [("kind".to_owned(), b"even".to_vec())]);
        // Dropped on purpose: applied (state and id kept) with nothing written.
        assert!(matches!(
            split(&state, &mut overlay, "a-5", 5),
            Decision::Emit { outputs, .. } if outputs.is_empty()
        ));
        assert_eq!(overlay.entities["card-1"], 2);
        assert!(overlay.seen.contains_key("a-5"));
        // A refusal, a panic and an unknown output: dead letters, the state untouched, the ids
        // remembered with their outcome.
        for (id, n, reason, code) in [
            ("a-3", 3, DeadLetterReason::TransformRefused, Some("odd")),
            ("a-13", 13, DeadLetterReason::TransformPanic, None),
            (
                "a-7",
                7,
                DeadLetterReason::TransformRefused,
                Some("unknown_output"),
            ),
        ] {
            let decision = split(&state, &mut overlay, id, n);
            let Decision::DeadLetter {
                reason: r,
                code: c,
                detail,
                ..
            } = decision
            else {
                panic!("{id}: {decision:?}");
            };
            assert_eq!((r, c.as_deref()), (reason, code), "{id}: {detail}");
            assert_eq!(overlay.seen[id].dead_letter, Some(reason), "{id}");
            assert_eq!(overlay.entities["card-1"], 2, "{id}");
        }
        // A failure is as final as a refusal: the same event again is a duplicate.
        assert_eq!(
            split(&state, &mut overlay, "a-13", 13),
            Decision::Duplicate {
                event_id: "a-13".into()
            }
        );
    }

    /// The audit output's schema takes numbers below 10 only.
    struct AuditBelowTen;

    impl OutputFit for AuditBelowTen {
        fn check(&self, output: &str, value: &serde_json::Value) -> Result<(), String> {
            match (output, value.as_i64()) {
                ("audit", Some(n)) if n >= 10 => Err(format!("{n} is not below 10")),
                _ => Ok(()),
            }
        }
    }

    #[test]
    fn an_output_that_does_not_fit_its_schema_makes_the_event_a_dead_letter_and_changes_nothing() {
        let store = StateStore::in_memory().expect("in-memory store");
        let state = PartitionState::<u64>::new(store.partition("changelog", 0).expect("tables"));
        let mut overlay = Overlay::default();
        let decide = |overlay: &mut Overlay<u64>, id: &str, n: i64| {
            let value = format!(r#"{{"n":{n}}}"#);
            let headers: [(&str, Option<&[u8]>); 1] = [("event_id", Some(id.as_bytes()))];
            let policy = DecisionPolicy {
                outputs: BTreeSet::from(["default".to_owned(), "audit".to_owned()]),
                contract: EventContract::default(),
                output_fit: Some(Arc::new(AuditBelowTen)),
                ..policy()
            };
            let record = InputRecord {
                key: Some(b"card-1"),
                value: Some(value.as_bytes()),
                headers: &headers,
                timestamp_secs: NOW,
                content: None,
            };
            state
                .decide(overlay, &Splitter, record, &source(0), NOW, &policy)
                .expect("store reads")
        };
        assert!(matches!(
            decide(&mut overlay, "a-2", 2),
            Decision::Emit { outputs, .. } if outputs.len() == 2
        ));
        // 12 goes to the default output (fits) and the audit output (does not): neither is written.
        let decision = decide(&mut overlay, "a-12", 12);
        let Decision::DeadLetter { reason, detail, .. } = &decision else {
            panic!("{decision:?}");
        };
        assert_eq!(*reason, DeadLetterReason::OutputSchemaMisfit);
        assert_eq!(detail, "output \"audit\": 12 is not below 10");
        assert_eq!(overlay.entities["card-1"], 1, "the state is as a-2 left it");
        assert_eq!(
            overlay.seen["a-12"].dead_letter,
            Some(DeadLetterReason::OutputSchemaMisfit)
        );
        assert_eq!(
            decide(&mut overlay, "a-12", 12),
            Decision::Duplicate {
                event_id: "a-12".into()
            },
            "the outcome is final"
        );
    }

    /// `split` with the record's headers: the event id and, for a re-drive, its id.
    fn split_redriven(
        state: &PartitionState<u64>,
        overlay: &mut Overlay<u64>,
        id: &str,
        n: i64,
        redrive: &str,
    ) -> Decision {
        let value = format!(r#"{{"n":{n}}}"#);
        let headers: [(&str, Option<&[u8]>); 2] = [
            ("event_id", Some(id.as_bytes())),
            (redrive::REDRIVE_ID_HEADER, Some(redrive.as_bytes())),
        ];
        let policy = DecisionPolicy {
            outputs: BTreeSet::from(["default".to_owned(), "audit".to_owned()]),
            contract: EventContract::default(),
            ..policy()
        };
        state
            .decide(
                overlay,
                &Splitter,
                InputRecord {
                    key: Some(b"card-1"),
                    value: Some(value.as_bytes()),
                    headers: &headers,
                    timestamp_secs: NOW,
                    content: None,
                },
                &source(0),
                NOW,
                &policy,
            )
            .expect("store reads")
    }

    /// Issue 51: a refused event re-delivered after the state changed was applied, and one
    /// re-delivered with other content was applied as new. Its outcome is final now, through
    /// the committed store as through the batch's overlay.
    #[test]
    fn a_refused_event_is_final_whatever_the_state_says_later() {
        let state = fresh();
        let mut overlay = Overlay::default();
        let max = format!(
            r#"{{"event_id":"e-1","entity_id":"a","value":{}}}"#,
            i64::MAX
        );
        let big = r#"{"event_id":"e-2","entity_id":"a","value":100}"#;
        assert!(matches!(
            decide(&state, &mut overlay, &max, 0),
            Decision::Emit { .. }
        ));
        assert!(matches!(
            decide(&state, &mut overlay, big, 1),
            Decision::DeadLetter {
                reason: DeadLetterReason::TotalOverflow,
                ..
            }
        ));
        state.apply::<LedgerTransform>(overlay).expect("applies");
        let stored = state
            .store()
            .seen("e-2")
            .expect("reads")
            .expect("remembered");
        assert_eq!(stored.dead_letter, Some(DeadLetterReason::TotalOverflow));
        // A refund makes room: before, the re-delivery of e-2 was applied now.
        let mut overlay = Overlay::default();
        let refund = r#"{"event_id":"e-3","entity_id":"a","value":-500}"#;
        assert!(matches!(
            decide(&state, &mut overlay, refund, 2),
            Decision::Emit { .. }
        ));
        assert_eq!(
            decide(&state, &mut overlay, big, 3),
            Decision::Duplicate {
                event_id: "e-2".into()
            }
        );
        let other = r#"{"event_id":"e-2","entity_id":"a","value":1}"#;
        let conflict = decide(&state, &mut overlay, other, 4);
        assert!(
            matches!(
                &conflict,
                Decision::DeadLetter { reason: DeadLetterReason::EventIdConflict, detail, .. }
                    if detail.contains("already dead-lettered (total_overflow)")
            ),
            "{conflict:?}"
        );
        assert_eq!(entity(&state, "a").map(|t| t.count), Some(1));
    }

    #[test]
    fn a_redrive_judges_a_dead_lettered_event_again_once() {
        let store = StateStore::in_memory().expect("in-memory store");
        let state = PartitionState::<u64>::new(store.partition("changelog", 0).expect("tables"));
        let mut overlay = Overlay::default();
        // 3 is refused, 13 panics.
        for (id, n) in [("a-3", 3), ("a-13", 13)] {
            assert!(matches!(
                split(&state, &mut overlay, id, n),
                Decision::DeadLetter { .. }
            ));
        }
        state.apply::<Splitter>(overlay).expect("applies");
        let mut overlay = Overlay::default();
        // Re-driven with a transform that still refuses: refused again, and the re-drive kept.
        let again = split_redriven(&state, &mut overlay, "a-3", 3, "rd-1");
        assert!(
            matches!(
                again,
                Decision::DeadLetter {
                    reason: DeadLetterReason::TransformRefused,
                    ..
                }
            ),
            "{again:?}"
        );
        assert_eq!(overlay.seen["a-3"].redrives, ["rd-1"]);
        // The same re-drive delivered twice: a duplicate, not a third judgement.
        assert_eq!(
            split_redriven(&state, &mut overlay, "a-3", 3, "rd-1"),
            Decision::Duplicate {
                event_id: "a-3".into()
            }
        );
        state.apply::<Splitter>(overlay).expect("applies");
        // A re-drive with other content is a conflict like any other record.
        let mut overlay = Overlay::default();
        assert!(matches!(
            split_redriven(&state, &mut overlay, "a-3", 4, "rd-2"),
            Decision::DeadLetter {
                reason: DeadLetterReason::EventIdConflict,
                ..
            }
        ));
        // The panic's event re-driven after "the fix" (here: content the transform takes, which
        // a fix would be) is out of reach; a re-drive of an applied event changes nothing.
        let Decision::Emit {
            outputs, redrive, ..
        } = split_redriven(&state, &mut overlay, "a-2", 2, "rd-3")
        else {
            panic!("a new event under a re-drive is judged");
        };
        assert_eq!((outputs.len(), redrive.as_deref()), (2, Some("rd-3")));
        assert_eq!(
            split_redriven(&state, &mut overlay, "a-2", 2, "rd-4"),
            Decision::Duplicate {
                event_id: "a-2".into()
            },
            "an applied event is never judged again"
        );
        state.apply::<Splitter>(overlay).expect("applies");
        let stored = state.store().seen("a-3").expect("reads").expect("kept");
        assert_eq!(
            (stored.dead_letter, stored.redrives),
            (
                Some(DeadLetterReason::TransformRefused),
                vec!["rd-1".to_owned()]
            )
        );
        // A re-drive id that cannot be one is refused, not taken for an ordinary re-delivery.
        let mut overlay = Overlay::default();
        assert!(matches!(
            split_redriven(&state, &mut overlay, "a-3", 3, "not an id"),
            Decision::DeadLetter {
                reason: DeadLetterReason::InvalidField,
                ..
            }
        ));
    }

    /// A transform fixed between a refusal and its re-drive: the re-drive applies it, its outputs
    /// name the re-drive, and the event's outcome is then applied for every later record.
    #[test]
    fn a_redriven_refusal_applied_replaces_the_refusal() {
        struct Limit(i64);
        impl Transform for Limit {
            type State = i64;
            fn apply(
                &self,
                spent: &mut i64,
                event: Event,
                _source: &SourcePosition,
            ) -> Result<Vec<Output>, crate::transform::Refusal> {
                let amount = event.value["n"].as_i64().unwrap_or_default();
                if *spent + amount > self.0 {
                    return Err(crate::transform::Refusal::new("over_limit", "over"));
                }
                *spent += amount;
                Ok(vec![Output::to_default(*spent)])
            }
        }
        let store = StateStore::in_memory().expect("in-memory store");
        let state = PartitionState::<i64>::new(store.partition("changelog", 0).expect("tables"));
        let decide_with = |limit: i64, overlay: &mut Overlay<i64>, redrive: Option<&str>| {
            let mut headers: Vec<(&str, Option<&[u8]>)> = vec![("event_id", Some(b"a-1"))];
            if let Some(redrive) = redrive {
                headers.push((redrive::REDRIVE_ID_HEADER, Some(redrive.as_bytes())));
            }
            state
                .decide(
                    overlay,
                    &Limit(limit),
                    InputRecord {
                        key: Some(b"card-1"),
                        value: Some(br#"{"n":50}"#),
                        headers: &headers,
                        timestamp_secs: NOW,
                        content: None,
                    },
                    &source(0),
                    NOW,
                    &DecisionPolicy {
                        contract: EventContract::default(),
                        ..policy()
                    },
                )
                .expect("store reads")
        };
        let mut overlay = Overlay::default();
        assert!(matches!(
            decide_with(10, &mut overlay, None),
            Decision::DeadLetter { .. }
        ));
        // The limit raised: a plain re-delivery is still a duplicate, the re-drive applies it.
        assert!(matches!(
            decide_with(100, &mut overlay, None),
            Decision::Duplicate { .. }
        ));
        assert!(matches!(
            decide_with(100, &mut overlay, Some("rd-1")),
            Decision::Emit {
                redrive: Some(_),
                ..
            }
        ));
        assert_eq!(overlay.seen["a-1"].dead_letter, None);
        for redrive in [None, Some("rd-1"), Some("rd-2")] {
            assert!(
                matches!(
                    decide_with(100, &mut overlay, redrive),
                    Decision::Duplicate { .. }
                ),
                "{redrive:?}"
            );
        }
    }
}
