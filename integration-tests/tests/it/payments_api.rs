//! payments-api, the outbox's example domain service, as a real process on a real database:
//! retries with one key write one payment and one event; a key reused with another body and bad
//! input write nothing; through outbox-relay, every payment is on the topic once.

use eos_testkit::argv;
use std::collections::HashSet;
use std::time::Duration;

use anyhow::Context as _;

use integration_tests::otlp_collector::{OtlpCollector, env_refs};
use integration_tests::service_process::ServiceProcess;
use integration_tests::{
    Isolation, TestDatabase, bootstrap_servers, create_topic, read_topic, unique_name,
};
use rdkafka::Message as _;
use serde_json::{Value, json};
use sqlx::PgPool;

const START_TIMEOUT: Duration = Duration::from_secs(60);

pub(crate) struct PaymentsApi {
    pub(crate) process: ServiceProcess,
    base: String,
    client: reqwest::Client,
}

impl PaymentsApi {
    fn start(db: &TestDatabase, topic: &str) -> anyhow::Result<Self> {
        Self::start_on(&db.url, topic, &[], &[])
    }

    /// payments-api on `database_url`, publishing to `topic`, with `extra` flags and `envs`.
    pub(crate) fn start_on(
        database_url: &str,
        topic: &str,
        extra: &[&str],
        envs: &[(&str, &str)],
    ) -> anyhow::Result<Self> {
        let mut args = argv!(payments_api::Config {
            addr: "127.0.0.1:0",
            metrics_addr: "127.0.0.1:0",
            database[database_url]: database_url,
            topic: topic,
        });
        args.extend(extra.iter().map(|arg| (*arg).to_owned()));
        let mut process = ServiceProcess::spawn("payments-api", &args, envs)?;
        let addr = process.wait_for_log_field("http_addr", START_TIMEOUT)?;
        Ok(Self {
            process,
            base: format!("http://{addr}"),
            client: reqwest::Client::new(),
        })
    }

    pub(crate) async fn pay(
        &self,
        key: Option<&str>,
        body: &str,
    ) -> anyhow::Result<(u16, bool, Value)> {
        let mut request = self
            .client
            .post(format!("{}/payments", self.base))
            .header("content-type", "application/json")
            .body(body.to_owned());
        if let Some(key) = key {
            request = request.header("idempotency-key", key);
        }
        let response = request.send().await?;
        let status = response.status().as_u16();
        let replayed = response.headers().contains_key("idempotent-replayed");
        let body: Value = response.json().await?;
        Ok((status, replayed, body))
    }
}

/// outbox-relay (exactly-once) on `database_url`, under a fresh relay name and positions topic,
/// with `extra` flags and `envs`.
pub(crate) fn spawn_relay(
    database_url: &str,
    extra: &[&str],
    envs: &[(&str, &str)],
) -> anyhow::Result<ServiceProcess> {
    let mut args = argv!(outbox_relay::Config {
        kafka.bootstrap_servers: bootstrap_servers(),
        database[database_url]: database_url,
        relay_name: unique_name("relay"),
        positions_topic: unique_name("positions"),
        metrics_addr: "127.0.0.1:0",
    });
    args.extend(extra.iter().map(|arg| (*arg).to_owned()));
    ServiceProcess::spawn("outbox-relay", &args, envs)
}

/// eos-processor from `input` to `output` as consumer group `group`, with extra environment.
fn spawn_processor(
    input: &str,
    output: &str,
    group: &str,
    envs: &[(&str, &str)],
) -> anyhow::Result<ServiceProcess> {
    let args = argv!(eos_processor::Config {
        kafka.bootstrap_servers: &bootstrap_servers(),
        input_topic: input,
        output_topic: output,
        group_id: group,
        metrics_addr: "127.0.0.1:0",
    });
    ServiceProcess::spawn("eos-processor", &args, envs)
}

async fn counts(pool: &PgPool) -> anyhow::Result<(i64, i64)> {
    let payments: i64 = sqlx::query_scalar("SELECT count(*) FROM payments_api_payments")
        .fetch_one(pool)
        .await?;
    let events: i64 = sqlx::query_scalar("SELECT count(*) FROM eos_outbox")
        .fetch_one(pool)
        .await?;
    Ok((payments, events))
}

