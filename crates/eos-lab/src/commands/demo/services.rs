//! The demo's service processes, each with the command line the run gives it: provider-sim with
//! its faults, dedup-service, eos-processor and sink-writer (payments-api and outbox-relay are
//! `OutboxServices`, in mod.rs, since the relay's outage restarts it).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use eos_runtime::kafka_settings::ChildKafkaProperties;
use eos_testkit::loopback_ports::free_loopback_addr;

use crate::chain::service::Service;
use crate::commands::demo::args::{DemoArgs, DemoGuarantee};
use crate::commands::demo::command_line::strings;
use crate::commands::demo::registry_format::RegistryFormat;

/// Where every service of the run is started from and how it reaches Kafka.
pub(super) struct RunPlace<'a> {
    pub(super) bin_dir: &'a Path,
    pub(super) run_dir: &'a Path,
    pub(super) bootstrap_servers: &'a str,
    /// eos-lab's Kafka properties, secrets included, in an owner-only file.
    pub(super) kafka: &'a Arc<ChildKafkaProperties>,
}

/// provider-sim on `addr`, applying every charge and losing the share of answers `args` asks.
pub(super) fn provider_sim(
    place: &RunPlace<'_>,
    args: &DemoArgs,
    addr: SocketAddr,
    seed: u64,
) -> Service {
    Service::new(
        "provider-sim",
        place.bin_dir,
        place.run_dir,
        strings(&[
            "--addr",
            &addr.to_string(),
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
        addr,
    )
}

/// dedup-service on `addr`, reconciling with the provider every 200 ms.
pub(super) fn dedup_service(
    place: &RunPlace<'_>,
    addr: SocketAddr,
    provider_url: &str,
    database_url: &str,
) -> anyhow::Result<Service> {
    let ops = free_loopback_addr()?;
    Ok(Service::new(
        "dedup-service",
        place.bin_dir,
        place.run_dir,
        strings(&[
            "--listen",
            &addr.to_string(),
            "--provider-url",
            provider_url,
            "--reconcile-interval",
            "200ms",
            "--in-flight-window",
            "5s",
            "--metrics-addr",
            &ops.to_string(),
        ]),
        ops,
    )
    .with_env("DATABASE_URL", database_url))
}

/// eos-processor from `input` to `output` in `group`, its store in `state_dir`.
pub(super) fn eos_processor(
    place: &RunPlace<'_>,
    args: &DemoArgs,
    [input, output, group]: [&str; 3],
    state_dir: &Path,
    registry_format: Option<&RegistryFormat>,
) -> anyhow::Result<Service> {
    let ops = free_loopback_addr()?;
    let ops_text = ops.to_string();
    let state_dir = state_dir.display().to_string();
    let mut words = vec![
        "--bootstrap-servers",
        place.bootstrap_servers,
        "--input-topic",
        input,
        "--output-topic",
        output,
        "--group-id",
        group,
        "--instance-id",
        "demo-processor",
        "--guarantee",
        args.guarantee.as_str(),
        "--metrics-addr",
        &ops_text,
        "--state-dir",
        &state_dir,
    ];
    // Without transactions a kill repeats only the outputs sent since the last offset commit.
    // A long commit interval keeps such outputs in flight for a while after each (re)start,
    // which re-reads and re-sends them, so every aimed kill (`aimed_kill`) finds some even once
    // the payments have stopped coming; the mechanism shown is the same at any interval.
    if args.guarantee == DemoGuarantee::AtLeastOnce {
        words.extend(["--commit-interval", "10s"]);
    }
    let mut command_line = strings(&words);
    if let Some(registry_format) = registry_format {
        command_line.extend(registry_format.processor_args());
    }
    Ok(Service::new(
        "eos-processor",
        place.bin_dir,
        place.run_dir,
        command_line,
        ops,
    )
    .with_kafka_properties(place.kafka))
}

/// sink-writer reading `output` in `group`, writing the targets of `targets`.
pub(super) fn sink_writer(
    place: &RunPlace<'_>,
    [output, group]: [&str; 2],
    targets: &Path,
    database_url: &str,
    registry_format: Option<&RegistryFormat>,
) -> anyhow::Result<Service> {
    let ops = free_loopback_addr()?;
    let mut command_line = strings(&[
        "--bootstrap-servers",
        place.bootstrap_servers,
        "--topic",
        output,
        "--group-id",
        group,
        "--instance-id",
        "demo-sink",
        "--config",
        &targets.display().to_string(),
        "--metrics-addr",
        &ops.to_string(),
        "--max-backoff",
        "1s",
    ]);
    if let Some(registry_format) = registry_format {
        command_line.extend(registry_format.sink_args());
    }
    Ok(Service::new(
        "sink-writer",
        place.bin_dir,
        place.run_dir,
        command_line,
        ops,
    )
    .with_env("DATABASE_URL", database_url)
    .with_kafka_properties(place.kafka))
}
