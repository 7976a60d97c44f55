//! The interface between the processor and a module, version [`INTERFACE_VERSION`]: JSON in,
//! JSON out, through Extism's input and output (docs/TRANSFORMS.md "WebAssembly transforms"
//! is the reference for module authors).
//!
//! Input of `apply`:
//!
//! ```json
//! {"state": null,
//!  "event": {"value": {"auth_id": "a-1", "card": "c-7", "amount": "12.50"},
//!            "event_id": "a-1", "entity": "c-7", "occurred_at": "2026-12-04T10:00:00Z",
//!            "key": "c-7", "headers": {"traceparent": "00-…"},
//!            "partition": 0, "offset": 41}}
//! ```
//!
//! Output: `{"state": …, "outputs": [{"output": "default", "key": "…", "value": …,
//! "headers": {"name": "value"}}]}` (`key` and `headers` optional) or
//! `{"refusal": {"code": "…", "detail": "…"}}`. Instead of `value`, an output may give
//! `"event_value_with": {"status": "approved"}`: the event's value with those top-level members
//! set, which the host builds, so a module that passes an event on does not read and write all
//! of it (version 2).
//!
//! The optional `eos_upgrade_state` takes `{"digest": "sha256:…", "state": …}` (a state another
//! module wrote, and that module's digest) and answers `{"state": …}`.
//!
//! The optional `eos_contract`, called once when the module is loaded, declares where the
//! module's events keep their id, entity and time, every output it writes to, and the members
//! of an event's value it reads: `{"event_id": "/auth_id", "entity": "/card", "occurred_at":
//! "/at", "outputs": ["default", "flagged"], "reads": ["amount", "currency"]}` (each member
//! optional; [`DeclaredContract`]). With `reads`, `event.value` holds only those members: a
//! module that needs two fields of a large event does not read all of it.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use time::format_description::well_known::Rfc3339;

use crate::{CallError, Position};
use eos_core::{Event, FieldLocation};

/// The interface version of this host: the one the example modules and the SDK helpers answer.
/// Raised when the meaning of the input or the result changes; a module built for a version
/// the host does not run is refused at start-up, never at its first event.
pub const INTERFACE_VERSION: &str = "eos-transform/2";

/// Every version a module's `eos_interface_version` may answer: 2, and 1, whose modules are
/// version 2's without `eos_contract` and `event_value_with` (a module that uses either answers
/// 2, so that a host of version 1 refuses it at start-up instead of dead-lettering its events).
pub const INTERFACE_VERSIONS: [&str; 2] = ["eos-transform/1", INTERFACE_VERSION];

/// One record the module writes.
#[derive(Debug, Clone, PartialEq)]
pub struct ModuleOutput {
    /// The output's name: `default` or one configured with `--output NAME=TOPIC`.
    pub output: String,
    /// The record key; absent keys it by the event's entity.
    pub key: Option<String>,
    /// The record value: the module's `value`, or the event's value with its
    /// `event_value_with` members set.
    pub value: Value,
    /// Headers of its own.
    pub headers: std::collections::BTreeMap<String, String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawOutput {
    output: String,
    #[serde(default)]
    key: Option<String>,
    #[serde(default, deserialize_with = "present")]
    value: Option<Value>,
    #[serde(default)]
    event_value_with: Option<Map<String, Value>>,
    #[serde(default)]
    headers: std::collections::BTreeMap<String, String>,
}

/// The module's refusal of an event.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModuleRefusal {
    /// Its reason code.
    pub code: String,
    /// For people.
    #[serde(default)]
    pub detail: String,
}

/// What `apply` answered.
#[derive(Debug, Clone, PartialEq)]
pub enum InterfaceResult {
    /// The new state and the outputs.
    Applied {
        /// The entity's new state.
        state: Value,
        /// The records to write.
        outputs: Vec<ModuleOutput>,
    },
    /// A refusal.
    Refused(ModuleRefusal),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawResult {
    /// Present (even as `null`, a stateless module's answer) or absent, which serde's
    /// `Option<Value>` alone would not tell apart.
    #[serde(default, deserialize_with = "present")]
    state: Option<Value>,
    #[serde(default)]
    outputs: Vec<RawOutput>,
    #[serde(default)]
    refusal: Option<ModuleRefusal>,
}

#[derive(Serialize)]
struct Input<'a> {
    state: &'a Value,
    event: EventInput<'a>,
}

