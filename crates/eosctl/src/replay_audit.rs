//! `eosctl audit --replay`: the replay proof of a transform's outputs (docs/TRANSFORMS.md "Prove
//! it: the replay audit"): a built-in transform, or with the `wasm` feature a WebAssembly module
//! loaded by the processor's own host. The run — its input, every output topic and the dead
//! letters — is read by `eos_transform::replay::read_committed_run`, the reader a user's own
//! test calls, as a `read_committed` consumer sees it; `eos_transform::replay` runs the transform
//! again over the input with the processor's own decision code, under the contract and outputs
//! the processor's flags gave the run, and says which outputs and dead letters (reason and the
//! transform's code) differ from what it computes. Counting ids shows one outcome per event;
//! this shows the outcome is the transform's. An event's outcome is final, so an event id the
//! run judged twice (a refusal and an output, two refusals) where the replay judges it once is
//! named in the report (`two_outcomes`).

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Context as _;
use eos_core::EventContract;
use eos_transform::replay::{self, CommittedRun, ReplayReport, RunTopics};
use eos_transform::transform::filter_value;
use eos_transform::{
    BuiltinTransform, DEFAULT_OUTPUT, LedgerTransform, PassThroughTransform, Transform,
};
use serde::Serialize;

use crate::cli::ReplayTransform;
use crate::kafka_client::KafkaSettings;
use crate::run_formats::{RunFormats, decode_run};

/// How many differing outputs the report lists.
const EXAMPLES: usize = 10;

/// What to replay: the transform, where its events keep their parts, and the topics — each as
/// the processor was told.
#[derive(Debug, Clone)]
pub struct ReplayAuditConfig {
    pub transform: ReplayTransform,
    /// The processor's `--wasm-fuel`, `--wasm-max-memory` and `--wasm-timeout`.
    pub wasm_limits: WasmLimits,
    pub event_id: Option<eos_core::FieldLocation>,
    pub entity: Option<eos_core::FieldLocation>,
    pub occurred_at: Option<String>,
    pub max_record_bytes: usize,
    pub filter: Option<(String, String)>,
    pub input: String,
    /// Output name → topic, the default output included.
    pub outputs: BTreeMap<String, String>,
    pub dlq: String,
    pub end_timeout: Duration,
    /// The input's and the outputs' formats (plain JSON, or a schema registry's).
    pub formats: RunFormats,
}

/// The limits a module ran under in the processor, to run it under again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WasmLimits {
    pub fuel: u64,
    pub max_memory_bytes: u64,
    pub timeout: Duration,
}

/// The replay's verdict and figures.
#[derive(Debug, Clone, Serialize)]
pub struct ReplayAuditOutcome {
    pub passed: bool,
    /// `ledger`, `pass-through`, or `webassembly module sha256:…` (as the processor's
    /// `/boundary` names a module).
    pub transform: String,
    pub input_records: usize,
    pub applied: u64,
    pub duplicates: u64,
    pub dead_letters: usize,
    pub committed_outputs: usize,
    pub matched: u64,
    pub missing: usize,
    pub unexpected: usize,
    pub dead_letter_differences: usize,
    /// Event ids with more outcomes than the replay's one.
    pub two_outcomes: usize,
    /// Records on the dead-letter topic that are no dead letter of this input (another input's,
    /// or without a dead letter's headers): not compared.
    pub other_dead_letters: usize,
    /// A few of each difference, for people.
    pub examples: ReplayReport,
}

/// Reads the run and replays `config.transform` over its input. Blocking work (the read, a
/// module's compilation, the replay) runs off the async runtime.
pub async fn run(
    kafka: KafkaSettings,
    config: ReplayAuditConfig,
) -> anyhow::Result<ReplayAuditOutcome> {
    tokio::task::spawn_blocking(move || replay_run(&kafka, &config))
        .await
        .context("the replay panicked")?
}

