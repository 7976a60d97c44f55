//! The provider link over HTTPS with a credential (docs/security.md "Provider URLs"): provider-sim serves TLS
//! with a certificate from a CA made here and requires an `Authorization` value; the sink and
//! dedup-service's reconciler read that value from a file and trust the CA from a file. Real
//! processes, real Kafka and PostgreSQL; the audit is the provider's own effect list.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use anyhow::ensure;
use dedup_client::{ChargeOutcome, ProviderAccess, ProviderClient};
use integration_tests::eosctl::Workload;
use integration_tests::test_certs::TestCa;
use integration_tests::{TestDatabase, unique_name};
use serde_json::json;

use crate::dedup_service::Dedup;
use crate::provider_sim::ProviderSim;
use crate::sink_provider::{effects_at, sink_through_kills};
use crate::sink_writer::{Sink, TopicTruth};

/// A provider-sim on HTTPS that loses a tenth of its answers after applying (so the reconciler's
/// look-ups run too), its https:// URL, the CA file and the credential file.
struct SecureProvider {
    sim: ProviderSim,
    url: String,
    ca_file: String,
    credential_file: String,
    credential: String,
}

impl SecureProvider {
    fn start(dir: &Path) -> anyhow::Result<Self> {
        let ca = TestCa::new(dir)?;
        let server = ca.issue("provider", &["127.0.0.1", "localhost"])?;
        let credential = format!("Bearer {}", unique_name("key"));
        let credential_file = dir.join("provider-credential");
        std::fs::write(&credential_file, format!("{credential}\n"))?;
        let sim = ProviderSim::spawn(&[
            "--tls-cert",
            path(&server.cert_file)?,
            "--tls-key",
            path(&server.key_file)?,
            "--require-auth-file",
            path(&credential_file)?,
            "--seed",
            "11",
            "--drop-response-after-apply-probability",
            "0.10",
        ])?;
        let url = sim.url.replacen("http://", "https://", 1);
        Ok(Self {
            sim,
            url,
            ca_file: path(&ca.cert_file)?.to_owned(),
            credential_file: path(&credential_file)?.to_owned(),
            credential,
        })
    }

    fn client(&self, access: &ProviderAccess) -> anyhow::Result<ProviderClient> {
        Ok(ProviderClient::new(
            &self.url,
            Duration::from_secs(5),
            access,
        )?)
    }

    fn trusted(&self) -> anyhow::Result<ProviderAccess> {
        Ok(ProviderAccess {
            ca_pem: Some(std::fs::read(&self.ca_file)?),
            ..ProviderAccess::default()
        })
    }

    /// Keys of every applied effect starting with `prefix`, a key listed twice kept twice.
    async fn effects(&self, prefix: &str) -> anyhow::Result<Vec<String>> {
        let ca = reqwest::Certificate::from_pem(&std::fs::read(&self.ca_file)?)?;
        let client = reqwest::Client::builder()
            .add_root_certificate(ca)
            .build()?;
        let effects = effects_at(&client, &self.url, prefix).await?;
        Ok(effects.into_iter().map(|(key, _, _)| key).collect())
    }
}

fn path(path: &Path) -> anyhow::Result<&str> {
    path.to_str()
        .ok_or_else(|| anyhow::anyhow!("not UTF-8: {}", path.display()))
}