#[derive(Serialize)]
struct EventInput<'a> {
    value: Projected<'a>,
    event_id: &'a str,
    entity: &'a str,
    /// RFC 3339 in UTC, so a module's "day" is the UTC day without a time-zone library.
    occurred_at: Option<String>,
    key: Option<String>,
    headers: Map<String, Value>,
    partition: i32,
    offset: i64,
}

/// An event's value as the module asked for it: whole, or only the members it reads.
struct Projected<'a> {
    value: &'a Map<String, Value>,
    reads: Option<&'a [String]>,
}

impl Serialize for Projected<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let Some(reads) = self.reads else {
            return self.value.serialize(serializer);
        };
        use serde::ser::SerializeMap as _;
        let mut map = serializer.serialize_map(None)?;
        // In the order of the value's own members (sorted), as the whole value is written.
        for (name, value) in self.value {
            if reads.contains(name) {
                map.serialize_entry(name, value)?;
            }
        }
        map.end()
    }
}

fn present<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(deserializer).map(Some)
}

/// The JSON input of `apply`: the event's value whole, or only its members `reads` names (the
/// module's declaration). Key and header values are handed over as text (bytes that are not
/// UTF-8 replaced), a header given twice by its last value.
pub fn input(
    state: &Value,
    event: &Event,
    position: Position,
    reads: Option<&[String]>,
) -> Result<Vec<u8>, String> {
    let occurred_at = event
        .occurred_at
        .map(|at| at.to_offset(time::UtcOffset::UTC).format(&Rfc3339))
        .transpose()
        .map_err(|error| error.to_string())?;
    let headers = event
        .headers
        .iter()
        .map(|(name, value)| {
            let value = value
                .as_deref()
                .map(|bytes| Value::String(String::from_utf8_lossy(bytes).into_owned()))
                .unwrap_or(Value::Null);
            (name.clone(), value)
        })
        .collect();
    let input = Input {
        state,
        event: EventInput {
            value: Projected {
                value: &event.value,
                reads,
            },
            event_id: event.id.as_str(),
            entity: event.entity.as_str(),
            occurred_at,
            key: event
                .key
                .as_deref()
                .map(|key| String::from_utf8_lossy(key).into_owned()),
            headers,
            partition: position.partition,
            offset: position.offset,
        },
    };
    serde_json::to_vec(&input).map_err(|error| error.to_string())
}

/// The result of `apply` from its output bytes, for an event whose value is `event_value`.
/// Anything but exactly one of a state or a refusal, or an output with both or neither of a
/// `value` and an `event_value_with`, is the module's bug, reported as a trap.
pub fn result(
    bytes: &[u8],
    event_value: &Map<String, Value>,
) -> Result<InterfaceResult, CallError> {
    let raw: RawResult = serde_json::from_slice(bytes).map_err(|error| {
        CallError::Trap(format!(
            "the module's result is not the interface's JSON ({INTERFACE_VERSION}): {error}"
        ))
    })?;
    match (raw.state, raw.refusal) {
        (Some(state), None) => Ok(InterfaceResult::Applied {
            state,
            outputs: raw
                .outputs
                .into_iter()
                .map(|output| resolve(output, event_value))
                .collect::<Result<_, _>>()?,
        }),
        (None, Some(refusal)) if raw.outputs.is_empty() => Ok(InterfaceResult::Refused(refusal)),
        _ => Err(CallError::Trap(
            "the module's result must hold either \"state\" (with \"outputs\") or \"refusal\""
                .into(),
        )),
    }
}

