//! HTTP client for the provider's API (the one provider-sim implements): `POST /charges` with an
//! `Idempotency-Key` header, and `GET /charges/{key}` for reconciliation. The current span's
//! trace context travels in `traceparent`, its event id in `baggage`.
//!
//! [`ProviderClient::charge`] sorts every answer into what the caller must report: applied
//! (Complete), definitely not applied (Fail), or not known (MarkUnknown) — a timeout, a lost
//! response and a 5xx are all "not known", never a failure.

use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use sha2::{Digest as _, Sha256};
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use crate::http_call::{AnswerRules, LookupRules, RenderedRequest, SortedAnswer};

pub use crate::charge_answer::{
    ChargeLookup, ChargeOutcome, MAX_REPORTED_BODY_BYTES, reported_body,
};

pub const IDEMPOTENCY_KEY_HEADER: &str = "Idempotency-Key";

/// Longest provider body kept as it is. dedup-service stores an applied charge's result up to
/// 64 KiB; a longer body is replaced by a summary (its size and SHA-256), so a provider answering
/// with a huge document can neither exhaust the caller's memory nor make `Complete` invalid (which
/// would leave the applied charge to be reconciled over and over).
pub const MAX_KEPT_BODY_BYTES: usize = 32 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    /// `url` is redacted: a URL with a password never reaches a log or an error.
    #[error("bad provider URL {url:?}: {detail}")]
    Url { url: String, detail: String },
    #[error("bad provider CA certificate: {0}")]
    Certificate(#[source] reqwest::Error),
    #[error("provider request failed: {0}")]
    Transport(#[from] reqwest::Error),
    #[error("provider answered {status}: {body}")]
    Status { status: u16, body: String },
}

#[derive(Debug, Clone)]
pub struct ProviderClient {
    http: reqwest::Client,
    base: reqwest::Url,
}

/// How to reach a provider beyond its URL: the credential it expects and a private CA.
#[derive(Debug, Clone, Default)]
pub struct ProviderAccess {
    /// Sent with every request (e.g. `Authorization: Bearer …`). Marked sensitive, so neither its
    /// `Debug` nor reqwest's prints it.
    pub credential: Option<(HeaderName, HeaderValue)>,
    /// PEM certificates trusted for `https://` in addition to the built-in web roots.
    pub ca_pem: Option<Vec<u8>>,
}

impl ProviderAccess {
    /// `header: value`, with the value marked sensitive.
    pub fn with_credential(mut self, header: &str, value: &str) -> Result<Self, String> {
        let name = HeaderName::try_from(header)
            .map_err(|_| format!("{header:?} is not an HTTP header name"))?;
        let mut value = HeaderValue::try_from(value)
            .map_err(|_| format!("the value for {header} is not a valid HTTP header value"))?;
        value.set_sensitive(true);
        self.credential = Some((name, value));
        Ok(self)
    }

    /// The PEM certificates in `path` trusted too; the error names the file.
    pub fn with_ca_file(mut self, path: &std::path::Path) -> Result<Self, String> {
        let pem = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
        self.ca_pem = Some(pem);
        Ok(self)
    }
}

/// Refuses what cannot work or would leak: a scheme other than http(s) (no request could ever
/// succeed, so every charge would end UNKNOWN), and credentials in the URL (they would be logged
/// and served wherever the URL is; give them as a header instead).
fn parse_base_url(base_url: &str) -> Result<reqwest::Url, ProviderError> {
    let bad = |detail: &str| ProviderError::Url {
        url: eos_runtime::secrets::redact_url_userinfo(base_url),
        detail: detail.to_owned(),
    };
    let base = reqwest::Url::parse(base_url).map_err(|e| bad(&e.to_string()))?;
    if !matches!(base.scheme(), "http" | "https") {
        return Err(bad("the scheme must be http or https"));
    }
    if base.cannot_be_a_base() {
        return Err(bad("cannot be a base URL"));
    }
    if !base.username().is_empty() || base.password().is_some() {
        return Err(bad(
            "credentials in the URL are refused: give them as a header from a file or the \
             environment (provider_auth_file / provider_auth_env)",
        ));
    }
    Ok(base)
}

/// `traceparent` and the baggage (the event id) of the current span.
fn trace_headers() -> HeaderMap {
    let mut headers = HeaderMap::new();
    eos_runtime::trace_context::inject_http(&tracing::Span::current().context(), &mut headers);
    headers
}

impl ProviderClient {
    /// `timeout` bounds every request unless a call gives its own.
    pub fn new(
        base_url: &str,
        timeout: Duration,
        access: &ProviderAccess,
    ) -> Result<Self, ProviderError> {
        let base = parse_base_url(base_url)?;
        let mut builder = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout.min(Duration::from_secs(2)));
        if let Some((name, value)) = &access.credential {
            builder =
                builder.default_headers(HeaderMap::from_iter([(name.clone(), value.clone())]));
        }
        if let Some(pem) = &access.ca_pem {
            for certificate in
                reqwest::Certificate::from_pem_bundle(pem).map_err(ProviderError::Certificate)?
            {
                builder = builder.add_root_certificate(certificate);
            }
        }
        Ok(Self {
            http: builder.build()?,
            base,
        })
    }

    fn url(&self, segments: &[&str]) -> reqwest::Url {
        let mut url = self.base.clone();
        if let Ok(mut path) = url.path_segments_mut() {
            // Percent-encodes each segment: operation ids may hold ':' or '/'.
            path.pop_if_empty().extend(segments);
        }
        url
    }

    /// `GET {base}/charges/{key}`, sorted by [`LookupRules::default`] (provider-sim's look-up).
    pub async fn lookup(&self, key: &str) -> Result<ChargeLookup, ProviderError> {
        let request = RenderedRequest {
            method: reqwest::Method::GET,
            url: self.url(&["charges", key]),
            key: key.to_owned(),
            headers: HeaderMap::new(),
            body: None,
        };
        self.ask(&request, &LookupRules::default()).await
    }

    /// Sends a look-up `request` (rendered by a [`crate::http_call::RequestTemplate`]) with this
    /// client's credential, CA and the trace headers, and sorts the answer by `rules`. An answer
    /// the rules do not sort, or none, is an error: the reconciler asks again later.
    pub async fn ask(
        &self,
        request: &RenderedRequest,
        rules: &LookupRules,
    ) -> Result<ChargeLookup, ProviderError> {
        let mut builder = self
            .http
            .request(request.method.clone(), request.url.clone())
            .headers(trace_headers())
            .headers(request.headers.clone());
        if let Some(body) = &request.body {
            builder = builder.body(body.clone());
        }
        let response = builder.send().await?;
        let status = response.status().as_u16();
        let body = read_body(response).await?;
        rules
            .sort(status, body)
            .map_err(|body| ProviderError::Status { status, body })
    }

    /// `POST {base}/charges` with `Idempotency-Key: key` under `deadline`. Call only after
    /// Begin answered ACQUIRED, with the operation id as the key.
    pub async fn charge(
        &self,
        key: &str,
        body: &serde_json::Value,
        deadline: Duration,
    ) -> ChargeOutcome {
        let mut headers = HeaderMap::new();
        if let Ok(value) = HeaderValue::try_from(key) {
            headers.insert(IDEMPOTENCY_KEY_HEADER, value);
        }
        headers.insert(
            reqwest::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        let request = RenderedRequest {
            method: reqwest::Method::POST,
            url: self.url(&["charges"]),
            key: key.to_owned(),
            headers,
            body: Some(eos_core::json_text::to_vec(body)),
        };
        self.send(&request, &AnswerRules::default(), deadline)
            .await
            .outcome
    }

    /// Sends `request` (rendered by a [`crate::http_call::RequestTemplate`]) with this client's
    /// credential, CA and the trace headers under `deadline`, and sorts the answer by `rules`.
    /// No answer, or one lost while its body was read, is not known (`Ambiguous`), never a
    /// failure. Call only after Begin answered ACQUIRED for the request's key.
    pub async fn send(
        &self,
        request: &RenderedRequest,
        rules: &AnswerRules,
        deadline: Duration,
    ) -> SortedAnswer {
        let mut builder = self
            .http
            .request(request.method.clone(), request.url.clone())
            .headers(trace_headers())
            .headers(request.headers.clone())
            .timeout(deadline);
        if let Some(body) = &request.body {
            builder = builder.body(body.clone());
        }
        let not_known = |detail: String| SortedAnswer {
            outcome: ChargeOutcome::Ambiguous { detail },
            retry_after: None,
        };
        let response = match builder.send().await {
            Ok(response) => response,
            Err(error) => return not_known(format!("no answer: {error}")),
        };
        let status = response.status();
        let retry_after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned);
        // A body that cannot be read leaves even a 2xx ambiguous: the answer was lost.
        match read_body(response).await {
            Ok(body) => rules.sort(status.as_u16(), retry_after.as_deref(), body),
            Err(error) => not_known(format!("answer {status} lost while reading: {error}")),
        }
    }
}

