//! The WebAssembly transform behind `--transform wasm:PATH`: a module in any language, run by
//! `wasm_transform` (Extism on wasmtime) under the processor's exactly-once loop
//! (docs/TRANSFORMS.md "WebAssembly transforms").
//!
//! The adapter lives here, behind the crate's `wasm` feature, rather than in `wasm-transform`:
//! the host knows nothing of the [`Transform`] trait, and a crate that wants the trait without
//! wasmtime (eosctl, whose replay runs the built-in transforms) leaves the feature off.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use eos_core::{DeadLetterReason, Event};
use wasm_transform::CallError;
pub use wasm_transform::{Interrupter, Limits, Options, WasmModule, WasmState, digest};

use crate::transform::{Output, Refusal, SourcePosition, StateUpgradeError, Transform};

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
}

impl Transform for WasmTransform {
    type State = WasmState;

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
            CallError::Trap(_) => {
                Refusal::with_reason(DeadLetterReason::TransformTrap, error.to_string())
            }
            CallError::Limit(_) | CallError::Interrupted => {
                Refusal::with_reason(DeadLetterReason::TransformLimit, error.to_string())
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
