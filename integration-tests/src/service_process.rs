//! The real service binaries as child processes, so chaos tests can SIGKILL, SIGSTOP and
//! SIGCONT them: [`eos_testkit::ChildProcess`] started the way every test starts a service (the
//! workspace's fresh build, a log file per process under [`log_dir`], `RUST_LOG` defaulting to
//! `info`).

use std::ops::{Deref, DerefMut};
use std::path::PathBuf;
use std::process::Command;

use eos_testkit::{ChildProcess, LogMode};

use crate::{unique_name, workspace_binary};

/// A service under test; every supervisor method of [`ChildProcess`] applies.
#[derive(Debug)]
pub struct ServiceProcess(ChildProcess);

/// Where the child processes' logs go: `$TMPDIR/eos-it-logs/`.
pub fn log_dir() -> PathBuf {
    std::env::temp_dir().join("eos-it-logs")
}

/// Where the processors the tests start keep their stores (`EOS_STATE_DIR`, unless a test passes
/// `--state-dir`): `$TMPDIR/eos-it-processor-state/`, apart from the product's default so that
/// `.ci/run` can remove it after the tests without touching a real processor's state.
pub fn processor_state_dir() -> PathBuf {
    std::env::temp_dir().join("eos-it-processor-state")
}

impl ServiceProcess {
    /// Starts workspace binary `binary` with `args` and extra environment `envs`.
    pub fn spawn(binary: &str, args: &[String], envs: &[(&str, &str)]) -> anyhow::Result<Self> {
        let path = workspace_binary(binary)?;
        let dir = log_dir();
        std::fs::create_dir_all(&dir)?;
        let name = unique_name(binary);
        let log_path = dir.join(format!("{name}.log"));
        let mut command = Command::new(&path);
        command
            .env("EOS_STATE_DIR", processor_state_dir())
            .args(args)
            .envs(envs.iter().copied())
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
            );
        Ok(Self(ChildProcess::spawn(
            name,
            command,
            &log_path,
            LogMode::Truncate,
        )?))
    }
}

impl ServiceProcess {
    /// SIGTERM, and an error (with the log's tail) unless it exits 0 within 30 s: every service
    /// must finish its work and stop cleanly when asked.
    pub fn stop_gracefully(&mut self) -> anyhow::Result<()> {
        let status = self.terminate(std::time::Duration::from_secs(30))?;
        anyhow::ensure!(
            status.success(),
            "SIGTERM must exit 0, got {status}\n{}",
            self.log_tail(30)
        );
        Ok(())
    }
}

impl Deref for ServiceProcess {
    type Target = ChildProcess;

    fn deref(&self) -> &ChildProcess {
        &self.0
    }
}

impl DerefMut for ServiceProcess {
    fn deref_mut(&mut self) -> &mut ChildProcess {
        &mut self.0
    }
}

/// A service the test restarts whenever it stops, as an orchestrator would, keeping why it
/// stopped. Each stop must be a reported one: a non-zero status and an ERROR naming the reason
/// (`… stopped error=…`) at the end of its log — a service that dies silently fails the test.
pub struct Supervised {
    pub process: ServiceProcess,
    /// The reason line of every stop so far.
    pub exits: Vec<String>,
    /// Processes started after the first (for its own stops and for kills alike).
    pub restarts: usize,
    spawn: Box<dyn Fn() -> anyhow::Result<ServiceProcess> + Send>,
}

impl std::fmt::Debug for Supervised {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Supervised")
            .field("process", &self.process)
            .field("exits", &self.exits)
            .field("restarts", &self.restarts)
            .finish_non_exhaustive()
    }
}

impl Supervised {
    pub fn start(
        spawn: impl Fn() -> anyhow::Result<ServiceProcess> + Send + 'static,
    ) -> anyhow::Result<Self> {
        Ok(Self {
            process: spawn()?,
            exits: Vec::new(),
            restarts: 0,
            spawn: Box::new(spawn),
        })
    }

    /// Starts the service again if it has stopped, after checking that it said why.
    pub fn keep_running(&mut self) -> anyhow::Result<()> {
        if self.process.is_running() {
            return Ok(());
        }
        let status = self
            .process
            .wait_timeout(std::time::Duration::from_secs(5))?;
        let reason = self
            .process
            .log_tail(5)
            .lines()
            .find(|line| line.contains(" stopped error="))
            .map(str::to_owned);
        anyhow::ensure!(
            status.is_some_and(|status| !status.success()) && reason.is_some(),
            "{} stopped without saying why (status {status:?})\n{}",
            self.process.name(),
            self.process.log_tail(40)
        );
        self.exits.extend(reason);
        self.restart()
    }

    /// Starts a new instance in place of the current one (which must have exited or been
    /// killed).
    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.process = (self.spawn)()?;
        self.restarts += 1;
        Ok(())
    }
}
