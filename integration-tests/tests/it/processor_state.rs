//! The processor's state on disk (docs/architecture/processor-state.md): a processor
//! SIGKILLed and restarted with the same `--state-dir` reads only the changelog's tail from its
//! local checkpoint (warm restore); with the state directory deleted it reads the whole
//! changelog (cold restore). Either way, re-sent events are still dropped as duplicates: the
//! audit is exact.

use eos_testkit::argv;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use eos_processor::state_store::{StateStore, instance_dir};
use integration_tests::eosctl::{self, Workload};
use integration_tests::service_process::ServiceProcess;
use integration_tests::{
    bootstrap_servers, create_topic, end_offsets_on, unique_name, wait_until_consumed,
};

const DRAIN_TIMEOUT: Duration = Duration::from_secs(120);

/// The processor's `--instance-id`: every start uses the same store on the same disk.
const INSTANCE: &str = "state-0";

struct Pipeline {
    bootstrap: String,
    input: String,
    output: String,
    group: String,
    state_dir: PathBuf,
}

/// The fields of the processor's "state restored" log line this test checks.
#[derive(Debug)]
struct Restored {
    mode: String,
    changelog_records: u64,
}

fn field<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    let needle = format!(" {name}=");
    line.split(&needle)
        .nth(1)?
        .split_whitespace()
        .next()
        .map(|value| value.trim_matches('"'))
}

impl Pipeline {
    fn changelog(&self) -> String {
        format!("{}-{}-changelog", self.group, self.input)
    }

    fn spawn(&self) -> anyhow::Result<ServiceProcess> {
        let args = argv!(eos_processor::Config {
            kafka.bootstrap_servers: &self.bootstrap,
            input_topic: &self.input,
            output_topic: &self.output,
            group_id: &self.group,
            instance.instance_id: INSTANCE,
            metrics_addr: "127.0.0.1:0",
            state_dir: &self.state_dir.display().to_string(),
        });
        ServiceProcess::spawn("eos-processor", &args, &[])
    }

    fn restored(&self, processor: &mut ServiceProcess) -> anyhow::Result<Restored> {
        let line = processor
            .wait_for_log_line("state restored", Duration::from_secs(60))
            .with_context(|| processor.log_tail(30))?;
        let mode = field(&line, "restore").unwrap_or_default().to_owned();
        let changelog_records = field(&line, "changelog_records")
            .and_then(|n| n.parse().ok())
            .with_context(|| format!("no changelog_records in {line:?}"))?;
        Ok(Restored {
            mode,
            changelog_records,
        })
    }

    /// The local checkpoint of the changelog's only partition, read from the store of a
    /// processor that is not running (a running one holds the store's lock).
    fn checkpoint(&self) -> anyhow::Result<Option<i64>> {
        let dir = instance_dir(&self.state_dir, &self.group, INSTANCE);
        let store = StateStore::open(&dir)?;
        let checkpoint = store.partition(&self.changelog(), 0)?.checkpoint()?;
        Ok(checkpoint.map(|checkpoint| checkpoint.next_offset))
    }

    /// SIGKILLs a drained `processor` with its local checkpoint at the changelog's end, and
    /// returns that end: what the warm restore after it must find, to read nothing but the tail.
    ///
    /// The processor moves the checkpoint up about a second after its last commit, once the
    /// commit marker is written, and says nothing when it does; while it runs, its store is
    /// locked. So the checkpoint is read after the kill, and when it is behind the end (a commit
    /// marker slow on a loaded machine; an abort, after which it waits for the next restore),
    /// the processor is started again on the same disk — its restore ends with a checkpoint at
    /// the end — and killed again.
    fn kill_with_the_checkpoint_at_the_end(
        &self,
        mut processor: ServiceProcess,
    ) -> anyhow::Result<i64> {
        const ATTEMPTS: usize = 5;
        for attempt in 1..=ATTEMPTS {
            // Two checkpoint intervals: the checkpoint is usually at the end by then.
            std::thread::sleep(Duration::from_secs(2));
            processor.kill_hard()?;
            let end = self.changelog_end()?;
            let checkpoint = self.checkpoint()?;
            if checkpoint == Some(end) {
                return Ok(end);
            }
            eprintln!(
                "attempt {attempt}: killed with the checkpoint at {checkpoint:?}, the changelog \
                 ends at {end}; restarting on the same disk"
            );
            processor = self.spawn()?;
            self.restored(&mut processor)?;
        }
        anyhow::bail!(
            "the local checkpoint never reached the changelog's end in {ATTEMPTS} attempts\n{}",
            processor.log_tail(30)
        )
    }

