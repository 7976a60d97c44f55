//! Everything the sink's loop needs, resolved from the configuration at start-up, and the loop's
//! consumer type. Its own module, so that the loop and the parts it drives (the batch writer,
//! partition positioning, the lag watch) read them without using the loop.

use std::sync::Arc;
use std::time::Duration;

use eos_runtime::rebalance::RebalanceRecorder;
use eos_schema::{RecordFormat, RegistryConfig};
use rdkafka::ClientConfig;
use rdkafka::consumer::BaseConsumer;

use crate::config::OffsetsMode;

/// Everything the loop needs, resolved from the configuration.
#[derive(Debug, Clone)]
pub(crate) struct LoopSettings {
    pub topic: String,
    pub dlq_topic: String,
    pub group_id: String,
    pub instance_id: String,
    pub offsets: OffsetsMode,
    pub max_batch: usize,
    pub max_batch_bytes: usize,
    pub batch_interval: Duration,
    /// An open batch closes once no record arrived for this long (`--batch-idle`).
    pub batch_idle: Duration,
    /// How records are read as events: the contract and the schema checked.
    pub events: crate::mapping::EventFormat,
    /// The topic's record format, and the registry a registry format reads through.
    pub input_format: RecordFormat,
    pub registry: Option<RegistryConfig>,
    pub max_backoff: Duration,
    pub shutdown_timeout: Duration,
    pub fault_stall_before_commit: Option<Duration>,
    /// The largest dead letter: the smaller of the producer's `message.max.bytes` and the
    /// dead-letter topic's `max.message.bytes`.
    pub dead_letter_max_bytes: usize,
    pub client_config: ClientConfig,
    /// Poked after a committed batch that held an event: the held gauge is read again.
    pub held_refresh: Arc<tokio::sync::Notify>,
}

pub(crate) type LoopConsumer = BaseConsumer<RebalanceRecorder>;
