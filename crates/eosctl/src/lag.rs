//! `eosctl lag`: how far a consumer group is behind a topic, per partition — and, with `--wait`,
//! waiting until it has caught up, so scripts can tell when a pipeline has drained.
//!
//! The lag of a partition is the number of records the group has still to read: the end of the
//! log (high watermark) minus the group's committed offset (read with `read_committed`, see
//! [`crate::group_offsets`]). One correction makes "caught up" mean what a script needs on a
//! topic written with transactions: a consumer commits the offset after its last *record*, but
//! the log goes on with the transaction's commit marker (and possibly aborted records), which no
//! consumer ever receives. Such a partition would show a lag of one forever. So when a partition
//! has a gap, a `read_committed` probe reads from the committed offset: if it passes the end
//! without receiving a record, the gap is markers and aborted records only, and the lag is 0.

use std::collections::{BTreeSet, HashMap};
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use comfy_table::presets::UTF8_FULL_CONDENSED;
use comfy_table::{CellAlignment, Table};
use eos_runtime::kafka_clients::{self, Isolation::ReadCommitted};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use serde::Serialize;

use crate::group_offsets::{GroupOffsetReader, PartitionOffsets};
use crate::kafka_client::{
    ClusterAccess as _, ClusterError, KafkaSettings, ReportingContext, topic_partitions,
};
use crate::report::grouped;

/// How often `--wait` looks again.
pub const WAIT_POLL_INTERVAL: Duration = Duration::from_millis(250);
/// How long the probe may read a gap before it counts as holding records.
const PROBE_BUDGET: Duration = Duration::from_secs(2);
const PROBE_POLL: Duration = Duration::from_millis(20);

/// Offsets between where the group resumes and the end of the log. A group that never committed
/// resumes at the start of the log (the pipeline's services reset to `earliest`).
pub fn offset_gap(committed: Option<i64>, low: i64, end: i64) -> i64 {
    let resume = committed.unwrap_or(low);
    (end - resume).max(0)
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PartitionLag {
    pub partition: i32,
    /// The group's committed offset (the next offset it reads); `null` if it never committed.
    pub committed: Option<i64>,
    /// The high watermark.
    pub end: i64,
    /// Records the group has still to read.
    pub lag: i64,
    /// `end - committed`: equal to `lag` unless the rest of the log is only transaction markers
    /// or aborted records, which no consumer receives.
    pub offset_gap: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LagReport {
    pub group: String,
    pub topic: String,
    pub partitions: Vec<PartitionLag>,
    pub total_lag: i64,
    /// Every partition has a lag of 0.
    pub caught_up: bool,
}

impl LagReport {
    /// `markers_only`: partitions whose gap was shown to hold no record a consumer receives.
    pub fn new(
        group: &str,
        topic: &str,
        observed: &[PartitionOffsets],
        markers_only: &BTreeSet<i32>,
    ) -> Self {
        let partitions: Vec<PartitionLag> = observed
            .iter()
            .map(|offsets| {
                let gap = offset_gap(offsets.committed, offsets.low, offsets.end);
                PartitionLag {
                    partition: offsets.partition,
                    committed: offsets.committed,
                    end: offsets.end,
                    lag: if markers_only.contains(&offsets.partition) {
                        0
                    } else {
                        gap
                    },
                    offset_gap: gap,
                }
            })
            .collect();
        let total_lag = partitions.iter().map(|p| p.lag).sum();
        Self {
            group: group.to_owned(),
            topic: topic.to_owned(),
            partitions,
            total_lag,
            caught_up: total_lag == 0,
        }
    }
}

/// The lag command's result: the last report, and whether `--wait` gave up.
#[derive(Debug, Clone, Serialize)]
pub struct LagOutcome {
    #[serde(flatten)]
    pub report: LagReport,
    pub timed_out: bool,
}

pub fn lag_text(outcome: &LagOutcome) -> String {
    let report = &outcome.report;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "group {:?} on topic {:?}: {}",
        report.group,
        report.topic,
        if report.caught_up {
            "caught up".to_owned()
        } else {
            format!("{} records behind", grouped(report.total_lag))
        }
    );
    let mut table = Table::new();
    table.load_preset(UTF8_FULL_CONDENSED);
    table.set_header(["partition", "committed", "end", "lag"]);
    for partition in &report.partitions {
        table.add_row([
            partition.partition.to_string(),
            partition.committed.map_or_else(|| "-".to_owned(), grouped),
            grouped(partition.end),
            grouped(partition.lag),
        ]);
    }
    table.add_row([
        "total".to_owned(),
        String::new(),
        grouped(report.partitions.iter().map(|p| p.end).sum::<i64>()),
        grouped(report.total_lag),
    ]);
    for index in 1..4 {
        if let Some(column) = table.column_mut(index) {
            column.set_cell_alignment(CellAlignment::Right);
        }
    }
    let _ = writeln!(out, "{table}");
    let markers: Vec<String> = report
        .partitions
        .iter()
        .filter(|p| p.lag == 0 && p.offset_gap > 0)
        .map(|p| format!("{} ({})", p.partition, p.offset_gap))
        .collect();
    if !markers.is_empty() {
        let _ = writeln!(
            out,
            "partitions {} end in offsets that hold only transaction markers or aborted records \
             (counted as no lag)",
            markers.join(", ")
        );
    }
    out
}

/// A partition whose committed offset is behind its end.
#[derive(Debug, Clone, Copy)]
struct Gap {
    partition: i32,
    from: i64,
    end: i64,
}

/// Watches one group on one topic. Blocking: run it off the async reactor.
pub struct LagWatcher {
    settings: KafkaSettings,
    topic: String,
    partitions: Vec<i32>,
    metadata: BaseConsumer<ReportingContext>,
    offsets: GroupOffsetReader,
    probe: BaseConsumer<ReportingContext>,
}

impl std::fmt::Debug for LagWatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LagWatcher")
            .field("group", &self.offsets.group())
            .field("topic", &self.topic)
            .finish_non_exhaustive()
    }
}

