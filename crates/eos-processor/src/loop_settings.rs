//! What the loop needs, resolved from the configuration at start-up. Its own module, so that the
//! loop and the components it composes (the owned states, the committer) each read it without
//! using each other.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use rdkafka::ClientConfig;

use eos_core::Guarantee;
use eos_runtime::transactional_producer::TransactionalProducer;

use crate::error::ProcessorError;
use crate::partition_state::DecisionPolicy;

/// Everything the loop needs, resolved from the configuration.
#[derive(Debug, Clone)]
pub(crate) struct LoopSettings {
    pub guarantee: Guarantee,
    pub input_topic: String,
    /// Output name → topic; without [`crate::transform::DEFAULT_OUTPUT`] when the transform
    /// writes only to outputs it names.
    pub outputs: BTreeMap<String, String>,
    pub dlq_topic: String,
    pub changelog_topic: String,
    pub group_id: String,
    /// Static group membership: a restarted instance takes its partitions back at once instead of
    /// waiting out the dead member's session.
    pub instance_id: String,
    pub transactional_id: String,
    pub commit_interval: Duration,
    pub max_batch: usize,
    pub policy: DecisionPolicy,
    pub transaction_timeout: Duration,
    pub fault_abort_every: Option<u64>,
    /// The largest dead letter the producer can write: its `message.max.bytes`, or the dead-letter
    /// topic's `max.message.bytes` when smaller (see `eos_core::dead_letter::build`).
    pub dead_letter_max_bytes: usize,
    /// Connection settings shared by every client.
    pub client_config: ClientConfig,
    /// This instance's state store directory (see `state_store::instance_dir`).
    pub state_dir: PathBuf,
    /// The changelog's `delete.retention.ms`: a local checkpoint older than this is not trusted.
    pub changelog_delete_retention: Duration,
    /// This start created the changelog: local state of a changelog by that name is stale.
    pub changelog_created: bool,
}

impl LoopSettings {
    /// Where a transaction's outputs go, for its span: the default output's topic, else every
    /// output's.
    pub(crate) fn destination(&self) -> String {
        match self.outputs.get(crate::transform::DEFAULT_OUTPUT) {
            Some(topic) => topic.clone(),
            None => self.outputs.values().cloned().collect::<Vec<_>>().join(","),
        }
    }

    pub(crate) fn call_timeout(&self) -> Duration {
        self.transaction_timeout.max(Duration::from_secs(10))
    }

    pub(crate) fn create_producer(&self) -> Result<TransactionalProducer, ProcessorError> {
        let mut config = self.client_config.clone();
        // The broker checks a topic's max.message.bytes against a whole record batch: batches of
        // at most the dead-letter limit, so that dead letters that each fit are never refused
        // together (an aborted transaction, then the same batch again). With the default limits
        // this is librdkafka's own default; a smaller -X batch.size stays.
        let batch_bytes = config
            .get("batch.size")
            .and_then(|value| value.parse::<usize>().ok())
            .map_or(self.dead_letter_max_bytes, |set| {
                set.min(self.dead_letter_max_bytes)
            });
        config.set("batch.size", batch_bytes.to_string());
        TransactionalProducer::new(
            &config,
            self.guarantee,
            &self.transactional_id,
            self.transaction_timeout,
            self.call_timeout(),
        )
        .map_err(ProcessorError::from)
    }

    pub(crate) fn restore_timeout(&self) -> Duration {
        // How long a restore may make no progress: a crashed owner's open transaction holds the
        // changelog's LSO until the broker aborts it.
        self.transaction_timeout * 3 + Duration::from_secs(30)
    }
}
