//! Network faults on every link of a running pipeline: the processor and the sink-writer (its
//! tables and a provider target through dedup-service and provider-sim) under a steady load, each
//! of their links through a TCP fault proxy (integration_tests::fault_proxy) — processor↔Kafka,
//! sink↔Kafka, sink↔PostgreSQL, sink↔dedup-service. In turn: 200 ms of latency each way on every
//! link, a bandwidth limit on every link, connection resets on each link, and a 30-second partition
//! of each link. The test never restarts a service: after every fault each must still run and move
//! on by itself, and at the end both are caught up and `eosctl audit` is exact at every boundary
//! (topics, tables, provider effects).

use eos_testkit::argv;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use eos_runtime::kafka_clients;
use integration_tests::eosctl::{self, Workload};
use integration_tests::fault_proxy::{Direction, FaultProxy};
use integration_tests::proxied_kafka::ProxiedKafka;
use integration_tests::service_process::ServiceProcess;
use integration_tests::{
    TestDatabase, arg_refs, client_config_for, create_topic_on, end_offsets_on, sink_checkpoints,
    unique_name, wait_until_consumed,
};
use rdkafka::TopicPartitionList;
use rdkafka::consumer::{BaseConsumer, Consumer as _};
use sqlx::PgPool;
use tokio::task::block_in_place;

use crate::dedup_service::Dedup;
use crate::provider_sim::ProviderSim;

const PARTITIONS: i32 = 3;
/// Events per second from the load generator, for the whole run.
const RATE: u64 = 40;
const LATENCY: Duration = Duration::from_millis(200);
/// Per direction, per link: a fraction of what the load needs at full speed with its batching,
/// so the services fall behind while it lasts.
const BANDWIDTH_BYTES_PER_SECOND: u64 = 16 * 1024;
const SLOW_FOR: Duration = Duration::from_secs(10);
const PARTITION_FOR: Duration = Duration::from_secs(30);
/// Events written at the start of each partition, so there is new work behind the cut link
/// however long the recoveries before it took: the steady load is sized for the faults' own time
/// and may be over by the last partition on a loaded machine.
const BURST_PER_PARTITION: u64 = 2 * RATE;
/// What a fault may take to settle before the test looks at whether it bites.
const SETTLE: Duration = Duration::from_secs(3);
/// After a fault ends, each service must be moving again within this.
const RECOVERY_TIMEOUT: Duration = Duration::from_secs(90);
const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(120);

/// What a partition of a link must stop, so the test knows the proxy is really in the path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cut {
    /// The processor commits nothing more.
    Processor,
    /// The sink commits nothing more (its database or dedup-service is out of reach).
    Sink,
    /// The sink may finish what it fetched before the cut, but reads nothing produced after it.
    SinkFetches,
}

struct Link<'a> {
    name: &'static str,
    cut: Cut,
    proxy: &'a FaultProxy,
}

/// The sink's targets: the default two tables and the provider charge through dedup-service,
/// as `eos-lab demo` configures them.
fn targets_file(path: &std::path::Path, name: &str, dedup_url: &str, provider_url: &str) -> String {
    let text = integration_tests::tables_and_provider_targets(name, dedup_url, provider_url);
    std::fs::write(path, text).expect("the targets file is writable");
    path.display().to_string()
}

/// `url` (postgres://user:password@host:port/database) with its host:port replaced.
fn through(url: &str, endpoint: &str) -> anyhow::Result<String> {
    let (scheme_and_user, rest) = url.split_once('@').context("no @ in the database URL")?;
    let (_, path) = rest.split_once('/').context("no database in the URL")?;
    Ok(format!("{scheme_and_user}@{endpoint}/{path}"))
}

/// host:port of a database URL.
fn host_port(url: &str) -> anyhow::Result<String> {
    let (_, rest) = url.split_once('@').context("no @ in the database URL")?;
    Ok(rest.split('/').next().unwrap_or(rest).to_owned())
}

struct Pipeline {
    bootstrap: String,
    input: String,
    output: String,
    processor_group: String,
    sink_group: String,
}

/// Where the services are: the processor's committed input offsets and the sink's PostgreSQL
/// checkpoints of the output, summed over the partitions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Position {
    processor: i64,
    sink: i64,
}

impl Pipeline {
    /// The sum of the group's committed offsets of `topic` (without waiting on open
    /// transactions: a cut-off processor's may stay open for a while).
    fn committed(&self, group: &str, topic: &str) -> anyhow::Result<i64> {
        let consumer: BaseConsumer = kafka_clients::consumer(
            &client_config_for(&self.bootstrap),
            group,
            kafka_clients::Isolation::ReadUncommitted,
        )
        .create()?;
        let mut list = TopicPartitionList::new();
        for partition in 0..PARTITIONS {
            list.add_partition(topic, partition);
        }
        let committed = consumer.committed_offsets(list, Duration::from_secs(10))?;
        Ok(committed
            .elements()
            .iter()
            .filter_map(|elem| elem.offset().to_raw())
            .filter(|offset| *offset >= 0)
            .sum())
    }

