//! Human-readable renderings of the commands' results. The `--json` renderings are the serde
//! forms of the same structs, so both always carry the same figures.

use std::fmt::Write as _;

use comfy_table::presets::UTF8_FULL_CONDENSED;
use comfy_table::{CellAlignment, Table};
use serde::Serialize;

use crate::audit::{AuditReport, Figures};
use crate::produce::ProduceSummary;

/// Examples shown per violation kind in the text report (the JSON carries all that were kept).
const TEXT_EXAMPLES: usize = 5;

/// An audit report with the topics it is about.
#[derive(Debug, Clone, Serialize)]
pub struct AuditOutcome {
    pub input_topic: String,
    pub output_topic: String,
    pub dlq_topic: String,
    /// The PostgreSQL tables audited, when `--database-url` was given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sink_table: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state_table: Option<String>,
    /// The key prefix of the provider effects audited, when `--provider-url` was given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider_operation_prefix: Option<String>,
    /// The query naming the committed domain rows, when `--outbox-database-url` was given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outbox_domain_query: Option<String>,
    #[serde(flatten)]
    pub report: AuditReport,
}

/// `1234567` as `1,234,567`.
pub fn grouped(number: impl Into<i128>) -> String {
    let number: i128 = number.into();
    let digits = number.unsigned_abs().to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3 + 1);
    if number < 0 {
        out.push('-');
    }
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

pub fn produce_text(summary: &ProduceSummary) -> String {
    let mut out = String::new();
    let created = if summary.topic_created {
        ", created"
    } else {
        ""
    };
    let _ = writeln!(
        out,
        "produced to topic {:?} ({} partitions{created}), seed {}",
        summary.topic, summary.partitions, summary.seed
    );
    let mut table = Table::new();
    table.load_preset(UTF8_FULL_CONDENSED);
    table.set_header(["", "records"]);
    let malformed_kinds = summary
        .malformed_by_kind
        .iter()
        .map(|(kind, count)| format!("{kind} {count}"))
        .collect::<Vec<_>>()
        .join(", ");
    let rows = [
        ("logical events (--count)", grouped(summary.logical_events)),
        (
            "physical records written",
            grouped(summary.physical_records),
        ),
        ("  exact duplicate deliveries", grouped(summary.duplicates)),
        ("  malformed", grouped(summary.malformed)),
        (
            "  conflicts (reused id, other content)",
            grouped(summary.conflicts),
        ),
        (
            "sum of values over logical events",
            grouped(summary.sum_logical_values),
        ),
        (
            "sum of values over all valid records",
            grouped(summary.sum_valid_physical_values),
        ),
    ];
    for (name, value) in rows {
        table.add_row([name.to_owned(), value]);
    }
    if let Some(column) = table.column_mut(1) {
        column.set_cell_alignment(CellAlignment::Right);
    }
    let _ = writeln!(out, "{table}");
    if !malformed_kinds.is_empty() {
        let _ = writeln!(out, "malformed by kind: {malformed_kinds}");
    }
    let _ = writeln!(
        out,
        "{} records ({:.1} MB) in {:.2} s: {} records/s, {:.1} MB/s",
        grouped(summary.physical_records),
        summary.bytes as f64 / 1_000_000.0,
        summary.elapsed_seconds,
        grouped(summary.records_per_second.round() as i64),
        summary.megabytes_per_second
    );
    out
}

pub fn audit_text(outcome: &AuditOutcome) -> String {
    let report = &outcome.report;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "audit: input {:?} -> output {:?}, dead letters {:?}",
        outcome.input_topic, outcome.output_topic, outcome.dlq_topic
    );
    if let (Some(sink), Some(state)) = (&outcome.sink_table, &outcome.state_table) {
        let _ = writeln!(out, "postgres: tables {sink:?} and {state:?}");
    }
    if let Some(prefix) = &outcome.provider_operation_prefix {
        let _ = writeln!(out, "provider: effects with keys {prefix:?}<event_id>");
    }
    if let Some(query) = &outcome.outbox_domain_query {
        let _ = writeln!(out, "outbox: committed domain rows from {query:?}");
    }
    let _ = writeln!(out, "{}", checks_table(report));
    let _ = writeln!(out, "{}", figures_table(&report.figures));
    if !report.figures.malformed_by_reason.is_empty() {
        let malformed = report
            .figures
            .malformed_by_reason
            .iter()
            .map(|(reason, count)| format!("{reason} {count}"))
            .collect::<Vec<_>>()
            .join(", ");
        let _ = writeln!(out, "malformed by reason: {malformed}");
    }
    out.push_str(&violations_text(report));
    for note in &report.notes {
        let _ = writeln!(out, "note: {note}");
    }
    let _ = writeln!(out, "{}", verdict_line(report));
    out
}

