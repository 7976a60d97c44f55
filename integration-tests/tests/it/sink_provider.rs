//! The sink-writer's provider target end to end (docs/ARCHITECTURE.md "Boundaries": sink-writer
//! → provider, an outcome that can be lost after the effect): real sink-writer, dedup-service and provider-sim
//! processes, real Kafka and PostgreSQL. The provider applies every charge it receives, then loses
//! a fifth of the answers (dropped, 5xx, or later than the caller's deadline), and the sink is
//! SIGKILLed mid-run. The audit is the provider's own effect list: exactly one effect per operation
//! id.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::time::{Duration, Instant};

use anyhow::ensure;
use integration_tests::eosctl::{self, Workload};
use integration_tests::{Isolation, TestDatabase, read_topic, unique_name};
use rdkafka::Message as _;
use serde_json::Value;

use crate::dedup_service::Dedup;
use crate::provider_sim::ProviderSim;
use crate::sink_writer::{Sink, TopicTruth};

const EVENTS: u64 = 5_000;
const SINK_KILLS: usize = 3;

/// 10% of answers dropped after applying, 5% answered 500 after applying, 5% answered after the
/// sink's 1 s deadline (but applied at once).
const FAULTS: [&str; 10] = [
    "--seed",
    "5",
    "--drop-response-after-apply-probability",
    "0.10",
    "--error-after-apply-probability",
    "0.05",
    "--delay-after-apply",
    "3s",
    "--delay-after-apply-probability",
    "0.05",
];

pub(crate) fn targets_file(
    dir: &std::path::Path,
    name: &str,
    dedup: &str,
    provider: &str,
) -> anyhow::Result<String> {
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(
        &path,
        format!(
            "[[targets]]\nkind = \"provider\"\nname = \"{name}\"\ndedup_url = \"{dedup}\"\n\
             provider_url = \"{provider}\"\ncall_timeout = \"1s\"\nlease_ttl = \"10s\"\n"
        ),
    )?;
    Ok(path.display().to_string())
}

/// (key → (amount, attempts)) of the provider's effects whose key starts with `prefix`; a key
/// listed twice is kept twice, so a double charge shows.
pub(crate) async fn effects(
    sim: &ProviderSim,
    prefix: &str,
) -> anyhow::Result<Vec<(String, i64, u64)>> {
    effects_at(&reqwest::Client::new(), &sim.url, prefix).await
}

