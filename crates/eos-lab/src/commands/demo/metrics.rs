//! Every service's own counters, scraped from its /metrics at the end of the run and compared
//! with what the audit counted.

use serde_json::Value;

use crate::commands::demo::report::{ReportLine, figure};
use crate::commands::demo::scrape::{Scraped, metric_sum};

/// Whether each service's own counters agree with what the audit counted. Counters start at
/// zero in every process, so they add up only in a run without kills.
pub(super) fn metrics_line(
    scraped: Option<&Scraped>,
    audit: &Value,
    (_, reconciled): (i64, i64),
    killed: bool,
) -> ReportLine {
    let name = "metrics agree with the audit".to_owned();
    let Some(scraped) = scraped else {
        return ReportLine {
            name,
            passed: None,
            detail: "not scraped: the run did not complete".into(),
        };
    };
    if killed {
        return ReportLine {
            name,
            passed: None,
            detail: "not compared: counters restart with every SIGKILLed process (run with \
                     --processor-kills 0 --sink-kills 0 to compare)"
                .into(),
        };
    }
    let text = |t: &Option<String>| t.clone().unwrap_or_default();
    let (processor, sink, dedup, provider) = (
        text(&scraped.processor),
        text(&scraped.sink),
        text(&scraped.dedup),
        text(&scraped.provider),
    );
    let acquired = metric_sum(
        &dedup,
        "eos_dedup_begin_outcomes_total",
        &["outcome=\"acquired\""],
    );
    let comparisons = [
        (
            "processor duplicates dropped = re-deliveries",
            metric_sum(&processor, "eos_processor_duplicates_dropped_total", &[]),
            figure(audit, "duplicate_deliveries"),
        ),
        (
            "processor dead letters = DLQ records",
            metric_sum(&processor, "eos_processor_dead_letters_total", &[]),
            figure(audit, "dlq_records"),
        ),
        (
            "processor outputs = output records",
            metric_sum(&processor, "eos_processor_records_out_total", &[]),
            figure(audit, "output_records"),
        ),
        (
            "sink rows written = event_sink rows",
            metric_sum(
                &sink,
                "eos_sink_rows_written_total",
                &["target=\"event_sink\""],
            ),
            figure(audit, "postgres_rows"),
        ),
        (
            "sink charges = provider effects",
            metric_sum(
                &sink,
                "eos_sink_provider_effects_total",
                &["outcome=\"charged\""],
            ),
            figure(audit, "provider_effects"),
        ),
        (
            "sink provider calls = dedup ACQUIRED",
            metric_sum(&sink, "eos_sink_provider_calls_total", &[]),
            acquired,
        ),
        (
            "dedup UNKNOWNs resolved = reconciled",
            metric_sum(&dedup, "eos_dedup_unknown_resolved_total", &[]),
            reconciled,
        ),
        (
            "provider-sim effects = provider effects",
            metric_sum(&provider, "eos_provider_effects_total", &[]),
            figure(audit, "provider_effects"),
        ),
    ];
    let wrong: Vec<String> = comparisons
        .iter()
        .filter(|(_, metric, audited)| metric != audited)
        .map(|(what, metric, audited)| format!("{what}: {metric} vs {audited}"))
        .collect();
    ReportLine {
        name,
        passed: Some(wrong.is_empty()),
        detail: if wrong.is_empty() {
            format!(
                "{} counters across eos-processor, sink-writer, dedup-service and provider-sim equal \
                 the audit's figures",
                comparisons.len()
            )
        } else {
            wrong.join("; ")
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PROCESSOR: &str = "# TYPE eos_processor_dead_letters_total counter
eos_processor_dead_letters_total{reason=\"malformed_json\"} 3
eos_processor_dead_letters_total{reason=\"event_id_conflict\"} 2
eos_processor_duplicates_dropped_total 100
eos_processor_records_out_total 2000
";

    fn audit(duplicates: i64) -> Value {
        serde_json::json!({"figures": {
            "duplicate_deliveries": duplicates, "dlq_records": 5, "output_records": 2000,
            "postgres_rows": 2000, "provider_effects": 2000,
        }})
    }

    fn scraped() -> Scraped {
        Scraped {
            processor: Some(PROCESSOR.into()),
            sink: Some(
                "eos_sink_rows_written_total{target=\"event_sink\"} 2000\n\
                 eos_sink_rows_written_total{target=\"entity_state\"} 100\n\
                 eos_sink_provider_effects_total{target=\"p\",outcome=\"charged\"} 2000\n\
                 eos_sink_provider_calls_total{target=\"p\",outcome=\"applied\"} 1990\n\
                 eos_sink_provider_calls_total{target=\"p\",outcome=\"ambiguous\"} 10\n"
                    .into(),
            ),
            dedup: Some(
                "eos_dedup_begin_outcomes_total{outcome=\"acquired\"} 2000\n\
                 eos_dedup_begin_outcomes_total{outcome=\"unknown\"} 30\n\
                 eos_dedup_unknown_resolved_total{outcome=\"SUCCEEDED\"} 10\n"
                    .into(),
            ),
            provider: Some("eos_provider_effects_total 2000\n".into()),
        }
    }

    #[test]
    fn metric_sum_adds_the_series_that_match_the_labels() {
        assert_eq!(
            metric_sum(PROCESSOR, "eos_processor_dead_letters_total", &[]),
            5
        );
        assert_eq!(
            metric_sum(
                PROCESSOR,
                "eos_processor_dead_letters_total",
                &["reason=\"malformed_json\""]
            ),
            3
        );
        assert_eq!(
            metric_sum(PROCESSOR, "eos_processor_records_out_total", &[]),
            2000
        );
        assert_eq!(metric_sum(PROCESSOR, "eos_processor_records_out", &[]), 0);
    }

    #[test]
    fn metrics_line_passes_only_when_every_counter_equals_the_audit() {
        let line = metrics_line(Some(&scraped()), &audit(100), (10, 10), false);
        assert_eq!(line.passed, Some(true), "{}", line.detail);
        let line = metrics_line(Some(&scraped()), &audit(99), (10, 10), false);
        assert_eq!(line.passed, Some(false));
        assert!(
            line.detail
                .contains("processor duplicates dropped = re-deliveries: 100 vs 99"),
            "{}",
            line.detail
        );
        let line = metrics_line(Some(&scraped()), &audit(100), (11, 11), false);
        assert_eq!(line.passed, Some(false), "{}", line.detail);
    }

    #[test]
    fn metrics_are_not_compared_after_kills() {
        let line = metrics_line(Some(&scraped()), &audit(99), (10, 10), true);
        assert_eq!(line.passed, None);
    }
}
