//! The real service binaries as child processes, so chaos tests can SIGKILL, SIGSTOP and
//! SIGCONT them. Output goes to a log file per process; a process still running when its handle
//! is dropped is killed, so a failing test leaves nothing behind.

use std::fs::File;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::{unique_name, workspace_binary};

#[derive(Debug)]
pub struct ServiceProcess {
    name: String,
    child: Child,
    log_path: PathBuf,
}

/// Where the child processes' logs go: `$TMPDIR/eos-it-logs/`.
pub fn log_dir() -> PathBuf {
    std::env::temp_dir().join("eos-it-logs")
}

impl ServiceProcess {
    /// Starts workspace binary `binary` with `args` and extra environment `envs`.
    pub fn spawn(binary: &str, args: &[String], envs: &[(&str, &str)]) -> anyhow::Result<Self> {
        let path = workspace_binary(binary)?;
        let dir = log_dir();
        std::fs::create_dir_all(&dir)?;
        let name = unique_name(binary);
        let log_path = dir.join(format!("{name}.log"));
        let log = File::create(&log_path)?;
        let child = Command::new(&path)
            .args(args)
            .envs(envs.iter().copied())
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("cannot start {}", path.display()))?;
        Ok(Self {
            name,
            child,
            log_path,
        })
    }

    pub fn pid(&self) -> Pid {
        Pid::from_raw(self.child.id() as i32)
    }

    fn signal(&self, signal: Signal) -> anyhow::Result<()> {
        kill(self.pid(), signal).with_context(|| format!("cannot send {signal} to {}", self.name))
    }

    /// SIGKILL and reap: the process gets no chance to finish anything.
    pub fn kill_hard(&mut self) -> anyhow::Result<ExitStatus> {
        if let Some(status) = self.child.try_wait()? {
            return Ok(status);
        }
        self.signal(Signal::SIGKILL)?;
        Ok(self.child.wait()?)
    }

    pub fn pause(&self) -> anyhow::Result<()> {
        self.signal(Signal::SIGSTOP)
    }

    pub fn resume(&self) -> anyhow::Result<()> {
        self.signal(Signal::SIGCONT)
    }

    /// SIGTERM, then waits up to `timeout` for a graceful exit.
    pub fn terminate(&mut self, timeout: Duration) -> anyhow::Result<ExitStatus> {
        if let Some(status) = self.child.try_wait()? {
            return Ok(status);
        }
        self.signal(Signal::SIGTERM)?;
        self.wait_timeout(timeout)?
            .with_context(|| format!("{} did not exit within {timeout:?} of SIGTERM", self.name))
    }

    /// The exit status, if the process exits within `timeout`.
    pub fn wait_timeout(&mut self, timeout: Duration) -> anyhow::Result<Option<ExitStatus>> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(Some(status));
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// Waits until a log line contains `needle` and returns it; fails if the process exits
    /// first or `timeout` passes.
    pub fn wait_for_log_line(&mut self, needle: &str, timeout: Duration) -> anyhow::Result<String> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(line) = self.log().lines().find(|line| line.contains(needle)) {
                return Ok(line.to_owned());
            }
            if let Some(status) = self.child.try_wait()? {
                anyhow::bail!(
                    "{} exited ({status}) before logging {needle:?}\n{}",
                    self.name,
                    self.log_tail(30)
                );
            }
            if Instant::now() >= deadline {
                anyhow::bail!(
                    "{} did not log {needle:?} within {timeout:?}\n{}",
                    self.name,
                    self.log_tail(30)
                );
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    /// The value of `field=value` in the first log line that has it (text log format), e.g. the
    /// address a service bound when started on port 0.
    pub fn wait_for_log_field(&mut self, field: &str, timeout: Duration) -> anyhow::Result<String> {
        let needle = format!(" {field}=");
        let line = self.wait_for_log_line(&needle, timeout)?;
        let value = line
            .split(&needle)
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .unwrap_or_default()
            .trim_matches('"')
            .to_owned();
        Ok(value)
    }

    /// The last `lines` lines of the log, for assertion messages.
    pub fn log_tail(&self, lines: usize) -> String {
        let log = self.log();
        let all: Vec<&str> = log.lines().collect();
        let start = all.len().saturating_sub(lines);
        format!(
            "--- {} ({}) ---\n{}",
            self.name,
            self.log_path.display(),
            all[start..].join("\n")
        )
    }
}

impl Drop for ServiceProcess {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
