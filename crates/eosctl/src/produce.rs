//! `eosctl produce`: writes a [`Workload`] to a topic the way an at-least-once producer does —
//! with re-deliveries, malformed records and reused ids — through an idempotent producer, so
//! every duplicate on the topic is one the workload meant to write, not one the client added.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use indicatif::ProgressBar;
use rdkafka::ClientContext;
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::types::RDKafkaErrorCode;
use serde::Serialize;

use crate::kafka_client::{ClusterError, KafkaSettings, TopicLayout, ensure_topic};
use crate::workload::{MalformedKind, RecordKind, SpecError, Workload, WorkloadSpec};

/// How often the progress bar is refreshed, in records.
const PROGRESS_EVERY: u64 = 1000;
/// Pause before retrying a send when librdkafka's local queue is full.
const QUEUE_FULL_BACKOFF: Duration = Duration::from_millis(2);

#[derive(Debug, Clone)]
pub struct ProduceOptions {
    pub topic: String,
    pub layout: TopicLayout,
    /// Records per second; 0 for as fast as the broker takes them.
    pub rate: u64,
    /// librdkafka `message.timeout.ms`: how long a record may take to be acknowledged.
    pub delivery_timeout: Duration,
    pub spec: WorkloadSpec,
}

#[derive(Debug, thiserror::Error)]
pub enum ProduceError {
    #[error(transparent)]
    Spec(#[from] SpecError),
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    #[error("cannot create the Kafka producer")]
    Producer(#[source] KafkaError),
    #[error("cannot send record {index}")]
    Send { index: u64, source: KafkaError },
    #[error("{failed} of {sent} records were not delivered (first error: {first_error})")]
    Delivery {
        failed: u64,
        sent: u64,
        first_error: String,
    },
    #[error("{undelivered} of {sent} records were still unacknowledged after {timeout:?}")]
    Unacknowledged {
        undelivered: u64,
        sent: u64,
        timeout: Duration,
    },
    #[error(
        "interrupted after sending {sent} of {planned} records (all sent records were delivered)"
    )]
    Interrupted { sent: u64, planned: u64 },
    #[error("producer task failed")]
    Task(#[from] tokio::task::JoinError),
}

/// What was written. Serialised as the `--json` output.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ProduceSummary {
    pub topic: String,
    pub partitions: usize,
    pub topic_created: bool,
    pub seed: u64,
    /// Distinct valid events (`--count`).
    pub logical_events: u64,
    /// Records written: logical events plus duplicates, malformed records and conflicts.
    pub physical_records: u64,
    pub duplicates: u64,
    pub malformed: u64,
    pub malformed_by_kind: BTreeMap<MalformedKind, u64>,
    pub conflicts: u64,
    /// Sum of `value` over the logical events: what an exactly-once consumer must end up with.
    pub sum_logical_values: i128,
    /// Sum of `value` over every valid record written, re-deliveries and conflicts included.
    pub sum_valid_physical_values: i128,
    pub bytes: u64,
    pub elapsed_seconds: f64,
    pub records_per_second: f64,
    pub megabytes_per_second: f64,
}

impl ProduceSummary {
    fn count(&mut self, kind: RecordKind, bytes: usize) {
        self.physical_records += 1;
        self.bytes += bytes as u64;
        match kind {
            RecordKind::Logical { value, .. } => {
                self.logical_events += 1;
                self.sum_logical_values += i128::from(value);
                self.sum_valid_physical_values += i128::from(value);
            }
            RecordKind::Duplicate { value, .. } => {
                self.duplicates += 1;
                self.sum_valid_physical_values += i128::from(value);
            }
            RecordKind::Conflict { value, .. } => {
                self.conflicts += 1;
                self.sum_valid_physical_values += i128::from(value);
            }
            RecordKind::Malformed(kind) => {
                self.malformed += 1;
                *self.malformed_by_kind.entry(kind).or_default() += 1;
            }
        }
    }

    fn finish(&mut self, elapsed: Duration) {
        let seconds = elapsed.as_secs_f64();
        self.elapsed_seconds = seconds;
        if seconds > 0.0 {
            self.records_per_second = self.physical_records as f64 / seconds;
            self.megabytes_per_second = self.bytes as f64 / seconds / 1_000_000.0;
        }
    }
}

/// Counts acknowledgements as librdkafka reports them, from its polling thread.
#[derive(Debug, Default)]
struct DeliveryTracker {
    delivered: AtomicU64,
    failed: AtomicU64,
    first_error: Mutex<Option<String>>,
}

impl ClientContext for DeliveryTracker {}

impl ProducerContext for DeliveryTracker {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        match result {
            Ok(_) => {
                self.delivered.fetch_add(1, Ordering::Relaxed);
            }
            Err((error, _)) => {
                self.failed.fetch_add(1, Ordering::Relaxed);
                if let Ok(mut first) = self.first_error.lock() {
                    first.get_or_insert_with(|| error.to_string());
                }
            }
        }
    }
}

