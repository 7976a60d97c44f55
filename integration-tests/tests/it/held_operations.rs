//! A provider operation that cannot be settled is held, not waited on forever (docs/ARCHITECTURE.md
//! "Held operations"): real sink-writer, dedup-service, provider-sim and eosctl processes, real
//! Kafka and PostgreSQL.
//!
//! How the UNKNOWN becomes stuck, as it does in production: the provider applies the charge and
//! loses its answer (UNKNOWN), and dedup-service's reconciler cannot reach the provider until the
//! provider has forgotten the key. Its "no record" then proves nothing, so the reconciler marks
//! the intent stuck and leaves it UNKNOWN. The sink must then hold that event (neither charge it
//! again nor record it as charged), write every other event behind it, and `eosctl held resolve`
//! must settle it at dedup-service and mark the held row resolved.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use dedup_client::{BeginOutcome, BeginParams};
use eos_proto::dedup::v1 as pb;
use eos_testkit::argv;
use integration_tests::{
    TestDatabase, arg_refs, create_topic, produce_records, unique_name, workspace_binary,
};
use serde_json::Value;
use time::OffsetDateTime;

use crate::dedup_service::{Dedup, acquire};
use crate::provider_sim::ProviderSim;
use crate::sink_provider::effects;
use crate::sink_writer::Sink;

/// The provider forgets keys after this; dedup-service is told the same (--provider-key-ttl).
const KEY_TTL: &str = "3s";
const KEY_TTL_DURATION: Duration = Duration::from_secs(3);
/// Events written behind the held one.
const OTHERS: usize = 50;
const OPERATOR_TOKEN: &str = "held-operations-operator-token-0123456789";
const CLIENT_TOKEN: &str = "held-operations-client-token-0123456789";

/// dedup-service flags whose key TTL outlives one lease and the in-flight window, as its
/// start-up check demands, with a reconciler that looks often.
fn dedup_flags(provider_url: &str, extra: &[String]) -> Vec<String> {
    let mut flags = argv!(dedup_service::Config {
        provider_url: provider_url,
        provider_key_ttl: KEY_TTL,
        lease_ttl: "1s",
        max_lease_ttl: "1s",
        in_flight_window: "1s",
        reconcile_interval: "200ms",
    });
    flags.extend_from_slice(extra);
    flags
}

fn targets_file(
    dir: &std::path::Path,
    file: &str,
    name: &str,
    dedup: &str,
    provider: &str,
) -> anyhow::Result<String> {
    let path = dir.join(format!("{file}.toml"));
    std::fs::write(
        &path,
        format!(
            "[[targets]]\nkind = \"provider\"\nname = \"{name}\"\ndedup_url = \"{dedup}\"\n\
             provider_url = \"{provider}\"\ncall_timeout = \"500ms\"\nlease_ttl = \"1s\"\n\
             settle_timeout = \"3s\"\n"
        ),
    )?;
    Ok(path.display().to_string())
}

fn envelope(event_id: &str, value: i64) -> (Option<String>, Vec<u8>) {
    let entity = format!("acct-{event_id}");
    let body = serde_json::json!({"event_id": event_id, "entity_id": entity, "value": value});
    (Some(entity), body.to_string().into_bytes())
}

