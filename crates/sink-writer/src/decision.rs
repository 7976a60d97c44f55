//! A batch from records to decisions, without I/O: which records are dead letters, which rows each
//! target gets, and — once the database has answered — the outcome of every record in every
//! target, with the conflict rows to keep.

use std::collections::{BTreeMap, HashMap};

use crate::batch_plan::{self, Candidate, Outcome, Stored};
use crate::mapping::{self, DecodedEvent, InputRecord, Position, Refusal, RowShape};
use crate::table_writer::{ConflictRow, LateRow, TargetWrite};
use crate::targets::TargetKind;

/// What a target contributes to the decision.
#[derive(Debug, Clone, Copy)]
pub struct TargetView<'a> {
    pub shape: &'a RowShape,
    pub kind: TargetKind,
}

/// The in-memory decision of a batch.
#[derive(Debug)]
pub struct BatchDecision {
    /// Per record: the decoded event, or `None` for a dead letter.
    pub events: Vec<Option<DecodedEvent>>,
    /// `(record, why)`, in record order.
    pub dead_letters: Vec<(usize, Refusal)>,
    /// Per target: its rows in record order.
    pub candidates: Vec<Vec<Candidate>>,
    /// Per target, per candidate: whether it is the row of its key that is sent.
    pub send: Vec<Vec<bool>>,
    /// Per target: records that do not apply to it (a versioned target, an event without version).
    pub skipped: Vec<u64>,
}

/// Decodes and maps every record, then picks each target's winners. `records` are in
/// consumption order.
pub fn decide(
    records: &[InputRecord],
    targets: &[TargetView<'_>],
    format: &mapping::EventFormat,
) -> BatchDecision {
    let mut events = Vec::with_capacity(records.len());
    let mut dead_letters = Vec::new();
    let mut candidates: Vec<Vec<Candidate>> = vec![Vec::new(); targets.len()];
    let mut skipped = vec![0; targets.len()];
    for (index, record) in records.iter().enumerate() {
        let event = match mapping::decode(record, format) {
            Ok(event) => event,
            Err(refusal) => {
                dead_letters.push((index, refusal));
                events.push(None);
                continue;
            }
        };
        let position = Position {
            topic: &record.topic,
            partition: record.partition,
            offset: record.offset,
            key: record.key.as_deref(),
        };
        let mapped: Result<Vec<Option<mapping::MappedRow>>, Refusal> = targets
            .iter()
            .map(|target| mapping::map_row(target.shape, &event, position))
            .collect();
        match mapped {
            Err(refusal) => {
                dead_letters.push((index, refusal));
                events.push(None);
            }
            Ok(rows) => {
                for (t, row) in rows.into_iter().enumerate() {
                    match row {
                        Some(row) => candidates[t].push(Candidate { record: index, row }),
                        None => skipped[t] += 1,
                    }
                }
                events.push(Some(event));
            }
        }
    }
    let send = targets
        .iter()
        .zip(&candidates)
        .map(|(target, candidates)| batch_plan::select_winners(target.kind, candidates))
        .collect();
    BatchDecision {
        events,
        dead_letters,
        candidates,
        send,
        skipped,
    }
}

/// Counts of one target's outcomes in one batch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TargetCounts {
    pub written: u64,
    pub duplicates: u64,
    pub conflicts: u64,
    pub stale: u64,
    pub skipped: u64,
    /// Winners another writer got in before (classified against what it stored).
    pub late: u64,
}

/// Every candidate's outcome, replayed in order against what was stored before the write.
pub fn outcomes(
    target: TargetView<'_>,
    candidates: &[Candidate],
    write: &TargetWrite,
) -> Vec<Outcome> {
    let stored: HashMap<usize, Stored> = write
        .stored
        .iter()
        .map(|(&i, row)| (i, row.stored.clone()))
        .collect();
    batch_plan::classify(target.kind, target.shape, candidates, &stored)
}

