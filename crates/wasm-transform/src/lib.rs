//! wasm-transform: a transform written in any language, compiled to WebAssembly and run by
//! eos-processor for each new event (`--transform wasm:PATH`, docs/TRANSFORMS.md
//! "WebAssembly transforms").
//!
//! The host is Extism on wasmtime: a module built with any Extism PDK (Go, Rust, JavaScript,
//! Python, C, Zig, AssemblyScript, .NET) exports `eos_interface_version`, which must answer
//! [`INTERFACE_VERSION`], and `apply`, which takes one event with its entity's state as JSON
//! and answers the new state and the outputs, or a refusal ([`interface`]).
//!
//! Guarantee: a call is bounded and isolated. Every call runs under a fuel limit and a
//! wall-clock limit, and the module's memory under a memory limit; a call that passes one fails
//! with [`CallError::Limit`], one that traps (a Go panic, `unreachable`, an exit) with
//! [`CallError::Trap`], and either way the instance is dropped and the next call gets a fresh
//! one, so one bad event never poisons the next. The wall-clock limit is there because fuel
//! does not bound time: wasmtime charges one unit for a bulk-memory or bulk-table instruction
//! whatever its length, so a loop of 64 MiB `memory.fill`s runs for ever on a few units a pass.
//! A running call can also be stopped from another thread ([`Interrupter`], the processor's
//! shutdown), and then fails with [`CallError::Interrupted`]. The module gets no host paths, no hosts, no
//! environment and no arguments. A module without the exports or with another interface
//! version is refused when it is loaded, never at the first event. The state handed back is
//! stamped with the module's sha256 digest, and state stamped by another module is refused
//! when it is restored ([`WasmModule::admit`]) unless the module upgrades it
//! ([`UPGRADE_EXPORT`]) or the operator said its format is compatible.
//!
//! This crate knows nothing of the processor's loop: eos-processor adapts [`WasmModule`] to its
//! `Transform` trait (the processor binary depends on this crate, so this crate cannot depend
//! on the processor).

pub mod deterministic;
pub mod interface;

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use extism::{
    CancelHandle, CompiledPlugin, Manifest, Plugin, PluginBuilder, UserData, Val, ValType, Wasm,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest as _, Sha256};

use eos_core::Event;
pub use interface::{
    DeclaredContract, INTERFACE_VERSION, INTERFACE_VERSIONS, InterfaceResult, ModuleOutput,
    ModuleRefusal,
};

/// The export that names the interface the module implements.
pub const VERSION_EXPORT: &str = "eos_interface_version";
/// The export called once per new event.
pub const APPLY_EXPORT: &str = "apply";
/// The optional export that turns state written by another module into this one's:
/// `{"digest": "sha256:…", "state": …}` in, `{"state": …}` out.
pub const UPGRADE_EXPORT: &str = "eos_upgrade_state";
/// The optional export, called once at load, that declares where the module's events keep
/// their id, entity and time and which outputs it writes to ([`DeclaredContract`]).
pub const CONTRACT_EXPORT: &str = "eos_contract";

/// WebAssembly pages are 64 KiB.
const PAGE_BYTES: u64 = 65_536;

/// How much of what a call writes to stdout and stderr is kept for its error: a Go panic's
/// message and the first frames of its stack.
const WRITTEN_KEPT: usize = 1024;

/// What the module wrote to stdout and stderr in the current call, its first [`WRITTEN_KEPT`]
/// bytes (the host function behind [`deterministic::STDIO_BYTE`]).
type Written = Arc<Mutex<Vec<u8>>>;

/// The limits each call runs under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Fuel per call: about one unit per WebAssembly instruction executed. A call that uses it
    /// all fails with [`CallError::Limit`], so an endless loop costs at most this much.
    pub fuel: u64,
    /// The most memory the module's instance may grow to, in bytes (rounded down to 64 KiB
    /// pages).
    pub max_memory_bytes: u64,
    /// The longest a call may run, by the wall clock (whole milliseconds). A call still running
    /// then fails with [`CallError::Limit`]: what bounds a call that spends time without fuel.
    pub timeout: Duration,
}

