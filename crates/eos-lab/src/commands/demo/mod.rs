//! `eos-lab demo`: the whole pipeline under faults, and one report that says, boundary by
//! boundary, whether every event had exactly one effect.
//!
//! HTTP clients → payments-api (payment row + outbox row in one PostgreSQL transaction) →
//! outbox-relay → the payments topic → eos-processor → sink-writer → PostgreSQL tables, and
//! sink-writer → dedup-service → provider-sim for the charge. While the clients pay, the relay,
//! the processor and the sink-writer are SIGKILLed and restarted in turn, the relay is also
//! kept down for a while and killed again in the middle of the backlog that left
//! (`relay_outage`), and provider-sim applies charges but loses some answers. The report gives
//! how long each service took to catch up once the clients were done, against a bound. Once
//! everything has drained, `eosctl audit` checks the outbox (one event per committed payment),
//! the topics, the tables and the provider's effects by event_id. With `--guarantee
//! at-least-once` the relay and the processor run without transactions under the same faults:
//! the contrast is the point.
//!
//! `--source producer` starts at the topic instead: `eosctl produce` writes re-deliveries,
//! malformed records and reused ids with other content straight onto it, which the processor must
//! dedup and dead-letter (payments-api refuses such requests before anything is written).
//!
//! Every service is a real child process of the binaries next to this one; their logs, the sink's
//! targets file and the reports stay in the run's directory. The clients, the producer, the lag
//! waits and the audit are this eos-lab's own code, run in-process.

mod aimed_kill;
mod args;
mod database;
mod metrics;
mod payments_workload;
mod registry_format;
mod relay_outage;
mod report;
mod scrape;
mod services;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use indicatif::ProgressBar;
use rand::SeedableRng as _;
use serde_json::Value;

use crate::bench::record_format::RecordFormat;
use crate::chain::service::{Service, wait_listening};
use crate::chain::{ProviderTarget, create_database, drop_database, sink_targets};
use crate::commands::demo::aimed_kill::{AimedKill, KillAim};
pub use crate::commands::demo::args::{DemoArgs, DemoGuarantee, DemoSource};
use crate::commands::demo::database::{drop_relay_slot, outbox_backlog, unknowns};
use crate::commands::demo::metrics::metrics_line;
use crate::commands::demo::payments_workload::{PaymentsSummary, PaymentsWorkload};
use crate::commands::demo::registry_format::RegistryFormat;
use crate::commands::demo::relay_outage::{OutagePlan, RelayOutage};
pub use crate::commands::demo::report::{DemoReport, ReportLine, report_text};
use crate::commands::demo::report::{Drain, DrainStage, build_report};
use crate::commands::demo::scrape::{Scraped, scrape};
use crate::commands::demo::services::RunPlace;
use eos_runtime::kafka_settings::ChildKafkaProperties;
use eos_testkit::loopback_ports::free_loopback_addr;
use eosctl::cli::{AuditArgs, ProduceArgs, TraceArgs};
use eosctl::commands::{self, audit, progress_bar};

use eosctl::kafka_client::{KafkaSettings, TopicLayout, ensure_topic};
use eosctl::produce;
use eosctl::report::grouped;

/// Writes `services`' /metrics addresses for Prometheus's `file_sd_configs`: written whole to a
/// temporary file and renamed, since Prometheus re-reads the file whenever it changes.
fn write_prometheus_targets(path: &Path, services: &[&Service]) -> anyhow::Result<()> {
    let groups: Vec<serde_json::Value> = services
        .iter()
        .map(|service| {
            serde_json::json!({
                "targets": [service.ops_addr.to_string()],
                "labels": { "job": service.name },
            })
        })
        .collect();
    let partial = path.with_extension("partial");
    std::fs::write(&partial, serde_json::to_vec_pretty(&groups)?)
        .with_context(|| format!("writing {}", partial.display()))?;
    std::fs::rename(&partial, path).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// Progress for people: plain lines on stderr.
fn say(line: impl AsRef<str>) {
    eprintln!("{}", line.as_ref());
}

/// A subcommand's arguments from the words a user would type after it: the demo runs `produce`
/// and `audit` in-process with exactly the defaults of their command lines.
fn command_args<A: clap::Args + clap::FromArgMatches>(words: &[&str]) -> anyhow::Result<A> {
    let matches = A::augment_args(clap::Command::new("eos-lab"))
        .try_get_matches_from(std::iter::once("eos-lab").chain(words.iter().copied()))?;
    Ok(A::from_arg_matches(&matches)?)
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| (*s).to_owned()).collect()
}