/// Creates the topic if needed, then writes the workload. `stop` ends the run early (the records
/// already sent are still waited for).
pub async fn run(
    settings: &KafkaSettings,
    options: ProduceOptions,
    progress: ProgressBar,
    stop: Arc<AtomicBool>,
) -> Result<ProduceSummary, ProduceError> {
    let workload = Workload::new(options.spec.clone())?;
    let (partitions, created) = ensure_topic(settings, &options.topic, options.layout).await?;
    let producer = producer(settings, options.delivery_timeout)?;
    let mut summary = tokio::task::spawn_blocking(move || {
        send_all(&producer, &options, workload, &progress, &stop)
    })
    .await??;
    summary.partitions = partitions;
    summary.topic_created = created;
    Ok(summary)
}

fn producer(
    settings: &KafkaSettings,
    delivery_timeout: Duration,
) -> Result<ThreadedProducer<DeliveryTracker>, ProduceError> {
    settings
        .client_config()
        // Idempotence: a retry inside the client never adds a duplicate the workload did not
        // mean to write, and per-partition order is kept.
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("allow.auto.create.topics", "false")
        .set("linger.ms", "5")
        .set("batch.size", "1000000")
        .set(
            "message.timeout.ms",
            delivery_timeout.as_millis().to_string(),
        )
        .create_with_context(DeliveryTracker::default())
        .map_err(ProduceError::Producer)
}

fn send_all(
    producer: &ThreadedProducer<DeliveryTracker>,
    options: &ProduceOptions,
    workload: Workload,
    progress: &ProgressBar,
    stop: &AtomicBool,
) -> Result<ProduceSummary, ProduceError> {
    let planned = workload.spec().physical_records();
    let mut summary = ProduceSummary {
        topic: options.topic.clone(),
        seed: workload.spec().seed,
        ..ProduceSummary::default()
    };
    let tracker = producer.context();
    let started = Instant::now();
    let mut interrupted = false;
    for (index, record) in (0u64..).zip(workload) {
        if stop.load(Ordering::Relaxed) {
            interrupted = true;
            break;
        }
        if options.rate > 0 {
            // Pace against the start, not the previous record, so sleep overshoot does not
            // accumulate into a lower rate.
            let due = Duration::from_secs_f64(index as f64 / options.rate as f64);
            if let Some(wait) = due.checked_sub(started.elapsed()) {
                std::thread::sleep(wait);
            }
        }
        let headers = record
            .headers
            .iter()
            .fold(OwnedHeaders::new(), |headers, (key, value)| {
                headers.insert(Header {
                    key,
                    value: Some(value.as_slice()),
                })
            });
        let mut pending = BaseRecord::to(&options.topic)
            .key(record.key.as_slice())
            .payload(record.value.as_slice())
            .headers(headers);
        loop {
            match producer.send(pending) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), returned)) => {
                    pending = returned;
                    std::thread::sleep(QUEUE_FULL_BACKOFF);
                }
                Err((source, _)) => return Err(ProduceError::Send { index, source }),
            }
        }
        summary.count(record.kind, record.value.len());
        if (index + 1).is_multiple_of(PROGRESS_EVERY) {
            progress.set_position(tracker.delivered.load(Ordering::Relaxed));
        }
    }

    // Wait for every acknowledgement, keeping the bar moving.
    let deadline = Instant::now() + options.delivery_timeout + Duration::from_secs(5);
    while producer.in_flight_count() > 0 && Instant::now() < deadline {
        // A flush error is only the timeout of this slice; the loop condition decides.
        let _ = producer.flush(Duration::from_millis(100));
        progress.set_position(tracker.delivered.load(Ordering::Relaxed));
    }
    summary.finish(started.elapsed());
    progress.finish_and_clear();

    let sent = summary.physical_records;
    let failed = tracker.failed.load(Ordering::Relaxed);
    if failed > 0 {
        let first_error = tracker
            .first_error
            .lock()
            .ok()
            .and_then(|first| first.clone())
            .unwrap_or_default();
        return Err(ProduceError::Delivery {
            failed,
            sent,
            first_error,
        });
    }
    let delivered = tracker.delivered.load(Ordering::Relaxed);
    if delivered < sent {
        return Err(ProduceError::Unacknowledged {
            undelivered: sent - delivered,
            sent,
            timeout: options.delivery_timeout,
        });
    }
    if interrupted {
        return Err(ProduceError::Interrupted { sent, planned });
    }
    tracing::debug!(
        topic = %summary.topic,
        records = sent,
        elapsed_ms = started.elapsed().as_millis(),
        "all records delivered"
    );
    Ok(summary)
}
