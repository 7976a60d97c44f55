//! Events that are not the ledger's: the processor binary's pass-through transform on card
//! authorisations with the id at a JSON pointer and the entity in the record key, against the
//! real broker. Duplicates are dropped by that id, filtered events leave nothing, and a record
//! whose id or entity is missing, of the wrong type or too long is a dead letter whose detail
//! names the configured location.

use eos_testkit::argv;
use std::time::Duration;

use anyhow::Context as _;
use eos_core::dead_letter;
use eos_runtime::kafka_clients;
use integration_tests::service_process::ServiceProcess;
use integration_tests::{
    Isolation, bootstrap_servers, client_config, create_topic, read_topic, unique_name,
    wait_until_consumed, workspace_binary,
};
use rdkafka::Message as _;
use rdkafka::message::{Header, Headers as _, OwnedHeaders, OwnedMessage};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer as _};
use serde_json::{Value, json};

/// Produces `(key, value, traceparent)` records in order, idempotently.
fn produce(topic: &str, records: &[(Option<&str>, Value, &str)]) -> anyhow::Result<()> {
    let producer: BaseProducer = kafka_clients::idempotent_producer(&client_config()).create()?;
    for (key, value, traceparent) in records {
        let payload = value.to_string();
        let headers = OwnedHeaders::new().insert(Header {
            key: "traceparent",
            value: Some(*traceparent),
        });
        let mut record = BaseRecord::to(topic).payload(&payload).headers(headers);
        if let Some(key) = key {
            record = record.key(*key);
        }
        producer.send(record).map_err(|(error, _)| error)?;
    }
    producer.flush(Duration::from_secs(30))?;
    Ok(())
}

fn header<'a>(message: &'a OwnedMessage, name: &str) -> &'a str {
    message
        .headers()
        .and_then(|headers| headers.iter().filter(|h| h.key == name).last())
        .and_then(|h| h.value)
        .and_then(|v| std::str::from_utf8(v).ok())
        .unwrap_or_default()
}

fn authorisation(id: Value, card: &str, amount: &str, currency: &str) -> Value {
    json!({"auth": {"id": id}, "card": card, "amount": amount, "currency": currency})
}

