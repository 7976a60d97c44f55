//! dedup-service as the Helm chart deploys it: two replicas (real processes) sharing one
//! database, callers spread over both behind a client-side load balancer, and one replica
//! SIGKILLed mid-run. The 64-racer claim race and the ambiguous-provider workload of
//! `dedup_service.rs` must stay exact (docs/ARCHITECTURE.md "Boundaries", dedup-service): counted
//! from the provider's own ledger and from the database, never from what the callers believe.
//!
//! The replica that dies is reached through an [`AnswerDroppingProxy`]: just before the kill its
//! answers stop reaching callers while it keeps committing, and the kill waits until it has
//! committed acquisitions nobody was told of — the worst moment to die, made to happen every run
//! instead of by luck. Those callers' retries on the survivor carry the same request id and must
//! be told ACQUIRED, exactly once per operation.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow, bail, ensure};
use dedup_client::grpc_client::is_transient;
use dedup_client::proto_convert;
use dedup_client::{BeginOutcome, ChargeOutcome, DedupClient, FencingToken, ProviderClient};
use eos_core::Fingerprint;
use eos_proto::dedup::v1 as pb;
use eos_proto::dedup::v1::dedup_client::DedupClient as GrpcClient;
use futures::StreamExt as _;
use integration_tests::TestDatabase;
use integration_tests::answer_dropping_proxy::AnswerDroppingProxy;
use serde_json::{Value, json};
use time::OffsetDateTime;
use tokio::sync::watch;
use tonic::transport::Channel;
use tonic::{Code, Status};

use crate::dedup_service::{Dedup, history, step};
use crate::provider_sim::ProviderSim;

const REPLICAS: usize = 2;
/// The replica that is SIGKILLed.
const VICTIM: usize = 0;
/// The replica that stays up.
const SURVIVOR: usize = 1;
/// Deadline of one attempt of a call at one replica.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a caller keeps trying a call (over every replica) before it gives up.
const CALL_PATIENCE: Duration = Duration::from_secs(30);

/// Starts the replicas at once on the same database, as a Deployment's pods start: their
/// start-up migrations of the fresh database race too.
fn spawn_replicas(db: &TestDatabase, extra: &[&str]) -> anyhow::Result<Vec<Dedup>> {
    std::thread::scope(|scope| {
        let starting: Vec<_> = (0..REPLICAS)
            .map(|_| scope.spawn(|| Dedup::spawn(db, extra)))
            .collect();
        starting
            .into_iter()
            .map(|thread| {
                thread
                    .join()
                    .map_err(|_| anyhow!("starting a replica panicked"))?
            })
            .collect()
    })
}

/// The replicas as the test's load balancer sees them: a channel to each, and what the kill did
/// to the calls in flight.
struct Cluster {
    channels: Vec<GrpcClient<Channel>>,
    /// Calls sent to each replica and not answered yet.
    in_flight: Vec<AtomicUsize>,
    /// When each replica was killed (set just before the signal).
    killed_at: Vec<OnceLock<Instant>>,
    /// Calls the kill cut off: sent to the replica before it was killed, failed with a status
    /// [`worth_another_replica`], and sent again to another replica.
    cut: Vec<AtomicUsize>,
    /// Calls sent again to another replica, whatever the reason.
    failovers: AtomicUsize,
    /// The Begins sent to each replica and not answered yet: request id → when sent.
    begins_in_flight: Vec<Mutex<HashMap<String, Instant>>>,
    /// When each replica's answers started to be dropped.
    answers_dropped_at: Vec<OnceLock<Instant>>,
}

impl Cluster {
    /// Channels to `endpoints`, one per replica, in replica order.
    fn connect(endpoints: &[String]) -> anyhow::Result<Arc<Self>> {
        let channels = endpoints
            .iter()
            .map(|endpoint| Ok(DedupClient::connect_lazy(endpoint)?.grpc()))
            .collect::<anyhow::Result<_>>()?;
        let per_replica = || endpoints.iter();
        Ok(Arc::new(Self {
            channels,
            in_flight: per_replica().map(|_| AtomicUsize::new(0)).collect(),
            killed_at: per_replica().map(|_| OnceLock::new()).collect(),
            cut: per_replica().map(|_| AtomicUsize::new(0)).collect(),
            failovers: AtomicUsize::new(0),
            begins_in_flight: per_replica().map(|_| Mutex::default()).collect(),
            answers_dropped_at: per_replica().map(|_| OnceLock::new()).collect(),
        }))
    }

    fn begins_in_flight(&self, index: usize) -> MutexGuard<'_, HashMap<String, Instant>> {
        // Only inserts and removals happen under the lock; a poisoned set is still whole.
        self.begins_in_flight[index]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// A caller that starts on replica `preferred`.
    fn caller(self: &Arc<Self>, preferred: usize) -> Caller {
        Caller {
            cluster: Arc::clone(self),
            preferred: Arc::new(AtomicUsize::new(preferred)),
        }
    }

    /// SIGKILLs `replica` (number `index`); how many calls were in flight on it just before.
    fn kill(&self, index: usize, replica: &mut Dedup) -> anyhow::Result<usize> {
        let in_flight = self.in_flight[index].load(Ordering::SeqCst);
        let _ = self.killed_at[index].set(Instant::now());
        let status = replica.process.kill_hard()?;
        ensure!(
            status.code().is_none(),
            "replica {index} was not killed by the signal: {status}"
        );
        Ok(in_flight)
    }