fn replay_run(
    kafka: &KafkaSettings,
    config: &ReplayAuditConfig,
) -> anyhow::Result<ReplayAuditOutcome> {
    let topics = RunTopics {
        input: config.input.clone(),
        outputs: config.outputs.clone(),
        dead_letters: config.dlq.clone(),
    };
    let records =
        replay::read_committed_records(&kafka.client_config(), &topics, config.end_timeout)
            .context("reading the run")?;
    let (records, undecodable) = decode_run(records, &config.input, &config.formats)?;
    let run = records.into_run(&config.input);
    let replayed = match &config.transform {
        ReplayTransform::Builtin(BuiltinTransform::Ledger) => {
            replay_with(&LedgerTransform, "ledger", config, &topics, &run)?
        }
        ReplayTransform::Builtin(BuiltinTransform::PassThrough) => {
            let filter = config
                .filter
                .clone()
                .map(|(pointer, equals)| (pointer, filter_value(&equals)));
            let transform = PassThroughTransform { filter };
            replay_with(&transform, "pass-through", config, &topics, &run)?
        }
        ReplayTransform::Wasm(path) => replay_module(path, config, &topics, &run)?,
    };
    let (mut expected, transform) = replayed;
    // Dead-lettered by the processor before any decision, as the replay's decoding finds them.
    expected.dead_letters.extend(undecodable);
    let report = run.compare(&expected);
    Ok(ReplayAuditOutcome {
        passed: report.exact(),
        transform,
        input_records: run.inputs.len(),
        applied: expected.applied,
        duplicates: expected.duplicates,
        dead_letters: expected.dead_letters.len(),
        committed_outputs: run.outputs.len(),
        matched: report.matched,
        missing: report.missing.len(),
        unexpected: report.unexpected.len(),
        dead_letter_differences: report.dead_letter_differences.len(),
        two_outcomes: report.two_outcomes.len(),
        other_dead_letters: run.other_dead_letters,
        examples: ReplayReport {
            matched: report.matched,
            missing: report.missing.into_iter().take(EXAMPLES).collect(),
            unexpected: report.unexpected.into_iter().take(EXAMPLES).collect(),
            dead_letter_differences: report
                .dead_letter_differences
                .into_iter()
                .take(EXAMPLES)
                .collect(),
            two_outcomes: report.two_outcomes.into_iter().take(EXAMPLES).collect(),
        },
    })
}

/// Loads the module with the processor's host and limits, and replays it.
#[cfg(feature = "wasm")]
fn replay_module(
    path: &std::path::Path,
    config: &ReplayAuditConfig,
    topics: &RunTopics,
    run: &CommittedRun,
) -> anyhow::Result<(replay::Expected, String)> {
    use eos_transform::wasm::{Limits, Options, WasmTransform};
    let options = Options {
        limits: Limits {
            fuel: config.wasm_limits.fuel,
            max_memory_bytes: config.wasm_limits.max_memory_bytes,
            timeout: config.wasm_limits.timeout,
        },
        ..Options::default()
    };
    let transform = WasmTransform::load(path, options)
        .with_context(|| format!("loading the WebAssembly module {}", path.display()))?;
    let name = format!("webassembly module {}", transform.digest());
    tracing::info!(module = %path.display(), digest = transform.digest(), "webassembly transform loaded for the replay");
    replay_with(&transform, &name, config, topics, run)
}

/// Unreachable: `--transform wasm:` is refused at parse time without the feature.
#[cfg(not(feature = "wasm"))]
fn replay_module(
    path: &std::path::Path,
    _config: &ReplayAuditConfig,
    _topics: &RunTopics,
    _run: &CommittedRun,
) -> anyhow::Result<(replay::Expected, String)> {
    anyhow::bail!(
        "cannot replay {}: this eosctl was built without its `wasm` feature",
        path.display()
    )
}

fn replay_with<T: Transform>(
    transform: &T,
    name: &str,
    config: &ReplayAuditConfig,
    topics: &RunTopics,
    run: &CommittedRun,
) -> anyhow::Result<(replay::Expected, String)> {
    let contract = run_contract(transform.contract(), config);
    let expected = replay::expected(transform, &contract, &topics.output_names(), &run.inputs)?;
    Ok((expected, name.to_owned()))
}

