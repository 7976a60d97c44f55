//! `eosctl audit --replay`: the replay proof of a built-in transform's outputs
//! (docs/TRANSFORMS.md "Prove it: the replay audit"). The input, every output topic and the
//! dead letters are read as a `read_committed` consumer sees them; `eos_transform::replay` runs
//! the transform again over the input with the processor's own decision code and says which
//! outputs and dead letters differ from what it computes. Counting ids shows one outcome per
//! event; this shows the outcome is the transform's. An event's outcome is final, so an event id
//! the run judged twice (a refusal and an output, two refusals) where the replay judges it once
//! is named in the report (`two_outcomes`).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::{Context as _, bail};
use eos_core::{DeadLetterReason, EventContract, dead_letter};
use eos_transform::replay::{self, ReplayInput, ReplayOutput, ReplayReport};
use eos_transform::transform::filter_value;
use eos_transform::{
    BuiltinTransform, DEFAULT_OUTPUT, LedgerTransform, PassThroughTransform, Transform,
};
use serde::Serialize;

use crate::kafka_client::KafkaSettings;
use crate::source_record::SourceRecord;
use crate::topic_reader::read_topics;

/// How many differing outputs the report lists.
const EXAMPLES: usize = 10;

/// What to replay: the transform, where its events keep their parts, and the topics.
#[derive(Debug, Clone)]
pub struct ReplayAuditConfig {
    pub transform: BuiltinTransform,
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
}

/// The replay's verdict and figures.
#[derive(Debug, Clone, Serialize)]
pub struct ReplayAuditOutcome {
    pub passed: bool,
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
    /// A few of each difference, for people.
    pub examples: ReplayReport,
}

