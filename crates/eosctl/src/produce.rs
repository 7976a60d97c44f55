//! `eosctl produce`: writes a [`Workload`] to a topic the way an at-least-once producer does —
//! with re-deliveries, malformed records and reused ids — through an idempotent producer, so
//! every duplicate on the topic is one the workload meant to write, not one the client added.
//!
//! Every record gets an `eosctl produce` span (OpenTelemetry messaging conventions, kind
//! producer), ended when the broker acknowledges the record. An event's first send *is* the span
//! its records' `traceparent` names, so the trace of an event starts here; a re-delivery is a
//! child span of that first send. Without an OTLP endpoint the spans are no-ops.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use indicatif::ProgressBar;
use opentelemetry::global::{BoxedSpan, BoxedTracer};
use opentelemetry::trace::{Span as _, SpanKind, Status, TraceContextExt as _, Tracer as _};
use opentelemetry::{Context, KeyValue};
use rdkafka::ClientContext;
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, Message as _, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use serde::Serialize;

use eos_runtime::backoff::send_when_queue_has_room;
use eos_runtime::kafka_clients;

use crate::kafka_client::{ClusterError, KafkaSettings, TopicLayout, ensure_topic};
use crate::workload::{
    GeneratedRecord, MalformedKind, RecordKind, SpecError, Workload, WorkloadSpec,
};

/// How often the progress bar is refreshed, in records.
const PROGRESS_EVERY: u64 = 1000;

#[derive(Debug, Clone)]
pub struct ProduceOptions {
    pub topic: String,
    pub layout: TopicLayout,
    /// Records per second; 0 for as fast as the broker takes them.
    pub rate: u64,
    /// librdkafka `message.timeout.ms`: how long a record may take to be acknowledged.
    pub delivery_timeout: Duration,
    pub spec: WorkloadSpec,
}

#[derive(Debug, thiserror::Error)]
pub enum ProduceError {
    #[error(transparent)]
    Spec(#[from] SpecError),
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    #[error("cannot create the Kafka producer")]
    Producer(#[source] KafkaError),
    #[error("cannot send record {index}")]
    Send { index: u64, source: KafkaError },
    #[error("{failed} of {sent} records were not delivered (first error: {first_error})")]
    Delivery {
        failed: u64,
        sent: u64,
        first_error: String,
    },
    #[error("{undelivered} of {sent} records were still unacknowledged after {timeout:?}")]
    Unacknowledged {
        undelivered: u64,
        sent: u64,
        timeout: Duration,
    },
    #[error(
        "interrupted after sending {sent} of {planned} records (all sent records were delivered)"
    )]
    Interrupted { sent: u64, planned: u64 },
    #[error("producer task failed")]
    Task(#[from] tokio::task::JoinError),
}

/// What was written. Serialised as the `--json` output.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ProduceSummary {
    pub topic: String,
    pub partitions: usize,
    pub topic_created: bool,
    pub seed: u64,
    /// Distinct valid events (`--count`).
    pub logical_events: u64,
    /// Records written: logical events plus duplicates, malformed records and conflicts.
    pub physical_records: u64,
    pub duplicates: u64,
    pub malformed: u64,
    pub malformed_by_kind: BTreeMap<MalformedKind, u64>,
    pub conflicts: u64,
    /// Sum of `value` over the logical events: what an exactly-once consumer must end up with.
    pub sum_logical_values: i128,
    /// Sum of `value` over every valid record written, re-deliveries and conflicts included.
    pub sum_valid_physical_values: i128,
    pub bytes: u64,
    pub elapsed_seconds: f64,
    pub records_per_second: f64,
    pub megabytes_per_second: f64,
}

impl ProduceSummary {
    fn count(&mut self, kind: RecordKind, bytes: usize) {
        self.physical_records += 1;
        self.bytes += bytes as u64;
        match kind {
            RecordKind::Logical { value, .. } => {
                self.logical_events += 1;
                self.sum_logical_values += i128::from(value);
                self.sum_valid_physical_values += i128::from(value);
            }
            RecordKind::Duplicate { value, .. } => {
                self.duplicates += 1;
                self.sum_valid_physical_values += i128::from(value);
            }
            RecordKind::Conflict { value, .. } => {
                self.conflicts += 1;
                self.sum_valid_physical_values += i128::from(value);
            }
            RecordKind::Malformed(kind) => {
                self.malformed += 1;
                *self.malformed_by_kind.entry(kind).or_default() += 1;
            }
        }
    }