/// The contract the run had: the transform's own, with what the processor's flags said instead
/// (as the processor's `Config::event_contract` makes it), so that the replay decides what the
/// run decided even when the flags overrode the transform.
fn run_contract(base: EventContract, config: &ReplayAuditConfig) -> EventContract {
    EventContract {
        event_id: config.event_id.clone().unwrap_or(base.event_id),
        entity: config.entity.clone().unwrap_or(base.entity),
        occurred_at: config.occurred_at.clone().or(base.occurred_at),
        max_record_bytes: config.max_record_bytes,
    }
}

/// The report for people.
pub fn text(outcome: &ReplayAuditOutcome) -> String {
    let replayed = match outcome.transform.as_str() {
        module if module.starts_with("webassembly") => module.to_owned(),
        builtin => format!("the {builtin} transform"),
    };
    let mut text = format!(
        "replay of {} over {} input records: {} events applied, {} duplicates dropped, {} dead letters\ncommitted outputs {}: {} as replayed, {} missing, {} \
         unexpected; {} dead letters differ; {} event ids with two outcomes\n",
        replayed,
        outcome.input_records,
        outcome.applied,
        outcome.duplicates,
        outcome.dead_letters,
        outcome.committed_outputs,
        outcome.matched,
        outcome.missing,
        outcome.unexpected,
        outcome.dead_letter_differences,
        outcome.two_outcomes,
    );
    if outcome.other_dead_letters > 0 {
        text.push_str(&format!(
            "{} records on the dead-letter topic are no dead letter of this input (not \
             compared)\n",
            outcome.other_dead_letters
        ));
    }
    for output in &outcome.examples.missing {
        text.push_str(&format!("  missing    {output}\n"));
    }
    for output in &outcome.examples.unexpected {
        text.push_str(&format!("  unexpected {output}\n"));
    }
    for difference in &outcome.examples.dead_letter_differences {
        text.push_str(&format!("  {difference}\n"));
    }
    for event_id in &outcome.examples.two_outcomes {
        text.push_str(&format!(
            "  two outcomes for {event_id}: judged again after its outcome was final\n"
        ));
    }
    text.push_str(if outcome.passed {
        "RESULT: PASS: every committed output and dead letter is the transform's, once\n"
    } else {
        "RESULT: FAIL: the committed outputs are not the transform's (see above)\n"
    });
    text
}

/// The default output first, then the named ones: an output's name from `NAME=TOPIC`.
pub fn output_topics(default_topic: &str, named: &[(String, String)]) -> BTreeMap<String, String> {
    std::iter::once((DEFAULT_OUTPUT.to_owned(), default_topic.to_owned()))
        .chain(named.iter().cloned())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flags_say_where_the_run_found_the_event_s_parts() {
        let config = ReplayAuditConfig {
            transform: ReplayTransform::Builtin(BuiltinTransform::PassThrough),
            wasm_limits: WasmLimits {
                fuel: 1,
                max_memory_bytes: 1,
                timeout: Duration::from_secs(1),
            },
            event_id: None,
            entity: Some(eos_core::FieldLocation::Pointer("/account".into())),
            occurred_at: None,
            max_record_bytes: 4096,
            filter: None,
            input: "in".into(),
            outputs: output_topics("out", &[("flagged".into(), "f".into())]),
            dlq: "in.dlq".into(),
            end_timeout: Duration::from_secs(1),
            formats: RunFormats::json(),
        };
        let contract = run_contract(EventContract::ledger(), &config);
        assert_eq!(contract.event_id, EventContract::ledger().event_id);
        assert_eq!(
            contract.entity,
            eos_core::FieldLocation::Pointer("/account".into())
        );
        assert_eq!(contract.max_record_bytes, 4096);
        assert_eq!(config.outputs.len(), 2);
    }
}
