//! `eosctl trace <event_id>` against the stack's real Jaeger: a short `eos-lab demo` (every
//! service a real process, one SIGKILL of the processor) exports its spans over OTLP to Jaeger,
//! then the built `eosctl trace` must show one event's trace as a tree that holds the spans of
//! the producer, eos-processor, sink-writer, dedup-service and provider-sim, each under the step
//! that caused it. The producer is eosctl's (its span is `eosctl produce`), run inside the demo's
//! process, so its spans carry the service name `eos-lab`.
//!
//! The event is the workload's last: the demo spreads its SIGKILLs over the first two thirds of
//! the production (at most 0.65 of it plus a second for one kill), so the last event is produced
//! and processed by processes that are never killed and export every span at their SIGTERM. Its
//! trace is therefore complete, and a missing span is a failure, not bad luck.
//!
//! Jaeger is found as `deploy/local/stack env` prints it: EOS_JAEGER_OTLP_ENDPOINT (spans in) and
//! EOS_JAEGER_URL (query API), defaulting to the stack's ports.

use std::collections::BTreeSet;
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use integration_tests::{bootstrap_servers, workspace_binary};
use serde_json::Value;

const EVENTS: u64 = 1500;
/// Records per second: production takes about 10.6 s (with re-deliveries and bad records), so the
/// one kill lands well before the last event.
const RATE: u64 = 150;

fn jaeger_url() -> String {
    std::env::var("EOS_JAEGER_URL").unwrap_or_else(|_| "http://127.0.0.1:16686".to_owned())
}

fn jaeger_otlp_endpoint() -> String {
    std::env::var("EOS_JAEGER_OTLP_ENDPOINT").unwrap_or_else(|_| "http://127.0.0.1:4317".to_owned())
}

/// Fails at once, with the fix, when the stack's Jaeger is not up.
fn require_jaeger() -> anyhow::Result<()> {
    let url = format!("{}/api/services", jaeger_url());
    let reachable = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(async {
            reqwest::Client::new()
                .get(&url)
                .timeout(Duration::from_secs(5))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success())
        });
    anyhow::ensure!(
        reachable,
        "Jaeger's query API does not answer at {url}: start it with `deploy/local/stack up` \
         (or point EOS_JAEGER_URL / EOS_JAEGER_OTLP_ENDPOINT at another Jaeger)"
    );
    Ok(())
}

/// A seed no earlier run used, so the event ids (evt-<seed>-<n>) are new to Jaeger.
fn fresh_seed() -> u64 {
    let micros = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_micros();
    u64::try_from(micros % 1_000_000_000_000).unwrap_or(1) * 10 + u64::from(std::process::id() % 10)
}

fn run_demo(seed: u64) -> anyhow::Result<()> {
    let runs_dir = std::env::temp_dir().join("eos-demo-runs");
    // The demo's database is on the shared server: no PostgreSQL restart while it runs.
    let _postgres = integration_tests::postgres_in_use()?;
    let output = Command::new(workspace_binary("eos-lab")?)
        .args([
            "--bootstrap-servers",
            &bootstrap_servers(),
            "demo",
            // Event ids the test can name in advance (evt-<seed>-<n>).
            "--source",
            "producer",
            "--events",
            &EVENTS.to_string(),
            "--rate",
            &RATE.to_string(),
            "--processor-kills",
            "1",
            "--sink-kills",
            "0",
            "--seed",
            &seed.to_string(),
            "--runs-dir",
            &runs_dir.display().to_string(),
            "--drop-database",
            "--json",
        ])
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", jaeger_otlp_endpoint())
        // A SIGKILLed process loses at most its last 200 ms of spans.
        .env("OTEL_BSP_SCHEDULE_DELAY", "200")
        .output()?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    anyhow::ensure!(
        output.status.success(),
        "the demo failed ({}):\n{}\n{stderr}",
        output.status,
        String::from_utf8_lossy(&output.stdout)
    );
    Ok(())
}

/// `eosctl trace <event_id> [args]`: (exit code, stdout, stderr).
fn eosctl_trace(event_id: &str, args: &[&str]) -> anyhow::Result<(i32, String, String)> {
    let output = Command::new(workspace_binary("eosctl")?)
        .args(["trace", event_id, "--jaeger-url", &jaeger_url()])
        .args(args)
        .output()?;
    Ok((
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    ))
}

/// A span of the JSON tree with the span ids of its ancestors, root first.
struct Placed<'a> {
    span: &'a Value,
    ancestors: Vec<String>,
}

fn flatten<'a>(span: &'a Value, ancestors: &[String], out: &mut Vec<Placed<'a>>) {
    out.push(Placed {
        span,
        ancestors: ancestors.to_vec(),
    });
    let mut below = ancestors.to_vec();
    below.push(span["span_id"].as_str().unwrap_or_default().to_owned());
    for child in span["children"].as_array().into_iter().flatten() {
        flatten(child, &below, out);
    }
}

fn field<'a>(span: &'a Value, name: &str) -> &'a str {
    span[name].as_str().unwrap_or_default()
}

/// The spans of `service` named `name` that descend from one of `ancestors`.
fn under<'a>(
    spans: &'a [Placed<'a>],
    service: &str,
    name: &str,
    ancestors: &[&Placed<'_>],
) -> Vec<&'a Placed<'a>> {
    spans
        .iter()
        .filter(|p| field(p.span, "service") == service && field(p.span, "name") == name)
        .filter(|p| {
            ancestors
                .iter()
                .any(|a| p.ancestors.iter().any(|id| id == field(a.span, "span_id")))
        })
        .collect()
}

