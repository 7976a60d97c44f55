//! The `provider` target: one charge per event at an external provider (a payment API) that no
//! database transaction can include, made exactly-once by dedup-service's durable intents, though
//! the provider's answer can be lost after it applied the charge (docs/ARCHITECTURE.md
//! "Boundaries").
//!
//! Per event, with operation id = idempotency key = `<name>:<event_id>`:
//! 1. `Begin`. Only `ACQUIRED` allows a provider call; `SUCCEEDED`, a non-retryable `FAILED`,
//!    `CONFLICT` and `EXPIRED` are final and nothing is called; `IN_PROGRESS` and `UNKNOWN` are
//!    waited out (another holder's lease, or the reconciler asking the provider with the same key),
//!    except an `UNKNOWN` the reconciler found stuck for good (older than the provider's key
//!    retention): that event is held (`Settled::Held`, a `sink_held_operations` row) so the
//!    partition moves on; only an operator's Resolve settles it.
//! 2. On `ACQUIRED`: the provider call under `call_timeout`, then `Complete` (applied), `Fail`
//!    (rejected) or `MarkUnknown` (timeout, lost answer, 5xx: it may have been applied). A final
//!    refusal (`Settled::Rejected`) is dead-lettered by the sink as `provider_rejected`.
//! 3. After `MarkUnknown` or a retryable failure: `Begin` again after a backoff until the answer
//!    is final. A retryable `FAILED` (the reconciler found no charge) is re-acquired by `Begin`
//!    and called again with the same key, so the provider applies it at most once.
//!
//! A batch's first round is batched: one `BeginBatch` and one `CompleteBatch` per chunk of events
//! (each item with its event's trace context), the calls in between within each lease; later
//! rounds are single calls. The steps and their answers are the same.
//!
//! The sink checkpoints a batch only after every one of its events is final here, so a crash at
//! any point replays the batch and `Begin` answers what was already done. Giving up (the settle
//! timeout, shutdown) drops the batch uncommitted; nothing is lost, the replay settles it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dedup_client::http_call::{AnswerRules, CallContext, RenderedRequest, RequestTemplate};
use dedup_client::{
    BeginOutcome, BeginParams, ClientCredentials, ClientError, CompleteItem, DedupClient,
    FencingToken,
};
use dedup_client::{ChargeOutcome, ProviderAccess, ProviderClient};
use eos_runtime::backoff::{BackoffBuilder as _, doubling};
use metrics::counter;
use serde_json::Value;
use time::OffsetDateTime;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument as _, debug, warn};
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use crate::call_pacing::CallPacing;
use crate::effect_results::ResultsTable;
use crate::metrics as m;
pub(crate) use crate::provider_target_error::{MAX_TARGET_NAME_BYTES, ProviderTargetError};
use crate::targets::{ProviderCall, ProviderSpec, SecretSource, Source};

/// dedup-service's limit on the items of a batch call.
const BATCH_ITEMS: usize = 1000;
/// Chunks of a batch in their first round at once. A chunk's round ends only when its slowest
/// provider call does (up to the call timeout), while the calls themselves are bounded by the
/// `concurrency` slots: with 4 chunks, a few slow answers per chunk (a provider that delays 2%
/// of its answers past a 1 s timeout delays 73% of 64-item chunks) left most slots idle and the
/// first round near 4 chunks a second. More chunks let the quick calls of the next ones use
/// those slots; the slots still bound the calls (and the connections) in flight.
const CHUNKS_IN_FLIGHT: usize = 16;

/// Why an acquisition is given back uncalled when its lease would end before the call's deadline.
const TOO_LITTLE_LEASE: &str = "too little of the lease was left for the call";
/// Why an acquisition was given back when its batch ended before its call.
const BATCH_ENDING: &str = "the batch ended (a shutdown, or another event's error) before its call";

const FIRST_WAIT: Duration = Duration::from_millis(50);
const MAX_WAIT: Duration = Duration::from_secs(1);

/// One event to charge.
#[derive(Debug, Clone)]
pub(crate) struct EffectItem {
    pub event_id: String,
    pub fingerprint: [u8; 32],
    pub occurred_at: OffsetDateTime,
    /// The request, rendered from the event by the target's template; the same for every attempt
    /// (the provider compares it per key).
    pub request: RenderedRequest,
    /// The trace context of the record's span: the provider span is its child.
    pub parent: opentelemetry::Context,
}