/// Winners expected to be written that the database did not apply: another writer stored the
/// key between this batch's read and its write.
pub fn late_winners(
    candidates: &[Candidate],
    send: &[bool],
    outcomes: &[Outcome],
    write: &TargetWrite,
) -> Vec<usize> {
    (0..candidates.len())
        .filter(|&i| {
            send[i]
                && outcomes[i] == Outcome::Written
                && !write.applied.contains(&candidates[i].row.key)
        })
        .collect()
}

/// Re-classifies the late winners against the row stored now.
pub fn settle_late(
    target: TargetView<'_>,
    candidates: &[Candidate],
    late: &[usize],
    stored_now: &HashMap<String, LateRow>,
    outcomes: &mut [Outcome],
) {
    for &i in late {
        let Some(row) = stored_now.get(&candidates[i].row.key) else {
            // Gone again (deleted concurrently): nothing of this record is stored; the row it
            // lost to is not there to compare with. Counted as stale, and logged by the caller.
            outcomes[i] = Outcome::Stale;
            continue;
        };
        outcomes[i] = match target.kind {
            TargetKind::Append => batch_plan::classify_late_append(row.content_differs),
            TargetKind::Versioned => {
                batch_plan::classify_late_versioned(row.same_version, row.content_differs)
            }
        };
    }
}

/// Counts and conflict rows of one target.
pub fn resolve(
    target: TargetView<'_>,
    candidates: &[Candidate],
    outcomes: &[Outcome],
    write: &TargetWrite,
    stored_now: &HashMap<String, LateRow>,
    records: &[InputRecord],
    events: &[Option<DecodedEvent>],
) -> (TargetCounts, Vec<ConflictRow>) {
    let mut counts = TargetCounts {
        late: stored_now.len() as u64,
        ..TargetCounts::default()
    };
    let mut conflicts = Vec::new();
    for (i, (candidate, outcome)) in candidates.iter().zip(outcomes).enumerate() {
        match outcome {
            Outcome::Written => counts.written += 1,
            Outcome::Duplicate => counts.duplicates += 1,
            Outcome::Stale => counts.stale += 1,
            Outcome::Conflict { earlier } => {
                counts.conflicts += 1;
                let Some(event) = events[candidate.record].as_ref() else {
                    continue;
                };
                let source = &records[candidate.record];
                let (stored_fingerprint, stored_row, detail) = match earlier {
                    Some(earlier) => (
                        events[*earlier].as_ref().map(|e| e.fingerprint.to_hex()),
                        None,
                        format!(
                            "an earlier record of the same batch ({}[{}]@{}) has the same key and \
                             other content",
                            records[*earlier].topic,
                            records[*earlier].partition,
                            records[*earlier].offset
                        ),
                    ),
                    None => match (write.stored.get(&i), stored_now.get(&candidate.row.key)) {
                        (Some(stored), _) => (
                            stored.fingerprint.clone(),
                            Some(stored.row.clone()),
                            "the stored row has the same key and other content".to_owned(),
                        ),
                        (None, Some(late)) => (
                            late.fingerprint.clone(),
                            Some(late.row.clone()),
                            "the row another writer stored meanwhile has the same key and other \
                             content"
                                .to_owned(),
                        ),
                        (None, None) => (None, None, "same key, other content".to_owned()),
                    },
                };
                let incoming = eos_core::fingerprint::canonical_json(&serde_json::Value::Object(
                    mapping::incoming_json(event),
                ));
                conflicts.push(ConflictRow {
                    target: target.shape.table.clone(),
                    key: candidate.row.key.clone(),
                    event_id: event.event_id.to_string(),
                    reason: match target.kind {
                        TargetKind::Append => "event_id_conflict".into(),
                        TargetKind::Versioned => "version_conflict".into(),
                    },
                    stored_fingerprint,
                    incoming_fingerprint: event.fingerprint.to_hex(),
                    stored_row,
                    incoming_record: (!incoming.contains("\\u0000")).then_some(incoming),
                    detail,
                    topic: source.topic.clone(),
                    partition: source.partition,
                    offset: source.offset,
                });
            }
        }
    }
    (counts, conflicts)
}

