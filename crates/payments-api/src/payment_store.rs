//! The one transaction of a payment: bump the account, insert the payment, enqueue its event.
//! A key seen before rolls it all back and answers from the stored payment instead.

use serde::Serialize;
use serde_json::json;
use sqlx::PgPool;
use time::OffsetDateTime;

use eos_core::EventId;
use eos_outbox::{OutboxError, OutboxEvent};

use crate::payment_request::PaymentRequest;

/// A recorded payment, as the API answers it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Payment {
    pub payment_id: String,
    /// The id of the payment's event on the topic (the payment id).
    pub event_id: String,
    pub account_id: String,
    pub amount: i64,
    pub currency: String,
    pub account_version: i64,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
}

/// What recording a request did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recorded {
    /// A new payment and its event, committed together.
    Created(Payment),
    /// The key was used before by the same request: its payment, nothing written.
    Replayed(Payment),
    /// The key was used before by another request: nothing written.
    KeyReused,
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("PostgreSQL: {0}")]
    Database(#[from] sqlx::Error),
    #[error("outbox: {0}")]
    Outbox(#[from] OutboxError),
    #[error("payment id {0:?} is not a valid event id")]
    PaymentId(String),
}

/// Records `request` under `key` as payment `payment_id`, publishing to `topic`.
pub async fn record_payment(
    pool: &PgPool,
    topic: &str,
    key: &str,
    request: &PaymentRequest,
    payment_id: &str,
) -> Result<Recorded, StoreError> {
    let fingerprint = request.fingerprint();
    let mut tx = pool.begin().await?;
    let account_version = sqlx::query_scalar!(
        r#"INSERT INTO payments_api_accounts AS account (account_id, version, balance)
           VALUES ($1, 1, $2)
           ON CONFLICT (account_id) DO UPDATE
              SET version = account.version + 1, balance = account.balance + excluded.balance
           RETURNING version"#,
        request.account_id.as_str(),
        request.amount,
    )
    .fetch_one(&mut *tx)
    .await?;
    // Waits for a concurrent request with the same key to end, then sees its row.
    let created_at = sqlx::query_scalar!(
        r#"INSERT INTO payments_api_payments (payment_id, idempotency_key, request_fingerprint,
               account_id, amount, currency, account_version)
           VALUES ($1, $2, $3, $4, $5, $6, $7)
           ON CONFLICT (idempotency_key) DO NOTHING
           RETURNING created_at"#,
        payment_id,
        key,
        fingerprint,
        request.account_id.as_str(),
        request.amount,
        request.currency,
        account_version,
    )
    .fetch_optional(&mut *tx)
    .await?;
    let Some(created_at) = created_at else {
        tx.rollback().await?;
        return earlier_answer(pool, key, &fingerprint).await;
    };
    let event_id =
        EventId::new(payment_id).map_err(|_| StoreError::PaymentId(payment_id.to_owned()))?;
    let mut event = OutboxEvent::new(topic, event_id, request.account_id.clone(), request.amount);
    event.version = Some(account_version as u64);
    event.payload = Some(json!({ "payment_id": payment_id, "currency": request.currency }));
    event.occurred_at = Some(created_at);
    eos_outbox::enqueue(&mut tx, &event).await?;
    tx.commit().await?;
    Ok(Recorded::Created(Payment {
        payment_id: payment_id.to_owned(),
        event_id: payment_id.to_owned(),
        account_id: request.account_id.to_string(),
        amount: request.amount,
        currency: request.currency.clone(),
        account_version,
        created_at,
    }))
}

async fn earlier_answer(
    pool: &PgPool,
    key: &str,
    fingerprint: &str,
) -> Result<Recorded, StoreError> {
    let row = sqlx::query!(
        r#"SELECT payment_id, request_fingerprint, account_id, amount, currency, account_version,
                  created_at
             FROM payments_api_payments WHERE idempotency_key = $1"#,
        key,
    )
    .fetch_one(pool)
    .await?;
    if row.request_fingerprint != fingerprint {
        return Ok(Recorded::KeyReused);
    }
    Ok(Recorded::Replayed(Payment {
        event_id: row.payment_id.clone(),
        payment_id: row.payment_id,
        account_id: row.account_id,
        amount: row.amount,
        currency: row.currency,
        account_version: row.account_version,
        created_at: row.created_at,
    }))
}