impl Default for Limits {
    /// 200 million instructions and 256 MiB: far above what the example's Go module needs per
    /// event (its runtime's start-up included), far below what would stall a partition or a
    /// pod.
    ///
    /// 2 s of wall clock. Long enough that a call always runs out of fuel first when it spends
    /// fuel (the whole default fuel took about 0.2 s on the 2-core development machine), so an
    /// ordinary endless loop stays a deterministic fuel failure and only a call that burns time
    /// without fuel meets the clock; and far below the processor's default 10 s transaction
    /// timeout, so a hanging call never outlives the open transaction (the coordinator would
    /// abort it, and the batch, with the same call in it, would be redone for ever). It is also
    /// how long one such event holds up every partition of the instance.
    fn default() -> Self {
        Self {
            fuel: 200_000_000,
            max_memory_bytes: 256 * 1024 * 1024,
            timeout: Duration::from_secs(2),
        }
    }
}

/// How a module is loaded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Options {
    /// Per-call limits.
    pub limits: Limits,
    /// Accept state written by a module with another digest (`--wasm-state-compatible`): the
    /// operator vouches that the new module reads the old one's state format.
    pub state_compatible: bool,
}

/// Why a module cannot be used: found when it is loaded, so the processor refuses to start.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file cannot be read.
    #[error("reading the WebAssembly module {path}: {source}")]
    Read {
        /// The module's path.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The bytes are not a binary WebAssembly module.
    #[error("the file is not a binary WebAssembly module (it does not start with \\0asm)")]
    NotWasm,
    /// The module's clock, randomness or sleep imports cannot be replaced.
    #[error("{0}")]
    Rewrite(deterministic::RewriteError),
    /// The bytes are not a module Extism can compile and link (unknown imports among them).
    #[error("the WebAssembly module does not compile or link: {0:#}")]
    Compile(extism::Error),
    /// An export the interface needs is missing.
    #[error(
        "the WebAssembly module does not export {0:?}: a transform exports \
         {VERSION_EXPORT:?} and {APPLY_EXPORT:?} (docs/TRANSFORMS.md \"WebAssembly transforms\")"
    )]
    MissingExport(&'static str),
    /// `eos_interface_version` answered another version.
    #[error(
        "the WebAssembly module implements interface {found:?}; this processor runs \
         {INTERFACE_VERSIONS:?}"
    )]
    WrongVersion {
        /// What the module answered.
        found: String,
    },
    /// `eos_interface_version` failed.
    #[error("the WebAssembly module's {VERSION_EXPORT} failed: {0}")]
    VersionCall(CallError),
    /// `eos_contract` failed, or answered something that is not a contract.
    #[error("the WebAssembly module's {CONTRACT_EXPORT} {0}")]
    Contract(String),
}

/// Why one call did not produce a result. Each becomes a dead letter of the event, with the
/// state left as it was.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    /// The module refused the event with its own reason code.
    #[error("{detail}")]
    Refused {
        /// The module's reason code.
        code: String,
        /// For people.
        detail: String,
    },
    /// The module trapped, exited, reported an error, or answered something that is not the
    /// interface's result.
    #[error("the WebAssembly transform failed: {0}")]
    Trap(String),
    /// The call ran out of fuel or time, or the instance out of memory.
    #[error("the WebAssembly transform hit its limit: {0}")]
    Limit(String),
    /// The call was stopped from outside ([`Interrupter::interrupt`]: the processor is shutting
    /// down). It says nothing about the event: the event is not decided, and the processor
    /// commits nothing of it.
    #[error("the WebAssembly transform was interrupted: the processor is shutting down")]
    Interrupted,
}

impl CallError {
    /// The dead letter's reason code (`eos-dlq-transform-reason`).
    pub fn code(&self) -> &str {
        match self {
            Self::Refused { code, .. } => code,
            Self::Trap(_) => "transform_trap",
            Self::Limit(_) => "transform_limit",
            Self::Interrupted => "transform_interrupted",
        }
    }
}

