//! dedup-service as a real child process against real PostgreSQL (and provider-sim where the
//! provider matters): the state machine, races, fencing, lease expiry, retention, bad input,
//! and the ambiguous-outcome scenario (docs/ARCHITECTURE.md "Boundaries") — with and without
//! SIGKILL — audited by the cardinality of the provider's effects per operation id.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use dedup_client::{
    BeginOutcome, BeginParams, CompleteItem, DedupClient, FencingToken, RetryPolicy,
};
use dedup_client::{ChargeOutcome, ProviderClient};
use eos_core::Fingerprint;
use eos_proto::dedup::v1 as pb;
use eos_proto::dedup::v1::dedup_client::DedupClient as GrpcClient;
use eos_testkit::argv;
use futures::StreamExt as _;
use integration_tests::service_process::ServiceProcess;
use integration_tests::{TestDatabase, arg_refs};
use serde_json::json;
use time::OffsetDateTime;
use tonic::Code;
use tonic::transport::Channel;

use crate::provider_sim::ProviderSim;

const START_TIMEOUT: Duration = Duration::from_secs(60);

/// A running dedup-service.
pub(crate) struct Dedup {
    pub(crate) process: ServiceProcess,
    grpc_addr: String,
}

/// dedup-service's reconciler at an hour: out of the way of a test that drives the intents.
fn reconcile_hourly() -> Vec<String> {
    argv!(dedup_service::Config {
        reconcile_interval: "1h"
    })
}

impl Dedup {
    pub(crate) fn spawn(db: &TestDatabase, extra: &[&str]) -> anyhow::Result<Self> {
        Self::spawn_on(&db.url, "127.0.0.1:0", extra)
    }

    pub(crate) fn spawn_on(
        database_url: &str,
        listen: &str,
        extra: &[&str],
    ) -> anyhow::Result<Self> {
        let mut args = argv!(dedup_service::Config {
            database[database_url]: database_url,
            listen: listen,
            metrics_addr: "127.0.0.1:0",
        });
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        let mut process = ServiceProcess::spawn("dedup-service", &args, &[])?;
        let grpc_addr = process.wait_for_log_field("grpc_addr", START_TIMEOUT)?;
        Ok(Self { process, grpc_addr })
    }

    /// The Prometheus text of the service's ops endpoint.
    pub(crate) async fn metrics(&mut self) -> anyhow::Result<String> {
        let addr = self
            .process
            .wait_for_log_field("metrics_addr", START_TIMEOUT)?;
        Ok(reqwest::get(format!("http://{addr}/metrics"))
            .await?
            .error_for_status()?
            .text()
            .await?)
    }

    pub(crate) fn endpoint(&self) -> String {
        format!("http://{}", self.grpc_addr)
    }

    /// The workspace client (retries transient failures).
    pub(crate) fn client(&self) -> anyhow::Result<DedupClient> {
        Ok(DedupClient::connect_lazy(&self.endpoint())?)
    }

    /// The generated client, without retries, for status codes.
    async fn grpc(&self) -> anyhow::Result<GrpcClient<Channel>> {
        Ok(GrpcClient::connect(self.endpoint()).await?)
    }
}

fn fingerprint(seed: u8) -> Vec<u8> {
    vec![seed; 32]
}

fn params(operation_id: &str, fp: u8, owner: &str) -> BeginParams {
    BeginParams {
        operation_id: operation_id.to_owned(),
        fingerprint: fingerprint(fp),
        owner: owner.to_owned(),
        occurred_at: OffsetDateTime::now_utc(),
        lease_ttl: None,
    }
}

fn with_lease(mut params: BeginParams, lease: Duration) -> BeginParams {
    params.lease_ttl = Some(lease);
    params
}

pub(crate) async fn acquire(
    client: &DedupClient,
    params: &BeginParams,
) -> anyhow::Result<FencingToken> {
    match client.begin(params).await? {
        BeginOutcome::Acquired { fencing_token, .. } => Ok(fencing_token),
        other => bail!("{}: expected ACQUIRED, got {other:?}", params.operation_id),
    }
}

fn code_of<T: std::fmt::Debug>(result: Result<T, dedup_client::ClientError>) -> Code {
    match result {
        Ok(value) => panic!("expected an error status, got {value:?}"),
        Err(error) => error.code().unwrap_or(Code::Ok),
    }
}

/// One row of `dedup_intent_history`: (from state, to state, fencing token).
pub(crate) type HistoryRow = (Option<String>, String, i64);

/// An operation's transitions, oldest first.
pub(crate) async fn history(
    db: &TestDatabase,
    operation_id: &str,
) -> anyhow::Result<Vec<HistoryRow>> {
    Ok(sqlx::query_as(
        "SELECT from_state, to_state, fencing_token FROM dedup_intent_history
         WHERE operation_id = $1 ORDER BY id",
    )
    .bind(operation_id)
    .fetch_all(&db.pool)
    .await?)
}

pub(crate) fn step(from: Option<&str>, to: &str, token: i64) -> HistoryRow {
    (from.map(str::to_owned), to.to_owned(), token)
}

