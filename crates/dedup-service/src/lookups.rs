//! Per-target look-ups (`--lookups FILE`): for a target settled by `lookup`, the request that
//! asks its API about a key and how the answer is sorted into found, not found, pending or
//! failed (docs/dedup-service.md "Look-ups of any API"). A lookup target without one asks
//! `--provider-url`'s `GET /charges/{key}`, provider-sim's shape.
//!
//! ```toml
//! [[lookups]]
//! target = "partner"                 # operation ids partner:<event_id>
//! method = "GET"                     # [default: GET]
//! url = "https://partner.example/v1/charges/{key}"  # {key}, {target}, {event_id}
//! key_header = "Idempotency-Key"     # the key in a header too [default: none]
//! provider_auth_file = "/run/secrets/partner"  # the credential header's value, never here
//! provider_auth_header = "Authorization"       # [default: Authorization]
//! provider_ca_file = "/etc/partner-ca.pem"     # a private CA for https:// [default: web roots]
//! [lookups.headers]                  # static headers
//! "X-Api-Version" = "2024-06-20"
//! [lookups.answers]                  # status lists; the first holding a status decides
//! found = ["200-299"]                # SUCCEEDED with the answer as its result
//! not_found = ["404"]                # "not applied" once no request can still arrive
//! pending = ["202"]                  # received, not settled: ask again later
//! failed = ["410"]                   # refused for good: FAILED, a dead letter at the sink
//! state = "/status"                  # in a found answer, this value decides instead:
//! [lookups.answers.states]
//! succeeded = "found"
//! processing = "pending"
//! canceled = "failed"
//! ```
//!
//! Every mistake stops the service at start-up, naming the target and the field. An answer the
//! rules do not sort (another status, a state not listed) is an error the reconciler counts and
//! asks again about, never a verdict.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::time::Duration;

use dedup_client::http_call::{
    BodyTemplate, CallContext, LookupRules, LookupVerdict, RequestTemplate, StateField,
    StatusRange, static_headers,
};
use dedup_client::provider_client::{ChargeLookup, ProviderAccess, ProviderClient, ProviderError};
use serde::Deserialize;

use crate::target_policies::{ReconcileStrategy, TargetPolicies, target_of};

/// A look-up in flight.
pub(crate) type LookupFuture<'a> =
    Pin<Box<dyn Future<Output = Result<ChargeLookup, ProviderError>> + Send + 'a>>;

/// The file as read.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    lookups: Vec<RawLookup>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLookup {
    target: String,
    method: Option<String>,
    url: String,
    key_header: Option<String>,
    provider_auth_file: Option<PathBuf>,
    provider_auth_header: Option<String>,
    provider_ca_file: Option<PathBuf>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    #[serde(default)]
    answers: RawAnswers,
}

/// `[lookups.answers]`: each list given replaces its default.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAnswers {
    found: Option<Vec<String>>,
    not_found: Option<Vec<String>>,
    #[serde(default)]
    pending: Vec<String>,
    #[serde(default)]
    failed: Vec<String>,
    state: Option<String>,
    states: Option<BTreeMap<String, String>>,
}

/// One target's look-up: the request, its answer rules, and the client with its credential.
#[derive(Debug)]
pub(crate) struct TargetLookup {
    template: RequestTemplate,
    rules: LookupRules,
    client: ProviderClient,
}

impl TargetLookup {
    /// Asks the API about `operation_id` (the key), as `<target>:<event_id>`.
    pub(crate) fn ask<'a>(&'a self, operation_id: &'a str) -> LookupFuture<'a> {
        Box::pin(async move {
            let (target, event_id) = operation_id.split_once(':').unwrap_or(("", operation_id));
            let context = CallContext {
                target,
                event_id,
                entity_id: "",
                event: &serde_json::Value::Null,
            };
            let request = self
                .template
                .render(&context)
                .map_err(|detail| ProviderError::Url {
                    url: operation_id.to_owned(),
                    detail,
                })?;
            self.client.ask(&request, &self.rules).await
        })
    }
}

/// Every target's look-up, by name.
#[derive(Debug, Default)]
pub(crate) struct Lookups(HashMap<String, TargetLookup>);

/// The lookups file cannot be used; the message names the file, the target and the field.
#[derive(Debug, thiserror::Error)]
#[error("--lookups {path}: {detail}")]
pub(crate) struct LookupsError {
    path: String,
    detail: String,
}

