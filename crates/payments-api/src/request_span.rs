//! The span of one `POST /payments` (docs/architecture/event-path.md "The path of one event": one
//! trace per `event_id`, every span of it tagged `event_id`, which is how `eosctl trace` and Jaeger
//! find it).
//!
//! What a request is about is known only once the database has looked at its key: a new key
//! creates a payment, and the span starts that payment's trace, parented on the caller's
//! context; a key seen before makes the request a resend of that key's payment, or a refused
//! reuse of the key, and the span joins that payment's trace (the context its outbox row stored),
//! linking to the caller's span instead. So a resend is tagged with the payment it is about —
//! never with the id it would have created, which no payment has — and one search by a
//! payment's id finds every request about it in the payment's one trace, sampled or not with it.
//! Once the relay has purged the outbox row (`OUTBOX_RETENTION` after publishing it) there is no
//! trace to join: the span then stays in the caller's trace, still tagged with the payment.

use opentelemetry::Context;
use opentelemetry::trace::{SpanContext, TraceContextExt as _};
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use eos_runtime::trace_context;

use crate::payment_store::{Recorded, StoreError};

/// The payment the request is about; its id is its event's id.
pub(crate) const EVENT_ID_ATTRIBUTE: &str = "event_id";
/// What became of the request: [`Outcome::as_str`]. The tag sink-writer's and eos-processor's
/// spans put their outcome in, which `eosctl trace` shows next to each span.
pub(crate) const OUTCOME_ATTRIBUTE: &str = "eos.outcome";

/// What became of a request that reached the database. A request refused before (a bad body or
/// key) gets no span: it is about no payment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// It created its payment.
    Created,
    /// Its key was used before by the same request: answered from that payment.
    Replayed,
    /// Its key was used before by another request: refused, the key belongs to that payment.
    Refused,
    /// The database failed; whether its payment exists is not known.
    Unavailable,
}

impl Outcome {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Created => "created",
            Self::Replayed => "replayed",
            Self::Refused => "refused",
            Self::Unavailable => "unavailable",
        }
    }
}

/// The span of a request for `account_id`, started now but not yet part of any trace: its
/// OpenTelemetry span begins only when it is first entered, after [`SpanPlan::apply`].
pub(crate) fn request_span(account_id: &str) -> Span {
    tracing::info_span!(
        "request",
        otel.name = "payments-api POST /payments",
        otel.kind = "server",
        http.request.method = "POST",
        http.route = "/payments",
        account_id = %account_id,
        event_id = tracing::field::Empty,
        eos.outcome = tracing::field::Empty,
    )
}

/// Where a request's span belongs, once the database said what the request is about.
#[derive(Debug, Clone)]
pub(crate) struct SpanPlan {
    pub parent: Context,
    /// The caller's span, when the span joins another trace than the caller's.
    pub link: Option<SpanContext>,
}

impl SpanPlan {
    /// For a request from `caller` about payment `payment_id` (`None` when the database failed
    /// before saying), whose creating request stored `original_trace` (`None` for the request
    /// that creates it, and once the outbox row is purged).
    ///
    /// The parent's baggage names the payment: `eos_outbox::enqueue` stores the span's context,
    /// baggage included, with the payment's event, and every later hop reads the event id there.
    pub(crate) fn new(
        caller: &Context,
        payment_id: Option<&str>,
        original_trace: Option<&str>,
    ) -> Self {
        let original = original_trace
            .map(trace_context::context_from_stored)
            .filter(|original| original.span().span_context().is_valid());
        let (parent, link) = match original {
            Some(original) => {
                let caller_span = caller.span().span_context().clone();
                (original, caller_span.is_valid().then_some(caller_span))
            }
            None => (caller.clone(), None),
        };
        let parent = match payment_id {
            Some(payment_id) => trace_context::context_with_event_id(&parent, payment_id),
            None => parent,
        };
        Self { parent, link }
    }

