//! Start-up apart from running (docs/CODE_STYLE.md "The shape of a service"): [`build`] does all
//! the wiring and fails on everything that can be found before the first call — the
//! configuration, the retention formula, the gRPC and ops ports, PostgreSQL and its migrations,
//! the provider's credential and CA, TLS, reflection, the progress watches and the group commit
//! — and [`Service::run`] then only runs: the reconciler, the purge and the gRPC server, until
//! shutdown, then the drain.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use eos_core::{Boundary, Guarantee};
use eos_proto::dedup::v1::FILE_DESCRIPTOR_SET;
use eos_proto::dedup::v1::dedup_server::DedupServer;
use eos_runtime::ops_http::{OpsEndpoint, Readiness};
use eos_runtime::postgres_pool::START_MAX_BACKOFF;
use eos_runtime::progress_watch::{ProgressWatch, StallState};
use eos_runtime::schema_migrations as migrations;
use sqlx::PgPool;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::server::Router;
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};
use tonic_health::server::HealthReporter;
use tower::layer::util::{Identity as NoLayer, Stack};

use crate::auth::{AuthPolicy, Authenticator};
use crate::config::Config;
use crate::grpc_connections::{self, ConnectionLimits, TrackCallsLayer};
use crate::grpc_service::DedupApi;
use crate::intent_store::{self, IntentStore};
use crate::lookups::Lookups;
use crate::metrics;
use crate::reconciler::{self, Asked, ReconcilerSettings};
use crate::write_watch::{self, WriteWatch};
use crate::{purge, retention::RetentionPolicy};
use dedup_client::{ProviderAccess, ProviderClient};

/// The guarantee this configuration gives, for logs and `/boundary`.
pub(crate) fn boundary(config: &Config) -> Boundary {
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

/// dedup-service, wired and not yet running: made by [`build`], run by [`Service::run`].
pub struct Service {
    /// `/metrics`, `/healthz`, `/readyz` and `/boundary`, serving since start-up; stopped last.
    ops: OpsEndpoint,
    pool: PgPool,
    background: Background,
    grpc: Grpc,
    /// `--shutdown-timeout`: how long the gRPC calls, then the background tasks, may drain.
    drain_limit: Duration,
}

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service")
            .field("grpc_addr", &self.grpc.addr)
            .field("tls", &self.grpc.tls)
            .field("drain_limit", &self.drain_limit)
            .finish_non_exhaustive()
    }
}

/// Builds dedup-service from its flags: every check and every connection it needs, so that a
/// mistake stops the start and never a later call. `Ok(None)` when `shutdown` is cancelled
/// while PostgreSQL is still being waited for (the process then ends as a stop does, exit 0).
///
/// `shutdown` is taken here as well as by [`Service::run`] because that wait is the one step of
/// start-up with no end of its own: PostgreSQL may come up after this service, and the pool waits
/// for it with backoff (docs/architecture/crates.md "Where the transport settings are read"); a
/// stop asked for meanwhile must still end the process.
///
/// # Errors
///
/// A configuration that does not fit together (retention below the replay horizon, a token in
/// two roles, an unauthenticated non-loopback listener …), a port taken, PostgreSQL refusing
/// the connection or a migration, an unreadable credential, CA, certificate or key.
pub async fn build(
    config: Config,
    shutdown: &CancellationToken,
) -> anyhow::Result<Option<Service>> {
    let auth = checked_configuration(&config)?;
    // Before the ops endpoint: on port 0 it could be handed the fixed gRPC port, free since the
    // process this one replaces died a moment ago.
    let listener = TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {} for gRPC", config.listen))?;
    let ops = OpsEndpoint::start(config.metrics_addr, boundary(&config), metrics::describe).await?;
    metrics::record_retention(&config.retention_policy());
    // The ops endpoint serves from here on: whatever ends the start now stops it first.
    match wire(&config, auth, listener, &ops.stalls, shutdown).await {
        Ok(Some((pool, background, grpc))) => Ok(Some(Service {
            ops,
            pool,
            background,
            grpc,
            drain_limit: config.shutdown_timeout,
        })),
        Ok(None) => {
            ops.stop().await;
            Ok(None)
        }
        Err(error) => {
            ops.stop().await;
            Err(error)
        }
    }
}

