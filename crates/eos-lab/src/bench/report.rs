//! What the benchmark measured, and its text rendering (the `--json` output is the serde form
//! of the same structs).

use std::fmt::Write as _;

use comfy_table::presets::UTF8_FULL_CONDENSED;
use comfy_table::{CellAlignment, Table};
use eos_core::Guarantee;
use serde::Serialize;

use crate::bench::figures::{LatencySummary, LatencyTrend, median, megabytes_per_second, ratio};
use crate::bench::record_format::RecordFormat;
use eosctl::report::grouped;

/// The exactly-once/at-least-once throughput ratio aimed at, from this record size up
/// (docs/BENCHMARKS.md).
pub(super) const RATIO_TARGET: f64 = 0.95;
/// Exactly-once over the pass-through copy of the same input, from the same record size up.
pub(super) const PASS_THROUGH_RATIO_TARGET: f64 = 0.80;
pub(super) const RATIO_TARGET_MIN_BYTES: usize = 1024;
/// Single-record transactions a second (docs/BENCHMARKS.md "Single-record transactions").
pub(super) const SINGLE_RECORD_TARGET: f64 = 200.0;
/// From a processor's SIGKILL to its successor's first committed output.
pub(super) const KILL_RESUME_TARGET_MS: u64 = 5_000;

/// Everything the benchmark measured. Serialised as the `--json` output.
#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    pub processor_bin: String,
    pub debug_build: bool,
    pub partitions: i32,
    /// Processor instances (processes in one group) in each throughput round.
    pub instances: u32,
    pub commit_interval_ms: u64,
    pub max_batch: u32,
    pub rounds: u32,
    pub throughput: Vec<SizeThroughput>,
    pub single_record: Option<SingleRecordFigures>,
    /// The latency runs in the order they ran: the first at half the exactly-once peak (or at
    /// `--latency-rate`); when the pipeline did not keep up, again at half that rate, at most
    /// [`LATENCY_RETRIES`](crate::bench::LATENCY_RETRIES) times.
    pub latency: Vec<LatencyFigures>,
    pub kill_resume: Option<KillResumeFigures>,
    pub topics_deleted: bool,
    pub machine: MachineLoad,
}

/// Whatever else runs on the machine competes with the broker and the processor for CPU: the
/// figures are only comparable between quiet runs.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct MachineLoad {
    pub cpus: usize,
    /// 1-minute load average when the benchmark started (Linux only); later ones would mostly
    /// show the benchmark itself.
    pub load_average_at_start: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct SizeThroughput {
    /// The requested value size (`--sizes`).
    pub value_bytes: usize,
    /// The mean size of the values actually written (the smallest envelope the workload
    /// generator writes is larger than 100 bytes).
    pub mean_value_bytes: f64,
    pub records: u64,
    pub exactly_once: PathThroughput,
    pub at_least_once: PathThroughput,
    /// A plain consumer → producer copy of the same input (`bench::pass_through`).
    pub pass_through: PathThroughput,
    /// Median exactly-once rate over median at-least-once rate.
    pub ratio_eo_to_alo: Option<f64>,
    pub ratio_target: Option<f64>,
    /// Median exactly-once rate over the median pass-through rate.
    pub ratio_eo_to_pass_through: Option<f64>,
    pub pass_through_ratio_target: Option<f64>,
    /// Exactly-once over the same events in each registry format of `--format` (JSON's is
    /// `exactly_once`), in the order asked for.
    pub formats: Vec<FormatThroughput>,
}

/// Exactly-once rounds over one registry format's input: the same events as the JSON input.
#[derive(Debug, Clone, Serialize)]
pub struct FormatThroughput {
    pub format: RecordFormat,
    /// The mean size of its values (the wire format's header included).
    pub mean_value_bytes: f64,
    pub exactly_once: PathThroughput,
    /// Its median exactly-once rate over JSON's.
    pub ratio_to_json: Option<f64>,
}

impl FormatThroughput {
    pub(super) fn new(
        format: RecordFormat,
        rounds: Vec<RoundFigures>,
        mean_value_bytes: f64,
        json: &PathThroughput,
    ) -> Self {
        let exactly_once = PathThroughput::new(WritePath::ExactlyOnce, rounds, mean_value_bytes);
        let ratio_to_json = exactly_once
            .median_records_per_second
            .zip(json.median_records_per_second)
            .and_then(|(format, json)| ratio(format, json));
        Self {
            format,
            mean_value_bytes,
            exactly_once,
            ratio_to_json,
        }
    }
}

