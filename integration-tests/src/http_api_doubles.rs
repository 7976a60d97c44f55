//! Two HTTP APIs of other shapes than provider-sim's, for the sink's `http` target (docs/
//! sink-writer.md "Calls to any HTTP API"): each runs in the test's own process on 127.0.0.1,
//! records every effect it applies, and loses answers on purpose.
//!
//! - [`ApiDouble::idempotent`] keeps Stripe's idempotency contract: the first request with a key is
//!   applied and its answer stored; a repeat with the same parameters gets the stored answer
//!   (`Idempotent-Replayed: true`); a repeat while the first is still running gets 409; a repeat
//!   with other parameters gets 400. A 429 and a 500 before anything is applied store nothing,
//!   as Stripe's do, so the same key may be tried again.
//!   It also answers a look-up by key, as a ledger service of a team's own would:
//!   `GET /v1/entries/{key}` is 200 `{"status": "posted", "entry": …}` once applied, 200
//!   `{"status": "pending"}` while the first request still runs, and 404 for a key it never saw.
//! - [`ApiDouble::webhook`] takes no key and has no look-up: every delivery it is sent is an effect.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse as _, Response};
use axum::routing::{get, post};
use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};
use serde_json::{Value, json};
use tokio::task::JoinHandle;

/// How often an API misbehaves, each a probability per request.
#[derive(Debug, Clone, Copy)]
pub struct ApiFaults {
    /// 429 with `Retry-After: retry_after_seconds`, nothing applied.
    pub throttle: f64,
    pub retry_after_seconds: u64,
    /// 500 before anything is applied (the key is freed).
    pub error_before_apply: f64,
    /// Applied at once, answered only after `late_answer` (past the caller's deadline): the
    /// caller sees a timeout. The key stays in flight meanwhile.
    pub late: f64,
    pub late_answer: Duration,
    pub seed: u64,
}

/// One applied effect: the key (or the event id, for a webhook) and the request's body.
#[derive(Debug, Clone)]
pub struct Effect {
    pub key: String,
    pub body: Value,
}

/// What an API answered, counted.
#[derive(Debug, Default)]
pub struct AnswerCounts {
    pub applied: AtomicU64,
    pub replayed: AtomicU64,
    pub in_flight_409: AtomicU64,
    pub other_parameters_400: AtomicU64,
    pub throttled_429: AtomicU64,
    pub errors_500: AtomicU64,
    pub late: AtomicU64,
    /// Look-ups answered (`GET /v1/entries/{key}`).
    pub looked_up: AtomicU64,
}

impl AnswerCounts {
    /// `name=count` of each, for a test's log.
    pub fn summary(&self) -> String {
        let read = |counter: &AtomicU64| counter.load(Ordering::SeqCst);
        format!(
            "applied={} replayed={} 409={} 400={} 429={} 500={} late={} looked_up={}",
            read(&self.applied),
            read(&self.replayed),
            read(&self.in_flight_409),
            read(&self.other_parameters_400),
            read(&self.throttled_429),
            read(&self.errors_500),
            read(&self.late),
            read(&self.looked_up)
        )
    }
}

/// A key's state at the idempotent API.
#[derive(Debug, Clone)]
enum KeyState {
    InFlight { parameters: Value },
    Done { parameters: Value, answer: Value },
}

#[derive(Debug)]
struct Shared {
    faults: ApiFaults,
    rng: Mutex<StdRng>,
    keys: Mutex<HashMap<String, KeyState>>,
    effects: Mutex<Vec<Effect>>,
    /// When each request arrived, for the highest rate seen.
    arrivals: Mutex<Vec<Instant>>,
    counts: AnswerCounts,
}

impl Shared {
    fn new(faults: ApiFaults) -> Arc<Self> {
        Arc::new(Self {
            faults,
            rng: Mutex::new(StdRng::seed_from_u64(faults.seed)),
            keys: Mutex::new(HashMap::new()),
            effects: Mutex::new(Vec::new()),
            arrivals: Mutex::new(Vec::new()),
            counts: AnswerCounts::default(),
        })
    }

