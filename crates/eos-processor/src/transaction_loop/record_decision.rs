//! The decision on one polled record, into the open batch: its `process` span (a child of the
//! trace context its headers carry, docs/architecture/event-path.md "The path of one event"), the
//! sweep of dedup ids past the horizon, the batch's commit deadline ("Latency"), and the outputs or
//! the dead letter the decision makes. The decision itself is `partition_state.rs`'s, pure.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::time::{Duration, Instant};

use opentelemetry::trace::TraceContextExt as _;
use rdkafka::message::{Header, Headers, Message, OwnedHeaders, OwnedMessage};
use tracing::{debug, info, info_span, warn};
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use eos_core::DeadLetterReason;
use eos_runtime::backoff::{self, BackoffBuilder as _};
use eos_runtime::trace_context;
use eos_runtime::transactional_producer::PendingRecord;
use rdkafka::consumer::Consumer as _;
use tokio_util::sync::CancellationToken;

use super::TransactionLoop;
use crate::dead_letter_record::dead_letter_record;
use crate::error::ProcessorError;
use crate::partition_state::{Decision, EXPIRY_SWEEP_MAX, InputRecord, Overlay, PartitionState};
use crate::transform::{SourcePosition, Transform};

/// How often committed ids past the horizon are swept into tombstones, per partition. A sweep
/// reads only the expired end of the store's expiry index, so it can be frequent.
const EXPIRY_SWEEP_INTERVAL: Duration = Duration::from_secs(1);

/// The first wait before asking an unreachable schema registry again; the waits double to
/// [`REGISTRY_RETRY_MAX`].
const REGISTRY_RETRY_FIRST: Duration = Duration::from_millis(200);
const REGISTRY_RETRY_MAX: Duration = Duration::from_secs(10);

impl<T: Transform> TransactionLoop<T> {
    /// `message` when it can be decided now: once the schema it names is at hand (always, for
    /// plain JSON). While the schema registry cannot answer, the record waits and is never
    /// skipped (docs/schemas.md "When the registry cannot answer"): it is held, the open batch
    /// commits without it (no transaction stays open through the outage, and no position passes
    /// a held record), the assignment is paused, and the loop goes on polling (the group keeps
    /// this instance; rebalances are handled) while it asks again with backoff, shown as an
    /// outage on the progress watch. `None` when the record is held: the loop takes it, and
    /// anything polled meanwhile, from [`TransactionLoop::held`] before polling again.
    pub(super) fn schema_at_hand(
        &mut self,
        message: OwnedMessage,
        shutdown: &CancellationToken,
    ) -> Result<Option<OwnedMessage>, ProcessorError> {
        let Err(mut error) = self.input.prepare(message.payload()) else {
            return Ok(Some(message));
        };
        let (topic, partition, offset) = (
            message.topic().to_owned(),
            message.partition(),
            message.offset(),
        );
        self.held.push_front(message);
        self.finish_batch()?;
        self.consumer.pause(&self.consumer.assignment()?)?;
        let mut delays = backoff::doubling(REGISTRY_RETRY_FIRST, REGISTRY_RETRY_MAX).build();
        loop {
            self.progress.waiting_for_outage("the schema registry");
            let delay = delays.next().unwrap_or(REGISTRY_RETRY_MAX);
            warn!(
                topic,
                partition,
                offset,
                %error,
                retry_in = ?delay,
                "the schema registry cannot answer: the record waits, nothing is skipped"
            );
            let waited_until = Instant::now() + delay;
            while Instant::now() < waited_until && !shutdown.is_cancelled() {
                let wait = waited_until
                    .saturating_duration_since(Instant::now())
                    .min(Duration::from_millis(200));
                // Only a partition assigned in this poll can deliver before it is paused below.
                if let Some(Ok(early)) = self.consumer.poll(wait) {
                    self.held.push_back(early.detach());
                }
                self.handle_rebalance_events()?;
                self.consumer.pause(&self.consumer.assignment()?)?;
            }
            if shutdown.is_cancelled() {
                return Ok(None);
            }
            let Some(waiting) = self.held.front() else {
                // Its partition was revoked: its new owner reads it.
                break;
            };
            match self.input.prepare(waiting.payload()) {
                Ok(()) => break,
                Err(again) => error = again,
            }
        }
        info!(
            topic,
            partition, offset, "the schema registry answered: reading goes on"
        );
        self.consumer.resume(&self.consumer.assignment()?)?;
        Ok(None)
    }

