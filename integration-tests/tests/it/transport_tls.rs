//! Kafka and PostgreSQL over TLS, with a test CA made here (rcgen):
//!
//! - a throw-away broker (`deploy/local/stack kafka-tls-broker`) with SSL and SASL_SSL (SCRAM)
//!   listeners: the processor (`-X`), the sink (`--kafka-properties-file`, with a SCRAM password
//!   that must not reach its log) and eosctl (`EOS_KAFKA_PROPERTIES`, `-X`) pass a short exact
//!   run over it, audited by event_id through the sink's tables;
//! - the local PostgreSQL with the test CA's server certificate: a service connects with
//!   `sslmode=verify-full` and its backends are TLS in `pg_stat_ssl`, another CA is refused, and
//!   `sslmode=require` against a server with TLS off fails with a clear error.
//!
//! The stack's own broker on 9092 is never touched; PostgreSQL's settings are restored by a
//! guard, and turning TLS on never refuses the plaintext clients of the tests running alongside.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use eos_testkit::{ChildProcess, LogMode, argv};
use integration_tests::eosctl::{self, Workload};
use integration_tests::service_process::{ServiceProcess, log_dir};
use integration_tests::{
    TestDatabase, bootstrap_servers, client_config_for, create_topic, create_topic_on, unique_name,
    wait_until_consumed,
};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use rdkafka::consumer::{BaseConsumer, Consumer as _};
use sqlx::PgPool;

const DRAIN_TIMEOUT: Duration = Duration::from_secs(180);
const BROKER_START_TIMEOUT: Duration = Duration::from_secs(120);
const SCRAM_USER: &str = "eos-sink";

/// A certificate authority made for one test, and the files it wrote.
pub(crate) struct TestCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
    dir: PathBuf,
}

impl TestCa {
    pub(crate) fn new(name: &str) -> anyhow::Result<Self> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, format!("eos-suite test CA {name}"));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate()?)?;
        let dir = std::env::temp_dir().join(unique_name(&format!("eos-it-tls-{name}")));
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join("ca.pem"), issuer.pem())?;
        Ok(Self { issuer, dir })
    }

    fn ca_path(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// A client certificate (`clientAuth`) for the MTLS listener: `(cert path, PKCS#8 key path)`.
    fn client_cert(&self, name: &str) -> anyhow::Result<(PathBuf, PathBuf)> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        let cert_path = self.dir.join(format!("{name}-client.pem"));
        let key_path = self.dir.join(format!("{name}-client.key"));
        std::fs::write(&cert_path, cert.pem())?;
        std::fs::write(&key_path, key.serialize_pem())?;
        Ok((cert_path, key_path))
    }

    /// A server certificate for 127.0.0.1 and localhost: `(chain path, PKCS#8 key path)`.
    pub(crate) fn server_cert(&self, name: &str) -> anyhow::Result<(PathBuf, PathBuf)> {
        let mut params =
            CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])?;
        params
            .distinguished_name
            .push(DnType::CommonName, "127.0.0.1");
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        let chain = self.dir.join(format!("{name}.pem"));
        let key_path = self.dir.join(format!("{name}.key"));
        std::fs::write(&chain, cert.pem())?;
        std::fs::write(&key_path, key.serialize_pem())?;
        Ok((chain, key_path))
    }
}

impl Drop for TestCa {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Ports free on 127.0.0.1 right now.
fn free_ports<const N: usize>() -> anyhow::Result<[u16; N]> {
    let ports = eos_testkit::loopback_ports::free_loopback_ports(N)?;
    ports
        .try_into()
        .map_err(|ports| anyhow::anyhow!("asked for {N} ports, got {ports:?}"))
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from(".."))
}

/// A throw-away broker from `deploy/local/stack kafka-tls-broker`; stopped and its directory
/// removed on drop.
struct TlsBroker {
    process: ChildProcess,
    dir: PathBuf,
    plaintext: String,
    ssl: String,
    sasl_ssl: String,
    /// The SSL listener that requires a client certificate signed by the test CA.
    mtls: String,
}

