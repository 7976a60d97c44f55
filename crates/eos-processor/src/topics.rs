//! Creates the topics the processor needs when they are missing, and checks them when present:
//! the changelog must be compacted only (never deleted by retention) and have exactly as many
//! partitions as the input, since changelog partition N holds the state of input partition N.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::types::RDKafkaErrorCode;

use eos_runtime::backoff::{BackoffBuilder as _, polling};
use eos_runtime::kafka_errors::{ReportingContext, serve_pending_events};
use eos_runtime::topic_config::{
    KEYED_STATE_TOPIC_CONFIG, TopicReplicationFlags, cleanup_policy, require_compact_only,
};

use crate::error::ProcessorError;

const METADATA_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Clone)]
pub(crate) struct TopicPlan {
    pub input: String,
    pub outputs: Vec<String>,
    pub dlq: String,
    pub changelog: String,
    pub partitions: i32,
}

fn topic_error(topic: &str, detail: impl Into<String>) -> ProcessorError {
    ProcessorError::Topic {
        topic: topic.to_owned(),
        detail: detail.into(),
    }
}

/// Partition counts of the topics that exist (topics missing from the map do not).
fn partition_counts(
    client_config: &ClientConfig,
    topics: &[&str],
) -> Result<HashMap<String, i32>, ProcessorError> {
    let consumer: BaseConsumer<ReportingContext> =
        client_config.create_with_context(ReportingContext)?;
    let mut counts = HashMap::new();
    for &topic in topics {
        let metadata = consumer
            .fetch_metadata(Some(topic), METADATA_TIMEOUT)
            .inspect_err(|_| serve_pending_events(&consumer))?;
        for t in metadata.topics() {
            if t.error().is_none() && !t.partitions().is_empty() {
                counts.insert(t.name().to_owned(), t.partitions().len() as i32);
            }
        }
    }
    Ok(counts)
}

/// Kafka's default `delete.retention.ms` (one day), assumed when the broker does not say.
const DEFAULT_DELETE_RETENTION: Duration = Duration::from_secs(86_400);

/// What the processor learns of its topics at start-up.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TopicsReady {
    pub input_partitions: i32,
    /// This start created the changelog: any local state of a changelog by that name is of an
    /// earlier topic.
    pub changelog_created: bool,
    /// The changelog's `delete.retention.ms`: how long a tombstone stays readable after
    /// compaction reached it.
    pub changelog_delete_retention: Duration,
}

/// Creates whatever is missing, then checks the changelog against the input.
pub(crate) async fn ensure_topics(
    client_config: &ClientConfig,
    plan: &TopicPlan,
    replication: &TopicReplicationFlags,
) -> Result<TopicsReady, ProcessorError> {
    let all: Vec<&str> = [plan.input.as_str()]
        .into_iter()
        .chain(plan.outputs.iter().map(String::as_str))
        .chain([plan.dlq.as_str(), plan.changelog.as_str()])
        .collect();
    let existing = partition_counts(client_config, &all)?;
    let input_partitions = existing
        .get(&plan.input)
        .copied()
        .unwrap_or(plan.partitions);
    let admin: AdminClient<ReportingContext> =
        client_config.create_with_context(ReportingContext)?;
    let options = AdminOptions::new().operation_timeout(Some(METADATA_TIMEOUT));

    let replication_settings = replication.topic_settings();
    let mut to_create = Vec::new();
    for &topic in &all {
        if existing.contains_key(topic) {
            continue;
        }
        // The changelog must match the input even when the input already existed.
        let partitions = if topic == plan.changelog {
            input_partitions
        } else {
            plan.partitions
        };
        let state_settings: &[(&str, &str)] = if topic == plan.changelog {
            &KEYED_STATE_TOPIC_CONFIG
        } else {
            &[]
        };
        to_create.push(
            replication.new_topic(
                topic,
                partitions,
                replication_settings
                    .iter()
                    .map(|(key, value)| (*key, value.as_str()))
                    .chain(state_settings.iter().copied()),
            ),
        );
    }
    let mut changelog_created = false;
    if !to_create.is_empty() {
        replication.warn_if_under_replicated(client_config).await;
        let results = admin.create_topics(to_create.iter(), &options).await?;
        for result in results {
            match result {
                Ok(topic) => {
                    changelog_created |= topic == plan.changelog;
                    tracing::info!(topic, "created topic");
                }
                // Another instance (or the producer) created it first: fine, checked below.
                Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((topic, code)) => {
                    return Err(topic_error(&topic, format!("cannot create: {code}")));
                }
            }
        }
    }

    let counts = wait_for_topics(client_config, &all).await?;
    let input_partitions = counts[&plan.input];
    let changelog_partitions = counts[&plan.changelog];
    if changelog_partitions != input_partitions {
        return Err(topic_error(
            &plan.changelog,
            format!(
                "has {changelog_partitions} partitions but input {} has {input_partitions}; the \
                 changelog must be co-partitioned with the input (recreate it with \
                 {input_partitions} partitions, or use another --changelog-topic)",
                plan.input
            ),
        ));
    }
    check_compacted(&admin, &plan.changelog).await?;
    let changelog_delete_retention = delete_retention(&admin, &plan.changelog).await;
    Ok(TopicsReady {
        input_partitions,
        changelog_created,
        changelog_delete_retention,
    })
}