impl LagWatcher {
    pub fn new(settings: &KafkaSettings, group: &str, topic: &str) -> Result<Self, ClusterError> {
        let metadata = settings.metadata_client()?;
        let partitions = topic_partitions(&metadata, settings, topic)?.ok_or_else(|| {
            ClusterError::TopicMissing {
                topic: topic.to_owned(),
            }
        })?;
        // librdkafka assigns partitions only in a consumer with a group id; the probe never
        // joins or commits, so a throw-away id leaves no trace.
        let probe =
            kafka_clients::reader(&settings.client_config(), "eosctl-lag-probe", ReadCommitted)
                .set("allow.auto.create.topics", "false")
                .set("auto.offset.reset", "earliest")
                // The probe only needs to see whether one record comes back: no big prefetch.
                .set("max.partition.fetch.bytes", "65536")
                .set("queued.max.messages.kbytes", "1024")
                .set("fetch.wait.max.ms", "50")
                .create_with_context(ReportingContext)
                .map_err(|e| ClusterError::client("cannot create the Kafka consumer", e))?;
        Ok(Self {
            settings: settings.clone(),
            topic: topic.to_owned(),
            partitions,
            metadata,
            offsets: GroupOffsetReader::new(settings, group)?,
            probe,
        })
    }

    pub fn observe(&self) -> Result<LagReport, ClusterError> {
        let observed = self.offsets.observe(
            &self.settings,
            &self.metadata,
            &self.topic,
            &self.partitions,
        )?;
        let gaps: Vec<Gap> = observed
            .iter()
            .filter(|o| offset_gap(o.committed, o.low, o.end) > 0)
            .map(|o| Gap {
                partition: o.partition,
                // Below the start of the log (retention), reading resumes at the start.
                from: o.committed.unwrap_or(o.low).max(o.low),
                end: o.end,
            })
            .collect();
        let markers_only = if gaps.is_empty() {
            BTreeSet::new()
        } else {
            self.markers_only(&gaps)?
        };
        Ok(LagReport::new(
            self.offsets.group(),
            &self.topic,
            &observed,
            &markers_only,
        ))
    }

    /// The gaps a `read_committed` reader passes without receiving a record. A gap the probe
    /// cannot settle within its budget counts as holding records.
    fn markers_only(&self, gaps: &[Gap]) -> Result<BTreeSet<i32>, ClusterError> {
        let mut assignment = TopicPartitionList::new();
        for gap in gaps {
            assignment
                .add_partition_offset(&self.topic, gap.partition, Offset::Offset(gap.from))
                .map_err(|e| ClusterError::client("cannot build the probe's assignment", e))?;
        }
        self.probe
            .assign(&assignment)
            .map_err(|e| ClusterError::client("cannot assign the probe", e))?;
        let mut open: HashMap<i32, i64> = gaps.iter().map(|g| (g.partition, g.end)).collect();
        let mut proven = BTreeSet::new();
        let deadline = Instant::now() + PROBE_BUDGET;
        while !open.is_empty() && Instant::now() < deadline {
            match self.probe.poll(PROBE_POLL) {
                Some(Ok(message)) => {
                    let partition = message.partition();
                    if open
                        .get(&partition)
                        .is_some_and(|&end| message.offset() < end)
                    {
                        // A record the group has yet to read: real lag.
                        open.remove(&partition);
                    }
                }
                Some(Err(error)) => tracing::debug!(%error, "probe read error"),
                None => {}
            }
            // The position moves past control records, which are never returned as messages.
            let positions = self
                .probe
                .position()
                .map_err(|e| ClusterError::client("cannot read the probe's position", e))?;
            for element in positions.elements_for_topic(&self.topic) {
                let Offset::Offset(position) = element.offset() else {
                    continue;
                };
                if open
                    .get(&element.partition())
                    .is_some_and(|&end| position >= end)
                {
                    open.remove(&element.partition());
                    proven.insert(element.partition());
                }
            }
        }
        self.probe
            .unassign()
            .map_err(|e| ClusterError::client("cannot unassign the probe", e))?;
        Ok(proven)
    }
}

