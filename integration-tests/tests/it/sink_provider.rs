//! The sink-writer's provider target end to end (issue #5 part 6, seed 002 "External ambiguous
//! outcome"): real sink-writer, dedup-service and provider-sim processes, real Kafka and
//! PostgreSQL. The provider applies every charge it receives, then loses a fifth of the answers
//! (dropped, 5xx, or later than the caller's deadline), and the sink is SIGKILLed mid-run. The
//! audit is the provider's own effect list: exactly one effect per operation id.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use anyhow::ensure;
use integration_tests::eosctl::{self, Workload};
use integration_tests::{TestDatabase, unique_name};
use serde_json::Value;

use crate::dedup_service::Dedup;
use crate::provider_sim::ProviderSim;
use crate::sink_writer::{Sink, TopicTruth, stop_gracefully};

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

fn targets_file(
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
async fn effects(sim: &ProviderSim, prefix: &str) -> anyhow::Result<Vec<(String, i64, u64)>> {
    let body: Value = reqwest::get(format!("{}/effects", sim.url))
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

#[tokio::test(flavor = "multi_thread")]
async fn sink_provider_target_charges_each_event_once_through_lost_answers_and_sigkills()
-> anyhow::Result<()> {
    let db = TestDatabase::create().await?;
    let sim = ProviderSim::spawn(&FAULTS)?;
    let dedup = Dedup::spawn(
        &db,
        &[
            "--provider-url",
            &sim.url,
            "--reconcile-interval",
            "200ms",
            "--in-flight-window",
            "3s",
        ],
    )?;
    let name = unique_name("pay").replace('-', "_");
    let dir = std::env::temp_dir().join(unique_name("sink-provider"));
    std::fs::create_dir_all(&dir)?;
    let config = targets_file(&dir, &name, &dedup.endpoint(), &sim.url)?;

    let topic = unique_name("sink-provider");
    let sink = Sink::new(&topic, &db.url);
    let workload = Workload {
        rate: 1_000,
        ..Workload::chaos(EVENTS, 77)
    };
    let producer = {
        let topic = topic.clone();
        std::thread::spawn(move || eosctl::produce(&topic, &workload))
    };
    let started = Instant::now();
    let args = ["--config", config.as_str()];
    for _ in 0..SINK_KILLS {
        let mut process = sink.spawn("provider", &args, &[])?;
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        let status = process.kill_hard()?;
        ensure!(status.code().is_none(), "killed by a signal: {status}");
    }
    let mut last = sink.spawn("provider", &args, &[])?;
    tokio::task::spawn_blocking(move || producer.join())
        .await?
        .map_err(|_| anyhow::anyhow!("producer thread panicked"))??;
    sink.wait_drained(&db.pool, &mut last).await?;
    stop_gracefully(&mut last)?;
    eprintln!(
        "provider target: {SINK_KILLS} SIGKILLs, drained in {:?}",
        started.elapsed()
    );

    let truth = TopicTruth::read(&topic)?;
    ensure!(
        truth.logical.len() as u64 == EVENTS,
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
        unknowns as u64 >= EVENTS / 10,
        "the faults must bite: only {unknowns} UNKNOWN outcomes"
    );
    assert_eq!(
        reconciled, unknowns,
        "every UNKNOWN settled by the reconciler"
    );
    assert_eq!(states, vec![("SUCCEEDED".to_owned(), EVENTS as i64)]);
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