/// The final state of one event at the provider.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Settled {
    /// Charged. `called`: this sink called the provider for it in this batch; otherwise an
    /// earlier attempt had (a replay after a crash: a duplicate suppressed). `result`: the
    /// answer dedup-service keeps for it (the API's, or its look-up's).
    Charged { called: bool, result: Vec<u8> },
    /// The provider refused the charge for good (a 4xx); recorded as FAILED at dedup-service.
    Rejected { reason: String },
    /// The operation id is known with another fingerprint: the event id was reused.
    Conflict { stored_fingerprint: Vec<u8> },
    /// Older than dedup-service's retained window: whether it was charged cannot be told, so it
    /// is not charged (fail closed).
    Expired,
    /// UNKNOWN for good: dedup-service's reconciler found no record at the provider after its key
    /// retention, which proves nothing. Neither charged again nor counted as charged; the sink
    /// holds the event (sink_held_operations) until an operator resolves the intent.
    Held { reason: String },
}

impl Settled {
    pub(crate) fn label(&self) -> &'static str {
        match self {
            Self::Charged { called: true, .. } => "charged",
            Self::Charged { called: false, .. } => "already_charged",
            Self::Rejected { .. } => "rejected",
            Self::Conflict { .. } => "conflict",
            Self::Expired => "expired",
            Self::Held { .. } => "held",
        }
    }
}

/// Reads the target's credential and CA at start-up, so a missing secret stops the sink before
/// it reads a record instead of failing every charge.
fn provider_access(spec: &ProviderSpec) -> Result<ProviderAccess, String> {
    let mut access = ProviderAccess::default();
    if let Some(auth) = &spec.auth {
        let value = match &auth.value_from {
            SecretSource::Env(variable) => std::env::var(variable)
                .ok()
                .filter(|value| !value.trim().is_empty())
                .ok_or_else(|| {
                    format!("provider_auth_env: the environment variable {variable} is not set")
                })?,
            SecretSource::File(path) => {
                eos_runtime::secrets::read_secret_file(path).map_err(|e| e.to_string())?
            }
        };
        access = access.with_credential(&auth.header, value.trim())?;
    }
    if let Some(path) = &spec.ca_file {
        access = access
            .with_ca_file(path)
            .map_err(|e| format!("provider_ca_file {e}"))?;
    }
    Ok(access)
}

/// What one pass over an operation came to.
enum Step {
    Final(Settled),
    /// Not final yet: Begin again after a wait.
    Wait,
}

/// A round's step and the provider calls it made.
struct Round {
    step: Step,
    calls: u32,
}

impl Round {
    /// What a `Begin` answer other than `ACQUIRED` leaves to do, `called_before` calls into the
    /// charge: this round made none.
    fn answered(outcome: BeginOutcome, called_before: u32) -> Self {
        let step = match outcome {
            BeginOutcome::Succeeded { result } => Step::Final(Settled::Charged {
                called: called_before > 0,
                result,
            }),
            BeginOutcome::Failed {
                reason,
                retryable: false,
            } => Step::Final(Settled::Rejected { reason }),
            BeginOutcome::Conflict { stored_fingerprint } => {
                Step::Final(Settled::Conflict { stored_fingerprint })
            }
            BeginOutcome::Expired { .. } => Step::Final(Settled::Expired),
            // Waiting would never end: only an operator's Resolve settles it.
            BeginOutcome::Unknown {
                stuck_reason: Some(reason),
                ..
            } => Step::Final(Settled::Held { reason }),
            // An acquisition is never answered here: it is called.
            BeginOutcome::Acquired { .. }
            | BeginOutcome::Failed {
                retryable: true, ..
            }
            | BeginOutcome::InProgress { .. }
            | BeginOutcome::Unknown { .. } => Step::Wait,
        };
        Self { step, calls: 0 }
    }
}

/// One event's charge: its operation, the request, and the span its calls are made in.
struct Charge {
    operation_id: String,
    params: BeginParams,
    request: RenderedRequest,
    span: tracing::Span,
}

/// A batched round's provider call: applied (to be completed in the batch), or done with.
enum Called {
    Applied(FencingToken, Vec<u8>),
    Done(Round),
}

#[derive(Debug, Clone)]
pub(crate) struct ProviderTarget {
    spec: ProviderSpec,
    dedup: DedupClient,
    provider: ProviderClient,
    /// How a request is built from an event: provider-sim's `POST /charges` for this target
    /// kind (docs/sink-writer.md).
    template: RequestTemplate,
    /// How the provider's answers are sorted.
    answers: AnswerRules,
    owner: String,
    /// `concurrency` slots, shared by the target's clones: one is held while an event's round
    /// (`Begin`, and the call with its report) runs, never while it waits for an outcome to
    /// settle.
    rounds: Arc<Semaphore>,
    /// `rate_limit` and the API's `Retry-After`, shared by the target's clones.
    pacing: Arc<CallPacing>,
    /// `[targets.results]`, checked against the database (`with_results`).
    results: Option<Arc<ResultsTable>>,
}