/// What clap cannot check: the values that must fit together, the credentials and whether the
/// listener may go without them. Logs the retention it accepted.
fn checked_configuration(config: &Config) -> anyhow::Result<AuthPolicy> {
    let problem = |problem: String| anyhow::anyhow!("configuration: {problem}");
    config.validate().map_err(problem)?;
    let auth = config.auth_policy().map_err(problem)?;
    auth.check_listen(config.listen, config.allow_unauthenticated)
        .map_err(problem)?;
    let policy: RetentionPolicy = config.retention_policy();
    tracing::info!(
        retention = %humantime::format_duration(policy.retention),
        required = %humantime::format_duration(policy.required_retention()),
        "retention covers the replay horizon"
    );
    Ok(auth)
}

/// The wiring behind the ports: the pool and its migrations, the reconciler's provider client,
/// the watches, and the gRPC server. `Ok(None)` when shut down while waiting for PostgreSQL.
async fn wire(
    config: &Config,
    auth: AuthPolicy,
    listener: TcpListener,
    stalls: &StallState,
    shutdown: &CancellationToken,
) -> anyhow::Result<Option<(PgPool, Background, Grpc)>> {
    let Some(pool) = intent_store::pool_builder(config.db_max_connections)
        .connect_at_start(config.database.url(), START_MAX_BACKOFF, shutdown)
        .await
        .context("connecting to PostgreSQL")?
    else {
        return Ok(None);
    };
    migrations::prepare_at_start(
        &pool,
        &intent_store::migrator(),
        "dedup-service",
        config.skip_migrations,
    )
    .await?;
    let store = IntentStore::new(pool.clone(), config.retention);
    let background = Background::build(config, store.clone(), stalls)?;
    let writes = WriteWatch::new(
        ProgressWatch::spawn(write_watch::LOOP, config.stall.policy(), stalls)
            .context("starting the progress watch")?,
        Some(pool.clone()),
    );
    // Starts the group commit's dispatchers when grouping is on; they wait for the first call.
    let api = DedupApi::new(
        store,
        config.lease_limits(),
        (config.group_commit_settings(), writes),
    );
    let grpc = Grpc::build(config, auth, listener, api)?;
    Ok(Some((pool, background, grpc)))
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
        access = access
            .with_ca_file(path)
            .map_err(|detail| anyhow::anyhow!("--provider-ca-file {detail}"))?;
    }
    Ok(access)
}

/// The tasks beside the gRPC server, built and not yet spawned: the reconciler and the purge.
struct Background {
    store: IntentStore,
    /// Whom the reconciler asks, and each target's strategy and key TTL.
    asked: Asked,
    progress: Arc<ProgressWatch>,
    reconciler: ReconcilerSettings,
    purge_interval: Duration,
}

impl Background {
    fn build(config: &Config, store: IntentStore, stalls: &StallState) -> anyhow::Result<Self> {
        let provider = match config.provider_url.as_deref() {
            Some(url) => Some(ProviderClient::new(
                url,
                config.provider_timeout,
                &provider_access(config)?,
            )?),
            None => {
                tracing::warn!(
                    "no --provider-url: UNKNOWN intents of lookup targets are only settled by \
                     Resolve calls"
                );
                None
            }
        };
        for (target_name, strategy) in &config.reconcile_strategies {
            tracing::info!(target_name, ?strategy, "reconcile strategy");
        }
        let policies = config.target_policies();
        let lookups = match &config.lookups {
            Some(path) => Lookups::load(path, config.provider_timeout, &policies)?,
            None => Lookups::default(),
        };
        for target_name in lookups.targets() {
            tracing::info!(target_name, "the target's own look-up (--lookups)");
        }
        let progress = ProgressWatch::spawn("dedup-reconciler", config.stall.policy(), stalls)
            .context("starting the progress watch")?;
        Ok(Self {
            store,
            asked: Asked {
                provider,
                lookups,
                policies,
            },
            progress,
            reconciler: ReconcilerSettings {
                interval: config.reconcile_interval,
                concurrency: config.reconcile_concurrency,
                in_flight_window: config.in_flight_window,
                provider_key_ttl: config.provider_key_ttl,
                rate_window: config.rate_window,
            },
            purge_interval: config.purge_interval,
        })
    }

