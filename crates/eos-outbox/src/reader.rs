//! Reading the outbox in an order that never skips a committed row.
//!
//! Rows are read by (order_xid, position) and only once every transaction that could still add
//! a row below that key has ended: `order_xid` below the xmin of the reading statement's snapshot
//! (the oldest transaction still running). Why that is gap-free, and why a reader of
//! `position > last` is not, is told in the migration's comment on `eos_outbox_enqueue`.
//!
//! This order needs no server setting and no privilege, so outbox-relay keeps it as its `xmin`
//! mode. Its cost: a long-running writing transaction anywhere on the server holds the xmin back,
//! and so delays (never loses) the rows committed after it started. The relay's `logical` mode
//! reads commit order from a replication slot instead and loads the rows with
//! [`read_positions`] (docs/architecture/outbox.md "Outbox").

use serde_json::{Map, Value};
use sqlx::PgExecutor;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use eos_core::{EntityId, EnvelopeError, EventEnvelope, EventId, json_text};

/// A place in the outbox's read order. The default is before the first row.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct OutboxCursor {
    pub order_xid: i64,
    pub position: i64,
}

/// An outbox row, ready to be published.
#[derive(Debug, Clone, PartialEq)]
pub struct OutboxRow {
    pub cursor: OutboxCursor,
    pub topic: String,
    pub key: String,
    pub event_id: String,
    pub entity_id: String,
    /// The ledger envelope's value; `None` on a general row, which has `record` instead.
    pub value: Option<i64>,
    /// A general row's record value (`eos_outbox_enqueue_event`), published as it is.
    pub record: Option<Value>,
    /// A general row's extra headers: an object of string values.
    pub headers: Option<Value>,
    pub version: Option<i64>,
    pub payload: Option<Value>,
    pub occurred_at: Option<OffsetDateTime>,
    pub trace_context: Option<String>,
    pub enqueued_at: OffsetDateTime,
}

impl OutboxRow {
    /// The record value: a general row's JSON as it was enqueued, else the ledger envelope as
    /// every service parses it (docs/architecture/wire-format.md "Wire format"). The table's CHECKs
    /// keep the fields valid; an error here means a row was written around them.
    pub fn value_bytes(&self) -> Result<Vec<u8>, EnvelopeError> {
        if let Some(record) = &self.record {
            return Ok(json_text::to_vec(record));
        }
        let envelope = EventEnvelope {
            event_id: EventId::new(self.event_id.clone())?,
            entity_id: EntityId::new(self.entity_id.clone())?,
            value: self.value.ok_or(EnvelopeError::MissingField("value"))?,
            version: self.version.map(u64::try_from).transpose().map_err(|_| {
                EnvelopeError::InvalidField {
                    field: "version",
                    reason: "must not be negative".into(),
                }
            })?,
            payload: self.payload.clone(),
            occurred_at: self.occurred_at,
            extra: Map::new(),
        };
        // Moved into its object, not copied again (`to_bytes` would clone the payload).
        Ok(json_text::to_vec(&Value::Object(envelope.into_json())))
    }

