//! W3C trace context (`traceparent` / `tracestate`) and W3C baggage, carried in Kafka record
//! headers, gRPC metadata and HTTP headers, so one trace follows an event across every service;
//! and the `event_id` header.
//!
//! The event's id rides in the baggage (`baggage: event_id=<id>`): a service that receives a
//! request parents its span on the extracted context and tags the span with
//! [`event_id_in`] of it, whatever the request's own fields are. [`context_with_event_id`] puts
//! it there. Everything injected from a context — including a `tracing` span's
//! `OpenTelemetrySpanExt::context()`, which keeps its parent's baggage — carries both.
//!
//! The propagator (TraceContext + Baggage) is used directly rather than the global one, so
//! propagation works the same whether or not telemetry was initialised (tests, tools), and
//! extraction starts from an empty context, never from whatever context is current on the thread.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::LazyLock;

use opentelemetry::baggage::{Baggage, BaggageExt as _};
use opentelemetry::propagation::{
    Extractor, Injector, TextMapCompositePropagator, TextMapPropagator,
};
use opentelemetry::trace::TraceContextExt as _;
use opentelemetry::{Context, Key, StringValue};
use opentelemetry_sdk::propagation::{BaggagePropagator, TraceContextPropagator};
use rdkafka::message::{Header, Headers, OwnedHeaders};
use tonic::metadata::{KeyRef, MetadataKey, MetadataMap, MetadataValue};
use tracing_opentelemetry::OpenTelemetrySpanExt;

pub const TRACEPARENT_HEADER: &str = "traceparent";
pub const TRACESTATE_HEADER: &str = "tracestate";
pub const BAGGAGE_HEADER: &str = "baggage";
/// Carries the event's id next to the payload so tools can follow it without parsing the value.
pub const EVENT_ID_HEADER: &str = "event_id";
/// The baggage entry holding the event's id.
pub const EVENT_ID_BAGGAGE_KEY: &str = "event_id";

/// TraceContext + Baggage: the W3C propagators every hop uses.
static PROPAGATOR: LazyLock<TextMapCompositePropagator> = LazyLock::new(propagator);

/// The propagator to install globally (`opentelemetry::global::set_text_map_propagator`), so
/// instrumentation that uses the global one propagates the same fields.
pub fn propagator() -> TextMapCompositePropagator {
    TextMapCompositePropagator::new(vec![
        Box::new(TraceContextPropagator::new()),
        Box::new(BaggagePropagator::new()),
    ])
}

/// `cx` plus the baggage entry `event_id=<event_id>` (replacing an earlier one; other entries
/// are kept). Parent a span on it, and every request made from that span (or a child of it)
/// carries the event id to the next service.
pub fn context_with_event_id(cx: &Context, event_id: &str) -> Context {
    // The processor calls this per record on a context that usually has the entry already.
    let already = cx
        .baggage()
        .get_with_metadata(EVENT_ID_BAGGAGE_KEY)
        .is_some_and(|(value, metadata)| {
            value.as_str() == event_id && metadata.as_str().is_empty()
        });
    if already {
        return cx.clone();
    }
    let baggage: Baggage = cx
        .baggage()
        .iter()
        .filter(|(key, _)| key.as_str() != EVENT_ID_BAGGAGE_KEY)
        .map(|(key, (value, metadata))| (key.clone(), (value.clone(), metadata.clone())))
        .chain(std::iter::once((
            Key::from_static_str(EVENT_ID_BAGGAGE_KEY),
            (StringValue::from(event_id.to_owned()), Default::default()),
        )))
        .collect();
    cx.with_baggage(baggage)
}

/// The event id in `cx`'s baggage, if there is one. W3C baggage trims values, so an id with
/// leading or trailing spaces comes back trimmed after a hop.
pub fn event_id_in(cx: &Context) -> Option<String> {
    cx.baggage()
        .get(EVENT_ID_BAGGAGE_KEY)
        .map(|value| value.as_str().to_owned())
}

/// The SDK's baggage propagator percent-decodes values on extraction but does not encode `%` on
/// injection, so `a%20b` would arrive as `a b`. Encoding `%` here makes every value round-trip.
fn wire_context(cx: &Context) -> Cow<'_, Context> {
    let baggage = cx.baggage();
    if !baggage
        .iter()
        .any(|(_, (value, _))| value.as_str().contains('%'))
    {
        return Cow::Borrowed(cx);
    }
    let escaped: Baggage = baggage
        .iter()
        .map(|(key, (value, metadata))| {
            let value = StringValue::from(value.as_str().replace('%', "%25"));
            (key.clone(), (value, metadata.clone()))
        })
        .collect();
    Cow::Owned(cx.with_baggage(escaped))
}