#[tokio::test(flavor = "multi_thread")]
async fn pass_through_reads_any_event_shape_from_the_configured_locations() -> anyhow::Result<()> {
    let input = unique_name("auths");
    let output = unique_name("auths-eur");
    let group = unique_name("auths-processor");
    create_topic(&input, 1).await?;
    let dlq = format!("{input}.dlq");
    const TRACE_A: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    const TRACE_B: &str = "00-1bf7651916cd43dd8448eb211c80319c-c7ad6b7169203331-01";
    let long_id = "a".repeat(129);
    let records = [
        // 0: passes the filter.
        (
            Some("c-1"),
            authorisation(json!("a-1"), "c-1", "12.50", "EUR"),
            TRACE_A,
        ),
        // 1: the same event re-delivered with other headers: dropped as a duplicate.
        (
            Some("c-1"),
            authorisation(json!("a-1"), "c-1", "12.50", "EUR"),
            TRACE_B,
        ),
        // 2: filtered out: applied, nothing written.
        (
            Some("c-2"),
            authorisation(json!("a-2"), "c-2", "3.00", "USD"),
            TRACE_A,
        ),
        // 3: passes.
        (
            Some("c-2"),
            authorisation(json!("a-3"), "c-2", "7.25", "EUR"),
            TRACE_A,
        ),
        // 4: the id is a number: invalid_field at /auth/id.
        (
            Some("c-3"),
            authorisation(json!(7), "c-3", "1.00", "EUR"),
            TRACE_A,
        ),
        // 5: no key, so no entity: missing_field at key.
        (
            None,
            authorisation(json!("a-5"), "c-3", "1.00", "EUR"),
            TRACE_A,
        ),
        // 6: a-1 again with another amount: a broken producer contract.
        (
            Some("c-1"),
            authorisation(json!("a-1"), "c-1", "99.00", "EUR"),
            TRACE_A,
        ),
        // 7: an id over 128 bytes: field_too_long at /auth/id.
        (
            Some("c-4"),
            authorisation(json!(long_id), "c-4", "1.00", "EUR"),
            TRACE_A,
        ),
        // 8: a-2 re-delivered: remembered although filtered, so a duplicate, not passed.
        (
            Some("c-2"),
            authorisation(json!("a-2"), "c-2", "3.00", "USD"),
            TRACE_B,
        ),
    ];
    produce(&input, &records)?;

    let bootstrap = bootstrap_servers();
    let args = argv!(eos_processor::ServiceConfig {
        processor.kafka.bootstrap_servers: &bootstrap,
        processor.input_topic: &input,
        processor.output_topic: &output,
        processor.group_id: &group,
        processor.instance.instance_id: "auths",
        processor.metrics_addr: "127.0.0.1:0",
        transform: "pass-through",
        processor.event_id: "/auth/id",
        filter_pointer: "/currency",
        filter_equals: "EUR",
    });
    let mut processor = ServiceProcess::spawn("eos-processor", &args, &[])?;
    tokio::task::block_in_place(|| {
        wait_until_consumed(&bootstrap, &group, &input, Duration::from_secs(120))
    })
    .with_context(|| processor.log_tail(40))?;
    processor.stop_gracefully()?;
    assert!(
        processor
            .log()
            .contains("event id at /auth/id, entity at key"),
        "the start-up log says where events are read\n{}",
        processor.log_tail(40)
    );

    let output_topic = output.clone();
    let (outputs, letters) = tokio::task::spawn_blocking(move || {
        anyhow::Ok((
            read_topic(&output_topic, Isolation::ReadCommitted)?,
            read_topic(&dlq, Isolation::ReadCommitted)?,
        ))
    })
    .await??;
    let mut passed: Vec<(&str, &str, Value)> = outputs
        .iter()
        .map(|message| {
            (
                std::str::from_utf8(message.key().unwrap_or_default()).unwrap_or_default(),
                header(message, "event_id"),
                serde_json::from_slice(message.payload().unwrap_or_default())
                    .unwrap_or(Value::Null),
            )
        })
        .collect();
    // The output has partitions of its own: the order across them is not the input's.
    passed.sort_by(|a, b| a.1.cmp(b.1));
    assert_eq!(
        passed,
        [
            ("c-1", "a-1", records[0].1.clone()),
            ("c-2", "a-3", records[3].1.clone()),
        ],
        "each EUR authorisation once, as it came, keyed by its card"
    );
    let mut reasons: Vec<(i64, &str, &str)> = letters
        .iter()
        .map(|letter| {
            (
                header(letter, dead_letter::SOURCE_OFFSET_HEADER)
                    .parse()
                    .unwrap_or(-1),
                header(letter, dead_letter::REASON_HEADER),
                header(letter, dead_letter::DETAIL_HEADER),
            )
        })
        .collect();
    reasons.sort_unstable();
    let expected = [
        (4, "invalid_field", "/auth/id"),
        (5, "missing_field", "at key"),
        (6, "event_id_conflict", "fingerprint"),
        (7, "field_too_long", "/auth/id"),
    ];
    assert_eq!(reasons.len(), expected.len(), "{reasons:?}");
    for ((offset, reason, detail), (want_offset, want_reason, names)) in
        reasons.iter().zip(expected)
    {
        assert_eq!((*offset, *reason), (want_offset, want_reason), "{detail}");
        assert!(detail.contains(names), "{reason}: {detail}");
    }

    // The replay proof through eosctl: the same transform with the processor's flags finds every
    // output and dead letter as committed; told another filter, it is another transform, and the
    // same outputs are no longer its own.
    let replay = |filter_equals: &str| -> anyhow::Result<(Option<i32>, serde_json::Value)> {
        let run = std::process::Command::new(workspace_binary("eosctl")?)
            .args(["audit", "--bootstrap-servers", &bootstrap, "--json"])
            .args(["--input", &input, "--output", &output, "--replay"])
            .args(["--transform", "pass-through", "--event-id", "/auth/id"])
            .args([
                "--filter-pointer",
                "/currency",
                "--filter-equals",
                filter_equals,
            ])
            .output()?;
        let report = serde_json::from_slice(&run.stdout)
            .with_context(|| format!("no JSON report: {}", String::from_utf8_lossy(&run.stderr)))?;
        Ok((run.status.code(), report))
    };
    let (code, report) = tokio::task::block_in_place(|| replay("EUR"))?;
    assert_eq!(code, Some(0), "{report:#}");
    assert_eq!(
        (
            &report["matched"],
            &report["applied"],
            &report["duplicates"],
            &report["dead_letters"]
        ),
        (&json!(2), &json!(3), &json!(2), &json!(4)),
        "{report:#}"
    );
    let (code, report) = tokio::task::block_in_place(|| replay("USD"))?;
    assert_eq!(code, Some(1), "{report:#}");
    assert_eq!(
        (&report["missing"], &report["unexpected"]),
        (&json!(1), &json!(2)),
        "{report:#}"
    );
    Ok(())
}

#[test]
fn an_unknown_transform_or_location_is_refused_at_start_up() -> anyhow::Result<()> {
    let binary = workspace_binary("eos-processor")?;
    for (flags, names) in [
        (&["--transform", "wasm:nothing.wasm"][..], "--transform"),
        (&["--event-id", "id"], "JSON pointer"),
        (&["--output", "flagged"], "NAME=TOPIC"),
    ] {
        let run = std::process::Command::new(&binary)
            .args(flags)
            .args(["--metrics-addr", "127.0.0.1:0"])
            .output()?;
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert_eq!(run.status.code(), Some(2), "{flags:?}: {stderr}");
        assert!(stderr.contains(names), "{flags:?}: {stderr}");
    }
    Ok(())
}

