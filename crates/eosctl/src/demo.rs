//! `eosctl demo`: the whole pipeline under faults, and one report that says, boundary by
//! boundary, whether every event had exactly one effect.
//!
//! producer (`eosctl produce`) → eos-processor → sink-writer → PostgreSQL tables, and
//! sink-writer → dedup-service → provider-sim for the charge. While the producer writes, the
//! processor and the sink-writer are SIGKILLed and restarted in turn, and provider-sim applies
//! charges but loses some answers. Once everything has drained, `eosctl audit` checks the topics,
//! the tables and the provider's effects by event_id. With `--guarantee at-least-once` the
//! processor runs without transactions under the same faults: the contrast is the point.
//!
//! Every service is a real child process of the binaries next to this one; their logs, the sink's
//! targets file and the reports stay in the run's directory.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::IsTerminal as _;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use clap::{Args, ValueEnum};
use eos_testkit::{ChildProcess, LogMode};
use nix::sys::signal::Signal;
use nix::unistd::Pid;
use rand::{Rng as _, SeedableRng as _};
use serde::Serialize;
use serde_json::Value;
use tokio::process::Command;

use crate::report::grouped;

const START_TIMEOUT: Duration = Duration::from_secs(60);
const STOP_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DemoGuarantee {
    /// Transactions in the processor, checkpoints with the rows in the sink.
    ExactlyOnce,
    /// The processor without transactions (offsets committed after the output is flushed).
    AtLeastOnce,
}

impl DemoGuarantee {
    fn as_str(self) -> &'static str {
        match self {
            Self::ExactlyOnce => "exactly-once",
            Self::AtLeastOnce => "at-least-once",
        }
    }
}

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// exactly-once, or at-least-once to see what the same faults do without transactions.
    #[arg(long, value_enum, default_value = "exactly-once")]
    pub guarantee: DemoGuarantee,

    /// Logical events to produce (plus 5% re-deliveries, 0.5% malformed, 0.1% reused ids).
    #[arg(long, default_value_t = 20_000)]
    pub events: u64,

    /// Records per second the producer writes.
    #[arg(long, default_value_t = 2_000)]
    pub rate: u64,

    /// SIGKILLs of eos-processor while the producer writes (each restarted at once).
    #[arg(long, default_value_t = 3)]
    pub processor_kills: usize,

    /// SIGKILLs of sink-writer while the producer writes (each restarted at once).
    #[arg(long, default_value_t = 3)]
    pub sink_kills: usize,

    /// Probability that provider-sim applies a charge and drops the connection.
    #[arg(long, default_value_t = 0.05)]
    pub provider_drop: f64,

    /// Probability that provider-sim applies a charge and answers 500.
    #[arg(long, default_value_t = 0.02)]
    pub provider_error: f64,

    /// Probability that provider-sim applies a charge and answers after the sink's deadline.
    #[arg(long, default_value_t = 0.02)]
    pub provider_late: f64,

    /// PostgreSQL server (and a database on it the role can connect to). Each run creates its
    /// own database there for the sink's tables and dedup-service's intents, and keeps it for
    /// inspection.
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://eos:eos@127.0.0.1:5432/eos",
        hide_env_values = true
    )]
    pub database_url: String,

    /// Where the service binaries are [default: the directory of this eosctl].
    #[arg(long, env = "EOS_BIN_DIR")]
    pub bin_dir: Option<PathBuf>,

    /// The run's directory (logs, targets file, reports) is created under this one.
    #[arg(long, default_value = ".stack/demo")]
    pub runs_dir: PathBuf,

    /// How long to wait for the pipeline to drain after the producer is done.
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    pub drain_timeout: Duration,

    /// Seed of the workload (its event ids are evt-<seed>-<n>) and of the fault schedule
    /// [default: the run's start time, so the tables and dedup-service, which outlive a run,
    /// see new event ids].
    #[arg(long)]
    pub seed: Option<u64>,

    /// Drop the run's database after the audit (tests do; people usually want to look).
    #[arg(long)]
    pub drop_database: bool,

    /// Print the report as one JSON object on stdout (progress goes to stderr).
    #[arg(long)]
    pub json: bool,
}

/// One line of the report.
#[derive(Debug, Clone, Serialize)]
pub struct ReportLine {
    pub name: String,
    /// `None`: a figure, not a check.
    pub passed: Option<bool>,
    pub detail: String,
}

#[derive(Debug, Serialize)]
pub struct DemoReport {
    pub guarantee: DemoGuarantee,
    pub passed: bool,
    pub run_dir: String,
    pub topics: BTreeMap<&'static str, String>,
    pub faults: Vec<String>,
    pub lines: Vec<ReportLine>,
    pub traces: String,
    /// `eosctl audit --json` as it printed it.
    pub audit: Value,
}

