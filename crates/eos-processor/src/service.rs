//! The eos-processor binary: the library's [`Config`] with the demo's defaults, plus the flags
//! only the binary has — which transform to run (`--transform`: the built-in ledger or
//! pass-through, or a WebAssembly module), the module's limits and the pass-through's filter —
//! and [`run`], which builds that transform and runs the [`Processor`] with it.
//!
//! Behind the crate's `wasm` feature, as the binary is: a library user who brings their own
//! transform builds neither these flags nor wasmtime (docs/TRANSFORMS.md "The host: Extism on
//! wasmtime").

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Parser, ValueEnum as _};
use eos_core::FieldLocation;
use tokio_util::sync::CancellationToken;

use crate::config::{BuiltinTransform, Config};
use crate::error::ProcessorError;
use crate::transform::{self, LedgerTransform, PassThroughTransform, Transform};
use crate::{Processor, wasm};

/// The demo's input topic (docs/getting-started.md): the payments the ledger reads.
pub(crate) const DEMO_INPUT_TOPIC: &str = "payments";
/// The demo's default output topic: the ledger sink-writer reads.
pub(crate) const DEMO_OUTPUT_TOPIC: &str = "ledger";
/// The demo's consumer group, the prefix of its transactional ids.
pub(crate) const DEMO_GROUP_ID: &str = "eos-processor";

/// What `--transform` names: a built-in transform or a WebAssembly module.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TransformChoice {
    /// `ledger` or `pass-through`.
    Builtin(BuiltinTransform),
    /// `wasm:PATH`.
    Wasm(PathBuf),
}

/// `--transform`, as clap's value parser: a built-in's name, or `wasm:` and the path of a
/// module file (checked to exist here, so a typo is a usage error; the module itself is
/// checked when it is loaded).
pub(crate) fn parse_transform(text: &str) -> Result<TransformChoice, String> {
    if let Some(path) = text.strip_prefix("wasm:") {
        let path = PathBuf::from(path);
        if !path.is_file() {
            return Err(format!(
                "{} is not a file: wasm:PATH names a WebAssembly module",
                path.display()
            ));
        }
        return Ok(TransformChoice::Wasm(path));
    }
    BuiltinTransform::from_str(text, false)
        .map(TransformChoice::Builtin)
        .map_err(|_| format!("{text:?} is not ledger, pass-through or wasm:PATH"))
}

/// A size in bytes, optionally with a KiB, MiB or GiB suffix (`--wasm-max-memory`).
pub(crate) fn parse_bytes(text: &str) -> Result<u64, String> {
    let (number, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(at) => text.split_at(at),
        None => (text, ""),
    };
    let unit = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        _ => return Err(format!("{text:?} is not a size such as 256MiB")),
    };
    number
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(unit))
        .ok_or_else(|| format!("{text:?} is not a size such as 256MiB"))
}

/// `--wasm-timeout`, as clap's value parser: a duration of at least a millisecond (the host
/// counts whole milliseconds, and a zero limit would stop every call at once).
pub(crate) fn parse_wasm_timeout(text: &str) -> Result<Duration, String> {
    let timeout = humantime::parse_duration(text).map_err(|error| format!("{text:?}: {error}"))?;
    if timeout < Duration::from_millis(1) {
        return Err(format!("{text:?} is shorter than a millisecond"));
    }
    Ok(timeout)
}

