//! The `eos.dedup.v1.Dedup` service: validates, calls the store, converts. Every handler runs in
//! a span whose parent is the trace context of the request's gRPC metadata, and every error
//! becomes a `tonic::Status` in `respond` (via `From<DedupError>`), nowhere else. An item of a
//! batch that carries its own trace context also gets a span of its own in that trace
//! (`item_spans`): a batch's items are different events.

use std::collections::HashMap;
use std::future::Future;
use std::time::Instant;

use eos_proto::dedup::v1 as pb;
use eos_proto::dedup::v1::dedup_server::Dedup;
use eos_runtime::trace_context::{event_id_in, extract_fields, extract_grpc, stored_span_context};
use opentelemetry::trace::TraceContextExt as _;
use tonic::{Code, Request, Response, Status};
use tracing::Instrument as _;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use crate::auth::Role;
use crate::error::DedupError;
use crate::group_commit::{GroupCommit, GroupCommitSettings};
use crate::intent_store::{BeginAnswer, HolderReport, IntentStore};
use crate::validation::{self, LeaseLimits};
use crate::write_watch::WriteWatch;
use dedup_client::proto_convert;
use dedup_client::state_machine::BeginOutcome;

use crate::metrics;

#[derive(Debug, Clone)]
pub(crate) struct DedupApi {
    store: IntentStore,
    limits: LeaseLimits,
    /// Single Begin and Complete calls go through it when grouping is on
    /// (`--group-commit-max-calls` above 1); batches and the other calls never do.
    groups: Option<GroupCommit>,
    /// Every write is told to it, grouped or not (`write_watch.rs`).
    writes: WriteWatch,
}

impl DedupApi {
    /// Starts the group commit's dispatchers when `groups` turns grouping on: call it inside the
    /// tokio runtime.
    pub(crate) fn new(
        store: IntentStore,
        limits: LeaseLimits,
        (groups, writes): (GroupCommitSettings, WriteWatch),
    ) -> Self {
        let groups = groups
            .enabled()
            .then(|| GroupCommit::start(store.clone(), groups, writes.clone()));
        Self {
            store,
            limits,
            groups,
            writes,
        }
    }
}

/// The request span: built first, parented on the caller's trace, then entered by
/// `.instrument` (setting the parent inside an entered span would start a new trace). `event_id`
/// comes from the caller's baggage (absent for callers that send none, e.g. the reconciler's).
fn rpc_span<T>(method: &'static str, request: &Request<T>) -> tracing::Span {
    method_span(method, extract_grpc(request.metadata()))
}

fn method_span(method: &'static str, parent: opentelemetry::Context) -> tracing::Span {
    let span = tracing::info_span!(
        "dedup.rpc",
        otel.name = %format_args!("eos.dedup.v1.Dedup/{method}"),
        otel.kind = "server",
        rpc.system = "grpc",
        rpc.service = "eos.dedup.v1.Dedup",
        rpc.method = method,
        event_id = tracing::field::Empty,
        operation_id = tracing::field::Empty,
        items = tracing::field::Empty,
    );
    if let Some(event_id) = event_id_in(&parent) {
        span.record("event_id", event_id);
    }
    let _ = span.set_parent(parent);
    span
}

/// A span for each item of a batch call (`method`) that carries its own trace context, as a
/// child of it; `None` for an item without one (it is in the call's trace). The spans end when
/// they are dropped, after the batch is answered.
fn item_spans<'a>(
    method: &'static str,
    items: impl Iterator<Item = (&'a str, &'a HashMap<String, String>)>,
) -> Vec<Option<(tracing::Span, opentelemetry::Context)>> {
    items
        .map(|(operation_id, fields)| {
            if fields.is_empty() {
                return None;
            }
            let parent = extract_fields(fields);
            if !parent.span().span_context().is_valid() {
                return None;
            }
            let span = method_span(method, parent.clone());
            span.record("operation_id", operation_id);
            Some((span, parent))
        })
        .collect()
}

