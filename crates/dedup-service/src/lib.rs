//! dedup-service: durable intents in PostgreSQL behind gRPC, so that an external provider (a
//! payment API no database transaction can include) applies each operation at most once and
//! every ambiguous outcome is settled with evidence.
//!
//! Guarantee: for every operation id, at most one caller at a time holds a lease with the
//! current fencing token, and only such a caller calls the provider (with the operation id as
//! the idempotency key). The intent is durable before the call. A timeout or lost answer is
//! UNKNOWN, never failure: no new call happens until the reconciler has asked the provider with
//! the same key. Counted by operation id, the provider's effects are exactly one per completed
//! operation — through retries, crashes (`kill -9`) of callers and of this service, and expired
//! leases. Operations older than the retained window answer EXPIRED (fail closed), and the
//! service refuses to start when retention is shorter than the replay horizon.

pub mod auth;
pub mod config;
pub mod error;
pub mod group_commit;
pub mod grpc_connections;
pub mod grpc_service;
pub mod intent_store;
pub mod metrics;
pub mod purge;
pub mod reconciler;
pub mod retention;
pub mod validation;
pub mod write_watch;

use std::time::Duration;

use anyhow::Context as _;
use eos_core::{Boundary, Guarantee};
use eos_proto::dedup::v1::FILE_DESCRIPTOR_SET;
use eos_proto::dedup::v1::dedup_server::DedupServer;
use eos_runtime::ops_http::{OpsEndpoint, Readiness};
use eos_runtime::postgres_pool::START_MAX_BACKOFF;
use eos_runtime::progress_watch::{ProgressWatch, StallState};
use eos_runtime::schema_migrations as migrations;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};

use auth::{AuthPolicy, Authenticator};
pub use config::{Config, MigrateArgs};
use dedup_client::{ProviderAccess, ProviderClient};
pub use error::DedupError;
use grpc_service::DedupApi;
use intent_store::IntentStore;
use reconciler::ReconcilerSettings;
use write_watch::WriteWatch;

/// The guarantee this configuration gives, for logs and `/boundary`.
pub fn boundary(config: &Config) -> Boundary {
    // Logged at start-up and served on /boundary: a credential in the URL must not reach either
    // (validate refuses such a URL, but the boundary is built for any configuration).
    let provider = config.provider_url.as_deref().map_or_else(
        || "(no --provider-url: settled by Resolve only)".to_owned(),
        eos_runtime::secrets::redact_url_userinfo,
    );
    Boundary {
        guarantee: Guarantee::ExactlyOnce,
        input: format!(
            "grpc eos.dedup.v1.Dedup on {} (Begin / Complete / Fail / MarkUnknown)",
            config.listen
        ),
        result: format!(
            "one provider effect per operation id (idempotency key = operation id) at {provider}"
        ),
        checkpoint: "postgres tables dedup_intents + dedup_intent_history, written before the \
                     provider call"
            .into(),
        recovery: format!(
            "intents survive restarts; a lease that runs out makes the intent UNKNOWN and the \
             reconciler settles it with GET /charges/{{key}}, never with a blind second call; \
             operations older than the {} retention answer EXPIRED",
            humantime::format_duration(config.retention)
        ),
        transform: None,
    }
}

/// `dedup-service migrate`: applies the embedded migrations to the database and logs each one
/// it applied; fails with the reason (and exit 1) when it cannot.
pub async fn migrate(args: MigrateArgs) -> anyhow::Result<()> {
    Ok(migrations::migrate_command(
        "dedup-service",
        args.database.url(),
        &intent_store::migrator(),
    )
    .await?)
}

/// Runs the service until `shutdown` is cancelled (then drains and returns `Ok`), or fails at
/// start-up (bad configuration, retention below the replay horizon, database, ports).
pub async fn run(config: Config, shutdown: CancellationToken) -> anyhow::Result<()> {
    config
        .validate()
        .map_err(|problem| anyhow::anyhow!("configuration: {problem}"))?;
    let auth = config
        .auth_policy()
        .map_err(|problem| anyhow::anyhow!("configuration: {problem}"))?;
    auth.check_listen(config.listen, config.allow_unauthenticated)
        .map_err(|problem| anyhow::anyhow!("configuration: {problem}"))?;
    let boundary = boundary(&config);
    let policy = config.retention_policy();
    tracing::info!(
        retention = %humantime::format_duration(policy.retention),
        required = %humantime::format_duration(policy.required_retention()),
        "retention covers the replay horizon"
    );

    // Before the ops endpoint: on port 0 it could be handed the fixed gRPC port, free since the
    // process this one replaces died a moment ago.
    let listener = TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {} for gRPC", config.listen))?;
    let ops = OpsEndpoint::start(config.metrics_addr, boundary, metrics::describe).await?;
    metrics::record_retention(&policy);
    let result = serve(
        config,
        auth,
        listener,
        (ops.readiness.clone(), ops.stalls.clone()),
        shutdown,
    )
    .await;
    ops.stop().await;
    result
}

