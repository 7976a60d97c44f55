//! Progress or alarm (docs/OBSERVABILITY.md "Liveness"), in the real binaries, for the loops the
//! alerts test does not stall:
//! - a stuck loop's "how far behind" gauge goes on growing while it is stuck: eos-processor's
//!   `eos_processor_consumer_lag` during a transform call that does not return, sink-writer's
//!   `eos_sink_checkpoint_lag` while a batch does not commit;
//! - dedup-service's intent writes (the group commit) and payments-api's requests, held up by a
//!   lock on their table, are a stall: the gauge grows, the warning names what they wait for,
//!   `/readyz` and then (past `--stall-restart`) `/healthz` answer 503, and all of it clears once
//!   the writes go through.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use dedup_client::{BeginOutcome, BeginParams, DedupClient};
use eos_testkit::argv;
use integration_tests::eosctl::{self, Workload};
use integration_tests::service_process::ServiceProcess;
use integration_tests::{
    TestDatabase, bootstrap_servers, create_topic, produce_records, unique_name,
    wait_until_consumed,
};
use serde_json::json;
use sqlx::{Connection as _, PgConnection};
use time::OffsetDateTime;

const START_TIMEOUT: Duration = Duration::from_secs(60);

fn metrics_addr(service: &mut ServiceProcess) -> anyhow::Result<SocketAddr> {
    Ok(service
        .wait_for_log_field("metrics_addr", START_TIMEOUT)?
        .parse()?)
}

/// The value of `series` (name and labels, as the exporter prints them) on `addr`'s /metrics.
fn scrape(addr: SocketAddr, series: &str) -> anyhow::Result<Option<f64>> {
    let text = reqwest::blocking::get(format!("http://{addr}/metrics"))?.text()?;
    Ok(text.lines().find_map(|line| {
        line.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse::<f64>()
            .ok()
    }))
}

