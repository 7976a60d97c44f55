//! Poison inputs against the real broker and the real binaries: records too big for a dead
//! letter to copy whole (999 KB, 1 MiB and the input topic's own 4 MiB maximum, with large
//! headers) are dead-lettered — cut to fit, with their coordinates — and the pipeline moves on to
//! the next event. The processor is audited exactly with `eosctl audit`; the sink is checked in
//! SQL and on its dead-letter topic.

use eos_testkit::argv;
use std::time::Duration;

use anyhow::Context as _;
use eos_core::dead_letter;
use eos_runtime::kafka_clients;
use integration_tests::service_process::ServiceProcess;
use integration_tests::{
    Isolation, TestDatabase, admin, bootstrap_servers, client_config, create_topic, eosctl,
    produce_records, read_topic, unique_name, wait_until_consumed,
};
use rdkafka::Message as _;
use rdkafka::admin::{AdminOptions, NewTopic, TopicReplication};
use rdkafka::message::{Header, Headers as _, OwnedHeaders, OwnedMessage};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer as _};
use serde_json::json;

use crate::dedup_service::{Dedup, history};
use crate::provider_sim::ProviderSim;
use crate::sink_writer::Sink;

/// The input topics' `max.message.bytes`: four times the producers' default limit.
const TOPIC_MAX_BYTES: usize = 4 * 1024 * 1024;
/// The processor's default `--max-record-bytes` (eos-processor's config).
const PROCESSOR_MAX_RECORD_BYTES: usize = 900 * 1024;

/// One record to produce: key, value, headers.
struct Poison {
    key: String,
    value: Vec<u8>,
    headers: Vec<(String, Vec<u8>)>,
}

impl Poison {
    /// A record that is an envelope in form, padded with a payload string to `size` bytes.
    fn envelope_of_size(event_id: &str, size: usize, header_bytes: usize) -> Self {
        let head = format!(r#"{{"event_id":"{event_id}","entity_id":"big","value":1,"payload":""#);
        let tail = r#""}"#;
        let mut value = head.into_bytes();
        value.resize(size - tail.len(), b'p');
        value.extend_from_slice(tail.as_bytes());
        Self {
            key: "big".into(),
            value,
            headers: large_headers(header_bytes),
        }
    }

    fn event(event_id: &str, value: i64) -> Self {
        Self {
            key: "small".into(),
            value: json!({"event_id": event_id, "entity_id": "small", "value": value})
                .to_string()
                .into_bytes(),
            headers: vec![(
                "traceparent".into(),
                b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".to_vec(),
            )],
        }
    }
}

/// A trace header plus four headers sharing `bytes` between them.
fn large_headers(bytes: usize) -> Vec<(String, Vec<u8>)> {
    let mut headers = vec![(
        "traceparent".to_owned(),
        b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".to_vec(),
    )];
    for i in 0..4 {
        headers.push((format!("big-header-{i}"), vec![b'h'; bytes / 4]));
    }
    headers
}

/// A topic whose `max.message.bytes` is [`TOPIC_MAX_BYTES`].
async fn large_record_topic(prefix: &str) -> anyhow::Result<String> {
    let topic = unique_name(prefix);
    let max = TOPIC_MAX_BYTES.to_string();
    let new_topic =
        NewTopic::new(&topic, 1, TopicReplication::Fixed(1)).set("max.message.bytes", &max);
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    for result in admin()?.create_topics([&new_topic], &options).await? {
        if let Err((topic, code)) = result {
            anyhow::bail!("cannot create topic {topic}: {code}");
        }
    }
    Ok(topic)
}

/// Produces `records` in order with a producer whose `message.max.bytes` admits the topic's
/// maximum (the services' own producers keep librdkafka's 1,000,000-byte default).
fn produce_large(topic: &str, records: &[Poison]) -> anyhow::Result<()> {
    let producer: BaseProducer = kafka_clients::idempotent_producer(&client_config())
        .set(
            "message.max.bytes",
            (TOPIC_MAX_BYTES + 64 * 1024).to_string(),
        )
        .create()?;
    for record in records {
        let mut headers = OwnedHeaders::new();
        for (key, value) in &record.headers {
            headers = headers.insert(Header {
                key,
                value: Some(value),
            });
        }
        producer
            .send(
                BaseRecord::to(topic)
                    .key(&record.key)
                    .payload(&record.value)
                    .headers(headers),
            )
            .map_err(|(error, _)| error)
            .with_context(|| format!("producing a {}-byte record", record.value.len()))?;
        // One at a time, in order: the topic is not meant to batch these.
        producer.flush(Duration::from_secs(30))?;
    }
    Ok(())
}

fn header<'a>(letter: &'a OwnedMessage, name: &str) -> Option<&'a [u8]> {
    letter
        .headers()?
        .iter()
        .filter(|h| h.key == name)
        .last()
        .and_then(|h| h.value)
}