    fn finish(&mut self, elapsed: Duration) {
        let seconds = elapsed.as_secs_f64();
        self.elapsed_seconds = seconds;
        if seconds > 0.0 {
            self.records_per_second = self.physical_records as f64 / seconds;
            self.megabytes_per_second = self.bytes as f64 / seconds / 1_000_000.0;
        }
    }
}

/// Counts acknowledgements as librdkafka reports them, from its polling thread, and ends each
/// record's span there.
#[derive(Debug, Default)]
struct DeliveryTracker {
    delivered: AtomicU64,
    failed: AtomicU64,
    first_error: Mutex<Option<String>>,
}

impl ClientContext for DeliveryTracker {
    fn error(&self, error: KafkaError, reason: &str) {
        eos_runtime::kafka_errors::report_client_error(&error, reason);
    }
}

impl ProducerContext for DeliveryTracker {
    type DeliveryOpaque = Box<BoxedSpan>;

    fn delivery(&self, result: &DeliveryResult<'_>, mut span: Box<BoxedSpan>) {
        match result {
            Ok(message) => {
                self.delivered.fetch_add(1, Ordering::Relaxed);
                if span.is_recording() {
                    span.set_attribute(KeyValue::new(
                        "messaging.destination.partition.id",
                        message.partition().to_string(),
                    ));
                    span.set_attribute(KeyValue::new("messaging.kafka.offset", message.offset()));
                }
            }
            Err((error, _)) => {
                self.failed.fetch_add(1, Ordering::Relaxed);
                if let Ok(mut first) = self.first_error.lock() {
                    first.get_or_insert_with(|| error.to_string());
                }
                span.set_status(Status::error(error.to_string()));
            }
        }
        span.end();
    }
}

/// The `eosctl produce` span of one record, started now and ended on its acknowledgement.
///
/// Built with the OpenTelemetry API rather than `tracing`: an event's first send must have the
/// span id its `traceparent` header already names (drawn from the seed, so the workload stays
/// deterministic and a re-delivery can name the same parent), and only a span builder can set ids.
fn send_span(tracer: &BoxedTracer, topic: &str, record: &GeneratedRecord) -> BoxedSpan {
    let original = record.send.span_context();
    let mut builder = tracer
        .span_builder("eosctl produce")
        .with_kind(SpanKind::Producer);
    let parent = if record.is_redelivery() {
        Context::new().with_remote_span_context(original)
    } else {
        builder = builder
            .with_trace_id(original.trace_id())
            .with_span_id(original.span_id());
        Context::new()
    };
    let mut attributes = Vec::with_capacity(8);
    attributes.extend([
        KeyValue::new("messaging.system", "kafka"),
        KeyValue::new("messaging.operation.type", "send"),
        KeyValue::new("messaging.operation.name", "send"),
        KeyValue::new("messaging.destination.name", topic.to_owned()),
        KeyValue::new("messaging.message.body.size", record.value.len() as i64),
    ]);
    if let Ok(key) = std::str::from_utf8(&record.key) {
        attributes.push(KeyValue::new("messaging.kafka.message.key", key.to_owned()));
    }
    if let Some(event_id) = record.event_id() {
        attributes.push(KeyValue::new("event_id", event_id.to_owned()));
    }
    if record.is_redelivery() {
        attributes.push(KeyValue::new("eos.redelivery", true));
    }
    builder
        .with_attributes(attributes)
        .start_with_context(tracer, &parent)
}

