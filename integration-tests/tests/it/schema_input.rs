//! eos-processor reading Avro through the local stack's schema registry (Apicurio Registry's
//! Confluent-compatible API, docs/schemas.md): the registry unreachable when the first records
//! arrive (a partitioned link), so they wait, nothing skipped and nothing dead-lettered, with the
//! outage warned of and `/readyz` answering 503; then the link healed, every event decided once
//! as its JSON event, and each record that does not decode a dead letter naming the subject and
//! the schema id. `make test` passes the registry's URL in EOS_SCHEMA_REGISTRY_URL.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use eos_core::dead_letter;
use eos_schema::{RegistryClient, RegistryConfig, Schema, wire};
use eos_testkit::argv;
use integration_tests::fault_proxy::FaultProxy;
use integration_tests::service_process::ServiceProcess;
use integration_tests::{
    Isolation, bootstrap_servers, create_topic, produce_records, read_topic, unique_name,
    wait_until_consumed,
};
use rdkafka::Message as _;
use rdkafka::message::OwnedMessage;
use serde_json::{Value, json};

/// How long the healed processor may take to drain the topic.
const DRAIN_BOUND: Duration = Duration::from_secs(120);

pub(crate) const AUTHORISATION_AVRO: &str = r#"{
  "type": "record", "name": "Authorisation", "namespace": "com.example.cards",
  "fields": [
    {"name": "auth", "type": {"type": "record", "name": "Auth", "fields": [
      {"name": "id", "type": "string"}]}},
    {"name": "card", "type": "string"},
    {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}},
    {"name": "currency", "type": {"type": "enum", "name": "Currency", "symbols": ["EUR", "USD"]}},
    {"name": "note", "type": ["null", "string"], "default": null}
  ]
}"#;

pub(crate) fn registry_url() -> anyhow::Result<String> {
    std::env::var("EOS_SCHEMA_REGISTRY_URL").context(
        "EOS_SCHEMA_REGISTRY_URL is not set: the schema registry this test reads through \
         (`deploy/local/stack env` prints it; `make test` sets it)",
    )
}

pub(crate) fn authorisation(id: &str, card: &str, amount: &str) -> Value {
    json!({"auth": {"id": id}, "card": card, "amount": amount, "currency": "EUR", "note": null})
}

/// The output topic's and the dead-letter topic's records, as `read_committed` readers see them;
/// a dead-letter topic never made (nothing was dead-lettered) reads as empty.
pub(crate) async fn outputs_and_dead_letters(
    output: String,
    dlq: String,
) -> anyhow::Result<(Vec<OwnedMessage>, Vec<OwnedMessage>)> {
    tokio::task::spawn_blocking(move || {
        anyhow::Ok((
            read_topic(&output, Isolation::ReadCommitted)?,
            read_topic(&dlq, Isolation::ReadCommitted).unwrap_or_default(),
        ))
    })
    .await?
}

/// Each output's `event_id` header and JSON value, in event-id order.
pub(crate) fn json_outputs_by_event_id(outputs: &[OwnedMessage]) -> Vec<(String, Value)> {
    let mut written: Vec<(String, Value)> = outputs
        .iter()
        .map(|message| {
            (
                header(message, "event_id").to_owned(),
                serde_json::from_slice(message.payload().unwrap_or_default())
                    .unwrap_or(Value::Null),
            )
        })
        .collect();
    written.sort_by(|a, b| a.0.cmp(&b.0));
    written
}

/// The last value of header `name`, or "".
fn header<'a>(message: &'a OwnedMessage, name: &str) -> &'a str {
    crate::card_authorisations::header(message, name).unwrap_or_default()
}

