//! Telemetry set-up shared by every binary: `tracing` logs to stderr (text or JSON), and spans
//! exported over OTLP/gRPC only when `OTEL_EXPORTER_OTLP_ENDPOINT` is set.

use std::fmt;
use std::io::IsTerminal as _;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor;
use opentelemetry_sdk::trace::{BatchConfigBuilder, SdkTracerProvider};
use tracing_subscriber::layer::{Layer as _, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, filter};

use crate::span_export::{CountedSpanExporter, CountedSpanProcessor, SpanAccounting};

/// The environment variable that turns the OTLP exporter on (the OpenTelemetry standard name).
pub const OTLP_ENDPOINT_ENV: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
/// Spans waiting for export beyond this many are dropped (the OpenTelemetry standard name).
const BSP_MAX_QUEUE_SIZE_ENV: &str = "OTEL_BSP_MAX_QUEUE_SIZE";
/// The queue when `OTEL_BSP_MAX_QUEUE_SIZE` is not set: about a second of spans at the highest
/// rates here (roughly 1 KiB each, so tens of MiB at worst, and only during a burst).
const DEFAULT_SPAN_QUEUE: usize = 65_536;
/// How long an ended span may wait for export (the OpenTelemetry standard name, in ms).
const BSP_SCHEDULE_DELAY_ENV: &str = "OTEL_BSP_SCHEDULE_DELAY";
/// The export interval when `OTEL_BSP_SCHEDULE_DELAY` is not set, instead of the SDK's 5 s: a
/// SIGKILL loses the spans of about the last interval, and exporting 25 times as often costs no
/// CPU that could be measured; 100 ms could (docs/OBSERVABILITY.md has the trade-off).
const DEFAULT_SCHEDULE_DELAY: Duration = Duration::from_millis(200);

/// Spans opened once per record (module path prefix, span name) that carry the trace to the
/// exporter and nothing to the log: they are never entered, and what is logged about a record
/// carries its own fields (partition, offset, event_id). The log layer would otherwise format
/// every one's fields into a string nobody reads: 5% of the processor's loop at tens of
/// thousands of records a second (docs/BENCHMARKS.md). Without an exporter they are not
/// created at all.
const EXPORT_ONLY_SPANS: &[(&str, &str)] = &[
    ("eos_processor", "process"),
    ("sink_writer", "sink-writer write"),
];

/// The log layer's own filter: everything the global filter lets through but the export-only
/// spans.
fn logged(metadata: &tracing::Metadata<'_>) -> bool {
    logged_unless(EXPORT_ONLY_SPANS, metadata)
}

fn logged_unless(export_only: &[(&str, &str)], metadata: &tracing::Metadata<'_>) -> bool {
    !(metadata.is_span()
        && export_only.iter().any(|(module, name)| {
            metadata.name() == *name
                && metadata
                    .module_path()
                    .is_some_and(|path| path.starts_with(module))
        }))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

impl FromStr for LogFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "text" => Ok(Self::Text),
            "json" => Ok(Self::Json),
            other => Err(format!(
                "unknown log format {other:?}: expected text or json"
            )),
        }
    }
}

impl fmt::Display for LogFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Text => "text",
            Self::Json => "json",
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("cannot build the OTLP span exporter: {0}")]
    Exporter(#[from] opentelemetry_otlp::ExporterBuildError),
    #[error("cannot install the tracing subscriber: {0}")]
    Subscriber(#[from] tracing_subscriber::util::TryInitError),
}

/// Flushes and stops the span exporter; call [`TelemetryGuard::shutdown`] before exiting.
#[derive(Debug)]
#[must_use = "spans are only flushed when the guard is shut down"]
pub struct TelemetryGuard {
    provider: Option<(SdkTracerProvider, Arc<SpanAccounting>)>,
}

impl TelemetryGuard {
    /// Flushes pending spans. Runs the blocking flush off the async reactor.
    pub async fn shutdown(self) {
        let Some((provider, accounting)) = self.provider else {
            return;
        };
        let flushed = tokio::task::spawn_blocking(move || provider.shutdown()).await;
        if let Ok(Err(error)) = flushed {
            eprintln!("telemetry: flushing spans failed: {error}");
        }
        // The metrics endpoint is gone by now; the log is the last word on what was lost.
        let (queue_full, export_failed) = accounting.dropped();
        if queue_full + export_failed > 0 {
            tracing::warn!(
                exported = accounting.exported(),
                dropped_queue_full = queue_full,
                dropped_export_failed = export_failed,
                "spans were dropped in this process's life"
            );
        }
    }
}

/// Installs the global subscriber. `RUST_LOG` filters (default `info`). Must run inside a Tokio
/// runtime when the OTLP exporter is enabled, since spans are exported on that runtime.
pub fn init(
    service_name: &'static str,
    log_format: LogFormat,
) -> Result<TelemetryGuard, TelemetryError> {
    opentelemetry::global::set_text_map_propagator(crate::trace_context::propagator());
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));

    let provider = match std::env::var(OTLP_ENDPOINT_ENV) {
        Ok(endpoint) if !endpoint.trim().is_empty() => Some(otlp_provider(service_name)?),
        _ => None,
    };
    let otel_layer = provider.as_ref().map(|(provider, _)| {
        tracing_opentelemetry::layer().with_tracer(provider.tracer(service_name))
    });

    let registry = tracing_subscriber::registry().with(filter).with(otel_layer);
    match log_format {
        LogFormat::Text => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .with_ansi(std::io::stderr().is_terminal())
                    .with_writer(std::io::stderr)
                    .with_filter(filter::filter_fn(logged)),
            )
            .try_init()?,
        LogFormat::Json => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .flatten_event(true)
                    .with_current_span(false)
                    .with_writer(std::io::stderr)
                    .with_filter(filter::filter_fn(logged)),
            )
            .try_init()?,
    }
    Ok(TelemetryGuard { provider })
}

