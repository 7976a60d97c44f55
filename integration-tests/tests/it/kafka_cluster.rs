//! The processor and the sink on a three-node cluster (replication factor 3,
//! `min.insync.replicas=2`), each broker bounced in turn under load — SIGKILLed twice round, the
//! leader of the input's partition 0 first, then stopped with a controlled shutdown once round —
//! then audited by event_id at every boundary with `eosctl audit`. After every bounce the pipeline
//! must catch up by itself. The test acts as the orchestrator would: a service that exits is
//! started again, and each exit must be a reported one (an ERROR naming why it stopped, non-zero
//! status) — a static consumer can be fenced by its own abandoned JoinGroup while the group
//! coordinator moves, and a fenced instance stops by design.

use eos_testkit::argv;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use integration_tests::eosctl::{self, Workload};
use integration_tests::kafka_cluster::KafkaCluster;
use integration_tests::service_process::{ServiceProcess, Supervised};
use integration_tests::{
    TestDatabase, create_topic_on, end_offsets_on, sink_checkpoints, unique_name,
    wait_until_consumed,
};
use sqlx::PgPool;
use tokio::task::block_in_place;

const PARTITIONS: i32 = 3;
/// Events produced around each bounce, at `RATE` per second: the broker goes down while they flow.
const EVENTS_PER_BOUNCE: u64 = 1_500;
const RATE: u64 = 500;
/// How long a killed or stopped broker stays down.
const DOWN_FOR: Duration = Duration::from_secs(3);
const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(120);

#[derive(Debug, Clone, Copy)]
enum Bounce {
    Kill,
    ControlledShutdown,
}

#[derive(Clone)]
struct Pipeline {
    bootstrap: String,
    input: String,
    output: String,
    processor_group: String,
    sink_group: String,
}

impl Pipeline {
    fn spawn_processor(&self) -> anyhow::Result<ServiceProcess> {
        let args = argv!(eos_processor::Config {
            kafka.bootstrap_servers: &self.bootstrap,
            input_topic: &self.input,
            output_topic: &self.output,
            group_id: &self.processor_group,
            instance.instance_id: "cluster",
            metrics_addr: "127.0.0.1:0",
            transaction_timeout: "10s",
        });
        ServiceProcess::spawn("eos-processor", &args, &[])
    }

    fn spawn_sink(&self, database_url: &str) -> anyhow::Result<ServiceProcess> {
        let args = argv!(sink_writer::Config {
            kafka.bootstrap_servers: &self.bootstrap,
            topic: &self.output,
            group_id: &self.sink_group,
            instance.instance_id: "cluster",
            database[database_url]: database_url,
            metrics_addr: "127.0.0.1:0",
            max_backoff: "1s",
        });
        ServiceProcess::spawn("sink-writer", &args, &[])
    }