    /// Spawns both tasks; they end when `stop` is cancelled.
    fn spawn(self, stop: &CancellationToken) -> TaskTracker {
        let tasks = TaskTracker::new();
        tasks.spawn(reconciler::run(
            self.store.clone(),
            (self.asked, self.progress),
            self.reconciler,
            stop.clone(),
        ));
        tasks.spawn(purge::run(self.store, self.purge_interval, stop.clone()));
        tasks.close();
        tasks
    }
}

/// The gRPC server as built at start-up: its type names its one layer ([`TrackCallsLayer`]).
type GrpcRouter = Router<Stack<TrackCallsLayer, NoLayer>>;

/// The gRPC side, built: the bound listener, the server with its services, and its health.
struct Grpc {
    router: GrpcRouter,
    listener: TcpListener,
    addr: SocketAddr,
    health: HealthReporter,
    limits: ConnectionLimits,
    tls: bool,
    mtls: bool,
    reflection: bool,
}

impl Grpc {
    /// The server with its limits, TLS, and its services (health, reflection if asked for, the
    /// API), each behind the authenticator but health.
    fn build(
        config: &Config,
        auth: AuthPolicy,
        listener: TcpListener,
        api: DedupApi,
    ) -> anyhow::Result<Self> {
        let addr = listener.local_addr()?;
        let (health, health_service) = tonic_health::server::health_reporter();
        let authenticator = Authenticator::new(auth);
        // Reflection describes the API to whoever may call it: off unless asked for, and behind
        // the same credentials as Dedup when on.
        let reflection = if config.reflection {
            let service = tonic_reflection::server::Builder::configure()
                .register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)
                .build_v1()
                .context("building the reflection service")?;
            Some(InterceptedService::new(service, authenticator.clone()))
        } else {
            None
        };
        // The message limits apply per message, before a handler sees it; the interceptor runs
        // before either.
        let api = InterceptedService::new(
            DedupServer::new(api)
                .max_decoding_message_size(config.max_decoding_message_size)
                .max_encoding_message_size(config.max_encoding_message_size),
            authenticator,
        );
        // tonic's own limits are per call and per connection once it is open; how many are
        // open, and for how long a silent or idle one stays, is grpc_connections' (docs/security.md
        // "dedup-service").
        let mut server = Server::builder()
            .concurrency_limit_per_connection(config.concurrency_per_connection)
            .timeout(config.request_timeout)
            .http2_keepalive_interval(Some(config.http2_keepalive_interval))
            .http2_keepalive_timeout(Some(config.http2_keepalive_timeout))
            .layer(grpc_connections::track_calls());
        let tls = match tls_config(config)? {
            Some(tls) => {
                server = server
                    .tls_config(tls)
                    .context("bad --tls-cert / --tls-key / --tls-client-ca")?;
                true
            }
            None => false,
        };
        let router = server
            .add_service(health_service)
            .add_optional_service(reflection)
            .add_service(api);
        Ok(Self {
            router,
            listener,
            addr,
            health,
            limits: config.connection_limits(),
            tls,
            mtls: config.tls_client_ca.is_some(),
            reflection: config.reflection,
        })
    }
}

