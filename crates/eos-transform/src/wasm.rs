//! The WebAssembly transform behind `--transform wasm:PATH`: a module in any language, run by
//! `wasm_transform` (Extism on wasmtime) under the processor's exactly-once loop
//! (docs/TRANSFORMS.md "WebAssembly transforms").
//!
//! The adapter lives here, behind the crate's `wasm` feature, rather than in `wasm-transform`:
//! the host knows nothing of the [`Transform`] trait, and a crate that wants the trait without
//! wasmtime (eosctl, whose replay runs the built-in transforms) leaves the feature off.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use eos_core::{DeadLetterReason, Event, EventContract};
use wasm_transform::CallError;
pub use wasm_transform::{
    DeclaredContract, Interrupter, Limits, Options, WasmModule, WasmState, digest,
};

use crate::transform::{
    DEFAULT_OUTPUT, Output, Refusal, SourcePosition, StateUpgradeError, Transform,
};

/// A loaded module as a [`Transform`]: its state per entity is the module's JSON stamped with
/// the module's digest ([`WasmState`]).
#[derive(Debug)]
pub struct WasmTransform {
    module: WasmModule,
    /// The last call was interrupted ([`Transform::interrupted`]).
    interrupted: AtomicBool,
}

impl WasmTransform {
    /// Loads, compiles and checks the module at `path` (its exports and interface version):
    /// a module that cannot run is refused here, before the processor starts.
    pub fn load(path: &Path, options: Options) -> Result<Self, wasm_transform::LoadError> {
        WasmModule::load(path, options).map(Self::new)
    }

    /// A transform over an already loaded module.
    pub fn new(module: WasmModule) -> Self {
        Self {
            module,
            interrupted: AtomicBool::new(false),
        }
    }

    /// What stops the module's running call, and every later one, from another thread: the
    /// processor interrupts on shutdown, so that SIGTERM is not held up by a call that would
    /// run to its wall-clock limit.
    pub fn interrupter(&self) -> Interrupter {
        self.module.interrupter()
    }

    /// `sha256:<hex>` of the module.
    pub fn digest(&self) -> &str {
        self.module.digest()
    }

    /// What the module's `eos_contract` declared; `None` when it exports none.
    pub fn declared(&self) -> Option<&DeclaredContract> {
        self.module.declared()
    }
}

/// The dead letter of a call that failed: its reason, and the call's code in
/// `eos-dlq-transform-reason` as a refusal's is, so every dead letter of a module names what
/// happened in the same header.
fn failure(reason: DeadLetterReason, error: &CallError) -> Refusal {
    Refusal {
        code: Some(error.code().to_owned()),
        ..Refusal::with_reason(reason, error.to_string())
    }
}

impl Transform for WasmTransform {
    type State = WasmState;

    /// Where the module declared (`eos_contract`) its events keep their id, entity and time;
    /// what it leaves out is the default's.
    fn contract(&self) -> EventContract {
        let default = EventContract::default();
        let Some(declared) = self.module.declared() else {
            return default;
        };
        EventContract {
            event_id: declared.event_id.clone().unwrap_or(default.event_id),
            entity: declared.entity.clone().unwrap_or(default.entity),
            occurred_at: declared.occurred_at.clone(),
            ..default
        }
    }

    /// The declared outputs but the default one.
    fn outputs(&self) -> Vec<String> {
        let declared = self.module.declared().and_then(|d| d.outputs.as_ref());
        declared
            .into_iter()
            .flatten()
            .filter(|name| *name != DEFAULT_OUTPUT)
            .cloned()
            .collect()
    }

    /// Unless the module declared its outputs without the default one.
    fn writes_default_output(&self) -> bool {
        self.module
            .declared()
            .and_then(|d| d.outputs.as_ref())
            .is_none_or(|outputs| outputs.iter().any(|name| name == DEFAULT_OUTPUT))
    }

    fn apply(
        &self,
        state: &mut WasmState,
        event: Event,
        source: &SourcePosition,
    ) -> Result<Vec<Output>, Refusal> {
        let position = wasm_transform::Position {
            partition: source.partition,
            offset: source.offset,
        };
        // A refusal, a trap and a limit each become a dead letter: the state stays as it was
        // and the id is remembered with that outcome, as for any refusal (docs/TRANSFORMS.md
        // "An event's outcome is final"). An interruption decides nothing: the processor asks
        // `interrupted` and commits nothing.
        let applied = self.module.apply(state, &event, position);
        self.interrupted.store(
            matches!(applied, Err(CallError::Interrupted)),
            Ordering::SeqCst,
        );
        let outputs = applied.map_err(|error| match &error {
            CallError::Refused { code, detail } => Refusal::new(code, detail.clone()),
            CallError::Trap(_) => failure(DeadLetterReason::TransformTrap, &error),
            CallError::Limit(_) | CallError::Interrupted => {
                failure(DeadLetterReason::TransformLimit, &error)
            }
        })?;
        Ok(outputs
            .into_iter()
            .map(|output| {
                let mut record = Output::new(output.output, output.value);
                if let Some(key) = output.key {
                    record = record.with_key(key);
                }
                for (name, value) in output.headers {
                    record = record.with_header(name, value);
                }
                record
            })
            .collect())
    }

