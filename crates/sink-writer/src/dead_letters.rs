//! The dead-letter producer (docs/ARCHITECTURE.md "Bad input"): the original bytes and headers,
//! plus the reason and the source position as eos-core's `dead_letter` headers.
//!
//! Ordering: a batch's dead letters are produced and their delivery awaited *inside* the open
//! database transaction, after the checkpoint row is locked and before the commit. So a crash
//! can never move the checkpoint past a record whose dead letter is not in Kafka. The price: a
//! crash after the delivery and before the commit replays the batch and produces those dead
//! letters again — a duplicate dead letter is recognisable by its source headers
//! (`eos-source-topic/-partition/-offset`), and `sink_dead_letters` (written in the same
//! transaction as the checkpoint) holds exactly one row per dead-lettered input.

use std::time::Duration;

use eos_core::{DeadLetterReason, dead_letter};
use rdkafka::ClientConfig;
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;

use crate::mapping::InputRecord;

/// How long a dead letter may wait for its acknowledgement before the batch is rolled back.
pub const DELIVERY_TIMEOUT: Duration = Duration::from_secs(20);

pub fn create_producer(client_config: &ClientConfig) -> Result<FutureProducer, KafkaError> {
    client_config
        .clone()
        // Idempotent: librdkafka's own retries never duplicate a dead letter.
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "2")
        .set(
            "message.timeout.ms",
            DELIVERY_TIMEOUT.as_millis().to_string(),
        )
        .create()
}

/// Produces every dead letter of a batch and waits until all are acknowledged.
pub async fn deliver(
    producer: &FutureProducer,
    dlq_topic: &str,
    letters: &[(&InputRecord, DeadLetterReason, &str)],
) -> Result<(), KafkaError> {
    let mut deliveries = Vec::with_capacity(letters.len());
    for (record, reason, detail) in letters {
        let headers = headers(record, *reason, detail);
        let mut future_record: FutureRecord<'_, [u8], [u8]> =
            FutureRecord::to(dlq_topic).headers(headers);
        if let Some(key) = &record.key {
            future_record = future_record.key(key.as_slice());
        }
        if let Some(payload) = &record.payload {
            future_record = future_record.payload(payload.as_slice());
        }
        deliveries.push(producer.send(future_record, Timeout::After(DELIVERY_TIMEOUT)));
    }
    for result in futures::future::join_all(deliveries).await {
        if let Err((error, _)) = result {
            return Err(error);
        }
    }
    Ok(())
}

fn headers(record: &InputRecord, reason: DeadLetterReason, detail: &str) -> OwnedHeaders {
    let mut headers = OwnedHeaders::new();
    for (key, value) in &record.headers {
        headers = headers.insert(Header {
            key,
            value: value.as_deref(),
        });
    }
    let partition = record.partition.to_string();
    let offset = record.offset.to_string();
    for (key, value) in [
        (dead_letter::REASON_HEADER, reason.as_str()),
        (dead_letter::DETAIL_HEADER, detail),
        (dead_letter::SOURCE_TOPIC_HEADER, record.topic.as_str()),
        (dead_letter::SOURCE_PARTITION_HEADER, partition.as_str()),
        (dead_letter::SOURCE_OFFSET_HEADER, offset.as_str()),
    ] {
        headers = headers.insert(Header {
            key,
            value: Some(value.as_bytes()),
        });
    }
    headers
}