async fn wait_for<T>(
    what: &str,
    timeout: Duration,
    mut probe: impl AsyncFnMut() -> anyhow::Result<Option<T>>,
) -> anyhow::Result<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = probe().await? {
            return Ok(value);
        }
        if Instant::now() > deadline {
            bail!("{what}: not after {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Runs eosctl with `args`; its stdout, or an error with its stderr.
fn eosctl(args: &[&str]) -> anyhow::Result<String> {
    let output = Command::new(workspace_binary("eosctl")?)
        .args(args)
        .output()?;
    if !output.status.success() {
        bail!(
            "eosctl {args:?} failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(String::from_utf8(output.stdout)?)
}

#[tokio::test(flavor = "multi_thread")]
async fn sink_holds_a_stuck_operation_writes_the_rest_and_eosctl_resolves_it() -> anyhow::Result<()>
{
    let started = Instant::now();
    let db = TestDatabase::create().await?;
    let dir = std::env::temp_dir().join(unique_name("held-operations"));
    std::fs::create_dir_all(&dir)?;
    let token_path = |file: &str, token: &str| -> anyhow::Result<String> {
        let path = dir.join(file);
        std::fs::write(&path, format!("{token}\n"))?;
        Ok(path.display().to_string())
    };
    let operator_token = token_path("operator-token", OPERATOR_TOKEN)?;
    let client_token = token_path("client-token", CLIENT_TOKEN)?;
    let name = unique_name("held").replace('-', "_");
    let topic = unique_name("held-operations");
    create_topic(&topic, 1).await?;
    let sink = Sink::new(&topic, &db.url);
    let held_id = "held-0";
    let operation_id = format!("{name}:{held_id}");

    // 1. The charge is applied and its answer lost; the reconciler's provider is unreachable.
    let losing = ProviderSim::spawn(&[
        "--key-ttl",
        KEY_TTL,
        "--drop-response-after-apply-probability",
        "1",
    ])?;
    let unreachable = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        format!("http://{}", listener.local_addr()?)
    };
    let blind = Dedup::spawn(&db, &arg_refs(&dedup_flags(&unreachable, &[])))?;
    produce_records(&topic, &[envelope(held_id, 700)])?;
    let config = targets_file(&dir, "losing", &name, &blind.endpoint(), &losing.url)?;
    let mut first = sink.spawn(
        "held-a",
        &arg_refs(&argv!(sink_writer::Config { config: &config })),
        &[],
    )?;
    wait_for(
        "the charge's outcome UNKNOWN",
        Duration::from_secs(60),
        async || {
            let state: Option<String> =
                sqlx::query_scalar("SELECT state FROM dedup_intents WHERE operation_id = $1")
                    .bind(&operation_id)
                    .fetch_optional(&db.pool)
                    .await?;
            Ok((state.as_deref() == Some("UNKNOWN")).then_some(()))
        },
    )
    .await
    .with_context(|| first.log_tail(30))?;
    first.kill_hard()?;
    drop(blind);
    ensure!(
        effects(&losing, &operation_id).await?.len() == 1,
        "the provider applied the lost charge once"
    );

    // 2. Once the provider has forgotten the key, a reconciler that reaches it finds no record,
    //    which proves nothing: stuck, still UNKNOWN.
    tokio::time::sleep(KEY_TTL_DURATION + Duration::from_millis(500)).await;
    let token_flags = argv!(dedup_service::Config {
        client_token_files: &client_token,
        operator_token_files: &operator_token,
    });
    let dedup = Dedup::spawn(&db, &arg_refs(&dedup_flags(&losing.url, &token_flags)))?;
    let reason = wait_for(
        "the reconciler's stuck verdict",
        Duration::from_secs(30),
        async || {
            Ok(sqlx::query_scalar::<_, Option<String>>(
            "SELECT stuck_reason FROM dedup_intents WHERE operation_id = $1 AND state = 'UNKNOWN'",
        )
        .bind(&operation_id)
        .fetch_optional(&db.pool)
        .await?
        .flatten())
        },
    )
    .await?;
    ensure!(reason.contains("key TTL"), "stuck reason: {reason}");
    // Get and ListUnknown (an operator's view) carry the same verdict.
    let operator = dedup_client::DedupClient::connect_lazy_with(
        &dedup.endpoint(),
        &dedup_client::ClientCredentials {
            token: Some(dedup_client::BearerToken::new(OPERATOR_TOKEN, "test")?),
            tls: dedup_client::ClientTlsFiles::default(),
        },
    )?;
    let got = operator.get(&operation_id).await?;
    ensure!(got.stuck_reason == reason, "Get: {got:?}");
    let unknown = operator.list_unknown(100).await?;
    ensure!(
        unknown
            .iter()
            .any(|intent| intent.operation_id == operation_id && intent.stuck_reason == reason),
        "ListUnknown: {unknown:?}"
    );

    // 3. Behind it, OTHERS more events, and a provider that answers. The sink holds the stuck
    //    event and writes the rest; the partition moves on.
    let honest = ProviderSim::spawn(&[])?;
    let others: Vec<(Option<String>, Vec<u8>)> = (1..=OTHERS)
        .map(|n| envelope(&format!("ok-{n}"), 100 + n as i64))
        .collect();
    produce_records(&topic, &others)?;
    let config = targets_file(&dir, "honest", &name, &dedup.endpoint(), &honest.url)?;
    let mut second = sink.spawn(
        "held-b",
        &arg_refs(&argv!(sink_writer::Config {
            config: &config,
            dedup.dedup_token_file: &client_token,
            held_refresh_interval: "500ms",
        })),
        &[],
    )?;
    sink.wait_drained(&db.pool, &mut second).await?;
    let metrics_addr = second.wait_for_log_field("metrics_addr", Duration::from_secs(10))?;
    let metrics = reqwest::get(format!("http://{metrics_addr}/metrics"))
        .await?
        .text()
        .await?;
    ensure!(
        metrics
            .lines()
            .any(|line| line.starts_with("eos_sink_held_operations_total")
                && line.contains(&name)
                && line.ends_with(" 1")),
        "held counter missing:\n{metrics}"
    );
    let unresolved_gauge = |metrics: &str| {
        metrics
            .lines()
            .find(|line| {
                line.starts_with("eos_sink_held_operations_unresolved") && line.contains(&name)
            })
            .map(str::to_owned)
    };
    ensure!(
        unresolved_gauge(&metrics).is_some_and(|line| line.ends_with(" 1")),
        "unresolved gauge after the hold:\n{metrics}"
    );
    let warning = second.wait_for_log_line("held:", Duration::from_secs(5))?;
    ensure!(
        warning.contains(held_id) && warning.contains(&operation_id),
        "the WARN names the event and the operation: {warning}"
    );

    // Audit by event_id: one effect for each other event, with its amount; none at the honest
    // provider for the held one (not charged again); the held one in sink_held_operations.
    let mut per_event: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for (key, amount, _) in effects(&honest, &format!("{name}:")).await? {
        per_event
            .entry(key[name.len() + 1..].to_owned())
            .or_default()
            .push(amount);
    }
    for n in 1..=OTHERS {
        let event_id = format!("ok-{n}");
        ensure!(
            per_event.remove(&event_id) == Some(vec![100 + n as i64]),
            "{event_id}: exactly one effect with its amount"
        );
    }
    ensure!(per_event.is_empty(), "unexpected effects: {per_event:?}");
    let held: Vec<(String, String, i32, i64, Option<String>)> = sqlx::query_as(
        "SELECT event_id, operation_id, source_partition, source_offset, resolution
         FROM sink_held_operations WHERE sink = $1 AND target = $2",
    )
    .bind(&sink.group)
    .bind(&name)
    .fetch_all(&db.pool)
    .await?;
    ensure!(
        held == vec![(held_id.to_owned(), operation_id.clone(), 0, 0, None)],
        "held rows: {held:?}"
    );
    let states: Vec<(String, i64)> = sqlx::query_as(
        "SELECT state, count(*) FROM dedup_intents WHERE operation_id LIKE $1
         GROUP BY state ORDER BY state",
    )
    .bind(format!("{name}:%"))
    .fetch_all(&db.pool)
    .await?;
    ensure!(
        states
            == vec![
                ("SUCCEEDED".to_owned(), OTHERS as i64),
                ("UNKNOWN".to_owned(), 1)
            ],
        "intents: {states:?}"
    );

    // 4. The operator lists it, checks the provider (it has the charge), and resolves it.
    let listed: Value = serde_json::from_str(&eosctl(&[
        "held",
        "list",
        "--json",
        "--database-url",
        &db.url,
    ])?)?;
    ensure!(
        listed.as_array().map(Vec::len) == Some(1) && listed[0]["operation_id"] == operation_id,
        "held list: {listed}"
    );
    let resolve = [
        "held",
        "resolve",
        operation_id.as_str(),
        "--outcome",
        "succeeded",
        "--evidence",
        "the provider's effect list has the charge",
        "--database-url",
        &db.url,
        "--dedup-url",
        &dedup.endpoint(),
        "--operator-token-file",
        &operator_token,
        "--json",
    ];
    let resolved: Value = serde_json::from_str(&eosctl(&resolve)?)?;
    ensure!(
        resolved["intent_state"] == "INTENT_STATE_SUCCEEDED" && resolved["rows_resolved"] == 1,
        "resolve: {resolved}"
    );
    let state: String =
        sqlx::query_scalar("SELECT state FROM dedup_intents WHERE operation_id = $1")
            .bind(&operation_id)
            .fetch_one(&db.pool)
            .await?;
    ensure!(state == "SUCCEEDED", "intent after resolve: {state}");
    let row: (Option<String>, bool) = sqlx::query_as(
        "SELECT resolution, resolved_at IS NOT NULL FROM sink_held_operations WHERE operation_id = $1",
    )
    .bind(&operation_id)
    .fetch_one(&db.pool)
    .await?;
    ensure!(
        row == (Some("succeeded".to_owned()), true),
        "held row after resolve: {row:?}"
    );
    // The running sink sees the resolution at its next periodic refresh.
    let gauge = wait_for(
        "the unresolved gauge at 0",
        Duration::from_secs(10),
        async || {
            let metrics = reqwest::get(format!("http://{metrics_addr}/metrics"))
                .await?
                .text()
                .await?;
            Ok(unresolved_gauge(&metrics).filter(|line| line.ends_with(" 0")))
        },
    )
    .await?;
    ensure!(gauge.contains(&name), "{gauge}");
    second.stop_gracefully()?;
    // Nothing is held any more, and resolving again changes nothing.
    let listed: Value = serde_json::from_str(&eosctl(&[
        "held",
        "list",
        "--json",
        "--database-url",
        &db.url,
    ])?)?;
    ensure!(
        listed == serde_json::json!([]),
        "held list after resolve: {listed}"
    );
    let again: Value = serde_json::from_str(&eosctl(&resolve)?)?;
    ensure!(again["rows_resolved"] == 0, "second resolve: {again}");
    // A client token is not enough for Resolve.
    let refused = Command::new(workspace_binary("eosctl")?)
        .args(&resolve[..resolve.len() - 2])
        .args([client_token.as_str(), "--json"])
        .output()?;
    ensure!(
        !refused.status.success()
            && String::from_utf8_lossy(&refused.stderr).contains("needs an operator token"),
        "resolve with a client token must be refused: {}",
        String::from_utf8_lossy(&refused.stderr)
    );

    eprintln!(
        "held operation: held, {OTHERS} written, resolved in {:?}",
        started.elapsed()
    );
    drop(dedup);
    std::fs::remove_dir_all(&dir)?;
    db.drop_database().await?;
    Ok(())
}

/// The stuck verdict belongs to the attempt it judged: after an operator's Resolve makes the
/// operation retryable and it is acquired and lost again, Begin answers a plain UNKNOWN (the
/// reconciler has a new attempt to ask about), not the old verdict.
#[tokio::test(flavor = "multi_thread")]
async fn dedup_stuck_verdict_is_bound_to_the_attempt_it_judged() -> anyhow::Result<()> {
    let db = TestDatabase::create().await?;
    let unreachable = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        format!("http://{}", listener.local_addr()?)
    };
    let begin = BeginParams {
        operation_id: "held-attempts".into(),
        fingerprint: vec![7; 32],
        owner: "worker-a".into(),
        occurred_at: OffsetDateTime::now_utc(),
        lease_ttl: None,
    };
    // Attempt 1 is lost while the reconciler cannot reach the provider.
    let blind = Dedup::spawn(&db, &arg_refs(&dedup_flags(&unreachable, &[])))?;
    let client = blind.client()?;
    let first = acquire(&client, &begin).await?;
    client
        .mark_unknown(&begin.operation_id, first, "answer lost")
        .await?;
    drop(blind);
    tokio::time::sleep(KEY_TTL_DURATION + Duration::from_millis(500)).await;

    // A provider with no record, past the key TTL: stuck.
    let empty = ProviderSim::spawn(&[])?;
    let dedup = Dedup::spawn(&db, &arg_refs(&dedup_flags(&empty.url, &[])))?;
    let client = dedup.client()?;
    let stuck = wait_for("a stuck answer", Duration::from_secs(30), async || {
        Ok(match client.begin(&begin).await? {
            BeginOutcome::Unknown {
                stuck_reason: Some(reason),
                ..
            } => Some(reason),
            BeginOutcome::Unknown { .. } => None,
            other => bail!("expected UNKNOWN, got {other:?}"),
        })
    })
    .await?;
    ensure!(stuck.contains("key TTL"), "{stuck}");

    // The operator makes it retryable; attempt 2 is acquired and lost too.
    client
        .resolve(pb::ResolveRequest {
            operation_id: begin.operation_id.clone(),
            outcome: pb::IntentState::Failed as i32,
            evidence: "the provider's support: not charged".into(),
            result: Vec::new(),
            retryable: true,
            expected_fencing_token: 0,
        })
        .await?;
    let second = acquire(&client, &begin).await?;
    ensure!(second.counter > first.counter, "a new attempt");
    client
        .mark_unknown(&begin.operation_id, second, "answer lost again")
        .await?;
    let answer = client.begin(&begin).await?;
    ensure!(
        matches!(
            &answer,
            BeginOutcome::Unknown {
                stuck_reason: None,
                ..
            }
        ),
        "attempt 2 is not stuck: {answer:?}"
    );
    drop(dedup);
    db.drop_database().await
}
