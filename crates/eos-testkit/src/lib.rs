//! One supervisor for the child processes of eos-suite's tooling: `eos-lab demo` and
//! `eos-lab bench` run the real service binaries, and so do the integration tests. Each child's
//! stdout and stderr go to one log file; it can be SIGKILLed, SIGTERMed, SIGSTOPped and
//! SIGCONTed, waited for with a timeout, and a child still running when its handle is dropped is
//! killed, so a failing run leaves nothing behind.
//!
//! It also holds the rest of what the lab and the tests share, and no service needs:
//! [`bench_figures`] (a figure over interleaved rounds, the machine's load), [`loopback_ports`]
//! (ports for servers started after the port is chosen), [`scratch_database`] (dropping a
//! throw-away database services may still be connected to) and [`sink_targets`] (the sink's
//! targets file).

pub mod bench_figures;
pub mod loopback_ports;
pub mod scratch_database;
pub mod sink_targets;

pub mod argv;

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// How often a wait looks whether the child has exited.
const POLL_INTERVAL: Duration = Duration::from_millis(20);
/// How often [`ChildProcess::wait_for_log_line`] reads the log again.
const LOG_POLL_INTERVAL: Duration = Duration::from_millis(25);

#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    #[error("cannot create the log file {}", path.display())]
    Log {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot start {}", program.display())]
    Spawn {
        program: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot send {signal} to {name}")]
    Signal {
        name: String,
        signal: Signal,
        source: nix::Error,
    },
    #[error("cannot check on {name}")]
    Wait {
        name: String,
        source: std::io::Error,
    },
    #[error("{name} did not exit within {timeout:?} of SIGTERM")]
    StillRunning { name: String, timeout: Duration },
    #[error("{name} exited ({status}) before logging {needle:?}\n{tail}")]
    ExitedBeforeLogging {
        name: String,
        status: ExitStatus,
        needle: String,
        tail: String,
    },
    #[error("{name} did not log {needle:?} within {timeout:?}\n{tail}")]
    NotLogged {
        name: String,
        needle: String,
        timeout: Duration,
        tail: String,
    },
}

/// How the log file is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogMode {
    /// A fresh file per process.
    Truncate,
    /// One file across restarts of the same service.
    Append,
}

/// A running child process whose output goes to a log file.
#[derive(Debug)]
pub struct ChildProcess {
    name: String,
    child: Child,
    log_path: PathBuf,
}

