//! An `http` target's call, as its `--config` entry gives it: the request built from each event
//! and how the API's answers are sorted (docs/sink-writer.md "Calls to any HTTP API"). It becomes
//! a [`RequestTemplate`] and [`AnswerRules`] of dedup-client's `http_call`, the same machinery
//! that provider-sim's charges use, so both kinds share the intent protocol of `provider_target`.
//!
//! ```toml
//! [[targets]]
//! kind = "http"
//! name = "partner"                   # operation ids <name>:<event_id>
//! dedup_url = "http://127.0.0.1:50051"
//! method = "POST"                    # [default: POST]
//! url = "https://partner.example/v1/notifications?account={entity_id}"
//! key_header = "Idempotency-Key"     # "" sends no key [default: Idempotency-Key]
//! key_format = "{target}:{event_id}" # [default: {target}:{event_id}]
//! provider_auth_file = "/run/secrets/partner" # the credential header's value, never here
//! [targets.headers]                  # static headers
//! "X-Api-Version" = "2024-06-20"
//! [targets.body]                     # a JSON object of fields; or body = "event" | "none"
//! amount = "/payload/amount"         # a JSON pointer into the event
//! reference = "key"                  # event_id | entity_id | key | event, else a constant
//! livemode = false                   # a constant of any TOML type
//! [targets.answers]                  # status lists; the first list holding a status decides
//! applied = ["200-299"]
//! retry = ["409", "429"]             # Retry-After honoured
//! refused = ["400-499"]              # a dead letter with the status and a cut body
//! [targets.results]                  # each success's answer in a table (`effect_results`)
//! table = "partner_notifications"
//! columns = { notification_id = "/id" }
//! ```

use std::collections::BTreeMap;

use dedup_client::http_call::{
    AnswerRules, BodyTemplate, DEFAULT_KEY_FORMAT, DEFAULT_KEY_HEADER, Field, RequestTemplate,
    StatusRange, static_headers,
};
use serde::Deserialize;
use serde_json::Value;

/// `body`: `"event"`, `"none"`, or a table of fields.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum RawBody {
    Whole(String),
    Fields(BTreeMap<String, toml::Value>),
}

/// `[targets.answers]`: each list given replaces its default.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawAnswers {
    applied: Option<Vec<String>>,
    retry: Option<Vec<String>>,
    refused: Option<Vec<String>>,
}

/// An `http` target's fields as read, before they are checked.
#[derive(Debug, Default)]
pub(crate) struct RawHttpCall {
    pub(crate) method: Option<String>,
    pub(crate) url: Option<String>,
    pub(crate) headers: Option<BTreeMap<String, String>>,
    pub(crate) body: Option<RawBody>,
    pub(crate) key_header: Option<String>,
    pub(crate) key_format: Option<String>,
    pub(crate) answers: Option<RawAnswers>,
}

impl RawHttpCall {
    /// The fields set, by name: they belong to `http` targets only.
    pub(crate) fn fields_set(&self) -> impl Iterator<Item = &'static str> {
        [
            ("method", self.method.is_some()),
            ("url", self.url.is_some()),
            ("headers", self.headers.is_some()),
            ("body", self.body.is_some()),
            ("key_header", self.key_header.is_some()),
            ("key_format", self.key_format.is_some()),
            ("answers", self.answers.is_some()),
        ]
        .into_iter()
        .filter_map(|(field, set)| set.then_some(field))
    }
}

/// An `http` target's call, checked: [`HttpCall::template`] cannot fail for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpCall {
    pub method: String,
    /// With `{event_id}`, `{entity_id}`, `{key}`, `{target}` or `{/pointer}` placeholders.
    pub url: String,
    pub headers: Vec<(String, String)>,
    pub body: HttpBody,
    /// `None`: no key is sent (a webhook that takes none); the operation id is still the key.
    pub key_header: Option<String>,
    pub key_format: String,
    pub answers: AnswerRules,
}

/// The request's body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HttpBody {
    None,
    /// The event as JSON.
    Event,
    /// A JSON object: each field's source is a string ([`Field::parse`]) or a constant.
    Fields(Vec<(String, Value)>),
}

impl HttpCall {
    /// Checks `raw` by building its template once, so a mistake stops the sink at start-up with
    /// the target's name instead of dead-lettering every event.
    pub(crate) fn parse(raw: RawHttpCall) -> Result<Self, String> {
        let url = raw
            .url
            .ok_or("url is required (the API's URL, with {event_id}-like placeholders)")?;
        let body = match raw.body {
            None => HttpBody::Event,
            Some(RawBody::Whole(whole)) => match whole.as_str() {
                "event" => HttpBody::Event,
                "none" => HttpBody::None,
                other => {
                    return Err(format!(
                        "body {other:?}: expected \"event\", \"none\" or a [targets.body] table"
                    ));
                }
            },
            Some(RawBody::Fields(fields)) => HttpBody::Fields(
                fields
                    .into_iter()
                    .map(|(name, value)| {
                        serde_json::to_value(&value)
                            .map(|value| (name.clone(), value))
                            .map_err(|e| format!("body.{name}: {e}"))
                    })
                    .collect::<Result<_, _>>()?,
            ),
        };
        let answers = match raw.answers {
            None => AnswerRules::default(),
            Some(raw) => answer_rules(raw)?,
        };
        let call = Self {
            method: raw.method.unwrap_or_else(|| "POST".to_owned()),
            url,
            headers: raw.headers.unwrap_or_default().into_iter().collect(),
            body,
            key_header: match raw.key_header.as_deref() {
                None => Some(DEFAULT_KEY_HEADER.to_owned()),
                Some("") => None,
                Some(name) => Some(name.to_owned()),
            },
            key_format: raw
                .key_format
                .unwrap_or_else(|| DEFAULT_KEY_FORMAT.to_owned()),
            answers,
        };
        call.template()?;
        Ok(call)
    }