    fn interrupted(&self) -> bool {
        self.interrupted.load(Ordering::SeqCst)
    }

    fn module_digest(&self) -> Option<String> {
        Some(self.module.digest().to_owned())
    }

    /// State another module wrote stops the restore unless the module upgrades it or the
    /// operator declared it compatible (`--wasm-state-compatible`).
    fn admit_state(&self, state: WasmState) -> Result<WasmState, StateUpgradeError> {
        self.module
            .admit(state)
            .map_err(|error| StateUpgradeError(error.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use eos_core::dead_letter::{self, DeadLetterInput, TRANSFORM_REASON_HEADER};
    use eos_core::{FieldLocation, RecordParts};

    use super::*;

    /// A module whose `apply` body is `apply` and whose further exports are `extra`, which may
    /// call `$out` (pointer, length) with text of its own data.
    fn module(apply: &str, extra: &str) -> WasmTransform {
        let text = format!(
            r#"(module
  (import "extism:host/env" "alloc" (func $alloc (param i64) (result i64)))
  (import "extism:host/env" "store_u8" (func $store_u8 (param i64 i32)))
  (import "extism:host/env" "output_set" (func $output_set (param i64 i64)))
  (memory (export "memory") 1)
  (data (i32.const 0) "eos-transform/2")
  (func $out (param $ptr i32) (param $len i32)
    (local $offs i64) (local $i i32)
    (local.set $offs (call $alloc (i64.extend_i32_u (local.get $len))))
    (block $done (loop $next
      (br_if $done (i32.ge_u (local.get $i) (local.get $len)))
      (call $store_u8 (i64.add (local.get $offs) (i64.extend_i32_u (local.get $i)))
                      (i32.load8_u (i32.add (local.get $ptr) (local.get $i))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br $next)))
    (call $output_set (local.get $offs) (i64.extend_i32_u (local.get $len))))
  (func (export "eos_interface_version") (result i32)
    (call $out (i32.const 0) (i32.const 15)) (i32.const 0))
  (func (export "apply") (result i32) {apply})
  {extra})"#
        );
        let options = Options {
            limits: Limits {
                fuel: 1_000_000,
                ..Limits::default()
            },
            state_compatible: false,
        };
        let bytes = wat::parse_str(&text).expect("valid WAT");
        WasmTransform::new(WasmModule::from_bytes(&bytes, options).expect("loads"))
    }

    fn event() -> Event {
        Event::parse(
            &EventContract::default(),
            RecordParts {
                key: Some(b"c-7"),
                value: Some(br#"{"amount": "1.00"}"#),
                headers: &[("event_id", Some(b"e-1"))],
            },
        )
        .expect("an event")
    }

    #[test]
    fn a_trap_or_a_limit_is_a_dead_letter_with_its_reason_header() {
        let source = SourcePosition {
            topic: "auths".into(),
            partition: 0,
            offset: 7,
        };
        for (apply, reason, code) in [
            (
                "unreachable",
                DeadLetterReason::TransformTrap,
                "transform_trap",
            ),
            (
                "(loop $spin (br $spin)) (i32.const 0)",
                DeadLetterReason::TransformLimit,
                "transform_limit",
            ),
        ] {
            let refusal = module(apply, "")
                .apply(&mut WasmState::default(), event(), &source)
                .expect_err("fails");
            assert_eq!(refusal.reason, reason, "{refusal}");
            assert_eq!(refusal.code.as_deref(), Some(code), "{refusal}");
            let letter = dead_letter::build(
                &DeadLetterInput {
                    key: Some(b"c-7"),
                    value: Some(br#"{"amount": "1.00"}"#),
                    headers: Vec::new(),
                    source_topic: &source.topic,
                    source_partition: source.partition,
                    source_offset: source.offset,
                    reason: refusal.reason,
                    transform_reason: refusal.code.as_deref(),
                    detail: &refusal.detail,
                },
                1 << 20,
            );
            assert_eq!(
                letter.header(TRANSFORM_REASON_HEADER),
                Some(code.as_bytes())
            );
        }
    }

    #[test]
    fn a_declared_contract_is_the_transforms() {
        let undeclared = module("unreachable", "");
        assert_eq!(undeclared.contract(), EventContract::default());
        assert!(undeclared.outputs().is_empty() && undeclared.writes_default_output());

        let contract = r#"{"event_id":"/id","entity":"header:card","outputs":["tier"]}"#;
        let declared = module(
            "unreachable",
            &format!(
                r#"(data (i32.const 64) "{}")
  (func (export "eos_contract") (result i32)
    (call $out (i32.const 64) (i32.const {})) (i32.const 0))"#,
                contract.replace('"', "\\\""),
                contract.len()
            ),
        );
        let expected = EventContract {
            event_id: FieldLocation::Pointer("/id".into()),
            entity: FieldLocation::Header("card".into()),
            ..EventContract::default()
        };
        assert_eq!(declared.contract(), expected);
        assert_eq!(declared.outputs(), ["tier"]);
        assert!(!declared.writes_default_output());
    }
}
