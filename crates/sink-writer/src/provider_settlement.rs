//! Provider targets' side of a batch: every charge settled at dedup-service and the provider
//! before the database transaction that checkpoints the batch, and what the outcomes add to that
//! transaction (conflict rows, dead letters).

use std::collections::HashMap;

use metrics::counter;
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;
use tracing::warn;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use eos_core::DeadLetterReason;

use crate::decision::BatchDecision;
use crate::effect_results::ResultRow;
use crate::error::SinkError;
use crate::mapping::{DecodedEvent, InputRecord, Refusal};
use crate::metrics as m;
use crate::provider_target::{EffectItem, ProviderTarget, Settled};
use crate::table_writer::{ConflictRow, HeldRow};

/// What the provider targets add to a batch's transaction.
#[derive(Debug, Default)]
pub(crate) struct ProviderResults {
    pub(crate) conflicts: Vec<ConflictRow>,
    pub(crate) dead_letters: Vec<(usize, Refusal)>,
    /// Events whose operation is stuck UNKNOWN: neither charged nor refused, set aside.
    pub(crate) held: Vec<HeldRow>,
    /// Per provider target (in order): the rows of its results table, one per charged event.
    pub(crate) result_rows: Vec<Vec<ResultRow>>,
}

/// Every provider target's charges for the batch, settled before the transaction that
/// checkpoints them: a crash in between replays the batch, and dedup-service answers what
/// was done. Within the batch the first record of an event id leads; later ones are
/// duplicates (same fingerprint) or conflicts.
pub(crate) async fn settle(
    providers: &[ProviderTarget],
    shutdown: &CancellationToken,
    records: &[InputRecord],
    decision: &BatchDecision,
    spans: &[Option<tracing::Span>],
) -> Result<ProviderResults, SinkError> {
    let mut results = ProviderResults {
        result_rows: vec![Vec::new(); providers.len()],
        ..ProviderResults::default()
    };
    for (target_index, target) in providers.iter().enumerate() {
        let spec = target.spec();
        let mut leaders: HashMap<&str, usize> = HashMap::new();
        let mut items = Vec::new();
        let mut item_records = Vec::new();
        let mut followers = Vec::new();
        for (index, event) in decision.events.iter().enumerate() {
            let Some(event) = event else { continue };
            let event_id = event.event_id.as_str();
            if let Some(&leader) = leaders.get(event_id) {
                followers.push((index, leader));
                continue;
            }
            let request = match target.request(event) {
                Ok(request) => request,
                Err(detail) => {
                    results.dead_letters.push((
                        index,
                        Refusal {
                            reason: DeadLetterReason::MissingField,
                            detail,
                        },
                    ));
                    continue;
                }
            };
            leaders.insert(event_id, items.len());
            item_records.push(index);
            items.push(EffectItem {
                event_id: event_id.to_owned(),
                fingerprint: *event.fingerprint.as_bytes(),
                occurred_at: occurred_at(event, &records[index]),
                request,
                parent: spans[index]
                    .as_ref()
                    .map(OpenTelemetrySpanExt::context)
                    .unwrap_or_default(),
            });
        }
        if items.is_empty() {
            continue;
        }
        let fingerprints: Vec<[u8; 32]> = items.iter().map(|item| item.fingerprint).collect();
        let settled = target
            .settle(items, shutdown)
            .await
            .map_err(SinkError::Provider)?;
        let mut refusals: Vec<Option<Refusal>> = vec![None; settled.len()];
        let mut held_reasons: Vec<Option<String>> = vec![None; settled.len()];
        for (k, outcome) in settled.iter().enumerate() {
            let index = item_records[k];
            let record = &records[index];
            let Some(event) = &decision.events[index] else {
                continue;
            };
            let refusal = match outcome {
                Settled::Charged { result, .. } => {
                    if let Some(table) = target.results() {
                        let operation_id = spec.operation_id(event.event_id.as_str());
                        results.result_rows[target_index].push(table.row(
                            event.event_id.as_str(),
                            &operation_id,
                            result,
                        ));
                    }
                    None
                }
                // Nothing was applied and asking again would be refused again: the event
                // is accounted for as a dead letter, next to its FAILED intent.
                Settled::Rejected { reason } => {
                    warn!(
                        target = target.name(),
                        event_id = %event.event_id,
                        reason,
                        "provider rejected the charge; dead-lettered, FAILED at dedup-service"
                    );
                    Some(Refusal {
                        reason: DeadLetterReason::ProviderRejected,
                        detail: format!("provider target {}: not charged: {reason}", target.name()),
                    })
                }
                Settled::Conflict { stored_fingerprint } => {
                    results.conflicts.push(provider_conflict(
                        spec.operation_id(event.event_id.as_str()),
                        target.name(),
                        record,
                        event,
                        hex(stored_fingerprint),
                    ));
                    None
                }
                Settled::Held { reason } => {
                    results.held.push(held_row(
                        spec.operation_id(event.event_id.as_str()),
                        target.name(),
                        record,
                        event,
                        reason,
                    ));
                    held_reasons[k] = Some(reason.clone());
                    None
                }
                Settled::Expired => Some(Refusal {
                    reason: DeadLetterReason::BeyondDedupHorizon,
                    detail: format!(
                        "provider target {}: dedup-service answered EXPIRED (older than its \
                         retained window): not charged, since an earlier charge could not be \
                         recognised",
                        target.name()
                    ),
                }),
            };
            if let Some(refusal) = &refusal {
                results.dead_letters.push((index, refusal.clone()));
            }
            refusals[k] = refusal;
        }
        // A re-delivery in the same batch shares its leader's fate: a duplicate of a charge,
        // or a dead letter of its own when the leader was refused (as it would be in a later
        // batch, where dedup-service answers for it).
        for (index, leader) in followers {
            let Some(event) = &decision.events[index] else {
                continue;
            };
            let stored = fingerprints[leader];
            if *event.fingerprint.as_bytes() == stored {
                if let Some(refusal) = &refusals[leader] {
                    results.dead_letters.push((index, refusal.clone()));
                    continue;
                }
                if let Some(reason) = &held_reasons[leader] {
                    results.held.push(held_row(
                        spec.operation_id(event.event_id.as_str()),
                        target.name(),
                        &records[index],
                        event,
                        reason,
                    ));
                    continue;
                }
                counter!(m::PROVIDER_EFFECTS, "target" => target.name().to_owned(), "outcome" => "duplicate")
                    .increment(1);
            } else {
                results.conflicts.push(provider_conflict(
                    spec.operation_id(event.event_id.as_str()),
                    target.name(),
                    &records[index],
                    event,
                    hex(&stored),
                ));
            }
        }
    }
    results.dead_letters.sort_by_key(|(index, _)| *index);
    Ok(results)
}