/// Where the service binaries are, each one the run starts there; and the flags that do not go
/// together refused before anything starts.
fn binary_dir(args: &DemoArgs) -> anyhow::Result<PathBuf> {
    let self_exe = std::env::current_exe().context("locating eos-lab")?;
    let bin_dir = match &args.bin_dir {
        Some(dir) => dir.clone(),
        None => self_exe
            .parent()
            .context("eos-lab has no directory")?
            .to_path_buf(),
    };
    let mut binaries = vec![
        "eos-processor",
        "sink-writer",
        "dedup-service",
        "provider-sim",
    ];
    if args.source == DemoSource::PaymentsApi {
        binaries.extend(["payments-api", "outbox-relay"]);
    }
    for binary in binaries {
        if !bin_dir.join(binary).is_file() {
            bail!(
                "{} is missing: build the workspace first (make demo does), or point --bin-dir at \
                 the binaries",
                bin_dir.join(binary).display()
            );
        }
    }
    if args.format != RecordFormat::Json && args.source == DemoSource::Producer {
        bail!(
            "--format {} is for --source payments-api (eosctl produce writes JSON)",
            args.format
        );
    }
    Ok(bin_dir)
}

/// The run's first lines: what it does, under which faults, and where to look.
fn announce(
    args: &DemoArgs,
    registry_format: Option<&RegistryFormat>,
    run_dir: &Path,
    [input, output, database, provider_url]: [&str; 4],
) {
    let traces_note = if std::env::var_os("OTEL_EXPORTER_OTLP_ENDPOINT").is_some() {
        "traces are exported to OTEL_EXPORTER_OTLP_ENDPOINT"
    } else {
        "traces are off: set OTEL_EXPORTER_OTLP_ENDPOINT to export them"
    };
    let relay_kills = match args.source {
        DemoSource::PaymentsApi if !args.relay_outage.is_zero() => format!(
            "{} of outbox-relay and a {} outage of it, ",
            args.relay_kills,
            humantime::format_duration(args.relay_outage)
        ),
        DemoSource::PaymentsApi => format!("{} of outbox-relay, ", args.relay_kills),
        DemoSource::Producer => String::new(),
    };
    let format = match registry_format {
        Some(registry_format) => format!(", {} topics", registry_format.format()),
        None => String::new(),
    };
    say(format!(
        "== eos-suite demo ({}{format}): {} payments through {}, SIGKILLs: {relay_kills}{} of \
         eos-processor, {} of sink-writer; provider-sim losing {:.0}% of answers",
        args.guarantee.as_str(),
        grouped(args.events as i64),
        match args.source {
            DemoSource::PaymentsApi => "payments-api and the outbox",
            DemoSource::Producer => "eosctl produce",
        },
        args.processor_kills,
        args.sink_kills,
        (args.provider_drop + args.provider_error + args.provider_late) * 100.0
    ));
    say(format!(
        "   run directory {} ({traces_note})",
        run_dir.display()
    ));
    say(format!(
        "   topics {input} -> {output}; PostgreSQL database {database} (payments_api_payments, \
         eos_outbox, event_sink, entity_state, dedup_intents); provider {provider_url}"
    ));
}

