//! What a request must be before anything is written: the body's fields and the
//! Idempotency-Key header. Pure, so every refusal is unit-tested.

use eos_core::{EntityId, Fingerprint};
use serde::Deserialize;
use serde_json::json;

/// The header that makes a retry safe.
pub const IDEMPOTENCY_KEY_HEADER: &str = "idempotency-key";
const MAX_KEY_BYTES: usize = 255;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PaymentBody {
    account_id: String,
    /// Minor units (cents).
    amount: i64,
    currency: String,
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
    pub fn parse(body: &[u8]) -> Result<Self, String> {
        let body: PaymentBody =
            serde_json::from_slice(body).map_err(|e| format!("body is not a payment: {e}"))?;
        let account_id = EntityId::new(body.account_id).map_err(|e| format!("account_id: {e}"))?;
        if body.amount <= 0 {
            return Err("amount must be a positive number of minor units".into());
        }
        if body.currency.len() != 3 || !body.currency.bytes().all(|b| b.is_ascii_uppercase()) {
            return Err("currency must be a three-letter ISO 4217 code such as EUR".into());
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
            assert!(error.contains(reason), "{error} should mention {reason}");
        }
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
