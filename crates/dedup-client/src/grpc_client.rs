//! A Rust client of the dedup-service whose retries are safe, for callers such as the
//! sink-writer's provider target:
//!
//! ```text
//! match client.begin(&params).await? {
//!     BeginOutcome::Acquired { fencing_token, .. } => match provider.charge(id, &body, deadline).await {
//!         ChargeOutcome::Applied { body, .. } => client.complete(id, fencing_token, body).await?,
//!         ChargeOutcome::Rejected { body, retryable, .. } => client.fail(id, fencing_token, &body, retryable).await?,
//!         ChargeOutcome::Ambiguous { detail } => client.mark_unknown(id, fencing_token, &detail).await?,
//!     },
//!     // Succeeded / Failed / Conflict / Expired: final; InProgress / Unknown: ask again later.
//!     other => …,
//! }
//! ```
//!
//! Every call carries the current span's trace context (and the bearer token of its
//! [`ClientCredentials`], if any) and is retried on transient codes
//! (UNAVAILABLE, DEADLINE_EXCEEDED, …). That is safe because every call is idempotent: a retried
//! Begin carries the same `request_id`, so if the first attempt acquired, the retry gets the same
//! token back instead of a second acquisition; Complete/Fail/MarkUnknown with the same token are
//! repeats. The client never calls the provider itself.

use std::future::Future;
use std::time::Duration;

use eos_proto::dedup::v1 as pb;
use eos_proto::dedup::v1::dedup_client::DedupClient as GrpcClient;
use eos_runtime::backoff::{Retryable as _, doubling};
use eos_runtime::trace_context::{context_fields, inject_grpc};
use opentelemetry::Context;
use time::OffsetDateTime;
pub use tonic::transport::{Certificate, ClientTlsConfig};
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Response, Status};
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use crate::credentials::{ClientCredentials, CredentialError};
use crate::proto_convert;
pub use crate::state_machine::BeginOutcome;
use crate::state_machine::FencingToken;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// `endpoint` is shown without its user information, which could be a credential.
    #[error("bad dedup-service endpoint {endpoint:?}: {source}")]
    Endpoint {
        endpoint: String,
        source: tonic::transport::Error,
    },
    /// The service's answer (after retries, for transient codes).
    #[error("dedup-service: {}: {}", .0.code(), .0.message())]
    Status(#[from] Status),
    #[error("dedup-service credentials: {0}")]
    Credentials(#[from] CredentialError),
    #[error("dedup-service answered without an outcome")]
    Protocol,
}

impl ClientError {
    pub fn code(&self) -> Option<Code> {
        match self {
            Self::Status(status) => Some(status.code()),
            _ => None,
        }
    }

    /// A newer holder exists (or the transition does not fit the state): stop reporting and
    /// Begin again to learn the outcome.
    pub fn is_failed_precondition(&self) -> bool {
        self.code() == Some(Code::FailedPrecondition)
    }
}

/// Retries of transient failures.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    /// Attempts per call, the first included.
    pub attempts: u32,
    pub first_backoff: Duration,
    pub max_backoff: Duration,
    /// Deadline of each attempt (sent as `grpc-timeout`).
    pub call_timeout: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            attempts: 8,
            first_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(2),
            call_timeout: Duration::from_secs(5),
        }
    }
}

/// Codes after which the same call may simply be sent again (every dedup call is idempotent: a
/// Begin by its request id, the others by the fencing token). `Cancelled` is what a connection
/// closed mid-call looks like — e.g. a dedup-service replica that died behind a load balancer.
pub fn is_transient(code: Code) -> bool {
    matches!(
        code,
        Code::Unavailable
            | Code::Cancelled
            | Code::DeadlineExceeded
            | Code::ResourceExhausted
            | Code::Aborted
            | Code::Unknown
    )
}

/// What to Begin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BeginParams {
    /// Also the provider's idempotency key, e.g. `<sink>:<event_id>`.
    pub operation_id: String,
    pub fingerprint: Vec<u8>,
    pub owner: String,
    pub occurred_at: OffsetDateTime,
    /// `None`: the service's default lease.
    pub lease_ttl: Option<Duration>,
}