    /// Asked again for up to 10 s: the group coordinator may not be ready yet (NotCoordinator
    /// before the processor's first commit).
    async fn position(&self, pool: &PgPool) -> anyhow::Result<Position> {
        let mut attempts = 0;
        let processor = loop {
            match block_in_place(|| self.committed(&self.processor_group, &self.input)) {
                Ok(processor) => break processor,
                Err(error) if attempts >= 20 => return Err(error),
                Err(_) => attempts += 1,
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        };
        let sink = sink_checkpoints(pool, &self.sink_group, &self.output)
            .await
            .values()
            .sum();
        Ok(Position { processor, sink })
    }

    fn ends(&self, topic: &str) -> anyhow::Result<i64> {
        Ok(block_in_place(|| end_offsets_on(&self.bootstrap, topic))?
            .iter()
            .map(|(_, end)| end)
            .sum())
    }
}

/// The running services; the test never restarts them.
struct Services {
    processor: ServiceProcess,
    sink: ServiceProcess,
    dedup: Dedup,
}

impl Services {
    fn ensure_running(&mut self, after: &str) -> anyhow::Result<()> {
        for (name, process) in [
            ("eos-processor", &mut self.processor),
            ("sink-writer", &mut self.sink),
            ("dedup-service", &mut self.dedup.process),
        ] {
            ensure!(
                process.is_running(),
                "{name} stopped after {after}: a service must ride out network faults\n{}",
                process.log_tail(40)
            );
        }
        Ok(())
    }

