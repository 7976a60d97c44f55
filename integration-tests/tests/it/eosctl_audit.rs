//! `eosctl audit` against hand-made topics: it must name exactly the violations planted.

use std::collections::HashSet;
use std::time::Duration;

use anyhow::Context as _;
use eos_core::{EventEnvelope, dead_letter};
use integration_tests::eosctl::{self, Workload};
use integration_tests::{Isolation, TestProducer, client_config, read_topic, unique_name};
use rdkafka::Message as _;
use rdkafka::message::{Header, OwnedHeaders, OwnedMessage};
use rdkafka::producer::{BaseRecord, Producer as _};

fn copy_to(
    producer: &TestProducer,
    topic: &str,
    record: &OwnedMessage,
    headers: OwnedHeaders,
) -> anyhow::Result<()> {
    let mut out = BaseRecord::to(topic).headers(headers);
    if let Some(key) = record.key() {
        out = out.key(key);
    }
    if let Some(payload) = record.payload() {
        out = out.payload(payload);
    }
    producer.send(out).map_err(|(error, _)| error)?;
    Ok(())
}

fn dead_letter_headers(record: &OwnedMessage, reason: &str) -> OwnedHeaders {
    let partition = record.partition().to_string();
    let offset = record.offset().to_string();
    [
        (dead_letter::REASON_HEADER, reason),
        (dead_letter::SOURCE_TOPIC_HEADER, record.topic()),
        (dead_letter::SOURCE_PARTITION_HEADER, partition.as_str()),
        (dead_letter::SOURCE_OFFSET_HEADER, offset.as_str()),
    ]
    .into_iter()
    .fold(OwnedHeaders::new(), |headers, (key, value)| {
        headers.insert(Header {
            key,
            value: Some(value.as_bytes()),
        })
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn audit_reports_exactly_the_planted_missing_duplicated_and_misrouted_events()
-> anyhow::Result<()> {
    let input = unique_name("audit-in");
    let output = unique_name("audit-out");
    let dlq = format!("{input}.dlq");
    let (input_c, output_c, dlq_c) = (input.clone(), output.clone(), dlq.clone());
    let (missing, duplicated, misrouted) =
        tokio::task::spawn_blocking(move || -> anyhow::Result<(String, String, String)> {
            let workload = Workload {
                duplicate_ratio: 0.05,
                bad_ratio: 0.02,
                conflict_ratio: 0.0,
                ..Workload::chaos(500, 61)
            };
            let summary = eosctl::produce(&input_c, &workload)?;
            assert_eq!(summary["logical_events"], 500);

            // A correct "pipeline" by hand: first occurrences to the output, bad records to the DLQ...
            let producer: TestProducer = client_config().create()?;
            let mut seen = HashSet::new();
            let mut first_occurrences = Vec::new();
            for record in read_topic(&input_c, Isolation::ReadCommitted)? {
                match record.payload().map(EventEnvelope::parse) {
                    Some(Ok(envelope)) => {
                        if seen.insert(envelope.event_id.to_string()) {
                            first_occurrences.push((envelope.event_id.to_string(), record));
                        }
                    }
                    Some(Err(error)) => copy_to(
                        &producer,
                        &dlq_c,
                        &record,
                        dead_letter_headers(&record, error.reason().as_str()),
                    )?,
                    None => copy_to(
                        &producer,
                        &dlq_c,
                        &record,
                        dead_letter_headers(&record, "empty_record"),
                    )?,
                }
            }
            // ...except for three planted mistakes.
            let (missing, _) = first_occurrences.remove(10);
            let (misrouted, misrouted_record) = first_occurrences.remove(20);
            copy_to(
                &producer,
                &dlq_c,
                &misrouted_record,
                dead_letter_headers(&misrouted_record, "invalid_field"),
            )?;
            let duplicated = first_occurrences[30].0.clone();
            for (event_id, record) in &first_occurrences {
                copy_to(&producer, &output_c, record, OwnedHeaders::new())?;
                if *event_id == duplicated {
                    copy_to(&producer, &output_c, record, OwnedHeaders::new())?;
                }
            }
            producer.flush(Duration::from_secs(30))?;
            Ok((missing, duplicated, misrouted))
        })
        .await??;

    let outcome = eosctl::audit(&input, &output, &dlq).context("running the audit")?;
    assert_eq!(outcome.exit_code, 1, "a violation is exit status 1");
    assert!(!outcome.passed());
    let examples = |kind: &str| outcome.report["violations"][kind]["examples"].to_string();
    assert_eq!(
        outcome.violations("missing_output"),
        1,
        "{}",
        outcome.failures()
    );
    assert!(
        examples("missing_output").contains(&missing),
        "{}",
        examples("missing_output")
    );
    assert_eq!(
        outcome.violations("duplicated_output"),
        1,
        "{}",
        outcome.failures()
    );
    assert!(examples("duplicated_output").contains(&duplicated));
    assert_eq!(
        outcome.violations("valid_event_in_dlq"),
        1,
        "{}",
        outcome.failures()
    );
    assert!(examples("valid_event_in_dlq").contains(&misrouted));
    // Nothing else is reported: the bad records were dead-lettered correctly.
    let others: i64 = outcome.report["violations"]
        .as_object()
        .context("violations is an object")?
        .iter()
        .filter(|(kind, _)| {
            !["missing_output", "duplicated_output", "valid_event_in_dlq"].contains(&kind.as_str())
        })
        .map(|(_, v)| v["count"].as_i64().unwrap_or(0))
        .sum();
    assert_eq!(others, 0, "{}", outcome.failures());
    Ok(())
}