impl BeginParams {
    fn to_request(&self, request_id: String) -> pb::BeginRequest {
        pb::BeginRequest {
            operation_id: self.operation_id.clone(),
            fingerprint: self.fingerprint.clone(),
            owner: self.owner.clone(),
            lease_ttl: self
                .lease_ttl
                .and_then(|ttl| prost_types::Duration::try_from(ttl).ok()),
            occurred_at: Some(proto_convert::timestamp(self.occurred_at)),
            request_id,
            // A single Begin's context is the call's metadata.
            trace_context: Default::default(),
        }
    }
}

/// One item of a [`DedupClient::complete_batch`].
#[derive(Debug, Clone)]
pub struct CompleteItem {
    pub operation_id: String,
    pub fencing_token: FencingToken,
    /// The provider's result, stored and returned to later Begins.
    pub result: Vec<u8>,
    /// The trace context of the work this item is for: dedup-service answers the item in a span
    /// of its own, a child of it. `Context::new()`: the item is in the call's trace.
    pub trace: Context,
}

fn new_request_id() -> String {
    format!("cli-{:032x}", rand::random::<u128>())
}

#[derive(Debug, Clone)]
pub struct DedupClient {
    inner: GrpcClient<Channel>,
    policy: RetryPolicy,
    /// `Bearer …`, added to every call (marked sensitive: never logged by tonic/hyper).
    authorization: Option<tonic::metadata::AsciiMetadataValue>,
}

impl DedupClient {
    /// A client for `endpoint` presenting `credentials`: `https://` endpoints use its TLS files
    /// (a CA is required; a client certificate for mTLS is optional), `http://` endpoints refuse
    /// TLS files rather than ignore them, and the token (if any) goes with every call.
    pub fn connect_lazy_with(
        endpoint: &str,
        credentials: &ClientCredentials,
    ) -> Result<Self, ClientError> {
        let client = if endpoint.starts_with("https://") {
            Self::connect_lazy_tls(endpoint, credentials.tls.load()?)?
        } else if credentials.tls.is_empty() {
            Self::connect_lazy(endpoint)?
        } else {
            return Err(ClientError::Credentials(CredentialError::Invalid {
                what: format!(
                    "dedup-service endpoint {:?}",
                    eos_runtime::secrets::redact_url_userinfo(endpoint)
                ),
                problem: "TLS files are set but the endpoint is not https://".into(),
            }));
        };
        Ok(client.with_token(credentials.token.as_ref()))
    }

    /// Sends `authorization: Bearer <token>` with every call (`None`: no header).
    pub fn with_token(mut self, token: Option<&crate::credentials::BearerToken>) -> Self {
        self.authorization = token.map(crate::credentials::BearerToken::authorization);
        self
    }

    /// A client for `endpoint` (e.g. `http://127.0.0.1:50051`). Connects lazily, so a service
    /// that is down now is retried like any transient failure.
    pub fn connect_lazy(endpoint: &str) -> Result<Self, ClientError> {
        let channel = Endpoint::from_shared(endpoint.to_owned())
            .map_err(|source| ClientError::Endpoint {
                endpoint: eos_runtime::secrets::redact_url_userinfo(endpoint),
                source,
            })?
            .connect_timeout(Duration::from_secs(2))
            .tcp_nodelay(true)
            .connect_lazy();
        Ok(Self::from_channel(channel))
    }

    /// Like [`DedupClient::connect_lazy`], over TLS (`https://…`), trusting what `tls` says.
    pub fn connect_lazy_tls(endpoint: &str, tls: ClientTlsConfig) -> Result<Self, ClientError> {
        let bad = |source| ClientError::Endpoint {
            endpoint: eos_runtime::secrets::redact_url_userinfo(endpoint),
            source,
        };
        let channel = Endpoint::from_shared(endpoint.to_owned())
            .map_err(bad)?
            .tls_config(tls)
            .map_err(bad)?
            .connect_timeout(Duration::from_secs(2))
            .tcp_nodelay(true)
            .connect_lazy();
        Ok(Self::from_channel(channel))
    }