/// A service child process with its log file.
struct Service {
    name: &'static str,
    binary: PathBuf,
    args: Vec<String>,
    log: PathBuf,
    process: Option<ChildProcess>,
    restarts: usize,
    /// Where its /readyz is served.
    ops_addr: SocketAddr,
}

impl Service {
    /// `ops_addr`: where it serves /readyz and /metrics (the caller passes it in `args`).
    fn new(
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
            log: run_dir.join(format!("{name}.log")),
            process: None,
            restarts: 0,
            ops_addr,
        }
    }

    /// Waits until /readyz answers 200 (partitions assigned and positioned), so that a kill
    /// lands on a service at work rather than one still joining its group.
    async fn wait_ready(&mut self, timeout: Duration) -> anyhow::Result<bool> {
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
    fn start(&mut self) -> anyhow::Result<()> {
        let mut command = std::process::Command::new(&self.binary);
        command.args(&self.args);
        self.process = Some(ChildProcess::spawn(
            self.name,
            command,
            &self.log,
            LogMode::Append,
        )?);
        Ok(())
    }

    /// SIGKILL and restart at once, as an orchestrator would.
    async fn kill_and_restart(&mut self) -> anyhow::Result<Pid> {
        let mut pid = Pid::from_raw(0);
        if let Some(mut process) = self.process.take() {
            pid = process.pid();
            process.kill_hard().ok();
        }
        self.restarts += 1;
        self.start()?;
        Ok(pid)
    }

    /// SIGTERM, then wait; `Ok(true)` when it exited 0 in time.
    async fn stop(&mut self) -> anyhow::Result<bool> {
        let Some(mut process) = self.process.take() else {
            return Ok(false);
        };
        if process.try_wait()?.is_none() {
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
    fn check_running(&mut self) -> anyhow::Result<()> {
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

fn log_tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

fn free_addr() -> anyhow::Result<SocketAddr> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

async fn wait_listening(service: &mut Service, addr: SocketAddr) -> anyhow::Result<()> {
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

/// Progress for people: plain lines on stderr.
fn say(line: impl AsRef<str>) {
    eprintln!("{}", line.as_ref());
}

/// The sink's targets: the seed's two tables, and the provider charge.
fn targets_file(provider_name: &str, dedup_url: &str, provider_url: &str) -> String {
    format!(
        r#"# Written by `eosctl demo`.
[[targets]]
table = "event_sink"
kind = "append"
key = "event_id"
[targets.columns]
event_id = "event_id"
entity_id = "entity_id"
value = "value"
payload = "payload"
fingerprint = "fingerprint"
source_topic = "kafka.topic"
source_partition = "kafka.partition"
source_offset = "kafka.offset"
written_at = "now"

[[targets]]
table = "entity_state"
kind = "versioned"
key = "entity_id"
[targets.columns]
entity_id = "entity_id"
version = "version"
payload = "payload"
event_id = "event_id"
updated_at = "now"

[[targets]]
kind = "provider"
name = "{provider_name}"
dedup_url = "{dedup_url}"
provider_url = "{provider_url}"
call_timeout = "1s"
lease_ttl = "10s"
"#
    )
}

/// Runs this eosctl with `args`; (exit code, stdout). Its stderr goes to `log`, or to the
/// terminal for `show_progress` when stderr is one (its progress bar, nothing else is printing).
async fn eosctl(
    self_exe: &Path,
    args: &[String],
    log: &Path,
    show_progress: bool,
) -> anyhow::Result<(i32, String)> {
    let stderr = if show_progress && std::io::stderr().is_terminal() {
        Stdio::inherit()
    } else {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)?
            .into()
    };
    let output = Command::new(self_exe)
        .args(args)
        .stdin(Stdio::null())
        .stderr(stderr)
        .output()
        .await
        .with_context(|| format!("running eosctl {}", args.join(" ")))?;
    Ok((
        output.status.code().unwrap_or(2),
        String::from_utf8_lossy(&output.stdout).into_owned(),
    ))
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| (*s).to_owned()).collect()
}

pub async fn run(bootstrap_servers: &str, args: DemoArgs) -> anyhow::Result<bool> {
    let self_exe = std::env::current_exe().context("locating eosctl")?;
    let bin_dir = match &args.bin_dir {
        Some(dir) => dir.clone(),
        None => self_exe
            .parent()
            .context("eosctl has no directory")?
            .to_path_buf(),
    };
    for binary in [
        "eos-processor",
        "sink-writer",
        "dedup-service",
        "provider-sim",
    ] {
        if !bin_dir.join(binary).is_file() {
            bail!(
                "{} is missing: build the workspace first (make demo does), or point --bin-dir at \
                 the binaries",
                bin_dir.join(binary).display()
            );
        }
    }
    let started = time::OffsetDateTime::now_utc().unix_timestamp();
    let run_id = format!("{started}-{}", std::process::id());
    let seed = args
        .seed
        .unwrap_or_else(|| u64::try_from(started).unwrap_or_default());
    let run_dir = args.runs_dir.join(&run_id);
    std::fs::create_dir_all(&run_dir).with_context(|| format!("creating {}", run_dir.display()))?;
    let run_dir = run_dir.canonicalize()?;
    let input = format!("demo-payments-{run_id}");
    let output = format!("demo-ledger-{run_id}");
    let processor_group = format!("demo-processor-{run_id}");
    let sink_group = format!("demo-sink-{run_id}");
    // dedup-service's intents outlive a run: a fresh name keeps this run's operation ids new.
    let provider_name = format!("pay_{}", run_id.replace('-', "_"));

    let database = format!("eos_demo_{}", run_id.replace('-', "_"));
    let database_url = create_database(&args.database_url, &database).await?;
    let provider_addr = free_addr()?;
    let dedup_addr = free_addr()?;
    let provider_url = format!("http://{provider_addr}");
    let dedup_url = format!("http://{dedup_addr}");
    let traces_note = if std::env::var_os("OTEL_EXPORTER_OTLP_ENDPOINT").is_some() {
        "traces are exported to OTEL_EXPORTER_OTLP_ENDPOINT"
    } else {
        "traces are off: set OTEL_EXPORTER_OTLP_ENDPOINT to export them"
    };
    say(format!(
        "== eos-suite demo ({}): {} payments, {} SIGKILLs of eos-processor, {} of sink-writer, \
         provider-sim losing {:.0}% of answers",
        args.guarantee.as_str(),
        grouped(args.events as i64),
        args.processor_kills,
        args.sink_kills,
        (args.provider_drop + args.provider_error + args.provider_late) * 100.0
    ));
    say(format!(
        "   run directory {} ({traces_note})",
        run_dir.display()
    ));
    say(format!(
        "   topics {input} -> {output}; PostgreSQL database {database} (event_sink, entity_state, \
         dedup_intents); provider {provider_url}"
    ));

    let mut provider = Service::new(
        "provider-sim",
        &bin_dir,
        &run_dir,
        strings(&[
            "--addr",
            &provider_addr.to_string(),
            "--seed",
            &seed.to_string(),
            "--drop-response-after-apply-probability",
            &args.provider_drop.to_string(),
            "--error-after-apply-probability",
            &args.provider_error.to_string(),
            "--delay-after-apply",
            "3s",
            "--delay-after-apply-probability",
            &args.provider_late.to_string(),
        ]),
        provider_addr,
    );
    let ops = free_addr()?;
    let mut dedup = Service::new(
        "dedup-service",
        &bin_dir,
        &run_dir,
        strings(&[
            "--listen",
            &dedup_addr.to_string(),
            "--database-url",
            &database_url,
            "--provider-url",
            &provider_url,
            "--reconcile-interval",
            "200ms",
            "--in-flight-window",
            "5s",
            "--metrics-addr",
            &ops.to_string(),
        ]),
        ops,
    );
    let targets = run_dir.join("sink-targets.toml");
    std::fs::write(
        &targets,
        targets_file(&provider_name, &dedup_url, &provider_url),
    )?;
    let ops = free_addr()?;
    let mut processor = Service::new(
        "eos-processor",
        &bin_dir,
        &run_dir,
        strings(&[
            "--bootstrap-servers",
            bootstrap_servers,
            "--input-topic",
            &input,
            "--output-topic",
            &output,
            "--group-id",
            &processor_group,
            "--instance-id",
            "demo-processor",
            "--guarantee",
            args.guarantee.as_str(),
            "--metrics-addr",
            &ops.to_string(),
        ]),
        ops,
    );
    let ops = free_addr()?;
    let mut sink = Service::new(
        "sink-writer",
        &bin_dir,
        &run_dir,
        strings(&[
            "--bootstrap-servers",
            bootstrap_servers,
            "--topic",
            &output,
            "--group-id",
            &sink_group,
            "--instance-id",
            "demo-sink",
            "--database-url",
            &database_url,
            "--config",
            &targets.display().to_string(),
            "--metrics-addr",
            &ops.to_string(),
            "--max-backoff",
            "1s",
        ]),
        ops,
    );

    let outcome = drive(
        &args,
        seed,
        &self_exe,
        bootstrap_servers,
        &run_dir,
        [&mut provider, &mut dedup, &mut processor, &mut sink],
        (&input, &output, &processor_group, &sink_group),
        (provider_addr, dedup_addr),
    )
    .await;
    // The counters, read before SIGTERM ends the processes that hold them.
    let scraped = if outcome.is_ok() {
        Some(Scraped {
            processor: scrape(processor.ops_addr).await,
            sink: scrape(sink.ops_addr).await,
            dedup: scrape(dedup.ops_addr).await,
            provider: scrape(provider.ops_addr).await,
        })
    } else {
        None
    };
    // Whatever happened, nothing of the run keeps running.
    let mut stopped_cleanly = true;
    for service in [&mut sink, &mut processor, &mut dedup] {
        let clean = service.stop().await.unwrap_or(false);
        if !clean && outcome.is_ok() {
            say(format!(
                "   {} did not exit 0 on SIGTERM; see {}",
                service.name,
                service.log.display()
            ));
        }
        stopped_cleanly &= clean;
    }
    let drained = outcome?;
    say("== audit: the logical set by event_id at every boundary (topics, tables, provider)");
    let audit_args = strings(&[
        "--bootstrap-servers",
        bootstrap_servers,
        "audit",
        "--input",
        &input,
        "--output",
        &output,
        "--database-url",
        &database_url,
        "--provider-url",
        &provider_url,
        "--provider-operation-prefix",
        &format!("{provider_name}:"),
        "--json",
    ]);
    let (audit_code, audit_json) =
        eosctl(&self_exe, &audit_args, &run_dir.join("audit.log"), false).await?;
    provider.stop().await.ok();
    std::fs::write(run_dir.join("audit.json"), &audit_json)?;
    if audit_code == 2 {
        bail!(
            "the audit could not run; see {}:\n{}",
            run_dir.join("audit.log").display(),
            log_tail(&run_dir.join("audit.log"), 20)
        );
    }
    let audit: Value = serde_json::from_str(&audit_json).context("eosctl audit printed no JSON")?;
    let reconciled = unknowns(&database_url, &provider_name).await?;
    if args.drop_database {
        drop_database(&args.database_url, &database).await?;
    }

    let kills =
        |n: usize, name: &str| format!("{n} SIGKILL{} of {name}", if n == 1 { "" } else { "s" });
    let mut faults = vec![
        kills(processor.restarts, "eos-processor"),
        kills(sink.restarts, "sink-writer"),
    ];
    faults.push(format!(
        "provider-sim applied every charge and lost {:.0}% of the answers (dropped, 500, late)",
        (args.provider_drop + args.provider_error + args.provider_late) * 100.0
    ));
    let killed = processor.restarts + sink.restarts > 0;
    let metrics = metrics_line(scraped.as_ref(), &audit, reconciled, killed);
    let report = build_report(
        &args,
        &run_dir,
        [&input, &output, &format!("evt-{seed}-0")],
        faults,
        audit,
        audit_code,
        reconciled,
        stopped_cleanly && drained,
        metrics,
    );
    std::fs::write(
        run_dir.join("report.json"),
        serde_json::to_string_pretty(&report)?,
    )?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{}", report_text(&report));
    }
    Ok(report.passed)
}

#[allow(clippy::too_many_arguments)]
async fn drive(
    args: &DemoArgs,
    seed: u64,
    self_exe: &Path,
    bootstrap_servers: &str,
    run_dir: &Path,
    [provider, dedup, processor, sink]: [&mut Service; 4],
    (input, output, processor_group, sink_group): (&str, &str, &str, &str),
    (provider_addr, dedup_addr): (SocketAddr, SocketAddr),
) -> anyhow::Result<bool> {
    provider.start()?;
    wait_listening(provider, provider_addr).await?;
    dedup.start()?;
    wait_listening(dedup, dedup_addr).await?;
    say("   provider-sim and dedup-service are up");

    say(format!(
        "== producing at {}/s: 5% re-deliveries, 0.5% malformed, 0.1% reused ids with other content",
        args.rate
    ));
    let produce_args = strings(&[
        "--bootstrap-servers",
        bootstrap_servers,
        "produce",
        "--topic",
        input,
        "--count",
        &args.events.to_string(),
        "--duplicate-ratio",
        "0.05",
        "--bad-ratio",
        "0.005",
        "--conflict-ratio",
        "0.001",
        "--rate",
        &args.rate.to_string(),
        "--seed",
        &seed.to_string(),
        "--json",
    ]);
    let producer = {
        let self_exe = self_exe.to_path_buf();
        let log = run_dir.join("produce.log");
        tokio::spawn(async move { eosctl(&self_exe, &produce_args, &log, false).await })
    };
    // The producer creates the input topic; the processor starts once it is there.
    tokio::time::sleep(Duration::from_millis(500)).await;
    processor.start()?;
    sink.start()?;

    let produce_seconds = args.events as f64 * 1.06 / args.rate.max(1) as f64;
    let kills = args.processor_kills + args.sink_kills;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let (mut processor_left, mut sink_left) = (args.processor_kills, args.sink_kills);
    for i in 0..kills {
        let gap = produce_seconds / (kills + 1) as f64;
        let jitter = rng.random_range(0.7..1.3);
        tokio::time::sleep(Duration::from_secs_f64(gap * jitter)).await;
        let kill_processor = sink_left == 0 || (processor_left > 0 && i % 2 == 0);
        let service = if kill_processor {
            processor_left -= 1;
            &mut *processor
        } else {
            sink_left -= 1;
            &mut *sink
        };
        // A kill should land on a service at work, not one still joining its group.
        service.wait_ready(Duration::from_secs(30)).await?;
        tokio::time::sleep(Duration::from_millis(rng.random_range(200..800))).await;
        let pid = service.kill_and_restart().await?;
        say(format!(
            "   SIGKILL #{} of {} (pid {pid}), restarted",
            service.restarts, service.name
        ));
    }
    let (produce_code, produce_json) = producer.await.context("the producer task")??;
    if produce_code != 0 {
        bail!(
            "eosctl produce failed; see {}",
            run_dir.join("produce.log").display()
        );
    }
    std::fs::write(run_dir.join("produce.json"), &produce_json)?;
    say("== producer done; waiting for the pipeline to drain");
    let timeout = humantime::format_duration(args.drain_timeout).to_string();
    let mut drained = true;
    for (group, topic, service) in [
        (processor_group, input, &mut *processor),
        (sink_group, output, &mut *sink),
    ] {
        let lag_args = strings(&[
            "--bootstrap-servers",
            bootstrap_servers,
            "lag",
            "--group",
            group,
            "--topic",
            topic,
            "--wait",
            "--timeout",
            &timeout,
        ]);
        let (code, _) = eosctl(self_exe, &lag_args, &run_dir.join("lag.log"), true).await?;
        service.check_running()?;
        if code != 0 {
            say(format!(
                "   {} did not catch up within {timeout}",
                service.name
            ));
            drained = false;
        } else {
            say(format!("   {} caught up with {topic}", service.name));
        }
    }
    Ok(drained)
}

/// Every service's Prometheus text at the end of the run (`None`: not scraped).
#[derive(Debug)]
struct Scraped {
    processor: Option<String>,
    sink: Option<String>,
    dedup: Option<String>,
    provider: Option<String>,
}

async fn scrape(addr: SocketAddr) -> Option<String> {
    let response = reqwest::get(format!("http://{addr}/metrics")).await.ok()?;
    response.error_for_status().ok()?.text().await.ok()
}

/// The sum of every sample of `name` whose labels include each of `labels` (`key="value"`).
fn metric_sum(text: &str, name: &str, labels: &[&str]) -> i64 {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (metric, label_text) = match series.split_once('{') {
                Some((metric, rest)) => (metric, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            let wanted = metric == name && labels.iter().all(|l| label_text.contains(l));
            wanted.then(|| value.parse::<f64>().ok()).flatten()
        })
        .sum::<f64>() as i64
}

/// Whether each service's own counters agree with what the audit counted. Counters start at
/// zero in every process, so they add up only in a run without kills.
fn metrics_line(
    scraped: Option<&Scraped>,
    audit: &Value,
    (_, reconciled): (i64, i64),
    killed: bool,
) -> ReportLine {
    let name = "metrics agree with the audit".to_owned();
    let Some(scraped) = scraped else {
        return ReportLine {
            name,
            passed: None,
            detail: "not scraped: the run did not complete".into(),
        };
    };
    if killed {
        return ReportLine {
            name,
            passed: None,
            detail: "not compared: counters restart with every SIGKILLed process (run with \
                     --processor-kills 0 --sink-kills 0 to compare)"
                .into(),
        };
    }
    let text = |t: &Option<String>| t.clone().unwrap_or_default();
    let (processor, sink, dedup, provider) = (
        text(&scraped.processor),
        text(&scraped.sink),
        text(&scraped.dedup),
        text(&scraped.provider),
    );
    let acquired = metric_sum(
        &dedup,
        "eos_dedup_begin_outcomes_total",
        &["outcome=\"acquired\""],
    );
    let comparisons = [
        (
            "processor duplicates dropped = re-deliveries",
            metric_sum(&processor, "eos_processor_duplicates_dropped_total", &[]),
            figure(audit, "duplicate_deliveries"),
        ),
        (
            "processor dead letters = DLQ records",
            metric_sum(&processor, "eos_processor_dead_letters_total", &[]),
            figure(audit, "dlq_records"),
        ),
        (
            "processor outputs = output records",
            metric_sum(&processor, "eos_processor_records_out_total", &[]),
            figure(audit, "output_records"),
        ),
        (
            "sink rows written = event_sink rows",
            metric_sum(
                &sink,
                "eos_sink_rows_written_total",
                &["target=\"event_sink\""],
            ),
            figure(audit, "postgres_rows"),
        ),
        (
            "sink charges = provider effects",
            metric_sum(
                &sink,
                "eos_sink_provider_effects_total",
                &["outcome=\"charged\""],
            ),
            figure(audit, "provider_effects"),
        ),
        (
            "sink provider calls = dedup ACQUIRED",
            metric_sum(&sink, "eos_sink_provider_calls_total", &[]),
            acquired,
        ),
        (
            "dedup UNKNOWNs resolved = reconciled",
            metric_sum(&dedup, "eos_dedup_unknown_resolved_total", &[]),
            reconciled,
        ),
        (
            "provider-sim effects = provider effects",
            metric_sum(&provider, "eos_provider_effects_total", &[]),
            figure(audit, "provider_effects"),
        ),
    ];
    let wrong: Vec<String> = comparisons
        .iter()
        .filter(|(_, metric, audited)| metric != audited)
        .map(|(what, metric, audited)| format!("{what}: {metric} vs {audited}"))
        .collect();
    ReportLine {
        name,
        passed: Some(wrong.is_empty()),
        detail: if wrong.is_empty() {
            format!(
                "{} counters across eos-processor, sink-writer, dedup-service and provider-sim equal \
                 the audit's figures",
                comparisons.len()
            )
        } else {
            wrong.join("; ")
        },
    }
}

/// Creates `database` on the server of `server_url`; the URL of the new database.
async fn create_database(server_url: &str, database: &str) -> anyhow::Result<String> {
    use sqlx::Connection as _;
    let mut conn = sqlx::PgConnection::connect(server_url)
        .await
        .context("connecting to PostgreSQL (is the stack up? deploy/local/stack up)")?;
    sqlx::query(&format!("CREATE DATABASE \"{database}\""))
        .execute(&mut conn)
        .await
        .with_context(|| format!("creating database {database}"))?;
    conn.close().await.ok();
    let mut url = reqwest::Url::parse(server_url).context("--database-url is not a URL")?;
    url.set_path(&format!("/{database}"));
    Ok(url.to_string())
}

async fn drop_database(server_url: &str, database: &str) -> anyhow::Result<()> {
    use sqlx::Connection as _;
    let mut conn = sqlx::PgConnection::connect(server_url).await?;
    sqlx::query(&format!(
        "DROP DATABASE IF EXISTS \"{database}\" WITH (FORCE)"
    ))
    .execute(&mut conn)
    .await
    .with_context(|| format!("dropping database {database}"))?;
    conn.close().await.ok();
    Ok(())
}

/// (went UNKNOWN, settled out of UNKNOWN) for this run's operations, from dedup-service's history.
async fn unknowns(database_url: &str, provider_name: &str) -> anyhow::Result<(i64, i64)> {
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(database_url)
        .await
        .context("connecting to PostgreSQL for dedup-service's history")?;
    let pattern = format!("{provider_name}:%");
    let (into, out): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE to_state = 'UNKNOWN'),
                count(*) FILTER (WHERE from_state = 'UNKNOWN')
           FROM dedup_intent_history WHERE operation_id LIKE $1",
    )
    .bind(&pattern)
    .fetch_one(&pool)
    .await?;
    pool.close().await;
    Ok((into, out))
}

