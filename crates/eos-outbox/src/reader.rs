//! Reading the outbox in an order that never skips a committed row.
//!
//! Rows are read by (order_xid, position) and only once every transaction that could still add
//! a row below that key has ended: `order_xid` below the xmin of the reading statement's snapshot
//! (the oldest transaction still running). Why that is gap-free, and why a reader of
//! `position > last` is not, is told in the migration's comment on `eos_outbox_enqueue`.
//!
//! Logical decoding would give commit order directly, but it needs `wal_level = logical`, a
//! replication slot that holds WAL while the relay is down, and a role with the REPLICATION
//! attribute: settings a managed PostgreSQL often does not grant to an application. This order
//! needs none of that. Its cost: a long-running writing transaction anywhere on the server holds
//! the xmin back, and so delays (never loses) the rows committed after it started.

use serde_json::{Map, Value};
use sqlx::PgExecutor;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use eos_core::{EntityId, EnvelopeError, EventEnvelope, EventId};

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
    /// every service parses it (docs/ARCHITECTURE.md "Wire format"). The table's CHECKs keep the
    /// fields valid; an error here means a row was written around them.
    pub fn value_bytes(&self) -> Result<Vec<u8>, EnvelopeError> {
        if let Some(record) = &self.record {
            return serde_json::to_vec(record)
                .map_err(|e| EnvelopeError::MalformedJson(e.to_string()));
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
        Ok(envelope.to_bytes())
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

/// Up to `limit` rows after `cursor`, in read order, from transactions that have all ended.
pub async fn read_after<'c>(
    executor: impl PgExecutor<'c>,
    cursor: OutboxCursor,
    limit: i64,
) -> Result<Vec<OutboxRow>, sqlx::Error> {
    let rows = sqlx::query!(
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
    Ok(rows
        .into_iter()
        .map(|row| OutboxRow {
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
        })
        .collect())
}