/// [`effects`] of the provider at `base_url`, asked with `client` (e.g. one trusting a test CA).
pub(crate) async fn effects_at(
    client: &reqwest::Client,
    base_url: &str,
    prefix: &str,
) -> anyhow::Result<Vec<(String, i64, u64)>> {
    let body: Value = client
        .get(format!("{base_url}/effects"))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    Ok(body["effects"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .filter_map(|e| {
            let key = e["key"].as_str()?;
            key.starts_with(prefix).then(|| {
                (
                    key.to_owned(),
                    e["amount"].as_i64().unwrap_or_default(),
                    e["attempts"].as_u64().unwrap_or_default(),
                )
            })
        })
        .collect())
}

/// Produces `workload` to `topic` while the sink runs with `config`: `kills` instances are
/// SIGKILLed 1.5 s into their run, then a last one drains the topic and is stopped gracefully.
pub(crate) async fn sink_through_kills(
    sink: &Sink,
    topic: &str,
    config: &str,
    workload: Workload,
    kills: usize,
    pool: &sqlx::PgPool,
) -> anyhow::Result<()> {
    let producer = {
        let topic = topic.to_owned();
        std::thread::spawn(move || eosctl::produce(&topic, &workload))
    };
    let args = ["--config", config];
    for _ in 0..kills {
        let mut process = sink.spawn("provider", &args, &[])?;
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        let status = process.kill_hard()?;
        ensure!(status.code().is_none(), "killed by a signal: {status}");
    }
    let mut last = sink.spawn("provider", &args, &[])?;
    tokio::task::spawn_blocking(move || producer.join())
        .await?
        .map_err(|_| anyhow::anyhow!("producer thread panicked"))??;
    sink.wait_drained(pool, &mut last).await?;
    last.stop_gracefully()
}

#[tokio::test(flavor = "multi_thread")]
async fn sink_provider_target_charges_each_event_once_through_lost_answers_and_sigkills()
-> anyhow::Result<()> {
    charges_each_event_once_through_lost_answers(None, EVENTS, SINK_KILLS).await
}

/// The same with dedup-service's `replay` strategy for the target (issue 53): an UNKNOWN is
/// never looked up; after the in-flight window the sink sends the same request with the same key
/// again, and provider-sim (Stripe's idempotency contract) answers the first result, so still
/// one effect per event, and every reconciliation says it was a replay. Slower to drain than a
/// look-up: a replay waits for the attempt's lease (3 s here) and the in-flight window (3 s).
#[tokio::test(flavor = "multi_thread")]
async fn the_replay_strategy_settles_lost_answers_by_sending_the_same_request_again()
-> anyhow::Result<()> {
    charges_each_event_once_through_lost_answers(Some("replay"), 1_000, 1).await
}

/// `events` through provider-sim losing a fifth of its answers, the sink SIGKILLed `kills`
/// times, the target reconciled by `strategy` (dedup-service's default, lookup, when `None`).
async fn charges_each_event_once_through_lost_answers(
    strategy: Option<&str>,
    events: u64,
    kills: usize,
) -> anyhow::Result<()> {
    let db = TestDatabase::create().await?;
    let sim = ProviderSim::spawn(&FAULTS)?;
    let name = unique_name("pay").replace('-', "_");
    let mut dedup_args = vec![
        "--provider-url".to_owned(),
        sim.url.clone(),
        "--reconcile-interval".to_owned(),
        "200ms".to_owned(),
        "--in-flight-window".to_owned(),
        "3s".to_owned(),
    ];
    if let Some(strategy) = strategy {
        dedup_args.extend([
            "--reconcile-strategy".to_owned(),
            format!("{name}={strategy}"),
            // provider-sim keeps its keys for as long as it runs: longer than any replay.
            "--key-ttl".to_owned(),
            format!("{name}=30d"),
        ]);
    }
    let dedup_args: Vec<&str> = dedup_args.iter().map(String::as_str).collect();
    let dedup = Dedup::spawn(&db, &dedup_args)?;
    let dir = std::env::temp_dir().join(unique_name("sink-provider"));
    std::fs::create_dir_all(&dir)?;
    let config = targets_file(&dir, &name, &dedup.endpoint(), &sim.url)?;
    if strategy == Some("replay") {
        // A replay waits for the attempt's lease to end: a shorter one drains sooner.
        let text = std::fs::read_to_string(&config)?;
        std::fs::write(
            &config,
            text.replace("lease_ttl = \"10s\"", "lease_ttl = \"3s\""),
        )?;
    }

    let topic = unique_name("sink-provider");
    let sink = Sink::new(&topic, &db.url);
    let workload = Workload {
        rate: 1_000,
        ..Workload::chaos(events, 77)
    };
    let started = Instant::now();
    sink_through_kills(&sink, &topic, &config, workload, kills, &db.pool).await?;
    eprintln!(
        "provider target ({strategy:?}): {kills} SIGKILLs, drained in {:?}",
        started.elapsed()
    );

    let truth = TopicTruth::read(&topic)?;
    ensure!(
        truth.logical.len() as u64 == events,
        "{} logical events",
        truth.logical.len()
    );
    let prefix = format!("{name}:");
    let effects = effects(&sim, &prefix).await?;

    // Exactly one effect per operation id, for exactly the logical events, with their amounts.
    let mut per_key: BTreeMap<&str, usize> = BTreeMap::new();
    for (key, _, _) in &effects {
        *per_key.entry(key).or_default() += 1;
    }
    let charged_twice: Vec<_> = per_key.iter().filter(|(_, n)| **n > 1).collect();
    assert!(charged_twice.is_empty(), "charged twice: {charged_twice:?}");
    let expected: HashSet<String> = truth
        .logical
        .keys()
        .map(|id| format!("{prefix}{id}"))
        .collect();
    let got: HashSet<String> = per_key.keys().map(|k| (*k).to_owned()).collect();
    let missing: Vec<_> = expected.difference(&got).take(5).collect();
    let unexpected: Vec<_> = got.difference(&expected).take(5).collect();
    assert!(
        missing.is_empty() && unexpected.is_empty(),
        "missing {missing:?}, unexpected {unexpected:?}"
    );
    for (key, amount, _) in &effects {
        let event_id = &key[prefix.len()..];
        assert_eq!(
            Some(*amount),
            truth.logical.get(event_id).map(|(v, _)| *v),
            "{key}"
        );
    }
    let retries_absorbed: u64 = effects.iter().map(|(_, _, attempts)| attempts - 1).sum();

    // Every ambiguous answer became UNKNOWN, and the reconciler settled every one of them.
    let unknowns: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM dedup_intent_history WHERE to_state = 'UNKNOWN' AND operation_id LIKE $1",
    )
    .bind(format!("{prefix}%"))
    .fetch_one(&db.pool)
    .await?;
    let reconciled: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM dedup_intent_history WHERE from_state = 'UNKNOWN' AND operation_id LIKE $1",
    )
    .bind(format!("{prefix}%"))
    .fetch_one(&db.pool)
    .await?;
    let states: Vec<(String, i64)> = sqlx::query_as(
        "SELECT state, count(*) FROM dedup_intents WHERE operation_id LIKE $1 GROUP BY state",
    )
    .bind(format!("{prefix}%"))
    .fetch_all(&db.pool)
    .await?;
    eprintln!(
        "provider target: {} effects, {unknowns} UNKNOWN, {reconciled} reconciled, \
         {retries_absorbed} repeated POSTs absorbed by the key, intents {states:?}",
        effects.len()
    );
    assert!(
        unknowns as u64 >= events / 10,
        "the faults must bite: only {unknowns} UNKNOWN outcomes"
    );
    assert_eq!(
        reconciled, unknowns,
        "every UNKNOWN settled by the reconciler"
    );
    assert_eq!(states, vec![("SUCCEEDED".to_owned(), events as i64)]);
    if strategy == Some("replay") {
        let replayed: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM dedup_intent_history WHERE from_state = 'UNKNOWN' \
             AND operation_id LIKE $1 AND detail LIKE '%reconcile strategy replay%'",
        )
        .bind(format!("{prefix}%"))
        .fetch_one(&db.pool)
        .await?;
        assert_eq!(
            replayed, reconciled,
            "every UNKNOWN settled by a replay, none by a look-up"
        );
        // A lost answer's replay reaches provider-sim as a repeated key (absorbed); an
        // attempt killed before its call is replayed as its first POST.
        assert!(
            retries_absorbed > 0,
            "the replays of lost answers reached the provider as repeated keys"
        );
    }
    assert!(dedup.client()?.list_unknown(100).await?.is_empty());

    // The reused ids with other content are conflicts, not second charges.
    let conflicts: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM sink_conflicts WHERE sink = $1 AND target = $2 AND reason = 'operation_conflict'",
    )
    .bind(&sink.group)
    .bind(&name)
    .fetch_one(&db.pool)
    .await?;
    assert_eq!(conflicts as usize, truth.conflicts.len());
    assert!(conflicts > 0, "the workload reuses ids");

    drop(dedup);
    std::fs::remove_dir_all(&dir)?;
    db.drop_database().await
}