fn occurred_at(event: &DecodedEvent, record: &InputRecord) -> OffsetDateTime {
    event
        .occurred_at
        .or_else(|| {
            record.timestamp_ms.and_then(|ms| {
                OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000).ok()
            })
        })
        .unwrap_or_else(OffsetDateTime::now_utc)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// An event set aside because its operation is stuck UNKNOWN at dedup-service.
fn held_row(
    operation_id: String,
    target: &str,
    record: &InputRecord,
    event: &DecodedEvent,
    reason: &str,
) -> HeldRow {
    HeldRow {
        target: target.to_owned(),
        operation_id,
        event_id: event.event_id.as_str().to_owned(),
        topic: record.topic.clone(),
        partition: record.partition,
        offset: record.offset,
        reason: reason.replace('\0', "\\0"),
    }
}

/// A reused event id at a provider target: the operation id is known with another fingerprint.
fn provider_conflict(
    operation_id: String,
    target: &str,
    record: &InputRecord,
    event: &DecodedEvent,
    stored_fingerprint: String,
) -> ConflictRow {
    ConflictRow {
        target: target.to_owned(),
        key: operation_id,
        event_id: event.event_id.as_str().to_owned(),
        reason: "operation_conflict".into(),
        stored_fingerprint: Some(stored_fingerprint),
        incoming_fingerprint: event.fingerprint.to_hex(),
        stored_row: None,
        incoming_record: serde_json::to_string(&event.raw)
            .ok()
            .filter(|json| !json.contains("\\u0000")),
        detail: "the provider operation of this event id was begun with other content; not \
                 charged again"
            .into(),
        topic: record.topic.clone(),
        partition: record.partition,
        offset: record.offset,
    }
}