impl Lookups {
    /// Reads and checks `path`: each target at most once, settled by `lookup` under
    /// `policies`, with a request that renders from a key alone; its credential and CA read now.
    pub(crate) fn load(
        path: &Path,
        timeout: Duration,
        policies: &TargetPolicies,
    ) -> Result<Self, LookupsError> {
        let error = |detail: String| LookupsError {
            path: path.display().to_string(),
            detail,
        };
        let text = std::fs::read_to_string(path).map_err(|e| error(e.to_string()))?;
        let raw: RawFile = toml::from_str(&text).map_err(|e| error(e.to_string()))?;
        let mut lookups = HashMap::new();
        for entry in raw.lookups {
            let target = entry.target.clone();
            let named = |detail: String| error(format!("target {target:?}: {detail}"));
            if target.is_empty() || target.contains(':') {
                return Err(named("a target name is not empty and holds no ':'".into()));
            }
            let strategy = policies.of(&format!("{target}:probe"));
            if strategy != ReconcileStrategy::Lookup {
                return Err(named(format!(
                    "its UNKNOWN intents are settled by {strategy:?} (--reconcile-strategy), \
                     so a look-up would never be asked; drop it or make the target lookup"
                )));
            }
            let lookup = target_lookup(entry, timeout).map_err(named)?;
            if lookups.insert(target.clone(), lookup).is_some() {
                return Err(named("named twice".into()));
            }
        }
        Ok(Self(lookups))
    }

    /// The look-up of the target `operation_id` belongs to, if it has one.
    pub(crate) fn of(&self, operation_id: &str) -> Option<&TargetLookup> {
        target_of(operation_id).and_then(|target| self.0.get(target))
    }

    /// The targets with a look-up, sorted (for the start-up log).
    pub(crate) fn targets(&self) -> Vec<&str> {
        let mut targets: Vec<&str> = self.0.keys().map(String::as_str).collect();
        targets.sort_unstable();
        targets
    }
}

fn target_lookup(raw: RawLookup, timeout: Duration) -> Result<TargetLookup, String> {
    // The service knows the key and what it is made of, never the event.
    if raw.url.contains("{entity_id}") || raw.url.contains("{/") {
        return Err(format!(
            "url {:?}: a look-up knows only {{key}}, {{target}} and {{event_id}}",
            raw.url
        ));
    }
    let template = RequestTemplate::new(
        raw.method.as_deref().unwrap_or("GET"),
        &raw.url,
        static_headers(&raw.headers.into_iter().collect::<Vec<_>>())?,
        BodyTemplate::None,
        raw.key_header.as_deref(),
        "{target}:{event_id}",
    )?;
    let rules = lookup_rules(raw.answers)?;
    let mut access = ProviderAccess::default();
    match (raw.provider_auth_file, raw.provider_auth_header) {
        (Some(path), header) => {
            let value = eos_runtime::secrets::read_secret_file(&path)
                .map_err(|e| format!("provider_auth_file: {e}"))?;
            access = access
                .with_credential(header.as_deref().unwrap_or("Authorization"), value.trim())?;
        }
        (None, Some(_)) => return Err("provider_auth_header needs provider_auth_file".into()),
        (None, None) => {}
    }
    if let Some(path) = raw.provider_ca_file {
        access = access
            .with_ca_file(&path)
            .map_err(|e| format!("provider_ca_file {e}"))?;
    }
    let client =
        ProviderClient::new(template.origin(), timeout, &access).map_err(|e| e.to_string())?;
    Ok(TargetLookup {
        template,
        rules,
        client,
    })
}