fn header_str<'a>(letter: &'a OwnedMessage, name: &str) -> &'a str {
    header(letter, name)
        .and_then(|v| std::str::from_utf8(v).ok())
        .unwrap_or_default()
}

/// Checks the dead letter of `original`: whole when `whole`, else cut to the producer's limit with
/// the original's size, SHA-256 and position, and fewer of its headers.
fn assert_letter(letter: &OwnedMessage, original: &Poison, offset: i64, whole: bool) {
    let value = letter.payload().unwrap_or_default();
    assert_eq!(
        header_str(letter, dead_letter::SOURCE_OFFSET_HEADER),
        offset.to_string()
    );
    assert!(
        dead_letter::stands_for(value, |h| header(letter, h), &original.value),
        "dead letter of offset {offset} does not stand for its original"
    );
    if whole {
        assert_eq!(header_str(letter, dead_letter::TRUNCATED_HEADER), "false");
        assert_eq!(value, original.value.as_slice());
        for (key, _) in &original.headers {
            assert!(header(letter, key).is_some(), "header {key} kept");
        }
        return;
    }
    assert_eq!(header_str(letter, dead_letter::TRUNCATED_HEADER), "true");
    assert!(value.len() < original.value.len() && value.len() > 500_000);
    assert_eq!(
        header_str(letter, dead_letter::ORIGINAL_SIZE_HEADER),
        original.value.len().to_string()
    );
    assert_eq!(
        header_str(letter, dead_letter::ORIGINAL_SHA256_HEADER),
        dead_letter::sha256_hex(&original.value)
    );
    assert!(
        header(letter, "traceparent").is_some(),
        "small headers kept"
    );
    let dropped: usize = header_str(letter, dead_letter::HEADERS_DROPPED_HEADER)
        .parse()
        .unwrap_or(0);
    assert!(dropped >= 1, "large headers trimmed");
    let size = value.len()
        + letter.key().map_or(0, <[u8]>::len)
        + letter.headers().map_or(0, |h| {
            h.iter()
                .map(|h| h.key.len() + h.value.map_or(0, <[u8]>::len))
                .sum()
        });
    assert!(size < 1_000_000, "dead letter of {size} bytes");
}