    pub fn from_channel(channel: Channel) -> Self {
        Self {
            inner: GrpcClient::new(channel),
            policy: RetryPolicy::default(),
            authorization: None,
        }
    }

    pub fn with_policy(mut self, policy: RetryPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// The generated client, for anything not wrapped here. It sends no token: add the
    /// `authorization` metadata yourself where the service requires one.
    pub fn grpc(&self) -> GrpcClient<Channel> {
        self.inner.clone()
    }

    async fn call<Req, Resp, F, Fut>(&self, request: Req, send: F) -> Result<Resp, ClientError>
    where
        Req: Clone,
        F: Fn(GrpcClient<Channel>, tonic::Request<Req>) -> Fut,
        Fut: Future<Output = Result<Response<Resp>, Status>>,
    {
        let attempt_once = || {
            let mut message = tonic::Request::new(request.clone());
            message.set_timeout(self.policy.call_timeout);
            if let Some(authorization) = &self.authorization {
                message
                    .metadata_mut()
                    .insert("authorization", authorization.clone());
            }
            inject_grpc(&tracing::Span::current().context(), message.metadata_mut());
            send(self.inner.clone(), message)
        };
        let mut attempt = 1;
        let delays = doubling(self.policy.first_backoff, self.policy.max_backoff)
            .with_jitter()
            .with_max_times(self.policy.attempts.saturating_sub(1) as usize);
        attempt_once
            .retry(delays)
            .when(|status| is_transient(status.code()))
            .notify(|status, _delay| {
                tracing::debug!(code = ?status.code(), attempt, "retrying dedup-service call");
                attempt += 1;
            })
            .await
            .map(Response::into_inner)
            .map_err(ClientError::from)
    }

    /// Begin. Only `Acquired` allows a provider call.
    pub async fn begin(&self, params: &BeginParams) -> Result<BeginOutcome, ClientError> {
        // One request id for every retry of this call: a retry replays, never re-acquires.
        let request = params.to_request(new_request_id());
        let response = self
            .call(request, |mut client, request| async move {
                client.begin(request).await
            })
            .await?;
        proto_convert::begin_outcome(response).ok_or(ClientError::Protocol)
    }

    /// Begin for many operations in one call; answers in the order of `items`. Each item goes
    /// with the trace context of the work it is for (`Context::new()`: the call's trace), so
    /// dedup-service answers it in that trace, and a reconciliation of it later joins it too.
    pub async fn begin_batch(
        &self,
        items: &[(BeginParams, Context)],
    ) -> Result<Vec<BeginOutcome>, ClientError> {
        let request = pb::BeginBatchRequest {
            items: items
                .iter()
                .map(|(params, trace)| pb::BeginRequest {
                    trace_context: context_fields(trace),
                    ..params.to_request(new_request_id())
                })
                .collect(),
        };
        let response = self
            .call(request, |mut client, request| async move {
                client.begin_batch(request).await
            })
            .await?;
        if response.items.len() != items.len() {
            return Err(ClientError::Protocol);
        }
        response
            .items
            .into_iter()
            .map(|item| proto_convert::begin_outcome(item).ok_or(ClientError::Protocol))
            .collect()
    }

    pub async fn complete(
        &self,
        operation_id: &str,
        fencing_token: FencingToken,
        result: Vec<u8>,
    ) -> Result<pb::Intent, ClientError> {
        let request = pb::CompleteRequest {
            operation_id: operation_id.to_owned(),
            fencing_token: fencing_token.counter,
            result,
            fencing_secret: fencing_token.secret.as_bytes().to_vec(),
            trace_context: Default::default(),
        };
        let response = self
            .call(request, |mut client, request| async move {
                client.complete(request).await
            })
            .await?;
        response.intent.ok_or(ClientError::Protocol)
    }

    /// Complete for many operations in one call; one answer per item, in order (a stale
    /// token fails only its item, as `FAILED_PRECONDITION`).
    pub async fn complete_batch(
        &self,
        items: &[CompleteItem],
    ) -> Result<Vec<Result<pb::Intent, ClientError>>, ClientError> {
        let request = pb::CompleteBatchRequest {
            items: items
                .iter()
                .map(|item| pb::CompleteRequest {
                    operation_id: item.operation_id.clone(),
                    fencing_token: item.fencing_token.counter,
                    result: item.result.clone(),
                    fencing_secret: item.fencing_token.secret.as_bytes().to_vec(),
                    trace_context: context_fields(&item.trace),
                })
                .collect(),
        };
        let response = self
            .call(request, |mut client, request| async move {
                client.complete_batch(request).await
            })
            .await?;
        if response.items.len() != items.len() {
            return Err(ClientError::Protocol);
        }
        Ok(response
            .items
            .into_iter()
            .map(|item| match item.intent {
                Some(intent) if item.code == Code::Ok as i32 => Ok(intent),
                _ => Err(ClientError::Status(Status::new(
                    Code::from_i32(item.code),
                    item.message,
                ))),
            })
            .collect())
    }

    pub async fn fail(
        &self,
        operation_id: &str,
        fencing_token: FencingToken,
        reason: &str,
        retryable: bool,
    ) -> Result<pb::Intent, ClientError> {
        let request = pb::FailRequest {
            operation_id: operation_id.to_owned(),
            fencing_token: fencing_token.counter,
            reason: reason.to_owned(),
            retryable,
            fencing_secret: fencing_token.secret.as_bytes().to_vec(),
        };
        let response = self
            .call(request, |mut client, request| async move {
                client.fail(request).await
            })
            .await?;
        response.intent.ok_or(ClientError::Protocol)
    }

    pub async fn mark_unknown(
        &self,
        operation_id: &str,
        fencing_token: FencingToken,
        detail: &str,
    ) -> Result<pb::Intent, ClientError> {
        let request = pb::MarkUnknownRequest {
            operation_id: operation_id.to_owned(),
            fencing_token: fencing_token.counter,
            detail: detail.to_owned(),
            fencing_secret: fencing_token.secret.as_bytes().to_vec(),
        };
        let response = self
            .call(request, |mut client, request| async move {
                client.mark_unknown(request).await
            })
            .await?;
        response.intent.ok_or(ClientError::Protocol)
    }

    pub async fn get(&self, operation_id: &str) -> Result<pb::Intent, ClientError> {
        let request = pb::GetRequest {
            operation_id: operation_id.to_owned(),
        };
        let response = self
            .call(request, |mut client, request| async move {
                client.get(request).await
            })
            .await?;
        response.intent.ok_or(ClientError::Protocol)
    }

    pub async fn list_unknown(&self, limit: u32) -> Result<Vec<pb::Intent>, ClientError> {
        let request = pb::ListUnknownRequest { limit };
        let response = self
            .call(request, |mut client, request| async move {
                client.list_unknown(request).await
            })
            .await?;
        Ok(response.intents)
    }

    pub async fn resolve(&self, request: pb::ResolveRequest) -> Result<pb::Intent, ClientError> {
        let response = self
            .call(request, |mut client, request| async move {
                client.resolve(request).await
            })
            .await?;
        response.intent.ok_or(ClientError::Protocol)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_transient_codes_are_retried() {
        for code in [
            Code::Unavailable,
            Code::Cancelled,
            Code::DeadlineExceeded,
            Code::ResourceExhausted,
        ] {
            assert!(is_transient(code), "{code:?}");
        }
        for code in [
            Code::InvalidArgument,
            Code::FailedPrecondition,
            Code::NotFound,
            Code::Internal,
        ] {
            assert!(!is_transient(code), "{code:?}");
        }
    }

    #[test]
    fn begin_params_carry_every_field() {
        let params = BeginParams {
            operation_id: "sink:e-1".into(),
            fingerprint: vec![1, 2],
            owner: "w".into(),
            occurred_at: OffsetDateTime::UNIX_EPOCH,
            lease_ttl: Some(Duration::from_secs(5)),
        };
        let request = params.to_request("r-1".into());
        assert_eq!(request.operation_id, "sink:e-1");
        assert_eq!(request.request_id, "r-1");
        assert_eq!(request.lease_ttl.map(|d| d.seconds), Some(5));
        assert_eq!(request.occurred_at.map(|t| t.seconds), Some(0));
    }
}
