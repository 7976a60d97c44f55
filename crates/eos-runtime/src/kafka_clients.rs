//! The one way a Kafka client is set up in eos-suite: a consumer that never commits on its own,
//! and an idempotent producer, each from the service's [`KafkaSettings`](crate::KafkaSettings)
//! client config. What exactly-once depends on is set here once (docs/ARCHITECTURE.md
//! "Boundaries"); what differs per use (group, fetch sizes, linger, timeouts) the
//! caller adds to the returned [`ClientConfig`], which is itself a builder.

use std::time::{SystemTime, UNIX_EPOCH};

use rdkafka::ClientConfig;

/// Which records a consumer is handed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isolation {
    /// Only records of committed transactions, up to the last stable offset: what every reader
    /// of a transactional topic uses.
    ReadCommitted,
    /// Every record up to the high watermark, open and aborted transactions included: only for
    /// tools that look at the log itself (its end, a contrast with `read_committed`).
    ReadUncommitted,
}

impl Isolation {
    /// The `isolation.level` value.
    pub fn as_property(self) -> &'static str {
        match self {
            Self::ReadCommitted => "read_committed",
            Self::ReadUncommitted => "read_uncommitted",
        }
    }
}

/// A consumer in `group_id` that commits nothing by itself: no automatic commit and no automatic
/// offset store, because every position eos-suite keeps is committed where its results are (a
/// Kafka transaction, a PostgreSQL checkpoint) or not at all.
pub fn consumer(base: &ClientConfig, group_id: &str, isolation: Isolation) -> ClientConfig {
    let mut config = base.clone();
    config
        .set("group.id", group_id)
        .set("isolation.level", isolation.as_property())
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false");
    config
}

/// A consumer for a manual assignment (a reader, a probe) that never joins a group: librdkafka
/// needs a group id even then, so it gets a throw-away one, `<purpose>-<pid>-<nanos>`, that
/// leaves no committed position anyone could share.
pub fn reader(base: &ClientConfig, purpose: &str, isolation: Isolation) -> ClientConfig {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_nanos());
    consumer(
        base,
        &format!("{purpose}-{}-{nanos}", std::process::id()),
        isolation,
    )
}

/// An idempotent producer: librdkafka's own retries never write a record twice and keep each
/// partition's order (`enable.idempotence`, `acks=all`). The transactional producer adds its
/// `transactional.id` to this.
pub fn idempotent_producer(base: &ClientConfig) -> ClientConfig {
    let mut config = base.clone();
    config.set("enable.idempotence", "true").set("acks", "all");
    config
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_consumer_commits_nothing_by_itself_and_keeps_the_base_properties() {
        let mut base = ClientConfig::new();
        base.set("bootstrap.servers", "127.0.0.1:9092");
        let config = consumer(&base, "g", Isolation::ReadCommitted);
        assert_eq!(config.get("bootstrap.servers"), Some("127.0.0.1:9092"));
        assert_eq!(config.get("group.id"), Some("g"));
        assert_eq!(config.get("isolation.level"), Some("read_committed"));
        assert_eq!(config.get("enable.auto.commit"), Some("false"));
        assert_eq!(config.get("enable.auto.offset.store"), Some("false"));
        assert_eq!(base.get("group.id"), None, "the base is left as it was");
    }

    #[test]
    fn readers_get_a_group_of_their_own() {
        let base = ClientConfig::new();
        let first = reader(&base, "probe", Isolation::ReadUncommitted);
        std::thread::sleep(std::time::Duration::from_millis(1));
        let second = reader(&base, "probe", Isolation::ReadUncommitted);
        let group = first.get("group.id").expect("a group id");
        assert!(group.starts_with(&format!("probe-{}-", std::process::id())));
        assert_ne!(first.get("group.id"), second.get("group.id"));
        assert_eq!(first.get("isolation.level"), Some("read_uncommitted"));
    }

    #[test]
    fn a_producer_is_idempotent_with_every_replica_acknowledging() {
        let config = idempotent_producer(&ClientConfig::new());
        assert_eq!(config.get("enable.idempotence"), Some("true"));
        assert_eq!(config.get("acks"), Some("all"));
    }
}