/// Why a restored state cannot be used with this module: the processor stops the restore
/// rather than let a module misread another module's state.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdmitError {
    /// Written by another module, which this one does not upgrade from.
    #[error(
        "the entity's state was written by WebAssembly module {stored}; this module is \
         {module} and exports no {UPGRADE_EXPORT}. Restart with --wasm-state-compatible if \
         it reads that state as it is"
    )]
    ForeignState {
        /// The digest stored with the state.
        stored: String,
        /// This module's digest.
        module: String,
    },
    /// The module's upgrade failed.
    #[error("the module's {UPGRADE_EXPORT} of state written by {stored} failed: {error}")]
    Upgrade {
        /// The digest stored with the state.
        stored: String,
        /// Why.
        error: CallError,
    },
}

/// An entity's state as kept by the processor: the module's own JSON, stamped with the digest
/// of the module that wrote it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WasmState {
    /// `sha256:<hex>` of the module that wrote `state`; `None` for an entity with no state yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// The module's state, `null` before its first event.
    #[serde(default)]
    pub state: Value,
}

/// Where the event was read, handed to the module.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    /// The input partition.
    pub partition: i32,
    /// The record's offset.
    pub offset: i64,
}

/// Stops a module's running call from another thread: it fails with
/// [`CallError::Interrupted`], and so does any later call that fails, whatever its own error
/// (the processor interrupts on shutdown, so that SIGTERM does not wait for a call to reach its
/// wall-clock limit, and commits nothing a failed call decided). A call that succeeds still
/// does: the processor's loop makes at most one more before it sees the shutdown, and a batch
/// it can commit is committed. Cheap to clone.
#[derive(Clone, Default)]
pub struct Interrupter {
    shared: Arc<Interruption>,
}

#[derive(Default)]
struct Interruption {
    interrupted: AtomicBool,
    /// The cancel handle of the current instance. Extism cancels only a call that is running
    /// (its timer thread knows only those): a call that starts after the interrupt runs, under
    /// its wall-clock limit.
    running: Mutex<Option<CancelHandle>>,
}

impl std::fmt::Debug for Interrupter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Interrupter")
            .field("interrupted", &self.is_interrupted())
            .finish_non_exhaustive()
    }
}

impl Interrupter {
    /// Stops the running call, if any; from now on every failed call is
    /// [`CallError::Interrupted`].
    pub fn interrupt(&self) {
        self.shared.interrupted.store(true, Ordering::SeqCst);
        let running = self
            .shared
            .running
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(handle) = running.as_ref() {
            // Fails only when Extism's timer thread is gone, at process exit.
            let _ = handle.cancel();
        }
    }

    /// Whether [`Interrupter::interrupt`] was called.
    pub fn is_interrupted(&self) -> bool {
        self.shared.interrupted.load(Ordering::SeqCst)
    }

    fn track(&self, plugin: &Plugin) {
        *self
            .shared
            .running
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(plugin.cancel_handle());
    }
}

/// A loaded, checked module and its one instance.
pub struct WasmModule {
    compiled: CompiledPlugin,
    /// The instance calls run in; `None` after a failed call, until the next call makes a
    /// fresh one. A mutex because Extism calls take `&mut` and the processor's trait `&self`;
    /// the processor calls from one thread, so it is never contended.
    instance: Mutex<Option<Plugin>>,
    digest: String,
    upgrades: bool,
    declared: Option<DeclaredContract>,
    options: Options,
    interrupter: Interrupter,
    written: Written,
}

impl std::fmt::Debug for WasmModule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WasmModule")
            .field("digest", &self.digest)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// `sha256:<hex>` of a module's bytes: what the state is stamped with and the logs show.
pub fn digest(bytes: &[u8]) -> String {
    let hash = Sha256::digest(bytes);
    let mut text = String::with_capacity(7 + 64);
    text.push_str("sha256:");
    for byte in hash {
        text.push_str(&format!("{byte:02x}"));
    }
    text
}

