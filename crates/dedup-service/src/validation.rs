//! Request validation: proto messages in, checked domain values out, and `INVALID_ARGUMENT`
//! naming the field for anything else. Pure: no I/O.

use std::collections::HashMap;
use std::time::Duration;

use eos_proto::dedup::v1 as pb;
use time::OffsetDateTime;

use crate::error::DedupError;
use dedup_client::state_machine::IntentState;

pub(crate) const MAX_OPERATION_ID_BYTES: usize = 256;
pub(crate) const MAX_FINGERPRINT_BYTES: usize = 64;
pub(crate) const MAX_OWNER_BYTES: usize = 128;
pub(crate) const MAX_REQUEST_ID_BYTES: usize = 128;
pub(crate) const MAX_RESULT_BYTES: usize = 64 * 1024;
pub(crate) const MAX_TEXT_BYTES: usize = 4 * 1024;
pub(crate) const MAX_BATCH_ITEMS: usize = 1000;
pub(crate) const MAX_LIST_LIMIT: u32 = 1000;
pub(crate) const DEFAULT_LIST_LIMIT: u32 = 100;

/// Lease bounds from the configuration.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LeaseLimits {
    pub(crate) default_ttl: Duration,
    pub(crate) max_ttl: Duration,
}

/// A checked Begin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BeginItem {
    /// The logical operation, and the provider's idempotency key.
    pub operation_id: String,
    /// What the operation does: the same id with another fingerprint is a conflict.
    pub fingerprint: Vec<u8>,
    /// Who asks, recorded as the lease holder.
    pub owner: String,
    /// The caller's, or one made up here: either way it tells whether this call acquired.
    pub request_id: String,
    /// How long the holder may take to call the provider and report (within `--max-lease-ttl`).
    pub lease_ttl: Duration,
    /// When the operation happened: older than the retained window, it answers EXPIRED.
    pub occurred_at: OffsetDateTime,
    /// The Begin's own trace context ([`eos_runtime::trace_context::stored_context`]), kept with the
    /// intent when this Begin acquires it.
    pub trace_context: Option<String>,
}

/// A checked CompleteBatch item. The secret is passed on as presented: a wrong one (of any
/// length, or none) is the store's PERMISSION_DENIED, not a malformed request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompleteItem {
    /// The operation completed.
    pub operation_id: String,
    /// The counter of the holder's fencing token.
    pub fencing_token: i64,
    /// The secret drawn with that counter when the holder acquired.
    pub fencing_secret: Vec<u8>,
    /// The provider's record of the effect, kept with the SUCCEEDED intent.
    pub result: Vec<u8>,
}

/// A checked Resolve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolution {
    /// The UNKNOWN operation settled.
    pub operation_id: String,
    /// SUCCEEDED or FAILED.
    pub outcome: IntentState,
    /// What proves the outcome (kept in the intent's history).
    pub evidence: String,
    /// The provider's record, for SUCCEEDED.
    pub result: Vec<u8>,
    /// For FAILED: whether a later Begin may acquire the operation again.
    pub retryable: bool,
    /// Settles only while the intent still has this fencing token, when given.
    pub expected_fencing_token: Option<i64>,
}

fn field(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_owned()
    } else {
        format!("{prefix}.{name}")
    }
}

/// 1..=256 bytes, no control characters.
pub(crate) fn operation_id(value: &str, field_name: &str) -> Result<(), DedupError> {
    identifier(value, field_name, MAX_OPERATION_ID_BYTES)
}

fn identifier(value: &str, field_name: &str, max: usize) -> Result<(), DedupError> {
    if value.is_empty() {
        return Err(DedupError::invalid(field_name, "must not be empty"));
    }
    if value.len() > max {
        return Err(DedupError::invalid(
            field_name,
            format!("is {} bytes, at most {max} allowed", value.len()),
        ));
    }
    if value.chars().any(char::is_control) {
        return Err(DedupError::invalid(
            field_name,
            "must not contain control characters",
        ));
    }
    Ok(())
}

