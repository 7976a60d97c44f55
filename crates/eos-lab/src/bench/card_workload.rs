//! The card-authorisations workload of `eos-lab bench processor --workload card-authorisations`,
//! next to eosctl's envelope workload ([`eosctl::workload`]), whose record type it shares.

use eos_runtime::trace_context::{self, EVENT_ID_HEADER};
use eosctl::workload::{GeneratedRecord, RecordKind, SendTrace, pad_string};
use opentelemetry::Context;
use opentelemetry::trace::TraceContextExt as _;
use rand::{Rng as _, SeedableRng as _};
use rand_chacha::ChaCha8Rng;
use time::format_description::well_known::Rfc3339;
use time::{Duration, OffsetDateTime};

/// Card authorisations for `eos-lab bench processor --workload card-authorisations`: the
/// events of the card-authorisations example (docs/TRANSFORMS.md), which its native Rust
/// transform and its WebAssembly modules both run. `count` distinct authorisations over `cards`
/// cards, amounts of 0.01 to 9.99 so that no card reaches its daily limit, one in a hundred of
/// 600.00 so that the flagged output is written too, padded by the merchant to `value_bytes`.
/// The id is in `/auth_id`, the card in `/card` and the time in `/at`.
pub fn card_authorisations(
    seed: u64,
    count: u64,
    cards: u32,
    value_bytes: usize,
    at_base: OffsetDateTime,
) -> Vec<GeneratedRecord> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..count)
        .map(|sequence| {
            let card = format!("card-{}", rng.random_range(0..cards.max(1)));
            let auth_id = format!("auth-{seed:x}-{sequence}");
            let cents: i64 = if rng.random_ratio(1, 100) {
                60_000
            } else {
                rng.random_range(1..1_000)
            };
            let at = at_base
                .checked_add(Duration::milliseconds(
                    i64::try_from(sequence).unwrap_or(i64::MAX),
                ))
                .unwrap_or(at_base)
                .format(&Rfc3339)
                .unwrap_or_default();
            let build = |merchant: &str| {
                serde_json::json!({
                    "auth_id": auth_id,
                    "card": card,
                    "amount": format!("{}.{:02}", cents / 100, cents % 100),
                    "currency": "EUR",
                    "merchant": merchant,
                    "at": at,
                })
                .to_string()
            };
            let bare = build("");
            let merchant = pad_string(rng.random(), value_bytes.saturating_sub(bare.len()));
            let send = SendTrace::random(&mut rng);
            let cx = Context::new().with_remote_span_context(send.span_context());
            let cx = trace_context::context_with_event_id(&cx, &auth_id);
            let mut headers: Vec<(&'static str, Vec<u8>)> = trace_context::context_headers(&cx)
                .into_iter()
                .map(|(key, value)| (key, value.into_bytes()))
                .collect();
            headers.push((EVENT_ID_HEADER, auth_id.clone().into_bytes()));
            GeneratedRecord {
                key: card.clone().into_bytes(),
                value: build(&merchant).into_bytes(),
                headers,
                kind: RecordKind::Logical {
                    sequence,
                    value: cents,
                },
                send,
            }
        })
        .collect()
}
