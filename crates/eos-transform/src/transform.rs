//! The per-event business logic: the one trait a user implements to run their own logic under the
//! processor's exactly-once loop (docs/TRANSFORMS.md), and the built-in transforms the binary
//! offers behind `--transform`.
//!
//! A transform sees only new events (duplicate deliveries are dropped before it, by event id and
//! fingerprint) together with the state of the event's entity, and returns zero or more outputs or
//! a refusal. Everything it returns, and the entity's new state, goes into the batch's one Kafka
//! transaction, so a replay after an abort or a crash computes it again from the same inputs and
//! the same state: a transform must be deterministic (no clock, no randomness, no I/O).

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use eos_core::{DeadLetterReason, Event, EventContract, EventEnvelope};

/// The name of the output that `--output-topic` configures; other outputs are named by
/// `--output NAME=TOPIC`.
pub const DEFAULT_OUTPUT: &str = "default";

/// `NAME=TOPIC` (the processor's `--output`, eosctl's `audit --replay --named-output`), as clap's
/// value parser: the name and the topic, both non-empty.
pub fn parse_named_output(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((name, topic)) if !name.is_empty() && !topic.is_empty() => {
            Ok((name.to_owned(), topic.to_owned()))
        }
        _ => Err(format!("{text:?} is not NAME=TOPIC")),
    }
}

/// Where an input record was read from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourcePosition {
    /// The input topic.
    pub topic: String,
    /// Its partition.
    pub partition: i32,
    /// The record's offset.
    pub offset: i64,
}

/// One record a transform writes for an event.
#[derive(Debug, Clone, PartialEq)]
pub struct Output {
    /// The output it goes to, by name: [`DEFAULT_OUTPUT`] or one configured with
    /// `--output NAME=TOPIC`.
    pub output: String,
    /// The record key; `None` keys it by the event's entity.
    pub key: Option<Vec<u8>>,
    /// The record value.
    pub value: Value,
    /// Headers of its own. The processor adds the trace context (`traceparent`, `baggage`) and
    /// the `event_id` header after them.
    pub headers: Vec<(String, Vec<u8>)>,
}

impl Output {
    /// A record to `output`, keyed by the event's entity, without headers of its own.
    pub fn new(output: impl Into<String>, value: impl Into<Value>) -> Self {
        Self {
            output: output.into(),
            key: None,
            value: value.into(),
            headers: Vec::new(),
        }
    }

    /// A record to the default output, keyed by the event's entity.
    pub fn to_default(value: impl Into<Value>) -> Self {
        Self::new(DEFAULT_OUTPUT, value)
    }

    /// The same record with its own key.
    #[must_use]
    pub fn with_key(mut self, key: impl Into<Vec<u8>>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// The same record with one more header.
    #[must_use]
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<Vec<u8>>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }
}

/// Why a transform refuses an event: it becomes a dead letter, the entity's state is left as it
/// was, and the event id is remembered with the refusal — the event's final outcome, so a
/// re-delivery is a duplicate (or, with other content, an `event_id_conflict`) even once the
/// state would let it through. Only an operator's re-drive judges it again (docs/TRANSFORMS.md
/// "An event's outcome is final").
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{detail}")]
pub struct Refusal {
    /// The dead letter's reason: `transform_refused` for a transform's own reason, or one of the
    /// suite's reasons for the built-in transforms.
    pub reason: DeadLetterReason,
    /// The transform's own reason code (`over_limit`), written to the dead letter's
    /// `eos-dlq-transform-reason` header.
    pub code: Option<String>,
    /// For people: what was wrong.
    pub detail: String,
}

impl Refusal {
    /// A refusal with the transform's own reason code: lowercase letters, digits and `_`, at most
    /// 64 bytes (anything else is replaced by `_`, so a code is always a safe header value and
    /// metric label).
    pub fn new(code: &str, detail: impl Into<String>) -> Self {
        let code: String = code
            .chars()
            .take(64)
            .map(|c| match c {
                'a'..='z' | '0'..='9' | '_' => c,
                'A'..='Z' => c.to_ascii_lowercase(),
                _ => '_',
            })
            .collect();
        Self {
            reason: DeadLetterReason::TransformRefused,
            code: Some(if code.is_empty() {
                "refused".into()
            } else {
                code
            }),
            detail: detail.into(),
        }
    }

    /// A refusal with one of the suite's own reasons (the built-in transforms).
    pub fn with_reason(reason: DeadLetterReason, detail: impl Into<String>) -> Self {
        Self {
            reason,
            code: None,
            detail: detail.into(),
        }
    }
}