impl ProviderTarget {
    /// Connects lazily: a dedup-service or provider that is down now is retried per batch.
    pub(crate) fn new(
        spec: ProviderSpec,
        owner: String,
        dedup_credentials: &ClientCredentials,
    ) -> Result<Self, ProviderTargetError> {
        check_name(&spec.name)?;
        let dedup = DedupClient::connect_lazy_with(&spec.dedup_url, dedup_credentials).map_err(
            |source| ProviderTargetError::DedupUrl {
                target: spec.name.clone(),
                source,
            },
        )?;
        let access = provider_access(&spec).map_err(|detail| ProviderTargetError::Access {
            target: spec.name.clone(),
            detail,
        })?;
        let (template, answers) =
            call_template(&spec).map_err(|detail| ProviderTargetError::Access {
                target: spec.name.clone(),
                detail,
            })?;
        // The client's base only serves provider-sim's lookups; every call sends its rendered
        // URL whole.
        let provider = ProviderClient::new(template.origin(), spec.call_timeout, &access).map_err(
            |source| ProviderTargetError::Url {
                target: spec.name.clone(),
                source,
            },
        )?;
        Ok(Self {
            rounds: Arc::new(Semaphore::new(spec.concurrency)),
            pacing: Arc::new(CallPacing::new(spec.rate_limit.map(f64::from))),
            spec,
            dedup,
            provider,
            template,
            answers,
            owner,
            results: None,
        })
    }

    /// The target writing each success's answer to `results` (its `[targets.results]`).
    pub(crate) fn with_results(mut self, results: ResultsTable) -> Self {
        self.results = Some(Arc::new(results));
        self
    }

    /// Where each success's answer is written, if anywhere.
    pub(crate) fn results(&self) -> Option<&ResultsTable> {
        self.results.as_deref()
    }

    pub(crate) fn spec(&self) -> &ProviderSpec {
        &self.spec
    }

    pub(crate) fn name(&self) -> &str {
        &self.spec.name
    }

    /// The request for `event`, by the target's template (for a charge: the amount, an integer
    /// at the spec's source, and the event it is for). Deterministic per event, so every attempt
    /// with the same key sends the same request; `Err` names what the event lacks (a dead letter).
    pub(crate) fn request(
        &self,
        event: &crate::mapping::DecodedEvent,
    ) -> Result<RenderedRequest, String> {
        if let ProviderCall::Charges { amount } = &self.spec.call {
            let pointer = amount_pointer(amount);
            if event.raw.pointer(pointer).and_then(Value::as_i64).is_none() {
                return Err(format!(
                    "provider target {}: no integer amount at {pointer}",
                    self.spec.name
                ));
            }
        }
        self.template
            .render(&CallContext {
                target: &self.spec.name,
                event_id: event.event_id.as_str(),
                entity_id: event.entity_id.as_str(),
                event: &event.raw,
            })
            .map_err(|detail| format!("provider target {}: {detail}", self.spec.name))
    }

    /// Drives every item to a final state; answers in item order. An error means the batch must
    /// not be checkpointed (and is retried from the checkpoint).
    ///
    /// Each chunk of `concurrency` items (at most `BATCH_ITEMS`) has a batched first round
    /// (`ProviderTarget::chunk_round`): one `BeginBatch` and one `CompleteBatch` instead of a
    /// call each, the provider calls in between; `CHUNKS_IN_FLIGHT` chunks are in it at once.
    /// An item that is not final after it goes on by itself (`ProviderTarget::settle_one`)
    /// as soon as its chunk's round ends, not after every chunk's: the settle timeout counts from
    /// there, so a large batch's later chunks do not find it spent before they start. At most
    /// `concurrency` items are in a round with dedup-service and the provider at any moment. An
    /// event waiting for its outcome (a lost answer that the reconciler settles after the
    /// in-flight window, another holder's lease) holds no slot meanwhile: a slot per waiting
    /// event made the few slow events of a batch hold most of the slots, and the whole batch
    /// then waited on them in turn.
    pub(crate) async fn settle(
        &self,
        items: Vec<EffectItem>,
        shutdown: &CancellationToken,
    ) -> Result<Vec<Settled>, ProviderTargetError> {
        let charges: Vec<Charge> = items.into_iter().map(|item| self.charge(item)).collect();
        let chunk = self.spec.concurrency.clamp(1, BATCH_ITEMS);
        // Ends the batch's rounds on shutdown or on the first error: each gives back what it
        // acquired and has not called, instead of being dropped between its Begin and its call.
        let stop = shutdown.child_token();
        let stop = &stop;
        // FIFO: the chunks enter their first round in batch order.
        let first_rounds = Semaphore::new(CHUNKS_IN_FLIGHT);
        let chunks = charges.chunks(chunk).map(|chunk| {
            let first_rounds = &first_rounds;
            async move {
                let firsts = {
                    let Ok(_turn) = first_rounds.acquire().await else {
                        return Err(self.cancelled());
                    };
                    ending_on_error(stop, self.chunk_round(chunk, stop)).await?
                };
                let give_up_at = Instant::now() + self.spec.settle_timeout;
                all_ok(
                    futures::future::join_all(chunk.iter().zip(firsts).map(|(charge, first)| {
                        ending_on_error(stop, self.settle_one(charge, first, give_up_at, stop))
                    }))
                    .await,
                )
            }
        });
        let result = all_ok(futures::future::join_all(chunks).await)
            .map(|settled| settled.into_iter().flatten().collect());
        if let Err(ProviderTargetError::Unsettled { .. }) = &result {
            counter!(m::PROVIDER_UNSETTLED, "target" => self.spec.name.clone()).increment(1);
        }
        result
    }

