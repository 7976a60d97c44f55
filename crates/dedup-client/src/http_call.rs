//! A call to any HTTP API as an exactly-once effect (issue 53's foundation): the request built
//! from an event ([`RequestTemplate`]: method, URL template, headers, body, the idempotency key's
//! header and format) and its answer sorted by rules ([`AnswerRules`]: which statuses mean
//! applied, refused for good, retry later or not known, and `Retry-After`). provider-sim's
//! `POST /charges` is one configuration of it ([`RequestTemplate::provider_charges`] with
//! [`AnswerRules::default`]), which [`crate::ProviderClient::charge`] sends.
//!
//! Rendering is pure and deterministic per event: every attempt with the same key sends the same
//! request, which is what an API's idempotency contract compares. A value the template needs and
//! the event lacks is an error the caller dead-letters, never a request with a hole in it.

use std::fmt::Write as _;
use std::time::Duration;

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use reqwest::Method;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde_json::{Map, Value};

use crate::charge_answer::{ChargeLookup, ChargeOutcome, reported_body};

/// The default idempotency key header, as Stripe and most payment APIs name it.
pub const DEFAULT_KEY_HEADER: &str = "Idempotency-Key";
/// The default key: the target's name and the event's id, unique across targets.
pub const DEFAULT_KEY_FORMAT: &str = "{target}:{event_id}";

/// What a URL placeholder's value may hold unescaped: RFC 3986's unreserved characters. Anything
/// else (a `/` or `?` in an id) is percent-encoded, so a value never changes the URL's shape.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// One event's values a template reads.
#[derive(Debug, Clone, Copy)]
pub struct CallContext<'a> {
    /// The target's name.
    pub target: &'a str,
    pub event_id: &'a str,
    pub entity_id: &'a str,
    /// The event as the JSON event model has it.
    pub event: &'a Value,
}

/// Where a value of the request comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum Field {
    /// A JSON pointer into the event (`/amount`); the event must have it.
    Pointer(String),
    /// A constant from the configuration.
    Const(Value),
    EventId,
    EntityId,
    /// The idempotency key.
    Key,
    /// The whole event.
    Event,
}

impl Field {
    /// `"/pointer"`, `"event_id"`, `"entity_id"`, `"key"` or `"event"`; anything else is a
    /// constant string (a constant of another type is given as [`Field::Const`]).
    pub fn parse(text: &str) -> Self {
        match text {
            "event_id" => Self::EventId,
            "entity_id" => Self::EntityId,
            "key" => Self::Key,
            "event" => Self::Event,
            pointer if pointer.starts_with('/') => Self::Pointer(pointer.to_owned()),
            constant => Self::Const(Value::String(constant.to_owned())),
        }
    }

    fn value(&self, context: &CallContext<'_>, key: &str) -> Result<Value, String> {
        Ok(match self {
            Self::Pointer(pointer) => context
                .event
                .pointer(pointer)
                .filter(|value| !value.is_null())
                .cloned()
                .ok_or_else(|| format!("the event has no value at {pointer}"))?,
            Self::Const(value) => value.clone(),
            Self::EventId => Value::String(context.event_id.to_owned()),
            Self::EntityId => Value::String(context.entity_id.to_owned()),
            Self::Key => Value::String(key.to_owned()),
            Self::Event => context.event.clone(),
        })
    }
}

/// The request's body.
#[derive(Debug, Clone, PartialEq)]
pub enum BodyTemplate {
    /// No body (a GET, a DELETE).
    None,
    /// The whole event, as JSON.
    Event,
    /// A JSON object of these fields (written with its keys sorted: the same bytes every time).
    Object(Vec<(String, Field)>),
}

/// A request rendered for one event.
#[derive(Debug, Clone)]
pub struct RenderedRequest {
    pub method: Method,
    pub url: reqwest::Url,
    /// The idempotency key (sent in the key header when there is one).
    pub key: String,
    pub headers: HeaderMap,
    pub body: Option<Vec<u8>>,
}