impl ChildProcess {
    /// Starts `command` (its program, arguments and environment as the caller set them) with
    /// stdin closed and stdout and stderr in `log`. `name` is how errors call it.
    pub fn spawn(
        name: impl Into<String>,
        mut command: Command,
        log: &Path,
        mode: LogMode,
    ) -> Result<Self, ProcessError> {
        let log_error = |source| ProcessError::Log {
            path: log.to_path_buf(),
            source,
        };
        let file = match mode {
            LogMode::Truncate => File::create(log),
            LogMode::Append => OpenOptions::new().create(true).append(true).open(log),
        }
        .map_err(log_error)?;
        let stderr = file.try_clone().map_err(log_error)?;
        let child = command
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(stderr)
            .spawn()
            .map_err(|source| ProcessError::Spawn {
                program: PathBuf::from(command.get_program()),
                source,
            })?;
        Ok(Self {
            name: name.into(),
            child,
            log_path: log.to_path_buf(),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn pid(&self) -> Pid {
        // A pid always fits: the kernel's pid_t is an i32.
        Pid::from_raw(self.child.id() as i32)
    }

    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    pub fn signal(&self, signal: Signal) -> Result<(), ProcessError> {
        kill(self.pid(), signal).map_err(|source| ProcessError::Signal {
            name: self.name.clone(),
            signal,
            source,
        })
    }

    /// SIGKILL and reap: the process gets no chance to finish anything.
    pub fn kill_hard(&mut self) -> Result<ExitStatus, ProcessError> {
        if let Some(status) = self.try_wait()? {
            return Ok(status);
        }
        self.signal(Signal::SIGKILL)?;
        self.child.wait().map_err(|source| self.wait_error(source))
    }

    pub fn pause(&self) -> Result<(), ProcessError> {
        self.signal(Signal::SIGSTOP)
    }

    pub fn resume(&self) -> Result<(), ProcessError> {
        self.signal(Signal::SIGCONT)
    }

    /// SIGTERM, then waits up to `timeout` for a graceful exit.
    pub fn terminate(&mut self, timeout: Duration) -> Result<ExitStatus, ProcessError> {
        if let Some(status) = self.try_wait()? {
            return Ok(status);
        }
        self.signal(Signal::SIGTERM)?;
        self.wait_timeout(timeout)?
            .ok_or_else(|| ProcessError::StillRunning {
                name: self.name.clone(),
                timeout,
            })
    }

    /// The exit status, if the process has exited; never blocks.
    pub fn try_wait(&mut self) -> Result<Option<ExitStatus>, ProcessError> {
        self.child
            .try_wait()
            .map_err(|source| self.wait_error(source))
    }

    /// The exit status, if the process exits within `timeout`.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Result<Option<ExitStatus>, ProcessError> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.try_wait()? {
                return Ok(Some(status));
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            std::thread::sleep(POLL_INTERVAL);
        }
    }

    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// The last `lines` lines of the log.
    pub fn last_log_lines(&self, lines: usize) -> String {
        last_lines(&self.log(), lines)
    }

    /// The last `lines` lines of the log under a header naming the process and its log file,
    /// for assertion messages.
    pub fn log_tail(&self, lines: usize) -> String {
        format!(
            "--- {} ({}) ---\n{}",
            self.name,
            self.log_path.display(),
            self.last_log_lines(lines)
        )
    }

    /// Waits until a log line contains `needle` and returns it; fails if the process exits
    /// first or `timeout` passes.
    pub fn wait_for_log_line(
        &mut self,
        needle: &str,
        timeout: Duration,
    ) -> Result<String, ProcessError> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(line) = self.log().lines().find(|line| line.contains(needle)) {
                return Ok(line.to_owned());
            }
            if let Some(status) = self.try_wait()? {
                return Err(ProcessError::ExitedBeforeLogging {
                    name: self.name.clone(),
                    status,
                    needle: needle.to_owned(),
                    tail: self.log_tail(30),
                });
            }
            if Instant::now() >= deadline {
                return Err(ProcessError::NotLogged {
                    name: self.name.clone(),
                    needle: needle.to_owned(),
                    timeout,
                    tail: self.log_tail(30),
                });
            }
            std::thread::sleep(LOG_POLL_INTERVAL);
        }
    }

    /// The value of `field=value` in the first log line that has it (text log format), e.g. the
    /// address a service bound when started on port 0.
    pub fn wait_for_log_field(
        &mut self,
        field: &str,
        timeout: Duration,
    ) -> Result<String, ProcessError> {
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

    fn wait_error(&self, source: std::io::Error) -> ProcessError {
        ProcessError::Wait {
            name: self.name.clone(),
            source,
        }
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        // On every error path: never leave a service running behind its supervisor.
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn last_lines(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shell(script: &str) -> Command {
        let mut command = Command::new("sh");
        command.args(["-c", script]);
        command
    }

    fn log_path(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("eos-testkit-{name}-{}.log", std::process::id()))
    }

    #[test]
    fn output_goes_to_the_log_and_the_exit_status_is_kept() -> Result<(), ProcessError> {
        let log = log_path("exit");
        let mut process = ChildProcess::spawn(
            "sh",
            shell("echo one; echo two >&2; exit 3"),
            &log,
            LogMode::Truncate,
        )?;
        let status = process.wait_timeout(Duration::from_secs(10))?;
        assert_eq!(status.and_then(|s| s.code()), Some(3));
        assert_eq!(process.last_log_lines(1), "two");
        assert!(
            process.log_tail(5).starts_with("--- sh ("),
            "{}",
            process.log_tail(5)
        );
        let _ = std::fs::remove_file(log);
        Ok(())
    }

    #[test]
    fn append_keeps_the_earlier_output() -> Result<(), ProcessError> {
        let log = log_path("append");
        for word in ["first", "second"] {
            let mut process =
                ChildProcess::spawn("sh", shell(&format!("echo {word}")), &log, LogMode::Append)?;
            process.wait_timeout(Duration::from_secs(10))?;
        }
        let process = ChildProcess::spawn("sh", shell("true"), &log, LogMode::Append)?;
        assert_eq!(process.last_log_lines(2), "first\nsecond");
        drop(process);
        let _ = std::fs::remove_file(log);
        Ok(())
    }

    #[test]
    fn sigterm_ends_a_sleeper_and_a_log_field_is_found() -> Result<(), ProcessError> {
        let log = log_path("term");
        let mut process = ChildProcess::spawn(
            "sh",
            shell("echo 'started addr=\"127.0.0.1:5\" ok'; exec sleep 30"),
            &log,
            LogMode::Truncate,
        )?;
        assert_eq!(
            process.wait_for_log_field("addr", Duration::from_secs(10))?,
            "127.0.0.1:5"
        );
        assert!(process.is_running());
        let status = process.terminate(Duration::from_secs(10))?;
        assert!(!status.success());
        let _ = std::fs::remove_file(log);
        Ok(())
    }

    #[test]
    fn a_missing_program_names_itself() {
        let log = log_path("missing");
        let error = ChildProcess::spawn(
            "nothing",
            Command::new("/nonexistent/eos-nothing"),
            &log,
            LogMode::Truncate,
        )
        .err()
        .map(|e| e.to_string());
        let _ = std::fs::remove_file(log);
        assert_eq!(
            error.as_deref(),
            Some("cannot start /nonexistent/eos-nothing")
        );
    }
}