    fn charge(&self, item: EffectItem) -> Charge {
        let operation_id = self.spec.operation_id(&item.event_id);
        let span = tracing::info_span!(
            "sink-writer provider",
            otel.name = "sink-writer provider charge",
            otel.kind = "client",
            event_id = %item.event_id,
            eos.target = %self.spec.name,
            eos.operation_id = %operation_id,
            eos.outcome = tracing::field::Empty,
            eos.provider_calls = tracing::field::Empty,
        );
        let _ = span.set_parent(item.parent.clone());
        let params = BeginParams {
            operation_id: operation_id.clone(),
            fingerprint: item.fingerprint.to_vec(),
            owner: self.owner.clone(),
            occurred_at: item.occurred_at,
            lease_ttl: Some(self.spec.lease_ttl),
        };
        Charge {
            operation_id,
            params,
            request: item.request,
            span,
        }
    }

    /// One chunk's first round, batched: one `BeginBatch`, the provider calls its acquisitions
    /// allow, and one `CompleteBatch` for the calls applied. Each item carries its charge span's
    /// context, so dedup-service answers it in its event's trace. A refused or unknown call is
    /// reported by itself (`Fail`, `MarkUnknown`: rare, and the single calls say it in the
    /// event's trace), and a batch item that cannot be completed is completed by itself, as the
    /// single path would.
    async fn chunk_round(
        &self,
        charges: &[Charge],
        shutdown: &CancellationToken,
    ) -> Result<Vec<Round>, ProviderTargetError> {
        if shutdown.is_cancelled() {
            return Err(self.cancelled());
        }
        let begins: Vec<(BeginParams, opentelemetry::Context)> = charges
            .iter()
            .map(|charge| (charge.params.clone(), charge.span.context()))
            .collect();
        let begun = Instant::now();
        let outcomes = self
            .dedup
            .begin_batch(&begins)
            .await
            .map_err(|source| self.dedup_error(source))?;
        let calls = charges
            .iter()
            .zip(outcomes)
            .map(|(charge, outcome)| self.first_call(charge, outcome, begun, shutdown));
        let called: Vec<Result<Called, ProviderTargetError>> =
            futures::future::join_all(calls.map(|call| ending_on_error(shutdown, call))).await;
        // Completed even when the batch ends: an applied call left unreported would expire
        // into UNKNOWN, which a `none` target holds for an operator.
        let applied: Vec<CompleteItem> = charges
            .iter()
            .zip(&called)
            .filter_map(|(charge, called)| match called {
                Ok(Called::Applied(fencing_token, body)) => Some(CompleteItem {
                    operation_id: charge.operation_id.clone(),
                    fencing_token: *fencing_token,
                    result: body.clone(),
                    trace: charge.span.context(),
                }),
                _ => None,
            })
            .collect();
        let mut completed = if applied.is_empty() {
            Vec::new()
        } else {
            self.dedup
                .complete_batch(&applied)
                .await
                .map_err(|source| self.dedup_error(source))?
        }
        .into_iter();
        let called = all_ok(called)?;
        let mut rounds = Vec::with_capacity(charges.len());
        for (charge, called) in charges.iter().zip(called) {
            let round = match called {
                Called::Done(round) => round,
                Called::Applied(fencing_token, body) => {
                    let step = match completed.next() {
                        Some(Ok(_)) => Step::Final(Settled::Charged {
                            called: true,
                            result: body,
                        }),
                        Some(Err(error)) if error.is_failed_precondition() => {
                            self.reported(&charge.operation_id, Err(error))?
                        }
                        // Whatever else the item was answered, the single call answers it
                        // again, with its retries and its errors.
                        Some(Err(_)) | None => {
                            self.complete(&charge.operation_id, fencing_token, body)
                                .instrument(charge.span.clone())
                                .await?
                        }
                    };
                    Round { step, calls: 1 }
                }
            };
            rounds.push(round);
        }
        Ok(rounds)
    }