/// What one set of rounds ran over the input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum WritePath {
    /// eos-processor with `--guarantee exactly-once`.
    ExactlyOnce,
    /// eos-processor with `--guarantee at-least-once`.
    AtLeastOnce,
    /// The plain copy, no processor.
    PassThrough,
}

impl std::fmt::Display for WritePath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::ExactlyOnce => "exactly-once",
            Self::AtLeastOnce => "at-least-once",
            Self::PassThrough => "pass-through",
        })
    }
}

impl From<Guarantee> for WritePath {
    fn from(guarantee: Guarantee) -> Self {
        match guarantee {
            Guarantee::ExactlyOnce => Self::ExactlyOnce,
            Guarantee::AtLeastOnce => Self::AtLeastOnce,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct PathThroughput {
    pub path: WritePath,
    /// In the order they ran.
    pub rounds: Vec<RoundFigures>,
    pub median_records_per_second: Option<f64>,
    pub median_megabytes_per_second: Option<f64>,
    pub median_cpu_ms_per_1000_records: Option<f64>,
}

impl PathThroughput {
    pub(super) fn new(path: WritePath, rounds: Vec<RoundFigures>, bytes_per_record: f64) -> Self {
        let rates: Vec<f64> = rounds.iter().map(|r| r.records_per_second).collect();
        let median_rate = median(&rates);
        let cpu: Option<Vec<f64>> = rounds.iter().map(|r| r.cpu_ms_per_1000_records).collect();
        Self {
            path,
            median_records_per_second: median_rate,
            median_megabytes_per_second: median_rate
                .map(|rate| megabytes_per_second(rate, bytes_per_record)),
            median_cpu_ms_per_1000_records: cpu.as_deref().and_then(median),
            rounds,
        }
    }
}

#[derive(Debug, Clone, Copy, Serialize)]
pub struct RoundFigures {
    pub records_per_second: f64,
    /// From the first commit seen to the end of the input.
    pub measured_seconds: f64,
    /// From the process start to the first commit seen (not part of the rate).
    pub startup_seconds: f64,
    /// CPU time (user + system) per 1,000 input records of the process that did the work: the
    /// processor over its whole life, start-up included, or this eos-lab during the pass-through
    /// copy. Unlike the rate, hardly affected by other work on the machine.
    pub cpu_ms_per_1000_records: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct SingleRecordFigures {
    pub records: u64,
    pub value_bytes: usize,
    /// = records per second: one transaction per record.
    pub transactions_per_second: f64,
    /// The same input copied one record per transaction by the processor's producer with
    /// nothing else in the transaction: the floor under `transactions_per_second` on this
    /// broker and machine.
    pub bare_transactions_per_second: Option<f64>,
    pub target: f64,
}

/// SIGKILL of the processor under load, restarted at once under the same instance id.
#[derive(Debug, Clone, Serialize)]
pub struct KillResumeFigures {
    pub kills: u32,
    pub rate_records_per_second: u64,
    pub value_bytes: usize,
    /// For each kill in order: milliseconds from the SIGKILL to the restarted process's first
    /// committed output.
    pub resume_ms: Vec<u64>,
    pub median_ms: Option<f64>,
    pub worst_ms: Option<u64>,
    pub target_ms: u64,
}

impl KillResumeFigures {
    pub(super) fn new(kills: u32, rate: u64, value_bytes: usize, resume_ms: Vec<u64>) -> Self {
        let as_f64: Vec<f64> = resume_ms.iter().map(|&ms| ms as f64).collect();
        Self {
            kills,
            rate_records_per_second: rate,
            value_bytes,
            median_ms: median(&as_f64),
            worst_ms: resume_ms.iter().copied().max(),
            resume_ms,
            target_ms: KILL_RESUME_TARGET_MS,
        }
    }
}

/// Where a latency run's rate came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LatencyRateBasis {
    /// Half the exactly-once median rate of the first size.
    HalfPeak,
    /// `--latency-rate`.
    Flag,
    /// Half the rate of the previous run, which did not keep up.
    HalvedAfterFallingBehind,
}

#[derive(Debug, Clone, Serialize)]
pub struct LatencyFigures {
    /// The exactly-once median rate of the first size (absent with `--rounds 0`).
    pub peak_records_per_second: Option<f64>,
    pub rate_records_per_second: u64,
    pub rate_basis: LatencyRateBasis,
    pub value_bytes: usize,
    /// Measured; the first seconds of the producer's run are not (see [`PRODUCER_RAMP_UP`](crate::bench::PRODUCER_RAMP_UP)).
    pub seconds: u64,
    /// `samples` is the number of output records measured.
    #[serde(flatten)]
    pub summary: LatencySummary,
    #[serde(flatten)]
    pub trend: LatencyTrend,
}

fn rate_text(rate: Option<f64>) -> String {
    rate.map_or_else(|| "-".to_owned(), |rate| grouped(rate.round() as i64))
}

/// One decimal, or `-` for a figure that could not be taken.
fn mb_text(value: Option<f64>) -> String {
    value.map_or_else(|| "-".to_owned(), |value| format!("{value:.1}"))
}

fn verdict(value: f64, target: f64) -> &'static str {
    if value >= target { "met" } else { "NOT met" }
}

pub fn bench_text(report: &BenchReport) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "eos-processor benchmark: {}", report.processor_bin);
    if report.debug_build {
        let _ = writeln!(
            out,
            "WARNING: a debug build; build with --release for meaningful figures"
        );
    }
    if report.instances > 1 {
        let _ = writeln!(
            out,
            "{} eos-processor instances in each throughput round (one group; its rate, their CPU \
             together)",
            report.instances
        );
    }
    let _ = writeln!(
        out,
        "{} partitions, commit interval {} ms, max batch {}, {} round{} of each path \
         (interleaved EO, ALO, pass-through, ...), fresh group per round; processor rates from the \
         first commit to the end of the input, pass-through (a plain consumer -> producer copy in \
         eos-lab) from the first record read to the last acknowledged; CPU ms/1k = CPU time per \
         1,000 records of the processor (of eos-lab for the pass-through)",
        report.partitions,
        report.commit_interval_ms,
        report.max_batch,
        report.rounds,
        if report.rounds == 1 { "" } else { "s" }
    );
    if !report.throughput.is_empty() {
        let _ = writeln!(out, "{}", throughput_table(report));
    }
    if report
        .throughput
        .iter()
        .any(|size| !size.formats.is_empty())
    {
        let _ = writeln!(
            out,
            "exactly-once by record format (the same events; registry formats in the schema \
             registry's wire format, in and out):\n{}",
            format_table(report)
        );
    }
    if let Some(single) = &report.single_record {
        let _ = writeln!(
            out,
            "single-record transactions/s: {:.0}  ({} records of {} B, exactly-once, \
             --max-batch 1; target >= {:.0}: {})",
            single.transactions_per_second,
            grouped(single.records),
            single.value_bytes,
            single.target,
            verdict(single.transactions_per_second, single.target)
        );
        if let Some(bare) = single.bare_transactions_per_second {
            let _ = writeln!(
                out,
                "  the same input, one record per transaction with nothing else in it: {bare:.0}/s \
                 (the processor at {})",
                ratio(single.transactions_per_second, bare)
                    .map_or_else(|| "-".to_owned(), |share| format!("{share:.2} of it"))
            );
        }
    }
    for latency in &report.latency {
        let basis = match (latency.rate_basis, latency.peak_records_per_second) {
            (LatencyRateBasis::HalfPeak, Some(peak)) => format!(
                "half of the exactly-once peak of {}/s",
                grouped(peak.round() as i64)
            ),
            (LatencyRateBasis::HalvedAfterFallingBehind, _) => {
                "half the rate of the run before".to_owned()
            }
            _ => "--latency-rate".to_owned(),
        };
        let _ = writeln!(
            out,
            "latency at {} records/s ({basis}), {} B, {} records over {} s: p50 {} ms, p99 {} ms, \
             max {} ms",
            grouped(latency.rate_records_per_second),
            latency.value_bytes,
            grouped(latency.summary.samples),
            latency.seconds,
            latency.summary.p50_ms,
            latency.summary.p99_ms,
            latency.summary.max_ms
        );
        if !latency.trend.kept_up {
            let _ = writeln!(
                out,
                "  the pipeline did not keep up at this rate (median latency {} ms over the first \
                 quarter of the run, {} ms over the last): these figures measure a queue, not \
                 the pipeline",
                latency.trend.first_quarter_p50_ms, latency.trend.last_quarter_p50_ms
            );
        }
    }
    if let Some(kill) = &report.kill_resume
        && let (Some(median_ms), Some(worst_ms)) = (kill.median_ms, kill.worst_ms)
    {
        let each = kill
            .resume_ms
            .iter()
            .map(|ms| grouped(*ms))
            .collect::<Vec<_>>()
            .join("  ");
        let _ = writeln!(
            out,
            "SIGKILL to the restarted processor's first committed output (same instance id, at \
             once, {} records/s of {} B): median {} ms, worst {} ms over {} kills (target <= {} \
             ms: {}); each: {each}",
            grouped(kill.rate_records_per_second),
            kill.value_bytes,
            grouped(median_ms.round() as i64),
            grouped(worst_ms),
            kill.kills,
            grouped(kill.target_ms),
            if worst_ms <= kill.target_ms {
                "met"
            } else {
                "NOT met"
            }
        );
    }
    let machine = &report.machine;
    if let Some(load) = machine.load_average_at_start {
        let _ = writeln!(
            out,
            "machine: {} CPUs, 1-minute load average {load:.2} before the benchmark (other work \
             on the machine skews the figures)",
            machine.cpus
        );
    }
    if !report.topics_deleted {
        let _ = writeln!(out, "the benchmark's topics were kept (--keep-topics)");
    }
    out
}

