//! The operations endpoint every service serves: Prometheus `/metrics`, `/healthz` (the process
//! is alive, and no loop of it is hung where a restart would help), `/readyz` (it has its
//! assignment and state and is doing work: no loop stalled past its warning) and `/boundary` (the
//! guarantee it gives, as JSON). Stalls come from [`crate::progress_watch`].

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Json};
use axum::routing::get;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use eos_core::Boundary;

use crate::progress_watch::StallState;

/// Installs the process-wide Prometheus recorder. Call once, before any metric is recorded.
pub fn install_prometheus_recorder() -> Result<PrometheusHandle, OpsError> {
    let handle = PrometheusBuilder::new()
        .install_recorder()
        .map_err(|e| OpsError::Recorder(e.to_string()))?;
    crate::span_export::register_metrics();
    Ok(handle)
}

#[derive(Debug, thiserror::Error)]
pub enum OpsError {
    #[error("cannot install the Prometheus recorder: {0}")]
    Recorder(String),
    #[error("cannot listen on {addr} for metrics and health: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// Readiness, shared between the service loop (which sets it) and the endpoint (which reports it).
#[derive(Debug, Clone, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    pub fn set(&self, ready: bool) {
        self.0.store(ready, Ordering::Relaxed);
    }

    pub fn is_ready(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

#[derive(Debug, Clone)]
struct OpsState {
    readiness: Readiness,
    stalls: StallState,
    boundary: Arc<Boundary>,
    metrics: PrometheusHandle,
}

/// A service's running ops endpoint: what every service starts before its work and stops after.
#[derive(Debug)]
pub struct OpsEndpoint {
    /// Set by the service loop; `/readyz` reports it.
    pub readiness: Readiness,
    /// Set by the loops' progress watches; `/readyz` and `/healthz` report it.
    pub stalls: StallState,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl OpsEndpoint {
    /// Logs the service's boundary (its guarantee, stated once at start-up), installs the
    /// Prometheus recorder, runs `describe` (the service's metric descriptions),
    /// binds `addr` (a taken port is a start-up error) and serves. Logs the bound address as
    /// `metrics_addr`, which scripts and tests read when `addr` has port 0.
    pub async fn start(
        addr: SocketAddr,
        boundary: Boundary,
        describe: fn(),
    ) -> Result<Self, OpsError> {
        tracing::info!(
            guarantee = %boundary.guarantee,
            input = %boundary.input,
            result = %boundary.result,
            checkpoint = %boundary.checkpoint,
            recovery = %boundary.recovery,
            "boundary"
        );
        let metrics = install_prometheus_recorder()?;
        describe();
        let server = OpsServer::bind(addr).await?;
        if let Some(metrics_addr) = server.local_addr() {
            tracing::info!(%metrics_addr, "serving /metrics, /healthz, /readyz, /boundary");
        }
        let readiness = Readiness::default();
        let stalls = StallState::default();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(server.serve(
            boundary,
            (readiness.clone(), stalls.clone()),
            metrics,
            shutdown.clone(),
        ));
        Ok(Self {
            readiness,
            stalls,
            shutdown,
            task,
        })
    }

    /// Stops serving (after the service's own work has stopped).
    pub async fn stop(self) {
        self.shutdown.cancel();
        let _ = self.task.await;
    }
}

/// A bound but not yet serving ops listener: binding early makes a taken port a start-up error.
#[derive(Debug)]
pub struct OpsServer {
    listener: TcpListener,
}

impl OpsServer {
    pub async fn bind(addr: SocketAddr) -> Result<Self, OpsError> {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| OpsError::Bind { addr, source })?;
        Ok(Self { listener })
    }

    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.listener.local_addr().ok()
    }

    /// Serves until `shutdown` is cancelled.
    pub async fn serve(
        self,
        boundary: Boundary,
        (readiness, stalls): (Readiness, StallState),
        metrics: PrometheusHandle,
        shutdown: CancellationToken,
    ) -> std::io::Result<()> {
        let state = OpsState {
            readiness,
            stalls,
            boundary: Arc::new(boundary),
            metrics,
        };
        let app = Router::new()
            .route("/metrics", get(render_metrics))
            .route("/healthz", get(healthz))
            .route("/readyz", get(readyz))
            .route("/boundary", get(boundary_json))
            .with_state(state);
        axum::serve(self.listener, app)
            .with_graceful_shutdown(shutdown.cancelled_owned())
            .await
    }
}

async fn render_metrics(State(state): State<OpsState>) -> impl IntoResponse {
    state.metrics.render()
}

async fn healthz(State(state): State<OpsState>) -> impl IntoResponse {
    match state.stalls.restart_due() {
        None => (StatusCode::OK, "ok\n".to_owned()),
        Some(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("stalled, a restart may clear it: {why}\n"),
        ),
    }
}

async fn readyz(State(state): State<OpsState>) -> impl IntoResponse {
    if let Some(why) = state.stalls.stalled() {
        return (StatusCode::SERVICE_UNAVAILABLE, format!("stalled: {why}\n"));
    }
    if state.readiness.is_ready() {
        (StatusCode::OK, "ready\n".to_owned())
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n".to_owned())
    }
}

async fn boundary_json(State(state): State<OpsState>) -> impl IntoResponse {
    Json(state.boundary.as_ref().clone())
}
