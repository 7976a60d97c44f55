//! The relay's error enum: each variant is something the caller does differently.

use rdkafka::error::KafkaError;

#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    /// Bad flags: fix the configuration.
    #[error("configuration: {0}")]
    Config(String),
    /// The position topic is missing and cannot be created, or has the wrong shape.
    #[error("topic {topic}: {detail}")]
    Topic { topic: String, detail: String },
    /// The position in Kafka and the one in PostgreSQL disagree in a way that means one of them
    /// lost data: starting would repeat or skip rows, so do not.
    #[error("position of relay {relay}: {detail}")]
    Position { relay: String, detail: String },
    /// Logical mode: the replication slot is missing, invalidated, ahead of Kafka's position or
    /// not the relay's, or returned what cannot be decoded. Resuming would skip or repeat rows,
    /// so stop and let an operator decide (docs/architecture/outbox.md).
    #[error("replication slot {slot}: {detail}")]
    Slot { slot: String, detail: String },
    /// A row cannot be turned into a record: not a valid envelope (it was written around the
    /// table's checks), or a value that does not fit its topic's schema, or a topic without a
    /// usable schema. Stop rather than skip it.
    #[error("outbox row at position {position} (event {event_id}) cannot be published: {detail}")]
    InvalidRow {
        position: i64,
        event_id: String,
        detail: String,
    },
    /// Fenced by a newer relay with the same name, or a fatal producer error: exit non-zero.
    #[error("fatal Kafka error, stopping: {0}")]
    Fatal(KafkaError),
    /// A Kafka call failed where no transaction was open.
    #[error("Kafka: {0}")]
    Kafka(#[from] KafkaError),
    #[error("PostgreSQL: {0}")]
    Database(#[from] sqlx::Error),
    /// Logical mode: the replication session on the slot failed or ended (the server went away,
    /// the connection broke, another session holds the slot). Retried like a database error:
    /// a new session starts at the relay's position.
    #[error("replication session on slot {slot}: {detail}")]
    Replication { slot: String, detail: String },
    /// The schema registry cannot answer for a topic's schema now: retried like a database
    /// error, the rows wait.
    #[error("schema registry: {0}")]
    Registry(eos_schema::SchemaError),
}

impl RelayError {
    /// PostgreSQL did not answer or broke off: the same work is tried again after a while.
    pub fn is_database_outage(&self) -> bool {
        matches!(self, Self::Database(_) | Self::Replication { .. })
    }

    /// The schema registry did not answer: the same rows are tried again after a while.
    pub fn is_registry_outage(&self) -> bool {
        matches!(self, Self::Registry(_))
    }

    /// The slot is held by another session (SQLSTATE 55006, object_in_use): the replication
    /// session was refused (the client puts the code in its message), or a SQL call on the slot
    /// (a peek or an advance of the table pass) was. That session is a newer relay's with this
    /// name, a fenced one's, or the walsender of one that died and has not gone yet.
    pub fn is_slot_held_elsewhere(&self) -> bool {
        match self {
            Self::Replication { detail, .. } => detail.contains("SQLSTATE 55006"),
            Self::Database(error) => error
                .as_database_error()
                .and_then(|error| error.code())
                .is_some_and(|code| code == "55006"),
            _ => false,
        }
    }
}

impl From<eos_runtime::transactional_producer::ProducerError> for RelayError {
    fn from(error: eos_runtime::transactional_producer::ProducerError) -> Self {
        use eos_runtime::transactional_producer::ProducerError;
        match error {
            ProducerError::Fatal(error) => Self::Fatal(error),
            ProducerError::Kafka(error) => Self::Kafka(error),
        }
    }
}