fn throughput_table(report: &BenchReport) -> Table {
    let mut table = Table::new();
    table.load_preset(UTF8_FULL_CONDENSED);
    table.set_header([
        "size".to_owned(),
        "guarantee".to_owned(),
        format!("records/s (median of {})", report.rounds),
        "MB/s".to_owned(),
        "CPU ms/1k".to_owned(),
        "each round (records/s)".to_owned(),
    ]);
    for size in &report.throughput {
        let label = if (size.mean_value_bytes - size.value_bytes as f64).abs()
            > 0.1 * size.value_bytes as f64
        {
            format!("{} B (~{:.0} B)", size.value_bytes, size.mean_value_bytes)
        } else {
            format!("{} B", size.value_bytes)
        };
        for (index, figures) in [&size.exactly_once, &size.at_least_once, &size.pass_through]
            .into_iter()
            .enumerate()
        {
            let rounds = each_round(figures);
            table.add_row([
                if index == 0 {
                    label.clone()
                } else {
                    String::new()
                },
                figures.path.to_string(),
                rate_text(figures.median_records_per_second),
                mb_text(figures.median_megabytes_per_second),
                mb_text(figures.median_cpu_ms_per_1000_records),
                rounds,
            ]);
        }
        for (name, value, target) in [
            ("ratio EO/ALO", size.ratio_eo_to_alo, size.ratio_target),
            (
                "ratio EO/pass-through",
                size.ratio_eo_to_pass_through,
                size.pass_through_ratio_target,
            ),
        ] {
            let target = match (value, target) {
                (Some(value), Some(target)) => {
                    format!("target >= {target:.2}: {}", verdict(value, target))
                }
                _ => String::new(),
            };
            table.add_row([
                String::new(),
                name.to_owned(),
                value.map_or_else(|| "-".to_owned(), |r| format!("{r:.2}")),
                String::new(),
                String::new(),
                target,
            ]);
        }
    }
    for index in [2, 3, 4] {
        if let Some(column) = table.column_mut(index) {
            column.set_cell_alignment(CellAlignment::Right);
        }
    }
    table
}

