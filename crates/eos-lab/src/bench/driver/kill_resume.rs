//! The kill-to-resume phase: a processor SIGKILLed while it commits steadily, and the time its
//! successor takes to commit again.

// The driver's state, constants and imports: this is one more `impl Bench`, split by phase.
use super::*;

impl Bench {
    /// Under a steady load, SIGKILLs the processor and starts the next one at once under the same
    /// instance id — the same `transactional.id`, `group.instance.id` and state directory, as an
    /// orchestrator restarting a pod — `--kill-resume-kills` times. Each time: from the kill to
    /// the new process's first committed output, read from its records-out counter, which moves
    /// only after a transaction committed (so the output is visible to `read_committed` readers).
    pub(super) fn kill_resume(&mut self, size: usize) -> anyhow::Result<KillResumeFigures> {
        let kills = self.options.kill_resume_kills;
        let rate = self.options.kill_resume_rate;
        let input = self.name("kill-resume-in");
        self.topics.push(input.clone());
        self.runtime
            .block_on(ensure_topic(&self.settings, &input, self.layout()))
            .with_context(|| format!("creating topic {input:?}"))?;
        let run = self.processor_run(
            "kill-resume",
            Guarantee::ExactlyOnce,
            self.options.max_batch,
            &input,
        );

        // Enough records for every kill at its slowest; the producer is stopped once they are done.
        let per_kill = KILL_SETTLE + self.options.stall_timeout;
        let budget = rate * per_kill.as_secs() * (u64::from(kills) + 1);
        let producing_done = Arc::new(AtomicBool::new(false));
        let producer = {
            let (settings, runtime) = (self.settings.clone(), self.runtime.clone());
            let spec = self.workload_spec(budget, size, self.seed_base + 3_000_000);
            let options = self.produce_options(&input, spec, rate);
            let done = Arc::clone(&producing_done);
            std::thread::spawn(move || {
                runtime.block_on(produce::run(
                    &settings,
                    options,
                    ProgressBar::hidden(),
                    done,
                ))
            })
        };
        let measured = self.kill_and_resume_each(&run, kills);
        producing_done.store(true, Ordering::Relaxed);
        let produced = producer
            .join()
            .map_err(|_| anyhow!("the kill-to-resume producer panicked"))?;
        let (resume_ms, process) = measured?;
        match produced {
            Ok(_) | Err(produce::ProduceError::Interrupted { .. }) => {}
            Err(error) => return Err(error).context("producing the kill-to-resume load"),
        }
        process.stop(STOP_TIMEOUT)?;
        let mut topics = vec![input];
        topics.extend(run.created_topics());
        self.delete_now(&topics)?;
        let figures = KillResumeFigures::new(kills, rate, size, resume_ms);
        tracing::info!(
            median_ms = figures.median_ms,
            worst_ms = figures.worst_ms,
            "kill-to-resume run done"
        );
        Ok(figures)
    }

    /// The kills of [`Self::kill_resume`]: each resume time in milliseconds, and the last process.
    pub(super) fn kill_and_resume_each(
        &mut self,
        run: &ProcessorRun,
        kills: u32,
    ) -> anyhow::Result<(Vec<u64>, ProcessorProcess)> {
        let mut process = self.spawn(run)?;
        let mut metrics_url = self.metrics_url(&mut process)?;
        // The first process joins the group, creates its topics and restores nothing: its start is
        // not a resume.
        self.first_committed_output(&mut process, &metrics_url, Instant::now())?;
        let mut resume_ms = Vec::new();
        for kill in 1..=kills {
            std::thread::sleep(KILL_SETTLE);
            self.check_interrupted()?;
            process.ensure_running()?;
            process.kill_hard()?;
            let killed_at = Instant::now();
            process = self.spawn(run)?;
            metrics_url = self.metrics_url(&mut process)?;
            let resumed = self.first_committed_output(&mut process, &metrics_url, killed_at)?;
            tracing::info!(
                kill,
                resume_ms = resumed.as_millis(),
                "resumed after SIGKILL"
            );
            resume_ms.push(resumed.as_millis() as u64);
        }
        Ok((resume_ms, process))
    }

    /// `/metrics` of a processor started with `--metrics-addr 127.0.0.1:0` (it logs the address
    /// it bound).
    pub(super) fn metrics_url(&self, process: &mut ProcessorProcess) -> anyhow::Result<String> {
        let addr = process.wait_for_log_field("metrics_addr", self.options.stall_timeout)?;
        Ok(format!("http://{addr}/metrics"))
    }

    /// How long after `since` the process's records-out counter first moved.
    pub(super) fn first_committed_output(
        &self,
        process: &mut ProcessorProcess,
        metrics_url: &str,
        since: Instant,
    ) -> anyhow::Result<Duration> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(1))
            .build()
            .context("building the metrics client")?;
        loop {
            self.check_interrupted()?;
            process.ensure_running()?;
            let text = self.runtime.block_on(async {
                http.get(metrics_url)
                    .send()
                    .await?
                    .error_for_status()?
                    .text()
                    .await
            });
            if let Ok(text) = text
                && prometheus_value(&text, RECORDS_OUT_METRIC).is_some_and(|out| out > 0.0)
            {
                return Ok(since.elapsed());
            }
            if since.elapsed() >= self.options.stall_timeout {
                bail!(
                    "kill-to-resume: the restarted processor committed no output within {}; log: {}",
                    humantime::format_duration(self.options.stall_timeout),
                    process.log().display()
                );
            }
            std::thread::sleep(RESUME_POLL_INTERVAL);
        }
    }
}
