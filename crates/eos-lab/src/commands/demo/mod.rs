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
mod command_line;
mod database;
mod drive;
mod metrics;
mod outbox_services;
mod payments_workload;
mod processes;
mod registry_format;
mod relay_outage;
mod report;
mod run_names;
mod scrape;
mod services;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context as _, bail};
use indicatif::ProgressBar;
use serde_json::Value;

use crate::bench::record_format::RecordFormat;
use crate::chain::service::Service;
use crate::chain::{ProviderTarget, create_database, drop_database, sink_targets};
pub use crate::commands::demo::args::{DemoArgs, DemoGuarantee, DemoSource};
use crate::commands::demo::command_line::{command_args, say};
use crate::commands::demo::database::unknowns;
use crate::commands::demo::drive::{Driven, drive};
use crate::commands::demo::metrics::metrics_line;
use crate::commands::demo::outbox_services::OutboxServices;
use crate::commands::demo::processes::RunProcesses;
use crate::commands::demo::registry_format::RegistryFormat;
use crate::commands::demo::relay_outage::RelayOutage;
use crate::commands::demo::report::build_report;
pub use crate::commands::demo::report::{DemoReport, ReportLine, report_text};
use crate::commands::demo::run_names::RunNames;
use crate::commands::demo::scrape::Scraped;
use crate::commands::demo::services::RunPlace;
use eosctl::cli::{AuditArgs, TraceArgs};
use eosctl::commands::{self, audit};

use eosctl::kafka_client::KafkaSettings;
use eosctl::report::grouped;

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
    let names = RunNames::new(&args)?;
    let run_dir = args.runs_dir.join(&names.run_id);
    std::fs::create_dir_all(&run_dir).with_context(|| format!("creating {}", run_dir.display()))?;
    let run_dir = run_dir.canonicalize()?;
    // The Kafka services connect as eos-lab does (TLS, SASL): its properties, secrets included,
    // reach them through an owner-only file named in their environment, removed at the end.
    let kafka_for_services = Arc::new(
        kafka
            .write_for_children(&run_dir.join("kafka-client.properties"))
            .context("writing the Kafka properties for the services")?,
    );
    let mut registry_format =
        RegistryFormat::register(args.format, &args.registry, [&names.input, &names.output])?;
    let database_url = create_database(&args.database_url, &names.database).await?;
    announce(
        &args,
        registry_format.as_ref(),
        &run_dir,
        [
            &names.input,
            &names.output,
            &names.database,
            &names.provider_url(),
        ],
    );

    let place = RunPlace {
        bin_dir: &bin_dir,
        run_dir: &run_dir,
        bootstrap_servers: kafka.bootstrap_servers.as_str(),
        kafka: &kafka_for_services,
    };
    // The processor's store, removed at the end: only this run's group uses it.
    let processor_state = run_dir.join("processor-state");
    let mut processes = make_processes(
        &place,
        &args,
        &names,
        &database_url,
        &processor_state,
        registry_format.as_ref(),
    )?;
    if let Some(path) = &args.prometheus_targets {
        processes.write_prometheus_targets(path)?;
    }
    let RunProcesses {
        provider,
        dedup,
        processor,
        sink,
        outbox,
    } = &mut processes;
    let outcome = drive(
        &args,
        &names,
        &kafka,
        &run_dir,
        [provider, dedup, processor, sink],
        outbox.as_mut(),
        registry_format.as_ref(),
    )
    .await;
    let scraped = match &outcome {
        Ok(_) => Some(processes.scrape().await),
        Err(_) => None,
    };
    let stopped_cleanly = processes
        .stop_all_but_the_provider(&database_url, outcome.is_ok())
        .await;
    let driven = outcome?;
    let audited = audit_and_clean_up(
        kafka,
        &args,
        &names,
        [&run_dir, &processor_state],
        &database_url,
        &mut processes,
        registry_format.as_mut(),
    )
    .await?;
    let report = run_report(
        &args,
        (&run_dir, &names),
        &processes,
        driven,
        audited,
        (scraped, stopped_cleanly),
    );
    publish_report(&args, &run_dir, &report).await
}

/// The run's report: the faults it met, whether the metrics agree with the audit, and each
/// boundary's verdict, with its drain and its processes' peak memory.
fn run_report(
    args: &DemoArgs,
    (run_dir, names): (&Path, &RunNames),
    processes: &RunProcesses,
    driven: Driven,
    (audit, audit_code, reconciled): (Value, i32, (i64, i64)),
    (scraped, stopped_cleanly): (Option<Scraped>, bool),
) -> DemoReport {
    let Driven {
        drain,
        payments,
        aimed_processor_kills,
        relay_outage,
    } = driven;
    let faults = fault_lines(
        args,
        [&processes.processor, &processes.sink],
        processes.outbox.as_ref(),
        relay_outage.as_ref(),
        aimed_processor_kills,
    );
    let metrics = metrics_line(scraped.as_ref(), &audit, reconciled, processes.any_killed());
    let mut report = build_report(
        args,
        run_dir,
        [
            &names.input,
            &names.output,
            &payments
                .as_ref()
                .and_then(|payments| payments.first_payment_id.clone())
                .unwrap_or_else(|| format!("evt-{}-0", names.seed)),
        ],
        faults,
        payments.as_ref(),
        audit,
        audit_code,
        reconciled,
        (drain, stopped_cleanly),
        metrics,
    );
    report.peak_rss_kib = processes.peak_rss_kib();
    report.relay_outage = relay_outage;
    report
}

