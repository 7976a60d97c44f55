//! The Helm chart's production database path, run for real (deploy/helm/eos-suite/README.md,
//! "What the chart needs from you"): PostgreSQL with a server certificate from a private CA and
//! TLS required, each role's password apart from its URL.
//!
//! The test starts a PostgreSQL of its own on a free loopback port (`initdb` and `postgres` from
//! the server package `deploy/local/stack` installs), whose `pg_hba.conf` admits TCP only over
//! TLS (`hostssl`), with a certificate from a CA made here. As the chart's migration Job does,
//! each service's `migrate` runs as the schema owner; then dedup-service, sink-writer,
//! outbox-relay and payments-api start as a runtime role with only row privileges and
//! `EOS_SKIP_MIGRATIONS=true`. Every one of them gets what the chart gives its pods: a
//! `DATABASE_URL` without a password, with `sslmode=verify-full&sslrootcert=<the CA>`, and the
//! password in a file named by `DATABASE_PASSWORD_FILE`. Each must become ready with only TLS
//! backends, and with another CA each `migrate` must be refused, saying the certificate is the
//! reason. Nothing is shared with other tests: the server, its data directory and its port are
//! this test's, and go with it, failed or not.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use eos_runtime::postgres_pool::PoolBuilder;
use eos_runtime::secrets::url_with_password;
use eos_testkit::{ChildProcess, LogMode, argv};
use integration_tests::service_process::{ServiceProcess, log_dir};
use integration_tests::test_certs::TestCa;
use integration_tests::{bootstrap_servers, create_topic, unique_name};
use sqlx::PgPool;

use crate::secrets::assert_no_secret;

const START_TIMEOUT: Duration = Duration::from_secs(60);
/// The services with tables, in the order the chart's migration Job runs their `migrate`.
const DATABASE_SERVICES: [&str; 4] = [
    "dedup-service",
    "sink-writer",
    "outbox-relay",
    "payments-api",
];
const OWNER: &str = "eos_owner";
const RUNTIME_ROLE: &str = "eos_app";
const DATABASE: &str = "eos";

/// The newest PostgreSQL server's binaries (Debian's layout, as `deploy/local/stack` installs
/// them).
fn postgres_bin_dir() -> anyhow::Result<PathBuf> {
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .context("no /usr/lib/postgresql: run `deploy/local/stack up`, which installs PostgreSQL")?
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let version = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            bin.join("postgres").exists().then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions
        .pop()
        .map(|(_, bin)| bin)
        .context("no PostgreSQL server binaries under /usr/lib/postgresql/*/bin")
}

/// The uid and gid the server runs as: PostgreSQL refuses to run as root, so a root test runs it
/// as the `postgres` OS user; anyone else runs it as themselves.
fn server_user() -> anyhow::Result<Option<(u32, u32)>> {
    let id = |args: &[&str]| -> anyhow::Result<u32> {
        let output = Command::new("id").args(args).output()?;
        ensure!(output.status.success(), "id {args:?} failed");
        Ok(String::from_utf8(output.stdout)?.trim().parse()?)
    };
    if id(&["-u"])? != 0 {
        return Ok(None);
    }
    let uid = id(&["-u", "postgres"]).context("running as root needs the postgres OS user")?;
    Ok(Some((uid, id(&["-g", "postgres"])?)))
}

/// A password with characters that mean something in a URL, so the services' percent-encoding
/// is what lets them in.
fn awkward_password(prefix: &str) -> String {
    format!("{prefix}:p@ss/w?rd#%41&'{:016x}", rand::random::<u64>())
}

/// A PostgreSQL server of this test's own, TLS required on TCP; stopped and its directory removed
/// on drop.
struct PrivatePostgres {
    /// `None` once stopped.
    server: Option<ChildProcess>,
    dir: PathBuf,
    port: u16,
    ca: TestCa,
    owner_password: String,
}