/// One row per check: expected, actual, PASS or FAIL.
fn checks_table(report: &AuditReport) -> Table {
    let mut table = Table::new();
    table.load_preset(UTF8_FULL_CONDENSED);
    table.set_header(["check", "expected", "actual", "result"]);
    for check in &report.checks {
        table.add_row([
            check.name.clone(),
            grouped(check.expected),
            grouped(check.actual),
            if check.passed { "PASS" } else { "FAIL" }.to_owned(),
        ]);
    }
    align_numbers_right(&mut table);
    table
}

/// The physical records beside the logical events, and each audited boundary's count.
fn figures_table(figures: &Figures) -> Table {
    let mut physical = Table::new();
    physical.load_preset(UTF8_FULL_CONDENSED);
    physical.set_header(["physical vs logical", "records", "sum of values"]);
    let mut rows: Vec<(&str, u64, Option<i128>)> = vec![
        ("input records", figures.input_records, None),
        (
            "valid input records (all attempts)",
            figures.valid_input_records,
            Some(figures.sum_valid_input_values),
        ),
        (
            "logical events (unique event_id)",
            figures.logical_events,
            Some(figures.sum_logical_values),
        ),
        (
            "duplicate deliveries (to drop)",
            figures.duplicate_deliveries,
            None,
        ),
        ("malformed inputs", figures.malformed_inputs, None),
        ("conflicts (reused event_id)", figures.conflicts, None),
        (
            "beyond the dedup horizon (in DLQ)",
            figures.beyond_dedup_horizon,
            None,
        ),
        (
            "overflowing a running total (in DLQ)",
            figures.total_overflows,
            None,
        ),
        ("dead-letter records", figures.dlq_records, None),
        (
            "output records",
            figures.output_records,
            Some(figures.output_sum),
        ),
    ];
    if let Some(count) = figures.outbox_domain_rows {
        rows.push(("committed domain rows (outbox)", count, None));
    }
    if let Some(count) = figures.outbox_events {
        rows.push(("  distinct events on the input", count, None));
    }
    if let Some(count) = figures.postgres_rows {
        rows.push(("rows in the sink table", count, figures.postgres_sum));
    }
    if let Some(count) = figures.entity_states {
        rows.push(("entity states in the state table", count, None));
    }
    if let Some(count) = figures.provider_effects {
        rows.push(("provider effects", count, figures.provider_sum));
    }
    if let Some(count) = figures.provider_retries_absorbed {
        rows.push(("  provider retries absorbed (same key)", count, None));
    }
    if let Some(count) = figures.provider_refused {
        rows.push(("  events refused, dead-lettered, not charged", count, None));
    }
    if let Some(count) = figures.provider_held {
        rows.push((
            "  events held, operation UNKNOWN (eosctl held)",
            count,
            None,
        ));
    }
    for (name, count, sum) in rows {
        physical.add_row([
            name.to_owned(),
            grouped(count),
            sum.map(grouped).unwrap_or_default(),
        ]);
    }
    align_numbers_right(&mut physical);
    physical
}

/// The second and third columns hold numbers.
fn align_numbers_right(table: &mut Table) {
    for column in [1, 2] {
        if let Some(column) = table.column_mut(column) {
            column.set_cell_alignment(CellAlignment::Right);
        }
    }
}

