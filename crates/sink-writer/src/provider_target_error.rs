//! Why a provider target's batch could not be settled, and the limits on its names. Its own
//! module, so that the sink's error (which wraps it) and the provider target (which returns it)
//! each use it without using each other.

use std::time::Duration;

use dedup_client::{ClientError, ProviderError};

/// dedup-service's limit on an operation id, in bytes.
pub(crate) const MAX_OPERATION_ID_BYTES: usize = 256;
/// Longest target name: `<name>:<event_id>` must fit [`MAX_OPERATION_ID_BYTES`] for the longest
/// event id the envelope allows, or every event with a long id would be refused by dedup-service.
pub(crate) const MAX_TARGET_NAME_BYTES: usize =
    MAX_OPERATION_ID_BYTES - 1 - eos_core::envelope::MAX_ID_BYTES;

#[derive(Debug, thiserror::Error)]
pub enum ProviderTargetError {
    #[error("provider target {target}: bad URL: {source}")]
    Url {
        target: String,
        source: ProviderError,
    },
    /// The credential or the CA could not be read; the message names where from, never the value.
    #[error("provider target {target}: {detail}")]
    Access { target: String, detail: String },
    #[error("provider target {target}: bad dedup-service URL or credentials: {source}")]
    DedupUrl { target: String, source: ClientError },
    /// dedup-service did not answer after the client's retries: the batch is retried later.
    #[error("provider target {target}: {source}")]
    Dedup { target: String, source: ClientError },
    /// Some events are still UNKNOWN or held by another owner after `settle_timeout`.
    #[error(
        "provider target {target}: operation {operation_id} not final after {}: waiting for \
         dedup-service's reconciler (is it running with --provider-url?) or another holder's lease",
        humantime::format_duration(*timeout)
    )]
    Unsettled {
        target: String,
        operation_id: String,
        timeout: Duration,
    },
    #[error("provider target {target}: shutting down with operations not final")]
    Cancelled { target: String },
    #[error(
        "provider target name {target:?} is {len} bytes, at most {MAX_TARGET_NAME_BYTES} allowed: \
         operation ids are <name>:<event_id>, at most {MAX_OPERATION_ID_BYTES} bytes with event ids \
         of up to {} bytes",
        eos_core::envelope::MAX_ID_BYTES
    )]
    NameTooLong { target: String, len: usize },
}