    /// Waits until the processor has committed the input's end and the sink's PostgreSQL
    /// checkpoints hold the output's end, restarting a service that stopped.
    async fn wait_caught_up(
        &self,
        pool: &PgPool,
        processor: &mut Supervised,
        sink: &mut Supervised,
    ) -> anyhow::Result<()> {
        let deadline = Instant::now() + CATCH_UP_TIMEOUT;
        loop {
            processor.keep_running()?;
            let consumed = block_in_place(|| {
                wait_until_consumed(
                    &self.bootstrap,
                    &self.processor_group,
                    &self.input,
                    Duration::from_secs(5),
                )
            });
            match consumed {
                Ok(()) => break,
                Err(_) if Instant::now() < deadline => {}
                Err(error) => return Err(error).with_context(|| processor.process.log_tail(40)),
            }
        }
        loop {
            sink.keep_running()?;
            // Right after a bounce a partition may have no leader yet: that is "not yet", not a
            // failure.
            let behind = match block_in_place(|| end_offsets_on(&self.bootstrap, &self.output)) {
                Ok(ends) => {
                    let stored = sink_checkpoints(pool, &self.sink_group, &self.output).await;
                    let behind: Vec<_> = ends
                        .iter()
                        .filter(|(partition, end)| *end > 0 && stored.get(partition) != Some(end))
                        .collect();
                    if behind.is_empty() {
                        return Ok(());
                    }
                    format!("ends {ends:?}, checkpoints {stored:?}")
                }
                Err(error) => format!("the output's end offsets: {error:#}"),
            };
            anyhow::ensure!(
                Instant::now() < deadline,
                "the sink did not catch up within {CATCH_UP_TIMEOUT:?}: {behind}\n{}",
                sink.process.log_tail(40)
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn processor_and_sink_stay_exact_while_each_of_three_brokers_is_bounced_under_load()
-> anyhow::Result<()> {
    let mut cluster = block_in_place(|| KafkaCluster::start("bounce"))?;
    let pipeline = Pipeline {
        bootstrap: cluster.bootstrap(),
        input: unique_name("payments"),
        output: unique_name("ledger"),
        processor_group: unique_name("eos-processor"),
        sink_group: unique_name("sink"),
    };
    create_topic_on(&pipeline.bootstrap, &pipeline.input, PARTITIONS).await?;
    create_topic_on(&pipeline.bootstrap, &pipeline.output, PARTITIONS).await?;
    let db = TestDatabase::create().await?;
    let mut processor = Supervised::start({
        let pipeline = pipeline.clone();
        move || pipeline.spawn_processor()
    })?;
    let mut sink = Supervised::start({
        let (pipeline, url) = (pipeline.clone(), db.url.clone());
        move || pipeline.spawn_sink(&url)
    })?;

    let first = block_in_place(|| cluster.leader_of(&pipeline.input, 0))?;
    let mut order = vec![first];
    order.extend(cluster.node_ids().into_iter().filter(|id| *id != first));
    let rounds = [Bounce::Kill, Bounce::Kill, Bounce::ControlledShutdown];
    let mut produced = 0;
    for (round, bounce) in rounds.iter().enumerate() {
        for &node in &order {
            let seed = 9_000 + produced / EVENTS_PER_BOUNCE;
            let workload = Workload {
                rate: RATE,
                ..Workload::chaos(EVENTS_PER_BOUNCE, seed)
            };
            let (bootstrap, input) = (pipeline.bootstrap.clone(), pipeline.input.clone());
            let producer =
                std::thread::spawn(move || eosctl::produce_on(&bootstrap, &input, &workload));
            tokio::time::sleep(Duration::from_secs(1)).await;
            block_in_place(|| match bounce {
                Bounce::Kill => cluster.kill(node),
                Bounce::ControlledShutdown => cluster.stop(node),
            })
            .with_context(|| format!("round {round}: bringing node {node} down"))?;
            tokio::time::sleep(DOWN_FOR).await;
            block_in_place(|| cluster.restart(node))
                .with_context(|| format!("round {round}: node {node} did not come back"))?;
            let summary = producer
                .join()
                .map_err(|_| anyhow::anyhow!("producer thread panicked"))??;
            assert_eq!(
                summary["logical_events"], EVENTS_PER_BOUNCE,
                "round {round}, node {node}: the producer lost events"
            );
            produced += EVENTS_PER_BOUNCE;
            block_in_place(|| cluster.wait_fully_replicated(CATCH_UP_TIMEOUT))
                .with_context(|| cluster.server_log_tail(node, 30))?;
            pipeline
                .wait_caught_up(&db.pool, &mut processor, &mut sink)
                .await
                .with_context(|| format!("round {round} ({bounce:?}), node {node}"))?;
        }
    }

    processor.process.stop_gracefully()?;
    sink.process.stop_gracefully()?;
    eprintln!(
        "{} bounces; processor restarted {} times {:?}; sink restarted {} times {:?}",
        rounds.len() * order.len(),
        processor.exits.len(),
        processor.exits,
        sink.exits.len(),
        sink.exits
    );
    let dlq = format!("{}.dlq", pipeline.input);
    let outcome = block_in_place(|| {
        eosctl::audit_with(
            &pipeline.bootstrap,
            &pipeline.input,
            &pipeline.output,
            &dlq,
            &["--database-url", &db.url],
        )
    })?;
    assert!(outcome.passed(), "audit not exact:\n{}", outcome.failures());
    assert_eq!(outcome.figure("logical_events"), produced as i64);
    db.drop_database().await?;
    Ok(())
}
