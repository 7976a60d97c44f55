//! dedup-service's gRPC security (docs/architecture/security.md), against the real
//! binary and real PostgreSQL: bearer tokens with client and operator roles, fencing secrets
//! that a guessed counter cannot stand in for, mTLS with certificates made here with rcgen, and
//! the sink-writer's provider target passing an exact run over mTLS + token.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, ensure};
use dedup_client::{
    BearerToken, BeginParams, ClientCredentials, ClientTlsFiles, DedupClient, RetryPolicy,
};
use eos_proto::dedup::v1 as pb;
use eos_proto::dedup::v1::dedup_client::DedupClient as GrpcClient;
use integration_tests::eosctl::{self, Workload};
use integration_tests::test_certs::TestCa;
use integration_tests::{TestDatabase, unique_name};
use time::OffsetDateTime;
use tonic::transport::Channel;
use tonic::{Code, Request};

use crate::dedup_service::{Dedup, acquire};
use crate::provider_sim::ProviderSim;
use crate::sink_provider::{effects, targets_file};
use crate::sink_writer::{Sink, TopicTruth};

const CLIENT_TOKEN: &str = "client-token-aaaaaaaaaaaaaaaa";
/// The next client token of a rotation: both are valid at once.
const CLIENT_TOKEN_NEXT: &str = "client-token-bbbbbbbbbbbbbbbb";
const OPERATOR_TOKEN: &str = "operator-token-cccccccccccccccc";

fn token(value: &str) -> BearerToken {
    BearerToken::new(value, "test").expect("valid test token")
}

fn params(operation_id: &str) -> BeginParams {
    BeginParams {
        operation_id: operation_id.to_owned(),
        fingerprint: vec![3; 32],
        owner: "worker-a".into(),
        occurred_at: OffsetDateTime::now_utc(),
        lease_ttl: None,
    }
}

/// One attempt, no retries: refusals are answers, not transient failures.
fn once(client: DedupClient) -> DedupClient {
    client.with_policy(RetryPolicy {
        attempts: 1,
        ..RetryPolicy::default()
    })
}

fn with_bearer<T>(message: T, token: Option<&str>) -> Request<T> {
    let mut request = Request::new(message);
    if let Some(token) = token {
        request.metadata_mut().insert(
            "authorization",
            format!("Bearer {token}").parse().expect("ascii"),
        );
    }
    request
}

