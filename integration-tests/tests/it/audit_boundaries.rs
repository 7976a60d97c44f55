//! `eosctl audit` across every boundary: a pipeline built by hand on the real broker, the real
//! sink-writer filling a fresh database from its output, and charges at a real provider-sim. The
//! exact result must pass with the figures of what was written; one deleted row, one planted row
//! and one charge for an unknown event must be reported as exactly those three violations. An event
//! the sink dead-lettered as refused by the provider must have no charge, and is reported when it
//! has one.

use std::collections::{BTreeSet, HashSet};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use eos_core::{EventEnvelope, dead_letter};
use eos_testkit::argv;
use integration_tests::eosctl::{self, AuditOutcome, Workload};
use integration_tests::service_process::ServiceProcess;
use integration_tests::{
    Isolation, TestDatabase, bootstrap_servers, create_topic, end_offsets, read_topic,
    transactional_producer, unique_name, workspace_binary,
};
use rdkafka::Message as _;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, Producer as _};
use serde_json::{Value, json};
use sqlx::PgPool;

use crate::provider_sim::ProviderSim;

const DRAIN_TIMEOUT: Duration = Duration::from_secs(120);
const PREFIX: &str = "payments:";
/// Charges posted twice, as a client retrying after a lost answer would.
const RETRIED: usize = 3;
/// The event the provider refused: not charged, and dead-lettered by the sink as such.
const REFUSED: usize = 7;

/// A logical event of the output topic.
#[derive(Debug, Clone)]
struct Event {
    event_id: String,
    entity_id: String,
    value: i64,
}

/// The processor's job done by hand, exactly: the first occurrence of each event id to `output`,
/// malformed records to `dlq` with their reason, in one transaction. Returns the output's events.
fn process_by_hand(input: &str, output: &str, dlq: &str) -> anyhow::Result<Vec<Event>> {
    let producer = transactional_producer(&unique_name("boundaries-txn"))?;
    producer.begin_transaction()?;
    let mut seen = HashSet::new();
    let mut events = Vec::new();
    for record in read_topic(input, Isolation::ReadCommitted)? {
        let (topic, headers, event) = match record.payload().map(EventEnvelope::parse) {
            Some(Ok(envelope)) => {
                if !seen.insert(envelope.event_id.to_string()) {
                    continue;
                }
                let event = Event {
                    event_id: envelope.event_id.to_string(),
                    entity_id: envelope.entity_id.to_string(),
                    value: envelope.value,
                };
                (output, OwnedHeaders::new(), Some(event))
            }
            failed => {
                let reason = match failed {
                    Some(Err(error)) => error.reason().as_str(),
                    _ => "empty_record",
                };
                let (partition, offset) =
                    (record.partition().to_string(), record.offset().to_string());
                let headers = [
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
                });
                (dlq, headers, None)
            }
        };
        let mut out = BaseRecord::to(topic).headers(headers);
        if let Some(key) = record.key() {
            out = out.key(key);
        }
        if let Some(payload) = record.payload() {
            out = out.payload(payload);
        }
        producer.send(out).map_err(|(error, _)| error)?;
        events.extend(event);
    }
    producer.commit_transaction(Duration::from_secs(30))?;
    Ok(events)
}