    /// Decides one polled record into the open batch: its outputs or its dead letter join the
    /// batch's records, its state change the partition's overlay, its offset the positions.
    pub(super) fn decide(&mut self, message: &OwnedMessage) -> Result<(), ProcessorError> {
        let partition = message.partition();
        let Some(state) = self.states.get(partition) else {
            // Only possible for a partition revoked in the same poll; its new owner reads it.
            debug!(
                partition,
                offset = message.offset(),
                "record of an unowned partition skipped"
            );
            return Ok(());
        };
        let now = time::OffsetDateTime::now_utc().unix_timestamp();
        let batch = &mut self.batch;
        batch.set_due_once(|| {
            batch_deadline(
                Instant::now(),
                record_age(message.timestamp()),
                self.settings.commit_interval,
            )
        });
        let overlay = partition_overlay(
            batch.overlays_mut(),
            &mut self.last_sweep,
            state,
            partition,
            now,
        )?;
        let source = SourcePosition {
            topic: message.topic().to_owned(),
            partition,
            offset: message.offset(),
        };
        let event_id_header = message
            .headers()
            .and_then(trace_context::event_id_header)
            .unwrap_or_default()
            .to_owned();
        // The event id as baggage too, so the output's headers carry it to the next service even
        // when the producer sent no baggage.
        let parent = message
            .headers()
            .map(trace_context::extract_kafka)
            .unwrap_or_default();
        let parent = if event_id_header.is_empty() {
            parent
        } else {
            trace_context::context_with_event_id(&parent, &event_id_header)
        };
        let span = process_span(&source, &self.settings.group_id);
        let _ = span.set_parent(parent.clone());
        let headers: Vec<(&str, Option<&[u8]>)> = message
            .headers()
            .map(|headers| {
                headers
                    .iter()
                    .map(|header| (header.key, header.value))
                    .collect()
            })
            .unwrap_or_default();
        let decision = match self.input.decode(message.payload()) {
            Ok(decoded) => {
                let record = InputRecord {
                    key: message.key(),
                    value: decoded.as_ref().map(|decoded| decoded.value.as_ref()),
                    headers: &headers,
                    timestamp_secs: message.timestamp().to_millis().unwrap_or(0) / 1000,
                    content: decoded
                        .as_ref()
                        .and_then(|decoded| decoded.content.as_deref()),
                };
                state.decide(
                    overlay,
                    &self.transform,
                    record,
                    &source,
                    now,
                    &self.settings.policy,
                )?
            }
            // No event to judge, so nothing to remember: as a record that is not JSON.
            Err(detail) => Decision::DeadLetter {
                reason: DeadLetterReason::UndecodableRecord,
                code: None,
                detail,
                event_id: None,
            },
        };
        // Nothing of an interrupted call joins the batch: it decided nothing.
        if self.transform.interrupted() {
            return Err(ProcessorError::Interrupted);
        }
        self.join_batch(message, decision, &span, parent, &event_id_header)
    }

    /// What `decision` makes of `message` joins the open batch: its position, its span's link,
    /// and its outputs, its dead letter or its count as a duplicate.
    fn join_batch(
        &mut self,
        message: &OwnedMessage,
        decision: Decision,
        span: &tracing::Span,
        parent: opentelemetry::Context,
        event_id_header: &str,
    ) -> Result<(), ProcessorError> {
        let (partition, offset) = (message.partition(), message.offset());
        let batch = &mut self.batch;
        batch.read(
            partition,
            offset,
            span.context().span().span_context().clone(),
        );
        let decided_id = match &decision {
            Decision::Emit { event_id, .. } | Decision::Duplicate { event_id } => Some(event_id),
            Decision::DeadLetter { event_id, .. } => event_id.as_ref(),
        };
        if let Some(event_id) = decided_id.filter(|id| !id.is_empty()) {
            span.record("event_id", event_id.as_str());
        } else if !event_id_header.is_empty() {
            span.record("event_id", event_id_header);
        }
        match decision {
            Decision::Emit {
                event_id,
                entity_id,
                outputs,
                redrive,
            } => {
                span.record("eos.decision", "emit");
                if let Some(redrive) = &redrive {
                    // An operator's act: the event was dead-lettered before and is judged again.
                    info!(
                        event_id,
                        redrive,
                        partition,
                        offset,
                        outputs = outputs.len(),
                        "re-driven event applied"
                    );
                }
                // Without an exporter the span has no context of its own: pass the input's on.
                let span_cx = span.context();
                let cx = if span_cx.span().span_context().is_valid() {
                    span_cx
                } else {
                    parent
                };
                let emitted = Emitted {
                    event_id: &event_id,
                    entity_id: &entity_id,
                    redrive: redrive.as_deref(),
                };
                self.push_outputs(&emitted, outputs, &cx)?;
            }
            Decision::Duplicate { event_id } => {
                span.record("eos.decision", "duplicate");
                debug!(event_id, partition, offset, "duplicate delivery dropped");
                batch.count_duplicate();
            }
            Decision::DeadLetter {
                reason,
                code,
                detail,
                event_id,
            } => {
                span.record("eos.decision", "dead_letter");
                self.push_dead_letter(
                    message,
                    (reason, code.as_deref()),
                    &detail,
                    event_id.as_deref(),
                );
            }
        }
        Ok(())
    }