/// Observes once, or with `wait = Some(timeout)` until the group has caught up or the timeout
/// passes. While waiting, a failed observation (say, a transaction that holds the group's offsets
/// longer than a fetch may wait) is retried; the last error is returned only if no observation
/// ever succeeded. `on_progress` gets the total lag after each observation.
pub fn observe_or_wait(
    watcher: &LagWatcher,
    wait: Option<Duration>,
    on_progress: &mut dyn FnMut(i64),
) -> Result<LagOutcome, ClusterError> {
    let Some(timeout) = wait else {
        return Ok(LagOutcome {
            report: watcher.observe()?,
            timed_out: false,
        });
    };
    let started = Instant::now();
    let mut last: Option<LagReport> = None;
    loop {
        let round = Instant::now();
        match watcher.observe() {
            Ok(report) => {
                on_progress(report.total_lag);
                if report.caught_up {
                    return Ok(LagOutcome {
                        report,
                        timed_out: false,
                    });
                }
                last = Some(report);
            }
            Err(error) if started.elapsed() < timeout => {
                tracing::warn!(
                    error = error_chain(&error),
                    "cannot observe the group's lag; retrying"
                );
            }
            Err(error) => {
                if last.is_none() {
                    return Err(error);
                }
                tracing::warn!(
                    error = error_chain(&error),
                    "cannot observe the group's lag"
                );
            }
        }
        if started.elapsed() >= timeout
            && let Some(report) = last
        {
            return Ok(LagOutcome {
                report,
                timed_out: true,
            });
        }
        if let Some(pause) = WAIT_POLL_INTERVAL.checked_sub(round.elapsed()) {
            std::thread::sleep(pause);
        }
    }
}

/// `error: cause: cause`, for a log line.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let _ = write!(text, ": {cause}");
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offsets(partition: i32, committed: Option<i64>, low: i64, end: i64) -> PartitionOffsets {
        PartitionOffsets {
            partition,
            committed,
            low,
            end,
        }
    }

    #[test]
    fn gap_is_end_minus_committed() {
        assert_eq!(offset_gap(Some(40), 0, 100), 60);
        assert_eq!(offset_gap(Some(100), 0, 100), 0);
        // A group that never committed has the whole log still to read, from its start.
        assert_eq!(offset_gap(None, 30, 100), 70);
        assert_eq!(offset_gap(None, 0, 0), 0);
        // A commit can be read before an end that has moved on: never a negative lag.
        assert_eq!(offset_gap(Some(105), 0, 100), 0);
    }

    #[test]
    fn report_sums_lag_and_discounts_marker_only_gaps() {
        let observed = [
            offsets(0, Some(10), 0, 10),
            offsets(1, Some(7), 0, 8),
            offsets(2, Some(3), 0, 20),
            offsets(3, None, 0, 0),
        ];
        let report = LagReport::new("g", "t", &observed, &BTreeSet::new());
        assert_eq!(report.total_lag, 18);
        assert!(!report.caught_up);
        assert_eq!(report.partitions[1].lag, 1);
        assert_eq!(report.partitions[3].committed, None);

        // Partition 1's last offset is a commit marker: nothing left to read there.
        let markers_only = BTreeSet::from([1]);
        let report = LagReport::new("g", "t", &observed, &markers_only);
        assert_eq!(report.partitions[1].lag, 0);
        assert_eq!(report.partitions[1].offset_gap, 1);
        assert_eq!(report.total_lag, 17);

        let drained = [offsets(0, Some(11), 0, 11), offsets(1, Some(8), 0, 9)];
        let report = LagReport::new("g", "t", &drained, &BTreeSet::from([1]));
        assert!(report.caught_up);
        let text = lag_text(&LagOutcome {
            report,
            timed_out: false,
        });
        assert!(text.contains("caught up"), "{text}");
        assert!(text.contains("transaction markers"), "{text}");
    }

    #[test]
    fn a_group_that_never_committed_is_behind_by_the_whole_log() {
        let report = LagReport::new("g", "t", &[offsets(0, None, 5, 25)], &BTreeSet::new());
        assert_eq!(report.total_lag, 20);
        let text = lag_text(&LagOutcome {
            report,
            timed_out: false,
        });
        assert!(text.contains("20 records behind"), "{text}");
    }
}
