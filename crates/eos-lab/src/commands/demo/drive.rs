//! Driving the run: the workload started, the faults at their times (SIGKILLs, the relay's
//! outage, aimed kills), and the wait for the pipeline to drain.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use eosctl::cli::ProduceArgs;
use eosctl::commands::{self, progress_bar};
use eosctl::kafka_client::{KafkaSettings, TopicLayout, ensure_topic};
use eosctl::produce;
use eosctl::report::grouped;
use indicatif::ProgressBar;
use rand::SeedableRng as _;

use crate::chain::service::{Service, wait_listening};
use crate::commands::demo::aimed_kill::{AimedKill, KillAim};
use crate::commands::demo::args::{DemoArgs, DemoGuarantee};
use crate::commands::demo::command_line::{command_args, say};
use crate::commands::demo::outbox_services::OutboxServices;
use crate::commands::demo::payments_workload;
use crate::commands::demo::payments_workload::{PaymentsSummary, PaymentsWorkload};
use crate::commands::demo::registry_format::RegistryFormat;
use crate::commands::demo::relay_outage;
use crate::commands::demo::relay_outage::{OutagePlan, RelayOutage};
use crate::commands::demo::report::{Drain, DrainStage};
use crate::commands::demo::run_names::RunNames;

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
pub(super) struct Driven {
    /// How long each service took to catch up once the workload was done, and the bound.
    pub(super) drain: Drain,
    pub(super) payments: Option<PaymentsSummary>,
    /// At-least-once processor kills that landed with outputs its restart repeats.
    pub(super) aimed_processor_kills: usize,
    pub(super) relay_outage: Option<RelayOutage>,
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

/// The run itself: the services started in order, the workload with its faults on two
/// timelines (the relay's, and the processor's and the sink's), then the wait for every stage to
/// drain.
pub(super) async fn drive(
    args: &DemoArgs,
    names: &RunNames,
    kafka: &KafkaSettings,
    run_dir: &Path,
    [provider, dedup, processor, sink]: [&mut Service; 4],
    mut outbox: Option<&mut OutboxServices>,
    registry_format: Option<&RegistryFormat>,
) -> anyhow::Result<Driven> {
    let (seed, input, output) = (names.seed, names.input.as_str(), names.output.as_str());
    let (processor_group, sink_group) = (names.processor_group.as_str(), names.sink_group.as_str());
    provider.start()?;
    wait_listening(provider, names.provider_addr).await?;
    dedup.start()?;
    wait_listening(dedup, names.dedup_addr).await?;
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
    let (payments, workload_ended) = finish_workload(workload, run_dir, input).await?;
    let stages = wait_drained(
        args,
        kafka,
        workload_ended,
        outbox,
        [
            (processor_group, input, &mut *processor),
            (sink_group, output, &mut *sink),
        ],
    )
    .await?;
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

/// Waits for the workload's end and keeps its summary in the run's directory; the summary of
/// payments made, if they were, and when the workload ended.
async fn finish_workload(
    workload: Workload,
    run_dir: &Path,
    input: &str,
) -> anyhow::Result<(Option<PaymentsSummary>, Instant)> {
    Ok(match workload {
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
    })
}

/// Each stage's time to catch up after the workload's end: the relay's outbox (if it ran), then
/// each consumer group with its topic and service.
async fn wait_drained(
    args: &DemoArgs,
    kafka: &KafkaSettings,
    workload_ended: Instant,
    outbox: Option<&mut OutboxServices>,
    consumers: [(&str, &str, &mut Service); 2],
) -> anyhow::Result<Vec<DrainStage>> {
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
    for (group, topic, service) in consumers {
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
    Ok(stages)
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng as _;

    use super::*;

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
