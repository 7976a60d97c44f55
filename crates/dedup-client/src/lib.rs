//! What a caller of dedup-service needs, without the server: the gRPC client whose retries are
//! safe ([`grpc_client`]), the HTTP client of the provider's API ([`provider_client`]), the intent
//! state machine ([`state_machine`]), its `eos.dedup.v1` conversions ([`proto_convert`]) and the
//! link's credentials ([`credentials`]: bearer tokens, TLS).
//! dedup-service builds its server on the same state machine and conversions; the sink-writer's
//! provider target and the tests depend on this crate alone.
//!
//! Guarantee: every call the client makes is idempotent (a retried `Begin` carries the same
//! request id, reports repeat the same fencing token and secret), and every provider answer is sorted into
//! applied, definitely not applied, or not known — a timeout or a lost answer is never a failure.

mod charge_answer;
pub mod credentials;
pub mod grpc_client;
pub mod http_call;
pub mod proto_convert;
pub mod provider_client;
pub mod state_machine;

pub use credentials::{
    BearerToken, ClientCredentials, ClientTlsFiles, CredentialError, DedupTlsFlags,
};
pub use grpc_client::{
    BeginOutcome, BeginParams, Certificate, ClientError, ClientTlsConfig, CompleteItem,
    DedupClient, RetryPolicy,
};
pub use provider_client::{ChargeOutcome, ProviderAccess, ProviderClient, ProviderError};
pub use state_machine::{FencingSecret, FencingToken};
