//! Span export that never loses a span silently: every span a service ends is either exported
//! or counted in `eos_trace_spans_dropped_total{reason}` (docs/OBSERVABILITY.md).
//!
//! The SDK's batch processor drops a span when its queue is full and only logs the first drop.
//! [`CountedSpanProcessor`] keeps the spans in flight (handed to the batch processor, not yet
//! settled by the exporter) below the queue's capacity, so the batch processor never drops one
//! itself: a span over that bound is dropped here, and counted. [`CountedSpanExporter`] settles
//! each batch: exported, or failed (an export error, or a timeout that abandons the export).
//!
//! What no process can count is what it had not exported when it was SIGKILLed: at most the
//! spans ended in its last `OTEL_BSP_SCHEDULE_DELAY`.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use opentelemetry::Context;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter, SpanProcessor};

/// Spans dropped before export, by `reason`: `queue_full` or `export_failed`.
pub const SPANS_DROPPED: &str = "eos_trace_spans_dropped_total";
/// Spans the collector accepted.
pub const SPANS_EXPORTED: &str = "eos_trace_spans_exported_total";

const QUEUE_FULL: &str = "queue_full";
/// Slots of the batch processor's channel kept free of spans: its `SetResource` message and a
/// `Flush` or `Shutdown`.
const CONTROL_MESSAGE_ROOM: usize = 2;
const EXPORT_FAILED: &str = "export_failed";

/// Registers the span counters at 0, so a scrape shows them before the first drop. Called once
/// the Prometheus recorder is installed.
pub fn register_metrics() {
    metrics::describe_counter!(
        SPANS_DROPPED,
        "Spans ended but never exported, by reason (queue_full: more in flight than the export \
         queue holds; export_failed: the collector refused or did not answer in time)"
    );
    metrics::describe_counter!(SPANS_EXPORTED, "Spans the OTLP collector accepted");
    for reason in [QUEUE_FULL, EXPORT_FAILED] {
        metrics::counter!(SPANS_DROPPED, "reason" => reason).absolute(0);
    }
    metrics::counter!(SPANS_EXPORTED).absolute(0);
}

/// What the processor and the exporter share: the spans in flight between them, and the
/// lifetime totals (also logged at shutdown, when the metrics endpoint is already gone).
#[derive(Debug)]
pub struct SpanAccounting {
    capacity: usize,
    in_flight: AtomicUsize,
    exported: AtomicU64,
    dropped_queue_full: AtomicU64,
    dropped_export_failed: AtomicU64,
}

impl SpanAccounting {
    /// `capacity`: the batch processor's queue size; fewer spans than that are ever in flight.
    pub fn new(capacity: usize) -> Arc<Self> {
        Arc::new(Self {
            capacity,
            in_flight: AtomicUsize::new(0),
            exported: AtomicU64::new(0),
            dropped_queue_full: AtomicU64::new(0),
            dropped_export_failed: AtomicU64::new(0),
        })
    }

    /// Spans dropped in this process's life, by reason.
    pub fn dropped(&self) -> (u64, u64) {
        (
            self.dropped_queue_full.load(Ordering::Relaxed),
            self.dropped_export_failed.load(Ordering::Relaxed),
        )
    }

    /// Spans exported in this process's life.
    pub fn exported(&self) -> u64 {
        self.exported.load(Ordering::Relaxed)
    }

    /// Takes one span in flight, or says the queue is full (and counts it dropped).
    fn admit(&self) -> bool {
        // The batch processor's channel also carries its control messages: keep room for the
        // resource it is sent when the provider is built (still queued if its task has not run
        // yet) and for a flush or the shutdown. Without the first, a flush right after start-up
        // could find the channel full and fail.
        let admitted = self
            .in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n + CONTROL_MESSAGE_ROOM < self.capacity).then_some(n + 1)
            })
            .is_ok();
        if !admitted {
            self.dropped_queue_full.fetch_add(1, Ordering::Relaxed);
            metrics::counter!(SPANS_DROPPED, "reason" => QUEUE_FULL).increment(1);
        }
        admitted
    }

    fn settle(&self, spans: usize, exported: bool) {
        self.in_flight.fetch_sub(spans, Ordering::AcqRel);
        let spans = spans as u64;
        if exported {
            self.exported.fetch_add(spans, Ordering::Relaxed);
            metrics::counter!(SPANS_EXPORTED).increment(spans);
        } else {
            self.dropped_export_failed
                .fetch_add(spans, Ordering::Relaxed);
            metrics::counter!(SPANS_DROPPED, "reason" => EXPORT_FAILED).increment(spans);
        }
    }
}

/// Wraps the batch processor: admits a sampled span only while fewer than the queue's capacity
/// are in flight.
#[derive(Debug)]
pub struct CountedSpanProcessor<P> {
    inner: P,
    accounting: Arc<SpanAccounting>,
}