/// The reconciler's credential and CA for the provider, read once at start-up.
fn provider_access(config: &Config) -> anyhow::Result<ProviderAccess> {
    let mut access = ProviderAccess::default();
    if let Some(value) = config
        .provider_auth
        .as_ref()
        .or(config.provider_auth_file.as_ref())
    {
        access = access
            .with_credential(&config.provider_auth_header, value.expose())
            .map_err(|detail| anyhow::anyhow!("--provider-auth: {detail}"))?;
    }
    if let Some(path) = &config.provider_ca_file {
        access.ca_pem = Some(
            std::fs::read(path)
                .with_context(|| format!("--provider-ca-file {}", path.display()))?,
        );
    }
    Ok(access)
}

/// How often the gRPC health statuses are set from the progress watches.
const GRPC_HEALTH_INTERVAL: Duration = Duration::from_secs(1);

/// The gRPC health service says what `/healthz` and `/readyz` say (docs/OBSERVABILITY.md
/// "Liveness"), for the orchestrators that probe dedup-service over gRPC (the Helm chart's
/// probes do): the server's overall status ("") is NOT_SERVING while a restart is due, the
/// `eos.dedup.v1.Dedup` service's while a loop is stalled past its warning. Until `shutdown`.
async fn grpc_health_follows_stalls(
    health: tonic_health::server::HealthReporter,
    stalls: StallState,
    shutdown: CancellationToken,
) {
    use tonic::server::NamedService as _;
    use tonic_health::ServingStatus;
    let status = |failing: bool| {
        if failing {
            ServingStatus::NotServing
        } else {
            ServingStatus::Serving
        }
    };
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(GRPC_HEALTH_INTERVAL) => {}
        }
        health
            .set_service_status("", status(stalls.restart_due().is_some()))
            .await;
        health
            .set_service_status(
                DedupServer::<DedupApi>::NAME,
                status(stalls.stalled().is_some()),
            )
            .await;
    }
}

