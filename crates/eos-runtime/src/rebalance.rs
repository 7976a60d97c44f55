//! A consumer context that records rebalance events for the service loop to handle after `poll`
//! returns, so partition state is restored or dropped by the loop (with its I/O and its error
//! handling) rather than inside librdkafka's callback.

use std::sync::Mutex;

use rdkafka::consumer::{BaseConsumer, Consumer as _, ConsumerContext, Rebalance};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::{ClientConfig, ClientContext, TopicPartitionList};

use crate::kafka_clients::{self, Isolation};

/// A consumer subscribed to `topic` for a service that keeps its own positions (in a Kafka
/// transaction or in PostgreSQL): `read_committed`, no automatic commits or offset stores, and
/// static membership under `instance_id`, so a restarted instance takes its partitions back at
/// once. Rebalances are recorded for the service loop ([`RebalanceRecorder`]). None of these is
/// configurable: exactly-once depends on them.
pub fn subscribe_static_member(
    config: &ClientConfig,
    group_id: &str,
    instance_id: &str,
    topic: &str,
) -> KafkaResult<BaseConsumer<RebalanceRecorder>> {
    let consumer: BaseConsumer<RebalanceRecorder> =
        kafka_clients::consumer(config, group_id, Isolation::ReadCommitted)
            .set("group.instance.id", instance_id)
            .set("auto.offset.reset", "earliest")
            .set("session.timeout.ms", "10000")
            .set("heartbeat.interval.ms", "1000")
            .create_with_context(RebalanceRecorder::new(topic))?;
    consumer.subscribe(&[topic])?;
    Ok(consumer)
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RebalanceEvent {
    Revoked { partitions: Vec<i32>, lost: bool },
    Assigned { partitions: Vec<i32> },
}

/// Records the rebalance events of one input topic.
#[derive(Debug)]
pub struct RebalanceRecorder {
    topic: String,
    events: Mutex<Vec<RebalanceEvent>>,
}

impl RebalanceRecorder {
    pub fn new(topic: impl Into<String>) -> Self {
        Self {
            topic: topic.into(),
            events: Mutex::new(Vec::new()),
        }
    }

    fn partitions(&self, list: &TopicPartitionList) -> Vec<i32> {
        list.elements()
            .iter()
            .filter(|elem| elem.topic() == self.topic)
            .map(|elem| elem.partition())
            .collect()
    }

    fn push(&self, event: RebalanceEvent) {
        if let Ok(mut events) = self.events.lock() {
            events.push(event);
        }
    }

    /// The events recorded since the last call, oldest first.
    pub fn take(&self) -> Vec<RebalanceEvent> {
        self.events
            .lock()
            .map(|mut events| std::mem::take(&mut *events))
            .unwrap_or_default()
    }
}

impl ClientContext for RebalanceRecorder {
    fn error(&self, error: KafkaError, reason: &str) {
        crate::kafka_errors::report_client_error(&error, reason);
    }
}

impl ConsumerContext for RebalanceRecorder {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Revoke(list) => self.push(RebalanceEvent::Revoked {
                partitions: self.partitions(list),
                lost: consumer.assignment_lost(),
            }),
            Rebalance::Assign(_) => {}
            Rebalance::Error(error) => tracing::warn!(%error, "rebalance error"),
        }
    }

    fn post_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(list) = rebalance {
            self.push(RebalanceEvent::Assigned {
                partitions: self.partitions(list),
            });
        }
    }
}
