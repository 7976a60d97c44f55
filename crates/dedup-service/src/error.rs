//! The gRPC boundary's error enum. Each variant is something the caller does differently, and
//! [`From<DedupError> for tonic::Status`] is the one place where errors become status codes.

use std::sync::Arc;

use dedup_client::state_machine::{IntentState, Transition};

/// Why a call of the store or of the gRPC API did not succeed; each variant is something the
/// caller does differently (docs/CODE_STYLE.md "Errors"). It becomes a gRPC status in one place,
/// `From<DedupError> for tonic::Status`.
#[derive(Debug, thiserror::Error)]
pub enum DedupError {
    /// Fix the request: the field is named. `INVALID_ARGUMENT`.
    #[error("{field}: {problem}")]
    InvalidArgument { field: String, problem: String },
    /// No intent for this operation id (never begun, or purged). `NOT_FOUND`.
    #[error("no intent for operation {operation_id:?}")]
    NotFound { operation_id: String },
    /// The caller is not (or no longer) the holder: a newer token exists, or the token was never
    /// issued. It must not report an outcome; Begin again to learn the state.
    /// `FAILED_PRECONDITION`.
    #[error(
        "fencing_token {presented} is not the current token {current} of operation {operation_id:?}"
    )]
    StaleToken {
        operation_id: String,
        presented: i64,
        current: i64,
    },
    /// The counter is the current one but the secret is not its secret: the caller never
    /// acquired this token (a guess, a forgery, or a bug that mixed up tokens). Nothing changed.
    /// `PERMISSION_DENIED`, not `FAILED_PRECONDITION`: this caller is not the holder and Begin
    /// will not make it one, so it must not take the "lost the lease, Begin again" path a stale
    /// holder takes; it is also the code alerts on forged reports watch.
    #[error(
        "fencing_secret is not the secret of fencing_token {fencing_token} of operation {operation_id:?}"
    )]
    WrongFencingSecret {
        operation_id: String,
        fencing_token: i64,
    },
    /// An operator RPC (Resolve, ListUnknown) called with a client credential.
    /// `PERMISSION_DENIED`.
    #[error("{method} needs an operator token")]
    NotOperator { method: &'static str },
    /// The transition is not allowed from the intent's state (e.g. Fail after SUCCEEDED).
    /// `FAILED_PRECONDITION`.
    #[error("cannot {} operation {operation_id:?} in state {state}", transition.verb())]
    WrongState {
        operation_id: String,
        state: IntentState,
        transition: Transition,
    },
    /// PostgreSQL cannot be reached (or the pool is exhausted): retrying the same call is safe.
    /// `UNAVAILABLE`.
    #[error("database unavailable: {0}")]
    Unavailable(#[source] sqlx::Error),
    /// Anything else from the database. `INTERNAL`.
    #[error("database: {0}")]
    Database(#[source] sqlx::Error),
    /// A row (or an answer) that breaks the schema's promises, e.g. a state the code does not
    /// know. `INTERNAL`.
    #[error("corrupt row: {0}")]
    CorruptRow(String),
    /// The error of a group commit's statement (`group_commit.rs`), told to every call of the
    /// group: each gets the status the error gives a single call.
    #[error(transparent)]
    Group(Arc<DedupError>),
    /// A grouped call's group ended without answering it (the service is stopping). `INTERNAL`.
    #[error("the group commit of this call ended without an answer")]
    GroupCommitLost,
}

impl DedupError {
    pub(crate) fn invalid(field: impl Into<String>, problem: impl Into<String>) -> Self {
        Self::InvalidArgument {
            field: field.into(),
            problem: problem.into(),
        }
    }

    /// Whether the database decided the call (a result or a refusal such as a stale token): for
    /// the progress watch of the intent writes, progress (docs/OBSERVABILITY.md "Liveness").
    /// A database error, a corrupt row or a lost group is no answer.
    pub(crate) fn is_answer(&self) -> bool {
        match self {
            Self::Unavailable(_)
            | Self::Database(_)
            | Self::CorruptRow(_)
            | Self::GroupCommitLost => false,
            Self::Group(shared) => shared.is_answer(),
            Self::InvalidArgument { .. }
            | Self::NotFound { .. }
            | Self::StaleToken { .. }
            | Self::WrongFencingSecret { .. }
            | Self::NotOperator { .. }
            | Self::WrongState { .. } => true,
        }
    }

    /// The database's error behind this one, if any.
    pub(crate) fn database_error(&self) -> Option<&sqlx::Error> {
        match self {
            Self::Unavailable(error) | Self::Database(error) => Some(error),
            Self::Group(shared) => shared.database_error(),
            _ => None,
        }
    }

    /// Serialization failures and deadlocks: the statement had no effect and may run again.
    pub(crate) fn is_retryable_conflict(&self) -> bool {
        match self {
            Self::Database(sqlx::Error::Database(db)) => {
                matches!(db.code().as_deref(), Some("40001" | "40P01"))
            }
            Self::Group(shared) => shared.is_retryable_conflict(),
            _ => false,
        }
    }

    /// The status code of this error (`From<DedupError> for tonic::Status` adds the message).
    fn code(&self) -> tonic::Code {
        use tonic::Code;
        match self {
            Self::InvalidArgument { .. } => Code::InvalidArgument,
            Self::NotFound { .. } => Code::NotFound,
            Self::StaleToken { .. } | Self::WrongState { .. } => Code::FailedPrecondition,
            Self::WrongFencingSecret { .. } | Self::NotOperator { .. } => Code::PermissionDenied,
            Self::Unavailable(_) => Code::Unavailable,
            Self::Database(_) | Self::CorruptRow(_) | Self::GroupCommitLost => Code::Internal,
            Self::Group(shared) => shared.code(),
        }
    }
}

impl From<sqlx::Error> for DedupError {
    fn from(error: sqlx::Error) -> Self {
        let unavailable = match &error {
            sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::WorkerCrashed => true,
            // Class 08: connection exception; 57P0x: the server is shutting down or restarting.
            sqlx::Error::Database(db) => db
                .code()
                .is_some_and(|code| code.starts_with("08") || code.starts_with("57P0")),
            _ => false,
        };
        if unavailable {
            Self::Unavailable(error)
        } else {
            Self::Database(error)
        }
    }
}

impl From<DedupError> for tonic::Status {
    fn from(error: DedupError) -> Self {
        let message = error.to_string();
        let code = error.code();
        if code == tonic::Code::Internal {
            tracing::error!(error = %message, "internal error");
        }
        tonic::Status::new(code, message)
    }
}

#[cfg(test)]
mod tests {
    use tonic::Code;

    use super::*;

    #[test]
    fn each_variant_has_its_status_code() {
        let cases = [
            (
                DedupError::invalid("operation_id", "must not be empty"),
                Code::InvalidArgument,
            ),
            (
                DedupError::NotFound {
                    operation_id: "x".into(),
                },
                Code::NotFound,
            ),
            (
                DedupError::StaleToken {
                    operation_id: "x".into(),
                    presented: 1,
                    current: 2,
                },
                Code::FailedPrecondition,
            ),
            (
                DedupError::WrongFencingSecret {
                    operation_id: "x".into(),
                    fencing_token: 2,
                },
                Code::PermissionDenied,
            ),
            (
                DedupError::NotOperator { method: "Resolve" },
                Code::PermissionDenied,
            ),
            (
                DedupError::WrongState {
                    operation_id: "x".into(),
                    state: IntentState::Succeeded,
                    transition: Transition::Fail,
                },
                Code::FailedPrecondition,
            ),
            (
                DedupError::from(sqlx::Error::PoolTimedOut),
                Code::Unavailable,
            ),
            (DedupError::from(sqlx::Error::RowNotFound), Code::Internal),
            (
                DedupError::Group(Arc::new(DedupError::from(sqlx::Error::PoolTimedOut))),
                Code::Unavailable,
            ),
            (
                DedupError::Group(Arc::new(DedupError::from(sqlx::Error::RowNotFound))),
                Code::Internal,
            ),
            (DedupError::GroupCommitLost, Code::Internal),
        ];
        for (error, code) in cases {
            assert_eq!(tonic::Status::from(error).code(), code);
        }
    }

    #[test]
    fn invalid_argument_names_the_field() {
        let status =
            tonic::Status::from(DedupError::invalid("items[3].owner", "must not be empty"));
        assert_eq!(status.message(), "items[3].owner: must not be empty");
    }
}