/// The provider's final "no" (the other outcome besides success): provider-sim declines
/// every charge above a limit with a 402, applying nothing. Each such event's intent ends FAILED
/// and not retryable, and every record of it is accounted for by a `provider_rejected` dead
/// letter — re-deliveries too, and records replayed after a SIGKILL — while every other event is
/// charged exactly once.
#[tokio::test(flavor = "multi_thread")]
async fn sink_provider_declined_charges_are_dead_lettered_never_applied() -> anyhow::Result<()> {
    const DECLINE_EVENTS: u64 = 600;
    let db = TestDatabase::create().await?;
    let topic = unique_name("sink-declined");
    let workload = Workload {
        rate: 300,
        ..Workload::chaos(DECLINE_EVENTS, 79)
    };
    // Values of the chaos workload are amounts of either sign: decline the upper part of them.
    let limit = 50_000;
    let sim = ProviderSim::spawn(&["--decline-amounts-above", &limit.to_string()])?;
    let dedup = Dedup::spawn(&db, &["--provider-url", &sim.url])?;
    let name = unique_name("decl").replace('-', "_");
    let dir = std::env::temp_dir().join(unique_name("sink-declined"));
    std::fs::create_dir_all(&dir)?;
    let config = targets_file(&dir, &name, &dedup.endpoint(), &sim.url)?;
    let sink = Sink::new(&topic, &db.url);
    sink_through_kills(&sink, &topic, &config, workload, 1, &db.pool).await?;

    // What the topic says: the declined events, and every record carrying one with its first
    // content (a reused id with other content is a conflict instead).
    let mut first_fingerprint: BTreeMap<String, (i64, String)> = BTreeMap::new();
    let mut records: Vec<((i32, i64), String, String)> = Vec::new();
    for message in read_topic(&topic, Isolation::ReadCommitted)? {
        let Ok(event) = sink_writer::mapping::decode_value(
            message.payload(),
            &sink_writer::mapping::EventFormat::ledger(),
        ) else {
            continue;
        };
        let event_id = event.event_id.to_string();
        let fingerprint = event.fingerprint.to_hex();
        first_fingerprint.entry(event_id.clone()).or_insert((
            event.raw["value"].as_i64().unwrap_or_default(),
            fingerprint.clone(),
        ));
        records.push((
            (message.partition(), message.offset()),
            event_id,
            fingerprint,
        ));
    }
    let declined: BTreeSet<&str> = first_fingerprint
        .iter()
        .filter(|(_, (value, _))| *value > limit)
        .map(|(id, _)| id.as_str())
        .collect();
    let declined_records: BTreeSet<(i32, i64)> = records
        .iter()
        .filter(|(_, id, fingerprint)| {
            declined.contains(id.as_str()) && first_fingerprint[id].1 == *fingerprint
        })
        .map(|(position, _, _)| *position)
        .collect();
    ensure!(
        !declined.is_empty() && declined.len() < first_fingerprint.len(),
        "the limit must split the workload: {} of {} declined",
        declined.len(),
        first_fingerprint.len()
    );

    // Charged: exactly the others, once each. Declined: nothing applied.
    let prefix = format!("{name}:");
    let effects = effects(&sim, &prefix).await?;
    let charged: BTreeSet<&str> = effects.iter().map(|(k, _, _)| &k[prefix.len()..]).collect();
    assert_eq!(charged.len(), effects.len(), "no operation charged twice");
    let expected_charged: BTreeSet<&str> = first_fingerprint
        .keys()
        .map(String::as_str)
        .filter(|id| !declined.contains(id))
        .collect();
    assert_eq!(charged, expected_charged);

    // Each declined event's intent is FAILED for good; each charged one SUCCEEDED.
    let failed: Vec<(String, bool, Option<String>)> = sqlx::query_as(
        "SELECT operation_id, retryable, failure_reason FROM dedup_intents \
         WHERE operation_id LIKE $1 AND state = 'FAILED' ORDER BY operation_id",
    )
    .bind(format!("{prefix}%"))
    .fetch_all(&db.pool)
    .await?;
    let failed_ids: BTreeSet<&str> = failed
        .iter()
        .map(|(id, _, _)| &id[prefix.len()..])
        .collect();
    assert_eq!(failed_ids, declined);
    for (id, retryable, reason) in &failed {
        assert!(!retryable, "{id}: a decline is final");
        assert!(
            reason.as_deref().is_some_and(|r| r.contains("402")),
            "{id}: {reason:?}"
        );
    }
    let succeeded: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM dedup_intents WHERE operation_id LIKE $1 AND state = 'SUCCEEDED'",
    )
    .bind(format!("{prefix}%"))
    .fetch_one(&db.pool)
    .await?;
    assert_eq!(succeeded as usize, expected_charged.len());

    // Every record of a declined event is a provider_rejected dead letter, and nothing else is.
    let dead_letters: Vec<(i32, i64)> = sqlx::query_as(
        "SELECT source_partition, source_offset FROM sink_dead_letters \
         WHERE sink = $1 AND reason = 'provider_rejected'",
    )
    .bind(&sink.group)
    .fetch_all(&db.pool)
    .await?;
    let dead_lettered: BTreeSet<(i32, i64)> = dead_letters.iter().copied().collect();
    assert_eq!(dead_lettered.len(), dead_letters.len());
    assert_eq!(dead_lettered, declined_records);
    eprintln!(
        "provider target: {} events, {} declined ({} records dead-lettered), {} charged",
        first_fingerprint.len(),
        declined.len(),
        declined_records.len(),
        charged.len()
    );

    drop(dedup);
    std::fs::remove_dir_all(&dir)?;
    db.drop_database().await
}
