//! Interoperability with Confluent's reference clients: records written by `confluent-kafka`'s
//! own Python serializers (`AvroSerializer`, `ProtobufSerializer`, `JSONSerializer`), which
//! register their schemas in the local stack's registry as a team's producers do
//! (`integration-tests/interop/confluent_produce.py`, run in a venv that
//! `integration-tests/interop/python` makes on first use). eos-processor reads each topic in its
//! format and writes every event once in the same format (`--output-format`, with the input's
//! schema registered for the output's subject), with nothing dead-lettered: the producer's retry
//! of its first records is dropped by event id, and the run drains within `DRAIN_BOUND`. The
//! outputs are read back with Confluent's own deserializers (`interop/confluent_consume.py`,
//! `read_committed`), each the event the producer wrote. docs/schemas.md.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use eos_schema::{RegistryClient, RegistryConfig};
use eos_testkit::argv;
use integration_tests::service_process::ServiceProcess;
use integration_tests::{bootstrap_servers, create_topic, unique_name, wait_until_consumed};
use serde_json::Value;

/// How long the processor may take to read every record once they are all written.
const DRAIN_BOUND: Duration = Duration::from_secs(60);
const EVENTS: usize = 300;
/// The first records written again, as a producer retrying after a lost acknowledgement would.
const RETRIED: usize = 20;

/// How long one run of a Confluent client script may take (coreutils `timeout`), its venv's
/// first making (a pip install) included.
const SCRIPT_TIMEOUT: &str = "600s";

/// Writes `count` authorisations with Confluent's serializer for `format`; the events as the
/// processor should read them, in order.
fn confluent_produce(
    format: &str,
    registry: &str,
    topic: &str,
    count: usize,
) -> anyhow::Result<Vec<Value>> {
    confluent_script("confluent_produce.py", format, registry, topic, count)
}

