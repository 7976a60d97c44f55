//! The example of your own events and logic (`examples/card-authorisations`) under the same chaos
//! as the ledger: card authorisations with re-deliveries are produced while the example's binary
//! is SIGKILLed and restarted at random moments, and the replay proof (`eos_processor::replay`,
//! the example's own transform run again over the committed input, read by the library's
//! `read_committed_run`, under the configuration the run had) must find every approved and
//! flagged output and every refusal exactly once, as computed.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::Context as _;
use card_authorisations::{CardAuthorisations, FLAGGED_OUTPUT};
use eos_processor::{DEFAULT_OUTPUT, Transform};
use eos_runtime::kafka_clients;
use eos_testkit::argv;
use eos_transform::replay::{self, CommittedRun, RunTopics};
use integration_tests::http_api_doubles::{ApiDouble, ApiFaults};
use integration_tests::otlp_collector::{OtlpCollector, env_refs};
use integration_tests::service_process::ServiceProcess;
use integration_tests::{
    Isolation, arg_refs, bootstrap_servers, client_config, create_topic, read_topic, unique_name,
    wait_until_consumed,
};
use rand::{Rng as _, SeedableRng as _};
use rdkafka::Message as _;
use rdkafka::message::{Header, Headers as _, OwnedHeaders, OwnedMessage};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer as _};
use serde_json::json;

const AUTHORISATIONS: usize = 4_000;
const CARDS: usize = 400;
const KILLS: usize = 6;
/// The binary's limits: about ten authorisations of about 200.00 per card and day, so the later
/// ones of a card pass its limit of 2,000.00, and about a quarter are flagged.
const TRANSFORM: CardAuthorisations = CardAuthorisations {
    daily_limit: 200_000,
    flag_at: 30_000,
};

/// One record of the workload: the card as its key, the authorisation, and the W3C
/// `traceparent` its upstream sent it with (a re-delivery carries the same one).
#[derive(Clone)]
struct Authorisation {
    auth_id: String,
    card: String,
    value: Vec<u8>,
    trace_id: String,
}

impl Authorisation {
    fn traceparent(&self) -> String {
        format!(
            "00-{}-{:016x}-01",
            self.trace_id,
            1 + fnv(self.auth_id.as_bytes()) % (u64::MAX - 1)
        )
    }
}

/// A fixed, non-zero hash for the parent span id of a record's traceparent.
fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The workload: each card's authorisations over one UTC day, 5% sent twice.
fn authorisations(seed: u64) -> Vec<Authorisation> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let day = time::OffsetDateTime::now_utc().date();
    let mut records = Vec::with_capacity(AUTHORISATIONS * 21 / 20);
    for n in 0..AUTHORISATIONS {
        let card = format!("card-{}", rng.random_range(0..CARDS));
        let at = day
            .with_hms(0, 0, 0)
            .map(|midnight| midnight.assume_utc() + time::Duration::seconds(n as i64))
            .unwrap_or_else(|_| time::OffsetDateTime::now_utc());
        let auth_id = format!("auth-{seed}-{n}");
        let value = json!({
            "auth_id": auth_id,
            "card": card,
            "amount": card_authorisations::decimal(rng.random_range(100..40_000)),
            "currency": if rng.random_bool(0.8) { "EUR" } else { "USD" },
            "merchant": format!("m-{}", rng.random_range(0..500)),
            "at": at.format(&time::format_description::well_known::Rfc3339).unwrap_or_default(),
        })
        .to_string()
        .into_bytes();
        let authorisation = Authorisation {
            auth_id,
            card,
            value,
            trace_id: format!("{:032x}", rng.random::<u128>().max(1)),
        };
        if rng.random_bool(0.05) {
            records.push(authorisation.clone());
        }
        records.push(authorisation);
    }
    records
}

/// The example binary's command line: its topics (input, approved, flagged), group and instance,
/// with [`TRANSFORM`]'s limit of 2,000.00 a day and flags from 300.00.
fn processor_args(
    bootstrap: &str,
    (input, approved, flagged): (&str, &str, &str),
    group: &str,
    instance: &str,
) -> Vec<String> {
    argv!(card_authorisations::Args {
        processor.kafka.bootstrap_servers: bootstrap,
        processor.input_topic: input,
        processor.output_topic: approved,
        processor.outputs: format!("{FLAGGED_OUTPUT}={flagged}"),
        processor.group_id: group,
        processor.instance.instance_id: instance,
        processor.metrics_addr: "127.0.0.1:0",
        daily_limit: card_authorisations::decimal(TRANSFORM.daily_limit),
        flag_at: card_authorisations::decimal(TRANSFORM.flag_at),
    })
}

