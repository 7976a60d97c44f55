//! The pass-through baseline: a plain consumer → producer copy of the same input, in this
//! process, with no transaction, no transform and no state — what the broker and librdkafka
//! manage on this machine in the same run, against which the processor's rate is set.
//!
//! The consumer reads `read_committed` from the beginning of every partition (as the processor
//! does) and each record goes, with its key, value and headers, to the same partition of the
//! output topic through a producer with librdkafka's defaults plus the processor's `acks=all`
//! and `linger.ms=5`. The rate runs from the first record read to the last one acknowledged.
//!
//! [`single_record_transactions`] is the floor under the processor's single-record
//! transactions: the same input copied one record per Kafka transaction.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use eos_core::Guarantee;
use eos_runtime::backoff::send_when_queue_has_room;
use eos_runtime::kafka_clients::{self, Isolation::ReadCommitted};
use eos_runtime::transactional_producer::{PendingRecord, TransactionalProducer, TxnFailure};
use nix::sys::resource::UsageWho;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Message, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::{ClientContext, Offset, TopicPartitionList};

use crate::bench::processor_process::cpu_time;
use crate::bench::report::RoundFigures;
use eosctl::kafka_client::KafkaSettings;

/// Counts failed deliveries: a copy that lost records measured nothing.
#[derive(Debug, Default)]
struct DeliveryFailures(AtomicU64);

impl ClientContext for DeliveryFailures {}

impl ProducerContext for DeliveryFailures {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _opaque: ()) {
        if result.is_err() {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Copies `input` (up to `ends`, per partition) to `output`, which has the same partitions.
pub(super) fn copy(
    settings: &KafkaSettings,
    input: &str,
    output: &str,
    ends: &BTreeMap<i32, i64>,
    stall_timeout: Duration,
    interrupted: &AtomicBool,
) -> anyhow::Result<RoundFigures> {
    let started = Instant::now();
    let cpu_before = own_cpu();
    let consumer =
        input_reader(settings, &format!("{output}-copier"), input, ends).context("pass-through")?;
    let producer: BaseProducer<DeliveryFailures> = settings
        .client_config()
        .set("acks", "all")
        .set("linger.ms", "5")
        .create_with_context(DeliveryFailures::default())
        .context("cannot create the pass-through producer")?;

    let total: i64 = ends.values().sum();
    let mut remaining: BTreeMap<i32, i64> = ends
        .iter()
        .filter(|&(_, &end)| end > 0)
        .map(|(&partition, &end)| (partition, end))
        .collect();
    let mut first_read: Option<Instant> = None;
    let mut last_progress = Instant::now();
    while !remaining.is_empty() {
        if interrupted.load(Ordering::Relaxed) {
            bail!("interrupted");
        }
        producer.poll(Duration::ZERO);
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(message)) => {
                first_read.get_or_insert_with(Instant::now);
                last_progress = Instant::now();
                let mut record = BaseRecord::to(output).partition(message.partition());
                if let Some(key) = message.key() {
                    record = record.key(key);
                }
                if let Some(payload) = message.payload() {
                    record = record.payload(payload);
                }
                if let Some(headers) = message.headers() {
                    record = record.headers(headers.detach());
                }
                send(&producer, record)?;
                let partition = message.partition();
                if remaining
                    .get(&partition)
                    .is_some_and(|&end| message.offset() + 1 >= end)
                {
                    remaining.remove(&partition);
                }
            }
            Some(Err(error)) => tracing::debug!(%error, "pass-through consumer error"),
            None => {}
        }
        if last_progress.elapsed() >= stall_timeout {
            bail!(
                "pass-through: no record read for {}; partitions not finished: {:?}",
                humantime::format_duration(stall_timeout),
                remaining.keys().collect::<Vec<_>>()
            );
        }
    }
    while producer.in_flight_count() > 0 {
        producer.poll(Duration::from_millis(1));
        if last_progress.elapsed() >= stall_timeout {
            bail!(
                "pass-through: {} records not acknowledged within {}",
                producer.in_flight_count(),
                humantime::format_duration(stall_timeout)
            );
        }
    }
    let finished = Instant::now();
    let failed = producer.context().0.load(Ordering::Relaxed);
    if failed > 0 {
        bail!("pass-through: {failed} deliveries failed");
    }
    let first_read = first_read.ok_or_else(|| anyhow!("pass-through: the input is empty"))?;
    let measured = finished.duration_since(first_read).as_secs_f64();
    if measured <= 0.0 {
        bail!("pass-through: the copy was too fast to measure; give more records");
    }
    let cpu = own_cpu()
        .zip(cpu_before)
        .map(|(after, before)| after.saturating_sub(before));
    Ok(RoundFigures {
        records_per_second: total as f64 / measured,
        measured_seconds: measured,
        startup_seconds: first_read.duration_since(started).as_secs_f64(),
        cpu_ms_per_1000_records: cpu.map(|cpu| cpu.as_secs_f64() * 1e6 / total as f64),
    })
}

