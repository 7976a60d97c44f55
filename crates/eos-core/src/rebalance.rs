//! A consumer context that records rebalance events for the service loop to handle after `poll`
//! returns, so partition state is restored or dropped by the loop (with its I/O and its error
//! handling) rather than inside librdkafka's callback.

use std::sync::Mutex;

use rdkafka::consumer::{BaseConsumer, Consumer as _, ConsumerContext, Rebalance};
use rdkafka::{ClientContext, TopicPartitionList};

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

impl ClientContext for RebalanceRecorder {}

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