/// Kafka → Kafka exactly-once read-process-write.
///
/// Reads events (JSON objects) from the input topic with read_committed, drops duplicate
/// deliveries by event id, applies the transform (--transform) with each entity's state, and
/// writes the outputs, the state changelog, the dead letters and the consumed offsets in one
/// Kafka transaction per batch. Idempotence, read_committed and manual offset commits are not
/// configurable: exactly-once depends on them.
#[derive(Debug, Clone, Parser)]
#[command(name = "eos-processor", version, about, long_about)]
// The demo's topics and group are the binary's, never the library's: a library binary that
// forgot --group-id would otherwise join the demo's group and share its transactional ids.
#[command(mut_arg("input_topic", |arg| arg.required(false).default_value(DEMO_INPUT_TOPIC)))]
#[command(mut_arg("group_id", |arg| arg.required(false).default_value(DEMO_GROUP_ID)))]
// Not a clap default: a module that declares no default output gets no topic created for one
// (`run`).
#[command(mut_arg("output_topic", |arg| arg.help(
    "Topic of the default output (named \"default\") [default: ledger, unless the transform \
     writes only to outputs it names: a WebAssembly module that declares no default output]",
)))]
pub struct ServiceConfig {
    /// The processor's own flags, as every binary that runs a `Processor` has them.
    #[command(flatten)]
    pub processor: Config,

    /// The transform to run.
    ///
    /// ledger: the demo's ledger: checks the ledger envelope (id, entity and time at
    /// /event_id, /entity_id and /occurred_at) and keeps per-entity running totals.
    ///
    /// pass-through: each new event's value to the default output as it came, or only those
    /// whose value at --filter-pointer equals --filter-equals.
    ///
    /// wasm:PATH: the WebAssembly module at PATH, written in any language (docs/TRANSFORMS.md
    /// "WebAssembly transforms"; see --wasm-fuel, --wasm-max-memory, --wasm-timeout,
    /// --wasm-state-compatible).
    #[arg(long, env = "EOS_TRANSFORM", default_value = "ledger", value_parser = parse_transform)]
    pub transform: TransformChoice,

    /// wasm: fuel per call to the module, about one unit per instruction; a call that uses it
    /// all is dead-lettered with reason transform_limit.
    #[arg(long, env = "EOS_WASM_FUEL", default_value_t = wasm::Limits::default().fuel)]
    pub wasm_fuel: u64,

    /// wasm: the most memory the module may grow to, in bytes or with a KiB, MiB or GiB
    /// suffix; a call that would pass it is dead-lettered with reason transform_limit.
    #[arg(long, env = "EOS_WASM_MAX_MEMORY", default_value = "256MiB", value_parser = parse_bytes)]
    pub wasm_max_memory: u64,

    /// wasm: the longest one call to the module may run, by the wall clock (e.g. 500ms, 2s); a
    /// call still running then is dead-lettered with reason transform_limit. Fuel alone does
    /// not bound time (a bulk-memory instruction costs one unit whatever its length); at most
    /// half of --transaction-timeout.
    #[arg(long, env = "EOS_WASM_TIMEOUT", default_value = "2s", value_parser = parse_wasm_timeout)]
    pub wasm_timeout: Duration,

    /// wasm: accept entity state written by a module with another digest (the new module reads
    /// the old one's state format as it is); without it, and unless the module exports
    /// eos_upgrade_state, such state stops the restore with an error naming both digests.
    #[arg(long, env = "EOS_WASM_STATE_COMPATIBLE")]
    pub wasm_state_compatible: bool,

    /// pass-through: pass only events whose value at this JSON pointer equals --filter-equals.
    #[arg(long, env = "EOS_FILTER_POINTER", requires = "filter_equals")]
    pub filter_pointer: Option<String>,

    /// pass-through: the value to compare with, as JSON (`true`, `3`, `"EUR"`) or a plain
    /// string (`EUR`).
    #[arg(long, env = "EOS_FILTER_EQUALS", requires = "filter_pointer")]
    pub filter_equals: Option<String>,
}

impl ServiceConfig {
    /// Checks what clap cannot: the processor's flags ([`Config::validate`]) and the binary's
    /// own against them.
    pub fn validate(&self) -> Result<(), String> {
        self.processor.validate()?;
        if self.filter_pointer.is_some()
            && self.transform != TransformChoice::Builtin(BuiltinTransform::PassThrough)
        {
            return Err("--filter-pointer is for --transform pass-through".into());
        }
        // A call that hangs to its limit keeps the batch's transaction open that long, with the
        // commit interval and the commit still to come: past --transaction-timeout the
        // coordinator would abort it, and the redone batch would hang on the same call again,
        // for ever, instead of dead-lettering it.
        if matches!(self.transform, TransformChoice::Wasm(_))
            && self.wasm_timeout * 2 > self.processor.transaction_timeout
        {
            return Err(format!(
                "--wasm-timeout ({}) must be at most half of --transaction-timeout ({})",
                humantime::format_duration(self.wasm_timeout),
                humantime::format_duration(self.processor.transaction_timeout)
            ));
        }
        Ok(())
    }