/// Runs a handler in its span, records its duration, and turns its error into a `Status`.
async fn respond<T>(
    method: &'static str,
    span: tracing::Span,
    handler: impl Future<Output = Result<T, DedupError>>,
) -> Result<Response<T>, Status> {
    let started = Instant::now();
    let result = handler.instrument(span.clone()).await;
    ::metrics::histogram!(metrics::RPC_SECONDS, "method" => method)
        .record(started.elapsed().as_secs_f64());
    match result {
        Ok(message) => Ok(Response::new(message)),
        Err(error) => {
            let status = Status::from(error);
            ::metrics::counter!(metrics::RPC_ERRORS, "method" => method, "code" => format!("{:?}", status.code()))
                .increment(1);
            span.in_scope(|| {
                tracing::debug!(code = ?status.code(), message = status.message(), "rejected");
            });
            Err(status)
        }
    }
}

fn record_answers(answers: &[BeginAnswer]) {
    for answer in answers {
        ::metrics::counter!(metrics::BEGIN_OUTCOMES, "outcome" => answer.outcome.label())
            .increment(1);
        if answer.expired_lease_now {
            ::metrics::counter!(metrics::LEASES_EXPIRED).increment(1);
            ::metrics::counter!(metrics::UNKNOWN_ARRIVALS).increment(1);
        }
        if matches!(answer.outcome, BeginOutcome::Conflict { .. }) {
            ::metrics::counter!(metrics::CONFLICTS).increment(1);
            tracing::warn!(
                operation_id = %answer.operation_id,
                "same operation id with another fingerprint: answered CONFLICT"
            );
        }
    }
}

impl DedupApi {
    async fn begin_items(
        &self,
        items: Vec<validation::BeginItem>,
    ) -> Result<Vec<pb::BeginResponse>, DedupError> {
        let answers = self
            .writes
            .watched("a Begin statement", self.store.begin_batch(&items))
            .await?;
        record_answers(&answers);
        Ok(answers
            .into_iter()
            .map(|answer| proto_convert::begin_response(answer.operation_id, answer.outcome))
            .collect())
    }

    async fn report(
        &self,
        operation_id: String,
        fencing_token: i64,
        fencing_secret: Vec<u8>,
        report: HolderReport,
    ) -> Result<pb::IntentResponse, DedupError> {
        validation::operation_id(&operation_id, "operation_id")?;
        validation::fencing_token(fencing_token, "fencing_token")?;
        let transition = report.transition();
        let intent = self
            .writes
            .watched(
                "a holder's report (Complete, Fail, MarkUnknown)",
                self.store
                    .report(&operation_id, fencing_token, &fencing_secret, report),
            )
            .await?;
        ::metrics::counter!(metrics::REPORTS, "transition" => transition.verb()).increment(1);
        Ok(pb::IntentResponse {
            intent: Some(proto_convert::intent(intent)),
        })
    }

    /// The intents as answers, each UNKNOWN one with the reconciler's stuck verdict on its
    /// current attempt, if any: an operator reading Get or ListUnknown sees why no Begin will
    /// settle it.
    async fn with_stuck_reasons(
        &self,
        intents: Vec<dedup_client::state_machine::Intent>,
    ) -> Result<Vec<pb::Intent>, DedupError> {
        let unknown: Vec<String> = intents
            .iter()
            .filter(|intent| intent.state == dedup_client::state_machine::IntentState::Unknown)
            .map(|intent| intent.operation_id.clone())
            .collect();
        let mut stuck = self.store.stuck_reasons(&unknown).await?;
        Ok(intents
            .into_iter()
            .map(|intent| {
                let reason = stuck.remove(&intent.operation_id);
                let mut answer = proto_convert::intent(intent);
                answer.stuck_reason = reason.unwrap_or_default();
                answer
            })
            .collect())
    }
}