impl TlsBroker {
    /// Starts a broker with `ca`'s server certificate and one SCRAM user, and waits until it
    /// answers. Blocking.
    fn start(ca: &TestCa, scram_password: &str) -> anyhow::Result<Self> {
        let (chain, key) = ca.server_cert("broker")?;
        let [plaintext, ssl, sasl_ssl, mtls, controller] = free_ports::<5>()?;
        let dir = ca.dir.join("broker");
        let mut command = Command::new(repo_root().join("deploy/local/stack"));
        command.arg("kafka-tls-broker");
        for (flag, value) in [
            ("--dir", dir.display().to_string()),
            ("--plaintext-port", plaintext.to_string()),
            ("--ssl-port", ssl.to_string()),
            ("--sasl-ssl-port", sasl_ssl.to_string()),
            ("--controller-port", controller.to_string()),
            ("--cert-chain", chain.display().to_string()),
            ("--key", key.display().to_string()),
            ("--ca", ca.ca_path().display().to_string()),
            ("--scram-user", format!("{SCRAM_USER}:{scram_password}")),
            ("--mtls-port", mtls.to_string()),
        ] {
            command.args([flag, &value]);
        }
        std::fs::create_dir_all(log_dir())?;
        let log = log_dir().join(format!("{}.log", unique_name("kafka-tls-broker")));
        let process = ChildProcess::spawn("kafka-tls-broker", command, &log, LogMode::Truncate)?;
        let mut broker = Self {
            process,
            dir,
            plaintext: format!("127.0.0.1:{plaintext}"),
            ssl: format!("127.0.0.1:{ssl}"),
            sasl_ssl: format!("127.0.0.1:{sasl_ssl}"),
            mtls: format!("127.0.0.1:{mtls}"),
        };
        broker.wait_ready()?;
        Ok(broker)
    }

    /// Waits until the broker answers a metadata request on its plaintext listener.
    fn wait_ready(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + BROKER_START_TIMEOUT;
        let client: BaseConsumer = client_config_for(&self.plaintext).create()?;
        loop {
            if !self.process.is_running() {
                bail!(
                    "the TLS broker exited during start-up\n{}\n{}",
                    self.process.log_tail(30),
                    self.server_log_tail()
                );
            }
            match client.fetch_metadata(None, Duration::from_secs(2)) {
                Ok(metadata) if !metadata.brokers().is_empty() => return Ok(()),
                _ if Instant::now() > deadline => bail!(
                    "the TLS broker did not answer within {BROKER_START_TIMEOUT:?}\n{}",
                    self.server_log_tail()
                ),
                _ => std::thread::sleep(Duration::from_millis(500)),
            }
        }
    }

