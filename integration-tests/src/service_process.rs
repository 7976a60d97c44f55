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

impl ServiceProcess {
    /// Starts workspace binary `binary` with `args` and extra environment `envs`.
    pub fn spawn(binary: &str, args: &[String], envs: &[(&str, &str)]) -> anyhow::Result<Self> {
        let path = workspace_binary(binary)?;
        let dir = log_dir();
        std::fs::create_dir_all(&dir)?;
        let name = unique_name(binary);
        let log_path = dir.join(format!("{name}.log"));
        let mut command = Command::new(&path);
        command.args(args).envs(envs.iter().copied()).env(
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
