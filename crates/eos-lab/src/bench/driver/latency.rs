//! The latency phase: a processor fed at a steady rate, each output's latency from its input's
//! timestamp, repeated at half the rate when the processor fell behind.

// The driver's state, constants and imports: this is one more `impl Bench`, split by phase.
use super::*;

impl Bench {
    /// Latency at half of `peak` (or at `--latency-rate`). A latency measured while the
    /// pipeline falls behind is the length of a queue, not the pipeline's latency: without
    /// `--latency-rate`, such a run is repeated at half the rate, up to [`LATENCY_RETRIES`] times.
    /// (The peak is measured with the processor alone; during the latency run the producer and
    /// the output reader share the machine, which on a small one can take more than half.)
    pub(super) fn latency(
        &mut self,
        peak: Option<f64>,
        size: usize,
    ) -> anyhow::Result<Vec<LatencyFigures>> {
        let (mut rate, mut basis) = match (self.options.latency_rate, peak) {
            (Some(rate), _) => (rate, LatencyRateBasis::Flag),
            (None, Some(peak)) => (
                ((peak / 2.0).round() as u64).max(1),
                LatencyRateBasis::HalfPeak,
            ),
            (None, None) => bail!("no exactly-once rate was measured to base the latency run on"),
        };
        let mut runs = Vec::new();
        loop {
            let figures = self.latency_run(runs.len() + 1, rate, basis, peak, size)?;
            let kept_up = figures.trend.kept_up;
            runs.push(figures);
            let retries = runs.len() - 1;
            if kept_up || basis == LatencyRateBasis::Flag || retries >= LATENCY_RETRIES || rate < 2
            {
                return Ok(runs);
            }
            rate /= 2;
            basis = LatencyRateBasis::HalvedAfterFallingBehind;
            tracing::info!(
                rate,
                "the pipeline fell behind: measuring again at half the rate"
            );
        }
    }

    /// One latency run: a warmed-up exactly-once processor, records produced at `rate`, and a
    /// read_committed reader of the output noting when each input's output arrives.
    pub(super) fn latency_run(
        &mut self,
        attempt: usize,
        rate: u64,
        basis: LatencyRateBasis,
        peak: Option<f64>,
        size: usize,
    ) -> anyhow::Result<LatencyFigures> {
        let seconds = self.options.latency_seconds;
        let records = rate * seconds;
        // Sent before the measured records, through the same producer, and not measured.
        let ramp_up_records = rate * PRODUCER_RAMP_UP.as_secs();
        let label = format!("latency-{attempt}");
        let input = self.name(&format!("{label}-in"));
        self.topics.push(input.clone());
        self.runtime
            .block_on(ensure_topic(&self.settings, &input, self.layout()))
            .with_context(|| format!("creating topic {input:?}"))?;
        let run = self.processor_run(
            &label,
            Guarantee::ExactlyOnce,
            self.options.max_batch,
            &input,
        );
        let offsets = GroupOffsetReader::new(&self.settings, &run.group)?;
        let mut process = self.spawn(&run)?;
        let started = Instant::now();

        tracing::info!(
            records = WARMUP_RECORDS,
            "warming up the latency run's processor"
        );
        let seed = self.seed_base + 2_000_000 + 2 * attempt as u64;
        self.produce(&input, WARMUP_RECORDS, size, 0, seed)?;
        let (partitions, warm_target) = self.input_extent(&input)?;
        self.follow_commits(
            std::slice::from_mut(&mut process),
            &offsets,
            &run,
            &partitions,
            warm_target,
            started,
        )?;
        let metadata = self.settings.metadata_client()?;
        let warm_ends: BTreeMap<i32, i64> =
            watermarks(&self.settings, &metadata, &input, &partitions)?
                .into_iter()
                .map(|(partition, (_, end))| (partition, end))
                .collect();
        let output_partitions = topic_partitions(&metadata, &self.settings, &run.output)?
            .ok_or_else(|| {
                anyhow!(
                    "the processor did not create its output topic {:?}",
                    run.output
                )
            })?;

        let collector = ArrivalCollector::start(
            &self.settings,
            &run.output,
            &output_partitions,
            warm_ends.clone(),
            ramp_up_records + records,
        )?;
        tracing::info!(rate, seconds, records, "producing for the latency run");
        let produced = self.produce(&input, ramp_up_records + records, size, rate, seed + 1);
        let arrivals = match produced {
            Ok(_) => collector.finish(&mut process, &self.stop, self.options.stall_timeout),
            Err(error) => {
                collector.abandon();
                Err(error)
            }
        }?;
        process.stop(STOP_TIMEOUT)?;
        let ends: BTreeMap<i32, i64> = watermarks(&self.settings, &metadata, &input, &partitions)?
            .into_iter()
            .map(|(partition, (_, end))| (partition, end))
            .collect();
        let sent_at = read_timestamps(
            &self.settings,
            &input,
            &warm_ends,
            &ends,
            self.options.stall_timeout,
        )?;
        let (samples, unmatched) = latency_samples(&arrivals, &sent_at);
        if unmatched > 0 {
            tracing::warn!(unmatched, "output records whose input record was not found");
        }
        let ramp_up_ms = PRODUCER_RAMP_UP.as_millis() as i64;
        let samples = without_ramp_up(samples, ramp_up_ms);
        if let Some(path) = &self.options.latency_samples {
            append_samples(path, rate, &samples)
                .with_context(|| format!("writing latency samples to {}", path.display()))?;
        }
        let summary = LatencySummary::from_millis(samples.iter().map(|&(_, latency)| latency))
            .ok_or_else(|| anyhow!("no output record arrived during the latency run"))?;
        let commit_interval_ms = self.options.commit_interval.as_millis() as u64;
        let trend = LatencyTrend::from_samples(samples, commit_interval_ms)
            .ok_or_else(|| anyhow!("too few output records to judge the latency run"))?;
        if !trend.kept_up {
            tracing::warn!(
                rate,
                first_quarter_p50_ms = trend.first_quarter_p50_ms,
                last_quarter_p50_ms = trend.last_quarter_p50_ms,
                "the pipeline did not keep up with this rate: the latency is a queue's"
            );
        }
        let mut topics = vec![input];
        topics.extend(run.created_topics());
        self.delete_now(&topics)?;
        tracing::info!(
            p50_ms = summary.p50_ms,
            p99_ms = summary.p99_ms,
            "latency run done"
        );
        Ok(LatencyFigures {
            peak_records_per_second: peak,
            rate_records_per_second: rate,
            rate_basis: basis,
            value_bytes: size,
            seconds,
            summary,
            trend,
        })
    }
}
