//! Kafka cluster access shared by every command: metadata, watermarks and topic creation.
//!
//! The settings (`--bootstrap-servers`, `-X/--kafka-property`, `EOS_KAFKA_PROPERTIES`,
//! `--kafka-properties-file`) are eos-runtime's, the same as the services': settings exactly-once
//! depends on (idempotence, `acks`, `read_committed`, auto-commit, topic auto-creation) are set by
//! the commands themselves and refused there; everything else (TLS, SASL, timeouts) passes
//! through to every client a command creates.

use std::time::{Duration, Instant};

use eos_runtime::backoff::{BackoffBuilder as _, polling};
use eos_runtime::kafka_clients::{self, Isolation::ReadUncommitted};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;

pub use eos_runtime::kafka_errors::{ReportingContext, last_refusal, serve_pending_events};
pub use eos_runtime::kafka_settings::{KafkaSettings, KafkaSettingsError};

/// How long a metadata request may take before the cluster counts as unreachable.
pub const METADATA_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("cannot reach Kafka at {servers}")]
    Unreachable { servers: String, source: KafkaError },
    /// The broker refused this client (a wrong SASL password, a missing client certificate):
    /// librdkafka only times the call out (that error adds nothing, so it is not kept), its
    /// error callback said why.
    #[error("Kafka at {servers} refused this client: {refusal}")]
    Refused { servers: String, refusal: String },
    #[error("topic {topic:?} does not exist")]
    TopicMissing { topic: String },
    #[error("cannot create topic {topic:?}: {reason}")]
    CreateTopic { topic: String, reason: String },
    #[error("background task failed")]
    Task(#[from] tokio::task::JoinError),
    #[error("{context}")]
    Client { context: String, source: KafkaError },
}

impl ClusterError {
    pub(crate) fn client(context: impl Into<String>, source: KafkaError) -> Self {
        Self::Client {
            context: context.into(),
            source,
        }
    }
}

/// What the commands need of [`KafkaSettings`] beyond a client configuration.
pub trait ClusterAccess {
    /// The error for a cluster that does not answer.
    fn unreachable(&self, source: KafkaError) -> ClusterError;

    /// A consumer that never joins a group: metadata and watermark queries only. It is
    /// read_uncommitted (librdkafka's default is read_committed) so that its high watermark is
    /// the true end of the log rather than the last stable offset.
    fn metadata_client(&self) -> Result<BaseConsumer<ReportingContext>, ClusterError>;
}

impl ClusterAccess for KafkaSettings {
    fn unreachable(&self, source: KafkaError) -> ClusterError {
        let servers = self.bootstrap_servers.clone();
        match last_refusal() {
            Some(refusal) => ClusterError::Refused { servers, refusal },
            None => ClusterError::Unreachable { servers, source },
        }
    }

    fn metadata_client(&self) -> Result<BaseConsumer<ReportingContext>, ClusterError> {
        kafka_clients::reader(&self.client_config(), "eosctl-metadata", ReadUncommitted)
            .set("allow.auto.create.topics", "false")
            .create_with_context(ReportingContext)
            .map_err(|e| ClusterError::client("cannot create a Kafka client", e))
    }
}

/// The partitions of `topic`, or `None` when it does not exist. Blocking.
pub fn topic_partitions(
    client: &BaseConsumer<ReportingContext>,
    settings: &KafkaSettings,
    topic: &str,
) -> Result<Option<Vec<i32>>, ClusterError> {
    let metadata = client
        .fetch_metadata(Some(topic), METADATA_TIMEOUT)
        .map_err(|e| {
            serve_pending_events(client);
            settings.unreachable(e)
        })?;
    let Some(found) = metadata.topics().iter().find(|t| t.name() == topic) else {
        return Ok(None);
    };
    match found.error() {
        None => {}
        Some(code) if RDKafkaErrorCode::from(code) == RDKafkaErrorCode::UnknownTopicOrPartition => {
            return Ok(None);
        }
        Some(code) => {
            return Err(ClusterError::client(
                format!("cannot read the metadata of topic {topic:?}"),
                KafkaError::MetadataFetch(code.into()),
            ));
        }
    }
    let mut partitions: Vec<i32> = found.partitions().iter().map(|p| p.id()).collect();
    partitions.sort_unstable();
    Ok((!partitions.is_empty()).then_some(partitions))
}

/// How to create a topic the command needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TopicLayout {
    pub partitions: i32,
    /// -1: the broker's `default.replication.factor`.
    pub replication_factor: i32,
}

/// Makes sure `topic` exists, creating it with `layout` when it does not. Returns its partition
/// count and whether it was created.
pub async fn ensure_topic(
    settings: &KafkaSettings,
    topic: &str,
    layout: TopicLayout,
) -> Result<(usize, bool), ClusterError> {
    let describe = {
        let settings = settings.clone();
        let topic = topic.to_owned();
        move || -> Result<Option<Vec<i32>>, ClusterError> {
            let client = settings.metadata_client()?;
            topic_partitions(&client, &settings, &topic)
        }
    };
    if let Some(partitions) = spawn_blocking(describe.clone()).await? {
        return Ok((partitions.len(), false));
    }

    let admin: AdminClient<ReportingContext> = settings
        .client_config()
        .create_with_context(ReportingContext)
        .map_err(|e| ClusterError::client("cannot create a Kafka admin client", e))?;
    let new_topic = NewTopic::new(
        topic,
        layout.partitions,
        TopicReplication::Fixed(layout.replication_factor),
    );
    let options = AdminOptions::new().operation_timeout(Some(METADATA_TIMEOUT));
    let results = admin
        .create_topics([&new_topic], &options)
        .await
        .map_err(|e| settings.unreachable(e))?;
    for result in results {
        match result {
            Ok(_) => tracing::info!(topic, partitions = layout.partitions, "created topic"),
            // Someone else created it in the meantime: just as good.
            Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((_, code)) => {
                return Err(ClusterError::CreateTopic {
                    topic: topic.to_owned(),
                    reason: code.to_string(),
                });
            }
        }
    }
    // Creation is asynchronous on the broker side: wait until the metadata shows the topic, so
    // the first produce does not race it.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut delays = polling().build();
    while Instant::now() < deadline {
        if let Some(partitions) = spawn_blocking(describe.clone()).await? {
            return Ok((partitions.len(), true));
        }
        tokio::time::sleep(delays.next().unwrap_or(Duration::from_secs(1))).await;
    }
    Err(ClusterError::CreateTopic {
        topic: topic.to_owned(),
        reason: "created, but it did not appear in the cluster metadata within 5 s".to_owned(),
    })
}

async fn spawn_blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, ClusterError> + Send + 'static,
) -> Result<T, ClusterError> {
    tokio::task::spawn_blocking(work).await?
}