async fn serve(
    config: Config,
    auth: AuthPolicy,
    listener: TcpListener,
    (readiness, stalls): (Readiness, StallState),
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let Some(pool) = intent_store::pool_builder(config.db_max_connections)
        .connect_at_start(config.database.url(), START_MAX_BACKOFF, &shutdown)
        .await
        .context("connecting to PostgreSQL")?
    else {
        return Ok(());
    };
    migrations::prepare_at_start(
        &pool,
        &intent_store::migrator(),
        "dedup-service",
        config.skip_migrations,
    )
    .await?;
    let store = IntentStore::new(pool.clone(), config.retention);
    let provider = match config.provider_url.as_deref() {
        Some(url) => Some(ProviderClient::new(
            url,
            config.provider_timeout,
            &provider_access(&config)?,
        )?),
        None => {
            tracing::warn!("no --provider-url: UNKNOWN intents are only settled by Resolve calls");
            None
        }
    };
    let grpc_addr = listener.local_addr()?;

    let background = CancellationToken::new();
    let tasks = TaskTracker::new();
    let progress = ProgressWatch::spawn("dedup-reconciler", config.stall.policy(), &stalls)
        .context("starting the progress watch")?;
    let writes = WriteWatch::new(
        ProgressWatch::spawn(write_watch::LOOP, config.stall.policy(), &stalls)
            .context("starting the progress watch")?,
        Some(pool.clone()),
    );
    tasks.spawn(reconciler::run(
        store.clone(),
        (provider, progress),
        ReconcilerSettings {
            interval: config.reconcile_interval,
            concurrency: config.reconcile_concurrency,
            in_flight_window: config.in_flight_window,
            provider_key_ttl: config.provider_key_ttl,
            rate_window: config.rate_window,
        },
        background.clone(),
    ));
    tasks.spawn(purge::run(
        store.clone(),
        config.purge_interval,
        background.clone(),
    ));
    tasks.close();

    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<DedupServer<DedupApi>>().await;
    let health_follows_stalls = tokio::spawn(grpc_health_follows_stalls(
        health.clone(),
        stalls,
        shutdown.clone(),
    ));
    let authenticator = Authenticator::new(auth);
    // Reflection describes the API to whoever may call it: off unless asked for, and behind the
    // same credentials as Dedup when on.
    let reflection = if config.reflection {
        let service = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)
            .build_v1()
            .context("building the reflection service")?;
        Some(tonic::service::interceptor::InterceptedService::new(
            service,
            authenticator.clone(),
        ))
    } else {
        None
    };
    // The message limits apply per message, before a handler sees it; the interceptor runs
    // before either.
    let api = tonic::service::interceptor::InterceptedService::new(
        DedupServer::new(DedupApi::new(
            store,
            config.lease_limits(),
            (config.group_commit_settings(), writes),
        ))
        .max_decoding_message_size(config.max_decoding_message_size)
        .max_encoding_message_size(config.max_encoding_message_size),
        authenticator,
    );

    // Connections are accepted until the drain has begun: readiness and the health service say
    // so first.
    let accepting = CancellationToken::new();
    let drained = {
        let shutdown = shutdown.clone();
        let readiness = readiness.clone();
        let accepting = accepting.clone();
        async move {
            shutdown.cancelled().await;
            tracing::info!("draining gRPC calls");
            readiness.set(false);
            // Stopped first, so that it cannot mark the service serving again.
            let _ = health_follows_stalls.await;
            health.set_not_serving::<DedupServer<DedupApi>>().await;
            accepting.cancel();
        }
    };
    // tonic's own limits are per call and per connection once it is open; how many are open,
    // and for how long a silent or idle one stays, is grpc_connections' (docs/security.md
    // "dedup-service").
    let mut builder = Server::builder()
        .concurrency_limit_per_connection(config.concurrency_per_connection)
        .timeout(config.request_timeout)
        .http2_keepalive_interval(Some(config.http2_keepalive_interval))
        .http2_keepalive_timeout(Some(config.http2_keepalive_timeout))
        .layer(grpc_connections::track_calls());
    let tls = match (&config.tls_cert, &config.tls_key) {
        (Some(cert), Some(key)) => {
            let cert = std::fs::read(cert)
                .with_context(|| format!("cannot read --tls-cert {}", cert.display()))?;
            let key = std::fs::read(key)
                .with_context(|| format!("cannot read --tls-key {}", key.display()))?;
            let mut tls = ServerTlsConfig::new().identity(Identity::from_pem(cert, key));
            if let Some(ca) = &config.tls_client_ca {
                let ca = std::fs::read(ca)
                    .with_context(|| format!("cannot read --tls-client-ca {}", ca.display()))?;
                // Required, not optional: a client without a certificate signed by this CA does
                // not get past the handshake.
                tls = tls.client_ca_root(Certificate::from_pem(ca));
            }
            builder = builder
                .tls_config(tls)
                .context("bad --tls-cert / --tls-key / --tls-client-ca")?;
            true
        }
        _ => false,
    };
    let limits = config.connection_limits();
    let server = builder
        .add_service(health_service)
        .add_optional_service(reflection)
        .add_service(api)
        .serve_with_incoming_shutdown(
            grpc_connections::incoming(listener, limits, tls, accepting),
            drained,
        );
    readiness.set(true);
    tracing::info!(
        %grpc_addr,
        tls,
        mtls = config.tls_client_ca.is_some(),
        reflection = config.reflection,
        max_connections = limits.max_connections,
        handshake_timeout = ?limits.handshake_timeout,
        idle_timeout = ?limits.idle_timeout,
        "serving gRPC"
    );

    let drain_limit = config.shutdown_timeout;
    let served = tokio::select! {
        served = server => served.context("gRPC server"),
        () = async {
            shutdown.cancelled().await;
            tokio::time::sleep(drain_limit).await;
        } => {
            tracing::warn!(timeout = ?drain_limit, "gRPC calls still running after the drain timeout");
            Ok(())
        }
    };
    background.cancel();
    if tokio::time::timeout(drain_limit.max(Duration::from_secs(1)), tasks.wait())
        .await
        .is_err()
    {
        tracing::warn!("background tasks did not stop in time");
    }
    pool.close().await;
    tracing::info!("stopped");
    served
}
