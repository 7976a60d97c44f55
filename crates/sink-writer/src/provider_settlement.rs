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

/// The batch as the provider targets read it.
#[derive(Clone, Copy)]
struct BatchView<'a> {
    records: &'a [InputRecord],
    decision: &'a BatchDecision,
    spans: &'a [Option<tracing::Span>],
}

/// One target's share of the batch: the first record of each event id (its leader) as an item
/// to settle, and the later ones (followers) with their leader's item.
struct TargetItems {
    items: Vec<EffectItem>,
    /// Per item: its record.
    item_records: Vec<usize>,
    /// `(record, leader item)`.
    followers: Vec<(usize, usize)>,
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
    let batch = BatchView {
        records,
        decision,
        spans,
    };
    let mut results = ProviderResults {
        result_rows: vec![Vec::new(); providers.len()],
        ..ProviderResults::default()
    };
    for (target_index, target) in providers.iter().enumerate() {
        let TargetItems {
            items,
            item_records,
            followers,
        } = target_items(target, batch, &mut results.dead_letters);
        if items.is_empty() {
            continue;
        }
        let fingerprints: Vec<[u8; 32]> = items.iter().map(|item| item.fingerprint).collect();
        let settled = target
            .settle(items, shutdown)
            .await
            .map_err(SinkError::Provider)?;
        let mut fates = Vec::with_capacity(settled.len());
        for (outcome, &index) in settled.iter().zip(&item_records) {
            let fate = match &decision.events[index] {
                Some(event) => {
                    let (record, at) = (&records[index], (target_index, target));
                    record_outcome(at, (record, event), outcome, &mut results)
                }
                None => Fate::Done,
            };
            if let Fate::Refused(refusal) = &fate {
                results.dead_letters.push((index, refusal.clone()));
            }
            fates.push(fate);
        }
        for (index, leader) in followers {
            if let Some(event) = &decision.events[index] {
                let leader = (&fates[leader], fingerprints[leader]);
                follow_leader(
                    target,
                    (&records[index], event, index),
                    leader,
                    &mut results,
                );
            }
        }
    }
    results.dead_letters.sort_by_key(|(index, _)| *index);
    Ok(results)
}

/// `target`'s items for the batch; an event its request cannot be made from (a missing field)
/// is a dead letter in `dead_letters`.
fn target_items(
    target: &ProviderTarget,
    batch: BatchView<'_>,
    dead_letters: &mut Vec<(usize, Refusal)>,
) -> TargetItems {
    let mut leaders: HashMap<&str, usize> = HashMap::new();
    let mut planned = TargetItems {
        items: Vec::new(),
        item_records: Vec::new(),
        followers: Vec::new(),
    };
    for (index, event) in batch.decision.events.iter().enumerate() {
        let Some(event) = event else { continue };
        let event_id = event.event_id.as_str();
        if let Some(&leader) = leaders.get(event_id) {
            planned.followers.push((index, leader));
            continue;
        }
        let request = match target.request(event) {
            Ok(request) => request,
            Err(detail) => {
                let reason = DeadLetterReason::MissingField;
                dead_letters.push((index, Refusal { reason, detail }));
                continue;
            }
        };
        leaders.insert(event_id, planned.items.len());
        planned.item_records.push(index);
        planned.items.push(EffectItem {
            event_id: event_id.to_owned(),
            fingerprint: *event.fingerprint.as_bytes(),
            occurred_at: occurred_at(event, &batch.records[index]),
            request,
            parent: batch.spans[index]
                .as_ref()
                .map(OpenTelemetrySpanExt::context)
                .unwrap_or_default(),
        });
    }
    planned
}

/// What became of a leader, for the records that follow it.
enum Fate {
    /// Charged, or a conflict: a follower with the same content is a duplicate.
    Done,
    /// Not charged, for good: a dead letter, and so is each follower.
    Refused(Refusal),
    /// Stuck UNKNOWN: held, and so is each follower.
    Held(String),
}

/// Adds what a leader's outcome puts in the batch's transaction to `results` (a results row, a
/// conflict row, a held row), and says what its followers share.
fn record_outcome(
    (target_index, target): (usize, &ProviderTarget),
    (record, event): (&InputRecord, &DecodedEvent),
    outcome: &Settled,
    results: &mut ProviderResults,
) -> Fate {
    let operation_id = || target.spec().operation_id(event.event_id.as_str());
    match outcome {
        Settled::Charged { result, .. } => {
            if let Some(table) = target.results() {
                let row = table.row(event.event_id.as_str(), &operation_id(), result);
                results.result_rows[target_index].push(row);
            }
            Fate::Done
        }
        // Nothing was applied and asking again would be refused again: the event is accounted
        // for as a dead letter, next to its FAILED intent.
        Settled::Rejected { reason } => {
            warn!(
                target = target.name(),
                event_id = %event.event_id,
                reason,
                "provider rejected the charge; dead-lettered, FAILED at dedup-service"
            );
            Fate::Refused(Refusal {
                reason: DeadLetterReason::ProviderRejected,
                detail: format!("provider target {}: not charged: {reason}", target.name()),
            })
        }
        Settled::Conflict { stored_fingerprint } => {
            let stored = hex(stored_fingerprint);
            let conflict = provider_conflict(operation_id(), target.name(), record, event, stored);
            results.conflicts.push(conflict);
            Fate::Done
        }
        Settled::Held { reason } => {
            let held = held_row(operation_id(), target.name(), record, event, reason);
            results.held.push(held);
            Fate::Held(reason.clone())
        }
        Settled::Expired => Fate::Refused(Refusal {
            reason: DeadLetterReason::BeyondDedupHorizon,
            detail: format!(
                "provider target {}: dedup-service answered EXPIRED (older than its retained \
                 window): not charged, since an earlier charge could not be recognised",
                target.name()
            ),
        }),
    }
}

/// A re-delivery in the same batch shares its leader's fate: a duplicate of a charge, or a dead
/// letter (or a held row) of its own when the leader was refused (or held), as it would be in a
/// later batch, where dedup-service answers for it. Other content under the id is a conflict.
fn follow_leader(
    target: &ProviderTarget,
    (record, event, index): (&InputRecord, &DecodedEvent, usize),
    (fate, stored): (&Fate, [u8; 32]),
    results: &mut ProviderResults,
) {
    let operation_id = target.spec().operation_id(event.event_id.as_str());
    if *event.fingerprint.as_bytes() != stored {
        let conflict = provider_conflict(operation_id, target.name(), record, event, hex(&stored));
        results.conflicts.push(conflict);
        return;
    }
    match fate {
        Fate::Refused(refusal) => results.dead_letters.push((index, refusal.clone())),
        Fate::Held(reason) => {
            let held = held_row(operation_id, target.name(), record, event, reason);
            results.held.push(held);
        }
        Fate::Done => {
            counter!(m::PROVIDER_EFFECTS, "target" => target.name().to_owned(), "outcome" => "duplicate")
                .increment(1);
        }
    }
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
