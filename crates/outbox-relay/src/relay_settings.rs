//! Everything the relay's loop needs, resolved from the configuration at start-up. Its own
//! module, so that the loop and position recovery each read it without using each other.

use std::sync::Arc;
use std::time::Duration;

use eos_core::Guarantee;
use eos_runtime::transactional_producer::TransactionalProducer;
use eos_schema::TopicSchemas;
use rdkafka::ClientConfig;

use crate::error::RelayError;
use crate::logical::LogicalSource;

/// Everything the loop needs, resolved from the configuration.
#[derive(Debug, Clone)]
pub struct RelaySettings {
    pub client_config: ClientConfig,
    pub guarantee: Guarantee,
    pub relay_name: String,
    pub transactional_id: String,
    pub positions_topic: String,
    pub batch_size: i64,
    pub poll_interval: Duration,
    /// Caught up: the least time from a read that found rows to the next read (`--linger`).
    pub linger: Duration,
    pub transaction_timeout: Duration,
    /// Logical mode: the slot's source (`None`: xmin mode).
    pub logical: Option<LogicalSource>,
    /// Logical mode: how often an idle relay still moves its position.
    pub idle_position_interval: Duration,
    /// `--value-format` in a registry format: each topic's schema (`None`: values as JSON).
    pub value_schemas: Option<Arc<TopicSchemas>>,
}

impl RelaySettings {
    pub(crate) fn call_timeout(&self) -> Duration {
        self.transaction_timeout.max(Duration::from_secs(10))
    }

    /// A crashed relay's open transaction holds the position topic's LSO until the broker
    /// aborts it.
    pub(crate) fn position_read_timeout(&self) -> Duration {
        self.transaction_timeout * 3 + Duration::from_secs(30)
    }

    pub(crate) fn create_producer(&self) -> Result<TransactionalProducer, RelayError> {
        Ok(TransactionalProducer::new(
            &self.client_config,
            self.guarantee,
            &self.transactional_id,
            self.transaction_timeout,
            self.call_timeout(),
        )?)
    }
}