/// Copies `input` (up to `ends`) to `output` one record per Kafka transaction, through the
/// processor's own producer (`TransactionalProducer`: the same linger, retry backoff and commit
/// that waits for its deliveries), each transaction holding the record and its consumed offset
/// and nothing else: no transform, no state or changelog record, no spans. What this broker and
/// librdkafka allow one transaction at a time on this machine, set beside the processor's
/// `--max-batch 1` rate. Returns transactions per second, from the first record read to the last
/// commit.
pub(super) fn single_record_transactions(
    settings: &KafkaSettings,
    input: &str,
    output: &str,
    ends: &BTreeMap<i32, i64>,
    stall_timeout: Duration,
    interrupted: &AtomicBool,
) -> anyhow::Result<f64> {
    let group = format!("{output}-copier");
    let consumer = input_reader(settings, &group, input, ends).context("single-record copy")?;
    let producer = TransactionalProducer::new(
        &settings.client_config(),
        Guarantee::ExactlyOnce,
        &group,
        Duration::from_secs(60),
        Duration::from_secs(30),
    )
    .context("cannot create the single-record copy's producer")?;
    let group_metadata = consumer
        .group_metadata()
        .ok_or_else(|| anyhow!("the single-record copy's consumer has no group metadata"))?;
    let failed =
        |step: &str, failure: TxnFailure| anyhow!("single-record copy: {step}: {failure:?}");

    let total: i64 = ends.values().sum();
    let mut copied = 0_i64;
    let mut first_read: Option<Instant> = None;
    let mut last_progress = Instant::now();
    while copied < total {
        if interrupted.load(Ordering::Relaxed) {
            bail!("interrupted");
        }
        let message = match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(message)) => message,
            Some(Err(error)) => {
                tracing::debug!(%error, "single-record copy: consumer error");
                continue;
            }
            None if last_progress.elapsed() >= stall_timeout => bail!(
                "single-record copy: {copied} of {total} records copied, then none for {}",
                humantime::format_duration(stall_timeout)
            ),
            None => continue,
        };
        first_read.get_or_insert_with(Instant::now);
        producer
            .begin()
            .map_err(|failure| failed("begin", failure))?;
        producer
            .send(&PendingRecord {
                topic: output.to_owned(),
                partition: Some(message.partition()),
                key: message.key().map(<[u8]>::to_vec),
                payload: message.payload().map(<[u8]>::to_vec),
                headers: message
                    .headers()
                    .map_or_else(OwnedHeaders::new, |headers| headers.detach()),
            })
            .context("single-record copy: cannot send")?;
        let mut offsets = TopicPartitionList::new();
        offsets.add_partition_offset(
            input,
            message.partition(),
            Offset::Offset(message.offset() + 1),
        )?;
        producer
            .send_offsets(&offsets, &group_metadata)
            .map_err(|failure| failed("send_offsets", failure))?;
        producer
            .commit()
            .map_err(|failure| failed("commit", failure))?;
        copied += 1;
        last_progress = Instant::now();
    }
    let first_read = first_read.ok_or_else(|| anyhow!("single-record copy: the input is empty"))?;
    let measured = first_read.elapsed().as_secs_f64();
    if measured <= 0.0 {
        bail!("single-record copy: too fast to measure; give more records");
    }
    Ok(total as f64 / measured)
}

/// A `read_committed` consumer in `group` assigned every partition of `input` in `ends` from the
/// beginning, as the processor reads it.
fn input_reader(
    settings: &KafkaSettings,
    group: &str,
    input: &str,
    ends: &BTreeMap<i32, i64>,
) -> anyhow::Result<BaseConsumer> {
    let consumer: BaseConsumer =
        kafka_clients::consumer(&settings.client_config(), group, ReadCommitted)
            .set("allow.auto.create.topics", "false")
            .create()
            .context("cannot create the consumer")?;
    let mut assignment = TopicPartitionList::new();
    for &partition in ends.keys() {
        assignment.add_partition_offset(input, partition, Offset::Beginning)?;
    }
    consumer
        .assign(&assignment)
        .context("cannot assign the input")?;
    Ok(consumer)
}

fn send(
    producer: &BaseProducer<DeliveryFailures>,
    record: BaseRecord<'_, [u8], [u8]>,
) -> anyhow::Result<()> {
    #[expect(
        clippy::result_large_err,
        reason = "rdkafka's send hands the record back inside its error"
    )]
    let sent = send_when_queue_has_room(
        record,
        |record| producer.send(record),
        // A BaseProducer serves its acknowledgements only in poll, which makes room.
        |delay| {
            producer.poll(delay);
        },
    );
    sent.map_err(|(error, _)| error)
        .context("pass-through: cannot send")
}

/// User plus system CPU time of this process so far (the copy is the only work it does
/// meanwhile).
fn own_cpu() -> Option<Duration> {
    cpu_time(UsageWho::RUSAGE_SELF)
}
