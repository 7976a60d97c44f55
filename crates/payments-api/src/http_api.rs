//! The HTTP API: `POST /payments`. A request that creates a payment runs in a span parented on
//! its `traceparent`, and the outbox row keeps that span's context: the event's trace starts at
//! the request. A resend or a refused reuse of the payment's key joins that trace
//! (`request_span`). Every such span names the payment it is about.

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Json, Response};
use axum::routing::post;
use metrics::counter;
use serde_json::json;
use sqlx::PgPool;
use std::time::Duration;
use tracing::Instrument as _;

use eos_runtime::trace_context;

use crate::http_server::{BodyError, read_body};
use crate::payment_request::{
    IDEMPOTENCY_KEY_HEADER, PaymentRequest, RequestError, idempotency_key,
};
use crate::payment_store::{Begun, Recorded, StoreError, begin_payment};
use crate::request_span::{RequestTags, SpanPlan, request_span};
use crate::request_watch::RequestWatch;

/// Set on an answer that repeats an earlier request's.
pub(crate) const REPLAYED_HEADER: &str = "idempotent-replayed";
pub(crate) const REQUESTS: &str = "payments_api_requests_total";

pub(crate) fn describe_metrics() {
    metrics::describe_counter!(
        REQUESTS,
        "POST /payments by outcome: created, replayed (same key and body), key_reused (same key, \
         other body), invalid, refused (past a limit or in another currency than the account's; \
         nothing written), unavailable (database error; nothing written)"
    );
}

#[derive(Debug, Clone)]
pub(crate) struct AppState {
    pub pool: PgPool,
    pub topic: String,
    /// `--body-read-timeout`: the whole body must arrive within it (`http_server::read_body`).
    pub body_read_timeout: Duration,
    /// Told while a request waits on PostgreSQL, and when PostgreSQL answered it.
    pub requests: RequestWatch,
}

pub(crate) fn router(state: AppState) -> Router {
    Router::new()
        .route("/payments", post(create_payment))
        .with_state(state)
}

fn refusal(status: StatusCode, outcome: &'static str, reason: impl Into<String>) -> Response {
    counter!(REQUESTS, "outcome" => outcome).increment(1);
    (status, Json(json!({ "error": reason.into() }))).into_response()
}

/// A body that was not read whole. The connection is closed after the answer: what is left of
/// the body is unread (or drained in the background, for a body that is too large).
fn body_refusal(error: &BodyError) -> Response {
    let status = match error {
        BodyError::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        BodyError::TimedOut(_) => StatusCode::REQUEST_TIMEOUT,
        BodyError::Broken(_) => StatusCode::BAD_REQUEST,
    };
    counter!(REQUESTS, "outcome" => "invalid").increment(1);
    (
        status,
        [(header::CONNECTION, "close")],
        Json(json!({ "error": format!("{error}; nothing was written") })),
    )
        .into_response()
}

async fn create_payment(State(state): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    let key = match idempotency_key(
        headers
            .get(IDEMPOTENCY_KEY_HEADER)
            .map(HeaderValue::as_bytes),
    ) {
        Ok(key) => key,
        Err(reason) => return refusal(StatusCode::BAD_REQUEST, "invalid", reason),
    };
    let body = match read_body(body, state.body_read_timeout).await {
        Ok(body) => body,
        Err(error) => return body_refusal(&error),
    };
    let request = match PaymentRequest::parse(&body) {
        Ok(request) => request,
        Err(error @ RequestError::Malformed(_)) => {
            return refusal(StatusCode::BAD_REQUEST, "invalid", error.to_string());
        }
        Err(error @ RequestError::AmountOverLimit { .. }) => {
            return refusal(
                StatusCode::UNPROCESSABLE_ENTITY,
                "refused",
                error.to_string(),
            );
        }
    };
    let payment_id = format!("pay-{:032x}", rand::random::<u128>());
    let caller = trace_context::extract_http(&headers);
    // Started here, so it times the whole request, but entered only once the key was looked at:
    // that decides which trace it joins (see `request_span`).
    let span = request_span(request.account_id.as_str());
    let waiting = state.requests.enter();
    let begun = begin_payment(&state.pool, &key, &request, &payment_id).await;
    let plan = match &begun {
        Ok(Begun::New(new)) => SpanPlan::new(&caller, Some(new.payment_id()), None),
        Ok(Begun::Seen(recorded)) => SpanPlan::new(
            &caller,
            Some(recorded.payment_id()),
            recorded.original_trace(),
        ),
        Err(_) => SpanPlan::new(&caller, None, None),
    };
    plan.apply(&span);
    let recorded = match begun {
        Ok(Begun::New(new)) => new.commit(&state.topic).instrument(span.clone()).await,
        Ok(Begun::Seen(recorded)) => Ok(recorded),
        Err(error) => Err(error),
    };
    state.requests.ended(waiting, &recorded);
    RequestTags::of(&recorded).record(&span);
    match recorded {
        Ok(Recorded::Created(payment)) => {
            counter!(REQUESTS, "outcome" => "created").increment(1);
            (StatusCode::CREATED, Json(payment)).into_response()
        }
        Ok(Recorded::Replayed { payment, .. }) => {
            counter!(REQUESTS, "outcome" => "replayed").increment(1);
            (
                StatusCode::CREATED,
                [(REPLAYED_HEADER, "true")],
                Json(payment),
            )
                .into_response()
        }
        Ok(Recorded::KeyReused { payment_id, .. }) => {
            tracing::info!(
                parent: &span,
                event_id = %payment_id,
                idempotency_key = %key,
                "idempotency key reused with another request, refused"
            );
            refusal(
                StatusCode::CONFLICT,
                "key_reused",
                "this Idempotency-Key was used with a different request; nothing was written",
            )
        }
        Err(StoreError::Refused(refused)) => {
            tracing::info!(parent: &span, %refused, idempotency_key = %key, "payment refused");
            refusal(
                StatusCode::UNPROCESSABLE_ENTITY,
                "refused",
                refused.to_string(),
            )
        }
        Err(error) => {
            tracing::warn!(parent: &span, %error, idempotency_key = %key, "payment not recorded");
            refusal(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "the payment could not be recorded; nothing was written, retry with the same key",
            )
        }
    }
}
