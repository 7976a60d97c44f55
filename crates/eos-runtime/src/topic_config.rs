//! The topics the services create and check: how they are replicated (`--topic-replication-factor`,
//! `--topic-min-insync-replicas`), the settings of a topic of state by key, and reading a topic's
//! configuration back from the broker, for the services that refuse a topic whose settings would
//! break their guarantee (a changelog or position topic that retention could delete), and for the
//! dead-letter producers, whose records must fit the topic's own `max.message.bytes`.

use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::client::ClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::error::KafkaError;

use crate::backoff::{BackoffBuilder as _, polling};
use crate::kafka_errors::ReportingContext;

/// How the topics a service creates are replicated. Flattened into the flags of every service
/// that creates topics; a topic that already exists is used as it is.
#[derive(Debug, Clone, clap::Args)]
pub struct TopicReplicationFlags {
    /// Replication factor of the topics this service creates (outputs, dead letters, state
    /// changelogs, positions); -1 takes the broker's `default.replication.factor`. Existing
    /// topics are not changed.
    #[arg(
        long,
        env = "EOS_TOPIC_REPLICATION_FACTOR",
        default_value_t = -1,
        allow_negative_numbers = true,
        value_parser = clap::value_parser!(i32).range(-1..=32),
        help_heading = "Topics this service creates"
    )]
    pub topic_replication_factor: i32,

    /// `min.insync.replicas` of the topics this service creates: how many replicas must have a
    /// write before it counts [default: the broker's].
    #[arg(
        long,
        env = "EOS_TOPIC_MIN_INSYNC_REPLICAS",
        value_parser = clap::value_parser!(u16).range(1..=32),
        help_heading = "Topics this service creates"
    )]
    pub topic_min_insync_replicas: Option<u16>,
}

impl Default for TopicReplicationFlags {
    fn default() -> Self {
        Self {
            topic_replication_factor: -1,
            topic_min_insync_replicas: None,
        }
    }
}

impl TopicReplicationFlags {
    /// The topic-level settings these flags add, to `set` on a [`NewTopic`] (owned, so the
    /// caller keeps them alive as long as the `NewTopic` that borrows them).
    pub fn topic_settings(&self) -> Vec<(&'static str, String)> {
        self.topic_min_insync_replicas
            .map(|replicas| ("min.insync.replicas", replicas.to_string()))
            .into_iter()
            .collect()
    }

    /// A [`NewTopic`] with this replication and `settings` (e.g. [`Self::topic_settings`] and
    /// [`KEYED_STATE_TOPIC_CONFIG`]).
    pub fn new_topic<'a>(
        &self,
        name: &'a str,
        partitions: i32,
        settings: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> NewTopic<'a> {
        settings.into_iter().fold(
            NewTopic::new(
                name,
                partitions,
                TopicReplication::Fixed(self.topic_replication_factor),
            ),
            |topic, (key, value)| topic.set(key, value),
        )
    }

    /// Warns at start-up when the topics this service creates could lose acknowledged writes
    /// with one broker down on a cluster that could do better (see [`replication_warning`]).
    /// Best effort: a cluster that cannot be described is not a reason to stop.
    pub async fn warn_if_under_replicated(&self, client_config: &ClientConfig) {
        let Some((brokers, default_replication)) = describe_cluster(client_config).await else {
            return;
        };
        let replication = match self.topic_replication_factor {
            -1 => default_replication,
            explicit => Some(explicit),
        };
        if let Some(warning) =
            replication_warning(brokers, replication, self.topic_min_insync_replicas)
        {
            tracing::warn!(
                brokers,
                replication_factor = ?replication,
                min_insync_replicas = ?self.topic_min_insync_replicas,
                "{warning}"
            );
        }
    }
}

/// Why the replication of new topics is too weak for a cluster of `brokers`, if it is: a
/// cluster of 3 or more brokers should keep 3 replicas of a topic, and 2 of them in sync for a
/// write to count (with `min.insync.replicas=1` an acknowledged write lives on one disk).
pub fn replication_warning(
    brokers: usize,
    replication_factor: Option<i32>,
    min_insync_replicas: Option<u16>,
) -> Option<String> {
    let replication_factor = replication_factor?;
    if brokers >= 3 && replication_factor < 3 {
        return Some(format!(
            "topics this service creates get replication factor {replication_factor} on a \
             cluster of {brokers} brokers: one broker lost can lose acknowledged records; set \
             --topic-replication-factor 3 (or the broker's default.replication.factor)"
        ));
    }
    if replication_factor >= 3 && min_insync_replicas == Some(1) {
        return Some(
            "--topic-min-insync-replicas 1: a write counts once one replica has it, so one disk \
             lost can lose acknowledged records; 2 keeps it on two"
                .to_owned(),
        );
    }
    None
}