    /// The request template of this call.
    pub fn template(&self) -> Result<RequestTemplate, String> {
        let headers = static_headers(&self.headers)?;
        let body = match &self.body {
            HttpBody::None => BodyTemplate::None,
            HttpBody::Event => BodyTemplate::Event,
            HttpBody::Fields(fields) => BodyTemplate::Object(
                fields
                    .iter()
                    .map(|(name, value)| {
                        let field = match value {
                            Value::String(text) => Field::parse(text),
                            constant => Field::Const(constant.clone()),
                        };
                        (name.clone(), field)
                    })
                    .collect(),
            ),
        };
        RequestTemplate::new(
            &self.method,
            &self.url,
            headers,
            body,
            self.key_header.as_deref(),
            &self.key_format,
        )
    }
}

fn answer_rules(raw: RawAnswers) -> Result<AnswerRules, String> {
    let defaults = AnswerRules::default();
    let ranges = |list: Option<Vec<String>>, default: Vec<StatusRange>, name: &str| match list {
        None => Ok(default),
        Some(list) => list
            .iter()
            .map(|text| StatusRange::parse(text).map_err(|e| format!("answers.{name}: {e}")))
            .collect::<Result<Vec<_>, _>>(),
    };
    let rules = AnswerRules {
        applied: ranges(raw.applied, defaults.applied, "applied")?,
        retry: ranges(raw.retry, defaults.retry, "retry")?,
        refused: ranges(raw.refused, defaults.refused, "refused")?,
    };
    if rules.applied.is_empty() {
        return Err("answers.applied must list at least one status".to_owned());
    }
    Ok(rules)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_has_defaults_and_each_list_given_replaces_its_own() -> Result<(), String> {
        let call = HttpCall::parse(RawHttpCall {
            url: Some("http://h/hooks/{event_id}".into()),
            answers: Some(RawAnswers {
                retry: Some(vec!["429".into(), "503".into()]),
                ..RawAnswers::default()
            }),
            ..RawHttpCall::default()
        })?;
        assert_eq!(call.method, "POST");
        assert_eq!(call.body, HttpBody::Event);
        assert_eq!(call.key_header.as_deref(), Some("Idempotency-Key"));
        assert_eq!(call.key_format, "{target}:{event_id}");
        assert_eq!(
            call.answers.retry,
            vec![StatusRange(429, 429), StatusRange(503, 503)]
        );
        assert_eq!(call.answers.applied, AnswerRules::default().applied);
        let no_key = HttpCall::parse(RawHttpCall {
            url: Some("http://h/".into()),
            key_header: Some(String::new()),
            body: Some(RawBody::Whole("none".into())),
            ..RawHttpCall::default()
        })?;
        assert_eq!((no_key.key_header, no_key.body), (None, HttpBody::None));
        Ok(())
    }

    #[test]
    fn what_cannot_work_is_refused_with_its_field() {
        let url = || Some("http://h/x".to_owned());
        let cases = [
            (RawHttpCall::default(), "url is required"),
            (
                RawHttpCall {
                    url: Some("http://h/{amount}".into()),
                    ..RawHttpCall::default()
                },
                "unknown placeholder {amount}",
            ),
            (
                RawHttpCall {
                    url: Some("http://user:secret@h/".into()),
                    ..RawHttpCall::default()
                },
                "credentials in the URL are refused",
            ),
            (
                RawHttpCall {
                    url: url(),
                    method: Some("P OST".into()),
                    ..RawHttpCall::default()
                },
                "not an HTTP method",
            ),
            (
                RawHttpCall {
                    url: url(),
                    headers: Some(BTreeMap::from([("bad header".into(), "x".into())])),
                    ..RawHttpCall::default()
                },
                "not a header name",
            ),
            (
                RawHttpCall {
                    url: url(),
                    body: Some(RawBody::Whole("payload".into())),
                    ..RawHttpCall::default()
                },
                "body \"payload\"",
            ),
            (
                RawHttpCall {
                    url: url(),
                    answers: Some(RawAnswers {
                        refused: Some(vec!["4xx".into()]),
                        ..RawAnswers::default()
                    }),
                    ..RawHttpCall::default()
                },
                "answers.refused",
            ),
            (
                RawHttpCall {
                    url: url(),
                    answers: Some(RawAnswers {
                        applied: Some(Vec::new()),
                        ..RawAnswers::default()
                    }),
                    ..RawHttpCall::default()
                },
                "at least one status",
            ),
        ];
        for (raw, expected) in cases {
            let text = format!("{raw:?}");
            let error = HttpCall::parse(raw).expect_err(&text);
            assert!(error.contains(expected), "{text}: {error}");
        }
    }
}