/// The body when it is at most [`MAX_KEPT_BODY_BYTES`]; otherwise a JSON summary of it
/// (`provider_body_truncated`, `bytes`, `sha256`). Only that much is ever held: the rest is
/// hashed and counted as it arrives (the request's timeout bounds how long that may take).
async fn read_body(mut response: reqwest::Response) -> Result<Vec<u8>, reqwest::Error> {
    let mut kept = Vec::new();
    let mut total = 0usize;
    let mut digest = Sha256::new();
    while let Some(chunk) = response.chunk().await? {
        total += chunk.len();
        digest.update(&chunk);
        let room = (MAX_KEPT_BODY_BYTES + 1).saturating_sub(kept.len());
        kept.extend_from_slice(&chunk[..chunk.len().min(room)]);
    }
    if total <= MAX_KEPT_BODY_BYTES {
        return Ok(kept);
    }
    Ok(body_summary(total, &digest.finalize()))
}

fn body_summary(total: usize, sha256: &[u8]) -> Vec<u8> {
    let hex: String = sha256.iter().map(|byte| format!("{byte:02x}")).collect();
    serde_json::json!({ "provider_body_truncated": true, "bytes": total, "sha256": hex })
        .to_string()
        .into_bytes()
}

/// Sorts an HTTP answer to a charge by [`AnswerRules::default`]: 2xx applied; 408, 5xx and
/// anything unexpected ambiguous; other 4xx rejected. 409 and 429 are retryable (nothing was
/// applied, try again later), and so are 401 and 403: a missing or expired credential is the
/// operator's to fix, and the payment must not be given up for it.
pub fn classify(status: u16, body: Vec<u8>) -> ChargeOutcome {
    AnswerRules::default().sort(status, None, body).outcome
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_sorted_by_what_they_prove() {
        assert!(matches!(
            classify(201, vec![]),
            ChargeOutcome::Applied { .. }
        ));
        assert!(matches!(
            classify(200, vec![]),
            ChargeOutcome::Applied { .. }
        ));
        assert!(matches!(
            classify(500, vec![]),
            ChargeOutcome::Ambiguous { .. }
        ));
        assert!(matches!(
            classify(503, vec![]),
            ChargeOutcome::Ambiguous { .. }
        ));
        assert!(matches!(
            classify(408, vec![]),
            ChargeOutcome::Ambiguous { .. }
        ));
        assert!(matches!(
            classify(302, vec![]),
            ChargeOutcome::Ambiguous { .. }
        ));
        assert!(matches!(
            classify(422, vec![]),
            ChargeOutcome::Rejected {
                retryable: false,
                ..
            }
        ));
        assert!(matches!(
            classify(401, vec![]),
            ChargeOutcome::Rejected {
                retryable: true,
                ..
            }
        ));
        assert!(matches!(
            classify(429, vec![]),
            ChargeOutcome::Rejected {
                retryable: true,
                ..
            }
        ));
    }

    #[test]
    fn long_bodies_are_cut_to_fit_a_fail_reason() {
        // 10 KiB of two-byte characters: the cut must land on a char boundary.
        let body = "é".repeat(5 * 1024).into_bytes();
        let ChargeOutcome::Rejected { body: kept, .. } = classify(422, body.clone()) else {
            panic!("a 422 is a rejection");
        };
        assert!(kept.len() <= MAX_REPORTED_BODY_BYTES, "{}", kept.len());
        assert!(kept.starts_with("éé"));
        assert!(kept.ends_with("[truncated, 10240 bytes in all]"), "{kept}");
        // What the sink sends as the Fail reason stays under dedup-service's 4 KiB limit.
        assert!(format!("provider answered 422: {kept}").len() <= 4 * 1024);
        let ChargeOutcome::Ambiguous { detail } = classify(503, body) else {
            panic!("a 503 is ambiguous");
        };
        assert!(detail.len() <= MAX_REPORTED_BODY_BYTES + 16);
        // A short body is kept as it is.
        assert!(matches!(
            classify(402, b"declined".to_vec()),
            ChargeOutcome::Rejected { body, .. } if body == "declined"
        ));
    }

    /// Serves one HTTP answer with a `size`-byte body to the first connection.
    async fn one_answer(status: u16, size: usize) -> String {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.expect("accept");
            let mut request = vec![0; 64 * 1024];
            let _ = stream.read(&mut request).await;
            let head = format!(
                "HTTP/1.1 {status} X\r\ncontent-length: {size}\r\ncontent-type: application/json\r\n\r\n"
            );
            stream.write_all(head.as_bytes()).await.expect("head");
            stream.write_all(&vec![b'7'; size]).await.expect("body");
        });
        url
    }

    #[tokio::test]
    async fn a_huge_answer_is_kept_as_its_size_and_hash_only() {
        let size = 3 * 1024 * 1024;
        let url = one_answer(201, size).await;
        let client = ProviderClient::new(&url, Duration::from_secs(10), &ProviderAccess::default())
            .expect("url");
        let outcome = client
            .charge("op", &serde_json::json!({}), Duration::from_secs(10))
            .await;
        let ChargeOutcome::Applied { status: 201, body } = outcome else {
            panic!("a 2xx is applied whatever its size: {outcome:?}");
        };
        let summary: serde_json::Value = serde_json::from_slice(&body).expect("a JSON summary");
        assert_eq!(summary["provider_body_truncated"], true);
        assert_eq!(summary["bytes"], size);
        let expected: String = Sha256::digest(vec![b'7'; size])
            .iter()
            .map(|byte| format!("{byte:02x}"))
            .collect();
        assert_eq!(summary["sha256"], expected);
        assert!(body.len() < 200, "fits dedup-service's result limit");

        // A body at the limit is kept as it is.
        let url = one_answer(201, MAX_KEPT_BODY_BYTES).await;
        let client = ProviderClient::new(&url, Duration::from_secs(10), &ProviderAccess::default())
            .expect("url");
        let outcome = client
            .charge("op", &serde_json::json!({}), Duration::from_secs(10))
            .await;
        assert!(
            matches!(&outcome, ChargeOutcome::Applied { body, .. } if body.len() == MAX_KEPT_BODY_BYTES)
        );
    }

    #[test]
    fn keys_are_one_encoded_path_segment() {
        let access = ProviderAccess::default();
        let client = ProviderClient::new(
            "http://127.0.0.1:8081/api/",
            Duration::from_secs(1),
            &access,
        )
        .expect("url");
        assert_eq!(
            client.url(&["charges", "sink:a/b c"]).as_str(),
            "http://127.0.0.1:8081/api/charges/sink:a%2Fb%20c"
        );
        assert!(ProviderClient::new("not a url", Duration::from_secs(1), &access).is_err());
    }

    #[test]
    fn urls_that_cannot_work_or_would_leak_are_refused_without_echoing_the_password() {
        let access = ProviderAccess::default();
        let refused = |url: &str| {
            ProviderClient::new(url, Duration::from_secs(1), &access)
                .expect_err(url)
                .to_string()
        };
        let error = refused("https://user:MARKER-SECRET@provider.example/");
        assert!(error.contains("credentials in the URL"), "{error}");
        assert!(!error.contains("MARKER-SECRET"), "{error}");
        assert!(refused("ftp://provider.example/").contains("http or https"));
        assert!(refused("grpc://provider.example/").contains("http or https"));
        assert!(
            ProviderClient::new(
                "https://provider.example/v1/",
                Duration::from_secs(1),
                &access
            )
            .is_ok()
        );
    }

    #[test]
    fn the_credential_is_never_printed() {
        let access = ProviderAccess::default()
            .with_credential("Authorization", "Bearer MARKER-SECRET")
            .expect("valid header");
        let printed = format!("{access:?}");
        assert!(!printed.contains("MARKER-SECRET"), "{printed}");
        assert!(
            ProviderAccess::default()
                .with_credential("bad header", "x")
                .is_err()
        );
        assert!(
            ProviderAccess::default()
                .with_credential("Authorization", "line\nbreak")
                .is_err()
        );
    }
}
