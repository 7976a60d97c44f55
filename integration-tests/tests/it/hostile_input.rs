//! Hostile input (docs/security.md "What each service refuses"): every endpoint is
//! probed as an attacker or a careless client would, against the real binaries on the local
//! stack, so that the next endpoint is probed the same way. Each service is started once and
//! every probe of it fired at that one process; each probe asserts the precise refusal (HTTP
//! status and reason, gRPC code, dead-letter reason, exit code and message) and that nothing was
//! written where nothing must be (no payment row, no intent, no output record), then that the
//! service still does its work.
//!
//! - payments-api's HTTP API: malformed JSON, other content types, huge and too many headers,
//!   path traversal, unknown methods, negative and overflowing amounts, raw bytes on the socket;
//! - dedup-service's gRPC API: no or a wrong token, malformed protobuf bytes and gRPC frames,
//!   an oversized message, unknown methods, forged fencing, raw bytes on the gRPC port;
//! - the ops endpoint (`/healthz`, `/readyz`, `/metrics`, `/boundary`) of every service started
//!   here, with odd methods and paths;
//! - malformed records on eos-processor's and sink-writer's topics;
//! - every binary with bad flag values.
//!
//! Probes kept elsewhere, not repeated here: slow and stalled HTTP clients and the connection cap
//! (`payments_api::slow_clients_are_cut_off_and_payments_go_on`), an oversized body chunked or
//! with a length (`payments_api::an_oversized_body_is_answered_413_chunked_or_not`), a reused
//! Idempotency-Key and a key with a space (`payments_api::one_key_is_one_payment_and_…`), an
//! amount past a balance's limit and another currency (`payments_api::an_amount_past_the_limit_…`);
//! every RPC with no, a wrong or a client token, fencing secrets guessed, empty or cut, and mTLS
//! without a trusted certificate (`dedup_auth`); invalid fields, a non-positive or guessed fencing
//! counter and an unknown id (`dedup_service::dedup_bad_input_gets_the_right_status_…`); records
//! too large for a dead letter and dead-letter topics smaller than the producer's limit
//! (`poison_input`); a malformed record of every kind `eosctl produce` writes, audited exactly
//! (`processor`, `sink_writer`); secrets in flags, files and the environment (`secrets`).

use std::collections::BTreeMap;
use std::pin::Pin;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use eos_core::dead_letter;
use eos_proto::dedup::v1 as pb;
use eos_proto::dedup::v1::dedup_client::DedupClient as GrpcClient;
use eos_testkit::argv;
use integration_tests::service_process::ServiceProcess;
use integration_tests::{
    Isolation, TestDatabase, bootstrap_servers, create_topic, produce_records, read_topic,
    unique_name, wait_until_consumed, workspace_binary,
};
use rdkafka::Message as _;
use rdkafka::message::Headers as _;
use serde_json::json;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tonic::codegen::{Body as _, Service as _, http};
use tonic::transport::Channel;
use tonic::{Code, Request};

use crate::dedup_service::Dedup;
use crate::payments_api::PaymentsApi;
use crate::sink_writer::Sink;

const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a refused raw connection may take to be answered and closed.
const RAW_ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// What a raw TCP exchange got back: the bytes read until the server closed the connection (or
/// reset it), and whether it did within [`RAW_ANSWER_TIMEOUT`].
struct RawAnswer {
    bytes: Vec<u8>,
    closed: bool,
}

impl std::fmt::Debug for RawAnswer {
    /// The answer as text, cut: what a failure message needs to show.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let text = String::from_utf8_lossy(&self.bytes);
        let shown: String = text.chars().take(300).collect();
        f.debug_struct("RawAnswer")
            .field("text", &shown)
            .field("bytes", &self.bytes.len())
            .field("closed", &self.closed)
            .finish()
    }
}

impl RawAnswer {
    /// The status code of an HTTP/1.x answer, if the bytes start with one.
    fn status(&self) -> Option<u16> {
        let text = String::from_utf8_lossy(&self.bytes);
        let line = text.lines().next()?;
        let mut words = line.split(' ');
        words
            .next()
            .filter(|version| version.starts_with("HTTP/1."))?;
        words.next()?.parse().ok()
    }

    /// The body of an HTTP answer (after the blank line), as text.
    fn body(&self) -> String {
        let text = String::from_utf8_lossy(&self.bytes);
        text.split_once("\r\n\r\n")
            .map(|(_, body)| body.to_owned())
            .unwrap_or_default()
    }
}

/// Connects to `addr`, writes `request` (a write the server cuts short is not an error: it may
/// refuse before reading everything) and reads until the server closes the connection.
async fn raw_exchange(addr: &str, request: &[u8]) -> anyhow::Result<RawAnswer> {
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    let _ = stream.write_all(request).await;
    let mut bytes = Vec::new();
    let closed = tokio::time::timeout(RAW_ANSWER_TIMEOUT, async {
        let mut buffer = [0u8; 4096];
        loop {
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(n) => bytes.extend_from_slice(&buffer[..n]),
            }
        }
    })
    .await
    .is_ok();
    Ok(RawAnswer { bytes, closed })
}

