//! What a request must be before anything is written: the body's fields and the
//! Idempotency-Key header. Pure, so every refusal is unit-tested.

use eos_core::{EntityId, Fingerprint};
use serde::Deserialize;
use serde_json::json;

/// The header that makes a retry safe.
pub const IDEMPOTENCY_KEY_HEADER: &str = "idempotency-key";
const MAX_KEY_BYTES: usize = 255;
/// The largest amount one payment may carry, in minor units (10 billion of a two-decimal
/// currency): far beyond any real payment, and small enough that an account's balance takes
/// millions of them before its own limit (docs/bad-input.md).
pub const MAX_AMOUNT: i64 = 1_000_000_000_000;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PaymentBody {
    account_id: String,
    /// Minor units (cents).
    amount: i64,
    currency: String,
}

/// Why a request is refused before anything is written; each variant is its own HTTP status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// Not a payment: a body or header the client must fix (400).
    #[error("{0}")]
    Malformed(String),
    /// A well-formed payment past the documented bound (422): sending it again cannot help.
    #[error(
        "amount {amount} is over the limit of {MAX_AMOUNT} minor units per payment; nothing was \
         written"
    )]
    AmountOverLimit { amount: i64 },
}

/// A valid payment request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PaymentRequest {
    pub account_id: EntityId,
    pub amount: i64,
    pub currency: String,
}

impl PaymentRequest {
    /// Parses and validates a request body; the error is the reason given to the client.
    pub fn parse(body: &[u8]) -> Result<Self, RequestError> {
        let malformed = |reason: String| RequestError::Malformed(reason);
        let body: PaymentBody = serde_json::from_slice(body)
            .map_err(|e| malformed(format!("body is not a payment: {e}")))?;
        let account_id =
            EntityId::new(body.account_id).map_err(|e| malformed(format!("account_id: {e}")))?;
        if body.amount <= 0 {
            return Err(malformed(
                "amount must be a positive number of minor units".into(),
            ));
        }
        if body.amount > MAX_AMOUNT {
            return Err(RequestError::AmountOverLimit {
                amount: body.amount,
            });
        }
        if body.currency.len() != 3 || !body.currency.bytes().all(|b| b.is_ascii_uppercase()) {
            return Err(malformed(
                "currency must be a three-letter ISO 4217 code such as EUR".into(),
            ));
        }
        Ok(Self {
            account_id,
            amount: body.amount,
            currency: body.currency,
        })
    }

    /// Of the request's meaning, not its bytes: the same fields in another order or spacing are
    /// the same request.
    pub fn fingerprint(&self) -> String {
        Fingerprint::of_json(&json!({
            "account_id": self.account_id.as_str(),
            "amount": self.amount,
            "currency": self.currency,
        }))
        .to_hex()
    }
}

/// The Idempotency-Key header's value, or why it is refused.
pub fn idempotency_key(value: Option<&[u8]>) -> Result<String, String> {
    let value = value.ok_or("the Idempotency-Key header is required")?;
    let key = std::str::from_utf8(value).map_err(|_| "Idempotency-Key is not UTF-8")?;
    if key.is_empty() || key.len() > MAX_KEY_BYTES {
        return Err(format!(
            "Idempotency-Key must be 1 to {MAX_KEY_BYTES} bytes"
        ));
    }
    if !key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err("Idempotency-Key must be printable ASCII without spaces".into());
    }
    Ok(key.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_valid_body_parses_and_its_fingerprint_ignores_layout() {
        let a = PaymentRequest::parse(br#"{"account_id":"acct-1","amount":1250,"currency":"EUR"}"#)
            .expect("valid");
        let b = PaymentRequest::parse(
            br#"{ "currency": "EUR", "amount": 1250, "account_id": "acct-1" }"#,
        )
        .expect("valid");
        assert_eq!(a, b);
        assert_eq!(a.fingerprint(), b.fingerprint());
        let c = PaymentRequest::parse(br#"{"account_id":"acct-1","amount":1251,"currency":"EUR"}"#)
            .expect("valid");
        assert_ne!(a.fingerprint(), c.fingerprint());
    }

    #[test]
    fn bad_bodies_are_refused_with_a_reason() {
        for (body, reason) in [
            (&b"not json"[..], "not a payment"),
            (br#"{"account_id":"a","amount":5}"#, "currency"),
            (
                br#"{"account_id":"a","amount":0,"currency":"EUR"}"#,
                "positive",
            ),
            (
                br#"{"account_id":"a","amount":-5,"currency":"EUR"}"#,
                "positive",
            ),
            (
                br#"{"account_id":"a","amount":5,"currency":"eur"}"#,
                "three-letter",
            ),
            (
                br#"{"account_id":"","amount":5,"currency":"EUR"}"#,
                "account_id",
            ),
            (
                br#"{"account_id":"a","amount":5.5,"currency":"EUR"}"#,
                "not a payment",
            ),
            (
                br#"{"account_id":"a","amount":5,"currency":"EUR","x":1}"#,
                "unknown field",
            ),
        ] {
            let error = PaymentRequest::parse(body).expect_err("refused");
            assert!(matches!(error, RequestError::Malformed(_)), "{error:?}");
            let error = error.to_string();
            assert!(error.contains(reason), "{error} should mention {reason}");
        }
    }

    #[test]
    fn an_amount_over_the_limit_is_refused_naming_the_limit() {
        let body = |amount: i64| {
            format!(r#"{{"account_id":"a","amount":{amount},"currency":"EUR"}}"#).into_bytes()
        };
        assert!(PaymentRequest::parse(&body(MAX_AMOUNT)).is_ok());
        for amount in [MAX_AMOUNT + 1, i64::MAX] {
            let error = PaymentRequest::parse(&body(amount)).expect_err("over the limit");
            assert_eq!(error, RequestError::AmountOverLimit { amount });
            assert!(error.to_string().contains("1000000000000"), "{error}");
        }
        // The schema keeps the same bound (its CHECK), so the two cannot drift apart.
        let migration = include_str!("../migrations/20261206000101_account_currency.sql");
        assert!(
            migration.contains(&format!("BETWEEN 1 AND {MAX_AMOUNT}")),
            "the migration's CHECK is MAX_AMOUNT"
        );
    }

    #[test]
    fn idempotency_keys_must_be_present_and_printable() {
        assert_eq!(idempotency_key(Some(b"k-1")), Ok("k-1".into()));
        assert!(idempotency_key(None).is_err());
        assert!(idempotency_key(Some(b"")).is_err());
        assert!(idempotency_key(Some(b"has space")).is_err());
        assert!(idempotency_key(Some(&[b'k'; 256])).is_err());
    }
}