impl WasmModule {
    /// Loads the module at `path`; see [`WasmModule::from_bytes`].
    pub fn load(path: &Path, options: Options) -> Result<Self, LoadError> {
        let bytes = std::fs::read(path).map_err(|source| LoadError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_bytes(&bytes, options)
    }

    /// Compiles the module, checks its exports and interface version, and starts its
    /// instance. Refused here rather than at the first event: a module that cannot work stops
    /// the start-up with a clear error.
    pub fn from_bytes(bytes: &[u8], options: Options) -> Result<Self, LoadError> {
        // Checked here because wasmtime would otherwise try the bytes as WAT text and answer
        // with a parse error about parentheses.
        if !bytes.starts_with(b"\0asm") {
            return Err(LoadError::NotWasm);
        }
        let pages = u32::try_from(options.limits.max_memory_bytes / PAGE_BYTES).unwrap_or(u32::MAX);
        // No allowed hosts, no allowed paths, no config: the module sees nothing of the host
        // (docs/TRANSFORMS.md "Determinism and limits").
        // The digest is of the operator's file; what runs is that module with its clock,
        // randomness and sleep replaced.
        let deterministic = deterministic::rewrite(bytes).map_err(LoadError::Rewrite)?;
        // The timeout is Extism's: wasmtime's epoch interruption, checked at every function
        // entry and loop back edge, so a loop of bulk-memory instructions is stopped between
        // two of them (each at most the memory limit long).
        let manifest = Manifest::new([Wasm::data(deterministic)])
            .with_memory_max(pages)
            .with_timeout(options.limits.timeout);
        let kept = UserData::new(Vec::<u8>::with_capacity(WRITTEN_KEPT));
        let written = kept.get().map_err(LoadError::Compile)?;
        let compiled = PluginBuilder::new(manifest)
            // Standard Go's wasip1 runtime imports WASI (clock, random, fd_write, proc_exit)
            // and does not link without it; its clock and random are never called (see
            // `deterministic`), and without preopened directories a file cannot be opened
            // (docs/TRANSFORMS.md "Determinism and limits").
            .with_wasi(true)
            .with_fuel_limit(options.limits.fuel)
            // What the module writes to stdout and stderr (its fd_write redirected by
            // `deterministic`) is kept for the call's error: the message of a Go panic, which
            // the Go runtime writes to stderr before it exits.
            .with_function_in_namespace(
                deterministic::STDIO_MODULE,
                deterministic::STDIO_BYTE,
                [ValType::I32],
                [ValType::I32],
                kept,
                keep_written_byte,
            )
            // Compiled code is not cached on disk: the processor's root filesystem is
            // read-only in the chart, and a cache keyed by bytes would save only start-up.
            .with_cache_disabled()
            .compile()
            .map_err(LoadError::Compile)?;
        let mut module = Self {
            compiled,
            instance: Mutex::new(None),
            digest: digest(bytes),
            upgrades: false,
            declared: None,
            options,
            interrupter: Interrupter::default(),
            written,
        };
        let plugin = module.instantiate().map_err(LoadError::Compile)?;
        for export in [VERSION_EXPORT, APPLY_EXPORT] {
            if !plugin.function_exists(export) {
                return Err(LoadError::MissingExport(export));
            }
        }
        module.upgrades = plugin.function_exists(UPGRADE_EXPORT);
        let declares = plugin.function_exists(CONTRACT_EXPORT);
        *module.lock() = Some(plugin);
        let found = module.version().map_err(LoadError::VersionCall)?;
        if !INTERFACE_VERSIONS.contains(&found.as_str()) {
            return Err(LoadError::WrongVersion { found });
        }
        if declares {
            let answer = module
                .call(CONTRACT_EXPORT, &[])
                .map_err(|error| LoadError::Contract(format!("failed: {error}")))?;
            module.declared =
                Some(interface::declared_contract(&answer).map_err(LoadError::Contract)?);
        }
        Ok(module)
    }

    /// `sha256:<hex>` of the module's bytes.
    pub fn digest(&self) -> &str {
        &self.digest
    }

    /// The options it was loaded with.
    pub fn options(&self) -> Options {
        self.options
    }

    /// What stops this module's calls from another thread.
    pub fn interrupter(&self) -> Interrupter {
        self.interrupter.clone()
    }

    /// Whether the module exports [`UPGRADE_EXPORT`].
    pub fn upgrades(&self) -> bool {
        self.upgrades
    }

    /// What the module's [`CONTRACT_EXPORT`] declared; `None` when it exports none.
    pub fn declared(&self) -> Option<&DeclaredContract> {
        self.declared.as_ref()
    }

    /// A state read back from the changelog or the store, made fit for this module. State
    /// this module wrote, or no state yet, is admitted as it is. State another module wrote is
    /// handed to the module's [`UPGRADE_EXPORT`] when it has one, and otherwise admitted as it
    /// is only when the operator declared the formats compatible; else it is refused.
    pub fn admit(&self, state: WasmState) -> Result<WasmState, AdmitError> {
        let Some(stored) = state.digest.as_deref() else {
            return Ok(state);
        };
        if stored == self.digest {
            return Ok(state);
        }
        if self.upgrades {
            let upgrade = |error| AdmitError::Upgrade {
                stored: stored.to_owned(),
                error,
            };
            let input = serde_json::to_vec(&serde_json::json!({
                "digest": stored,
                "state": state.state,
            }))
            .map_err(|error| upgrade(CallError::Trap(error.to_string())))?;
            let output = self.call(UPGRADE_EXPORT, &input).map_err(upgrade)?;
            let upgraded = interface::upgraded(&output).map_err(upgrade)?;
            return Ok(WasmState {
                digest: Some(self.digest.clone()),
                state: upgraded,
            });
        }
        if self.options.state_compatible {
            return Ok(state);
        }
        Err(AdmitError::ForeignState {
            stored: stored.to_owned(),
            module: self.digest.clone(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Plugin>> {
        // A panic while the lock was held left at worst a broken instance, which the next
        // failed call replaces.
        self.instance
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn instantiate(&self) -> Result<Plugin, extism::Error> {
        let plugin = Plugin::new_from_compiled(&self.compiled)?;
        self.interrupter.track(&plugin);
        Ok(plugin)
    }

    /// Calls `export` with `input` and returns its output, under the limits. After a failure
    /// the instance is dropped: a trapped or exhausted instance (a Go runtime that exited, a
    /// heap at its limit) is not called again.
    fn call(&self, export: &str, input: &[u8]) -> Result<Vec<u8>, CallError> {
        let mut instance = self.lock();
        if instance.is_none() {
            let mut plugin = self
                .instantiate()
                .map_err(|error| CallError::Trap(format!("instantiating the module: {error:#}")))?;
            // The runtime's start-up (Go's runtime initialisation runs at the first call) is
            // paid here, outside any event's call, so every event's call gets the whole fuel
            // limit whether it is the instance's first or its thousandth.
            self.forget_written();
            plugin
                .call::<&[u8], &[u8]>(VERSION_EXPORT, &[])
                .map(|_| ())
                .map_err(|error| self.classify(&error))?;
            *instance = Some(plugin);
        }
        let Some(plugin) = instance.as_mut() else {
            return Err(CallError::Trap("no instance".into()));
        };
        self.forget_written();
        match plugin.call::<&[u8], &[u8]>(export, input) {
            Ok(output) => Ok(output.to_vec()),
            Err(error) => {
                *instance = None;
                Err(self.classify(&error))
            }
        }
    }

    /// Which failure an Extism error is: [`CallError::Interrupted`] once the module is
    /// interrupted, whatever the call's own error (it may be the interruption's, and nothing
    /// of the call is kept either way); else [`classify`]'s.
    fn classify(&self, error: &extism::Error) -> CallError {
        if self.interrupter.is_interrupted() {
            return CallError::Interrupted;
        }
        match classify(error, self.options.limits) {
            CallError::Trap(detail) => {
                let written = std::mem::take(
                    &mut *self
                        .written
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner),
                );
                let written = String::from_utf8_lossy(&written);
                let written = written.trim();
                if written.is_empty() {
                    return CallError::Trap(detail);
                }
                let detail = format!("{detail}; the module wrote: {written}");
                CallError::Trap(
                    eos_core::dead_letter::truncate_with_marker(&detail, 2048).into_owned(),
                )
            }
            other => other,
        }
    }

    fn forget_written(&self) {
        self.written
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clear();
    }

    fn version(&self) -> Result<String, CallError> {
        let output = self.call(VERSION_EXPORT, &[])?;
        Ok(String::from_utf8_lossy(&output).trim().to_owned())
    }

    /// Applies one new event to its entity's state: on success `state` is the module's new
    /// state stamped with this module's digest, and the outputs are returned; on an error
    /// `state` is unchanged. The state is the module's own or one it admitted
    /// ([`WasmModule::admit`]): the processor admits every state it restores.
    pub fn apply(
        &self,
        state: &mut WasmState,
        event: &Event,
        position: Position,
    ) -> Result<Vec<ModuleOutput>, CallError> {
        let reads = self.declared.as_ref().and_then(|d| d.reads.as_deref());
        let input = interface::input(&state.state, event, position, reads)
            .map_err(|error| CallError::Trap(format!("encoding the input: {error}")))?;
        let output = self.call(APPLY_EXPORT, &input)?;
        match interface::result(&output, &event.value)? {
            InterfaceResult::Applied {
                state: new_state,
                outputs,
            } => {
                state.digest = Some(self.digest.clone());
                state.state = new_state;
                Ok(outputs)
            }
            InterfaceResult::Refused(refusal) => Err(CallError::Refused {
                code: refusal.code,
                detail: refusal.detail,
            }),
        }
    }
}

/// The host function behind [`deterministic::STDIO_BYTE`]: keeps the byte while fewer than
/// [`WRITTEN_KEPT`] are kept, and answers 0 once it wants no more in this call.
fn keep_written_byte(
    _plugin: &mut extism::CurrentPlugin,
    inputs: &[Val],
    outputs: &mut [Val],
    kept: UserData<Vec<u8>>,
) -> Result<(), extism::Error> {
    let kept = kept.get()?;
    let mut kept = kept
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if kept.len() < WRITTEN_KEPT
        && let Some(byte) = inputs.first().and_then(Val::i32)
    {
        // The low byte: what i32.load8_u loaded.
        kept.push(byte.to_le_bytes()[0]);
    }
    if let Some(more) = outputs.first_mut() {
        *more = Val::I32(i32::from(kept.len() < WRITTEN_KEPT));
    }
    Ok(())
}

/// Which failure an Extism error is. Extism reports the memory limiter's refusal with the root
/// cause "oom", an exhausted fuel tank as "plugin ran out of fuel" and an epoch interruption
/// (its timeout, or a cancel) as "timeout" (extism 1.21 `Plugin::raw_call`); everything else
/// the module did is a trap. The text names the limit, never the time the call took, so the
/// same event fails with the same detail every time.
fn classify(error: &extism::Error, limits: Limits) -> CallError {
    let root = error.root_cause().to_string();
    if root == "timeout" {
        return CallError::Limit(format!(
            "the call ran past its wall-clock limit of {:?} (--wasm-timeout)",
            limits.timeout
        ));
    }
    let chain = format!("{error:#}");
    if root == "oom" {
        return CallError::Limit(format!(
            "the module's memory would pass the limit of {} bytes",
            limits.max_memory_bytes
        ));
    }
    if chain.contains("ran out of fuel") || chain.contains("all fuel consumed") {
        return CallError::Limit(format!(
            "the call used all of its fuel ({} units)",
            limits.fuel
        ));
    }
    CallError::Trap(eos_core::dead_letter::truncate_with_marker(&chain, 2048).into_owned())
}

#[cfg(test)]
mod tests;