/// Why stored state cannot be read by this transform.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct StateUpgradeError(pub String);

/// The logic the processor runs for each new event. See docs/TRANSFORMS.md for a worked example.
pub trait Transform: Send + 'static {
    /// State kept per entity, in the changelog and the local store as JSON.
    type State: Clone + Default + Serialize + DeserializeOwned + Send + std::fmt::Debug;

    /// The version of `State`'s format. Every stored state carries the version it was written
    /// with; state of another version is refused at restore unless
    /// [`Transform::upgrade_state`] turns it into this one. Raise it whenever a stored state
    /// would no longer mean the same thing.
    const STATE_VERSION: u32 = 1;

    /// Where this transform's events carry their id, entity and time, unless the operator says
    /// otherwise (`--event-id`, `--entity`, `--occurred-at`). Default: the `event_id` header and
    /// the record key, no event time.
    fn contract(&self) -> EventContract {
        EventContract::default()
    }

    /// Names of the outputs it writes to besides [`DEFAULT_OUTPUT`]; each must be configured with
    /// `--output NAME=TOPIC`, which is checked at start-up.
    fn outputs(&self) -> Vec<String> {
        Vec::new()
    }

    /// Whether it writes to [`DEFAULT_OUTPUT`], whose topic (`--output-topic`) is then required
    /// at start-up. A transform that writes only to the outputs it names answers `false`: it
    /// needs no default output topic, and the processor creates none (an output to the default
    /// one is then an `unknown_output` dead letter).
    fn writes_default_output(&self) -> bool {
        true
    }

    /// Applies one new event to its entity's state and returns the records to write (none: the
    /// event is consumed on purpose, and its id remembered). On a refusal `state` may be partly
    /// changed: the processor drops it.
    fn apply(
        &self,
        state: &mut Self::State,
        event: Event,
        source: &SourcePosition,
    ) -> Result<Vec<Output>, Refusal>;

    /// Turns state stored with `from_version` (its JSON as stored) into the current `State`.
    /// The default refuses, so a changelog written by another version stops the restore with a
    /// clear error rather than being misread.
    fn upgrade_state(
        &self,
        from_version: u32,
        state: Value,
    ) -> Result<Self::State, StateUpgradeError> {
        let _ = state;
        Err(StateUpgradeError(format!(
            "the state was written with state format version {from_version}; this transform's \
             is {} and it has no upgrade from {from_version}",
            Self::STATE_VERSION
        )))
    }

    /// Checks a state read back from the changelog or the local store before any event is
    /// applied to it, and may rewrite it. An error stops the restore, as a state format
    /// without an upgrade does. The default admits every state; a transform whose state
    /// depends on more than the format version (a WebAssembly module's state, stamped with the
    /// module's digest) refuses here what it cannot read.
    fn admit_state(&self, state: Self::State) -> Result<Self::State, StateUpgradeError> {
        Ok(state)
    }

    /// Whether the last [`Transform::apply`] was cut short by the processor's shutdown rather
    /// than decided: its refusal is then not the event's outcome, so the processor stops
    /// without committing the open batch and the event is read again at the next start. Only a
    /// transform whose calls can be stopped from outside says so (the WebAssembly one, whose
    /// call the shutdown interrupts, docs/TRANSFORMS.md "Determinism and limits"); the
    /// default never is.
    fn interrupted(&self) -> bool {
        false
    }

    /// The digest of the code this transform runs when that code is loaded from outside the
    /// binary (a WebAssembly module): shown on `/boundary` and as the `digest` label of
    /// `eos_processor_transform_module_info`, so an operator sees which module a pod runs.
    /// `None`, the default, for logic compiled into the binary.
    fn module_digest(&self) -> Option<String> {
        None
    }
}

/// The transforms built into the processor binary (`--transform`), which eosctl's
/// `audit --replay --transform` replays by the same names; a library user runs their own with
/// eos-processor's `Processor`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BuiltinTransform {
    /// The demo's ledger: checks the ledger envelope and keeps per-entity running totals.
    Ledger,
    /// Each new event's value to the default output as it came, or only those whose value at
    /// --filter-pointer equals --filter-equals.
    PassThrough,
}

/// Per-entity running totals: the reference practice's `counter = counter + 1`
/// (docs/ARCHITECTURE.md "The reference practice"), which a replay must not repeat.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerTotals {
    /// Sum of the entity's event values.
    pub total: i64,
    /// Number of the entity's events applied.
    pub count: u64,
}