/// Creates the topic if needed, then writes the workload. `stop` ends the run early (the records
/// already sent are still waited for).
pub async fn run(
    settings: &KafkaSettings,
    options: ProduceOptions,
    progress: ProgressBar,
    stop: Arc<AtomicBool>,
) -> Result<ProduceSummary, ProduceError> {
    let workload = Workload::new(options.spec.clone())?;
    let planned = workload.spec().physical_records();
    let (partitions, created) = ensure_topic(settings, &options.topic, options.layout).await?;
    let producer = producer(settings, options.delivery_timeout)?;
    let mut summary = tokio::task::spawn_blocking(move || {
        let seed = options.spec.seed;
        send_all(
            &producer,
            &options.send(),
            (workload, planned, seed),
            &progress,
            &stop,
        )
    })
    .await??;
    summary.partitions = partitions;
    summary.topic_created = created;
    Ok(summary)
}

/// Where and how fast `send_all` writes.
#[derive(Debug, Clone)]
pub struct SendOptions {
    pub topic: String,
    /// Records per second; 0 for as fast as the broker takes them.
    pub rate: u64,
    /// librdkafka `message.timeout.ms`.
    pub delivery_timeout: Duration,
}

impl ProduceOptions {
    fn send(&self) -> SendOptions {
        SendOptions {
            topic: self.topic.clone(),
            rate: self.rate,
            delivery_timeout: self.delivery_timeout,
        }
    }
}

/// Writes `records` (e.g. [`Workload::ambiguous_records`] of `seed`) to an existing topic, in
/// order, and waits for every acknowledgement.
pub async fn write_records(
    settings: &KafkaSettings,
    options: SendOptions,
    seed: u64,
    records: Vec<GeneratedRecord>,
) -> Result<ProduceSummary, ProduceError> {
    let producer = producer(settings, options.delivery_timeout)?;
    let planned = records.len() as u64;
    tokio::task::spawn_blocking(move || {
        send_all(
            &producer,
            &options,
            (records.into_iter(), planned, seed),
            &ProgressBar::hidden(),
            &AtomicBool::new(false),
        )
    })
    .await?
}

fn producer(
    settings: &KafkaSettings,
    delivery_timeout: Duration,
) -> Result<ThreadedProducer<DeliveryTracker>, ProduceError> {
    // Idempotence: a retry inside the client never adds a duplicate the workload did not mean
    // to write, and per-partition order is kept.
    kafka_clients::idempotent_producer(&settings.client_config())
        .set("allow.auto.create.topics", "false")
        .set("linger.ms", "5")
        .set("batch.size", "1000000")
        .set(
            "message.timeout.ms",
            delivery_timeout.as_millis().to_string(),
        )
        .create_with_context(DeliveryTracker::default())
        .map_err(ProduceError::Producer)
}

