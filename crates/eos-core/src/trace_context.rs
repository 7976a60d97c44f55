//! W3C trace context (`traceparent` / `tracestate`) and the `event_id` header, carried in Kafka
//! record headers and gRPC metadata, so one trace follows an event across every service.
//!
//! The W3C propagator is used directly rather than the global one, so propagation works the same
//! whether or not telemetry was initialised (tests, tools).

use opentelemetry::Context;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use rdkafka::message::{Header, Headers, OwnedHeaders};
use tonic::metadata::{KeyRef, MetadataKey, MetadataMap, MetadataValue};
use tracing_opentelemetry::OpenTelemetrySpanExt;

pub const TRACEPARENT_HEADER: &str = "traceparent";
pub const TRACESTATE_HEADER: &str = "tracestate";
/// Carries the event's id next to the payload so tools can follow it without parsing the value.
pub const EVENT_ID_HEADER: &str = "event_id";

struct PairCollector(Vec<(String, String)>);

impl Injector for PairCollector {
    fn set(&mut self, key: &str, value: String) {
        self.0.push((key.to_owned(), value));
    }
}

fn context_pairs(cx: &Context) -> Vec<(String, String)> {
    let mut collector = PairCollector(Vec::new());
    TraceContextPropagator::new().inject_context(cx, &mut collector);
    collector.0
}

/// Appends `traceparent` (and `tracestate` when present) for `cx` to Kafka headers.
pub fn inject_kafka(cx: &Context, mut headers: OwnedHeaders) -> OwnedHeaders {
    for (key, value) in context_pairs(cx) {
        headers = headers.insert(Header {
            key: &key,
            value: Some(value.as_bytes()),
        });
    }
    headers
}

/// Appends the trace context of a `tracing` span (its OpenTelemetry context) to Kafka headers.
pub fn inject_kafka_from_span(span: &tracing::Span, headers: OwnedHeaders) -> OwnedHeaders {
    inject_kafka(&span.context(), headers)
}

/// Appends the `event_id` header.
pub fn with_event_id(headers: OwnedHeaders, event_id: &str) -> OwnedHeaders {
    headers.insert(Header {
        key: EVENT_ID_HEADER,
        value: Some(event_id.as_bytes()),
    })
}

struct KafkaHeaderExtractor<'a, H: Headers>(&'a H);

impl<H: Headers> Extractor for KafkaHeaderExtractor<'_, H> {
    fn get(&self, key: &str) -> Option<&str> {
        header_str(self.0, key)
    }

    fn keys(&self) -> Vec<&str> {
        self.0.iter().map(|header| header.key).collect()
    }
}

/// The first header named `key`, as UTF-8.
pub fn header_str<'a, H: Headers>(headers: &'a H, key: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|header| header.key == key)
        .and_then(|header| header.value)
        .and_then(|value| std::str::from_utf8(value).ok())
}

/// The trace context carried by Kafka headers; an empty context when there is none.
pub fn extract_kafka<H: Headers>(headers: &H) -> Context {
    TraceContextPropagator::new().extract(&KafkaHeaderExtractor(headers))
}

/// The `event_id` header, if present and UTF-8.
pub fn event_id_header<H: Headers>(headers: &H) -> Option<&str> {
    header_str(headers, EVENT_ID_HEADER)
}

/// Writes the trace context of `cx` into gRPC request metadata.
pub fn inject_grpc(cx: &Context, metadata: &mut MetadataMap) {
    for (key, value) in context_pairs(cx) {
        let (Ok(key), Ok(value)) = (
            MetadataKey::from_bytes(key.as_bytes()),
            MetadataValue::try_from(value.as_str()),
        ) else {
            continue;
        };
        metadata.insert(key, value);
    }
}

struct GrpcMetadataExtractor<'a>(&'a MetadataMap);

impl Extractor for GrpcMetadataExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|value| value.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0
            .keys()
            .filter_map(|key| match key {
                KeyRef::Ascii(key) => Some(key.as_str()),
                KeyRef::Binary(_) => None,
            })
            .collect()
    }
}

/// The trace context carried by gRPC metadata; an empty context when there is none.
pub fn extract_grpc(metadata: &MetadataMap) -> Context {
    TraceContextPropagator::new().extract(&GrpcMetadataExtractor(metadata))
}

#[cfg(test)]
mod tests {
    use opentelemetry::trace::{
        SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState,
    };

    use super::*;

    fn sample_context() -> Context {
        let span_context = SpanContext::new(
            TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap_or(TraceId::INVALID),
            SpanId::from_hex("00f067aa0ba902b7").unwrap_or(SpanId::INVALID),
            TraceFlags::SAMPLED,
            true,
            TraceState::from_key_value([("vendor", "x")]).unwrap_or_default(),
        );
        Context::new().with_remote_span_context(span_context)
    }

    #[test]
    fn kafka_headers_round_trip() {
        let headers = with_event_id(inject_kafka(&sample_context(), OwnedHeaders::new()), "e-1");
        assert_eq!(
            header_str(&headers, TRACEPARENT_HEADER),
            Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
        );
        assert_eq!(header_str(&headers, TRACESTATE_HEADER), Some("vendor=x"));
        assert_eq!(event_id_header(&headers), Some("e-1"));
        let extracted = extract_kafka(&headers);
        assert_eq!(
            extracted.span().span_context().trace_id(),
            sample_context().span().span_context().trace_id()
        );
        assert!(extracted.span().span_context().is_remote());
    }

    #[test]
    fn grpc_metadata_round_trip() {
        let mut metadata = MetadataMap::new();
        inject_grpc(&sample_context(), &mut metadata);
        let extracted = extract_grpc(&metadata);
        assert_eq!(
            extracted.span().span_context().span_id(),
            sample_context().span().span_context().span_id()
        );
    }

    #[test]
    fn missing_context_extracts_as_invalid() {
        let extracted = extract_kafka(&OwnedHeaders::new());
        assert!(!extracted.span().span_context().is_valid());
        assert!(event_id_header(&OwnedHeaders::new()).is_none());
    }
}
