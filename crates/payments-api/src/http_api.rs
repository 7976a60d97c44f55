//! The HTTP API: `POST /payments`. Each request runs in a span parented on its `traceparent`,
//! carrying the payment's event id as baggage, and the outbox row keeps that span's context: the
//! event's trace starts at the request.

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Json, Response};
use axum::routing::post;
use metrics::counter;
use serde_json::json;
use sqlx::PgPool;
use tracing::Instrument as _;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use eos_runtime::trace_context;

use crate::payment_request::{IDEMPOTENCY_KEY_HEADER, PaymentRequest, idempotency_key};
use crate::payment_store::{Recorded, record_payment};

/// Set on an answer that repeats an earlier request's.
pub const REPLAYED_HEADER: &str = "idempotent-replayed";
pub const REQUESTS: &str = "payments_api_requests_total";

pub fn describe_metrics() {
    metrics::describe_counter!(
        REQUESTS,
        "POST /payments by outcome: created, replayed (same key and body), key_reused (same key, \
         other body), invalid, unavailable (database error; nothing written)"
    );
}

#[derive(Debug, Clone)]
pub struct AppState {
    pub pool: PgPool,
    pub topic: String,
}

pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/payments", post(create_payment))
        .with_state(state)
}

fn refusal(status: StatusCode, outcome: &'static str, reason: impl Into<String>) -> Response {
    counter!(REQUESTS, "outcome" => outcome).increment(1);
    (status, Json(json!({ "error": reason.into() }))).into_response()
}

async fn create_payment(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let key = match idempotency_key(
        headers
            .get(IDEMPOTENCY_KEY_HEADER)
            .map(HeaderValue::as_bytes),
    ) {
        Ok(key) => key,
        Err(reason) => return refusal(StatusCode::BAD_REQUEST, "invalid", reason),
    };
    let request = match PaymentRequest::parse(&body) {
        Ok(request) => request,
        Err(reason) => return refusal(StatusCode::BAD_REQUEST, "invalid", reason),
    };
    let payment_id = format!("pay-{:032x}", rand::random::<u128>());
    let parent =
        trace_context::context_with_event_id(&trace_context::extract_http(&headers), &payment_id);
    let span = tracing::info_span!(
        "request",
        otel.name = "payments-api POST /payments",
        otel.kind = "server",
        http.request.method = "POST",
        http.route = "/payments",
        event_id = %payment_id,
        account_id = %request.account_id,
    );
    let _ = span.set_parent(parent);
    let recorded = record_payment(&state.pool, &state.topic, &key, &request, &payment_id)
        .instrument(span)
        .await;
    match recorded {
        Ok(Recorded::Created(payment)) => {
            counter!(REQUESTS, "outcome" => "created").increment(1);
            (StatusCode::CREATED, Json(payment)).into_response()
        }
        Ok(Recorded::Replayed(payment)) => {
            counter!(REQUESTS, "outcome" => "replayed").increment(1);
            (
                StatusCode::CREATED,
                [(REPLAYED_HEADER, "true")],
                Json(payment),
            )
                .into_response()
        }
        Ok(Recorded::KeyReused) => refusal(
            StatusCode::CONFLICT,
            "key_reused",
            "this Idempotency-Key was used with a different request; nothing was written",
        ),
        Err(error) => {
            tracing::warn!(%error, idempotency_key = %key, "payment not recorded");
            refusal(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "the payment could not be recorded; nothing was written, retry with the same key",
            )
        }
    }
}
