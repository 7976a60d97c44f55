//! A real Prometheus server (Debian's `prometheus` package, installed by `deploy/prometheus/check`
//! in `make test`) scraping the services a test runs, with the repository's alert rules loaded:
//! the alerts and dashboards are proven against it, not only by `promtool test rules`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use serde_json::Value;

/// The rules file the chart ships, the one source of the alerts.
pub fn rules_file() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/helm/eos-suite/files/prometheus/eos-suite.rules.yml")
}

/// The chart's Grafana dashboards.
pub fn dashboards_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/helm/eos-suite/files/grafana")
}

/// The rules with every `for:` shortened to `for_override`, so an alert that fires after minutes
/// in production fires within a test. Expressions and thresholds are left as they are.
pub fn rules_with_for(for_override: &str) -> anyhow::Result<String> {
    let rules = std::fs::read_to_string(rules_file()).context("reading the rules file")?;
    Ok(rules
        .lines()
        .map(|line| match line.trim_start().strip_prefix("for:") {
            Some(_) => {
                let indent = &line[..line.len() - line.trim_start().len()];
                format!("{indent}for: {for_override}")
            }
            None => line.to_owned(),
        })
        .collect::<Vec<_>>()
        .join("\n"))
}

/// Where a scrape job finds its targets.
#[derive(Debug)]
pub enum Targets<'a> {
    /// Fixed addresses.
    Static(&'a [SocketAddr]),
    /// A `file_sd_configs` file (e.g. `eos-lab demo --prometheus-targets`), which sets the jobs.
    File(&'a Path),
}

/// One firing or pending alert.
#[derive(Debug, Clone)]
pub struct Alert {
    pub name: String,
    pub state: String,
    pub labels: Value,
}

#[derive(Debug)]
pub struct PrometheusServer {
    child: Child,
    addr: SocketAddr,
    dir: PathBuf,
    http: reqwest::blocking::Client,
}

impl PrometheusServer {
    /// Starts Prometheus scraping every second, `jobs` (name, targets) and `rules` (a rules file's
    /// text) evaluated every second.
    pub fn start(jobs: &[(&str, Targets<'_>)], rules: &str) -> anyhow::Result<Self> {
        let binary = which_prometheus()?;
        let dir = std::env::temp_dir().join(crate::unique_name("eos-prometheus"));
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join("rules.yml"), rules)?;
        let mut config = String::from(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n  scrape_timeout: 900ms\n\
             rule_files:\n  - rules.yml\nscrape_configs:\n",
        );
        for (job, targets) in jobs {
            config.push_str(&format!("  - job_name: {job:?}\n"));
            match targets {
                Targets::Static(addrs) => {
                    let list: Vec<String> = addrs
                        .iter()
                        .map(|a| format!("{:?}", a.to_string()))
                        .collect();
                    config.push_str(&format!(
                        "    static_configs:\n      - targets: [{}]\n",
                        list.join(", ")
                    ));
                }
                Targets::File(path) => config.push_str(&format!(
                    "    file_sd_configs:\n      - files: [{:?}]\n        refresh_interval: 1s\n",
                    path.display().to_string()
                )),
            }
        }
        std::fs::write(dir.join("prometheus.yml"), &config)?;
        let addr = eos_testkit::loopback_ports::free_loopback_addr()?;
        let log = std::fs::File::create(dir.join("prometheus.log"))?;
        let child = Command::new(binary)
            .current_dir(&dir)
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("starting prometheus")?;
        let server = Self {
            child,
            addr,
            dir,
            http: reqwest::blocking::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()?,
        };
        server.wait_ready()?;
        Ok(server)
    }

    fn wait_ready(&self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ready = self
                .http
                .get(format!("http://{}/-/ready", self.addr))
                .send()
                .is_ok_and(|answer| answer.status().is_success());
            if ready {
                return Ok(());
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "prometheus not ready after 30 s:\n{}",
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    fn api(&self, path: &str, query: &[(&str, &str)]) -> anyhow::Result<Value> {
        let answer: Value = self
            .http
            .get(format!("http://{}/api/v1/{path}", self.addr))
            .query(query)
            .send()?
            .json()?;
        anyhow::ensure!(answer["status"] == "success", "{path} {query:?}: {answer}");
        Ok(answer["data"].clone())
    }

    /// An instant query's result vector (or matrix/scalar as Prometheus gives it).
    pub fn query(&self, promql: &str) -> anyhow::Result<Vec<Value>> {
        let data = self.api("query", &[("query", promql)])?;
        Ok(match &data["result"] {
            Value::Array(series) => series.clone(),
            Value::Null => Vec::new(),
            scalar => vec![scalar.clone()],
        })
    }

    /// A range query's series (a matrix) over `start..=end`, evaluated every `step`: what a
    /// Grafana panel over that time range shows.
    pub fn query_range(
        &self,
        promql: &str,
        (start, end): (SystemTime, SystemTime),
        step: Duration,
    ) -> anyhow::Result<Vec<Value>> {
        let unix = |at: SystemTime| {
            at.duration_since(UNIX_EPOCH)
                .map(|since| since.as_secs_f64().to_string())
        };
        let data = self.api(
            "query_range",
            &[
                ("query", promql),
                ("start", &unix(start)?),
                ("end", &unix(end)?),
                ("step", &step.as_secs_f64().to_string()),
            ],
        )?;
        Ok(data["result"].as_array().cloned().unwrap_or_default())
    }

    /// Every metric name Prometheus holds.
    pub fn metric_names(&self) -> anyhow::Result<Vec<String>> {
        let data = self.api("label/__name__/values", &[])?;
        Ok(data
            .as_array()
            .map(|names| {
                names
                    .iter()
                    .filter_map(|n| n.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default())
    }

    /// The alerts pending or firing now.
    pub fn alerts(&self) -> anyhow::Result<Vec<Alert>> {
        let data = self.api("alerts", &[])?;
        Ok(data["alerts"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|alert| Alert {
                name: alert["labels"]["alertname"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                state: alert["state"].as_str().unwrap_or_default().to_owned(),
                labels: alert["labels"].clone(),
            })
            .collect())
    }

    /// Whether `name` is firing.
    pub fn firing(&self, name: &str) -> anyhow::Result<Option<Alert>> {
        Ok(self
            .alerts()?
            .into_iter()
            .find(|alert| alert.name == name && alert.state == "firing"))
    }

    /// Waits until `name` fires; the alert.
    pub fn wait_firing(&self, name: &str, timeout: Duration) -> anyhow::Result<Alert> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(alert) = self.firing(name)? {
                return Ok(alert);
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "{name} did not fire within {timeout:?}; alerts now: {:?}",
                self.alerts()?
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// Waits until `name` is neither pending nor firing.
    pub fn wait_resolved(&self, name: &str, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let alerts = self.alerts()?;
            if !alerts.iter().any(|alert| alert.name == name) {
                return Ok(());
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "{name} still active after {timeout:?}: {alerts:?}"
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }
}

impl Drop for PrometheusServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn which_prometheus() -> anyhow::Result<PathBuf> {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .chain([PathBuf::from("/usr/bin")])
        .map(|dir| dir.join("prometheus"))
        .find(|candidate| candidate.is_file())
        .context("no prometheus binary: `deploy/prometheus/check` installs Debian's package")
}