fn lookup_rules(raw: RawAnswers) -> Result<LookupRules, String> {
    let defaults = LookupRules::default();
    let ranges = |list: &[String], name: &str| {
        list.iter()
            .map(|text| StatusRange::parse(text).map_err(|e| format!("answers.{name}: {e}")))
            .collect::<Result<Vec<_>, _>>()
    };
    let state = match (raw.state, raw.states) {
        (Some(pointer), Some(states)) if pointer.starts_with('/') && !states.is_empty() => {
            let values = states
                .into_iter()
                .map(|(value, verdict)| {
                    LookupVerdict::parse(&verdict)
                        .map(|verdict| (value.clone(), verdict))
                        .map_err(|e| format!("answers.states.{value}: {e}"))
                })
                .collect::<Result<Vec<_>, _>>()?;
            Some(StateField { pointer, values })
        }
        (None, None) => None,
        _ => {
            return Err(
                "answers.state (a JSON pointer such as \"/status\") and answers.states (each \
                 value's found, not_found, pending or failed) go together"
                    .into(),
            );
        }
    };
    Ok(LookupRules {
        found: match raw.found {
            Some(list) => ranges(&list, "found")?,
            None => defaults.found,
        },
        not_found: match raw.not_found {
            Some(list) => ranges(&list, "not_found")?,
            None => defaults.not_found,
        },
        pending: ranges(&raw.pending, "pending")?,
        failed: ranges(&raw.failed, "failed")?,
        state,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policies() -> TargetPolicies {
        TargetPolicies::new(
            [("webhook".to_owned(), ReconcileStrategy::None)],
            [],
            Duration::from_secs(24 * 3600),
        )
    }

    fn load(text: &str) -> Result<Lookups, String> {
        let dir = std::env::temp_dir().join(format!("eos-lookups-{}", rand::random::<u64>()));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let path = dir.join("lookups.toml");
        std::fs::write(&path, text).map_err(|e| e.to_string())?;
        let loaded =
            Lookups::load(&path, Duration::from_secs(5), &policies()).map_err(|e| e.to_string());
        let _ = std::fs::remove_dir_all(&dir);
        loaded
    }

    #[tokio::test]
    async fn a_file_of_look_ups_is_read_and_each_mistake_is_named() {
        let lookups = load(
            r#"
            [[lookups]]
            target = "partner"
            url = "http://127.0.0.1:1/v1/charges/{key}?t={target}&e={event_id}"
            [lookups.answers]
            pending = ["202"]
            state = "/status"
            [lookups.answers.states]
            succeeded = "found"
            processing = "pending"
            "#,
        )
        .expect("a good file");
        assert_eq!(lookups.targets(), ["partner"]);
        assert!(lookups.of("partner:e-1").is_some());
        assert!(lookups.of("payments:e-1").is_none());
        for (text, named) in [
            (
                "[[lookups]]\ntarget = \"webhook\"\nurl = \"http://h/{key}\"",
                "settled by None",
            ),
            (
                "[[lookups]]\ntarget = \"p\"\nurl = \"http://h/{entity_id}\"",
                "knows only",
            ),
            (
                "[[lookups]]\ntarget = \"p\"\nurl = \"http://h/{/amount}\"",
                "knows only",
            ),
            (
                "[[lookups]]\ntarget = \"p\"\nurl = \"ftp://h/{key}\"",
                "http or https",
            ),
            (
                "[[lookups]]\ntarget = \"p\"\nurl = \"http://h/{key}\"\n\
                 [[lookups]]\ntarget = \"p\"\nurl = \"http://h/{key}\"",
                "named twice",
            ),
            (
                "[[lookups]]\ntarget = \"p\"\nurl = \"http://h/{key}\"\n[lookups.answers]\n\
                 state = \"/status\"",
                "go together",
            ),
            (
                "[[lookups]]\ntarget = \"p\"\nurl = \"http://h/{key}\"\n[lookups.answers]\n\
                 state = \"/status\"\nstates = { ok = \"done\" }",
                "answers.states.ok",
            ),
            (
                "[[lookups]]\ntarget = \"p\"\nurl = \"http://h/{key}\"\n[lookups.answers]\n\
                 pending = [\"2xx\"]",
                "answers.pending",
            ),
            (
                "[[lookups]]\ntarget = \"p\"\nurl = \"http://h/{key}\"\nprovider_auth_header = \"X\"",
                "needs provider_auth_file",
            ),
            (
                "[[lookups]]\ntarget = \"p\"\nurl = \"http://h/{key}\"\nprovider_auth_file = \"/nonexistent/secret\"",
                "provider_auth_file",
            ),
            (
                "[[lookups]]\ntarget = \"p\"\nurl = \"http://h/{key}\"\nmethd = \"GET\"",
                "unknown field",
            ),
        ] {
            let error = load(text).err().unwrap_or_default();
            assert!(error.contains(named), "{text}: {error}");
        }
    }

    #[tokio::test]
    async fn a_look_up_renders_the_key_into_its_url() {
        let lookups = load(
            "[[lookups]]\ntarget = \"partner\"\nkey_header = \"Idempotency-Key\"\n\
             url = \"http://127.0.0.1:1/v1/charges/{key}?event={event_id}\"",
        )
        .expect("a good file");
        let lookup = lookups.of("partner:evt/1").expect("partner's look-up");
        let request = lookup
            .template
            .render(&CallContext {
                target: "partner",
                event_id: "evt/1",
                entity_id: "",
                event: &serde_json::Value::Null,
            })
            .expect("renders");
        assert_eq!(
            request.url.as_str(),
            "http://127.0.0.1:1/v1/charges/partner%3Aevt%2F1?event=evt%2F1"
        );
        assert_eq!(request.key, "partner:evt/1");
        assert_eq!(request.headers["idempotency-key"], "partner:evt/1");
        assert!(request.body.is_none());
    }
}