/// The changelog's `delete.retention.ms`, or Kafka's default with a WARN when it cannot be read.
async fn delete_retention(admin: &AdminClient<ReportingContext>, changelog: &str) -> Duration {
    let options = AdminOptions::new().operation_timeout(Some(METADATA_TIMEOUT));
    let described = admin
        .describe_configs([&ResourceSpecifier::Topic(changelog)], &options)
        .await;
    let millis = described.ok().and_then(|results| {
        results.into_iter().find_map(|result| {
            result
                .ok()?
                .get("delete.retention.ms")?
                .value
                .as_deref()?
                .trim()
                .parse::<u64>()
                .ok()
        })
    });
    match millis {
        Some(millis) => Duration::from_millis(millis),
        None => {
            tracing::warn!(
                topic = changelog,
                "cannot read the changelog's delete.retention.ms; assuming Kafka's default of one \
                 day for the age of a local checkpoint"
            );
            DEFAULT_DELETE_RETENTION
        }
    }
}

/// How long a topic created a moment ago may take to show in the metadata.
const TOPIC_METADATA_TIMEOUT: Duration = Duration::from_secs(10);

/// Waits until every topic has metadata (creation is asynchronous on the broker).
async fn wait_for_topics(
    client_config: &ClientConfig,
    topics: &[&str],
) -> Result<HashMap<String, i32>, ProcessorError> {
    let deadline = Instant::now() + TOPIC_METADATA_TIMEOUT;
    let mut delays = polling().build();
    while Instant::now() < deadline {
        let counts = partition_counts(client_config, topics)?;
        if topics.iter().all(|t| counts.contains_key(*t)) {
            return Ok(counts);
        }
        tokio::time::sleep(delays.next().unwrap_or(Duration::from_secs(1))).await;
    }
    let counts = partition_counts(client_config, topics)?;
    let missing: Vec<&str> = topics
        .iter()
        .copied()
        .filter(|t| !counts.contains_key(*t))
        .collect();
    Err(topic_error(
        &missing.join(","),
        "still missing 10 s after creation",
    ))
}

async fn check_compacted(
    admin: &AdminClient<ReportingContext>,
    changelog: &str,
) -> Result<(), ProcessorError> {
    let policy = cleanup_policy(admin, changelog, METADATA_TIMEOUT)
        .await
        .map_err(|error| topic_error(changelog, error.to_string()))?;
    require_compact_only(&policy).map_err(|detail| topic_error(changelog, detail))
}
