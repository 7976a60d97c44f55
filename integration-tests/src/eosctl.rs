//! Runs the real `eosctl` binary: the workload generator and the audit are part of the product,
//! so the tests use them exactly as a user would.

use std::process::Command;

use anyhow::{Context as _, bail};
use serde_json::Value;

use crate::{bootstrap_servers, workspace_binary};

/// A workload for `eosctl produce`.
#[derive(Debug, Clone)]
pub struct Workload {
    pub count: u64,
    pub entities: u64,
    pub duplicate_ratio: f64,
    pub bad_ratio: f64,
    pub conflict_ratio: f64,
    pub rate: u64,
    pub seed: u64,
}

impl Workload {
    /// The chaos mix: 5% duplicate deliveries, 0.5% malformed, 0.1% reused ids.
    pub fn chaos(count: u64, seed: u64) -> Self {
        Self {
            count,
            entities: 200,
            duplicate_ratio: 0.05,
            bad_ratio: 0.005,
            conflict_ratio: 0.001,
            rate: 0,
            seed,
        }
    }

    pub fn args(&self, bootstrap_servers: &str, topic: &str) -> Vec<String> {
        [
            "produce",
            "--topic",
            topic,
            "--count",
            &self.count.to_string(),
            "--entities",
            &self.entities.to_string(),
            "--duplicate-ratio",
            &self.duplicate_ratio.to_string(),
            "--bad-ratio",
            &self.bad_ratio.to_string(),
            "--conflict-ratio",
            &self.conflict_ratio.to_string(),
            "--rate",
            &self.rate.to_string(),
            "--seed",
            &self.seed.to_string(),
            "--bootstrap-servers",
            bootstrap_servers,
            "--json",
        ]
        .map(str::to_owned)
        .to_vec()
    }
}

/// Runs `eosctl produce` to completion and returns its JSON summary.
pub fn produce(topic: &str, workload: &Workload) -> anyhow::Result<Value> {
    produce_on(&bootstrap_servers(), topic, workload)
}

pub fn produce_on(
    bootstrap_servers: &str,
    topic: &str,
    workload: &Workload,
) -> anyhow::Result<Value> {
    produce_with_env(bootstrap_servers, topic, workload, &[])
}

/// [`produce_on`] with extra environment variables (e.g. `OTEL_EXPORTER_OTLP_ENDPOINT`).
pub fn produce_with_env(
    bootstrap_servers: &str,
    topic: &str,
    workload: &Workload,
    envs: &[(&str, &str)],
) -> anyhow::Result<Value> {
    let output = Command::new(workspace_binary("eosctl")?)
        .args(workload.args(bootstrap_servers, topic))
        .envs(envs.iter().copied())
        .output()?;
    if !output.status.success() {
        bail!(
            "eosctl produce failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    serde_json::from_slice(&output.stdout).context("eosctl produce --json printed no JSON")
}

/// What `eosctl audit` said: its exit code and its JSON report.
#[derive(Debug)]
pub struct AuditOutcome {
    pub exit_code: i32,
    pub report: Value,
}

impl AuditOutcome {
    pub fn passed(&self) -> bool {
        self.exit_code == 0 && self.report["passed"] == Value::Bool(true)
    }

    pub fn figure(&self, name: &str) -> i64 {
        self.report["figures"][name].as_i64().unwrap_or(-1)
    }

    pub fn violations(&self, kind: &str) -> i64 {
        self.report["violations"][kind]["count"]
            .as_i64()
            .unwrap_or(-1)
    }

    /// The failing checks, for assertion messages.
    pub fn failures(&self) -> String {
        let checks = self.report["checks"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        checks
            .iter()
            .filter(|c| c["passed"] != Value::Bool(true))
            .map(|c| c.to_string())
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// Runs `eosctl audit --json` (exit 0 = exact, 1 = violation; anything else is an error here).
pub fn audit(input: &str, output: &str, dlq: &str) -> anyhow::Result<AuditOutcome> {
    audit_on(&bootstrap_servers(), input, output, dlq)
}

pub fn audit_on(
    bootstrap_servers: &str,
    input: &str,
    output: &str,
    dlq: &str,
) -> anyhow::Result<AuditOutcome> {
    audit_with(bootstrap_servers, input, output, dlq, &[])
}

/// [`audit_on`] with more `eosctl audit` flags (the boundaries past the topics).
pub fn audit_with(
    bootstrap_servers: &str,
    input: &str,
    output: &str,
    dlq: &str,
    extra: &[&str],
) -> anyhow::Result<AuditOutcome> {
    let result = Command::new(workspace_binary("eosctl")?)
        .args([
            "audit",
            "--input",
            input,
            "--output",
            output,
            "--dlq",
            dlq,
            "--bootstrap-servers",
            bootstrap_servers,
            "--json",
        ])
        .args(extra)
        .output()?;
    let exit_code = result.status.code().unwrap_or(-1);
    if exit_code != 0 && exit_code != 1 {
        bail!(
            "eosctl audit failed ({}): {}",
            result.status,
            String::from_utf8_lossy(&result.stderr)
        );
    }
    let report = serde_json::from_slice(&result.stdout)
        .with_context(|| format!("eosctl audit --json printed no JSON (exit {exit_code})"))?;
    Ok(AuditOutcome { exit_code, report })
}