    fn server_log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("logs/server.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

impl Drop for TlsBroker {
    fn drop(&mut self) {
        // A throw-away broker: no clean shutdown needed, and its data goes with the directory.
        let _ = self.process.kill_hard();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The sink's committed checkpoints have reached the end of every partition of `topic`.
async fn wait_sink_drained(
    pool: &PgPool,
    plaintext: &str,
    sink: &str,
    topic: &str,
    process: &mut ServiceProcess,
) -> anyhow::Result<()> {
    let client: BaseConsumer = client_config_for(plaintext).create()?;
    let deadline = Instant::now() + DRAIN_TIMEOUT;
    loop {
        let metadata = client.fetch_metadata(Some(topic), Duration::from_secs(10))?;
        let mut ends = Vec::new();
        for partition in metadata.topics().iter().flat_map(|t| t.partitions()) {
            let (_, high) =
                client.fetch_watermarks(topic, partition.id(), Duration::from_secs(10))?;
            ends.push((partition.id(), high));
        }
        let stored: Vec<(i32, Option<i64>)> = sqlx::query_as(
            "SELECT partition, next_offset FROM sink_checkpoints WHERE sink = $1 AND topic = $2",
        )
        .bind(sink)
        .bind(topic)
        .fetch_all(pool)
        .await
        .unwrap_or_default();
        let drained = !ends.is_empty()
            && ends
                .iter()
                .all(|(partition, end)| *end == 0 || stored.contains(&(*partition, Some(*end))));
        if drained {
            return Ok(());
        }
        ensure!(
            process.is_running(),
            "the sink exited before draining\n{}",
            process.log_tail(40)
        );
        ensure!(
            Instant::now() < deadline,
            "the sink did not drain {topic} in {DRAIN_TIMEOUT:?}: ends {ends:?}, checkpoints \
             {stored:?}\n{}",
            process.log_tail(40)
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn spawn_processor(
    bootstrap: &str,
    kafka_args: &[&str],
    input: &str,
    output: &str,
    group: &str,
) -> anyhow::Result<ServiceProcess> {
    spawn_processor_at(bootstrap, kafka_args, input, output, group, "127.0.0.1:0")
}

/// [`spawn_processor`] serving /readyz at `ops`.
fn spawn_processor_at(
    bootstrap: &str,
    kafka_args: &[&str],
    input: &str,
    output: &str,
    group: &str,
    ops: &str,
) -> anyhow::Result<ServiceProcess> {
    let mut args = argv!(eos_processor::Config {
        kafka.bootstrap_servers: bootstrap
    });
    args.extend(kafka_args.iter().map(|a| (*a).to_owned()));
    args.extend(argv!(eos_processor::Config {
        input_topic: input,
        output_topic: output,
        group_id: group,
        instance.instance_id: "tls-0",
        metrics_addr: ops,
    }));
    ServiceProcess::spawn("eos-processor", &args, &[])
}

fn spawn_sink(
    bootstrap: &str,
    kafka_args: &[&str],
    topic: &str,
    group: &str,
    database_url: &str,
) -> anyhow::Result<ServiceProcess> {
    spawn_sink_at(
        bootstrap,
        kafka_args,
        topic,
        group,
        database_url,
        "127.0.0.1:0",
    )
}

/// [`spawn_sink`] serving /readyz at `ops`.
fn spawn_sink_at(
    bootstrap: &str,
    kafka_args: &[&str],
    topic: &str,
    group: &str,
    database_url: &str,
    ops: &str,
) -> anyhow::Result<ServiceProcess> {
    let mut args = argv!(sink_writer::Config {
        kafka.bootstrap_servers: bootstrap
    });
    args.extend(kafka_args.iter().map(|a| (*a).to_owned()));
    args.extend(argv!(sink_writer::Config {
        topic: topic,
        group_id: group,
        instance.instance_id: "tls-0",
        database[database_url]: database_url,
        metrics_addr: ops,
    }));
    ServiceProcess::spawn("sink-writer", &args, &[])
}

/// The whole pipeline over TLS: eosctl (`EOS_KAFKA_PROPERTIES`, then `-X`) and the processor
/// (`-X`) over SSL, the sink over SASL_SSL with SCRAM (`--kafka-properties-file`); the audit
/// reads the topics over SSL and the sink's tables.
#[tokio::test(flavor = "multi_thread")]
async fn processor_and_sink_pass_an_exact_run_over_tls_and_sasl_scram() -> anyhow::Result<()> {
    use tokio::task::block_in_place;

    let ca = TestCa::new("kafka")?;
    let scram_password = format!("scram-{:016x}", rand::random::<u64>());
    let broker = block_in_place(|| TlsBroker::start(&ca, &scram_password))?;
    let ca_file = ca.ca_path().display().to_string();
    let ssl_ca = format!("ssl.ca.location={ca_file}");

    // The SSL listener speaks only TLS: a plaintext client gets no metadata from it.
    block_in_place(|| -> anyhow::Result<()> {
        let plaintext_client: BaseConsumer = client_config_for(&broker.ssl).create()?;
        ensure!(
            plaintext_client
                .fetch_metadata(None, Duration::from_secs(3))
                .is_err(),
            "a plaintext client read metadata from the SSL listener"
        );
        Ok(())
    })?;

    let input = unique_name("tls-payments");
    let output = unique_name("tls-ledger");
    let group = unique_name("tls-processor");
    let sink_group = unique_name("tls-sink");
    create_topic_on(&broker.plaintext, &input, 3).await?;
    let db = TestDatabase::create().await?;
    let properties_file = ca.dir.join("sink-kafka.properties");
    std::fs::write(
        &properties_file,
        format!(
            "# the sink's Kafka user\n\
             security.protocol=SASL_SSL\n\
             {ssl_ca}\n\
             sasl.mechanism=SCRAM-SHA-512\n\
             sasl.username={SCRAM_USER}\n\
             sasl.password={scram_password}\n"
        ),
    )?;
    let properties_file = properties_file.display().to_string();

    let summary = block_in_place(|| {
        eosctl::produce_with_env(
            &broker.ssl,
            &input,
            &Workload::chaos(2_000, 31),
            &[(
                "EOS_KAFKA_PROPERTIES",
                &format!("security.protocol=SSL;{ssl_ca}"),
            )],
        )
    })?;
    assert_eq!(summary["logical_events"], 2_000, "{summary}");

    let mut processor = spawn_processor(
        &broker.ssl,
        &["-X", "security.protocol=SSL", "-X", &ssl_ca],
        &input,
        &output,
        &group,
    )?;
    block_in_place(|| wait_until_consumed(&broker.plaintext, &group, &input, DRAIN_TIMEOUT))
        .with_context(|| processor.log_tail(40))?;

    let mut sink = spawn_sink(
        &broker.sasl_ssl,
        &["--kafka-properties-file", &properties_file],
        &output,
        &sink_group,
        &db.url,
    )?;
    wait_sink_drained(&db.pool, &broker.plaintext, &sink_group, &output, &mut sink).await?;

    let audit = block_in_place(|| {
        eosctl::audit_with(
            &broker.ssl,
            &input,
            &output,
            &format!("{input}.dlq"),
            &[
                "-X",
                "security.protocol=SSL",
                "-X",
                &ssl_ca,
                "--database-url",
                &db.url,
            ],
        )
    })?;
    processor.stop_gracefully()?;
    sink.stop_gracefully()?;
    assert!(audit.passed(), "audit not exact:\n{}", audit.failures());
    assert_eq!(audit.figure("logical_events"), 2_000);

    let sink_log = sink.log();
    assert!(
        sink_log.contains("sasl.password"),
        "the sink logs its Kafka property keys\n{}",
        sink.log_tail(40)
    );
    assert!(
        !sink_log.contains(&scram_password),
        "the SCRAM password reached the sink's log"
    );
    db.drop_database().await?;
    drop(broker);
    Ok(())
}

fn superuser_sql(sql: &str) -> anyhow::Result<String> {
    integration_tests::superuser_sql(None, sql)
}

/// The server-wide TLS settings this test changes.
const SERVER_TLS_SETTINGS: [&str; 3] = ["ssl", "ssl_cert_file", "ssl_key_file"];

/// The local PostgreSQL serving the test CA's certificate (`ALTER SYSTEM` + `pg_reload_conf()`,
/// no restart). Drop puts back what `postgresql.auto.conf` said before and reloads; the
/// certificate files are removed only once that worked, so the server never points at a file
/// that is gone.
pub(crate) struct ServerTls {
    /// `(setting, its ALTER SYSTEM value before the test, if it had one)`.
    before: Vec<(String, Option<String>)>,
    dir: PathBuf,
    _lock: std::fs::File,
}

impl ServerTls {
    pub(crate) fn install(chain: &Path, key: &Path) -> anyhow::Result<Self> {
        // One test at a time changes the server's TLS settings, across test processes.
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(std::env::temp_dir().join("eos-it-postgres-tls.lock"))?;
        lock.lock().context("cannot take the PostgreSQL TLS lock")?;

        let names = SERVER_TLS_SETTINGS.map(|n| format!("'{n}'")).join(",");
        let listing = superuser_sql(&format!(
            "SELECT name || '|' || setting || '|' || coalesce(sourcefile, '') FROM pg_settings \
             WHERE name IN ({names})"
        ))?;
        let before = listing
            .lines()
            .filter_map(|line| {
                let mut fields = line.splitn(3, '|');
                let (name, setting, file) = (fields.next()?, fields.next()?, fields.next()?);
                let altered = file.ends_with("postgresql.auto.conf");
                Some((name.to_owned(), altered.then(|| setting.to_owned())))
            })
            .collect::<Vec<_>>();
        ensure!(
            before.len() == 3,
            "unexpected pg_settings listing: {listing}"
        );

        // The server reads the key as its own OS user: a copy owned by postgres, mode 0600.
        let dir = std::env::temp_dir().join(unique_name("eos-it-pg-tls"));
        std::fs::create_dir_all(&dir)?;
        let server_tls = Self {
            before,
            dir: dir.clone(),
            _lock: lock,
        };
        let (cert_file, key_file) = (dir.join("server.crt"), dir.join("server.key"));
        std::fs::copy(chain, &cert_file)?;
        std::fs::copy(key, &key_file)?;
        let uid: u32 =
            String::from_utf8(Command::new("id").args(["-u", "postgres"]).output()?.stdout)?
                .trim()
                .parse()
                .context("no postgres OS user")?;
        for file in [&cert_file, &key_file] {
            std::os::unix::fs::chown(file, Some(uid), None)?;
        }
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o600))?;
        superuser_sql(&format!(
            "ALTER SYSTEM SET ssl_cert_file = '{}'",
            cert_file.display()
        ))?;
        superuser_sql(&format!(
            "ALTER SYSTEM SET ssl_key_file = '{}'",
            key_file.display()
        ))?;
        server_tls.set_ssl(true)?;
        Ok(server_tls)
    }

    /// Turns the server's TLS on or off (a reload) and waits until new sessions see it.
    pub(crate) fn set_ssl(&self, on: bool) -> anyhow::Result<()> {
        let value = if on { "on" } else { "off" };
        superuser_sql(&format!("ALTER SYSTEM SET ssl = {value}"))?;
        superuser_sql("SELECT pg_reload_conf()")?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while superuser_sql("SHOW ssl")? != value {
            ensure!(
                Instant::now() < deadline,
                "ssl did not become {value} after a reload"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    }

    fn restore(&self) -> anyhow::Result<()> {
        for (name, value) in &self.before {
            match value {
                Some(value) => superuser_sql(&format!(
                    "ALTER SYSTEM SET {name} = '{}'",
                    value.replace('\'', "''")
                ))?,
                None => superuser_sql(&format!("ALTER SYSTEM RESET {name}"))?,
            };
        }
        superuser_sql("SELECT pg_reload_conf()")?;
        Ok(())
    }
}

impl Drop for ServerTls {
    fn drop(&mut self) {
        match self.restore() {
            Ok(()) => {
                let _ = std::fs::remove_dir_all(&self.dir);
            }
            Err(error) => eprintln!(
                "could not restore PostgreSQL's TLS settings (kept {}): {error:#}",
                self.dir.display()
            ),
        }
    }
}

/// `url` with more query parameters.
fn with_params(url: &str, params: &str) -> String {
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}{params}")
}

/// Runs `sink-writer migrate` against `database_url`: `(success, stderr)`.
fn migrate(database_url: &str) -> anyhow::Result<(bool, String)> {
    let output = Command::new(integration_tests::workspace_binary("sink-writer")?)
        .args(argv!(subcommand sink_writer::MigrateArgs {
            database[database_url]: database_url
        }))
        .output()?;
    let mut text = String::from_utf8_lossy(&output.stderr).into_owned();
    text.push_str(&String::from_utf8_lossy(&output.stdout));
    Ok((output.status.success(), text))
}

/// (backends of `application_name`, how many of them are TLS) from `pg_stat_ssl`.
async fn tls_backends(pool: &PgPool, application_name: &str) -> anyhow::Result<(i64, i64)> {
    Ok(sqlx::query_as(
        "SELECT count(*), count(*) FILTER (WHERE s.ssl) FROM pg_stat_activity a \
         JOIN pg_stat_ssl s USING (pid) WHERE a.application_name = $1",
    )
    .bind(application_name)
    .fetch_one(pool)
    .await?)
}

/// A service's pool honours `sslmode` and `sslrootcert` in its URL: verify-full against the
/// test CA gives TLS backends, another CA is refused, and `require` without server TLS fails
/// with a clear error instead of falling back to plaintext.
#[tokio::test(flavor = "multi_thread")]
async fn postgres_urls_with_sslmode_verify_full_connect_over_tls_and_require_never_falls_back()
-> anyhow::Result<()> {
    use tokio::task::block_in_place;

    // The shared lock of a test database: no other test restarts the server meanwhile.
    let db = TestDatabase::create().await?;
    let ca = TestCa::new("postgres")?;
    let (chain, key) = ca.server_cert("postgres")?;
    let server = block_in_place(|| ServerTls::install(&chain, &key))?;
    let application_name = unique_name("eos-it-tls-sink");
    let verify_full = with_params(
        &db.url,
        &format!(
            "sslmode=verify-full&sslrootcert={}&application_name={application_name}",
            ca.ca_path().display()
        ),
    );

    // A running service: every one of its backends is TLS.
    let topic = unique_name("tls-pg-ledger");
    create_topic(&topic, 1).await?;
    let mut sink = spawn_sink(
        &bootstrap_servers(),
        &[],
        &topic,
        &unique_name("tls-pg-sink"),
        &verify_full,
    )?;
    let deadline = Instant::now() + Duration::from_secs(60);
    let (backends, tls) = loop {
        let (backends, tls) = tls_backends(&db.pool, &application_name).await?;
        if backends > 0 {
            break (backends, tls);
        }
        ensure!(
            sink.is_running() && Instant::now() < deadline,
            "the sink never connected with sslmode=verify-full\n{}",
            sink.log_tail(40)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(tls, backends, "every backend of the sink is TLS");
    sink.stop_gracefully()?;

    // verify-full checks the chain: a server certificate from another CA is refused.
    let other_ca = TestCa::new("other")?;
    let (ok, output) = block_in_place(|| {
        migrate(&with_params(
            &db.url,
            &format!(
                "sslmode=verify-full&sslrootcert={}",
                other_ca.ca_path().display()
            ),
        ))
    })?;
    assert!(
        !ok,
        "verify-full accepted a certificate of another CA:\n{output}"
    );
    assert!(
        output.to_lowercase().contains("certificate"),
        "the error names the certificate:\n{output}"
    );

    // The server with TLS off: require fails and says why; the default (prefer) still connects.
    block_in_place(|| server.set_ssl(false))?;
    let (ok, output) = block_in_place(|| migrate(&with_params(&db.url, "sslmode=require")))?;
    assert!(!ok, "sslmode=require connected without TLS:\n{output}");
    assert!(
        output.contains("TLS") || output.contains("SSL"),
        "the error says TLS is missing:\n{output}"
    );
    let (ok, output) = block_in_place(|| migrate(&db.url))?;
    assert!(ok, "the default sslmode falls back to plaintext:\n{output}");

    drop(server);
    db.drop_database().await?;
    Ok(())
}

/// A properties file for the SASL_SSL listener with `password`, in the CA's directory.
fn scram_properties(ca: &TestCa, name: &str, password: &str) -> anyhow::Result<String> {
    let path = ca.dir.join(format!("{name}.properties"));
    std::fs::write(
        &path,
        format!(
            "security.protocol=SASL_SSL\n\
             ssl.ca.location={}\n\
             sasl.mechanism=SCRAM-SHA-512\n\
             sasl.username={SCRAM_USER}\n\
             sasl.password={password}\n",
            ca.ca_path().display()
        ),
    )?;
    Ok(path.display().to_string())
}

/// Every file under `dir`, recursively.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_owned()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
            } else {
                files.push(path);
            }
        }
    }
    files
}

/// Runs eosctl with `args`: (exit code, stdout, stderr).
fn eosctl_run(args: &[&str]) -> anyhow::Result<(i32, String, String)> {
    run_binary("eosctl", args)
}

/// Runs `binary` of the workspace with `args`: (exit code, stdout, stderr).
fn run_binary(binary: &str, args: &[&str]) -> anyhow::Result<(i32, String, String)> {
    let output = Command::new(integration_tests::workspace_binary(binary)?)
        .args(args)
        .output()?;
    Ok((
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    ))
}

/// `eos-lab demo` and `eos-lab bench` with their Kafka properties (SASL_SSL, SCRAM, the test CA)
/// in `--kafka-properties-file`: every service they start connects with them too — the demo's
/// processor, sink and outbox relay over SASL_SSL pass their exact run, the bench's processors
/// theirs — and the password is in no command line, log or file left behind.
#[tokio::test(flavor = "multi_thread")]
async fn demo_and_bench_hand_their_kafka_properties_to_the_services_they_start()
-> anyhow::Result<()> {
    use tokio::task::block_in_place;

    let ca = TestCa::new("kafka-children")?;
    let password = format!("scram-{:016x}", rand::random::<u64>());
    let broker = block_in_place(|| TlsBroker::start(&ca, &password))?;
    let properties = scram_properties(&ca, "eos-lab", &password)?;
    // The demo's database is on the shared server: no PostgreSQL restart while it runs.
    let _postgres = tokio::task::block_in_place(integration_tests::postgres_in_use)?;
    let runs_dir = ca.dir.join("demo-runs");
    let runs = runs_dir.display().to_string();

    let (code, stdout, stderr) = block_in_place(|| {
        run_binary(
            "eos-lab",
            &[
                "--bootstrap-servers",
                &broker.sasl_ssl,
                "--kafka-properties-file",
                &properties,
                "demo",
                "--source",
                "payments-api",
                "--events",
                "300",
                "--rate",
                "300",
                "--relay-kills",
                "0",
                "--processor-kills",
                "0",
                "--sink-kills",
                "0",
                "--runs-dir",
                &runs,
                "--drop-database",
                "--json",
            ],
        )
    })?;
    let report: serde_json::Value = serde_json::from_str(&stdout)
        .with_context(|| format!("the demo printed no JSON report (exit {code}):\n{stderr}"))?;
    assert_eq!(code, 0, "{report:#}\n{stderr}");
    assert_eq!(report["passed"], true, "{report:#}");
    assert_eq!(report["audit"]["figures"]["logical_events"], 300);
    assert_eq!(report["audit"]["figures"]["outbox_events"], 300);
    let left = files_under(&runs_dir);
    assert!(
        !left.iter().any(|f| f.ends_with("kafka-client.properties")),
        "the services' properties file is removed at the end: {left:?}"
    );
    for file in &left {
        let text = std::fs::read(file).unwrap_or_default();
        assert!(
            !String::from_utf8_lossy(&text).contains(&password),
            "the SCRAM password reached {}",
            file.display()
        );
    }
    assert!(
        !stderr.contains(&password),
        "the password reached eos-lab's output"
    );

    let processor_bin = integration_tests::workspace_binary("eos-processor")?;
    let (code, stdout, stderr) = block_in_place(|| {
        run_binary(
            "eos-lab",
            &[
                "--bootstrap-servers",
                &broker.sasl_ssl,
                "--kafka-properties-file",
                &properties,
                "bench",
                "processor",
                "--processor-bin",
                &processor_bin.display().to_string(),
                // Small transactions, so that even a few thousand records take many commits: the
                // bench refuses a run committed all at once as too fast to measure.
                "--records",
                "3000",
                "--max-batch",
                "100",
                "--commit-interval",
                "10ms",
                "--sizes",
                "100",
                "--rounds",
                "1",
                "--single-records",
                "50",
                "--latency-seconds",
                "1",
                "--kill-resume-kills",
                "2",
                "--json",
            ],
        )
    })?;
    assert_eq!(code, 0, "eos-lab bench over SASL_SSL failed:\n{stderr}");
    let bench: serde_json::Value = serde_json::from_str(&stdout)
        .with_context(|| format!("the bench printed no JSON:\n{stderr}"))?;
    // Both SIGKILLed processors came back over SASL_SSL and committed output again.
    let resumes = bench["kill_resume"]["resume_ms"]
        .as_array()
        .with_context(|| format!("no kill-to-resume figures: {bench}"))?;
    assert_eq!(resumes.len(), 2, "{bench}");
    // The pass-through baseline's own consumer and producer got the properties too.
    let copied = bench["throughput"][0]["pass_through"]["median_records_per_second"].as_f64();
    assert!(copied.is_some_and(|rate| rate > 0.0), "{bench}");
    // And the single-record floor's transactional copy.
    let bare = bench["single_record"]["bare_transactions_per_second"].as_f64();
    assert!(bare.is_some_and(|rate| rate > 0.0), "{bench}");
    assert!(!stderr.contains(&password) && !stdout.contains(&password));
    drop(broker);
    Ok(())
}

/// Whether `/readyz` at `ops` answers 200.
async fn ready(ops: &str) -> bool {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(1))
        .build()
        .expect("a reqwest client");
    client
        .get(format!("http://{ops}/readyz"))
        .send()
        .await
        .is_ok_and(|answer| answer.status().is_success())
}

/// The ERROR every Kafka client of eos-suite logs when the broker refuses its SASL credentials.
const AUTH_FAILED: &str = "Kafka authentication failed";

/// A wrong SCRAM password: eos-processor, sink-writer and outbox-relay each log that Kafka
/// authentication failed and never become ready, then stop at the end of their start-up wait
/// with the refusal named (exit 1, for an orchestrator to show and restart); eosctl produce and
/// audit exit 2 saying so. The password is in no output.
#[tokio::test(flavor = "multi_thread")]
async fn a_wrong_scram_password_is_named_by_every_kafka_service_and_command() -> anyhow::Result<()>
{
    use tokio::task::block_in_place;

    let ca = TestCa::new("kafka-auth")?;
    let password = format!("scram-{:016x}", rand::random::<u64>());
    let broker = block_in_place(|| TlsBroker::start(&ca, &password))?;
    let wrong = format!("wrong-{:016x}", rand::random::<u64>());
    let properties = scram_properties(&ca, "wrong", &wrong)?;
    let kafka_args = ["--kafka-properties-file", properties.as_str()];
    let topic = unique_name("auth-payments");
    create_topic_on(&broker.plaintext, &topic, 1).await?;
    let db = TestDatabase::create().await?;
    let [processor_ops, sink_ops, relay_ops] = free_ports::<3>()?.map(|p| format!("127.0.0.1:{p}"));

    let started = Instant::now();
    let processor = spawn_processor_at(
        &broker.sasl_ssl,
        &kafka_args,
        &topic,
        &unique_name("auth-out"),
        &unique_name("auth-processor"),
        &processor_ops,
    )?;
    let sink = spawn_sink_at(
        &broker.sasl_ssl,
        &kafka_args,
        &topic,
        &unique_name("auth-sink"),
        &db.url,
        &sink_ops,
    )?;
    let relay_args = argv!(outbox_relay::Config {
        kafka.bootstrap_servers: &broker.sasl_ssl,
        kafka.kafka_properties_file: &properties,
        database[database_url]: &db.url,
        relay_name: unique_name("auth-relay"),
        metrics_addr: &relay_ops,
    });
    let relay = ServiceProcess::spawn("outbox-relay", &relay_args, &[])?;

    let mut services = [
        ("eos-processor", processor, processor_ops),
        ("sink-writer", sink, sink_ops),
        ("outbox-relay", relay, relay_ops),
    ];
    // Each says so within seconds, and is never ready meanwhile.
    let deadline = Instant::now() + Duration::from_secs(30);
    for (name, process, ops) in &mut services {
        loop {
            assert!(
                !ready(ops).await,
                "{name} became ready with a wrong password"
            );
            if process.log().contains(AUTH_FAILED) {
                break;
            }
            ensure!(
                Instant::now() < deadline,
                "{name} did not say that Kafka authentication failed\n{}",
                process.log_tail(30)
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    eprintln!(
        "every service named the refusal after {:?}",
        started.elapsed()
    );

    let (code, _, stderr) = block_in_place(|| {
        eosctl_run(&[
            "--bootstrap-servers",
            &broker.sasl_ssl,
            "--kafka-properties-file",
            &properties,
            "produce",
            "--topic",
            &topic,
            "--count",
            "10",
            "--json",
        ])
    })?;
    assert_eq!(code, 2, "eosctl produce with a wrong password:\n{stderr}");
    assert!(
        stderr.contains("authentication failed"),
        "eosctl produce says why:\n{stderr}"
    );
    assert!(!stderr.contains(&wrong), "{stderr}");
    let audit = block_in_place(|| {
        eosctl::audit_with(&broker.sasl_ssl, &topic, &topic, &topic, &kafka_args)
    });
    let error = format!("{:#}", audit.expect_err("the audit cannot read the topics"));
    assert!(
        error.contains("authentication failed"),
        "eosctl audit says why:\n{error}"
    );
    assert!(!error.contains(&wrong), "{error}");

    for (name, process, ops) in &mut services {
        assert!(
            !ready(ops).await,
            "{name} became ready with a wrong password"
        );
        let status = block_in_place(|| process.wait_timeout(Duration::from_secs(30)))?;
        let log = process.log();
        assert!(
            status.is_some_and(|status| status.code() == Some(1)),
            "{name}: {status:?}\n{}",
            process.log_tail(30)
        );
        assert!(
            log.contains("kafka_refusal"),
            "{name} names the refusal when it stops\n{log}"
        );
        assert!(!log.contains(&wrong), "the password reached {name}'s log");
    }
    db.drop_database().await?;
    drop(broker);
    Ok(())
}

/// The MTLS listener requires a client certificate the test CA signed: the processor and the
/// sink, each with its own certificate (`ssl.certificate.location`, `ssl.key.location`), pass an
/// exact run over it; a client without one is refused and says the TLS handshake failed.
#[tokio::test(flavor = "multi_thread")]
async fn processor_and_sink_pass_an_exact_run_over_mtls_and_a_client_without_a_certificate_is_refused()
-> anyhow::Result<()> {
    use tokio::task::block_in_place;

    let ca = TestCa::new("kafka-mtls")?;
    let broker = block_in_place(|| TlsBroker::start(&ca, "unused-scram-password"))?;
    let ca_location = format!("ssl.ca.location={}", ca.ca_path().display());
    let client_args = |name: &str| -> anyhow::Result<Vec<String>> {
        let (cert, key) = ca.client_cert(name)?;
        Ok(vec![
            "-X".into(),
            "security.protocol=SSL".into(),
            "-X".into(),
            ca_location.clone(),
            "-X".into(),
            format!("ssl.certificate.location={}", cert.display()),
            "-X".into(),
            format!("ssl.key.location={}", key.display()),
        ])
    };

    // Without a certificate: refused, and eosctl says the TLS handshake failed.
    let input = unique_name("mtls-payments");
    create_topic_on(&broker.plaintext, &input, 2).await?;
    let (code, _, stderr) = block_in_place(|| {
        eosctl_run(&[
            "--bootstrap-servers",
            &broker.mtls,
            "-X",
            "security.protocol=SSL",
            "-X",
            &ca_location,
            "produce",
            "--topic",
            &input,
            "--count",
            "10",
            "--json",
        ])
    })?;
    assert_eq!(
        code, 2,
        "a client without a certificate was let in:\n{stderr}"
    );
    assert!(
        stderr.contains("TLS handshake failed"),
        "the refusal is named:\n{stderr}"
    );

    let eosctl_args = client_args("eosctl")?;
    let eosctl_args: Vec<&str> = eosctl_args.iter().map(String::as_str).collect();
    let workload_args = Workload::chaos(1_000, 37).args(&broker.mtls, &input);
    let mut produce_args: Vec<&str> = workload_args.iter().map(String::as_str).collect();
    produce_args.extend(&eosctl_args);
    let (code, stdout, stderr) = block_in_place(|| eosctl_run(&produce_args))?;
    assert_eq!(code, 0, "eosctl produce over mTLS:\n{stderr}");
    let summary: serde_json::Value = serde_json::from_str(&stdout)?;
    assert_eq!(summary["logical_events"], 1_000, "{summary}");

    let output = unique_name("mtls-ledger");
    let group = unique_name("mtls-processor");
    let sink_group = unique_name("mtls-sink");
    let db = TestDatabase::create().await?;
    let processor_args = client_args("processor")?;
    let processor_args: Vec<&str> = processor_args.iter().map(String::as_str).collect();
    let mut processor = spawn_processor(&broker.mtls, &processor_args, &input, &output, &group)?;
    block_in_place(|| wait_until_consumed(&broker.plaintext, &group, &input, DRAIN_TIMEOUT))
        .with_context(|| processor.log_tail(40))?;
    let sink_args = client_args("sink")?;
    let sink_args: Vec<&str> = sink_args.iter().map(String::as_str).collect();
    let mut sink = spawn_sink(&broker.mtls, &sink_args, &output, &sink_group, &db.url)?;
    wait_sink_drained(&db.pool, &broker.plaintext, &sink_group, &output, &mut sink).await?;

    let mut audit_args = eosctl_args.clone();
    audit_args.extend(["--database-url", &db.url]);
    let audit = block_in_place(|| {
        eosctl::audit_with(
            &broker.mtls,
            &input,
            &output,
            &format!("{input}.dlq"),
            &audit_args,
        )
    })?;
    processor.stop_gracefully()?;
    sink.stop_gracefully()?;
    assert!(audit.passed(), "audit not exact:\n{}", audit.failures());
    assert_eq!(audit.figure("logical_events"), 1_000);
    db.drop_database().await?;
    drop(broker);
    Ok(())
}