    /// An emitted event's outputs into the batch, each to its output's topic, in its format,
    /// with the trace context, the event id and (for a re-drive) its id in the headers.
    fn push_outputs(
        &mut self,
        emitted: &Emitted<'_>,
        outputs: Vec<crate::transform::Output>,
        cx: &opentelemetry::Context,
    ) -> Result<(), ProcessorError> {
        let Emitted {
            event_id,
            entity_id,
            redrive,
        } = *emitted;
        let cx = trace_context::context_with_event_id(cx, event_id);
        for output in outputs {
            let mut headers = OwnedHeaders::new_with_capacity(output.headers.len() + 4);
            for (key, value) in &output.headers {
                headers = headers.insert(Header {
                    key,
                    value: Some(value),
                });
            }
            let mut headers =
                trace_context::with_event_id(trace_context::inject_kafka(&cx, headers), event_id);
            // Which re-drive made it, so an output after a dead letter of the same id says why
            // there are two (docs/TRANSFORMS.md "Re-driving dead letters").
            if let Some(redrive) = redrive {
                headers = headers.insert(Header {
                    key: eos_core::redrive::REDRIVE_ID_HEADER,
                    value: Some(redrive),
                });
            }
            let topic = self.settings.outputs[&output.output].clone();
            let payload =
                match &self.output {
                    // The decision checked that it fits: encoding is the same call again.
                    Some(encoder) => encoder.encode(&output.output, &output.value).map_err(
                        |detail| {
                            ProcessorError::Config(format!(
                                "output {:?} of event {event_id} fit its schema when decided, and \
                             not when written: {detail}",
                                output.output
                            ))
                        },
                    )?,
                    None => eos_core::json_text::to_vec(&output.value),
                };
            self.batch.push_output(PendingRecord {
                topic,
                partition: None,
                key: Some(output.key.unwrap_or_else(|| entity_id.as_bytes().to_vec())),
                payload: Some(payload),
                headers,
            });
        }
        Ok(())
    }

    /// A dead letter of `message` into the batch, the original bytes cut to what the producer
    /// can write.
    fn push_dead_letter(
        &mut self,
        message: &OwnedMessage,
        (reason, code): (DeadLetterReason, Option<&str>),
        detail: &str,
        event_id: Option<&str>,
    ) {
        let (partition, offset) = (message.partition(), message.offset());
        warn!(
            partition,
            offset,
            event_id = event_id.unwrap_or(""),
            %reason,
            detail,
            "record dead-lettered"
        );
        let record = dead_letter_record(
            &self.settings.dlq_topic,
            message,
            (reason, code),
            detail,
            self.settings.dead_letter_max_bytes,
        );
        if record.truncated {
            warn!(
                partition,
                offset,
                size = message.payload().map_or(0, <[u8]>::len),
                limit = self.settings.dead_letter_max_bytes,
                "dead letter too big for the producer: a prefix is kept, with the original's \
                 size and SHA-256"
            );
        }
        self.batch.push_dead_letter(reason, record.record);
    }
}

/// The partition's overlay in the open batch, made by its first record, which also sweeps the
/// partition's dedup ids past the horizon into tombstones when its last sweep is
/// `EXPIRY_SWEEP_INTERVAL` old.
fn partition_overlay<'a, S: Clone + Default>(
    overlays: &'a mut HashMap<i32, Overlay<S>>,
    last_sweep: &mut HashMap<i32, Instant>,
    state: &PartitionState<S>,
    partition: i32,
    now: i64,
) -> Result<&'a mut Overlay<S>, ProcessorError> {
    Ok(match overlays.entry(partition) {
        Entry::Occupied(entry) => entry.into_mut(),
        Entry::Vacant(entry) => {
            let mut overlay = Overlay::default();
            let last = last_sweep.entry(partition).or_insert_with(Instant::now);
            if last.elapsed() >= EXPIRY_SWEEP_INTERVAL {
                *last = Instant::now();
                let expired = state.expire(&mut overlay, now)?;
                if expired > 0 {
                    info!(partition, expired, "dedup ids past the horizon tombstoned");
                }
                if expired >= EXPIRY_SWEEP_MAX {
                    // More are due: sweep again in the next batch.
                    if let Some(earlier) = last.checked_sub(EXPIRY_SWEEP_INTERVAL) {
                        *last = earlier;
                    }
                }
            }
            entry.insert(overlay)
        }
    })
}

