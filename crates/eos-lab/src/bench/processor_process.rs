//! One `eos-processor` child process of the benchmark, on the shared supervisor: started
//! without fault switches, its failures quoting its log, its CPU time measured.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::Duration;

use anyhow::anyhow;
use eos_runtime::kafka_settings::ChildKafkaProperties;
use eos_testkit::{ChildProcess, LogMode, ProcessError};
use nix::sys::resource::{UsageWho, getrusage};

/// Lines of a failed processor's log quoted in the error.
const LOG_TAIL_LINES: usize = 15;

/// One `eos-processor` child process, its output going to a log file. Its CPU time shows in
/// [`children_cpu`] once it is stopped.
pub(super) struct ProcessorProcess {
    process: ChildProcess,
}

impl ProcessorProcess {
    pub(super) fn spawn(
        bin: &Path,
        args: &[String],
        kafka: &ChildKafkaProperties,
        log: PathBuf,
        label: &str,
    ) -> anyhow::Result<Self> {
        let mut command = Command::new(bin);
        // A fault switch must never leak into a benchmark from the environment.
        command.args(args).env_remove("EOS_FAULT_ABORT_EVERY");
        kafka.apply_to(&mut command);
        let process = ChildProcess::spawn(label, command, &log, LogMode::Truncate)?;
        Ok(Self { process })
    }

    pub(super) fn log(&self) -> &Path {
        self.process.log_path()
    }

    pub(super) fn ensure_running(&mut self) -> anyhow::Result<()> {
        match self.process.try_wait()? {
            None => Ok(()),
            Some(status) => Err(self.failure(&format!("exited early ({status})"))),
        }
    }

    /// SIGKILL and reap: the processor finishes nothing, its open transaction is left to its
    /// successor's `init_transactions`.
    pub(super) fn kill_hard(&mut self) -> anyhow::Result<()> {
        self.process.kill_hard()?;
        Ok(())
    }

    /// The value of `field=` in the processor's first log line that has it.
    pub(super) fn wait_for_log_field(
        &mut self,
        field: &str,
        timeout: Duration,
    ) -> anyhow::Result<String> {
        Ok(self.process.wait_for_log_field(field, timeout)?)
    }

    /// SIGTERM, then waits for the processor to finish its batch and exit.
    pub(super) fn stop(mut self, timeout: Duration) -> anyhow::Result<()> {
        match self.process.terminate(timeout) {
            Ok(status) => self.check_exit(status),
            Err(ProcessError::StillRunning { .. }) => Err(self.failure(&format!(
                "did not exit within {} of SIGTERM",
                humantime::format_duration(timeout)
            ))),
            Err(error) => Err(error.into()),
        }
    }

    fn check_exit(&self, status: ExitStatus) -> anyhow::Result<()> {
        if status.success() {
            Ok(())
        } else {
            Err(self.failure(&format!("stopped with {status}")))
        }
    }

    fn failure(&self, what: &str) -> anyhow::Error {
        anyhow!(
            "eos-processor ({}) {what}; log: {}\n{}",
            self.process.name(),
            self.log().display(),
            self.process.last_log_lines(LOG_TAIL_LINES)
        )
    }
}

/// User plus system CPU time of this process's terminated and waited-for children.
pub(super) fn children_cpu() -> Option<Duration> {
    cpu_time(UsageWho::RUSAGE_CHILDREN)
}

/// User plus system CPU time of `who`, where the platform tells.
pub(super) fn cpu_time(who: UsageWho) -> Option<Duration> {
    let usage = getrusage(who).ok()?;
    let micros = |time: nix::sys::time::TimeVal| -> Option<u64> {
        Some(u64::try_from(time.tv_sec()).ok()? * 1_000_000 + u64::try_from(time.tv_usec()).ok()?)
    };
    Some(Duration::from_micros(
        micros(usage.user_time())? + micros(usage.system_time())?,
    ))
}
