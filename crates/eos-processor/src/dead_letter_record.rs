//! A dead letter as the record the open batch writes: the original key, value and headers plus
//! the `eos_core::dead_letter` headers, cut to fit what the producer can write
//! (docs/architecture/event-path.md, "The path of one event").

use rdkafka::message::{Header, Headers, Message, OwnedHeaders, OwnedMessage};

use eos_core::{DeadLetterReason, dead_letter};
use eos_runtime::transactional_producer::PendingRecord;

/// A dead letter to write, and whether its value had to be cut to fit.
pub(crate) struct DeadLetterRecord {
    pub(crate) record: PendingRecord,
    pub(crate) truncated: bool,
}

/// The original bytes and headers plus the reason and the source position, in the
/// `eos_core::dead_letter` headers — cut to fit `max_bytes` when the original is too big for the
/// producer, so a dead letter can never fail to be written and stall the partition.
pub(crate) fn dead_letter_record(
    dlq_topic: &str,
    message: &OwnedMessage,
    (reason, transform_reason): (DeadLetterReason, Option<&str>),
    detail: &str,
    max_bytes: usize,
) -> DeadLetterRecord {
    let headers = message
        .headers()
        .map(|original| {
            original
                .iter()
                .map(|header| (header.key, header.value))
                .collect()
        })
        .unwrap_or_default();
    let letter = dead_letter::build(
        &dead_letter::DeadLetterInput {
            key: message.key(),
            value: message.payload(),
            headers,
            source_topic: message.topic(),
            source_partition: message.partition(),
            source_offset: message.offset(),
            reason,
            transform_reason,
            detail,
        },
        max_bytes,
    );
    let mut headers = OwnedHeaders::new_with_capacity(letter.headers.len());
    for (key, value) in &letter.headers {
        headers = headers.insert(Header {
            key,
            value: value.as_deref(),
        });
    }
    DeadLetterRecord {
        truncated: letter.truncated,
        record: PendingRecord {
            topic: dlq_topic.to_owned(),
            partition: None,
            key: letter.key,
            payload: letter.value,
            headers,
        },
    }
}
