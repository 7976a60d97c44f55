//! The provider's HTTP API. Handlers run in a span parented on the request's `traceparent`, tagged
//! with the `event_id` of its W3C baggage.

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Json, Response};
use axum::routing::{get, post};
use eos_runtime::trace_context;
use metrics::counter;
use metrics_exporter_prometheus::PrometheusHandle;
use serde_json::json;
use time::OffsetDateTime;
use tracing::Instrument as _;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use crate::faults::{AfterApply, Faults};
use crate::ledger::{Applied, Ledger};

pub(crate) const IDEMPOTENCY_KEY_HEADER: &str = "idempotency-key";
pub(crate) const REPLAYED_HEADER: &str = "idempotent-replayed";
const MAX_KEY_BYTES: usize = 255;

/// Marks a response the server must not send: it closes the connection instead.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DropConnection;

#[derive(Debug, Clone)]
pub(crate) struct AppState {
    pub ledger: Arc<Mutex<Ledger>>,
    pub faults: Arc<Mutex<Faults>>,
    /// Charges with a larger amount are declined (`--decline-amounts-above`).
    pub decline_above: Option<i64>,
    /// A decline's body is padded to this many bytes (`--decline-body-bytes`).
    pub decline_body_bytes: Option<usize>,
    /// The Prometheus text of this process's counters (`None` in unit tests).
    pub metrics: Option<PrometheusHandle>,
}

/// Metric names (Prometheus), prefixed like every other service's.
pub(crate) const CHARGES: &str = "eos_provider_charges_total";
pub(crate) const EFFECTS: &str = "eos_provider_effects_total";
pub(crate) const FAULTS: &str = "eos_provider_faults_total";
pub(crate) const LOOKUPS: &str = "eos_provider_lookups_total";

pub(crate) fn describe_metrics() {
    metrics::describe_counter!(
        CHARGES,
        "POST /charges by outcome: applied (a new effect), replayed (same key and request), \
         mismatch (same key, other request), refused (bad request, fault before applying), \
         declined (above --decline-amounts-above)"
    );
    metrics::describe_counter!(EFFECTS, "effects applied (one per idempotency key)");
    metrics::describe_counter!(
        FAULTS,
        "injected faults by kind: error_before_apply, drop_after_apply, delay_after_apply, \
         error_after_apply"
    );
    metrics::describe_counter!(LOOKUPS, "GET /charges/{key} by outcome: found, not_found");
}

