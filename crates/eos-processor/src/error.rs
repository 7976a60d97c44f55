//! The processor's error enum: each variant is something the caller does differently.

use rdkafka::error::KafkaError;

/// Why the processor stopped or could not start.
#[derive(Debug, thiserror::Error)]
pub enum ProcessorError {
    /// Bad flags or topics that do not fit together: fix the configuration.
    #[error("configuration: {0}")]
    Config(String),
    /// A topic is missing and cannot be created, or exists with the wrong shape.
    #[error("topic {topic}: {detail}")]
    Topic {
        /// The topic.
        topic: String,
        /// What is wrong with it.
        detail: String,
    },
    /// State could not be rebuilt from the changelog: never process without it.
    #[error("restoring state of {topic}[{partition}]: {detail}")]
    Restore {
        /// The changelog topic.
        topic: String,
        /// Its partition.
        partition: i32,
        /// What went wrong.
        detail: String,
    },
    /// The local state store failed: never process without it. A restart restores it from the
    /// changelog (delete the state directory if it is corrupt).
    #[error("{0}")]
    Store(#[from] crate::state_store::StoreError),
    /// Fenced by a newer instance, or a fatal producer/consumer error: stop producing and exit
    /// non-zero so the orchestrator restarts us (and the restart fences whatever is left).
    #[error("fatal Kafka error, stopping: {0}")]
    Fatal(KafkaError),
    /// The shutdown interrupted a transform call: the event is undecided, so the open batch is
    /// not committed, and its records are read again at the next start.
    #[error("the shutdown interrupted a transform call")]
    Interrupted,
    /// A Kafka client call failed where no transaction was open.
    #[error("Kafka: {0}")]
    Kafka(#[from] KafkaError),
}

impl From<eos_runtime::transactional_producer::ProducerError> for ProcessorError {
    fn from(error: eos_runtime::transactional_producer::ProducerError) -> Self {
        use eos_runtime::transactional_producer::ProducerError;
        match error {
            ProducerError::Fatal(error) => Self::Fatal(error),
            ProducerError::Kafka(error) => Self::Kafka(error),
        }
    }
}