struct PairCollector(Vec<(&'static str, String)>);

impl Injector for PairCollector {
    fn set(&mut self, key: &str, value: String) {
        // The two propagators only ever write these three fields.
        let key = match key {
            TRACEPARENT_HEADER => TRACEPARENT_HEADER,
            TRACESTATE_HEADER => TRACESTATE_HEADER,
            BAGGAGE_HEADER => BAGGAGE_HEADER,
            _ => return,
        };
        self.0.push((key, value));
    }
}

/// The fields that carry `cx` across a process boundary: `traceparent` (with a valid span
/// context), `tracestate` (when not empty) and `baggage` (when not empty), in that order. For
/// callers that assemble their own header lists; the `inject_*` functions use it.
pub fn context_headers(cx: &Context) -> Vec<(&'static str, String)> {
    let mut collector = PairCollector(Vec::with_capacity(3));
    PROPAGATOR.inject_context(&wire_context(cx), &mut collector);
    collector.0
}

fn extract(extractor: &dyn Extractor) -> Context {
    PROPAGATOR.extract_with_context(&Context::new(), extractor)
}

/// Appends `traceparent`, `tracestate` and `baggage` for `cx` to Kafka headers.
pub fn inject_kafka(cx: &Context, mut headers: OwnedHeaders) -> OwnedHeaders {
    for (key, value) in context_headers(cx) {
        headers = headers.insert(Header {
            key,
            value: Some(value.as_bytes()),
        });
    }
    headers
}

/// Appends the context of a `tracing` span (its OpenTelemetry context, baggage included) to
/// Kafka headers.
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

/// The trace context and baggage carried by Kafka headers; an empty context when there is none.
pub fn extract_kafka<H: Headers>(headers: &H) -> Context {
    extract(&KafkaHeaderExtractor(headers))
}

/// The `event_id` header, if present, UTF-8 and no longer than an envelope's event id may be
/// (`eos_core::envelope::MAX_ID_BYTES`): it becomes a span attribute and baggage, so a longer one
/// from a hostile producer is ignored rather than copied into every span of the event.
pub fn event_id_header<H: Headers>(headers: &H) -> Option<&str> {
    header_str(headers, EVENT_ID_HEADER).filter(|id| id.len() <= eos_core::envelope::MAX_ID_BYTES)
}

/// Writes the trace context and baggage of `cx` into gRPC request metadata.
pub fn inject_grpc(cx: &Context, metadata: &mut MetadataMap) {
    for (key, value) in context_headers(cx) {
        let Ok(value) = MetadataValue::try_from(value.as_str()) else {
            continue;
        };
        metadata.insert(MetadataKey::from_static(key), value);
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

/// The trace context and baggage carried by gRPC metadata; an empty context when there is none.
pub fn extract_grpc(metadata: &MetadataMap) -> Context {
    extract(&GrpcMetadataExtractor(metadata))
}

/// Writes the trace context and baggage of `cx` into HTTP headers (reqwest, axum, hyper: all use
/// `http::HeaderMap`).
pub fn inject_http(cx: &Context, headers: &mut http::HeaderMap) {
    for (key, value) in context_headers(cx) {
        let Ok(value) = http::HeaderValue::try_from(value) else {
            continue;
        };
        headers.insert(http::HeaderName::from_static(key), value);
    }
}

struct HttpHeaderExtractor<'a>(&'a http::HeaderMap);

impl Extractor for HttpHeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|value| value.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}

/// The trace context and baggage carried by HTTP headers; an empty context when there is none.
pub fn extract_http(headers: &http::HeaderMap) -> Context {
    extract(&HttpHeaderExtractor(headers))
}

/// `cx` as text to keep with durable state (a JSON object of the fields [`context_headers`]
/// gives), so work done later on that state — a reconciliation after the request is long gone —
/// can join the request's trace; `None` when `cx` carries nothing.
pub fn stored_context(cx: &Context) -> Option<String> {
    let fields = context_fields(cx);
    if fields.is_empty() {
        return None;
    }
    serde_json::to_string(&fields).ok()
}

/// The fields of [`context_headers`] as a map: the trace context of one item of a batched
/// request (e.g. dedup-service's `BeginRequest.trace_context`), whose items belong to different
/// traces and so cannot share the request's metadata.
pub fn context_fields(cx: &Context) -> HashMap<String, String> {
    context_headers(cx)
        .into_iter()
        .map(|(key, value)| (key.to_owned(), value))
        .collect()
}

/// The context [`context_fields`] gave; an empty context for a map without one.
pub fn extract_fields(fields: &HashMap<String, String>) -> Context {
    extract(fields)
}

/// [`stored_context`] of `span`'s context, or of `fallback` (typically the caller's context)
/// when the span has none because this process installed no OpenTelemetry layer: it exports no
/// spans, but later work can still join the caller's trace.
pub fn stored_span_context(span: &tracing::Span, fallback: &Context) -> Option<String> {
    let own = span.context();
    if own.span().span_context().is_valid() {
        stored_context(&own)
    } else {
        stored_context(fallback)
    }
}

/// The context [`stored_context`] wrote; an empty context for text it did not write.
pub fn context_from_stored(text: &str) -> Context {
    let fields: HashMap<String, String> = serde_json::from_str(text).unwrap_or_default();
    extract_fields(&fields)
}

#[cfg(test)]
mod tests {
    use opentelemetry::trace::{
        SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState, TracerProvider as _,
    };
    use opentelemetry_sdk::trace::SdkTracerProvider;
    use tracing::Instrument as _;
    use tracing_subscriber::layer::SubscriberExt as _;

    use super::*;

    const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

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

    fn header<'a>(pairs: &'a [(&'static str, String)], key: &str) -> Option<&'a str> {
        pairs
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, value)| value.as_str())
    }

    #[test]
    fn kafka_headers_round_trip() {
        let cx = context_with_event_id(&sample_context(), "e-1");
        let headers = with_event_id(inject_kafka(&cx, OwnedHeaders::new()), "e-1");
        assert_eq!(header_str(&headers, TRACEPARENT_HEADER), Some(TRACEPARENT));
        assert_eq!(header_str(&headers, TRACESTATE_HEADER), Some("vendor=x"));
        assert_eq!(header_str(&headers, BAGGAGE_HEADER), Some("event_id=e-1"));
        assert_eq!(event_id_header(&headers), Some("e-1"));
        let extracted = extract_kafka(&headers);
        assert_eq!(
            extracted.span().span_context().trace_id(),
            sample_context().span().span_context().trace_id()
        );
        assert!(extracted.span().span_context().is_remote());
        assert_eq!(event_id_in(&extracted).as_deref(), Some("e-1"));
    }

    #[test]
    fn grpc_metadata_round_trip() {
        let mut metadata = MetadataMap::new();
        inject_grpc(
            &context_with_event_id(&sample_context(), "e-2"),
            &mut metadata,
        );
        let extracted = extract_grpc(&metadata);
        assert_eq!(
            extracted.span().span_context().span_id(),
            sample_context().span().span_context().span_id()
        );
        assert_eq!(event_id_in(&extracted).as_deref(), Some("e-2"));
    }

    #[test]
    fn http_headers_round_trip() {
        let mut headers = http::HeaderMap::new();
        inject_http(
            &context_with_event_id(&sample_context(), "e-3"),
            &mut headers,
        );
        assert_eq!(
            headers.get(TRACEPARENT_HEADER).map(|v| v.as_bytes()),
            Some(TRACEPARENT.as_bytes())
        );
        let extracted = extract_http(&headers);
        assert_eq!(
            extracted.span().span_context().trace_id(),
            sample_context().span().span_context().trace_id()
        );
        assert_eq!(event_id_in(&extracted).as_deref(), Some("e-3"));
    }

    #[test]
    fn stored_context_round_trips_and_empty_stores_nothing() {
        let cx = context_with_event_id(&sample_context(), "e-4");
        let stored = stored_context(&cx);
        let restored = context_from_stored(stored.as_deref().unwrap_or_default());
        assert_eq!(
            restored.span().span_context().span_id(),
            sample_context().span().span_context().span_id()
        );
        assert_eq!(event_id_in(&restored).as_deref(), Some("e-4"));
        assert_eq!(stored_context(&Context::new()), None);
        let garbage = context_from_stored("not json");
        assert!(!garbage.span().span_context().is_valid());
        assert_eq!(event_id_in(&garbage), None);
    }

    #[test]
    fn an_items_context_fields_round_trip() {
        let fields = context_fields(&context_with_event_id(&sample_context(), "e-5"));
        assert_eq!(
            fields.get(TRACEPARENT_HEADER).map(String::as_str),
            Some(TRACEPARENT)
        );
        let extracted = extract_fields(&fields);
        assert_eq!(
            extracted.span().span_context().span_id(),
            sample_context().span().span_context().span_id()
        );
        assert_eq!(event_id_in(&extracted).as_deref(), Some("e-5"));
        assert!(context_fields(&Context::new()).is_empty());
        assert!(
            !extract_fields(&HashMap::new())
                .span()
                .span_context()
                .is_valid()
        );
    }

    #[test]
    fn event_ids_with_reserved_characters_round_trip() {
        for id in ["a%20b", "x,y;z=w", "évé nt/1", "100%", "k=v;prop"] {
            let headers = inject_kafka(
                &context_with_event_id(&Context::new(), id),
                OwnedHeaders::new(),
            );
            let extracted = extract_kafka(&headers);
            assert_eq!(event_id_in(&extracted).as_deref(), Some(id), "{headers:?}");
        }
    }

    #[test]
    fn a_new_event_id_replaces_the_old_and_keeps_other_baggage() {
        let cx = Context::new().with_baggage([opentelemetry::KeyValue::new("tenant", "t-9")]);
        let cx = context_with_event_id(&context_with_event_id(&cx, "old"), "new");
        assert_eq!(event_id_in(&cx).as_deref(), Some("new"));
        assert_eq!(
            cx.baggage().get("tenant").map(StringValue::as_str),
            Some("t-9")
        );
        assert_eq!(cx.baggage().len(), 2);
        assert_eq!(event_id_in(&Context::new()), None);
        let same = context_with_event_id(&cx, "new");
        assert_eq!(event_id_in(&same).as_deref(), Some("new"));
        assert_eq!(same.baggage().len(), 2, "the same id again adds nothing");
    }

    #[test]
    fn missing_context_extracts_as_invalid() {
        let extracted = extract_kafka(&OwnedHeaders::new());
        assert!(!extracted.span().span_context().is_valid());
        assert!(event_id_header(&OwnedHeaders::new()).is_none());
        let long = "e".repeat(eos_core::envelope::MAX_ID_BYTES + 1);
        let hostile = OwnedHeaders::new().insert(rdkafka::message::Header {
            key: EVENT_ID_HEADER,
            value: Some(long.as_str()),
        });
        assert!(
            event_id_header(&hostile).is_none(),
            "an over-long id is ignored"
        );
        assert_eq!(event_id_in(&extracted), None);
    }

    #[test]
    fn extraction_ignores_the_current_context() {
        // A record without trace headers, read while another event's context is current, must
        // not inherit that event's trace or id.
        let _current = context_with_event_id(&sample_context(), "other").attach();
        let extracted = extract_kafka(&OwnedHeaders::new());
        assert!(!extracted.span().span_context().is_valid());
        assert_eq!(event_id_in(&extracted), None);
        let extracted = extract_http(&http::HeaderMap::new());
        assert!(!extracted.span().span_context().is_valid());
        assert_eq!(event_id_in(&extracted), None);
    }

    #[test]
    fn an_empty_context_injects_nothing() {
        assert!(context_headers(&Context::new()).is_empty());
    }

    /// What DedupClient and ProviderClient rely on: they inject `Span::current().context()`,
    /// from inside a span whose (grand)parent was set with [`context_with_event_id`].
    #[test]
    fn a_span_parented_with_an_event_id_forwards_it_to_every_request_made_under_it() {
        let provider = SdkTracerProvider::builder().build();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
        tracing::subscriber::with_default(subscriber, || {
            let write = tracing::info_span!("sink-writer write");
            assert!(
                write
                    .set_parent(context_with_event_id(&sample_context(), "e-42"))
                    .is_ok()
            );

            // The span itself.
            let pairs = context_headers(&write.context());
            let traceparent = header(&pairs, TRACEPARENT_HEADER).unwrap_or_default();
            assert!(
                traceparent.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"),
                "same trace: {traceparent}"
            );
            assert_ne!(
                traceparent, TRACEPARENT,
                "its own span id, not its parent's"
            );
            assert_eq!(header(&pairs, BAGGAGE_HEADER), Some("event_id=e-42"));

            // A child span created while it is entered (a client call inside it).
            let from_child = write.in_scope(|| {
                let call = tracing::info_span!("provider call");
                call.in_scope(|| context_headers(&tracing::Span::current().context()))
            });
            assert_eq!(header(&from_child, BAGGAGE_HEADER), Some("event_id=e-42"));
            assert!(
                header(&from_child, TRACEPARENT_HEADER)
                    .is_some_and(|tp| tp.contains("4bf92f3577b34da6a3ce929d0e0e4736"))
            );

            // A child span's future under `.instrument`, the way async clients run.
            let runtime = tokio::runtime::Builder::new_current_thread()
                .build()
                .expect("a current-thread runtime");
            let mut metadata = MetadataMap::new();
            let call = tracing::info_span!(parent: &write, "dedup.Begin");
            runtime.block_on(
                async {
                    tokio::task::yield_now().await;
                    inject_grpc(&tracing::Span::current().context(), &mut metadata);
                }
                .instrument(call),
            );
            assert_eq!(
                event_id_in(&extract_grpc(&metadata)).as_deref(),
                Some("e-42")
            );
        });
    }
}