/// `GET http://addr/path`'s status, until it is `status` or `within` passes; the last status.
pub(crate) fn probe_until(addr: SocketAddr, path: &str, status: u16, within: Duration) -> u16 {
    let deadline = Instant::now() + within;
    loop {
        let got = reqwest::blocking::get(format!("http://{addr}{path}"))
            .map(|response| response.status().as_u16())
            .unwrap_or(0);
        if got == status || Instant::now() > deadline {
            return got;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn avro_input_waits_out_a_registry_outage_and_is_decided_as_its_json_events()
-> anyhow::Result<()> {
    let url = registry_url()?;
    let input = unique_name("avro-auths");
    let output = unique_name("avro-auths-out");
    let group = unique_name("avro-auths-processor");
    let dlq = format!("{input}.dlq");
    create_topic(&input, 1).await?;

    let registry = RegistryClient::new(RegistryConfig::new(url.clone()))?;
    let subject = format!("{input}-value");
    let avro_id = registry
        .register(&subject, &Schema::avro(AUTHORISATION_AVRO))
        .await?;
    let avro = registry.parsed_schema(avro_id).await?;
    let proto_id = registry
        .register(
            &format!("{input}-other-value"),
            &Schema::protobuf("syntax = \"proto3\";\nmessage Other { string id = 1; }\n"),
        )
        .await?;
    let encode = |value: &Value| avro.encode_framed(avro_id, value);
    let a1 = authorisation("a-1", "c-1", "12.50");
    let a2 = authorisation("a-2", "c-2", "3.00");
    let a3 = authorisation("a-3", "c-1", "7.25");
    let mut garbage = wire::frame(avro_id, &[0xff; 3]);
    garbage.truncate(7);
    let records: Vec<(Option<String>, Vec<u8>)> = vec![
        // 0, 1: a-1, then a-1 again: a duplicate.
        (Some("c-1".into()), encode(&a1)?),
        (Some("c-1".into()), encode(&a1)?),
        // 2: plain JSON on an Avro topic: not the wire format.
        (Some("c-2".into()), a2.to_string().into_bytes()),
        // 3: a schema id the registry does not have.
        (
            Some("c-2".into()),
            wire::frame(eos_schema::SchemaId(2_000_000_000), b"\x02"),
        ),
        // 4: a Protobuf schema's id on an Avro input.
        (Some("c-2".into()), wire::frame(proto_id, b"\x00\x02")),
        // 5: the Avro schema's id with bytes that are not its record.
        (Some("c-2".into()), garbage),
        // 6, 7: a-2 and a-3.
        (Some("c-2".into()), encode(&a2)?),
        (Some("c-1".into()), encode(&a3)?),
    ];

    // The processor reaches the registry through a link that is down from the start.
    let upstream = url
        .strip_prefix("http://")
        .and_then(|rest| rest.split('/').next())
        .context("the registry URL is http://HOST:PORT/...")?
        .to_owned();
    let proxy = FaultProxy::start(&upstream).await?;
    proxy.partition();
    let proxied_url = url.replacen(&upstream, &proxy.addr().to_string(), 1);
    let bootstrap = bootstrap_servers();
    let args = argv!(eos_processor::ServiceConfig {
        processor.kafka.bootstrap_servers: &bootstrap,
        processor.input_topic: &input,
        processor.output_topic: &output,
        processor.group_id: &group,
        processor.instance.instance_id: "avro-auths",
        processor.metrics_addr: "127.0.0.1:0",
        processor.input_format.input_format: "avro",
        processor.input_format.registry.schema_registry_url: &proxied_url,
        processor.input_format.registry.schema_registry_timeout: "1s",
        processor.stall.stall_warning: "2s",
        transform: "pass-through",
        processor.event_id: "/auth/id",
    });
    let mut processor = ServiceProcess::spawn("eos-processor", &args, &[])?;
    let addr: SocketAddr = processor
        .wait_for_log_field("metrics_addr", Duration::from_secs(60))?
        .parse()?;
    produce_records(&input, &records)?;

    // While the link is down: the first record waits, warned of; /readyz says not ready;
    // nothing is committed, output or dead letter.
    tokio::task::block_in_place(|| {
        processor.wait_for_log_line("the schema registry cannot answer", Duration::from_secs(60))
    })
    .with_context(|| processor.log_tail(30))?;
    let ready =
        tokio::task::block_in_place(|| probe_until(addr, "/readyz", 503, Duration::from_secs(20)));
    ensure!(
        ready == 503,
        "/readyz during the registry's outage: {ready}"
    );
    let (health, _) = tokio::task::block_in_place(|| {
        let response = reqwest::blocking::get(format!("http://{addr}/healthz"))?;
        anyhow::Ok((response.status().as_u16(), ()))
    })?;
    ensure!(
        health == 200,
        "/healthz stays 200: a restart would not bring the registry back ({health})"
    );
    let (out_during, dlq_during) = {
        let (output, dlq) = (output.clone(), dlq.clone());
        tokio::task::spawn_blocking(move || {
            anyhow::Ok((
                read_topic(&output, Isolation::ReadCommitted)?.len(),
                read_topic(&dlq, Isolation::ReadCommitted).map_or(0, |letters| letters.len()),
            ))
        })
        .await??
    };
    ensure!(
        (out_during, dlq_during) == (0, 0),
        "nothing is decided while the registry cannot answer: {out_during} outputs, \
         {dlq_during} dead letters"
    );

    proxy.heal();
    let healed_at = Instant::now();
    tokio::task::block_in_place(|| wait_until_consumed(&bootstrap, &group, &input, DRAIN_BOUND))
        .with_context(|| processor.log_tail(40))?;
    let drained_in = healed_at.elapsed();
    let ready =
        tokio::task::block_in_place(|| probe_until(addr, "/readyz", 200, Duration::from_secs(20)));
    ensure!(ready == 200, "/readyz once the registry answers: {ready}");
    processor.stop_gracefully()?;
    eprintln!("drained {drained_in:?} after the registry's link healed (bound {DRAIN_BOUND:?})");
    ensure!(
        processor.log().contains("format=avro via"),
        "the boundary line names the format\n{}",
        processor.log_tail(40)
    );

    let (outputs, letters) = outputs_and_dead_letters(output, dlq).await?;
    let passed = json_outputs_by_event_id(&outputs);
    assert_eq!(
        passed,
        [
            ("a-1".to_owned(), a1),
            ("a-2".to_owned(), a2),
            ("a-3".to_owned(), a3)
        ],
        "each event once, as its JSON event (the decimal with its scale, the enum by name)"
    );
    let mut reasons: Vec<(i64, String, String)> = letters
        .iter()
        .map(|letter| {
            (
                header(letter, dead_letter::SOURCE_OFFSET_HEADER)
                    .parse()
                    .unwrap_or(-1),
                header(letter, dead_letter::REASON_HEADER).to_owned(),
                header(letter, dead_letter::DETAIL_HEADER).to_owned(),
            )
        })
        .collect();
    reasons.sort_unstable();
    let expected = [
        (2, "not the schema registry's wire format".to_owned()),
        (3, "schema id 2000000000 is not in the registry".to_owned()),
        (4, format!("schema id {proto_id} is a Protobuf schema")),
        (5, format!("schema id {avro_id}: payload does not decode")),
    ];
    assert_eq!(reasons.len(), expected.len(), "{reasons:?}");
    for ((offset, reason, detail), (want_offset, names)) in reasons.iter().zip(&expected) {
        assert_eq!(
            (*offset, reason.as_str()),
            (*want_offset, "undecodable_record"),
            "{detail}"
        );
        assert!(
            detail.contains(&format!("subject {subject}")) && detail.contains(names.as_str()),
            "offset {offset}: {detail} (expected it to name the subject and {names:?})"
        );
    }
    // Each letter keeps its record's bytes as they came.
    for letter in &letters {
        let offset: usize = header(letter, dead_letter::SOURCE_OFFSET_HEADER).parse()?;
        assert_eq!(
            letter.payload().unwrap_or_default(),
            records[offset].1.as_slice(),
            "the dead letter of offset {offset} holds the original bytes"
        );
    }
    Ok(())
}

/// A producer moves to a newer BACKWARD-compatible schema mid-run (a field added with a
/// default): nothing stops, the events it writes with it are decided as before, and an event
/// written again with the new schema and the new field at its default is the same event (a
/// duplicate), while the new field set to something else is another content (a conflict).
#[tokio::test(flavor = "multi_thread")]
async fn a_producer_moving_to_a_compatible_schema_mid_run_changes_no_event() -> anyhow::Result<()> {
    let url = registry_url()?;
    let input = unique_name("avro-evolving");
    let output = unique_name("avro-evolving-out");
    let group = unique_name("avro-evolving-processor");
    let dlq = format!("{input}.dlq");
    create_topic(&input, 1).await?;
    let registry = RegistryClient::new(RegistryConfig::new(url.clone()))?;
    let subject = format!("{input}-value");
    let v1_id = registry
        .register(&subject, &Schema::avro(AUTHORISATION_AVRO))
        .await?;
    let v1 = registry.parsed_schema(v1_id).await?;
    let bootstrap = bootstrap_servers();
    let args = argv!(eos_processor::ServiceConfig {
        processor.kafka.bootstrap_servers: &bootstrap,
        processor.input_topic: &input,
        processor.output_topic: &output,
        processor.group_id: &group,
        processor.instance.instance_id: "avro-evolving",
        processor.metrics_addr: "127.0.0.1:0",
        processor.input_format.input_format: "avro",
        processor.input_format.registry.schema_registry_url: &url,
        transform: "pass-through",
        processor.event_id: "/auth/id",
    });
    let started = Instant::now();
    let mut processor = ServiceProcess::spawn("eos-processor", &args, &[])?;
    let (a1, a2) = (
        authorisation("a-1", "c-1", "12.50"),
        authorisation("a-2", "c-2", "3.00"),
    );
    produce_records(
        &input,
        &[
            (Some("c-1".into()), v1.encode_framed(v1_id, &a1)?),
            (Some("c-2".into()), v1.encode_framed(v1_id, &a2)?),
        ],
    )?;
    tokio::task::block_in_place(|| wait_until_consumed(&bootstrap, &group, &input, DRAIN_BOUND))
        .with_context(|| processor.log_tail(40))?;
    // The producer's newer schema: a channel, "pos" unless said.
    let v2_text = AUTHORISATION_AVRO.replace(
        r#"{"name": "note", "type": ["null", "string"], "default": null}"#,
        r#"{"name": "note", "type": ["null", "string"], "default": null},
    {"name": "channel", "type": "string", "default": "pos"}"#,
    );
    ensure!(
        v2_text != AUTHORISATION_AVRO,
        "the test's schema edit applies"
    );
    let v2_id = registry.register(&subject, &Schema::avro(v2_text)).await?;
    let v2 = registry.parsed_schema(v2_id).await?;
    let with_channel = |event: &Value, channel: &str| {
        let mut event = event.clone();
        event["channel"] = channel.into();
        event
    };
    let a3 = with_channel(&authorisation("a-3", "c-1", "7.25"), "pos");
    produce_records(
        &input,
        &[
            // a-1 again, as the new schema writes it: the same event.
            (
                Some("c-1".into()),
                v2.encode_framed(v2_id, &with_channel(&a1, "pos"))?,
            ),
            // a-2 again with another channel: another content under its id.
            (
                Some("c-2".into()),
                v2.encode_framed(v2_id, &with_channel(&a2, "web"))?,
            ),
            (Some("c-1".into()), v2.encode_framed(v2_id, &a3)?),
        ],
    )?;
    tokio::task::block_in_place(|| wait_until_consumed(&bootstrap, &group, &input, DRAIN_BOUND))
        .with_context(|| processor.log_tail(40))?;
    let drained_in = started.elapsed();
    processor.stop_gracefully()?;
    eprintln!("both halves drained within {drained_in:?} (bound {DRAIN_BOUND:?} each)");

    let (outputs, letters) = outputs_and_dead_letters(output, dlq).await?;
    let written = json_outputs_by_event_id(&outputs);
    ensure!(
        written
            == [
                ("a-1".to_owned(), a1),
                ("a-2".to_owned(), a2),
                ("a-3".to_owned(), a3)
            ],
        "each event once, as the schema that wrote it first reads it: {written:?}"
    );
    let reasons: Vec<(&str, &str)> = letters
        .iter()
        .map(|letter| {
            (
                header(letter, dead_letter::REASON_HEADER),
                header(letter, dead_letter::SOURCE_OFFSET_HEADER),
            )
        })
        .collect();
    ensure!(
        reasons == [("event_id_conflict", "3")],
        "only a-2 with another channel is a conflict: {reasons:?}"
    );

    // A consumer reading as the first schema (--input-reader-schema SUBJECT@1) sees its fields
    // only, whatever wrote the record: a-3 without its channel, and a-2 with another channel
    // the same event as before (a duplicate, not a conflict).
    let as_v1 = unique_name("avro-evolving-as-v1");
    let reader_group = unique_name("avro-evolving-reader");
    let reader_subject = format!("{subject}@1");
    let args = argv!(eos_processor::ServiceConfig {
        processor.kafka.bootstrap_servers: &bootstrap,
        processor.input_topic: &input,
        processor.output_topic: &as_v1,
        processor.group_id: &reader_group,
        processor.instance.instance_id: "avro-evolving-reader",
        processor.metrics_addr: "127.0.0.1:0",
        processor.input_format.input_format: "avro",
        processor.input_format.input_reader_schema: &reader_subject,
        processor.input_format.registry.schema_registry_url: &url,
        transform: "pass-through",
        processor.event_id: "/auth/id",
        processor.dlq_topic: &format!("{as_v1}.dlq"),
    });
    let mut reader = ServiceProcess::spawn("eos-processor", &args, &[])?;
    tokio::task::block_in_place(|| {
        wait_until_consumed(&bootstrap, &reader_group, &input, DRAIN_BOUND)
    })
    .with_context(|| reader.log_tail(40))?;
    reader.stop_gracefully()?;
    let (outputs, letters) =
        outputs_and_dead_letters(as_v1.clone(), format!("{as_v1}.dlq")).await?;
    let written = json_outputs_by_event_id(&outputs);
    ensure!(
        written
            == [
                ("a-1".to_owned(), authorisation("a-1", "c-1", "12.50")),
                ("a-2".to_owned(), authorisation("a-2", "c-2", "3.00")),
                ("a-3".to_owned(), authorisation("a-3", "c-1", "7.25"))
            ],
        "each event once, as the first schema reads it: {written:?}"
    );
    ensure!(
        letters.is_empty(),
        "read as the first schema, a-2's other channel is no other content: {} dead letters",
        letters.len()
    );
    Ok(())
}