#[tonic::async_trait]
impl Dedup for DedupApi {
    async fn begin(
        &self,
        request: Request<pb::BeginRequest>,
    ) -> Result<Response<pb::BeginResponse>, Status> {
        let span = rpc_span("Begin", &request);
        span.record("operation_id", request.get_ref().operation_id.as_str());
        let trace_context = stored_span_context(&span, &extract_grpc(request.metadata()));
        let request = request.into_inner();
        respond("Begin", span, async move {
            let mut item = validation::begin_item(request, "", self.limits)?;
            item.trace_context = trace_context;
            if let Some(groups) = &self.groups {
                let answer = groups.begin(item).await?;
                record_answers(std::slice::from_ref(&answer));
                return Ok(proto_convert::begin_response(
                    answer.operation_id,
                    answer.outcome,
                ));
            }
            let mut answers = self.begin_items(vec![item]).await?;
            answers
                .pop()
                .ok_or_else(|| DedupError::CorruptRow("begin answered nothing".into()))
        })
        .await
    }

    async fn begin_batch(
        &self,
        request: Request<pb::BeginBatchRequest>,
    ) -> Result<Response<pb::BeginBatchResponse>, Status> {
        let span = rpc_span("BeginBatch", &request);
        span.record("items", request.get_ref().items.len());
        let trace_context = stored_span_context(&span, &extract_grpc(request.metadata()));
        let request = request.into_inner();
        let spans = item_spans(
            "BeginBatch",
            request
                .items
                .iter()
                .map(|item| (item.operation_id.as_str(), &item.trace_context)),
        );
        respond("BeginBatch", span, async move {
            let mut items = validation::begin_batch(request, self.limits)?;
            // An acquiring item keeps its own span's context, so its reconciliation joins the
            // trace of its event rather than the batch's.
            for (item, own) in items.iter_mut().zip(&spans) {
                item.trace_context = match own {
                    Some((span, parent)) => stored_span_context(span, parent),
                    None => trace_context.clone(),
                };
            }
            let items = self.begin_items(items).await?;
            drop(spans);
            Ok(pb::BeginBatchResponse { items })
        })
        .await
    }

    async fn complete(
        &self,
        request: Request<pb::CompleteRequest>,
    ) -> Result<Response<pb::IntentResponse>, Status> {
        let span = rpc_span("Complete", &request);
        span.record("operation_id", request.get_ref().operation_id.as_str());
        let request = request.into_inner();
        respond("Complete", span, async move {
            validation::result_bytes(&request.result, "result")?;
            if let Some(groups) = &self.groups {
                validation::operation_id(&request.operation_id, "operation_id")?;
                validation::fencing_token(request.fencing_token, "fencing_token")?;
                let intent = groups
                    .complete(validation::CompleteItem {
                        operation_id: request.operation_id,
                        fencing_token: request.fencing_token,
                        fencing_secret: request.fencing_secret,
                        result: request.result,
                    })
                    .await?;
                ::metrics::counter!(metrics::REPORTS, "transition" => "complete").increment(1);
                return Ok(pb::IntentResponse {
                    intent: Some(proto_convert::intent(intent)),
                });
            }
            self.report(
                request.operation_id,
                request.fencing_token,
                request.fencing_secret,
                HolderReport::Complete {
                    result: request.result,
                },
            )
            .await
        })
        .await
    }

    async fn complete_batch(
        &self,
        request: Request<pb::CompleteBatchRequest>,
    ) -> Result<Response<pb::CompleteBatchResponse>, Status> {
        let span = rpc_span("CompleteBatch", &request);
        span.record("items", request.get_ref().items.len());
        let request = request.into_inner();
        let spans = item_spans(
            "CompleteBatch",
            request
                .items
                .iter()
                .map(|item| (item.operation_id.as_str(), &item.trace_context)),
        );
        respond("CompleteBatch", span, async move {
            let items = validation::complete_batch(request)?;
            let results = self
                .writes
                .watched(
                    "a CompleteBatch statement",
                    self.store.complete_batch(&items),
                )
                .await?;
            drop(spans);
            let items = results
                .into_iter()
                .map(|result| match result {
                    Ok(intent) => {
                        ::metrics::counter!(metrics::REPORTS, "transition" => "complete")
                            .increment(1);
                        pb::ItemResult {
                            intent: Some(proto_convert::intent(intent)),
                            code: Code::Ok as i32,
                            message: String::new(),
                        }
                    }
                    Err(error) => {
                        // The same conversion as for a single call, per item.
                        let status = Status::from(error);
                        pb::ItemResult {
                            intent: None,
                            code: status.code() as i32,
                            message: status.message().to_owned(),
                        }
                    }
                })
                .collect();
            Ok(pb::CompleteBatchResponse { items })
        })
        .await
    }