#[tokio::test(flavor = "multi_thread")]
async fn one_key_is_one_payment_and_one_event_and_refusals_write_nothing() -> anyhow::Result<()> {
    let db = TestDatabase::create().await?;
    let mut api = PaymentsApi::start(&db, "payments")?;
    let body = r#"{"account_id":"acct-1","amount":1250,"currency":"EUR"}"#;

    // Five concurrent attempts and two later retries with the same key: one payment.
    let attempts = futures::future::join_all((0..5).map(|_| api.pay(Some("key-1"), body))).await;
    let mut payment_ids = HashSet::new();
    for attempt in attempts {
        let (status, _, answer) = attempt?;
        assert_eq!(status, 201, "{answer}");
        payment_ids.insert(answer["payment_id"].as_str().unwrap_or_default().to_owned());
    }
    for _ in 0..2 {
        let (status, replayed, answer) = api
            .pay(
                Some("key-1"),
                r#"{ "currency":"EUR", "amount":1250, "account_id":"acct-1" }"#,
            )
            .await?;
        assert_eq!((status, replayed), (201, true), "{answer}");
        payment_ids.insert(answer["payment_id"].as_str().unwrap_or_default().to_owned());
    }
    assert_eq!(
        payment_ids.len(),
        1,
        "every answer names the one payment: {payment_ids:?}"
    );
    assert_eq!(counts(&db.pool).await?, (1, 1));

    // The same key with another body is refused and writes nothing.
    let (status, _, answer) = api
        .pay(
            Some("key-1"),
            r#"{"account_id":"acct-1","amount":9999,"currency":"EUR"}"#,
        )
        .await?;
    assert_eq!(status, 409, "{answer}");
    assert!(
        answer["error"]
            .as_str()
            .is_some_and(|e| e.contains("different request"))
    );

    // Bad input: 400 with a reason, nothing written.
    for (key, bad) in [
        (None, body),
        (Some("key-2"), "{not json"),
        (
            Some("key-3"),
            r#"{"account_id":"acct-1","amount":-5,"currency":"EUR"}"#,
        ),
        (
            Some("key-4"),
            r#"{"account_id":"acct-1","amount":5,"currency":"EUR","extra":1}"#,
        ),
        (Some("bad key"), body),
    ] {
        let (status, _, answer) = api.pay(key, bad).await?;
        assert_eq!(status, 400, "{key:?} {bad}: {answer}");
        assert!(
            answer["error"].as_str().is_some_and(|e| !e.is_empty()),
            "{answer}"
        );
    }
    assert_eq!(counts(&db.pool).await?, (1, 1), "refusals wrote nothing");
    let version: i64 =
        sqlx::query_scalar("SELECT version FROM payments_api_accounts WHERE account_id = 'acct-1'")
            .fetch_one(&db.pool)
            .await?;
    assert_eq!(version, 1, "replays and refusals did not bump the account");

    let status = api.process.terminate(Duration::from_secs(30))?;
    assert!(status.success(), "{}", api.process.log_tail(30));
    db.drop_database().await
}