/// Writes `records` at about `rate` per second, idempotently.
fn produce(topic: &str, records: &[Authorisation], rate: u64) -> anyhow::Result<()> {
    let producer: BaseProducer = kafka_clients::idempotent_producer(&client_config())
        .set("linger.ms", "5")
        .create()?;
    let started = std::time::Instant::now();
    for (sent, record) in records.iter().enumerate() {
        let traceparent = record.traceparent();
        loop {
            let headers = OwnedHeaders::new().insert(Header {
                key: "traceparent",
                value: Some(&traceparent),
            });
            let message = BaseRecord::to(topic)
                .key(&record.card)
                .payload(&record.value)
                .headers(headers);
            match producer.send(message) {
                Ok(()) => break,
                Err((error, _)) if error.rdkafka_error_code().is_some() => {
                    producer.poll(Duration::from_millis(50));
                }
                Err((error, _)) => return Err(error.into()),
            }
        }
        producer.poll(Duration::ZERO);
        let due = Duration::from_secs_f64(sent as f64 / rate as f64);
        if let Some(wait) = due.checked_sub(started.elapsed()) {
            std::thread::sleep(wait);
        }
    }
    producer.flush(Duration::from_secs(60))?;
    Ok(())
}

pub(crate) fn header<'a>(message: &'a OwnedMessage, name: &str) -> Option<&'a str> {
    message
        .headers()?
        .iter()
        .filter(|h| h.key == name)
        .last()
        .and_then(|h| h.value)
        .and_then(|v| std::str::from_utf8(v).ok())
}

#[test]
fn card_authorisations_survive_repeated_sigkill_and_replay_exactly() -> anyhow::Result<()> {
    let bootstrap = bootstrap_servers();
    let input = unique_name("card-auths");
    let approved = unique_name("card-approved");
    let flagged = unique_name("card-flagged");
    let group = unique_name("card-authorisations");
    tokio::runtime::Runtime::new()?.block_on(create_topic(&input, 3))?;
    let seed = 20_261_204;
    let records = authorisations(seed);
    let producer = {
        let (input, records) = (input.clone(), records.clone());
        std::thread::spawn(move || produce(&input, &records, 700))
    };
    let args = processor_args(&bootstrap, (&input, &approved, &flagged), &group, "cards");
    let spawn = || ServiceProcess::spawn("card-authorisations", &args, &[]);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    for _ in 0..KILLS {
        let mut processor = spawn()?;
        std::thread::sleep(Duration::from_millis(rng.random_range(700..2_200)));
        let status = processor.kill_hard()?;
        assert!(
            status.code().is_none(),
            "killed by a signal, not exited: {status}\n{}",
            processor.log_tail(30)
        );
    }
    let mut last = spawn()?;
    producer
        .join()
        .map_err(|_| anyhow::anyhow!("producer thread panicked"))??;
    wait_until_consumed(&bootstrap, &group, &input, Duration::from_secs(180))
        .with_context(|| last.log_tail(40))?;
    last.stop_gracefully()?;

    let (expected, run) = replay_run(&args, example_transform)?;
    assert_eq!(
        run.inputs.len(),
        records.len(),
        "every record produced is read"
    );
    // The workload takes every path: approvals, flags, refusals and re-deliveries, dropped
    // (a refused event's too: its outcome is final).
    let paths = replay_paths(&expected, records.len(), FLAGGED_OUTPUT);
    assert!(
        paths.0 > 1_000 && paths.1 > 200 && paths.2 > 200 && paths.3 > 50,
        "(applied, flagged, refused, duplicates) = {paths:?}"
    );
    eprintln!("replayed (applied, flagged, refused, duplicates) = {paths:?}");
    assert_replay_exact(&expected, &run);
    Ok(())
}

/// `args` parsed as the example's binary parses its command line.
pub(crate) fn example_args(args: &[String]) -> anyhow::Result<card_authorisations::Args> {
    Ok(<card_authorisations::Args as clap::Parser>::try_parse_from(
        std::iter::once("card-authorisations".to_owned()).chain(args.iter().cloned()),
    )?)
}