    async fn fail(
        &self,
        request: Request<pb::FailRequest>,
    ) -> Result<Response<pb::IntentResponse>, Status> {
        let span = rpc_span("Fail", &request);
        span.record("operation_id", request.get_ref().operation_id.as_str());
        let request = request.into_inner();
        respond("Fail", span, async move {
            validation::text(&request.reason, "reason")?;
            if request.reason.is_empty() {
                return Err(DedupError::invalid("reason", "must not be empty"));
            }
            self.report(
                request.operation_id,
                request.fencing_token,
                request.fencing_secret,
                HolderReport::Fail {
                    reason: request.reason,
                    retryable: request.retryable,
                },
            )
            .await
        })
        .await
    }

    async fn mark_unknown(
        &self,
        request: Request<pb::MarkUnknownRequest>,
    ) -> Result<Response<pb::IntentResponse>, Status> {
        let span = rpc_span("MarkUnknown", &request);
        span.record("operation_id", request.get_ref().operation_id.as_str());
        let request = request.into_inner();
        respond("MarkUnknown", span, async move {
            validation::text(&request.detail, "detail")?;
            self.report(
                request.operation_id,
                request.fencing_token,
                request.fencing_secret,
                HolderReport::MarkUnknown {
                    detail: request.detail,
                },
            )
            .await
        })
        .await
    }

    async fn get(
        &self,
        request: Request<pb::GetRequest>,
    ) -> Result<Response<pb::IntentResponse>, Status> {
        let span = rpc_span("Get", &request);
        span.record("operation_id", request.get_ref().operation_id.as_str());
        let request = request.into_inner();
        respond("Get", span, async move {
            validation::operation_id(&request.operation_id, "operation_id")?;
            let intent = self
                .store
                .get(&request.operation_id)
                .await?
                .ok_or_else(|| DedupError::NotFound {
                    operation_id: request.operation_id.clone(),
                })?;
            let intents = self.with_stuck_reasons(vec![intent]).await?;
            Ok(pb::IntentResponse {
                intent: intents.into_iter().next(),
            })
        })
        .await
    }

    async fn list_unknown(
        &self,
        request: Request<pb::ListUnknownRequest>,
    ) -> Result<Response<pb::ListUnknownResponse>, Status> {
        let span = rpc_span("ListUnknown", &request);
        let role = Role::of(&request);
        let request = request.into_inner();
        respond("ListUnknown", span, async move {
            role.require_operator("ListUnknown")?;
            let limit = validation::list_limit(request.limit)?;
            let intents = self.store.list_unknown(limit).await?;
            Ok(pb::ListUnknownResponse {
                intents: self.with_stuck_reasons(intents).await?,
            })
        })
        .await
    }

