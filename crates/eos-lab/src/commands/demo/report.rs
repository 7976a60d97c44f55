//! The demo's report: one line per boundary from the audit's figures and violations, and its
//! text rendering (`--json` prints the serde form).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;

use crate::bench::record_format::RecordFormat;
use crate::commands::demo::args::{DemoArgs, DemoGuarantee};
use crate::commands::demo::payments_workload::PaymentsSummary;
use crate::commands::demo::relay_outage::RelayOutage;
use eosctl::report::grouped;

/// One line of the report.
#[derive(Debug, Clone, Serialize)]
pub struct ReportLine {
    pub name: String,
    /// `None`: a figure, not a check.
    pub passed: Option<bool>,
    pub detail: String,
}

#[derive(Debug, Serialize)]
pub struct DemoReport {
    pub guarantee: DemoGuarantee,
    /// The topics' record format (`--format`).
    pub format: RecordFormat,
    pub passed: bool,
    pub run_dir: String,
    pub topics: BTreeMap<&'static str, String>,
    pub faults: Vec<String>,
    /// Peak resident memory of each service over the run (all its incarnations), in KiB.
    pub peak_rss_kib: BTreeMap<String, u64>,
    /// An event that went through every service: `eosctl trace <it>` shows its trace.
    pub sample_event_id: String,
    /// How long the pipeline took to drain once the workload was done, against its bound.
    pub drain: Drain,
    /// The relay's outage (`--relay-outage`), when it had one.
    pub relay_outage: Option<RelayOutage>,
    pub lines: Vec<ReportLine>,
    pub traces: String,
    /// `eosctl audit --json` as it printed it.
    pub audit: Value,
}

/// The drain: from the moment the workload was done (the last payment answered, the last record
/// acknowledged) until each service was seen caught up, in pipeline order, each checked after
/// the one before it; the whole pipeline is drained when the last one is.
#[derive(Debug, Clone, Serialize)]
pub struct Drain {
    /// `--drain-timeout` as given: every stage must have caught up within it of the workload's
    /// end.
    pub bound: String,
    pub bound_seconds: f64,
    /// How long the workload itself took, from its start to its end (against the rate asked,
    /// the rate the machine gave).
    pub workload_seconds: f64,
    pub stages: Vec<DrainStage>,
    /// The last stage's time (`None`: some stage did not catch up within the bound).
    pub total_seconds: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct DrainStage {
    pub service: String,
    /// Seconds from the workload's end until it was seen caught up (`None`: not within the
    /// bound).
    pub caught_up_after_seconds: Option<f64>,
}

impl DrainStage {
    pub(super) fn new(service: &str, after: Option<Duration>) -> Self {
        Self {
            service: service.to_owned(),
            caught_up_after_seconds: after.map(|after| after.as_secs_f64()),
        }
    }
}

impl Drain {
    pub(super) fn new(bound: Duration, workload: Duration, stages: Vec<DrainStage>) -> Self {
        let total_seconds = stages
            .iter()
            .map(|stage| stage.caught_up_after_seconds)
            .collect::<Option<Vec<f64>>>()
            .map(|times| times.into_iter().fold(0.0, f64::max));
        Self {
            bound: humantime::format_duration(bound).to_string(),
            bound_seconds: bound.as_secs_f64(),
            workload_seconds: workload.as_secs_f64(),
            stages,
            total_seconds,
        }
    }

    pub fn drained(&self) -> bool {
        self.total_seconds.is_some()
    }