/// The general outbox: any JSON event enqueued with its own key and headers in the domain
/// transaction (`eos_outbox::enqueue_message`, i.e. `eos_outbox_enqueue_event`) is published by
/// the real outbox-relay as it is, once, next to a ledger-shaped row of the old function; a rolled
/// back transaction's event is never published.
#[tokio::test(flavor = "multi_thread")]
async fn the_outbox_publishes_any_json_event_as_it_is() -> anyhow::Result<()> {
    let db = integration_tests::TestDatabase::create().await?;
    eos_outbox::migrator().run(&db.pool).await?;
    let topic = unique_name("outbox-orders");
    create_topic(&topic, 3).await?;
    let order = |id: &str, key: &str, total: &str| eos_outbox::OutboxMessage {
        topic: topic.clone(),
        key: key.to_owned(),
        event_id: eos_core::EventId::new(id).expect("a valid id"),
        record: json!({"order_id": id, "customer": key, "total": total, "lines": [{"sku": "s-1"}]})
            .as_object()
            .cloned()
            .unwrap_or_default(),
        headers: vec![("schema".to_owned(), "orders.v1".to_owned())],
    };
    let mut tx = db.pool.begin().await?;
    for (id, key, total) in [("o-1", "cust-1", "12.50"), ("o-2", "cust-2", "3.00")] {
        eos_outbox::enqueue_message(&mut tx, &order(id, key, total)).await?;
    }
    // The ledger-shaped function keeps working beside it.
    eos_outbox::enqueue(
        &mut tx,
        &eos_outbox::OutboxEvent::new(
            &topic,
            eos_core::EventId::new("l-1")?,
            eos_core::EntityId::new("acct-1")?,
            500,
        ),
    )
    .await?;
    tx.commit().await?;
    let mut rolled_back = db.pool.begin().await?;
    eos_outbox::enqueue_message(&mut rolled_back, &order("o-3", "cust-3", "1.00")).await?;
    rolled_back.rollback().await?;
    // The same event id twice is refused, whatever its shape.
    let mut again = db.pool.begin().await?;
    let duplicate = eos_outbox::enqueue_message(&mut again, &order("o-1", "cust-1", "12.50")).await;
    assert!(
        matches!(duplicate, Err(eos_outbox::OutboxError::DuplicateEvent(_))),
        "{duplicate:?}"
    );
    again.rollback().await?;

    let relay_name = unique_name("orders-relay");
    let bootstrap = bootstrap_servers();
    let args = argv!(outbox_relay::Config {
        kafka.bootstrap_servers: &bootstrap,
        database[database_url]: &db.url,
        relay_name: &relay_name,
        positions_topic: unique_name("orders-positions"),
        metrics_addr: "127.0.0.1:0",
        poll_interval: "200ms",
    });
    let mut relay = ServiceProcess::spawn("outbox-relay", &args, &[])?;
    // Watched on the topic itself: what the relay records in PostgreSQL is its position in
    // xmin mode and only a purge bound in logical mode (docs/outbox.md).
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let records = loop {
        let records = tokio::task::block_in_place(|| read_topic(&topic, Isolation::ReadCommitted))?;
        if records.len() >= 3 {
            break records;
        }
        anyhow::ensure!(
            std::time::Instant::now() < deadline && relay.is_running(),
            "the relay did not publish the three rows (the topic has {})\n{}",
            records.len(),
            relay.log_tail(30)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    relay.stop_gracefully()?;

    let mut published: Vec<(String, String, String, Value)> = records
        .iter()
        .map(|message| {
            (
                header(message, "event_id").to_owned(),
                String::from_utf8_lossy(message.key().unwrap_or_default()).into_owned(),
                header(message, "schema").to_owned(),
                serde_json::from_slice(message.payload().unwrap_or_default())
                    .unwrap_or(Value::Null),
            )
        })
        .collect();
    published.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(published.len(), 3, "{published:?}");
    assert_eq!(
        published[0].3,
        Value::Object(
            eos_core::EventEnvelope::parse(
                br#"{"event_id":"l-1","entity_id":"acct-1","value":500}"#
            )?
            .to_json()
        ),
        "the ledger row is still its envelope"
    );
    for (index, (id, key, total)) in [
        (1, ("o-1", "cust-1", "12.50")),
        (2, ("o-2", "cust-2", "3.00")),
    ] {
        assert_eq!(
            published[index],
            (
                id.to_owned(),
                key.to_owned(),
                "orders.v1".to_owned(),
                Value::Object(order(id, key, total).record)
            )
        );
    }
    db.drop_database().await
}
