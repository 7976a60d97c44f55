//! The Kafka record each outbox row becomes: its key, envelope and headers, and the publish
//! span that carries the event's trace on from the domain change (docs/OBSERVABILITY.md).

use opentelemetry::trace::TraceContextExt as _;
use rdkafka::message::OwnedHeaders;
use tracing::info_span;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use eos_outbox::OutboxRow;
use eos_runtime::trace_context;
use eos_runtime::transactional_producer::PendingRecord;
use eos_schema::SubjectSchema;

use crate::error::RelayError;

/// The record for one row: key and value as the row says (the value as JSON, or in `schema`'s
/// registry format), the event id header, and the trace context of a span whose parent is the
/// context stored at enqueue, so the event's trace goes on from the domain change.
pub(crate) fn record_for(
    row: &OutboxRow,
    schema: Option<&SubjectSchema>,
) -> Result<PendingRecord, RelayError> {
    let invalid = |detail: String| RelayError::InvalidRow {
        position: row.cursor.position,
        event_id: row.event_id.clone(),
        detail,
    };
    let json = row
        .value_bytes()
        .map_err(|error| invalid(error.to_string()))?;
    let payload = match schema {
        None => json,
        Some(schema) => {
            let value: serde_json::Value =
                serde_json::from_slice(&json).map_err(|error| invalid(error.to_string()))?;
            schema.encode(&value).map_err(invalid)?
        }
    };
    let parent = row
        .trace_context
        .as_deref()
        .map(trace_context::context_from_stored)
        .unwrap_or_default();
    let parent = trace_context::context_with_event_id(&parent, &row.event_id);
    let span = info_span!(
        "publish",
        otel.name = "outbox-relay publish",
        otel.kind = "producer",
        event_id = %row.event_id,
        messaging.system = "kafka",
        messaging.operation.type = "publish",
        messaging.destination.name = %row.topic,
        outbox.position = row.cursor.position,
    );
    let _ = span.set_parent(parent.clone());
    // Without an exporter the span has no context of its own: pass the stored one on.
    let span_cx = span.context();
    let cx = if span_cx.span().span_context().is_valid() {
        trace_context::context_with_event_id(&span_cx, &row.event_id)
    } else {
        parent
    };
    // A general row's own headers first; the trace context and event_id are the relay's.
    let mut own = OwnedHeaders::new();
    for (name, value) in row.extra_headers() {
        own = own.insert(rdkafka::message::Header {
            key: name,
            value: Some(value),
        });
    }
    let headers =
        trace_context::with_event_id(trace_context::inject_kafka(&cx, own), &row.event_id);
    Ok(PendingRecord {
        topic: row.topic.clone(),
        partition: None,
        key: Some(row.key.clone().into_bytes()),
        payload: Some(payload),
        headers,
    })
}

#[cfg(test)]
mod tests {
    use eos_outbox::OutboxCursor;
    use time::OffsetDateTime;

    use super::*;

    #[test]
    fn a_record_carries_the_row_key_envelope_and_event_id() {
        let row = OutboxRow {
            cursor: OutboxCursor {
                order_xid: 7,
                position: 3,
            },
            topic: "payments".into(),
            key: "acct-1".into(),
            event_id: "ev-1".into(),
            entity_id: "acct-1".into(),
            value: Some(1250),
            record: None,
            headers: None,
            version: Some(2),
            payload: None,
            occurred_at: None,
            trace_context: None,
            enqueued_at: OffsetDateTime::UNIX_EPOCH,
        };
        let record = record_for(&row, None).expect("valid row");
        assert_eq!(record.topic, "payments");
        assert_eq!(record.key.as_deref(), Some(b"acct-1".as_slice()));
        let envelope =
            eos_core::EventEnvelope::parse(record.payload.as_deref().unwrap_or_default())
                .expect("parses");
        assert_eq!(envelope.event_id.as_str(), "ev-1");
        assert_eq!((envelope.value, envelope.version), (1250, Some(2)));
        let headers = record.headers;
        assert_eq!(
            trace_context::event_id_header(&headers),
            Some("ev-1"),
            "event_id header"
        );
    }

    #[test]
    fn a_row_written_around_the_checks_stops_the_relay_instead_of_being_skipped() {
        let row = OutboxRow {
            cursor: OutboxCursor::default(),
            topic: "payments".into(),
            key: "k".into(),
            event_id: String::new(),
            entity_id: "e".into(),
            value: Some(1),
            record: None,
            headers: None,
            version: None,
            payload: None,
            occurred_at: None,
            trace_context: None,
            enqueued_at: OffsetDateTime::UNIX_EPOCH,
        };
        assert!(matches!(
            record_for(&row, None),
            Err(RelayError::InvalidRow { .. })
        ));
    }
}