    /// Places `span`; before it is first entered, or the parent is ignored.
    pub(crate) fn apply(self, span: &Span) {
        // Fails only where no OpenTelemetry layer is installed, and then there is no trace.
        let _ = span.set_parent(self.parent);
        if let Some(link) = self.link {
            span.add_link(link);
        }
    }
}

/// What the span of an answered request says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RequestTags {
    /// The payment the request is about; `None` when the database failed, since the id the
    /// request would have created may belong to no payment.
    pub event_id: Option<String>,
    pub outcome: Outcome,
}

impl RequestTags {
    pub(crate) fn of(recorded: &Result<Recorded, StoreError>) -> Self {
        let recorded = match recorded {
            Ok(recorded) => recorded,
            // Refused by the account before any payment was made: no payment to name.
            Err(StoreError::Refused(_)) => {
                return Self {
                    event_id: None,
                    outcome: Outcome::Refused,
                };
            }
            Err(_) => {
                return Self {
                    event_id: None,
                    outcome: Outcome::Unavailable,
                };
            }
        };
        let outcome = match recorded {
            Recorded::Created(_) => Outcome::Created,
            Recorded::Replayed { .. } => Outcome::Replayed,
            Recorded::KeyReused { .. } => Outcome::Refused,
        };
        Self {
            event_id: Some(recorded.payment_id().to_owned()),
            outcome,
        }
    }

