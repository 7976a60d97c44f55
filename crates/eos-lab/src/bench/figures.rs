//! The arithmetic of `eos-lab bench`: rates from committed-offset samples, medians, ratios and
//! latency percentiles. Pure, so every figure the benchmark prints is unit-tested.

use std::time::Duration;

use serde::Serialize;

/// The median; the mean of the middle two for an even count. `None` for no values or a NaN.
pub fn median(values: &[f64]) -> Option<f64> {
    if values.iter().any(|v| v.is_nan()) {
        return None;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let middle = sorted.len() / 2;
    match sorted.len() {
        0 => None,
        n if n % 2 == 1 => Some(sorted[middle]),
        _ => Some((sorted[middle - 1] + sorted[middle]) / 2.0),
    }
}

/// `numerator / denominator`, when the denominator is positive.
pub fn ratio(numerator: f64, denominator: f64) -> Option<f64> {
    (denominator > 0.0).then(|| numerator / denominator)
}

/// Nearest-rank percentile (`percent` in 0..=100) of values sorted ascending.
pub fn percentile(sorted: &[u64], percent: f64) -> Option<u64> {
    if sorted.is_empty() || !(0.0..=100.0).contains(&percent) {
        return None;
    }
    // Rank ceil(p/100 * n), 1-based; p = 0 is the minimum.
    let rank = (percent / 100.0 * sorted.len() as f64).ceil() as usize;
    sorted.get(rank.clamp(1, sorted.len()) - 1).copied()
}

/// Records per second and megabytes (10^6 bytes) per second.
pub fn megabytes_per_second(records_per_second: f64, bytes_per_record: f64) -> f64 {
    records_per_second * bytes_per_record / 1_000_000.0
}

/// One look at how many input records a group has committed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CommitSample {
    /// Since the processor was started.
    pub at: Duration,
    pub committed: i64,
}

/// Follows a group's committed offsets from its first commit to the end of its input, and turns
/// them into a rate. Start-up (process start, joining the group, restoring state) ends with the
/// first commit, so it is not part of the rate: the rate is the records committed after the first
/// sample that saw a commit, over the time from that sample to the one that saw the end.
#[derive(Debug, Clone)]
pub struct CommitProgress {
    target: i64,
    first: Option<CommitSample>,
    last: Option<CommitSample>,
    last_change: Duration,
}

impl CommitProgress {
    /// `target`: the committed total that means everything was processed.
    pub fn new(target: i64) -> Self {
        Self {
            target,
            first: None,
            last: None,
            last_change: Duration::ZERO,
        }
    }

    /// Records a sample (samples come in time order); true once the target is reached.
    pub fn observe(&mut self, sample: CommitSample) -> bool {
        let previous = self.committed();
        if sample.committed > previous {
            self.last_change = sample.at;
        }
        if self.first.is_none() && sample.committed > 0 {
            self.first = Some(sample);
        }
        if self.first.is_some() && sample.committed >= previous {
            self.last = Some(sample);
        }
        self.is_done()
    }

    pub fn is_done(&self) -> bool {
        self.last.is_some_and(|last| last.committed >= self.target)
    }

    /// When the committed total last moved (or when watching began, before any commit).
    pub fn last_change(&self) -> Duration {
        self.last_change
    }

    pub fn committed(&self) -> i64 {
        self.last.map_or(0, |last| last.committed)
    }

    /// When the first sample that saw a commit was taken: start-up ends there.
    pub fn first_commit_seen_at(&self) -> Option<Duration> {
        self.first.map(|first| first.at)
    }

    /// Seconds from the first commit seen to the last sample.
    pub fn measured_seconds(&self) -> f64 {
        match (self.first, self.last) {
            (Some(first), Some(last)) => last.at.saturating_sub(first.at).as_secs_f64(),
            _ => 0.0,
        }
    }

    /// Records per second between the first sample with a commit and the last sample. `None`
    /// until two samples with a commit, at different times and counts, were seen (for example
    /// when the whole input went in one commit: too little input to measure).
    pub fn rate(&self) -> Option<f64> {
        let (first, last) = (self.first?, self.last?);
        let records = last.committed - first.committed;
        let seconds = last.at.checked_sub(first.at)?.as_secs_f64();
        (records > 0 && seconds > 0.0).then(|| records as f64 / seconds)
    }
}

/// End-to-end latencies in milliseconds, summarised.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LatencySummary {
    pub samples: u64,
    pub p50_ms: u64,
    pub p99_ms: u64,
    pub max_ms: u64,
}