/// How to call an API for one event.
#[derive(Debug, Clone)]
pub struct RequestTemplate {
    method: Method,
    /// `https://api.example.com/v1/charges`, with `{event_id}`, `{entity_id}`, `{key}`,
    /// `{target}` or `{/pointer}` placeholders, each percent-encoded into the URL.
    url: String,
    /// Static headers and secrets read at start-up (marked sensitive: never printed).
    headers: HeaderMap,
    body: BodyTemplate,
    /// `None`: the API takes no key (a webhook); the key is still the intent's operation id.
    key_header: Option<HeaderName>,
    /// The key's text, with the URL's placeholders (`{target}:{event_id}` by default).
    key_format: String,
    /// `scheme://host[:port]` of the URL: the client's base, and what logs name.
    origin: String,
}

impl RequestTemplate {
    /// A template; `Err` says what in it cannot work (an unknown placeholder, a URL that is not
    /// http(s), credentials in the URL, a header name or value HTTP refuses).
    pub fn new(
        method: &str,
        url: &str,
        headers: HeaderMap,
        body: BodyTemplate,
        key_header: Option<&str>,
        key_format: &str,
    ) -> Result<Self, String> {
        let method = Method::from_bytes(method.to_ascii_uppercase().as_bytes())
            .map_err(|_| format!("{method:?} is not an HTTP method"))?;
        let key_header = key_header
            .map(|name| {
                HeaderName::try_from(name).map_err(|_| format!("{name:?} is not a header name"))
            })
            .transpose()?;
        let mut template = Self {
            method,
            url: url.to_owned(),
            headers,
            body,
            key_header,
            key_format: key_format.to_owned(),
            origin: String::new(),
        };
        // A probe render finds unknown placeholders and a bad URL at start-up, not per event.
        fill(&template.key_format, None, None, |text| text.to_owned())
            .map_err(|error| format!("key format {key_format:?}: {error}"))?;
        let url_text = fill(url, None, Some("key"), |text| text.to_owned())
            .map_err(|error| format!("URL {url:?}: {error}"))?;
        let parsed =
            reqwest::Url::parse(&url_text).map_err(|error| format!("URL {url:?}: {error}"))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(format!("URL {url:?}: the scheme must be http or https"));
        }
        if !parsed.username().is_empty() || parsed.password().is_some() {
            return Err(format!(
                "URL {:?}: credentials in the URL are refused; give them as a header from a \
                 file",
                eos_runtime::secrets::redact_url_userinfo(url)
            ));
        }
        template.origin = parsed.origin().ascii_serialization();
        Ok(template)
    }

    /// `scheme://host[:port]` of the URL (a placeholder in the host reads as `probe`).
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// provider-sim's API: `POST {base}/charges` with `{"amount", "event_id", "entity_id"}`,
    /// the amount at `amount` in the event, and `Idempotency-Key: <target>:<event_id>`.
    pub fn provider_charges(base: &str, amount: &str) -> Result<Self, String> {
        Self::new(
            "POST",
            &format!("{}/charges", base.trim_end_matches('/')),
            HeaderMap::new(),
            BodyTemplate::Object(vec![
                ("amount".to_owned(), Field::parse(amount)),
                ("event_id".to_owned(), Field::EventId),
                ("entity_id".to_owned(), Field::EntityId),
            ]),
            Some(DEFAULT_KEY_HEADER),
            DEFAULT_KEY_FORMAT,
        )
    }

    /// The idempotency key of `context`'s event.
    pub fn key(&self, context: &CallContext<'_>) -> Result<String, String> {
        fill(&self.key_format, Some(context), None, |text| {
            text.to_owned()
        })
    }

    /// The request for `context`'s event; `Err` names what the event lacks.
    pub fn render(&self, context: &CallContext<'_>) -> Result<RenderedRequest, String> {
        let key = self.key(context)?;
        let url = fill(&self.url, Some(context), Some(&key), |text| {
            utf8_percent_encode(text, SEGMENT).to_string()
        })?;
        let url = reqwest::Url::parse(&url).map_err(|error| format!("URL {url:?}: {error}"))?;
        let mut headers = self.headers.clone();
        if let Some(name) = &self.key_header {
            let value = HeaderValue::try_from(key.as_str())
                .map_err(|_| format!("the key {key:?} is not a header value"))?;
            headers.insert(name.clone(), value);
        }
        let body = match &self.body {
            BodyTemplate::None => None,
            BodyTemplate::Event => Some(context.event.clone()),
            BodyTemplate::Object(fields) => Some(Value::Object(
                fields
                    .iter()
                    .map(|(name, field)| Ok((name.clone(), field.value(context, &key)?)))
                    .collect::<Result<Map<_, _>, String>>()?,
            )),
        };
        if body.is_some() && !headers.contains_key(reqwest::header::CONTENT_TYPE) {
            headers.insert(
                reqwest::header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
        }
        Ok(RenderedRequest {
            method: self.method.clone(),
            url,
            key,
            headers,
            body: body.map(|body| eos_core::json_text::to_vec(&body)),
        })
    }
}