/// Each violated kind with its count and first examples.
fn violations_text(report: &AuditReport) -> String {
    let mut out = String::new();
    // Only the kinds this audit checked are in the map (the boundaries' only when audited).
    for (kind, detail) in &report.violations {
        if detail.count == 0 {
            continue;
        }
        let shown = detail
            .examples
            .iter()
            .take(TEXT_EXAMPLES)
            .cloned()
            .collect::<Vec<_>>()
            .join(", ");
        let more = if detail.count > TEXT_EXAMPLES as u64 {
            ", …"
        } else {
            ""
        };
        let _ = writeln!(out, "{kind} ({}): {shown}{more}", grouped(detail.count));
    }
    out
}

/// PASS with what was proven, or FAIL with how many checks failed.
fn verdict_line(report: &AuditReport) -> String {
    let figures = &report.figures;
    let failed = report.checks.iter().filter(|check| !check.passed).count();
    if report.passed {
        let boundaries = [
            figures.postgres_rows.map(|_| "the tables"),
            figures.provider_effects.map(|_| "the provider"),
        ]
        .into_iter()
        .flatten()
        .collect::<Vec<_>>();
        let downstream = if boundaries.is_empty() {
            String::new()
        } else {
            format!("; {} hold each output event once", boundaries.join(" and "))
        };
        let downstream = match figures.outbox_domain_rows {
            Some(rows) => format!(
                "; each of {} committed domain rows has one event on the input{downstream}",
                grouped(rows)
            ),
            None => downstream,
        };
        format!(
            "PASS: every input accounted for exactly once ({} inputs, {} logical events){downstream}",
            grouped(figures.input_records),
            grouped(figures.logical_events)
        )
    } else {
        format!("FAIL: {failed} checks failed")
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::audit::{Figures, Violation, ViolationDetail};

    #[test]
    fn groups_digits() {
        assert_eq!(grouped(0), "0");
        assert_eq!(grouped(999), "999");
        assert_eq!(grouped(1000), "1,000");
        assert_eq!(grouped(-1_234_567), "-1,234,567");
        assert_eq!(grouped(100_000), "100,000");
    }

    fn outcome(figures: Figures, boundaries: bool) -> AuditOutcome {
        AuditOutcome {
            outbox_domain_query: None,
            input_topic: "payments".into(),
            output_topic: "ledger".into(),
            dlq_topic: "payments.dlq".into(),
            sink_table: boundaries.then(|| "event_sink".into()),
            state_table: boundaries.then(|| "entity_state".into()),
            provider_operation_prefix: boundaries.then(|| "payments:".into()),
            report: AuditReport {
                passed: true,
                figures,
                checks: Vec::new(),
                violations: BTreeMap::from([(
                    Violation::UnexpectedEffect,
                    ViolationDetail::default(),
                )]),
                notes: Vec::new(),
            },
        }
    }

    #[test]
    fn boundary_figures_are_in_the_table_and_the_json_only_when_audited()
    -> Result<(), serde_json::Error> {
        let audited = outcome(
            Figures {
                postgres_rows: Some(1_200),
                postgres_sum: Some(-5),
                entity_states: Some(7),
                provider_effects: Some(1_200),
                provider_sum: Some(-5),
                provider_retries_absorbed: Some(31),
                ..Figures::default()
            },
            true,
        );
        let text = audit_text(&audited);
        for line in [
            "postgres: tables \"event_sink\" and \"entity_state\"",
            "rows in the sink table",
            "entity states in the state table",
            "provider effects",
            "provider retries absorbed",
            "1,200",
            "31",
            "the tables and the provider hold each output event once",
        ] {
            assert!(text.contains(line), "{line:?} in\n{text}");
        }
        let json = serde_json::to_value(&audited)?;
        assert_eq!(json["figures"]["provider_retries_absorbed"], 31);
        assert_eq!(json["figures"]["entity_states"], 7);
        assert_eq!(json["sink_table"], "event_sink");
        assert_eq!(json["violations"]["unexpected_effect"]["count"], 0);

        let topic_only = outcome(Figures::default(), false);
        let text = audit_text(&topic_only);
        assert!(!text.contains("provider"), "{text}");
        assert!(!text.contains("sink table"), "{text}");
        let json = serde_json::to_value(&topic_only)?;
        assert!(json.get("sink_table").is_none());
        assert!(json["figures"].get("postgres_rows").is_none());
        Ok(())
    }
}