fn bounded_text(value: &str, field_name: &str) -> Result<(), DedupError> {
    if value.len() > MAX_TEXT_BYTES {
        return Err(DedupError::invalid(
            field_name,
            format!("is {} bytes, at most {MAX_TEXT_BYTES} allowed", value.len()),
        ));
    }
    Ok(())
}

/// Tokens are issued from 1 upwards; anything else cannot be one of ours.
pub(crate) fn fencing_token(value: i64, field_name: &str) -> Result<(), DedupError> {
    if value < 1 {
        return Err(DedupError::invalid(
            field_name,
            format!("must be a token issued by Begin (>= 1), got {value}"),
        ));
    }
    Ok(())
}

pub(crate) fn result_bytes(value: &[u8], field_name: &str) -> Result<(), DedupError> {
    if value.len() > MAX_RESULT_BYTES {
        return Err(DedupError::invalid(
            field_name,
            format!(
                "is {} bytes, at most {MAX_RESULT_BYTES} allowed",
                value.len()
            ),
        ));
    }
    Ok(())
}

pub(crate) fn text(value: &str, field_name: &str) -> Result<(), DedupError> {
    bounded_text(value, field_name)
}

fn timestamp(
    value: &prost_types::Timestamp,
    field_name: &str,
) -> Result<OffsetDateTime, DedupError> {
    let invalid = || DedupError::invalid(field_name, "is not a valid timestamp");
    if !(0..1_000_000_000).contains(&value.nanos) {
        return Err(invalid());
    }
    let nanos = i128::from(value.seconds) * 1_000_000_000 + i128::from(value.nanos);
    OffsetDateTime::from_unix_timestamp_nanos(nanos).map_err(|_| invalid())
}

fn lease_ttl(
    value: Option<&prost_types::Duration>,
    field_name: &str,
    limits: LeaseLimits,
) -> Result<Duration, DedupError> {
    let Some(value) = value else {
        return Ok(limits.default_ttl);
    };
    let ttl = Duration::try_from(*value)
        .map_err(|_| DedupError::invalid(field_name, "must be a positive duration"))?;
    if ttl < Duration::from_millis(1) {
        return Err(DedupError::invalid(field_name, "must be at least 1ms"));
    }
    if ttl > limits.max_ttl {
        return Err(DedupError::invalid(
            field_name,
            format!(
                "must be at most {} (--max-lease-ttl)",
                humantime::format_duration(limits.max_ttl)
            ),
        ));
    }
    Ok(ttl)
}

/// Checks one Begin; `prefix` is `""` for Begin and `items[i]` inside a batch.
pub(crate) fn begin_item(
    request: pb::BeginRequest,
    prefix: &str,
    limits: LeaseLimits,
) -> Result<BeginItem, DedupError> {
    operation_id(&request.operation_id, &field(prefix, "operation_id"))?;
    let fingerprint_field = field(prefix, "fingerprint");
    if request.fingerprint.is_empty() {
        return Err(DedupError::invalid(fingerprint_field, "must not be empty"));
    }
    if request.fingerprint.len() > MAX_FINGERPRINT_BYTES {
        return Err(DedupError::invalid(
            fingerprint_field,
            format!(
                "is {} bytes, at most {MAX_FINGERPRINT_BYTES} allowed",
                request.fingerprint.len()
            ),
        ));
    }
    identifier(&request.owner, &field(prefix, "owner"), MAX_OWNER_BYTES)?;
    let request_id = if request.request_id.is_empty() {
        format!("srv-{:032x}", rand::random::<u128>())
    } else {
        identifier(
            &request.request_id,
            &field(prefix, "request_id"),
            MAX_REQUEST_ID_BYTES,
        )?;
        request.request_id
    };
    let lease_ttl = lease_ttl(
        request.lease_ttl.as_ref(),
        &field(prefix, "lease_ttl"),
        limits,
    )?;
    let occurred_field = field(prefix, "occurred_at");
    let occurred_at = match request.occurred_at.as_ref() {
        Some(value) => timestamp(value, &occurred_field)?,
        None => {
            return Err(DedupError::invalid(
                occurred_field,
                "is required (operations older than the retained window answer EXPIRED)",
            ));
        }
    };
    Ok(BeginItem {
        operation_id: request.operation_id,
        fingerprint: request.fingerprint,
        owner: request.owner,
        request_id,
        lease_ttl,
        occurred_at,
        trace_context: None,
    })
}

