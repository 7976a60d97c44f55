//! Start order: a service started before its PostgreSQL is reachable waits for it, logging each
//! retry, and serves once it is there; a login the server refuses stops it at once, and a
//! shutdown while waiting exits cleanly. This is `eos_runtime::postgres_pool::PoolBuilder`'s
//! start-up connect, which every service with tables uses (docs/ARCHITECTURE.md "Crates").

use std::time::{Duration, Instant};

use anyhow::Context as _;
use eos_testkit::argv;
use integration_tests::service_process::ServiceProcess;
use integration_tests::{TestDatabase, unique_name};
use reqwest::Url;
use tokio::net::{TcpListener, TcpStream};

use crate::payments_api::spawn_relay;
use crate::postgres_tls::wait_ready;

const RETRY_LOGGED: &str = "PostgreSQL unreachable at start; retrying";
const TIMEOUT: Duration = Duration::from_secs(60);

/// Relays every connection to `listener` on to `upstream`, until the task is dropped.
async fn forward(listener: TcpListener, upstream: String) {
    while let Ok((mut inbound, _)) = listener.accept().await {
        let upstream = upstream.clone();
        tokio::spawn(async move {
            if let Ok(mut outbound) = TcpStream::connect(&upstream).await {
                let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
            }
        });
    }
}

/// dedup-service on `database_url`, on ports of its own.
fn spawn_dedup(database_url: &str) -> anyhow::Result<ServiceProcess> {
    let args = argv!(dedup_service::Config {
        database[database_url]: database_url,
        listen: "127.0.0.1:0",
        metrics_addr: "127.0.0.1:0",
    });
    ServiceProcess::spawn("dedup-service", &args, &[])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn services_wait_for_a_late_postgres_and_stop_at_once_on_a_refused_login()
-> anyhow::Result<()> {
    let db = TestDatabase::create().await?;
    let real: Url = db.url.parse().context("the test database's URL")?;
    let upstream = format!(
        "{}:{}",
        real.host_str().context("a host")?,
        real.port().unwrap_or(5432)
    );
    // A loopback port nothing listens on yet: PostgreSQL "is not up".
    let late_port = eos_testkit::loopback_ports::free_loopback_ports(1)?[0];
    let mut late = real.clone();
    late.set_port(Some(late_port))
        .map_err(|()| anyhow::anyhow!("cannot set the port"))?;
    let late_url = late.to_string();

    let mut dedup = spawn_dedup(&late_url)?;
    let mut relay = spawn_relay(&late_url, &[], &[])?;
    let topic = unique_name("payments");
    let args = argv!(payments_api::Config {
        addr: "127.0.0.1:0",
        metrics_addr: "127.0.0.1:0",
        database[database_url]: &late_url,
        topic: &topic,
    });
    let mut payments = ServiceProcess::spawn("payments-api", &args, &[])?;
    let mut cancelled = spawn_dedup(&late_url)?;
    for process in [&mut *dedup, &mut *relay, &mut *payments, &mut *cancelled] {
        process.wait_for_log_line(RETRY_LOGGED, TIMEOUT)?;
    }
    // Still waiting a while later, not crash-looping.
    tokio::time::sleep(Duration::from_secs(2)).await;
    for process in [&mut *dedup, &mut *relay, &mut *payments, &mut *cancelled] {
        assert!(
            process.is_running(),
            "{} exited while PostgreSQL was unreachable:\n{}",
            process.name(),
            process.log_tail(30)
        );
    }
    // A shutdown while waiting is a clean exit.
    let status = cancelled.terminate(Duration::from_secs(10))?;
    assert!(status.success(), "SIGTERM while waiting exits 0: {status}");

    // PostgreSQL "comes up": each service connects, migrates and becomes ready.
    let listener = TcpListener::bind(("127.0.0.1", late_port)).await?;
    let forwarder = tokio::spawn(forward(listener, upstream));
    for process in [&mut dedup, &mut relay, &mut payments] {
        wait_ready(process).await?;
    }
    for process in [&mut dedup, &mut relay, &mut payments] {
        process.stop_gracefully()?;
    }
    forwarder.abort();

    // A login the server refuses cannot pass by waiting: the service stops at once, non-zero.
    let mut refused = real.clone();
    refused
        .set_password(Some("not-the-password"))
        .map_err(|()| anyhow::anyhow!("cannot set the password"))?;
    let started = Instant::now();
    let mut wrong_password = spawn_dedup(refused.as_str())?;
    let status = wrong_password
        .wait_timeout(Duration::from_secs(20))?
        .with_context(|| {
            format!(
                "a refused login still running after 20 s:\n{}",
                wrong_password.log_tail(30)
            )
        })?;
    assert!(!status.success(), "a refused login exits non-zero");
    let log = wrong_password.log();
    assert!(
        log.contains("password authentication failed") && !log.contains(RETRY_LOGGED),
        "a refused login is named and not retried:\n{log}"
    );
    assert!(started.elapsed() < Duration::from_secs(20));
    db.drop_database().await
}