/// The transform the example's binary runs with `args`, as its `main` builds it.
pub(crate) fn example_transform(args: &card_authorisations::Args) -> CardAuthorisations {
    CardAuthorisations {
        daily_limit: args.daily_limit,
        flag_at: args.flag_at,
    }
}

/// How long reading a run may go without progress: an open transaction of a SIGKILLed instance
/// is aborted well within it, by its successor or its timeout.
pub(crate) const READ_STALL: Duration = Duration::from_secs(60);

/// What a run of the example's binary committed, and what the replay computes for it, under the
/// configuration the run had: `args`, its command line, parsed again as the binary parses it,
/// gives the transform (`transform`), the topics and the event contract — the transform's own
/// with what the flags say instead, as the processor made it (`Config::event_contract`), never
/// the transform's contract alone.
pub(crate) fn replay_run<T: Transform>(
    args: &[String],
    transform: impl FnOnce(&card_authorisations::Args) -> T,
) -> anyhow::Result<(replay::Expected, CommittedRun)> {
    let args = example_args(args)?;
    let transform = transform(&args);
    let config = &args.processor;
    let topics = RunTopics {
        input: config.input_topic.clone(),
        outputs: config.output_topics(),
        dead_letters: config.dlq_topic(),
    };
    let kafka = config.kafka.settings(&[])?.client_config();
    let run = replay::read_committed_run(&kafka, &topics, READ_STALL)?;
    let contract = config.event_contract(transform.contract());
    let expected = replay::expected(&transform, &contract, &topics.output_names(), &run.inputs)?;
    Ok((expected, run))
}

/// (applied, flagged, refused, duplicates) of a replay, once each of the `records` written is
/// checked to have exactly one of those outcomes.
pub(crate) fn replay_paths(
    expected: &replay::Expected,
    records: usize,
    flagged_output: &str,
) -> (u64, usize, usize, u64) {
    assert_eq!(
        expected.applied as usize + expected.duplicates as usize + expected.dead_letters.len(),
        records
    );
    let flags = expected
        .outputs
        .iter()
        .filter(|output| output.output == flagged_output)
        .count();
    (
        expected.applied,
        flags,
        expected.dead_letters.len(),
        expected.duplicates,
    )
}

/// The replay's outputs and dead letters are exactly what the run committed: none missing, none
/// unexpected, every dead letter with the replay's reason and code, and none of another input.
pub(crate) fn assert_replay_exact(expected: &replay::Expected, run: &CommittedRun) {
    let report = run.compare(expected);
    assert!(
        report.exact(),
        "the committed outputs are not the transform's: {report}"
    );
    assert_eq!(report.matched as usize, run.outputs.len());
    assert_eq!(run.other_dead_letters, 0);
}