/// The server's certificate and key (`--tls-cert`, `--tls-key`) and the CA its clients'
/// certificates must be signed by (`--tls-client-ca`), read from their files; `None` without
/// both a certificate and a key (plaintext gRPC).
fn tls_config(config: &Config) -> anyhow::Result<Option<ServerTlsConfig>> {
    let (Some(cert), Some(key)) = (&config.tls_cert, &config.tls_key) else {
        return Ok(None);
    };
    let cert = std::fs::read(cert)
        .with_context(|| format!("cannot read --tls-cert {}", cert.display()))?;
    let key =
        std::fs::read(key).with_context(|| format!("cannot read --tls-key {}", key.display()))?;
    // tonic builds the server's rustls config with the process's default crypto provider,
    // which rustls cannot pick by itself when a dependency enables its aws-lc-rs backend beside
    // ring (outbox-relay's replication client does, in a workspace build): ring, as every other
    // TLS endpoint of the suite uses. Installing fails only when one is installed already.
    let _ = tokio_rustls::rustls::crypto::ring::default_provider().install_default();
    let mut tls = ServerTlsConfig::new().identity(Identity::from_pem(cert, key));
    if let Some(ca) = &config.tls_client_ca {
        let ca = std::fs::read(ca)
            .with_context(|| format!("cannot read --tls-client-ca {}", ca.display()))?;
        // Required, not optional: a client without a certificate signed by this CA does not get
        // past the handshake.
        tls = tls.client_ca_root(Certificate::from_pem(ca));
    }
    Ok(Some(tls))
}

impl Service {
    /// Runs dedup-service until `shutdown` is cancelled, then drains: readiness and the gRPC
    /// health service say NOT_SERVING first, the calls in flight get `--shutdown-timeout` to
    /// finish, then the reconciler and the purge stop and the pool closes. `Ok` after a drain;
    /// an error only when the gRPC server itself fails.
    pub async fn run(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let Self {
            ops,
            pool,
            background,
            grpc,
            drain_limit,
        } = self;
        let stop_background = CancellationToken::new();
        let tasks = background.spawn(&stop_background);
        let served = grpc
            .serve(
                (ops.readiness.clone(), ops.stalls.clone()),
                shutdown,
                drain_limit,
            )
            .await;
        stop_background.cancel();
        if tokio::time::timeout(drain_limit.max(Duration::from_secs(1)), tasks.wait())
            .await
            .is_err()
        {
            tracing::warn!("background tasks did not stop in time");
        }
        pool.close().await;
        tracing::info!("stopped");
        ops.stop().await;
        served
    }
}

impl Grpc {
    /// Serves until `shutdown`, then stops accepting and gives the calls in flight up to
    /// `drain_limit` to finish.
    async fn serve(
        self,
        (readiness, stalls): (Readiness, StallState),
        shutdown: CancellationToken,
        drain_limit: Duration,
    ) -> anyhow::Result<()> {
        let Self {
            router,
            listener,
            addr: grpc_addr,
            health,
            limits,
            tls,
            mtls,
            reflection,
        } = self;
        health.set_serving::<DedupServer<DedupApi>>().await;
        let health_follows_stalls = tokio::spawn(grpc_health_follows_stalls(
            health.clone(),
            stalls,
            shutdown.clone(),
        ));
        // Connections are accepted until the drain has begun: readiness and the health service
        // say so first.
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
        let server = router.serve_with_incoming_shutdown(
            grpc_connections::incoming(listener, limits, tls, accepting),
            drained,
        );
        readiness.set(true);
        tracing::info!(
            %grpc_addr,
            tls,
            mtls,
            reflection,
            max_connections = limits.max_connections,
            handshake_timeout = ?limits.handshake_timeout,
            idle_timeout = ?limits.idle_timeout,
            "serving gRPC"
        );
        tokio::select! {
            served = server => served.context("gRPC server"),
            () = async {
                shutdown.cancelled().await;
                tokio::time::sleep(drain_limit).await;
            } => {
                tracing::warn!(timeout = ?drain_limit, "gRPC calls still running after the drain timeout");
                Ok(())
            }
        }
    }
}

/// How often the gRPC health statuses are set from the progress watches.
const GRPC_HEALTH_INTERVAL: Duration = Duration::from_secs(1);

/// The gRPC health service says what `/healthz` and `/readyz` say (docs/OBSERVABILITY.md
/// "Liveness"), for the orchestrators that probe dedup-service over gRPC (the Helm chart's
/// probes do): the server's overall status ("") is NOT_SERVING while a restart is due, the
/// `eos.dedup.v1.Dedup` service's while a loop is stalled past its warning. Until `shutdown`.
async fn grpc_health_follows_stalls(
    health: HealthReporter,
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
