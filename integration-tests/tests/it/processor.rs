//! eos-processor against the real broker, as a real child process: SIGKILLed, paused, rebalanced
//! and cut off from a killed broker — then audited by event_id with `eosctl audit`.

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use eos_testkit::argv;
use integration_tests::aimed_kill::{
    ProcessorTopics, kill_when, outputs_a_restart_repeats_after_the_kill,
    outputs_an_at_least_once_restart_repeats,
};
use integration_tests::eosctl::{self, AuditOutcome, Workload};
use integration_tests::service_process::ServiceProcess;
use integration_tests::{
    Isolation, bootstrap_servers, create_topic, read_topic_on, records_in_topic, unique_name,
    wait_until_consumed,
};
use rand::{Rng as _, SeedableRng as _};
use rdkafka::Message as _;

const DRAIN_TIMEOUT: Duration = Duration::from_secs(180);

/// Names of one pipeline run.
struct Pipeline {
    bootstrap: String,
    input: String,
    output: String,
    group: String,
}

impl Pipeline {
    fn new(bootstrap: String) -> Self {
        Self {
            bootstrap,
            input: unique_name("payments"),
            output: unique_name("ledger"),
            group: unique_name("eos-processor"),
        }
    }

    fn dlq(&self) -> String {
        format!("{}.dlq", self.input)
    }

    fn spawn(
        &self,
        instance: &str,
        guarantee: &str,
        envs: &[(&str, &str)],
    ) -> anyhow::Result<ServiceProcess> {
        let args = argv!(eos_processor::Config {
            kafka.bootstrap_servers: &self.bootstrap,
            input_topic: &self.input,
            output_topic: &self.output,
            group_id: &self.group,
            instance.instance_id: instance,
            guarantee: guarantee,
            metrics_addr: "127.0.0.1:0",
            transaction_timeout: "10s",
        });
        ServiceProcess::spawn("eos-processor", &args, envs)
    }

    fn produce_in_background(
        &self,
        workload: Workload,
    ) -> std::thread::JoinHandle<anyhow::Result<serde_json::Value>> {
        let (bootstrap, input) = (self.bootstrap.clone(), self.input.clone());
        std::thread::spawn(move || eosctl::produce_on(&bootstrap, &input, &workload))
    }

    fn wait_drained(&self) -> anyhow::Result<()> {
        wait_until_consumed(&self.bootstrap, &self.group, &self.input, DRAIN_TIMEOUT)
    }

    fn audit(&self) -> anyhow::Result<AuditOutcome> {
        eosctl::audit_on(&self.bootstrap, &self.input, &self.output, &self.dlq())
    }
}

fn assert_exact(outcome: &AuditOutcome, logical: i64) {
    assert!(outcome.passed(), "audit not exact:\n{}", outcome.failures());
    assert_eq!(outcome.figure("logical_events"), logical);
}

/// Produces 20,000 events while the processor is SIGKILLed `kills` times at random moments and
/// restarted, then drains with one last instance and audits.
fn hard_kill_run(guarantee: &str, kills: usize, seed: u64) -> anyhow::Result<AuditOutcome> {
    let pipeline = Pipeline::new(bootstrap_servers());
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let producer = pipeline.produce_in_background(Workload {
        rate: 1_500,
        ..Workload::chaos(20_000, seed)
    });
    for _ in 0..kills {
        let mut processor = pipeline.spawn("chaos", guarantee, &[])?;
        std::thread::sleep(Duration::from_millis(rng.random_range(700..2_200)));
        let status = processor.kill_hard()?;
        assert!(
            status.code().is_none(),
            "killed by a signal, not exited: {status}\n{}",
            processor.log_tail(30)
        );
    }
    let mut last = pipeline.spawn("chaos", guarantee, &[])?;
    let summary = producer
        .join()
        .map_err(|_| anyhow::anyhow!("producer thread panicked"))??;
    assert_eq!(summary["logical_events"], 20_000);
    pipeline.wait_drained().with_context(|| last.log_tail(40))?;
    last.stop_gracefully()?;
    pipeline.audit()
}

#[test]
fn exactly_once_survives_repeated_sigkill() -> anyhow::Result<()> {
    let outcome = hard_kill_run("exactly-once", 12, 11)?;
    assert_exact(&outcome, 20_000);
    assert_eq!(outcome.figure("duplicate_deliveries"), 1_000);
    assert_eq!(outcome.figure("conflicts"), 20);
    assert_eq!(outcome.figure("malformed_inputs"), 100);
    Ok(())
}