    /// How long the lease lasts from the Begin: the one asked for, or less if the service's
    /// answer says so (it caps leases at its --max-lease-ttl).
    fn lease_left(&self, lease_expires_at: OffsetDateTime) -> Duration {
        let answered = (lease_expires_at - OffsetDateTime::now_utc())
            .try_into()
            .unwrap_or(Duration::ZERO);
        self.spec.lease_ttl.min(answered)
    }

    /// The first round's call of one charge, after its `Begin` in the batch answered `outcome`
    /// (`begun`: when it was sent): the provider is called only for an acquisition, with a
    /// slot, at its turn and with enough of the lease left; an applied call is completed with
    /// the batch's `CompleteBatch`.
    async fn first_call(
        &self,
        charge: &Charge,
        outcome: BeginOutcome,
        begun: Instant,
        shutdown: &CancellationToken,
    ) -> Result<Called, ProviderTargetError> {
        counter!(m::PROVIDER_BEGINS, "target" => self.spec.name.clone(), "answer" => outcome.label())
            .increment(1);
        let BeginOutcome::Acquired {
            fencing_token,
            lease_expires_at,
        } = outcome
        else {
            return Ok(Called::Done(Round::answered(outcome, 0)));
        };
        let lease_ends = begun + self.lease_left(lease_expires_at);
        let Ok(_slot) = self.rounds.acquire().await else {
            return Err(self.cancelled());
        };
        self.wait_turn(&charge.operation_id, fencing_token, shutdown)
            .instrument(charge.span.clone())
            .await?;
        // The protocol calls the provider only within the lease, with its deadline inside it: a
        // lease that ran out may already be the reconciler's (a long wait for the slot or the
        // turn gives the acquisition back).
        if Instant::now() + self.spec.call_timeout >= lease_ends {
            let step = self
                .release(&charge.operation_id, fencing_token, TOO_LITTLE_LEASE)
                .instrument(charge.span.clone())
                .await?;
            return Ok(Called::Done(Round { step, calls: 0 }));
        }
        let outcome = self
            .call(&charge.request)
            .instrument(charge.span.clone())
            .await;
        match outcome {
            ChargeOutcome::Applied { body, .. } => Ok(Called::Applied(fencing_token, body)),
            other => {
                let step = self
                    .report(&charge.operation_id, fencing_token, other)
                    .instrument(charge.span.clone())
                    .await?;
                Ok(Called::Done(Round { step, calls: 1 }))
            }
        }
    }

    /// Rounds after the first, one at a time, until the outcome is final.
    async fn settle_one(
        &self,
        charge: &Charge,
        first: Round,
        give_up_at: Instant,
        shutdown: &CancellationToken,
    ) -> Result<Settled, ProviderTargetError> {
        let work = async {
            let mut waits = doubling(FIRST_WAIT, MAX_WAIT).with_jitter().build();
            let Round {
                mut step,
                mut calls,
            } = first;
            loop {
                if let Step::Final(settled) = step {
                    charge.span.record("eos.outcome", settled.label());
                    charge.span.record("eos.provider_calls", calls);
                    counter!(m::PROVIDER_EFFECTS, "target" => self.spec.name.clone(), "outcome" => settled.label())
                        .increment(1);
                    return Ok(settled);
                }
                if Instant::now() >= give_up_at {
                    return Err(ProviderTargetError::Unsettled {
                        target: self.spec.name.clone(),
                        operation_id: charge.operation_id.clone(),
                        timeout: self.spec.settle_timeout,
                    });
                }
                let wait = waits.next().unwrap_or(MAX_WAIT);
                tokio::select! {
                    () = shutdown.cancelled() => return Err(self.cancelled()),
                    () = tokio::time::sleep(wait) => {}
                }
                let round = self.round(charge, calls, shutdown).await?;
                step = round.step;
                calls += round.calls;
            }
        };
        work.instrument(charge.span.clone()).await
    }

