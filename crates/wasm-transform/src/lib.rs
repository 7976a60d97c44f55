//! wasm-transform: a transform written in any language, compiled to WebAssembly and run by
//! eos-processor for each new event (`--transform wasm:PATH`, docs/TRANSFORMS.md
//! "WebAssembly transforms").
//!
//! The host is Extism on wasmtime: a module built with any Extism PDK (Go, Rust, JavaScript,
//! Python, C, Zig, AssemblyScript, .NET) exports `eos_interface_version`, which must answer
//! [`INTERFACE_VERSION`], and `apply`, which takes one event with its entity's state as JSON
//! and answers the new state and the outputs, or a refusal ([`interface`]).
//!
//! Guarantee: a call is bounded and isolated. Every call runs under a fuel limit and the
//! module's memory under a memory limit; a call that passes one fails with
//! [`CallError::Limit`], one that traps (a Go panic, `unreachable`, an exit) with
//! [`CallError::Trap`], and either way the instance is dropped and the next call gets a fresh
//! one, so one bad event never poisons the next. The module gets no host paths, no hosts, no
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
use std::sync::Mutex;

use extism::{CompiledPlugin, Manifest, Plugin, PluginBuilder, Wasm};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest as _, Sha256};

use eos_core::Event;
pub use interface::{INTERFACE_VERSION, InterfaceResult, ModuleOutput, ModuleRefusal};

/// The export that names the interface the module implements.
pub const VERSION_EXPORT: &str = "eos_interface_version";
/// The export called once per new event.
pub const APPLY_EXPORT: &str = "apply";
/// The optional export that turns state written by another module into this one's:
/// `{"digest": "sha256:…", "state": …}` in, `{"state": …}` out.
pub const UPGRADE_EXPORT: &str = "eos_upgrade_state";

/// WebAssembly pages are 64 KiB.
const PAGE_BYTES: u64 = 65_536;

/// The limits each call runs under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Fuel per call: about one unit per WebAssembly instruction executed. A call that uses it
    /// all fails with [`CallError::Limit`], so an endless loop costs at most this much.
    pub fuel: u64,
    /// The most memory the module's instance may grow to, in bytes (rounded down to 64 KiB
    /// pages).
    pub max_memory_bytes: u64,
}

impl Default for Limits {
    /// 200 million instructions (a fraction of a second) and 256 MiB: far above what the
    /// example's Go module needs per event (its runtime's start-up included), far below what
    /// would stall a partition or a pod.
    fn default() -> Self {
        Self {
            fuel: 200_000_000,
            max_memory_bytes: 256 * 1024 * 1024,
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
         {INTERFACE_VERSION:?}"
    )]
    WrongVersion {
        /// What the module answered.
        found: String,
    },
    /// `eos_interface_version` failed.
    #[error("the WebAssembly module's {VERSION_EXPORT} failed: {0}")]
    VersionCall(CallError),
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
    /// The call ran out of fuel or the instance out of memory.
    #[error("the WebAssembly transform hit its limit: {0}")]
    Limit(String),
}

impl CallError {
    /// The dead letter's reason code (`eos-dlq-transform-reason`).
    pub fn code(&self) -> &str {
        match self {
            Self::Refused { code, .. } => code,
            Self::Trap(_) => "transform_trap",
            Self::Limit(_) => "transform_limit",
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

/// A loaded, checked module and its one instance.
pub struct WasmModule {
    compiled: CompiledPlugin,
    /// The instance calls run in; `None` after a failed call, until the next call makes a
    /// fresh one. A mutex because Extism calls take `&mut` and the processor's trait `&self`;
    /// the processor calls from one thread, so it is never contended.
    instance: Mutex<Option<Plugin>>,
    digest: String,
    upgrades: bool,
    options: Options,
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
        let manifest = Manifest::new([Wasm::data(deterministic)]).with_memory_max(pages);
        let compiled = PluginBuilder::new(manifest)
            // Standard Go's wasip1 runtime imports WASI (clock, random, fd_write, proc_exit)
            // and does not link without it; its clock and random are never called (see
            // `deterministic`), and without preopened directories a file cannot be opened
            // (docs/TRANSFORMS.md "Determinism and limits").
            .with_wasi(true)
            .with_fuel_limit(options.limits.fuel)
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
            options,
        };
        let plugin = module.instantiate().map_err(LoadError::Compile)?;
        for export in [VERSION_EXPORT, APPLY_EXPORT] {
            if !plugin.function_exists(export) {
                return Err(LoadError::MissingExport(export));
            }
        }
        module.upgrades = plugin.function_exists(UPGRADE_EXPORT);
        *module.lock() = Some(plugin);
        let found = module.version().map_err(LoadError::VersionCall)?;
        if found != INTERFACE_VERSION {
            return Err(LoadError::WrongVersion { found });
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

    /// Whether the module exports [`UPGRADE_EXPORT`].
    pub fn upgrades(&self) -> bool {
        self.upgrades
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
        Plugin::new_from_compiled(&self.compiled)
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
            plugin
                .call::<&[u8], &[u8]>(VERSION_EXPORT, &[])
                .map(|_| ())
                .map_err(|error| classify(&error, self.options.limits))?;
            *instance = Some(plugin);
        }
        let Some(plugin) = instance.as_mut() else {
            return Err(CallError::Trap("no instance".into()));
        };
        match plugin.call::<&[u8], &[u8]>(export, input) {
            Ok(output) => Ok(output.to_vec()),
            Err(error) => {
                *instance = None;
                Err(classify(&error, self.options.limits))
            }
        }
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
        let input = interface::input(&state.state, event, position)
            .map_err(|error| CallError::Trap(format!("encoding the input: {error}")))?;
        let output = self.call(APPLY_EXPORT, &input)?;
        match interface::result(&output)? {
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

/// Which failure an Extism error is. Extism reports the memory limiter's refusal with the root
/// cause "oom" and an exhausted fuel tank as "plugin ran out of fuel" (extism 1.21
/// `Plugin::raw_call`); everything else the module did is a trap.
fn classify(error: &extism::Error, limits: Limits) -> CallError {
    let root = error.root_cause().to_string();
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