/// Exactly-once in each record format, JSON first, per size.
fn format_table(report: &BenchReport) -> Table {
    let mut table = Table::new();
    table.load_preset(UTF8_FULL_CONDENSED);
    table.set_header([
        "size".to_owned(),
        "format".to_owned(),
        "value bytes (mean)".to_owned(),
        format!("records/s (median of {})", report.rounds),
        "CPU ms/1k".to_owned(),
        "÷ JSON".to_owned(),
        "each round (records/s)".to_owned(),
    ]);
    for size in &report.throughput {
        let json = (
            RecordFormat::Json,
            size.mean_value_bytes,
            &size.exactly_once,
            Some(1.0),
        );
        let others = size.formats.iter().map(|format| {
            (
                format.format,
                format.mean_value_bytes,
                &format.exactly_once,
                format.ratio_to_json,
            )
        });
        for (index, (format, bytes, figures, to_json)) in
            std::iter::once(json).chain(others).enumerate()
        {
            table.add_row([
                if index == 0 {
                    format!("{} B", size.value_bytes)
                } else {
                    String::new()
                },
                format.to_string(),
                format!("{bytes:.0}"),
                rate_text(figures.median_records_per_second),
                mb_text(figures.median_cpu_ms_per_1000_records),
                to_json.map_or_else(|| "-".to_owned(), |r| format!("{r:.2}")),
                each_round(figures),
            ]);
        }
    }
    for index in [2, 3, 4, 5] {
        if let Some(column) = table.column_mut(index) {
            column.set_cell_alignment(CellAlignment::Right);
        }
    }
    table
}