/// The whole chain with no ledger field anywhere: card authorisations → the example's processor
/// (approved and flagged outputs) → sink-writer with a TOML target over the approved output,
/// reading the id from the `event_id` header the processor writes and the card from the key.
/// Each is SIGKILLed once mid-run. The Kafka boundary is proven by the replay, the PostgreSQL one
/// by one row per approved authorisation, by event id, with the output's content. The traces, by
/// one trace per event: the one the producer's `traceparent` began. The same sink notifies a
/// partner's API once per approved authorisation (an `http` target beside the table, settled by
/// `replay`, the partner throttling, failing and answering late): one notification per approved
/// authorisation, with its fields (docs/TRANSFORMS.md "Into PostgreSQL").
#[tokio::test(flavor = "multi_thread")]
async fn a_chain_without_ledger_fields_is_exact_at_every_boundary() -> anyhow::Result<()> {
    let db = integration_tests::TestDatabase::create().await?;
    let partner = ApiDouble::idempotent(ApiFaults {
        throttle: 0.02,
        retry_after_seconds: 1,
        error_before_apply: 0.02,
        late: 0.05,
        late_answer: Duration::from_secs(4),
        seed: 7,
    })
    .await?;
    let notify = unique_name("partner").replace('-', "_");
    let dedup = crate::dedup_service::Dedup::spawn(
        &db,
        &[
            "--reconcile-interval",
            "200ms",
            "--in-flight-window",
            "3s",
            "--reconcile-strategy",
            &format!("{notify}=replay"),
            // The partner double keeps its keys for as long as it runs: longer than any replay.
            "--key-ttl",
            &format!("{notify}=30d"),
        ],
    )?;
    sqlx::query(
        "CREATE TABLE card_approvals (
             auth_id TEXT PRIMARY KEY,
             card TEXT NOT NULL,
             amount TEXT NOT NULL,
             currency TEXT NOT NULL,
             day_spent TEXT NOT NULL,
             fingerprint TEXT NOT NULL,
             source_offset BIGINT NOT NULL
         )",
    )
    .execute(&db.pool)
    .await?;
    let targets = std::env::temp_dir().join(format!("{}.toml", unique_name("card-targets")));
    std::fs::write(
        &targets,
        format!(
            r#"
[[targets]]
table = "card_approvals"
kind = "append"
key = "auth_id"
[targets.columns]
auth_id = "event_id"
card = "entity_id"
amount = "/amount"
currency = "/currency"
day_spent = "/day_spent"
fingerprint = "fingerprint"
source_offset = "kafka.offset"

[[targets]]
kind = "http"
name = "{notify}"
dedup_url = "{dedup_url}"
url = "{partner_url}/v1/notifications"
call_timeout = "1s"
lease_ttl = "3s"
[targets.body]
authorisation = "event_id"
card = "entity_id"
amount = "/amount"
currency = "/currency"
status = "/status"
"#,
            dedup_url = dedup.endpoint(),
            partner_url = partner.url(),
        ),
    )?;
    let bootstrap = bootstrap_servers();
    let input = unique_name("chain-auths");
    let approved = unique_name("chain-approved");
    let flagged = unique_name("chain-flagged");
    let group = unique_name("chain-cards");
    create_topic(&input, 3).await?;
    let records: Vec<_> = authorisations(7).into_iter().take(1_500).collect();
    // The first half is produced while each service is SIGKILLed once; the second after both
    // restarts, so only instances that stop gracefully (and so flush their spans) handle it.
    let (during_kills, after_kills) = records.split_at(records.len() / 2);
    let producer = {
        let (input, during_kills) = (input.clone(), during_kills.to_vec());
        std::thread::spawn(move || produce(&input, &during_kills, 500))
    };
    let collector = OtlpCollector::start()?;
    let otel = collector.exporter_env();
    let otel = env_refs(&otel);
    let processor_args = processor_args(&bootstrap, (&input, &approved, &flagged), &group, "chain");
    let sink = crate::sink_writer::Sink::new(&approved, &db.url);
    let sink_args = argv!(sink_writer::Config {
        config: targets.display().to_string(),
        event_id: "header:event_id",
        entity: "key",
        occurred_at: "/at",
        event_schema: "any",
    });
    let sink_args = arg_refs(&sink_args);
    let mut processor = ServiceProcess::spawn("card-authorisations", &processor_args, &otel)?;
    let mut sink_process = sink.spawn("chain", &sink_args, &otel)?;
    tokio::time::sleep(Duration::from_millis(700)).await;
    processor.kill_hard()?;
    let mut processor = ServiceProcess::spawn("card-authorisations", &processor_args, &otel)?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    sink_process.kill_hard()?;
    let mut sink_process = sink.spawn("chain", &sink_args, &otel)?;
    tokio::task::block_in_place(|| {
        producer
            .join()
            .map_err(|_| anyhow::anyhow!("producer thread panicked"))?
    })?;
    tokio::task::block_in_place(|| produce(&input, after_kills, 1_000))?;
    tokio::task::block_in_place(|| {
        wait_until_consumed(&bootstrap, &group, &input, Duration::from_secs(180))
    })
    .with_context(|| processor.log_tail(40))?;
    processor.stop_gracefully()?;
    sink.wait_drained(&db.pool, &mut sink_process).await?;
    sink_process.stop_gracefully()?;
    let _ = std::fs::remove_file(&targets);

    // Kafka → Kafka: the replay.
    let (expected, run) =
        tokio::task::block_in_place(|| replay_run(&processor_args, example_transform))?;
    assert_replay_exact(&expected, &run);

    // Kafka → PostgreSQL: one row per approved authorisation, with its content.
    let mut want: Vec<(String, String, String)> = run
        .outputs
        .iter()
        .filter(|output| output.output == DEFAULT_OUTPUT)
        .map(|output| {
            let value: serde_json::Value = serde_json::from_str(&output.value).unwrap_or_default();
            (
                output.event_id.clone(),
                output.key.clone(),
                value["day_spent"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    want.sort();
    let rows: Vec<(String, String, String)> =
        sqlx::query_as("SELECT auth_id, card, day_spent FROM card_approvals ORDER BY auth_id")
            .fetch_all(&db.pool)
            .await?;
    assert!(want.len() > 300, "{} approved", want.len());
    assert_eq!(
        rows, want,
        "one row per approved authorisation, as approved"
    );
    let dead: i64 = sqlx::query_scalar("SELECT count(*) FROM sink_dead_letters")
        .fetch_one(&db.pool)
        .await?;
    let conflicts: i64 = sqlx::query_scalar("SELECT count(*) FROM sink_conflicts")
        .fetch_one(&db.pool)
        .await?;
    assert_eq!((dead, conflicts), (0, 0));

    // The partner: one notification per approved authorisation, with its fields, whatever its
    // answers lost.
    let approved_outputs: BTreeMap<String, serde_json::Value> = run
        .outputs
        .iter()
        .filter(|output| output.output == DEFAULT_OUTPUT)
        .map(|output| {
            let value = serde_json::from_str(&output.value).unwrap_or_default();
            (format!("{notify}:{}", output.event_id), value)
        })
        .collect();
    let notifications = partner.effects();
    eprintln!(
        "partner: {} notifications; answers {}",
        notifications.len(),
        partner.counts().summary()
    );
    let mut notified: BTreeMap<&str, &serde_json::Value> = BTreeMap::new();
    for notification in &notifications {
        assert!(
            notified
                .insert(notification.key.as_str(), &notification.body)
                .is_none(),
            "{} notified twice",
            notification.key
        );
    }
    assert_eq!(
        notified.keys().copied().collect::<Vec<_>>(),
        approved_outputs
            .keys()
            .map(String::as_str)
            .collect::<Vec<_>>(),
        "one notification per approved authorisation"
    );
    for (key, body) in &notified {
        let output = &approved_outputs[*key];
        assert_eq!(body["amount"], output["amount"], "{key}");
        assert_eq!(body["status"], "approved", "{key}");
        assert_eq!(body["card"], output["card"], "{key}");
    }
    drop(dedup);

    // Each event has one trace: the one its upstream began. Every span about it, from any
    // instance, killed or not, lies in it; and the events produced after the kills have the spans
    // of every service they reached.
    let trace_of: BTreeMap<&str, &str> = records
        .iter()
        .map(|record| (record.auth_id.as_str(), record.trace_id.as_str()))
        .collect();
    let spans = collector.spans_by_event_id();
    for (event_id, event_spans) in &spans {
        if let Some(trace_id) = trace_of.get(event_id.as_str()) {
            for span in event_spans {
                assert_eq!(
                    &span.trace_id, trace_id,
                    "{event_id}: a span outside its trace: {span}"
                );
            }
        }
    }
    let approved_ids: BTreeSet<&str> = want.iter().map(|(id, _, _)| id.as_str()).collect();
    for record in after_kills {
        let services: BTreeSet<&str> = spans
            .get(&record.auth_id)
            .into_iter()
            .flatten()
            .map(|span| span.service_name.as_str())
            .collect();
        let expected: BTreeSet<&str> = if approved_ids.contains(record.auth_id.as_str()) {
            ["card-authorisations", "sink-writer"].into()
        } else {
            ["card-authorisations"].into()
        };
        assert!(
            expected.is_subset(&services),
            "{}: spans from {services:?}, expected {expected:?}",
            record.auth_id
        );
    }
    db.drop_database().await
}

/// Writes each event's value to the output it names, `tier`, and never to the default output:
/// a library user's transform with named outputs only.
struct TiersOnly;

impl eos_processor::Transform for TiersOnly {
    type State = ();

    fn contract(&self) -> eos_core::EventContract {
        TRANSFORM.contract()
    }

    fn outputs(&self) -> Vec<String> {
        vec!["tier".to_owned()]
    }

    fn writes_default_output(&self) -> bool {
        false
    }

    fn apply(
        &self,
        _state: &mut (),
        event: eos_core::Event,
        _source: &eos_processor::SourcePosition,
    ) -> Result<Vec<eos_processor::Output>, eos_processor::Refusal> {
        Ok(vec![eos_processor::Output::new("tier", event.value)])
    }
}

/// Like [`TiersOnly`], but writing to the default output as well (the trait's default).
struct TiersAndDefault;

impl eos_processor::Transform for TiersAndDefault {
    type State = ();

    fn outputs(&self) -> Vec<String> {
        vec!["tier".to_owned()]
    }

    fn apply(
        &self,
        _state: &mut (),
        _event: eos_core::Event,
        _source: &eos_processor::SourcePosition,
    ) -> Result<Vec<eos_processor::Output>, eos_processor::Refusal> {
        Ok(Vec::new())
    }
}

/// A library binary carries none of the demo's defaults (issue 51, part 2): the example's
/// `--help` lists no flag of the eos-processor binary's own, started without its topic and group
/// it refuses with clap's error naming both, and a transform that writes only to an output it
/// names runs (in this process, as a user's `main` would) without a default output topic, which
/// is then never created; one that writes to the default output is refused without it.
#[tokio::test(flavor = "multi_thread")]
async fn a_library_binary_has_no_demo_defaults() -> anyhow::Result<()> {
    let binary = integration_tests::workspace_binary("card-authorisations")?;
    let help = std::process::Command::new(&binary).arg("--help").output()?;
    let help = String::from_utf8(help.stdout)?;
    assert!(help.contains("--input-topic"), "{help}");
    for demo_only in [
        "--transform",
        "--wasm-",
        "--filter-",
        "[default: payments]",
        "[default: ledger]",
        "[default: eos-processor]",
    ] {
        assert!(!help.contains(demo_only), "{demo_only} in\n{help}");
    }
    let bootstrap = bootstrap_servers();
    let bare = std::process::Command::new(&binary)
        .args(["--bootstrap-servers", &bootstrap])
        .output()?;
    let error = String::from_utf8_lossy(&bare.stderr);
    assert_eq!(bare.status.code(), Some(2), "{error}");
    assert!(
        error.contains("required arguments were not provided")
            && error.contains("--input-topic")
            && error.contains("--group-id"),
        "{error}"
    );

    let base = unique_name("library-tiers");
    let (input, tier) = (format!("{base}-in"), format!("{base}-tier"));
    create_topic(&input, 3).await?;
    let state_dir = std::env::temp_dir().join(&base);
    let args = argv!(eos_processor::Config {
        kafka.bootstrap_servers: &bootstrap,
        input_topic: &input,
        outputs: format!("tier={tier}"),
        group_id: &base,
        instance.instance_id: "tiers-0",
        metrics_addr: "127.0.0.1:0",
        state_dir: state_dir.display().to_string(),
    });
    let parse = || {
        <eos_processor::Config as clap::Parser>::try_parse_from(
            std::iter::once("tiers".to_owned()).chain(args.iter().cloned()),
        )
    };
    let refused = eos_processor::Processor::new(parse()?, TiersAndDefault)
        .run(tokio_util::sync::CancellationToken::new())
        .await
        .expect_err("a default output without its topic");
    assert!(
        refused
            .to_string()
            .contains("--output-topic is required: the transform writes to the default output"),
        "{refused:#}"
    );

    // Only the processor of this process ever installs the metrics recorder: one per process.
    let shutdown = tokio_util::sync::CancellationToken::new();
    let processor =
        tokio::spawn(eos_processor::Processor::new(parse()?, TiersOnly).run(shutdown.clone()));
    let records: Vec<Authorisation> = authorisations(7).into_iter().take(20).collect();
    let consumed = tokio::task::block_in_place(|| {
        produce(&input, &records, 1_000)?;
        wait_until_consumed(&bootstrap, &base, &input, Duration::from_secs(120))
    });
    shutdown.cancel();
    processor.await??;
    consumed?;
    let tiers = read_topic(&tier, Isolation::ReadCommitted)?;
    let distinct: BTreeSet<&str> = records.iter().map(|r| r.auth_id.as_str()).collect();
    assert_eq!(tiers.len(), distinct.len());
    let metadata = integration_tests::admin()?
        .inner()
        .fetch_metadata(None, Duration::from_secs(10))?;
    let created: BTreeSet<&str> = metadata
        .topics()
        .iter()
        .map(|topic| topic.name())
        .filter(|name| name.starts_with(&base))
        .collect();
    let changelog = format!("{base}-{input}-changelog");
    let dlq = format!("{input}.dlq");
    assert_eq!(
        created,
        BTreeSet::from([
            input.as_str(),
            tier.as_str(),
            dlq.as_str(),
            changelog.as_str()
        ]),
        "no default output topic"
    );
    let _ = std::fs::remove_dir_all(&state_dir);
    Ok(())
}