impl PrivatePostgres {
    /// initdb, a server certificate from a new CA, and the server started on a free port.
    /// Blocking.
    fn start() -> anyhow::Result<Self> {
        let bin = postgres_bin_dir()?;
        let user = server_user()?;
        let dir = std::env::temp_dir().join(unique_name("eos-it-private-postgres"));
        let (data, socket) = (dir.join("data"), dir.join("socket"));
        for path in [&data, &socket] {
            std::fs::create_dir_all(path)?;
        }
        let port = eos_testkit::loopback_ports::free_loopback_ports(1)?[0];
        let ca = TestCa::new(&dir.join("ca"))?;
        let server_cert = ca.issue("server", &["127.0.0.1", "localhost"])?;
        let owner_password = awkward_password("owner");
        let password_file = dir.join("owner-password");
        std::fs::write(&password_file, format!("{owner_password}\n"))?;
        let mut postgres = Self {
            server: None,
            dir,
            port,
            ca,
            owner_password,
        };

        // The server reads its data, socket directory, key and password file as its own user;
        // it refuses a key others can read.
        use std::os::unix::fs::PermissionsExt as _;
        for (path, mode) in [
            (&data, 0o700),
            (&socket, 0o700),
            (&server_cert.key_file, 0o600),
            (&password_file, 0o600),
        ] {
            if let Some((uid, gid)) = user {
                std::os::unix::fs::chown(path, Some(uid), Some(gid))?;
            }
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
        }
        let as_server_user = |program: &str| {
            let mut command = Command::new(bin.join(program));
            if let Some((uid, gid)) = user {
                use std::os::unix::process::CommandExt as _;
                command.uid(uid).gid(gid);
            }
            // Its working directory must be one it can read.
            command.current_dir(&postgres.dir);
            command
        };

        let output = as_server_user("initdb")
            .arg("--pgdata")
            .arg(&data)
            .args(["--username", OWNER, "--encoding", "UTF8", "--locale", "C"])
            .arg(format!("--pwfile={}", password_file.display()))
            .args([
                "--auth-local",
                "trust",
                "--auth-host",
                "scram-sha-256",
                "--no-sync",
            ])
            .output()
            .context("cannot run initdb")?;
        ensure!(
            output.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        // TCP only over TLS: a connection without it finds no entry and is refused.
        std::fs::write(
            data.join("pg_hba.conf"),
            "local all all trust\nhostssl all all 127.0.0.1/32 scram-sha-256\n",
        )?;

        let mut command = as_server_user("postgres");
        command.arg("-D").arg(&data).args(["-p", &port.to_string()]);
        command.arg("-k").arg(&socket);
        for setting in [
            "listen_addresses=127.0.0.1".to_owned(),
            "ssl=on".to_owned(),
            format!("ssl_cert_file={}", server_cert.cert_file.display()),
            format!("ssl_key_file={}", server_cert.key_file.display()),
            "fsync=off".to_owned(),
            "max_connections=60".to_owned(),
            // outbox-relay's default mode reads a logical replication slot.
            "wal_level=logical".to_owned(),
        ] {
            command.args(["-c", &setting]);
        }
        std::fs::create_dir_all(log_dir())?;
        let log = log_dir().join(format!("{}.log", unique_name("private-postgres")));
        postgres.server = Some(ChildProcess::spawn(
            "private-postgres",
            command,
            &log,
            LogMode::Truncate,
        )?);
        Ok(postgres)
    }

    /// `postgres://<role>@127.0.0.1:<port>/<database>?sslmode=verify-full&sslrootcert=<ca>`, as
    /// the chart's values spell it: no password.
    fn url(&self, role: &str, database: &str, ca_file: &Path, extra: &str) -> String {
        format!(
            "postgres://{role}@127.0.0.1:{}/{database}?sslmode=verify-full&sslrootcert={}{extra}",
            self.port,
            ca_file.display()
        )
    }

    /// The owner's pool in `database` (over TLS, verify-full), once the server answers.
    async fn owner_pool(&mut self, database: &str) -> anyhow::Result<PgPool> {
        let url = self.url(OWNER, database, &self.ca.cert_file, "");
        let url = url_with_password(&url, &self.owner_password)?;
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            match PoolBuilder::new(2).connect(&url).await {
                Ok(pool) => return Ok(pool),
                Err(error) => {
                    let server = self.server.as_mut().context("the server was stopped")?;
                    if !server.is_running() || Instant::now() > deadline {
                        bail!(
                            "the private PostgreSQL does not answer: {error}\n{}",
                            server.log_tail(30)
                        );
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// A fast shutdown (SIGINT: sessions still open are ended), else SIGKILL.
    fn stop(&mut self) {
        let Some(mut server) = self.server.take() else {
            return;
        };
        let stopped = server
            .signal(nix::sys::signal::Signal::SIGINT)
            .and_then(|()| server.wait_timeout(Duration::from_secs(20)));
        if !matches!(stopped, Ok(Some(_)))
            && let Err(error) = server.kill_hard()
        {
            eprintln!("could not stop the private PostgreSQL: {error:#}");
        }
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        // The server first: its files are open until it is gone.
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Runs `<binary> migrate` with `envs`: (exited 0, its log).
fn run_migrate(binary: &str, envs: &[(&str, &str)]) -> anyhow::Result<(bool, String)> {
    let args = argv!(subcommand eos_runtime::service_flags::MigrateArgs {});
    let mut process = ServiceProcess::spawn(binary, &args, envs)?;
    let status = process
        .wait_timeout(START_TIMEOUT)?
        .with_context(|| format!("{binary} migrate still running\n{}", process.log_tail(30)))?;
    Ok((status.success(), process.log()))
}

/// A database service started as the chart starts it (its own listen addresses, Kafka for the
/// sink and the relay), with the database settings in `envs`.
fn spawn_service(
    binary: &str,
    topic: &str,
    envs: &[(&str, &str)],
) -> anyhow::Result<ServiceProcess> {
    let bootstrap = bootstrap_servers();
    let args = match binary {
        "dedup-service" => argv!(dedup_service::Config {
            listen: "127.0.0.1:0",
            metrics_addr: "127.0.0.1:0",
        }),
        "sink-writer" => argv!(sink_writer::Config {
            kafka.bootstrap_servers: bootstrap,
            topic: topic,
            group_id: unique_name("tls-pg-sink"),
            instance.instance_id: "tls-pg-sink-0",
            max_backoff: "1s",
            metrics_addr: "127.0.0.1:0",
        }),
        "outbox-relay" => argv!(outbox_relay::Config {
            kafka.bootstrap_servers: bootstrap,
            relay_name: unique_name("tls-pg-relay"),
            positions_topic: unique_name("tls-pg-positions"),
            metrics_addr: "127.0.0.1:0",
        }),
        "payments-api" => argv!(payments_api::Config {
            addr: "127.0.0.1:0",
            topic: topic,
            metrics_addr: "127.0.0.1:0",
        }),
        other => bail!("{other} has no database"),
    };
    ServiceProcess::spawn(binary, &args, envs)
}

/// Waits until the service's `/readyz` answers 200: connected, schema checked, working.
pub(crate) async fn wait_ready(process: &mut ServiceProcess) -> anyhow::Result<String> {
    let ops =
        tokio::task::block_in_place(|| process.wait_for_log_field("metrics_addr", START_TIMEOUT))?;
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()?;
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        let ready = client
            .get(format!("http://{ops}/readyz"))
            .send()
            .await
            .is_ok_and(|answer| answer.status().is_success());
        if ready {
            return Ok(ops);
        }
        ensure!(
            process.is_running() && Instant::now() < deadline,
            "{} did not become ready\n{}",
            process.name(),
            process.log_tail(40)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn every_service_and_migration_connects_with_verify_full_and_a_password_file_and_another_ca_is_refused()
-> anyhow::Result<()> {
    use tokio::task::block_in_place;

    let mut postgres = block_in_place(PrivatePostgres::start)?;
    let server_pool = postgres.owner_pool("postgres").await?;
    sqlx::query(&format!("CREATE DATABASE {DATABASE}"))
        .execute(&server_pool)
        .await?;
    server_pool.close().await;
    let owner_pool = postgres.owner_pool(DATABASE).await?;
    // The runtime role with the grants of docs/security.md, given before the first migrate
    // (REPLICATION: outbox-relay's logical mode).
    let runtime_password = awkward_password("runtime");
    sqlx::raw_sql(&format!(
        "CREATE ROLE {RUNTIME_ROLE} LOGIN PASSWORD '{}';
         GRANT USAGE ON SCHEMA public TO {RUNTIME_ROLE};
         ALTER DEFAULT PRIVILEGES IN SCHEMA public
             GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO {RUNTIME_ROLE};
         ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT USAGE ON SEQUENCES TO {RUNTIME_ROLE};
         ALTER ROLE {RUNTIME_ROLE} REPLICATION;",
        runtime_password.replace('\'', "''")
    ))
    .execute(&owner_pool)
    .await?;
    // Each role's password in a file of its own, as the chart mounts a Secret's key.
    let owner_password_file = postgres.dir.join("owner.password");
    let runtime_password_file = postgres.dir.join("runtime.password");
    std::fs::write(
        &owner_password_file,
        format!("{}\n", postgres.owner_password),
    )?;
    std::fs::write(&runtime_password_file, format!("{runtime_password}\n"))?;
    let owner_password_path = owner_password_file.display().to_string();
    let runtime_password_path = runtime_password_file.display().to_string();

    // Without TLS the server admits no one: every connection below that works is TLS.
    let plaintext = format!(
        "postgres://{OWNER}@127.0.0.1:{}/{DATABASE}?sslmode=disable",
        postgres.port
    );
    let (ok, log) = block_in_place(|| {
        run_migrate(
            "sink-writer",
            &[
                ("DATABASE_URL", &plaintext),
                ("DATABASE_PASSWORD_FILE", &owner_password_path),
            ],
        )
    })?;
    assert!(!ok, "a plaintext connection was admitted:\n{log}");
    assert!(
        log.contains("pg_hba.conf"),
        "the server refused it for want of TLS:\n{log}"
    );

    // The migration Job: every service's migrate, as the owner.
    let owner_url = postgres.url(OWNER, DATABASE, &postgres.ca.cert_file, "");
    for binary in DATABASE_SERVICES {
        let (ok, log) = block_in_place(|| {
            run_migrate(
                binary,
                &[
                    ("DATABASE_URL", &owner_url),
                    ("DATABASE_PASSWORD_FILE", &owner_password_path),
                ],
            )
        })?;
        assert!(ok, "{binary} migrate over verify-full failed:\n{log}");
        assert!(
            log.contains("schema is current"),
            "{binary} migrate:\n{log}"
        );
        assert!(
            !log.contains(&postgres.owner_password),
            "{binary} migrate shows the password"
        );
    }

    // The services, as the runtime role with migrations skipped, each under its own
    // application_name so its backends can be found.
    let topic = unique_name("tls-pg-ledger");
    create_topic(&topic, 1).await?;
    let mut services = Vec::new();
    for binary in DATABASE_SERVICES {
        let url = postgres.url(
            RUNTIME_ROLE,
            DATABASE,
            &postgres.ca.cert_file,
            &format!("&application_name=eos-it-tls-{binary}"),
        );
        let envs = [
            ("DATABASE_URL", url.as_str()),
            ("DATABASE_PASSWORD_FILE", runtime_password_path.as_str()),
            ("EOS_SKIP_MIGRATIONS", "true"),
        ];
        services.push((binary, spawn_service(binary, &topic, &envs)?));
    }
    for (binary, process) in &mut services {
        let ops = wait_ready(process).await?;
        let backends: Vec<(String, bool)> = sqlx::query_as(
            "SELECT a.usename::text, s.ssl FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) \
             WHERE a.application_name = $1",
        )
        .bind(format!("eos-it-tls-{binary}"))
        .fetch_all(&owner_pool)
        .await?;
        assert!(
            !backends.is_empty(),
            "{binary} (ready at {ops}) has no backend"
        );
        for (role, ssl) in backends {
            assert_eq!(role, RUNTIME_ROLE, "{binary} connects as the runtime role");
            assert!(ssl, "{binary}: a backend without TLS");
        }
        assert_no_secret(process, &runtime_password).await?;
    }

    // A payment through payments-api: a row written by the runtime role over TLS.
    let (_, api) = services
        .iter_mut()
        .find(|(binary, _)| *binary == "payments-api")
        .context("payments-api runs")?;
    let api_addr = block_in_place(|| api.wait_for_log_field("http_addr", START_TIMEOUT))?;
    let answer = reqwest::Client::new()
        .post(format!("http://{api_addr}/payments"))
        .header("content-type", "application/json")
        .header("idempotency-key", unique_name("tls-pg-payment"))
        .body(r#"{"account_id": "acct-1", "amount": 700, "currency": "EUR"}"#)
        .send()
        .await?;
    assert_eq!(answer.status().as_u16(), 201, "{}", answer.text().await?);
    let payments: i64 = sqlx::query_scalar("SELECT count(*) FROM payments_api_payments")
        .fetch_one(&owner_pool)
        .await?;
    assert_eq!(payments, 1);

    for (_, process) in &mut services {
        block_in_place(|| process.stop_gracefully())?;
    }

    // verify-full checks the chain: with another CA's certificate as the root, every migrate is
    // refused and says the certificate is why.
    let other_ca = TestCa::new(&postgres.dir.join("other-ca"))?;
    let wrong_ca_url = postgres.url(OWNER, DATABASE, &other_ca.cert_file, "");
    for binary in DATABASE_SERVICES {
        let (ok, log) = block_in_place(|| {
            run_migrate(
                binary,
                &[
                    ("DATABASE_URL", &wrong_ca_url),
                    ("DATABASE_PASSWORD_FILE", &owner_password_path),
                ],
            )
        })?;
        assert!(
            !ok,
            "{binary} migrate accepted a certificate of another CA:\n{log}"
        );
        // rustls' words: "invalid peer certificate: <why>".
        assert!(
            log.contains("invalid peer certificate"),
            "{binary}: the error names the certificate:\n{log}"
        );
        assert!(
            !log.contains(&postgres.owner_password),
            "{binary} shows the password"
        );
    }

    owner_pool.close().await;
    drop(postgres);
    Ok(())
}