/// Runs `script` of integration-tests/interop with the shared flags; its JSON lines.
fn confluent_script(
    script: &str,
    format: &str,
    registry: &str,
    topic: &str,
    count: usize,
) -> anyhow::Result<Vec<Value>> {
    let interop = Path::new(env!("CARGO_MANIFEST_DIR")).join("interop");
    // A bound on the whole run, the venv's first making included: a client that waits forever
    // (a registry that accepts and never answers) fails the test naming the script instead.
    let output = Command::new("timeout")
        .args(["--kill-after=10s", SCRIPT_TIMEOUT])
        .arg(interop.join("python"))
        .arg(interop.join(script))
        .args(["--format", format, "--bootstrap", &bootstrap_servers()])
        .args(["--registry", registry, "--topic", topic])
        .args(["--count", &count.to_string()])
        .output()
        .context("running integration-tests/interop/python")?;
    ensure!(
        output.status.code() != Some(124),
        "{script} --format {format} did not end within {SCRIPT_TIMEOUT}, after {} records:\n{}",
        output.stdout.iter().filter(|byte| **byte == b'\n').count(),
        String::from_utf8_lossy(&output.stderr)
    );
    ensure!(
        output.status.success(),
        "{script} --format {format} failed ({}):\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout)?
        .lines()
        .map(|line| serde_json::from_str(line).with_context(|| format!("line {line:?}")))
        .collect()
}

/// `confluent_consume.py`'s lines as (their `event_id` header, the value read), sorted.
fn by_event_id(read_back: Vec<Value>) -> Vec<(String, Value)> {
    let mut read: Vec<(String, Value)> = read_back
        .into_iter()
        .map(|line| {
            (
                line["event_id"].as_str().unwrap_or("").to_owned(),
                line["value"].clone(),
            )
        })
        .collect();
    read.sort_by(|a, b| a.0.cmp(&b.0));
    read
}

/// `confluent_produce.py`'s events as (their `/auth/id`, the event), sorted.
fn events_by_id(events: Vec<Value>) -> Vec<(String, Value)> {
    let mut events: Vec<(String, Value)> = events
        .into_iter()
        .map(|event| (event["auth"]["id"].as_str().unwrap_or("").to_owned(), event))
        .collect();
    events.sort_by(|a, b| a.0.cmp(&b.0));
    events
}

async fn confluent_records_are_read_once_as_their_events(format: &str) -> anyhow::Result<()> {
    let registry = std::env::var("EOS_SCHEMA_REGISTRY_URL").context(
        "EOS_SCHEMA_REGISTRY_URL is not set: the schema registry this test writes through \
         (`deploy/local/stack env` prints it; `make test` sets it)",
    )?;
    let input = unique_name(&format!("interop-{format}"));
    let output = unique_name(&format!("interop-{format}-out"));
    let group = unique_name(&format!("interop-{format}-processor"));
    let dlq = format!("{input}.dlq");
    create_topic(&input, 3).await?;
    let (registry_for_producer, topic) = (registry.clone(), input.clone());
    let format_owned = format.to_owned();
    let expected = tokio::task::spawn_blocking(move || {
        let events = confluent_produce(&format_owned, &registry_for_producer, &topic, EVENTS)?;
        confluent_produce(&format_owned, &registry_for_producer, &topic, RETRIED)?;
        anyhow::Ok(events)
    })
    .await??;
    ensure!(
        expected.len() == EVENTS,
        "{} events written",
        expected.len()
    );

    // The outputs' subject gets the schema the producer registered for the input.
    let client = RegistryClient::new(RegistryConfig::new(registry.clone()))?;
    let input_schema = client.latest(&format!("{input}-value")).await?;
    client
        .register(&format!("{output}-value"), &input_schema.schema)
        .await?;

    let bootstrap = bootstrap_servers();
    let args = argv!(eos_processor::ServiceConfig {
        processor.kafka.bootstrap_servers: &bootstrap,
        processor.input_topic: &input,
        processor.output_topic: &output,
        processor.group_id: &group,
        processor.instance.instance_id: &format!("interop-{format}"),
        processor.metrics_addr: "127.0.0.1:0",
        processor.input_format.input_format: format,
        processor.input_format.output_format: format,
        processor.input_format.registry.schema_registry_url: &registry,
        transform: "pass-through",
        processor.event_id: "/auth/id",
    });
    let started = Instant::now();
    let mut processor = ServiceProcess::spawn("eos-processor", &args, &[])?;
    tokio::task::block_in_place(|| wait_until_consumed(&bootstrap, &group, &input, DRAIN_BOUND))
        .with_context(|| processor.log_tail(40))?;
    let drained_in = started.elapsed();
    processor.stop_gracefully()?;
    eprintln!(
        "{format}: {} records from Confluent's serializer read in {drained_in:?} (bound \
         {DRAIN_BOUND:?})",
        EVENTS + RETRIED
    );

    let (outputs, letters) =
        crate::schema_input::outputs_and_dead_letters(output.clone(), dlq).await?;
    ensure!(
        letters.is_empty(),
        "nothing is dead-lettered; the first: {:?}",
        letters
            .first()
            .and_then(|letter| crate::card_authorisations::header(
                letter,
                eos_core::dead_letter::DETAIL_HEADER
            ))
    );
    let (registry_for_consumer, topic) = (registry.clone(), output.clone());
    let format_owned = format.to_owned();
    let count = outputs.len();
    let read_back = tokio::task::spawn_blocking(move || {
        confluent_script(
            "confluent_consume.py",
            &format_owned,
            &registry_for_consumer,
            &topic,
            count,
        )
    })
    .await??;
    let written = by_event_id(read_back);
    let want = events_by_id(expected);
    ensure!(
        written.len() == want.len(),
        "{} outputs for {} events (each once, the {RETRIED} retried records dropped)",
        written.len(),
        want.len()
    );
    for (got, expected) in written.iter().zip(&want) {
        ensure!(
            got == expected,
            "{format}: event {} reads back as {} with Confluent's deserializer where its \
             serializer wrote {}",
            expected.0,
            got.1,
            expected.1
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn confluent_avro_serializer_records_are_read_once_as_their_events() -> anyhow::Result<()> {
    confluent_records_are_read_once_as_their_events("avro").await
}

/// Confluent's `ProtobufSerializer` registers its schema as a serialized descriptor (base64), not
/// `.proto` text, and a registry that keeps what it was given serves it back so.
#[tokio::test(flavor = "multi_thread")]
async fn confluent_protobuf_serializer_records_are_read_once_as_their_events() -> anyhow::Result<()>
{
    confluent_records_are_read_once_as_their_events("protobuf").await
}

#[tokio::test(flavor = "multi_thread")]
async fn confluent_json_serializer_records_are_read_once_as_their_events() -> anyhow::Result<()> {
    confluent_records_are_read_once_as_their_events("json-schema").await
}

/// outbox-relay writes each row in the topic's registered format (`--value-format`), and
/// Confluent's deserializers read every row back, once, as the event that was enqueued: the
/// events are the ones `confluent_produce.py` wrote (so its schema is registered for the relay's
/// topic too), enqueued as JSON rows in domain transactions. The relay drains them within
/// `DRAIN_BOUND`.
async fn outbox_rows_are_published_in_the_registry_format(format: &str) -> anyhow::Result<()> {
    let registry = std::env::var("EOS_SCHEMA_REGISTRY_URL")
        .context("EOS_SCHEMA_REGISTRY_URL is not set (`deploy/local/stack env` prints it)")?;
    let model = unique_name(&format!("outbox-{format}-model"));
    let topic = unique_name(&format!("outbox-{format}"));
    create_topic(&model, 1).await?;
    create_topic(&topic, 3).await?;
    let (registry_for_producer, model_topic) = (registry.clone(), model.clone());
    let format_owned = format.to_owned();
    let events = tokio::task::spawn_blocking(move || {
        confluent_produce(&format_owned, &registry_for_producer, &model_topic, EVENTS)
    })
    .await??;
    let client = RegistryClient::new(RegistryConfig::new(registry.clone()))?;
    let schema = client.latest(&format!("{model}-value")).await?;
    client
        .register(&format!("{topic}-value"), &schema.schema)
        .await?;

    let db = integration_tests::TestDatabase::create().await?;
    eos_outbox::migrator().run(&db.pool).await?;
    let mut domain = db.pool.begin().await?;
    for (n, event) in events.iter().enumerate() {
        let id = event["auth"]["id"].as_str().unwrap_or_default();
        let message = eos_outbox::OutboxMessage {
            topic: topic.clone(),
            key: event["card"].as_str().unwrap_or_default().to_owned(),
            event_id: eos_core::EventId::new(id)?,
            record: event.as_object().cloned().unwrap_or_default(),
            headers: Vec::new(),
        };
        eos_outbox::enqueue_message(&mut domain, &message).await?;
        // Several domain transactions, as a service's requests would commit them.
        if n % 50 == 49 {
            domain.commit().await?;
            domain = db.pool.begin().await?;
        }
    }
    domain.commit().await?;

    let relay_name = unique_name(&format!("outbox-{format}-relay"));
    let bootstrap = bootstrap_servers();
    let args = argv!(outbox_relay::Config {
        kafka.bootstrap_servers: &bootstrap,
        database[database_url]: &db.url,
        relay_name: &relay_name,
        positions_topic: unique_name("outbox-registry-positions"),
        metrics_addr: "127.0.0.1:0",
        poll_interval: "200ms",
        value_format: format,
        registry.schema_registry_url: &registry,
    });
    let started = Instant::now();
    let mut relay = ServiceProcess::spawn("outbox-relay", &args, &[])?;
    let (registry_for_consumer, relayed) = (registry.clone(), topic.clone());
    let format_owned = format.to_owned();
    let read_back = tokio::task::spawn_blocking(move || {
        confluent_script(
            "confluent_consume.py",
            &format_owned,
            &registry_for_consumer,
            &relayed,
            EVENTS,
        )
    })
    .await?
    .with_context(|| relay.log_tail(30))?;
    let drained_in = started.elapsed();
    relay.stop_gracefully()?;
    eprintln!(
        "outbox {format}: {} rows published and read back with Confluent's deserializer in \
         {drained_in:?} (bound {DRAIN_BOUND:?})",
        read_back.len()
    );
    ensure!(
        drained_in < DRAIN_BOUND,
        "the relay took {drained_in:?}, over {DRAIN_BOUND:?}"
    );
    let got = by_event_id(read_back);
    let want = events_by_id(events);
    ensure!(
        got.len() == want.len(),
        "{} records for {} rows",
        got.len(),
        want.len()
    );
    for (got, want) in got.iter().zip(&want) {
        ensure!(
            got == want,
            "{format}: row {} reads back as {} where {} was enqueued",
            want.0,
            got.1,
            want.1
        );
    }

    // A row whose value does not fit the topic's schema stops the relay, naming the row and the
    // subject: skipping it would be a gap.
    let mut misfit = want[0].1.clone();
    misfit["card"] = Value::Bool(true);
    let mut domain = db.pool.begin().await?;
    eos_outbox::enqueue_message(
        &mut domain,
        &eos_outbox::OutboxMessage {
            topic: topic.clone(),
            key: "misfit".into(),
            event_id: eos_core::EventId::new("misfit-1")?,
            record: misfit.as_object().cloned().unwrap_or_default(),
            headers: Vec::new(),
        },
    )
    .await?;
    domain.commit().await?;
    let mut relay = ServiceProcess::spawn("outbox-relay", &args, &[])?;
    let status = relay
        .wait_timeout(Duration::from_secs(60))?
        .with_context(|| format!("the relay published a misfit\n{}", relay.log_tail(20)))?;
    ensure!(!status.success(), "the relay exits non-zero on a misfit");
    let log = relay.log();
    ensure!(
        log.contains("misfit-1") && log.contains(&format!("subject {topic}-value")),
        "the relay names the row and the subject\n{}",
        relay.log_tail(20)
    );
    db.drop_database().await
}

#[tokio::test(flavor = "multi_thread")]
async fn outbox_rows_are_published_in_avro_and_read_by_confluent_s_deserializer()
-> anyhow::Result<()> {
    outbox_rows_are_published_in_the_registry_format("avro").await
}

#[tokio::test(flavor = "multi_thread")]
async fn outbox_rows_are_published_in_protobuf_and_read_by_confluent_s_deserializer()
-> anyhow::Result<()> {
    outbox_rows_are_published_in_the_registry_format("protobuf").await
}
