//! Card authorisations on eos-processor: an example of your own events and your own logic
//! (docs/TRANSFORMS.md walks through it).
//!
//! The events are the team's own, not the suite's ledger envelope:
//!
//! ```json
//! {"auth_id": "a-1", "card": "c-7", "amount": "12.50", "currency": "EUR",
//!  "merchant": "m-1", "at": "2026-12-04T10:00:00Z"}
//! ```
//!
//! The id is at `/auth_id`, the entity (whose events are ordered and whose state is kept) at
//! `/card`, the event time at `/at`. Per card and UTC day the transform keeps what was spent in
//! each currency, in minor units. An authorisation that would take the day's spend in its currency
//! above the daily limit is refused (dead letter `transform_refused`, reason `over_daily_limit`);
//! every other one is approved to the default output, and one of at least the flag threshold goes
//! to the `flagged` output as well, in the same transaction. Amounts are decimal strings and are
//! never turned into floats.

use std::collections::BTreeMap;

use eos_core::{Event, EventContract, FieldLocation};
use eos_processor::{Config, Output, Processor, Refusal, SourcePosition, Transform};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

/// The output flagged authorisations go to (`--output flagged=TOPIC`).
pub const FLAGGED_OUTPUT: &str = "flagged";

/// The command line: the processor's flags plus the example's own.
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "card-authorisations", version, about, long_about = None)]
pub struct Args {
    /// The processor's flags (topics, group, guarantee, where events are read).
    #[command(flatten)]
    pub processor: Config,

    /// Most a card may spend per UTC day in one currency, as a decimal ("1000.00").
    #[arg(long, env = "CARD_DAILY_LIMIT", default_value = "1000.00", value_parser = minor_units)]
    pub daily_limit: i64,

    /// Authorisations of at least this amount also go to the flagged output.
    #[arg(long, env = "CARD_FLAG_AT", default_value = "500.00", value_parser = minor_units)]
    pub flag_at: i64,
}

impl Args {
    /// Runs the processor with [`CardAuthorisations`] until `shutdown`.
    pub async fn run(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let transform = CardAuthorisations {
            daily_limit: self.daily_limit,
            flag_at: self.flag_at,
        };
        Processor::new(self.processor, transform)
            .run(shutdown)
            .await
    }
}

/// The transform: per-card daily spend, over-limit refusals, approved and flagged outputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CardAuthorisations {
    /// Daily limit per currency, in minor units.
    pub daily_limit: i64,
    /// Flag threshold, in minor units.
    pub flag_at: i64,
}

/// A card's state: the UTC day of its latest authorisation and what was spent that day.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CardDay {
    /// `YYYY-MM-DD`.
    pub day: String,
    /// Currency → minor units spent that day.
    pub spent: BTreeMap<String, i64>,
}

impl Transform for CardAuthorisations {
    type State = CardDay;

    fn contract(&self) -> EventContract {
        EventContract {
            event_id: FieldLocation::Pointer("/auth_id".to_owned()),
            entity: FieldLocation::Pointer("/card".to_owned()),
            occurred_at: Some("/at".to_owned()),
            ..EventContract::default()
        }
    }

    fn outputs(&self) -> Vec<String> {
        vec![FLAGGED_OUTPUT.to_owned()]
    }

    fn apply(
        &self,
        card: &mut CardDay,
        event: Event,
        _source: &SourcePosition,
    ) -> Result<Vec<Output>, Refusal> {
        let amount_text = event.value.get("amount").and_then(Value::as_str);
        let amount = amount_text
            .and_then(|text| minor_units(text).ok())
            .ok_or_else(|| {
                Refusal::new(
                    "invalid_amount",
                    format!("amount {amount_text:?} is not a decimal string with up to 2 places"),
                )
            })?;
        let currency = event
            .value
            .get("currency")
            .and_then(Value::as_str)
            .filter(|c| c.len() == 3 && c.bytes().all(|b| b.is_ascii_uppercase()))
            .ok_or_else(|| Refusal::new("invalid_currency", "currency is not an ISO 4217 code"))?
            .to_owned();
        // The day comes from the event, never from the clock: a replay computes the same.
        let at = event
            .occurred_at
            .ok_or_else(|| Refusal::new("missing_time", "the authorisation has no /at"))?;
        let day = at.to_offset(time::UtcOffset::UTC).date().to_string();
        if card.day != day {
            card.day = day;
            card.spent.clear();
        }
        let spent = card.spent.get(&currency).copied().unwrap_or_default();
        let after = spent
            .checked_add(amount)
            .filter(|after| *after <= self.daily_limit)
            .ok_or_else(|| {
                Refusal::new(
                    "over_daily_limit",
                    format!(
                        "card {} would spend {} {currency} on {}, over its daily limit of {}",
                        event.entity,
                        decimal(spent.saturating_add(amount)),
                        card.day,
                        decimal(self.daily_limit)
                    ),
                )
            })?;
        card.spent.insert(currency.clone(), after);

        let mut outputs = Vec::with_capacity(2);
        if amount >= self.flag_at {
            outputs.push(
                Output::new(
                    FLAGGED_OUTPUT,
                    json!({
                        "auth_id": event.id.as_str(),
                        "card": event.entity.as_str(),
                        "amount": amount_text,
                        "currency": currency,
                        "reason": "large_amount",
                    }),
                )
                .with_header("eos-flag", "large_amount"),
            );
        }
        let mut approved = event.value;
        approved.insert("status".into(), "approved".into());
        approved.insert("day_spent".into(), decimal(after).into());
        outputs.push(Output::to_default(approved));
        Ok(outputs)
    }
}

