//! The sink's error enum: each variant is something the caller does differently.

use rdkafka::error::KafkaError;

#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    /// Bad flags, a bad targets file, or a retention shorter than the replay horizon: fix the
    /// configuration. Nothing was written.
    #[error("configuration: {0}")]
    Config(String),
    /// A configured table does not fit its mapping (missing table, column, unique constraint, or
    /// an unsupported type): fix the schema or the targets file.
    #[error("schema: {0}")]
    Schema(String),
    /// PostgreSQL is unreachable or the transaction failed for a reason that may pass (restart,
    /// deadlock, serialization failure): roll back, retry with backoff, re-fence, re-read the
    /// checkpoint. The checkpoint never moves without the rows.
    #[error("database unavailable: {0}")]
    Transient(sqlx::Error),
    /// PostgreSQL refused the data of a batch (a check constraint, another unique index): the
    /// batch is redone one record at a time and the refused records are dead-lettered.
    #[error("database refused the batch's data: {0}")]
    Data(sqlx::Error),
    /// Another owner bumped the epoch of these partitions: this instance is a zombie for them. Its
    /// batch is rolled back and it stops (exit non-zero); the orchestrator restarts it.
    #[error("fenced: partitions {partitions:?} of {topic} now belong to a newer owner")]
    Fenced { topic: String, partitions: Vec<i32> },
    /// A database error that retrying will not fix (a dropped table or column, no permission).
    #[error("database: {0}")]
    Database(sqlx::Error),
    /// Dead letters could not be delivered: the batch is rolled back and redone, so the checkpoint
    /// never moves past a record whose dead letter is not in Kafka.
    #[error("dead-letter delivery failed: {0}")]
    DeadLetter(KafkaError),
    /// A fatal Kafka client error (e.g. this static member was fenced by a newer instance).
    #[error("fatal Kafka error, stopping: {0}")]
    Fatal(KafkaError),
    /// A provider target could not settle every event of the batch (dedup-service unreachable,
    /// an outcome still UNKNOWN after the settle timeout, shutdown): the batch is not
    /// checkpointed and is replayed; dedup-service answers what was already done.
    #[error(transparent)]
    Provider(#[from] crate::provider_target_error::ProviderTargetError),
    /// A Kafka client call failed.
    #[error("Kafka: {0}")]
    Kafka(#[from] KafkaError),
}

impl SinkError {
    /// Sorts a database error into what to do about it.
    pub fn from_db(error: sqlx::Error) -> Self {
        match db_error_class(&error) {
            DbErrorClass::Transient => Self::Transient(error),
            DbErrorClass::Data => Self::Data(error),
            DbErrorClass::Permanent => Self::Database(error),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DbErrorClass {
    Transient,
    Data,
    Permanent,
}

/// By SQLSTATE class (PostgreSQL appendix A) or by the kind of client error.
pub(crate) fn db_error_class(error: &sqlx::Error) -> DbErrorClass {
    match error {
        sqlx::Error::Database(db) => match db.code() {
            Some(code) => sqlstate_class(&code),
            None => DbErrorClass::Transient,
        },
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => DbErrorClass::Transient,
        _ => DbErrorClass::Permanent,
    }
}

fn sqlstate_class(code: &str) -> DbErrorClass {
    match code.get(..2).unwrap_or_default() {
        // 08 connection exception, 40 rollback (serialization failure, deadlock), 53 insufficient
        // resources, 55 lock not available (our lock_timeout), 57 operator intervention
        // (admin shutdown, cannot connect now), 58 system error.
        "08" | "40" | "53" | "55" | "57" | "58" => DbErrorClass::Transient,
        // 22 data exception, 23 integrity constraint violation.
        "22" | "23" => DbErrorClass::Data,
        // query_canceled (statement_timeout) may pass.
        _ if code == "57014" => DbErrorClass::Transient,
        _ => DbErrorClass::Permanent,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlstates_are_sorted_by_what_to_do() {
        assert_eq!(sqlstate_class("57P01"), DbErrorClass::Transient);
        assert_eq!(sqlstate_class("40P01"), DbErrorClass::Transient);
        assert_eq!(sqlstate_class("08006"), DbErrorClass::Transient);
        assert_eq!(sqlstate_class("55P03"), DbErrorClass::Transient);
        assert_eq!(sqlstate_class("23514"), DbErrorClass::Data);
        assert_eq!(sqlstate_class("22P02"), DbErrorClass::Data);
        assert_eq!(sqlstate_class("42P01"), DbErrorClass::Permanent);
        assert_eq!(
            db_error_class(&sqlx::Error::PoolTimedOut),
            DbErrorClass::Transient
        );
    }
}