#[tokio::test(flavor = "multi_thread")]
async fn the_provider_link_needs_the_credential_and_the_ca_and_never_guesses() -> anyhow::Result<()>
{
    let dir = std::env::temp_dir().join(unique_name("provider-tls-refusals"));
    let provider = SecureProvider::start(&dir)?;
    let body = json!({"amount": 100, "event_id": "e", "entity_id": "a"});
    let deadline = Duration::from_secs(5);

    // Trusted, without the credential: 401, nothing applied, and retryable (the payment is not
    // given up for a credential the operator has to fix).
    let anonymous = provider.client(&provider.trusted()?)?;
    match anonymous.charge("refusals:1", &body, deadline).await {
        ChargeOutcome::Rejected {
            status: 401,
            retryable: true,
            ..
        } => {}
        other => anyhow::bail!("without the credential: {other:?}"),
    }
    // Not trusting the CA: the handshake fails, no answer.
    let untrusting = provider.client(
        &ProviderAccess::default()
            .with_credential("Authorization", &provider.credential)
            .map_err(anyhow::Error::msg)?,
    )?;
    assert!(matches!(
        untrusting.charge("refusals:2", &body, deadline).await,
        ChargeOutcome::Ambiguous { .. }
    ));
    // Plain HTTP to the TLS port: no answer either.
    let plain = ProviderClient::new(&provider.sim.url, deadline, &ProviderAccess::default())?;
    assert!(matches!(
        plain.charge("refusals:3", &body, deadline).await,
        ChargeOutcome::Ambiguous { .. }
    ));
    // Trusted, with the credential: applied.
    let access = provider
        .trusted()?
        .with_credential("Authorization", &provider.credential)
        .map_err(anyhow::Error::msg)?;
    let client = provider.client(&access)?;
    assert!(matches!(
        client.charge("refusals:4", &body, deadline).await,
        ChargeOutcome::Applied { .. }
    ));
    assert_eq!(provider.effects("refusals:").await?, ["refusals:4"]);
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn sink_charges_each_event_once_over_https_with_a_credential_from_a_file()
-> anyhow::Result<()> {
    const EVENTS: u64 = 800;
    let db = TestDatabase::create().await?;
    let dir = std::env::temp_dir().join(unique_name("provider-tls"));
    let provider = SecureProvider::start(&dir)?;
    let dedup = Dedup::spawn(
        &db,
        &[
            "--provider-url",
            &provider.url,
            "--provider-auth-file",
            &provider.credential_file,
            "--provider-ca-file",
            &provider.ca_file,
        ],
    )?;
    let name = unique_name("tls").replace('-', "_");
    let config = dir.join("targets.toml");
    std::fs::write(
        &config,
        format!(
            "[[targets]]\nkind = \"provider\"\nname = \"{name}\"\ndedup_url = \"{}\"\n\
             provider_url = \"{}\"\ncall_timeout = \"1s\"\nlease_ttl = \"10s\"\n\
             provider_auth_file = \"{}\"\nprovider_ca_file = \"{}\"\n",
            dedup.endpoint(),
            provider.url,
            provider.credential_file,
            provider.ca_file
        ),
    )?;
    let topic = unique_name("sink-provider-tls");
    let sink = Sink::new(&topic, &db.url);
    let workload = Workload {
        rate: 400,
        ..Workload::chaos(EVENTS, 83)
    };
    sink_through_kills(&sink, &topic, path(&config)?, workload, 1, &db.pool).await?;

    // One effect per logical event, none twice, over the authenticated TLS link.
    let prefix = format!("{name}:");
    let effects = provider.effects(&prefix).await?;
    let charged: BTreeSet<&str> = effects.iter().map(|k| &k[prefix.len()..]).collect();
    assert_eq!(charged.len(), effects.len(), "no operation charged twice");
    let truth = TopicTruth::read(&topic)?;
    let expected: BTreeSet<&str> = truth.logical.keys().map(String::as_str).collect();
    assert_eq!(charged, expected);

    // Answers were lost, so some intents went UNKNOWN; every one is settled SUCCEEDED, which
    // only the reconciler's authenticated HTTPS look-up (or the sink's replay) can prove.
    let (unknown_ever, not_succeeded): (i64, i64) = sqlx::query_as(
        "SELECT \
           (SELECT count(DISTINCT operation_id) FROM dedup_intent_history \
             WHERE operation_id LIKE $1 AND to_state = 'UNKNOWN'), \
           (SELECT count(*) FROM dedup_intents \
             WHERE operation_id LIKE $1 AND state <> 'SUCCEEDED')",
    )
    .bind(format!("{prefix}%"))
    .fetch_one(&db.pool)
    .await?;
    ensure!(
        unknown_ever > 0,
        "the faults lost no answer: the test would not exercise the reconciler"
    );
    assert_eq!(not_succeeded, 0, "every intent settled SUCCEEDED");
    drop(dedup);
    std::fs::remove_dir_all(&dir)?;
    db.drop_database().await
}
