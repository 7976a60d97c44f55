//! An in-process OTLP/gRPC trace collector: the `opentelemetry.proto.collector.trace.v1.
//! TraceService/Export` endpoint the services' exporters send to when
//! `OTEL_EXPORTER_OTLP_ENDPOINT` points at it. It keeps every span it receives, flattened to what
//! the trace tests check (service, ids, parent, name, kind, links, attributes), and answers
//! questions by `event_id`.
//!
//! It runs on its own thread and runtime, so sync tests can use it and a test's blocking calls
//! never starve it.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::trace::v1::span;
use tokio::sync::oneshot;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status};

/// The attribute every span of an event carries.
pub const EVENT_ID_ATTRIBUTE: &str = "event_id";

/// A span kind, as OTLP sends it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SpanKind {
    Unspecified,
    Internal,
    Server,
    Client,
    Producer,
    Consumer,
}

impl From<i32> for SpanKind {
    fn from(kind: i32) -> Self {
        match span::SpanKind::try_from(kind) {
            Ok(span::SpanKind::Internal) => Self::Internal,
            Ok(span::SpanKind::Server) => Self::Server,
            Ok(span::SpanKind::Client) => Self::Client,
            Ok(span::SpanKind::Producer) => Self::Producer,
            Ok(span::SpanKind::Consumer) => Self::Consumer,
            Ok(span::SpanKind::Unspecified) | Err(_) => Self::Unspecified,
        }
    }
}

/// An attribute value; arrays and maps are kept as their debug form.
#[derive(Debug, Clone, PartialEq)]
pub enum AttributeValue {
    String(String),
    Bool(bool),
    Int(i64),
    Double(f64),
    Other(String),
}

impl AttributeValue {
    fn from_proto(value: Option<AnyValue>) -> Self {
        match value.and_then(|value| value.value) {
            Some(any_value::Value::StringValue(s)) => Self::String(s),
            Some(any_value::Value::BoolValue(b)) => Self::Bool(b),
            Some(any_value::Value::IntValue(i)) => Self::Int(i),
            Some(any_value::Value::DoubleValue(d)) => Self::Double(d),
            Some(other) => Self::Other(format!("{other:?}")),
            None => Self::Other(String::new()),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Self::String(s) => Some(s),
            _ => None,
        }
    }
}

impl fmt::Display for AttributeValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::String(s) | Self::Other(s) => f.write_str(s),
            Self::Bool(b) => write!(f, "{b}"),
            Self::Int(i) => write!(f, "{i}"),
            Self::Double(d) => write!(f, "{d}"),
        }
    }
}

/// A link to another span (trace id and span id, lowercase hex).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpanLink {
    pub trace_id: String,
    pub span_id: String,
}

/// One received span. Ids are lowercase hex (32 digits for a trace, 16 for a span).
#[derive(Debug, Clone, PartialEq)]
pub struct CollectedSpan {
    /// The `service.name` resource attribute of the exporting process.
    pub service_name: String,
    pub trace_id: String,
    pub span_id: String,
    /// `None` for a root span.
    pub parent_span_id: Option<String>,
    pub name: String,
    pub kind: SpanKind,
    pub links: Vec<SpanLink>,
    pub attributes: BTreeMap<String, AttributeValue>,
}

impl CollectedSpan {
    pub fn attribute(&self, key: &str) -> Option<&AttributeValue> {
        self.attributes.get(key)
    }

    /// A string attribute's value.
    pub fn str_attribute(&self, key: &str) -> Option<&str> {
        self.attribute(key).and_then(AttributeValue::as_str)
    }

    pub fn event_id(&self) -> Option<&str> {
        self.str_attribute(EVENT_ID_ATTRIBUTE)
    }
}

impl fmt::Display for CollectedSpan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {:?} {:?} trace={} span={} parent={} event_id={:?}",
            self.service_name,
            self.name,
            self.kind,
            self.trace_id,
            self.span_id,
            self.parent_span_id.as_deref().unwrap_or("-"),
            self.event_id(),
        )
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

fn attributes(attributes: Vec<KeyValue>) -> BTreeMap<String, AttributeValue> {
    attributes
        .into_iter()
        .map(|kv| (kv.key, AttributeValue::from_proto(kv.value)))
        .collect()
}