impl LatencySummary {
    /// Negative latencies (clock steps) count as 0. `None` for no samples.
    pub fn from_millis(latencies: impl IntoIterator<Item = i64>) -> Option<Self> {
        let mut sorted: Vec<u64> = latencies
            .into_iter()
            .map(|ms| u64::try_from(ms).unwrap_or(0))
            .collect();
        sorted.sort_unstable();
        Some(Self {
            samples: sorted.len() as u64,
            p50_ms: percentile(&sorted, 50.0)?,
            p99_ms: percentile(&sorted, 99.0)?,
            max_ms: *sorted.last()?,
        })
    }
}

/// Latency samples `(send time, latency)` without those sent in the first `ramp_up_ms` after the
/// first send.
pub fn without_ramp_up(samples: Vec<(i64, i64)>, ramp_up_ms: i64) -> Vec<(i64, i64)> {
    let Some(first) = samples.iter().map(|&(sent, _)| sent).min() else {
        return samples;
    };
    samples
        .into_iter()
        .filter(|&(sent, _)| sent >= first + ramp_up_ms)
        .collect()
}

/// Whether the pipeline kept up with the rate it was offered. A pipeline that keeps up has a
/// steady latency of the order of its commit interval; one that falls behind builds a queue, and
/// the latency grows through the run (or, when it fell behind at once, is many commit intervals
/// from the start) — then the figures measure the queue, not the pipeline.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LatencyTrend {
    /// Median latency of the records sent in the first quarter of the run.
    pub first_quarter_p50_ms: u64,
    /// Median latency of the records sent in the last quarter of the run.
    pub last_quarter_p50_ms: u64,
    /// The last quarter's median is at most twice the first's plus [`KEPT_UP_SLACK_MS`], and the
    /// overall median at most [`KEPT_UP_COMMIT_INTERVALS`] commit intervals plus that slack.
    pub kept_up: bool,
}

/// Jitter allowed before a latency counts as growing or queued.
pub const KEPT_UP_SLACK_MS: u64 = 200;
/// A median latency longer than this many commit intervals is queueing: in a pipeline that keeps
/// up, a record waits at most one interval for its batch to close, then for one transaction.
pub const KEPT_UP_COMMIT_INTERVALS: u64 = 3;