    fn wasm_options(&self) -> wasm::Options {
        wasm::Options {
            limits: wasm::Limits {
                fuel: self.wasm_fuel,
                max_memory_bytes: self.wasm_max_memory,
                timeout: self.wasm_timeout,
            },
            state_compatible: self.wasm_state_compatible,
        }
    }
}

/// `config` with the demo's default output topic when the transform writes to the default
/// output and none was given.
fn with_demo_output(mut config: Config, transform: &impl Transform) -> Config {
    if transform.writes_default_output() && config.output_topic.is_none() {
        config.output_topic = Some(DEMO_OUTPUT_TOPIC.to_owned());
    }
    config
}

/// Where the flags disagree with what a module declared (`eos_contract`): a location flag that
/// names another place than the module's, or an `--output` the module never writes to (a typo
/// of a declared name, say). The module's own declaration is what it was written against, so
/// the processor refuses to start rather than run it on other fields. A declared output without
/// its topic is [`Config::check_outputs`]'s refusal, as for any transform.
pub(crate) fn module_disagreement(
    config: &Config,
    declared: &wasm::DeclaredContract,
) -> Result<(), String> {
    let locations: [(&str, Option<FieldLocation>, Option<FieldLocation>); 3] = [
        (
            "--event-id",
            config.event_id.clone(),
            declared.event_id.clone(),
        ),
        ("--entity", config.entity.clone(), declared.entity.clone()),
        (
            "--occurred-at",
            config.occurred_at.clone().map(FieldLocation::Pointer),
            declared.occurred_at.clone().map(FieldLocation::Pointer),
        ),
    ];
    for (flag, given, module) in locations {
        if let (Some(given), Some(module)) = (given, module)
            && given != module
        {
            return Err(format!(
                "{flag} {given} disagrees with the WebAssembly module, which declares {module} \
                 (eos_contract): drop the flag, or give the module's"
            ));
        }
    }
    if let Some(outputs) = &declared.outputs
        && let Some((name, topic)) = config
            .outputs
            .iter()
            .find(|(name, _)| !outputs.contains(name))
    {
        return Err(format!(
            "--output {name}={topic} names an output the WebAssembly module does not declare \
             (eos_contract declares {})",
            outputs.join(", ")
        ));
    }
    Ok(())
}

/// Runs the transform `--transform` names until `shutdown` is cancelled (exit 0 after
/// committing the open batch) or a fatal error (fenced, unrecoverable Kafka state, bad topics,
/// a module that cannot run or disagrees with the flags).
pub async fn run(config: ServiceConfig, shutdown: CancellationToken) -> anyhow::Result<()> {
    config.validate().map_err(ProcessorError::Config)?;
    match config.transform.clone() {
        TransformChoice::Builtin(BuiltinTransform::Ledger) => {
            let processor = with_demo_output(config.processor, &LedgerTransform);
            Processor::new(processor, LedgerTransform)
                .run(shutdown)
                .await
        }
        TransformChoice::Builtin(BuiltinTransform::PassThrough) => {
            let filter = config
                .filter_pointer
                .clone()
                .zip(config.filter_equals.as_deref().map(transform::filter_value));
            let transform = PassThroughTransform { filter };
            let processor = with_demo_output(config.processor, &transform);
            Processor::new(processor, transform).run(shutdown).await
        }
        TransformChoice::Wasm(path) => run_module(config, path, shutdown).await,
    }
}

