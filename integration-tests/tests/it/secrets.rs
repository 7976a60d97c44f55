//! No secret in an output (docs/security.md "What is redacted"): every binary is started with a database URL
//! whose password is a marker string — on a database that cannot be reached, and with a wrong
//! password on the real server — and asked for `--help` with the marker in its environment; the
//! marker must appear in no output or log line. The services that run with it on a reachable
//! database are checked in migrate.rs (their log, `/boundary` and `/metrics`), with
//! [`assert_no_secret`].

use std::time::Duration;

use eos_testkit::argv;
use integration_tests::service_process::ServiceProcess;
use integration_tests::{TestDatabase, bootstrap_servers, create_topic, unique_name};

/// How long a service may take to give up on a database it cannot use, or to show it retries.
const GIVE_UP_TIMEOUT: Duration = Duration::from_secs(20);

/// Fails when `marker` is in the process's log, or in its `/boundary` or `/metrics` body (when
/// it logged where it serves them).
pub(crate) async fn assert_no_secret(
    process: &mut ServiceProcess,
    marker: &str,
) -> anyhow::Result<()> {
    let log = process.log();
    assert!(
        !log.contains(marker),
        "{}'s log shows the secret:\n{}",
        process.name(),
        log.lines()
            .filter(|line| line.contains(marker))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let addr = process.wait_for_log_field("metrics_addr", Duration::from_secs(30))?;
    for path in ["boundary", "metrics"] {
        let body = reqwest::get(format!("http://{addr}/{path}"))
            .await?
            .text()
            .await?;
        assert!(
            !body.is_empty(),
            "{} /{path} answered nothing",
            process.name()
        );
        assert!(
            !body.contains(marker),
            "{} /{path} shows the secret",
            process.name()
        );
    }
    Ok(())
}

/// The arguments that let each database service start apart from its database.
fn service_args(binary: &str) -> Vec<String> {
    match binary {
        "dedup-service" => argv!(dedup_service::Config {
            listen: "127.0.0.1:0",
            metrics_addr: "127.0.0.1:0",
        }),
        "sink-writer" => argv!(sink_writer::Config {
            topic: unique_name("secrets"),
            group_id: unique_name("secrets"),
            metrics_addr: "127.0.0.1:0",
        }),
        "outbox-relay" => argv!(outbox_relay::Config {
            kafka.bootstrap_servers: bootstrap_servers(),
            relay_name: unique_name("secrets"),
            metrics_addr: "127.0.0.1:0",
        }),
        "payments-api" => argv!(payments_api::Config {
            addr: "127.0.0.1:0",
            topic: unique_name("secrets"),
            metrics_addr: "127.0.0.1:0",
        }),
        other => unreachable!("{other} has no database"),
    }
}

const DATABASE_SERVICES: [&str; 4] = [
    "dedup-service",
    "sink-writer",
    "outbox-relay",
    "payments-api",
];

#[tokio::test(flavor = "multi_thread")]
async fn no_binary_prints_the_database_password_it_cannot_use() -> anyhow::Result<()> {
    let marker = unique_name("MARKERPW").replace('-', "");
    let db = TestDatabase::create().await?;
    let (_, host_and_database) = db
        .url
        .split_once('@')
        .ok_or_else(|| anyhow::anyhow!("a URL with credentials: the test database's"))?;
    let wrong_password = format!("postgres://eos:{marker}@{host_and_database}");
    let unreachable = format!("postgres://eos:{marker}@127.0.0.1:1/eos");

    let mut waits = Vec::new();
    for binary in DATABASE_SERVICES {
        for url in [&wrong_password, &unreachable] {
            let process =
                ServiceProcess::spawn(binary, &service_args(binary), &[("DATABASE_URL", url)])?;
            waits.push(process);
        }
    }
    for mut process in waits {
        // Each either exits with its error or keeps retrying; both must say why without the
        // password.
        if process.wait_timeout(GIVE_UP_TIMEOUT)?.is_none() {
            process.kill_hard()?;
        }
        let log = process.log();
        assert!(
            !log.contains(&marker),
            "{} shows the password:\n{}",
            process.name(),
            process.log_tail(20)
        );
        let said = log.to_lowercase();
        assert!(
            said.contains("postgres") || said.contains("database"),
            "{} must say what failed:\n{}",
            process.name(),
            process.log_tail(20)
        );
    }

    // eosctl's audit (of two empty topics, so it gets as far as the database): the error names
    // the flag, not the URL.
    let (input, output) = (unique_name("secrets-in"), unique_name("secrets-out"));
    create_topic(&input, 1).await?;
    create_topic(&output, 1).await?;
    let mut audit = ServiceProcess::spawn(
        "eosctl",
        &[
            "audit",
            "--bootstrap-servers",
            &bootstrap_servers(),
            "--input",
            &input,
            "--output",
            &output,
            "--database-url",
            &unreachable,
        ]
        .map(str::to_owned),
        &[],
    )?;
    let status = audit
        .wait_timeout(Duration::from_secs(60))?
        .ok_or_else(|| anyhow::anyhow!("eosctl audit still running\n{}", audit.log_tail(20)))?;
    assert!(!status.success(), "an unreachable database fails the audit");
    let log = audit.log();
    assert!(!log.contains(&marker), "{}", audit.log_tail(20));
    assert!(log.contains("--database-url"), "{}", audit.log_tail(20));
    db.drop_database().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn help_shows_no_secret_from_the_environment() -> anyhow::Result<()> {
    let marker = unique_name("MARKERPW").replace('-', "");
    let url = format!("postgres://eos:{marker}@127.0.0.1:5432/eos");
    let envs = [
        ("DATABASE_URL", url.as_str()),
        ("DEDUP_PROVIDER_AUTH", marker.as_str()),
    ];
    for binary in [
        "dedup-service",
        "sink-writer",
        "outbox-relay",
        "payments-api",
        "eos-processor",
        "provider-sim",
        "eosctl",
        "eos-lab",
    ] {
        let mut process = ServiceProcess::spawn(binary, &["--help".to_owned()], &envs)?;
        let status = process
            .wait_timeout(Duration::from_secs(30))?
            .ok_or_else(|| anyhow::anyhow!("{binary} --help still running"))?;
        assert!(status.success(), "{binary} --help: {status}");
        let help = process.log();
        assert!(help.contains("Usage"), "{binary} --help printed its usage");
        assert!(
            !help.contains(&marker),
            "{binary} --help shows a secret:\n{help}"
        );
    }
    Ok(())
}
