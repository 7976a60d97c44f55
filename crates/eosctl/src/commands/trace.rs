//! `eosctl trace <event_id>`: the event's trace(s) from Jaeger's query API, as a tree of spans.

use std::collections::BTreeSet;
use std::io::Write as _;
use std::time::{Duration, Instant};

use crate::cli::TraceArgs;
use crate::commands::Status;
use crate::jaeger::{EventSearch, JaegerClient};
use crate::trace_tree;

/// How often --wait looks again.
const POLL_INTERVAL: Duration = Duration::from_millis(500);
/// A trace that found no new span for this long is taken as complete: the services export their
/// spans in batches, so the first spans of a trace can be in Jaeger well before its last ones.
const SETTLE: Duration = Duration::from_secs(1);
/// One request to Jaeger.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Shows the trace `args` names (eos-lab's demo shows its sample event's so).
pub async fn run(args: TraceArgs) -> anyhow::Result<Status> {
    let client = JaegerClient::new(&args.jaeger_url, REQUEST_TIMEOUT)?;
    let search = search_until_settled(&client, &args.event_id, args.lookback, args.wait).await?;
    if search.spans.is_empty() {
        eprintln!(
            "no trace in Jaeger ({}) has a span tagged event_id={} (searched the services {} over \
             the last {}{}). Spans reach Jaeger only from processes run with \
             OTEL_EXPORTER_OTLP_ENDPOINT pointing at its OTLP port, and Jaeger's in-memory \
             storage forgets them when it restarts.",
            client.url(),
            args.event_id,
            if search.services.is_empty() {
                "(Jaeger has spans of none yet)".to_owned()
            } else {
                search.services.join(", ")
            },
            humantime::format_duration(args.lookback),
            if args.wait.is_zero() {
                String::new()
            } else {
                format!(", waiting {}", humantime::format_duration(args.wait))
            },
        );
        return Ok(Status::TraceNotFound);
    }
    let traces = trace_tree::build(&args.event_id, search.spans);
    let text = if args.json {
        format!("{}\n", serde_json::to_string(&traces)?)
    } else {
        trace_tree::render_text(&traces)
    };
    write_stdout(&text)?;
    Ok(Status::Success)
}

/// Writes the result; a reader that closed the pipe early (`| head`) is not an error.
fn write_stdout(text: &str) -> std::io::Result<()> {
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Err(error) if error.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other,
    }
}

/// Searches until the event's spans are there and have stopped arriving for [`SETTLE`], or
/// `wait` has passed (then returns what it found, maybe nothing). `wait` 0 searches once.
async fn search_until_settled(
    client: &JaegerClient,
    event_id: &str,
    lookback: Duration,
    wait: Duration,
) -> anyhow::Result<EventSearch> {
    let deadline = Instant::now() + wait;
    let mut seen: BTreeSet<(String, String)> = BTreeSet::new();
    let mut last_change = Instant::now();
    loop {
        let search = client.spans_of_event(event_id, lookback).await?;
        let now = Instant::now();
        let ids: BTreeSet<(String, String)> = search
            .spans
            .iter()
            .map(|s| (s.trace_id.clone(), s.span_id.clone()))
            .collect();
        if ids != seen {
            seen = ids;
            last_change = now;
        }
        let settled = !seen.is_empty() && now.duration_since(last_change) >= SETTLE.min(wait);
        if settled || now >= deadline {
            return Ok(search);
        }
        tokio::time::sleep(POLL_INTERVAL.min(deadline - now)).await;
    }
}