    /// A general row's own headers, in the order the object holds them.
    pub fn extra_headers(&self) -> Vec<(&str, &str)> {
        self.headers
            .as_ref()
            .and_then(Value::as_object)
            .map(|headers| {
                headers
                    .iter()
                    .filter_map(|(name, value)| Some((name.as_str(), value.as_str()?)))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// `occurred_at` as the envelope writes it, for logs.
    pub fn occurred_at_text(&self) -> Option<String> {
        self.occurred_at.and_then(|at| at.format(&Rfc3339).ok())
    }
}

/// A row as the queries below select it.
struct StoredRow {
    position: i64,
    order_xid: i64,
    topic: String,
    message_key: String,
    event_id: String,
    entity_id: String,
    value: Option<i64>,
    version: Option<i64>,
    payload: Option<Value>,
    occurred_at: Option<OffsetDateTime>,
    trace_context: Option<String>,
    enqueued_at: OffsetDateTime,
    record: Option<Value>,
    headers: Option<Value>,
}

impl From<StoredRow> for OutboxRow {
    fn from(row: StoredRow) -> Self {
        Self {
            cursor: OutboxCursor {
                order_xid: row.order_xid,
                position: row.position,
            },
            topic: row.topic,
            key: row.message_key,
            event_id: row.event_id,
            entity_id: row.entity_id,
            value: row.value,
            record: row.record,
            headers: row.headers,
            version: row.version,
            payload: row.payload,
            occurred_at: row.occurred_at,
            trace_context: row.trace_context,
            enqueued_at: row.enqueued_at,
        }
    }
}

/// Up to `limit` rows after `cursor`, in read order, from transactions that have all ended.
pub async fn read_after<'c>(
    executor: impl PgExecutor<'c>,
    cursor: OutboxCursor,
    limit: i64,
) -> Result<Vec<OutboxRow>, sqlx::Error> {
    let rows = sqlx::query_as!(
        StoredRow,
        r#"SELECT position, order_xid, topic, message_key, event_id, entity_id, value, version,
                  payload, occurred_at, trace_context, enqueued_at, record, headers
             FROM eos_outbox
            WHERE (order_xid, position) > ($1, $2)
              AND order_xid < pg_snapshot_xmin(pg_current_snapshot())::TEXT::BIGINT
            ORDER BY order_xid, position
            LIMIT $3"#,
        cursor.order_xid,
        cursor.position,
        limit,
    )
    .fetch_all(executor)
    .await?;
    Ok(rows.into_iter().map(OutboxRow::from).collect())
}

/// Up to `limit` rows after `cursor` in read order that the statement's snapshot sees, whether
/// or not a transaction below them still runs. Only for rows known to be final by other means:
/// outbox-relay's logical mode reads the rows committed before its replication slot existed this
/// way (docs/architecture/outbox.md "Outbox").
pub async fn read_visible_after<'c>(
    executor: impl PgExecutor<'c>,
    cursor: OutboxCursor,
    limit: i64,
) -> Result<Vec<OutboxRow>, sqlx::Error> {
    let rows = sqlx::query_as!(
        StoredRow,
        r#"SELECT position, order_xid, topic, message_key, event_id, entity_id, value, version,
                  payload, occurred_at, trace_context, enqueued_at, record, headers
             FROM eos_outbox
            WHERE (order_xid, position) > ($1, $2)
            ORDER BY order_xid, position
            LIMIT $3"#,
        cursor.order_xid,
        cursor.position,
        limit,
    )
    .fetch_all(executor)
    .await?;
    Ok(rows.into_iter().map(OutboxRow::from).collect())
}

/// The rows at `positions`, in the order given; a position with no row is left out (the caller
/// compares lengths). outbox-relay's logical mode decodes only each insert's position from the
/// write-ahead log and loads the rows here.
pub async fn read_positions<'c>(
    executor: impl PgExecutor<'c>,
    positions: &[i64],
) -> Result<Vec<OutboxRow>, sqlx::Error> {
    let rows = sqlx::query_as!(
        StoredRow,
        r#"SELECT position, order_xid, topic, message_key, event_id, entity_id, value, version,
                  payload, occurred_at, trace_context, enqueued_at, record, headers
             FROM eos_outbox
            WHERE position = ANY($1)"#,
        positions,
    )
    .fetch_all(executor)
    .await?;
    let mut by_position: std::collections::HashMap<i64, OutboxRow> = rows
        .into_iter()
        .map(|row| (row.position, OutboxRow::from(row)))
        .collect();
    Ok(positions
        .iter()
        .filter_map(|position| by_position.remove(position))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ledger_row(payload: Option<Value>) -> OutboxRow {
        OutboxRow {
            cursor: OutboxCursor::default(),
            topic: "ledger".to_owned(),
            key: "acct-7".to_owned(),
            event_id: "ev-\"1\"".to_owned(),
            entity_id: "acct-7".to_owned(),
            value: Some(-250),
            record: None,
            headers: None,
            version: Some(3),
            payload,
            occurred_at: Some(OffsetDateTime::from_unix_timestamp(1_700_000_000).expect("valid")),
            trace_context: None,
            enqueued_at: OffsetDateTime::UNIX_EPOCH,
        }
    }

    /// The relay's bytes are the envelope's wire format exactly: what `EventEnvelope::to_bytes`
    /// (serde_json over a copy) writes, with and without a payload.
    #[test]
    fn a_ledger_row_publishes_the_envelope_bytes() {
        for payload in [
            None,
            Some(serde_json::json!({"memo": "tab\tand \u{e9}", "lines": [1, 2.5, null]})),
        ] {
            let row = ledger_row(payload.clone());
            let envelope = EventEnvelope {
                event_id: EventId::new(row.event_id.clone()).expect("valid id"),
                entity_id: EntityId::new(row.entity_id.clone()).expect("valid id"),
                value: -250,
                version: Some(3),
                payload,
                occurred_at: row.occurred_at,
                extra: Map::new(),
            };
            assert_eq!(row.value_bytes().expect("a valid row"), envelope.to_bytes());
        }
    }

    #[test]
    fn a_general_row_publishes_its_record_as_serde_json_writes_it() {
        let record = serde_json::json!({"order": "o-1", "note": "quote \" and \\", "n": 1e3});
        let row = OutboxRow {
            record: Some(record.clone()),
            value: None,
            ..ledger_row(None)
        };
        assert_eq!(
            row.value_bytes().expect("a valid row"),
            serde_json::to_vec(&record).expect("serialises")
        );
    }
}
