//! Reading a topic's configuration back from the broker, for the services that refuse a topic
//! whose settings would break their guarantee (a changelog or position topic that retention could
//! delete).

use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;
use rdkafka::error::KafkaError;

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
