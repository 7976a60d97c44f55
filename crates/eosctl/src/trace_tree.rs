//! The traces of one event as trees of spans, for `eosctl trace`: each span under its parent,
//! with its service, name, duration, attempt number and status; printed as an indented tree or
//! as stable JSON. Pure: the spans come from [`crate::jaeger`].
//!
//! Attempt numbers: a span tagged `attempt` or `eos.attempt` has that number. Otherwise, when a
//! parent has several children of the same service and name — the same step done again, e.g. a
//! record processed again after a SIGKILL or a re-delivery, a second `Begin` after an UNKNOWN —
//! they are numbered 1, 2, ... by start time. Children with the parent's own service and name
//! are its repeats (`eosctl produce` parents a re-delivery on the first send): the parent is
//! attempt 1 and they follow. A step done once has no number.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;

use serde::Serialize;
use serde_json::Value;

/// Span tags that carry an explicit attempt number.
const ATTEMPT_TAGS: [&str; 2] = ["eos.attempt", "attempt"];
/// Span tags that say what the step decided or how it ended, in the order they are looked for.
const OUTCOME_TAGS: [&str; 2] = ["eos.decision", "eos.outcome"];
/// The tag `eosctl produce` puts on a re-delivery of an event (the same record sent again).
const REDELIVERY_TAG: &str = "eos.redelivery";

/// One span as found in Jaeger, its service resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct SpanRecord {
    pub trace_id: String,
    pub span_id: String,
    /// The span's parent in its trace (`CHILD_OF`), if it has one.
    pub parent_span_id: Option<String>,
    pub service: String,
    pub name: String,
    pub start_unix_micros: u64,
    pub duration_micros: u64,
    pub tags: BTreeMap<String, Value>,
}