/// Sends `records` (`planned` of them, made with `seed`), paced at `options.rate`.
fn send_all(
    producer: &ThreadedProducer<DeliveryTracker>,
    options: &SendOptions,
    (records, planned, seed): (impl Iterator<Item = GeneratedRecord>, u64, u64),
    progress: &ProgressBar,
    stop: &AtomicBool,
) -> Result<ProduceSummary, ProduceError> {
    let mut summary = ProduceSummary {
        topic: options.topic.clone(),
        seed,
        ..ProduceSummary::default()
    };
    let tracker = producer.context();
    let tracer = opentelemetry::global::tracer("eosctl");
    let started = Instant::now();
    let mut interrupted = false;
    for (index, record) in (0u64..).zip(records) {
        if stop.load(Ordering::Relaxed) {
            interrupted = true;
            break;
        }
        if options.rate > 0 {
            // Pace against the start, not the previous record, so sleep overshoot does not
            // accumulate into a lower rate.
            let due = Duration::from_secs_f64(index as f64 / options.rate as f64);
            if let Some(wait) = due.checked_sub(started.elapsed()) {
                std::thread::sleep(wait);
            }
        }
        let headers = record
            .headers
            .iter()
            .fold(OwnedHeaders::new(), |headers, (key, value)| {
                headers.insert(Header {
                    key,
                    value: Some(value.as_slice()),
                })
            });
        let span = Box::new(send_span(&tracer, &options.topic, &record));
        let pending = BaseRecord::with_opaque_to(&options.topic, span)
            .key(record.key.as_slice())
            .payload(record.value.as_slice())
            .headers(headers);
        #[expect(
            clippy::result_large_err,
            reason = "rdkafka's send hands the record back inside its error"
        )]
        let sent = send_when_queue_has_room(
            pending,
            |pending| producer.send(pending),
            std::thread::sleep,
        );
        if let Err((source, returned)) = sent {
            let mut span = returned.delivery_opaque;
            span.set_status(Status::error(source.to_string()));
            span.end();
            return Err(ProduceError::Send { index, source });
        }
        summary.count(record.kind, record.value.len());
        if (index + 1).is_multiple_of(PROGRESS_EVERY) {
            progress.set_position(tracker.delivered.load(Ordering::Relaxed));
        }
    }

    // Wait for every acknowledgement, keeping the bar moving.
    let deadline = Instant::now() + options.delivery_timeout + Duration::from_secs(5);
    while producer.in_flight_count() > 0 && Instant::now() < deadline {
        // A flush error is only the timeout of this slice; the loop condition decides.
        let _ = producer.flush(Duration::from_millis(100));
        progress.set_position(tracker.delivered.load(Ordering::Relaxed));
    }
    summary.finish(started.elapsed());
    progress.finish_and_clear();

    let sent = summary.physical_records;
    let failed = tracker.failed.load(Ordering::Relaxed);
    if failed > 0 {
        let first_error = tracker
            .first_error
            .lock()
            .ok()
            .and_then(|first| first.clone())
            .unwrap_or_default();
        return Err(ProduceError::Delivery {
            failed,
            sent,
            first_error,
        });
    }
    let delivered = tracker.delivered.load(Ordering::Relaxed);
    if delivered < sent {
        return Err(ProduceError::Unacknowledged {
            undelivered: sent - delivered,
            sent,
            timeout: options.delivery_timeout,
        });
    }
    if interrupted {
        return Err(ProduceError::Interrupted { sent, planned });
    }
    tracing::debug!(
        topic = %summary.topic,
        records = sent,
        elapsed_ms = started.elapsed().as_millis(),
        "all records delivered"
    );
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use opentelemetry::trace::{SpanId, TracerProvider as _};
    use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};

    use super::*;

    fn attribute(span: &SpanData, key: &str) -> Option<String> {
        span.attributes
            .iter()
            .find(|kv| kv.key.as_str() == key)
            .map(|kv| kv.value.to_string())
    }

    #[test]
    fn a_first_send_is_the_traceparent_span_and_a_redelivery_its_child() {
        let ended = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(ended.clone())
            .build();
        let tracer = BoxedTracer::new(Box::new(provider.tracer("eosctl")));
        let spec = WorkloadSpec {
            seed: 3,
            count: 200,
            entities: 10,
            duplicate_ratio: 0.1,
            bad_ratio: 0.0,
            conflict_ratio: 0.0,
            value_bytes: 100,
            occurred_at_base: time::macros::datetime!(2026-01-02 03:04:05 UTC),
        };
        let records: Vec<GeneratedRecord> = Workload::new(spec).expect("valid spec").collect();
        for record in &records {
            send_span(&tracer, "payments", record).end();
        }

        let ended = ended.get_finished_spans().expect("spans recorded");
        assert_eq!(ended.len(), records.len());
        let mut redeliveries = 0;
        for (record, span) in records.iter().zip(ended.iter()) {
            let send = record.send;
            assert_eq!(span.name, "eosctl produce");
            assert_eq!(span.span_kind, SpanKind::Producer);
            assert_eq!(span.span_context.trace_id(), send.trace_id);
            assert_eq!(attribute(span, "event_id").as_deref(), record.event_id());
            assert_eq!(
                attribute(span, "messaging.destination.name").as_deref(),
                Some("payments")
            );
            assert_eq!(
                attribute(span, "messaging.operation.type").as_deref(),
                Some("send")
            );
            if record.is_redelivery() {
                redeliveries += 1;
                assert_eq!(span.parent_span_id, send.span_id);
                assert_ne!(span.span_context.span_id(), send.span_id);
            } else {
                assert_eq!(span.span_context.span_id(), send.span_id);
                assert_eq!(span.parent_span_id, SpanId::INVALID, "a root");
            }
        }
        assert_eq!(redeliveries, 20);
    }
}
