//! Test helpers: record builders and a reference processor that does exactly what the audit
//! expects of a correct exactly-once processor, so tests can start from a passing result and
//! break one thing at a time.

use std::collections::{BTreeMap, HashMap};

use eos_core::dead_letter::{
    DETAIL_HEADER, REASON_HEADER, SOURCE_OFFSET_HEADER, SOURCE_PARTITION_HEADER,
    SOURCE_TOPIC_HEADER,
};
use eos_core::redrive::REDRIVE_ID_HEADER;
use eos_core::{DeadLetterReason, Event, EventContract, EventEnvelope, Fingerprint, RecordParts};
use serde_json::{Value, json};

use crate::audit::{ENTITY_COUNT_FIELD, ENTITY_TOTAL_FIELD, SOURCE_FIELD};
use crate::source_record::SourceRecord;
use crate::workload::Workload;

pub(crate) const INPUT: &str = "payments";
pub(crate) const OUTPUT: &str = "ledger";
pub(crate) const DLQ: &str = "payments.dlq";

pub(crate) fn record(topic: &str, partition: i32, offset: i64, value: &[u8]) -> SourceRecord {
    SourceRecord {
        topic: topic.to_owned(),
        partition,
        offset,
        key: None,
        value: Some(value.to_vec()),
        headers: Vec::new(),
        timestamp_ms: None,
        decoding: Default::default(),
    }
}

/// A minimal valid envelope.
pub(crate) fn envelope(event_id: &str, entity_id: &str, value: i64) -> Vec<u8> {
    json!({"event_id": event_id, "entity_id": entity_id, "value": value})
        .to_string()
        .into_bytes()
}

/// Appends inputs to partitions, giving each the next offset there.
#[derive(Debug, Default)]
pub(crate) struct InputLog {
    pub(crate) records: Vec<SourceRecord>,
    next: BTreeMap<i32, i64>,
}

impl InputLog {
    pub(crate) fn push(&mut self, partition: i32, value: &[u8]) -> &mut Self {
        let offset = self.next.entry(partition).or_default();
        self.records.push(record(INPUT, partition, *offset, value));
        *offset += 1;
        self
    }
}

/// The workload's records, partitioned by key the way a keyed producer would (any stable
/// function of the key keeps an entity in one partition, which is all the audit relies on).
pub(crate) fn workload_input(workload: Workload, partitions: i32) -> Vec<SourceRecord> {
    let mut log = InputLog::default();
    for generated in workload {
        let hash = generated
            .key
            .iter()
            .fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(*b)));
        let partition = i32::try_from(hash % partitions.unsigned_abs()).unwrap_or(0);
        log.push(partition, &generated.value);
        if let Some(last) = log.records.last_mut() {
            last.key = Some(generated.key.clone());
            last.headers = generated
                .headers
                .iter()
                .map(|(k, v)| ((*k).to_owned(), Some(v.clone())))
                .collect();
        }
    }
    log.records
}

#[derive(Debug, Default, Clone)]
pub(crate) struct Processed {
    pub(crate) output: Vec<SourceRecord>,
    pub(crate) dlq: Vec<SourceRecord>,
}

impl Processed {
    pub(crate) fn dlq_record(
        &mut self,
        source: &SourceRecord,
        reason: DeadLetterReason,
    ) -> &mut SourceRecord {
        let offset = self.dlq.len() as i64;
        let mut dead = record(DLQ, 0, offset, source.value_bytes());
        dead.headers = vec![
            (REASON_HEADER.to_owned(), Some(reason.as_str().into())),
            (DETAIL_HEADER.to_owned(), Some(b"test".to_vec())),
            (
                SOURCE_TOPIC_HEADER.to_owned(),
                Some(source.topic.clone().into()),
            ),
            (
                SOURCE_PARTITION_HEADER.to_owned(),
                Some(source.partition.to_string().into()),
            ),
            (
                SOURCE_OFFSET_HEADER.to_owned(),
                Some(source.offset.to_string().into()),
            ),
        ];
        self.dlq.push(dead);
        let last = self.dlq.len() - 1;
        &mut self.dlq[last]
    }

    /// Appends an output record with the next offset of `partition`.
    pub(crate) fn push_output(&mut self, partition: i32, value: Vec<u8>) {
        let offset = self
            .output
            .iter()
            .filter(|r| r.partition == partition)
            .count() as i64;
        self.output.push(record(OUTPUT, partition, offset, &value));
    }
}