/// Reads the topics and replays `config.transform` over the input.
pub async fn run(
    kafka: KafkaSettings,
    config: ReplayAuditConfig,
) -> anyhow::Result<ReplayAuditOutcome> {
    let topics: Vec<String> = std::iter::once(config.input.clone())
        .chain(config.outputs.values().cloned())
        .chain(std::iter::once(config.dlq.clone()))
        .collect();
    let end_timeout = config.end_timeout;
    let mut snapshots = tokio::task::spawn_blocking(move || {
        let names: Vec<&str> = topics.iter().map(String::as_str).collect();
        read_topics(&kafka, &names, end_timeout, &mut |_| {})
    })
    .await
    .context("reading the topics")?
    .context("reading the topics")?
    .into_iter();
    let input = snapshots.next().context("no input topic read")?;
    if !input.exists {
        bail!("input topic {:?} does not exist", config.input);
    }
    let mut committed = Vec::new();
    for name in config.outputs.keys() {
        let output = snapshots.next().context("an output topic was not read")?;
        committed.extend(
            output
                .records
                .iter()
                .map(|record| committed_output(name, record)),
        );
    }
    let dlq = snapshots.next().context("no dead-letter topic read")?;
    let inputs: Vec<ReplayInput> = input.records.iter().map(replay_input).collect();
    let letters = dead_letter_reasons(&dlq.records);
    let names: BTreeSet<String> = config.outputs.keys().cloned().collect();
    let (expected, transform) = match config.transform {
        BuiltinTransform::Ledger => (
            expected(&LedgerTransform, &config, &names, &inputs)?,
            "ledger",
        ),
        BuiltinTransform::PassThrough => {
            let filter = config
                .filter
                .clone()
                .map(|(pointer, equals)| (pointer, filter_value(&equals)));
            (
                expected(&PassThroughTransform { filter }, &config, &names, &inputs)?,
                "pass-through",
            )
        }
    };
    let report = replay::compare(&expected, &committed, &letters);
    Ok(ReplayAuditOutcome {
        passed: report.exact(),
        transform: transform.to_owned(),
        input_records: inputs.len(),
        applied: expected.applied,
        duplicates: expected.duplicates,
        dead_letters: expected.dead_letters.len(),
        committed_outputs: committed.len(),
        matched: report.matched,
        missing: report.missing.len(),
        unexpected: report.unexpected.len(),
        dead_letter_differences: report.dead_letter_differences.len(),
        two_outcomes: report.two_outcomes.len(),
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

fn expected<T: Transform>(
    transform: &T,
    config: &ReplayAuditConfig,
    outputs: &BTreeSet<String>,
    inputs: &[ReplayInput],
) -> anyhow::Result<replay::Expected> {
    let base = transform.contract();
    let contract = EventContract {
        event_id: config.event_id.clone().unwrap_or(base.event_id),
        entity: config.entity.clone().unwrap_or(base.entity),
        occurred_at: config.occurred_at.clone().or(base.occurred_at),
        max_record_bytes: config.max_record_bytes,
    };
    Ok(replay::expected(transform, &contract, outputs, inputs)?)
}

fn replay_input(record: &SourceRecord) -> ReplayInput {
    ReplayInput {
        partition: record.partition,
        offset: record.offset,
        key: record.key.clone(),
        value: record.value.clone(),
        headers: record.headers.clone(),
        timestamp_ms: record.timestamp_ms.unwrap_or_default(),
    }
}

fn header<'a>(record: &'a SourceRecord, name: &str) -> Option<&'a str> {
    record
        .headers
        .iter()
        .rev()
        .find(|(key, _)| key == name)
        .and_then(|(_, value)| value.as_deref())
        .and_then(|value| std::str::from_utf8(value).ok())
}

fn committed_output(name: &str, record: &SourceRecord) -> ReplayOutput {
    ReplayOutput::committed(
        header(record, "event_id").unwrap_or_default(),
        name,
        record.key.as_deref(),
        record.value.as_deref().unwrap_or_default(),
    )
}

/// Source position → reason of every dead letter that says where it came from.
fn dead_letter_reasons(letters: &[SourceRecord]) -> BTreeMap<(i32, i64), DeadLetterReason> {
    letters
        .iter()
        .filter_map(|letter| {
            let partition = header(letter, dead_letter::SOURCE_PARTITION_HEADER)?
                .parse()
                .ok()?;
            let offset = header(letter, dead_letter::SOURCE_OFFSET_HEADER)?
                .parse()
                .ok()?;
            let reason = header(letter, dead_letter::REASON_HEADER)?.parse().ok()?;
            Some(((partition, offset), reason))
        })
        .collect()
}

/// The report for people.
pub fn text(outcome: &ReplayAuditOutcome) -> String {
    let mut text = format!(
        "replay of the {} transform over {} input records: {} events applied, {} duplicates \
         dropped, {} dead letters\ncommitted outputs {}: {} as replayed, {} missing, {} \
         unexpected; {} dead letters differ; {} event ids with two outcomes\n",
        outcome.transform,
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
    for output in &outcome.examples.missing {
        text.push_str(&format!(
            "  missing    {} → {} key {:?}: {}\n",
            output.event_id, output.output, output.key, output.value
        ));
    }
    for output in &outcome.examples.unexpected {
        text.push_str(&format!(
            "  unexpected {} → {} key {:?}: {}\n",
            output.event_id, output.output, output.key, output.value
        ));
    }
    for (partition, offset, written, replayed) in &outcome.examples.dead_letter_differences {
        text.push_str(&format!(
            "  dead letter at {partition}@{offset}: committed {written}, replayed {replayed}\n"
        ));
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

    fn record(headers: &[(&str, &str)]) -> SourceRecord {
        SourceRecord {
            topic: "t.dlq".into(),
            partition: 0,
            offset: 3,
            key: None,
            value: None,
            headers: headers
                .iter()
                .map(|(k, v)| ((*k).to_owned(), Some(v.as_bytes().to_vec())))
                .collect(),
            timestamp_ms: None,
        }
    }

    #[test]
    fn dead_letters_are_read_by_their_source_position_and_the_last_reason_header() {
        let letters = [
            record(&[
                (dead_letter::REASON_HEADER, "missing_field"),
                (dead_letter::SOURCE_PARTITION_HEADER, "2"),
                (dead_letter::SOURCE_OFFSET_HEADER, "41"),
            ]),
            // An input's own header of the name comes first; the service's is last.
            record(&[
                (dead_letter::REASON_HEADER, "nonsense"),
                (dead_letter::REASON_HEADER, "transform_refused"),
                (dead_letter::SOURCE_PARTITION_HEADER, "0"),
                (dead_letter::SOURCE_OFFSET_HEADER, "7"),
            ]),
            // Without its position it cannot be matched: left out.
            record(&[(dead_letter::REASON_HEADER, "missing_field")]),
        ];
        assert_eq!(
            dead_letter_reasons(&letters),
            BTreeMap::from([
                ((0, 7), DeadLetterReason::TransformRefused),
                ((2, 41), DeadLetterReason::MissingField),
            ])
        );
        assert_eq!(
            output_topics("ledger", &[("flagged".into(), "f".into())]).len(),
            2
        );
    }
}