/// Runs the real sink-writer over `topic` until its Postgres checkpoint reaches the topic's end
/// (past the commit markers) in every partition that has records, then stops it.
async fn sink_until_drained(topic: &str, db: &TestDatabase) -> anyhow::Result<()> {
    let group = unique_name("boundaries-sink");
    let args = argv!(sink_writer::Config {
        topic: topic,
        group_id: &group,
        instance.instance_id: "audit",
        database[database_url]: &db.url,
        metrics_addr: "127.0.0.1:0",
    });
    let mut sink = ServiceProcess::spawn("sink-writer", &args, &[])?;
    let owned_topic = topic.to_owned();
    let ends = tokio::task::spawn_blocking(move || end_offsets(&owned_topic)).await??;
    let deadline = Instant::now() + DRAIN_TIMEOUT;
    loop {
        let stored = checkpoints(&db.pool, &group, topic).await;
        let drained = ends
            .iter()
            .filter(|(_, end)| *end > 0)
            .all(|(partition, end)| stored.contains(&(*partition, *end)));
        if drained {
            break;
        }
        anyhow::ensure!(
            sink.is_running() && Instant::now() < deadline,
            "sink-writer did not drain {topic} (ends {ends:?}, checkpoints {stored:?})\n{}",
            sink.log_tail(40)
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let status = sink.terminate(Duration::from_secs(30))?;
    anyhow::ensure!(
        status.success(),
        "sink-writer exited {status}\n{}",
        sink.log_tail(20)
    );
    Ok(())
}

async fn checkpoints(pool: &PgPool, group: &str, topic: &str) -> Vec<(i32, i64)> {
    // Before its first batch the sink may not have created the table yet: no checkpoints then.
    sqlx::query_as(
        "SELECT partition, next_offset FROM sink_checkpoints \
         WHERE sink = $1 AND topic = $2 AND next_offset IS NOT NULL",
    )
    .bind(group)
    .bind(topic)
    .fetch_all(pool)
    .await
    .unwrap_or_default()
}

async fn charge(provider: &ProviderSim, key: &str, amount: i64) -> anyhow::Result<()> {
    let status = reqwest::Client::new()
        .post(format!("{}/charges", provider.url))
        .header("Idempotency-Key", key)
        .json(&json!({"amount": amount}))
        .send()
        .await?
        .status();
    anyhow::ensure!(status.is_success(), "POST /charges {key}: {status}");
    Ok(())
}

/// The real `eosctl audit --json` across every boundary: (exit status, report or stderr).
fn audit(
    input: &str,
    output: &str,
    database_url: &str,
    provider_url: &str,
    extra: &[&str],
) -> anyhow::Result<(i32, String, Option<AuditOutcome>)> {
    let result = Command::new(workspace_binary("eosctl")?)
        .args([
            "audit",
            "--input",
            input,
            "--output",
            output,
            "--database-url",
            database_url,
            "--provider-url",
            provider_url,
            "--bootstrap-servers",
            &bootstrap_servers(),
            "--json",
        ])
        .args(extra)
        .output()?;
    let exit_code = result.status.code().unwrap_or(-1);
    let stderr = String::from_utf8_lossy(&result.stderr).into_owned();
    let report = serde_json::from_slice::<Value>(&result.stdout)
        .ok()
        .map(|report| AuditOutcome { exit_code, report });
    Ok((exit_code, stderr, report))
}

/// Every violation kind with a non-zero count, by name.
fn reported(outcome: &AuditOutcome) -> anyhow::Result<Vec<(String, i64)>> {
    let mut reported: Vec<(String, i64)> = outcome.report["violations"]
        .as_object()
        .context("violations is an object")?
        .iter()
        .map(|(kind, detail)| (kind.clone(), detail["count"].as_i64().unwrap_or(-1)))
        .filter(|(_, count)| *count != 0)
        .collect();
    reported.sort();
    Ok(reported)
}

#[tokio::test(flavor = "multi_thread")]
async fn audit_boundaries_pass_exact_and_report_a_missing_row_a_planted_row_and_an_unknown_effect()
-> anyhow::Result<()> {
    let input = unique_name("boundaries-in");
    let output = unique_name("boundaries-out");
    let dlq = format!("{input}.dlq");
    create_topic(&output, 3).await?;
    create_topic(&dlq, 1).await?;
    let (input_c, output_c, dlq_c) = (input.clone(), output.clone(), dlq.clone());
    let events = tokio::task::spawn_blocking(move || -> anyhow::Result<Vec<Event>> {
        let workload = Workload {
            duplicate_ratio: 0.05,
            bad_ratio: 0.02,
            conflict_ratio: 0.0,
            ..Workload::chaos(200, 67)
        };
        eosctl::produce(&input_c, &workload)?;
        process_by_hand(&input_c, &output_c, &dlq_c)
    })
    .await??;
    assert_eq!(events.len(), 200);
    let sum: i64 = events.iter().map(|event| event.value).sum();
    let entities: BTreeSet<&str> = events.iter().map(|e| e.entity_id.as_str()).collect();

    let db = TestDatabase::create().await?;
    sink_until_drained(&output, &db).await?;
    let provider = ProviderSim::spawn(&[])?;
    for event in events
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != REFUSED)
        .map(|(_, e)| e)
    {
        charge(
            &provider,
            &format!("{PREFIX}{}", event.event_id),
            event.value,
        )
        .await?;
    }
    for event in &events[..RETRIED] {
        charge(
            &provider,
            &format!("{PREFIX}{}", event.event_id),
            event.value,
        )
        .await?;
    }
    // Another pipeline's charge on the same provider: outside the prefix, not audited.
    charge(&provider, "refunds:r-1", 5).await?;
    // The refusal as the sink records it: a dead letter at the event's output position.
    let refused = &events[REFUSED].event_id;
    let (output_c, refused_c) = (output.clone(), refused.clone());
    let position = tokio::task::spawn_blocking(move || -> anyhow::Result<(i32, i64)> {
        read_topic(&output_c, Isolation::ReadCommitted)?
            .iter()
            .find(|record| {
                record
                    .payload()
                    .and_then(|bytes| EventEnvelope::parse(bytes).ok())
                    .is_some_and(|envelope| envelope.event_id.as_str() == refused_c)
            })
            .map(|record| (record.partition(), record.offset()))
            .context("the refused event is in the output")
    })
    .await??;
    sqlx::query(
        "INSERT INTO sink_dead_letters (sink, source_topic, source_partition, source_offset, \
         reason, detail, dlq_topic) VALUES ('audit-test', $1, $2, $3, 'provider_rejected', \
         'provider answered 402', 'unused')",
    )
    .bind(&output)
    .bind(position.0)
    .bind(position.1)
    .execute(&db.pool)
    .await?;

    let (exit, stderr, exact) = audit(&input, &output, &db.url, &provider.url, &[])?;
    let exact = exact.with_context(|| format!("no JSON report (exit {exit}): {stderr}"))?;
    assert_eq!(exit, 0, "{}", exact.failures());
    assert!(exact.passed());
    assert_eq!(exact.figure("postgres_rows"), 200);
    assert_eq!(exact.figure("postgres_sum"), sum);
    // The workload versions every event, so each entity has its latest state.
    assert_eq!(exact.figure("entity_states"), entities.len() as i64);
    assert_eq!(exact.figure("provider_effects"), 199);
    assert_eq!(exact.figure("provider_sum"), sum - events[REFUSED].value);
    assert_eq!(exact.figure("provider_refused"), 1);
    assert_eq!(exact.figure("provider_retries_absorbed"), RETRIED as i64);
    for kind in [
        "missing_row",
        "stale_state",
        "missing_effect",
        "unexpected_effect",
        "refused_but_applied",
    ] {
        assert_eq!(exact.violations(kind), 0, "{kind} is reported, at 0");
    }

    // A table that does not exist cannot be audited: exit 2, naming it.
    let (exit, stderr, _) = audit(
        &input,
        &output,
        &db.url,
        &provider.url,
        &["--state-table", "no_such_state"],
    )?;
    assert_eq!(exit, 2, "{stderr}");
    assert!(stderr.contains("no_such_state"), "{stderr}");

    let deleted = &events[42].event_id;
    sqlx::query("DELETE FROM event_sink WHERE event_id = $1")
        .bind(deleted)
        .execute(&db.pool)
        .await?;
    let planted = unique_name("planted");
    sqlx::query(
        "INSERT INTO event_sink (event_id, entity_id, value, fingerprint, source_topic, \
         source_partition, source_offset) VALUES ($1, 'ent-0', 0, 'planted', $2, 0, 999999)",
    )
    .bind(&planted)
    .bind(&output)
    .execute(&db.pool)
    .await?;
    let unknown = format!("{PREFIX}{}", unique_name("unknown"));
    charge(&provider, &unknown, 1).await?;
    // The refused event charged after all: the sink's dead letter says it was not.
    charge(
        &provider,
        &format!("{PREFIX}{refused}"),
        events[REFUSED].value,
    )
    .await?;

    let (exit, stderr, broken) = audit(&input, &output, &db.url, &provider.url, &[])?;
    let broken = broken.with_context(|| format!("no JSON report (exit {exit}): {stderr}"))?;
    assert_eq!(exit, 1, "a violation is exit status 1: {stderr}");
    assert_eq!(
        reported(&broken)?,
        [
            ("missing_row", 1),
            ("refused_but_applied", 1),
            ("unexpected_effect", 1),
            ("unexpected_row", 1)
        ]
        .map(|(kind, count)| (kind.to_owned(), count))
        .to_vec(),
        "{}",
        broken.failures()
    );
    let examples = |kind: &str| broken.report["violations"][kind]["examples"].clone();
    assert_eq!(examples("missing_row"), json!([deleted]));
    assert_eq!(examples("unexpected_row"), json!([planted]));
    assert_eq!(examples("unexpected_effect"), json!([unknown]));
    assert_eq!(examples("refused_but_applied"), json!([refused]));
    assert_eq!(broken.figure("postgres_sum"), sum - events[42].value);
    assert_eq!(broken.figure("provider_effects"), 201);

    drop(provider);
    db.drop_database().await
}