#[test]
fn eosctl_trace_shows_an_events_spans_from_every_service_as_a_tree() -> anyhow::Result<()> {
    require_jaeger()?;
    let seed = fresh_seed();
    let started = Instant::now();
    run_demo(seed)?;
    let demo_took = started.elapsed();
    let event_id = format!("evt-{seed}-{}", EVENTS - 1);

    let (code, stdout, stderr) = eosctl_trace(&event_id, &["--json", "--wait", "30s"])?;
    assert_eq!(code, 0, "eosctl trace --json failed: {stderr}");
    let traces: Value = serde_json::from_str(&stdout)
        .with_context(|| format!("eosctl trace --json printed no JSON: {stdout}\n{stderr}"))?;
    assert_eq!(traces["event_id"], event_id.as_str());

    // The event's trace: the one with the sink's write (a reused id would be another trace).
    let all_traces = traces["traces"].as_array().context("no traces array")?;
    let trace = all_traces
        .iter()
        .find(|t| t.to_string().contains("\"sink-writer write\""))
        .with_context(|| format!("no trace of {event_id} has the sink's span: {traces:#}"))?;
    let mut spans = Vec::new();
    for root in trace["roots"].as_array().into_iter().flatten() {
        flatten(root, &[], &mut spans);
    }
    assert_eq!(
        spans.len() as u64,
        trace["span_count"].as_u64().unwrap_or_default(),
        "every span is in the tree once"
    );
    // Every child names its parent, and only spans whose parent Jaeger lacks are extra roots.
    for placed in &spans {
        let parent = placed.span["parent_span_id"].as_str();
        match placed.ancestors.last() {
            Some(direct) => assert_eq!(parent, Some(direct.as_str()), "{}", placed.span),
            None => assert!(
                parent.is_none() || placed.span["parent_missing"] == true,
                "{}",
                placed.span
            ),
        }
        assert!(
            ["ok", "error"].contains(&field(placed.span, "status")),
            "{}",
            placed.span
        );
    }

    // The chain of this event, each step under the one that caused it.
    let producer: Vec<&Placed> = spans
        .iter()
        .filter(|p| {
            field(p.span, "service") == "eos-lab"
                && field(p.span, "name") == "eosctl produce"
                && p.ancestors.is_empty()
                && p.span["parent_span_id"].is_null()
        })
        .collect();
    assert_eq!(producer.len(), 1, "one first send, the root: {trace:#}");
    assert_eq!(field(producer[0].span, "status"), "ok");
    let processed = under(&spans, "eos-processor", "eos-processor process", &producer);
    assert!(
        !processed.is_empty(),
        "no processor span under the send: {trace:#}"
    );
    assert!(
        processed.iter().any(|p| field(p.span, "outcome") == "emit"),
        "the processor emitted the event: {trace:#}"
    );
    let written = under(&spans, "sink-writer", "sink-writer write", &processed);
    assert!(
        !written.is_empty(),
        "no sink write under the processor: {trace:#}"
    );
    let charged = under(
        &spans,
        "sink-writer",
        "sink-writer provider charge",
        &written,
    );
    assert!(
        !charged.is_empty(),
        "no provider charge under the write: {trace:#}"
    );
    // The sink's first round of charges is a BeginBatch; each item's span is in its event's
    // trace.
    let begun = under(
        &spans,
        "dedup-service",
        "eos.dedup.v1.Dedup/BeginBatch",
        &charged,
    );
    assert!(
        !begun.is_empty(),
        "no dedup Begin under the charge: {trace:#}"
    );
    let posted = under(&spans, "provider-sim", "POST /charges", &charged);
    assert!(
        !posted.is_empty(),
        "no provider call under the charge: {trace:#}"
    );
    let services: BTreeSet<&str> = spans.iter().map(|p| field(p.span, "service")).collect();
    for service in [
        "eos-lab",
        "eos-processor",
        "sink-writer",
        "dedup-service",
        "provider-sim",
    ] {
        assert!(services.contains(service), "{service} missing: {trace:#}");
    }

    // The text form: a tree naming each service, with the trace's id.
    let (code, text, stderr) = eosctl_trace(&event_id, &["--wait", "0s"])?;
    assert_eq!(code, 0, "eosctl trace failed: {stderr}");
    let trace_id = field(trace, "trace_id");
    assert!(text.contains(&format!("trace {trace_id}")), "{text}");
    for line in [
        "eos-lab: eosctl produce",
        "─ eos-processor: eos-processor process",
        "sink-writer: sink-writer write",
        "sink-writer: sink-writer provider charge",
        "dedup-service: eos.dedup.v1.Dedup/BeginBatch",
        "provider-sim: POST /charges",
    ] {
        assert!(text.contains(line), "{line:?} is not in:\n{text}");
    }

    // An id no span carries: exit 1 and a message, not an empty tree.
    let (code, stdout, stderr) = eosctl_trace(&format!("evt-{seed}-none"), &["--wait", "0s"])?;
    assert_eq!(code, 1, "stdout: {stdout}\nstderr: {stderr}");
    assert!(stdout.is_empty(), "{stdout}");
    assert!(stderr.contains("no trace in Jaeger"), "{stderr}");
    eprintln!(
        "trace_cli: demo {demo_took:.1?}, trace {} spans from {services:?}",
        spans.len()
    );
    Ok(())
}

#[test]
fn eosctl_trace_says_so_when_jaeger_is_not_reachable() -> anyhow::Result<()> {
    // A port nothing listens on: bound, then released.
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let output = Command::new(workspace_binary("eosctl")?)
        .args(["trace", "evt-1-0", "--wait", "0s", "--jaeger-url"])
        .arg(format!("http://127.0.0.1:{port}"))
        .output()?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "cannot reach Jaeger's query API at http://127.0.0.1:{port}"
        )),
        "{stderr}"
    );
    Ok(())
}