/// The code of every Dedup RPC called with `token` (None: no authorization header), by method.
async fn codes_of_every_rpc(
    grpc: &mut GrpcClient<Channel>,
    token: Option<&str>,
) -> BTreeMap<&'static str, Code> {
    let begin = pb::BeginRequest {
        operation_id: "auth-probe".into(),
        fingerprint: vec![1; 32],
        owner: "probe".into(),
        occurred_at: Some(prost_types::Timestamp::from(std::time::SystemTime::now())),
        ..Default::default()
    };
    // Reports name an id never begun: with a client token they answer NOT_FOUND, not a
    // fencing refusal.
    let complete = pb::CompleteRequest {
        operation_id: "auth-probe-never-begun".into(),
        fencing_token: 1,
        ..Default::default()
    };
    let code = |result: Result<tonic::Status, ()>| result.map(|s| s.code()).unwrap_or(Code::Ok);
    let err = |r: Result<(), tonic::Status>| code(r.err().ok_or(()));
    let mut codes = BTreeMap::new();
    codes.insert(
        "Begin",
        err(grpc
            .begin(with_bearer(begin.clone(), token))
            .await
            .map(drop)),
    );
    codes.insert(
        "BeginBatch",
        err(grpc
            .begin_batch(with_bearer(
                pb::BeginBatchRequest {
                    items: vec![begin.clone()],
                },
                token,
            ))
            .await
            .map(drop)),
    );
    codes.insert(
        "Complete",
        err(grpc
            .complete(with_bearer(complete.clone(), token))
            .await
            .map(drop)),
    );
    codes.insert(
        "CompleteBatch",
        err(grpc
            .complete_batch(with_bearer(
                pb::CompleteBatchRequest {
                    items: vec![complete.clone()],
                },
                token,
            ))
            .await
            .map(drop)),
    );
    codes.insert(
        "Fail",
        err(grpc
            .fail(with_bearer(
                pb::FailRequest {
                    operation_id: "auth-probe-never-begun".into(),
                    fencing_token: 1,
                    reason: "probe".into(),
                    ..Default::default()
                },
                token,
            ))
            .await
            .map(drop)),
    );
    codes.insert(
        "MarkUnknown",
        err(grpc
            .mark_unknown(with_bearer(
                pb::MarkUnknownRequest {
                    operation_id: "auth-probe-never-begun".into(),
                    fencing_token: 1,
                    ..Default::default()
                },
                token,
            ))
            .await
            .map(drop)),
    );
    codes.insert(
        "Get",
        err(grpc
            .get(with_bearer(
                pb::GetRequest {
                    operation_id: "auth-probe".into(),
                },
                token,
            ))
            .await
            .map(drop)),
    );
    codes.insert(
        "ListUnknown",
        err(grpc
            .list_unknown(with_bearer(pb::ListUnknownRequest { limit: 10 }, token))
            .await
            .map(drop)),
    );
    codes.insert(
        "Resolve",
        err(grpc
            .resolve(with_bearer(
                pb::ResolveRequest {
                    operation_id: "auth-probe".into(),
                    outcome: pb::IntentState::Succeeded as i32,
                    evidence: "forged".into(),
                    ..Default::default()
                },
                token,
            ))
            .await
            .map(drop)),
    );
    codes
}

/// The intent's row as stored: (state, fencing_token, holder, history rows).
async fn row_of(db: &TestDatabase, operation_id: &str) -> anyhow::Result<(String, i64, i64)> {
    Ok(sqlx::query_as(
        "SELECT state, fencing_token,
                (SELECT count(*) FROM dedup_intent_history h WHERE h.operation_id = i.operation_id)
         FROM dedup_intents i WHERE operation_id = $1",
    )
    .bind(operation_id)
    .fetch_one(&db.pool)
    .await?)
}