fn otlp_provider(
    service_name: &'static str,
) -> Result<(SdkTracerProvider, Arc<SpanAccounting>), TelemetryError> {
    // The exporter reads OTEL_EXPORTER_OTLP_ENDPOINT (and the other OTEL_* variables) itself.
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .build()?;
    // The SDK's default queue (2,048 spans) overflows within milliseconds of a burst — `eosctl
    // produce` ends ~75,000 spans a second — and a full queue drops spans silently.
    // The SDK reads the other OTEL_BSP_* variables itself; the queue size is read here too, since
    // the accounting needs it and the SDK's config does not tell it.
    let queue = std::env::var(BSP_MAX_QUEUE_SIZE_ENV)
        .ok()
        .and_then(|size| size.trim().parse().ok())
        .unwrap_or(DEFAULT_SPAN_QUEUE);
    let mut batch = BatchConfigBuilder::default().with_max_queue_size(queue);
    if std::env::var_os(BSP_SCHEDULE_DELAY_ENV).is_none() {
        batch = batch.with_scheduled_delay(DEFAULT_SCHEDULE_DELAY);
    }
    let batch = batch.build();
    let accounting = SpanAccounting::new(queue);
    let exporter = CountedSpanExporter::new(exporter, Arc::clone(&accounting));
    // Exports on the application's Tokio runtime: tonic needs a reactor, which the SDK's default
    // batch thread does not have.
    let processor = BatchSpanProcessor::builder(exporter, opentelemetry_sdk::runtime::Tokio)
        .with_batch_config(batch)
        .build();
    // The sampler is the SDK's default, which reads OTEL_TRACES_SAMPLER and
    // OTEL_TRACES_SAMPLER_ARG (parent-based, always on when unset).
    let provider = SdkTracerProvider::builder()
        .with_span_processor(CountedSpanProcessor::new(
            processor,
            Arc::clone(&accounting),
        ))
        .with_resource(Resource::builder().with_service_name(service_name).build())
        .build();
    opentelemetry::global::set_tracer_provider(provider.clone());
    Ok((provider, accounting))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_layer_skips_export_only_spans_and_keeps_the_rest() {
        use std::sync::{Arc, Mutex};

        /// Notes the name of every span the layer is told of.
        struct SpanNames(Arc<Mutex<Vec<String>>>);
        impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for SpanNames {
            fn on_new_span(
                &self,
                attrs: &tracing::span::Attributes<'_>,
                _: &tracing::span::Id,
                _: tracing_subscriber::layer::Context<'_, S>,
            ) {
                self.0
                    .lock()
                    .expect("not poisoned")
                    .push(attrs.metadata().name().to_owned());
            }
        }
        const EXPORT_ONLY: &[(&str, &str)] = &[("eos_runtime::telemetry", "per record")];
        let names = Arc::new(Mutex::new(Vec::new()));
        let subscriber = tracing_subscriber::registry().with(
            SpanNames(Arc::clone(&names))
                .with_filter(filter::filter_fn(|m| logged_unless(EXPORT_ONLY, m))),
        );
        tracing::subscriber::with_default(subscriber, || {
            let _record = tracing::info_span!("per record");
            let _batch = tracing::info_span!("per batch");
        });
        assert_eq!(*names.lock().expect("not poisoned"), ["per batch"]);
    }

    #[test]
    fn log_format_parses() {
        assert_eq!("json".parse::<LogFormat>(), Ok(LogFormat::Json));
        assert_eq!("text".parse::<LogFormat>(), Ok(LogFormat::Text));
        assert!("xml".parse::<LogFormat>().is_err());
    }
}