/// Checks a batch: 1..=1000 items with distinct operation ids.
pub(crate) fn begin_batch(
    request: pb::BeginBatchRequest,
    limits: LeaseLimits,
) -> Result<Vec<BeginItem>, DedupError> {
    if request.items.is_empty() {
        return Err(DedupError::invalid("items", "must not be empty"));
    }
    if request.items.len() > MAX_BATCH_ITEMS {
        return Err(DedupError::invalid(
            "items",
            format!(
                "has {} items, at most {MAX_BATCH_ITEMS} allowed",
                request.items.len()
            ),
        ));
    }
    let mut seen: HashMap<String, usize> = HashMap::with_capacity(request.items.len());
    let mut items = Vec::with_capacity(request.items.len());
    for (index, item) in request.items.into_iter().enumerate() {
        let prefix = format!("items[{index}]");
        let item = begin_item(item, &prefix, limits)?;
        if let Some(first) = seen.insert(item.operation_id.clone(), index) {
            return Err(DedupError::invalid(
                format!("{prefix}.operation_id"),
                format!("repeats items[{first}].operation_id"),
            ));
        }
        items.push(item);
    }
    Ok(items)
}

/// Checks a CompleteBatch: 1..=1000 items with distinct operation ids.
pub(crate) fn complete_batch(
    request: pb::CompleteBatchRequest,
) -> Result<Vec<CompleteItem>, DedupError> {
    if request.items.is_empty() {
        return Err(DedupError::invalid("items", "must not be empty"));
    }
    if request.items.len() > MAX_BATCH_ITEMS {
        return Err(DedupError::invalid(
            "items",
            format!(
                "has {} items, at most {MAX_BATCH_ITEMS} allowed",
                request.items.len()
            ),
        ));
    }
    let mut seen: HashMap<String, usize> = HashMap::with_capacity(request.items.len());
    let mut items = Vec::with_capacity(request.items.len());
    for (index, item) in request.items.into_iter().enumerate() {
        let prefix = format!("items[{index}]");
        operation_id(&item.operation_id, &field(&prefix, "operation_id"))?;
        fencing_token(item.fencing_token, &field(&prefix, "fencing_token"))?;
        result_bytes(&item.result, &field(&prefix, "result"))?;
        if let Some(first) = seen.insert(item.operation_id.clone(), index) {
            return Err(DedupError::invalid(
                field(&prefix, "operation_id"),
                format!("repeats items[{first}].operation_id"),
            ));
        }
        items.push(CompleteItem {
            operation_id: item.operation_id,
            fencing_token: item.fencing_token,
            fencing_secret: item.fencing_secret,
            result: item.result,
        });
    }
    Ok(items)
}

pub(crate) fn resolution(request: pb::ResolveRequest) -> Result<Resolution, DedupError> {
    operation_id(&request.operation_id, "operation_id")?;
    let outcome = match pb::IntentState::try_from(request.outcome) {
        Ok(pb::IntentState::Succeeded) => IntentState::Succeeded,
        Ok(pb::IntentState::Failed) => IntentState::Failed,
        _ => {
            return Err(DedupError::invalid(
                "outcome",
                "must be INTENT_STATE_SUCCEEDED or INTENT_STATE_FAILED",
            ));
        }
    };
    if request.evidence.is_empty() {
        return Err(DedupError::invalid(
            "evidence",
            "must say what shows the outcome",
        ));
    }
    text(&request.evidence, "evidence")?;
    result_bytes(&request.result, "result")?;
    let expected_fencing_token = match request.expected_fencing_token {
        0 => None,
        token => {
            fencing_token(token, "expected_fencing_token")?;
            Some(token)
        }
    };
    Ok(Resolution {
        operation_id: request.operation_id,
        outcome,
        evidence: request.evidence,
        result: request.result,
        retryable: request.retryable,
        expected_fencing_token,
    })
}

