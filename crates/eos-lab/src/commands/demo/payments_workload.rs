//! The demo's clients of payments-api: `POST /payments` with an Idempotency-Key, as a careful
//! client sends them. An answer that does not come (payments-api busy, a timeout) is retried with
//! the same key until it does; some payments are sent twice on purpose, some keys are reused with
//! another body, and some requests are malformed. Every answer is checked against what the API
//! promises, so a broken promise shows up in the report, not just in the audit.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use rand::{Rng as _, SeedableRng as _};
use serde::Serialize;
use serde_json::{Value, json};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

/// How many requests are in flight at once.
const CONCURRENCY: usize = 32;
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one payment is retried before the workload gives up on the run.
const GIVE_UP_AFTER: Duration = Duration::from_secs(120);

#[derive(Debug, Clone)]
pub(super) struct PaymentsWorkload {
    pub(super) api_url: String,
    pub(super) payments: u64,
    pub(super) rate: u64,
    pub(super) accounts: u64,
    /// Share of payments sent a second time with the same key and body.
    pub(super) resend_ratio: f64,
    /// Share of payments whose key is then reused with another amount.
    pub(super) key_reuse_ratio: f64,
    /// Share of extra requests with a malformed body (each under a fresh key).
    pub(super) malformed_ratio: f64,
    pub(super) seed: u64,
}

/// What the clients saw. `broken_promises` must stay empty.
#[derive(Debug, Default, Clone, Serialize)]
pub(super) struct PaymentsSummary {
    /// Payments the API answered 201 for (one per key).
    pub(super) created: u64,
    /// Resends answered with the original payment and nothing written.
    pub(super) replayed: u64,
    /// Requests retried with the same key after no answer or a 503.
    pub(super) retried: u64,
    /// Keys reused with another body, refused with 409.
    pub(super) key_reuse_refused: u64,
    /// Malformed requests refused with 400.
    pub(super) malformed_refused: u64,
    /// The payment id of the first payment: its event's trace is the one to look at.
    pub(super) first_payment_id: Option<String>,
    /// Answers that break the API's promises (examples, at most 10).
    pub(super) broken_promises: Vec<String>,
    pub(super) broken_promise_count: u64,
}

impl PaymentsSummary {
    fn broken(&mut self, what: String) {
        self.broken_promise_count += 1;
        if self.broken_promises.len() < 10 {
            self.broken_promises.push(what);
        }
    }

    fn merge(&mut self, other: Self) {
        self.created += other.created;
        self.replayed += other.replayed;
        self.retried += other.retried;
        self.key_reuse_refused += other.key_reuse_refused;
        self.malformed_refused += other.malformed_refused;
        self.first_payment_id = self.first_payment_id.take().or(other.first_payment_id);
        // Each example counts once through `broken`; the count covers those without one.
        let uncounted = other.broken_promise_count - other.broken_promises.len() as u64;
        for what in other.broken_promises {
            self.broken(what);
        }
        self.broken_promise_count += uncounted;
    }
}

/// One payment's requests, decided up front from the seed so a run can be repeated.
#[derive(Debug, Clone)]
struct PaymentPlan {
    first: bool,
    key: String,
    body: Value,
    resend: bool,
    reuse_key_with: Option<Value>,
    malformed: Option<String>,
}

fn plans(workload: &PaymentsWorkload) -> Vec<PaymentPlan> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(workload.seed);
    (0..workload.payments)
        .map(|n| {
            let account = format!("acct-{:04}", rng.random_range(0..workload.accounts.max(1)));
            let amount: i64 = rng.random_range(100..100_000);
            let body = json!({ "account_id": account, "amount": amount, "currency": "EUR" });
            let reuse_key_with = rng
                .random_bool(workload.key_reuse_ratio)
                .then(|| json!({ "account_id": account, "amount": amount + 1, "currency": "EUR" }));
            let malformed = rng.random_bool(workload.malformed_ratio).then(|| {
                match rng.random_range(0..3) {
                    0 => r#"{"account_id": "acct-0001", "amount": -5, "currency": "EUR"}"#,
                    1 => r#"{"account_id": "acct-0001", "amount": 10, "currency": "euro"}"#,
                    _ => r#"{"account_id": "acct-0001", "amount": "#,
                }
                .to_owned()
            });
            PaymentPlan {
                first: n == 0,
                key: format!("demo-{}-{n}", workload.seed),
                body,
                resend: rng.random_bool(workload.resend_ratio),
                reuse_key_with,
                malformed,
            }
        })
        .collect()
}

/// Sends every planned payment at `rate` per second; returns what the clients saw.
pub(super) async fn run(workload: PaymentsWorkload) -> anyhow::Result<PaymentsSummary> {
    let client = reqwest::Client::builder()
        .timeout(REQUEST_TIMEOUT)
        .build()?;
    let url = format!("{}/payments", workload.api_url.trim_end_matches('/'));
    let permits = Arc::new(Semaphore::new(CONCURRENCY));
    let mut tasks = JoinSet::new();
    let mut ticker =
        tokio::time::interval(Duration::from_secs_f64(1.0 / workload.rate.max(1) as f64));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut summary = PaymentsSummary::default();
    for plan in plans(&workload) {
        ticker.tick().await;
        let permit = permits.clone().acquire_owned().await?;
        let (client, url) = (client.clone(), url.clone());
        tasks.spawn(async move {
            let outcome = pay(&client, &url, &plan).await;
            drop(permit);
            outcome
        });
        while let Some(done) = tasks.try_join_next() {
            summary.merge(done.context("a client task")??);
        }
    }
    while let Some(done) = tasks.join_next().await {
        summary.merge(done.context("a client task")??);
    }
    Ok(summary)
}