pub(crate) fn router(state: AppState) -> Router {
    Router::new()
        .route("/charges", post(create_charge))
        .route("/charges/{key}", get(get_charge))
        .route("/effects", get(list_effects))
        .route("/metrics", get(render_metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(|| async { "ready\n" }))
        .with_state(state)
}

async fn render_metrics(State(state): State<AppState>) -> Response {
    match &state.metrics {
        Some(handle) => handle.render().into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

/// A server span parented on the caller's `traceparent` (built, parented, then entered), with
/// the event id of the caller's baggage.
fn request_span(name: &'static str, headers: &HeaderMap, key: &str) -> tracing::Span {
    let span = tracing::info_span!(
        "provider",
        otel.name = name,
        otel.kind = "server",
        key,
        event_id = tracing::field::Empty,
    );
    let parent = trace_context::extract_http(headers);
    if let Some(event_id) = trace_context::event_id_in(&parent) {
        span.record("event_id", event_id);
    }
    let _ = span.set_parent(parent);
    span
}

fn error(status: StatusCode, code: &str, detail: impl Into<String>) -> Response {
    (
        status,
        Json(json!({"error": code, "detail": detail.into()})),
    )
        .into_response()
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding the lock cannot leave the ledger half-written (every update is one
    // insert or one counter bump), so a poisoned lock is still usable.
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

async fn create_charge(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    let key = headers
        .get(IDEMPOTENCY_KEY_HEADER)
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let span = request_span("POST /charges", &headers, &key);
    async move {
        let (request, amount) = match admitted(&state, &key, &body) {
            Ok(admitted) => admitted,
            Err(refused) => return refused,
        };
        let applied = lock(&state.ledger).apply(&key, amount, &request, OffsetDateTime::now_utc());
        let (status, record, replayed) = match applied {
            Applied::New(record) => (StatusCode::CREATED, record, false),
            Applied::Replayed(record) => (StatusCode::OK, record, true),
            Applied::Mismatch { existing } => {
                counter!(CHARGES, "outcome" => "mismatch").increment(1);
                tracing::warn!(charge_id = %existing.id, "idempotency key reused with another request");
                return error(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "idempotency_key_reused",
                    format!(
                        "key {key:?} was used for charge {} with another request",
                        existing.id
                    ),
                );
            }
        };
        tracing::info!(charge_id = %record.id, amount, replayed, "charge applied");
        if replayed {
            counter!(CHARGES, "outcome" => "replayed").increment(1);
        } else {
            counter!(CHARGES, "outcome" => "applied").increment(1);
            counter!(EFFECTS).increment(1);
        }
        if let Some(faulted) = fault_after_apply(&state).await {
            return faulted;
        }
        let mut response = (status, Json(record)).into_response();
        if replayed {
            response
                .headers_mut()
                .insert(REPLAYED_HEADER, axum::http::HeaderValue::from_static("true"));
        }
        response
    }
    .instrument(span)
    .await
}

/// The request as JSON and its amount, or the answer that refuses it before anything is applied:
/// no key, a body without an integer amount, an amount above the decline limit, an injected 503.
#[expect(
    clippy::result_large_err,
    reason = "the refusal is the handler's answer, returned at once; boxing it buys nothing"
)]
fn admitted(
    state: &AppState,
    key: &str,
    body: &[u8],
) -> Result<(serde_json::Value, i64), Response> {
    if key.is_empty() || key.len() > MAX_KEY_BYTES {
        return Err(error(
            StatusCode::BAD_REQUEST,
            "idempotency_key_required",
            format!("the Idempotency-Key header must hold 1..={MAX_KEY_BYTES} bytes"),
        ));
    }
    let request: serde_json::Value = match serde_json::from_slice(body) {
        Ok(value) => value,
        Err(e) => {
            return Err(error(
                StatusCode::BAD_REQUEST,
                "invalid_json",
                e.to_string(),
            ));
        }
    };
    let Some(amount) = request.get("amount").and_then(serde_json::Value::as_i64) else {
        return Err(error(
            StatusCode::BAD_REQUEST,
            "amount_required",
            "the body must be a JSON object with an integer amount",
        ));
    };
    if let Some(limit) = state.decline_above.filter(|limit| amount > *limit) {
        tracing::info!(amount, limit, "charge declined: above the amount limit");
        counter!(CHARGES, "outcome" => "declined").increment(1);
        let mut detail = format!("amount {amount} is above the limit {limit}");
        if let Some(bytes) = state.decline_body_bytes {
            detail.push(' ');
            while detail.len() < bytes {
                detail.push_str("declined ");
            }
        }
        return Err(error(
            StatusCode::PAYMENT_REQUIRED,
            "amount_limit_exceeded",
            detail,
        ));
    }
    if lock(&state.faults).fail_before_apply() {
        tracing::info!("fault: 503 before applying");
        counter!(FAULTS, "fault" => "error_before_apply").increment(1);
        counter!(CHARGES, "outcome" => "refused").increment(1);
        return Err(error(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "injected fault before applying",
        ));
    }
    Ok((request, amount))
}

/// The injected fault after a charge is applied, if one falls: the connection dropped, a 500, or
/// the answer delayed (then `None`, and the answer follows).
async fn fault_after_apply(state: &AppState) -> Option<Response> {
    let after = lock(&state.faults).after_apply();
    match after {
        AfterApply::Answer => None,
        AfterApply::DropConnection => {
            tracing::info!("fault: dropping the connection after applying");
            counter!(FAULTS, "fault" => "drop_after_apply").increment(1);
            let mut response = StatusCode::INTERNAL_SERVER_ERROR.into_response();
            response.extensions_mut().insert(DropConnection);
            Some(response)
        }
        AfterApply::AnswerLate(delay) => {
            tracing::info!(?delay, "fault: answering late after applying");
            counter!(FAULTS, "fault" => "delay_after_apply").increment(1);
            tokio::time::sleep(delay).await;
            None
        }
        AfterApply::ServerError => {
            tracing::info!("fault: 500 after applying");
            counter!(FAULTS, "fault" => "error_after_apply").increment(1);
            Some(error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "injected fault after applying",
            ))
        }
    }
}

async fn get_charge(
    State(state): State<AppState>,
    Path(key): Path<String>,
    headers: HeaderMap,
) -> Response {
    let span = request_span("GET /charges/{key}", &headers, &key);
    let _entered = span.enter();
    let found = lock(&state.ledger).lookup(&key, OffsetDateTime::now_utc());
    counter!(LOOKUPS, "outcome" => if found.is_some() { "found" } else { "not_found" })
        .increment(1);
    match found {
        Some(record) => (StatusCode::OK, Json(record)).into_response(),
        None => error(
            StatusCode::NOT_FOUND,
            "no_such_charge",
            format!("no charge for key {key:?}"),
        ),
    }
}

async fn list_effects(State(state): State<AppState>) -> Response {
    let ledger = lock(&state.ledger);
    let effects = ledger.effects();
    Json(json!({"count": effects.len(), "effects": effects})).into_response()
}

#[cfg(test)]
mod tests {
    use opentelemetry::trace::{TraceContextExt as _, TracerProvider as _};
    use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
    use tracing_subscriber::layer::SubscriberExt as _;

    use super::*;

    #[test]
    fn the_request_span_continues_the_callers_trace_and_tags_its_event_id() {
        let ended = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(ended.clone())
            .build();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
        tracing::subscriber::with_default(subscriber, || {
            let mut headers = HeaderMap::new();
            headers.insert(
                "traceparent",
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
                    .parse()
                    .expect("valid header"),
            );
            headers.insert("baggage", "event_id=evt-7".parse().expect("valid header"));
            let span = request_span("POST /charges", &headers, "k");
            let trace_id = span.context().span().span_context().trace_id();
            assert_eq!(trace_id.to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
            drop(span);
            let _untraced = request_span("GET /charges/{key}", &HeaderMap::new(), "k");
        });
        let ended = ended.get_finished_spans().expect("spans recorded");
        let event_id = |span: &SpanData| {
            span.attributes
                .iter()
                .find(|kv| kv.key.as_str() == "event_id")
                .map(|kv| kv.value.to_string())
        };
        assert_eq!(ended.len(), 2);
        assert_eq!(event_id(&ended[0]).as_deref(), Some("evt-7"));
        assert_eq!(event_id(&ended[1]), None, "no baggage, no event_id");
    }
}