/// `"12.50"` → 1250: digits, optionally a point and one or two more digits; no sign, no
/// exponent, nothing past an `i64`.
pub fn minor_units(text: &str) -> Result<i64, String> {
    let invalid = || format!("{text:?} is not an amount such as 12.50");
    let (units, cents) = text.split_once('.').unwrap_or((text, ""));
    let digits = |part: &str| !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit());
    if !digits(units) || (text.contains('.') && (!digits(cents) || cents.len() > 2)) {
        return Err(invalid());
    }
    let cents: i64 = match cents.len() {
        0 => 0,
        1 => cents.parse::<i64>().map_err(|_| invalid())? * 10,
        _ => cents.parse().map_err(|_| invalid())?,
    };
    units
        .parse::<i64>()
        .ok()
        .and_then(|units| units.checked_mul(100))
        .and_then(|minor| minor.checked_add(cents))
        .ok_or_else(invalid)
}

/// 1250 → `"12.50"`.
pub fn decimal(minor: i64) -> String {
    let sign = if minor < 0 { "-" } else { "" };
    let minor = minor.unsigned_abs();
    format!("{sign}{}.{:02}", minor / 100, minor % 100)
}

#[cfg(test)]
mod tests {
    use super::*;
    use eos_core::RecordParts;

    const CARDS: CardAuthorisations = CardAuthorisations {
        daily_limit: 100_000,
        flag_at: 50_000,
    };

    fn event(id: &str, amount: &str, currency: &str, at: &str) -> Event {
        let value = json!({
            "auth_id": id, "card": "c-7", "amount": amount, "currency": currency,
            "merchant": "m-1", "at": at,
        })
        .to_string();
        Event::parse(
            &CARDS.contract(),
            RecordParts {
                key: Some(b"c-7"),
                value: Some(value.as_bytes()),
                headers: &[],
            },
        )
        .expect("an authorisation")
    }

    fn source() -> SourcePosition {
        SourcePosition {
            topic: "auths".into(),
            partition: 0,
            offset: 0,
        }
    }

    #[test]
    fn amounts_are_exact_minor_units() {
        for (text, minor) in [("12.50", 1250), ("12.5", 1250), ("12", 1200), ("0.07", 7)] {
            assert_eq!(minor_units(text), Ok(minor), "{text}");
            assert_eq!(minor_units(&decimal(minor)), Ok(minor));
        }
        for bad in [
            "",
            ".5",
            "1.",
            "1.234",
            "-1",
            "+1",
            "1e3",
            "1,50",
            "99999999999999999999",
        ] {
            assert!(minor_units(bad).is_err(), "{bad}");
        }
        assert_eq!(decimal(-1250), "-12.50");
    }

    #[test]
    fn a_day_s_spend_is_approved_up_to_the_limit_and_large_ones_flagged() {
        let mut card = CardDay::default();
        let day = "2026-12-04T10:00:00Z";
        let outputs = CARDS
            .apply(&mut card, event("a-1", "600.00", "EUR", day), &source())
            .expect("approved");
        assert_eq!(outputs.len(), 2, "approved and flagged");
        assert_eq!(outputs[0].output, FLAGGED_OUTPUT);
        assert_eq!(outputs[0].value["reason"], "large_amount");
        assert_eq!(outputs[1].output, eos_processor::DEFAULT_OUTPUT);
        assert_eq!(outputs[1].value["day_spent"], "600.00");
        assert_eq!(outputs[1].value["merchant"], "m-1");
        // Another currency has a limit of its own.
        assert!(
            CARDS
                .apply(&mut card, event("a-2", "900.00", "USD", day), &source())
                .is_ok()
        );
        // Over the limit: refused with the example's own reason, the state unchanged.
        let before = card.clone();
        let refusal = CARDS
            .apply(&mut card, event("a-3", "400.01", "EUR", day), &source())
            .expect_err("over the limit");
        assert_eq!(refusal.code.as_deref(), Some("over_daily_limit"));
        assert!(refusal.detail.contains("1000.01 EUR"), "{refusal}");
        assert_eq!(card, before);
        // Exactly up to it: approved, not flagged.
        let outputs = CARDS
            .apply(&mut card, event("a-4", "400.00", "EUR", day), &source())
            .expect("approved");
        assert_eq!(outputs.len(), 1);
        assert_eq!(outputs[0].value["day_spent"], "1000.00");
        // Half past midnight in Paris is still the same UTC day: over the limit.
        let refusal = CARDS
            .apply(
                &mut card,
                event("a-5", "10.00", "EUR", "2026-12-05T00:30:00+01:00"),
                &source(),
            )
            .expect_err("the same UTC day");
        assert_eq!(refusal.code.as_deref(), Some("over_daily_limit"));
        // A new UTC day starts from nothing.
        let outputs = CARDS
            .apply(
                &mut card,
                event("a-6", "10.00", "EUR", "2026-12-05T01:00:00Z"),
                &source(),
            )
            .expect("a new day");
        assert_eq!(outputs[0].value["day_spent"], "10.00");
        assert_eq!(card.day, "2026-12-05");
        assert_eq!(card.spent.len(), 1, "yesterday's currencies are gone");
    }

    #[test]
    fn bad_fields_are_refused_with_their_own_reasons() {
        for (amount, currency, code) in [
            ("12,50", "EUR", "invalid_amount"),
            ("12.50", "eur", "invalid_currency"),
        ] {
            let refusal = CARDS
                .apply(
                    &mut CardDay::default(),
                    event("a-1", amount, currency, "2026-12-04T10:00:00Z"),
                    &source(),
                )
                .expect_err(code);
            assert_eq!(refusal.code.as_deref(), Some(code));
        }
    }
}