#[test]
fn poison_records_too_big_for_a_dead_letter_are_cut_and_the_processor_moves_on()
-> anyhow::Result<()> {
    let runtime = tokio::runtime::Runtime::new()?;
    let input = runtime.block_on(large_record_topic("poison-payments"))?;
    let (output, group) = (
        unique_name("poison-ledger"),
        unique_name("poison-processor"),
    );
    let dlq = format!("{input}.dlq");
    let records = [
        Poison::event("e-before", 100),
        // Over --max-record-bytes but, with small headers, small enough to copy whole.
        Poison::envelope_of_size("e-fits", PROCESSOR_MAX_RECORD_BYTES + 1, 0),
        Poison::envelope_of_size("e-999k", 999_000, 120 * 1024),
        Poison::envelope_of_size("e-1m", 1024 * 1024, 120 * 1024),
        // As large as the topic takes: the value, its 200 KiB of headers and 4 KiB for framing.
        Poison::envelope_of_size("e-max", TOPIC_MAX_BYTES - 204 * 1024, 200 * 1024),
        Poison::event("e-after", 23),
    ];
    produce_large(&input, &records)?;

    let bootstrap = bootstrap_servers();
    let args = argv!(eos_processor::Config {
        kafka.bootstrap_servers: &bootstrap,
        input_topic: &input,
        output_topic: &output,
        group_id: &group,
        instance.instance_id: "poison",
        metrics_addr: "127.0.0.1:0",
    });
    let mut processor = ServiceProcess::spawn("eos-processor", &args, &[])?;
    wait_until_consumed(&bootstrap, &group, &input, Duration::from_secs(120))
        .with_context(|| processor.log_tail(40))?;
    processor.stop_gracefully()?;

    let letters = read_topic(&dlq, Isolation::ReadCommitted)?;
    assert_eq!(letters.len(), 4, "one dead letter per poison record");
    for (letter, (offset, whole)) in
        letters
            .iter()
            .zip([(1, true), (2, false), (3, false), (4, false)])
    {
        assert_eq!(
            header_str(letter, dead_letter::REASON_HEADER),
            "oversized_record"
        );
        assert_letter(letter, &records[offset as usize], offset, whole);
    }

    let max_record_bytes = PROCESSOR_MAX_RECORD_BYTES.to_string();
    let audit = eosctl::audit_with(
        &bootstrap,
        &input,
        &output,
        &dlq,
        &["--max-record-bytes", &max_record_bytes],
    )?;
    assert!(audit.passed(), "audit not exact:\n{}", audit.failures());
    assert_eq!(audit.figure("logical_events"), 2, "e-before and e-after");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn poison_a_huge_malformed_record_is_dead_lettered_by_the_sink_and_the_rest_written()
-> anyhow::Result<()> {
    let db = TestDatabase::create().await?;
    let topic = large_record_topic("poison-sink").await?;
    let mut malformed = Poison::envelope_of_size("m-1", 3 * 1024 * 1024, 200 * 1024);
    malformed.value.truncate(malformed.value.len() - 1); // no closing brace: not JSON
    let mut nearly_limit = Poison::envelope_of_size("m-2", 1000 * 1024, 120 * 1024);
    nearly_limit.value[0] = b'['; // JSON-ish but broken
    let records = vec![
        Poison::event("s-before", 5),
        malformed,
        nearly_limit,
        Poison::event("s-after", 7),
    ];
    let produced = {
        let topic = topic.clone();
        tokio::task::spawn_blocking(move || produce_large(&topic, &records).map(|()| records))
    };
    let records = produced.await??;

    let sink = Sink::new(&topic, &db.url);
    let mut process = sink.spawn("poison", &[], &[])?;
    sink.wait_drained(&db.pool, &mut process).await?;
    process.stop_gracefully()?;

    let rows: Vec<(String, i64)> =
        sqlx::query_as("SELECT event_id, value FROM event_sink ORDER BY event_id")
            .fetch_all(&db.pool)
            .await?;
    assert_eq!(
        rows,
        [("s-after".to_owned(), 7), ("s-before".to_owned(), 5)],
        "the events around the poison are written"
    );
    let dead: Vec<(i64, String)> = sqlx::query_as(
        "SELECT source_offset, reason FROM sink_dead_letters ORDER BY source_offset",
    )
    .fetch_all(&db.pool)
    .await?;
    assert_eq!(
        dead,
        [
            (1, "oversized_record".to_owned()),
            (2, "malformed_json".to_owned())
        ]
    );
    let dlq = format!("{topic}.sink-dlq");
    let letters =
        tokio::task::spawn_blocking(move || read_topic(&dlq, Isolation::ReadCommitted)).await??;
    assert_eq!(letters.len(), 2, "one Kafka dead letter per poison record");
    for letter in &letters {
        let offset: i64 = header_str(letter, dead_letter::SOURCE_OFFSET_HEADER).parse()?;
        assert_letter(letter, &records[offset as usize], offset, false);
    }
    db.drop_database().await
}

/// The sink's dead-letter topic made beforehand with a `max.message.bytes` (16 KiB) far below
/// the producer's limit: a 100 KB malformed record and one with 40 KB of headers are
/// dead-lettered cut to the topic's limit (read at start-up), not refused by the broker forever,
/// and the events around them are written.
#[tokio::test(flavor = "multi_thread")]
async fn poison_a_dead_letter_topic_smaller_than_the_producer_limit_gets_fitted_dead_letters()
-> anyhow::Result<()> {
    const DLQ_MAX_BYTES: usize = 16 * 1024;
    let db = TestDatabase::create().await?;
    let topic = unique_name("poison-small-dlq");
    create_topic(&topic, 1).await?;
    let dlq = format!("{topic}.sink-dlq");
    let small =
        NewTopic::new(&dlq, 1, TopicReplication::Fixed(1)).set("max.message.bytes", "16384");
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    for result in admin()?.create_topics([&small], &options).await? {
        if let Err((topic, code)) = result {
            anyhow::bail!("cannot create topic {topic}: {code}");
        }
    }
    let mut malformed = Poison::envelope_of_size("d-1", 100 * 1024, 0);
    malformed.value.truncate(malformed.value.len() - 1); // no closing brace: not JSON
    let mut headed = Poison::envelope_of_size("d-2", 2 * 1024, 40 * 1024);
    headed.value[0] = b'['; // JSON-ish but broken
    let records = vec![
        Poison::event("t-before", 5),
        malformed,
        headed,
        Poison::event("t-after", 7),
    ];
    let produced = {
        let topic = topic.clone();
        tokio::task::spawn_blocking(move || produce_large(&topic, &records).map(|()| records))
    };
    let records = produced.await??;

    let sink = Sink::new(&topic, &db.url);
    let mut process = sink.spawn("poison-small-dlq", &[], &[])?;
    sink.wait_drained(&db.pool, &mut process).await?;
    process.stop_gracefully()?;
    assert!(
        process
            .log()
            .contains(&format!("dead_letter_max_bytes={DLQ_MAX_BYTES}")),
        "the sink reads the topic's limit\n{}",
        process.log_tail(20)
    );

    let rows: Vec<(String, i64)> =
        sqlx::query_as("SELECT event_id, value FROM event_sink ORDER BY event_id")
            .fetch_all(&db.pool)
            .await?;
    assert_eq!(
        rows,
        [("t-after".to_owned(), 7), ("t-before".to_owned(), 5)],
        "the events around the poison are written"
    );
    let letters =
        tokio::task::spawn_blocking(move || read_topic(&dlq, Isolation::ReadCommitted)).await??;
    assert_eq!(letters.len(), 2, "one Kafka dead letter per poison record");
    for letter in &letters {
        let offset: i64 = header_str(letter, dead_letter::SOURCE_OFFSET_HEADER).parse()?;
        let original = &records[offset as usize];
        assert_eq!(header_str(letter, dead_letter::TRUNCATED_HEADER), "true");
        assert!(
            dead_letter::stands_for(
                letter.payload().unwrap_or_default(),
                |h| header(letter, h),
                &original.value
            ),
            "dead letter of offset {offset} does not stand for its original"
        );
        let size = letter.payload().map_or(0, <[u8]>::len)
            + letter.key().map_or(0, <[u8]>::len)
            + letter.headers().map_or(0, |h| {
                h.iter()
                    .map(|h| h.key.len() + h.value.map_or(0, <[u8]>::len))
                    .sum()
            });
        assert!(
            size < DLQ_MAX_BYTES,
            "dead letter of offset {offset}: {size} bytes"
        );
    }
    db.drop_database().await
}

/// The processor's dead-letter topic with a `max.message.bytes` far below the producer's limit:
/// four malformed 10 KB records, each of which fits the topic whole, are dead-lettered in one
/// transaction without the broker refusing them together (the producer's batches are capped at
/// the topic's limit), so no transaction is aborted, and the events around them are processed.
#[tokio::test(flavor = "multi_thread")]
async fn poison_the_processor_fits_dead_letters_to_a_small_dead_letter_topic_without_an_abort()
-> anyhow::Result<()> {
    const DLQ_MAX_BYTES: usize = 16 * 1024;
    let input = unique_name("poison-small-processor-dlq");
    create_topic(&input, 1).await?;
    let dlq = format!("{input}.dlq");
    let small =
        NewTopic::new(&dlq, 1, TopicReplication::Fixed(1)).set("max.message.bytes", "16384");
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    for result in admin()?.create_topics([&small], &options).await? {
        if let Err((topic, code)) = result {
            anyhow::bail!("cannot create topic {topic}: {code}");
        }
    }
    let mut records = vec![Poison::event("p-before", 5)];
    for n in 0..4 {
        let mut malformed = Poison::envelope_of_size(&format!("p-bad-{n}"), 10 * 1024, 0);
        malformed.value.truncate(malformed.value.len() - 1); // no closing brace: not JSON
        records.push(malformed);
    }
    records.push(Poison::event("p-after", 7));
    let produced = {
        let input = input.clone();
        tokio::task::spawn_blocking(move || produce_large(&input, &records))
    };
    produced.await??;

    let (output, group) = (
        unique_name("poison-ledger"),
        unique_name("poison-processor"),
    );
    let bootstrap = bootstrap_servers();
    let args = argv!(eos_processor::Config {
        input_topic: &input,
        output_topic: &output,
        group_id: &group,
        instance.instance_id: "poison-small-dlq",
        metrics_addr: "127.0.0.1:0",
    });
    let mut processor = ServiceProcess::spawn("eos-processor", &args, &[])?;
    tokio::task::block_in_place(|| {
        wait_until_consumed(&bootstrap, &group, &input, Duration::from_secs(120))
    })
    .with_context(|| processor.log_tail(40))?;
    processor.stop_gracefully()?;
    let log = processor.log();
    assert!(
        log.contains(&format!("dead_letter_max_bytes={DLQ_MAX_BYTES}")),
        "the processor reads the topic's limit\n{}",
        processor.log_tail(20)
    );
    assert!(
        !log.contains("aborting transaction"),
        "no transaction may be aborted for dead letters that each fit\n{}",
        processor.log_tail(40)
    );

    let letters =
        tokio::task::spawn_blocking(move || read_topic(&dlq, Isolation::ReadCommitted)).await??;
    assert_eq!(letters.len(), 4, "one dead letter per malformed record");
    for letter in &letters {
        assert_eq!(
            header_str(letter, dead_letter::REASON_HEADER),
            "malformed_json"
        );
        assert!(letter.payload().map_or(0, <[u8]>::len) < DLQ_MAX_BYTES);
    }
    let audit =
        tokio::task::block_in_place(|| eosctl::audit(&input, &output, &format!("{input}.dlq")))?;
    assert!(audit.passed(), "audit not exact:\n{}", audit.failures());
    assert_eq!(audit.figure("logical_events"), 2, "p-before and p-after");
    Ok(())
}

/// A provider that declines with a 10 KiB body: the sink's `Fail` reason is cut to fit
/// dedup-service's 4 KiB limit, so the intent ends FAILED at the first answer — no UNKNOWN, no
/// second POST — and the event is dead-lettered as provider_rejected.
#[tokio::test(flavor = "multi_thread")]
async fn poison_a_decline_with_a_10_kib_body_fails_the_intent_once() -> anyhow::Result<()> {
    let db = TestDatabase::create().await?;
    let topic = unique_name("poison-decline");
    create_topic(&topic, 1).await?;
    let events: Vec<(Option<String>, Vec<u8>)> = [("d-1", 10), ("d-big", 1_000), ("d-2", 20)]
        .iter()
        .map(|(id, value)| {
            let body = json!({"event_id": id, "entity_id": "c", "value": value});
            (Some("c".to_owned()), body.to_string().into_bytes())
        })
        .collect();
    {
        let topic = topic.clone();
        tokio::task::spawn_blocking(move || produce_records(&topic, &events)).await??;
    }
    let sim = ProviderSim::spawn(&[
        "--decline-amounts-above",
        "500",
        "--decline-body-bytes",
        "10240",
    ])?;
    let dedup = Dedup::spawn(&db, &["--provider-url", &sim.url])?;
    let name = unique_name("verbose").replace('-', "_");
    let dir = std::env::temp_dir().join(unique_name("poison-decline"));
    std::fs::create_dir_all(&dir)?;
    let config = dir.join("targets.toml");
    std::fs::write(
        &config,
        format!(
            "[[targets]]\nkind = \"provider\"\nname = \"{name}\"\ndedup_url = \"{}\"\n\
             provider_url = \"{}\"\ncall_timeout = \"2s\"\nlease_ttl = \"10s\"\n",
            dedup.endpoint(),
            sim.url
        ),
    )?;
    let config = config.display().to_string();
    let sink = Sink::new(&topic, &db.url);
    let mut process = sink.spawn("poison", &["--config", &config], &[])?;
    sink.wait_drained(&db.pool, &mut process).await?;
    process.stop_gracefully()?;
    std::fs::remove_dir_all(&dir)?;

    let operation_id = format!("{name}:d-big");
    let (state, retryable, reason): (String, bool, Option<String>) = sqlx::query_as(
        "SELECT state, retryable, failure_reason FROM dedup_intents WHERE operation_id = $1",
    )
    .bind(&operation_id)
    .fetch_one(&db.pool)
    .await?;
    assert_eq!((state.as_str(), retryable), ("FAILED", false));
    let reason = reason.unwrap_or_default();
    assert!(reason.len() <= 4 * 1024, "{} bytes", reason.len());
    assert!(reason.contains("402"), "{reason}");
    assert!(
        reason.contains("bytes in all]"),
        "the cut is marked: {reason}"
    );
    let states: Vec<String> = history(&db, &operation_id)
        .await?
        .into_iter()
        .map(|(_, to, _)| to)
        .collect();
    assert_eq!(states, ["RESERVED", "FAILED"], "acquired once, failed once");

    let metrics = reqwest::get(format!("{}/metrics", sim.url))
        .await?
        .text()
        .await?;
    let declined = metrics
        .lines()
        .find(|line| line.starts_with(r#"eos_provider_charges_total{outcome="declined"}"#))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|n| n.parse::<f64>().ok());
    assert_eq!(declined, Some(1.0), "the declined charge was POSTed once");
    let charged: Vec<String> = sim
        .effects()
        .await?
        .into_iter()
        .map(|(key, _)| key)
        .filter(|key| key.starts_with(&name))
        .collect();
    assert_eq!(
        charged.len(),
        2,
        "the events around it are charged: {charged:?}"
    );
    let dead: Vec<(i64, String)> =
        sqlx::query_as("SELECT source_offset, reason FROM sink_dead_letters")
            .fetch_all(&db.pool)
            .await?;
    assert_eq!(dead, [(1, "provider_rejected".to_owned())]);
    db.drop_database().await
}