    /// One `Begin` and, if it acquires, the provider call and its report; `called_before` calls
    /// into the charge.
    async fn round(
        &self,
        charge: &Charge,
        called_before: u32,
        shutdown: &CancellationToken,
    ) -> Result<Round, ProviderTargetError> {
        let Ok(_slot) = self.rounds.acquire().await else {
            return Err(self.cancelled());
        };
        if shutdown.is_cancelled() {
            return Err(self.cancelled());
        }
        let begun = Instant::now();
        let outcome = self
            .dedup
            .begin(&charge.params)
            .await
            .map_err(|source| self.dedup_error(source))?;
        counter!(m::PROVIDER_BEGINS, "target" => self.spec.name.clone(), "answer" => outcome.label())
            .increment(1);
        let BeginOutcome::Acquired {
            fencing_token,
            lease_expires_at,
        } = outcome
        else {
            return Ok(Round::answered(outcome, called_before));
        };
        // Only a call waits for its turn: an answered Begin (a replay after a crash) takes none.
        self.wait_turn(&charge.operation_id, fencing_token, shutdown)
            .await?;
        if Instant::now() + self.spec.call_timeout >= begun + self.lease_left(lease_expires_at) {
            let step = self
                .release(&charge.operation_id, fencing_token, TOO_LITTLE_LEASE)
                .await?;
            return Ok(Round { step, calls: 0 });
        }
        let outcome = self.call(&charge.request).await;
        let step = self
            .report(&charge.operation_id, fencing_token, outcome)
            .await?;
        Ok(Round { step, calls: 1 })
    }

    /// Waits for the target's next call moment (`rate_limit`, a `Retry-After`), counting the
    /// calls that waited. The batch's end (a shutdown, another event's error) before or during
    /// the wait gives the acquisition back uncalled, so it is acquired again at once, not left to
    /// expire into UNKNOWN.
    async fn wait_turn(
        &self,
        operation_id: &str,
        fencing_token: FencingToken,
        shutdown: &CancellationToken,
    ) -> Result<(), ProviderTargetError> {
        tokio::select! {
            biased;
            () = shutdown.cancelled() => {
                self.release(operation_id, fencing_token, BATCH_ENDING)
                    .await?;
                Err(self.cancelled())
            }
            waited = self.pacing.wait_turn() => {
                if !waited.is_zero() {
                    counter!(m::PROVIDER_PACED_CALLS, "target" => self.spec.name.clone())
                        .increment(1);
                }
                Ok(())
            }
        }
    }

    /// The one provider call an `ACQUIRED` allows. A `Retry-After` on its answer pauses the
    /// target's calls.
    async fn call(&self, request: &RenderedRequest) -> ChargeOutcome {
        let answer = self
            .provider
            .send(request, &self.answers, self.spec.call_timeout)
            .await;
        if let Some(retry_after) = answer.retry_after {
            debug!(target_name = %self.spec.name, ?retry_after, "the API asked for a pause");
            self.pacing.pause_for(retry_after);
            counter!(m::PROVIDER_PAUSES, "target" => self.spec.name.clone()).increment(1);
        }
        let outcome = answer.outcome;
        let label = match &outcome {
            ChargeOutcome::Applied { .. } => "applied",
            ChargeOutcome::Rejected { .. } => "rejected",
            ChargeOutcome::Ambiguous { .. } => "ambiguous",
        };
        counter!(m::PROVIDER_CALLS, "target" => self.spec.name.clone(), "outcome" => label)
            .increment(1);
        outcome
    }

    /// The report of a call's outcome to dedup-service, and what it leaves to do.
    async fn report(
        &self,
        operation_id: &str,
        fencing_token: FencingToken,
        outcome: ChargeOutcome,
    ) -> Result<Step, ProviderTargetError> {
        let reported = match outcome {
            ChargeOutcome::Applied { body, .. } => {
                return self.complete(operation_id, fencing_token, body).await;
            }
            ChargeOutcome::Rejected {
                status,
                body,
                retryable,
            } => {
                let reason = format!("provider answered {status}: {body}");
                self.dedup
                    .fail(operation_id, fencing_token, &reason, retryable)
                    .await
                    .map(|_| {
                        if retryable {
                            Step::Wait
                        } else {
                            Step::Final(Settled::Rejected { reason })
                        }
                    })
            }
            ChargeOutcome::Ambiguous { detail } => {
                debug!(
                    operation_id,
                    detail, "provider outcome unknown; marked for reconciliation"
                );
                self.dedup
                    .mark_unknown(operation_id, fencing_token, &detail)
                    .await
                    .map(|_| Step::Wait)
            }
        };
        self.reported(operation_id, reported)
    }

    async fn complete(
        &self,
        operation_id: &str,
        fencing_token: FencingToken,
        result: Vec<u8>,
    ) -> Result<Step, ProviderTargetError> {
        let reported = self
            .dedup
            .complete(operation_id, fencing_token, result.clone())
            .await
            .map(|_| {
                Step::Final(Settled::Charged {
                    called: true,
                    result,
                })
            });
        self.reported(operation_id, reported)
    }

    /// Gives back an acquisition that was not called, as a retryable failure: the next Begin
    /// acquires it again at once instead of after the lease and a reconciliation.
    async fn release(
        &self,
        operation_id: &str,
        fencing_token: FencingToken,
        why: &str,
    ) -> Result<Step, ProviderTargetError> {
        let reported = self
            .dedup
            .fail(
                operation_id,
                fencing_token,
                &format!("not called: {why}"),
                true,
            )
            .await
            .map(|_| Step::Wait);
        self.reported(operation_id, reported)
    }