#[tokio::test(flavor = "multi_thread")]
async fn dedup_state_machine_follows_the_transition_table() -> anyhow::Result<()> {
    let db = TestDatabase::create().await?;
    let service = Dedup::spawn(&db, &arg_refs(&reconcile_hourly()))?;
    let client = service.client()?;

    // RESERVED → SUCCEEDED; others see IN_PROGRESS, then the stored result.
    let token = acquire(&client, &params("op-complete", 1, "worker-a")).await?;
    assert_eq!(token.counter, 1);
    let busy = client.begin(&params("op-complete", 1, "worker-b")).await?;
    assert!(
        matches!(&busy, BeginOutcome::InProgress { holder, .. } if holder == "worker-a"),
        "{busy:?}"
    );
    client
        .complete("op-complete", token, b"receipt-1".to_vec())
        .await?;
    assert_eq!(
        client.begin(&params("op-complete", 1, "worker-b")).await?,
        BeginOutcome::Succeeded {
            result: b"receipt-1".to_vec()
        }
    );
    // Repeating the report is harmless; contradicting it is refused.
    client
        .complete("op-complete", token, b"receipt-1".to_vec())
        .await?;
    assert_eq!(
        code_of(client.fail("op-complete", token, "late", false).await),
        Code::FailedPrecondition
    );

    // A non-retryable failure is final.
    let token = acquire(&client, &params("op-final", 2, "worker-a")).await?;
    client
        .fail("op-final", token, "card declined", false)
        .await?;
    assert_eq!(
        client.begin(&params("op-final", 2, "worker-b")).await?,
        BeginOutcome::Failed {
            reason: "card declined".into(),
            retryable: false
        }
    );

    // A retryable failure is acquired again with a newer token; the old one is stale.
    let old = acquire(&client, &params("op-retry", 3, "worker-a")).await?;
    client
        .fail("op-retry", old, "503 before applying", true)
        .await?;
    let new = acquire(&client, &params("op-retry", 3, "worker-b")).await?;
    assert_eq!((old.counter, new.counter), (1, 2));
    assert_eq!(
        code_of(client.complete("op-retry", old, b"x".to_vec()).await),
        Code::FailedPrecondition
    );
    client
        .complete("op-retry", new, b"receipt-2".to_vec())
        .await?;

    // UNKNOWN blocks every new call until resolved.
    let token = acquire(&client, &params("op-unknown", 4, "worker-a")).await?;
    client.mark_unknown("op-unknown", token, "timeout").await?;
    assert!(matches!(
        client.begin(&params("op-unknown", 4, "worker-b")).await?,
        BeginOutcome::Unknown { .. }
    ));
    let unknown = client.list_unknown(0).await?;
    assert_eq!(
        unknown
            .iter()
            .map(|i| i.operation_id.as_str())
            .collect::<Vec<_>>(),
        vec!["op-unknown"]
    );
    let resolve = |operation_id: &str| pb::ResolveRequest {
        operation_id: operation_id.to_owned(),
        outcome: pb::IntentState::Succeeded as i32,
        evidence: "provider record ch_1".into(),
        result: b"receipt-3".to_vec(),
        retryable: false,
        expected_fencing_token: 0,
    };
    client.resolve(resolve("op-unknown")).await?;
    assert_eq!(
        client.begin(&params("op-unknown", 4, "worker-b")).await?,
        BeginOutcome::Succeeded {
            result: b"receipt-3".to_vec()
        }
    );
    assert_eq!(
        code_of(client.resolve(resolve("op-final")).await),
        Code::FailedPrecondition,
        "only an UNKNOWN is resolved"
    );
    assert_eq!(code_of(client.get("op-never").await), Code::NotFound);
    let intent = client.get("op-retry").await?;
    assert_eq!(intent.state, pb::IntentState::Succeeded as i32);
    assert_eq!(intent.fencing_token, 2);

    // Every transition is in the history, in order, with its token.
    assert_eq!(
        history(&db, "op-retry").await?,
        vec![
            step(None, "RESERVED", 1),
            step(Some("RESERVED"), "FAILED", 1),
            step(Some("FAILED"), "RESERVED", 2),
            step(Some("RESERVED"), "SUCCEEDED", 2),
        ]
    );
    assert_eq!(
        history(&db, "op-unknown").await?,
        vec![
            step(None, "RESERVED", 1),
            step(Some("RESERVED"), "UNKNOWN", 1),
            step(Some("UNKNOWN"), "SUCCEEDED", 1),
        ]
    );
    // Repeated Begins and reports changed nothing, so they left no history.
    assert_eq!(history(&db, "op-complete").await?.len(), 2);
    drop(service);
    db.drop_database().await
}

#[tokio::test(flavor = "multi_thread")]
async fn dedup_concurrent_begins_acquire_exactly_once_per_id() -> anyhow::Result<()> {
    const IDS: usize = 1000;
    const CONTENDERS: usize = 64;
    let db = TestDatabase::create().await?;
    let service = Dedup::spawn(&db, &arg_refs(&reconcile_hourly()))?;
    // Several connections, so contenders really race inside the service and the database.
    let clients: Vec<DedupClient> = (0..4)
        .map(|_| service.client())
        .collect::<anyhow::Result<_>>()?;
    let clients = Arc::new(clients);

    let started = Instant::now();
    let per_id: Vec<(usize, usize, usize)> = futures::stream::iter(0..IDS)
        .map(|id| {
            let clients = Arc::clone(&clients);
            async move {
                let begins = (0..CONTENDERS).map(|contender| {
                    let client = &clients[contender % clients.len()];
                    let params = params(&format!("race-{id}"), 9, &format!("worker-{contender}"));
                    async move { client.begin(&params).await }
                });
                let answers = futures::future::join_all(begins).await;
                let mut acquired = 0;
                let mut in_progress = 0;
                for answer in answers {
                    match answer? {
                        BeginOutcome::Acquired { .. } => acquired += 1,
                        BeginOutcome::InProgress { .. } => in_progress += 1,
                        other => bail!("race-{id}: unexpected {other:?}"),
                    }
                }
                Ok::<_, anyhow::Error>((id, acquired, in_progress))
            }
        })
        .buffer_unordered(8)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<anyhow::Result<_>>()?;
    let elapsed = started.elapsed();
    println!(
        "{} Begins in {elapsed:?} ({:.0}/s)",
        IDS * CONTENDERS,
        (IDS * CONTENDERS) as f64 / elapsed.as_secs_f64()
    );

    let wrong: Vec<_> = per_id
        .iter()
        .filter(|(_, acquired, _)| *acquired != 1)
        .collect();
    assert!(wrong.is_empty(), "ids not acquired exactly once: {wrong:?}");
    assert!(per_id.iter().all(|(_, _, busy)| *busy == CONTENDERS - 1));
    let (rows, reservations): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM dedup_intents WHERE state = 'RESERVED' AND fencing_token = 1),
                (SELECT count(*) FROM dedup_intent_history WHERE to_state = 'RESERVED')",
    )
    .fetch_one(&db.pool)
    .await?;
    assert_eq!((rows, reservations), (IDS as i64, IDS as i64));
    drop(service);
    db.drop_database().await
}