pub(crate) fn list_limit(limit: u32) -> Result<u32, DedupError> {
    match limit {
        0 => Ok(DEFAULT_LIST_LIMIT),
        1..=MAX_LIST_LIMIT => Ok(limit),
        _ => Err(DedupError::invalid(
            "limit",
            format!("must be at most {MAX_LIST_LIMIT}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: LeaseLimits = LeaseLimits {
        default_ttl: Duration::from_secs(30),
        max_ttl: Duration::from_secs(600),
    };

    fn good() -> pb::BeginRequest {
        pb::BeginRequest {
            operation_id: "sink:e-1".into(),
            fingerprint: vec![7; 32],
            owner: "worker-1".into(),
            lease_ttl: None,
            occurred_at: Some(prost_types::Timestamp {
                seconds: 1_700_000_000,
                nanos: 0,
            }),
            request_id: String::new(),
            trace_context: Default::default(),
        }
    }

    fn field_of(error: DedupError) -> String {
        match error {
            DedupError::InvalidArgument { field, .. } => field,
            other => panic!("expected INVALID_ARGUMENT, got {other:?}"),
        }
    }

    #[test]
    fn a_good_begin_gets_defaults_and_a_request_id() {
        let item = begin_item(good(), "", LIMITS).expect("valid");
        assert_eq!(item.lease_ttl, Duration::from_secs(30));
        assert!(item.request_id.starts_with("srv-"));
        let again = begin_item(good(), "", LIMITS).expect("valid");
        assert_ne!(item.request_id, again.request_id);
    }

    #[test]
    fn bad_fields_are_named() {
        type Breaker = fn(&mut pb::BeginRequest);
        let cases: [(&str, Breaker); 9] = [
            ("operation_id", |r| r.operation_id.clear()),
            ("operation_id", |r| r.operation_id = "x".repeat(10 * 1024)),
            ("operation_id", |r| r.operation_id = "a\nb".into()),
            ("fingerprint", |r| r.fingerprint.clear()),
            ("fingerprint", |r| r.fingerprint = vec![0; 65]),
            ("owner", |r| r.owner.clear()),
            ("occurred_at", |r| r.occurred_at = None),
            ("lease_ttl", |r| {
                r.lease_ttl = Some(prost_types::Duration {
                    seconds: 3600,
                    nanos: 0,
                })
            }),
            ("lease_ttl", |r| {
                r.lease_ttl = Some(prost_types::Duration {
                    seconds: -1,
                    nanos: 0,
                })
            }),
        ];
        for (expected, breaker) in cases {
            let mut request = good();
            breaker(&mut request);
            let error = begin_item(request, "", LIMITS).expect_err(expected);
            assert_eq!(field_of(error), expected);
        }
    }

    #[test]
    fn batch_errors_name_the_item() {
        let mut bad = good();
        bad.owner.clear();
        let request = pb::BeginBatchRequest {
            items: vec![good(), bad],
        };
        assert_eq!(
            field_of(begin_batch(request, LIMITS).expect_err("bad owner")),
            "items[1].owner"
        );
        let request = pb::BeginBatchRequest {
            items: vec![good(), good()],
        };
        assert_eq!(
            field_of(begin_batch(request, LIMITS).expect_err("duplicate")),
            "items[1].operation_id"
        );
        let request = pb::BeginBatchRequest { items: vec![] };
        assert_eq!(
            field_of(begin_batch(request, LIMITS).expect_err("empty")),
            "items"
        );
    }

    #[test]
    fn complete_batches_are_checked_per_item() {
        let complete = |id: &str, token| pb::CompleteRequest {
            operation_id: id.into(),
            fencing_token: token,
            result: Vec::new(),
            fencing_secret: vec![9; 32],
            trace_context: Default::default(),
        };
        let ok = pb::CompleteBatchRequest {
            items: vec![complete("a", 1), complete("b", 2)],
        };
        assert_eq!(complete_batch(ok).map(|items| items.len()).ok(), Some(2));
        let bad_token = pb::CompleteBatchRequest {
            items: vec![complete("a", 1), complete("b", 0)],
        };
        assert_eq!(
            field_of(complete_batch(bad_token).expect_err("token 0")),
            "items[1].fencing_token"
        );
        let repeated = pb::CompleteBatchRequest {
            items: vec![complete("a", 1), complete("a", 1)],
        };
        assert_eq!(
            field_of(complete_batch(repeated).expect_err("repeat")),
            "items[1].operation_id"
        );
    }

    #[test]
    fn tokens_and_resolutions_are_checked() {
        assert_eq!(
            field_of(fencing_token(0, "fencing_token").expect_err("0")),
            "fencing_token"
        );
        assert!(fencing_token(1, "fencing_token").is_ok());
        let request = pb::ResolveRequest {
            operation_id: "op".into(),
            outcome: pb::IntentState::Reserved as i32,
            evidence: "x".into(),
            ..Default::default()
        };
        assert_eq!(
            field_of(resolution(request).expect_err("reserved")),
            "outcome"
        );
        assert_eq!(list_limit(0).ok(), Some(DEFAULT_LIST_LIMIT));
        assert!(list_limit(MAX_LIST_LIMIT + 1).is_err());
    }

    /// Every request is accepted with values inside the limits, or refused as INVALID_ARGUMENT
    /// naming a field of the request — never a panic, never another status.
    mod properties {
        use super::*;
        use proptest::prelude::*;

        /// Strings around the limits: empty, short, control characters, multi-byte, long.
        fn arb_text(max_len: usize) -> impl Strategy<Value = String> {
            prop_oneof![
                Just(String::new()),
                "[a-z0-9:._-]{1,40}",
                ".{0,40}",
                (0..max_len + 64).prop_map(|n| "é".repeat(n / 2)),
                (0..max_len + 64).prop_map(|n| "x".repeat(n)),
            ]
        }

        fn arb_timestamp() -> impl Strategy<Value = prost_types::Timestamp> {
            prop_oneof![
                (any::<i64>(), any::<i32>())
                    .prop_map(|(seconds, nanos)| prost_types::Timestamp { seconds, nanos }),
                (0i64..4_000_000_000, 0i32..1_000_000_000)
                    .prop_map(|(seconds, nanos)| prost_types::Timestamp { seconds, nanos }),
            ]
        }

        fn arb_duration() -> impl Strategy<Value = prost_types::Duration> {
            prop_oneof![
                (any::<i64>(), any::<i32>())
                    .prop_map(|(seconds, nanos)| prost_types::Duration { seconds, nanos }),
                (0i64..1_000, 0i32..1_000_000_000)
                    .prop_map(|(seconds, nanos)| prost_types::Duration { seconds, nanos }),
            ]
        }

        fn arb_begin() -> impl Strategy<Value = pb::BeginRequest> {
            (
                arb_text(MAX_OPERATION_ID_BYTES),
                prop::collection::vec(any::<u8>(), 0..80),
                arb_text(MAX_OWNER_BYTES),
                arb_text(MAX_REQUEST_ID_BYTES),
                prop::option::of(arb_duration()),
                prop::option::of(arb_timestamp()),
            )
                .prop_map(
                    |(operation_id, fingerprint, owner, request_id, lease_ttl, occurred_at)| {
                        pb::BeginRequest {
                            operation_id,
                            fingerprint,
                            owner,
                            lease_ttl,
                            occurred_at,
                            request_id,
                            trace_context: Default::default(),
                        }
                    },
                )
        }

        fn refused_naming_a_field(error: DedupError, fields: &[&str]) -> Result<(), TestCaseError> {
            let field = match &error {
                DedupError::InvalidArgument { field, .. } => field.clone(),
                other => {
                    return Err(TestCaseError::fail(format!(
                        "not INVALID_ARGUMENT: {other:?}"
                    )));
                }
            };
            prop_assert_eq!(
                tonic::Status::from(error).code(),
                tonic::Code::InvalidArgument
            );
            prop_assert!(
                fields.iter().any(|f| field.ends_with(f) || field == *f),
                "unexpected field {}",
                field
            );
            Ok(())
        }

        fn is_identifier(value: &str, max: usize) -> bool {
            !value.is_empty() && value.len() <= max && !value.chars().any(char::is_control)
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(128))]

            #[test]
            fn begin_is_accepted_inside_the_limits_or_refused_naming_a_field(request in arb_begin()) {
                match begin_item(request.clone(), "", LIMITS) {
                    Ok(item) => {
                        prop_assert!(is_identifier(&item.operation_id, MAX_OPERATION_ID_BYTES));
                        prop_assert!((1..=MAX_FINGERPRINT_BYTES).contains(&item.fingerprint.len()));
                        prop_assert!(is_identifier(&item.owner, MAX_OWNER_BYTES));
                        prop_assert!(is_identifier(&item.request_id, MAX_REQUEST_ID_BYTES.max(36)));
                        prop_assert!(item.lease_ttl >= Duration::from_millis(1));
                        prop_assert!(item.lease_ttl <= LIMITS.max_ttl);
                        prop_assert_eq!(item.operation_id, request.operation_id);
                        prop_assert_eq!(item.fingerprint, request.fingerprint);
                    }
                    Err(error) => refused_naming_a_field(
                        error,
                        &["operation_id", "fingerprint", "owner", "request_id", "lease_ttl", "occurred_at"],
                    )?,
                }
            }

            #[test]
            fn batches_are_accepted_with_distinct_ids_or_refused(
                requests in prop::collection::vec(arb_begin(), 0..6),
                repeat_first in any::<bool>(),
            ) {
                let mut items = requests;
                if repeat_first && let Some(first) = items.first().cloned() {
                    items.push(first);
                }
                match begin_batch(pb::BeginBatchRequest { items }, LIMITS) {
                    Ok(items) => {
                        let ids: std::collections::HashSet<&str> =
                            items.iter().map(|i| i.operation_id.as_str()).collect();
                        prop_assert_eq!(ids.len(), items.len());
                        prop_assert!(!items.is_empty());
                    }
                    Err(error) => refused_naming_a_field(
                        error,
                        &["items", "operation_id", "fingerprint", "owner", "request_id", "lease_ttl", "occurred_at"],
                    )?,
                }
            }

            #[test]
            fn resolve_is_accepted_inside_the_limits_or_refused_naming_a_field(
                operation_id in arb_text(MAX_OPERATION_ID_BYTES),
                outcome in any::<i32>(),
                evidence in arb_text(MAX_TEXT_BYTES),
                result_len in prop_oneof![0usize..16, MAX_RESULT_BYTES - 2..MAX_RESULT_BYTES + 2],
                retryable in any::<bool>(),
                expected_fencing_token in any::<i64>(),
            ) {
                let request = pb::ResolveRequest {
                    operation_id,
                    outcome,
                    evidence,
                    result: vec![1; result_len],
                    retryable,
                    expected_fencing_token,
                };
                match resolution(request) {
                    Ok(resolution) => {
                        prop_assert!(is_identifier(&resolution.operation_id, MAX_OPERATION_ID_BYTES));
                        prop_assert!(matches!(resolution.outcome, IntentState::Succeeded | IntentState::Failed));
                        prop_assert!((1..=MAX_TEXT_BYTES).contains(&resolution.evidence.len()));
                        prop_assert!(resolution.result.len() <= MAX_RESULT_BYTES);
                    }
                    Err(error) => refused_naming_a_field(
                        error,
                        &["operation_id", "outcome", "evidence", "result", "expected_fencing_token"],
                    )?,
                }
            }

            #[test]
            fn free_text_is_accepted_exactly_up_to_its_limit(value in arb_text(MAX_TEXT_BYTES)) {
                prop_assert_eq!(text(&value, "reason").is_ok(), value.len() <= MAX_TEXT_BYTES);
            }

            #[test]
            fn list_limits_are_bounded(limit in any::<u32>()) {
                match list_limit(limit) {
                    Ok(n) => prop_assert!((1..=MAX_LIST_LIMIT).contains(&n)),
                    Err(error) => refused_naming_a_field(error, &["limit"])?,
                }
            }
        }
    }
}
