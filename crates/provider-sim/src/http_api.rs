//! The provider's HTTP API. Handlers run in a span parented on the request's `traceparent`.

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Json, Response};
use axum::routing::{get, post};
use opentelemetry::propagation::{Extractor, TextMapPropagator as _};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use serde_json::json;
use time::OffsetDateTime;
use tracing::Instrument as _;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use crate::faults::{AfterApply, Faults};
use crate::ledger::{Applied, Ledger};

pub const IDEMPOTENCY_KEY_HEADER: &str = "idempotency-key";
pub const REPLAYED_HEADER: &str = "idempotent-replayed";
const MAX_KEY_BYTES: usize = 255;

/// Marks a response the server must not send: it closes the connection instead.
#[derive(Debug, Clone, Copy)]
pub struct DropConnection;

#[derive(Debug, Clone)]
pub struct AppState {
    pub ledger: Arc<Mutex<Ledger>>,
    pub faults: Arc<Mutex<Faults>>,
}

pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/charges", post(create_charge))
        .route("/charges/{key}", get(get_charge))
        .route("/effects", get(list_effects))
        .route("/healthz", get(|| async { "ok\n" }))
        .with_state(state)
}

struct HeaderExtractor<'a>(&'a HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|value| value.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|name| name.as_str()).collect()
    }
}

/// A server span parented on the caller's `traceparent` (built, parented, then entered).
fn request_span(name: &'static str, headers: &HeaderMap, key: &str) -> tracing::Span {
    let span = tracing::info_span!("provider", otel.name = name, otel.kind = "server", key);
    let parent = TraceContextPropagator::new().extract(&HeaderExtractor(headers));
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
        if key.is_empty() || key.len() > MAX_KEY_BYTES {
            return error(
                StatusCode::BAD_REQUEST,
                "idempotency_key_required",
                format!("the Idempotency-Key header must hold 1..={MAX_KEY_BYTES} bytes"),
            );
        }
        let request: serde_json::Value = match serde_json::from_slice(&body) {
            Ok(value) => value,
            Err(e) => return error(StatusCode::BAD_REQUEST, "invalid_json", e.to_string()),
        };
        let Some(amount) = request.get("amount").and_then(serde_json::Value::as_i64) else {
            return error(
                StatusCode::BAD_REQUEST,
                "amount_required",
                "the body must be a JSON object with an integer amount",
            );
        };
        if lock(&state.faults).fail_before_apply() {
            tracing::info!("fault: 503 before applying");
            return error(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "injected fault before applying",
            );
        }
        let applied = lock(&state.ledger).apply(&key, amount, &request, OffsetDateTime::now_utc());
        let (status, record, replayed) = match applied {
            Applied::New(record) => (StatusCode::CREATED, record, false),
            Applied::Replayed(record) => (StatusCode::OK, record, true),
            Applied::Mismatch { existing } => {
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
        let after = lock(&state.faults).after_apply();
        match after {
            AfterApply::Answer => {}
            AfterApply::DropConnection => {
                tracing::info!("fault: dropping the connection after applying");
                let mut response = StatusCode::INTERNAL_SERVER_ERROR.into_response();
                response.extensions_mut().insert(DropConnection);
                return response;
            }
            AfterApply::AnswerLate(delay) => {
                tracing::info!(?delay, "fault: answering late after applying");
                tokio::time::sleep(delay).await;
            }
            AfterApply::ServerError => {
                tracing::info!("fault: 500 after applying");
                return error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    "injected fault after applying",
                );
            }
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

async fn get_charge(
    State(state): State<AppState>,
    Path(key): Path<String>,
    headers: HeaderMap,
) -> Response {
    let span = request_span("GET /charges/{key}", &headers, &key);
    let _entered = span.enter();
    match lock(&state.ledger).lookup(&key, OffsetDateTime::now_utc()) {
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
    use opentelemetry_sdk::trace::SdkTracerProvider;
    use tracing_subscriber::layer::SubscriberExt as _;

    use super::*;

    #[test]
    fn the_request_span_continues_the_callers_trace() {
        let provider = SdkTracerProvider::builder().build();
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
            let span = request_span("POST /charges", &headers, "k");
            let trace_id = span.context().span().span_context().trace_id();
            assert_eq!(trace_id.to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
        });
    }
}