    fn roll(&self, probability: f64) -> bool {
        probability > 0.0
            && self
                .rng
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .random_bool(probability.min(1.0))
    }

    fn apply(&self, key: &str, body: &Value) {
        self.effects
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Effect {
                key: key.to_owned(),
                body: body.clone(),
            });
        self.counts.applied.fetch_add(1, Ordering::SeqCst);
    }

    fn arrived(&self) {
        self.arrivals
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Instant::now());
    }

    /// The most requests that arrived within any `window`.
    fn most_within(&self, window: Duration) -> usize {
        let arrivals = self.arrivals.lock().unwrap_or_else(PoisonError::into_inner);
        let mut most = 0;
        let mut first = 0;
        for (last, arrived) in arrivals.iter().enumerate() {
            while *arrived - arrivals[first] >= window {
                first += 1;
            }
            most = most.max(last + 1 - first);
        }
        most
    }

    /// Before anything is applied: a 429 or a 500, or `None` to go on.
    fn refuse_before_apply(&self) -> Option<Response> {
        if self.roll(self.faults.throttle) {
            self.counts.throttled_429.fetch_add(1, Ordering::SeqCst);
            return Some(
                (
                    StatusCode::TOO_MANY_REQUESTS,
                    [("retry-after", self.faults.retry_after_seconds.to_string())],
                    "rate limited",
                )
                    .into_response(),
            );
        }
        if self.roll(self.faults.error_before_apply) {
            self.counts.errors_500.fetch_add(1, Ordering::SeqCst);
            return Some((StatusCode::INTERNAL_SERVER_ERROR, "try again").into_response());
        }
        None
    }

    /// Sleeps past the caller's deadline when this answer is to be late.
    async fn maybe_late(&self) {
        if self.roll(self.faults.late) {
            self.counts.late.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(self.faults.late_answer).await;
        }
    }
}

/// A running API double in this process on 127.0.0.1; stops when dropped.
#[derive(Debug)]
pub struct ApiDouble {
    addr: SocketAddr,
    serving: JoinHandle<()>,
    shared: Arc<Shared>,
}

impl ApiDouble {
    /// An API with Stripe's idempotency contract at `POST /v1/charges` and `POST
    /// /v1/notifications` (one handler: a charge and a partner's notification keep the same
    /// contract), and a look-up by key at `GET /v1/entries/{key}`.
    pub async fn idempotent(faults: ApiFaults) -> anyhow::Result<Self> {
        Self::serve(
            faults,
            Router::new()
                .route("/v1/charges", post(idempotent_charge))
                .route("/v1/notifications", post(idempotent_charge))
                .route("/v1/entries/{key}", get(look_up)),
        )
        .await
    }

    /// A webhook receiver at `POST /hooks`: no key, no look-up; each delivery is recorded under
    /// the `event_id` of its body.
    pub async fn webhook(faults: ApiFaults) -> anyhow::Result<Self> {
        Self::serve(faults, Router::new().route("/hooks", post(webhook))).await
    }

