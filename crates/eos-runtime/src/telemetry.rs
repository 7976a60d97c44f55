//! Telemetry set-up shared by every binary: `tracing` logs to stderr (text or JSON), and spans
//! exported over OTLP/gRPC only when `OTEL_EXPORTER_OTLP_ENDPOINT` is set.

use std::fmt;
use std::io::IsTerminal as _;
use std::str::FromStr;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor;
use opentelemetry_sdk::trace::{BatchConfigBuilder, SdkTracerProvider};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// The environment variable that turns the OTLP exporter on (the OpenTelemetry standard name).
pub const OTLP_ENDPOINT_ENV: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
/// Spans waiting for export beyond this many are dropped (the OpenTelemetry standard name).
const BSP_MAX_QUEUE_SIZE_ENV: &str = "OTEL_BSP_MAX_QUEUE_SIZE";
/// The queue when `OTEL_BSP_MAX_QUEUE_SIZE` is not set: about a second of spans at the highest
/// rates here (roughly 1 KiB each, so tens of MiB at worst, and only during a burst).
const DEFAULT_SPAN_QUEUE: usize = 65_536;

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
    provider: Option<SdkTracerProvider>,
}

impl TelemetryGuard {
    /// Flushes pending spans. Runs the blocking flush off the async reactor.
    pub async fn shutdown(self) {
        let Some(provider) = self.provider else {
            return;
        };
        let flushed = tokio::task::spawn_blocking(move || provider.shutdown()).await;
        if let Ok(Err(error)) = flushed {
            eprintln!("telemetry: flushing spans failed: {error}");
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
    let otel_layer = provider
        .as_ref()
        .map(|provider| tracing_opentelemetry::layer().with_tracer(provider.tracer(service_name)));

    let registry = tracing_subscriber::registry().with(filter).with(otel_layer);
    match log_format {
        LogFormat::Text => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .with_ansi(std::io::stderr().is_terminal())
                    .with_writer(std::io::stderr),
            )
            .try_init()?,
        LogFormat::Json => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .flatten_event(true)
                    .with_current_span(false)
                    .with_writer(std::io::stderr),
            )
            .try_init()?,
    }
    Ok(TelemetryGuard { provider })
}

fn otlp_provider(service_name: &'static str) -> Result<SdkTracerProvider, TelemetryError> {
    // The exporter reads OTEL_EXPORTER_OTLP_ENDPOINT (and the other OTEL_* variables) itself.
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .build()?;
    // The SDK's default queue (2,048 spans) overflows within milliseconds of a burst — `eosctl
    // produce` ends ~75,000 spans a second — and a full queue drops spans silently.
    let mut batch = BatchConfigBuilder::default();
    if std::env::var_os(BSP_MAX_QUEUE_SIZE_ENV).is_none() {
        batch = batch.with_max_queue_size(DEFAULT_SPAN_QUEUE);
    }
    // Exports on the application's Tokio runtime: tonic needs a reactor, which the SDK's default
    // batch thread does not have.
    let processor = BatchSpanProcessor::builder(exporter, opentelemetry_sdk::runtime::Tokio)
        .with_batch_config(batch.build())
        .build();
    let provider = SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_resource(Resource::builder().with_service_name(service_name).build())
        .build();
    opentelemetry::global::set_tracer_provider(provider.clone());
    Ok(provider)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_format_parses() {
        assert_eq!("json".parse::<LogFormat>(), Ok(LogFormat::Json));
        assert_eq!("text".parse::<LogFormat>(), Ok(LogFormat::Text));
        assert!("xml".parse::<LogFormat>().is_err());
    }
}
