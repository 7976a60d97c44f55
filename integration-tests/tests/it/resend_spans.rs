//! payments-api's request spans say which payment a request is about
//! (docs/architecture/event-path.md: one trace per event_id): a resend answered from its Idempotency-Key and a
//! refused reuse of the key carry the event_id of the payment the key belongs to, never an id no
//! payment has, and join that payment's trace, so one search by a payment's id finds every
//! request about it. A resend from a caller with a trace of its own links to the caller's span.

use std::collections::HashSet;
use std::time::Duration;

use anyhow::Context as _;
use opentelemetry::trace::TraceContextExt as _;
use serde_json::Value;

use eos_runtime::trace_context;
use integration_tests::otlp_collector::{CollectedSpan, OtlpCollector, SpanLink, env_refs};
use integration_tests::{TestDatabase, unique_name};

use crate::payments_api::PaymentsApi;

const REQUEST_SPAN: &str = "payments-api POST /payments";
const OUTCOME: &str = "eos.outcome";
/// The caller's trace context sent with the second resend.
const CALLER_TRACE_ID: &str = "5c6b3f8e0d2a4f1b9e7c1a2b3c4d5e6f";
const CALLER_SPAN_ID: &str = "1a2b3c4d5e6f7a8b";

/// `POST /payments` with `key` and `body`, and the caller's `traceparent` if any.
async fn post(
    client: &reqwest::Client,
    base: &str,
    key: &str,
    body: &str,
    traceparent: Option<&str>,
) -> anyhow::Result<(u16, Value)> {
    let mut request = client
        .post(format!("{base}/payments"))
        .header("content-type", "application/json")
        .header("idempotency-key", key)
        .body(body.to_owned());
    if let Some(traceparent) = traceparent {
        request = request.header("traceparent", traceparent);
    }
    let response = request.send().await?;
    let status = response.status().as_u16();
    Ok((status, response.json().await?))
}