/// The status and JSON body of one request, retried with the same key while there is no answer
/// or the API says it could not record it (503): a client that gives up there cannot know
/// whether its payment exists — retrying with the key is how it finds out.
async fn send(
    client: &reqwest::Client,
    url: &str,
    key: &str,
    body: String,
    summary: &mut PaymentsSummary,
) -> anyhow::Result<(u16, bool, Value)> {
    let started = Instant::now();
    loop {
        let answer = client
            .post(url)
            .header("idempotency-key", key)
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await;
        match answer {
            Ok(response) if response.status().as_u16() != 503 => {
                let status = response.status().as_u16();
                let replayed = response.headers().contains_key("idempotent-replayed");
                let value = response.json::<Value>().await.unwrap_or(Value::Null);
                return Ok((status, replayed, value));
            }
            Ok(_) | Err(_) if started.elapsed() < GIVE_UP_AFTER => {
                summary.retried += 1;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Ok(response) => anyhow::bail!(
                "payments-api answered {} for key {key} for {GIVE_UP_AFTER:?}",
                response.status()
            ),
            Err(error) => {
                return Err(error).with_context(|| {
                    format!("payments-api did not answer key {key} for {GIVE_UP_AFTER:?}")
                });
            }
        }
    }
}

async fn pay(
    client: &reqwest::Client,
    url: &str,
    plan: &PaymentPlan,
) -> anyhow::Result<PaymentsSummary> {
    let mut summary = PaymentsSummary::default();
    let body = plan.body.to_string();
    let (status, _, first) = send(client, url, &plan.key, body.clone(), &mut summary).await?;
    if status != 201 {
        summary.broken(format!(
            "{}: a valid payment answered {status}: {first}",
            plan.key
        ));
        return Ok(summary);
    }
    summary.created += 1;
    let payment_id = first["payment_id"].clone();
    if plan.first {
        summary.first_payment_id = payment_id.as_str().map(str::to_owned);
    }
    if plan.resend {
        let (status, replayed, again) = send(client, url, &plan.key, body, &mut summary).await?;
        if status == 201 && replayed && again["payment_id"] == payment_id {
            summary.replayed += 1;
        } else {
            summary.broken(format!(
                "{}: a resend answered {status} (replayed: {replayed}) with {again}, first \
                 {payment_id}",
                plan.key
            ));
        }
    }
    if let Some(other) = &plan.reuse_key_with {
        let (status, _, answer) =
            send(client, url, &plan.key, other.to_string(), &mut summary).await?;
        if status == 409 {
            summary.key_reuse_refused += 1;
        } else {
            summary.broken(format!(
                "{}: the key reused with another body answered {status}: {answer}",
                plan.key
            ));
        }
    }
    if let Some(malformed) = &plan.malformed {
        let key = format!("{}-malformed", plan.key);
        let (status, _, answer) = send(client, url, &key, malformed.clone(), &mut summary).await?;
        if status == 400 {
            summary.malformed_refused += 1;
        } else {
            summary.broken(format!(
                "{key}: a malformed body answered {status}: {answer}"
            ));
        }
    }
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workload() -> PaymentsWorkload {
        PaymentsWorkload {
            api_url: "http://127.0.0.1:1".into(),
            payments: 2_000,
            rate: 100,
            accounts: 50,
            resend_ratio: 0.1,
            key_reuse_ratio: 0.05,
            malformed_ratio: 0.05,
            seed: 7,
        }
    }

    #[test]
    fn plans_are_repeatable_and_keys_unique() {
        let (a, b) = (plans(&workload()), plans(&workload()));
        assert_eq!(a.len(), 2_000);
        let keys: std::collections::HashSet<&str> = a.iter().map(|p| p.key.as_str()).collect();
        assert_eq!(keys.len(), a.len());
        for (x, y) in a.iter().zip(&b) {
            assert_eq!((&x.key, &x.body, x.resend), (&y.key, &y.body, y.resend));
        }
        let resends = a.iter().filter(|p| p.resend).count();
        assert!(
            (100..300).contains(&resends),
            "{resends} resends of 2000 at 10%"
        );
        for plan in a
            .iter()
            .filter_map(|p| p.reuse_key_with.as_ref().map(|o| (p, o)))
        {
            assert_ne!(&plan.0.body, plan.1, "a reused key must carry another body");
        }
    }

    #[test]
    fn merging_keeps_counts_and_at_most_ten_examples() {
        let mut total = PaymentsSummary::default();
        for n in 0..15 {
            let mut part = PaymentsSummary {
                created: 1,
                ..PaymentsSummary::default()
            };
            part.broken(format!("broken {n}"));
            total.merge(part);
        }
        assert_eq!(total.created, 15);
        assert_eq!(total.broken_promise_count, 15);
        assert_eq!(total.broken_promises.len(), 10);
    }
}