    fn produce(&self, workload: &Workload) -> anyhow::Result<()> {
        eosctl::produce_on(&self.bootstrap, &self.input, workload)?;
        Ok(())
    }

    fn drain(&self, processor: &ServiceProcess) -> anyhow::Result<()> {
        wait_until_consumed(&self.bootstrap, &self.group, &self.input, DRAIN_TIMEOUT)
            .with_context(|| processor.log_tail(40))
    }

    fn changelog_end(&self) -> anyhow::Result<i64> {
        Ok(end_offsets_on(&self.bootstrap, &self.changelog())?
            .iter()
            .map(|(_, end)| end)
            .sum())
    }

    fn assert_exact(&self, logical: i64) -> anyhow::Result<()> {
        let dlq = format!("{}.dlq", self.input);
        let outcome = eosctl::audit_on(&self.bootstrap, &self.input, &self.output, &dlq)?;
        anyhow::ensure!(outcome.passed(), "audit not exact:\n{}", outcome.failures());
        anyhow::ensure!(
            outcome.figure("logical_events") == logical,
            "logical events {} != {logical}",
            outcome.figure("logical_events")
        );
        Ok(())
    }
}

/// The same events again, delivered anew: every one must be dropped as a duplicate.
fn resent(count: u64, seed: u64) -> Workload {
    Workload {
        bad_ratio: 0.0,
        conflict_ratio: 0.0,
        ..Workload::chaos(count, seed)
    }
}

fn remove_state(dir: &Path) -> anyhow::Result<()> {
    std::fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_restart_on_the_same_disk_reads_only_the_changelog_tail_and_still_drops_duplicates()
-> anyhow::Result<()> {
    let pipeline = Pipeline {
        bootstrap: bootstrap_servers(),
        input: unique_name("payments"),
        output: unique_name("ledger"),
        group: unique_name("eos-processor"),
        state_dir: std::env::temp_dir().join(unique_name("eos-state-it")),
    };
    // One partition: one restore per start, and its log line is the partition's.
    create_topic(&pipeline.input, 1).await?;
    tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
        let result = run(&pipeline);
        let _ = std::fs::remove_dir_all(&pipeline.state_dir);
        result
    })
    .await?
}

fn run(pipeline: &Pipeline) -> anyhow::Result<()> {
    pipeline.produce(&resent(4_000, 41))?;
    let mut first = pipeline.spawn()?;
    let restored = pipeline.restored(&mut first)?;
    anyhow::ensure!(
        restored.mode == "cold" && restored.changelog_records == 0,
        "a new store restores cold from an empty changelog: {restored:?}"
    );
    pipeline.drain(&first)?;
    let state_records = pipeline.kill_with_the_checkpoint_at_the_end(first)?;
    anyhow::ensure!(state_records > 4_000, "changelog end {state_records}");

    // Warm: the same events again and new ones, a restart on the same disk.
    pipeline.produce(&resent(4_000, 41))?;
    pipeline.produce(&Workload::chaos(2_000, 42))?;
    let mut warm = pipeline.spawn()?;
    let restored = pipeline.restored(&mut warm)?;
    anyhow::ensure!(
        restored.mode == "warm",
        "same disk: warm restore expected, got {restored:?}\n{}",
        warm.log_tail(30)
    );
    // Only what came after the checkpoint (at most a commit marker): nothing like the
    // thousands of records of the whole changelog.
    anyhow::ensure!(
        restored.changelog_records * 100 < state_records as u64,
        "a warm restore read {} of {state_records} changelog records",
        restored.changelog_records
    );
    pipeline.drain(&warm)?;
    warm.kill_hard()?;
    pipeline.assert_exact(6_000)?;

    // Cold: the state directory is gone; everything is read from the changelog, and the same
    // events are still duplicates.
    remove_state(&pipeline.state_dir)?;
    let state_records = pipeline.changelog_end()?;
    pipeline.produce(&resent(4_000, 41))?;
    pipeline.produce(&resent(2_000, 42))?;
    let mut cold = pipeline.spawn()?;
    let restored = pipeline.restored(&mut cold)?;
    anyhow::ensure!(
        restored.mode == "cold",
        "no store: cold restore expected, got {restored:?}"
    );
    // Every live key's last value, at least: compaction may not have run yet, so up to all.
    anyhow::ensure!(
        restored.changelog_records >= 6_000 && restored.changelog_records <= state_records as u64,
        "a cold restore read {} records of a changelog ending at {state_records}",
        restored.changelog_records
    );
    pipeline.drain(&cold)?;
    cold.stop_gracefully()?;
    pipeline.assert_exact(6_000)?;
    Ok(())
}