/// The demo's transform: checks the ledger envelope (docs/architecture/wire-format.md "Wire
/// format") and emits it plus `entity_total`, `entity_count` and `source`.
#[derive(Debug, Clone, Copy, Default)]
pub struct LedgerTransform;

/// Fields the ledger transform adds to the input envelope.
pub const LEDGER_ADDED_FIELDS: [&str; 3] = ["entity_total", "entity_count", "source"];

impl Transform for LedgerTransform {
    type State = LedgerTotals;

    fn contract(&self) -> EventContract {
        EventContract::ledger()
    }

    fn apply(
        &self,
        state: &mut LedgerTotals,
        event: Event,
        source: &SourcePosition,
    ) -> Result<Vec<Output>, Refusal> {
        let (event_id, entity) = (event.id, event.entity);
        // The ledger schema is the transform's, not the core's: a record that is an event under
        // the configured contract but not a ledger envelope is refused here, by field.
        let envelope = EventEnvelope::from_object(event.value)
            .map_err(|error| Refusal::with_reason(error.reason(), error.to_string()))?;
        // Read from headers or the key, the id and entity must still be the envelope's.
        if envelope.event_id != event_id || envelope.entity_id != entity {
            return Err(Refusal::with_reason(
                DeadLetterReason::InvalidField,
                format!(
                    "the envelope's event_id {:?} and entity_id {:?} differ from the record's \
                     event id {:?} and entity {:?}",
                    envelope.event_id.as_str(),
                    envelope.entity_id.as_str(),
                    event_id.as_str(),
                    entity.as_str()
                ),
            ));
        }
        // A total past i64 cannot be represented; saturating would silently make every later
        // total wrong, and a panic would wedge the partition. So the event is refused, explicitly.
        let total = state.total.checked_add(envelope.value).ok_or_else(|| {
            Refusal::with_reason(
                DeadLetterReason::TotalOverflow,
                format!(
                    "entity {} total {} plus value {} overflows a signed 64-bit integer",
                    envelope.entity_id, state.total, envelope.value
                ),
            )
        })?;
        let count = state.count.checked_add(1).ok_or_else(|| {
            Refusal::with_reason(
                DeadLetterReason::TotalOverflow,
                format!("entity {} event count overflows", envelope.entity_id),
            )
        })?;
        state.total = total;
        state.count = count;
        let mut output = envelope.into_json();
        output.insert("entity_total".into(), Value::from(state.total));
        output.insert("entity_count".into(), Value::from(state.count));
        output.insert(
            "source".into(),
            serde_json::to_value(source).unwrap_or(Value::Null),
        );
        Ok(vec![Output::to_default(output)])
    }
}

/// A stateless transform: each new event's value to the default output as it came, or dropped
/// when a JSON pointer in it does not hold the wanted value (`--filter-pointer`,
/// `--filter-equals`). Dedup by event id and the exactly-once outputs still apply.
#[derive(Debug, Clone, Default)]
pub struct PassThroughTransform {
    /// Pass only events whose value at this pointer equals `equals`.
    pub filter: Option<(String, Value)>,
}

impl Transform for PassThroughTransform {
    type State = ();

    fn apply(
        &self,
        _state: &mut (),
        event: Event,
        _source: &SourcePosition,
    ) -> Result<Vec<Output>, Refusal> {
        let value = Value::Object(event.value);
        if let Some((pointer, wanted)) = &self.filter
            && value.pointer(pointer) != Some(wanted)
        {
            return Ok(Vec::new());
        }
        Ok(vec![Output::to_default(value)])
    }
}

/// The text of a filter value: JSON when it parses as JSON (`true`, `3`, `"EUR"`), else the
/// string itself (`EUR`).
pub fn filter_value(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned()))
}

