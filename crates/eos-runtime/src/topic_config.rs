//! Reading a topic's configuration back from the broker, for the services that refuse a topic
//! whose settings would break their guarantee (a changelog or position topic that retention could
//! delete), and for the dead-letter producers, whose records must fit the topic's own
//! `max.message.bytes`.

use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
use rdkafka::client::ClientContext;
use rdkafka::error::KafkaError;

use crate::kafka_errors::ReportingContext;

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
                        if let Some(value) = resource
                            .get("max.message.bytes")
                            .and_then(|entry| entry.value.clone())
                        {
                            return value.trim().parse::<usize>().map_err(|_| {
                                TopicConfigError::NotDescribed(format!(
                                    "max.message.bytes is {value:?}, not a number"
                                ))
                            });
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
