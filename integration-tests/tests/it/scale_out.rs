//! Many instances over many partitions, scaled out and in under load: three processors and three
//! sink-writers over 12 partitions; while events flow a fourth of each joins, one of each is
//! stopped with SIGTERM, and one of each is SIGKILLed and started again under its instance id.
//! At the end every partition has an owner (the `assigned_partitions` gauges of the running
//! instances add up to 12) and `eosctl audit` is exact at every boundary, per-entity order
//! included.

use eos_testkit::argv;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use integration_tests::eosctl::{self, Workload};
use integration_tests::service_process::ServiceProcess;
use integration_tests::{
    TestDatabase, bootstrap_servers, create_topic, end_offsets, sink_checkpoints, unique_name,
    wait_until_consumed,
};
use sqlx::PgPool;
use tokio::task::block_in_place;

const PARTITIONS: i32 = 12;
const EVENTS: u64 = 24_000;
const RATE: u64 = 1_500;
const DRAIN_TIMEOUT: Duration = Duration::from_secs(240);
const STEP: Duration = Duration::from_secs(3);

struct Pipeline {
    input: String,
    output: String,
    processor_group: String,
    sink_group: String,
    database_url: String,
}

/// One running instance and where its metrics are served.
struct Instance {
    id: String,
    process: ServiceProcess,
    metrics_addr: String,
}

impl Pipeline {
    fn spawn_processor(&self, id: &str) -> anyhow::Result<Instance> {
        let args = argv!(eos_processor::Config {
            input_topic: &self.input,
            output_topic: &self.output,
            group_id: &self.processor_group,
            instance.instance_id: id,
            metrics_addr: "127.0.0.1:0",
            transaction_timeout: "10s",
        });
        started(id, ServiceProcess::spawn("eos-processor", &args, &[])?)
    }

    fn spawn_sink(&self, id: &str) -> anyhow::Result<Instance> {
        let args = argv!(sink_writer::Config {
            topic: &self.output,
            group_id: &self.sink_group,
            instance.instance_id: id,
            database[database_url]: &self.database_url,
            metrics_addr: "127.0.0.1:0",
            max_backoff: "1s",
        });
        started(id, ServiceProcess::spawn("sink-writer", &args, &[])?)
    }