async fn run_module(
    config: ServiceConfig,
    path: PathBuf,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let options = config.wasm_options();
    // Compiling a module takes a while (seconds for a Go module): off the runtime's threads,
    // like the transaction loop.
    let load_path = path.clone();
    let transform =
        tokio::task::spawn_blocking(move || wasm::WasmTransform::load(&load_path, options))
            .await
            .context("loading the WebAssembly module panicked")?
            .with_context(|| format!("loading the WebAssembly transform {}", path.display()))?;
    let declared = transform.declared();
    tracing::info!(
        module = %path.display(),
        digest = transform.digest(),
        fuel = options.limits.fuel,
        max_memory_bytes = options.limits.max_memory_bytes,
        timeout = ?options.limits.timeout,
        state_compatible = options.state_compatible,
        declared_outputs = ?declared.and_then(|d| d.outputs.as_ref()),
        "webassembly transform loaded"
    );
    if let Some(declared) = declared {
        module_disagreement(&config.processor, declared).map_err(ProcessorError::Config)?;
        if !transform.writes_default_output()
            && let Some(topic) = &config.processor.output_topic
        {
            // Charts set the default output's topic whatever the transform: a warning, not a
            // refusal.
            tracing::warn!(
                topic,
                "the WebAssembly module declares no default output: --output-topic's topic is \
                 created and never written to"
            );
        }
    }
    let processor = with_demo_output(config.processor, &transform);
    // The loop checks the shutdown only between records: a call running when it comes is
    // interrupted, so SIGTERM does not wait for the call's wall-clock limit. The loop then
    // commits nothing of the open batch (`TransactionLoop::run`).
    let interrupter = transform.interrupter();
    let on_shutdown = shutdown.clone();
    let interrupt = tokio::spawn(async move {
        on_shutdown.cancelled().await;
        interrupter.interrupt();
    });
    let result = Processor::new(processor, transform).run(shutdown).await;
    interrupt.abort();
    result
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use eos_core::EventContract;

    use super::*;
    use crate::transform::DEFAULT_OUTPUT;

    fn parse(args: &[&str]) -> ServiceConfig {
        ServiceConfig::try_parse_from(std::iter::once("eos-processor").chain(args.iter().copied()))
            .expect("valid flags")
    }

    #[test]
    fn the_binary_keeps_the_demo_defaults() {
        let config = parse(&["--instance-id", "pod-0"]);
        assert!(config.validate().is_ok(), "{:?}", config.validate());
        assert_eq!(
            config.transform,
            TransformChoice::Builtin(BuiltinTransform::Ledger)
        );
        let processor = with_demo_output(config.processor, &LedgerTransform);
        assert_eq!(processor.input_topic, "payments");
        assert_eq!(processor.dlq_topic(), "payments.dlq");
        assert_eq!(
            processor.changelog_topic(),
            "eos-processor-payments-changelog"
        );
        assert_eq!(processor.transactional_id(), "eos-processor-pod-0");
        assert_eq!(
            processor.output_topics(),
            BTreeMap::from([("default".to_owned(), "ledger".to_owned())])
        );
        assert_eq!(
            processor.event_contract(EventContract::ledger()).event_id,
            FieldLocation::Pointer("/event_id".into())
        );
        // Given, the flags win.
        let given = parse(&[
            "--input-topic",
            "in",
            "--output-topic",
            "out",
            "--group-id",
            "g",
        ]);
        let processor = with_demo_output(given.processor, &LedgerTransform);
        assert_eq!(
            (processor.input_topic.as_str(), processor.group_id.as_str()),
            ("in", "g")
        );
        assert_eq!(processor.output_topics()[DEFAULT_OUTPUT], "out");
    }

    #[test]
    fn the_filter_is_the_pass_throughs() {
        let config = parse(&[
            "--transform",
            "pass-through",
            "--filter-pointer",
            "/currency",
            "--filter-equals",
            "EUR",
        ]);
        assert!(config.validate().is_ok(), "{:?}", config.validate());
        let ledger = parse(&["--filter-pointer", "/a", "--filter-equals", "1"]);
        assert!(ledger.validate().is_err());
        for bad in [&["--filter-pointer", "/a"][..], &["--transform", "wasm"]] {
            assert!(
                ServiceConfig::try_parse_from(
                    std::iter::once("eos-processor").chain(bad.iter().copied())
                )
                .is_err(),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn a_webassembly_transform_is_a_path_with_its_limits() {
        // Per process: two test runs at once must not remove each other's file.
        let module = std::env::temp_dir().join(format!(
            "eos-processor-config-test-{}.wasm",
            std::process::id()
        ));
        std::fs::write(&module, b"\0asm").expect("writes");
        let config = parse(&[
            "--transform",
            &format!("wasm:{}", module.display()),
            "--wasm-fuel",
            "1000",
            "--wasm-max-memory",
            "64MiB",
            "--wasm-state-compatible",
            "--wasm-timeout",
            "750ms",
        ]);
        assert_eq!(config.transform, TransformChoice::Wasm(module.clone()));
        assert_eq!(config.wasm_fuel, 1000);
        assert_eq!(config.wasm_max_memory, 64 << 20);
        assert!(config.wasm_state_compatible);
        assert_eq!(config.wasm_timeout, Duration::from_millis(750));
        assert!(config.validate().is_ok(), "{:?}", config.validate());
        let defaults = parse(&[]);
        assert_eq!(defaults.wasm_max_memory, 256 << 20);
        assert!(!defaults.wasm_state_compatible);
        assert_eq!(defaults.wasm_timeout, wasm::Limits::default().timeout);
        // A hanging call must not outlive the transaction it holds open.
        let outliving = parse(&[
            "--transform",
            &format!("wasm:{}", module.display()),
            "--wasm-timeout",
            "6s",
        ]);
        let error = outliving.validate().expect_err("6 s against 10 s");
        assert!(error.contains("--wasm-timeout (6s)"), "{error}");
        for bad in [
            &["--transform", "wasm:/no/such/module.wasm"][..],
            &["--transform", "wasm:"],
            &["--transform", "lua"],
            &["--wasm-max-memory", "lots"],
            &["--wasm-max-memory", "1TB"],
            &["--wasm-timeout", "0s"],
            &["--wasm-timeout", "soon"],
        ] {
            assert!(
                ServiceConfig::try_parse_from(
                    std::iter::once("eos-processor").chain(bad.iter().copied())
                )
                .is_err(),
                "{bad:?}"
            );
        }
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert_eq!(parse_bytes("2GiB"), Ok(2 << 30));
        std::fs::remove_file(&module).expect("removes the test module");
    }

    #[test]
    fn flags_that_disagree_with_a_modules_declaration_are_refused() {
        let declared = wasm::DeclaredContract {
            event_id: Some(FieldLocation::Pointer("/auth_id".into())),
            entity: Some(FieldLocation::Pointer("/card".into())),
            occurred_at: Some("/at".into()),
            outputs: Some(vec!["default".into(), "flagged".into()]),
            reads: None,
        };
        // The same places, or none: the module's.
        for agreeing in [
            &["--output", "flagged=f"][..],
            &[
                "--event-id",
                "/auth_id",
                "--entity",
                "/card",
                "--occurred-at",
                "/at",
            ],
        ] {
            let config = parse(agreeing);
            assert_eq!(
                module_disagreement(&config.processor, &declared),
                Ok(()),
                "{agreeing:?}"
            );
        }
        for (flags, named) in [
            (&["--event-id", "/id"][..], "--event-id /id"),
            (&["--entity", "key"], "--entity key"),
            (&["--occurred-at", "/time"], "--occurred-at /time"),
            (&["--output", "flaged=f"], "--output flaged=f"),
        ] {
            let error =
                module_disagreement(&parse(flags).processor, &declared).expect_err("disagrees");
            assert!(error.starts_with(named), "{error}");
        }
        // A declared output without its topic is the processor's refusal for any transform.
        let error = parse(&["--output-topic", "approved"])
            .processor
            .check_outputs(true, &["flagged".to_owned()])
            .expect_err("no --output flagged=");
        assert!(error.contains("--output flagged=TOPIC"), "{error}");
    }
}
