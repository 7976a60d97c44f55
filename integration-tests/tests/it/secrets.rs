//! No secret in an output (docs/security.md "What is redacted"): a marker string in every place
//! that can hold a credential must appear in no output — stdout, stderr, log, `/boundary`,
//! `/metrics`, `--help`.
//!
//! - Every database service with the marker as its database password, on a database that cannot
//!   be reached and with a wrong password on the real server, and eosctl's audit likewise.
//! - Every binary and subcommand asked for `--help` with the marker in every variable that can
//!   hold a credential or a URL with one.
//! - The services running and working with it as their tokens, provider credentials and Kafka
//!   properties (`sasl.password`, `ssl.key.password` in all three places).
//! - Every binary refusing it where it cannot be used: a malformed Kafka entry, a wrong password
//!   apart from the URL, a URL with it as user information, a token that is not one; the refusal
//!   names the place, never the value.
//!
//! The services that run with a marker password on a reachable database are checked in
//! migrate.rs (their log, `/boundary` and `/metrics`), with [`assert_no_secret`].

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
    let url_with_userinfo = format!("http://user:{marker}@127.0.0.1:1/");
    let kafka_properties = format!("sasl.password={marker};ssl.key.password={marker}");
    // Every variable a credential can be given in, and every URL variable that can carry one.
    let envs = [
        ("DATABASE_URL", url.as_str()),
        ("DATABASE_PASSWORD", marker.as_str()),
        ("DEDUP_PROVIDER_AUTH", marker.as_str()),
        ("DEDUP_PROVIDER_URL", url_with_userinfo.as_str()),
        ("DEDUP_CLIENT_TOKEN", marker.as_str()),
        ("DEDUP_OPERATOR_TOKEN", marker.as_str()),
        ("EOS_DEDUP_TOKEN", marker.as_str()),
        ("EOS_DEDUP_URL", url_with_userinfo.as_str()),
        ("EOS_JAEGER_URL", url_with_userinfo.as_str()),
        ("EOS_KAFKA_PROPERTIES", kafka_properties.as_str()),
        ("EOS_SCHEMA_REGISTRY_URL", url_with_userinfo.as_str()),
    ];
    let mut helps: Vec<Vec<&str>> = [
        "dedup-service",
        "sink-writer",
        "outbox-relay",
        "payments-api",
        "eos-processor",
        "provider-sim",
        "eosctl",
        "eos-lab",
    ]
    .into_iter()
    .map(|binary| vec![binary, "--help"])
    .collect();
    for binary in DATABASE_SERVICES {
        helps.push(vec![binary, "migrate", "--help"]);
    }
    for subcommand in ["produce", "audit", "lag", "trace"] {
        helps.push(vec!["eosctl", subcommand, "--help"]);
    }
    helps.push(vec!["eosctl", "held", "list", "--help"]);
    helps.push(vec!["eosctl", "held", "resolve", "--help"]);
    helps.push(vec!["eos-lab", "demo", "--help"]);
    for command in helps {
        let (binary, args) = (command[0], &command[1..]);
        let args: Vec<String> = args.iter().map(|arg| (*arg).to_owned()).collect();
        let mut process = ServiceProcess::spawn(binary, &args, &envs)?;
        let status = process
            .wait_timeout(Duration::from_secs(30))?
            .ok_or_else(|| anyhow::anyhow!("{command:?} still running"))?;
        assert!(status.success(), "{command:?}: {status}");
        let help = process.log();
        assert!(help.contains("Usage"), "{command:?} printed its usage");
        assert!(
            !help.contains(&marker),
            "{command:?} shows a secret:\n{}",
            lines_with(&help, &marker)
        );
    }
    Ok(())
}