/// Scrapes `series` until `done` holds for its value (an absent series reads 0); the last value.
fn scrape_until(
    addr: SocketAddr,
    series: &str,
    within: Duration,
    done: impl Fn(f64) -> bool,
) -> anyhow::Result<f64> {
    let deadline = Instant::now() + within;
    loop {
        let value = scrape(addr, series)?.unwrap_or(0.0);
        if done(value) || Instant::now() > deadline {
            return Ok(value);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `GET http://addr/path`: the status and the body.
fn probe(addr: SocketAddr, path: &str) -> anyhow::Result<(u16, String)> {
    let response = reqwest::blocking::get(format!("http://{addr}{path}"))?;
    Ok((response.status().as_u16(), response.text()?))
}

/// Probes `path` until it answers `status`; the body.
fn probe_until(
    addr: SocketAddr,
    path: &str,
    status: u16,
    within: Duration,
) -> anyhow::Result<String> {
    let deadline = Instant::now() + within;
    loop {
        let (answered, body) = probe(addr, path)?;
        if answered == status {
            return Ok(body);
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{path} still answers {answered} after {within:?}: {body}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// examples/wasm/go/hostile, built into a directory of this file's own: wasm_transforms.rs builds
/// target/wasm/ with examples/wasm/build and loads from it meanwhile, so writing there could hand
/// it a module half written. Go's build cache makes this quick. Fails when Go is missing, never
/// skips (as examples/wasm/build).
fn hostile_module() -> anyhow::Result<PathBuf> {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let build = || -> anyhow::Result<PathBuf> {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .context("integration-tests lives inside the workspace")?
            .to_owned();
        let out = root.join("target/wasm/liveness/hostile.wasm");
        let status = std::process::Command::new("go")
            .current_dir(root.join("examples/wasm/go"))
            .env("GOOS", "wasip1")
            .env("GOARCH", "wasm")
            .args(["build", "-trimpath", "-buildmode=c-shared", "-o"])
            .arg(&out)
            .arg("./hostile")
            .status()
            .context("running go (Go >= 1.24 builds examples/wasm/go)")?;
        anyhow::ensure!(
            status.success(),
            "go build of examples/wasm/go/hostile failed"
        );
        Ok(out)
    };
    BUILT
        .get_or_init(|| build().map_err(|error| format!("{error:#}")))
        .clone()
        .map_err(anyhow::Error::msg)
}

/// One event of the hostile module's input: `{"id", "entity"}` plus `extra`.
fn event(id: &str, extra: serde_json::Value) -> (Option<String>, Vec<u8>) {
    let mut value = json!({"id": id, "entity": "k"});
    if let (Some(value), Some(extra)) = (value.as_object_mut(), extra.as_object()) {
        value.extend(extra.clone());
    }
    (Some("k".to_owned()), value.to_string().into_bytes())
}

fn events(prefix: &str, count: usize) -> Vec<(Option<String>, Vec<u8>)> {
    (0..count)
        .map(|n| event(&format!("{prefix}-{n}"), json!({})))
        .collect()
}

/// The processor hangs in a transform call (a module that spins on `memory.fill`, cut only by
/// `--wasm-timeout`) while events keep arriving: its consumer lag grows with each burst, the
/// stall gauge showing the same stall throughout, and falls to 0 once the call is cut and the
/// partition drains.
#[test]
fn the_consumer_lag_grows_while_the_processor_hangs_in_a_transform_call() -> anyhow::Result<()> {
    /// The hanging call's limit: long enough for two lag measurements (every 5 s) after the
    /// bursts, short enough for the test.
    const CALL_LIMIT: &str = "20s";
    let module = hostile_module()?;
    let bootstrap = bootstrap_servers();
    let input = unique_name("liveness-lag");
    let group = unique_name("liveness-lag");
    tokio::runtime::Runtime::new()?.block_on(create_topic(&input, 1))?;
    let args = argv!(eos_processor::ServiceConfig {
        processor.kafka.bootstrap_servers: &bootstrap,
        transform: format!("wasm:{}", module.display()),
        processor.event_id: "/id",
        processor.entity: "/entity",
        processor.input_topic: &input,
        processor.output_topic: unique_name("liveness-lag-out"),
        processor.group_id: &group,
        processor.instance.instance_id: "liveness-lag",
        processor.metrics_addr: "127.0.0.1:0",
        wasm_timeout: CALL_LIMIT,
        processor.transaction_timeout: "60s",
        processor.stall.stall_warning: "1s",
    });
    let mut processor = ServiceProcess::spawn("eos-processor", &args, &[])?;
    let addr = metrics_addr(&mut processor)?;
    produce_records(&input, &events("warm", 1))?;
    wait_until_consumed(&bootstrap, &group, &input, Duration::from_secs(120))
        .with_context(|| processor.log_tail(40))?;
    let lag = r#"eos_processor_consumer_lag{partition="0"}"#;
    let stalled = r#"eos_loop_stalled_seconds{loop="eos-processor"}"#;
    scrape_until(addr, lag, Duration::from_secs(15), |lag| lag == 0.0)?;

    produce_records(&input, &[event("burn", json!({"do": "memory.fill"}))])?;
    let burnt_at = Instant::now();
    let first_stall = scrape_until(addr, stalled, Duration::from_secs(15), |s| s >= 1.0)?;
    anyhow::ensure!(
        first_stall >= 1.0,
        "the call never hung\n{}",
        processor.log_tail(30)
    );
    produce_records(&input, &events("a", 10))?;
    let first = scrape_until(addr, lag, Duration::from_secs(8), |lag| lag >= 10.0)?;
    let first_stalled = scrape(addr, stalled)?.unwrap_or(0.0);
    produce_records(&input, &events("b", 20))?;
    let second = scrape_until(addr, lag, Duration::from_secs(8), |lag| lag >= 30.0)?;
    let second_stalled = scrape(addr, stalled)?.unwrap_or(0.0);
    let seen_in = burnt_at.elapsed();
    eprintln!(
        "consumer lag while the call hangs: {first} (stalled {first_stalled} s), then {second} \
         (stalled {second_stalled} s), {seen_in:?} after the hanging event"
    );
    assert!(
        first >= 10.0 && second >= 30.0,
        "the lag grows with each burst while the loop is stuck: {first} then {second}\n{}",
        processor.log_tail(20)
    );
    assert!(
        second_stalled > first_stalled && first_stalled >= 1.0,
        "one stall throughout: stalled {first_stalled} s then {second_stalled} s"
    );
    assert!(
        seen_in < Duration::from_secs(20),
        "both seen within the call's limit: {seen_in:?}"
    );

    // The call is cut (a dead letter), the partition drains, and the lag says so.
    let drained = scrape_until(addr, lag, Duration::from_secs(60), |lag| lag == 0.0)?;
    assert_eq!(drained, 0.0, "{}", processor.log_tail(20));
    let stalled_after = scrape_until(addr, stalled, Duration::from_secs(10), |s| s == 0.0)?;
    assert_eq!(stalled_after, 0.0, "the loop moves again");
    processor.stop_gracefully()?;
    Ok(())
}

/// A sink whose batch does not commit (held before its transaction by the test-only
/// `--fault-stall-before-commit`) while records keep arriving: its checkpoint lag grows with each
/// burst, the stall gauge showing the same stall throughout.
#[test]
fn the_checkpoint_lag_grows_while_the_sink_cannot_commit() -> anyhow::Result<()> {
    let db = tokio::runtime::Runtime::new()?.block_on(TestDatabase::create())?;
    let bootstrap = bootstrap_servers();
    let topic = unique_name("liveness-sink");
    tokio::runtime::Runtime::new()?.block_on(create_topic(&topic, 1))?;
    let args = argv!(sink_writer::Config {
        kafka.bootstrap_servers: &bootstrap,
        topic: &topic,
        group_id: unique_name("liveness-sink"),
        instance.instance_id: "liveness-sink",
        database[database_url]: &db.url,
        metrics_addr: "127.0.0.1:0",
        fault_stall_before_commit: "60s",
        stall.stall_warning: "1s",
    });
    let mut sink = ServiceProcess::spawn("sink-writer", &args, &[])?;
    let addr = metrics_addr(&mut sink)?;
    sink.wait_for_log_line("partition positioned", START_TIMEOUT)?;
    let burst = |count, seed| {
        eosctl::produce(
            &topic,
            &Workload {
                count,
                entities: 10,
                duplicate_ratio: 0.0,
                bad_ratio: 0.0,
                conflict_ratio: 0.0,
                rate: 0,
                seed,
            },
        )
    };
    burst(10, 1)?;
    let held_at = Instant::now();
    sink.wait_for_log_line(
        "stalling before the batch transaction",
        Duration::from_secs(30),
    )?;
    let lag = r#"eos_sink_checkpoint_lag{partition="0"}"#;
    let stalled = r#"eos_loop_stalled_seconds{loop="sink-writer"}"#;
    scrape_until(addr, stalled, Duration::from_secs(10), |s| s >= 1.0)?;
    let first = scrape_until(addr, lag, Duration::from_secs(8), |lag| lag >= 10.0)?;
    let first_stalled = scrape(addr, stalled)?.unwrap_or(0.0);
    burst(20, 2)?;
    let second = scrape_until(addr, lag, Duration::from_secs(8), |lag| lag >= 30.0)?;
    let second_stalled = scrape(addr, stalled)?.unwrap_or(0.0);
    eprintln!(
        "checkpoint lag while the batch is held: {first} (stalled {first_stalled} s), then \
         {second} (stalled {second_stalled} s), {:?} after the batch was held",
        held_at.elapsed()
    );
    assert!(
        first >= 10.0 && second >= 30.0,
        "the lag grows with each burst while nothing commits: {first} then {second}\n{}",
        sink.log_tail(20)
    );
    assert!(
        second_stalled > first_stalled && first_stalled >= 1.0,
        "one stall throughout: stalled {first_stalled} s then {second_stalled} s"
    );
    assert!(
        held_at.elapsed() < Duration::from_secs(60),
        "all of it within the one held batch"
    );
    sink.kill_hard()?;
    tokio::runtime::Runtime::new()?.block_on(db.drop_database())
}

/// Single Begin calls wait on a lock on `dedup_intents` (their group commit cannot write): the
/// `dedup-intent-writes` stall grows, the warning names the group commit, `/readyz` and then
/// `/healthz` answer 503, and the gRPC health service says the same (NOT_SERVING overall: the
/// Helm chart's liveness probe is gRPC). Once the lock goes, the calls are answered and all of it
/// clears.
#[tokio::test(flavor = "multi_thread")]
async fn a_group_commit_that_cannot_write_is_a_stall_and_clears() -> anyhow::Result<()> {
    let db = TestDatabase::create().await?;
    let args = argv!(dedup_service::Config {
        listen: "127.0.0.1:0",
        metrics_addr: "127.0.0.1:0",
        database[database_url]: &db.url,
        reconcile_interval: "1h",
        stall.stall_warning: "1s",
        stall.stall_restart: "3s",
    });
    let mut dedup = ServiceProcess::spawn("dedup-service", &args, &[])?;
    let grpc_addr = dedup.wait_for_log_field("grpc_addr", START_TIMEOUT)?;
    let addr = metrics_addr(&mut dedup)?;
    let client = DedupClient::connect_lazy(&format!("http://{grpc_addr}"))?;
    let params = |n: usize| BeginParams {
        operation_id: format!("liveness:{n}"),
        fingerprint: vec![7; 32],
        owner: "liveness".to_owned(),
        occurred_at: OffsetDateTime::now_utc(),
        lease_ttl: None,
    };
    anyhow::ensure!(matches!(
        client.begin(&params(0)).await?,
        BeginOutcome::Acquired { .. }
    ));

    let mut lock = PgConnection::connect(&db.url).await?;
    sqlx::query("BEGIN").execute(&mut lock).await?;
    sqlx::query("LOCK TABLE dedup_intents IN ACCESS EXCLUSIVE MODE")
        .execute(&mut lock)
        .await?;
    let calls: Vec<_> = (1..=4)
        .map(|n| {
            let (client, params) = (client.clone(), params(n));
            tokio::spawn(async move { client.begin(&params).await })
        })
        .collect();
    let held_at = Instant::now();
    // The reconciler's first pass may wait on the lock too and warn of its own loop.
    let warning = tokio::task::block_in_place(|| {
        dedup.wait_for_log_line(
            r#"no progress while work waits loop="dedup-intent-writes""#,
            Duration::from_secs(20),
        )
    })?;
    assert!(warning.contains("group commit"), "{warning}");
    let (ready, body) = tokio::task::block_in_place(|| probe(addr, "/readyz"))?;
    assert_eq!(ready, 503, "/readyz while the writes wait: {body}");
    let health = tokio::task::block_in_place(|| {
        probe_until(addr, "/healthz", 503, Duration::from_secs(10))
    })?;
    // /healthz names one stall that is past --stall-restart: the writes', or the reconciler's
    // when its pass waits on the same lock (its start under load can fall inside it). The
    // writes' own stall is checked by its warning above and its gauge below.
    assert!(
        health.contains("dedup-intent-writes") || health.contains("dedup-reconciler"),
        "{health}"
    );
    // The gRPC health service follows the stall state once a second.
    let overall = grpc_health_until(
        &grpc_addr,
        tonic_health::pb::health_check_response::ServingStatus::NotServing,
        Duration::from_secs(5),
    )
    .await?;
    let stalled = tokio::task::block_in_place(|| {
        scrape(
            addr,
            r#"eos_loop_stalled_seconds{loop="dedup-intent-writes"}"#,
        )
    })?
    .unwrap_or(0.0);
    eprintln!(
        "writes held {:?}: stalled {stalled} s, gRPC health {overall:?}",
        held_at.elapsed()
    );
    // The gauge is set once a second (the watch's check), so it may trail the probe that
    // already saw more than --stall-restart (3 s) by up to that second (seen: 2.96 s).
    assert!(stalled >= 2.0, "{stalled}");
    assert_eq!(
        overall,
        tonic_health::pb::health_check_response::ServingStatus::NotServing as i32,
        "the gRPC liveness probe sees it too"
    );

    sqlx::query("COMMIT").execute(&mut lock).await?;
    for call in calls {
        let outcome = call.await??;
        assert!(
            matches!(outcome, BeginOutcome::Acquired { .. }),
            "{outcome:?}"
        );
    }
    tokio::task::block_in_place(|| {
        probe_until(addr, "/healthz", 200, Duration::from_secs(10))?;
        probe_until(addr, "/readyz", 200, Duration::from_secs(10))
    })?;
    let stalled = tokio::task::block_in_place(|| {
        scrape_until(
            addr,
            r#"eos_loop_stalled_seconds{loop="dedup-intent-writes"}"#,
            Duration::from_secs(5),
            |s| s == 0.0,
        )
    })?;
    assert_eq!(stalled, 0.0);
    let overall = grpc_health_until(
        &grpc_addr,
        tonic_health::pb::health_check_response::ServingStatus::Serving,
        Duration::from_secs(5),
    )
    .await?;
    assert_eq!(
        overall,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32,
        "gRPC health serves again"
    );
    dedup.stop_gracefully()?;
    db.drop_database().await
}

/// The server's gRPC health status at `grpc_addr` once it is `wanted`, asked every 200 ms; the
/// last status seen if it is not within `within`.
async fn grpc_health_until(
    grpc_addr: &str,
    wanted: tonic_health::pb::health_check_response::ServingStatus,
    within: Duration,
) -> anyhow::Result<i32> {
    let deadline = Instant::now() + within;
    loop {
        let status = grpc_health(grpc_addr, "").await?;
        if status == wanted as i32 || Instant::now() >= deadline {
            return Ok(status);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The gRPC health status of `service` ("" is the server's) at `grpc_addr`.
async fn grpc_health(grpc_addr: &str, service: &str) -> anyhow::Result<i32> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{grpc_addr}"))?
        .connect()
        .await?;
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    Ok(health
        .check(tonic_health::pb::HealthCheckRequest {
            service: service.to_owned(),
        })
        .await?
        .into_inner()
        .status)
}

/// Payments wait on a lock on the accounts table: the `payments-api` stall grows, the warning
/// names PostgreSQL, `/readyz` and then `/healthz` answer 503 (PostgreSQL itself answers the
/// readiness query meanwhile). Once the lock goes, the payments are recorded and all of it
/// clears.
#[tokio::test(flavor = "multi_thread")]
async fn payments_that_wait_on_postgresql_are_a_stall_and_clear() -> anyhow::Result<()> {
    let db = TestDatabase::create().await?;
    let args = argv!(payments_api::Config {
        addr: "127.0.0.1:0",
        metrics_addr: "127.0.0.1:0",
        database[database_url]: &db.url,
        topic: "payments",
        stall.stall_warning: "1s",
        stall.stall_restart: "3s",
    });
    let mut api = ServiceProcess::spawn("payments-api", &args, &[])?;
    let http_addr = api.wait_for_log_field("http_addr", START_TIMEOUT)?;
    let addr = metrics_addr(&mut api)?;
    let client = reqwest::Client::new();
    let pay = |key: String| {
        let request = client
            .post(format!("http://{http_addr}/payments"))
            .header("content-type", "application/json")
            .header("idempotency-key", key)
            .body(r#"{"account_id":"acct-1","amount":100,"currency":"EUR"}"#);
        async move { anyhow::Ok(request.send().await?.status().as_u16()) }
    };
    assert_eq!(pay("key-0".into()).await?, 201);

    let mut lock = PgConnection::connect(&db.url).await?;
    sqlx::query("BEGIN").execute(&mut lock).await?;
    sqlx::query("LOCK TABLE payments_api_accounts IN ACCESS EXCLUSIVE MODE")
        .execute(&mut lock)
        .await?;
    let payments: Vec<_> = (1..=3)
        .map(|n| tokio::spawn(pay(format!("key-{n}"))))
        .collect();
    let held_at = Instant::now();
    let warning = tokio::task::block_in_place(|| {
        api.wait_for_log_line("no progress while work waits", Duration::from_secs(20))
    })?;
    assert!(
        warning.contains("payments-api") && warning.contains("PostgreSQL to record a payment"),
        "{warning}"
    );
    let (ready, body) = tokio::task::block_in_place(|| probe(addr, "/readyz"))?;
    assert_eq!(ready, 503, "/readyz while the payments wait: {body}");
    let health = tokio::task::block_in_place(|| {
        probe_until(addr, "/healthz", 503, Duration::from_secs(10))
    })?;
    assert!(
        health.contains("PostgreSQL to record a payment"),
        "{health}"
    );
    let stalled = tokio::task::block_in_place(|| {
        scrape(addr, r#"eos_loop_stalled_seconds{loop="payments-api"}"#)
    })?
    .unwrap_or(0.0);
    eprintln!("payments held {:?}: stalled {stalled} s", held_at.elapsed());
    // The gauge is set once a second (the watch's check), so it may trail the probe that
    // already saw more than --stall-restart (3 s) by up to that second (seen: 2.96 s).
    assert!(stalled >= 2.0, "{stalled}");

    sqlx::query("COMMIT").execute(&mut lock).await?;
    for payment in payments {
        assert_eq!(payment.await??, 201);
    }
    tokio::task::block_in_place(|| {
        probe_until(addr, "/healthz", 200, Duration::from_secs(10))?;
        probe_until(addr, "/readyz", 200, Duration::from_secs(10))
    })?;
    api.stop_gracefully()?;
    db.drop_database().await
}