#[tokio::test(flavor = "multi_thread")]
async fn dedup_tokens_roles_and_fencing_secrets_are_enforced() -> anyhow::Result<()> {
    let db = TestDatabase::create().await?;
    let dir = std::env::temp_dir().join(unique_name("dedup-auth"));
    std::fs::create_dir_all(&dir)?;
    // Two client tokens (a rotation) from a file; the operator token from a flag.
    let client_tokens = dir.join("client-tokens");
    std::fs::write(
        &client_tokens,
        format!("# rotation in progress\n{CLIENT_TOKEN}\n{CLIENT_TOKEN_NEXT}\n"),
    )?;
    let client_tokens = client_tokens.display().to_string();
    let service = Dedup::spawn(
        &db,
        &[
            "--reconcile-interval",
            "1h",
            "--client-token-file",
            &client_tokens,
            "--operator-token",
            OPERATOR_TOKEN,
        ],
    )?;
    let mut grpc = GrpcClient::connect(service.endpoint()).await?;

    // No token, or one that is none of ours: every RPC is UNAUTHENTICATED.
    for presented in [None, Some("client-token-aaaaaaaaaaaaaaab"), Some("")] {
        let codes = codes_of_every_rpc(&mut grpc, presented).await;
        ensure!(codes.len() == 9, "{codes:?}");
        for (method, code) in &codes {
            ensure!(
                *code == Code::Unauthenticated,
                "{method} with {presented:?}: {code:?}"
            );
        }
    }
    // A client token reaches the client RPCs (the probe's answers are about the request, not
    // the caller) but neither operator RPC.
    for client_token in [CLIENT_TOKEN, CLIENT_TOKEN_NEXT] {
        let codes = codes_of_every_rpc(&mut grpc, Some(client_token)).await;
        for (method, code) in &codes {
            let operator_rpc = matches!(*method, "ListUnknown" | "Resolve");
            if operator_rpc {
                ensure!(*code == Code::PermissionDenied, "{method}: {code:?}");
            } else {
                ensure!(
                    !matches!(code, Code::Unauthenticated | Code::PermissionDenied),
                    "{method} with a client token: {code:?}"
                );
            }
        }
    }
    // Health checks stay open for probes.
    let mut health = tonic_health::pb::health_client::HealthClient::new(
        tonic::transport::Endpoint::from_shared(service.endpoint())?
            .connect()
            .await?,
    );
    let serving = health
        .check(tonic_health::pb::HealthCheckRequest::default())
        .await?
        .into_inner();
    ensure!(serving.status == 1, "health: {serving:?}");

    // The workspace client sends its token with every call.
    let client = once(
        service
            .client()?
            .with_token(Some(&token(CLIENT_TOKEN_NEXT))),
    );
    let operator = once(service.client()?.with_token(Some(&token(OPERATOR_TOKEN))));
    let held = acquire(&client, &params("fence-1")).await?;
    ensure!(held.counter == 1);
    ensure!(
        client.list_unknown(10).await.err().and_then(|e| e.code()) == Some(Code::PermissionDenied)
    );

    // A retried Begin (same request id) gets the same answer, secret included; anyone else
    // learns nothing of the secret.
    let begin = |request_id: &str| pb::BeginRequest {
        operation_id: "fence-2".into(),
        fingerprint: vec![3; 32],
        owner: "worker-a".into(),
        occurred_at: Some(prost_types::Timestamp::from(std::time::SystemTime::now())),
        request_id: request_id.into(),
        ..Default::default()
    };
    let mut secrets = Vec::new();
    for _ in 0..2 {
        let answer = grpc
            .begin(with_bearer(begin("req-1"), Some(CLIENT_TOKEN)))
            .await?
            .into_inner();
        let Some(pb::begin_response::Outcome::Acquired(acquired)) = answer.outcome else {
            bail!("expected ACQUIRED: {answer:?}");
        };
        ensure!(acquired.fencing_secret.len() == 32);
        secrets.push(acquired.fencing_secret);
    }
    ensure!(
        secrets[0] == secrets[1],
        "a retried Begin gets the same secret"
    );
    let other = grpc
        .begin(with_bearer(begin("req-2"), Some(CLIENT_TOKEN)))
        .await?
        .into_inner();
    ensure!(
        matches!(
            other.outcome,
            Some(pb::begin_response::Outcome::InProgress(_))
        ),
        "{other:?}"
    );

    // The right counter with a guessed, empty or truncated secret: PERMISSION_DENIED, and the
    // intent is unchanged (its row and its history).
    let before = row_of(&db, "fence-1").await?;
    ensure!(before == ("RESERVED".to_owned(), 1, 1), "{before:?}");
    let guesses: [Vec<u8>; 3] = [
        rand::random::<[u8; 32]>().to_vec(),
        Vec::new(),
        held.secret.as_bytes()[..16].to_vec(),
    ];
    for guess in guesses {
        let complete = pb::CompleteRequest {
            operation_id: "fence-1".into(),
            fencing_token: held.counter,
            result: b"forged".to_vec(),
            fencing_secret: guess.clone(),
            trace_context: Default::default(),
        };
        let refused = grpc
            .complete(with_bearer(complete.clone(), Some(CLIENT_TOKEN)))
            .await
            .expect_err("guessed secret");
        ensure!(refused.code() == Code::PermissionDenied, "{refused:?}");
        let batch = grpc
            .complete_batch(with_bearer(
                pb::CompleteBatchRequest {
                    items: vec![complete],
                },
                Some(CLIENT_TOKEN),
            ))
            .await?
            .into_inner();
        ensure!(
            batch.items[0].code == Code::PermissionDenied as i32,
            "{batch:?}"
        );
        let fail = grpc
            .fail(with_bearer(
                pb::FailRequest {
                    operation_id: "fence-1".into(),
                    fencing_token: held.counter,
                    reason: "forged".into(),
                    retryable: true,
                    fencing_secret: guess.clone(),
                },
                Some(CLIENT_TOKEN),
            ))
            .await
            .expect_err("guessed secret");
        ensure!(fail.code() == Code::PermissionDenied, "{fail:?}");
        let unknown = grpc
            .mark_unknown(with_bearer(
                pb::MarkUnknownRequest {
                    operation_id: "fence-1".into(),
                    fencing_token: held.counter,
                    detail: "forged".into(),
                    fencing_secret: guess,
                },
                Some(CLIENT_TOKEN),
            ))
            .await
            .expect_err("guessed secret");
        ensure!(unknown.code() == Code::PermissionDenied, "{unknown:?}");
    }
    // A guessed counter with the real secret is a stale token.
    let stale = grpc
        .complete(with_bearer(
            pb::CompleteRequest {
                operation_id: "fence-1".into(),
                fencing_token: held.counter + 1,
                result: b"forged".to_vec(),
                fencing_secret: held.secret.as_bytes().to_vec(),
                trace_context: Default::default(),
            },
            Some(CLIENT_TOKEN),
        ))
        .await
        .expect_err("guessed counter");
    ensure!(stale.code() == Code::FailedPrecondition, "{stale:?}");
    let after = row_of(&db, "fence-1").await?;
    ensure!(
        after == before,
        "refused reports changed the intent: {after:?}"
    );

    // The holder reports; the operator lists and resolves.
    client.complete("fence-1", held, b"ok".to_vec()).await?;
    ensure!(row_of(&db, "fence-1").await?.0 == "SUCCEEDED");
    let unknown = acquire(&client, &params("fence-3")).await?;
    client.mark_unknown("fence-3", unknown, "timeout").await?;
    let listed = operator.list_unknown(10).await?;
    ensure!(
        listed.iter().any(|i| i.operation_id == "fence-3"),
        "{listed:?}"
    );
    let resolve = pb::ResolveRequest {
        operation_id: "fence-3".into(),
        outcome: pb::IntentState::Succeeded as i32,
        evidence: "provider record".into(),
        ..Default::default()
    };
    ensure!(
        client
            .resolve(resolve.clone())
            .await
            .err()
            .and_then(|e| e.code())
            == Some(Code::PermissionDenied)
    );
    ensure!(row_of(&db, "fence-3").await?.0 == "UNKNOWN");
    operator.resolve(resolve).await?;
    ensure!(row_of(&db, "fence-3").await?.0 == "SUCCEEDED");

    drop(service);
    std::fs::remove_dir_all(&dir)?;
    db.drop_database().await
}