fn resolve(raw: RawOutput, event_value: &Map<String, Value>) -> Result<ModuleOutput, CallError> {
    let value = match (raw.value, raw.event_value_with) {
        (Some(value), None) => value,
        (None, Some(with)) => {
            let mut value = event_value.clone();
            value.extend(with);
            Value::Object(value)
        }
        _ => {
            return Err(CallError::Trap(format!(
                "output {:?} of the module's result must hold either \"value\" or \
                 \"event_value_with\"",
                raw.output
            )));
        }
    };
    Ok(ModuleOutput {
        output: raw.output,
        key: raw.key,
        value,
        headers: raw.headers,
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawUpgrade {
    state: Value,
}

/// The state `eos_upgrade_state` answered. Anything but `{"state": …}` is the module's bug,
/// reported as a trap.
pub fn upgraded(bytes: &[u8]) -> Result<Value, CallError> {
    serde_json::from_slice::<RawUpgrade>(bytes)
        .map(|raw| raw.state)
        .map_err(|error| {
            CallError::Trap(format!(
                "the module's upgraded state is not {{\"state\": …}} ({INTERFACE_VERSION}): {error}"
            ))
        })
}

/// What a module's `eos_contract` declares: where its events keep their id, entity and time, and
/// the outputs it writes to. What it leaves out is not declared (the flags, or their defaults,
/// say it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeclaredContract {
    /// Where the event id is (`--event-id`'s forms: `header:<name>`, `key`, a JSON pointer).
    pub event_id: Option<FieldLocation>,
    /// Where the entity is.
    pub entity: Option<FieldLocation>,
    /// A JSON pointer to the event time (RFC 3339).
    pub occurred_at: Option<String>,
    /// Every output it writes to, `default` (the default output, `--output-topic`) among them
    /// when it writes there; the others each need `--output NAME=TOPIC`.
    pub outputs: Option<Vec<String>>,
    /// The top-level members of an event's value it reads: `apply`'s `event.value` holds only
    /// those (an output's `event_value_with` still starts from the whole value).
    pub reads: Option<Vec<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawContract {
    #[serde(default)]
    event_id: Option<String>,
    #[serde(default)]
    entity: Option<String>,
    #[serde(default)]
    occurred_at: Option<String>,
    #[serde(default)]
    outputs: Option<Vec<String>>,
    #[serde(default)]
    reads: Option<Vec<String>>,
}

/// The contract `eos_contract` answered, checked: locations in the flags' forms, the time at a
/// JSON pointer, output names neither empty nor given twice. An error says what is wrong, and
/// the module is refused at load.
pub fn declared_contract(bytes: &[u8]) -> Result<DeclaredContract, String> {
    let raw: RawContract = serde_json::from_slice(bytes).map_err(|error| {
        format!(
            "is not {{\"event_id\", \"entity\", \"occurred_at\", \"outputs\", \"reads\"}} \
             JSON ({INTERFACE_VERSION}): {error}"
        )
    })?;
    let location = |part: &str, text: Option<String>| {
        text.map(|text| {
            text.parse::<FieldLocation>().map_err(|_| {
                format!(
                    "declares its {part} at {text:?}, which is not `key`, `header:<name>` or \
                     a JSON pointer such as /id"
                )
            })
        })
        .transpose()
    };
    let event_id = location("event id", raw.event_id)?;
    let entity = location("entity", raw.entity)?;
    if let Some(pointer) = &raw.occurred_at
        && !matches!(pointer.parse(), Ok(FieldLocation::Pointer(_)))
    {
        return Err(format!(
            "declares its event time at {pointer:?}, which is not a JSON pointer (such as /at)"
        ));
    }
    for (what, names) in [("output", &raw.outputs), ("member it reads", &raw.reads)] {
        let mut seen = std::collections::BTreeSet::new();
        for name in names.iter().flatten() {
            if name.is_empty() || !seen.insert(name) {
                return Err(format!(
                    "declares the {what} {name:?} {}",
                    if name.is_empty() { "(empty)" } else { "twice" }
                ));
            }
        }
    }
    Ok(DeclaredContract {
        event_id,
        entity,
        occurred_at: raw.occurred_at,
        outputs: raw.outputs,
        reads: raw.reads,
    })
}
