//! `eos_sink_checkpoint_lag`, measured by a thread beside the sink loop, so that it goes on
//! growing while the loop is stuck — in a batch's transaction, waiting on PostgreSQL or on a
//! provider target's outcomes — instead of freezing at its last value (docs/OBSERVABILITY.md
//! "Liveness"). The loop used to set it from inside, between polls.
//!
//! The design: the loop publishes what it knows without a request — the checkpoint it last
//! committed for each owned partition ([`Checkpoints`]: at each commit, positioning and
//! rebalance) — and the thread, sharing the loop's consumer, asks each partition's leader for its
//! end (the last stable offset, what `fetch_watermarks` answers a `read_committed` consumer) every
//! [`LAG_INTERVAL`]. The lag is the end minus the checkpoint, so it grows with every record
//! produced while no checkpoint moves. A partition being positioned again (after a failed batch)
//! keeps the checkpoint it had; one revoked is set to 0, its new owner reports it.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use eos_runtime::measuring_thread::MeasuringThread;

use metrics::gauge;
use rdkafka::consumer::Consumer;
use tracing::debug;

use crate::loop_settings::LoopConsumer;
use crate::metrics as m;

/// How often the lag is measured: each owned partition costs one request to its leader.
const LAG_INTERVAL: Duration = Duration::from_secs(5);
/// The first measurement after start-up: soon, so a restarted sink's lag shows at once.
const FIRST_LAG_REPORT: Duration = Duration::from_secs(1);
const LAG_TIMEOUT: Duration = Duration::from_secs(1);

/// The checkpoints the loop has committed, by owned partition: `None`, a partition positioned
/// without a checkpoint (its records are read from the log's start). A partition not yet
/// positioned since its assignment is absent.
#[derive(Debug, Clone, Default)]
pub(crate) struct Checkpoints(Arc<Mutex<BTreeMap<i32, Option<i64>>>>);

impl Checkpoints {
    /// The loop's partitions now: `Some(checkpoint)` for one positioned, `None` for one waiting
    /// to be positioned (it keeps the checkpoint it had, if any). Partitions left out are gone.
    pub(crate) fn publish(&self, owned: impl IntoIterator<Item = (i32, Option<Option<i64>>)>) {
        let Ok(mut published) = self.0.lock() else {
            return;
        };
        let before = std::mem::take(&mut *published);
        for (partition, checkpoint) in owned {
            match checkpoint.or_else(|| before.get(&partition).copied()) {
                Some(checkpoint) => published.insert(partition, checkpoint),
                None => None,
            };
        }
    }

    fn snapshot(&self) -> BTreeMap<i32, Option<i64>> {
        self.0
            .lock()
            .map(|published| published.clone())
            .unwrap_or_default()
    }
}

/// The measuring thread; dropping this stops it and waits for it (at most one watermark request).
#[derive(Debug)]
pub(crate) struct LagWatch {
    _thread: MeasuringThread,
}

impl LagWatch {
    /// Measures the lag of the `checkpoints` on `topic` through `consumer` until dropped (or the
    /// consumer is). `None`, with the reason logged, when no thread can be started: the loop
    /// runs without the gauge.
    pub(crate) fn spawn(
        consumer: &Arc<LoopConsumer>,
        topic: String,
        checkpoints: Checkpoints,
    ) -> Option<Self> {
        let consumer = Arc::downgrade(consumer);
        let mut reported = BTreeSet::new();
        let thread = MeasuringThread::spawn(
            "checkpoint-lag",
            (FIRST_LAG_REPORT, LAG_INTERVAL),
            move |stop| {
                let Some(consumer) = consumer.upgrade() else {
                    return ControlFlow::Break(());
                };
                measure(&consumer, (&topic, &checkpoints), &mut reported, stop);
                ControlFlow::Continue(())
            },
        );
        match thread {
            Ok(thread) => Some(Self { _thread: thread }),
            Err(error) => {
                tracing::error!(%error, "cannot start the checkpoint lag thread: eos_sink_checkpoint_lag is not measured");
                None
            }
        }
    }
}

/// Sets the lag of each published partition (`reported`: the partitions whose gauge this
/// instance set, to zero them once gone).
fn measure(
    consumer: &LoopConsumer,
    (topic, checkpoints): (&str, &Checkpoints),
    reported: &mut BTreeSet<i32>,
    stop: &AtomicBool,
) {
    let checkpoints = checkpoints.snapshot();
    for (&partition, checkpoint) in &checkpoints {
        if stop.load(Ordering::Acquire) {
            return;
        }
        match consumer.fetch_watermarks(topic, partition, LAG_TIMEOUT) {
            Ok((low, high)) => {
                let lag = high - checkpoint.unwrap_or(low).max(low);
                gauge!(m::CHECKPOINT_LAG, "partition" => partition.to_string())
                    .set(lag.max(0) as f64);
                reported.insert(partition);
            }
            Err(error) => debug!(partition, %error, "cannot fetch watermarks for the lag gauge"),
        }
    }
    let gone: Vec<i32> = reported
        .iter()
        .copied()
        .filter(|partition| !checkpoints.contains_key(partition))
        .collect();
    for partition in gone {
        gauge!(m::CHECKPOINT_LAG, "partition" => partition.to_string()).set(0.0);
        reported.remove(&partition);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partition_being_positioned_again_keeps_its_checkpoint_and_a_revoked_one_goes() {
        let checkpoints = Checkpoints::default();
        checkpoints.publish([(0, Some(Some(10))), (1, Some(None)), (2, None)]);
        assert_eq!(
            checkpoints.snapshot(),
            BTreeMap::from([(0, Some(10)), (1, None)]),
            "one not yet positioned is not measured"
        );
        // A failed batch: every partition is positioned again; partition 1 was revoked.
        checkpoints.publish([(0, None), (2, None)]);
        assert_eq!(checkpoints.snapshot(), BTreeMap::from([(0, Some(10))]));
        checkpoints.publish([(0, Some(Some(25))), (2, Some(Some(3)))]);
        assert_eq!(
            checkpoints.snapshot(),
            BTreeMap::from([(0, Some(25)), (2, Some(3))])
        );
    }
}
