//! Who may call what: the bearer-token interceptor in front of `eos.dedup.v1.Dedup` (and server
//! reflection, when on), and the roles the handlers check.
//!
//! - Client RPCs (Begin, BeginBatch, Complete, CompleteBatch, Fail, MarkUnknown, Get) need a
//!   client or an operator token — or, when no client token is configured, a client certificate
//!   verified by mTLS (`--tls-client-ca`).
//! - Operator RPCs (Resolve, ListUnknown) need an operator token: settling an UNKNOWN as
//!   SUCCEEDED without asking the provider is exactly what an attacker would want.
//! - No token (where one is needed) or a token that is none of ours: `UNAUTHENTICATED`, before any
//!   handler runs. A client credential on an operator RPC: `PERMISSION_DENIED`.
//! - `grpc.health.v1` is not behind the interceptor: probes carry no credentials.
//!
//! With neither client tokens nor mTLS, the service is unauthenticated: every caller is an
//! operator unless operator tokens are configured. [`AuthPolicy::check_listen`] refuses that on a
//! non-loopback address without `--allow-unauthenticated`.

use std::net::SocketAddr;
use std::sync::Arc;

use dedup_client::credentials::{BearerToken, bearer_of};
use tonic::service::Interceptor;
use tonic::{Request, Status};

use crate::error::DedupError;
use crate::metrics;

/// What an authenticated caller may do; put into the request's extensions by [`Authenticator`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    Client,
    Operator,
}

impl Role {
    /// The caller's role. A request that did not pass the interceptor has none and counts as a
    /// client (fail closed: it can never reach an operator RPC by accident).
    pub(crate) fn of<T>(request: &Request<T>) -> Self {
        request
            .extensions()
            .get::<Role>()
            .copied()
            .unwrap_or(Role::Client)
    }

    pub(crate) fn require_operator(self, method: &'static str) -> Result<(), DedupError> {
        match self {
            Role::Operator => Ok(()),
            Role::Client => Err(DedupError::NotOperator { method }),
        }
    }
}

/// The configured credentials.
#[derive(Debug, Clone, Default)]
pub(crate) struct AuthPolicy {
    pub(crate) client_tokens: Vec<BearerToken>,
    pub(crate) operator_tokens: Vec<BearerToken>,
    /// Client certificates are required and verified by TLS (`--tls-client-ca`).
    pub(crate) mtls: bool,
}

impl AuthPolicy {
    /// Nothing authenticates a client: no client token and no mTLS.
    pub(crate) fn is_unauthenticated(&self) -> bool {
        self.client_tokens.is_empty() && !self.mtls
    }

    /// Refuses an unauthenticated service on an address others can reach, unless explicitly
    /// allowed; warns whenever it is unauthenticated.
    pub(crate) fn check_listen(
        &self,
        listen: SocketAddr,
        allow_unauthenticated: bool,
    ) -> Result<(), String> {
        if !self.is_unauthenticated() {
            if self.operator_tokens.is_empty() {
                tracing::warn!(
                    "no operator token (--operator-token / --operator-token-file): Resolve and \
                     ListUnknown are refused to every caller"
                );
            }
            return Ok(());
        }
        if !listen.ip().is_loopback() && !allow_unauthenticated {
            return Err(format!(
                "--listen {listen} is not a loopback address and no client credential is \
                 configured: give --client-token / --client-token-file (and \
                 --operator-token / --operator-token-file) or --tls-client-ca, or \
                 --allow-unauthenticated to accept anyone who reaches the port"
            ));
        }
        tracing::warn!(
            %listen,
            operator_tokens = self.operator_tokens.len(),
            "dedup-service is UNAUTHENTICATED: anyone who reaches the port may Begin and report \
             outcomes{}",
            if self.operator_tokens.is_empty() {
                ", and Resolve UNKNOWN intents"
            } else {
                ""
            }
        );
        Ok(())
    }

    /// The role a request's `authorization` value (if any) earns. Every configured token is
    /// compared, in constant time each, so the time taken says nothing about which one nearly
    /// matched.
    pub(crate) fn authenticate(&self, authorization: Option<&str>) -> Result<Role, Refusal> {
        let Some(authorization) = authorization else {
            return if !self.client_tokens.is_empty() {
                Err(Refusal::MissingToken)
            } else if self.mtls || !self.operator_tokens.is_empty() {
                // mTLS verified the certificate; or nothing authenticates clients, but operators
                // have tokens of their own.
                Ok(Role::Client)
            } else {
                Ok(Role::Operator)
            };
        };
        let token = bearer_of(authorization).ok_or(Refusal::UnknownToken)?;
        let operator = any_matches(&self.operator_tokens, token);
        let client = any_matches(&self.client_tokens, token);
        if operator {
            Ok(Role::Operator)
        } else if client {
            Ok(Role::Client)
        } else {
            Err(Refusal::UnknownToken)
        }
    }
}

fn any_matches(tokens: &[BearerToken], presented: &str) -> bool {
    // `fold`, not `any`: no early exit.
    tokens
        .iter()
        .fold(false, |found, token| token.matches(presented) | found)
}

/// Why a call was refused before its handler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    MissingToken,
    UnknownToken,
}

impl Refusal {
    fn label(self) -> &'static str {
        match self {
            Self::MissingToken => "missing_token",
            Self::UnknownToken => "unknown_token",
        }
    }
}

