//! provider-sim as a real child process: idempotency per key, the effect log, key TTL, and that
//! every injected fault after applying still leaves exactly one effect.

use std::time::Duration;

use integration_tests::service_process::ServiceProcess;
use serde_json::{Value, json};

const START_TIMEOUT: Duration = Duration::from_secs(60);

/// A running provider-sim and its base URL.
pub(crate) struct ProviderSim {
    pub(crate) process: ServiceProcess,
    pub(crate) url: String,
}

impl ProviderSim {
    pub(crate) fn spawn(args: &[&str]) -> anyhow::Result<Self> {
        let mut all = vec!["--addr", "127.0.0.1:0"];
        all.extend_from_slice(args);
        let args: Vec<String> = all.into_iter().map(str::to_owned).collect();
        let mut process = ServiceProcess::spawn("provider-sim", &args, &[])?;
        let addr = process.wait_for_log_field("http_addr", START_TIMEOUT)?;
        Ok(Self {
            process,
            url: format!("http://{addr}"),
        })
    }

    /// `GET /effects`: (key, attempts) of every applied effect.
    pub(crate) async fn effects(&self) -> anyhow::Result<Vec<(String, u64)>> {
        let body: Value = reqwest::get(format!("{}/effects", self.url))
            .await?
            .error_for_status()?
            .json()
            .await?;
        let effects = body["effects"]
            .as_array()
            .ok_or_else(|| anyhow::anyhow!("no effects array in {body}"))?;
        Ok(effects
            .iter()
            .map(|e| {
                (
                    e["key"].as_str().unwrap_or_default().to_owned(),
                    e["attempts"].as_u64().unwrap_or_default(),
                )
            })
            .collect())
    }
}

async fn post(
    client: &reqwest::Client,
    url: &str,
    key: Option<&str>,
    body: &Value,
) -> reqwest::Result<reqwest::Response> {
    let mut request = client.post(format!("{url}/charges")).json(body);
    if let Some(key) = key {
        request = request.header("Idempotency-Key", key);
    }
    request.send().await
}

#[tokio::test(flavor = "multi_thread")]
async fn provider_sim_applies_once_per_key_and_lists_every_effect() -> anyhow::Result<()> {
    let sim = ProviderSim::spawn(&["--seed", "1"])?;
    let client = reqwest::Client::new();
    let body = json!({"amount": 1250, "currency": "EUR"});

    let first = post(&client, &sim.url, Some("op-1"), &body).await?;
    assert_eq!(first.status(), 201);
    let record: Value = first.json().await?;
    for _ in 0..2 {
        // Same request with its fields in another order: a replay.
        let again = post(
            &client,
            &sim.url,
            Some("op-1"),
            &json!({"currency": "EUR", "amount": 1250}),
        )
        .await?;
        assert_eq!(again.status(), 200);
        assert_eq!(again.headers()["idempotent-replayed"], "true");
        assert_eq!(again.json::<Value>().await?, record);
    }
    let reused = post(&client, &sim.url, Some("op-1"), &json!({"amount": 9999})).await?;
    assert_eq!(reused.status(), 422, "same key, other body");
    let no_key = post(&client, &sim.url, None, &body).await?;
    assert_eq!(no_key.status(), 400);
    let no_amount = post(&client, &sim.url, Some("op-2"), &json!({"x": 1})).await?;
    assert_eq!(no_amount.status(), 400);

    let found = client
        .get(format!("{}/charges/op-1", sim.url))
        .send()
        .await?;
    assert_eq!(found.status(), 200);
    assert_eq!(found.json::<Value>().await?, record);
    let missing = client
        .get(format!("{}/charges/op-2", sim.url))
        .send()
        .await?;
    assert_eq!(missing.status(), 404);

    // One effect; every POST with the key counted as an attempt.
    assert_eq!(sim.effects().await?, vec![("op-1".to_owned(), 4)]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn provider_sim_forgets_keys_after_their_ttl() -> anyhow::Result<()> {
    let sim = ProviderSim::spawn(&["--key-ttl", "700ms"])?;
    let client = reqwest::Client::new();
    let body = json!({"amount": 5});
    assert_eq!(
        post(&client, &sim.url, Some("k"), &body).await?.status(),
        201
    );
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let lookup = client.get(format!("{}/charges/k", sim.url)).send().await?;
    assert_eq!(lookup.status(), 404, "a forgotten key has no record");
    // The danger retention guards against: a forgotten key is charged again.
    assert_eq!(
        post(&client, &sim.url, Some("k"), &body).await?.status(),
        201
    );
    assert_eq!(sim.effects().await?.len(), 2);
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn provider_sim_faults_after_applying_still_apply_once() -> anyhow::Result<()> {
    let client = reqwest::Client::new();
    let body = json!({"amount": 7});

    let dropping = ProviderSim::spawn(&["--drop-response-after-apply-probability", "1"])?;
    let lost = post(&client, &dropping.url, Some("d"), &body).await;
    assert!(lost.is_err(), "the answer must be lost: {lost:?}");
    let status = client
        .get(format!("{}/charges/d", dropping.url))
        .send()
        .await?
        .status();
    assert_eq!(status, 200, "applied although the answer was lost");

    let failing = ProviderSim::spawn(&["--error-after-apply-probability", "1"])?;
    assert_eq!(
        post(&client, &failing.url, Some("e"), &body)
            .await?
            .status(),
        500
    );
    assert_eq!(
        post(&client, &failing.url, Some("e"), &body)
            .await?
            .status(),
        500
    );
    assert_eq!(failing.effects().await?, vec![("e".to_owned(), 2)]);

    let late = ProviderSim::spawn(&[
        "--delay-after-apply",
        "2s",
        "--delay-after-apply-probability",
        "1",
    ])?;
    let hurried = reqwest::Client::builder()
        .timeout(Duration::from_millis(300))
        .build()?;
    let timed_out = post(&hurried, &late.url, Some("l"), &body).await;
    assert!(
        timed_out.as_ref().is_err_and(|e| e.is_timeout()),
        "{timed_out:?}"
    );
    assert_eq!(late.effects().await?.len(), 1);

    let refusing = ProviderSim::spawn(&["--error-before-apply-probability", "1"])?;
    assert_eq!(
        post(&client, &refusing.url, Some("r"), &body)
            .await?
            .status(),
        503
    );
    assert!(
        refusing.effects().await?.is_empty(),
        "503 before applying applies nothing"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn provider_sim_exits_zero_on_sigterm() -> anyhow::Result<()> {
    let mut sim = ProviderSim::spawn(&[])?;
    let health = reqwest::get(format!("{}/healthz", sim.url)).await?;
    assert_eq!(health.status(), 200);
    let status = sim.process.terminate(Duration::from_secs(15))?;
    assert!(status.success(), "{status}\n{}", sim.process.log_tail(20));
    Ok(())
}