type Store = Arc<Mutex<Vec<CollectedSpan>>>;

fn lock(store: &Store) -> MutexGuard<'_, Vec<CollectedSpan>> {
    // Every update is one `extend`: a panic elsewhere cannot leave the list half-written.
    store.lock().unwrap_or_else(PoisonError::into_inner)
}

#[derive(Debug, Clone)]
struct Receiver {
    store: Store,
}

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: Request<ExportTraceServiceRequest>,
    ) -> Result<Response<ExportTraceServiceResponse>, Status> {
        let mut received = Vec::new();
        for resource_spans in request.into_inner().resource_spans {
            let service_name = resource_spans
                .resource
                .map(|resource| attributes(resource.attributes))
                .and_then(|mut attributes| attributes.remove("service.name"))
                .map(|name| name.to_string())
                .unwrap_or_default();
            for scope_spans in resource_spans.scope_spans {
                for span in scope_spans.spans {
                    received.push(CollectedSpan {
                        service_name: service_name.clone(),
                        trace_id: hex(&span.trace_id),
                        span_id: hex(&span.span_id),
                        parent_span_id: (!span.parent_span_id.is_empty())
                            .then(|| hex(&span.parent_span_id)),
                        name: span.name,
                        kind: SpanKind::from(span.kind),
                        links: span
                            .links
                            .into_iter()
                            .map(|link| SpanLink {
                                trace_id: hex(&link.trace_id),
                                span_id: hex(&link.span_id),
                            })
                            .collect(),
                        attributes: attributes(span.attributes),
                    });
                }
            }
        }
        lock(&self.store).extend(received);
        Ok(Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

/// The collector; stopped when dropped.
#[derive(Debug)]
pub struct OtlpCollector {
    addr: SocketAddr,
    store: Store,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl OtlpCollector {
    /// Binds 127.0.0.1:0 and serves until dropped.
    pub fn start() -> anyhow::Result<Self> {
        let store = Store::default();
        let (stop, stopped) = oneshot::channel::<()>();
        let (bound, bound_rx) = std::sync::mpsc::channel::<anyhow::Result<SocketAddr>>();
        let receiver = Receiver {
            store: store.clone(),
        };
        let thread = std::thread::Builder::new()
            .name("otlp-collector".into())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(error) => {
                        let _ = bound.send(Err(error.into()));
                        return;
                    }
                };
                runtime.block_on(async move {
                    let listener = match tokio::net::TcpListener::bind("127.0.0.1:0").await {
                        Ok(listener) => listener,
                        Err(error) => {
                            let _ = bound.send(Err(error.into()));
                            return;
                        }
                    };
                    let _ = bound.send(listener.local_addr().map_err(Into::into));
                    let served = tonic::transport::Server::builder()
                        .add_service(TraceServiceServer::new(receiver))
                        .serve_with_incoming_shutdown(TcpIncoming::from(listener), async {
                            let _ = stopped.await;
                        })
                        .await;
                    if let Err(error) = served {
                        eprintln!("otlp collector stopped: {error}");
                    }
                });
            })
            .context("cannot start the OTLP collector thread")?;
        let addr = bound_rx
            .recv()
            .context("the OTLP collector thread ended before binding")??;
        Ok(Self {
            addr,
            store,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// The value for `OTEL_EXPORTER_OTLP_ENDPOINT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The environment that points a service's exporter here, exporting every 100 ms (pass it
    /// through [`env_refs`]).
    pub fn exporter_env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("OTEL_EXPORTER_OTLP_ENDPOINT", self.endpoint()),
            ("OTEL_BSP_SCHEDULE_DELAY", "100".to_owned()),
        ]
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<CollectedSpan> {
        lock(&self.store).clone()
    }

    pub fn span_count(&self) -> usize {
        lock(&self.store).len()
    }

    /// The spans whose `event_id` attribute is `event_id`.
    pub fn spans_of_event(&self, event_id: &str) -> Vec<CollectedSpan> {
        lock(&self.store)
            .iter()
            .filter(|span| span.event_id() == Some(event_id))
            .cloned()
            .collect()
    }

    /// Every span with an `event_id` attribute, grouped by it.
    pub fn spans_by_event_id(&self) -> HashMap<String, Vec<CollectedSpan>> {
        let mut by_event: HashMap<String, Vec<CollectedSpan>> = HashMap::new();
        for span in lock(&self.store).iter() {
            if let Some(event_id) = span.event_id() {
                by_event
                    .entry(event_id.to_owned())
                    .or_default()
                    .push(span.clone());
            }
        }
        by_event
    }

    /// Every span of trace `trace_id`, whatever its attributes.
    pub fn spans_of_trace(&self, trace_id: &str) -> Vec<CollectedSpan> {
        lock(&self.store)
            .iter()
            .filter(|span| span.trace_id == trace_id)
            .cloned()
            .collect()
    }

    /// Waits until `done` holds for the spans received, polling every 50 ms; fails after
    /// `timeout` saying how many spans arrived.
    pub fn wait_until(
        &self,
        timeout: Duration,
        done: impl Fn(&[CollectedSpan]) -> bool,
    ) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if done(&lock(&self.store)) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                anyhow::bail!(
                    "the OTLP collector's spans did not reach the expected state within \
                     {timeout:?} ({} spans received)",
                    self.span_count()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for OtlpCollector {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Owned environment pairs as the borrowed ones `ServiceProcess::spawn` takes.
pub fn env_refs<'a>(pairs: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    pairs
        .iter()
        .map(|(key, value)| (*key, value.as_str()))
        .collect()
}

#[cfg(test)]
mod tests {
    use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
    use opentelemetry_proto::tonic::resource::v1::Resource;
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, span::Link};

    use super::*;

    fn string_kv(key: &str, value: &str) -> KeyValue {
        KeyValue {
            key: key.into(),
            value: Some(AnyValue {
                value: Some(any_value::Value::StringValue(value.into())),
            }),
        }
    }

    #[test]
    fn export_stores_spans_with_their_service_and_event_id() -> anyhow::Result<()> {
        let collector = OtlpCollector::start()?;
        let endpoint = collector.endpoint();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        runtime.block_on(async move {
            let mut client = TraceServiceClient::connect(endpoint).await?;
            let span = Span {
                trace_id: vec![0xab; 16],
                span_id: vec![0x01; 8],
                parent_span_id: vec![0x02; 8],
                name: "process".into(),
                kind: span::SpanKind::Consumer as i32,
                attributes: vec![
                    string_kv("event_id", "evt-1"),
                    KeyValue {
                        key: "messaging.kafka.offset".into(),
                        value: Some(AnyValue {
                            value: Some(any_value::Value::IntValue(7)),
                        }),
                    },
                ],
                links: vec![Link {
                    trace_id: vec![0xcd; 16],
                    span_id: vec![0x03; 8],
                    ..Link::default()
                }],
                ..Span::default()
            };
            let root = Span {
                trace_id: vec![0xab; 16],
                span_id: vec![0x02; 8],
                name: "send".into(),
                kind: span::SpanKind::Producer as i32,
                ..Span::default()
            };
            client
                .export(ExportTraceServiceRequest {
                    resource_spans: vec![ResourceSpans {
                        resource: Some(Resource {
                            attributes: vec![string_kv("service.name", "eos-processor")],
                            ..Resource::default()
                        }),
                        scope_spans: vec![ScopeSpans {
                            spans: vec![span, root],
                            ..ScopeSpans::default()
                        }],
                        ..ResourceSpans::default()
                    }],
                })
                .await?;
            anyhow::Ok(())
        })?;

        let spans = collector.spans_of_event("evt-1");
        assert_eq!(spans.len(), 1);
        let span = &spans[0];
        assert_eq!(span.service_name, "eos-processor");
        assert_eq!(span.trace_id, "ab".repeat(16));
        assert_eq!(span.span_id, "01".repeat(8));
        assert_eq!(
            span.parent_span_id.as_deref(),
            Some("02".repeat(8).as_str())
        );
        assert_eq!(span.kind, SpanKind::Consumer);
        assert_eq!(
            span.attribute("messaging.kafka.offset"),
            Some(&AttributeValue::Int(7))
        );
        assert_eq!(span.links[0].span_id, "03".repeat(8));
        let trace = collector.spans_of_trace(&"ab".repeat(16));
        assert_eq!(trace.len(), 2);
        assert!(trace.iter().any(|s| s.parent_span_id.is_none()));
        assert_eq!(collector.spans_by_event_id().len(), 1);
        Ok(())
    }
}