    async fn resolve(
        &self,
        request: Request<pb::ResolveRequest>,
    ) -> Result<Response<pb::IntentResponse>, Status> {
        let span = rpc_span("Resolve", &request);
        span.record("operation_id", request.get_ref().operation_id.as_str());
        let role = Role::of(&request);
        let request = request.into_inner();
        respond("Resolve", span, async move {
            role.require_operator("Resolve")?;
            let resolution = validation::resolution(request)?;
            let intent = self
                .writes
                .watched("a Resolve", self.store.resolve(&resolution))
                .await?;
            tracing::info!(
                outcome = %intent.state,
                evidence = %resolution.evidence,
                "resolved by request"
            );
            Ok(pb::IntentResponse {
                intent: Some(proto_convert::intent(intent)),
            })
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry::trace::{TraceContextExt as _, TracerProvider as _};
    use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
    use tracing_subscriber::layer::SubscriberExt as _;

    use super::*;

    /// A subscriber whose spans end up in the returned exporter while the returned provider
    /// lives (dropping it shuts the pipeline down).
    fn recording_subscriber() -> (
        InMemorySpanExporter,
        SdkTracerProvider,
        impl tracing::Subscriber,
    ) {
        let ended = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(ended.clone())
            .build();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
        (ended, provider, subscriber)
    }

    #[test]
    fn the_request_span_continues_the_callers_trace_and_tags_its_event_id() {
        let (ended, _provider, subscriber) = recording_subscriber();
        tracing::subscriber::with_default(subscriber, || {
            let mut request = Request::new(pb::GetRequest::default());
            request.metadata_mut().insert(
                "traceparent",
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
                    .parse()
                    .expect("valid metadata"),
            );
            request
                .metadata_mut()
                .insert("baggage", "event_id=evt-9".parse().expect("valid metadata"));
            let span = rpc_span("Get", &request);
            let trace_id = span.context().span().span_context().trace_id();
            assert_eq!(trace_id.to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
            drop(span);

            let orphan = rpc_span("Get", &Request::new(pb::GetRequest::default()));
            let own = orphan.context().span().span_context().trace_id();
            assert_ne!(own.to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
        });
        let ended = ended.get_finished_spans().expect("spans recorded");
        let event_id = |span: &SpanData| {
            span.attributes
                .iter()
                .find(|kv| kv.key.as_str() == "event_id")
                .map(|kv| kv.value.to_string())
        };
        assert_eq!(ended.len(), 2);
        assert_eq!(event_id(&ended[0]).as_deref(), Some("evt-9"));
        assert_eq!(event_id(&ended[1]), None, "no baggage, no event_id");
    }

    #[test]
    fn a_batch_item_with_its_own_context_is_answered_in_that_trace() {
        let (ended, _provider, subscriber) = recording_subscriber();
        let own: HashMap<String, String> = [
            (
                "traceparent".to_owned(),
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".to_owned(),
            ),
            ("baggage".to_owned(), "event_id=evt-7".to_owned()),
        ]
        .into();
        let none = HashMap::new();
        let garbage: HashMap<String, String> =
            [("traceparent".to_owned(), "not a context".to_owned())].into();
        tracing::subscriber::with_default(subscriber, || {
            let spans = item_spans(
                "BeginBatch",
                [("op-1", &own), ("op-2", &none), ("op-3", &garbage)].into_iter(),
            );
            assert!(
                spans[1].is_none() && spans[2].is_none(),
                "no context, no span"
            );
            let Some((span, parent)) = &spans[0] else {
                panic!("the item with a context has a span");
            };
            assert_eq!(
                span.context().span().span_context().trace_id().to_string(),
                "4bf92f3577b34da6a3ce929d0e0e4736"
            );
            // What an acquiring item stores for its reconciliation: its own span, in its trace.
            let stored = stored_span_context(span, parent).expect("a stored context");
            let restored = eos_runtime::trace_context::context_from_stored(&stored);
            assert_eq!(
                restored.span().span_context().span_id(),
                span.context().span().span_context().span_id()
            );
            assert_eq!(event_id_in(&restored).as_deref(), Some("evt-7"));
        });
        let ended = ended.get_finished_spans().expect("spans recorded");
        assert_eq!(ended.len(), 1);
        assert_eq!(ended[0].name, "eos.dedup.v1.Dedup/BeginBatch");
        assert_eq!(
            ended[0].parent_span_id.to_string(),
            "00f067aa0ba902b7",
            "a child of the item's context"
        );
        let attribute = |key: &str| {
            ended[0]
                .attributes
                .iter()
                .find(|kv| kv.key.as_str() == key)
                .map(|kv| kv.value.to_string())
        };
        assert_eq!(attribute("event_id").as_deref(), Some("evt-7"));
        assert_eq!(attribute("operation_id").as_deref(), Some("op-1"));
    }
}
