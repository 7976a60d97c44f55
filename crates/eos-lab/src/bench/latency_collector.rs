//! The latency run's measurement: a `read_committed` reader of the output notes when each
//! output record arrives; the input records' Kafka timestamps say when they were sent.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, anyhow, bail};
use eos_runtime::kafka_clients::{self, Isolation::ReadCommitted};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use serde::Deserialize;

use crate::bench::processor_process::ProcessorProcess;
use eosctl::kafka_client::KafkaSettings;

/// The latency run's producer is new, and its first records wait for it to connect and get a
/// producer id: records sent in its first seconds are not measured.
pub const PRODUCER_RAMP_UP: Duration = Duration::from_secs(2);
/// How often a latency run that fell behind is repeated at half the rate.
pub const LATENCY_RETRIES: usize = 2;

/// The part of a ledger output record the latency run needs: where its input came from.
#[derive(Debug, Deserialize)]
pub(super) struct OutputSource {
    pub(super) source: SourceRef,
}

#[derive(Debug, Deserialize)]
pub(super) struct SourceRef {
    pub(super) partition: i32,
    pub(super) offset: i64,
}

/// An output record as it reached the reader.
#[derive(Debug, Clone, Copy)]
pub(super) struct Arrival {
    /// Of the input record.
    partition: i32,
    offset: i64,
    received_ms: i64,
}

/// `(send time, latency)` of each arrival whose input record's timestamp is known, and how many
/// were not.
pub(super) fn latency_samples(
    arrivals: &[Arrival],
    sent_at: &HashMap<(i32, i64), i64>,
) -> (Vec<(i64, i64)>, u64) {
    let mut unmatched = 0;
    let samples = arrivals
        .iter()
        .filter_map(|arrival| {
            let sent = sent_at.get(&(arrival.partition, arrival.offset));
            if sent.is_none() {
                unmatched += 1;
            }
            sent.map(|&sent_ms| (sent_ms, arrival.received_ms - sent_ms))
        })
        .collect();
    (samples, unmatched)
}

/// A read_committed reader of the output topic on its own thread, noting when each output
/// record arrives.
pub(super) struct ArrivalCollector {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Vec<Arrival>>,
    expected: u64,
}