    fn reported(
        &self,
        operation_id: &str,
        reported: Result<Step, ClientError>,
    ) -> Result<Step, ProviderTargetError> {
        match reported {
            Ok(step) => Ok(step),
            // Our lease ran out and a newer holder (or the reconciler) took over: Begin tells
            // what became of it.
            Err(error) if error.is_failed_precondition() => {
                warn!(operation_id, %error, "report refused: a newer holder owns the operation");
                Ok(Step::Wait)
            }
            Err(source) => Err(self.dedup_error(source)),
        }
    }

    fn cancelled(&self) -> ProviderTargetError {
        ProviderTargetError::Cancelled {
            target: self.spec.name.clone(),
        }
    }

    fn dedup_error(&self, source: ClientError) -> ProviderTargetError {
        ProviderTargetError::Dedup {
            target: self.spec.name.clone(),
            source,
        }
    }
}

/// Refuses at start-up a name that would make some operation ids too long.
pub(crate) fn check_name(name: &str) -> Result<(), ProviderTargetError> {
    if name.len() > MAX_TARGET_NAME_BYTES {
        return Err(ProviderTargetError::NameTooLong {
            target: name.to_owned(),
            len: name.len(),
        });
    }
    Ok(())
}

/// Where the amount is: the spec's pointer, or the ledger's `value` (any event may carry one).
fn amount_pointer(amount: &Source) -> &str {
    match amount {
        Source::Pointer(pointer) => pointer,
        _ => "/value",
    }
}

/// The target's request template and answer rules: provider-sim's API (`POST
/// {provider_url}/charges` with the amount and the event it is for, keyed `<target>:<event_id>`,
/// sorted by the default rules), or an `http` target's own.
fn call_template(spec: &ProviderSpec) -> Result<(RequestTemplate, AnswerRules), String> {
    match &spec.call {
        ProviderCall::Charges { amount } => Ok((
            RequestTemplate::provider_charges(&spec.provider_url, amount_pointer(amount))?,
            AnswerRules::default(),
        )),
        ProviderCall::Http(call) => Ok((call.template()?, call.answers.clone())),
    }
}

/// `work`, cancelling `stop` when it fails, so its siblings end too (each giving back what it
/// acquired) rather than being dropped mid-round.
async fn ending_on_error<T>(
    stop: &CancellationToken,
    work: impl Future<Output = Result<T, ProviderTargetError>>,
) -> Result<T, ProviderTargetError> {
    let result = work.await;
    if result.is_err() {
        stop.cancel();
    }
    result
}