    /// `outbox-relay 1.2s, eos-processor 1.4s, sink-writer 2.0s`, or which did not catch up.
    fn stage_times(&self) -> String {
        let times: Vec<String> = self
            .stages
            .iter()
            .map(|stage| match stage.caught_up_after_seconds {
                Some(seconds) => format!("{} {seconds:.1}s", stage.service),
                None => format!("{} not caught up", stage.service),
            })
            .collect();
        times.join(", ")
    }
}

/// The report line of the drain and of the services' exit.
const DRAIN_LINE: &str = "pipeline drained, services stopped";

/// `4.2s`.
fn seconds(seconds: f64) -> String {
    format!("{seconds:.1}s")
}

pub(super) fn figure(audit: &Value, name: &str) -> i64 {
    audit["figures"][name].as_i64().unwrap_or_default()
}

fn violations(audit: &Value, kinds: &[&str]) -> (u64, Vec<String>) {
    let mut total = 0;
    let mut named = Vec::new();
    for kind in kinds {
        let count = audit["violations"][kind]["count"]
            .as_u64()
            .unwrap_or_default();
        if count > 0 {
            total += count;
            named.push(format!("{kind} {count}"));
        }
    }
    (total, named)
}

fn check_line(name: &str, audit: &Value, kinds: &[&str], figures: String) -> ReportLine {
    let (count, named) = violations(audit, kinds);
    ReportLine {
        name: name.to_owned(),
        passed: Some(count == 0),
        detail: if count == 0 {
            figures
        } else {
            format!("{figures}; {}", named.join(", "))
        },
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) fn build_report(
    args: &DemoArgs,
    run_dir: &Path,
    [input, output, sample_event]: [&str; 3],
    faults: Vec<String>,
    payments: Option<&PaymentsSummary>,
    audit: Value,
    audit_code: i32,
    (went_unknown, reconciled): (i64, i64),
    (drain, stopped_cleanly): (Drain, bool),
    metrics: ReportLine,
) -> DemoReport {
    let mut lines = payments
        .map(|p| payments_lines(p, &audit))
        .unwrap_or_default();
    lines.extend(processor_lines(&audit));
    lines.extend(sink_lines(&audit));
    lines.push(ReportLine {
        name: "UNKNOWNs reconciled".into(),
        passed: Some(reconciled == went_unknown),
        detail: format!(
            "{} of {} ambiguous provider outcomes settled by asking the provider with the same key",
            grouped(reconciled),
            grouped(went_unknown)
        ),
    });
    lines.push(drain_line(&drain, stopped_cleanly, run_dir));
    lines.push(metrics);
    let passed = audit_code == 0 && lines.iter().all(|line| line.passed != Some(false));
    let traces = traces_hint(&audit, sample_event, payments.is_some());
    DemoReport {
        guarantee: args.guarantee,
        format: args.format,
        passed,
        run_dir: run_dir.display().to_string(),
        topics: BTreeMap::from([("input", input.to_owned()), ("output", output.to_owned())]),
        faults,
        peak_rss_kib: BTreeMap::new(),
        sample_event_id: sample_event.to_owned(),
        drain,
        relay_outage: None,
        lines,
        traces,
        audit,
    }
}

/// An audit figure, grouped by thousands.
fn grouped_figure(audit: &Value, name: &str) -> String {
    grouped(figure(audit, name))
}

/// The payments API's promises and the outbox's one event per committed row.
fn payments_lines(payments: &PaymentsSummary, audit: &Value) -> Vec<ReportLine> {
    let g = |name: &str| grouped_figure(audit, name);
    let n = |count: u64| grouped(count as i64);
    let api = ReportLine {
        name: "payments-api".into(),
        passed: Some(payments.broken_promise_count == 0),
        detail: if payments.broken_promise_count == 0 {
            format!(
                "{} payments created; {} resends answered from the key, {} reused keys and {} \
                 malformed requests refused with nothing written; {} retries after no answer",
                n(payments.created),
                n(payments.replayed),
                n(payments.key_reuse_refused),
                n(payments.malformed_refused),
                n(payments.retried),
            )
        } else {
            format!(
                "{} answers broke the API's promises, e.g. {}",
                n(payments.broken_promise_count),
                payments.broken_promises.join("; ")
            )
        },
    };
    let outbox = check_line(
        "outbox → topic",
        audit,
        &[
            "domain_row_without_event",
            "event_published_twice",
            "event_without_domain_row",
        ],
        format!(
            "{} committed payment rows, {} events on the input topic: one each",
            g("outbox_domain_rows"),
            g("outbox_events")
        ),
    );
    vec![api, outbox]
}

/// What the processor read and wrote: inputs, duplicates, dead letters, running totals.
fn processor_lines(audit: &Value) -> Vec<ReportLine> {
    let g = |name: &str| grouped_figure(audit, name);
    let by_reason = audit["figures"]["malformed_by_reason"]
        .as_object()
        .map(|reasons| {
            reasons
                .iter()
                .map(|(reason, n)| format!("{reason} {}", n.as_i64().unwrap_or_default()))
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_default();
    let dead_letters = if by_reason.is_empty() {
        format!(
            "{} (event_id_conflict {})",
            g("dlq_records"),
            g("conflicts")
        )
    } else {
        format!(
            "{} ({by_reason}; event_id_conflict {})",
            g("dlq_records"),
            g("conflicts")
        )
    };
    vec![
        ReportLine {
            name: "physical attempts".into(),
            passed: None,
            detail: format!(
                "{} records on the input topic ({} valid)",
                g("input_records"),
                g("valid_input_records")
            ),
        },
        check_line(
            "logical inputs",
            audit,
            &["missing_output", "unexpected_output", "content_mismatch"],
            format!(
                "{} events by event_id, {} in the output",
                g("logical_events"),
                g("output_records")
            ),
        ),
        check_line(
            "duplicates suppressed",
            audit,
            &["duplicated_output", "two_outcomes"],
            format!(
                "{} re-deliveries produced no second output or outcome",
                g("duplicate_deliveries")
            ),
        ),
        check_line(
            "dead letters by reason",
            audit,
            &[
                "bad_input_in_output",
                "conflict_in_output",
                "valid_event_in_dlq",
                "bad_input_missing_from_dlq",
                "conflict_missing_from_dlq",
                "overflow_missing_from_dlq",
                "overflow_in_output",
                "wrong_dlq_reason",
                "dlq_not_original_bytes",
                "duplicated_in_dlq",
                "unexpected_dlq_record",
            ],
            dead_letters,
        ),
        check_line(
            "running totals",
            audit,
            &["wrong_entity_total", "order_violation"],
            format!("{} entities, per-entity totals and order", g("entities")),
        ),
    ]
}

/// What the sink wrote: rows in PostgreSQL and the provider's effects.
fn sink_lines(audit: &Value) -> Vec<ReportLine> {
    let g = |name: &str| grouped_figure(audit, name);
    vec![
        check_line(
            "rows in PostgreSQL",
            audit,
            &[
                "missing_row",
                "duplicated_row",
                "unexpected_row",
                "row_mismatch",
                "stale_state",
                "state_ahead",
            ],
            format!(
                "{} event_sink rows, {} entity_state rows at their latest version",
                g("postgres_rows"),
                g("entity_states")
            ),
        ),
        check_line(
            "provider effects",
            audit,
            &[
                "missing_effect",
                "duplicated_effect",
                "unexpected_effect",
                "effect_mismatch",
                "refused_but_applied",
            ],
            format!(
                "{} charges, one per operation id ({} repeated requests absorbed by the key; {} \
                 refused and dead-lettered; {} held for an operator)",
                g("provider_effects"),
                g("provider_retries_absorbed"),
                g("provider_refused"),
                g("provider_held")
            ),
        ),
    ]
}

/// Whether every service caught up within the bound and then exited 0 on SIGTERM.
fn drain_line(drain: &Drain, stopped_cleanly: bool, run_dir: &Path) -> ReportLine {
    let drained = if drain.drained() {
        format!(
            "every service caught up within {} of the workload's end ({}; --drain-timeout {}); \
             the workload took {}",
            drain.total_seconds.map(seconds).unwrap_or_default(),
            drain.stage_times(),
            drain.bound,
            seconds(drain.workload_seconds)
        )
    } else {
        format!(
            "not drained within --drain-timeout {} of the workload's end ({})",
            drain.bound,
            drain.stage_times()
        )
    };
    ReportLine {
        name: DRAIN_LINE.into(),
        passed: Some(drain.drained() && stopped_cleanly),
        detail: if stopped_cleanly {
            format!("{drained}; every service exited 0 on SIGTERM")
        } else {
            format!(
                "{drained}; some service did not exit 0 on SIGTERM: see the logs in {}",
                run_dir.display()
            )
        },
    }
}

/// Where to see an event's trace, and a duplicated event worth looking at.
fn traces_hint(audit: &Value, sample_event: &str, from_payments_api: bool) -> String {
    let duplicated = audit["violations"]["duplicated_output"]["examples"][0]
        .as_str()
        .map(str::to_owned);
    let first_span = if from_payments_api {
        "payments-api → outbox-relay"
    } else {
        "eosctl produce"
    };
    format!(
        "with OTEL_EXPORTER_OTLP_ENDPOINT set (e.g. Jaeger's OTLP port, http://127.0.0.1:4317), \
         every service exports its spans; in Jaeger search by tag event_id={sample_event} to see \
         {first_span} → eos-processor → sink-writer → dedup-service → provider-sim in one trace{}",
        duplicated
            .map(|s| format!("; a duplicated one to look at: {s}"))
            .unwrap_or_default()
    )
}

pub fn report_text(report: &DemoReport) -> String {
    let mut text = String::new();
    let _ = writeln!(
        text,
        "\n== eos-suite demo report ({}{})",
        report.guarantee.as_str(),
        match report.format {
            RecordFormat::Json => String::new(),
            format => format!(", {format}"),
        }
    );
    let _ = writeln!(text, "   faults: {}", report.faults.join("; "));
    if !report.peak_rss_kib.is_empty() {
        let peaks: Vec<String> = report
            .peak_rss_kib
            .iter()
            .map(|(name, kib)| format!("{name} {:.0} MiB", *kib as f64 / 1024.0))
            .collect();
        let _ = writeln!(text, "   peak RSS: {}", peaks.join(", "));
    }
    let width = report.lines.iter().map(|l| l.name.len()).max().unwrap_or(0);
    for line in &report.lines {
        let mark = match line.passed {
            Some(true) => "PASS",
            Some(false) => "FAIL",
            None => "    ",
        };
        let _ = writeln!(text, "   {mark}  {:width$}  {}", line.name, line.detail);
    }
    let _ = writeln!(text, "   traces: {}", report.traces);
    let _ = writeln!(text, "   run directory: {}", report.run_dir);
    let drain = &report.drain;
    let drained = match drain.total_seconds {
        Some(total) => format!(
            "drained {} after the workload ({}), within --drain-timeout {}",
            seconds(total),
            drain.stage_times(),
            drain.bound
        ),
        None => format!(
            "NOT drained within --drain-timeout {} ({})",
            drain.bound,
            drain.stage_times()
        ),
    };
    if report.passed {
        let outbox = if report
            .lines
            .iter()
            .any(|line| line.name == "outbox → topic")
        {
            "outbox, "
        } else {
            ""
        };
        let _ = writeln!(
            text,
            "RESULT: PASS: exactly one effect per event at every boundary ({outbox}topics, \
             PostgreSQL, provider); {drained}"
        );
    } else if report.guarantee == DemoGuarantee::AtLeastOnce {
        let _ = writeln!(
            text,
            "RESULT: FAIL: not exact. This is what at-least-once does under kills: the ledger \
             topic holds duplicates and wrong running totals (the idempotent tables and the \
             provider's key absorb them downstream, where they can); the audit names each one; \
             {drained}"
        );
    } else {
        let inexact = report
            .lines
            .iter()
            .any(|line| line.passed == Some(false) && line.name != DRAIN_LINE);
        let what = if inexact {
            "not exact at some boundary (see FAIL lines)"
        } else {
            "every boundary exact, but see the FAIL lines"
        };
        let _ = writeln!(text, "RESULT: FAIL: {what}; {drained}");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(passed: bool, drain: Drain) -> DemoReport {
        DemoReport {
            guarantee: DemoGuarantee::ExactlyOnce,
            format: RecordFormat::Json,
            passed,
            run_dir: "/runs/1".into(),
            topics: BTreeMap::new(),
            faults: Vec::new(),
            peak_rss_kib: BTreeMap::new(),
            sample_event_id: "evt-1-0".into(),
            lines: vec![ReportLine {
                name: DRAIN_LINE.into(),
                passed: Some(passed),
                detail: String::new(),
            }],
            drain,
            relay_outage: None,
            traces: String::new(),
            audit: Value::Null,
        }
    }

    #[test]
    fn the_result_gives_the_drain_time_and_names_its_bound() {
        let secs = Duration::from_secs_f64;
        let drain = Drain::new(
            Duration::from_secs(300),
            secs(10.0),
            vec![
                DrainStage::new("outbox-relay", Some(secs(1.24))),
                DrainStage::new("eos-processor", Some(secs(1.5))),
                DrainStage::new("sink-writer", Some(secs(2.04))),
            ],
        );
        assert_eq!(drain.total_seconds, Some(2.04));
        let text = report_text(&report(true, drain));
        assert!(
            text.contains(
                "RESULT: PASS: exactly one effect per event at every boundary (topics, \
                 PostgreSQL, provider); drained 2.0s after the workload (outbox-relay 1.2s, \
                 eos-processor 1.5s, sink-writer 2.0s), within --drain-timeout 5m"
            ),
            "{text}"
        );
        let stalled = Drain::new(
            Duration::from_secs(120),
            secs(10.0),
            vec![
                DrainStage::new("outbox-relay", None),
                DrainStage::new("eos-processor", Some(secs(120.0))),
            ],
        );
        assert_eq!(stalled.total_seconds, None);
        let text = report_text(&report(false, stalled));
        assert!(
            text.contains(
                "RESULT: FAIL: every boundary exact, but see the FAIL lines; NOT drained within \
                 --drain-timeout 2m (outbox-relay not caught up, eos-processor 120.0s)"
            ),
            "{text}"
        );
    }
}
