//! The dead-letter producer (docs/architecture/bad-input.md "Bad input"): the original bytes and
//! headers, plus the reason and the source position as eos-core's `dead_letter` headers.
//!
//! Ordering: a batch's dead letters are produced and their delivery awaited *inside* the open
//! database transaction, after the checkpoint row is locked and before the commit. So a crash
//! can never move the checkpoint past a record whose dead letter is not in Kafka. The price: a
//! crash after the delivery and before the commit replays the batch and produces those dead
//! letters again — a duplicate dead letter is recognisable by its source headers
//! (`eos-source-topic/-partition/-offset`), and `sink_dead_letters` (written in the same
//! transaction as the checkpoint) holds exactly one row per dead-lettered input.
//!
//! Size: a dead letter is built by `eos_core::dead_letter::build` to fit the smaller of the
//! producer's `message.max.bytes` and the dead-letter topic's `max.message.bytes` (read at
//! start-up), so an input larger than that (the input topic may accept more) is dead-lettered as
//! a prefix with its original size and SHA-256 instead of failing delivery and rolling the batch
//! back forever.

use std::time::Duration;

use eos_core::{DeadLetterReason, dead_letter};
use eos_runtime::kafka_clients;
use eos_runtime::kafka_errors::ReportingContext;
use rdkafka::ClientConfig;
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;
use tracing::warn;

use crate::mapping::InputRecord;

/// How long a dead letter may wait for its acknowledgement before the batch is rolled back.
pub(crate) const DELIVERY_TIMEOUT: Duration = Duration::from_secs(20);

/// The dead-letter producer and the largest record it can write.
pub(crate) struct DeadLetterProducer {
    producer: FutureProducer<ReportingContext>,
    max_bytes: usize,
}

impl std::fmt::Debug for DeadLetterProducer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeadLetterProducer")
            .field("max_bytes", &self.max_bytes)
            .finish_non_exhaustive()
    }
}

/// The dead-letter producer; `max_bytes` is the largest record it may write (see
/// `eos_core::dead_letter::message_limit`).
pub(crate) fn create_producer(
    client_config: &ClientConfig,
    max_bytes: usize,
) -> Result<DeadLetterProducer, KafkaError> {
    // Idempotent: librdkafka's own retries never duplicate a dead letter.
    let producer = kafka_clients::idempotent_producer(client_config)
        .set("linger.ms", "2")
        // The broker checks a topic's max.message.bytes against a whole record batch: batches of
        // at most the limit, so that dead letters that each fit are never refused together.
        .set("batch.size", max_bytes.to_string())
        .set(
            "message.timeout.ms",
            DELIVERY_TIMEOUT.as_millis().to_string(),
        )
        .create_with_context(ReportingContext)?;
    Ok(DeadLetterProducer {
        producer,
        max_bytes,
    })
}

/// Produces every dead letter of a batch and waits until all are acknowledged.
pub(crate) async fn deliver(
    producer: &DeadLetterProducer,
    dlq_topic: &str,
    letters: &[(&InputRecord, DeadLetterReason, &str)],
) -> Result<(), KafkaError> {
    let built: Vec<dead_letter::DeadLetter> = letters
        .iter()
        .map(|(record, reason, detail)| build(record, *reason, detail, producer.max_bytes))
        .collect();
    let mut deliveries = Vec::with_capacity(built.len());
    for (letter, (record, _, _)) in built.iter().zip(letters) {
        if letter.truncated {
            warn!(
                partition = record.partition,
                offset = record.offset,
                size = record.payload.as_ref().map_or(0, Vec::len),
                limit = producer.max_bytes,
                "dead letter too big for the producer: a prefix is kept, with the original's \
                 size and SHA-256"
            );
        }
        let mut headers = OwnedHeaders::new_with_capacity(letter.headers.len());
        for (key, value) in &letter.headers {
            headers = headers.insert(Header {
                key,
                value: value.as_deref(),
            });
        }
        let mut future_record: FutureRecord<'_, [u8], [u8]> =
            FutureRecord::to(dlq_topic).headers(headers);
        if let Some(key) = &letter.key {
            future_record = future_record.key(key.as_slice());
        }
        if let Some(value) = &letter.value {
            future_record = future_record.payload(value.as_slice());
        }
        deliveries.push(
            producer
                .producer
                .send(future_record, Timeout::After(DELIVERY_TIMEOUT)),
        );
    }
    for result in futures::future::join_all(deliveries).await {
        if let Err((error, _)) = result {
            return Err(error);
        }
    }
    Ok(())
}

/// The dead letter of one input record, cut to `max_bytes` when the original is too big.
pub(crate) fn build(
    record: &InputRecord,
    reason: DeadLetterReason,
    detail: &str,
    max_bytes: usize,
) -> dead_letter::DeadLetter {
    dead_letter::build(
        &dead_letter::DeadLetterInput {
            key: record.key.as_deref(),
            value: record.payload.as_deref(),
            headers: record
                .headers
                .iter()
                .map(|(key, value)| (key.as_str(), value.as_deref()))
                .collect(),
            source_topic: &record.topic,
            source_partition: record.partition,
            source_offset: record.offset,
            reason,
            transform_reason: None,
            detail,
        },
        max_bytes,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(payload: Vec<u8>) -> InputRecord {
        InputRecord {
            topic: "events".into(),
            partition: 1,
            offset: 7,
            key: Some(b"k".to_vec()),
            payload: Some(payload),
            headers: vec![("traceparent".into(), Some(b"00-abc".to_vec()))],
            timestamp_ms: None,
            decoded: None,
        }
    }

    #[test]
    fn a_small_record_is_copied_whole_and_a_huge_one_cut_to_the_limit() {
        let small = build(
            &record(b"{bad".to_vec()),
            DeadLetterReason::MalformedJson,
            "x",
            1_000_000,
        );
        assert!(!small.truncated);
        assert_eq!(small.value.as_deref(), Some(b"{bad".as_slice()));
        assert_eq!(small.header("traceparent"), Some(b"00-abc".as_slice()));

        let huge = vec![b'{'; 3 * 1024 * 1024];
        let letter = build(
            &record(huge.clone()),
            DeadLetterReason::OversizedRecord,
            "x",
            1_000_000,
        );
        assert!(letter.truncated);
        assert!(letter.wire_size() <= 1_000_000);
        assert_eq!(
            letter.header(dead_letter::SOURCE_OFFSET_HEADER),
            Some(b"7".as_slice())
        );
        assert_eq!(
            letter.header(dead_letter::ORIGINAL_SHA256_HEADER),
            Some(dead_letter::sha256_hex(&huge).as_bytes())
        );
    }
}
