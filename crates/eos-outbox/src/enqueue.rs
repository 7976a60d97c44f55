//! Enqueueing an event inside the caller's transaction.

use eos_core::{EntityId, EventId};
use serde_json::Value;
use sqlx::PgConnection;
use time::OffsetDateTime;

/// Why an event was not enqueued. The caller's transaction is then in an error state: roll it
/// back (the domain change with it).
#[derive(Debug, thiserror::Error)]
pub enum OutboxError {
    /// An event with this `event_id` is already in the outbox: the same fact enqueued twice.
    #[error("event {0} is already in the outbox")]
    DuplicateEvent(String),
    /// The row breaks one of the envelope's rules the table checks.
    #[error("event {event_id} is not a valid envelope: {detail}")]
    Invalid { event_id: String, detail: String },
    #[error("PostgreSQL: {0}")]
    Database(#[from] sqlx::Error),
}

/// One event to publish: the envelope (docs/architecture/wire-format.md "Wire format"), where it
/// goes and its record key.
#[derive(Debug, Clone, PartialEq)]
pub struct OutboxEvent {
    pub topic: String,
    /// The Kafka record key; [`OutboxEvent::new`] uses the entity id, so an entity's events
    /// share a partition and keep their order.
    pub key: String,
    pub event_id: EventId,
    pub entity_id: EntityId,
    /// Minor units (cents).
    pub value: i64,
    pub version: Option<u64>,
    pub payload: Option<Value>,
    pub occurred_at: Option<OffsetDateTime>,
}

impl OutboxEvent {
    /// An event keyed by its entity, with no version, payload or time.
    pub fn new(
        topic: impl Into<String>,
        event_id: EventId,
        entity_id: EntityId,
        value: i64,
    ) -> Self {
        Self {
            topic: topic.into(),
            key: entity_id.as_str().to_owned(),
            event_id,
            entity_id,
            value,
            version: None,
            payload: None,
            occurred_at: None,
        }
    }
}

/// Enqueues `event` in the transaction open on `conn` (pass `&mut tx`) and returns its outbox
/// position. The current span's trace context is stored with it, so the event's trace starts
/// here. The row commits or rolls back with the caller's transaction.
pub async fn enqueue(conn: &mut PgConnection, event: &OutboxEvent) -> Result<i64, OutboxError> {
    let trace_context = eos_runtime::trace_context::stored_span_context(
        &tracing::Span::current(),
        &opentelemetry::Context::current(),
    );
    let version =
        event
            .version
            .map(i64::try_from)
            .transpose()
            .map_err(|_| OutboxError::Invalid {
                event_id: event.event_id.to_string(),
                detail: "version is above the largest BIGINT".into(),
            })?;
    let enqueued = sqlx::query_scalar!(
        r#"SELECT eos_outbox_enqueue($1, $2, $3, $4, $5, $6, $7, $8, $9) AS "position!""#,
        event.topic,
        event.key,
        event.event_id.as_str(),
        event.entity_id.as_str(),
        event.value,
        version,
        event.payload,
        event.occurred_at,
        trace_context,
    )
    .fetch_one(conn)
    .await;
    enqueued.map_err(|error| classify(error, event.event_id.as_str()))
}

/// Any JSON event to publish as it is (`eos_outbox_enqueue_event`): where it goes, its record
/// key (which also orders it), its id (the `event_id` header) and extra headers.
#[derive(Debug, Clone, PartialEq)]
pub struct OutboxMessage {
    pub topic: String,
    /// The Kafka record key; the events of one key keep their commit order. 1..=128 bytes.
    pub key: String,
    pub event_id: EventId,
    /// The record value.
    pub record: serde_json::Map<String, Value>,
    /// Extra headers, besides `event_id` and the trace context the relay writes.
    pub headers: Vec<(String, String)>,
}

/// Enqueues any JSON event in the transaction open on `conn` and returns its outbox position;
/// the relay publishes `message.record` as it is. Otherwise as [`enqueue`].
pub async fn enqueue_message(
    conn: &mut PgConnection,
    message: &OutboxMessage,
) -> Result<i64, OutboxError> {
    let trace_context = eos_runtime::trace_context::stored_span_context(
        &tracing::Span::current(),
        &opentelemetry::Context::current(),
    );
    let record = Value::Object(message.record.clone());
    let headers = (!message.headers.is_empty()).then(|| {
        Value::Object(
            message
                .headers
                .iter()
                .map(|(name, value)| (name.clone(), Value::String(value.clone())))
                .collect(),
        )
    });
    let enqueued = sqlx::query_scalar!(
        r#"SELECT eos_outbox_enqueue_event($1, $2, $3, $4, $5, $6) AS "position!""#,
        message.topic,
        message.key,
        message.event_id.as_str(),
        record,
        headers,
        trace_context,
    )
    .fetch_one(conn)
    .await;
    enqueued.map_err(|error| classify(error, message.event_id.as_str()))
}

fn classify(error: sqlx::Error, event_id: &str) -> OutboxError {
    let event_id = event_id.to_owned();
    match error.as_database_error() {
        Some(db) if db.is_unique_violation() => OutboxError::DuplicateEvent(event_id),
        Some(db) if db.is_check_violation() => OutboxError::Invalid {
            event_id,
            detail: db.message().to_owned(),
        },
        _ => OutboxError::Database(error),
    }
}