fn figure(audit: &Value, name: &str) -> i64 {
    audit["figures"][name].as_i64().unwrap_or_default()
}

fn violations(audit: &Value, kinds: &[&str]) -> (u64, Vec<String>) {
    let mut total = 0;
    let mut named = Vec::new();
    for kind in kinds {
        let count = audit["violations"][kind]["count"]
            .as_u64()
            .unwrap_or_default();
        if count > 0 {
            total += count;
            named.push(format!("{kind} {count}"));
        }
    }
    (total, named)
}

fn check_line(name: &str, audit: &Value, kinds: &[&str], figures: String) -> ReportLine {
    let (count, named) = violations(audit, kinds);
    ReportLine {
        name: name.to_owned(),
        passed: Some(count == 0),
        detail: if count == 0 {
            figures
        } else {
            format!("{figures}; {}", named.join(", "))
        },
    }
}

#[allow(clippy::too_many_arguments)]
fn build_report(
    args: &DemoArgs,
    run_dir: &Path,
    [input, output, sample_event]: [&str; 3],
    faults: Vec<String>,
    audit: Value,
    audit_code: i32,
    (went_unknown, reconciled): (i64, i64),
    drained_and_stopped: bool,
    metrics: ReportLine,
) -> DemoReport {
    let g = |name: &str| grouped(figure(&audit, name));
    let mut lines = vec![
        ReportLine {
            name: "physical attempts".into(),
            passed: None,
            detail: format!(
                "{} records on the input topic ({} valid)",
                g("input_records"),
                g("valid_input_records")
            ),
        },
        check_line(
            "logical inputs",
            &audit,
            &["missing_output", "unexpected_output", "content_mismatch"],
            format!(
                "{} events by event_id, {} in the output",
                g("logical_events"),
                g("output_records")
            ),
        ),
        check_line(
            "duplicates suppressed",
            &audit,
            &["duplicated_output"],
            format!(
                "{} re-deliveries produced no second output",
                g("duplicate_deliveries")
            ),
        ),
    ];
    let by_reason = audit["figures"]["malformed_by_reason"]
        .as_object()
        .map(|reasons| {
            reasons
                .iter()
                .map(|(reason, n)| format!("{reason} {}", n.as_i64().unwrap_or_default()))
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_default();
    lines.push(check_line(
        "dead letters by reason",
        &audit,
        &[
            "bad_input_in_output",
            "conflict_in_output",
            "valid_event_in_dlq",
            "bad_input_missing_from_dlq",
            "conflict_missing_from_dlq",
            "wrong_dlq_reason",
            "dlq_not_original_bytes",
            "duplicated_in_dlq",
            "unexpected_dlq_record",
        ],
        format!(
            "{} ({by_reason}; event_id_conflict {})",
            g("dlq_records"),
            g("conflicts")
        ),
    ));
    lines.push(check_line(
        "running totals",
        &audit,
        &["wrong_entity_total", "order_violation"],
        format!("{} entities, per-entity totals and order", g("entities")),
    ));
    lines.push(check_line(
        "rows in PostgreSQL",
        &audit,
        &[
            "missing_row",
            "duplicated_row",
            "unexpected_row",
            "row_mismatch",
            "stale_state",
            "state_ahead",
        ],
        format!(
            "{} event_sink rows, {} entity_state rows at their latest version",
            g("postgres_rows"),
            g("entity_states")
        ),
    ));
    lines.push(check_line(
        "provider effects",
        &audit,
        &[
            "missing_effect",
            "duplicated_effect",
            "unexpected_effect",
            "effect_mismatch",
            "refused_but_applied",
        ],
        format!(
            "{} charges, one per operation id ({} repeated requests absorbed by the key; {} \
             refused and dead-lettered)",
            g("provider_effects"),
            g("provider_retries_absorbed"),
            g("provider_refused")
        ),
    ));
    lines.push(ReportLine {
        name: "UNKNOWNs reconciled".into(),
        passed: Some(reconciled == went_unknown),
        detail: format!(
            "{} of {} ambiguous provider outcomes settled by asking the provider with the same key",
            grouped(reconciled),
            grouped(went_unknown)
        ),
    });
    lines.push(ReportLine {
        name: "pipeline drained, services stopped".into(),
        passed: Some(drained_and_stopped),
        detail: if drained_and_stopped {
            "every service caught up and exited 0 on SIGTERM".into()
        } else {
            format!("see the logs in {}", run_dir.display())
        },
    });
    lines.push(metrics);
    let passed = audit_code == 0 && lines.iter().all(|line| line.passed != Some(false));
    let duplicated = audit["violations"]["duplicated_output"]["examples"][0]
        .as_str()
        .map(str::to_owned);
    let traces = format!(
        "with OTEL_EXPORTER_OTLP_ENDPOINT set (e.g. Jaeger's OTLP port, http://127.0.0.1:4317), \
         every service exports its spans; in Jaeger search by tag event_id={sample_event} to see \
         eosctl produce → eos-processor → sink-writer → dedup-service → provider-sim in one trace{}",
        duplicated
            .map(|s| format!("; a duplicated one to look at: {s}"))
            .unwrap_or_default()
    );
    DemoReport {
        guarantee: args.guarantee,
        passed,
        run_dir: run_dir.display().to_string(),
        topics: BTreeMap::from([("input", input.to_owned()), ("output", output.to_owned())]),
        faults,
        lines,
        traces,
        audit,
    }
}

pub fn report_text(report: &DemoReport) -> String {
    let mut text = String::new();
    let _ = writeln!(
        text,
        "\n== eos-suite demo report ({})",
        report.guarantee.as_str()
    );
    let _ = writeln!(text, "   faults: {}", report.faults.join("; "));
    let width = report.lines.iter().map(|l| l.name.len()).max().unwrap_or(0);
    for line in &report.lines {
        let mark = match line.passed {
            Some(true) => "PASS",
            Some(false) => "FAIL",
            None => "    ",
        };
        let _ = writeln!(text, "   {mark}  {:width$}  {}", line.name, line.detail);
    }
    let _ = writeln!(text, "   traces: {}", report.traces);
    let _ = writeln!(text, "   run directory: {}", report.run_dir);
    if report.passed {
        let _ = writeln!(
            text,
            "RESULT: PASS: exactly one effect per event at every boundary (topics, PostgreSQL, \
             provider)"
        );
    } else if report.guarantee == DemoGuarantee::AtLeastOnce {
        let _ = writeln!(
            text,
            "RESULT: FAIL: not exact. This is what at-least-once does under kills: the ledger \
             topic holds duplicates and wrong running totals (the idempotent tables and the \
             provider's key absorb them downstream, where they can); the audit names each one"
        );
    } else {
        let _ = writeln!(
            text,
            "RESULT: FAIL: not exact at some boundary (see FAIL lines)"
        );
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    const PROCESSOR: &str = "# TYPE eos_processor_dead_letters_total counter
eos_processor_dead_letters_total{reason=\"malformed_json\"} 3
eos_processor_dead_letters_total{reason=\"event_id_conflict\"} 2
eos_processor_duplicates_dropped_total 100
eos_processor_records_out_total 2000
";

    fn audit(duplicates: i64) -> Value {
        serde_json::json!({"figures": {
            "duplicate_deliveries": duplicates, "dlq_records": 5, "output_records": 2000,
            "postgres_rows": 2000, "provider_effects": 2000,
        }})
    }

    fn scraped() -> Scraped {
        Scraped {
            processor: Some(PROCESSOR.into()),
            sink: Some(
                "eos_sink_rows_written_total{target=\"event_sink\"} 2000\n\
                 eos_sink_rows_written_total{target=\"entity_state\"} 100\n\
                 eos_sink_provider_effects_total{target=\"p\",outcome=\"charged\"} 2000\n\
                 eos_sink_provider_calls_total{target=\"p\",outcome=\"applied\"} 1990\n\
                 eos_sink_provider_calls_total{target=\"p\",outcome=\"ambiguous\"} 10\n"
                    .into(),
            ),
            dedup: Some(
                "eos_dedup_begin_outcomes_total{outcome=\"acquired\"} 2000\n\
                 eos_dedup_begin_outcomes_total{outcome=\"unknown\"} 30\n\
                 eos_dedup_unknown_resolved_total{outcome=\"SUCCEEDED\"} 10\n"
                    .into(),
            ),
            provider: Some("eos_provider_effects_total 2000\n".into()),
        }
    }

    #[test]
    fn metric_sum_adds_the_series_that_match_the_labels() {
        assert_eq!(
            metric_sum(PROCESSOR, "eos_processor_dead_letters_total", &[]),
            5
        );
        assert_eq!(
            metric_sum(
                PROCESSOR,
                "eos_processor_dead_letters_total",
                &["reason=\"malformed_json\""]
            ),
            3
        );
        assert_eq!(
            metric_sum(PROCESSOR, "eos_processor_records_out_total", &[]),
            2000
        );
        assert_eq!(metric_sum(PROCESSOR, "eos_processor_records_out", &[]), 0);
    }

    #[test]
    fn metrics_line_passes_only_when_every_counter_equals_the_audit() {
        let line = metrics_line(Some(&scraped()), &audit(100), (10, 10), false);
        assert_eq!(line.passed, Some(true), "{}", line.detail);
        let line = metrics_line(Some(&scraped()), &audit(99), (10, 10), false);
        assert_eq!(line.passed, Some(false));
        assert!(
            line.detail
                .contains("processor duplicates dropped = re-deliveries: 100 vs 99"),
            "{}",
            line.detail
        );
        let line = metrics_line(Some(&scraped()), &audit(100), (11, 11), false);
        assert_eq!(line.passed, Some(false), "{}", line.detail);
    }

    #[test]
    fn metrics_are_not_compared_after_kills() {
        let line = metrics_line(Some(&scraped()), &audit(99), (10, 10), true);
        assert_eq!(line.passed, None);
    }
}
