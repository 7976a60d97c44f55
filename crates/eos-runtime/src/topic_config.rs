//! Reading a topic's configuration back from the broker, for the services that refuse a topic
//! whose settings would break their guarantee (a changelog or position topic that retention could
//! delete).

use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;
use rdkafka::error::KafkaError;

/// The settings eos-suite creates a topic of state by key with (the processor's changelog, the
/// relay's positions): compacted only, because retention must never delete a key's last value;
/// and compacted soon enough that a restore reads little more than one record per live key. The
/// active segment is never compacted, so it rolls every hour (`segment.ms`); a record waits at
/// most an hour to become compactable (`max.compaction.lag.ms`), and a log is cleaned once a tenth
/// of it is dirty (`min.cleanable.dirty.ratio`, Kafka's default 0.5 would let a restore read
/// twice the live state).
pub const KEYED_STATE_TOPIC_CONFIG: [(&str, &str); 4] = [
    ("cleanup.policy", "compact"),
    ("segment.ms", "3600000"),
    ("max.compaction.lag.ms", "3600000"),
    ("min.cleanable.dirty.ratio", "0.1"),
];

/// Checks the `cleanup.policy` of a topic of state by key: `compact` only. `compact,delete`
/// would let retention delete the state of a key that was not written for a while.
pub fn require_compact_only(policy: &str) -> Result<(), String> {
    let parts: Vec<&str> = policy.split(',').map(str::trim).collect();
    if parts == ["compact"] {
        return Ok(());
    }
    Err(format!(
        "cleanup.policy is {policy:?}, expected \"compact\" only: deleting old segments would \
         delete state that was not written for a while (set it with kafka-configs \
         --alter --add-config cleanup.policy=compact)"
    ))
}

#[derive(Debug, thiserror::Error)]
pub enum TopicConfigError {
    #[error("Kafka: {0}")]
    Kafka(#[from] KafkaError),
    /// The broker did not describe the setting before the deadline.
    #[error("{0}")]
    NotDescribed(String),
}

/// The topic's `cleanup.policy`. Right after creation the broker may answer a describe without
/// the topic's configs (creation is asynchronous), so an empty or unknown-topic answer is asked
/// again until `timeout`, never read as "not compacted".
pub async fn cleanup_policy(
    admin: &AdminClient<DefaultClientContext>,
    topic: &str,
    timeout: Duration,
) -> Result<String, TopicConfigError> {
    let options = AdminOptions::new().operation_timeout(Some(timeout));
    let deadline = Instant::now() + timeout;
    loop {
        let mut last_answer = String::from("no configs described");
        for result in admin
            .describe_configs([&ResourceSpecifier::Topic(topic)], &options)
            .await?
        {
            match result {
                Ok(resource) => {
                    if let Some(policy) = resource
                        .get("cleanup.policy")
                        .and_then(|entry| entry.value.clone())
                    {
                        return Ok(policy);
                    }
                }
                Err(code) => last_answer = format!("cannot describe: {code}"),
            }
        }
        if Instant::now() >= deadline {
            return Err(TopicConfigError::NotDescribed(last_answer));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_compact_alone_keeps_state() {
        assert!(require_compact_only("compact").is_ok());
        assert!(require_compact_only(" compact ").is_ok());
        for refused in ["compact,delete", "delete,compact", "delete", ""] {
            let Err(error) = require_compact_only(refused) else {
                panic!("{refused:?} must be refused");
            };
            assert!(
                error.contains("expected \"compact\" only"),
                "{refused}: {error}"
            );
        }
    }
}