#[tokio::test(flavor = "multi_thread")]
async fn dedup_stale_holder_is_fenced_after_a_newer_holder_completes() -> anyhow::Result<()> {
    // A's lease, and how long after it the reconciler may settle A's attempt as failed. B's
    // first Begin must come between the two to be told UNKNOWN: a window several seconds wide,
    // so a loaded machine's stalls do not close it.
    const LEASE: Duration = Duration::from_secs(1);
    const IN_FLIGHT_WINDOW: Duration = Duration::from_secs(5);
    let db = TestDatabase::create().await?;
    let sim = ProviderSim::spawn(&[])?;
    let window = humantime::format_duration(IN_FLIGHT_WINDOW).to_string();
    let service = Dedup::spawn(
        &db,
        &arg_refs(&argv!(dedup_service::Config {
            provider_url: &sim.url,
            in_flight_window: &window,
            reconcile_interval: "200ms",
        })),
    )?;
    let client = service.client()?;
    let provider = ProviderClient::new(&sim.url, Duration::from_secs(5), &Default::default())?;

    // Holder A acquires and stalls past its lease without calling the provider. B is told
    // UNKNOWN (A may have called) until the reconciler finds no charge after the in-flight
    // window and settles a retryable failure; then B acquires a newer token.
    let mut attempt = 0;
    let (op, a) = loop {
        attempt += 1;
        let op = format!("fence-{attempt}");
        let sent = Instant::now();
        let a = acquire(&client, &with_lease(params(&op, 5, "worker-a"), LEASE)).await?;
        tokio::time::sleep(LEASE + Duration::from_millis(300)).await;
        let first = client.begin(&params(&op, 5, "worker-b")).await?;
        if matches!(first, BeginOutcome::Unknown { .. }) {
            break (op, a);
        }
        // Answered before the window could close: only UNKNOWN is right. Answered after a
        // stall longer than the window, the reconciler may rightly have settled A's attempt:
        // the precondition did not hold, so the scenario starts again on a new operation.
        ensure!(
            sent.elapsed() >= LEASE + IN_FLIGHT_WINDOW,
            "B's first Begin {:?} after A's acquire: expected UNKNOWN, got {first:?}",
            sent.elapsed()
        );
        ensure!(
            attempt < 3,
            "B's first Begin came after the in-flight window {attempt} times: the machine stalls \
             longer than {IN_FLIGHT_WINDOW:?}"
        );
        eprintln!("{op}: B's first Begin came after the in-flight window; starting again");
    };
    let op = op.as_str();
    let b_params = params(op, 5, "worker-b");
    let deadline = Instant::now() + Duration::from_secs(20);
    let b = loop {
        match client.begin(&b_params).await? {
            BeginOutcome::Acquired { fencing_token, .. } => break fencing_token,
            BeginOutcome::Unknown { .. } if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            other => bail!("B: unexpected {other:?}"),
        }
    };
    assert!(
        b.counter > a.counter,
        "B's token {b:?} must be newer than A's {a:?}"
    );
    // A wakes up while B holds the lease: its stale token cannot touch B's reservation.
    assert_eq!(
        code_of(client.complete(op, a, b"a".to_vec()).await),
        Code::FailedPrecondition
    );
    assert_eq!(
        code_of(client.mark_unknown(op, a, "a").await),
        Code::FailedPrecondition
    );
    let during = client.get(op).await?;
    assert_eq!(
        (during.state, during.fencing_token, during.holder.as_str()),
        (pb::IntentState::Reserved as i32, b.counter, "worker-b")
    );
    let ChargeOutcome::Applied { body, .. } = provider
        .charge(op, &json!({"amount": 10}), Duration::from_secs(5))
        .await
    else {
        bail!("provider-sim without faults must apply");
    };
    client.complete(op, b, body).await?;

    // And after B completed, every report with A's stale token is still refused.
    assert_eq!(
        code_of(client.complete(op, a, b"a".to_vec()).await),
        Code::FailedPrecondition
    );
    assert_eq!(
        code_of(client.fail(op, a, "a", true).await),
        Code::FailedPrecondition
    );
    assert_eq!(
        code_of(client.mark_unknown(op, a, "a").await),
        Code::FailedPrecondition
    );

    let intent = client.get(op).await?;
    assert_eq!(intent.state, pb::IntentState::Succeeded as i32);
    assert_eq!(intent.fencing_token, b.counter);
    assert_eq!(
        history(&db, op).await?,
        vec![
            step(None, "RESERVED", a.counter),
            step(Some("RESERVED"), "UNKNOWN", a.counter),
            step(Some("UNKNOWN"), "FAILED", a.counter),
            step(Some("FAILED"), "RESERVED", b.counter),
            step(Some("RESERVED"), "SUCCEEDED", b.counter),
        ],
        "the final state was written once, by the newest holder"
    );
    assert_eq!(sim.effects().await?.len(), 1);
    drop(service);
    db.drop_database().await
}

#[tokio::test(flavor = "multi_thread")]
async fn dedup_lease_that_runs_out_makes_the_intent_unknown() -> anyhow::Result<()> {
    // Lazily, inside Begin: no reconciler pass runs during the test.
    let db = TestDatabase::create().await?;
    let service = Dedup::spawn(&db, &arg_refs(&reconcile_hourly()))?;
    let client = service.client()?;
    acquire(
        &client,
        &with_lease(params("lazy", 1, "worker-a"), Duration::from_millis(300)),
    )
    .await?;
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        client.get("lazy").await?.state,
        pb::IntentState::Reserved as i32
    );
    let answer = client.begin(&params("lazy", 1, "worker-b")).await?;
    assert!(
        matches!(&answer, BeginOutcome::Unknown { detail, .. } if detail.contains("expired")),
        "{answer:?}"
    );
    // Even the late holder's own Begin gets no new lease.
    assert!(matches!(
        client.begin(&params("lazy", 1, "worker-a")).await?,
        BeginOutcome::Unknown { .. }
    ));
    assert_eq!(
        history(&db, "lazy").await?,
        vec![
            step(None, "RESERVED", 1),
            step(Some("RESERVED"), "UNKNOWN", 1)
        ]
    );
    drop(service);
    db.drop_database().await?;

    // By the reconciler's sweep, without any Begin.
    let db = TestDatabase::create().await?;
    let service = Dedup::spawn(
        &db,
        &arg_refs(&argv!(dedup_service::Config {
            reconcile_interval: "100ms"
        })),
    )?;
    let client = service.client()?;
    acquire(
        &client,
        &with_lease(params("swept", 1, "worker-a"), Duration::from_millis(300)),
    )
    .await?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let state = client.get("swept").await?.state;
        if state == pb::IntentState::Unknown as i32 {
            break;
        }
        ensure!(Instant::now() < deadline, "still {state} after 10 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(service);
    db.drop_database().await
}

#[tokio::test(flavor = "multi_thread")]
async fn dedup_same_id_with_another_fingerprint_is_a_conflict() -> anyhow::Result<()> {
    let db = TestDatabase::create().await?;
    let service = Dedup::spawn(&db, &arg_refs(&reconcile_hourly()))?;
    let client = service.client()?;
    let token = acquire(&client, &params("c-1", 1, "worker-a")).await?;
    let conflict = BeginOutcome::Conflict {
        stored_fingerprint: fingerprint(1),
    };
    assert_eq!(client.begin(&params("c-1", 2, "worker-b")).await?, conflict);
    client.complete("c-1", token, b"r".to_vec()).await?;
    assert_eq!(client.begin(&params("c-1", 2, "worker-b")).await?, conflict);
    assert_eq!(
        history(&db, "c-1").await?.len(),
        2,
        "a conflict changes nothing"
    );
    drop(service);
    db.drop_database().await
}