#[tokio::test(flavor = "multi_thread")]
async fn every_payment_reaches_the_topic_once_through_the_relay() -> anyhow::Result<()> {
    let db = TestDatabase::create().await?;
    let topic = unique_name("payments-api");
    create_topic(&topic, 3).await?;
    let mut api = PaymentsApi::start(&db, &topic)?;
    let mut relay = spawn_relay(&db.url, &[], &[])?;

    let mut created = HashSet::new();
    for n in 0..300 {
        let body =
            json!({"account_id": format!("acct-{}", n % 7), "amount": 100 + n, "currency": "EUR"});
        let key = format!("order-{n}");
        // Every request sent twice, as a client retrying after a lost answer would.
        let (status, _, first) = api.pay(Some(&key), &body.to_string()).await?;
        let (again, _, second) = api.pay(Some(&key), &body.to_string()).await?;
        assert_eq!((status, again), (201, 201));
        assert_eq!(first["payment_id"], second["payment_id"]);
        created.insert(first["event_id"].as_str().unwrap_or_default().to_owned());
    }

    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let records = loop {
        let topic = topic.clone();
        let records =
            tokio::task::spawn_blocking(move || read_topic(&topic, Isolation::ReadCommitted))
                .await??;
        if records.len() >= created.len() || std::time::Instant::now() > deadline {
            break records;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let mut seen = HashSet::new();
    for record in &records {
        let envelope: Value = serde_json::from_slice(record.payload().unwrap_or_default())?;
        let event_id = envelope["event_id"].as_str().unwrap_or_default().to_owned();
        assert!(seen.insert(event_id.clone()), "{event_id} published twice");
        assert_eq!(
            record.key(),
            envelope["entity_id"].as_str().map(str::as_bytes)
        );
    }
    assert_eq!(seen, created, "the topic holds exactly the payments made");

    // eos-processor over the topic, and eosctl audit from the domain rows to the ledger.
    let (output, group) = (
        unique_name("payments-api-ledger"),
        unique_name("payments-api-processor"),
    );
    let mut processor = spawn_processor(&topic, &output, &group, &[])?;
    // The relay writes in transactions, so each input partition ends with a commit marker: the
    // group reaches the end only if the processor commits past markers too.
    let (audit_topic, database_url, consumed_group) =
        (topic.clone(), db.url.clone(), group.clone());
    let outcome = tokio::task::spawn_blocking(move || {
        integration_tests::wait_until_consumed(
            &bootstrap_servers(),
            &consumed_group,
            &audit_topic,
            Duration::from_secs(120),
        )?;
        integration_tests::eosctl::audit_with(
            &bootstrap_servers(),
            &audit_topic,
            &output,
            &format!("{audit_topic}.dlq"),
            &["--outbox-database-url", &database_url],
        )
    })
    .await?;
    let outcome = outcome.with_context(|| processor.log_tail(40))?;
    assert!(
        outcome.passed(),
        "not exact from the domain rows on:\n{}",
        outcome.failures()
    );
    assert_eq!(outcome.figure("outbox_domain_rows"), created.len() as i64);
    assert_eq!(outcome.figure("logical_events"), created.len() as i64);

    for process in [&mut processor, &mut relay, &mut api.process] {
        let status = process.terminate(Duration::from_secs(30))?;
        assert!(status.success(), "{}", process.log_tail(30));
    }
    db.drop_database().await
}

/// One trace per payment, starting at the HTTP request: payments-api's request span is the root,
/// outbox-relay's publish span is its child (through the context stored in the outbox row), and
/// eos-processor's process span is the relay's child (through the record's headers).
#[tokio::test(flavor = "multi_thread")]
async fn a_payments_trace_starts_at_the_http_request_and_crosses_the_relay() -> anyhow::Result<()> {
    let collector = OtlpCollector::start()?;
    let otel = collector.exporter_env();
    let otel = env_refs(&otel);
    let db = TestDatabase::create().await?;
    let topic = unique_name("payments-traced");
    create_topic(&topic, 3).await?;
    let api = PaymentsApi::start_on(&db.url, &topic, &[], &otel)?;
    let mut relay = spawn_relay(&db.url, &[], &otel)?;
    let mut processor = spawn_processor(
        &topic,
        &unique_name("ledger-traced"),
        &unique_name("processor-traced"),
        &otel,
    )?;

    let mut event_ids = Vec::new();
    for n in 0..20 {
        let body =
            json!({"account_id": format!("acct-{}", n % 3), "amount": 500 + n, "currency": "EUR"});
        let (status, _, answer) = api
            .pay(Some(&format!("traced-{n}")), &body.to_string())
            .await?;
        assert_eq!(status, 201, "{answer}");
        event_ids.push(answer["event_id"].as_str().unwrap_or_default().to_owned());
    }
    let services = ["payments-api", "outbox-relay", "eos-processor"];
    let wanted = event_ids.clone();
    let waited = collector.wait_until(Duration::from_secs(90), move |spans| {
        wanted.iter().all(|event_id| {
            services.iter().all(|service| {
                spans
                    .iter()
                    .any(|s| s.service_name == *service && s.event_id() == Some(event_id))
            })
        })
    });
    for process in [&mut processor, &mut relay] {
        let status = process.terminate(Duration::from_secs(30))?;
        assert!(status.success(), "{}", process.log_tail(30));
    }
    let mut api = api;
    let status = api.process.terminate(Duration::from_secs(30))?;
    assert!(status.success(), "{}", api.process.log_tail(30));
    waited?;

    for event_id in &event_ids {
        let spans = collector.spans_of_event(event_id);
        let of = |service: &str| {
            spans
                .iter()
                .find(|s| s.service_name == service)
                .cloned()
                .with_context(|| format!("{event_id}: no {service} span in {spans:?}"))
        };
        let (request, publish, process) = (
            of("payments-api")?,
            of("outbox-relay")?,
            of("eos-processor")?,
        );
        assert_eq!(
            request.parent_span_id, None,
            "{event_id}: the request starts the trace"
        );
        assert_eq!(
            (publish.trace_id.as_str(), publish.parent_span_id.as_deref()),
            (request.trace_id.as_str(), Some(request.span_id.as_str())),
            "{event_id}: the relay's span is the request's child"
        );
        assert_eq!(
            (process.trace_id.as_str(), process.parent_span_id.as_deref()),
            (request.trace_id.as_str(), Some(publish.span_id.as_str())),
            "{event_id}: the processor's span is the relay's child"
        );
    }
    db.drop_database().await
}

/// Waits until `url` answers `status`.
async fn wait_for_status(client: &reqwest::Client, url: &str, status: u16) -> anyhow::Result<()> {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let answered = client.get(url).send().await.map(|r| r.status().as_u16());
        if answered.as_ref().is_ok_and(|&answered| answered == status) {
            return Ok(());
        }
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "{url} answered {answered:?}, not {status}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// /readyz says whether a payment can be recorded: ready while PostgreSQL answers, not once the
/// database is gone; a payment is then refused with 503 and nothing is promised.
#[tokio::test(flavor = "multi_thread")]
async fn readyz_follows_the_database_and_payments_are_refused_without_it() -> anyhow::Result<()> {
    let db = TestDatabase::create().await?;
    let mut api = PaymentsApi::start(&db, &unique_name("payments-api-ready"))?;
    let ops = api
        .process
        .wait_for_log_field("metrics_addr", START_TIMEOUT)?;
    let readyz = format!("http://{ops}/readyz");
    wait_for_status(&api.client, &readyz, 200).await?;
    let body = r#"{"account_id": "acct-1", "amount": 500, "currency": "EUR"}"#;
    assert_eq!(api.pay(Some("before"), body).await?.0, 201);

    db.drop_database().await?;
    wait_for_status(&api.client, &readyz, 503)
        .await
        .with_context(|| api.process.log_tail(20))?;
    let (status, _, answer) = api.pay(Some("after"), body).await?;
    assert_eq!(status, 503, "{answer}");

    let status = api.process.terminate(Duration::from_secs(30))?;
    assert!(status.success(), "{}", api.process.log_tail(30));
    Ok(())
}

/// Issue 50 (hole 2): an amount that once bricked its account. The amount is bounded before
/// anything is written (422 naming the limit); a balance that would pass its limit and a payment
/// in another currency than the account's are refused 422, never a 503 that says "retry"; the
/// account keeps taking payments.
#[tokio::test(flavor = "multi_thread")]
async fn an_amount_past_the_limit_is_refused_and_the_account_keeps_working() -> anyhow::Result<()> {
    let db = TestDatabase::create().await?;
    let mut api = PaymentsApi::start(&db, &unique_name("payments-api-amounts"))?;
    let pay = |amount: &str, currency: &str| {
        format!(r#"{{"account_id":"acct-big","amount":{amount},"currency":"{currency}"}}"#)
    };
    assert_eq!(api.pay(Some("first"), &pay("500", "EUR")).await?.0, 201);

    let (status, _, answer) = api
        .pay(Some("huge"), &pay("9223372036854775807", "EUR"))
        .await?;
    assert_eq!(status, 422, "{answer}");
    let error = answer["error"].as_str().unwrap_or_default();
    assert!(
        error.contains(&payments_api::payment_request::MAX_AMOUNT.to_string()),
        "the refusal names the limit: {error}"
    );
    assert_eq!(counts(&db.pool).await?, (1, 1), "nothing written");
    assert_eq!(api.pay(Some("after"), &pay("700", "EUR")).await?.0, 201);

    // Another currency on this account: refused, the account unchanged.
    let (status, _, answer) = api.pay(Some("dollars"), &pay("100", "USD")).await?;
    assert_eq!(status, 422, "{answer}");
    assert!(
        answer["error"].as_str().is_some_and(|e| e.contains("EUR")),
        "{answer}"
    );

    // A balance at the edge of its limit (as an account bricked before the bound was): a payment
    // that would pass the limit is refused and names it, one that fits still goes through.
    sqlx::query("UPDATE payments_api_accounts SET balance = $1 WHERE account_id = 'acct-big'")
        .bind(i64::MAX - 100)
        .execute(&db.pool)
        .await?;
    let (status, _, answer) = api.pay(Some("overflow"), &pay("500", "EUR")).await?;
    assert_eq!(status, 422, "{answer}");
    let error = answer["error"].as_str().unwrap_or_default();
    assert!(
        error.contains(&i64::MAX.to_string()),
        "names the limit: {error}"
    );
    assert!(!error.contains("retry"), "{error}");
    assert_eq!(counts(&db.pool).await?, (2, 2), "refusals wrote nothing");
    assert_eq!(api.pay(Some("fits"), &pay("100", "EUR")).await?.0, 201);
    let balance: i64 = sqlx::query_scalar(
        "SELECT balance FROM payments_api_accounts WHERE account_id = 'acct-big'",
    )
    .fetch_one(&db.pool)
    .await?;
    assert_eq!(balance, i64::MAX);

    let status = api.process.terminate(Duration::from_secs(30))?;
    assert!(status.success(), "{}", api.process.log_tail(30));
    db.drop_database().await
}

/// The connection limits the slow-client test runs with: short, so the test is quick.
const SHORT_LIMITS: &[&str] = &[
    "--header-read-timeout",
    "2s",
    "--body-read-timeout",
    "2s",
    "--idle-timeout",
    "2s",
];
/// How long after connecting a slow client may still be open: the 2 s limit plus scheduling.
const CLOSED_WITHIN: Duration = Duration::from_secs(4);

/// One hostile client on loopback: it connects, sends `opening` at once, then one byte of
/// `trickle` per second, and reports how long after connecting the server closed it (`None`:
/// still open after `CLOSED_WITHIN` and a margin). Every loop is bounded.
async fn slow_client(addr: String, opening: String, trickle: &'static [u8]) -> Option<Duration> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let started = std::time::Instant::now();
    let stream = tokio::net::TcpStream::connect(&addr).await.ok()?;
    let (mut reader, mut writer) = stream.into_split();
    let writing = tokio::spawn(async move {
        if writer.write_all(opening.as_bytes()).await.is_err() {
            return;
        }
        for byte in trickle {
            tokio::time::sleep(Duration::from_secs(1)).await;
            if writer.write_all(&[*byte]).await.is_err() {
                return;
            }
        }
        // Then nothing: the body never comes. Held open until the reader is done.
        tokio::time::sleep(Duration::from_secs(30)).await;
    });
    let closed = tokio::time::timeout(CLOSED_WITHIN * 3, async {
        let mut buffer = [0u8; 1024];
        loop {
            match reader.read(&mut buffer).await {
                Ok(0) | Err(_) => return started.elapsed(),
                Ok(_) => {}
            }
        }
    })
    .await
    .ok();
    writing.abort();
    closed
}

/// Issue 50 (hole 1): 200 slow clients — 100 sending their headers at a byte per second, 100
/// sending headers and then stalling their body — do not stop payments: a normal payment is
/// answered within 1 s while they are connected, each is closed within its timeout, and the
/// closings are counted by reason.
#[tokio::test(flavor = "multi_thread")]
async fn slow_clients_are_cut_off_and_payments_go_on() -> anyhow::Result<()> {
    let db = TestDatabase::create().await?;
    let mut api = PaymentsApi::start_on(
        &db.url,
        &unique_name("payments-api-slow"),
        SHORT_LIMITS,
        &[],
    )?;
    let addr = api.base.trim_start_matches("http://").to_owned();
    let slow_headers = "POST /payments HTTP/1.1\r\nHost: payments\r\n".to_owned();
    let stalled_body = "POST /payments HTTP/1.1\r\nHost: payments\r\nIdempotency-Key: stall\r\n\
                        Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"
        .to_owned();
    let trickle: &'static [u8] = b"Idempotency-Key: trickled-one-byte-at-a-time\r\n\r\n";
    let mut clients = Vec::new();
    for n in 0..200 {
        let (opening, trickle) = if n % 2 == 0 {
            (slow_headers.clone(), trickle)
        } else {
            (stalled_body.clone(), &b""[..])
        };
        clients.push(tokio::spawn(slow_client(addr.clone(), opening, trickle)));
    }
    // All 200 are connected and holding on when the payment comes.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let started = std::time::Instant::now();
    let (status, _, answer) = api
        .pay(
            Some("normal"),
            r#"{"account_id":"acct-1","amount":100,"currency":"EUR"}"#,
        )
        .await?;
    let latency = started.elapsed();
    assert_eq!(status, 201, "{answer}");
    println!("a normal payment under 200 slow clients answered in {latency:?}");
    assert!(latency < Duration::from_secs(1), "answered in {latency:?}");

    let mut slowest = Duration::ZERO;
    for client in clients {
        let closed = client.await?;
        let closed = closed.context("a slow client was still connected")?;
        slowest = slowest.max(closed);
    }
    println!("the slowest of 200 slow clients was closed {slowest:?} after it connected");
    assert!(slowest <= CLOSED_WITHIN, "closed after {slowest:?}");

    let ops = api
        .process
        .wait_for_log_field("metrics_addr", START_TIMEOUT)?;
    let metrics = api
        .client
        .get(format!("http://{ops}/metrics"))
        .send()
        .await?
        .text()
        .await?;
    for reason in ["header_timeout", "body_timeout"] {
        let count = metric_value(
            &metrics,
            &format!("payments_api_connections_dropped_total{{reason=\"{reason}\"}}"),
        );
        assert!(count >= 100.0, "{reason}: {count} in\n{metrics}");
    }
    let status = api.process.terminate(Duration::from_secs(30))?;
    assert!(status.success(), "{}", api.process.log_tail(30));
    db.drop_database().await
}

/// The value of the sample `name{labels}` in a Prometheus text page, or 0.
fn metric_value(page: &str, sample: &str) -> f64 {
    page.lines()
        .find_map(|line| line.strip_prefix(sample))
        .and_then(|rest| rest.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Sends a 10 MB body (`chunked`, or with a Content-Length) over a raw socket as most clients
/// do — the whole body first, then the answer — and returns what was read before the connection
/// ended. A server that stops reading and closes makes the kernel reset the connection: the
/// client's writes fail, or its read does, and the answer is lost.
async fn send_big_body(addr: &str, chunked: bool) -> anyhow::Result<String> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    const BODY: usize = 10 * 1024 * 1024;
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    let framing = if chunked {
        "Transfer-Encoding: chunked".to_owned()
    } else {
        format!("Content-Length: {BODY}")
    };
    let head = format!(
        "POST /payments HTTP/1.1\r\nHost: payments\r\nIdempotency-Key: big\r\n\
         Content-Type: application/json\r\n{framing}\r\n\r\n"
    );
    let sent = tokio::time::timeout(Duration::from_secs(20), async {
        stream.write_all(head.as_bytes()).await?;
        let chunk = vec![b' '; 64 * 1024];
        for _ in 0..BODY / chunk.len() {
            if chunked {
                stream
                    .write_all(format!("{:x}\r\n", chunk.len()).as_bytes())
                    .await?;
            }
            stream.write_all(&chunk).await?;
            if chunked {
                stream.write_all(b"\r\n").await?;
            }
        }
        if chunked {
            stream.write_all(b"0\r\n\r\n").await?;
        }
        std::io::Result::Ok(())
    })
    .await;
    match sent {
        Ok(Ok(())) => {}
        Ok(Err(error)) => anyhow::bail!("sending the body failed: {error}"),
        Err(_) => anyhow::bail!("the body was not taken within 20 s"),
    }
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(20), async {
        let mut buffer = [0u8; 4096];
        loop {
            match stream.read(&mut buffer).await {
                Ok(0) => return Ok(()),
                Ok(n) => answer.extend_from_slice(&buffer[..n]),
                Err(error) => return Err(error),
            }
        }
    })
    .await;
    let answer = String::from_utf8_lossy(&answer).into_owned();
    match read {
        Ok(Ok(())) => Ok(answer),
        Ok(Err(error)) => anyhow::bail!("{error} after reading {answer:?}"),
        Err(_) => anyhow::bail!("no end within 20 s after reading {answer:?}"),
    }
}

/// Issue 50 (hole 4): a body over the size limit is answered 413, chunked or with a length —
/// never cut by a reset — and nothing is written.
#[tokio::test(flavor = "multi_thread")]
async fn an_oversized_body_is_answered_413_chunked_or_not() -> anyhow::Result<()> {
    let db = TestDatabase::create().await?;
    let mut api = PaymentsApi::start(&db, &unique_name("payments-api-big"))?;
    let addr = api.base.trim_start_matches("http://").to_owned();
    for chunked in [true, false] {
        let answer = send_big_body(&addr, chunked)
            .await
            .with_context(|| format!("chunked: {chunked}"))?;
        assert!(
            answer.starts_with("HTTP/1.1 413"),
            "chunked: {chunked}: {answer:?}"
        );
    }
    assert_eq!(counts(&db.pool).await?, (0, 0), "nothing written");
    let status = api.process.terminate(Duration::from_secs(30))?;
    assert!(status.success(), "{}", api.process.log_tail(30));
    db.drop_database().await
}
