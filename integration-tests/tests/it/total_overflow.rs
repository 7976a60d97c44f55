//! A running total at the edge of i64 through the real eos-processor: an event that would take
//! its entity's total past a signed 64-bit integer is a `total_overflow` dead letter and leaves the
//! total as it was; the refusal is the event's final outcome, so its re-deliveries are duplicates
//! even once a refund has made room (docs/TRANSFORMS.md "An event's outcome is final"); and
//! `eosctl audit`, which replays the totals in processing order, finds the result exact
//! (docs/bad-input.md "Bad input").

use eos_testkit::argv;
use std::time::Duration;

use anyhow::Context as _;
use eos_core::dead_letter;
use integration_tests::service_process::ServiceProcess;
use integration_tests::{
    Isolation, bootstrap_servers, create_topic, eosctl, produce_records, read_topic, unique_name,
    wait_until_consumed,
};
use rdkafka::Message as _;
use rdkafka::message::Headers as _;
use serde_json::{Value, json};

fn event(event_id: &str, entity_id: &str, value: i64) -> (Option<String>, Vec<u8>) {
    (
        Some(entity_id.to_owned()),
        json!({"event_id": event_id, "entity_id": entity_id, "value": value})
            .to_string()
            .into_bytes(),
    )
}

fn reason(letter: &rdkafka::message::OwnedMessage) -> String {
    letter
        .headers()
        .and_then(|headers| {
            headers
                .iter()
                .filter(|header| header.key == dead_letter::REASON_HEADER)
                .last()
                .and_then(|header| header.value)
        })
        .map(|value| String::from_utf8_lossy(value).into_owned())
        .unwrap_or_default()
}

#[test]
fn total_overflow_is_dead_lettered_where_it_overflows_and_audited_exact() -> anyhow::Result<()> {
    let runtime = tokio::runtime::Runtime::new()?;
    let (input, output, group) = (
        unique_name("overflow-payments"),
        unique_name("overflow-ledger"),
        unique_name("overflow-processor"),
    );
    runtime.block_on(create_topic(&input, 1))?;
    let dlq = format!("{input}.dlq");
    produce_records(
        &input,
        &[
            event("e-a", "big", i64::MAX - 10),
            event("e-b", "big", 100), // overflows
            event("e-c", "big", -200),
            event("e-b", "big", 100), // the same event again: it would fit, but was refused
            event("e-b", "big", 100), // and again
            event("e-d", "big", 500), // overflows
            event("e-n1", "neg", i64::MIN + 5),
            event("e-n2", "neg", -10), // overflows downwards
            event("e-s", "small", 1),
        ],
    )?;

    let bootstrap = bootstrap_servers();
    let args = argv!(eos_processor::Config {
        kafka.bootstrap_servers: &bootstrap,
        input_topic: &input,
        output_topic: &output,
        group_id: &group,
        instance.instance_id: "overflow",
        metrics_addr: "127.0.0.1:0",
    });
    let mut processor = ServiceProcess::spawn("eos-processor", &args, &[])?;
    wait_until_consumed(&bootstrap, &group, &input, Duration::from_secs(120))
        .with_context(|| processor.log_tail(40))?;
    processor.stop_gracefully()?;

    let letters = read_topic(&dlq, Isolation::ReadCommitted)?;
    // The dead-letter topic may have several partitions: compare as a set.
    let mut dead: Vec<(String, String)> = letters
        .iter()
        .map(|letter| {
            let value: Value =
                serde_json::from_slice(letter.payload().unwrap_or_default()).unwrap_or_default();
            (
                value["event_id"].as_str().unwrap_or_default().to_owned(),
                reason(letter),
            )
        })
        .collect();
    dead.sort();
    let overflow = || "total_overflow".to_owned();
    assert_eq!(
        dead,
        vec![
            ("e-b".to_owned(), overflow()),
            ("e-d".to_owned(), overflow()),
            ("e-n2".to_owned(), overflow()),
        ]
    );
    // The totals were left as they were: big's last output is e-c's, at MAX - 10 - 200, and the
    // refused e-b has none.
    let outputs = read_topic(&output, Isolation::ReadCommitted)?;
    let last_big = outputs
        .iter()
        .filter_map(|record| serde_json::from_slice::<Value>(record.payload()?).ok())
        .rfind(|value| value["entity_id"] == "big")
        .context("no output for entity big")?;
    assert_eq!(last_big["event_id"], "e-c");
    assert_eq!(last_big["entity_total"], i64::MAX - 210);
    assert_eq!(last_big["entity_count"], 2);

    let audit = eosctl::audit(&input, &output, &dlq)?;
    assert!(audit.passed(), "audit not exact:\n{}", audit.failures());
    assert_eq!(audit.figure("total_overflows"), 3);
    assert_eq!(audit.figure("logical_events"), 7);
    assert_eq!(audit.figure("output_records"), 4);
    assert_eq!(audit.figure("duplicate_deliveries"), 2);
    assert_eq!(audit.violations("overflow_missing_from_dlq"), 0);
    assert_eq!(audit.violations("valid_event_in_dlq"), 0);
    assert_eq!(audit.violations("two_outcomes"), 0);
    Ok(())
}