#[tokio::test(flavor = "multi_thread")]
async fn dedup_operations_older_than_retention_fail_closed() -> anyhow::Result<()> {
    let db = TestDatabase::create().await?;
    let service = Dedup::spawn(
        &db,
        &arg_refs(&argv!(dedup_service::Config {
            retention: "3s",
            client_retry_horizon: "1s",
            broker_replay_retention: "2s",
            restore_horizon: "1s",
            retention_margin: "1s",
            purge_interval: "300ms",
            reconcile_interval: "1h",
        })),
    )?;
    let client = service.client()?;

    let mut old = params("old", 1, "worker-a");
    old.occurred_at = OffsetDateTime::now_utc() - Duration::from_secs(3600);
    assert!(matches!(
        client.begin(&old).await?,
        BeginOutcome::Expired { .. }
    ));
    assert_eq!(
        code_of(client.get("old").await),
        Code::NotFound,
        "no row was made"
    );

    let done = params("done", 2, "worker-a");
    let token = acquire(&client, &done).await?;
    client.complete("done", token, b"r".to_vec()).await?;
    let unknown = params("unknown", 3, "worker-a");
    let token = acquire(&client, &unknown).await?;
    client.mark_unknown("unknown", token, "timeout").await?;
    let held = with_lease(params("held", 4, "worker-a"), Duration::from_secs(600));
    acquire(&client, &held).await?;

    // Once "done" is past retention it is purged, and its replay answers EXPIRED.
    let deadline = Instant::now() + Duration::from_secs(15);
    while client.get("done").await.is_ok() {
        ensure!(Instant::now() < deadline, "\"done\" was not purged");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(matches!(
        client.begin(&done).await?,
        BeginOutcome::Expired { .. }
    ));
    assert!(
        history(&db, "done").await?.is_empty(),
        "its history went with it"
    );

    // Rows whose outcome is not known are never purged, however old.
    assert_eq!(
        client.get("unknown").await?.state,
        pb::IntentState::Unknown as i32
    );
    assert!(matches!(
        client.begin(&unknown).await?,
        BeginOutcome::Unknown { .. }
    ));
    assert_eq!(
        client.get("held").await?.state,
        pb::IntentState::Reserved as i32
    );
    assert!(matches!(
        client.begin(&params("held", 4, "worker-b")).await,
        Ok(BeginOutcome::InProgress { .. }) | Ok(BeginOutcome::Expired { .. })
    ));
    assert_eq!(
        client.get("held").await?.state,
        pb::IntentState::Reserved as i32
    );
    drop(service);
    db.drop_database().await
}

#[tokio::test(flavor = "multi_thread")]
async fn dedup_refuses_to_start_with_retention_below_the_replay_horizon() -> anyhow::Result<()> {
    let args = argv!(dedup_service::Config {
        // Unreachable on purpose: the figures are checked before anything else.
        database[database_url]: "postgres://nobody@127.0.0.1:1/none",
        listen: "127.0.0.1:0",
        metrics_addr: "127.0.0.1:0",
        retention: "3d",
        client_retry_horizon: "1d",
        broker_replay_retention: "7d",
        restore_horizon: "2d",
        retention_margin: "12h",
    });
    let mut process = ServiceProcess::spawn("dedup-service", &args, &[])?;
    let status = process
        .wait_timeout(Duration::from_secs(30))?
        .context("dedup-service must refuse to start")?;
    assert!(!status.success(), "{status}");
    let log = process.log();
    for figure in [
        "--retention 3days",
        "--client-retry-horizon 1day",
        "--broker-replay-retention 7days",
        "--restore-horizon 2days",
        "--retention-margin 12h",
        "= 7days 12h",
    ] {
        assert!(log.contains(figure), "{figure:?} not named:\n{log}");
    }
    assert!(!log.contains("serving gRPC"), "{log}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn dedup_bad_input_gets_the_right_status_and_the_service_keeps_serving() -> anyhow::Result<()>
{
    let db = TestDatabase::create().await?;
    let service = Dedup::spawn(&db, &arg_refs(&reconcile_hourly()))?;
    let mut grpc = service.grpc().await?;
    let good = || pb::BeginRequest {
        operation_id: "bad-input-1".into(),
        fingerprint: fingerprint(1),
        owner: "worker-a".into(),
        lease_ttl: None,
        occurred_at: Some(prost_types::Timestamp {
            seconds: OffsetDateTime::now_utc().unix_timestamp(),
            nanos: 0,
        }),
        request_id: String::new(),
        trace_context: Default::default(),
    };
    let expect_invalid = |result: Result<tonic::Response<pb::BeginResponse>, tonic::Status>,
                          field: &str| {
        let status = result.expect_err(field);
        assert_eq!(status.code(), Code::InvalidArgument, "{field}: {status:?}");
        assert!(
            status.message().starts_with(field),
            "{field}: {}",
            status.message()
        );
    };
    expect_invalid(
        grpc.begin(pb::BeginRequest {
            operation_id: String::new(),
            ..good()
        })
        .await,
        "operation_id",
    );
    expect_invalid(
        grpc.begin(pb::BeginRequest {
            operation_id: "x".repeat(10 * 1024),
            ..good()
        })
        .await,
        "operation_id",
    );
    expect_invalid(
        grpc.begin(pb::BeginRequest {
            fingerprint: Vec::new(),
            ..good()
        })
        .await,
        "fingerprint",
    );
    expect_invalid(
        grpc.begin(pb::BeginRequest {
            occurred_at: None,
            ..good()
        })
        .await,
        "occurred_at",
    );
    let batch = grpc
        .begin_batch(pb::BeginBatchRequest {
            items: vec![good(), good()],
        })
        .await
        .expect_err("duplicate ids");
    assert_eq!(batch.code(), Code::InvalidArgument);
    assert!(
        batch.message().starts_with("items[1].operation_id"),
        "{}",
        batch.message()
    );

    let acquired = grpc.begin(good()).await?.into_inner();
    let Some(pb::begin_response::Outcome::Acquired(acquired)) = acquired.outcome else {
        bail!("expected ACQUIRED: {acquired:?}");
    };
    let complete = |token: i64, operation_id: &str| pb::CompleteRequest {
        operation_id: operation_id.to_owned(),
        fencing_token: token,
        result: Vec::new(),
        fencing_secret: acquired.fencing_secret.clone(),
        trace_context: Default::default(),
    };
    for token in [0, -5] {
        let status = grpc
            .complete(complete(token, "bad-input-1"))
            .await
            .expect_err("non-positive token");
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(
            status.message().starts_with("fencing_token"),
            "{}",
            status.message()
        );
    }
    let forged = grpc
        .complete(complete(acquired.fencing_token + 999, "bad-input-1"))
        .await
        .expect_err("forged token");
    assert_eq!(forged.code(), Code::FailedPrecondition, "{forged:?}");
    let missing = grpc
        .complete(complete(1, "never-begun"))
        .await
        .expect_err("unknown id");
    assert_eq!(missing.code(), Code::NotFound);
    let resolve = grpc
        .resolve(pb::ResolveRequest {
            operation_id: "bad-input-1".into(),
            outcome: pb::IntentState::Reserved as i32,
            evidence: "x".into(),
            ..Default::default()
        })
        .await
        .expect_err("resolve to RESERVED");
    assert_eq!(resolve.code(), Code::InvalidArgument);
    assert!(
        resolve.message().starts_with("outcome"),
        "{}",
        resolve.message()
    );

    // Still serving: the real holder completes, and health says SERVING.
    grpc.complete(complete(acquired.fencing_token, "bad-input-1"))
        .await?;
    let channel = tonic::transport::Endpoint::from_shared(service.endpoint())?
        .connect()
        .await?;
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    let serving = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: "eos.dedup.v1.Dedup".into(),
        })
        .await?
        .into_inner();
    assert_eq!(
        serving.status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );
    drop(service);
    db.drop_database().await
}

#[tokio::test(flavor = "multi_thread")]
async fn dedup_sigterm_drains_and_exits_zero() -> anyhow::Result<()> {
    let db = TestDatabase::create().await?;
    let mut service = Dedup::spawn(&db, &[])?;
    let client = service.client()?;
    let token = acquire(&client, &params("term-1", 1, "worker-a")).await?;
    client.complete("term-1", token, Vec::new()).await?;
    let status = service.process.terminate(Duration::from_secs(30))?;
    assert!(
        status.success(),
        "{status}\n{}",
        service.process.log_tail(20)
    );
    assert!(
        service
            .process
            .log()
            .contains("boundary guarantee=exactly-once")
    );
    db.drop_database().await
}

/// Counts of one scenario run.
#[derive(Debug, Default)]
struct Tally {
    provider_calls: AtomicUsize,
    ambiguous: AtomicUsize,
    report_errors: AtomicUsize,
    begin_errors: AtomicUsize,
}

/// One delivery of an operation, as a careful caller drives it: Begin, and only on ACQUIRED call
/// the provider with the operation id as key, then report; a timeout or lost answer is
/// MarkUnknown. Loops until Begin answers SUCCEEDED (UNKNOWN and IN_PROGRESS: ask again later).
async fn deliver(
    dedup: &DedupClient,
    provider: &ProviderClient,
    operation_id: &str,
    owner: &str,
    occurred_at: OffsetDateTime,
    tally: &Tally,
) -> anyhow::Result<()> {
    let body = json!({"amount": 100 + operation_id.len() as i64, "currency": "EUR"});
    let params = BeginParams {
        operation_id: operation_id.to_owned(),
        fingerprint: Fingerprint::of_json(&body).as_bytes().to_vec(),
        owner: owner.to_owned(),
        occurred_at,
        lease_ttl: Some(Duration::from_secs(3)),
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        ensure!(
            Instant::now() < deadline,
            "{operation_id} not settled in 120 s"
        );
        let outcome = match dedup.begin(&params).await {
            Ok(outcome) => outcome,
            Err(_) => {
                tally.begin_errors.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        match outcome {
            BeginOutcome::Acquired { fencing_token, .. } => {
                tally.provider_calls.fetch_add(1, Ordering::Relaxed);
                let reported = match provider
                    .charge(operation_id, &body, Duration::from_millis(800))
                    .await
                {
                    ChargeOutcome::Applied { body, .. } => {
                        dedup.complete(operation_id, fencing_token, body).await
                    }
                    ChargeOutcome::Rejected {
                        body, retryable, ..
                    } => {
                        dedup
                            .fail(operation_id, fencing_token, &body, retryable)
                            .await
                    }
                    ChargeOutcome::Ambiguous { detail } => {
                        tally.ambiguous.fetch_add(1, Ordering::Relaxed);
                        dedup
                            .mark_unknown(operation_id, fencing_token, &detail)
                            .await
                    }
                };
                // A report that does not arrive is no reason to call again: the lease runs
                // out, the intent turns UNKNOWN and the reconciler settles it.
                if reported.is_err() {
                    tally.report_errors.fetch_add(1, Ordering::Relaxed);
                }
            }
            BeginOutcome::Succeeded { .. } => return Ok(()),
            BeginOutcome::InProgress { .. }
            | BeginOutcome::Unknown { .. }
            | BeginOutcome::Failed {
                retryable: true, ..
            } => tokio::time::sleep(Duration::from_millis(150)).await,
            other => bail!("{operation_id}: unexpected {other:?}"),
        }
    }
}

/// Runs `ops` operations, each delivered twice concurrently (duplicate deliveries).
async fn run_operations(
    dedup: &DedupClient,
    provider: &ProviderClient,
    ops: usize,
    tally: &Tally,
) -> anyhow::Result<BTreeSet<String>> {
    let occurred_at = OffsetDateTime::now_utc();
    let ids: Vec<String> = (0..ops).map(|i| format!("payments:e-{i:05}")).collect();
    let deliveries = ids
        .iter()
        .flat_map(|id| [(id.clone(), "worker-a"), (id.clone(), "worker-b")]);
    let results: Vec<anyhow::Result<()>> =
        futures::stream::iter(deliveries)
            .map(|(id, owner)| async move {
                deliver(dedup, provider, &id, owner, occurred_at, tally).await
            })
            .buffer_unordered(32)
            .collect()
            .await;
    for result in results {
        result?;
    }
    Ok(ids.into_iter().collect())
}

/// The proof (docs/ARCHITECTURE.md "Retention and the replay horizon"): the logical set by
/// operation id has exactly as many members as the provider has effects, each id once, and every
/// intent settled SUCCEEDED.
async fn assert_one_effect_per_operation(
    db: &TestDatabase,
    sim: &ProviderSim,
    ids: &BTreeSet<String>,
) -> anyhow::Result<()> {
    let effects = sim.effects().await?;
    let mut per_key: BTreeMap<&str, usize> = BTreeMap::new();
    for (key, _) in &effects {
        *per_key.entry(key.as_str()).or_default() += 1;
    }
    let doubled: Vec<_> = per_key.iter().filter(|(_, n)| **n > 1).collect();
    assert!(doubled.is_empty(), "charged more than once: {doubled:?}");
    let charged: BTreeSet<String> = per_key.keys().map(|k| (*k).to_owned()).collect();
    assert_eq!(
        &charged, ids,
        "effects by operation id differ from the operations"
    );
    assert_eq!(effects.len(), ids.len());

    let states: Vec<(String, i64)> =
        sqlx::query_as("SELECT state, count(*) FROM dedup_intents GROUP BY state ORDER BY state")
            .fetch_all(&db.pool)
            .await?;
    assert_eq!(states, vec![("SUCCEEDED".to_owned(), ids.len() as i64)]);
    Ok(())
}

async fn reconciled_count(db: &TestDatabase) -> anyhow::Result<i64> {
    Ok(sqlx::query_scalar(
        "SELECT count(*) FROM dedup_intent_history WHERE from_state = 'UNKNOWN' AND to_state = 'SUCCEEDED'",
    )
    .fetch_one(&db.pool)
    .await?)
}

const FAULTS: [&str; 10] = [
    "--seed",
    "2",
    "--drop-response-after-apply-probability",
    "0.3",
    "--error-after-apply-probability",
    "0.05",
    "--delay-after-apply",
    "2s",
    "--delay-after-apply-probability",
    "0.05",
];

#[tokio::test(flavor = "multi_thread")]
async fn dedup_ambiguous_outcomes_are_reconciled_to_one_effect_per_operation() -> anyhow::Result<()>
{
    const OPS: usize = 200;
    let db = TestDatabase::create().await?;
    let sim = ProviderSim::spawn(&FAULTS)?;
    let service = Dedup::spawn(
        &db,
        &arg_refs(&argv!(dedup_service::Config {
            provider_url: &sim.url,
            reconcile_interval: "200ms",
            in_flight_window: "3s",
        })),
    )?;
    let dedup = service.client()?;
    let provider = ProviderClient::new(&sim.url, Duration::from_secs(5), &Default::default())?;
    let tally = Tally::default();

    let ids = run_operations(&dedup, &provider, OPS, &tally).await?;
    println!("{tally:?}");

    assert_one_effect_per_operation(&db, &sim, &ids).await?;
    let ambiguous = tally.ambiguous.load(Ordering::Relaxed);
    assert!(
        ambiguous >= OPS / 5,
        "the faults must bite: {ambiguous} ambiguous answers"
    );
    assert_eq!(
        reconciled_count(&db).await?,
        ambiguous as i64,
        "every UNKNOWN settled by the reconciler"
    );
    // Two deliveries of every operation, a third of the answers lost, and still exactly one
    // provider call per operation: no blind second charge was even attempted.
    assert_eq!(tally.provider_calls.load(Ordering::Relaxed), OPS);
    assert!(client_unknown_backlog(&dedup).await?.is_empty());

    // The backlog figures are exported: u, r, the backlog, and what this instance reconciled.
    let mut service = service;
    let metrics = service.metrics().await?;
    for name in [
        "eos_dedup_unknown_backlog",
        "eos_dedup_unknown_arrival_rate",
        "eos_dedup_unknown_reconcile_rate",
        "eos_dedup_unknown_backlog_unstable",
    ] {
        assert!(metrics.contains(name), "{name} missing:\n{metrics}");
    }
    let resolved = metrics
        .lines()
        .find(|line| line.starts_with("eos_dedup_unknown_resolved_total{outcome=\"SUCCEEDED\"}"))
        .and_then(|line| line.split_whitespace().last())
        .and_then(|value| value.parse::<f64>().ok());
    assert_eq!(resolved, Some(ambiguous as f64), "{metrics}");
    drop(service);
    db.drop_database().await
}

async fn client_unknown_backlog(dedup: &DedupClient) -> anyhow::Result<Vec<pb::Intent>> {
    Ok(dedup.list_unknown(0).await?)
}

#[tokio::test(flavor = "multi_thread")]
async fn dedup_sigkill_mid_run_loses_no_intent_and_charges_once() -> anyhow::Result<()> {
    const OPS: usize = 300;
    let db = TestDatabase::create().await?;
    let sim = ProviderSim::spawn(&FAULTS)?;
    let extra = argv!(dedup_service::Config {
        provider_url: &sim.url,
        reconcile_interval: "200ms",
        in_flight_window: "3s",
    });
    let first = Dedup::spawn(&db, &arg_refs(&extra))?;
    let addr = first.grpc_addr.clone();
    // Patient enough to ride out a restart.
    let dedup = first.client()?.with_policy(RetryPolicy {
        attempts: 60,
        first_backoff: Duration::from_millis(50),
        max_backoff: Duration::from_millis(500),
        call_timeout: Duration::from_secs(2),
    });
    let provider = ProviderClient::new(&sim.url, Duration::from_secs(5), &Default::default())?;
    let tally = Tally::default();

    let chaos = {
        let db_url = db.url.clone();
        let extra = extra.clone();
        let tally = &tally;
        async move {
            let mut service = first;
            for round in 0..2 {
                tokio::time::sleep(Duration::from_millis(1200)).await;
                let calls = tally.provider_calls.load(Ordering::Relaxed);
                ensure!(
                    round > 0 || (1..OPS).contains(&calls),
                    "the first kill must land mid-run (after {calls} of {OPS} provider calls)"
                );
                let status = service.process.kill_hard()?;
                ensure!(
                    status.code().is_none(),
                    "round {round}: not killed: {status}"
                );
                tokio::time::sleep(Duration::from_millis(500)).await;
                let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
                service = Dedup::spawn_on(&db_url, &addr, &extra)?;
            }
            Ok::<_, anyhow::Error>(service)
        }
    };
    let (ids, service) = tokio::join!(run_operations(&dedup, &provider, OPS, &tally), chaos);
    let ids = ids?;
    let service = service?;
    println!("{tally:?}");

    assert_one_effect_per_operation(&db, &sim, &ids).await?;
    let intents: i64 = sqlx::query_scalar("SELECT count(*) FROM dedup_intents")
        .fetch_one(&db.pool)
        .await?;
    assert_eq!(intents, OPS as i64, "no intent lost");
    assert!(client_unknown_backlog(&dedup).await?.is_empty());
    drop(service);
    db.drop_database().await
}

#[tokio::test(flavor = "multi_thread")]
async fn dedup_retried_begin_with_its_request_id_gets_the_same_token() -> anyhow::Result<()> {
    let db = TestDatabase::create().await?;
    let service = Dedup::spawn(&db, &arg_refs(&reconcile_hourly()))?;
    let mut grpc = service.grpc().await?;
    let request = |owner: &str, request_id: &str| pb::BeginRequest {
        operation_id: "replay-1".into(),
        fingerprint: fingerprint(1),
        owner: owner.into(),
        lease_ttl: None,
        occurred_at: Some(prost_types::Timestamp {
            seconds: OffsetDateTime::now_utc().unix_timestamp(),
            nanos: 0,
        }),
        request_id: request_id.into(),
        trace_context: Default::default(),
    };
    let mut answers = Vec::new();
    for (owner, request_id) in [
        ("worker-a", "req-1"),
        ("worker-a", "req-1"),
        ("worker-b", "req-1"),
        ("worker-a", "req-2"),
    ] {
        let response = grpc.begin(request(owner, request_id)).await?.into_inner();
        let outcome = dedup_client::proto_convert::begin_outcome(response)
            .context("an answer without outcome")?;
        answers.push(outcome.label());
        if let BeginOutcome::Acquired { fencing_token, .. } = outcome {
            assert_eq!(
                fencing_token.counter, 1,
                "a replay never issues a new token"
            );
        }
    }
    // The lost answer of a Begin is recovered by its retry; anyone else waits.
    assert_eq!(
        answers,
        vec!["acquired", "acquired", "in_progress", "in_progress"]
    );
    assert_eq!(history(&db, "replay-1").await?.len(), 1);
    drop(service);
    db.drop_database().await
}

#[tokio::test(flavor = "multi_thread")]
async fn dedup_begin_batch_answers_every_item_in_order() -> anyhow::Result<()> {
    let db = TestDatabase::create().await?;
    let service = Dedup::spawn(&db, &arg_refs(&reconcile_hourly()))?;
    let client = service.client()?;
    let token = acquire(&client, &params("b-done", 1, "worker-a")).await?;
    client.complete("b-done", token, b"r".to_vec()).await?;
    let token = acquire(&client, &params("b-unknown", 1, "worker-a")).await?;
    client.mark_unknown("b-unknown", token, "timeout").await?;
    acquire(&client, &params("b-conflict", 1, "worker-a")).await?;

    let mut batch: Vec<BeginParams> = (0..496)
        .map(|i| params(&format!("b-new-{i}"), 2, "worker-b"))
        .collect();
    batch.push(params("b-done", 1, "worker-b"));
    batch.push(params("b-unknown", 1, "worker-b"));
    batch.push(params("b-conflict", 2, "worker-b"));
    let mut old = params("b-old", 1, "worker-b");
    old.occurred_at = OffsetDateTime::now_utc() - Duration::from_secs(60 * 24 * 3600);
    batch.push(old);

    // The first item carries a trace context of its own, the others none.
    let item_trace: std::collections::HashMap<String, String> = [
        (
            "traceparent".to_owned(),
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".to_owned(),
        ),
        ("baggage".to_owned(), "event_id=b-new-0".to_owned()),
    ]
    .into();
    let traced = |batch: &[BeginParams]| -> Vec<(BeginParams, opentelemetry::Context)> {
        batch
            .iter()
            .enumerate()
            .map(|(i, params)| {
                let trace = if i == 0 {
                    eos_runtime::trace_context::extract_fields(&item_trace)
                } else {
                    opentelemetry::Context::new()
                };
                (params.clone(), trace)
            })
            .collect()
    };
    let answers = client.begin_batch(&traced(&batch)).await?;
    assert_eq!(answers.len(), 500);
    // An acquisition keeps its item's trace (a reconciliation of it joins that trace), not the
    // call's.
    let stored: Vec<(String, Option<String>)> = sqlx::query_as(
        "SELECT operation_id, trace_context FROM dedup_intents \
         WHERE operation_id IN ('b-new-0', 'b-new-1') ORDER BY operation_id",
    )
    .fetch_all(&db.pool)
    .await?;
    assert_eq!(stored.len(), 2);
    let first = stored[0].1.as_deref().unwrap_or_default();
    assert!(
        first.contains("4bf92f3577b34da6a3ce929d0e0e4736") && first.contains("event_id=b-new-0"),
        "{stored:?}"
    );
    assert!(
        !stored[1]
            .1
            .as_deref()
            .unwrap_or_default()
            .contains("4bf92f3577b34da6a3ce929d0e0e4736"),
        "{stored:?}"
    );
    let labels: Vec<&str> = answers.iter().map(BeginOutcome::label).collect();
    assert!(
        labels[..496].iter().all(|label| *label == "acquired"),
        "{labels:?}"
    );
    assert_eq!(
        &labels[496..],
        &["succeeded", "unknown", "conflict", "expired"]
    );

    // The same batch again (new request ids): nothing is acquired twice.
    let again = client.begin_batch(&traced(&batch[..496])).await?;
    assert!(
        again
            .iter()
            .all(|a| matches!(a, BeginOutcome::InProgress { .. }))
    );

    // Completed in one call; a stale token fails only its own item.
    let complete = |operation_id: &str, fencing_token, result: &[u8]| CompleteItem {
        operation_id: operation_id.to_owned(),
        fencing_token,
        result: result.to_vec(),
        trace: opentelemetry::Context::new(),
    };
    let mut completes: Vec<CompleteItem> = answers[..496]
        .iter()
        .zip(&batch)
        .map(|(answer, params)| match answer {
            BeginOutcome::Acquired { fencing_token, .. } => {
                complete(&params.operation_id, *fencing_token, b"ok")
            }
            other => panic!("{other:?}"),
        })
        .collect();
    let stale_token = FencingToken {
        counter: 7,
        secret: dedup_client::FencingSecret::random(),
    };
    completes.push(complete("b-conflict", stale_token, b"stale"));
    let results = client.complete_batch(&completes).await?;
    assert_eq!(results.len(), 497);
    assert!(results[..496].iter().all(Result::is_ok));
    let stale = results[496].as_ref().expect_err("stale token");
    assert_eq!(stale.code(), Some(Code::FailedPrecondition), "{stale}");
    let succeeded: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM dedup_intents WHERE operation_id LIKE 'b-new-%' AND state = 'SUCCEEDED'",
    )
    .fetch_one(&db.pool)
    .await?;
    assert_eq!(succeeded, 496);
    let reserved: i64 =
        sqlx::query_scalar("SELECT count(*) FROM dedup_intents WHERE operation_id LIKE 'b-new-%'")
            .fetch_one(&db.pool)
            .await?;
    assert_eq!(reserved, 496);
    drop(service);
    db.drop_database().await
}

/// Group commit (docs/architecture/loop-invariants.md, dedup-service): many single calls in
/// flight at once, several with the same operation id and Begins mixed with Completes, each get
/// the answer a sequential run of the same calls gives: per id exactly one Begin acquires and
/// every other sees it in progress with the same holder; every Complete with the right token
/// succeeds (a repeat is harmless), a stale one is refused FAILED_PRECONDITION and a wrong secret
/// PERMISSION_DENIED, whatever group they landed in; a Begin racing the Complete sees the
/// operation in progress or succeeded, never acquires it again.
#[tokio::test(flavor = "multi_thread")]
async fn dedup_group_commit_answers_each_call_as_a_sequential_run_would() -> anyhow::Result<()> {
    const IDS: usize = 200;
    const CONTENDERS: usize = 4;
    let db = TestDatabase::create().await?;
    let mut service = Dedup::spawn(&db, &["--reconcile-interval", "1h"])?;
    let clients: Vec<DedupClient> = (0..4)
        .map(|_| service.client())
        .collect::<anyhow::Result<_>>()?;
    let client_of = |n: usize| &clients[n % clients.len()];
    let id = |n: usize| format!("group-{n}");

    // Every Begin of every id at once: CONTENDERS per id, all in flight together.
    let begins = (0..IDS).flat_map(|n| (0..CONTENDERS).map(move |contender| (n, contender)));
    let answers = futures::future::join_all(begins.map(|(n, contender)| {
        let params = params(&id(n), 3, &format!("worker-{contender}"));
        async move { (n, client_of(n + contender).begin(&params).await) }
    }))
    .await;
    let mut tokens: BTreeMap<usize, FencingToken> = BTreeMap::new();
    let mut holders: BTreeMap<usize, BTreeSet<String>> = BTreeMap::new();
    for (n, answer) in answers {
        match answer? {
            BeginOutcome::Acquired { fencing_token, .. } => {
                ensure!(
                    fencing_token.counter == 1,
                    "{}: token {}",
                    id(n),
                    fencing_token.counter
                );
                ensure!(
                    tokens.insert(n, fencing_token).is_none(),
                    "{} acquired twice",
                    id(n)
                );
            }
            BeginOutcome::InProgress { holder, .. } => {
                holders.entry(n).or_default().insert(holder);
            }
            other => bail!("{}: unexpected {other:?}", id(n)),
        }
    }
    ensure!(
        tokens.len() == IDS,
        "acquired {} of {IDS} ids",
        tokens.len()
    );
    for (n, seen) in &holders {
        // Everyone who lost saw one holder: the winner's (never a row half-written by a group).
        ensure!(seen.len() == 1, "{}: holders {seen:?}", id(*n));
    }
    let in_progress: usize = holders.values().map(BTreeSet::len).sum();
    ensure!(
        in_progress == IDS,
        "every id had losers that saw its holder"
    );

    // Completes, each twice (a repeat), a stale and a forged one per tenth id, and a late
    // Begin per id, all at once.
    let stale = |n: usize| FencingToken {
        counter: 2,
        secret: tokens[&n].secret,
    };
    let forged = FencingToken {
        counter: 1,
        secret: dedup_client::FencingSecret::random(),
    };
    #[derive(Debug)]
    enum Answer {
        Complete(usize, Result<pb::Intent, dedup_client::ClientError>),
        Stale(usize, Result<pb::Intent, dedup_client::ClientError>),
        Forged(usize, Result<pb::Intent, dedup_client::ClientError>),
        Begin(usize, Result<BeginOutcome, dedup_client::ClientError>),
    }
    let mut calls: Vec<futures::future::BoxFuture<'_, Answer>> = Vec::new();
    for n in 0..IDS {
        let token = tokens[&n];
        for _ in 0..2 {
            calls.push(Box::pin(async move {
                Answer::Complete(
                    n,
                    client_of(n).complete(&id(n), token, b"paid".to_vec()).await,
                )
            }));
        }
        if n % 10 == 0 {
            let stale = stale(n);
            calls.push(Box::pin(async move {
                Answer::Stale(
                    n,
                    client_of(n + 1)
                        .complete(&id(n), stale, b"x".to_vec())
                        .await,
                )
            }));
            calls.push(Box::pin(async move {
                Answer::Forged(
                    n,
                    client_of(n + 2)
                        .complete(&id(n), forged, b"x".to_vec())
                        .await,
                )
            }));
        }
        let late = params(&id(n), 3, "worker-late");
        calls.push(Box::pin(async move {
            Answer::Begin(n, client_of(n + 3).begin(&late).await)
        }));
    }
    let mut completed = 0;
    for answer in futures::future::join_all(calls).await {
        match answer {
            Answer::Complete(n, result) => {
                let intent = result.with_context(|| format!("complete {}", id(n)))?;
                ensure!(
                    intent.state == pb::IntentState::Succeeded as i32,
                    "{intent:?}"
                );
                ensure!(intent.result == b"paid", "{intent:?}");
                completed += 1;
            }
            Answer::Stale(n, result) => {
                ensure!(
                    code_of(result) == Code::FailedPrecondition,
                    "stale {}",
                    id(n)
                );
            }
            Answer::Forged(n, result) => {
                ensure!(
                    code_of(result) == Code::PermissionDenied,
                    "forged {}",
                    id(n)
                );
            }
            Answer::Begin(n, result) => match result? {
                BeginOutcome::InProgress { .. } => {}
                BeginOutcome::Succeeded { result } => ensure!(result == b"paid", "{}", id(n)),
                other => bail!("late Begin of {}: unexpected {other:?}", id(n)),
            },
        }
    }
    ensure!(completed == 2 * IDS);

    // After everything: a Begin sees the outcome, and each id's history is the sequential one.
    for n in (0..IDS).step_by(17) {
        match client_of(n)
            .begin(&params(&id(n), 3, "worker-after"))
            .await?
        {
            BeginOutcome::Succeeded { result } => ensure!(result == b"paid"),
            other => bail!("{}: unexpected {other:?}", id(n)),
        }
        let expected: Vec<HistoryRow> = vec![
            (None, "RESERVED".into(), 1),
            (Some("RESERVED".into()), "SUCCEEDED".into(), 1),
        ];
        ensure!(history(&db, &id(n)).await? == expected, "{}", id(n));
    }
    let transitions: i64 = sqlx::query_scalar("SELECT count(*) FROM dedup_intent_history")
        .fetch_one(&db.pool)
        .await?;
    ensure!(transitions == 2 * IDS as i64, "{transitions} transitions");

    // The calls were grouped: fewer Begin statements than Begin calls.
    let metrics = service.metrics().await?;
    let figure = |name: &str| -> anyhow::Result<f64> {
        metrics
            .lines()
            .find(|line| line.starts_with(name) && line.contains("method=\"Begin\""))
            .and_then(|line| line.rsplit(' ').next())
            .context(format!("{name} in {metrics}"))?
            .parse::<f64>()
            .map_err(Into::into)
    };
    let (calls, groups) = (
        figure("eos_dedup_group_commit_calls_sum")?,
        figure("eos_dedup_group_commit_calls_count")?,
    );
    ensure!(
        calls >= (IDS * (CONTENDERS + 1)) as f64,
        "{calls} Begin calls"
    );
    ensure!(
        groups < calls,
        "{groups} groups for {calls} Begin calls: nothing was grouped"
    );
    drop(service);
    db.drop_database().await
}

/// A throw-away CA and a `localhost` server certificate it signed, made with the openssl CLI.
fn make_certificates(dir: &std::path::Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=DNS:localhost\nbasicConstraints=CA:FALSE\n",
    )?;
    let steps: [&[&str]; 3] = [
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "1",
            "-subj",
            "/CN=eos-test-ca",
        ],
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=localhost",
        ],
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.pem",
            "-days",
            "1",
            "-extfile",
            "server.ext",
        ],
    ];
    for args in steps {
        let output = std::process::Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .context("cannot run openssl")?;
        ensure!(
            output.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn dedup_serves_grpc_over_tls() -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(integration_tests::unique_name("dedup-tls"));
    make_certificates(&dir)?;
    let db = TestDatabase::create().await?;
    let cert = dir.join("server.pem").display().to_string();
    let key = dir.join("server.key").display().to_string();
    let service = Dedup::spawn(
        &db,
        &arg_refs(&argv!(dedup_service::Config {
            reconcile_interval: "1h",
            tls_cert: &cert,
            tls_key: &key,
        })),
    )?;
    let port = service.grpc_addr.rsplit(':').next().unwrap_or_default();
    let tls = dedup_client::ClientTlsConfig::new()
        .ca_certificate(dedup_client::Certificate::from_pem(std::fs::read(
            dir.join("ca.pem"),
        )?))
        .domain_name("localhost");
    let client = DedupClient::connect_lazy_tls(&format!("https://localhost:{port}"), tls)?;
    let token = acquire(&client, &params("tls-1", 1, "worker-a")).await?;
    client.complete("tls-1", token, b"r".to_vec()).await?;

    // Plaintext is not served.
    let plain = DedupClient::connect_lazy(&service.endpoint())?.with_policy(RetryPolicy {
        attempts: 1,
        ..RetryPolicy::default()
    });
    assert!(plain.get("tls-1").await.is_err());
    drop(service);
    let _ = std::fs::remove_dir_all(&dir);
    db.drop_database().await
}