impl ArrivalCollector {
    /// Collects outputs of inputs at or after `from` (per input partition) until `expected` of
    /// them have arrived.
    pub(super) fn start(
        settings: &KafkaSettings,
        output: &str,
        output_partitions: &[i32],
        from: BTreeMap<i32, i64>,
        expected: u64,
    ) -> anyhow::Result<Self> {
        let consumer: BaseConsumer = kafka_clients::reader(
            &settings.client_config(),
            "eos-lab-bench-reader-output",
            ReadCommitted,
        )
        .set("allow.auto.create.topics", "false")
        // Answer as soon as a transaction's records become readable.
        .set("fetch.wait.max.ms", "10")
        .create()
        .context("cannot create the output reader")?;
        let mut assignment = TopicPartitionList::new();
        for &partition in output_partitions {
            assignment.add_partition_offset(output, partition, Offset::Beginning)?;
        }
        consumer
            .assign(&assignment)
            .context("cannot assign the output partitions")?;
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || collect_arrivals(&consumer, &from, expected, &stop))
        };
        Ok(Self {
            stop,
            thread,
            expected,
        })
    }

    /// Waits for every expected output; fails when none arrives for `stall_timeout`.
    pub(super) fn finish(
        self,
        process: &mut ProcessorProcess,
        interrupted: &AtomicBool,
        stall_timeout: Duration,
    ) -> anyhow::Result<Vec<Arrival>> {
        let deadline = Instant::now() + stall_timeout;
        while !self.thread.is_finished() {
            if interrupted.load(Ordering::Relaxed) {
                self.abandon();
                bail!("interrupted");
            }
            if let Err(error) = process.ensure_running() {
                self.abandon();
                return Err(error);
            }
            if Instant::now() >= deadline {
                self.stop.store(true, Ordering::Relaxed);
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let arrivals = self
            .thread
            .join()
            .map_err(|_| anyhow!("the output reader panicked"))?;
        if (arrivals.len() as u64) < self.expected {
            bail!(
                "only {} of {} output records arrived within {} after the last input was sent; \
                 processor log: {}",
                arrivals.len(),
                self.expected,
                humantime::format_duration(stall_timeout),
                process.log().display()
            );
        }
        Ok(arrivals)
    }

    pub(super) fn abandon(self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.thread.join();
    }
}

fn collect_arrivals(
    consumer: &BaseConsumer,
    from: &BTreeMap<i32, i64>,
    expected: u64,
    stop: &AtomicBool,
) -> Vec<Arrival> {
    let mut arrivals = Vec::with_capacity(usize::try_from(expected).unwrap_or(0));
    while (arrivals.len() as u64) < expected && !stop.load(Ordering::Relaxed) {
        match consumer.poll(Duration::from_millis(20)) {
            Some(Ok(message)) => {
                let received_ms = now_ms();
                let Some(source) = message
                    .payload()
                    .and_then(|payload| serde_json::from_slice::<OutputSource>(payload).ok())
                    .map(|output| output.source)
                else {
                    continue;
                };
                // Outputs of the warm-up records are not measured.
                if source.offset < from.get(&source.partition).copied().unwrap_or(0) {
                    continue;
                }
                arrivals.push(Arrival {
                    partition: source.partition,
                    offset: source.offset,
                    received_ms,
                });
            }
            Some(Err(error)) => tracing::debug!(%error, "output read error"),
            None => {}
        }
    }
    arrivals
}

/// The Kafka timestamps (the producer's send time) of the input records in `[from, end)` of
/// each partition, keyed by (partition, offset).
pub(super) fn read_timestamps(
    settings: &KafkaSettings,
    topic: &str,
    from: &BTreeMap<i32, i64>,
    end: &BTreeMap<i32, i64>,
    stall_timeout: Duration,
) -> anyhow::Result<HashMap<(i32, i64), i64>> {
    let consumer: BaseConsumer = kafka_clients::reader(
        &settings.client_config(),
        "eos-lab-bench-reader-input",
        ReadCommitted,
    )
    .set("allow.auto.create.topics", "false")
    .create()
    .context("cannot create the input reader")?;
    let mut assignment = TopicPartitionList::new();
    let mut pending: HashMap<i32, i64> = HashMap::new();
    for (&partition, &end) in end {
        let start = from.get(&partition).copied().unwrap_or(0);
        if end > start {
            assignment.add_partition_offset(topic, partition, Offset::Offset(start))?;
            pending.insert(partition, end);
        }
    }
    let mut timestamps = HashMap::new();
    if pending.is_empty() {
        return Ok(timestamps);
    }
    consumer
        .assign(&assignment)
        .context("cannot assign the input partitions")?;
    let mut last_progress = Instant::now();
    while !pending.is_empty() {
        if last_progress.elapsed() >= stall_timeout {
            bail!("reading the input's timestamps made no progress for {stall_timeout:?}");
        }
        let Some(result) = consumer.poll(Duration::from_millis(100)) else {
            continue;
        };
        let message = result.context("reading the input's timestamps")?;
        let partition = message.partition();
        let Some(&end) = pending.get(&partition) else {
            continue;
        };
        if message.offset() >= end {
            continue;
        }
        last_progress = Instant::now();
        if let Some(ms) = message.timestamp().to_millis() {
            timestamps.insert((partition, message.offset()), ms);
        }
        if message.offset() + 1 >= end {
            pending.remove(&partition);
        }
    }
    Ok(timestamps)
}

/// librdkafka assigns partitions only in a consumer with a group id. The benchmark's readers
/// never join or commit, so a throw-away id leaves no trace.
pub(super) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| {
            i64::try_from(elapsed.as_millis()).unwrap_or(i64::MAX)
        })
}

/// Appends `rate,sent_ms,latency_ms` lines, with a header when the file is new.
pub(super) fn append_samples(
    path: &Path,
    rate: u64,
    samples: &[(i64, i64)],
) -> std::io::Result<()> {
    use std::io::Write as _;
    let new = !path.exists();
    let mut file = std::io::BufWriter::new(
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?,
    );
    if new {
        writeln!(file, "rate,sent_ms,latency_ms")?;
    }
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    for (sent_ms, latency_ms) in sorted {
        writeln!(file, "{rate},{sent_ms},{latency_ms}")?;
    }
    file.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_is_arrival_minus_the_input_timestamp() {
        let arrival = |partition, offset, received_ms| Arrival {
            partition,
            offset,
            received_ms,
        };
        let arrivals = [
            arrival(0, 7, 1_100),
            arrival(1, 7, 1_250),
            arrival(2, 1, 900),
        ];
        let sent_at = HashMap::from([((0, 7), 1_000), ((1, 7), 1_010)]);
        let (samples, unmatched) = latency_samples(&arrivals, &sent_at);
        assert_eq!(samples, vec![(1_000, 100), (1_010, 240)]);
        assert_eq!(unmatched, 1);
    }

    #[test]
    fn output_records_name_their_source() -> Result<(), serde_json::Error> {
        let output = br#"{"event_id":"e-1","entity_id":"ent-3","value":5,"entity_total":5,
            "entity_count":1,"source":{"topic":"payments","partition":2,"offset":41}}"#;
        let parsed: OutputSource = serde_json::from_slice(output)?;
        assert_eq!((parsed.source.partition, parsed.source.offset), (2, 41));
        Ok(())
    }
}