impl From<Refusal> for Status {
    fn from(refusal: Refusal) -> Self {
        match refusal {
            Refusal::MissingToken => {
                Status::unauthenticated("authorization: Bearer <token> is required")
            }
            // Never echo what was presented.
            Refusal::UnknownToken => Status::unauthenticated("the bearer token is not valid"),
        }
    }
}

/// The tonic interceptor: authenticates, records the role for the handlers, or refuses.
#[derive(Debug, Clone)]
pub(crate) struct Authenticator {
    policy: Arc<AuthPolicy>,
}

impl Authenticator {
    pub(crate) fn new(policy: AuthPolicy) -> Self {
        Self {
            policy: Arc::new(policy),
        }
    }
}

impl Interceptor for Authenticator {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        let authorization = match request.metadata().get("authorization") {
            Some(value) => Some(value.to_str().map_err(|_| {
                refused(Refusal::UnknownToken);
                Status::from(Refusal::UnknownToken)
            })?),
            None => None,
        };
        match self.policy.authenticate(authorization) {
            Ok(role) => {
                request.extensions_mut().insert(role);
                Ok(request)
            }
            Err(refusal) => {
                refused(refusal);
                Err(refusal.into())
            }
        }
    }
}

fn refused(refusal: Refusal) {
    ::metrics::counter!(metrics::AUTH_REFUSED, "reason" => refusal.label()).increment(1);
    tracing::debug!(reason = refusal.label(), "refused an unauthenticated call");
}

#[cfg(test)]
mod tests {
    use super::*;

    const CLIENT: &str = "client-token-0123456789";
    const CLIENT_NEXT: &str = "client-token-rotated-0123";
    const OPERATOR: &str = "operator-token-0123456789";

    #[test]
    fn every_refusal_label_is_registered_at_zero() {
        let labels = [Refusal::MissingToken, Refusal::UnknownToken].map(Refusal::label);
        assert_eq!(labels, metrics::AUTH_REFUSAL_REASONS);
    }

    fn token(value: &str) -> BearerToken {
        BearerToken::new(value, "test").expect("valid token")
    }

    fn with_tokens() -> AuthPolicy {
        AuthPolicy {
            client_tokens: vec![token(CLIENT), token(CLIENT_NEXT)],
            operator_tokens: vec![token(OPERATOR)],
            mtls: false,
        }
    }

    fn bearer(value: &str) -> String {
        format!("Bearer {value}")
    }

    #[test]
    fn tokens_give_their_role_and_anything_else_is_unauthenticated() {
        let policy = with_tokens();
        assert_eq!(policy.authenticate(Some(&bearer(CLIENT))), Ok(Role::Client));
        assert_eq!(
            policy.authenticate(Some(&bearer(CLIENT_NEXT))),
            Ok(Role::Client),
            "both tokens of a rotation are valid"
        );
        assert_eq!(
            policy.authenticate(Some(&bearer(OPERATOR))),
            Ok(Role::Operator)
        );
        assert_eq!(policy.authenticate(None), Err(Refusal::MissingToken));
        for wrong in [
            bearer("client-token-012345678"),
            bearer(""),
            CLIENT.to_owned(),
            format!("Basic {CLIENT}"),
        ] {
            assert_eq!(
                policy.authenticate(Some(&wrong)),
                Err(Refusal::UnknownToken),
                "{wrong}"
            );
        }
    }

    #[test]
    fn clients_cannot_call_operator_rpcs() {
        assert!(matches!(
            Role::Client.require_operator("Resolve"),
            Err(DedupError::NotOperator { method: "Resolve" })
        ));
        assert!(Role::Operator.require_operator("Resolve").is_ok());
        assert_eq!(
            Role::of(&Request::new(())),
            Role::Client,
            "no role recorded: not an operator"
        );
    }

    #[test]
    fn mtls_alone_authenticates_clients_but_not_operators() {
        let policy = AuthPolicy {
            mtls: true,
            ..AuthPolicy::default()
        };
        assert_eq!(policy.authenticate(None), Ok(Role::Client));
        assert_eq!(
            policy.authenticate(Some(&bearer(CLIENT))),
            Err(Refusal::UnknownToken),
            "a token that is none of ours is refused even with a certificate"
        );
        assert!(!policy.is_unauthenticated());
    }

    #[test]
    fn unauthenticated_only_on_loopback_or_when_allowed() {
        let open = AuthPolicy::default();
        assert!(open.is_unauthenticated());
        assert_eq!(open.authenticate(None), Ok(Role::Operator));
        let loopback: SocketAddr = "127.0.0.1:50051".parse().expect("addr");
        let anywhere: SocketAddr = "0.0.0.0:50051".parse().expect("addr");
        assert!(open.check_listen(loopback, false).is_ok());
        let error = open.check_listen(anywhere, false).expect_err("refused");
        assert!(error.contains("--allow-unauthenticated"), "{error}");
        assert!(open.check_listen(anywhere, true).is_ok());
        assert!(with_tokens().check_listen(anywhere, false).is_ok());

        let operators_only = AuthPolicy {
            operator_tokens: vec![token(OPERATOR)],
            ..AuthPolicy::default()
        };
        assert_eq!(
            operators_only.authenticate(None),
            Ok(Role::Client),
            "with operator tokens, an anonymous caller is no operator"
        );
    }
}
