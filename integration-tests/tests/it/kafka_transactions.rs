//! The broker is real and configured for exactly-once: transactions hide aborted data from
//! `read_committed` readers, move consumer offsets atomically, and fence zombies.

use std::time::Duration;

use anyhow::Context as _;
use eos_runtime::kafka_clients;
use integration_tests::{
    Isolation, TestProducer, client_config, create_topic, read_topic, transactional_producer,
    unique_name,
};
use rdkafka::Message as _;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};

const TIMEOUT: Duration = Duration::from_secs(30);

fn send(producer: &TestProducer, topic: &str, partition: i32, payload: &str) -> anyhow::Result<()> {
    producer
        .send(
            BaseRecord::to(topic)
                .partition(partition)
                .key(payload)
                .payload(payload),
        )
        .map_err(|(error, _)| error)
        .with_context(|| format!("cannot enqueue {payload}"))
}

fn payloads(records: &[rdkafka::message::OwnedMessage]) -> Vec<String> {
    records
        .iter()
        .map(|m| String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn read_committed_sees_only_committed_records() -> anyhow::Result<()> {
    let topic = unique_name("txn-visibility");
    create_topic(&topic, 1).await?;
    let txn_id = unique_name("txn");
    let topic_for_producer = topic.clone();
    tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
        let producer = transactional_producer(&txn_id)?;
        producer.begin_transaction()?;
        for i in 0..3 {
            send(&producer, &topic_for_producer, 0, &format!("committed-{i}"))?;
        }
        producer.commit_transaction(TIMEOUT)?;
        producer.begin_transaction()?;
        for i in 0..3 {
            send(&producer, &topic_for_producer, 0, &format!("aborted-{i}"))?;
        }
        producer.flush(TIMEOUT)?;
        producer.abort_transaction(TIMEOUT)?;
        Ok(())
    })
    .await??;

    let committed = payloads(&read_topic(&topic, Isolation::ReadCommitted)?);
    assert_eq!(committed, ["committed-0", "committed-1", "committed-2"]);
    let uncommitted = payloads(&read_topic(&topic, Isolation::ReadUncommitted)?);
    assert_eq!(uncommitted.len(), 6, "{uncommitted:?}");
    assert_eq!(
        uncommitted
            .iter()
            .filter(|p| p.starts_with("aborted-"))
            .count(),
        3
    );
    Ok(())
}

/// The committed offset of `group` for partition 0 of `topic`, as the broker reports it.
fn committed_offset(group: &str, topic: &str) -> anyhow::Result<Offset> {
    let consumer: BaseConsumer = client_config().set("group.id", group).create()?;
    let mut partitions = TopicPartitionList::new();
    partitions.add_partition(topic, 0);
    let committed = consumer.committed_offsets(partitions, TIMEOUT)?;
    let offset = committed
        .find_partition(topic, 0)
        .context("partition 0 missing from the committed offsets")?
        .offset();
    Ok(offset)
}

