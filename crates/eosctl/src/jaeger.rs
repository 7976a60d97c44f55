//! The adapter for Jaeger's HTTP query API (`/api/services`, `/api/traces`), the one every
//! Jaeger (v1 and v2, any storage) serves on its query port (16686 by default).
//!
//! Jaeger's search needs a service name, so the traces of an event are found by asking, for
//! each service Jaeger knows, for the traces with a span of that service tagged
//! `event_id=<id>`; the answers are merged by trace id. Every service of eos-suite tags its spans
//! of an event that way (`docs/architecture/event-path.md` "The path of one event"), so a trace is
//! found even when some service's spans are missing from it.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Deserialize;
use serde_json::Value;

use crate::trace_tree::SpanRecord;

/// How many traces one search may return per service: an event has one trace per send of its
/// id (a reused id with other content is another send), so a few at most.
const SEARCH_LIMIT: u32 = 50;

#[derive(Debug, thiserror::Error)]
pub enum JaegerError {
    #[error("invalid Jaeger URL {url:?}: {reason}")]
    InvalidUrl { url: String, reason: String },
    #[error(
        "cannot reach Jaeger's query API at {url} (is Jaeger running? `deploy/local/stack up` \
         starts one on 127.0.0.1:16686; --jaeger-url or EOS_JAEGER_URL names another)"
    )]
    Unreachable {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("Jaeger answered {url} with HTTP {status}: {body}")]
    Status {
        url: String,
        status: reqwest::StatusCode,
        body: String,
    },
    #[error("Jaeger's answer to {url} is not the query API's JSON: {source}")]
    Decode {
        url: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("Jaeger reported an error for {url}: {message}")]
    Api { url: String, message: String },
}

/// `{"data": ..., "errors": [...]}`, the envelope of every query API answer.
#[derive(Debug, Deserialize)]
struct Envelope<T> {
    data: Option<T>,
    #[serde(default)]
    errors: Option<Vec<ApiError>>,
}

#[derive(Debug, Deserialize)]
struct ApiError {
    #[serde(default)]
    code: i64,
    #[serde(default)]
    msg: String,
}

/// One trace as `/api/traces` returns it. Process ids (`p1`, `p2`, ...) are local to one answer.
#[derive(Debug, Clone, Deserialize)]
pub struct JaegerTrace {
    #[serde(rename = "traceID")]
    pub trace_id: String,
    pub spans: Vec<JaegerSpan>,
    pub processes: BTreeMap<String, JaegerProcess>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct JaegerSpan {
    #[serde(rename = "traceID")]
    pub trace_id: String,
    #[serde(rename = "spanID")]
    pub span_id: String,
    #[serde(rename = "operationName")]
    pub operation_name: String,
    #[serde(default)]
    pub references: Vec<JaegerReference>,
    /// Unix microseconds.
    #[serde(rename = "startTime")]
    pub start_time: u64,
    /// Microseconds.
    pub duration: u64,
    #[serde(default)]
    pub tags: Vec<JaegerTag>,
    #[serde(rename = "processID")]
    pub process_id: String,
}

#[derive(Debug, Clone, Deserialize)]
pub struct JaegerReference {
    #[serde(rename = "refType")]
    pub ref_type: String,
    #[serde(rename = "traceID")]
    pub trace_id: String,
    #[serde(rename = "spanID")]
    pub span_id: String,
}

#[derive(Debug, Clone, Deserialize)]
pub struct JaegerTag {
    pub key: String,
    pub value: Value,
}

#[derive(Debug, Clone, Deserialize)]
pub struct JaegerProcess {
    #[serde(rename = "serviceName")]
    pub service_name: String,
}

impl JaegerTrace {
    /// The spans with their service names resolved (process ids mean nothing outside one answer)
    /// and their parent: the `CHILD_OF` reference within the trace. OpenTelemetry links become
    /// `FOLLOWS_FROM` references in Jaeger and are not parents.
    pub fn span_records(&self) -> Vec<SpanRecord> {
        self.spans
            .iter()
            .map(|span| SpanRecord {
                trace_id: self.trace_id.clone(),
                span_id: span.span_id.clone(),
                parent_span_id: span
                    .references
                    .iter()
                    .find(|r| r.ref_type == "CHILD_OF" && r.trace_id == span.trace_id)
                    .map(|r| r.span_id.clone()),
                service: self
                    .processes
                    .get(&span.process_id)
                    .map_or_else(|| "?".to_owned(), |p| p.service_name.clone()),
                name: span.operation_name.clone(),
                start_unix_micros: span.start_time,
                duration_micros: span.duration,
                tags: span
                    .tags
                    .iter()
                    .map(|t| (t.key.clone(), t.value.clone()))
                    .collect(),
            })
            .collect()
    }
}

/// `url` as errors and messages show it: without its user information, which is the
/// credential of a Jaeger behind basic authentication (`http://user:password@jaeger:16686`).
fn shown(url: &str) -> String {
    eos_runtime::secrets::redact_url_userinfo(url)
}

/// A client of one Jaeger query API.
#[derive(Debug, Clone)]
pub struct JaegerClient {
    base: String,
    http: reqwest::Client,
}

impl JaegerClient {
    /// `url` is the query API's base, e.g. `http://127.0.0.1:16686`.
    pub fn new(url: &str, request_timeout: Duration) -> Result<Self, JaegerError> {
        let base = url.trim_end_matches('/').to_owned();
        let parsed = reqwest::Url::parse(&base).map_err(|error| JaegerError::InvalidUrl {
            url: shown(url),
            reason: error.to_string(),
        })?;
        if parsed.scheme() != "http" {
            return Err(JaegerError::InvalidUrl {
                url: shown(url),
                reason: "expected an http:// URL (this eosctl is built without TLS)".to_owned(),
            });
        }
        let http = reqwest::Client::builder()
            .timeout(request_timeout)
            .build()
            .map_err(|source| JaegerError::Unreachable {
                url: shown(&base),
                source,
            })?;
        Ok(Self { base, http })
    }