    fn cut(&self, index: usize) -> usize {
        self.cut[index].load(Ordering::SeqCst)
    }

    /// From now on no answer of replica `index` (behind `proxy`) reaches its caller.
    fn drop_answers(&self, index: usize, proxy: &AnswerDroppingProxy) {
        let _ = self.answers_dropped_at[index].set(Instant::now());
        proxy.drop_answers();
    }

    /// Request ids of the Begins sent to replica `index` after its answers started to be
    /// dropped: whatever it did for them, their callers cannot have heard of it.
    fn unheard_begins(&self, index: usize) -> Vec<String> {
        let Some(dropped_at) = self.answers_dropped_at[index].get() else {
            return Vec::new();
        };
        self.begins_in_flight(index)
            .iter()
            .filter(|(_, sent_at)| *sent_at > dropped_at)
            .map(|(request_id, _)| request_id.clone())
            .collect()
    }
}

/// The replicas as callers reach them: the victim through a proxy that can drop its answers,
/// the survivor directly.
async fn connect(replicas: &[Dedup]) -> anyhow::Result<(Arc<Cluster>, AnswerDroppingProxy)> {
    let victim = replicas[VICTIM].endpoint();
    let proxy = AnswerDroppingProxy::start(victim.trim_start_matches("http://")).await?;
    let endpoints: Vec<String> = replicas
        .iter()
        .enumerate()
        .map(|(index, replica)| {
            if index == VICTIM {
                format!("http://{}", proxy.addr())
            } else {
                replica.endpoint()
            }
        })
        .collect();
    Ok((Cluster::connect(&endpoints)?, proxy))
}

/// Operation ids the replica `index` acquired (committed RESERVED) for Begins whose callers were
/// never told, because its answers are being dropped.
async fn unheard_acquisitions(
    db: &TestDatabase,
    cluster: &Cluster,
    index: usize,
) -> anyhow::Result<Vec<String>> {
    Ok(sqlx::query_scalar(
        "SELECT operation_id FROM dedup_intents
         WHERE state = 'RESERVED' AND request_id = ANY($1) ORDER BY operation_id",
    )
    .bind(cluster.unheard_begins(index))
    .fetch_all(&db.pool)
    .await?)
}

