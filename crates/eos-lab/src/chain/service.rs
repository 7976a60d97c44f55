//! A service of the suite as a child process of its binary on the shared supervisor, with its
//! log in the run's directory, restarted at once after a SIGKILL.

use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::bail;
use eos_runtime::kafka_settings::ChildKafkaProperties;
use eos_testkit::{ChildProcess, LogMode};
use nix::sys::signal::Signal;
use nix::unistd::Pid;

const START_TIMEOUT: Duration = Duration::from_secs(60);
const STOP_TIMEOUT: Duration = Duration::from_secs(30);

/// A service child process with its log file.
pub(crate) struct Service {
    pub(crate) name: &'static str,
    binary: PathBuf,
    args: Vec<String>,
    /// Secrets go here rather than in `args`: a command line is visible to every user of the
    /// machine (`ps`), a process's environment only to its owner.
    envs: Vec<(String, String)>,
    /// eos-lab's Kafka properties, for a Kafka service (a file named in its environment: they
    /// may hold a SASL password).
    kafka_properties: Option<Arc<ChildKafkaProperties>>,
    pub(crate) log: PathBuf,
    process: Option<ChildProcess>,
    pub(crate) restarts: usize,
    /// The highest resident memory of any of its incarnations, in KiB (the kernel's VmHWM, read
    /// before each kill and stop).
    pub(crate) peak_rss_kib: u64,
    /// Where its /readyz is served.
    pub(crate) ops_addr: SocketAddr,
}

impl Service {
    /// `ops_addr`: where it serves /readyz and /metrics (the caller passes it in `args`).
    pub(crate) fn new(
        name: &'static str,
        bin_dir: &Path,
        run_dir: &Path,
        args: Vec<String>,
        ops_addr: SocketAddr,
    ) -> Self {
        Self {
            name,
            binary: bin_dir.join(name),
            args,
            envs: Vec::new(),
            kafka_properties: None,
            log: run_dir.join(format!("{name}.log")),
            process: None,
            restarts: 0,
            peak_rss_kib: 0,
            ops_addr,
        }
    }

    /// Logs to `<name>.log` in the run's directory instead of the service's own name (several
    /// processes of one service in one run).
    pub(crate) fn with_log_name(mut self, name: &str) -> Self {
        self.log.set_file_name(format!("{name}.log"));
        self
    }

    /// Sets an environment variable of the process (a secret such as `DATABASE_URL`).
    pub(crate) fn with_env(mut self, key: &str, value: &str) -> Self {
        self.envs.push((key.to_owned(), value.to_owned()));
        self
    }

    /// Makes it a Kafka client with eos-lab's own Kafka properties.
    pub(crate) fn with_kafka_properties(mut self, properties: &Arc<ChildKafkaProperties>) -> Self {
        self.kafka_properties = Some(Arc::clone(properties));
        self
    }

    /// Waits until /readyz answers 200 (partitions assigned and positioned), so that a kill
    /// lands on a service at work rather than one still joining its group.
    pub(crate) async fn wait_ready(&mut self, timeout: Duration) -> anyhow::Result<bool> {
        let deadline = Instant::now() + timeout;
        let url = format!("http://{}/readyz", self.ops_addr);
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(1))
            .build()?;
        while Instant::now() < deadline {
            self.check_running()?;
            if client
                .get(&url)
                .send()
                .await
                .is_ok_and(|r| r.status().is_success())
            {
                return Ok(true);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(false)
    }

    /// Starts the service; a restart appends to the same log.
    pub(crate) fn start(&mut self) -> anyhow::Result<()> {
        let mut command = std::process::Command::new(&self.binary);
        command.args(&self.args).envs(self.envs.iter().cloned());
        if let Some(properties) = &self.kafka_properties {
            properties.apply_to(&mut command);
        }
        self.process = Some(ChildProcess::spawn(
            self.name,
            command,
            &self.log,
            LogMode::Append,
        )?);
        Ok(())
    }

    /// SIGKILL and restart at once, as an orchestrator would.
    pub(crate) async fn kill_and_restart(&mut self) -> anyhow::Result<Pid> {
        let mut pid = Pid::from_raw(0);
        if let Some(mut process) = self.process.take() {
            pid = process.pid();
            self.peak_rss_kib = self.peak_rss_kib.max(peak_rss_kib(pid).unwrap_or(0));
            process.kill_hard().ok();
        }
        self.restarts += 1;
        self.start()?;
        Ok(pid)
    }

    /// SIGSTOP: the process stays as it is, mid-whatever, until `resume` or a kill.
    pub(crate) fn pause(&self) -> anyhow::Result<()> {
        if let Some(process) = &self.process {
            process.pause()?;
        }
        Ok(())
    }

    /// SIGCONT after `pause`.
    pub(crate) fn resume(&self) -> anyhow::Result<()> {
        if let Some(process) = &self.process {
            process.resume()?;
        }
        Ok(())
    }

    /// SIGTERM, then wait; `Ok(true)` when it exited 0 in time.
    pub(crate) async fn stop(&mut self) -> anyhow::Result<bool> {
        let Some(mut process) = self.process.take() else {
            return Ok(false);
        };
        if process.try_wait()?.is_none() {
            self.peak_rss_kib = self
                .peak_rss_kib
                .max(peak_rss_kib(process.pid()).unwrap_or(0));
            process.signal(Signal::SIGTERM).ok();
        }
        // Waited for here rather than with the supervisor's blocking wait: the runtime's other
        // tasks (the trace exporter among them) keep running meanwhile.
        let deadline = Instant::now() + STOP_TIMEOUT;
        loop {
            if let Some(status) = process.try_wait()? {
                return Ok(status.success());
            }
            if Instant::now() >= deadline {
                process.kill_hard().ok();
                return Ok(false);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Fails with the log's tail when the process has exited.
    pub(crate) fn check_running(&mut self) -> anyhow::Result<()> {
        if let Some(process) = self.process.as_mut()
            && let Some(status) = process.try_wait()?
        {
            bail!(
                "{} exited ({status}); the end of {}:\n{}",
                self.name,
                self.log.display(),
                process.last_log_lines(20)
            );
        }
        Ok(())
    }
}

pub(crate) async fn wait_listening(service: &mut Service, addr: SocketAddr) -> anyhow::Result<()> {
    let deadline = Instant::now() + START_TIMEOUT;
    while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
        service.check_running()?;
        if Instant::now() > deadline {
            bail!(
                "{} did not listen on {addr} within {START_TIMEOUT:?}",
                service.name
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// The process's peak resident set size in KiB (`VmHWM` in /proc/<pid>/status; Linux only).
fn peak_rss_kib(pid: Pid) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peak_rss_is_read_from_proc() {
        let own = Pid::from_raw(std::process::id() as i32);
        let kib = peak_rss_kib(own).expect("VmHWM of this process");
        assert!(kib > 1024, "a test process holds more than 1 MiB: {kib}");
        assert_eq!(peak_rss_kib(Pid::from_raw(i32::MAX)), None);
    }
}