    /// The query API's base URL as messages show it (no user information).
    pub fn url(&self) -> String {
        shown(&self.base)
    }

    /// The services Jaeger has spans of.
    pub async fn services(&self) -> Result<Vec<String>, JaegerError> {
        let url = format!("{}/api/services", self.base);
        Ok(self.get(&url, &[]).await?.unwrap_or_default())
    }

    /// The traces with a span of `service` carrying the tag `key=value`, started within
    /// `lookback` of now.
    pub async fn traces_with_tag(
        &self,
        service: &str,
        (key, value): (&str, &str),
        lookback: Duration,
    ) -> Result<Vec<JaegerTrace>, JaegerError> {
        let url = format!("{}/api/traces", self.base);
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let start = now.saturating_sub(lookback);
        let tags = serde_json::to_string(&BTreeMap::from([(key, value)]))
            .unwrap_or_else(|_| String::from("{}"));
        let query = [
            ("service", service.to_owned()),
            ("tags", tags),
            ("start", start.as_micros().to_string()),
            // A little ahead: span clocks of other processes may run ahead of this one's.
            (
                "end",
                (now + Duration::from_secs(60)).as_micros().to_string(),
            ),
            ("limit", SEARCH_LIMIT.to_string()),
        ];
        Ok(self.get(&url, &query).await?.unwrap_or_default())
    }

    /// Every span of every trace in which some span carries `event_id=<event_id>`, searched
    /// service by service.
    pub async fn spans_of_event(
        &self,
        event_id: &str,
        lookback: Duration,
    ) -> Result<EventSearch, JaegerError> {
        let services = self.services().await?;
        let mut spans: BTreeMap<(String, String), SpanRecord> = BTreeMap::new();
        for service in &services {
            for trace in self
                .traces_with_tag(service, ("event_id", event_id), lookback)
                .await?
            {
                for span in trace.span_records() {
                    spans.insert((span.trace_id.clone(), span.span_id.clone()), span);
                }
            }
        }
        Ok(EventSearch {
            services,
            spans: spans.into_values().collect(),
        })
    }

    async fn get<T: serde::de::DeserializeOwned>(
        &self,
        url: &str,
        query: &[(&str, String)],
    ) -> Result<Option<T>, JaegerError> {
        let response = self
            .http
            .get(url)
            .query(query)
            .send()
            .await
            .map_err(|source| JaegerError::Unreachable {
                url: shown(url),
                source,
            })?;
        let status = response.status();
        let body = response
            .bytes()
            .await
            .map_err(|source| JaegerError::Unreachable {
                url: shown(url),
                source,
            })?;
        if !status.is_success() {
            return Err(JaegerError::Status {
                url: shown(url),
                status,
                body: String::from_utf8_lossy(&body).chars().take(500).collect(),
            });
        }
        let envelope: Envelope<T> =
            serde_json::from_slice(&body).map_err(|source| JaegerError::Decode {
                url: shown(url),
                source,
            })?;
        if let Some(error) = envelope.errors.unwrap_or_default().into_iter().next() {
            return Err(JaegerError::Api {
                url: shown(url),
                message: format!("{} (code {})", error.msg, error.code),
            });
        }
        Ok(envelope.data)
    }
}

/// What one search found: the services Jaeger knows, and the spans of the event's traces.
#[derive(Debug, Clone, Default)]
pub struct EventSearch {
    pub services: Vec<String>,
    pub spans: Vec<SpanRecord>,
}

/// Parses a recorded `/api/traces` answer the way the client parses a live one.
#[cfg(test)]
pub(crate) fn parse_traces_answer(body: &str) -> Result<Vec<JaegerTrace>, serde_json::Error> {
    let envelope: Envelope<Vec<JaegerTrace>> = serde_json::from_str(body)?;
    Ok(envelope.data.unwrap_or_default())
}