/// Polls `check` (a database query: no event announces what it looks for) until it yields a
/// value, for at most `timeout`.
async fn wait_until<T, F, Fut>(what: &str, timeout: Duration, check: F) -> anyhow::Result<T>
where
    F: Fn() -> Fut,
    Fut: Future<Output = anyhow::Result<Option<T>>>,
{
    let give_up_at = Instant::now() + timeout;
    loop {
        if let Some(value) = check().await? {
            return Ok(value);
        }
        ensure!(
            Instant::now() < give_up_at,
            "{what}: not within {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One caller behind a client-side load balancer: it starts on its preferred replica, and when a
/// call fails there with a transient code it sends the very same request (same request id, same
/// fencing token) to the next replica, and stays there.
#[derive(Clone)]
struct Caller {
    cluster: Arc<Cluster>,
    preferred: Arc<AtomicUsize>,
}

impl Caller {
    /// Sends `request` until a replica answers (or a non-transient status, or patience runs
    /// out); the answer and the index of the replica that gave it. `begin_request_id` names a
    /// Begin, tracked while it is in flight.
    async fn call<Req, Resp, F, Fut>(
        &self,
        request: Req,
        begin_request_id: Option<&str>,
        send: F,
    ) -> Result<(Resp, usize), Status>
    where
        Req: Clone,
        F: Fn(GrpcClient<Channel>, tonic::Request<Req>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<Resp>, Status>>,
    {
        let cluster = &self.cluster;
        let give_up_at = Instant::now() + CALL_PATIENCE;
        let mut replica = self.preferred.load(Ordering::Relaxed);
        let mut failed_in_a_row = 0_u32;
        loop {
            let mut message = tonic::Request::new(request.clone());
            message.set_timeout(ATTEMPT_TIMEOUT);
            let sent_at = Instant::now();
            cluster.in_flight[replica].fetch_add(1, Ordering::SeqCst);
            if let Some(request_id) = begin_request_id {
                cluster
                    .begins_in_flight(replica)
                    .insert(request_id.to_owned(), sent_at);
            }
            let answer = send(cluster.channels[replica].clone(), message).await;
            if let Some(request_id) = begin_request_id {
                cluster.begins_in_flight(replica).remove(request_id);
            }
            cluster.in_flight[replica].fetch_sub(1, Ordering::SeqCst);
            match answer {
                Ok(response) => return Ok((response.into_inner(), replica)),
                Err(status) if worth_another_replica(&status) && Instant::now() < give_up_at => {}
                Err(status) => return Err(status),
            }
            if cluster.killed_at[replica]
                .get()
                .is_some_and(|killed_at| sent_at <= *killed_at)
            {
                cluster.cut[replica].fetch_add(1, Ordering::SeqCst);
            }
            cluster.failovers.fetch_add(1, Ordering::Relaxed);
            failed_in_a_row += 1;
            if failed_in_a_row.is_multiple_of(REPLICAS as u32) {
                // Every replica failed in turn (overloaded, or all restarting): back off.
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            replica = (replica + 1) % REPLICAS;
            self.preferred.store(replica, Ordering::Relaxed);
        }
    }

    /// Begin with `request` (one request id for every replica it is sent to, so a Begin that
    /// acquired on a replica that died before answering is answered ACQUIRED by the other).
    async fn begin(&self, request: pb::BeginRequest) -> Result<(BeginOutcome, usize), Status> {
        let request_id = request.request_id.clone();
        let (response, replica) = self
            .call(request, Some(&request_id), |mut grpc, message| async move {
                grpc.begin(message).await
            })
            .await?;
        let outcome = proto_convert::begin_outcome(response)
            .ok_or_else(|| Status::internal("a Begin answer without an outcome"))?;
        Ok((outcome, replica))
    }

    async fn complete(
        &self,
        operation_id: &str,
        token: FencingToken,
        result: Vec<u8>,
    ) -> Result<(), Status> {
        let request = pb::CompleteRequest {
            operation_id: operation_id.to_owned(),
            fencing_token: token.counter,
            result,
            fencing_secret: token.secret.as_bytes().to_vec(),
            trace_context: Default::default(),
        };
        self.call(request, None, |mut grpc, message| async move {
            grpc.complete(message).await
        })
        .await
        .map(drop)
    }

    async fn fail(
        &self,
        operation_id: &str,
        token: FencingToken,
        reason: &str,
    ) -> Result<(), Status> {
        let request = pb::FailRequest {
            operation_id: operation_id.to_owned(),
            fencing_token: token.counter,
            reason: reason.to_owned(),
            retryable: true,
            fencing_secret: token.secret.as_bytes().to_vec(),
        };
        self.call(request, None, |mut grpc, message| async move {
            grpc.fail(message).await
        })
        .await
        .map(drop)
    }

    async fn mark_unknown(
        &self,
        operation_id: &str,
        token: FencingToken,
        detail: &str,
    ) -> Result<(), Status> {
        let request = pb::MarkUnknownRequest {
            operation_id: operation_id.to_owned(),
            fencing_token: token.counter,
            detail: detail.to_owned(),
            fencing_secret: token.secret.as_bytes().to_vec(),
        };
        self.call(request, None, |mut grpc, message| async move {
            grpc.mark_unknown(message).await
        })
        .await
        .map(drop)
    }
}

/// A status after which the same request goes to another replica: the transient codes, and
/// CANCELLED, which is what a connection that closes under a call in flight turns into (a replica
/// that dies behind a TCP proxy). Every call here is safe to send again: a Begin carries its
/// request id, a report its fencing token.
fn worth_another_replica(status: &Status) -> bool {
    is_transient(status.code()) || status.code() == Code::Cancelled
}

/// A Begin request with a request id of its own.
fn begin_request(
    operation_id: &str,
    fingerprint: &[u8],
    owner: &str,
    lease: Duration,
    occurred_at: OffsetDateTime,
) -> pb::BeginRequest {
    pb::BeginRequest {
        operation_id: operation_id.to_owned(),
        fingerprint: fingerprint.to_vec(),
        owner: owner.to_owned(),
        lease_ttl: prost_types::Duration::try_from(lease).ok(),
        occurred_at: Some(proto_convert::timestamp(occurred_at)),
        request_id: format!("it-{:032x}", rand::random::<u128>()),
        trace_context: Default::default(),
    }
}

/// The provider's ledger, from `GET /effects`: per key, the charge ids applied (exactly one when
/// all is well) and the POSTs the provider received with the key.
#[derive(Debug, Default)]
struct Ledger {
    charges: BTreeMap<String, Vec<String>>,
    attempts: BTreeMap<String, u64>,
}

async fn ledger(sim: &ProviderSim) -> anyhow::Result<Ledger> {
    let body: Value = reqwest::get(format!("{}/effects", sim.url))
        .await?
        .error_for_status()?
        .json()
        .await?;
    let effects = body["effects"]
        .as_array()
        .with_context(|| format!("no effects array in {body}"))?;
    let mut ledger = Ledger::default();
    for effect in effects {
        let key = effect["key"].as_str().context("an effect without key")?;
        let charge_id = effect["charge_id"]
            .as_str()
            .context("an effect without charge_id")?;
        let attempts = effect["attempts"]
            .as_u64()
            .context("an effect without attempts")?;
        ledger
            .charges
            .entry(key.to_owned())
            .or_default()
            .push(charge_id.to_owned());
        *ledger.attempts.entry(key.to_owned()).or_default() += attempts;
    }
    Ok(ledger)
}

/// The exactness proof against the provider's ledger and the database: each operation in `ids`
/// has exactly one effect and nothing else has any; exactly the operations in `ids` are
/// SUCCEEDED, each with the provider's record of its one charge as the result; and the provider
/// was called once per operation (no blind second call, not even with the same key).
async fn assert_one_effect_each(
    db: &TestDatabase,
    sim: &ProviderSim,
    ids: &BTreeSet<String>,
) -> anyhow::Result<()> {
    let ledger = ledger(sim).await?;
    let doubled: Vec<_> = ledger
        .charges
        .iter()
        .filter(|(_, charges)| charges.len() != 1)
        .collect();
    assert!(doubled.is_empty(), "charged more than once: {doubled:?}");
    let charged: BTreeSet<String> = ledger.charges.keys().cloned().collect();
    assert_eq!(
        &charged, ids,
        "the provider's effects differ from the operations"
    );
    let called_again: Vec<_> = ledger.attempts.iter().filter(|(_, n)| **n != 1).collect();
    assert!(
        called_again.is_empty(),
        "the provider was called more than once for: {called_again:?}"
    );

    let succeeded: Vec<(String, Option<Vec<u8>>)> = sqlx::query_as(
        "SELECT operation_id, result FROM dedup_intents WHERE state = 'SUCCEEDED'
         ORDER BY operation_id",
    )
    .fetch_all(&db.pool)
    .await?;
    let succeeded_ids: BTreeSet<String> = succeeded.iter().map(|(id, _)| id.clone()).collect();
    assert_eq!(
        &succeeded_ids, ids,
        "SUCCEEDED intents differ from the provider's effects"
    );
    for (operation_id, result) in &succeeded {
        let record: Value = serde_json::from_slice(result.as_deref().unwrap_or_default())
            .with_context(|| format!("{operation_id}: the stored result is not the record"))?;
        assert_eq!(
            record["id"].as_str(),
            ledger.charges[operation_id].first().map(String::as_str),
            "{operation_id}: the stored result is not the provider's charge: {record}"
        );
    }
    Ok(())
}

/// Every acquisition in the history (transitions into RESERVED): operation id → (token, holder).
async fn acquisitions(db: &TestDatabase) -> anyhow::Result<BTreeMap<String, Vec<(i64, String)>>> {
    let rows: Vec<(String, i64, String)> = sqlx::query_as(
        "SELECT operation_id, fencing_token, holder FROM dedup_intent_history
         WHERE to_state = 'RESERVED' ORDER BY operation_id, id",
    )
    .fetch_all(&db.pool)
    .await?;
    let mut by_id: BTreeMap<String, Vec<(i64, String)>> = BTreeMap::new();
    for (operation_id, token, holder) in rows {
        by_id.entry(operation_id).or_default().push((token, holder));
    }
    Ok(by_id)
}

/// Who won one id's race, and through which replica the answer came.
#[derive(Debug)]
struct Winner {
    contender: usize,
    fencing_token: FencingToken,
    replica: usize,
}

#[derive(Debug)]
struct Claim {
    operation_id: String,
    winners: Vec<Winner>,
}

const RACE_FINGERPRINT: [u8; 32] = [9; 32];
/// Longer than one id's race takes (even across the kill), so every contender of an id races
/// the same lease; short enough that the takeover of the dead replica's leases is quick.
const CLAIM_LEASE: Duration = Duration::from_secs(8);

/// Every contender Begins `operation_id` at once, each through its own caller; who acquired.
/// Anything but ACQUIRED or IN_PROGRESS is an error.
async fn race(
    operation_id: String,
    contenders: &[Caller],
    occurred_at: OffsetDateTime,
) -> anyhow::Result<Claim> {
    let begins = contenders.iter().enumerate().map(|(contender, caller)| {
        let request = begin_request(
            &operation_id,
            &RACE_FINGERPRINT,
            &format!("worker-{contender}"),
            CLAIM_LEASE,
            occurred_at,
        );
        async move { (contender, caller.begin(request).await) }
    });
    let answers = futures::future::join_all(begins).await;
    let mut winners = Vec::new();
    for (contender, answer) in answers {
        let (outcome, replica) =
            answer.map_err(|status| anyhow!("{operation_id}: contender {contender}: {status}"))?;
        match outcome {
            BeginOutcome::Acquired { fencing_token, .. } => winners.push(Winner {
                contender,
                fencing_token,
                replica,
            }),
            BeginOutcome::InProgress { .. } => {}
            other => bail!("{operation_id}: contender {contender}: {other:?}"),
        }
    }
    Ok(Claim {
        operation_id,
        winners,
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn dedup_replicas_claim_race_stays_exact_when_one_replica_is_killed() -> anyhow::Result<()> {
    const IDS: usize = 200;
    const CONTENDERS: usize = 64;
    /// Ids raced only through the victim just before its answers are dropped.
    const GRANTED: usize = 4;
    /// Ids raced only through the victim while its answers are dropped.
    const UNHEARD: usize = 4;
    let db = TestDatabase::create().await?;
    let sim = ProviderSim::spawn(&[])?;
    let mut replicas = spawn_replicas(
        &db,
        &[
            "--provider-url",
            &sim.url,
            "--reconcile-interval",
            "200ms",
            "--in-flight-window",
            "1s",
        ],
    )?;
    let (cluster, proxy) = connect(&replicas).await?;
    // Contender c starts on replica c % 2: every id is raced through both replicas at once.
    let contenders: Vec<Caller> = (0..CONTENDERS)
        .map(|contender| cluster.caller(contender % REPLICAS))
        .collect();
    let victim_contenders: Vec<Caller> = (0..CONTENDERS).map(|_| cluster.caller(VICTIM)).collect();
    let granted_ids: Vec<String> = (0..GRANTED).map(|i| format!("race-granted-{i}")).collect();
    let unheard_ids: Vec<String> = (0..UNHEARD).map(|i| format!("race-unheard-{i}")).collect();
    let occurred_at = OffsetDateTime::now_utc();
    let (progress, mut raced) = watch::channel(0_usize);

    let main_race = async {
        // Owned here and dropped at the end, so a kill still waiting for progress gives up.
        let progress = progress;
        let started = Instant::now();
        let claims: Vec<anyhow::Result<Claim>> = futures::stream::iter(0..IDS)
            .map(|id| {
                let (contenders, progress) = (&contenders, &progress);
                async move {
                    let claim = race(format!("race-{id}"), contenders, occurred_at).await;
                    progress.send_modify(|done| *done += 1);
                    claim
                }
            })
            .buffer_unordered(8)
            .collect()
            .await;
        let elapsed = started.elapsed();
        println!(
            "{} Begins over {REPLICAS} replicas in {elapsed:?} ({:.0}/s)",
            IDS * CONTENDERS,
            (IDS * CONTENDERS) as f64 / elapsed.as_secs_f64()
        );
        claims.into_iter().collect::<anyhow::Result<Vec<Claim>>>()
    };
    let kill = async {
        let done = *raced
            .wait_for(|done| *done >= IDS / 3)
            .await
            .context("the race ended before a third of it was done")?;
        ensure!(
            done < IDS,
            "the kill must land mid-run (after {done} of {IDS} ids)"
        );
        // Races through the victim alone: it grants the leases and says so. Their holders die
        // with it (they never report), so these leases must be taken over.
        let granted_claims = futures::future::join_all(
            granted_ids
                .iter()
                .map(|id| race(id.clone(), &victim_contenders, occurred_at)),
        )
        .await
        .into_iter()
        .collect::<anyhow::Result<Vec<Claim>>>()?;
        cluster.drop_answers(VICTIM, &proxy);
        // Races through the victim alone: it acquires, and nobody hears of it.
        let unheard_races = futures::future::join_all(
            unheard_ids
                .iter()
                .map(|id| race(id.clone(), &victim_contenders, occurred_at)),
        );
        let killing = async {
            let acquired = wait_until(
                "the victim acquires the unheard ids",
                Duration::from_secs(20),
                || async {
                    let acquired = unheard_acquisitions(&db, &cluster, VICTIM).await?;
                    let all = unheard_ids.iter().all(|id| acquired.contains(id));
                    Ok(all.then_some(acquired))
                },
            )
            .await?;
            let in_flight = cluster.kill(VICTIM, &mut replicas[VICTIM])?;
            Ok::<_, anyhow::Error>((acquired, in_flight))
        };
        let (unheard_claims, killed) = tokio::join!(unheard_races, killing);
        let (acquired, in_flight) = killed?;
        let unheard_claims = unheard_claims
            .into_iter()
            .collect::<anyhow::Result<Vec<Claim>>>()?;
        Ok::<_, anyhow::Error>((done, acquired, in_flight, granted_claims, unheard_claims))
    };
    let (claims, killed) = tokio::join!(main_race, kill);
    let mut claims = claims?;
    let (done_at_kill, unheard_at_kill, in_flight_at_kill, granted_claims, unheard_claims) =
        killed?;
    let cut = cluster.cut(VICTIM);
    println!(
        "killed replica {VICTIM} after {done_at_kill} of {IDS} ids, having acquired \
         {unheard_at_kill:?} unheard, with {in_flight_at_kill} Begins in flight on it; {cut} were \
         cut and sent to replica {SURVIVOR}; {} failovers",
        cluster.failovers.load(Ordering::Relaxed)
    );
    ensure!(
        cut > 0,
        "the SIGKILL cut no Begin in flight, so it proved nothing"
    );
    claims.extend(granted_claims);
    claims.extend(unheard_claims);
    // Each unheard acquisition (of the unheard ids, and of any main-race id that started after
    // the answers were dropped) reaches its caller after all: the retry on the survivor carries
    // the same request id and is answered ACQUIRED, and nobody else is.
    for operation_id in &unheard_at_kill {
        let claim = claims
            .iter()
            .find(|claim| &claim.operation_id == operation_id)
            .with_context(|| format!("{operation_id} was not raced"))?;
        let answered_by: Vec<usize> = claim.winners.iter().map(|w| w.replica).collect();
        assert_eq!(
            answered_by,
            vec![SURVIVOR],
            "{operation_id}: the victim's unheard acquisition must be answered once, by the \
             survivor"
        );
    }

    // Exactly one contender of each id acquired, whichever replica answered it...
    let wrong: Vec<_> = claims
        .iter()
        .filter(|claim| claim.winners.len() != 1)
        .map(|claim| (&claim.operation_id, &claim.winners))
        .collect();
    assert!(wrong.is_empty(), "ids not acquired exactly once: {wrong:?}");
    // ...and the database agrees: one acquisition per id, token 1, held by that very contender.
    let acquired = acquisitions(&db).await?;
    assert_eq!(
        acquired.len(),
        IDS + GRANTED + UNHEARD,
        "ids with an acquisition"
    );
    for claim in &claims {
        let winner = &claim.winners[0];
        assert_eq!(winner.fencing_token.counter, 1, "{}", claim.operation_id);
        assert_eq!(
            acquired.get(&claim.operation_id),
            Some(&vec![(1, format!("worker-{}", winner.contender))]),
            "{}: the database's acquisitions are not the one the winner was told of",
            claim.operation_id
        );
    }

    // The leases the dead replica granted and told of (the granted ids, and main-race ids it
    // won): their holders never report. The survivor takes them over (the lease runs out, its
    // reconciler finds no charge and settles a retryable failure), a successor acquires a newer
    // token through it, and the dead lease's token is refused.
    let orphaned: BTreeSet<String> = claims
        .iter()
        .filter(|claim| claim.winners[0].replica == VICTIM)
        .map(|claim| claim.operation_id.clone())
        .collect();
    let granted: BTreeSet<String> = granted_ids.iter().cloned().collect();
    ensure!(
        orphaned.is_superset(&granted),
        "the victim did not answer every granted id itself: {orphaned:?}"
    );
    // What the dead holders were told: their counter (1) and its secret, presented again below.
    let dead_tokens: BTreeMap<&str, FencingToken> = claims
        .iter()
        .map(|claim| (claim.operation_id.as_str(), claim.winners[0].fencing_token))
        .collect();
    let successor = cluster.caller(SURVIVOR);
    let provider = ProviderClient::new(&sim.url, Duration::from_secs(5), &Default::default())?;
    let takeover_started = Instant::now();
    let taken_over: Vec<anyhow::Result<()>> = futures::stream::iter(&orphaned)
        .map(|operation_id| {
            take_over(
                &successor,
                &provider,
                operation_id,
                dead_tokens[operation_id.as_str()],
                occurred_at,
            )
        })
        .buffer_unordered(32)
        .collect()
        .await;
    for result in taken_over {
        result?;
    }
    println!(
        "{} leases of the dead replica taken over in {:?}",
        orphaned.len(),
        takeover_started.elapsed()
    );
    for operation_id in &orphaned {
        assert_eq!(
            history(&db, operation_id).await?,
            vec![
                step(None, "RESERVED", 1),
                step(Some("RESERVED"), "UNKNOWN", 1),
                step(Some("UNKNOWN"), "FAILED", 1),
                step(Some("FAILED"), "RESERVED", 2),
                step(Some("RESERVED"), "SUCCEEDED", 2),
            ],
            "{operation_id}: the outcome was written once, by the newest holder"
        );
    }
    // Only the successors called the provider: one effect for each taken-over id, none else.
    assert_one_effect_each(&db, &sim, &orphaned).await?;
    drop(replicas);
    db.drop_database().await
}

/// A successor takes over `operation_id`, whose lease (token `dead_token`) a dead replica
/// granted to a holder that never reports: it Begins through the survivor until it acquires a
/// newer token; the dead lease's token is refused for every report, before and after the
/// successor completes.
async fn take_over(
    successor: &Caller,
    provider: &ProviderClient,
    operation_id: &str,
    dead_token: FencingToken,
    occurred_at: OffsetDateTime,
) -> anyhow::Result<()> {
    // The lease, then the in-flight window and a reconciler pass.
    let give_up_at = Instant::now() + CLAIM_LEASE + Duration::from_secs(20);
    let token = loop {
        ensure!(
            Instant::now() < give_up_at,
            "{operation_id}: not taken over in time"
        );
        let request = begin_request(
            operation_id,
            &RACE_FINGERPRINT,
            "successor",
            CLAIM_LEASE,
            occurred_at,
        );
        match successor.begin(request).await?.0 {
            BeginOutcome::Acquired { fencing_token, .. } => break fencing_token,
            // The dead holder's lease is live, or ran out and awaits the reconciler's verdict.
            BeginOutcome::InProgress { .. } | BeginOutcome::Unknown { .. } => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            other => bail!("{operation_id}: successor: {other:?}"),
        }
    };
    ensure!(
        token.counter == dead_token.counter + 1,
        "{operation_id}: successor token {}, dead holder's {}",
        token.counter,
        dead_token.counter
    );
    let refused = |result: Result<(), Status>, what: &str| match result {
        Err(status) if status.code() == Code::FailedPrecondition => Ok(()),
        other => Err(anyhow!(
            "{operation_id}: {what} with the dead lease's token {}: {other:?}",
            dead_token.counter
        )),
    };
    refused(
        successor
            .complete(operation_id, dead_token, b"late".to_vec())
            .await,
        "Complete",
    )?;
    refused(
        successor.fail(operation_id, dead_token, "late").await,
        "Fail",
    )?;
    refused(
        successor
            .mark_unknown(operation_id, dead_token, "late")
            .await,
        "MarkUnknown",
    )?;
    let ChargeOutcome::Applied { body, .. } = provider
        .charge(operation_id, &json!({"amount": 10}), Duration::from_secs(5))
        .await
    else {
        bail!("{operation_id}: provider-sim without faults must apply");
    };
    successor
        .complete(operation_id, token, body)
        .await
        .map_err(|status| anyhow!("{operation_id}: successor's Complete: {status}"))?;
    refused(
        successor
            .complete(operation_id, dead_token, b"late".to_vec())
            .await,
        "Complete after the successor's",
    )
}

/// The provider's faults, all after applying: 30 % of answers lost, 5 % a 500, 5 % late.
const FAULTS: [&str; 10] = [
    "--seed",
    "7",
    "--drop-response-after-apply-probability",
    "0.3",
    "--error-after-apply-probability",
    "0.05",
    "--delay-after-apply",
    "2s",
    "--delay-after-apply-probability",
    "0.05",
];
/// The lease of one delivery's attempt: well above the provider deadline of 800 ms.
const DELIVERY_LEASE: Duration = Duration::from_secs(5);

/// What the callers saw (printed, and used to pick the moment of the kill; the assertions count
/// from the ledger and the database).
#[derive(Debug, Default)]
struct Tally {
    provider_calls: AtomicUsize,
    ambiguous: AtomicUsize,
    /// Operations with an ambiguous answer that their caller has not yet seen SUCCEEDED.
    ambiguous_unsettled: AtomicUsize,
    ambiguous_ids: Mutex<BTreeSet<String>>,
    /// Reports refused because a newer holder exists (the lease ran out first).
    stale_reports: AtomicUsize,
}

/// One delivery of an operation, as a careful caller drives it (as in `dedup_service.rs`):
/// Begin, and only on ACQUIRED call the provider with the operation id as key, then report; a
/// lost or late answer is MarkUnknown. Loops until Begin answers SUCCEEDED.
async fn deliver(
    caller: &Caller,
    provider: &ProviderClient,
    operation_id: &str,
    owner: &str,
    occurred_at: OffsetDateTime,
    tally: &Tally,
    changed: &watch::Sender<()>,
) -> anyhow::Result<()> {
    let body = json!({"amount": 100 + operation_id.len() as i64, "currency": "EUR"});
    let fingerprint = Fingerprint::of_json(&body).as_bytes().to_vec();
    let give_up_at = Instant::now() + Duration::from_secs(60);
    let mut saw_ambiguous = false;
    loop {
        ensure!(
            Instant::now() < give_up_at,
            "{operation_id} not settled in 60 s"
        );
        let request = begin_request(
            operation_id,
            &fingerprint,
            owner,
            DELIVERY_LEASE,
            occurred_at,
        );
        let (outcome, _) = caller
            .begin(request)
            .await
            .map_err(|status| anyhow!("{operation_id}: Begin on every replica: {status}"))?;
        // A moment the kill may be waiting for (see the kill's condition).
        changed.send_replace(());
        match outcome {
            BeginOutcome::Acquired { fencing_token, .. } => {
                tally.provider_calls.fetch_add(1, Ordering::SeqCst);
                let reported = match provider
                    .charge(operation_id, &body, Duration::from_millis(800))
                    .await
                {
                    ChargeOutcome::Applied { body, .. } => {
                        caller.complete(operation_id, fencing_token, body).await
                    }
                    ChargeOutcome::Rejected { body, .. } => {
                        bail!("{operation_id}: provider-sim rejected a valid charge: {body}")
                    }
                    ChargeOutcome::Ambiguous { detail } => {
                        saw_ambiguous = true;
                        tally.ambiguous.fetch_add(1, Ordering::SeqCst);
                        tally.ambiguous_unsettled.fetch_add(1, Ordering::SeqCst);
                        tally
                            .ambiguous_ids
                            .lock()
                            .map_err(|_| anyhow!("tally poisoned"))?
                            .insert(operation_id.to_owned());
                        changed.send_replace(());
                        caller
                            .mark_unknown(operation_id, fencing_token, &detail)
                            .await
                    }
                };
                match reported {
                    Ok(()) => {}
                    Err(status) if status.code() == Code::FailedPrecondition => {
                        tally.stale_reports.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(status) => bail!("{operation_id}: report on every replica: {status}"),
                }
            }
            BeginOutcome::Succeeded { .. } => {
                if saw_ambiguous {
                    tally.ambiguous_unsettled.fetch_sub(1, Ordering::SeqCst);
                    changed.send_replace(());
                }
                return Ok(());
            }
            // Another delivery holds the lease, or the reconciler has yet to ask the provider.
            BeginOutcome::InProgress { .. } | BeginOutcome::Unknown { .. } => {
                tokio::time::sleep(Duration::from_millis(150)).await;
            }
            other => bail!("{operation_id}: unexpected {other:?}"),
        }
    }
}

/// This replica's count of UNKNOWN intents its reconciler settled as SUCCEEDED.
async fn resolved_succeeded(replica: &mut Dedup) -> anyhow::Result<f64> {
    let metrics = replica.metrics().await?;
    Ok(metrics
        .lines()
        .find(|line| line.starts_with("eos_dedup_unknown_resolved_total{outcome=\"SUCCEEDED\"}"))
        .and_then(|line| line.split_whitespace().last())
        .and_then(|value| value.parse::<f64>().ok())
        .unwrap_or(0.0))
}

#[tokio::test(flavor = "multi_thread")]
async fn dedup_replicas_ambiguous_provider_stays_exact_when_one_replica_is_killed()
-> anyhow::Result<()> {
    const OPS: usize = 300;
    let db = TestDatabase::create().await?;
    let sim = ProviderSim::spawn(&FAULTS)?;
    let mut replicas = spawn_replicas(
        &db,
        &[
            "--provider-url",
            &sim.url,
            "--reconcile-interval",
            "200ms",
            "--in-flight-window",
            "3s",
        ],
    )?;
    let (cluster, proxy) = connect(&replicas).await?;
    let provider = ProviderClient::new(&sim.url, Duration::from_secs(5), &Default::default())?;
    let tally = Tally::default();
    let (changed, mut watch_tally) = watch::channel(());
    let occurred_at = OffsetDateTime::now_utc();
    let ids: BTreeSet<String> = (0..OPS).map(|i| format!("payments:r-{i:05}")).collect();

    let run = async {
        // Owned here and dropped at the end, so a kill still waiting for its moment gives up.
        let changed = changed;
        let started = Instant::now();
        // Every operation is delivered twice at once, one delivery starting on each replica.
        let deliveries = ids.iter().enumerate().flat_map(|(i, id)| {
            [
                (id, "worker-a", i % REPLICAS),
                (id, "worker-b", (i + 1) % REPLICAS),
            ]
        });
        let results: Vec<anyhow::Result<()>> =
            futures::stream::iter(deliveries)
                .map(|(id, owner, preferred)| {
                    let caller = cluster.caller(preferred);
                    let (provider, tally, changed) = (&provider, &tally, &changed);
                    async move {
                        deliver(&caller, provider, id, owner, occurred_at, tally, changed).await
                    }
                })
                .buffer_unordered(32)
                .collect()
                .await;
        println!(
            "{OPS} operations, 2 deliveries each, in {:?}",
            started.elapsed()
        );
        results.into_iter().collect::<anyhow::Result<Vec<()>>>()
    };
    let kill = async {
        // Once the faults have bitten and answers lost by the provider are still unsettled...
        watch_tally
            .wait_for(|()| {
                tally.ambiguous.load(Ordering::SeqCst) >= OPS / 10
                    && tally.ambiguous_unsettled.load(Ordering::SeqCst) > 0
            })
            .await
            .context("the workload ended before an ambiguous moment to kill in")?;
        let calls = tally.provider_calls.load(Ordering::SeqCst);
        ensure!(
            calls < OPS,
            "the kill must land mid-run (after {calls} of {OPS} provider calls)"
        );
        // ...the victim's own answers are lost too, and it dies once it has acquired for a
        // caller that never heard of it, while an ambiguous operation is still unsettled.
        cluster.drop_answers(VICTIM, &proxy);
        let (unheard, unsettled) = wait_until(
            "the victim acquires unheard while an ambiguous operation is unsettled",
            Duration::from_secs(20),
            || async {
                let unheard = unheard_acquisitions(&db, &cluster, VICTIM).await?;
                let unsettled = tally.ambiguous_unsettled.load(Ordering::SeqCst);
                Ok((!unheard.is_empty() && unsettled > 0).then_some((unheard, unsettled)))
            },
        )
        .await?;
        let in_flight = cluster.kill(VICTIM, &mut replicas[VICTIM])?;
        // Read after the kill: any ambiguous answer counted later arose while only the survivor
        // was up.
        let ambiguous = tally.ambiguous.load(Ordering::SeqCst);
        Ok::<_, anyhow::Error>((calls, unheard, unsettled, ambiguous, in_flight))
    };
    let (run, killed) = tokio::join!(run, kill);
    run?;
    let (calls_at_kill, unheard_at_kill, unsettled_at_kill, ambiguous_at_kill, in_flight_at_kill) =
        killed?;
    let cut = cluster.cut(VICTIM);
    println!(
        "killed replica {VICTIM} after {calls_at_kill} of {OPS} provider calls, having acquired \
         {} unheard, with {unsettled_at_kill} ambiguous operations unsettled and \
         {in_flight_at_kill} calls in flight on it; {cut} calls cut, {} failovers; {} provider \
         calls, {} ambiguous, {} stale reports",
        unheard_at_kill.len(),
        cluster.failovers.load(Ordering::Relaxed),
        tally.provider_calls.load(Ordering::SeqCst),
        tally.ambiguous.load(Ordering::SeqCst),
        tally.stale_reports.load(Ordering::SeqCst),
    );
    ensure!(
        cut > 0,
        "the SIGKILL cut no call in flight, so it proved nothing"
    );

    assert_one_effect_each(&db, &sim, &ids).await?;
    let states: Vec<(String, i64)> =
        sqlx::query_as("SELECT state, count(*) FROM dedup_intents GROUP BY state ORDER BY state")
            .fetch_all(&db.pool)
            .await?;
    assert_eq!(
        states,
        vec![("SUCCEEDED".to_owned(), OPS as i64)],
        "every intent settled, none left UNKNOWN"
    );
    // One acquisition per operation: the unheard ones too, so their callers' retries on the
    // survivor were answered ACQUIRED (otherwise the lease would have run out and the operation
    // been acquired again).
    let acquired = acquisitions(&db).await?;
    let reacquired: Vec<_> = acquired.iter().filter(|(_, a)| a.len() != 1).collect();
    assert!(
        reacquired.is_empty(),
        "acquired more than once: {reacquired:?}"
    );
    assert_eq!(acquired.len(), OPS);

    let ambiguous = tally.ambiguous.load(Ordering::SeqCst);
    assert!(
        ambiguous >= OPS / 5,
        "the faults must bite: {ambiguous} ambiguous answers"
    );
    // Every ambiguous answer was settled from the provider's evidence, not by a second call.
    let ambiguous_ids = tally
        .ambiguous_ids
        .lock()
        .map_err(|_| anyhow!("tally poisoned"))?
        .clone();
    for operation_id in &ambiguous_ids {
        let steps = history(&db, operation_id).await?;
        assert!(
            steps.contains(&step(Some("UNKNOWN"), "SUCCEEDED", 1)),
            "{operation_id}: not settled from UNKNOWN: {steps:?}"
        );
    }
    // The operations that went UNKNOWN after the kill were settled by the survivor's reconciler.
    let survivor_resolved = resolved_succeeded(&mut replicas[SURVIVOR]).await?;
    assert!(
        survivor_resolved >= (ambiguous - ambiguous_at_kill) as f64,
        "the survivor settled {survivor_resolved} UNKNOWNs; {} arose after the kill",
        ambiguous - ambiguous_at_kill
    );
    drop(replicas);
    db.drop_database().await
}
