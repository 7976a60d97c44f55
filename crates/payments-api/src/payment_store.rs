//! The one transaction of a payment: bump the account, insert the payment, enqueue its event.
//! A key seen before rolls it all back and answers from the stored payment instead, naming that
//! payment and the trace context of the request that created it, so the resend's span can join
//! that payment's trace (docs/architecture/event-path.md "The path of one event"). The transaction
//! is begun ([`begin_payment`]) before the request's span is started and committed
//! ([`NewPayment::commit`]) inside it, since which trace the span belongs to depends on whether
//! the key is new.

use serde::Serialize;
use serde_json::json;
use sqlx::{PgPool, Postgres, Transaction};
use time::OffsetDateTime;

use eos_core::{EntityId, EventId};
use eos_outbox::{OutboxError, OutboxEvent};

use crate::payment_request::PaymentRequest;

/// A recorded payment, as the API answers it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Payment {
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
pub(crate) enum Recorded {
    /// A new payment and its event, committed together.
    Created(Payment),
    /// The key was used before by the same request: its payment, nothing written.
    Replayed {
        payment: Payment,
        original_trace: Option<String>,
    },
    /// The key was used before by another request: the payment the key belongs to, nothing
    /// written.
    KeyReused {
        payment_id: String,
        original_trace: Option<String>,
    },
}

impl Recorded {
    /// The payment the request is about — the one it created or the one its key belongs to —
    /// whose id is also its event's id.
    pub(crate) fn payment_id(&self) -> &str {
        match self {
            Self::Created(payment) | Self::Replayed { payment, .. } => &payment.payment_id,
            Self::KeyReused { payment_id, .. } => payment_id,
        }
    }

    /// For a request that did not create its payment: the trace context stored with that
    /// payment's event by the request that did (`trace_context::stored_context` text). `None`
    /// once the relay purged the outbox row (`OUTBOX_RETENTION` after publishing it).
    pub(crate) fn original_trace(&self) -> Option<&str> {
        match self {
            Self::Created(_) => None,
            Self::Replayed { original_trace, .. } | Self::KeyReused { original_trace, .. } => {
                original_trace.as_deref()
            }
        }
    }
}

/// The most an account's balance may hold, in minor units: BIGINT's top. A payment that would
/// pass it is refused before anything is written (docs/bad-input.md), where the overflow used to
/// fail every later payment of the account with a 503 that said "retry".
pub(crate) const MAX_BALANCE: i64 = i64::MAX;