    fn logs(&self) -> String {
        format!(
            "processor:\n{}\nsink:\n{}",
            self.processor.log_tail(25),
            self.sink.log_tail(25)
        )
    }
}

/// Waits until each service has moved past `from`, or has nothing left to do (the processor has
/// committed the input's end; the sink's checkpoints hold the output's end).
async fn wait_progress(
    pipeline: &Pipeline,
    pool: &PgPool,
    services: &mut Services,
    from: Position,
    after: &str,
) -> anyhow::Result<Duration> {
    let started = Instant::now();
    loop {
        services.ensure_running(after)?;
        let now = pipeline.position(pool).await?;
        let processor_done =
            now.processor > from.processor || now.processor >= pipeline.ends(&pipeline.input)?;
        let sink_done = now.sink > from.sink || now.sink >= pipeline.ends(&pipeline.output)?;
        if processor_done && sink_done {
            return Ok(started.elapsed());
        }
        ensure!(
            started.elapsed() < RECOVERY_TIMEOUT,
            "no progress within {RECOVERY_TIMEOUT:?} after {after}: was {from:?}, now {now:?}\n{}",
            services.logs()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Waits until each service has caught up with what the topics held when it was called: the
/// processor has committed the input's end offsets of then, the sink's checkpoints hold the
/// output's end offsets of then. Recovery, not only movement.
async fn wait_caught_up(
    pipeline: &Pipeline,
    pool: &PgPool,
    services: &mut Services,
    after: &str,
) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let target = Position {
        processor: pipeline.ends(&pipeline.input)?,
        sink: pipeline.ends(&pipeline.output)?,
    };
    loop {
        services.ensure_running(after)?;
        let now = pipeline.position(pool).await?;
        if now.processor >= target.processor && now.sink >= target.sink {
            return Ok(started.elapsed());
        }
        ensure!(
            started.elapsed() < RECOVERY_TIMEOUT,
            "not caught up within {RECOVERY_TIMEOUT:?} after {after}: at {now:?}, the topics' \
             ends were {target:?}\n{}",
            services.logs()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn every_link_delayed_throttled_reset_and_partitioned_under_load_stays_exact_and_recovers()
-> anyhow::Result<()> {
    let started = Instant::now();
    let kafka = ProxiedKafka::start("netfault", &["processor", "sink"]).await?;
    let pipeline = Pipeline {
        bootstrap: kafka.bootstrap(),
        input: unique_name("payments"),
        output: unique_name("ledger"),
        processor_group: unique_name("eos-processor"),
        sink_group: unique_name("sink"),
    };
    create_topic_on(&pipeline.bootstrap, &pipeline.input, PARTITIONS).await?;
    create_topic_on(&pipeline.bootstrap, &pipeline.output, PARTITIONS).await?;

    let db = TestDatabase::create().await?;
    let postgres_link = FaultProxy::start(&host_port(&db.url)?).await?;
    let sim = ProviderSim::spawn(&[])?;
    let dedup = Dedup::spawn(
        &db,
        &arg_refs(&argv!(dedup_service::Config {
            provider_url: &sim.url
        })),
    )?;
    let dedup_addr = dedup.endpoint().trim_start_matches("http://").to_owned();
    let dedup_link = FaultProxy::start(&dedup_addr).await?;
    let dir = std::env::temp_dir().join(unique_name("network-faults"));
    std::fs::create_dir_all(&dir)?;
    let provider_name = unique_name("pay").replace('-', "_");
    let config = targets_file(
        &dir.join("targets.toml"),
        &provider_name,
        &format!("http://{}", dedup_link.endpoint()),
        &sim.url,
    );

    let processor = ServiceProcess::spawn(
        "eos-processor",
        &argv!(eos_processor::Config {
            kafka.bootstrap_servers: &kafka.bootstrap_via("processor")?,
            input_topic: &pipeline.input,
            output_topic: &pipeline.output,
            group_id: &pipeline.processor_group,
            instance.instance_id: "netfault",
            metrics_addr: "127.0.0.1:0",
        }),
        &[],
    )?;
    let sink = ServiceProcess::spawn(
        "sink-writer",
        &argv!(sink_writer::Config {
            kafka.bootstrap_servers: kafka.bootstrap_via("sink")?,
            topic: &pipeline.output,
            group_id: &pipeline.sink_group,
            instance.instance_id: "netfault",
            database[database_url]: through(&db.url, &postgres_link.endpoint())?,
            config: &config,
            metrics_addr: "127.0.0.1:0",
            max_backoff: "1s",
        }),
        &[],
    )?;
    let mut services = Services {
        processor,
        sink,
        dedup,
    };
    let links = [
        Link {
            name: "processor↔Kafka",
            cut: Cut::Processor,
            proxy: kafka.link("processor")?,
        },
        Link {
            name: "sink↔Kafka",
            cut: Cut::SinkFetches,
            proxy: kafka.link("sink")?,
        },
        Link {
            name: "sink↔PostgreSQL",
            cut: Cut::Sink,
            proxy: &postgres_link,
        },
        Link {
            name: "sink↔dedup-service",
            cut: Cut::Sink,
            proxy: &dedup_link,
        },
    ];

    // Load for the whole run: the faults' own time plus room for the recoveries in between.
    let planned = SLOW_FOR * 2 + PARTITION_FOR * links.len() as u32 + Duration::from_secs(20);
    let workload = Workload {
        rate: RATE,
        ..Workload::chaos(RATE * planned.as_secs(), 1_414)
    };
    let producer = {
        let (bootstrap, input, workload) = (
            pipeline.bootstrap.clone(),
            pipeline.input.clone(),
            workload.clone(),
        );
        std::thread::spawn(move || eosctl::produce_on(&bootstrap, &input, &workload))
    };
    let mut timings: BTreeMap<String, Duration> = BTreeMap::new();
    let start = Position {
        processor: 0,
        sink: 0,
    };
    wait_progress(&pipeline, &db.pool, &mut services, start, "start-up").await?;
    let took = wait_caught_up(&pipeline, &db.pool, &mut services, "start-up").await?;
    timings.insert("start-up".into(), took);

    // Latency, then a bandwidth limit, on every link at once: the pipeline keeps moving.
    for (fault, apply) in [
        (
            "200 ms latency each way",
            &(|proxy: &FaultProxy| {
                proxy.set_latency(Direction::ToUpstream, LATENCY);
                proxy.set_latency(Direction::ToCaller, LATENCY);
            }) as &dyn Fn(&FaultProxy),
        ),
        (
            "bandwidth limit",
            &(|proxy: &FaultProxy| proxy.set_bandwidth(Some(BANDWIDTH_BYTES_PER_SECOND))),
        ),
    ] {
        let from = pipeline.position(&db.pool).await?;
        for link in &links {
            apply(link.proxy);
        }
        tokio::time::sleep(SLOW_FOR).await;
        let moving = wait_progress(&pipeline, &db.pool, &mut services, from, fault).await;
        for link in &links {
            link.proxy.clear();
        }
        timings.insert(format!("moving under {fault}"), SLOW_FOR + moving?);
        let after = format!("lifting {fault}");
        let took = wait_caught_up(&pipeline, &db.pool, &mut services, &after).await?;
        timings.insert(after, took);
    }

    // Every open connection of each link reset in turn.
    for link in &links {
        ensure!(
            link.proxy.open_connections() > 0,
            "{} carries no connection: the service does not use the proxy",
            link.name
        );
        link.proxy.reset_connections();
        tokio::time::sleep(SETTLE).await;
        let after = format!("resetting {}", link.name);
        let took = wait_caught_up(&pipeline, &db.pool, &mut services, &after).await?;
        timings.insert(after, SETTLE + took);
    }

    // A 30-second partition of each link in turn, each after the pipeline caught up: the user
    // of the link stops (so the proxy is really in its path), nothing exits, and it catches up
    // by itself once the link heals. The sink may still finish what it fetched before its Kafka
    // link was cut, but nothing produced after the cut.
    let mut burst_events = 0;
    for (index, link) in links.iter().enumerate() {
        link.proxy.partition();
        let output_end_at_cut = pipeline.ends(&pipeline.output)?;
        let input_end_at_cut = pipeline.ends(&pipeline.input)?;
        let burst = Workload::chaos(BURST_PER_PARTITION, 1_415 + index as u64);
        let written =
            block_in_place(|| eosctl::produce_on(&pipeline.bootstrap, &pipeline.input, &burst))?;
        ensure!(
            written["logical_events"] == BURST_PER_PARTITION,
            "the burst at the cut of {} lost events: {written}",
            link.name
        );
        burst_events += BURST_PER_PARTITION;
        tokio::time::sleep(SETTLE).await;
        let settled = pipeline.position(&db.pool).await?;
        tokio::time::sleep(PARTITION_FOR - SETTLE).await;
        let before_heal = pipeline.position(&db.pool).await?;
        services.ensure_running(&format!("30 s of {} partitioned", link.name))?;
        let grown = match link.cut {
            Cut::Processor => pipeline.ends(&pipeline.input)? > input_end_at_cut,
            Cut::Sink | Cut::SinkFetches => pipeline.ends(&pipeline.output)? > output_end_at_cut,
        };
        ensure!(
            grown,
            "no new work behind {} while it was partitioned: the check below would prove nothing",
            link.name
        );
        let stopped = match link.cut {
            Cut::Processor => before_heal.processor == settled.processor,
            Cut::Sink => before_heal.sink == settled.sink,
            Cut::SinkFetches => before_heal.sink <= output_end_at_cut,
        };
        ensure!(
            stopped,
            "{:?}: moved while {} was partitioned ({settled:?} -> {before_heal:?}, output end \
             at the cut {output_end_at_cut}): the link is not cut",
            link.cut,
            link.name
        );
        link.proxy.heal();
        let after = format!("healing {}", link.name);
        let took = wait_caught_up(&pipeline, &db.pool, &mut services, &after).await?;
        timings.insert(after, took);
    }

    let summary = block_in_place(|| producer.join())
        .map_err(|_| anyhow::anyhow!("producer thread panicked"))??;
    assert_eq!(
        summary["logical_events"], workload.count,
        "the load generator lost events"
    );

    // Caught up, by themselves.
    let caught_up = Instant::now();
    block_in_place(|| {
        wait_until_consumed(
            &pipeline.bootstrap,
            &pipeline.processor_group,
            &pipeline.input,
            CATCH_UP_TIMEOUT,
        )
    })
    .with_context(|| services.logs())?;
    loop {
        services.ensure_running("the faults")?;
        let ends = block_in_place(|| end_offsets_on(&pipeline.bootstrap, &pipeline.output))?;
        let stored = sink_checkpoints(&db.pool, &pipeline.sink_group, &pipeline.output).await;
        if ends
            .iter()
            .all(|(partition, end)| *end == 0 || stored.get(partition) == Some(end))
        {
            break;
        }
        ensure!(
            caught_up.elapsed() < CATCH_UP_TIMEOUT,
            "the sink did not catch up: ends {ends:?}, checkpoints {stored:?}\n{}",
            services.logs()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    timings.insert("final catch-up".into(), caught_up.elapsed());
    services.ensure_running("the faults")?;
    services.processor.stop_gracefully()?;
    services.sink.stop_gracefully()?;

    let dlq = format!("{}.dlq", pipeline.input);
    let prefix = format!("{provider_name}:");
    let outcome = block_in_place(|| {
        eosctl::audit_with(
            &pipeline.bootstrap,
            &pipeline.input,
            &pipeline.output,
            &dlq,
            &[
                "--database-url",
                &db.url,
                "--provider-url",
                &sim.url,
                "--provider-operation-prefix",
                &prefix,
            ],
        )
    })?;
    assert!(outcome.passed(), "audit not exact:\n{}", outcome.failures());
    assert_eq!(
        outcome.figure("logical_events"),
        (workload.count + burst_events) as i64
    );
    eprintln!(
        "network faults: {} events in {:?}; recovery times {timings:#?}",
        workload.count + burst_events,
        started.elapsed()
    );

    drop(services);
    std::fs::remove_dir_all(&dir)?;
    db.drop_database().await
}