/// Every value, or the error that ended the batch: the first that is not the cancellation
/// it caused in the others.
fn all_ok<T>(results: Vec<Result<T, ProviderTargetError>>) -> Result<Vec<T>, ProviderTargetError> {
    let mut values = Vec::with_capacity(results.len());
    let mut error: Option<ProviderTargetError> = None;
    for result in results {
        match result {
            Ok(value) => values.push(value),
            Err(other) => {
                let cancelled =
                    |e: &ProviderTargetError| matches!(e, ProviderTargetError::Cancelled { .. });
                if error
                    .as_ref()
                    .is_none_or(|kept| cancelled(kept) && !cancelled(&other))
                {
                    error = Some(other);
                }
            }
        }
    }
    error.map_or(Ok(values), Err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider_target_error::MAX_OPERATION_ID_BYTES;

    #[test]
    fn every_settled_label_is_registered_at_zero() {
        let settled = [
            Settled::Charged {
                called: true,
                result: Vec::new(),
            },
            Settled::Charged {
                called: false,
                result: Vec::new(),
            },
            Settled::Rejected {
                reason: String::new(),
            },
            Settled::Conflict {
                stored_fingerprint: Vec::new(),
            },
            Settled::Expired,
            Settled::Held {
                reason: String::new(),
            },
        ];
        for outcome in settled {
            assert!(
                m::PROVIDER_EFFECT_OUTCOMES.contains(&outcome.label()),
                "{outcome:?}"
            );
        }
    }

    fn spec(amount: Source) -> ProviderSpec {
        ProviderSpec {
            name: "payments".into(),
            dedup_url: "http://127.0.0.1:50051".into(),
            provider_url: "http://127.0.0.1:8081".into(),
            call: ProviderCall::Charges { amount },
            call_timeout: Duration::from_secs(2),
            lease_ttl: Duration::from_secs(30),
            concurrency: 4,
            rate_limit: None,
            settle_timeout: Duration::from_secs(60),
            auth: None,
            ca_file: None,
            results: None,
        }
    }

    #[tokio::test]
    async fn a_missing_credential_stops_the_target_at_start_up_without_printing_it() {
        let mut with_auth = spec(Source::Value);
        with_auth.auth = Some(crate::targets::ProviderAuth {
            header: "Authorization".into(),
            value_from: SecretSource::File("/nonexistent/provider-credential".into()),
        });
        let error = ProviderTarget::new(with_auth.clone(), "owner".into(), &Default::default())
            .expect_err("missing file")
            .to_string();
        assert!(
            error.contains("/nonexistent/provider-credential"),
            "{error}"
        );

        let file = std::env::temp_dir().join(format!("eos-provider-auth-{}", std::process::id()));
        std::fs::write(&file, "Bearer MARKER-SECRET\n").expect("write");
        with_auth.auth = Some(crate::targets::ProviderAuth {
            header: "Authorization".into(),
            value_from: SecretSource::File(file.clone()),
        });
        let target = ProviderTarget::new(with_auth, "owner".into(), &Default::default())
            .expect("credential read");
        assert!(!format!("{target:?}").contains("MARKER-SECRET"));
        std::fs::remove_file(&file).expect("cleanup");
    }

    fn event(json: &str) -> crate::mapping::DecodedEvent {
        crate::mapping::decode(
            &crate::mapping::InputRecord {
                topic: "t".into(),
                partition: 0,
                offset: 0,
                key: None,
                payload: Some(json.as_bytes().to_vec()),
                headers: Vec::new(),
                timestamp_ms: None,
                decoded: None,
            },
            &crate::mapping::EventFormat::ledger(),
        )
        .expect("a valid envelope")
    }

    fn target(amount: Source) -> ProviderTarget {
        ProviderTarget::new(spec(amount), "owner".into(), &Default::default()).expect("a target")
    }

    /// The body as JSON.
    fn body(request: &RenderedRequest) -> Value {
        serde_json::from_slice(request.body.as_deref().unwrap_or_default()).expect("JSON")
    }

    #[tokio::test]
    async fn the_request_is_a_charge_of_the_amount_for_the_event_keyed_by_target_and_id() {
        let e =
            event(r#"{"event_id":"e-1","entity_id":"a-7","value":1250,"payload":{"cents":99}}"#);
        let request = target(Source::Value).request(&e).expect("a request");
        assert_eq!(
            (request.method.as_str(), request.url.as_str()),
            ("POST", "http://127.0.0.1:8081/charges")
        );
        assert_eq!(request.headers["idempotency-key"], "payments:e-1");
        assert_eq!(
            body(&request),
            serde_json::json!({"amount": 1250, "event_id": "e-1", "entity_id": "a-7"})
        );
        let request = target(Source::Pointer("/payload/cents".into()))
            .request(&e)
            .expect("a request");
        assert_eq!(body(&request)["amount"], 99);
    }

    #[tokio::test]
    async fn a_missing_amount_is_refused_naming_the_pointer() {
        let e = event(r#"{"event_id":"e-1","entity_id":"a-7","value":1,"payload":{"cents":"x"}}"#);
        let error = target(Source::Pointer("/payload/cents".into()))
            .request(&e)
            .expect_err("not an integer");
        assert!(error.contains("/payload/cents"), "{error}");
    }

    #[test]
    fn a_name_too_long_for_operation_ids_is_refused_at_start_up() {
        assert_eq!(MAX_TARGET_NAME_BYTES, 127);
        assert!(check_name(&"n".repeat(127)).is_ok());
        // The longest name with the longest event id is exactly dedup-service's limit.
        let longest = format!(
            "{}:{}",
            "n".repeat(127),
            "e".repeat(eos_core::envelope::MAX_ID_BYTES)
        );
        assert_eq!(longest.len(), MAX_OPERATION_ID_BYTES);
        let mut long = spec(Source::Value);
        long.name = "n".repeat(128);
        let error =
            ProviderTarget::new(long, "owner".into(), &Default::default()).expect_err("too long");
        let message = error.to_string();
        assert!(matches!(
            error,
            ProviderTargetError::NameTooLong { len: 128, .. }
        ));
        assert!(message.contains("128 bytes, at most 127"), "{message}");
    }

    #[test]
    fn labels_tell_a_new_charge_from_a_replayed_one() {
        let charged = |called| Settled::Charged {
            called,
            result: Vec::new(),
        };
        assert_eq!(charged(true).label(), "charged");
        assert_eq!(charged(false).label(), "already_charged");
        assert_eq!(Settled::Expired.label(), "expired");
        assert_eq!(
            Settled::Held {
                reason: "stuck".into()
            }
            .label(),
            "held"
        );
    }
}
