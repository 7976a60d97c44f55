//! Where a partition's log ends, for a `read_committed` reader that must read everything
//! decided there: the state restore of eos-processor and outbox-relay's read of its last
//! position.
//!
//! librdkafka's watermark query carries the client's isolation level, and a `read_committed`
//! client is answered the last stable offset instead of the high watermark. Reading up to that
//! stops short of a transaction still open, or committed with its markers not yet written, which
//! may be exactly the record being looked for (the previous owner's last batch, a relay's last
//! position). So the end comes from a `read_uncommitted` client, and the `read_committed` reader
//! reads until its position passes it: by then every transaction below it is decided, and read
//! if it committed.

use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::error::KafkaResult;

use crate::kafka_clients::{self, Isolation};
use crate::kafka_errors::ReportingContext;

/// A client that asks for partitions' ends as a `read_uncommitted` reader is told them.
pub struct EndQuery {
    client: BaseConsumer<ReportingContext>,
}

impl std::fmt::Debug for EndQuery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EndQuery").finish_non_exhaustive()
    }
}

impl EndQuery {
    pub fn new(client_config: &ClientConfig) -> KafkaResult<Self> {
        let client = kafka_clients::reader(client_config, "log-end", Isolation::ReadUncommitted)
            .create_with_context(ReportingContext)?;
        Ok(Self { client })
    }

    /// The log start offset and the high watermark of `topic[partition]`.
    pub fn watermarks(
        &self,
        topic: &str,
        partition: i32,
        timeout: Duration,
    ) -> KafkaResult<(i64, i64)> {
        self.client.fetch_watermarks(topic, partition, timeout)
    }
}