/// Static headers from a configuration's names and values; `Err` names the one HTTP refuses.
pub fn static_headers(pairs: &[(String, String)]) -> Result<HeaderMap, String> {
    let mut headers = HeaderMap::new();
    for (name, value) in pairs {
        let header = HeaderName::try_from(name.as_str())
            .map_err(|_| format!("headers: {name:?} is not a header name"))?;
        let value = HeaderValue::try_from(value.as_str())
            .map_err(|_| format!("headers.{name}: not a valid header value"))?;
        headers.insert(header, value);
    }
    Ok(headers)
}

/// `template` with each `{…}` replaced by its value through `encode`; `key` is `None` while the
/// key itself is being made (it cannot name itself). Without a `context` (the start-up probe)
/// each known placeholder stands for `probe`.
fn fill(
    template: &str,
    context: Option<&CallContext<'_>>,
    key: Option<&str>,
    encode: impl Fn(&str) -> String,
) -> Result<String, String> {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let close = rest[open..]
            .find('}')
            .ok_or_else(|| format!("an unclosed {{ at {:?}", &rest[open..]))?;
        let name = &rest[open + 1..open + close];
        let value = match (name, context) {
            ("key", _) => key.ok_or("the key cannot name itself")?.to_owned(),
            ("target" | "event_id" | "entity_id", None) => "probe".to_owned(),
            (pointer, None) if pointer.starts_with('/') => "probe".to_owned(),
            ("target", Some(context)) => context.target.to_owned(),
            ("event_id", Some(context)) => context.event_id.to_owned(),
            ("entity_id", Some(context)) => context.entity_id.to_owned(),
            (pointer, Some(context)) if pointer.starts_with('/') => {
                match context.event.pointer(pointer) {
                    Some(Value::String(text)) => text.clone(),
                    Some(Value::Number(number)) => number.to_string(),
                    _ => return Err(format!("the event has no text or number at {pointer}")),
                }
            }
            (other, _) => {
                return Err(format!(
                    "unknown placeholder {{{other}}}: use {{target}}, {{event_id}}, \
                     {{entity_id}}, {{key}} or {{/json/pointer}}"
                ));
            }
        };
        let _ = write!(out, "{}", encode(&value));
        rest = &rest[open + close + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// An inclusive range of HTTP statuses, `429` or `500-599`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatusRange(pub u16, pub u16);

impl StatusRange {
    /// `"429"` or `"500-599"`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let status = |part: &str| {
            part.trim()
                .parse::<u16>()
                .ok()
                .filter(|status| (100..=599).contains(status))
                .ok_or_else(|| format!("{text:?} is not a status (100-599) or a range of them"))
        };
        let range = match text.split_once('-') {
            Some((low, high)) => Self(status(low)?, status(high)?),
            None => Self(status(text)?, status(text)?),
        };
        if range.0 > range.1 {
            return Err(format!("{text:?}: the range is empty"));
        }
        Ok(range)
    }

    fn contains(self, status: u16) -> bool {
        (self.0..=self.1).contains(&status)
    }
}

/// How an API's answer is sorted. The first list that holds the status decides, in the order
/// applied, retry later, refused; any other status, a timeout and a lost answer are not known
/// (the intent goes UNKNOWN and is reconciled, never called blindly again).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnswerRules {
    /// Applied (or an earlier attempt's answer replayed).
    pub applied: Vec<StatusRange>,
    /// Not applied, and may be tried again later with the same key (`Retry-After` honoured).
    pub retry: Vec<StatusRange>,
    /// Not applied, for good: the event is a dead letter with the status and a cut body.
    pub refused: Vec<StatusRange>,
}

