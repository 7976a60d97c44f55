//! The provider's books, in memory: charges by idempotency key (forgotten after the key TTL, as
//! real providers do) and the log of every effect ever applied (never forgotten: it is what tests
//! count). Pure: time is passed in.

use std::collections::HashMap;
use std::time::Duration;

use eos_core::Fingerprint;
use serde::Serialize;
use time::OffsetDateTime;

/// The stable record of an applied charge (what `POST` and `GET /charges/{key}` answer).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct ChargeRecord {
    pub id: String,
    pub key: String,
    pub amount: i64,
    pub status: &'static str,
    #[serde(with = "time::serde::rfc3339")]
    pub applied_at: OffsetDateTime,
}

/// One applied effect, as `GET /effects` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Effect {
    pub key: String,
    pub charge_id: String,
    pub amount: i64,
    #[serde(with = "time::serde::rfc3339")]
    pub applied_at: OffsetDateTime,
    /// POSTs with this key while it was remembered (first one included).
    pub attempts: u64,
}

#[derive(Debug, Clone)]
struct Remembered {
    record: ChargeRecord,
    fingerprint: Fingerprint,
    effect_index: usize,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Applied {
    /// A new effect.
    New(ChargeRecord),
    /// The key was known with the same request: the original record, no new effect.
    Replayed(ChargeRecord),
    /// The key was known with another request: refused, no effect.
    Mismatch { existing: ChargeRecord },
}

#[derive(Debug)]
pub(crate) struct Ledger {
    key_ttl: Duration,
    charges: HashMap<String, Remembered>,
    effects: Vec<Effect>,
    next_id: u64,
}

impl Ledger {
    pub(crate) fn new(key_ttl: Duration) -> Self {
        Self {
            key_ttl,
            charges: HashMap::new(),
            effects: Vec::new(),
            next_id: 1,
        }
    }

    fn is_forgotten(&self, remembered: &Remembered, now: OffsetDateTime) -> bool {
        remembered.record.applied_at + self.key_ttl <= now
    }

    /// Applies `amount` under `key`, idempotently per key (while the key is remembered).
    pub(crate) fn apply(
        &mut self,
        key: &str,
        amount: i64,
        request: &serde_json::Value,
        now: OffsetDateTime,
    ) -> Applied {
        let fingerprint = Fingerprint::of_json(request);
        if let Some(remembered) = self.charges.get(key)
            && self.is_forgotten(remembered, now)
        {
            self.charges.remove(key);
        }
        if let Some(remembered) = self.charges.get(key) {
            self.effects[remembered.effect_index].attempts += 1;
            if remembered.fingerprint != fingerprint {
                return Applied::Mismatch {
                    existing: remembered.record.clone(),
                };
            }
            return Applied::Replayed(remembered.record.clone());
        }
        let record = ChargeRecord {
            id: format!("ch_{:08}", self.next_id),
            key: key.to_owned(),
            amount,
            status: "succeeded",
            applied_at: now,
        };
        self.next_id += 1;
        self.effects.push(Effect {
            key: key.to_owned(),
            charge_id: record.id.clone(),
            amount,
            applied_at: now,
            attempts: 1,
        });
        self.charges.insert(
            key.to_owned(),
            Remembered {
                record: record.clone(),
                fingerprint,
                effect_index: self.effects.len() - 1,
            },
        );
        Applied::New(record)
    }

    /// The record for `key`, unless unknown or forgotten.
    pub(crate) fn lookup(&self, key: &str, now: OffsetDateTime) -> Option<ChargeRecord> {
        self.charges
            .get(key)
            .filter(|remembered| !self.is_forgotten(remembered, now))
            .map(|remembered| remembered.record.clone())
    }

    /// Drops keys past their TTL (the effect log stays).
    pub(crate) fn forget_expired(&mut self, now: OffsetDateTime) -> usize {
        let before = self.charges.len();
        let ttl = self.key_ttl;
        self.charges
            .retain(|_, remembered| remembered.record.applied_at + ttl > now);
        before - self.charges.len()
    }

    pub(crate) fn effects(&self) -> &[Effect] {
        &self.effects
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use time::macros::datetime;

    use super::*;

    const T0: OffsetDateTime = datetime!(2026-01-01 0:00 UTC);

    #[test]
    fn the_same_key_and_request_applies_once() {
        let mut ledger = Ledger::new(Duration::from_secs(60));
        let body = json!({"amount": 100, "currency": "EUR"});
        let first = ledger.apply("k1", 100, &body, T0);
        let Applied::New(record) = first else {
            panic!("first apply must be new: {first:?}")
        };
        // Field order does not make it another request.
        let same = json!({"currency": "EUR", "amount": 100});
        assert_eq!(
            ledger.apply("k1", 100, &same, T0 + Duration::from_secs(1)),
            Applied::Replayed(record.clone())
        );
        assert_eq!(ledger.effects().len(), 1);
        assert_eq!(ledger.effects()[0].attempts, 2);
        assert_eq!(ledger.lookup("k1", T0), Some(record));
        assert_eq!(ledger.lookup("k2", T0), None);
    }

    #[test]
    fn the_same_key_with_another_request_is_refused() {
        let mut ledger = Ledger::new(Duration::from_secs(60));
        ledger.apply("k1", 100, &json!({"amount": 100}), T0);
        assert!(matches!(
            ledger.apply("k1", 200, &json!({"amount": 200}), T0),
            Applied::Mismatch { .. }
        ));
        assert_eq!(ledger.effects().len(), 1);
        assert_eq!(ledger.effects()[0].amount, 100);
    }

    #[test]
    fn forgotten_keys_apply_again_and_the_log_shows_both() {
        let mut ledger = Ledger::new(Duration::from_secs(60));
        let body = json!({"amount": 5});
        ledger.apply("k1", 5, &body, T0);
        let later = T0 + Duration::from_secs(60);
        assert_eq!(ledger.lookup("k1", later), None);
        assert!(matches!(
            ledger.apply("k1", 5, &body, later),
            Applied::New(_)
        ));
        assert_eq!(
            ledger.effects().len(),
            2,
            "a forgotten key is a second charge"
        );
        assert_eq!(ledger.forget_expired(later + Duration::from_secs(60)), 1);
    }
}