#[tokio::test(flavor = "multi_thread")]
async fn send_offsets_moves_the_group_offset_only_on_commit() -> anyhow::Result<()> {
    let input = unique_name("txn-offsets-in");
    let output = unique_name("txn-offsets-out");
    create_topic(&input, 1).await?;
    create_topic(&output, 1).await?;
    let group = unique_name("group");
    let txn_id = unique_name("txn");
    let (input_c, output_c, group_c) = (input.clone(), output.clone(), group.clone());
    tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
        let (input, output, group) = (input_c, output_c, group_c);
        let seed: TestProducer = client_config().create()?;
        for i in 0..10 {
            send(&seed, &input, 0, &format!("in-{i}"))?;
        }
        seed.flush(TIMEOUT)?;

        let consumer: BaseConsumer = kafka_clients::consumer(
            &client_config(),
            &group,
            kafka_clients::Isolation::ReadCommitted,
        )
        .set("auto.offset.reset", "earliest")
        .create()?;
        consumer.subscribe(&[&input])?;
        let mut consumed = 0;
        let deadline = std::time::Instant::now() + TIMEOUT;
        while consumed < 10 && std::time::Instant::now() < deadline {
            if let Some(message) = consumer.poll(Duration::from_millis(200)) {
                message?;
                consumed += 1;
            }
        }
        assert_eq!(consumed, 10, "the group consumed the whole input");
        let group_metadata = consumer
            .group_metadata()
            .context("the consumer has group metadata")?;
        let producer = transactional_producer(&txn_id)?;

        // Commit: offset 6 becomes the group's committed position together with the output.
        let mut offsets = TopicPartitionList::new();
        offsets.add_partition_offset(&input, 0, Offset::Offset(6))?;
        producer.begin_transaction()?;
        send(&producer, &output, 0, "out-committed")?;
        producer.send_offsets_to_transaction(&offsets, &group_metadata, TIMEOUT)?;
        producer.commit_transaction(TIMEOUT)?;
        assert_eq!(committed_offset(&group, &input)?, Offset::Offset(6));

        // Abort: offset 10 is sent but never becomes the committed position.
        let mut offsets = TopicPartitionList::new();
        offsets.add_partition_offset(&input, 0, Offset::Offset(10))?;
        producer.begin_transaction()?;
        send(&producer, &output, 0, "out-aborted")?;
        producer.send_offsets_to_transaction(&offsets, &group_metadata, TIMEOUT)?;
        producer.abort_transaction(TIMEOUT)?;
        assert_eq!(committed_offset(&group, &input)?, Offset::Offset(6));
        Ok(())
    })
    .await??;

    assert_eq!(
        payloads(&read_topic(&output, Isolation::ReadCommitted)?),
        ["out-committed"]
    );
    Ok(())
}

fn is_fencing_error(error: &KafkaError) -> bool {
    let code = match error {
        KafkaError::Transaction(e) => e.code(),
        other => match other.rdkafka_error_code() {
            Some(code) => code,
            None => return false,
        },
    };
    matches!(
        code,
        RDKafkaErrorCode::Fenced
            | RDKafkaErrorCode::ProducerFenced
            | RDKafkaErrorCode::InvalidProducerEpoch
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_new_producer_with_the_same_id_fences_the_old_one() -> anyhow::Result<()> {
    let topic = unique_name("txn-fencing");
    create_topic(&topic, 1).await?;
    let txn_id = unique_name("txn");
    let topic_c = topic.clone();
    let zombie_error = tokio::task::spawn_blocking(move || -> anyhow::Result<KafkaError> {
        let zombie = transactional_producer(&txn_id)?;
        zombie.begin_transaction()?;
        for i in 0..3 {
            send(&zombie, &topic_c, 0, &format!("zombie-{i}"))?;
        }
        zombie.flush(TIMEOUT)?;

        // The successor's init_transactions bumps the epoch and aborts the zombie's transaction.
        let successor = transactional_producer(&txn_id)?;
        successor.begin_transaction()?;
        send(&successor, &topic_c, 0, "successor")?;
        successor.commit_transaction(TIMEOUT)?;

        send(&zombie, &topic_c, 0, "zombie-late").ok();
        match zombie.commit_transaction(TIMEOUT) {
            Ok(()) => anyhow::bail!("the fenced producer committed"),
            Err(error) => Ok(error),
        }
    })
    .await??;

    assert!(
        is_fencing_error(&zombie_error),
        "expected a fencing error, got {zombie_error:?}"
    );
    if let KafkaError::Transaction(error) = &zombie_error {
        assert!(
            error.is_fatal(),
            "fencing is fatal for the zombie: {error:?}"
        );
    }
    assert_eq!(
        payloads(&read_topic(&topic, Isolation::ReadCommitted)?),
        ["successor"]
    );
    Ok(())
}