impl Default for AnswerRules {
    /// 2xx applied; 401, 403, 409 (a request with this key in progress) and 429 retry later; the
    /// other 4xx but 408 refused; the rest not known. provider-sim's and Stripe's contract.
    fn default() -> Self {
        Self {
            applied: vec![StatusRange(200, 299)],
            retry: vec![
                StatusRange(401, 401),
                StatusRange(403, 403),
                StatusRange(409, 409),
                StatusRange(429, 429),
            ],
            refused: vec![StatusRange(400, 407), StatusRange(409, 499)],
        }
    }
}

/// An answer sorted, and how long the API asked to wait before the next try.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SortedAnswer {
    pub outcome: ChargeOutcome,
    pub retry_after: Option<Duration>,
}

impl AnswerRules {
    /// Sorts `status` with its `Retry-After` header and `body`.
    pub fn sort(&self, status: u16, retry_after: Option<&str>, body: Vec<u8>) -> SortedAnswer {
        let held = |ranges: &[StatusRange]| ranges.iter().any(|range| range.contains(status));
        let outcome = if held(&self.applied) {
            ChargeOutcome::Applied { status, body }
        } else if held(&self.retry) || held(&self.refused) {
            ChargeOutcome::Rejected {
                status,
                body: reported_body(&body),
                retryable: held(&self.retry),
            }
        } else {
            ChargeOutcome::Ambiguous {
                detail: format!("answer {status}: {}", reported_body(&body)),
            }
        };
        let retry_after = match &outcome {
            ChargeOutcome::Rejected {
                retryable: true, ..
            } => retry_after.and_then(parse_retry_after),
            _ => None,
        };
        SortedAnswer {
            outcome,
            retry_after,
        }
    }
}

/// `Retry-After` in delta-seconds or as an HTTP date (RFC 9110 §10.2.3), at most an hour (a
/// longer ask is an hour: the operator hears of it through the stalled-loop alarm rather than
/// never). A date in the past is no wait.
fn parse_retry_after(text: &str) -> Option<Duration> {
    let text = text.trim();
    let wait = match text.parse::<u64>() {
        Ok(seconds) => Duration::from_secs(seconds),
        Err(_) => httpdate::parse_http_date(text)
            .ok()?
            .duration_since(std::time::SystemTime::now())
            .unwrap_or_default(),
    };
    Some(wait.min(Duration::from_secs(3_600)))
}

/// What a look-up's answer says about a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LookupVerdict {
    /// Applied: the intent is SUCCEEDED with the answer as its result.
    Found,
    /// No record: "not applied" once no request of the attempt can still arrive.
    NotFound,
    /// Received, not settled yet: ask again later.
    Pending,
    /// Received and refused for good: the intent is FAILED and the event a dead letter.
    Failed,
}

impl LookupVerdict {
    /// `found`, `not_found`, `pending` or `failed`.
    pub fn parse(text: &str) -> Result<Self, String> {
        match text {
            "found" => Ok(Self::Found),
            "not_found" => Ok(Self::NotFound),
            "pending" => Ok(Self::Pending),
            "failed" => Ok(Self::Failed),
            other => Err(format!(
                "{other:?} is not found, not_found, pending or failed"
            )),
        }
    }
}

/// A field of a `found` answer that says more than its status, as many APIs answer a look-up
/// with 200 and a `status` of `succeeded`, `processing` or `failed`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateField {
    /// A JSON pointer into the answer (`/status`).
    pub pointer: String,
    /// Each value's verdict; a value not listed (or none) is an answer the reconciler does not
    /// understand, so it asks again later and counts an error.
    pub values: Vec<(String, LookupVerdict)>,
}

/// How a look-up's answer is sorted: the first list that holds the status decides, in the order
/// found, not found, pending, failed; any other status is an error (the reconciler asks again
/// later), never a verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LookupRules {
    pub found: Vec<StatusRange>,
    pub not_found: Vec<StatusRange>,
    pub pending: Vec<StatusRange>,
    pub failed: Vec<StatusRange>,
    /// Read in a `found` answer, when given: its value decides instead.
    pub state: Option<StateField>,
}

impl Default for LookupRules {
    /// provider-sim's `GET /charges/{key}`: 2xx found, 404 not found.
    fn default() -> Self {
        Self {
            found: vec![StatusRange(200, 299)],
            not_found: vec![StatusRange(404, 404)],
            pending: Vec::new(),
            failed: Vec::new(),
            state: None,
        }
    }
}