/// The lines of `output` that show `marker`, for a failure message.
fn lines_with(output: &str, marker: &str) -> String {
    output
        .lines()
        .filter(|line| line.contains(marker))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every file that holds the marker as a credential of some kind, in one scratch directory.
struct SecretFiles {
    dir: std::path::PathBuf,
}

impl SecretFiles {
    fn write(marker: &str) -> anyhow::Result<Self> {
        let dir = std::env::temp_dir().join(unique_name("secrets-everywhere"));
        std::fs::create_dir_all(&dir)?;
        let files = Self { dir };
        for (name, contents) in [
            ("provider-auth", format!("Bearer provider-{marker}\n")),
            ("dedup-token", format!("client-token-{marker}\n")),
            // dedup-service's file of tokens, and eosctl's file of one.
            (
                "operator-tokens",
                format!("# the operators\noperator-token-{marker}\n"),
            ),
            ("operator-token", format!("operator-token-{marker}\n")),
            ("database-password", format!("{marker}\n")),
            (
                "kafka.properties",
                format!("# secrets\nsasl.password={marker}\nssl.key.password={marker}\n"),
            ),
            // A line without '=': the secret glued to its key, on line 3.
            (
                "malformed.properties",
                format!("# secrets\nlinger.ms=5\nsasl.password{marker}\n"),
            ),
        ] {
            std::fs::write(files.dir.join(name), contents)?;
        }
        Ok(files)
    }

    fn path(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }
}

impl Drop for SecretFiles {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Every service started with the marker in every place it can hold a credential, doing its
/// work with them — dedup-service's client and operator tokens and provider credential,
/// sink-writer's dedup-service token and provider credential (settling real charges through
/// both), the Kafka properties of eos-processor, sink-writer and outbox-relay in
/// `EOS_KAFKA_PROPERTIES`, `-X` and `--kafka-properties-file` — shows it in no log line, on
/// `/boundary` or on `/metrics`.
#[tokio::test(flavor = "multi_thread")]
async fn running_services_show_no_secret_from_any_place() -> anyhow::Result<()> {
    let marker = unique_name("MARKERRUN").replace('-', "");
    let files = SecretFiles::write(&marker)?;
    let db = TestDatabase::create().await?;
    let kafka_list = format!("sasl.password={marker};ssl.key.password={marker}");
    let kafka_env = [("EOS_KAFKA_PROPERTIES", kafka_list.as_str())];
    let key_password = format!("ssl.key.password={marker}");

    let sim = crate::provider_sim::ProviderSim::spawn(&[
        "--require-auth-file",
        &files.path("provider-auth"),
    ])?;
    let client_token = format!("client-token-{marker}");
    let mut dedup = crate::dedup_service::Dedup::spawn(
        &db,
        &[
            "--provider-url",
            &sim.url,
            "--provider-auth-file",
            &files.path("provider-auth"),
            "--client-token",
            &client_token,
            "--operator-token-file",
            &files.path("operator-tokens"),
        ],
    )?;

    // The sink settles every event at the provider through dedup-service, with both credentials.
    let topic = unique_name("secrets-sink");
    create_topic(&topic, 1).await?;
    let events: Vec<(Option<String>, Vec<u8>)> = (0..5)
        .map(|n| {
            let event = serde_json::json!({"event_id": format!("s-{n}"), "entity_id": "e", "value": 10 + n});
            (Some("e".to_owned()), event.to_string().into_bytes())
        })
        .collect();
    {
        let topic = topic.clone();
        tokio::task::spawn_blocking(move || integration_tests::produce_records(&topic, &events))
            .await??;
    }
    let targets = files.dir.join("targets.toml");
    std::fs::write(
        &targets,
        format!(
            "[[targets]]\nkind = \"provider\"\nname = \"secrets\"\ndedup_url = \"{}\"\n\
             provider_url = \"{}\"\nprovider_auth_file = \"{}\"\n",
            dedup.endpoint(),
            sim.url,
            files.path("provider-auth")
        ),
    )?;
    let sink = crate::sink_writer::Sink::new(&topic, &db.url);
    let mut sink_process = sink.spawn(
        "secrets",
        &[
            "--config",
            &targets.display().to_string(),
            "--dedup-token-file",
            &files.path("dedup-token"),
            "-X",
            &key_password,
        ],
        &kafka_env,
    )?;
    let mut relay = crate::payments_api::spawn_relay(
        &db.url,
        &[
            "--kafka-properties-file",
            &files.path("kafka.properties"),
            "-X",
            &key_password,
        ],
        &kafka_env,
    )?;
    let processor_args = argv!(eos_processor::Config {
        kafka.bootstrap_servers: bootstrap_servers(),
        input_topic: topic.clone(),
        output_topic: unique_name("secrets-out"),
        group_id: unique_name("secrets"),
        metrics_addr: "127.0.0.1:0",
    });
    let mut processor_args = processor_args;
    processor_args.extend([
        "--kafka-properties-file".to_owned(),
        files.path("kafka.properties"),
        "-X".to_owned(),
        key_password.clone(),
    ]);
    let mut processor = ServiceProcess::spawn("eos-processor", &processor_args, &kafka_env)?;

    sink.wait_drained(&db.pool, &mut sink_process).await?;
    let charged = sim.effects().await?;
    assert_eq!(
        charged.len(),
        5,
        "every event charged with the credentials: {charged:?}"
    );
    for process in [
        &mut dedup.process,
        &mut sink_process,
        &mut relay,
        &mut processor,
    ] {
        assert_no_secret(process, &marker).await?;
    }
    // The processor and the relay must have got as far as their work: ready, not stuck on a
    // setting.
    for process in [&mut processor, &mut relay] {
        let addr = process.wait_for_log_field("metrics_addr", GIVE_UP_TIMEOUT)?;
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let ready = reqwest::get(format!("http://{addr}/readyz"))
                .await?
                .status();
            if ready == 200 {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{} not ready with the properties\n{}",
                process.name(),
                process.log_tail(20)
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    for process in [&mut processor, &mut relay, &mut sink_process] {
        process.stop_gracefully()?;
        assert!(
            !process.log().contains(&marker),
            "{}:\n{}",
            process.name(),
            lines_with(&process.log(), &marker)
        );
    }
    assert!(
        !sim.process.log().contains(&marker),
        "provider-sim:\n{}",
        lines_with(&sim.process.log(), &marker)
    );
    drop(dedup);
    drop(sim);
    db.drop_database().await
}

/// One start of a binary with the marker where it cannot use it.
struct SecretCase {
    what: String,
    binary: &'static str,
    args: Vec<String>,
    envs: Vec<(&'static str, String)>,
    /// What the binary's output must say: where the refusal is, or the URL redacted.
    says: String,
}

impl SecretCase {
    fn new(
        what: String,
        binary: &'static str,
        args: Vec<String>,
        envs: Vec<(&'static str, String)>,
        says: String,
    ) -> Self {
        Self {
            what,
            binary,
            args,
            envs,
            says,
        }
    }
}

/// Every binary given the marker where it cannot use it — a malformed Kafka property entry
/// (`sasl.password<marker>`, no `=`) in each of the three places, a wrong database password
/// given apart from the URL, a password both in the URL and apart, a URL whose user information
/// is the credential (`--provider-url`, a sink target's `provider_url` and `dedup_url`, eosctl's
/// `--provider-url`, `--dedup-url` and `--jaeger-url`), a token that is not one — refuses with a
/// reason that names where the problem is, and shows the marker nowhere.
#[tokio::test(flavor = "multi_thread")]
async fn refused_secrets_are_named_by_place_never_shown() -> anyhow::Result<()> {
    let marker = unique_name("MARKERBAD").replace('-', "");
    let files = SecretFiles::write(&marker)?;
    let db = TestDatabase::create().await?;
    let (_, host_and_database) = db
        .url
        .split_once('@')
        .ok_or_else(|| anyhow::anyhow!("a URL with credentials: the test database's"))?;
    let no_password_url = format!("postgres://eos@{host_and_database}");
    let both_passwords_url = format!("postgres://eos:{marker}@{host_and_database}");
    let malformed_list = format!("linger.ms=5;sasl.password{marker}");
    let malformed_property = format!("ssl.key.password{marker}");
    let userinfo_url = |port: u16| format!("http://user:{marker}@127.0.0.1:{port}/");
    let token_url = format!("http://{marker}@127.0.0.1:1/");
    let topic = unique_name("secrets-refused");
    create_topic(&topic, 1).await?;

    let mut cases: Vec<SecretCase> = Vec::new();
    let kafka_services = ["eos-processor", "sink-writer", "outbox-relay"];
    for binary in kafka_services {
        let base = match binary {
            "eos-processor" => argv!(eos_processor::Config {
                input_topic: topic.clone(),
                metrics_addr: "127.0.0.1:0",
            }),
            other => {
                let mut args = service_args(other);
                args.extend(["--database-url".to_owned(), db.url.clone()]);
                args
            }
        };
        cases.push(SecretCase::new(
            "a malformed EOS_KAFKA_PROPERTIES entry".into(),
            binary,
            base.clone(),
            vec![("EOS_KAFKA_PROPERTIES", malformed_list.clone())],
            "EOS_KAFKA_PROPERTIES entry 2".into(),
        ));
        let mut with_property = base.clone();
        with_property.extend(["-X".to_owned(), malformed_property.clone()]);
        cases.push(SecretCase::new(
            "a malformed -X".into(),
            binary,
            with_property,
            Vec::new(),
            "--kafka-property 1".into(),
        ));
        let mut with_file = base;
        with_file.extend([
            "--kafka-properties-file".to_owned(),
            files.path("malformed.properties"),
        ]);
        cases.push(SecretCase::new(
            "a malformed line in --kafka-properties-file".into(),
            binary,
            with_file,
            Vec::new(),
            format!("{}:3", files.path("malformed.properties")),
        ));
    }
    cases.push(SecretCase::new(
        "a malformed EOS_KAFKA_PROPERTIES entry".into(),
        "eosctl",
        ["lag", "--group", "secrets", "--topic", &topic]
            .map(str::to_owned)
            .to_vec(),
        vec![("EOS_KAFKA_PROPERTIES", malformed_list.clone())],
        "EOS_KAFKA_PROPERTIES entry 2".into(),
    ));
    for binary in DATABASE_SERVICES {
        let mut args = service_args(binary);
        args.extend(["--database-url".to_owned(), no_password_url.clone()]);
        cases.push(SecretCase::new(
            "a wrong DATABASE_PASSWORD".into(),
            binary,
            args.clone(),
            vec![("DATABASE_PASSWORD", marker.clone())],
            "password authentication failed".into(),
        ));
        cases.push(SecretCase::new(
            "a wrong DATABASE_PASSWORD_FILE".into(),
            binary,
            args,
            vec![("DATABASE_PASSWORD_FILE", files.path("database-password"))],
            "password authentication failed".into(),
        ));
        let mut both = service_args(binary);
        both.extend(["--database-url".to_owned(), both_passwords_url.clone()]);
        cases.push(SecretCase::new(
            "a password in the URL and in DATABASE_PASSWORD".into(),
            binary,
            both,
            vec![("DATABASE_PASSWORD", format!("other-{marker}"))],
            "has a password already".into(),
        ));
    }
    for url in [userinfo_url(1), token_url.clone()] {
        let mut args = service_args("dedup-service");
        args.extend([
            "--database-url".to_owned(),
            db.url.clone(),
            "--provider-url".to_owned(),
            url,
        ]);
        cases.push(SecretCase::new(
            "a --provider-url with user information".into(),
            "dedup-service",
            args,
            Vec::new(),
            "--provider-auth".into(),
        ));
    }
    let mut bad_token = service_args("dedup-service");
    bad_token.extend([
        "--database-url".to_owned(),
        db.url.clone(),
        "--operator-token".to_owned(),
        format!("{marker} has spaces"),
    ]);
    cases.push(SecretCase::new(
        "an operator token that is not one".into(),
        "dedup-service",
        bad_token,
        Vec::new(),
        "--operator-token #1".into(),
    ));
    // (the field, its URLs, what the sink says: a refusal naming the field, or the URL redacted)
    for (field, dedup_url, provider_url, says) in [
        (
            "provider_url",
            "http://127.0.0.1:1".to_owned(),
            userinfo_url(2),
            "credentials in the URL are refused",
        ),
        (
            "provider_url",
            "http://127.0.0.1:1".to_owned(),
            token_url.clone(),
            "credentials in the URL are refused",
        ),
        (
            "dedup_url",
            userinfo_url(1),
            "http://127.0.0.1:2".to_owned(),
            "dedup_url=http://***@127.0.0.1:1/",
        ),
        (
            "dedup_url",
            format!("not a url {marker}"),
            "http://127.0.0.1:2".to_owned(),
            "dedup_url",
        ),
    ] {
        let targets = files.dir.join(format!("{}.toml", unique_name("targets")));
        std::fs::write(
            &targets,
            format!(
                "[[targets]]\nkind = \"provider\"\nname = \"secrets\"\n\
                 dedup_url = \"{dedup_url}\"\nprovider_url = \"{provider_url}\"\n"
            ),
        )?;
        let mut args = service_args("sink-writer");
        args.extend([
            "--database-url".to_owned(),
            db.url.clone(),
            "--config".to_owned(),
            targets.display().to_string(),
        ]);
        cases.push(SecretCase::new(
            format!("a target's {field} with a credential in it"),
            "sink-writer",
            args,
            Vec::new(),
            says.to_owned(),
        ));
    }
    let mut bad_dedup_token = service_args("sink-writer");
    bad_dedup_token.extend(["--database-url".to_owned(), db.url.clone()]);
    cases.push(SecretCase::new(
        "a dedup-service token that is not one".into(),
        "sink-writer",
        bad_dedup_token,
        vec![("EOS_DEDUP_TOKEN", format!("{marker} has spaces"))],
        "--dedup-token".into(),
    ));
    let audit = |flag: &str, value: String| -> Vec<String> {
        ["audit", "--input", &topic, "--output", &topic, flag, &value]
            .map(str::to_owned)
            .to_vec()
    };
    for url in [
        userinfo_url(1),
        token_url.clone(),
        format!("not a url {marker}"),
    ] {
        cases.push(SecretCase::new(
            "eosctl audit --provider-url with a credential".into(),
            "eosctl",
            audit("--provider-url", url),
            Vec::new(),
            "--provider-url".into(),
        ));
    }
    cases.push(SecretCase::new(
        "eosctl audit --outbox-database-url with a password".into(),
        "eosctl",
        audit(
            "--outbox-database-url",
            format!("postgres://eos:{marker}@127.0.0.1:1/eos"),
        ),
        Vec::new(),
        "--outbox-database-url".into(),
    ));
    for url in [
        format!("not a url {marker}"),
        format!("https://user:{marker}@127.0.0.1:1"),
    ] {
        cases.push(SecretCase::new(
            "eosctl held resolve --dedup-url with a credential".into(),
            "eosctl",
            [
                "held",
                "resolve",
                "secrets:e-1",
                "--outcome",
                "failed",
                "--evidence",
                "test",
                "--database-url",
                &db.url,
                "--dedup-url",
                &url,
                "--operator-token-file",
                &files.path("operator-token"),
            ]
            .map(str::to_owned)
            .to_vec(),
            Vec::new(),
            "dedup-service".into(),
        ));
    }
    for url in [
        userinfo_url(1),
        token_url.clone(),
        format!("not a url {marker}"),
    ] {
        cases.push(SecretCase::new(
            "eosctl trace --jaeger-url with a credential".into(),
            "eosctl",
            ["trace", "e-1", "--wait", "0s", "--jaeger-url", &url]
                .map(str::to_owned)
                .to_vec(),
            Vec::new(),
            "Jaeger".into(),
        ));
    }

    // All at once: each ends by itself within moments, but for the sinks whose dedup_url has
    // user information: dedup-service is reached lazily (tonic sends no user information), so
    // such a sink runs, showing the URL redacted, until it is killed.
    let mut running = Vec::new();
    for case in &cases {
        let envs: Vec<(&str, &str)> = case.envs.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let process = ServiceProcess::spawn(case.binary, &case.args, &envs)?;
        running.push((&case.what, case.binary, &case.says, process));
    }
    let mut failures = Vec::new();
    for (what, binary, says, mut process) in running {
        let status = process.wait_timeout(GIVE_UP_TIMEOUT)?;
        if status.is_none() {
            process.kill_hard()?;
        }
        let output = process.log();
        let runs_redacted = what.contains("dedup_url") && says.contains("***@");
        if output.contains(&marker) {
            failures.push(format!(
                "{binary}, {what}: shows the secret:\n{}",
                lines_with(&output, &marker)
            ));
        } else if !runs_redacted && status.is_none_or(|status| status.success()) {
            failures.push(format!(
                "{binary}, {what}: not refused ({status:?})\n{}",
                process.log_tail(10)
            ));
        } else if !output.contains(says.as_str()) {
            failures.push(format!(
                "{binary}, {what}: the output does not say {says:?}\n{}",
                process.log_tail(10)
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n---\n"));
    db.drop_database().await
}