/// An HTTP/1.1 request line and headers as written (no normalisation of the path), with
/// `Connection: close` so the server ends the exchange after its answer, and `body`.
fn raw_request(method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Vec<u8> {
    let mut request = format!("{method} {path} HTTP/1.1\r\nHost: hostile\r\nConnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    request.into_bytes()
}

/// The odd methods and paths every ops endpoint must refuse, and its four paths still answering
/// GET afterwards. The endpoint is the same code in every service (eos_runtime::ops_http), but
/// each service's is probed: a service could mount more on it.
async fn probe_ops_endpoint(service: &str, ops_addr: &str) -> anyhow::Result<()> {
    for path in ["/healthz", "/readyz", "/metrics", "/boundary"] {
        for method in ["POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "FOO"] {
            let answer = raw_exchange(ops_addr, &raw_request(method, path, &[], "{}")).await?;
            ensure!(
                answer.status() == Some(405),
                "{service}: {method} {path}: {answer:?}"
            );
        }
        // HEAD is GET without the body.
        let head = raw_exchange(ops_addr, &raw_request("HEAD", path, &[], "")).await?;
        ensure!(
            head.status()
                .is_some_and(|status| status == 200 || status == 503),
            "{service}: HEAD {path}: {head:?}"
        );
        ensure!(head.body().is_empty(), "{service}: HEAD {path}: {head:?}");
    }
    for path in [
        "/",
        "/metrics/",
        "//metrics",
        "/METRICS",
        "/boundary/../metrics",
        "/../../../../etc/passwd",
        "/%2e%2e/%2e%2e/etc/passwd",
        "/metrics/%00",
        "/payments",
    ] {
        let answer = raw_exchange(ops_addr, &raw_request("GET", path, &[], "")).await?;
        ensure!(
            answer.status() == Some(404),
            "{service}: GET {path}: {answer:?}"
        );
        ensure!(
            !answer.body().contains("root:"),
            "{service}: GET {path} served a file"
        );
    }
    let garbage = raw_exchange(ops_addr, b"\x00\x01\x02\xff\xfe not http\r\n\r\n").await?;
    ensure!(
        garbage.status() == Some(400) && garbage.closed,
        "{service}: raw bytes on the ops port: {garbage:?}"
    );
    let client = reqwest::Client::new();
    for path in ["healthz", "metrics", "boundary"] {
        let status = client
            .get(format!("http://{ops_addr}/{path}"))
            .send()
            .await?
            .status();
        ensure!(
            status == 200,
            "{service}: /{path} after the probes: {status}"
        );
    }
    Ok(())
}

/// Rows of payments-api's payments table and of the outbox.
async fn payments_and_events(db: &TestDatabase) -> anyhow::Result<(i64, i64)> {
    let payments: i64 = sqlx::query_scalar("SELECT count(*) FROM payments_api_payments")
        .fetch_one(&db.pool)
        .await?;
    let events: i64 = sqlx::query_scalar("SELECT count(*) FROM eos_outbox")
        .fetch_one(&db.pool)
        .await?;
    Ok((payments, events))
}

const PAYMENT: &str = r#"{"account_id":"acct-hostile","amount":500,"currency":"EUR"}"#;

#[tokio::test(flavor = "multi_thread")]
async fn hostile_http_requests_to_payments_api_are_refused_and_write_nothing() -> anyhow::Result<()>
{
    let db = TestDatabase::create().await?;
    let mut api = PaymentsApi::start_on(&db.url, &unique_name("hostile-payments"), &[], &[])?;
    let addr = api.process.wait_for_log_field("http_addr", START_TIMEOUT)?;
    let ops = api
        .process
        .wait_for_log_field("metrics_addr", START_TIMEOUT)?;
    let client = reqwest::Client::new();
    let url = format!("http://{addr}/payments");
    let mut key = 0;
    let mut post = async |content_type: &str, body: Vec<u8>| -> anyhow::Result<(u16, String)> {
        key += 1;
        let response = client
            .post(&url)
            .header("content-type", content_type)
            .header("idempotency-key", format!("hostile-{key}"))
            .body(body)
            .send()
            .await?;
        Ok((response.status().as_u16(), response.text().await?))
    };
    let error_of = |body: &str| -> String {
        serde_json::from_str::<serde_json::Value>(body)
            .ok()
            .and_then(|answer| answer["error"].as_str().map(str::to_owned))
            .unwrap_or_else(|| format!("<not a JSON error: {body:?}>"))
    };

    // Malformed JSON, and bodies in other formats: 400, the parser's reason.
    let deep = "[".repeat(10_000);
    let malformed: [(&str, &[u8]); 11] = [
        ("truncated", br#"{"account_id":"acct-hostile","amount":5"#),
        ("empty", b""),
        ("null", b"null"),
        ("an array", b"[1,2,3]"),
        ("a string", br#""pay me""#),
        (
            "a duplicate field",
            br#"{"account_id":"a","amount":5,"amount":7,"currency":"EUR"}"#,
        ),
        (
            "an unknown field",
            br#"{"account_id":"a","amount":5,"currency":"EUR","admin":true}"#,
        ),
        (
            "a byte-order mark",
            b"\xef\xbb\xbf{\"account_id\":\"a\",\"amount\":5,\"currency\":\"EUR\"}",
        ),
        (
            "invalid UTF-8",
            b"{\"account_id\":\"\xff\xfe\",\"amount\":5,\"currency\":\"EUR\"}",
        ),
        ("deep nesting", deep.as_bytes()),
        ("binary", &[0x00, 0x9f, 0x92, 0x96, 0xff, 0x00, 0x01]),
    ];
    for (what, body) in malformed {
        let (status, answer) = post("application/json", body.to_vec()).await?;
        ensure!(status == 400, "{what}: {status} {answer}");
        let error = error_of(&answer);
        ensure!(error.contains("body is not a payment"), "{what}: {error}");
    }
    for (content_type, body) in [
        (
            "application/x-www-form-urlencoded",
            "account_id=a&amount=5&currency=EUR",
        ),
        ("application/xml", "<payment><amount>5</amount></payment>"),
        (
            "multipart/form-data; boundary=x",
            "--x\r\nContent-Disposition: form-data; name=\"amount\"\r\n\r\n5\r\n--x--\r\n",
        ),
    ] {
        let (status, answer) = post(content_type, body.as_bytes().to_vec()).await?;
        ensure!(status == 400, "{content_type}: {status} {answer}");
        ensure!(
            error_of(&answer).contains("body is not a payment"),
            "{content_type}: {answer}"
        );
    }
    // The Content-Type is not read: a body that is a payment is one under any type. (A browser
    // cannot send it cross-site unasked: the Idempotency-Key header makes the request one that
    // needs a CORS preflight, which payments-api refuses with 405.)
    let (status, answer) = post("text/plain", PAYMENT.as_bytes().to_vec()).await?;
    ensure!(
        status == 201,
        "a payment under text/plain: {status} {answer}"
    );
    let written = (1, 1);
    ensure!(payments_and_events(&db).await? == written);

    // Amounts: not positive (400), past the limit (422 naming it), not a 64-bit integer (400).
    let max = payments_api::payment_request::MAX_AMOUNT;
    for (amount, status_wanted, says) in [
        ("-1".to_owned(), 400, "positive"),
        ("0".to_owned(), 400, "positive"),
        ("-9223372036854775808".to_owned(), 400, "positive"),
        (
            (max + 1).to_string(),
            422,
            "over the limit of 1000000000000",
        ),
        ("9223372036854775807".to_owned(), 422, "over the limit"),
        ("9223372036854775808".to_owned(), 400, "expected i64"),
        ("-9223372036854775809".to_owned(), 400, "expected i64"),
        ("1e400".to_owned(), 400, "number out of range"),
        ("5.5".to_owned(), 400, "floating point"),
        ("\"500\"".to_owned(), 400, "expected i64"),
        ("null".to_owned(), 400, "expected i64"),
    ] {
        let body = format!(r#"{{"account_id":"acct-hostile","amount":{amount},"currency":"EUR"}}"#);
        let (status, answer) = post("application/json", body.into_bytes()).await?;
        let error = error_of(&answer);
        ensure!(
            status == status_wanted && error.contains(says),
            "amount {amount}: {status} {error}"
        );
        ensure!(!error.contains("retry"), "amount {amount}: {error}");
    }

    // Headers: no key, an overlong key (400); one 1 MB header and 150 headers (431).
    let no_key = client
        .post(&url)
        .header("content-type", "application/json")
        .body(PAYMENT)
        .send()
        .await?;
    ensure!(no_key.status() == 400, "no key: {}", no_key.status());
    ensure!(error_of(&no_key.text().await?).contains("Idempotency-Key header is required"));
    let long_key = client
        .post(&url)
        .header("content-type", "application/json")
        .header("idempotency-key", "k".repeat(300))
        .body(PAYMENT)
        .send()
        .await?;
    ensure!(long_key.status() == 400, "long key: {}", long_key.status());
    ensure!(error_of(&long_key.text().await?).contains("1 to 255 bytes"));
    let huge = "h".repeat(1024 * 1024);
    let huge_header = raw_exchange(
        &addr,
        &raw_request(
            "POST",
            "/payments",
            &[("Idempotency-Key", "huge-header"), ("X-Huge", &huge)],
            PAYMENT,
        ),
    )
    .await?;
    ensure!(
        huge_header.status() == Some(431) && huge_header.closed,
        "a 1 MB header: {:?}",
        huge_header.status()
    );
    let many: Vec<(String, &str)> = (0..150).map(|n| (format!("X-Many-{n}"), "v")).collect();
    let mut headers: Vec<(&str, &str)> = many.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    headers.push(("Idempotency-Key", "many-headers"));
    let many_headers =
        raw_exchange(&addr, &raw_request("POST", "/payments", &headers, PAYMENT)).await?;
    ensure!(
        many_headers.status() == Some(431),
        "150 headers: {many_headers:?}"
    );

    // Paths around /payments, sent as written (no client normalises them here): 404, even with
    // a valid payment and key.
    for path in [
        "/payments/../payments",
        "/payments/",
        "/payments/1",
        "/../../../../etc/passwd",
        "/%2e%2e/%2e%2e/etc/passwd",
        "/payments%2f..%2f",
        "/PAYMENTS",
        "//payments",
    ] {
        let answer = raw_exchange(
            &addr,
            &raw_request(
                "POST",
                path,
                &[
                    ("Idempotency-Key", "path-probe"),
                    ("Content-Type", "application/json"),
                ],
                PAYMENT,
            ),
        )
        .await?;
        ensure!(answer.status() == Some(404), "POST {path}: {answer:?}");
        ensure!(
            !answer.body().contains("root:"),
            "POST {path} served a file"
        );
    }

    // Every other method on /payments: 405.
    for method in [
        "GET", "HEAD", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "CONNECT", "FOO",
    ] {
        let answer = raw_exchange(
            &addr,
            &raw_request(
                method,
                "/payments",
                &[
                    ("Idempotency-Key", "method-probe"),
                    ("Content-Type", "application/json"),
                ],
                PAYMENT,
            ),
        )
        .await?;
        ensure!(answer.status() == Some(405), "{method}: {answer:?}");
    }

    // Raw bytes and broken framing on the socket: 400 and the connection closed (an HTTP/2
    // preface: closed with no answer); the body-reading errors say nothing was written.
    let payment_request = |framing: &str, body: &str| {
        format!(
            "POST /payments HTTP/1.1\r\nHost: hostile\r\nIdempotency-Key: framing\r\n\
             Content-Type: application/json\r\n{framing}\r\n\r\n{body}"
        )
        .into_bytes()
    };
    let mut client_hello = vec![
        0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03,
    ];
    client_hello.extend_from_slice(&[0u8; 64]);
    // (what, the bytes, the handler's error; None: refused by the HTTP parser, before any
    // handler, with an empty body)
    let framing_probes: [(&str, Vec<u8>, Option<&str>); 9] = [
        (
            "raw bytes",
            b"\x00\x01\x02\xff\xfe\x80 not http at all\r\n\r\n".to_vec(),
            None,
        ),
        ("a TLS ClientHello", client_hello, None),
        (
            "HTTP/9.9",
            b"POST /payments HTTP/9.9\r\nHost: x\r\n\r\n".to_vec(),
            None,
        ),
        (
            "control bytes in the path",
            b"POST /pay\x01ments HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
            None,
        ),
        (
            "two Content-Lengths",
            payment_request("Content-Length: 5\r\nContent-Length: 7", PAYMENT),
            None,
        ),
        (
            "a negative Content-Length",
            payment_request("Content-Length: -1", PAYMENT),
            None,
        ),
        (
            "an unknown transfer coding",
            payment_request("Transfer-Encoding: gzip", PAYMENT),
            None,
        ),
        (
            "a broken chunk",
            payment_request("Transfer-Encoding: chunked", "zz\r\nabc\r\n0\r\n\r\n"),
            Some("the body could not be read"),
        ),
        (
            "a body shorter than its Content-Length",
            payment_request("Content-Length: 1000", PAYMENT),
            Some("the body could not be read"),
        ),
    ];
    for (what, bytes, says) in framing_probes {
        let answer = if what.starts_with("a body shorter") {
            // The body ends with the connection: the client half-closes after it.
            let mut stream = tokio::net::TcpStream::connect(&addr).await?;
            stream.write_all(&bytes).await?;
            stream.shutdown().await?;
            let mut read = Vec::new();
            let closed = tokio::time::timeout(RAW_ANSWER_TIMEOUT, stream.read_to_end(&mut read))
                .await
                .is_ok();
            RawAnswer {
                bytes: read,
                closed,
            }
        } else {
            raw_exchange(&addr, &bytes).await?
        };
        ensure!(
            answer.status() == Some(400) && answer.closed,
            "{what}: {answer:?}"
        );
        match says {
            None => ensure!(answer.body().is_empty(), "{what}: {answer:?}"),
            Some(says) => {
                let error = error_of(&answer.body());
                ensure!(
                    error.contains(says) && error.contains("nothing was written"),
                    "{what}: {error}"
                );
            }
        }
    }
    let preface = raw_exchange(&addr, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await?;
    ensure!(
        preface.closed && preface.bytes.is_empty(),
        "an HTTP/2 preface: {preface:?}"
    );

    ensure!(
        payments_and_events(&db).await? == written,
        "a refused request wrote a payment or an event"
    );
    probe_ops_endpoint("payments-api", &ops).await?;

    // Still taking payments.
    let (status, answer) = post("application/json", PAYMENT.as_bytes().to_vec()).await?;
    ensure!(status == 201, "after the probes: {status} {answer}");
    ensure!(payments_and_events(&db).await? == (written.0 + 1, written.1 + 1));
    let status = api.process.terminate(Duration::from_secs(30))?;
    ensure!(status.success(), "{}", api.process.log_tail(30));
    ensure!(
        !api.process.log().contains("panicked"),
        "{}",
        api.process.log_tail(30)
    );
    db.drop_database().await
}

const CLIENT_TOKEN: &str = "hostile-client-token-0123456789";

fn bearer<T>(message: T, token: Option<&str>) -> anyhow::Result<Request<T>> {
    let mut request = Request::new(message);
    if let Some(token) = token {
        request
            .metadata_mut()
            .insert("authorization", format!("Bearer {token}").parse()?);
    }
    Ok(request)
}

fn begin(operation_id: &str) -> pb::BeginRequest {
    pb::BeginRequest {
        operation_id: operation_id.to_owned(),
        fingerprint: vec![7; 32],
        owner: "hostile".into(),
        occurred_at: Some(prost_types::Timestamp::from(std::time::SystemTime::now())),
        ..Default::default()
    }
}

/// One gRPC frame: the compression flag, the big-endian length (of `message`, unless `length`
/// says otherwise) and the message. As text, since the only body type at hand is a `String`:
/// every byte here is below 0x80.
fn grpc_frame(compressed: bool, length: Option<u32>, message: &str) -> String {
    let length = length.unwrap_or(message.len() as u32);
    let mut frame = String::from(if compressed { '\u{1}' } else { '\0' });
    for byte in length.to_be_bytes() {
        assert!(byte < 0x80, "a frame length this test can write as text");
        frame.push(char::from(byte));
    }
    frame.push_str(message);
    frame
}

/// Sends `body` as a unary call to `path` on `channel`, below the generated client (so the bytes
/// need not be a message), and returns the gRPC status: from the headers of a trailers-only
/// answer, or from the trailers after the body. `None`: the answer carried no status.
async fn raw_grpc_call(
    channel: &Channel,
    path: &str,
    content_type: &str,
    token: Option<&str>,
    body: String,
) -> anyhow::Result<Option<tonic::Status>> {
    let mut request = http::Request::builder()
        .method("POST")
        .uri(path)
        .header("content-type", content_type)
        .header("te", "trailers");
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    let request = request.body(tonic::body::Body::new(body))?;
    let mut channel = channel.clone();
    futures::future::poll_fn(|cx| channel.poll_ready(cx)).await?;
    let response = tokio::time::timeout(RAW_ANSWER_TIMEOUT, channel.call(request))
        .await
        .context("no answer")??;
    if let Some(status) = tonic::Status::from_header_map(response.headers()) {
        return Ok(Some(status));
    }
    let mut body = response.into_body();
    loop {
        let frame = tokio::time::timeout(
            RAW_ANSWER_TIMEOUT,
            futures::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)),
        )
        .await
        .context("the answer's body did not end")?;
        match frame {
            None => return Ok(None),
            Some(frame) => {
                if let Ok(trailers) = frame?.into_trailers() {
                    return Ok(tonic::Status::from_header_map(&trailers));
                }
            }
        }
    }
}

/// Every intent dedup-service holds: (operation id, state, fencing counter, history rows).
async fn intents(db: &TestDatabase) -> anyhow::Result<Vec<(String, String, i64, i64)>> {
    Ok(sqlx::query_as(
        "SELECT operation_id, state, fencing_token,
                (SELECT count(*) FROM dedup_intent_history h WHERE h.operation_id = i.operation_id)
         FROM dedup_intents i ORDER BY operation_id",
    )
    .fetch_all(&db.pool)
    .await?)
}

#[tokio::test(flavor = "multi_thread")]
async fn hostile_grpc_calls_to_dedup_service_are_refused_and_write_nothing() -> anyhow::Result<()> {
    let db = TestDatabase::create().await?;
    let mut service = Dedup::spawn(
        &db,
        &["--reconcile-interval", "1h", "--client-token", CLIENT_TOKEN],
    )?;
    let channel = tonic::transport::Endpoint::from_shared(service.endpoint())?
        .connect()
        .await?;
    let mut grpc = GrpcClient::new(channel.clone());
    // One intent held the honest way: what a forged report must leave as it is.
    let held = grpc
        .begin(bearer(begin("hostile-held"), Some(CLIENT_TOKEN))?)
        .await?
        .into_inner();
    let Some(pb::begin_response::Outcome::Acquired(held)) = held.outcome else {
        bail!("expected ACQUIRED: {held:?}");
    };
    let before = intents(&db).await?;
    ensure!(
        before == [("hostile-held".to_owned(), "RESERVED".to_owned(), 1, 1)],
        "{before:?}"
    );

    // No token, a wrong one, a malformed authorization header: UNAUTHENTICATED, nothing begun.
    for (what, authorization) in [
        ("no token", None),
        (
            "a wrong token",
            Some("Bearer hostile-client-token-0123456780"),
        ),
        ("a token without Bearer", Some(CLIENT_TOKEN)),
        ("Basic credentials", Some("Basic aG9zdGlsZTpob3N0aWxl")),
        ("an empty bearer", Some("Bearer ")),
    ] {
        let mut request = Request::new(begin("hostile-unauthenticated"));
        if let Some(value) = authorization {
            request
                .metadata_mut()
                .insert("authorization", value.parse()?);
        }
        let refused = grpc.begin(request).await.expect_err(what);
        ensure!(
            refused.code() == Code::Unauthenticated,
            "{what}: {refused:?}"
        );
        let mut batch = Request::new(pb::BeginBatchRequest {
            items: vec![begin("hostile-unauthenticated-batch")],
        });
        if let Some(value) = authorization {
            batch.metadata_mut().insert("authorization", value.parse()?);
        }
        let refused = grpc.begin_batch(batch).await.expect_err(what);
        ensure!(
            refused.code() == Code::Unauthenticated,
            "{what}: {refused:?}"
        );
    }

    // Bytes that are no BeginRequest, and broken gRPC frames. Without a token the caller is
    // refused before its bytes are read; with one, the message is refused as undecodable.
    let begin_path = "/eos.dedup.v1.Dedup/Begin";
    let not_protobuf = "\u{f}\u{f}\u{f}\u{f} not protobuf \u{7}\u{7}";
    let garbage = grpc_frame(false, None, not_protobuf);
    let refused = raw_grpc_call(
        &channel,
        begin_path,
        "application/grpc",
        None,
        garbage.clone(),
    )
    .await?
    .context("an answer without a status")?;
    ensure!(refused.code() == Code::Unauthenticated, "{refused:?}");
    // A field of BeginRequest with a length past the message's end.
    let overrunning = "\u{a}\u{7f}hostile";
    // (what, the frame, what the INTERNAL status says)
    let frames: [(&str, String, &str); 5] = [
        (
            "bytes that are not protobuf",
            garbage,
            "failed to decode Protobuf message",
        ),
        (
            "a field that runs past the message",
            grpc_frame(false, None, overrunning),
            "failed to decode Protobuf message",
        ),
        (
            "a frame shorter than its length",
            grpc_frame(false, Some(100), "\u{a}\u{2}id"),
            "Unexpected EOF",
        ),
        (
            "a compressed frame with no grpc-encoding",
            grpc_frame(true, None, "\u{a}\u{2}id"),
            "compressed-flag but no grpc-encoding",
        ),
        (
            "a frame cut inside its prefix",
            "\0\0".to_owned(),
            "Unexpected EOF",
        ),
    ];
    for (what, frame, says) in frames {
        let status = raw_grpc_call(
            &channel,
            begin_path,
            "application/grpc",
            Some(CLIENT_TOKEN),
            frame,
        )
        .await?
        .with_context(|| format!("{what}: an answer without a status"))?;
        ensure!(
            status.code() == Code::Internal && status.message().contains(says),
            "{what}: {status:?}"
        );
    }
    // An unknown method and service, and server reflection (off by default): UNIMPLEMENTED.
    for path in [
        "/eos.dedup.v1.Dedup/DropAllIntents",
        "/hostile.Admin/Exec",
        "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
        "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
    ] {
        let status = raw_grpc_call(
            &channel,
            path,
            "application/grpc",
            Some(CLIENT_TOKEN),
            grpc_frame(false, None, ""),
        )
        .await?
        .with_context(|| format!("{path}: an answer without a status"))?;
        ensure!(status.code() == Code::Unimplemented, "{path}: {status:?}");
    }

    // A message over --max-decoding-message-size (4 MiB): OUT_OF_RANGE, tonic's code for it, as
    // the flag's help says.
    let oversized = pb::BeginRequest {
        operation_id: "o".repeat(5 * 1024 * 1024),
        ..begin("unused")
    };
    let refused = grpc
        .begin(bearer(oversized, Some(CLIENT_TOKEN))?)
        .await
        .expect_err("a 5 MiB message");
    ensure!(
        refused.code() == Code::OutOfRange && refused.message().contains("too large"),
        "{refused:?}"
    );

    // Forged fencing on the held intent: the right counter with a 64 KiB forged secret, the
    // largest counter with the real secret, a report for an id nobody began.
    let forged_secret = grpc
        .complete(bearer(
            pb::CompleteRequest {
                operation_id: "hostile-held".into(),
                fencing_token: held.fencing_token,
                result: b"forged".to_vec(),
                fencing_secret: vec![0x5a; 64 * 1024],
                trace_context: Default::default(),
            },
            Some(CLIENT_TOKEN),
        )?)
        .await
        .expect_err("a forged secret");
    ensure!(
        forged_secret.code() == Code::PermissionDenied,
        "{forged_secret:?}"
    );
    let forged_counter = grpc
        .fail(bearer(
            pb::FailRequest {
                operation_id: "hostile-held".into(),
                fencing_token: i64::MAX,
                reason: "forged".into(),
                retryable: false,
                fencing_secret: held.fencing_secret.clone(),
            },
            Some(CLIENT_TOKEN),
        )?)
        .await
        .expect_err("a forged counter");
    ensure!(
        forged_counter.code() == Code::FailedPrecondition,
        "{forged_counter:?}"
    );
    let never_begun = grpc
        .mark_unknown(bearer(
            pb::MarkUnknownRequest {
                operation_id: "hostile-never-begun".into(),
                fencing_token: 1,
                detail: "forged".into(),
                fencing_secret: held.fencing_secret.clone(),
            },
            Some(CLIENT_TOKEN),
        )?)
        .await
        .expect_err("an id nobody began");
    ensure!(never_begun.code() == Code::NotFound, "{never_begun:?}");

    // Raw bytes on the gRPC port (HTTP/2 only): closed at once, nothing served.
    let grpc_addr = service.endpoint().trim_start_matches("http://").to_owned();
    for (what, bytes) in [
        (
            "raw bytes",
            &b"\x00\x01\x02\xff\xfe not http/2 at all\r\n\r\n"[..],
        ),
        (
            "an HTTP/1.1 request",
            &b"POST /eos.dedup.v1.Dedup/Begin HTTP/1.1\r\nHost: x\r\n\
               Content-Type: application/grpc\r\nContent-Length: 5\r\n\r\n\0\0\0\0\0"[..],
        ),
    ] {
        let answer = raw_exchange(&grpc_addr, bytes).await?;
        ensure!(answer.closed, "{what}: the connection was kept open");
        ensure!(
            !String::from_utf8_lossy(&answer.bytes).contains("HTTP/1.1 200"),
            "{what}: {answer:?}"
        );
    }

    ensure!(
        intents(&db).await? == before,
        "a refused call wrote or changed an intent"
    );
    let ops = service
        .process
        .wait_for_log_field("metrics_addr", START_TIMEOUT)?;
    probe_ops_endpoint("dedup-service", &ops).await?;

    // Still serving: the holder reports, and a new id is begun.
    grpc.complete(bearer(
        pb::CompleteRequest {
            operation_id: "hostile-held".into(),
            fencing_token: held.fencing_token,
            result: b"ok".to_vec(),
            fencing_secret: held.fencing_secret.clone(),
            trace_context: Default::default(),
        },
        Some(CLIENT_TOKEN),
    )?)
    .await?;
    let after = grpc
        .begin(bearer(begin("hostile-after"), Some(CLIENT_TOKEN))?)
        .await?
        .into_inner();
    ensure!(
        matches!(
            after.outcome,
            Some(pb::begin_response::Outcome::Acquired(_))
        ),
        "{after:?}"
    );
    let states: Vec<(String, String)> = intents(&db)
        .await?
        .into_iter()
        .map(|(id, state, _, _)| (id, state))
        .collect();
    ensure!(
        states
            == [
                ("hostile-after".to_owned(), "RESERVED".to_owned()),
                ("hostile-held".to_owned(), "SUCCEEDED".to_owned())
            ],
        "{states:?}"
    );
    ensure!(
        !service.process.log().contains("panicked"),
        "{}",
        service.process.log_tail(30)
    );
    drop(service);
    db.drop_database().await
}

/// A record of the probe: a name, its key and value, and what must become of it — `None`: an
/// event that is processed, `Some(reason)`: dead-lettered for that reason.
struct HostileRecord {
    what: &'static str,
    key: String,
    value: Vec<u8>,
    fate: Option<&'static str>,
}

fn event(event_id: &str, value: i64) -> Vec<u8> {
    json!({"event_id": event_id, "entity_id": "hostile", "value": value})
        .to_string()
        .into_bytes()
}

/// Valid events around malformed ones of every kind the brief names (not JSON, wrong types, no
/// event_id, a huge key) and a few more (not UTF-8, empty, a duplicate key).
fn hostile_records() -> Vec<HostileRecord> {
    let huge_key = "k".repeat(512 * 1024);
    let record = |what, key: &str, value: Vec<u8>, fate| HostileRecord {
        what,
        key: key.to_owned(),
        value,
        fate,
    };
    vec![
        record("an event before", "hostile", event("h-before", 5), None),
        record(
            "not JSON",
            "hostile",
            b"not json at all".to_vec(),
            Some("malformed_json"),
        ),
        record(
            "a JSON array",
            "hostile",
            b"[1,2,3]".to_vec(),
            Some("malformed_json"),
        ),
        record(
            "event_id a number",
            "hostile",
            br#"{"event_id":5,"entity_id":"hostile","value":1}"#.to_vec(),
            Some("invalid_field"),
        ),
        record(
            "value a string",
            "hostile",
            br#"{"event_id":"h-string","entity_id":"hostile","value":"1"}"#.to_vec(),
            Some("invalid_field"),
        ),
        record(
            "no event_id",
            "hostile",
            br#"{"entity_id":"hostile","value":1}"#.to_vec(),
            Some("missing_field"),
        ),
        record(
            "not UTF-8",
            "hostile",
            b"{\"event_id\":\"h-\xff\xfe\",\"entity_id\":\"hostile\",\"value\":1}".to_vec(),
            Some("invalid_utf8"),
        ),
        record("empty", "hostile", Vec::new(), Some("empty_record")),
        record(
            "a duplicate key",
            "hostile",
            br#"{"event_id":"h-dup","event_id":"h-dup2","entity_id":"hostile","value":1}"#.to_vec(),
            Some("duplicate_key"),
        ),
        record(
            "a 512 KiB key on a malformed value",
            &huge_key,
            b"{not json".to_vec(),
            Some("malformed_json"),
        ),
        // The key is only the partitioning: the event is the value's.
        record(
            "a 512 KiB key on an event",
            &huge_key,
            event("h-huge-key", 11),
            None,
        ),
        record("an event after", "hostile", event("h-after", 7), None),
    ]
}

fn header_text<'a>(letter: &'a rdkafka::message::OwnedMessage, name: &str) -> &'a str {
    letter
        .headers()
        .and_then(|headers| headers.iter().filter(|h| h.key == name).last())
        .and_then(|h| h.value)
        .and_then(|v| std::str::from_utf8(v).ok())
        .unwrap_or_default()
}

/// (source offset → reason) of the dead letters on `topic`, each checked to stand for its
/// original record.
fn dead_letters_on(
    topic: &str,
    records: &[HostileRecord],
) -> anyhow::Result<BTreeMap<i64, String>> {
    let mut reasons = BTreeMap::new();
    for letter in read_topic(topic, Isolation::ReadCommitted)? {
        let offset: i64 = header_text(&letter, dead_letter::SOURCE_OFFSET_HEADER).parse()?;
        let original = records
            .get(usize::try_from(offset)?)
            .with_context(|| format!("a dead letter of offset {offset}"))?;
        ensure!(
            dead_letter::stands_for(
                letter.payload().unwrap_or_default(),
                |name| {
                    letter
                        .headers()
                        .and_then(|h| h.iter().filter(|h| h.key == name).last())
                        .and_then(|h| h.value)
                },
                &original.value
            ),
            "the dead letter of {} does not stand for it",
            original.what
        );
        // A dead letter that fits whole keeps the key, a 512 KiB one included.
        if header_text(&letter, dead_letter::TRUNCATED_HEADER) == "false" {
            ensure!(
                letter.key() == Some(original.key.as_bytes()),
                "the dead letter of {} lost its key",
                original.what
            );
        }
        reasons.insert(
            offset,
            header_text(&letter, dead_letter::REASON_HEADER).to_owned(),
        );
    }
    Ok(reasons)
}

fn expected_dead_letters(records: &[HostileRecord]) -> BTreeMap<i64, String> {
    records
        .iter()
        .enumerate()
        .filter_map(|(offset, record)| record.fate.map(|reason| (offset as i64, reason.to_owned())))
        .collect()
}

fn expected_events() -> Vec<String> {
    let mut ids = vec!["h-after", "h-before", "h-huge-key"];
    ids.sort_unstable();
    ids.into_iter().map(str::to_owned).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn hostile_kafka_records_are_dead_lettered_and_the_services_go_on() -> anyhow::Result<()> {
    let records = hostile_records();
    let as_produced: Vec<(Option<String>, Vec<u8>)> = records
        .iter()
        .map(|record| (Some(record.key.clone()), record.value.clone()))
        .collect();
    let (input, sink_topic) = (
        unique_name("hostile-processor-in"),
        unique_name("hostile-sink-in"),
    );
    for topic in [&input, &sink_topic] {
        create_topic(topic, 1).await?;
        let (topic, as_produced) = (topic.clone(), as_produced.clone());
        tokio::task::spawn_blocking(move || produce_records(&topic, &as_produced)).await??;
    }

    // Both services at once, each on its own topic.
    let (output, group) = (
        unique_name("hostile-processor-out"),
        unique_name("hostile-processor"),
    );
    let bootstrap = bootstrap_servers();
    let args = argv!(eos_processor::Config {
        kafka.bootstrap_servers: &bootstrap,
        input_topic: &input,
        output_topic: &output,
        group_id: &group,
        instance.instance_id: "hostile",
        metrics_addr: "127.0.0.1:0",
    });
    let mut processor = ServiceProcess::spawn("eos-processor", &args, &[])?;
    let db = TestDatabase::create().await?;
    let sink = Sink::new(&sink_topic, &db.url);
    let mut sink_process = sink.spawn("hostile", &[], &[])?;

    let consumed = {
        let (bootstrap, group, input) = (bootstrap.clone(), group.clone(), input.clone());
        tokio::task::spawn_blocking(move || {
            wait_until_consumed(&bootstrap, &group, &input, Duration::from_secs(120))
        })
    };
    sink.wait_drained(&db.pool, &mut sink_process).await?;
    consumed.await?.with_context(|| processor.log_tail(40))?;

    // eos-processor: one dead letter per malformed record, with its reason; the events around
    // them, the one under a huge key included, are processed.
    let processor_letters = {
        let (dlq, records) = (format!("{input}.dlq"), hostile_records());
        tokio::task::spawn_blocking(move || dead_letters_on(&dlq, &records)).await??
    };
    ensure!(
        processor_letters == expected_dead_letters(&records),
        "eos-processor's dead letters (offset → reason): {processor_letters:?}"
    );
    let outputs =
        tokio::task::spawn_blocking(move || read_topic(&output, Isolation::ReadCommitted))
            .await??;
    let mut processed: Vec<String> = outputs
        .iter()
        .filter_map(|record| {
            let value: serde_json::Value =
                serde_json::from_slice(record.payload().unwrap_or_default()).ok()?;
            value["event_id"].as_str().map(str::to_owned)
        })
        .collect();
    processed.sort_unstable();
    ensure!(
        processed == expected_events(),
        "eos-processor's outputs: {processed:?}"
    );
    ensure!(
        outputs
            .iter()
            .all(|record| record.key().is_some_and(|key| key.len() < 1024)),
        "an output keyed by the input's huge key"
    );

    // sink-writer: the same, in sink_dead_letters and on its dead-letter topic; rows only for
    // the events.
    let stored: Vec<(i64, String)> = sqlx::query_as(
        "SELECT source_offset, reason FROM sink_dead_letters ORDER BY source_offset",
    )
    .fetch_all(&db.pool)
    .await?;
    let stored: BTreeMap<i64, String> = stored.into_iter().collect();
    ensure!(
        stored == expected_dead_letters(&records),
        "sink_dead_letters (offset → reason): {stored:?}"
    );
    let sink_letters = {
        let (dlq, records) = (format!("{sink_topic}.sink-dlq"), hostile_records());
        tokio::task::spawn_blocking(move || dead_letters_on(&dlq, &records)).await??
    };
    ensure!(
        sink_letters == stored,
        "the sink's dead-letter topic: {sink_letters:?}"
    );
    let rows: Vec<String> = sqlx::query_scalar("SELECT event_id FROM event_sink ORDER BY event_id")
        .fetch_all(&db.pool)
        .await?;
    ensure!(rows == expected_events(), "event_sink: {rows:?}");

    for (service, process) in [
        ("eos-processor", &mut processor),
        ("sink-writer", &mut sink_process),
    ] {
        let ops = process.wait_for_log_field("metrics_addr", START_TIMEOUT)?;
        probe_ops_endpoint(service, &ops).await?;
        ensure!(process.is_running(), "{service} stopped on hostile records");
        process.stop_gracefully()?;
        ensure!(
            !process.log().contains("panicked"),
            "{}",
            process.log_tail(30)
        );
    }
    db.drop_database().await
}

/// A bad flag value and what must come of it: a usage error (exit 2, clap's `error:` line naming
/// the flag) or a configuration the service refuses at start-up (exit 1, one ERROR line that
/// names the flag).
struct BadFlags {
    binary: &'static str,
    args: Vec<&'static str>,
    exit: i32,
    says: &'static str,
}

fn bad(binary: &'static str, args: &[&'static str], exit: i32, says: &'static str) -> BadFlags {
    BadFlags {
        binary,
        args: args.to_vec(),
        exit,
        says,
    }
}

/// A database URL nothing listens at: a flag refused first never reaches it, and a case that
/// did would fail on it rather than touch a real database.
const NOWHERE_DB: &str = "postgres://eos:eos@127.0.0.1:1/eos";
const LOOPBACK_PORTS: [&str; 2] = ["--metrics-addr", "127.0.0.1:0"];

fn bad_flag_cases() -> Vec<BadFlags> {
    let db = ["--database-url", NOWHERE_DB];
    let with = |base: &[&'static str], more: &[&'static str]| -> Vec<&'static str> {
        base.iter().chain(more).copied().collect()
    };
    let serving = |more: &[&'static str]| with(&with(&db, &LOOPBACK_PORTS), more);
    vec![
        bad(
            "dedup-service",
            &with(&db, &["--listen", "not-an-address"]),
            2,
            "--listen",
        ),
        bad(
            "dedup-service",
            &with(&db, &["--lease-ttl", "forever"]),
            2,
            "--lease-ttl",
        ),
        bad(
            "dedup-service",
            &serving(&["--listen", "127.0.0.1:0", "--request-timeout", "0s"]),
            1,
            "--request-timeout",
        ),
        bad(
            "dedup-service",
            &serving(&["--listen", "127.0.0.1:0", "--retention", "1h"]),
            1,
            "--retention",
        ),
        bad(
            "dedup-service",
            &serving(&["--listen", "0.0.0.0:0"]),
            1,
            "--listen",
        ),
        bad(
            "dedup-service",
            &serving(&["--listen", "127.0.0.1:0", "--operator-token", "short"]),
            1,
            "--operator-token",
        ),
        bad(
            "dedup-service",
            &with(&["migrate"], &with(&db, &["--listen", "x"])),
            2,
            "--listen",
        ),
        bad(
            "sink-writer",
            &with(&db, &["--max-batch=-1"]),
            2,
            "--max-batch",
        ),
        bad(
            "sink-writer",
            &with(&db, &["--offsets", "somewhere"]),
            2,
            "--offsets",
        ),
        bad(
            "sink-writer",
            &serving(&["--max-record-bytes", "10"]),
            1,
            "--max-record-bytes",
        ),
        bad(
            "sink-writer",
            &serving(&["--config", "/nonexistent/hostile-targets.toml"]),
            1,
            "hostile-targets.toml",
        ),
        bad(
            "outbox-relay",
            &with(&db, &["--mode", "bogus"]),
            2,
            "--mode",
        ),
        bad(
            "outbox-relay",
            &serving(&["-X", "enable.idempotence=false"]),
            1,
            "--kafka-property 1",
        ),
        bad(
            "payments-api",
            &with(&db, &["--addr", "nowhere"]),
            2,
            "--addr",
        ),
        bad(
            "payments-api",
            &serving(&["--addr", "127.0.0.1:0", "--header-read-timeout", "0s"]),
            1,
            "--header-read-timeout",
        ),
        bad(
            "payments-api",
            &serving(&["--addr", "127.0.0.1:0", "--max-connections", "0"]),
            1,
            "--max-connections",
        ),
        bad(
            "payments-api",
            &["--database-url", NOWHERE_DB, "--database-password", "other"],
            2,
            "--database-password",
        ),
        bad(
            "eos-processor",
            &["--max-record-bytes", "lots"],
            2,
            "--max-record-bytes",
        ),
        bad("eos-processor", &["--transform", "nope"], 2, "--transform"),
        bad(
            "eos-processor",
            &with(&LOOPBACK_PORTS, &["-X", "group.id=hostile"]),
            1,
            "--kafka-property 1",
        ),
        bad(
            "eos-processor",
            &with(&LOOPBACK_PORTS, &["--max-record-bytes", "10"]),
            1,
            "--max-record-bytes",
        ),
        bad("provider-sim", &["--addr", "x"], 2, "--addr"),
        bad(
            "provider-sim",
            &[
                "--addr",
                "127.0.0.1:0",
                "--error-before-apply-probability",
                "2",
            ],
            1,
            "--error-before-apply-probability",
        ),
        bad(
            "eosctl",
            &["produce", "--topic", "t", "--count", "many"],
            2,
            "--count",
        ),
        bad("eosctl", &["audit"], 2, "--input"),
        bad(
            "eosctl",
            &["trace", "evt-1", "--wait", "banana"],
            2,
            "--wait",
        ),
        bad(
            "eosctl",
            &[
                "-X",
                "sasl.passwordhostile",
                "lag",
                "--group",
                "g",
                "--topic",
                "t",
            ],
            2,
            "--kafka-property 1",
        ),
        bad("eosctl", &["--bogus-flag"], 2, "--bogus-flag"),
        bad("eos-lab", &["bench", "processor", "--bogus"], 2, "--bogus"),
    ]
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_flag_values_exit_non_zero_with_one_clear_error_line() -> anyhow::Result<()> {
    // Built once before the clock starts (workspace_binary builds every binary on first use).
    workspace_binary("eosctl")?;
    let cases = bad_flag_cases();
    let mut running = Vec::new();
    for case in &cases {
        let args: Vec<String> = case.args.iter().map(|arg| (*arg).to_owned()).collect();
        // With backtraces on, so that a panic shows as one.
        running.push(ServiceProcess::spawn(
            case.binary,
            &args,
            &[("RUST_BACKTRACE", "1")],
        )?);
    }
    let mut failures = Vec::new();
    for (case, mut process) in cases.iter().zip(running) {
        let started = Instant::now();
        let status = process.wait_timeout(Duration::from_secs(30))?;
        let output = process.log();
        let name = format!("{} {}", case.binary, case.args.join(" "));
        let Some(status) = status else {
            process.kill_hard()?;
            failures.push(format!(
                "{name}: still running after {:?}",
                started.elapsed()
            ));
            continue;
        };
        let lines: Vec<&str> = output.lines().filter(|l| !l.trim().is_empty()).collect();
        let error_lines: Vec<&&str> = if case.exit == 2 {
            lines.iter().filter(|l| l.starts_with("error:")).collect()
        } else {
            lines.iter().filter(|l| l.contains(" ERROR ")).collect()
        };
        let problem = if status.code() != Some(case.exit) {
            Some(format!("exit {status}, not {}", case.exit))
        } else if output.contains("panicked") || output.contains("stack backtrace") {
            Some("a panic".to_owned())
        } else if error_lines.len() != 1 {
            Some(format!("{} error lines", error_lines.len()))
        } else if !error_lines[0].contains(case.says) && !output.contains(case.says) {
            Some(format!("nothing names {}", case.says))
        } else {
            None
        };
        if let Some(problem) = problem {
            failures.push(format!("{name}: {problem}\n{output}"));
        }
    }
    ensure!(failures.is_empty(), "{}", failures.join("\n---\n"));
    Ok(())
}

/// The client's HTTP/2 connection preface: what a client sends first, before its SETTINGS frame.
const HTTP2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Reads `stream` until the server closes it (or resets it); how long after `since` that was, or
/// `None` if it was still open `limit` after `since`. Whatever the server sends first (its
/// SETTINGS, a PING) is read and dropped.
async fn closed_after(
    mut stream: tokio::net::TcpStream,
    since: Instant,
    limit: Duration,
) -> Option<Duration> {
    let deadline = tokio::time::Instant::from_std(since + limit);
    let mut buffer = [0u8; 1024];
    tokio::time::timeout_at(deadline, async {
        loop {
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => return since.elapsed(),
                Ok(_) => {}
            }
        }
    })
    .await
    .ok()
}

/// The sample `name{reason="…"}` of a Prometheus page, if the page has it.
fn dropped_connections(page: &str, reason: &str) -> Option<f64> {
    let sample = format!("eos_dedup_connections_dropped_total{{reason=\"{reason}\"}}");
    page.lines()
        .find_map(|line| line.strip_prefix(sample.as_str()))
        .and_then(|rest| rest.trim().parse().ok())
}

/// Issue 50, the hole the probe left: a TCP connection to the gRPC port that sent nothing, or
/// only the HTTP/2 preface, was still open after 150 s, and nothing capped the connections, so a
/// few thousand such clients took every descriptor dedup-service had and stopped every call.
/// With short limits set by flag: connections that do not finish the HTTP/2 handshake in time
/// are closed, one past `--max-connections` is closed at once, an established connection with no
/// call is closed after the idle timeout (its client reconnects for its next call), a normal
/// call is answered quickly meanwhile, and each closing is counted by reason from 0.
#[tokio::test(flavor = "multi_thread")]
async fn silent_grpc_connections_are_closed_and_capped_while_calls_go_on() -> anyhow::Result<()> {
    const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(2);
    const IDLE_TIMEOUT: Duration = Duration::from_secs(4);
    const MAX_CONNECTIONS: usize = 32;
    const PREFACE_ONLY: usize = 5;
    // How late after its timeout a connection may be closed on a loaded machine.
    const SLACK: Duration = Duration::from_secs(2);
    let started = Instant::now();
    let db = TestDatabase::create().await?;
    let mut service = Dedup::spawn(
        &db,
        &[
            "--reconcile-interval",
            "1h",
            "--client-token",
            CLIENT_TOKEN,
            "--handshake-timeout",
            &humantime::format_duration(HANDSHAKE_TIMEOUT).to_string(),
            "--idle-timeout",
            &humantime::format_duration(IDLE_TIMEOUT).to_string(),
            "--max-connections",
            &MAX_CONNECTIONS.to_string(),
        ],
    )?;
    let grpc_addr = service.endpoint().trim_start_matches("http://").to_owned();
    let before = service.metrics().await?;
    for reason in ["connection_cap", "handshake_timeout", "idle_timeout"] {
        ensure!(
            dropped_connections(&before, reason) == Some(0.0),
            "{reason} does not start at 0:\n{before}"
        );
    }

    // One honest client, connected and called: the connection the flood must not stop.
    let mut grpc = GrpcClient::new(
        tonic::transport::Endpoint::from_shared(service.endpoint())?
            .connect()
            .await?,
    );
    let acquired = |answer: &pb::BeginResponse| {
        matches!(
            answer.outcome,
            Some(pb::begin_response::Outcome::Acquired(_))
        )
    };
    let first = grpc
        .begin(bearer(begin("silent-first"), Some(CLIENT_TOKEN))?)
        .await?
        .into_inner();
    ensure!(acquired(&first), "{first:?}");

    // The rest of the cap: silent connections, and some that send only the preface.
    let mut held = Vec::new();
    for n in 0..MAX_CONNECTIONS - 1 {
        let mut stream = tokio::net::TcpStream::connect(&grpc_addr).await?;
        let connected = Instant::now();
        if n < PREFACE_ONLY {
            stream.write_all(HTTP2_PREFACE).await?;
        }
        held.push((stream, connected));
    }
    // One past the cap: closed at once, long before any timeout.
    let past_cap = tokio::net::TcpStream::connect(&grpc_addr).await?;
    let refused = closed_after(past_cap, Instant::now(), HANDSHAKE_TIMEOUT / 2).await;
    ensure!(
        refused.is_some(),
        "a connection past --max-connections {MAX_CONNECTIONS} was still open after {:?}",
        HANDSHAKE_TIMEOUT / 2
    );
    println!("the connection past the cap was closed after {refused:?}");

    // The honest client is answered while the silent ones hold every other slot.
    let call = Instant::now();
    let during = grpc
        .begin(bearer(begin("silent-during"), Some(CLIENT_TOKEN))?)
        .await?
        .into_inner();
    let latency = call.elapsed();
    ensure!(acquired(&during), "{during:?}");
    println!(
        "a call under {} silent connections answered in {latency:?}",
        held.len()
    );
    ensure!(latency < Duration::from_secs(1), "answered in {latency:?}");

    // Every silent and preface-only connection is closed at the handshake timeout.
    let closings: Vec<_> = held
        .into_iter()
        .map(|(stream, connected)| {
            tokio::spawn(closed_after(stream, connected, HANDSHAKE_TIMEOUT + SLACK))
        })
        .collect();
    let mut slowest = Duration::ZERO;
    for (n, closing) in closings.into_iter().enumerate() {
        let what = if n < PREFACE_ONLY {
            "a preface-only connection"
        } else {
            "a silent connection"
        };
        let closed = closing.await?.with_context(|| {
            format!(
                "{what} was still open after {:?}",
                HANDSHAKE_TIMEOUT + SLACK
            )
        })?;
        // The service's clock starts at its accept, which can come a moment before this
        // task reads `connected` after its connect returns (seen: 0.2 ms): 50 ms of that.
        ensure!(
            closed >= HANDSHAKE_TIMEOUT - Duration::from_millis(50),
            "{what} was closed after {closed:?}, before the handshake timeout"
        );
        slowest = slowest.max(closed);
    }
    println!("the slowest of the silent connections was closed after {slowest:?}");

    // A connection that finishes the handshake (preface and SETTINGS) and then makes no call is
    // closed after the idle timeout — and so is the honest client's, which calls again after it.
    let mut idle = tokio::net::TcpStream::connect(&grpc_addr).await?;
    let connected = Instant::now();
    idle.write_all(HTTP2_PREFACE).await?;
    idle.write_all(&[0, 0, 0, 0x4, 0, 0, 0, 0, 0]).await?;
    let idle_closed = closed_after(idle, connected, IDLE_TIMEOUT + SLACK)
        .await
        .with_context(|| {
            format!(
                "an idle connection was still open after {:?}",
                IDLE_TIMEOUT + SLACK
            )
        })?;
    println!("an idle connection was closed after {idle_closed:?}");
    ensure!(
        idle_closed >= IDLE_TIMEOUT,
        "an idle connection was closed after {idle_closed:?}, before the idle timeout"
    );
    let after = grpc
        .begin(bearer(begin("silent-after"), Some(CLIENT_TOKEN))?)
        .await?
        .into_inner();
    ensure!(acquired(&after), "{after:?}");

    let metrics = service.metrics().await?;
    let count = |reason| dropped_connections(&metrics, reason).unwrap_or(-1.0);
    ensure!(
        count("connection_cap") == 1.0,
        "connection_cap {}:\n{metrics}",
        count("connection_cap")
    );
    ensure!(
        count("handshake_timeout") == (MAX_CONNECTIONS - 1) as f64,
        "handshake_timeout {}:\n{metrics}",
        count("handshake_timeout")
    );
    // The raw idle connection and the honest client's first one, at least.
    ensure!(
        count("idle_timeout") >= 2.0,
        "idle_timeout {}:\n{metrics}",
        count("idle_timeout")
    );
    ensure!(
        !service.process.log().contains("panicked"),
        "{}",
        service.process.log_tail(30)
    );
    drop(service);
    db.drop_database().await?;
    println!("the test took {:?}", started.elapsed());
    Ok(())
}
