//! The relay's position in Kafka (exactly-once mode): a compacted one-partition topic, keyed by
//! relay name, written inside the same transaction as the records it counts — as Kafka Connect's
//! exactly-once source connectors keep their offsets. Read back with `read_committed` at start,
//! it says exactly which rows are in Kafka.

use std::time::{Duration, Instant};

use eos_runtime::kafka_clients::{self, Isolation::ReadCommitted};
use eos_runtime::kafka_errors::ReportingContext;
use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Message, OwnedHeaders};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use serde::{Deserialize, Serialize};

use eos_outbox::OutboxCursor;
use eos_runtime::topic_config::{
    KEYED_STATE_TOPIC_CONFIG, TopicReplicationFlags, cleanup_policy, require_compact_only,
};
use eos_runtime::transactional_producer::PendingRecord;

use crate::error::RelayError;
use crate::pgoutput::Lsn;

const ADMIN_TIMEOUT: Duration = Duration::from_secs(10);

/// Where a relay has got to: what its position record says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelayPosition {
    /// xmin mode: every row up to this key in (order_xid, position) order is published.
    Xmin(OutboxCursor),
    /// logical mode: every outbox row of a transaction whose commit record starts before `lsn`
    /// is published — except, while `table_after` is set, the rows committed before the slot
    /// existed that come after that key in (order_xid, position) order (docs/ARCHITECTURE.md
    /// "Outbox").
    Logical {
        lsn: Lsn,
        table_after: Option<OutboxCursor>,
    },
}

impl Default for RelayPosition {
    fn default() -> Self {
        Self::Xmin(OutboxCursor::default())
    }
}