/// Every trace of one event id.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EventTraces {
    pub event_id: String,
    /// Oldest first.
    pub traces: Vec<TraceTree>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TraceTree {
    pub trace_id: String,
    pub span_count: usize,
    /// The services with spans in the trace, in the order of their first span.
    pub services: Vec<String>,
    /// Spans without a parent in the trace, oldest first: the trace's root, and any span whose
    /// parent is not in Jaeger (`parent_missing`).
    pub roots: Vec<SpanNode>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SpanStatus {
    Ok,
    Error,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SpanNode {
    pub span_id: String,
    pub parent_span_id: Option<String>,
    /// The span names a parent that Jaeger does not have (e.g. lost with a SIGKILLed process
    /// before it exported it).
    pub parent_missing: bool,
    pub service: String,
    pub name: String,
    pub start_unix_micros: u64,
    pub duration_micros: u64,
    /// See the module documentation.
    pub attempt: Option<u32>,
    pub status: SpanStatus,
    /// The error's description, for a span with status error.
    pub error: Option<String>,
    /// What the step decided or how it ended (`eos.decision`, `eos.outcome`), or `redelivery`.
    pub outcome: Option<String>,
    /// Oldest first.
    pub children: Vec<SpanNode>,
}

impl SpanNode {
    /// This span and all its descendants, depth first.
    pub fn walk(&self) -> Vec<&SpanNode> {
        let mut out = vec![self];
        for child in &self.children {
            out.extend(child.walk());
        }
        out
    }
}

/// Groups the spans into trees, one per trace.
pub fn build(event_id: &str, spans: Vec<SpanRecord>) -> EventTraces {
    let mut by_trace: BTreeMap<String, Vec<SpanRecord>> = BTreeMap::new();
    for span in spans {
        by_trace
            .entry(span.trace_id.clone())
            .or_default()
            .push(span);
    }
    let mut traces: Vec<TraceTree> = by_trace
        .into_iter()
        .map(|(trace_id, spans)| build_trace(trace_id, spans))
        .collect();
    traces.sort_by_key(|t| {
        (
            t.roots.iter().map(|r| r.start_unix_micros).min(),
            t.trace_id.clone(),
        )
    });
    EventTraces {
        event_id: event_id.to_owned(),
        traces,
    }
}

fn build_trace(trace_id: String, mut spans: Vec<SpanRecord>) -> TraceTree {
    spans.sort_by(|a, b| (a.start_unix_micros, &a.span_id).cmp(&(b.start_unix_micros, &b.span_id)));
    spans.dedup_by(|a, b| a.span_id == b.span_id);
    let ids: HashSet<&str> = spans.iter().map(|s| s.span_id.as_str()).collect();
    // The parent of each span within this trace; a self-reference counts as none.
    let parent_of = |span: &SpanRecord| {
        span.parent_span_id
            .as_deref()
            .filter(|p| *p != span.span_id && ids.contains(p))
            .map(str::to_owned)
    };
    let mut children: HashMap<Option<String>, Vec<usize>> = HashMap::new();
    for (index, span) in spans.iter().enumerate() {
        children.entry(parent_of(span)).or_default().push(index);
    }
    let attempts = attempt_numbers(&spans);

    let mut services: Vec<String> = Vec::new();
    for span in &spans {
        if !services.contains(&span.service) {
            services.push(span.service.clone());
        }
    }

    let mut visited = vec![false; spans.len()];
    let build = Builder {
        spans: &spans,
        children: &children,
        attempts: &attempts,
    };
    let mut roots: Vec<SpanNode> = children
        .get(&None)
        .map(|top| top.iter().map(|&i| build.node(i, &mut visited)).collect())
        .unwrap_or_default();
    // Spans in a parent cycle are reachable from no root; show them rather than drop them.
    for index in 0..spans.len() {
        if !visited[index] {
            roots.push(build.node(index, &mut visited));
        }
    }
    roots.sort_by(|a, b| (a.start_unix_micros, &a.span_id).cmp(&(b.start_unix_micros, &b.span_id)));
    TraceTree {
        trace_id,
        span_count: spans.len(),
        services,
        roots,
    }
}

/// Attempt numbers by span index: explicit tags first, then repeated siblings.
///
/// Siblings are spans naming the same parent, even one Jaeger does not have: two spans whose
/// parents were both lost are not known to be the same step, so they are not numbered together.
fn attempt_numbers(spans: &[SpanRecord]) -> Vec<Option<u32>> {
    let index_of: HashMap<&str, usize> = spans
        .iter()
        .enumerate()
        .map(|(i, s)| (s.span_id.as_str(), i))
        .collect();
    let mut by_parent: HashMap<Option<&str>, Vec<usize>> = HashMap::new();
    for (i, span) in spans.iter().enumerate() {
        let parent = span
            .parent_span_id
            .as_deref()
            .filter(|p| *p != span.span_id);
        by_parent.entry(parent).or_default().push(i);
    }
    let mut attempts: Vec<Option<u32>> = spans.iter().map(explicit_attempt).collect();
    for (parent, siblings) in by_parent {
        let parent = parent.and_then(|p| index_of.get(p).copied());
        // Siblings are in start order already (spans are sorted and indices ascend).
        let mut same_step: BTreeMap<(&str, &str), Vec<usize>> = BTreeMap::new();
        for i in siblings {
            same_step
                .entry((&spans[i].service, &spans[i].name))
                .or_default()
                .push(i);
        }
        for ((service, name), mut repeated) in same_step {
            if let Some(p) =
                parent.filter(|&p| spans[p].service == service && spans[p].name == name)
            {
                repeated.insert(0, p);
            }
            if repeated.len() < 2 {
                continue;
            }
            for (n, &i) in repeated.iter().enumerate() {
                attempts[i] = attempts[i].or(u32::try_from(n + 1).ok());
            }
        }
    }
    attempts
}

fn explicit_attempt(span: &SpanRecord) -> Option<u32> {
    ATTEMPT_TAGS
        .iter()
        .find_map(|key| match span.tags.get(*key)? {
            Value::Number(n) => n.as_u64().and_then(|n| u32::try_from(n).ok()),
            Value::String(s) => s.parse().ok(),
            _ => None,
        })
}

struct Builder<'a> {
    spans: &'a [SpanRecord],
    children: &'a HashMap<Option<String>, Vec<usize>>,
    attempts: &'a [Option<u32>],
}

impl Builder<'_> {
    fn node(&self, index: usize, visited: &mut [bool]) -> SpanNode {
        visited[index] = true;
        let span = &self.spans[index];
        let children = self
            .children
            .get(&Some(span.span_id.clone()))
            .map(|kids| {
                kids.iter()
                    .filter(|&&k| !visited[k])
                    .copied()
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default()
            .into_iter()
            .map(|k| self.node(k, visited))
            .collect();
        let (status, error) = status_of(span);
        SpanNode {
            span_id: span.span_id.clone(),
            parent_span_id: span.parent_span_id.clone(),
            parent_missing: span
                .parent_span_id
                .as_deref()
                .is_some_and(|p| p != span.span_id && !self.spans.iter().any(|s| s.span_id == p)),
            service: span.service.clone(),
            name: span.name.clone(),
            start_unix_micros: span.start_unix_micros,
            duration_micros: span.duration_micros,
            attempt: self.attempts[index],
            status,
            error,
            outcome: outcome_of(span),
            children,
        }
    }
}

/// Error when Jaeger marked the span (`error=true`, from OpenTelemetry's status ERROR) or the
/// OpenTelemetry status code tag says so.
fn status_of(span: &SpanRecord) -> (SpanStatus, Option<String>) {
    let error_tag = matches!(span.tags.get("error"), Some(Value::Bool(true)))
        || matches!(span.tags.get("error"), Some(Value::String(s)) if s == "true");
    let status_code_error =
        matches!(span.tags.get("otel.status_code"), Some(Value::String(s)) if s == "ERROR");
    if error_tag || status_code_error {
        let description = span
            .tags
            .get("otel.status_description")
            .and_then(Value::as_str)
            .map(str::to_owned);
        (SpanStatus::Error, description)
    } else {
        (SpanStatus::Ok, None)
    }
}

fn outcome_of(span: &SpanRecord) -> Option<String> {
    OUTCOME_TAGS
        .iter()
        .find_map(|key| match span.tags.get(*key)? {
            Value::String(s) => Some(s.clone()),
            Value::Null => None,
            other => Some(other.to_string()),
        })
        .or_else(|| {
            matches!(span.tags.get(REDELIVERY_TAG), Some(Value::Bool(true)))
                .then(|| "redelivery".to_owned())
        })
}

/// A duration for people: `86µs`, `43.1ms`, `1.35s`.
pub fn format_micros(micros: u64) -> String {
    if micros < 1_000 {
        format!("{micros}µs")
    } else if micros < 1_000_000 {
        format!("{:.1}ms", micros as f64 / 1_000.0)
    } else {
        format!("{:.2}s", micros as f64 / 1_000_000.0)
    }
}

/// The traces as indented trees, one line per span:
/// `<tree> <service>: <span name>   <duration>  attempt <n>  ok|error  <outcome>`.
pub fn render_text(traces: &EventTraces) -> String {
    let mut out = String::new();
    let count = traces.traces.len();
    let _ = writeln!(
        out,
        "event {}: {count} trace{}",
        traces.event_id,
        if count == 1 { "" } else { "s" }
    );
    for trace in &traces.traces {
        let _ = writeln!(
            out,
            "\ntrace {}  {} span{}  services: {}",
            trace.trace_id,
            trace.span_count,
            if trace.span_count == 1 { "" } else { "s" },
            trace.services.join(", ")
        );
        let mut rows: Vec<(String, &SpanNode)> = Vec::new();
        for root in &trace.roots {
            collect_rows(root, String::new(), None, &mut rows);
        }
        let width = rows
            .iter()
            .map(|(label, _)| label.chars().count())
            .max()
            .unwrap_or(0);
        for (label, node) in rows {
            let attempt = node
                .attempt
                .map(|n| format!("attempt {n}"))
                .unwrap_or_default();
            let status = match node.status {
                SpanStatus::Ok => "ok",
                SpanStatus::Error => "error",
            };
            let mut notes: Vec<String> = Vec::new();
            if let Some(outcome) = &node.outcome {
                notes.push(outcome.clone());
            }
            if let Some(error) = &node.error {
                notes.push(error.clone());
            }
            if node.parent_missing {
                notes.push(format!(
                    "(parent span {} is not in Jaeger)",
                    node.parent_span_id.as_deref().unwrap_or("?")
                ));
            }
            let line = format!(
                "{label:<width$}  {:>8}  {attempt:<10} {status:<5}  {}",
                format_micros(node.duration_micros),
                notes.join("  ")
            );
            let _ = writeln!(out, "{}", line.trim_end());
        }
    }
    out
}

/// Depth-first rows with their tree-drawing prefix. `last` is None for a root.
fn collect_rows<'a>(
    node: &'a SpanNode,
    indent: String,
    last: Option<bool>,
    rows: &mut Vec<(String, &'a SpanNode)>,
) {
    let branch = match last {
        None => "",
        Some(true) => "└─ ",
        Some(false) => "├─ ",
    };
    rows.push((
        format!("{indent}{branch}{}: {}", node.service, node.name),
        node,
    ));
    let child_indent = match last {
        None => indent,
        Some(true) => format!("{indent}   "),
        Some(false) => format!("{indent}│  "),
    };
    let count = node.children.len();
    for (i, child) in node.children.iter().enumerate() {
        collect_rows(child, child_indent.clone(), Some(i + 1 == count), rows);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jaeger::parse_traces_answer;

    /// A real `/api/traces?service=eosctl&tags={"event_id":"evt-778-2"}` answer from a demo run
    /// (span tags trimmed to the ones read here): the event was sent three times (two
    /// re-deliveries), processed three times (one emit, two duplicates), written once, and its
    /// charge's answer was lost, so the charge went UNKNOWN, was reconciled and begun again.
    const RECORDED_ANSWER: &str = r#"{"data":[{"traceID":"cd7fcfffd182b3d2857caa511fb5bc2d","spans":[{"traceID":"cd7fcfffd182b3d2857caa511fb5bc2d","spanID":"80cfe97bbb995acf","operationName":"eosctl produce","references":[],"startTime":1796079450088369,"duration":498880,"tags":[{"key":"event_id","type":"string","value":"evt-778-2"},{"key":"span.kind","type":"string","value":"producer"}],"logs":[],"processID":"p3"},
{"traceID":"cd7fcfffd182b3d2857caa511fb5bc2d","spanID":"a68945f0daa3aa3a","operationName":"eosctl produce","references":[{"refType":"CHILD_OF","traceID":"cd7fcfffd182b3d2857caa511fb5bc2d","spanID":"80cfe97bbb995acf"}],"startTime":1796079450193348,"duration":394016,"tags":[{"key":"eos.redelivery","type":"bool","value":true},{"key":"event_id","type":"string","value":"evt-778-2"},{"key":"span.kind","type":"string","value":"producer"}],"logs":[],"processID":"p3"},
{"traceID":"cd7fcfffd182b3d2857caa511fb5bc2d","spanID":"aba63cb8c8e1d936","operationName":"eosctl produce","references":[{"refType":"CHILD_OF","traceID":"cd7fcfffd182b3d2857caa511fb5bc2d","spanID":"80cfe97bbb995acf"}],"startTime":1796079450278358,"duration":309013,"tags":[{"key":"eos.redelivery","type":"bool","value":true},{"key":"event_id","type":"string","value":"evt-778-2"},{"key":"span.kind","type":"string","value":"producer"}],"logs":[],"processID":"p3"},
{"traceID":"cd7fcfffd182b3d2857caa511fb5bc2d","spanID":"f7df8c93853de56d","operationName":"eos-processor process","references":[{"refType":"CHILD_OF","traceID":"cd7fcfffd182b3d2857caa511fb5bc2d","spanID":"80cfe97bbb995acf"}],"startTime":1796079451141386,"duration":59,"tags":[{"key":"eos.decision","type":"string","value":"emit"},{"key":"event_id","type":"string","value":"evt-778-2"},{"key":"span.kind","type":"string","value":"consumer"}],"logs":[],"processID":"p5"},
{"traceID":"cd7fcfffd182b3d2857caa511fb5bc2d","spanID":"f2e529afb305f832","operationName":"eos-processor process","references":[{"refType":"CHILD_OF","traceID":"cd7fcfffd182b3d2857caa511fb5bc2d","spanID":"80cfe97bbb995acf"}],"startTime":1796079451142256,"duration":34,"tags":[{"key":"eos.decision","type":"string","value":"duplicate"},{"key":"event_id","type":"string","value":"evt-778-2"},{"key":"span.kind","type":"string","value":"consumer"}],"logs":[],"processID":"p5"},
{"traceID":"cd7fcfffd182b3d2857caa511fb5bc2d","spanID":"96bfd84e7ce8d2eb","operationName":"eos-processor process","references":[{"refType":"CHILD_OF","traceID":"cd7fcfffd182b3d2857caa511fb5bc2d","spanID":"80cfe97bbb995acf"}],"startTime":1796079451142574,"duration":34,"tags":[{"key":"eos.decision","type":"string","value":"duplicate"},{"key":"event_id","type":"string","value":"evt-778-2"},{"key":"span.kind","type":"string","value":"consumer"}],"logs":[],"processID":"p5"},
{"traceID":"cd7fcfffd182b3d2857caa511fb5bc2d","spanID":"3b6778121dd0fda4","operationName":"sink-writer write","references":[{"refType":"CHILD_OF","traceID":"cd7fcfffd182b3d2857caa511fb5bc2d","spanID":"f7df8c93853de56d"}],"startTime":1796079452839675,"duration":1346038,"tags":[{"key":"event_id","type":"string","value":"evt-778-2"},{"key":"span.kind","type":"string","value":"consumer"}],"logs":[],"processID":"p4"},
{"traceID":"cd7fcfffd182b3d2857caa511fb5bc2d","spanID":"dce9aa302aa876c5","operationName":"sink-writer provider charge","references":[{"refType":"CHILD_OF","traceID":"cd7fcfffd182b3d2857caa511fb5bc2d","spanID":"3b6778121dd0fda4"}],"startTime":1796079452841308,"duration":221693,"tags":[{"key":"eos.outcome","type":"string","value":"charged"},{"key":"event_id","type":"string","value":"evt-778-2"},{"key":"span.kind","type":"string","value":"client"}],"logs":[],"processID":"p4"},
{"traceID":"cd7fcfffd182b3d2857caa511fb5bc2d","spanID":"84857bb3190ab39d","operationName":"eos.dedup.v1.Dedup/Begin","references":[{"refType":"CHILD_OF","traceID":"cd7fcfffd182b3d2857caa511fb5bc2d","spanID":"dce9aa302aa876c5"}],"startTime":1796079452846849,"duration":43149,"tags":[{"key":"event_id","type":"string","value":"evt-778-2"},{"key":"span.kind","type":"string","value":"server"}],"logs":[],"processID":"p1"},
{"traceID":"cd7fcfffd182b3d2857caa511fb5bc2d","spanID":"f853ecc4eb1fdde7","operationName":"POST /charges","references":[{"refType":"CHILD_OF","traceID":"cd7fcfffd182b3d2857caa511fb5bc2d","spanID":"dce9aa302aa876c5"}],"startTime":1796079452892566,"duration":95,"tags":[{"key":"event_id","type":"string","value":"evt-778-2"},{"key":"span.kind","type":"string","value":"server"}],"logs":[],"processID":"p2"},
{"traceID":"cd7fcfffd182b3d2857caa511fb5bc2d","spanID":"d5fa172977a6b004","operationName":"eos.dedup.v1.Dedup/MarkUnknown","references":[{"refType":"CHILD_OF","traceID":"cd7fcfffd182b3d2857caa511fb5bc2d","spanID":"dce9aa302aa876c5"}],"startTime":1796079452897095,"duration":82234,"tags":[{"key":"event_id","type":"string","value":"evt-778-2"},{"key":"span.kind","type":"string","value":"server"}],"logs":[],"processID":"p1"},
{"traceID":"cd7fcfffd182b3d2857caa511fb5bc2d","spanID":"5aa28c13458585e8","operationName":"dedup-service reconcile","references":[{"refType":"CHILD_OF","traceID":"cd7fcfffd182b3d2857caa511fb5bc2d","spanID":"84857bb3190ab39d"}],"startTime":1796079453018267,"duration":8839,"tags":[{"key":"event_id","type":"string","value":"evt-778-2"},{"key":"fencing_token","type":"int64","value":1},{"key":"span.kind","type":"string","value":"internal"}],"logs":[],"processID":"p1"},
{"traceID":"cd7fcfffd182b3d2857caa511fb5bc2d","spanID":"2dc60a6a415170ab","operationName":"GET /charges/{key}","references":[{"refType":"CHILD_OF","traceID":"cd7fcfffd182b3d2857caa511fb5bc2d","spanID":"5aa28c13458585e8"}],"startTime":1796079453020283,"duration":38,"tags":[{"key":"event_id","type":"string","value":"evt-778-2"},{"key":"span.kind","type":"string","value":"server"}],"logs":[],"processID":"p2"},
{"traceID":"cd7fcfffd182b3d2857caa511fb5bc2d","spanID":"0c44a72b3bd55601","operationName":"eos.dedup.v1.Dedup/Begin","references":[{"refType":"CHILD_OF","traceID":"cd7fcfffd182b3d2857caa511fb5bc2d","spanID":"dce9aa302aa876c5"}],"startTime":1796079453054743,"duration":5221,"tags":[{"key":"event_id","type":"string","value":"evt-778-2"},{"key":"span.kind","type":"string","value":"server"}],"logs":[],"processID":"p1"}],"processes":{"p1":{"serviceName":"dedup-service","tags":[]},"p2":{"serviceName":"provider-sim","tags":[]},"p3":{"serviceName":"eosctl","tags":[]},"p4":{"serviceName":"sink-writer","tags":[]},"p5":{"serviceName":"eos-processor","tags":[]}},"warnings":null}],"total":0,"limit":0,"offset":0,"errors":null}"#;

    fn recorded_spans() -> Vec<SpanRecord> {
        parse_traces_answer(RECORDED_ANSWER)
            .expect("the recorded answer parses")
            .iter()
            .flat_map(|trace| trace.span_records())
            .collect()
    }

    /// Each span as "<depth> <service>: <name> [attempt]", depth first.
    fn outline(trace: &TraceTree) -> Vec<String> {
        fn visit(node: &SpanNode, depth: usize, out: &mut Vec<String>) {
            let attempt = node.attempt.map(|n| format!(" #{n}")).unwrap_or_default();
            out.push(format!("{depth} {}: {}{attempt}", node.service, node.name));
            for child in &node.children {
                visit(child, depth + 1, out);
            }
        }
        let mut out = Vec::new();
        for root in &trace.roots {
            visit(root, 0, &mut out);
        }
        out
    }

    #[test]
    fn the_recorded_trace_becomes_one_tree_with_every_span_under_its_parent() {
        let traces = build("evt-778-2", recorded_spans());
        assert_eq!(traces.traces.len(), 1);
        let trace = &traces.traces[0];
        assert_eq!(trace.trace_id, "cd7fcfffd182b3d2857caa511fb5bc2d");
        assert_eq!(trace.span_count, 14);
        assert_eq!(
            trace.services,
            [
                "eosctl",
                "eos-processor",
                "sink-writer",
                "dedup-service",
                "provider-sim"
            ]
        );
        assert_eq!(
            outline(trace),
            [
                "0 eosctl: eosctl produce #1",
                "1 eosctl: eosctl produce #2",
                "1 eosctl: eosctl produce #3",
                "1 eos-processor: eos-processor process #1",
                "2 sink-writer: sink-writer write",
                "3 sink-writer: sink-writer provider charge",
                "4 dedup-service: eos.dedup.v1.Dedup/Begin #1",
                "5 dedup-service: dedup-service reconcile",
                "6 provider-sim: GET /charges/{key}",
                "4 provider-sim: POST /charges",
                "4 dedup-service: eos.dedup.v1.Dedup/MarkUnknown",
                "4 dedup-service: eos.dedup.v1.Dedup/Begin #2",
                "1 eos-processor: eos-processor process #2",
                "1 eos-processor: eos-processor process #3",
            ]
        );
        let root = &trace.roots[0];
        assert_eq!(root.parent_span_id, None);
        assert!(!root.parent_missing);
        assert!(root.walk().iter().all(|s| s.status == SpanStatus::Ok));
        let outcomes: Vec<_> = root
            .walk()
            .iter()
            .filter_map(|s| s.outcome.clone())
            .collect();
        assert_eq!(
            outcomes,
            [
                "redelivery",
                "redelivery",
                "emit",
                "charged",
                "duplicate",
                "duplicate"
            ]
        );
    }

    #[test]
    fn the_text_form_is_an_indented_tree_with_duration_attempt_and_status() {
        let text = render_text(&build("evt-778-2", recorded_spans()));
        let expected = "\
event evt-778-2: 1 trace

trace cd7fcfffd182b3d2857caa511fb5bc2d  14 spans  services: eosctl, eos-processor, sink-writer, dedup-service, provider-sim
eosctl: eosctl produce                                      498.9ms  attempt 1  ok
├─ eosctl: eosctl produce                                   394.0ms  attempt 2  ok     redelivery
├─ eosctl: eosctl produce                                   309.0ms  attempt 3  ok     redelivery
├─ eos-processor: eos-processor process                        59µs  attempt 1  ok     emit
│  └─ sink-writer: sink-writer write                          1.35s             ok
│     └─ sink-writer: sink-writer provider charge           221.7ms             ok     charged
│        ├─ dedup-service: eos.dedup.v1.Dedup/Begin          43.1ms  attempt 1  ok
│        │  └─ dedup-service: dedup-service reconcile         8.8ms             ok
│        │     └─ provider-sim: GET /charges/{key}             38µs             ok
│        ├─ provider-sim: POST /charges                        95µs             ok
│        ├─ dedup-service: eos.dedup.v1.Dedup/MarkUnknown    82.2ms             ok
│        └─ dedup-service: eos.dedup.v1.Dedup/Begin           5.2ms  attempt 2  ok
├─ eos-processor: eos-processor process                        34µs  attempt 2  ok     duplicate
└─ eos-processor: eos-processor process                        34µs  attempt 3  ok     duplicate
";
        assert_eq!(text, expected, "got:\n{text}");
    }

    #[test]
    fn the_json_form_nests_children_and_names_every_field() {
        let json = serde_json::to_value(build("evt-778-2", recorded_spans())).expect("serialises");
        assert_eq!(json["event_id"], "evt-778-2");
        let root = &json["traces"][0]["roots"][0];
        let mut keys: Vec<_> = root
            .as_object()
            .expect("an object")
            .keys()
            .cloned()
            .collect();
        keys.sort();
        assert_eq!(
            keys,
            [
                "attempt",
                "children",
                "duration_micros",
                "error",
                "name",
                "outcome",
                "parent_missing",
                "parent_span_id",
                "service",
                "span_id",
                "start_unix_micros",
                "status",
            ]
        );
        assert_eq!(root["service"], "eosctl");
        assert_eq!(root["duration_micros"], 498_880);
        assert_eq!(root["status"], "ok");
        let processor = &root["children"][2];
        assert_eq!(processor["service"], "eos-processor");
        assert_eq!(processor["parent_span_id"], root["span_id"]);
        assert_eq!(processor["attempt"], 1);
        assert_eq!(processor["children"][0]["service"], "sink-writer");
    }

    #[test]
    fn a_span_whose_parent_is_lost_is_a_root_that_says_so() {
        // The processor's first span lost (its process SIGKILLed before exporting it).
        let spans: Vec<_> = recorded_spans()
            .into_iter()
            .filter(|s| s.span_id != "f7df8c93853de56d")
            .collect();
        let traces = build("evt-778-2", spans);
        let trace = &traces.traces[0];
        assert_eq!(trace.span_count, 13);
        assert_eq!(trace.roots.len(), 2);
        let orphan = &trace.roots[1];
        assert_eq!(orphan.name, "sink-writer write");
        assert!(orphan.parent_missing);
        assert_eq!(orphan.walk().len(), 8);
        // The two processings that are left are still attempts of one step.
        let attempts: Vec<_> = trace.roots[0]
            .children
            .iter()
            .filter(|c| c.service == "eos-processor")
            .map(|c| c.attempt)
            .collect();
        assert_eq!(attempts, [Some(1), Some(2)]);
        let text = render_text(&traces);
        assert!(
            text.contains("sink-writer: sink-writer write")
                && text.contains("(parent span f7df8c93853de56d is not in Jaeger)"),
            "{text}"
        );
    }

    #[test]
    fn orphans_of_different_lost_parents_are_not_attempts_of_one_step() {
        // As after SIGKILLs of sink-writer: each killed instance's write span is lost, the
        // provider charges under them were exported.
        let mut first = span("c1", Some("lost-write-1"), 2, &[]);
        let mut second = span("c2", Some("lost-write-2"), 3, &[]);
        let mut third = span("c3", Some("lost-write-2"), 4, &[]);
        for s in [&mut first, &mut second, &mut third] {
            s.name = "sink-writer provider charge".to_owned();
        }
        let traces = build("e", vec![span("root", None, 1, &[]), first, second, third]);
        let roots = &traces.traces[0].roots;
        let attempts: Vec<_> = roots
            .iter()
            .map(|r| (r.span_id.as_str(), r.attempt))
            .collect();
        assert_eq!(
            attempts,
            [
                ("root", None),
                ("c1", None),
                ("c2", Some(1)),
                ("c3", Some(2))
            ]
        );
        assert!(roots[1..].iter().all(|r| r.parent_missing));
    }

    fn span(id: &str, parent: Option<&str>, start: u64, tags: &[(&str, Value)]) -> SpanRecord {
        SpanRecord {
            trace_id: "t1".to_owned(),
            span_id: id.to_owned(),
            parent_span_id: parent.map(str::to_owned),
            service: "svc".to_owned(),
            name: format!("step {id}"),
            start_unix_micros: start,
            duration_micros: 10,
            tags: tags
                .iter()
                .map(|(k, v)| ((*k).to_owned(), v.clone()))
                .collect(),
        }
    }

    #[test]
    fn an_error_status_and_an_explicit_attempt_tag_are_shown() {
        let failed = span(
            "b",
            Some("a"),
            2,
            &[
                ("error", Value::Bool(true)),
                ("otel.status_code", Value::from("ERROR")),
                (
                    "otel.status_description",
                    Value::from("provider answered 500"),
                ),
                ("eos.attempt", Value::from(4)),
            ],
        );
        let traces = build("e", vec![span("a", None, 1, &[]), failed]);
        let child = &traces.traces[0].roots[0].children[0];
        assert_eq!(child.status, SpanStatus::Error);
        assert_eq!(child.error.as_deref(), Some("provider answered 500"));
        assert_eq!(child.attempt, Some(4));
        let text = render_text(&traces);
        assert!(
            text.contains("attempt 4  error  provider answered 500"),
            "{text}"
        );
        let status_only = span("c", None, 3, &[("otel.status_code", Value::from("ERROR"))]);
        assert_eq!(
            build("e", vec![status_only]).traces[0].roots[0].status,
            SpanStatus::Error
        );
    }

    #[test]
    fn traces_are_ordered_by_start_and_no_span_is_dropped() {
        let mut later = span("x", None, 50, &[]);
        later.trace_id = "t0".to_owned();
        // A parent cycle (never produced by a tracer, but a tree must not lose such spans).
        let cyclic = vec![
            span("a", None, 10, &[]),
            span("p", Some("q"), 11, &[]),
            span("q", Some("p"), 12, &[]),
            span("s", Some("s"), 13, &[]),
        ];
        let mut spans = cyclic;
        spans.push(later);
        let traces = build("e", spans);
        let ids: Vec<_> = traces.traces.iter().map(|t| t.trace_id.as_str()).collect();
        assert_eq!(ids, ["t1", "t0"]);
        let all: usize = traces.traces[0].roots.iter().map(|r| r.walk().len()).sum();
        assert_eq!(all, 4);
        assert_eq!(traces.traces[0].span_count, 4);
    }

    #[test]
    fn durations_read_in_the_unit_that_fits() {
        assert_eq!(format_micros(86), "86µs");
        assert_eq!(format_micros(43_149), "43.1ms");
        assert_eq!(format_micros(1_346_038), "1.35s");
    }
}