/// The object a ledger test event is made of (used by the tests of the crate's modules).
#[cfg(test)]
pub(crate) fn ledger_event(id: &str, value: i64) -> Event {
    let text = format!(r#"{{"event_id":"{id}","entity_id":"17","value":{value}}}"#);
    Event::parse(
        &EventContract::ledger(),
        eos_core::RecordParts {
            key: None,
            value: Some(text.as_bytes()),
            headers: &[],
        },
    )
    .expect("valid test event")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Map;

    fn source(offset: i64) -> SourcePosition {
        SourcePosition {
            topic: "payments".into(),
            partition: 2,
            offset,
        }
    }

    fn only(outputs: Vec<Output>) -> Map<String, Value> {
        assert_eq!(outputs.len(), 1, "{outputs:?}");
        match outputs.into_iter().next().map(|output| output.value) {
            Some(Value::Object(object)) => object,
            other => panic!("not an object: {other:?}"),
        }
    }

    #[test]
    fn ledger_accumulates_and_reports_the_source() {
        let mut totals = LedgerTotals::default();
        LedgerTransform
            .apply(&mut totals, ledger_event("e-102", 12500), &source(41))
            .expect("applies");
        let output = only(
            LedgerTransform
                .apply(&mut totals, ledger_event("e-103", 7000), &source(41))
                .expect("applies"),
        );
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
        for (start, value) in [(i64::MAX - 5, 6), (i64::MIN + 5, -6)] {
            let mut totals = LedgerTotals {
                total: start,
                count: 3,
            };
            let refusal = LedgerTransform
                .apply(&mut totals, ledger_event("e-big", value), &source(0))
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
                .apply(&mut totals, ledger_event("e-edge", 5), &source(0))
                .is_ok()
        );
        assert_eq!(totals.total, i64::MAX);
    }

    #[test]
    fn the_ledger_checks_its_envelope_and_that_it_agrees_with_the_record() {
        let event = |value: &str, contract: &EventContract, key: Option<&str>| {
            Event::parse(
                contract,
                eos_core::RecordParts {
                    key: key.map(str::as_bytes),
                    value: Some(value.as_bytes()),
                    headers: &[("event_id", Some(b"e-1"))],
                },
            )
            .expect("an event under the contract")
        };
        let ledger = EventContract::ledger();
        let by_header = EventContract::default();
        for (value, contract, key, reason, field) in [
            (
                r#"{"event_id":"e-1","entity_id":"a"}"#,
                &ledger,
                None,
                DeadLetterReason::MissingField,
                "value",
            ),
            (
                r#"{"event_id":"e-1","entity_id":"a","value":"12.50"}"#,
                &ledger,
                None,
                DeadLetterReason::InvalidField,
                "value",
            ),
            (
                r#"{"event_id":"e-2","entity_id":"a","value":1}"#,
                &by_header,
                Some("a"),
                DeadLetterReason::InvalidField,
                "differ",
            ),
            (
                r#"{"event_id":"e-1","entity_id":"b","value":1}"#,
                &by_header,
                Some("a"),
                DeadLetterReason::InvalidField,
                "differ",
            ),
        ] {
            let refusal = LedgerTransform
                .apply(
                    &mut LedgerTotals::default(),
                    event(value, contract, key),
                    &source(0),
                )
                .expect_err(value);
            assert_eq!(refusal.reason, reason, "{value}");
            assert!(refusal.detail.contains(field), "{value}: {refusal}");
        }
        // Id in the header and entity in the key, agreeing with the envelope: applied.
        let output = LedgerTransform
            .apply(
                &mut LedgerTotals::default(),
                event(
                    r#"{"event_id":"e-1","entity_id":"a","value":1}"#,
                    &by_header,
                    Some("a"),
                ),
                &source(0),
            )
            .expect("applies");
        assert_eq!(only(output)["entity_total"], 1);
    }

    #[test]
    fn pass_through_copies_or_filters_by_pointer() {
        let event = ledger_event("e-1", 5);
        let all = PassThroughTransform::default();
        let copied = only(
            all.apply(&mut (), event.clone(), &source(0))
                .expect("passes"),
        );
        assert_eq!(copied, event.value);
        let only_fives = PassThroughTransform {
            filter: Some(("/value".into(), filter_value("5"))),
        };
        assert_eq!(
            only_fives
                .apply(&mut (), event.clone(), &source(0))
                .expect("passes")
                .len(),
            1
        );
        let only_sixes = PassThroughTransform {
            filter: Some(("/value".into(), filter_value("6"))),
        };
        assert!(
            only_sixes
                .apply(&mut (), event, &source(0))
                .expect("dropped, not refused")
                .is_empty()
        );
        assert_eq!(filter_value("EUR"), Value::String("EUR".into()));
        assert_eq!(filter_value("\"EUR\""), Value::String("EUR".into()));
        assert_eq!(filter_value("true"), Value::Bool(true));
    }

    #[test]
    fn a_refusal_code_is_a_safe_label() {
        let refusal = Refusal::new("Over Limit!", "card c-1 over its daily limit");
        assert_eq!(refusal.reason, DeadLetterReason::TransformRefused);
        assert_eq!(refusal.code.as_deref(), Some("over_limit_"));
        assert_eq!(Refusal::new("", "x").code.as_deref(), Some("refused"));
        assert_eq!(
            Refusal::new(&"x".repeat(100), "x").code.map(|c| c.len()),
            Some(64)
        );
    }
}