impl<P> CountedSpanProcessor<P> {
    pub fn new(inner: P, accounting: Arc<SpanAccounting>) -> Self {
        Self { inner, accounting }
    }
}

impl<P: SpanProcessor> SpanProcessor for CountedSpanProcessor<P> {
    fn on_start(&self, span: &mut Span, cx: &Context) {
        self.inner.on_start(span, cx);
    }

    fn on_end(&self, span: SpanData) {
        // An unsampled span is not exported, so it is not in flight either (the batch
        // processor ignores it the same way).
        if span.span_context.is_sampled() && self.accounting.admit() {
            self.inner.on_end(span);
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// Wraps the OTLP exporter: settles each batch as exported or failed.
pub struct CountedSpanExporter<E> {
    inner: E,
    accounting: Arc<SpanAccounting>,
}

impl<E> CountedSpanExporter<E> {
    pub fn new(inner: E, accounting: Arc<SpanAccounting>) -> Self {
        Self { inner, accounting }
    }
}

impl<E: fmt::Debug> fmt::Debug for CountedSpanExporter<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CountedSpanExporter")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

/// Settles a batch when dropped: as failed unless the export said it succeeded. A batch whose
/// export future is abandoned (the processor's export timeout) is settled as failed too.
struct BatchSettlement {
    accounting: Arc<SpanAccounting>,
    spans: usize,
    exported: bool,
}

impl Drop for BatchSettlement {
    fn drop(&mut self) {
        self.accounting.settle(self.spans, self.exported);
    }
}

impl<E: SpanExporter> SpanExporter for CountedSpanExporter<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let mut settlement = BatchSettlement {
            accounting: Arc::clone(&self.accounting),
            spans: batch.len(),
            exported: false,
        };
        let result = self.inner.export(batch).await;
        settlement.exported = result.is_ok();
        result
    }

    fn shutdown_with_timeout(&mut self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&mut self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry::trace::{Tracer as _, TracerProvider as _};
    use opentelemetry_sdk::error::OTelSdkError;
    use opentelemetry_sdk::trace::SdkTracerProvider;
    use opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor;
    use opentelemetry_sdk::trace::{BatchConfigBuilder, InMemorySpanExporter};

    use super::*;

    /// An exporter whose collector refuses everything.
    #[derive(Debug)]
    struct Refusing;

    impl SpanExporter for Refusing {
        async fn export(&self, _batch: Vec<SpanData>) -> OTelSdkResult {
            Err(OTelSdkError::InternalFailure("collector refused".into()))
        }
    }

    fn provider<E: SpanExporter + 'static>(
        exporter: E,
        queue: usize,
    ) -> (SdkTracerProvider, Arc<SpanAccounting>) {
        let accounting = SpanAccounting::new(queue);
        let batch = BatchSpanProcessor::builder(
            CountedSpanExporter::new(exporter, Arc::clone(&accounting)),
            opentelemetry_sdk::runtime::Tokio,
        )
        .with_batch_config(
            BatchConfigBuilder::default()
                .with_max_queue_size(queue)
                .with_scheduled_delay(Duration::from_secs(3600))
                .build(),
        )
        .build();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(CountedSpanProcessor::new(batch, Arc::clone(&accounting)))
            .build();
        (provider, accounting)
    }

    fn end_spans(provider: &SdkTracerProvider, count: usize) {
        let tracer = provider.tracer("test");
        for _ in 0..count {
            drop(tracer.start("span"));
        }
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn every_span_is_exported_or_counted_when_the_queue_overflows() {
        let exporter = InMemorySpanExporter::default();
        let (provider, accounting) = provider(exporter.clone(), 64);
        // No export runs before the flush (an hour's delay, and the 64-span export batch is never
        // reached), so all but the queue less its two control slots drop.
        end_spans(&provider, 200);
        // Flushed, not shut down: the in-memory exporter forgets its spans at shutdown.
        let flushing = provider.clone();
        let flushed = tokio::task::spawn_blocking(move || flushing.force_flush()).await;
        assert!(matches!(flushed, Ok(Ok(()))), "{flushed:?}");
        let exported = exporter.get_finished_spans().map_or(0, |spans| spans.len()) as u64;
        let (queue_full, failed) = accounting.dropped();
        assert_eq!(accounting.exported(), exported);
        assert_eq!((exported, queue_full, failed), (62, 138, 0));
        let _ = tokio::task::spawn_blocking(move || provider.shutdown()).await;
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_refused_export_is_counted_as_dropped() {
        let (provider, accounting) = provider(Refusing, 1_024);
        end_spans(&provider, 10);
        let _ = tokio::task::spawn_blocking(move || provider.shutdown()).await;
        assert_eq!(accounting.dropped(), (0, 10));
        assert_eq!(accounting.exported(), 0);
    }
}
