//! `eos_processor_consumer_lag`, measured by a thread beside the transaction loop, so that it goes
//! on growing while the loop is stuck — in a transform call, in a commit — instead of freezing
//! at its last value (docs/OBSERVABILITY.md "Liveness"). The loop used to set it between batches
//! only.
//!
//! The design: the thread shares the loop's consumer. Every [`LAG_INTERVAL`] it reads the
//! consumer's position on each assigned partition of the input topic (a local read of where the
//! loop has got to, which stays put while the loop is stuck) and asks the partition's leader for
//! the last stable offset (what `fetch_watermarks` answers a `read_committed` consumer); the lag
//! is the difference, so it grows with every record produced while nothing moves. librdkafka's
//! calls are thread-safe, and these two neither wait for the loop nor hold up its polls and
//! commits. A partition revoked since the last measurement is set to 0: its new owner reports
//! it, and a stale value would add to the job's sum for good.

use std::collections::BTreeSet;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use eos_runtime::measuring_thread::MeasuringThread;

use metrics::gauge;
use rdkafka::consumer::Consumer;
use tracing::debug;

use crate::loop_consumer::LoopConsumer;
use crate::metrics as m;

/// How often the lag is measured: each owned partition costs one request to its leader.
const LAG_INTERVAL: Duration = Duration::from_secs(5);
/// The first measurement after start-up: soon, so a restarted instance's lag shows at once.
const FIRST_LAG_REPORT: Duration = Duration::from_secs(1);
const LAG_TIMEOUT: Duration = Duration::from_secs(1);

/// The measuring thread; dropping this stops it and waits for it (at most one watermark request).
#[derive(Debug)]
pub(crate) struct LagWatch {
    _thread: MeasuringThread,
}

impl LagWatch {
    /// Measures the lag of `consumer` on `topic` until dropped (or the consumer is). `None`, with
    /// the reason logged, when no thread can be started: the loop runs without the gauge.
    pub(crate) fn spawn(consumer: &Arc<LoopConsumer>, topic: String) -> Option<Self> {
        let consumer = Arc::downgrade(consumer);
        let mut reported = BTreeSet::new();
        let thread = MeasuringThread::spawn(
            "consumer-lag",
            (FIRST_LAG_REPORT, LAG_INTERVAL),
            move |stop| {
                let Some(consumer) = consumer.upgrade() else {
                    return ControlFlow::Break(());
                };
                measure(&consumer, &topic, &mut reported, stop);
                ControlFlow::Continue(())
            },
        );
        match thread {
            Ok(thread) => Some(Self { _thread: thread }),
            Err(error) => {
                tracing::error!(%error, "cannot start the consumer lag thread: eos_processor_consumer_lag is not measured");
                None
            }
        }
    }
}

/// Sets the lag of each assigned partition of `topic` (`reported`: the partitions whose gauge
/// this instance set, to zero them once revoked).
fn measure(consumer: &LoopConsumer, topic: &str, reported: &mut BTreeSet<i32>, stop: &AtomicBool) {
    let Ok(positions) = consumer.position() else {
        return;
    };
    let assigned: BTreeSet<i32> = positions
        .elements_for_topic(topic)
        .iter()
        .map(|element| element.partition())
        .collect();
    for element in positions.elements_for_topic(topic) {
        if stop.load(Ordering::Acquire) {
            return;
        }
        let partition = element.partition();
        // No position yet (nothing fetched since the assignment): the next measurement has one.
        let Some(position) = element.offset().to_raw().filter(|&next| next >= 0) else {
            continue;
        };
        match consumer.fetch_watermarks(topic, partition, LAG_TIMEOUT) {
            Ok((_, end)) => {
                gauge!(m::CONSUMER_LAG, "partition" => partition.to_string())
                    .set((end - position).max(0) as f64);
                reported.insert(partition);
            }
            Err(error) => debug!(partition, %error, "cannot fetch watermarks for the lag gauge"),
        }
    }
    let revoked: Vec<i32> = reported.difference(&assigned).copied().collect();
    for partition in revoked {
        gauge!(m::CONSUMER_LAG, "partition" => partition.to_string()).set(0.0);
        reported.remove(&partition);
    }
}