/// A CA, a server certificate for `localhost`, a client certificate signed by the CA and one
/// signed by a CA the server does not trust, as PEM files in `dir`.
fn make_pki(dir: &Path) -> anyhow::Result<()> {
    let trusted = TestCa::new(dir)?;
    trusted.issue("server", &["localhost"])?;
    trusted.issue("client", &["sink-writer"])?;
    let rogue = TestCa::new(&dir.join("rogue-ca"))?.issue("rogue", &["sink-writer"])?;
    std::fs::copy(&rogue.cert_file, dir.join("rogue.pem"))?;
    std::fs::copy(&rogue.key_file, dir.join("rogue-key.pem"))?;
    Ok(())
}

fn path(dir: &Path, file: &str) -> PathBuf {
    dir.join(file)
}

fn tls(dir: &Path, client_cert: Option<&str>) -> ClientTlsFiles {
    ClientTlsFiles {
        ca: Some(path(dir, "ca.pem")),
        cert: client_cert.map(|name| path(dir, &format!("{name}.pem"))),
        key: client_cert.map(|name| path(dir, &format!("{name}-key.pem"))),
        domain: None,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn dedup_mtls_refuses_clients_without_a_trusted_certificate_and_the_sink_runs_over_it()
-> anyhow::Result<()> {
    const EVENTS: u64 = 300;
    let dir = std::env::temp_dir().join(unique_name("dedup-mtls"));
    std::fs::create_dir_all(&dir)?;
    make_pki(&dir)?;
    let db = TestDatabase::create().await?;
    let sim = ProviderSim::spawn(&[])?;
    let file = |name: &str| path(&dir, name).display().to_string();
    let service = Dedup::spawn(
        &db,
        &[
            "--provider-url",
            &sim.url,
            "--tls-cert",
            &file("server.pem"),
            "--tls-key",
            &file("server-key.pem"),
            "--tls-client-ca",
            &file("ca.pem"),
            "--client-token",
            CLIENT_TOKEN,
            "--operator-token",
            OPERATOR_TOKEN,
        ],
    )?;
    let port = service
        .endpoint()
        .rsplit(':')
        .next()
        .unwrap_or_default()
        .to_owned();
    let endpoint = format!("https://localhost:{port}");
    let connect = |cert: Option<&str>, bearer: Option<&str>| {
        DedupClient::connect_lazy_with(
            &endpoint,
            &ClientCredentials {
                token: bearer.map(token),
                tls: tls(&dir, cert),
            },
        )
        .map(once)
    };

    // Without a certificate, or with one from a CA the server does not trust, the handshake
    // fails: no RPC is served, whatever the token.
    for cert in [None, Some("rogue")] {
        let refused = connect(cert, Some(CLIENT_TOKEN))?.get("mtls-1").await;
        let error = refused.expect_err("no trusted client certificate");
        ensure!(
            error.code() != Some(Code::NotFound),
            "{cert:?} reached the handler: {error}"
        );
    }
    // With the trusted certificate, but no token: UNAUTHENTICATED (both are required).
    let no_token = connect(Some("client"), None)?.get("mtls-1").await;
    ensure!(
        no_token.err().and_then(|e| e.code()) == Some(Code::Unauthenticated),
        "a certificate does not replace the configured token"
    );
    // Both: served.
    let client = connect(Some("client"), Some(CLIENT_TOKEN))?;
    let held = acquire(&client, &params("mtls-1")).await?;
    client.complete("mtls-1", held, b"ok".to_vec()).await?;
    ensure!(client.get("mtls-1").await?.state == pb::IntentState::Succeeded as i32);
    // An https:// endpoint without a CA, or TLS files for an http:// endpoint, are refused
    // before any call.
    ensure!(DedupClient::connect_lazy_with(&endpoint, &ClientCredentials::default()).is_err());
    ensure!(
        DedupClient::connect_lazy_with(
            &service.endpoint(),
            &ClientCredentials {
                token: None,
                tls: tls(&dir, Some("client"))
            }
        )
        .is_err()
    );

    // The sink-writer's provider target, over mTLS + token (token from a file): a short run
    // charges every logical event exactly once.
    let token_file = path(&dir, "dedup-token");
    std::fs::write(&token_file, format!("{CLIENT_TOKEN}\n"))?;
    let name = unique_name("mtls").replace('-', "_");
    let config = targets_file(&dir, &name, &endpoint, &sim.url)?;
    let topic = unique_name("sink-mtls");
    let sink = Sink::new(&topic, &db.url);
    let workload = Workload {
        rate: 600,
        ..Workload::chaos(EVENTS, 83)
    };
    let producer = {
        let topic = topic.clone();
        std::thread::spawn(move || eosctl::produce(&topic, &workload))
    };
    let mut process = sink.spawn(
        "mtls",
        &[
            "--config",
            &config,
            "--dedup-tls-ca",
            &file("ca.pem"),
            "--dedup-tls-cert",
            &file("client.pem"),
            "--dedup-tls-key",
            &file("client-key.pem"),
            "--dedup-token-file",
            &token_file.display().to_string(),
        ],
        &[],
    )?;
    tokio::task::spawn_blocking(move || producer.join())
        .await?
        .map_err(|_| anyhow::anyhow!("producer thread panicked"))??;
    tokio::time::timeout(
        Duration::from_secs(120),
        sink.wait_drained(&db.pool, &mut process),
    )
    .await??;
    process.stop_gracefully()?;

    let truth = TopicTruth::read(&topic)?;
    let prefix = format!("{name}:");
    let effects = effects(&sim, &prefix).await?;
    let keys: Vec<&str> = effects.iter().map(|(key, _, _)| key.as_str()).collect();
    let distinct: HashSet<&str> = keys.iter().copied().collect();
    ensure!(distinct.len() == keys.len(), "a key charged twice");
    let expected: HashSet<String> = truth
        .logical
        .keys()
        .map(|id| format!("{prefix}{id}"))
        .collect();
    let got: HashSet<String> = distinct.iter().map(|k| (*k).to_owned()).collect();
    ensure!(
        got == expected,
        "{} charged, {} logical events",
        got.len(),
        expected.len()
    );
    ensure!(expected.len() as u64 <= EVENTS && !expected.is_empty());

    // `eosctl held resolve` over the same mTLS, with the sink's --dedup-tls-* flags: a held row
    // for mtls-1 (SUCCEEDED already, so resolving it as succeeded is accepted and changes nothing
    // at dedup-service) is resolved; without the client certificate the handshake refuses it.
    sqlx::query(
        "INSERT INTO sink_held_operations (sink, target, operation_id, event_id, source_topic,
             source_partition, source_offset, reason)
         VALUES ('mtls', 'mtls', 'mtls-1', 'e-1', 'held', 0, 0, 'test')",
    )
    .execute(&db.pool)
    .await?;
    let operator_file = path(&dir, "operator-token");
    std::fs::write(&operator_file, format!("{OPERATOR_TOKEN}\n"))?;
    let (operator_file, ca, cert, key) = (
        operator_file.display().to_string(),
        file("ca.pem"),
        file("client.pem"),
        file("client-key.pem"),
    );
    let resolve = |client_cert: bool| -> anyhow::Result<std::process::Output> {
        let mut args = vec![
            "held",
            "resolve",
            "mtls-1",
            "--outcome",
            "succeeded",
            "--evidence",
            "mtls test",
            "--database-url",
            &db.url,
            "--dedup-url",
            &endpoint,
            "--operator-token-file",
            &operator_file,
            "--dedup-tls-ca",
            &ca,
            "--json",
        ];
        if client_cert {
            args.extend(["--dedup-tls-cert", &cert, "--dedup-tls-key", &key]);
        }
        Ok(
            std::process::Command::new(integration_tests::workspace_binary("eosctl")?)
                .args(args)
                .output()?,
        )
    };
    let refused = resolve(false)?;
    ensure!(
        !refused.status.success(),
        "held resolve without a client certificate: {}",
        String::from_utf8_lossy(&refused.stdout)
    );
    let resolved = resolve(true)?;
    let answer: serde_json::Value = serde_json::from_slice(&resolved.stdout).map_err(|_| {
        anyhow::anyhow!(
            "held resolve over mTLS: {}",
            String::from_utf8_lossy(&resolved.stderr)
        )
    })?;
    ensure!(
        answer["intent_state"] == "INTENT_STATE_SUCCEEDED" && answer["rows_resolved"] == 1,
        "held resolve over mTLS: {answer}"
    );

    drop(service);
    std::fs::remove_dir_all(&dir)?;
    db.drop_database().await
}