/// Each round's rate, in the order they ran.
fn each_round(figures: &PathThroughput) -> String {
    figures
        .rounds
        .iter()
        .map(|r| grouped(r.records_per_second.round() as i64))
        .collect::<Vec<_>>()
        .join("  ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round(rate: f64) -> RoundFigures {
        RoundFigures {
            records_per_second: rate,
            measured_seconds: 1.0,
            startup_seconds: 2.0,
            cpu_ms_per_1000_records: Some(20.0),
        }
    }

    #[test]
    fn text_report_shows_medians_ratio_and_targets() {
        let exactly_once = PathThroughput::new(
            WritePath::ExactlyOnce,
            vec![round(9_000.0), round(9_500.0), round(8_000.0)],
            1024.0,
        );
        let at_least_once = PathThroughput::new(
            WritePath::AtLeastOnce,
            vec![round(10_000.0), round(11_000.0), round(9_000.0)],
            1024.0,
        );
        let pass_through = PathThroughput::new(
            WritePath::PassThrough,
            vec![round(12_000.0), round(12_500.0), round(11_000.0)],
            1024.0,
        );
        assert_eq!(exactly_once.median_records_per_second, Some(9_000.0));
        let avro = FormatThroughput::new(
            RecordFormat::Avro,
            vec![round(10_800.0), round(9_900.0), round(11_000.0)],
            702.4,
            &exactly_once,
        );
        assert_eq!(avro.ratio_to_json, Some(1.2));
        let report = BenchReport {
            processor_bin: "/x/target/release/eos-processor".into(),
            debug_build: false,
            partitions: 3,
            instances: 1,
            commit_interval_ms: 100,
            max_batch: 5000,
            rounds: 3,
            throughput: vec![SizeThroughput {
                value_bytes: 1024,
                mean_value_bytes: 1024.0,
                records: 200_000,
                ratio_eo_to_alo: Some(0.9),
                ratio_target: Some(RATIO_TARGET),
                ratio_eo_to_pass_through: Some(0.75),
                pass_through_ratio_target: Some(PASS_THROUGH_RATIO_TARGET),
                formats: vec![avro],
                exactly_once,
                at_least_once,
                pass_through,
            }],
            single_record: Some(SingleRecordFigures {
                records: 2000,
                value_bytes: 1024,
                transactions_per_second: 80.0,
                bare_transactions_per_second: Some(100.0),
                target: SINGLE_RECORD_TARGET,
            }),
            latency: Vec::new(),
            kill_resume: Some(KillResumeFigures::new(
                3,
                500,
                1024,
                vec![2_100, 6_400, 1_900],
            )),
            topics_deleted: true,
            machine: MachineLoad::default(),
        };
        let text = bench_text(&report);
        assert!(text.contains("9,000"), "{text}");
        assert!(text.contains("9.2"), "{text}"); // 9,000 × 1024 B = 9.2 MB/s
        assert!(text.contains("0.90"), "{text}");
        assert!(text.contains("target >= 0.95: NOT met"), "{text}");
        assert!(text.contains("ratio EO/pass-through"), "{text}");
        assert!(text.contains("12,000"), "{text}");
        assert!(text.contains("target >= 0.80: NOT met"), "{text}");
        assert!(text.contains("target >= 200: NOT met"), "{text}");
        assert!(
            text.contains("nothing else in it: 100/s (the processor at 0.80 of it)"),
            "{text}"
        );
        assert!(
            text.contains(
                "median 2,100 ms, worst 6,400 ms over 3 kills (target <= 5,000 ms: NOT met)"
            ),
            "{text}"
        );
        assert!(text.contains("exactly-once by record format"), "{text}");
        let avro_row = text
            .lines()
            .find(|line| line.contains(" avro "))
            .expect("an avro row");
        for cell in ["702", "10,800", "1.20", "10,800  9,900  11,000"] {
            assert!(avro_row.contains(cell), "{cell} in {avro_row}");
        }
        let json = serde_json::to_value(&report).expect("serialisable");
        assert_eq!(json["throughput"][0]["formats"][0]["format"], "avro");
        assert_eq!(
            json["throughput"][0]["exactly_once"]["path"],
            "exactly-once"
        );
        assert_eq!(
            json["throughput"][0]["pass_through"]["path"],
            "pass-through"
        );
    }
}