/// The `process` span of the record at `source`.
fn process_span(source: &SourcePosition, group_id: &str) -> tracing::Span {
    info_span!(
        "process",
        otel.name = "eos-processor process",
        otel.kind = "consumer",
        // Recorded once decided: the event id is where the contract says, which may be the value
        // rather than the `event_id` header (docs/architecture/wire-format.md "Wire format").
        event_id = tracing::field::Empty,
        messaging.system = "kafka",
        messaging.operation.type = "process",
        messaging.destination.name = %source.topic,
        messaging.destination.partition.id = %source.partition,
        messaging.consumer.group.name = %group_id,
        messaging.kafka.offset = source.offset,
        eos.decision = tracing::field::Empty,
    )
}

/// Who an emitted event's outputs are of.
#[derive(Clone, Copy)]
struct Emitted<'a> {
    event_id: &'a str,
    entity_id: &'a str,
    /// The re-drive that had it judged again, whose id its outputs carry.
    redrive: Option<&'a str>,
}

/// When a batch whose first record is `first_record_age` old is committed at the latest: one
/// commit interval after that record was written, so that a record that waited behind the
/// previous commit (or in the producer's linger) does not wait a whole interval more, and the
/// interval bounds its latency as Kafka Streams' commit cadence does. A first record older than
/// half the interval is a backlog being read, not a wait behind one commit: its batch gets the
/// whole interval, which keeps throughput (batch sizes) where a backlog needs it. A record
/// timestamp from the future (another clock) or absent counts as just written.
fn batch_deadline(
    now: Instant,
    first_record_age: Option<Duration>,
    commit_interval: Duration,
) -> Instant {
    let waited = first_record_age
        .filter(|age| *age <= commit_interval / 2)
        .unwrap_or_default();
    now + (commit_interval - waited)
}

/// How long ago a record was written, by its Kafka timestamp; `None` without one or when the
/// timestamp is ahead of this clock.
fn record_age(timestamp: rdkafka::Timestamp) -> Option<Duration> {
    let written = time::OffsetDateTime::from_unix_timestamp_nanos(
        i128::from(timestamp.to_millis()?) * 1_000_000,
    )
    .ok()?;
    // A negative age (a timestamp ahead of this clock) does not convert.
    Duration::try_from(time::OffsetDateTime::now_utc() - written).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const INTERVAL: Duration = Duration::from_millis(100);

    #[test]
    fn a_record_that_waited_behind_a_commit_shortens_its_batch_by_the_wait() {
        let now = Instant::now();
        let due = batch_deadline(now, Some(Duration::from_millis(30)), INTERVAL);
        assert_eq!(due - now, Duration::from_millis(70));
    }

    #[test]
    fn a_backlog_or_an_unknown_age_gets_the_whole_interval() {
        let now = Instant::now();
        for age in [
            None,
            Some(Duration::from_millis(51)),
            Some(Duration::from_secs(3600)),
        ] {
            assert_eq!(
                batch_deadline(now, age, INTERVAL) - now,
                INTERVAL,
                "{age:?}"
            );
        }
        let half = batch_deadline(now, Some(INTERVAL / 2), INTERVAL);
        assert_eq!(half - now, INTERVAL / 2);
    }

    #[test]
    fn record_age_is_none_without_a_timestamp_or_from_the_future() {
        assert_eq!(record_age(rdkafka::Timestamp::NotAvailable), None);
        let ahead = std::time::SystemTime::now() + Duration::from_secs(60);
        let ahead_ms = ahead
            .duration_since(std::time::UNIX_EPOCH)
            .expect("the clock is after 1970")
            .as_millis() as i64;
        assert_eq!(record_age(rdkafka::Timestamp::CreateTime(ahead_ms)), None);
        let age = record_age(rdkafka::Timestamp::LogAppendTime(ahead_ms - 90_000))
            .expect("a timestamp 30 s in the past has an age");
        assert!(
            (Duration::from_secs(29)..Duration::from_secs(31)).contains(&age),
            "{age:?}"
        );
    }
}