    /// Waits until the sink's PostgreSQL checkpoints hold the output's end in every partition.
    async fn wait_sink_drained(&self, pool: &PgPool) -> anyhow::Result<()> {
        let deadline = Instant::now() + DRAIN_TIMEOUT;
        loop {
            let output = self.output.clone();
            let ends = block_in_place(|| end_offsets(&output))?;
            let stored = sink_checkpoints(pool, &self.sink_group, &self.output).await;
            if ends
                .iter()
                .all(|(partition, end)| *end == 0 || stored.get(partition) == Some(end))
            {
                return Ok(());
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "sinks not drained after {DRAIN_TIMEOUT:?}: ends {ends:?}, checkpoints {stored:?}"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

fn started(id: &str, mut process: ServiceProcess) -> anyhow::Result<Instance> {
    let metrics_addr = process.wait_for_log_field("metrics_addr", Duration::from_secs(30))?;
    Ok(Instance {
        id: id.to_owned(),
        process,
        metrics_addr,
    })
}

/// The value of an unlabelled gauge on an instance's /metrics.
async fn gauge(instance: &Instance, name: &str) -> anyhow::Result<f64> {
    let body = reqwest::get(format!("http://{}/metrics", instance.metrics_addr))
        .await?
        .text()
        .await?;
    body.lines()
        .find(|line| line.starts_with(name) && line[name.len()..].starts_with(' '))
        .and_then(|line| line.split_whitespace().last())
        .and_then(|value| value.parse().ok())
        .with_context(|| format!("{} serves no {name}", instance.id))
}

/// Waits until the running instances own `PARTITIONS` partitions between them, each of them
/// some: nobody's partition was left behind by the joins, leaves and kills.
async fn wait_every_partition_owned(instances: &mut [Instance], name: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut owned = Vec::new();
        for instance in instances.iter_mut() {
            anyhow::ensure!(
                instance.process.is_running(),
                "{} exited\n{}",
                instance.id,
                instance.process.log_tail(30)
            );
            owned.push((
                instance.id.clone(),
                gauge(instance, name).await.unwrap_or(-1.0),
            ));
        }
        let total: f64 = owned.iter().map(|(_, count)| count).sum();
        if total == f64::from(PARTITIONS) && owned.iter().all(|(_, count)| *count > 0.0) {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{name}: the running instances own {owned:?}, not {PARTITIONS} partitions between them"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn three_then_four_instances_of_each_service_scaled_in_and_killed_stay_exact_and_in_order()
-> anyhow::Result<()> {
    let db = TestDatabase::create().await?;
    let pipeline = Pipeline {
        input: unique_name("payments"),
        output: unique_name("ledger"),
        processor_group: unique_name("eos-processor"),
        sink_group: unique_name("sink"),
        database_url: db.url.clone(),
    };
    create_topic(&pipeline.input, PARTITIONS).await?;
    create_topic(&pipeline.output, PARTITIONS).await?;

    let mut processors = Vec::new();
    let mut sinks = Vec::new();
    for n in 1..=3 {
        processors.push(block_in_place(|| {
            pipeline.spawn_processor(&format!("p{n}"))
        })?);
        sinks.push(block_in_place(|| pipeline.spawn_sink(&format!("s{n}")))?);
    }
    let workload = Workload {
        rate: RATE,
        ..Workload::chaos(EVENTS, 1_214)
    };
    let input = pipeline.input.clone();
    let producer =
        std::thread::spawn(move || eosctl::produce_on(&bootstrap_servers(), &input, &workload));

    // Scale out: a fourth of each joins while events flow.
    tokio::time::sleep(STEP).await;
    processors.push(block_in_place(|| pipeline.spawn_processor("p4"))?);
    sinks.push(block_in_place(|| pipeline.spawn_sink("s4"))?);

    // Scale in: the first of each leaves cleanly.
    tokio::time::sleep(STEP).await;
    let mut leaving_processor = processors.remove(0);
    let mut leaving_sink = sinks.remove(0);
    block_in_place(|| leaving_processor.process.stop_gracefully())?;
    block_in_place(|| leaving_sink.process.stop_gracefully())?;

    // A crash: the (now) first of each is SIGKILLed, then started again under its instance id.
    tokio::time::sleep(STEP).await;
    let mut killed_processor = processors.remove(0);
    let mut killed_sink = sinks.remove(0);
    block_in_place(|| {
        killed_processor.process.kill_hard()?;
        killed_sink.process.kill_hard()
    })?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    processors.push(block_in_place(|| {
        pipeline.spawn_processor(&killed_processor.id)
    })?);
    sinks.push(block_in_place(|| pipeline.spawn_sink(&killed_sink.id))?);

    let summary = producer
        .join()
        .map_err(|_| anyhow::anyhow!("producer thread panicked"))??;
    assert_eq!(summary["logical_events"], EVENTS);
    block_in_place(|| {
        wait_until_consumed(
            &bootstrap_servers(),
            &pipeline.processor_group,
            &pipeline.input,
            DRAIN_TIMEOUT,
        )
    })?;
    pipeline.wait_sink_drained(&db.pool).await?;
    wait_every_partition_owned(&mut processors, "eos_processor_assigned_partitions").await?;
    wait_every_partition_owned(&mut sinks, "eos_sink_assigned_partitions").await?;

    for instance in processors.iter_mut().chain(sinks.iter_mut()) {
        block_in_place(|| instance.process.stop_gracefully())
            .with_context(|| format!("stopping {}", instance.id))?;
    }
    let dlq = format!("{}.dlq", pipeline.input);
    let outcome = block_in_place(|| {
        eosctl::audit_with(
            &bootstrap_servers(),
            &pipeline.input,
            &pipeline.output,
            &dlq,
            &["--database-url", &db.url],
        )
    })?;
    assert!(outcome.passed(), "audit not exact:\n{}", outcome.failures());
    assert_eq!(outcome.figure("logical_events"), EVENTS as i64);
    assert_eq!(outcome.violations("order_violation"), 0);
    db.drop_database().await?;
    Ok(())
}