    /// Tags `span` once it is answered. Once only: the exporter adds a recorded attribute rather
    /// than replacing it, so a second call would export two `event_id`s.
    pub(crate) fn record(&self, span: &Span) {
        if let Some(event_id) = &self.event_id {
            span.record(EVENT_ID_ATTRIBUTE, event_id.as_str());
        }
        span.record(OUTCOME_ATTRIBUTE, self.outcome.as_str());
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry::trace::{SpanId, TraceFlags, TraceId, TraceState};
    use time::OffsetDateTime;

    use super::*;
    use crate::payment_store::Payment;

    const ORIGINAL_TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
    const ORIGINAL_SPAN_ID: &str = "00f067aa0ba902b7";
    const CALLER_TRACE_ID: &str = "5c6b3f8e0d2a4f1b9e7c1a2b3c4d5e6f";
    const CALLER_SPAN_ID: &str = "1a2b3c4d5e6f7a8b";

    fn remote(trace_id: &str, span_id: &str, flags: TraceFlags) -> Context {
        Context::new().with_remote_span_context(SpanContext::new(
            TraceId::from_hex(trace_id).unwrap_or(TraceId::INVALID),
            SpanId::from_hex(span_id).unwrap_or(SpanId::INVALID),
            flags,
            true,
            TraceState::default(),
        ))
    }

    fn caller() -> Context {
        remote(CALLER_TRACE_ID, CALLER_SPAN_ID, TraceFlags::SAMPLED)
    }

    /// What `eos_outbox::enqueue` stores for the request span that created `payment_id`.
    fn stored_trace(payment_id: &str, flags: TraceFlags) -> Option<String> {
        let cx = remote(ORIGINAL_TRACE_ID, ORIGINAL_SPAN_ID, flags);
        trace_context::stored_context(&trace_context::context_with_event_id(&cx, payment_id))
    }

    fn ids(span_context: &SpanContext) -> (String, String) {
        (
            span_context.trace_id().to_string(),
            span_context.span_id().to_string(),
        )
    }

    fn parent_ids(plan: &SpanPlan) -> (String, String) {
        ids(plan.parent.span().span_context())
    }

    fn payment(payment_id: &str) -> Payment {
        Payment {
            payment_id: payment_id.into(),
            event_id: payment_id.into(),
            account_id: "acct-1".into(),
            amount: 1250,
            currency: "EUR".into(),
            account_version: 1,
            created_at: OffsetDateTime::UNIX_EPOCH,
        }
    }

    #[test]
    fn a_new_payment_starts_its_trace_under_the_caller_and_names_itself_in_the_baggage() {
        let plan = SpanPlan::new(&caller(), Some("pay-new"), None);
        assert_eq!(
            parent_ids(&plan),
            (CALLER_TRACE_ID.into(), CALLER_SPAN_ID.into())
        );
        assert_eq!(
            trace_context::event_id_in(&plan.parent).as_deref(),
            Some("pay-new")
        );
        assert_eq!(plan.link, None);
    }

    #[test]
    fn a_request_about_an_earlier_payment_joins_its_trace_and_links_the_caller() {
        let original = stored_trace("pay-original", TraceFlags::SAMPLED);
        let plan = SpanPlan::new(&caller(), Some("pay-original"), original.as_deref());
        assert_eq!(
            parent_ids(&plan),
            (ORIGINAL_TRACE_ID.into(), ORIGINAL_SPAN_ID.into())
        );
        assert_eq!(
            trace_context::event_id_in(&plan.parent).as_deref(),
            Some("pay-original")
        );
        assert_eq!(
            plan.link.as_ref().map(ids),
            Some((CALLER_TRACE_ID.into(), CALLER_SPAN_ID.into()))
        );
        let from_nowhere =
            SpanPlan::new(&Context::new(), Some("pay-original"), original.as_deref());
        assert_eq!(from_nowhere.link, None, "a caller without a trace");
    }

    /// With sampling, a resend is sampled exactly when its payment's trace was.
    #[test]
    fn a_request_about_an_unsampled_payment_inherits_the_decision() {
        let original = stored_trace("pay-original", TraceFlags::NOT_SAMPLED);
        let plan = SpanPlan::new(&caller(), Some("pay-original"), original.as_deref());
        assert!(!plan.parent.span().span_context().is_sampled());
    }

    #[test]
    fn without_a_stored_trace_the_span_stays_with_the_caller_and_still_names_the_payment() {
        for original in [None, Some("not a stored context")] {
            let plan = SpanPlan::new(&caller(), Some("pay-original"), original);
            assert_eq!(
                parent_ids(&plan),
                (CALLER_TRACE_ID.into(), CALLER_SPAN_ID.into())
            );
            assert_eq!(
                trace_context::event_id_in(&plan.parent).as_deref(),
                Some("pay-original")
            );
            assert_eq!(plan.link, None);
        }
        let failed = SpanPlan::new(&caller(), None, None);
        assert_eq!(trace_context::event_id_in(&failed.parent), None);
    }

    #[test]
    fn each_answer_is_tagged_with_the_payment_it_is_about() {
        let created = RequestTags::of(&Ok(Recorded::Created(payment("pay-new"))));
        let replayed = RequestTags::of(&Ok(Recorded::Replayed {
            payment: payment("pay-original"),
            original_trace: None,
        }));
        let refused = RequestTags::of(&Ok(Recorded::KeyReused {
            payment_id: "pay-original".into(),
            original_trace: None,
        }));
        let failed = RequestTags::of(&Err(StoreError::PaymentId("pay-x".into())));
        let tags = [&created, &replayed, &refused, &failed]
            .map(|tags| (tags.event_id.as_deref(), tags.outcome.as_str()));
        assert_eq!(
            tags,
            [
                (Some("pay-new"), "created"),
                (Some("pay-original"), "replayed"),
                (Some("pay-original"), "refused"),
                (None, "unavailable"),
            ]
        );
    }

    /// `Span::record` silently ignores a field the span did not declare.
    #[test]
    fn the_span_declares_the_fields_it_is_tagged_with() {
        let span = request_span("acct-1");
        for field in [EVENT_ID_ATTRIBUTE, OUTCOME_ATTRIBUTE] {
            assert!(
                span.metadata()
                    .is_some_and(|metadata| metadata.fields().field(field).is_some()),
                "{field} is not declared"
            );
        }
    }
}