impl LatencyTrend {
    /// `samples`: (send time, latency) in milliseconds, in any order. `None` for fewer than 4.
    pub fn from_samples(mut samples: Vec<(i64, i64)>, commit_interval_ms: u64) -> Option<Self> {
        if samples.len() < 4 {
            return None;
        }
        samples.sort_unstable();
        let quarter = samples.len() / 4;
        let p50 = |part: &[(i64, i64)]| {
            let mut latencies: Vec<u64> = part
                .iter()
                .map(|&(_, latency)| u64::try_from(latency).unwrap_or(0))
                .collect();
            latencies.sort_unstable();
            percentile(&latencies, 50.0)
        };
        let first = p50(&samples[..quarter])?;
        let last = p50(&samples[samples.len() - quarter..])?;
        let overall = p50(&samples)?;
        let growing = last > 2 * first + KEPT_UP_SLACK_MS;
        let queued = overall > KEPT_UP_COMMIT_INTERVALS * commit_interval_ms + KEPT_UP_SLACK_MS;
        Some(Self {
            first_quarter_p50_ms: first,
            last_quarter_p50_ms: last,
            kept_up: !growing && !queued,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(ms: u64, committed: i64) -> CommitSample {
        CommitSample {
            at: Duration::from_millis(ms),
            committed,
        }
    }

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[7.0]), Some(7.0));
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[1.0, f64::NAN]), None);
    }

    #[test]
    fn ratio_needs_a_positive_denominator() {
        assert_eq!(ratio(90.0, 100.0), Some(0.9));
        assert_eq!(ratio(1.0, 0.0), None);
        assert_eq!(ratio(1.0, -2.0), None);
    }

    #[test]
    fn nearest_rank_percentiles() {
        let sorted: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&sorted, 50.0), Some(50));
        assert_eq!(percentile(&sorted, 99.0), Some(99));
        assert_eq!(percentile(&sorted, 100.0), Some(100));
        assert_eq!(percentile(&sorted, 0.0), Some(1));
        assert_eq!(percentile(&[5, 9], 50.0), Some(5));
        assert_eq!(percentile(&[5, 9], 51.0), Some(9));
        assert_eq!(percentile(&[42], 99.0), Some(42));
        assert_eq!(percentile(&[], 50.0), None);
        assert_eq!(percentile(&[1], 101.0), None);
    }

    #[test]
    fn megabytes_are_decimal() {
        assert_eq!(megabytes_per_second(1000.0, 1000.0), 1.0);
    }

    #[test]
    fn rate_runs_from_the_first_commit_seen_to_the_end() {
        let mut progress = CommitProgress::new(10_000);
        // Start-up: nothing committed yet, however long it takes.
        assert!(!progress.observe(sample(0, 0)));
        assert!(!progress.observe(sample(3_000, 0)));
        assert_eq!(progress.rate(), None);
        // First commit seen at 3.05 s with 1,000 records already in it.
        assert!(!progress.observe(sample(3_050, 1_000)));
        assert_eq!(progress.rate(), None);
        assert!(!progress.observe(sample(3_550, 5_000)));
        assert!(progress.observe(sample(4_050, 10_000)));
        // 9,000 records in 1 s.
        assert_eq!(progress.rate(), Some(9_000.0));
        assert_eq!(progress.measured_seconds(), 1.0);
        assert_eq!(
            progress.first_commit_seen_at(),
            Some(Duration::from_millis(3_050))
        );
        assert_eq!(progress.committed(), 10_000);
    }

    #[test]
    fn everything_in_one_commit_cannot_be_measured() {
        let mut progress = CommitProgress::new(500);
        progress.observe(sample(0, 0));
        assert!(progress.observe(sample(100, 500)));
        assert_eq!(progress.rate(), None);
    }

    #[test]
    fn last_change_tracks_stalls() {
        let mut progress = CommitProgress::new(100);
        progress.observe(sample(0, 0));
        progress.observe(sample(500, 0));
        assert_eq!(progress.last_change(), Duration::ZERO);
        progress.observe(sample(600, 10));
        progress.observe(sample(2_000, 10));
        assert_eq!(progress.last_change(), Duration::from_millis(600));
        // A sample that reads lower (an older answer) neither moves progress back nor counts.
        progress.observe(sample(2_100, 5));
        assert_eq!(progress.committed(), 10);
        assert_eq!(progress.last_change(), Duration::from_millis(600));
    }

    #[test]
    fn a_steady_latency_kept_up_and_a_growing_or_queued_one_did_not() {
        // 1,000 records over 10 s with a jittery but steady 80-120 ms latency.
        let steady: Vec<(i64, i64)> = (0..1000).map(|i| (i * 10, 80 + (i * 7) % 40)).collect();
        let trend = LatencyTrend::from_samples(steady, 100).expect("enough samples");
        assert!(trend.kept_up, "{trend:?}");

        // The same run falling behind: every record waits 5 ms longer than the one before.
        let growing: Vec<(i64, i64)> = (0..1000).map(|i| (i * 10, 100 + i * 5)).collect();
        let trend = LatencyTrend::from_samples(growing, 100).expect("enough samples");
        assert!(!trend.kept_up, "{trend:?}");
        assert!(trend.last_quarter_p50_ms > trend.first_quarter_p50_ms * 5);

        // The order the samples come in does not matter (arrival order is not send order).
        let shuffled: Vec<(i64, i64)> = (0..1000).rev().map(|i| (i * 10, 100 + i * 5)).collect();
        assert_eq!(LatencyTrend::from_samples(shuffled, 100), Some(trend));

        // Behind from the start: a steady 3 s is a queue, not a 100 ms pipeline's latency.
        let queued: Vec<(i64, i64)> = (0..1000).map(|i| (i * 10, 3000 + i % 50)).collect();
        let trend = LatencyTrend::from_samples(queued.clone(), 100).expect("enough samples");
        assert!(!trend.kept_up, "{trend:?}");
        // ... though with a 2 s commit interval, 3 s is what it takes.
        let trend = LatencyTrend::from_samples(queued, 2000).expect("enough samples");
        assert!(trend.kept_up, "{trend:?}");

        assert_eq!(LatencyTrend::from_samples(vec![(0, 1); 3], 100), None);
    }

    #[test]
    fn ramp_up_is_measured_from_the_first_send() {
        let samples = vec![
            (1_500, 9),
            (1_000, 500),
            (3_000, 7),
            (2_999, 400),
            (4_000, 8),
        ];
        assert_eq!(
            without_ramp_up(samples, 2_000),
            vec![(3_000, 7), (4_000, 8)]
        );
        assert_eq!(without_ramp_up(Vec::new(), 2_000), Vec::new());
    }

    #[test]
    fn latency_summary() {
        let summary = LatencySummary::from_millis((1..=200).rev().chain([-3]));
        assert_eq!(
            summary,
            Some(LatencySummary {
                samples: 201,
                p50_ms: 100,
                p99_ms: 198,
                max_ms: 200,
            })
        );
        assert_eq!(LatencySummary::from_millis([]), None);
    }
}