/// A payment the account cannot take: the same request will be refused again, so the client is
/// told why (422), never to retry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Refusal {
    #[error(
        "account {account_id} holds {held}: a payment in {asked} is refused (an account has one \
         currency); nothing was written"
    )]
    OtherCurrency {
        account_id: String,
        held: String,
        asked: String,
    },
    #[error(
        "the balance of account {account_id} would pass its limit of {MAX_BALANCE} minor units; \
         nothing was written"
    )]
    BalanceLimit { account_id: String },
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum StoreError {
    /// Deterministic: answered 422, with nothing written.
    #[error(transparent)]
    Refused(#[from] Refusal),
    #[error("PostgreSQL: {0}")]
    Database(#[from] sqlx::Error),
    #[error("outbox: {0}")]
    Outbox(#[from] OutboxError),
    #[error("payment id {0:?} is not a valid event id")]
    PaymentId(String),
}

impl StoreError {
    /// The database's error behind this one, if any.
    pub(crate) fn database_error(&self) -> Option<&sqlx::Error> {
        match self {
            Self::Database(error) | Self::Outbox(OutboxError::Database(error)) => Some(error),
            Self::Refused(_) | Self::Outbox(_) | Self::PaymentId(_) => None,
        }
    }
}

/// A payment whose key was new: its account bumped and its row inserted in a transaction still
/// open; [`NewPayment::commit`] enqueues its event and commits. Dropped, it rolls back.
#[derive(Debug)]
pub(crate) struct NewPayment {
    tx: Transaction<'static, Postgres>,
    payment: Payment,
    account_id: EntityId,
}

/// How far [`begin_payment`] got: it tells a new key from one seen before, which decides the
/// trace the request's span joins (`request_span`) before anything is enqueued under it.
#[derive(Debug)]
pub(crate) enum Begun {
    New(NewPayment),
    /// The key was seen before; the transaction is rolled back and nothing was written.
    Seen(Recorded),
}

/// Begins recording `request` under `key` as payment `payment_id`.
pub(crate) async fn begin_payment(
    pool: &PgPool,
    key: &str,
    request: &PaymentRequest,
    payment_id: &str,
) -> Result<Begun, StoreError> {
    let fingerprint = request.fingerprint();
    let mut tx = pool.begin().await?;
    // The account takes the payment only in its own currency and below its balance limit; the
    // conflict locks the row either way, so the refusal is decided on the row it reads next.
    // Not yet a `query!`: its offline data in .sqlx/ is regenerated with `cargo sqlx prepare`.
    let account_version: Option<i64> = sqlx::query_scalar(
        r#"INSERT INTO payments_api_accounts AS account (account_id, version, balance, currency)
           VALUES ($1, 1, $2, $3)
           ON CONFLICT (account_id) DO UPDATE
              SET version = account.version + 1, balance = account.balance + excluded.balance
            WHERE account.currency = excluded.currency
              AND account.balance <= $4 - excluded.balance
           RETURNING version"#,
    )
    .bind(request.account_id.as_str())
    .bind(request.amount)
    .bind(&request.currency)
    .bind(MAX_BALANCE)
    .fetch_optional(&mut *tx)
    .await?;
    let Some(account_version) = account_version else {
        let refusal = account_refusal(&mut tx, request).await?;
        tx.rollback().await?;
        // A resend of a payment recorded before the account filled up is answered from it.
        return match seen_before(pool, key, &fingerprint).await? {
            Some(seen) => Ok(Begun::Seen(seen)),
            None => Err(refusal.into()),
        };
    };
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
        return Ok(Begun::Seen(earlier_answer(pool, key, &fingerprint).await?));
    };
    Ok(Begun::New(NewPayment {
        tx,
        payment: Payment {
            payment_id: payment_id.to_owned(),
            event_id: payment_id.to_owned(),
            account_id: request.account_id.to_string(),
            amount: request.amount,
            currency: request.currency.clone(),
            account_version,
            created_at,
        },
        account_id: request.account_id.clone(),
    }))
}

impl NewPayment {
    pub(crate) fn payment_id(&self) -> &str {
        &self.payment.payment_id
    }

    /// Enqueues the payment's event for `topic` and commits it with the payment. The event keeps
    /// the current span's trace context (`eos_outbox::enqueue`): run it inside the request's span.
    pub(crate) async fn commit(mut self, topic: &str) -> Result<Recorded, StoreError> {
        let payment = &self.payment;
        let event_id = EventId::new(payment.payment_id.as_str())
            .map_err(|_| StoreError::PaymentId(payment.payment_id.clone()))?;
        let mut event = OutboxEvent::new(topic, event_id, self.account_id, payment.amount);
        event.version = Some(payment.account_version as u64);
        event.payload =
            Some(json!({ "payment_id": payment.payment_id, "currency": payment.currency }));
        event.occurred_at = Some(payment.created_at);
        eos_outbox::enqueue(&mut self.tx, &event).await?;
        self.tx.commit().await?;
        Ok(Recorded::Created(self.payment))
    }
}

/// Why the account (locked by the refused upsert) did not take `request`.
async fn account_refusal(
    tx: &mut Transaction<'static, Postgres>,
    request: &PaymentRequest,
) -> Result<Refusal, StoreError> {
    let held: String =
        sqlx::query_scalar("SELECT currency FROM payments_api_accounts WHERE account_id = $1")
            .bind(request.account_id.as_str())
            .fetch_one(&mut **tx)
            .await?;
    let account_id = request.account_id.to_string();
    Ok(if held == request.currency {
        Refusal::BalanceLimit { account_id }
    } else {
        Refusal::OtherCurrency {
            account_id,
            held,
            asked: request.currency.clone(),
        }
    })
}

/// The stored answer for `key`, if a payment was recorded under it.
async fn seen_before(
    pool: &PgPool,
    key: &str,
    fingerprint: &str,
) -> Result<Option<Recorded>, StoreError> {
    let recorded: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM payments_api_payments WHERE idempotency_key = $1)",
    )
    .bind(key)
    .fetch_one(pool)
    .await?;
    if !recorded {
        return Ok(None);
    }
    Ok(Some(earlier_answer(pool, key, fingerprint).await?))
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
    let original_trace = original_trace(pool, &row.payment_id).await;
    if row.request_fingerprint != fingerprint {
        return Ok(Recorded::KeyReused {
            payment_id: row.payment_id,
            original_trace,
        });
    }
    let payment = Payment {
        event_id: row.payment_id.clone(),
        payment_id: row.payment_id,
        account_id: row.account_id,
        amount: row.amount,
        currency: row.currency,
        account_version: row.account_version,
        created_at: row.created_at,
    };
    Ok(Recorded::Replayed {
        payment,
        original_trace,
    })
}

/// The trace context `eos_outbox::enqueue` stored with the payment's event: the context of the
/// request span that created the payment. It is kept only in the outbox row, which the relay
/// purges once published and older than its retention; then there is none.
///
/// Only the trace the resend's span joins depends on it, so a failed read is logged and answered
/// with `None` rather than failing a request whose answer is already known.
async fn original_trace(pool: &PgPool, payment_id: &str) -> Option<String> {
    let stored = sqlx::query_scalar!(
        "SELECT trace_context FROM eos_outbox WHERE event_id = $1",
        payment_id
    )
    .fetch_optional(pool)
    .await;
    match stored {
        Ok(stored) => stored.flatten(),
        Err(error) => {
            tracing::warn!(event_id = %payment_id, %error, "cannot read the payment's trace context");
            None
        }
    }
}