/// The record value. An xmin position keeps the shape it had before the logical mode existed, so
/// either relay version reads the other's xmin records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
enum PositionValue {
    Logical {
        mode: LogicalTag,
        lsn: LsnText,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        table_after: Option<CursorValue>,
    },
    Xmin(CursorValue),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum LogicalTag {
    Logical,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct CursorValue {
    order_xid: i64,
    position: i64,
}

/// An LSN as PostgreSQL writes it, so an operator reads the record as psql shows the slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
struct LsnText(Lsn);

impl TryFrom<String> for LsnText {
    type Error = String;
    fn try_from(text: String) -> Result<Self, String> {
        text.parse().map(Self)
    }
}

impl From<LsnText> for String {
    fn from(lsn: LsnText) -> Self {
        lsn.0.to_string()
    }
}

impl From<CursorValue> for OutboxCursor {
    fn from(value: CursorValue) -> Self {
        Self {
            order_xid: value.order_xid,
            position: value.position,
        }
    }
}

impl From<OutboxCursor> for CursorValue {
    fn from(cursor: OutboxCursor) -> Self {
        Self {
            order_xid: cursor.order_xid,
            position: cursor.position,
        }
    }
}

impl From<RelayPosition> for PositionValue {
    fn from(position: RelayPosition) -> Self {
        match position {
            RelayPosition::Xmin(cursor) => Self::Xmin(cursor.into()),
            RelayPosition::Logical { lsn, table_after } => Self::Logical {
                mode: LogicalTag::Logical,
                lsn: LsnText(lsn),
                table_after: table_after.map(CursorValue::from),
            },
        }
    }
}

impl From<PositionValue> for RelayPosition {
    fn from(value: PositionValue) -> Self {
        match value {
            PositionValue::Xmin(cursor) => Self::Xmin(cursor.into()),
            PositionValue::Logical {
                lsn, table_after, ..
            } => Self::Logical {
                lsn: lsn.0,
                table_after: table_after.map(OutboxCursor::from),
            },
        }
    }
}

fn topic_error(topic: &str, detail: impl Into<String>) -> RelayError {
    RelayError::Topic {
        topic: topic.to_owned(),
        detail: detail.into(),
    }
}

/// Creates the topic (one partition, compacted) when missing; refuses one that is not compacted
/// only, since retention could then delete the position and the relay would publish again.
pub async fn ensure_positions_topic(
    client_config: &ClientConfig,
    topic: &str,
    replication: &TopicReplicationFlags,
) -> Result<(), RelayError> {
    // Its own context: the admin client's thread reports a broker's refusal (a wrong password)
    // as an ERROR, and the refusal is named if start-up then fails.
    let admin: AdminClient<ReportingContext> =
        client_config.create_with_context(ReportingContext)?;
    let options = AdminOptions::new().operation_timeout(Some(ADMIN_TIMEOUT));
    let settings = replication.topic_settings();
    let new_topic = replication.new_topic(
        topic,
        1,
        settings
            .iter()
            .map(|(key, value)| (*key, value.as_str()))
            .chain(KEYED_STATE_TOPIC_CONFIG),
    );
    for result in admin.create_topics([&new_topic], &options).await? {
        match result {
            Ok(topic) => {
                tracing::info!(topic, "created topic");
                // Only a topic this relay created: one that exists was replicated by someone else.
                replication.warn_if_under_replicated(client_config).await;
            }
            Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((topic, code)) => {
                return Err(topic_error(&topic, format!("cannot create: {code}")));
            }
        }
    }
    let policy = cleanup_policy(&admin, topic, ADMIN_TIMEOUT)
        .await
        .map_err(|error| topic_error(topic, error.to_string()))?;
    require_compact_only(&policy).map_err(|detail| topic_error(topic, detail))
}

/// The record that moves `relay_name`'s position to `position`, sent inside the batch's
/// transaction.
pub fn position_record(topic: &str, relay_name: &str, position: RelayPosition) -> PendingRecord {
    let value = PositionValue::from(position);
    PendingRecord {
        topic: topic.to_owned(),
        partition: Some(0),
        key: Some(relay_name.as_bytes().to_vec()),
        payload: serde_json::to_vec(&value).ok(),
        headers: OwnedHeaders::new(),
    }
}

/// `relay_name`'s last committed position (`None`: it never committed one, or an operator
/// deleted it with a tombstone). Call after the
/// producer's `init_transactions`, which aborts this relay's open transaction; an open
/// transaction of another relay on the topic is waited for, up to `timeout`.
pub fn read_position(
    client_config: &ClientConfig,
    topic: &str,
    relay_name: &str,
    timeout: Duration,
) -> Result<Option<RelayPosition>, RelayError> {
    let position_error = |detail: String| RelayError::Position {
        relay: relay_name.to_owned(),
        detail,
    };
    let consumer: BaseConsumer<ReportingContext> =
        kafka_clients::reader(client_config, &format!("{topic}-reader"), ReadCommitted)
            .create_with_context(ReportingContext)?;
    // Up to the high watermark: another relay's open transaction holds the last stable offset
    // below this relay's own last committed position (see `eos_runtime::log_end`).
    let (low, high) =
        eos_runtime::log_end::EndQuery::new(client_config)?.watermarks(topic, 0, ADMIN_TIMEOUT)?;
    if high <= low {
        return Ok(None);
    }
    let mut assignment = TopicPartitionList::new();
    assignment.add_partition_offset(topic, 0, Offset::Offset(low))?;
    consumer.assign(&assignment)?;
    let deadline = Instant::now() + timeout;
    let mut last = None;
    loop {
        if let Some(message) = consumer.poll(Duration::from_millis(100)) {
            let message = message?;
            if message.key() == Some(relay_name.as_bytes()) {
                last = match message.payload() {
                    // A tombstone: an operator reset the position on purpose.
                    None => None,
                    Some(bytes) => {
                        let value: PositionValue = serde_json::from_slice(bytes).map_err(|e| {
                            position_error(format!(
                                "record at offset {} does not decode: {e}",
                                message.offset()
                            ))
                        })?;
                        Some(RelayPosition::from(value))
                    }
                };
            }
        }
        // Aborted records and transaction markers advance the position without being returned.
        let position = consumer
            .position()
            .ok()
            .and_then(|list| {
                list.find_partition(topic, 0)
                    .and_then(|p| p.offset().to_raw())
            })
            .unwrap_or(low);
        if position >= high {
            return Ok(last);
        }
        if Instant::now() > deadline {
            return Err(position_error(format!(
                "stuck at offset {position} of {high} of {topic} after {timeout:?}: an open \
                 transaction holds the last stable offset"
            )));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(position: RelayPosition) -> (String, RelayPosition) {
        let record = position_record("positions", "default", position);
        assert_eq!(record.partition, Some(0));
        assert_eq!(record.key.as_deref(), Some(b"default".as_slice()));
        let bytes = record.payload.unwrap_or_default();
        let value: PositionValue = serde_json::from_slice(&bytes).expect("decodes");
        (
            String::from_utf8(bytes).expect("JSON is UTF-8"),
            RelayPosition::from(value),
        )
    }

    #[test]
    fn the_position_record_is_keyed_by_relay_and_round_trips() {
        let cursor = OutboxCursor {
            order_xid: 826_260,
            position: 42,
        };
        let (json, back) = round_trip(RelayPosition::Xmin(cursor));
        assert_eq!(back, RelayPosition::Xmin(cursor));
        assert_eq!(
            json, r#"{"order_xid":826260,"position":42}"#,
            "an xmin position keeps the record shape older relays wrote and read"
        );
        for table_after in [None, Some(cursor)] {
            let logical = RelayPosition::Logical {
                lsn: Lsn(0x16_B374_D848),
                table_after,
            };
            let (json, back) = round_trip(logical);
            assert_eq!(back, logical);
            assert!(
                json.contains(r#""mode":"logical","lsn":"16/B374D848""#),
                "{json}"
            );
        }
    }

    #[test]
    fn a_record_written_before_the_logical_mode_reads_as_an_xmin_position() {
        let value: PositionValue =
            serde_json::from_str(r#"{"order_xid":7,"position":3}"#).expect("decodes");
        assert_eq!(
            RelayPosition::from(value),
            RelayPosition::Xmin(OutboxCursor {
                order_xid: 7,
                position: 3
            })
        );
        assert!(
            serde_json::from_str::<PositionValue>(r#"{"mode":"logical","lsn":"nonsense"}"#)
                .is_err()
        );
    }
}
