//! The alert rules (deploy/helm/eos-suite/files/prometheus/eos-suite.rules.yml) against a real
//! Prometheus scraping real services: each alert fires on the failure it guards against and
//! resolves when that is over. Only the rules' `for:` is shortened (to 2 s), so that an alert
//! which waits minutes in production fires within the test; every expression and threshold is
//! the file's.

use std::time::Duration;

use eos_core::{EntityId, EventId};
use eos_outbox::OutboxEvent;
use eos_testkit::argv;
use integration_tests::eosctl::{self, Workload};
use integration_tests::prometheus_server::{PrometheusServer, Targets, rules_with_for};
use integration_tests::service_process::ServiceProcess;
use integration_tests::{TestDatabase, bootstrap_servers, create_topic, unique_name};
use nix::sys::signal::Signal;
use sqlx::{Connection as _, PgConnection};

const START_TIMEOUT: Duration = Duration::from_secs(60);
const SHORT_FOR: &str = "2s";

fn metrics_addr(service: &mut ServiceProcess) -> anyhow::Result<std::net::SocketAddr> {
    Ok(service
        .wait_for_log_field("metrics_addr", START_TIMEOUT)?
        .parse()?)
}

/// In xmin mode (the mode for a server without `wal_level=logical`), a transaction left open
/// holds the relay's read order back (docs/ARCHITECTURE.md "Outbox"):
/// the rows committed after it wait, EosOutboxUnpublishedRowTooOld fires once the oldest has
/// waited past the rule's bound, and resolves when the transaction ends and the rows go out.
/// Then the table is locked by an open transaction, so the relay's read never returns: its
/// warning names the read, `/readyz` and then (past `--stall-restart`) `/healthz` answer 503 and
/// EosLoopStalled fires; all of it clears once the lock is gone. Then the relay is SIGKILLed and
/// EosTargetDown fires for its job.
#[tokio::test(flavor = "multi_thread")]
async fn outbox_staleness_and_a_dead_relay_fire_their_alerts() -> anyhow::Result<()> {
    let db = TestDatabase::create().await?;
    eos_outbox::migrator().run(&db.pool).await?;
    let topic = unique_name("alerts-outbox");
    create_topic(&topic, 3).await?;
    let bootstrap = bootstrap_servers();
    let relay_name = unique_name("alerts-relay");
    let args = argv!(outbox_relay::Config {
        kafka.bootstrap_servers: &bootstrap,
        database[database_url]: &db.url,
        relay_name: &relay_name,
        positions_topic: unique_name("alerts-positions"),
        metrics_addr: "127.0.0.1:0",
        poll_interval: "200ms",
        mode: "xmin",
        stall.stall_warning: "2s",
        stall.stall_restart: "5s",
    });
    let mut relay = ServiceProcess::spawn("outbox-relay", &args, &[])?;
    let relay_addr = metrics_addr(&mut relay)?;
    let rules = rules_with_for(SHORT_FOR)?;
    let prometheus = tokio::task::block_in_place(|| {
        PrometheusServer::start(&[("outbox-relay", Targets::Static(&[relay_addr]))], &rules)
    })?;

    let event = |n: u32| -> anyhow::Result<OutboxEvent> {
        Ok(OutboxEvent::new(
            &topic,
            EventId::new(format!("alert-{n}"))?,
            EntityId::new(format!("account-{n}"))?,
            100,
        ))
    };
    // The long transaction: it enqueues and stays open.
    let mut long = PgConnection::connect(&db.url).await?;
    sqlx::query("BEGIN").execute(&mut long).await?;
    eos_outbox::enqueue(&mut long, &event(0)?).await?;
    for n in 1..=5 {
        let mut tx = db.pool.begin().await?;
        eos_outbox::enqueue(&mut tx, &event(n)?).await?;
        tx.commit().await?;
    }
    tokio::task::block_in_place(|| {
        prometheus.wait_firing("EosOutboxUnpublishedRowTooOld", Duration::from_secs(150))
    })?;
    sqlx::query("COMMIT").execute(&mut long).await?;
    tokio::task::block_in_place(|| {
        prometheus.wait_resolved("EosOutboxUnpublishedRowTooOld", Duration::from_secs(60))
    })?;

    // A read that never returns (the table locked by an open transaction): the relay warns, its
    // stall gauge grows, /readyz and then /healthz answer 503 and EosLoopStalled fires; all of
    // it ends once the read goes through.
    let mut lock = PgConnection::connect(&db.url).await?;
    sqlx::query("BEGIN").execute(&mut lock).await?;
    sqlx::query("LOCK TABLE eos_outbox IN ACCESS EXCLUSIVE MODE")
        .execute(&mut lock)
        .await?;
    let stalled_at = std::time::Instant::now();
    tokio::task::block_in_place(|| {
        relay.wait_for_log_line("no progress while work waits", Duration::from_secs(30))
    })?;
    let health = |path: &str| {
        let url = format!("http://{relay_addr}{path}");
        async move {
            let response = reqwest::get(url).await?;
            anyhow::Ok((response.status().as_u16(), response.text().await?))
        }
    };
    let (status, body) = health("/readyz").await?;
    assert_eq!(status, 503, "/readyz while stalled: {body}");
    assert!(body.contains("a read of the outbox"), "{body}");
    tokio::time::sleep(Duration::from_secs(5).saturating_sub(stalled_at.elapsed())).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let (status, body) = loop {
        let (status, body) = health("/healthz").await?;
        if status == 503 || std::time::Instant::now() > deadline {
            break (status, body);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert_eq!(status, 503, "/healthz past --stall-restart: {body}");
    let fired = tokio::task::block_in_place(|| {
        prometheus.wait_firing("EosLoopStalled", Duration::from_secs(150))
    })?;
    assert_eq!(fired.labels["loop"], "outbox-relay", "{fired:?}");
    sqlx::query("COMMIT").execute(&mut lock).await?;
    // Rows after the lock go out, and everything clears.
    let mut tx = db.pool.begin().await?;
    eos_outbox::enqueue(&mut tx, &event(7)?).await?;
    tx.commit().await?;
    tokio::task::block_in_place(|| {
        prometheus.wait_resolved("EosLoopStalled", Duration::from_secs(60))
    })?;
    let (status, body) = health("/healthz").await?;
    assert_eq!(status, 200, "/healthz once it moves: {body}");

    relay.kill_hard()?;
    let down = tokio::task::block_in_place(|| {
        prometheus.wait_firing("EosTargetDown", Duration::from_secs(30))
    })?;
    assert_eq!(down.labels["job"], "outbox-relay", "{down:?}");
    drop(prometheus);
    db.drop_database().await
}

/// provider-sim stops answering (SIGSTOP: every call and every look-up times out), so
/// dedup-service's UNKNOWN backlog grows while nothing reconciles: EosDedupUnknownBacklogGrowing
/// fires. provider-sim resumes, the reconciler settles the backlog with it, and the alert
/// resolves.
#[tokio::test(flavor = "multi_thread")]
async fn an_unknown_backlog_that_does_not_drain_fires_and_resolves() -> anyhow::Result<()> {
    let db = TestDatabase::create().await?;
    let bootstrap = bootstrap_servers();
    let topic = unique_name("alerts-effects");
    create_topic(&topic, 3).await?;
    let args = ["--addr", "127.0.0.1:0", "--seed", "5"].map(str::to_owned);
    let mut provider = ServiceProcess::spawn("provider-sim", &args, &[])?;
    let provider_addr: std::net::SocketAddr = provider
        .wait_for_log_field("http_addr", START_TIMEOUT)?
        .parse()?;
    let args = argv!(dedup_service::Config {
        listen: "127.0.0.1:0",
        metrics_addr: "127.0.0.1:0",
        database[database_url]: &db.url,
        provider_url: format!("http://{provider_addr}"),
        provider_timeout: "500ms",
        reconcile_interval: "200ms",
        // An UNKNOWN is looked up once its call can no longer be in flight.
        in_flight_window: "2s",
        rate_window: "10s",
    });
    let mut dedup = ServiceProcess::spawn("dedup-service", &args, &[])?;
    let dedup_url = format!(
        "http://{}",
        dedup.wait_for_log_field("grpc_addr", START_TIMEOUT)?
    );
    let dedup_addr = metrics_addr(&mut dedup)?;
    let config = std::env::temp_dir().join(format!("{}.toml", unique_name("alerts-targets")));
    std::fs::write(
        &config,
        format!(
            "[[targets]]\nkind = \"provider\"\nname = \"alerts\"\ndedup_url = \"{dedup_url}\"\n\
             provider_url = \"http://{provider_addr}\"\ncall_timeout = \"500ms\"\n\
             lease_ttl = \"5s\"\n"
        ),
    )?;
    let args = argv!(sink_writer::Config {
        kafka.bootstrap_servers: &bootstrap,
        topic: &topic,
        group_id: unique_name("alerts-sink"),
        instance.instance_id: "alerts",
        database[database_url]: &db.url,
        config: config.display().to_string(),
        metrics_addr: "127.0.0.1:0",
        max_backoff: "1s",
    });
    let mut sink = ServiceProcess::spawn("sink-writer", &args, &[])?;
    let sink_addr = metrics_addr(&mut sink)?;
    let rules = rules_with_for(SHORT_FOR)?;
    let prometheus = tokio::task::block_in_place(|| {
        PrometheusServer::start(
            &[
                ("dedup-service", Targets::Static(&[dedup_addr])),
                ("sink-writer", Targets::Static(&[sink_addr])),
                ("provider-sim", Targets::Static(&[provider_addr])),
            ],
            &rules,
        )
    })?;

    provider.signal(Signal::SIGSTOP)?;
    let workload = Workload {
        count: 300,
        entities: 30,
        duplicate_ratio: 0.0,
        bad_ratio: 0.0,
        conflict_ratio: 0.0,
        rate: 50,
        seed: 71,
    };
    tokio::task::block_in_place(|| eosctl::produce_on(&bootstrap, &topic, &workload))?;
    let fired = tokio::task::block_in_place(|| {
        prometheus.wait_firing("EosDedupUnknownBacklogGrowing", Duration::from_secs(120))
    });
    // Meanwhile the sink's batches cannot commit (their outcomes are not final): its stall gauge
    // grows, marked as an outage (no restart due: /healthz stays 200).
    let sink_stalled = tokio::task::block_in_place(|| {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let stalled = prometheus.query(r#"eos_loop_stalled_seconds{loop="sink-writer"}"#)?;
            let seconds = stalled
                .first()
                .and_then(|s| s["value"][1].as_str()?.parse::<f64>().ok())
                .unwrap_or(0.0);
            if seconds >= 10.0 || std::time::Instant::now() > deadline {
                return anyhow::Ok(seconds);
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    });
    let sink_health = reqwest::get(format!("http://{sink_addr}/healthz")).await;
    provider.signal(Signal::SIGCONT)?;
    let sink_stalled = sink_stalled?;
    assert!(
        sink_stalled >= 10.0,
        "the sink's stall gauge grows while the provider does not answer: {sink_stalled}"
    );
    assert_eq!(
        sink_health?.status().as_u16(),
        200,
        "an outage is no reason to restart"
    );
    let fired = fired?;
    assert_eq!(fired.labels["job"], "dedup-service", "{fired:?}");
    // The reconciler catches up (asking the provider with the same keys), then it resolves.
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let backlog =
            tokio::task::block_in_place(|| prometheus.query("eos_dedup_unknown_backlog"))?;
        let backlog = backlog.first().map(|s| s["value"][1].clone());
        if backlog == Some("0".into()) {
            break;
        }
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "the UNKNOWN backlog is still {backlog:?}\n{}",
            dedup.log_tail(30)
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    tokio::task::block_in_place(|| {
        prometheus.wait_resolved("EosDedupUnknownBacklogGrowing", Duration::from_secs(30))
    })?;

    drop(prometheus);
    sink.stop_gracefully()?;
    dedup.stop_gracefully()?;
    provider.stop_gracefully()?;
    let _ = std::fs::remove_file(&config);
    db.drop_database().await
}