impl LookupRules {
    /// Sorts a look-up's `status` and `body`; `Err` is the body (cut) of an answer the rules
    /// do not sort.
    pub fn sort(&self, status: u16, body: Vec<u8>) -> Result<ChargeLookup, String> {
        let held = |ranges: &[StatusRange]| ranges.iter().any(|range| range.contains(status));
        let verdict = if held(&self.found) {
            match &self.state {
                Some(state) => state_verdict(state, &body)?,
                None => LookupVerdict::Found,
            }
        } else if held(&self.not_found) {
            LookupVerdict::NotFound
        } else if held(&self.pending) {
            LookupVerdict::Pending
        } else if held(&self.failed) {
            LookupVerdict::Failed
        } else {
            return Err(reported_body(&body));
        };
        Ok(match verdict {
            LookupVerdict::Found => ChargeLookup::Found(body),
            LookupVerdict::NotFound => ChargeLookup::NotFound,
            LookupVerdict::Pending => ChargeLookup::Pending,
            LookupVerdict::Failed => ChargeLookup::Failed(reported_body(&body)),
        })
    }
}

/// The verdict of the value at `state.pointer` in a JSON `body`.
fn state_verdict(state: &StateField, body: &[u8]) -> Result<LookupVerdict, String> {
    let answer: Value = serde_json::from_slice(body)
        .map_err(|error| format!("the answer is not JSON ({error}): {}", reported_body(body)))?;
    let value = match answer.pointer(&state.pointer) {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Number(number)) => number.to_string(),
        Some(Value::Bool(flag)) => flag.to_string(),
        _ => return Err(format!("the answer has no value at {}", state.pointer)),
    };
    state
        .values
        .iter()
        .find(|(known, _)| *known == value)
        .map(|(_, verdict)| *verdict)
        .ok_or_else(|| format!("{} is {value:?}, which no state names", state.pointer))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn context(event: &Value) -> CallContext<'_> {
        CallContext {
            target: "partner",
            event_id: "evt/1?x",
            entity_id: "acc-7",
            event,
        }
    }

    #[test]
    fn a_request_is_rendered_from_the_event_the_same_every_time() {
        let event = json!({"amount": {"cents": 1250}, "currency": "EUR", "order": "o 42"});
        let mut headers = HeaderMap::new();
        headers.insert("x-api-version", HeaderValue::from_static("2024-06-20"));
        let template = RequestTemplate::new(
            "post",
            "https://api.example.com/v1/orders/{/order}/refunds?entity={entity_id}",
            headers,
            BodyTemplate::Object(vec![
                ("amount".into(), Field::parse("/amount/cents")),
                ("currency".into(), Field::parse("/currency")),
                ("reference".into(), Field::Key),
                ("source".into(), Field::Const(json!({"system": "eos"}))),
            ]),
            Some("Idempotency-Key"),
            DEFAULT_KEY_FORMAT,
        )
        .expect("a template");
        let request = template.render(&context(&event)).expect("renders");
        assert_eq!(request.method, Method::POST);
        assert_eq!(
            request.url.as_str(),
            "https://api.example.com/v1/orders/o%2042/refunds?entity=acc-7"
        );
        assert_eq!(request.key, "partner:evt/1?x");
        assert_eq!(request.headers["idempotency-key"], "partner:evt/1?x");
        assert_eq!(request.headers["x-api-version"], "2024-06-20");
        assert_eq!(request.headers["content-type"], "application/json");
        assert_eq!(
            request.body.as_deref(),
            Some(
                br#"{"amount":1250,"currency":"EUR","reference":"partner:evt/1?x","source":{"system":"eos"}}"#
                    .as_slice()
            )
        );
        let again = template.render(&context(&event)).expect("renders");
        assert_eq!(
            (again.url, again.body),
            (request.url, request.body),
            "deterministic per event"
        );
    }

    #[test]
    fn a_value_in_the_url_never_changes_its_shape() {
        let event = json!({});
        let template = RequestTemplate::new(
            "GET",
            "http://h/charges/{key}",
            HeaderMap::new(),
            BodyTemplate::None,
            None,
            DEFAULT_KEY_FORMAT,
        )
        .expect("a template");
        let request = template.render(&context(&event)).expect("renders");
        assert_eq!(request.url.path(), "/charges/partner%3Aevt%2F1%3Fx");
        assert_eq!(request.url.query(), None);
        assert!(request.body.is_none() && !request.headers.contains_key("content-type"));
        assert!(
            !request.headers.contains_key("idempotency-key"),
            "no key header"
        );
    }

    #[test]
    fn what_cannot_work_is_refused_at_start_and_what_the_event_lacks_per_event() {
        let new = |url: &str, key_format: &str| {
            RequestTemplate::new(
                "POST",
                url,
                HeaderMap::new(),
                BodyTemplate::Event,
                Some(DEFAULT_KEY_HEADER),
                key_format,
            )
        };
        for (url, key_format, names) in [
            (
                "https://h/{amount}",
                DEFAULT_KEY_FORMAT,
                "unknown placeholder {amount}",
            ),
            ("https://h/{event_id", DEFAULT_KEY_FORMAT, "unclosed"),
            ("ftp://h/x", DEFAULT_KEY_FORMAT, "http or https"),
            ("https://u:secret@h/x", DEFAULT_KEY_FORMAT, "credentials"),
            ("https://h/x", "{key}", "cannot name itself"),
        ] {
            let error = new(url, key_format).expect_err("refused");
            assert!(
                error.contains(names) && !error.contains("secret"),
                "{error}"
            );
        }
        assert!(
            RequestTemplate::new(
                "NOT A METHOD",
                "https://h",
                HeaderMap::new(),
                BodyTemplate::None,
                None,
                "{event_id}"
            )
            .is_err()
        );
        let template = RequestTemplate::new(
            "POST",
            "https://h/{/order}",
            HeaderMap::new(),
            BodyTemplate::Object(vec![("amount".into(), Field::parse("/amount"))]),
            None,
            DEFAULT_KEY_FORMAT,
        )
        .expect("a template");
        let without_amount = json!({"order": "o-1"});
        assert_eq!(
            template
                .render(&context(&without_amount))
                .expect_err("refused"),
            "the event has no value at /amount"
        );
        let without_order = json!({"amount": 5});
        assert_eq!(
            template
                .render(&context(&without_order))
                .expect_err("refused"),
            "the event has no text or number at /order"
        );
    }

    #[test]
    fn provider_sims_charges_are_one_configuration() {
        let event = json!({"value": 1250});
        let template =
            RequestTemplate::provider_charges("http://127.0.0.1:8081/", "/value").expect("valid");
        let request = template.render(&context(&event)).expect("renders");
        assert_eq!(request.url.as_str(), "http://127.0.0.1:8081/charges");
        assert_eq!(
            request.body.as_deref(),
            Some(br#"{"amount":1250,"entity_id":"acc-7","event_id":"evt/1?x"}"#.as_slice())
        );
        assert_eq!(request.headers["idempotency-key"], "partner:evt/1?x");
    }

    #[test]
    fn answers_are_sorted_by_the_rules_and_retry_after_is_read_when_retrying() {
        let rules = AnswerRules::default();
        let sorted = |status, retry_after| rules.sort(status, retry_after, b"{}".to_vec());
        assert!(matches!(
            sorted(201, None).outcome,
            ChargeOutcome::Applied { status: 201, .. }
        ));
        let too_many = sorted(429, Some("7"));
        assert!(matches!(
            too_many.outcome,
            ChargeOutcome::Rejected {
                retryable: true,
                ..
            }
        ));
        assert_eq!(too_many.retry_after, Some(Duration::from_secs(7)));
        assert_eq!(
            sorted(429, Some("86400")).retry_after,
            Some(Duration::from_secs(3_600))
        );
        // An HTTP date: the wait until then, none once it has passed.
        assert_eq!(
            sorted(429, Some("Wed, 21 Oct 2015 07:28:00 GMT")).retry_after,
            Some(Duration::ZERO)
        );
        let in_two_minutes =
            httpdate::fmt_http_date(std::time::SystemTime::now() + Duration::from_secs(120));
        let wait = sorted(429, Some(&in_two_minutes))
            .retry_after
            .expect("a date is read");
        assert!(
            (Duration::from_secs(118)..=Duration::from_secs(120)).contains(&wait),
            "{wait:?}"
        );
        assert_eq!(sorted(429, Some("soon")).retry_after, None);
        assert!(matches!(
            sorted(409, None).outcome,
            ChargeOutcome::Rejected {
                retryable: true,
                ..
            }
        ));
        let refused = sorted(422, Some("5"));
        assert!(matches!(
            refused.outcome,
            ChargeOutcome::Rejected {
                retryable: false,
                ..
            }
        ));
        assert_eq!(refused.retry_after, None, "a refusal is final");
        for unknown in [408, 500, 503, 302, 100] {
            assert!(
                matches!(
                    sorted(unknown, None).outcome,
                    ChargeOutcome::Ambiguous { .. }
                ),
                "{unknown}"
            );
        }
        // A webhook receiver that answers 202 for done and 410 for "gone, never retry".
        let webhook = AnswerRules {
            applied: vec![StatusRange::parse("202").expect("a status")],
            retry: vec![],
            refused: vec![StatusRange::parse("410").expect("a status")],
        };
        assert!(matches!(
            webhook.sort(200, None, vec![]).outcome,
            ChargeOutcome::Ambiguous { .. }
        ));
        assert!(matches!(
            webhook.sort(410, None, vec![]).outcome,
            ChargeOutcome::Rejected {
                retryable: false,
                ..
            }
        ));
        assert_eq!(StatusRange::parse("500-599"), Ok(StatusRange(500, 599)));
        for bad in ["600", "5xx", "599-500", ""] {
            assert!(StatusRange::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_look_up_is_sorted_by_its_status_then_by_its_state_field() {
        let provider_sim = LookupRules::default();
        assert_eq!(
            provider_sim.sort(200, b"{}".to_vec()),
            Ok(ChargeLookup::Found(b"{}".to_vec()))
        );
        assert_eq!(provider_sim.sort(404, vec![]), Ok(ChargeLookup::NotFound));
        assert!(provider_sim.sort(500, b"down".to_vec()).is_err());
        // An API that answers every look-up with 200 and a status field, 202 while it works on
        // it, and 410 for a key it refused.
        let stateful = LookupRules {
            found: vec![StatusRange(200, 200)],
            not_found: vec![StatusRange(404, 404)],
            pending: vec![StatusRange(202, 202)],
            failed: vec![StatusRange(410, 410)],
            state: Some(StateField {
                pointer: "/status".into(),
                values: vec![
                    ("succeeded".into(), LookupVerdict::Found),
                    ("processing".into(), LookupVerdict::Pending),
                    ("canceled".into(), LookupVerdict::Failed),
                    ("unknown_key".into(), LookupVerdict::NotFound),
                ],
            }),
        };
        let answer = |status, body: &str| stateful.sort(status, body.as_bytes().to_vec());
        assert_eq!(
            answer(200, r#"{"status":"succeeded","id":"ch_1"}"#),
            Ok(ChargeLookup::Found(
                br#"{"status":"succeeded","id":"ch_1"}"#.to_vec()
            ))
        );
        assert_eq!(
            answer(200, r#"{"status":"processing"}"#),
            Ok(ChargeLookup::Pending)
        );
        assert_eq!(
            answer(200, r#"{"status":"canceled"}"#),
            Ok(ChargeLookup::Failed(r#"{"status":"canceled"}"#.into()))
        );
        assert_eq!(
            answer(200, r#"{"status":"unknown_key"}"#),
            Ok(ChargeLookup::NotFound)
        );
        assert_eq!(answer(202, ""), Ok(ChargeLookup::Pending));
        assert_eq!(
            answer(410, "refused"),
            Ok(ChargeLookup::Failed("refused".into()))
        );
        // What the rules do not name is never a verdict.
        for (status, body) in [
            (200, r#"{"status":"requires_action"}"#),
            (200, r#"{"id":"ch_1"}"#),
            (200, "not json"),
            (500, "down"),
        ] {
            assert!(answer(status, body).is_err(), "{status} {body}");
        }
        assert_eq!(LookupVerdict::parse("pending"), Ok(LookupVerdict::Pending));
        assert!(LookupVerdict::parse("done").is_err());
    }
}