    async fn serve(faults: ApiFaults, routes: Router<Arc<Shared>>) -> anyhow::Result<Self> {
        let shared = Shared::new(faults);
        let router = routes.with_state(Arc::clone(&shared));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding an API double")?;
        let addr = listener.local_addr()?;
        let serving = tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        Ok(Self {
            addr,
            serving,
            shared,
        })
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every effect applied, in order (a webhook's under its event id); a key applied twice is
    /// listed twice.
    pub fn effects(&self) -> Vec<Effect> {
        self.shared
            .effects
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The `id` of each key's stored answer (the idempotent API), by key.
    pub fn answer_ids(&self) -> HashMap<String, String> {
        self.shared
            .keys
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter_map(|(key, state)| match state {
                KeyState::Done { answer, .. } => {
                    Some((key.clone(), answer["id"].as_str()?.to_owned()))
                }
                KeyState::InFlight { .. } => None,
            })
            .collect()
    }

    pub fn counts(&self) -> &AnswerCounts {
        &self.shared.counts
    }

    /// The most requests that arrived within any `window`.
    pub fn most_requests_within(&self, window: Duration) -> usize {
        self.shared.most_within(window)
    }
}

impl Drop for ApiDouble {
    fn drop(&mut self) {
        self.serving.abort();
    }
}

async fn idempotent_charge(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    shared.arrived();
    let Some(key) = headers
        .get("idempotency-key")
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned)
    else {
        return (StatusCode::BAD_REQUEST, "an Idempotency-Key is required").into_response();
    };
    let Ok(parameters @ Value::Object(_)) = serde_json::from_slice::<Value>(&body) else {
        return (StatusCode::BAD_REQUEST, "the body is not a JSON object").into_response();
    };
    if let Some(refusal) = shared.refuse_before_apply() {
        return refusal;
    }
    {
        let mut keys = shared.keys.lock().unwrap_or_else(PoisonError::into_inner);
        match keys.get(&key) {
            Some(KeyState::Done { parameters: p, .. } | KeyState::InFlight { parameters: p })
                if *p != parameters =>
            {
                shared
                    .counts
                    .other_parameters_400
                    .fetch_add(1, Ordering::SeqCst);
                return (
                    StatusCode::BAD_REQUEST,
                    axum::Json(json!({"error": {"type": "idempotency_error",
                        "message": "Keys for idempotent requests can only be used with the \
                                    same parameters they were first used with."}})),
                )
                    .into_response();
            }
            Some(KeyState::Done { answer, .. }) => {
                shared.counts.replayed.fetch_add(1, Ordering::SeqCst);
                return (
                    StatusCode::OK,
                    [("idempotent-replayed", "true")],
                    axum::Json(answer.clone()),
                )
                    .into_response();
            }
            Some(KeyState::InFlight { .. }) => {
                shared.counts.in_flight_409.fetch_add(1, Ordering::SeqCst);
                return (
                    StatusCode::CONFLICT,
                    axum::Json(json!({"error": {"type": "idempotency_error",
                        "message": "There is currently another in-progress request using this \
                                    Idempotent Key."}})),
                )
                    .into_response();
            }
            None => {
                keys.insert(
                    key.clone(),
                    KeyState::InFlight {
                        parameters: parameters.clone(),
                    },
                );
            }
        }
    }
    // The request runs to its end even when its caller has gone (a timeout): only then is its
    // answer stored and the key free for replays, as an API's own request handling would.
    let finishing = tokio::spawn(async move {
        shared.apply(&key, &parameters);
        let answer = json!({
            "id": format!("ch_{}", shared.counts.applied.load(Ordering::SeqCst)),
            "amount": parameters["amount"],
        });
        shared.maybe_late().await;
        shared
            .keys
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(
                key,
                KeyState::Done {
                    parameters,
                    answer: answer.clone(),
                },
            );
        answer
    });
    match finishing.await {
        Ok(answer) => (StatusCode::OK, axum::Json(answer)).into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

/// What the idempotent API knows of `key`: posted with its answer, still running, or never seen.
async fn look_up(State(shared): State<Arc<Shared>>, Path(key): Path<String>) -> Response {
    shared.counts.looked_up.fetch_add(1, Ordering::SeqCst);
    let state = shared
        .keys
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get(&key)
        .cloned();
    match state {
        Some(KeyState::Done { answer, .. }) => {
            axum::Json(json!({"status": "posted", "entry": answer})).into_response()
        }
        Some(KeyState::InFlight { .. }) => axum::Json(json!({"status": "pending"})).into_response(),
        None => (StatusCode::NOT_FOUND, "no such key").into_response(),
    }
}

async fn webhook(State(shared): State<Arc<Shared>>, body: Bytes) -> Response {
    shared.arrived();
    let Ok(delivery) = serde_json::from_slice::<Value>(&body) else {
        return (StatusCode::BAD_REQUEST, "the body is not JSON").into_response();
    };
    let Some(event_id) = delivery["event_id"].as_str().map(str::to_owned) else {
        return (StatusCode::BAD_REQUEST, "no event_id").into_response();
    };
    if let Some(refusal) = shared.refuse_before_apply() {
        return refusal;
    }
    shared.apply(&event_id, &delivery);
    shared.maybe_late().await;
    StatusCode::NO_CONTENT.into_response()
}
