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
//! `{"refusal": {"code": "…", "detail": "…"}}`.
//!
//! The optional `eos_upgrade_state` takes `{"digest": "sha256:…", "state": …}` (a state another
//! module wrote, and that module's digest) and answers `{"state": …}`.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use time::format_description::well_known::Rfc3339;

use crate::{CallError, Position};
use eos_core::Event;

/// The interface version a module's `eos_interface_version` must answer. Raised when the
/// meaning of the input or the result changes; a module built for another one is refused at
/// start-up.
pub const INTERFACE_VERSION: &str = "eos-transform/1";

/// One record the module writes.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModuleOutput {
    /// The output's name: `default` or one configured with `--output NAME=TOPIC`.
    pub output: String,
    /// The record key; absent keys it by the event's entity.
    #[serde(default)]
    pub key: Option<String>,
    /// The record value.
    pub value: Value,
    /// Headers of its own.
    #[serde(default)]
    pub headers: std::collections::BTreeMap<String, String>,
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
    outputs: Vec<ModuleOutput>,
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
    value: &'a Map<String, Value>,
    event_id: &'a str,
    entity: &'a str,
    /// RFC 3339 in UTC, so a module's "day" is the UTC day without a time-zone library.
    occurred_at: Option<String>,
    key: Option<String>,
    headers: Map<String, Value>,
    partition: i32,
    offset: i64,
}

fn present<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(deserializer).map(Some)
}

/// The JSON input of `apply`. Key and header values are handed over as text (bytes that are
/// not UTF-8 replaced), a header given twice by its last value.
pub fn input(state: &Value, event: &Event, position: Position) -> Result<Vec<u8>, String> {
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
            value: &event.value,
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

/// The result of `apply` from its output bytes. Anything but exactly one of a state or a
/// refusal is the module's bug, reported as a trap.
pub fn result(bytes: &[u8]) -> Result<InterfaceResult, CallError> {
    let raw: RawResult = serde_json::from_slice(bytes).map_err(|error| {
        CallError::Trap(format!(
            "the module's result is not the interface's JSON ({INTERFACE_VERSION}): {error}"
        ))
    })?;
    match (raw.state, raw.refusal) {
        (Some(state), None) => Ok(InterfaceResult::Applied {
            state,
            outputs: raw.outputs,
        }),
        (None, Some(refusal)) if raw.outputs.is_empty() => Ok(InterfaceResult::Refused(refusal)),
        _ => Err(CallError::Trap(
            "the module's result must hold either \"state\" (with \"outputs\") or \"refusal\""
                .into(),
        )),
    }
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