/// Per partition, the checkpoint after this batch: the last offset of the batch + 1.
pub fn next_offsets(records: &[InputRecord]) -> BTreeMap<i32, i64> {
    let mut next = BTreeMap::new();
    for record in records {
        let entry = next.entry(record.partition).or_insert(record.offset + 1);
        *entry = (*entry).max(record.offset + 1);
    }
    next
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;
    use crate::column_type::ColumnType;
    use crate::mapping::BoundColumn;
    use crate::table_writer::StoredRow;
    use crate::targets::Source;

    fn append_shape() -> RowShape {
        let ty = |name: &str| ColumnType::from_catalog(name, name, -1).expect("supported");
        RowShape {
            table: "event_sink".into(),
            columns: vec![
                BoundColumn {
                    name: "event_id".into(),
                    source: Source::EventId,
                    ty: ty("text"),
                    required: true,
                },
                BoundColumn {
                    name: "value".into(),
                    source: Source::Value,
                    ty: ty("int8"),
                    required: true,
                },
                BoundColumn {
                    name: "fingerprint".into(),
                    source: Source::Fingerprint,
                    ty: ty("text"),
                    required: true,
                },
                BoundColumn {
                    name: "source_offset".into(),
                    source: Source::KafkaOffset,
                    ty: ty("int8"),
                    required: false,
                },
            ],
            key_index: 0,
            version_index: None,
            content_indices: vec![2],
        }
    }

    fn record(offset: i64, value: &str) -> InputRecord {
        InputRecord {
            topic: "t".into(),
            partition: 0,
            offset,
            key: None,
            payload: Some(value.as_bytes().to_vec()),
            headers: Vec::new(),
            timestamp_ms: None,
            decoded: None,
        }
    }

    #[test]
    fn the_seed_practice_in_one_batch() {
        let shape = append_shape();
        let view = TargetView {
            shape: &shape,
            kind: TargetKind::Append,
        };
        let records = [
            record(0, r#"{"event_id":"e-102","entity_id":"17","value":12500}"#),
            record(1, r#"{"event_id":"e-102","entity_id":"17","value":12500}"#),
            record(2, r#"{"event_id":"e-103","entity_id":"28","value":7000}"#),
            record(3, r#"{"event_id":"e-102","entity_id":"17","value":99999}"#),
            record(4, "not json"),
        ];
        let decision = decide(&records, &[view], &mapping::EventFormat::ledger());
        assert_eq!(decision.dead_letters.len(), 1);
        assert_eq!(decision.dead_letters[0].0, 4);
        let candidates = &decision.candidates[0];
        assert_eq!(candidates.len(), 4);
        assert_eq!(decision.send[0], vec![true, false, true, false]);
        // The database already holds e-102 (same content as records 0 and 1) and inserts e-103.
        let stored = |differs| StoredRow {
            stored: Stored {
                version: None,
                differs,
            },
            row: "{}".into(),
            fingerprint: Some("stored".into()),
        };
        let write = TargetWrite {
            stored: HashMap::from([(0, stored(false)), (1, stored(false)), (3, stored(true))]),
            applied: HashSet::from(["e-103".to_owned()]),
        };
        let outcomes = outcomes(view, candidates, &write);
        assert!(late_winners(candidates, &decision.send[0], &outcomes, &write).is_empty());
        let (counts, conflicts) = resolve(
            view,
            candidates,
            &outcomes,
            &write,
            &HashMap::new(),
            &records,
            &decision.events,
        );
        assert_eq!(
            counts,
            TargetCounts {
                written: 1,
                duplicates: 2,
                conflicts: 1,
                ..TargetCounts::default()
            }
        );
        assert_eq!(conflicts.len(), 1);
        assert_eq!(conflicts[0].offset, 3);
        assert_eq!(conflicts[0].key, "e-102");
        assert_eq!(conflicts[0].stored_fingerprint.as_deref(), Some("stored"));
        assert_eq!(next_offsets(&records), BTreeMap::from([(0, 5)]));
    }
}