fn outcome(span: &CollectedSpan) -> &str {
    span.str_attribute(OUTCOME).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn resends_and_refused_key_reuses_are_tagged_with_the_keys_payment() -> anyhow::Result<()> {
    let collector = OtlpCollector::start()?;
    let otel = collector.exporter_env();
    let otel = env_refs(&otel);
    let db = TestDatabase::create().await?;
    // Nothing reads the topic: the test is about the request spans, not the relay.
    let mut api = PaymentsApi::start_on(&db.url, &unique_name("payments-resend"), &[], &otel)?;
    let base = format!(
        "http://{}",
        api.process
            .wait_for_log_field("http_addr", Duration::from_secs(60))?
    );
    let client = reqwest::Client::new();

    let key = unique_name("order");
    let body = r#"{"account_id":"acct-1","amount":1250,"currency":"EUR"}"#;
    let (status, created) = post(&client, &base, &key, body, None).await?;
    assert_eq!(status, 201, "{created}");
    let event_id = created["event_id"]
        .as_str()
        .context("the answer names its event")?
        .to_owned();

    // Two resends, the second from a caller with a trace of its own.
    let caller = format!("00-{CALLER_TRACE_ID}-{CALLER_SPAN_ID}-01");
    for traceparent in [None, Some(caller.as_str())] {
        let resend = r#"{ "currency": "EUR", "amount": 1250, "account_id": "acct-1" }"#;
        let (status, answer) = post(&client, &base, &key, resend, traceparent).await?;
        assert_eq!(status, 201, "{answer}");
        assert_eq!(answer["event_id"].as_str(), Some(event_id.as_str()));
    }
    // The key reused with other content: refused.
    let other = r#"{"account_id":"acct-1","amount":9999,"currency":"EUR"}"#;
    let (status, answer) = post(&client, &base, &key, other, None).await?;
    assert_eq!(status, 409, "{answer}");
    // Another payment, whose spans must not mix with the first's; a bad body, which gets none.
    let (status, second) = post(&client, &base, &unique_name("order"), other, None).await?;
    assert_eq!(status, 201, "{second}");
    let (status, answer) = post(&client, &base, &unique_name("order"), "{}", None).await?;
    assert_eq!(status, 400, "{answer}");

    // A graceful stop flushes every span still queued.
    let stopped = api.process.terminate(Duration::from_secs(30))?;
    assert!(stopped.success(), "{}", api.process.log_tail(30));
    let waited = collector.wait_until(Duration::from_secs(10), |spans| {
        spans.iter().filter(|s| s.name == REQUEST_SPAN).count() >= 5
    });
    let requests: Vec<CollectedSpan> = collector
        .spans()
        .into_iter()
        .filter(|s| s.service_name == "payments-api" && s.name == REQUEST_SPAN)
        .collect();
    let listing = requests
        .iter()
        .map(|s| format!("{s} outcome={} links={:?}", outcome(s), s.links))
        .collect::<Vec<_>>()
        .join("\n");
    waited.with_context(|| format!("request spans:\n{listing}"))?;

    // One search by the payment's id finds every request about it, and only those.
    let spans = collector.spans_of_event(&event_id);
    assert!(
        spans
            .iter()
            .all(|s| s.service_name == "payments-api" && s.name == REQUEST_SPAN),
        "{event_id}: only request spans\n{listing}"
    );
    let mut outcomes: Vec<&str> = spans.iter().map(outcome).collect();
    outcomes.sort_unstable();
    assert_eq!(
        outcomes,
        ["created", "refused", "replayed", "replayed"],
        "{event_id}:\n{listing}"
    );

    // Every request span names a payment that exists; the bad request has none.
    let payment_ids: HashSet<String> =
        sqlx::query_scalar::<_, String>("SELECT payment_id FROM payments_api_payments")
            .fetch_all(&db.pool)
            .await?
            .into_iter()
            .collect();
    assert_eq!(payment_ids.len(), 2);
    assert_eq!(requests.len(), 5, "{listing}");
    for span in &requests {
        let tagged = span.event_id().unwrap_or_default();
        assert!(
            payment_ids.contains(tagged),
            "a request span names no payment: {span}\n{listing}"
        );
    }
    let second_id = second["event_id"].as_str().unwrap_or_default();
    let second_spans = collector.spans_of_event(second_id);
    assert_eq!(
        second_spans.iter().map(outcome).collect::<Vec<_>>(),
        ["created"],
        "{listing}"
    );

    // The created request's span is what the outbox row stores, baggage naming the payment.
    let original = spans
        .iter()
        .find(|s| outcome(s) == "created")
        .context("no created span")?;
    let stored: Option<String> =
        sqlx::query_scalar("SELECT trace_context FROM eos_outbox WHERE event_id = $1")
            .bind(&event_id)
            .fetch_one(&db.pool)
            .await?;
    let stored = trace_context::context_from_stored(&stored.unwrap_or_default());
    assert_eq!(
        trace_context::event_id_in(&stored).as_deref(),
        Some(event_id.as_str())
    );
    assert_eq!(
        stored.span().span_context().span_id().to_string(),
        original.span_id
    );
    assert!(original.links.is_empty(), "{listing}");

    // Every other request about the payment is a child of the created one's span, in its trace;
    // the resend whose caller had a trace links to the caller's span.
    let caller_link = SpanLink {
        trace_id: CALLER_TRACE_ID.to_owned(),
        span_id: CALLER_SPAN_ID.to_owned(),
    };
    for span in spans.iter().filter(|s| outcome(s) != "created") {
        assert_eq!(
            (span.trace_id.as_str(), span.parent_span_id.as_deref()),
            (original.trace_id.as_str(), Some(original.span_id.as_str())),
            "{span}\n{listing}"
        );
    }
    let linked: Vec<&CollectedSpan> = spans.iter().filter(|s| !s.links.is_empty()).collect();
    assert_eq!(linked.len(), 1, "{listing}");
    assert_eq!(
        (outcome(linked[0]), linked[0].links.as_slice()),
        ("replayed", std::slice::from_ref(&caller_link)),
        "{listing}"
    );
    db.drop_database().await
}