pub async fn run(kafka: KafkaSettings, args: DemoArgs) -> anyhow::Result<bool> {
    let bin_dir = binary_dir(&args)?;
    let bootstrap_servers = kafka.bootstrap_servers.as_str();
    let started = time::OffsetDateTime::now_utc().unix_timestamp();
    let run_id = format!("{started}-{}", std::process::id());
    let seed = args
        .seed
        .unwrap_or_else(|| u64::try_from(started).unwrap_or_default());
    let run_dir = args.runs_dir.join(&run_id);
    std::fs::create_dir_all(&run_dir).with_context(|| format!("creating {}", run_dir.display()))?;
    let run_dir = run_dir.canonicalize()?;
    // The Kafka services connect as eos-lab does (TLS, SASL): its properties, secrets included,
    // reach them through an owner-only file named in their environment, removed at the end.
    let kafka_for_services = Arc::new(
        kafka
            .write_for_children(&run_dir.join("kafka-client.properties"))
            .context("writing the Kafka properties for the services")?,
    );
    let input = format!("demo-payments-{run_id}");
    let output = format!("demo-ledger-{run_id}");
    let processor_group = format!("demo-processor-{run_id}");
    let sink_group = format!("demo-sink-{run_id}");
    let mut registry_format = RegistryFormat::register(
        args.format,
        args.schema_registry_url.as_deref(),
        [&input, &output],
    )?;
    // dedup-service's intents outlive a run: a fresh name keeps this run's operation ids new.
    let provider_name = format!("pay_{}", run_id.replace('-', "_"));

    let database = format!("eos_demo_{}", run_id.replace('-', "_"));
    let database_url = create_database(&args.database_url, &database).await?;
    let provider_addr = free_loopback_addr()?;
    let dedup_addr = free_loopback_addr()?;
    let provider_url = format!("http://{provider_addr}");
    let dedup_url = format!("http://{dedup_addr}");
    announce(
        &args,
        registry_format.as_ref(),
        &run_dir,
        [&input, &output, &database, &provider_url],
    );

    let place = RunPlace {
        bin_dir: &bin_dir,
        run_dir: &run_dir,
        bootstrap_servers,
        kafka: &kafka_for_services,
    };
    let mut provider = services::provider_sim(&place, &args, provider_addr, seed);
    let mut dedup = services::dedup_service(&place, dedup_addr, &provider_url, &database_url)?;
    let targets = run_dir.join("sink-targets.toml");
    std::fs::write(
        &targets,
        sink_targets(
            "eos-lab demo",
            Some(&ProviderTarget {
                name: &provider_name,
                dedup_url: &dedup_url,
                provider_url: &provider_url,
                concurrency: None,
                as_http: false,
            }),
        ),
    )?;
    // The processor's store, removed at the end: only this run's group uses it.
    let processor_state = run_dir.join("processor-state");
    let mut processor = services::eos_processor(
        &place,
        &args,
        [&input, &output, &processor_group],
        &processor_state,
        registry_format.as_ref(),
    )?;
    let mut sink = services::sink_writer(
        &place,
        [&output, &sink_group],
        &targets,
        &database_url,
        registry_format.as_ref(),
    )?;

    let mut outbox = match args.source {
        DemoSource::PaymentsApi => Some(OutboxServices::new(
            &args,
            (&bin_dir, &run_dir),
            (bootstrap_servers, &kafka_for_services),
            &database_url,
            &input,
            format!("demo-{run_id}"),
            registry_format.as_ref(),
        )?),
        DemoSource::Producer => None,
    };

    if let Some(path) = &args.prometheus_targets {
        let mut services = vec![&provider, &dedup, &processor, &sink];
        if let Some(outbox) = &outbox {
            services.extend([&outbox.api, &outbox.relay]);
        }
        write_prometheus_targets(path, &services)?;
    }
    let outcome = drive(
        &args,
        seed,
        &kafka,
        &run_dir,
        [&mut provider, &mut dedup, &mut processor, &mut sink],
        outbox.as_mut(),
        registry_format.as_ref(),
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
    let mut services = vec![&mut sink, &mut processor, &mut dedup];
    if let Some(outbox) = outbox.as_mut() {
        services.extend([&mut outbox.relay, &mut outbox.api]);
    }
    for service in services {
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
    if let Some(outbox) = &outbox {
        // The relay's replication slot would hold the server's WAL after the run, kept database
        // or not.
        let slot = outbox_relay::config::slot_name_from(&outbox.relay_name);
        if let Err(error) = drop_relay_slot(&database_url, &slot).await {
            say(format!(
                "   cannot drop the relay's replication slot {slot}: {error:#}"
            ));
        }
    }
    let Driven {
        drain,
        payments,
        aimed_processor_kills,
        relay_outage,
    } = outcome?;
    say(
        "== audit: the logical set by event_id at every boundary (outbox, topics, tables, \
         provider)",
    );
    let outcome = audit_run(
        kafka,
        [
            &input,
            &output,
            &database_url,
            &provider_url,
            &provider_name,
        ],
        outbox.is_some(),
        registry_format.as_ref(),
    )
    .await;
    provider.stop().await.ok();
    let mut services = vec![&provider, &dedup, &processor, &sink];
    if let Some(outbox) = &outbox {
        services.extend([&outbox.api, &outbox.relay]);
    }
    let peak_rss_kib: std::collections::BTreeMap<String, u64> = services
        .into_iter()
        .filter(|service| service.peak_rss_kib > 0)
        .map(|service| (service.name.to_owned(), service.peak_rss_kib))
        .collect();
    let outcome = outcome.context("the audit could not run")?;
    // What `eosctl audit --json` prints, and the report carries it as that JSON reads back.
    let audit_json = serde_json::to_string(&outcome)?;
    std::fs::write(run_dir.join("audit.json"), format!("{audit_json}\n"))?;
    let audit_code = if outcome.report.passed { 0 } else { 1 };
    let audit: Value = serde_json::from_str(&audit_json)?;
    let reconciled = unknowns(&database_url, &provider_name).await?;
    if args.drop_database {
        drop_database(&args.database_url, &database).await?;
        if let Some(registry_format) = registry_format.as_mut() {
            registry_format.delete_subjects();
        }
    }
    std::fs::remove_dir_all(&processor_state).ok();

    let faults = fault_lines(
        &args,
        [&processor, &sink],
        outbox.as_ref(),
        relay_outage.as_ref(),
        aimed_processor_kills,
    );
    let killed = processor.restarts
        + sink.restarts
        + outbox.as_ref().map_or(0, |outbox| outbox.relay.restarts)
        > 0;
    let metrics = metrics_line(scraped.as_ref(), &audit, reconciled, killed);
    let mut report = build_report(
        &args,
        &run_dir,
        [
            &input,
            &output,
            &payments
                .as_ref()
                .and_then(|payments| payments.first_payment_id.clone())
                .unwrap_or_else(|| format!("evt-{seed}-0")),
        ],
        faults,
        payments.as_ref(),
        audit,
        audit_code,
        reconciled,
        (drain, stopped_cleanly),
        metrics,
    );
    report.peak_rss_kib = peak_rss_kib;
    report.relay_outage = relay_outage;
    std::fs::write(
        run_dir.join("report.json"),
        serde_json::to_string_pretty(&report)?,
    )?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{}", report_text(&report));
    }
    if let Some(jaeger_url) = &args.show_trace_from {
        show_trace(jaeger_url, &report.sample_event_id).await;
    }
    Ok(report.passed)
}

/// `eosctl audit` of the run, in-process: the topics (decoded as the run's format), the tables,
/// the provider's effects and, with the outbox, the committed payment rows.
async fn audit_run(
    kafka: KafkaSettings,
    [input, output, database_url, provider_url, provider_name]: [&str; 5],
    with_outbox: bool,
    registry_format: Option<&RegistryFormat>,
) -> anyhow::Result<eosctl::report::AuditOutcome> {
    let prefix = format!("{provider_name}:");
    let mut audit_words = vec![
        "--input",
        input,
        "--output",
        output,
        "--database-url",
        database_url,
        "--provider-url",
        provider_url,
        "--provider-operation-prefix",
        &prefix,
    ];
    if with_outbox {
        audit_words.extend(["--outbox-database-url", database_url]);
    }
    let audit_format_args = registry_format
        .map(RegistryFormat::audit_args)
        .unwrap_or_default();
    audit_words.extend(audit_format_args.iter().map(String::as_str));
    let audit_args: AuditArgs = command_args(&audit_words)?;
    audit::audit(kafka, audit_args, ProgressBar::hidden()).await
}

/// The report's faults line: each service's SIGKILLs, the relay's outage, the provider's faults.
fn fault_lines(
    args: &DemoArgs,
    [processor, sink]: [&Service; 2],
    outbox: Option<&OutboxServices>,
    relay_outage: Option<&RelayOutage>,
    aimed_processor_kills: usize,
) -> Vec<String> {
    let kills =
        |n: usize, name: &str| format!("{n} SIGKILL{} of {name}", if n == 1 { "" } else { "s" });
    let mut faults = Vec::new();
    if let Some(outbox) = outbox {
        faults.push(kills(outbox.relay.restarts, "outbox-relay"));
        if let Some(outage) = relay_outage {
            faults.push(outage.fault_line());
        }
    }
    let processor_kills = kills(processor.restarts, "eos-processor");
    faults.extend([
        match args.guarantee {
            DemoGuarantee::ExactlyOnce => processor_kills,
            DemoGuarantee::AtLeastOnce => format!(
                "{processor_kills}, {aimed_processor_kills} aimed at outputs its restart repeats"
            ),
        },
        kills(sink.restarts, "sink-writer"),
    ]);
    faults.push(format!(
        "provider-sim applied every charge and lost {:.0}% of the answers (dropped, 500, late)",
        (args.provider_drop + args.provider_error + args.provider_late) * 100.0
    ));
    faults
}

/// The sample event's trace, after the report; not finding it does not fail the run (spans are
/// exported in batches, and a SIGKILLed service loses the ones it had not sent).
async fn show_trace(jaeger_url: &str, event_id: &str) {
    say(format!(
        "\n== the trace of {event_id} (eosctl trace {event_id}, from Jaeger at {jaeger_url})"
    ));
    let shown =
        match command_args::<TraceArgs>(&[event_id, "--jaeger-url", jaeger_url, "--wait", "20s"]) {
            Ok(trace_args) => commands::trace::run(trace_args).await,
            Err(error) => Err(error),
        };
    match shown {
        Ok(commands::Status::Success) => {}
        Ok(_) => say(
            "   Jaeger has no span of it (were the services run with OTEL_EXPORTER_OTLP_ENDPOINT?)",
        ),
        Err(error) => say(format!("   cannot show it: {error:#}")),
    }
}

/// payments-api and outbox-relay, when the payments come through the outbox.
struct OutboxServices {
    api: Service,
    api_addr: SocketAddr,
    relay: Service,
    relay_name: String,
    /// The relay's `--batch-size`, given or its own default.
    relay_batch_size: i64,
    /// What a relay process is started from again after an outage.
    relay_start: RelayStart,
    database_url: String,
}

/// outbox-relay's command line, environment and paths.
struct RelayStart {
    bin_dir: PathBuf,
    run_dir: PathBuf,
    args: Vec<String>,
    ops: SocketAddr,
    database_url: String,
    kafka: Arc<ChildKafkaProperties>,
}

impl RelayStart {
    /// A relay not started yet; its log is the relay's log, appended to.
    fn service(&self) -> Service {
        Service::new(
            "outbox-relay",
            &self.bin_dir,
            &self.run_dir,
            self.args.clone(),
            self.ops,
        )
        .with_env("DATABASE_URL", &self.database_url)
        .with_kafka_properties(&self.kafka)
    }
}

impl OutboxServices {
    fn new(
        args: &DemoArgs,
        (bin_dir, run_dir): (&Path, &Path),
        (bootstrap_servers, kafka): (&str, &Arc<ChildKafkaProperties>),
        database_url: &str,
        topic: &str,
        relay_name: String,
        registry_format: Option<&RegistryFormat>,
    ) -> anyhow::Result<Self> {
        let api_addr = free_loopback_addr()?;
        let ops = free_loopback_addr()?;
        let api = Service::new(
            "payments-api",
            bin_dir,
            run_dir,
            strings(&[
                "--addr",
                &api_addr.to_string(),
                "--topic",
                topic,
                "--metrics-addr",
                &ops.to_string(),
            ]),
            ops,
        )
        .with_env("DATABASE_URL", database_url);
        let ops = free_loopback_addr()?;
        let mut relay_args = strings(&[
            "--bootstrap-servers",
            bootstrap_servers,
            "--relay-name",
            &relay_name,
            "--guarantee",
            args.guarantee.as_str(),
            "--metrics-addr",
            &ops.to_string(),
        ]);
        if let Some(size) = args.relay_batch_size {
            relay_args.extend(["--batch-size".to_owned(), size.to_string()]);
        }
        if let Some(registry_format) = registry_format {
            relay_args.extend(registry_format.relay_args());
        }
        let relay_start = RelayStart {
            bin_dir: bin_dir.to_path_buf(),
            run_dir: run_dir.to_path_buf(),
            args: relay_args,
            ops,
            database_url: database_url.to_owned(),
            kafka: Arc::clone(kafka),
        };
        Ok(Self {
            api,
            api_addr,
            relay: relay_start.service(),
            relay_name,
            relay_batch_size: relay_outage::relay_batch_size(args.relay_batch_size)?,
            relay_start,
            database_url: database_url.to_owned(),
        })
    }

    /// SIGKILLs the relay and leaves it down until `relay_back`. Dropping the supervisor's
    /// handle is the SIGKILL (eos-testkit's `ChildProcess` kills and reaps on drop); the handle
    /// put in its place is not started yet, and carries the count of kills and the peak memory
    /// of the earlier processes (the killed one's own peak is not read).
    fn relay_down(&mut self) -> anyhow::Result<()> {
        // A relay that exited by itself is a failure of the run, not an outage.
        self.relay.check_running()?;
        let down = std::mem::replace(&mut self.relay, self.relay_start.service());
        self.relay.restarts = down.restarts + 1;
        self.relay.peak_rss_kib = down.peak_rss_kib;
        drop(down);
        Ok(())
    }

    /// Starts the relay after `relay_down`; the outbox rows waiting for it then.
    async fn relay_back(&mut self) -> anyhow::Result<i64> {
        let backlog = outbox_backlog(&self.database_url, &self.relay_name).await?;
        self.relay.start()?;
        Ok(backlog)
    }

    /// Waits until the relay has published every outbox row.
    async fn wait_relayed(&mut self, timeout: Duration) -> anyhow::Result<bool> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            self.relay.check_running()?;
            if outbox_backlog(&self.database_url, &self.relay_name).await? == 0 {
                return Ok(true);
            }
            if std::time::Instant::now() >= deadline {
                return Ok(false);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// The workload running in the background: the producer's, or payments-api's clients'; each
/// ends with the moment it was done, where the drain time starts.
enum Workload {
    Producer(tokio::task::JoinHandle<(anyhow::Result<produce::ProduceSummary>, Instant)>),
    Payments(tokio::task::JoinHandle<(anyhow::Result<PaymentsSummary>, Instant)>),
}

/// Starts the workload's source; the processor and the sink start once its topic exists.
async fn start_workload(
    args: &DemoArgs,
    seed: u64,
    kafka: &KafkaSettings,
    input: &str,
    outbox: Option<&mut OutboxServices>,
    registry_format: Option<&RegistryFormat>,
) -> anyhow::Result<Workload> {
    let Some(outbox) = outbox else {
        say(format!(
            "== producing at {}/s: 5% re-deliveries, 0.5% malformed, 0.1% reused ids with other \
             content",
            args.rate
        ));
        let produce_args: ProduceArgs = command_args(&[
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
        ])?;
        let options = commands::produce::options(&produce_args)?;
        let kafka = kafka.clone();
        let stop = Arc::new(AtomicBool::new(false));
        let producer = tokio::spawn(async move {
            let summary = produce::run(&kafka, options, ProgressBar::hidden(), stop).await;
            (summary.map_err(anyhow::Error::from), Instant::now())
        });
        // The producer creates the input topic; the processor starts once it is there.
        tokio::time::sleep(Duration::from_millis(500)).await;
        return Ok(Workload::Producer(producer));
    };
    let layout = TopicLayout {
        partitions: 3,
        replication_factor: -1,
    };
    ensure_topic(kafka, input, layout).await?;
    outbox.api.start()?;
    wait_listening(&mut outbox.api, outbox.api_addr).await?;
    outbox.relay.start()?;
    outbox.relay.wait_ready(Duration::from_secs(60)).await?;
    // payments-api refuses bad requests, so the topic's ambiguous JSON comes from a producer
    // writing next to the relay: one duplicate key, one integer beyond 64 bits, one inexact
    // number. Each must end as a dead letter with its reason, and the audit counts them. On a
    // registry topic they are three records that do not decode instead.
    let mut ambiguous =
        eosctl::workload::Workload::ambiguous_records(seed, time::OffsetDateTime::now_utc())?;
    let written_directly = match registry_format {
        Some(registry_format) => {
            ambiguous = registry_format.undecodable_records(ambiguous);
            format!(
                "3 records that do not decode as {} (not the wire format, an unknown schema id, \
                 bytes the schema does not read)",
                registry_format.format()
            )
        }
        None => "3 ambiguous JSON records (duplicate key, integer beyond 64 bits, inexact number)"
            .to_owned(),
    };
    produce::write_records(
        kafka,
        produce::SendOptions {
            topic: input.to_owned(),
            rate: 0,
            delivery_timeout: Duration::from_secs(30),
        },
        seed,
        ambiguous,
    )
    .await
    .with_context(|| format!("writing the ambiguous records to {input:?}"))?;
    say(format!(
        "== paying at {}/s through payments-api: 5% resent with the same key, 0.1% keys reused \
         with another amount, 0.5% malformed requests; {written_directly} written to the topic \
         directly",
        args.rate
    ));
    let workload = PaymentsWorkload {
        api_url: format!("http://{}", outbox.api_addr),
        payments: args.events,
        rate: args.rate,
        accounts: 100,
        resend_ratio: 0.05,
        key_reuse_ratio: 0.001,
        malformed_ratio: 0.005,
        seed,
    };
    Ok(Workload::Payments(tokio::spawn(async move {
        let summary = payments_workload::run(workload).await;
        (summary, Instant::now())
    })))
}

/// What driving the pipeline came to.
struct Driven {
    /// How long each service took to catch up once the workload was done, and the bound.
    drain: Drain,
    payments: Option<PaymentsSummary>,
    /// At-least-once processor kills that landed with outputs its restart repeats.
    aimed_processor_kills: usize,
    relay_outage: Option<RelayOutage>,
}

/// How long an at-least-once processor kill waits for outputs its restart repeats before it
/// lands anyway (and is reported as not aimed); the same for the relay kill mid catch-up, which
/// waits for half of the backlog to be published.
const AIM_WITHIN: Duration = Duration::from_secs(60);

/// What the run does to the services, in the order of their times from the workload's start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// A SIGKILL, restarted at once: 0 the relay, 1 the processor, 2 the sink.
    Kill(usize),
    RelayDown,
    /// The relay back after the outage, and its kill mid catch-up.
    RelayBack,
}

/// The timed kills spread over the workload with jitter, round robin over the services with
/// kills left (relay, processor, sink), and the relay's outage; a relay kill that falls in the
/// outage waits for its end.
fn fault_schedule(
    [relay_kills, processor_kills, sink_kills]: [usize; 3],
    workload: Duration,
    outage: Option<OutagePlan>,
    rng: &mut impl rand::Rng,
) -> Vec<(Duration, Fault)> {
    let mut schedule = Vec::new();
    if let Some(outage) = outage {
        schedule.extend([
            (outage.start, Fault::RelayDown),
            (outage.end(), Fault::RelayBack),
        ]);
    }
    let kills = relay_kills + processor_kills + sink_kills;
    let gap = workload.as_secs_f64() / (kills + 1) as f64;
    let mut left = [relay_kills, processor_kills, sink_kills];
    let mut turn = 0;
    let mut at = 0.0;
    for _ in 0..kills {
        at += gap * rng.random_range(0.7..1.3);
        while left[turn % 3] == 0 {
            turn += 1;
        }
        left[turn % 3] -= 1;
        let mut when = Duration::from_secs_f64(at);
        if turn % 3 == 0
            && let Some(outage) = outage.filter(|outage| outage.covers(when))
        {
            when = outage.end();
        }
        schedule.push((when, Fault::Kill(turn % 3)));
        turn += 1;
    }
    // Stable: the relay's return stays ahead of the relay kills moved to the outage's end.
    schedule.sort_by_key(|(when, _)| *when);
    schedule
}

/// SIGKILLs `service` once it is ready and restarts it at once, aimed (`aim`: the at-least-once
/// processor's) or not; `Some(landed as aimed)` for an aimed kill.
async fn kill(
    service: &mut Service,
    aim: Option<&AimedKill<'_>>,
    rng: &mut impl rand::Rng,
) -> anyhow::Result<Option<bool>> {
    // A kill should land on a service at work, not one still joining its group.
    service.wait_ready(Duration::from_secs(30)).await?;
    tokio::time::sleep(Duration::from_millis(rng.random_range(200..800))).await;
    let Some(aimed_kill) = aim else {
        let pid = service.kill_and_restart().await?;
        say(format!(
            "   SIGKILL #{} of {} (pid {pid}), restarted",
            service.restarts, service.name
        ));
        return Ok(None);
    };
    let (aimed, how) = match aimed_kill.kill(service, AIM_WITHIN).await? {
        KillAim::Aimed { repeated_outputs } => (
            true,
            format!("with {repeated_outputs} outputs its restart repeats"),
        ),
        KillAim::Missed => (
            false,
            format!(
                "not aimed: no outputs its restart repeats within {}",
                humantime::format_duration(AIM_WITHIN)
            ),
        ),
    };
    say(format!(
        "   SIGKILL #{} of {} ({how}), restarted",
        service.restarts, service.name
    ));
    Ok(Some(aimed))
}

/// The relay's faults in their order: its timed kills, its outage and the kill mid catch-up
/// that follows; what the outage came to.
async fn relay_timeline(
    args: &DemoArgs,
    mut outbox: Option<&mut OutboxServices>,
    workload_started: Instant,
    faults: Vec<(Duration, Fault)>,
    rng: &mut impl rand::Rng,
) -> anyhow::Result<Option<RelayOutage>> {
    let mut relay_down_at = workload_started;
    let mut relay_outage = None;
    for (when, fault) in faults {
        let at = match fault {
            // The outage lasts what was asked even when a kill before it made it start late.
            Fault::RelayBack => relay_down_at + args.relay_outage,
            _ => workload_started + when,
        };
        tokio::time::sleep_until(at.into()).await;
        let outbox = outbox
            .as_deref_mut()
            .context("relay faults without a relay")?;
        match fault {
            Fault::RelayDown => {
                outbox.relay_down()?;
                relay_down_at = Instant::now();
                say(format!(
                    "   SIGKILL #{} of outbox-relay: down for {} while the clients pay",
                    outbox.relay.restarts,
                    humantime::format_duration(args.relay_outage)
                ));
            }
            Fault::RelayBack => {
                let backlog = outbox.relay_back().await?;
                let down_for = relay_down_at.elapsed();
                say(format!(
                    "   outbox-relay restarted after {down_for:.1?} with {} outbox rows waiting \
                     ({:.1} batches of {})",
                    grouped(backlog),
                    backlog as f64 / outbox.relay_batch_size as f64,
                    grouped(outbox.relay_batch_size)
                ));
                let published =
                    relay_outage::kill_mid_catch_up(&mut outbox.relay, backlog, AIM_WITHIN).await?;
                let outage =
                    RelayOutage::new(down_for, outbox.relay_batch_size, backlog, published);
                say(format!(
                    "   SIGKILL #{} of outbox-relay {} after {} of the {} rows, restarted",
                    outbox.relay.restarts,
                    if outage.killed_mid_catch_up {
                        "mid catch-up"
                    } else {
                        "(not mid catch-up)"
                    },
                    grouped(published),
                    grouped(backlog)
                ));
                relay_outage = Some(outage);
            }
            Fault::Kill(_) => {
                kill(&mut outbox.relay, None, rng).await?;
            }
        }
    }
    Ok(relay_outage)
}

#[allow(clippy::too_many_arguments)]
async fn drive(
    args: &DemoArgs,
    seed: u64,
    kafka: &KafkaSettings,
    run_dir: &Path,
    [provider, dedup, processor, sink]: [&mut Service; 4],
    mut outbox: Option<&mut OutboxServices>,
    registry_format: Option<&RegistryFormat>,
    (input, output, processor_group, sink_group): (&str, &str, &str, &str),
    (provider_addr, dedup_addr): (SocketAddr, SocketAddr),
) -> anyhow::Result<Driven> {
    provider.start()?;
    wait_listening(provider, provider_addr).await?;
    dedup.start()?;
    wait_listening(dedup, dedup_addr).await?;
    say("   provider-sim and dedup-service are up");

    let workload = start_workload(
        args,
        seed,
        kafka,
        input,
        outbox.as_deref_mut(),
        registry_format,
    )
    .await?;
    let workload_started = Instant::now();
    processor.start()?;
    sink.start()?;

    let relay_kills = if outbox.is_some() {
        args.relay_kills
    } else {
        0
    };
    let workload_time =
        Duration::from_secs_f64(args.events as f64 * 1.06 / args.rate.max(1) as f64);
    let outage = outbox
        .as_ref()
        .and_then(|_| OutagePlan::new(args.relay_outage, workload_time));
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let schedule = fault_schedule(
        [relay_kills, args.processor_kills, args.sink_kills],
        workload_time,
        outage,
        &mut rng,
    );
    // Two timelines side by side: the relay's (its kills and its outage) and the processor's
    // and the sink's. A kill waits for its service to be ready (a processor rejoining its group
    // takes seconds), which must not stretch the relay's outage or delay its return.
    let (relay_faults, other_faults): (Vec<_>, Vec<_>) = schedule
        .into_iter()
        .partition(|(_, fault)| *fault != Fault::Kill(1) && *fault != Fault::Kill(2));
    let mut relay_rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0x5eed);
    let relay_timeline = relay_timeline(
        args,
        outbox.as_deref_mut(),
        workload_started,
        relay_faults,
        &mut relay_rng,
    );
    let changelog = format!("{processor_group}-{input}-changelog");
    let aimed_kill = AimedKill {
        kafka,
        input,
        output,
        changelog: &changelog,
        group: processor_group,
    };
    let other_timeline = async {
        let mut aimed_processor_kills = 0;
        for (when, fault) in other_faults {
            tokio::time::sleep_until((workload_started + when).into()).await;
            let aim = fault == Fault::Kill(1) && args.guarantee == DemoGuarantee::AtLeastOnce;
            let service = match fault {
                Fault::Kill(1) => &mut *processor,
                _ => &mut *sink,
            };
            let Some(aimed) = kill(service, aim.then_some(&aimed_kill), &mut rng).await? else {
                continue;
            };
            if aimed {
                aimed_processor_kills += 1;
            }
        }
        anyhow::Ok(aimed_processor_kills)
    };
    let (relay_outage, aimed_processor_kills) = tokio::try_join!(relay_timeline, other_timeline)?;
    let (payments, workload_ended) = match workload {
        Workload::Producer(producer) => {
            let (summary, ended) = producer.await.context("the producer task")?;
            let summary = summary.with_context(|| format!("producing to topic {input:?}"))?;
            std::fs::write(
                run_dir.join("produce.json"),
                format!("{}\n", serde_json::to_string(&summary)?),
            )?;
            say("== producer done; waiting for the pipeline to drain");
            (None, ended)
        }
        Workload::Payments(clients) => {
            let (summary, ended) = clients.await.context("the payments clients' task")?;
            let summary = summary.context("paying through payments-api")?;
            std::fs::write(
                run_dir.join("payments.json"),
                format!("{}\n", serde_json::to_string(&summary)?),
            )?;
            say(format!(
                "== {} payments made; waiting for the pipeline to drain",
                grouped(summary.created as i64)
            ));
            (Some(summary), ended)
        }
    };
    // One bound for the whole drain, from the workload's end: a stage that catches up late
    // leaves the next one less time. Each stage's time is when it was seen caught up, after
    // the faults that outlasted the workload (a killed service must catch up too).
    let deadline = workload_ended + args.drain_timeout;
    let left = || deadline.saturating_duration_since(Instant::now());
    let timeout = humantime::format_duration(args.drain_timeout);
    let mut stages = Vec::new();
    if let Some(outbox) = outbox {
        let caught_up = outbox.wait_relayed(left()).await?;
        let after = workload_ended.elapsed();
        if caught_up {
            say(format!(
                "   outbox-relay published every outbox row, {after:.1?} after the workload"
            ));
        } else {
            say(format!("   outbox-relay did not catch up within {timeout}"));
        }
        stages.push(DrainStage::new("outbox-relay", caught_up.then_some(after)));
    }
    for (group, topic, service) in [
        (processor_group, input, &mut *processor),
        (sink_group, output, &mut *sink),
    ] {
        let lag = commands::lag::observe(
            kafka.clone(),
            group,
            topic,
            Some(left()),
            progress_bar(0, "records behind"),
        )
        .await;
        let after = workload_ended.elapsed();
        service.check_running()?;
        let caught_up = match lag {
            Ok(outcome) => !outcome.timed_out,
            Err(error) => {
                tracing::warn!(error = format!("{error:#}"), "cannot read the lag");
                false
            }
        };
        if caught_up {
            say(format!(
                "   {} caught up with {topic}, {after:.1?} after the workload",
                service.name
            ));
        } else {
            say(format!(
                "   {} did not catch up within {timeout}",
                service.name
            ));
        }
        stages.push(DrainStage::new(service.name, caught_up.then_some(after)));
    }
    Ok(Driven {
        drain: Drain::new(
            args.drain_timeout,
            workload_ended.saturating_duration_since(workload_started),
            stages,
        ),
        payments,
        aimed_processor_kills,
        relay_outage,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_process_commands_get_their_command_line_defaults() -> anyhow::Result<()> {
        let produce: ProduceArgs =
            command_args(&["--topic", "t", "--count", "10", "--bad-ratio", "0.005"])?;
        assert_eq!((produce.entities, produce.value_bytes), (100, 200));
        assert_eq!(produce.bad_ratio, 0.005);
        assert_eq!(produce.delivery_timeout, Duration::from_secs(60));
        let audit: AuditArgs = command_args(&[
            "--input",
            "i",
            "--output",
            "o",
            "--database-url",
            "postgres://h/d",
        ])?;
        assert_eq!(audit.sink_table, "event_sink");
        assert_eq!(audit.dedup_horizon, Duration::from_secs(7 * 24 * 3600));
        assert!(command_args::<ProduceArgs>(&["--topic", "t", "--count", "x"]).is_err());
        Ok(())
    }

    #[test]
    fn no_relay_kill_falls_in_the_outage_and_the_relay_is_back_before_one_after_it() {
        let workload = Duration::from_secs_f64(10.6);
        let outage = OutagePlan::new(Duration::from_secs(6), workload);
        let outage_plan = outage.expect("an outage");
        for seed in 0..50 {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let schedule = fault_schedule([2, 3, 3], workload, outage, &mut rng);
            let kills_of = |target| {
                schedule
                    .iter()
                    .filter(|(_, fault)| *fault == Fault::Kill(target))
                    .count()
            };
            assert_eq!((kills_of(0), kills_of(1), kills_of(2)), (2, 3, 3));
            let back = schedule
                .iter()
                .position(|(_, fault)| *fault == Fault::RelayBack)
                .expect("the relay comes back");
            let down = schedule
                .iter()
                .position(|(_, fault)| *fault == Fault::RelayDown)
                .expect("the relay goes down");
            for (index, (when, fault)) in schedule.iter().enumerate() {
                if *fault == Fault::Kill(0) {
                    assert!(!outage_plan.covers(*when), "seed {seed}: {schedule:?}");
                    assert!(index < down || index > back, "seed {seed}: {schedule:?}");
                }
            }
            assert!(schedule.windows(2).all(|pair| pair[0].0 <= pair[1].0));
        }
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        let schedule = fault_schedule([2, 0, 0], workload, None, &mut rng);
        assert_eq!(schedule.len(), 2);
    }
}