/// The run's services, made but not started (`drive` starts them in order): provider-sim,
/// dedup-service, eos-processor, sink-writer and, from payments-api, payments-api and the relay.
fn make_processes(
    place: &RunPlace<'_>,
    args: &DemoArgs,
    names: &RunNames,
    database_url: &str,
    processor_state: &Path,
    registry_format: Option<&RegistryFormat>,
) -> anyhow::Result<RunProcesses> {
    let provider_url = names.provider_url();
    let dedup_url = format!("http://{}", names.dedup_addr);
    let targets = write_sink_targets(
        place.run_dir,
        &names.provider_name,
        &dedup_url,
        &provider_url,
    )?;
    Ok(RunProcesses {
        provider: services::provider_sim(place, args, names.provider_addr, names.seed),
        dedup: services::dedup_service(place, names.dedup_addr, &provider_url, database_url)?,
        processor: services::eos_processor(
            place,
            args,
            [&names.input, &names.output, &names.processor_group],
            processor_state,
            registry_format,
        )?,
        sink: services::sink_writer(
            place,
            [&names.output, &names.sink_group],
            &targets,
            database_url,
            registry_format,
        )?,
        outbox: match args.source {
            DemoSource::PaymentsApi => Some(OutboxServices::new(
                args,
                (place.bin_dir, place.run_dir),
                (place.bootstrap_servers, place.kafka),
                database_url,
                &names.input,
                format!("demo-{}", names.run_id),
                registry_format,
            )?),
            DemoSource::Producer => None,
        },
    })
}

/// The audit of the drained run (kept as the run's audit.json), the charges that went UNKNOWN and
/// were reconciled, and then what the run made removed: the database and the subjects with
/// `--drop-database`, the processor's store always. provider-sim stops once the audit has read
/// its effects. The audit as its JSON reads back, its exit code, and the UNKNOWNs.
async fn audit_and_clean_up(
    kafka: KafkaSettings,
    args: &DemoArgs,
    names: &RunNames,
    [run_dir, processor_state]: [&Path; 2],
    database_url: &str,
    processes: &mut RunProcesses,
    registry_format: Option<&mut RegistryFormat>,
) -> anyhow::Result<(Value, i32, (i64, i64))> {
    say(
        "== audit: the logical set by event_id at every boundary (outbox, topics, tables, \
         provider)",
    );
    let outcome = audit_run(
        kafka,
        [
            &names.input,
            &names.output,
            database_url,
            &names.provider_url(),
            &names.provider_name,
        ],
        processes.outbox.is_some(),
        registry_format.as_deref(),
    )
    .await;
    processes.provider.stop().await.ok();
    let outcome = outcome.context("the audit could not run")?;
    // What `eosctl audit --json` prints, and the report carries it as that JSON reads back.
    let audit_json = serde_json::to_string(&outcome)?;
    std::fs::write(run_dir.join("audit.json"), format!("{audit_json}\n"))?;
    let audit_code = if outcome.report.passed { 0 } else { 1 };
    let audit: Value = serde_json::from_str(&audit_json)?;
    let reconciled = unknowns(database_url, &names.provider_name).await?;
    if args.drop_database {
        drop_database(&args.database_url, &names.database).await?;
        if let Some(registry_format) = registry_format {
            registry_format.delete_subjects();
        }
    }
    std::fs::remove_dir_all(processor_state).ok();
    Ok((audit, audit_code, reconciled))
}

/// The sink's targets file in the run's directory: the demo's tables, and the provider charged
/// through dedup-service.
fn write_sink_targets(
    run_dir: &Path,
    provider_name: &str,
    dedup_url: &str,
    provider_url: &str,
) -> anyhow::Result<PathBuf> {
    let targets = run_dir.join("sink-targets.toml");
    std::fs::write(
        &targets,
        sink_targets(
            "eos-lab demo",
            Some(&ProviderTarget {
                name: provider_name,
                dedup_url,
                provider_url,
                concurrency: None,
                as_http: false,
            }),
        ),
    )?;
    Ok(targets)
}

/// The report written to the run's directory and printed (as JSON with `--json`), and the
/// sample event's trace when asked; whether the run passed.
async fn publish_report(
    args: &DemoArgs,
    run_dir: &Path,
    report: &DemoReport,
) -> anyhow::Result<bool> {
    std::fs::write(
        run_dir.join("report.json"),
        serde_json::to_string_pretty(report)?,
    )?;
    if args.json {
        println!("{}", serde_json::to_string(report)?);
    } else {
        print!("{}", report_text(report));
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