/// The same workload and number of kills without transactions: the audit must catch the
/// repeated outputs. A kill repeats outputs only when it lands after they reached the broker and
/// before the changelog knew their event ids (see `integration_tests::aimed_kill`), which a timer
/// can miss (an instance still restoring, or idle once the input is drained); so every kill is
/// aimed at that state, and the outputs it found must each be in the output topic at least twice.
#[test]
fn at_least_once_under_the_same_kills_is_caught_by_the_audit() -> anyhow::Result<()> {
    const KILLS: usize = 12;
    // How long one kill may wait for its state before the test gives up on the precondition.
    const AIM_WITHIN: Duration = Duration::from_secs(30);
    let pipeline = Pipeline::new(bootstrap_servers());
    let changelog = format!("{}-{}-changelog", pipeline.group, pipeline.input);
    let topics = ProcessorTopics {
        bootstrap: &pipeline.bootstrap,
        input: &pipeline.input,
        output: &pipeline.output,
        changelog: &changelog,
        group: &pipeline.group,
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let producer = pipeline.produce_in_background(Workload {
        rate: 1_500,
        ..Workload::chaos(20_000, 11)
    });
    // A batch's outputs stay uncovered by the changelog until its commit. Once the producer has
    // finished, that state comes only after a restart, which reads the uncommitted input again:
    // a commit interval longer than the default 100 ms (and than the wait before the first look
    // below) keeps it open until the look.
    let envs = [("EOS_COMMIT_INTERVAL", "5s")];
    let mut repeated: BTreeSet<String> = BTreeSet::new();
    let (mut kills, mut aimed) = (0, 0);
    while aimed < KILLS {
        kills += 1;
        anyhow::ensure!(
            kills <= 2 * KILLS,
            "only {aimed} of {} kills left outputs that their restart repeats",
            kills - 1
        );
        let mut processor = pipeline.spawn("chaos", "at-least-once", &envs)?;
        std::thread::sleep(Duration::from_millis(rng.random_range(700..2_200)));
        // Its topics exist and its state is restored: a look can read what a restart finds.
        processor.wait_for_log_line("state restored", Duration::from_secs(60))?;
        kill_when(&mut processor, AIM_WITHIN, || {
            Ok(outputs_an_at_least_once_restart_repeats(topics)?.filter(|found| !found.is_empty()))
        })?
        .with_context(|| {
            format!(
                "kill {kills}: no moment in {AIM_WITHIN:?} with outputs a restart repeats\n{}",
                processor.log_tail(30)
            )
        })?;
        // An offset commit sent just before the freeze can still land: what counts is what the
        // restart finds, looked at with the process dead.
        let found = outputs_a_restart_repeats_after_the_kill(topics)?;
        if found.is_empty() {
            eprintln!("kill {kills}: a late commit covered what the look found; not counted");
            continue;
        }
        aimed += 1;
        repeated.extend(found.into_iter().map(|output| output.event_id));
    }
    let mut last = pipeline.spawn("chaos", "at-least-once", &envs)?;
    let summary = producer
        .join()
        .map_err(|_| anyhow::anyhow!("producer thread panicked"))??;
    assert_eq!(summary["logical_events"], 20_000);
    pipeline.wait_drained().with_context(|| last.log_tail(40))?;
    last.stop_gracefully()?;
    let outcome = pipeline.audit()?;
    eprintln!(
        "at-least-once: {kills} kills, {KILLS} of them aimed, left {} outputs to repeat; the \
         audit counts {} duplicated outputs",
        repeated.len(),
        outcome.violations("duplicated_output")
    );

    let mut copies: HashMap<String, usize> = HashMap::new();
    for record in read_topic_on(
        &pipeline.bootstrap,
        &pipeline.output,
        Isolation::ReadUncommitted,
    )? {
        let output: serde_json::Value =
            serde_json::from_slice(record.payload().unwrap_or_default()).unwrap_or_default();
        if let Some(event_id) = output["event_id"].as_str() {
            *copies.entry(event_id.to_owned()).or_default() += 1;
        }
    }
    let written_once: Vec<&String> = repeated
        .iter()
        .filter(|event_id| copies.get(*event_id).copied().unwrap_or(0) < 2)
        .collect();
    assert!(
        written_once.is_empty(),
        "outputs on the broker at a kill, past the committed offset and unknown to the \
         changelog, must be written again by the restart: {} of {} were not ({:?})",
        written_once.len(),
        repeated.len(),
        written_once.iter().take(5).collect::<Vec<_>>()
    );
    assert_eq!(
        outcome.exit_code, 1,
        "the audit must fail without transactions"
    );
    assert!(
        outcome.violations("duplicated_output") >= repeated.len() as i64,
        "the audit must count the {} outputs the {KILLS} aimed kills repeated:\n{}",
        repeated.len(),
        outcome.failures()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_paused_zombie_is_fenced_by_its_successor() -> anyhow::Result<()> {
    let pipeline = Pipeline::new(bootstrap_servers());
    create_topic(&pipeline.input, 3).await?;
    tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
        eosctl::produce_on(
            &pipeline.bootstrap,
            &pipeline.input,
            &Workload::chaos(3_000, 21),
        )?;
        let mut zombie = pipeline.spawn("same-pod", "exactly-once", &[])?;
        pipeline
            .wait_drained()
            .with_context(|| zombie.log_tail(40))?;
        zombie.pause()?;

        // While it is frozen, more input arrives and a successor with the same identity starts.
        eosctl::produce_on(
            &pipeline.bootstrap,
            &pipeline.input,
            &Workload::chaos(3_000, 22),
        )?;
        let mut successor = pipeline.spawn("same-pod", "exactly-once", &[])?;
        pipeline
            .wait_drained()
            .with_context(|| successor.log_tail(40))?;

        zombie.resume()?;
        let status = zombie
            .wait_timeout(Duration::from_secs(60))?
            .with_context(|| format!("the zombie kept running\n{}", zombie.log_tail(40)))?;
        assert!(
            !status.success(),
            "a fenced zombie exits non-zero\n{}",
            zombie.log_tail(40)
        );
        assert!(
            zombie.log().contains("fenced") || zombie.log().contains("Fenced"),
            "the zombie says it was fenced\n{}",
            zombie.log_tail(40)
        );

        eosctl::produce_on(
            &pipeline.bootstrap,
            &pipeline.input,
            &Workload::chaos(1_000, 23),
        )?;
        pipeline
            .wait_drained()
            .with_context(|| successor.log_tail(40))?;
        successor.stop_gracefully()?;
        assert_exact(&pipeline.audit()?, 7_000);
        Ok(())
    })
    .await?
}

#[test]
fn forced_aborts_rewind_without_skipping_or_doubling() -> anyhow::Result<()> {
    let pipeline = Pipeline::new(bootstrap_servers());
    let producer = pipeline.produce_in_background(Workload {
        rate: 2_000,
        ..Workload::chaos(5_000, 31)
    });
    // Small batches so there are many transactions, every second one failed before its commit.
    let mut processor = pipeline.spawn(
        "aborts",
        "exactly-once",
        &[("EOS_FAULT_ABORT_EVERY", "2"), ("EOS_MAX_BATCH", "200")],
    )?;
    producer
        .join()
        .map_err(|_| anyhow::anyhow!("producer thread panicked"))??;
    pipeline
        .wait_drained()
        .with_context(|| processor.log_tail(40))?;
    processor.stop_gracefully()?;
    let log = processor.log();
    let aborts = log.matches("aborting transaction").count();
    assert!(
        aborts >= 10,
        "every second transaction aborts; saw {aborts}"
    );
    assert!(log.contains("rewound to the committed offsets"));
    assert_exact(&pipeline.audit()?, 5_000);
    Ok(())
}

#[test]
fn rebalances_with_a_graceful_stop_and_a_kill_stay_exact() -> anyhow::Result<()> {
    let pipeline = Pipeline::new(bootstrap_servers());
    let producer = pipeline.produce_in_background(Workload {
        rate: 1_500,
        ..Workload::chaos(15_000, 41)
    });
    const ASSIGNED_WITHIN: Duration = Duration::from_secs(60);
    let mut first = pipeline.spawn("member-a", "exactly-once", &[])?;
    let mut second = pipeline.spawn("member-b", "exactly-once", &[])?;
    // Both members own partitions before one stops and the other is killed, so both are
    // rebalances away from a working member, however long the start-up takes; then they work
    // a moment, so the stop lands mid-stream.
    first.wait_for_log_line("partitions assigned", ASSIGNED_WITHIN)?;
    second.wait_for_log_line("partitions assigned", ASSIGNED_WITHIN)?;
    std::thread::sleep(Duration::from_secs(2));
    first.stop_gracefully()?;
    std::thread::sleep(Duration::from_secs(3));
    second.kill_hard()?;
    let mut third = pipeline.spawn("member-c", "exactly-once", &[])?;
    producer
        .join()
        .map_err(|_| anyhow::anyhow!("producer thread panicked"))??;
    pipeline
        .wait_drained()
        .with_context(|| third.log_tail(40))?;
    third.stop_gracefully()?;
    assert!(first.log().contains("partitions assigned"));
    assert_exact(&pipeline.audit()?, 15_000);
    Ok(())
}

/// A broker of this test's own (the stack script on free ports), so killing it harms no other test.
pub(crate) struct PrivateBroker {
    dir: PathBuf,
    port: u16,
    controller_port: u16,
}

impl PrivateBroker {
    pub(crate) fn stack(&self, args: &[&str]) -> anyhow::Result<()> {
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/local/stack");
        let output = Command::new(script)
            .args(args)
            .env("KAFKA_PORT", self.port.to_string())
            .env("KAFKA_CONTROLLER_PORT", self.controller_port.to_string())
            .env("EOS_STACK_DIR", &self.dir)
            .output()?;
        anyhow::ensure!(
            output.status.success(),
            "stack {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        Ok(())
    }

    pub(crate) fn start() -> anyhow::Result<Self> {
        let free_port = || -> anyhow::Result<u16> {
            Ok(std::net::TcpListener::bind("127.0.0.1:0")?
                .local_addr()?
                .port())
        };
        let dir = std::env::temp_dir().join(unique_name("eos-it-broker"));
        let broker = Self {
            dir,
            port: free_port()?,
            controller_port: free_port()?,
        };
        broker.stack(&["up", "kafka"])?;
        Ok(broker)
    }

    pub(crate) fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub(crate) fn kill_hard(&self) -> anyhow::Result<()> {
        let pid: i32 = std::fs::read_to_string(self.dir.join("kafka/kafka.pid"))?
            .trim()
            .parse()?;
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        )?;
        // Wait until the port is free again so the restart does not race the dying JVM.
        for _ in 0..100 {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        anyhow::bail!("the killed broker still listens on {}", self.port)
    }
}

impl Drop for PrivateBroker {
    fn drop(&mut self) {
        let _ = self.stack(&["down", "kafka"]);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn a_broker_killed_mid_run_and_restarted_loses_and_doubles_nothing() -> anyhow::Result<()> {
    let broker = PrivateBroker::start()?;
    let pipeline = Pipeline::new(broker.bootstrap());
    let producer = pipeline.produce_in_background(Workload {
        rate: 1_500,
        ..Workload::chaos(10_000, 51)
    });
    let mut processor = pipeline.spawn("broker-chaos", "exactly-once", &[])?;
    // Mid-run: once a second of the workload is in (a fixed wait once killed the broker while
    // eosctl was still creating the topic on a loaded machine, and it gave up).
    let deadline = Instant::now() + Duration::from_secs(60);
    while records_in_topic(&pipeline.bootstrap, &pipeline.input)? < 1_500 {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the workload did not start within 60 s\n{}",
            processor.log_tail(20)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    broker.kill_hard()?;
    std::thread::sleep(Duration::from_secs(2));
    broker.stack(&["up", "kafka"])?;
    producer
        .join()
        .map_err(|_| anyhow::anyhow!("producer thread panicked"))??;
    // An orchestrator restarts a processor that gave up because of the broker's absence, however
    // late: the coordinator may abort the stalled transaction after the restart, and the fenced
    // producer then exits by design.
    let deadline = Instant::now() + DRAIN_TIMEOUT;
    loop {
        if !processor.is_running() {
            processor = pipeline.spawn("broker-chaos", "exactly-once", &[])?;
        }
        let drained = wait_until_consumed(
            &pipeline.bootstrap,
            &pipeline.group,
            &pipeline.input,
            Duration::from_secs(5),
        );
        match drained {
            Ok(()) => break,
            Err(_) if Instant::now() < deadline => {}
            Err(error) => return Err(error).with_context(|| processor.log_tail(40)),
        }
    }
    processor.stop_gracefully()?;
    assert_exact(&pipeline.audit()?, 10_000);
    Ok(())
}

/// The settings set on the topic itself (not inherited from the broker's defaults), as the
/// broker describes them: name → value.
async fn topic_level_config(
    topic: &str,
) -> anyhow::Result<std::collections::HashMap<String, String>> {
    use rdkafka::admin::{AdminOptions, ConfigSource, ResourceSpecifier};
    let admin = integration_tests::admin()?;
    let results = admin
        .describe_configs([&ResourceSpecifier::Topic(topic)], &AdminOptions::new())
        .await?;
    let resource = results
        .into_iter()
        .next()
        .context("no describe answer")?
        .map_err(|code| anyhow::anyhow!("cannot describe {topic}: {code}"))?;
    Ok(resource
        .entries
        .into_iter()
        .filter(|entry| entry.source == ConfigSource::DynamicTopic)
        .filter_map(|entry| Some((entry.name, entry.value?)))
        .collect())
}

#[tokio::test(flavor = "multi_thread")]
async fn the_changelog_is_compacted_only_with_bounded_restore_work_and_compact_delete_is_refused()
-> anyhow::Result<()> {
    use rdkafka::admin::{AdminOptions, NewTopic, TopicReplication};

    // Created by the processor: compacted only, with the settings that bound restore work, and
    // every topic it creates with the --topic-min-insync-replicas it was given.
    let pipeline = Pipeline::new(bootstrap_servers());
    create_topic(&pipeline.input, 2).await?;
    let changelog = unique_name("changelog");
    let mut processor = pipeline.spawn(
        "changelog-settings",
        "exactly-once",
        &[
            ("EOS_CHANGELOG_TOPIC", changelog.as_str()),
            ("EOS_TOPIC_MIN_INSYNC_REPLICAS", "1"),
        ],
    )?;
    tokio::task::block_in_place(|| {
        processor.wait_for_log_line("topics ready", Duration::from_secs(60))
    })?;
    let config = topic_level_config(&changelog).await?;
    for (key, value) in [
        ("cleanup.policy", "compact"),
        ("segment.ms", "3600000"),
        ("max.compaction.lag.ms", "3600000"),
        ("min.cleanable.dirty.ratio", "0.1"),
        ("min.insync.replicas", "1"),
    ] {
        assert_eq!(
            config.get(key).map(String::as_str),
            Some(value),
            "{changelog}: {key}"
        );
    }
    for created in [&pipeline.output, &pipeline.dlq()] {
        let config = topic_level_config(created).await?;
        assert_eq!(
            config.get("min.insync.replicas").map(String::as_str),
            Some("1"),
            "{created}: min.insync.replicas"
        );
        assert!(
            !config.contains_key("cleanup.policy"),
            "{created} is not state"
        );
    }
    processor.stop_gracefully()?;

    // Found with compact,delete: retention could delete state, so the processor refuses to start.
    let pipeline = Pipeline::new(bootstrap_servers());
    create_topic(&pipeline.input, 2).await?;
    let changelog = unique_name("changelog");
    let topic = NewTopic::new(&changelog, 2, TopicReplication::Fixed(-1))
        .set("cleanup.policy", "compact,delete");
    for result in integration_tests::admin()?
        .create_topics([&topic], &AdminOptions::new())
        .await?
    {
        result.map_err(|(topic, code)| anyhow::anyhow!("cannot create {topic}: {code}"))?;
    }
    let mut processor = pipeline.spawn(
        "changelog-refused",
        "exactly-once",
        &[("EOS_CHANGELOG_TOPIC", changelog.as_str())],
    )?;
    let status = tokio::task::block_in_place(|| processor.wait_timeout(Duration::from_secs(60)))?
        .context("the processor must refuse a compact,delete changelog and exit")?;
    assert!(!status.success(), "exit status {status}");
    let log = processor.log();
    assert!(
        log.contains(r#"cleanup.policy is \"compact,delete\", expected \"compact\" only"#)
            || log.contains(r#"cleanup.policy is "compact,delete", expected "compact" only"#),
        "the refusal must name the policy and the fix:\n{}",
        processor.log_tail(20)
    );
    Ok(())
}