/// The number of brokers and the `default.replication.factor` of one of them.
async fn describe_cluster(client_config: &ClientConfig) -> Option<(usize, Option<i32>)> {
    let timeout = Duration::from_secs(10);
    let consumer: BaseConsumer<ReportingContext> =
        client_config.create_with_context(ReportingContext).ok()?;
    let brokers: Vec<i32> = tokio::task::spawn_blocking(move || {
        consumer
            .fetch_metadata(None, timeout)
            .ok()
            .map(|metadata| metadata.brokers().iter().map(|b| b.id()).collect())
    })
    .await
    .ok()??;
    let first = *brokers.first()?;
    let admin: AdminClient<ReportingContext> =
        client_config.create_with_context(ReportingContext).ok()?;
    let options = AdminOptions::new().operation_timeout(Some(timeout));
    let default_replication = admin
        .describe_configs([&ResourceSpecifier::Broker(first)], &options)
        .await
        .ok()?
        .into_iter()
        .find_map(|result| {
            result
                .ok()?
                .get("default.replication.factor")?
                .value
                .as_deref()?
                .parse()
                .ok()
        });
    Some((brokers.len(), default_replication))
}

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
pub async fn cleanup_policy<C: ClientContext + 'static>(
    admin: &AdminClient<C>,
    topic: &str,
    timeout: Duration,
) -> Result<String, TopicConfigError> {
    topic_setting(admin, topic, "cleanup.policy", timeout).await
}

/// The value of the topic's setting `key`, asked again until `timeout` while the broker
/// describes the topic without it (a topic created a moment ago).
async fn topic_setting<C: ClientContext + 'static>(
    admin: &AdminClient<C>,
    topic: &str,
    key: &str,
    timeout: Duration,
) -> Result<String, TopicConfigError> {
    let options = AdminOptions::new().operation_timeout(Some(timeout));
    let deadline = Instant::now() + timeout;
    let mut delays = polling().build();
    loop {
        let mut last_answer = String::from("no configs described");
        for result in admin
            .describe_configs([&ResourceSpecifier::Topic(topic)], &options)
            .await?
        {
            match result {
                Ok(resource) => {
                    if let Some(value) = resource.get(key).and_then(|entry| entry.value.clone()) {
                        return Ok(value);
                    }
                }
                Err(code) => last_answer = format!("cannot describe: {code}"),
            }
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(TopicConfigError::NotDescribed(last_answer));
        }
        let delay = delays.next().unwrap_or(Duration::from_secs(1));
        tokio::time::sleep(delay.min(deadline - now)).await;
    }
}

/// The topic's `max.message.bytes` as the broker describes it, or `None` (with a WARN) when it
/// cannot be read — no describe permission, or a topic created a moment ago whose configs the
/// broker does not list yet, asked again until `timeout`: the caller then goes by its producer's
/// `message.max.bytes` alone.
pub async fn max_message_bytes(
    client_config: &ClientConfig,
    topic: &str,
    timeout: Duration,
) -> Option<usize> {
    let answer = async {
        let admin: AdminClient<ReportingContext> =
            client_config.create_with_context(ReportingContext)?;
        let value = topic_setting(&admin, topic, "max.message.bytes", timeout).await?;
        value.trim().parse::<usize>().map_err(|_| {
            TopicConfigError::NotDescribed(format!("max.message.bytes is {value:?}, not a number"))
        })
    };
    match answer.await {
        Ok(bytes) => Some(bytes),
        Err(error) => {
            tracing::warn!(
                topic,
                %error,
                "cannot read the topic's max.message.bytes: dead letters are sized by the \
                 producer's message.max.bytes alone"
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cluster_of_three_wants_three_replicas_and_two_in_sync() {
        assert_eq!(replication_warning(1, Some(1), None), None);
        assert_eq!(replication_warning(3, Some(3), None), None);
        assert_eq!(replication_warning(3, Some(3), Some(2)), None);
        assert_eq!(replication_warning(5, None, None), None);
        let Some(too_few) = replication_warning(3, Some(1), None) else {
            panic!("replication factor 1 on three brokers must be warned about");
        };
        assert!(too_few.contains("replication factor 1 on a cluster of 3 brokers"));
        let Some(one_in_sync) = replication_warning(3, Some(3), Some(1)) else {
            panic!("min.insync.replicas 1 must be warned about");
        };
        assert!(one_in_sync.contains("--topic-min-insync-replicas 1"));
    }

    #[test]
    fn new_topics_carry_the_replication_and_settings() {
        let flags = TopicReplicationFlags {
            topic_replication_factor: 3,
            topic_min_insync_replicas: Some(2),
        };
        let settings = flags.topic_settings();
        assert_eq!(settings, vec![("min.insync.replicas", "2".to_owned())]);
        let topic = flags.new_topic(
            "t",
            6,
            settings
                .iter()
                .map(|(key, value)| (*key, value.as_str()))
                .chain(KEYED_STATE_TOPIC_CONFIG),
        );
        assert!(matches!(topic.replication, TopicReplication::Fixed(3)));
        assert_eq!(topic.num_partitions, 6);
        assert!(topic.config.contains(&("min.insync.replicas", "2")));
        assert!(topic.config.contains(&("cleanup.policy", "compact")));
    }

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
