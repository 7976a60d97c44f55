//! The spans of a batch: one per decoded record, parented on the trace context its Kafka headers
//! carry, and the database transaction's span linking to them.

use opentelemetry::trace::TraceContextExt as _;
use rdkafka::message::{Header, OwnedHeaders};
use tracing_opentelemetry::OpenTelemetrySpanExt;

use eos_runtime::trace_context;

use crate::decision::BatchDecision;
use crate::mapping::InputRecord;

/// A span per decoded record, parented on the trace context its Kafka headers carry, with the
/// event id as baggage so every service the record reaches tags its spans with it.
pub(crate) fn record_spans(
    records: &[InputRecord],
    decision: &BatchDecision,
    group_id: &str,
) -> Vec<Option<tracing::Span>> {
    records
        .iter()
        .zip(&decision.events)
        .map(|(record, event)| {
            let event = event.as_ref()?;
            let event_id = event.event_id.as_str();
            let span = tracing::info_span!(
                "sink-writer write",
                otel.name = "sink-writer write",
                otel.kind = "consumer",
                event_id,
                messaging.system = "kafka",
                messaging.operation.type = "process",
                messaging.destination.name = %record.topic,
                messaging.destination.partition.id = %record.partition,
                messaging.consumer.group.name = group_id,
                messaging.kafka.offset = record.offset,
            );
            let parent = trace_context::extract_kafka(&owned_headers(&record.headers));
            let _ = span.set_parent(trace_context::context_with_event_id(&parent, event_id));
            Some(span)
        })
        .collect()
}

/// The span of a batch's database transaction. It has many inputs, so no single parent: it links
/// to the records' spans (the first 128, OpenTelemetry's default limit per span).
pub(crate) fn batch_span(records: usize, spans: &[Option<tracing::Span>]) -> tracing::Span {
    let span = tracing::info_span!(
        "sink-writer transaction",
        otel.name = "sink-writer transaction",
        otel.kind = "client",
        db.system = "postgresql",
        db.operation.name = "COMMIT",
        eos.records = records,
    );
    for record in spans.iter().flatten().take(128) {
        let span_context = record.context().span().span_context().clone();
        if span_context.is_valid() {
            span.add_link(span_context);
        }
    }
    span
}

fn owned_headers(headers: &[(String, Option<Vec<u8>>)]) -> OwnedHeaders {
    headers.iter().fold(
        OwnedHeaders::new_with_capacity(headers.len()),
        |owned, (key, value)| {
            owned.insert(Header {
                key,
                value: value.as_deref(),
            })
        },
    )
}