/// The output value a correct processor writes for `source`, given the entity's new totals.
pub(crate) fn output_value(
    envelope: &EventEnvelope,
    source: &SourceRecord,
    count: u64,
    total: i64,
) -> Vec<u8> {
    let mut object = envelope.to_json();
    object.insert(ENTITY_TOTAL_FIELD.to_owned(), Value::from(total));
    object.insert(ENTITY_COUNT_FIELD.to_owned(), Value::from(count));
    object.insert(
        SOURCE_FIELD.to_owned(),
        json!({"topic": source.topic, "partition": source.partition, "offset": source.offset}),
    );
    Value::Object(object).to_string().into_bytes()
}

/// A correct processor: partitions in order, records in offset order, one dedup store keyed by
/// event id, outputs to the same partition number with running totals, everything else to the DLQ
/// — an event that would overflow its entity's total too, which then stays as it was. An event's
/// outcome is final (as eos-processor's): a record the ledger refuses is remembered by its id
/// when the ledger's contract reads one, and a later record of an id is a duplicate or a conflict
/// of its first, whatever that became — unless it is a re-drive (`eos-redrive-id`) of a refused
/// event with an id the event has not met.
pub(crate) fn reference_process(input: &[SourceRecord]) -> Processed {
    #[derive(Clone, Copy, PartialEq, Eq)]
    enum Content {
        Envelope(Fingerprint),
        Refused(Fingerprint),
    }
    struct Seen {
        content: Content,
        applied: bool,
        redrives: Vec<String>,
    }
    let mut sorted: Vec<&SourceRecord> = input.iter().collect();
    sorted.sort_by_key(|r| r.position());
    let mut seen: HashMap<String, Seen> = HashMap::new();
    let mut totals: HashMap<String, (u64, i64)> = HashMap::new();
    let mut processed = Processed::default();
    for source in sorted {
        let (event_id, content, envelope) = match EventEnvelope::parse(source.value_bytes()) {
            Ok(envelope) => (
                envelope.event_id.to_string(),
                Content::Envelope(envelope.fingerprint()),
                Ok(envelope),
            ),
            Err(error) => match contract_event(source) {
                Some((event_id, fingerprint)) => {
                    (event_id, Content::Refused(fingerprint), Err(error.reason()))
                }
                None => {
                    processed.dlq_record(source, error.reason());
                    continue;
                }
            },
        };
        let redrive = source.last_header_str(REDRIVE_ID_HEADER).map(str::to_owned);
        let mut redrives = Vec::new();
        if let Some(first) = seen.get_mut(&event_id) {
            if first.content != content {
                processed.dlq_record(source, DeadLetterReason::EventIdConflict);
                continue;
            }
            let admitted = redrive
                .as_ref()
                .is_some_and(|id| !first.applied && !first.redrives.contains(id));
            if !admitted {
                continue;
            }
            redrives = std::mem::take(&mut first.redrives);
        }
        redrives.extend(redrive);
        let applied = match envelope {
            Err(reason) => {
                processed.dlq_record(source, reason);
                false
            }
            Ok(envelope) => {
                let entry = totals.entry(envelope.entity_id.to_string()).or_default();
                match entry.1.checked_add(envelope.value) {
                    None => {
                        processed.dlq_record(source, DeadLetterReason::TotalOverflow);
                        false
                    }
                    Some(total) => {
                        entry.0 += 1;
                        entry.1 = total;
                        let value = output_value(&envelope, source, entry.0, entry.1);
                        processed.push_output(source.partition, value);
                        true
                    }
                }
            }
        };
        seen.insert(
            event_id,
            Seen {
                content,
                applied,
                redrives,
            },
        );
    }
    processed
}

/// The id and fingerprint the ledger's contract reads from `record`, if it reads one.
fn contract_event(record: &SourceRecord) -> Option<(String, Fingerprint)> {
    let headers: Vec<(&str, Option<&[u8]>)> = record
        .headers
        .iter()
        .map(|(name, value)| (name.as_str(), value.as_deref()))
        .collect();
    let event = Event::parse(
        &EventContract::ledger(),
        RecordParts {
            key: record.key.as_deref(),
            value: record.value.as_deref(),
            headers: &headers,
        },
    )
    .ok()?;
    Some((event.id.to_string(), event.fingerprint))
}
