//! The `--config` file: which tables the sink writes, how, and from which parts of a record.
//!
//! ```toml
//! [[targets]]
//! table = "payments_by_id"      # must exist; may be schema-qualified ("ledger.payments")
//! kind = "append"               # append | versioned
//! key = "event_id"              # unique column [default: event_id (append), entity_id (versioned)]
//! retention = "30d"             # optional: purge rows older than this ...
//! retention_column = "written_at" # ... by this timestamp column
//!
//! [targets.columns]             # column = source
//! event_id = "event_id"
//! amount = "value"
//! note = "/payload/note"        # a JSON pointer into the record value
//! fingerprint = "fingerprint"
//! written_at = "now"
//!
//! [[targets]]
//! table = "account_state"
//! kind = "versioned"
//! key = "account"
//! version_column = "version"    # [default: version]
//! [targets.columns]
//! account = "entity_id"
//! version = "version"
//! state = "payload"
//!
//! [[targets]]
//! kind = "provider"             # a charge at an external provider, once per event
//! name = "payments"             # operation id and idempotency key: "<name>:<event_id>"
//! dedup_url = "http://127.0.0.1:50051"
//! provider_url = "http://127.0.0.1:8081"
//! amount = "value"              # the charge's amount: value or a JSON pointer [default: value]
//! call_timeout = "2s"           # the provider call's deadline [default: 2s]
//! lease_ttl = "30s"             # the intent's lease; longer than call_timeout [default: 30s]
//! concurrency = 64              # charges in a round at once; a waiting one holds none [default: 64]
//! rate_limit = 50               # calls a second at most; Retry-After pauses the target [default: none]
//! settle_timeout = "60s"        # an event still not final this long after its first round
//!                               # gives its batch up (retried from the checkpoint) [default: 60s]
//! provider_auth_file = "/run/secrets/provider" # the credential header's value, from a file ...
//! # provider_auth_env = "PROVIDER_AUTH"      # ... or from this environment variable
//! provider_auth_header = "Authorization"     # the header it goes in [default: Authorization]
//! provider_ca_file = "/etc/provider-ca.pem"  # a private CA for https:// [default: web roots]
//! ```
//!
//! A `kind = "http"` target calls any HTTP API the same way, with its own request and answers
//! (`http_target`, docs/sink-writer.md "Calls to any HTTP API").
//!
//! Sources: the envelope fields `event_id`, `entity_id`, `value`, `version`, `payload`,
//! `occurred_at`; `fingerprint` (hex SHA-256 of the event, docs/architecture/wire-format.md "Wire
//! format"); `record` (the whole record value as JSON); `kafka.topic`, `kafka.partition`,
//! `kafka.offset`, `kafka.key` (where the sink read it); `now` (the transaction time); or a JSON
//! pointer starting with `/`.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

pub use crate::http_target::{HttpBody, HttpCall};
use crate::http_target::{RawAnswers, RawBody, RawHttpCall};

/// A provider target's events in a round (`Begin`, the call, its report) at once when its
/// `concurrency` is not set; an event waiting for its outcome to settle holds none. Each round
/// holds at most one HTTP/1.1 connection to the provider, so this also bounds the provider
/// connections one target keeps open (reqwest's pool keeps them for reuse, and opens them as load
/// comes).
pub const DEFAULT_PROVIDER_CONCURRENCY: usize = 64;

/// How a target applies a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TargetKind {
    /// `INSERT … ON CONFLICT (key) DO NOTHING`; an ignored row with other content is a conflict.
    Append,
    /// Upsert applied only when the incoming version is higher than the stored one.
    Versioned,
}

impl fmt::Display for TargetKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Append => "append",
            Self::Versioned => "versioned",
        })
    }
}

/// Where a column's value comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    EventId,
    EntityId,
    Value,
    Version,
    Payload,
    OccurredAt,
    Fingerprint,
    Record,
    KafkaTopic,
    KafkaPartition,
    KafkaOffset,
    KafkaKey,
    /// `now()` in SQL: the transaction's time.
    Now,
    /// A JSON pointer (RFC 6901) into the record value.
    Pointer(String),
}

impl Source {
    pub fn parse(text: &str) -> Result<Self, String> {
        Ok(match text {
            "event_id" => Self::EventId,
            "entity_id" => Self::EntityId,
            "value" => Self::Value,
            "version" => Self::Version,
            "payload" => Self::Payload,
            "occurred_at" => Self::OccurredAt,
            "fingerprint" => Self::Fingerprint,
            "record" => Self::Record,
            "kafka.topic" => Self::KafkaTopic,
            "kafka.partition" => Self::KafkaPartition,
            "kafka.offset" => Self::KafkaOffset,
            "kafka.key" => Self::KafkaKey,
            "now" => Self::Now,
            pointer if pointer.starts_with('/') => Self::Pointer(pointer.to_owned()),
            other => {
                return Err(format!(
                    "unknown source {other:?}: expected an envelope field (event_id, entity_id, \
                     value, version, payload, occurred_at), fingerprint, record, kafka.topic, \
                     kafka.partition, kafka.offset, kafka.key, now, or a JSON pointer like /payload/x"
                ));
            }
        })
    }

    /// Where the record was read, rather than what it says: not part of its content, so a
    /// duplicate delivery at another offset is still a duplicate.
    pub fn is_position(&self) -> bool {
        matches!(
            self,
            Self::KafkaTopic | Self::KafkaPartition | Self::KafkaOffset
        )
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = match self {
            Self::EventId => "event_id",
            Self::EntityId => "entity_id",
            Self::Value => "value",
            Self::Version => "version",
            Self::Payload => "payload",
            Self::OccurredAt => "occurred_at",
            Self::Fingerprint => "fingerprint",
            Self::Record => "record",
            Self::KafkaTopic => "kafka.topic",
            Self::KafkaPartition => "kafka.partition",
            Self::KafkaOffset => "kafka.offset",
            Self::KafkaKey => "kafka.key",
            Self::Now => "now",
            Self::Pointer(pointer) => pointer,
        };
        f.write_str(text)
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TargetsFile {
    targets: Vec<RawTarget>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
enum RawKind {
    Append,
    Versioned,
    Provider,
    Http,
}

/// Fields of every kind; `validate` and `validate_provider` say which belong to which.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTarget {
    kind: RawKind,
    table: Option<String>,
    key: Option<String>,
    version_column: Option<String>,
    retention: Option<String>,
    retention_column: Option<String>,
    columns: Option<BTreeMap<String, String>>,
    name: Option<String>,
    dedup_url: Option<String>,
    provider_url: Option<String>,
    amount: Option<String>,
    call_timeout: Option<String>,
    lease_ttl: Option<String>,
    concurrency: Option<usize>,
    rate_limit: Option<u32>,
    settle_timeout: Option<String>,
    provider_auth_header: Option<String>,
    provider_auth_env: Option<String>,
    provider_auth_file: Option<PathBuf>,
    provider_ca_file: Option<PathBuf>,
    method: Option<String>,
    url: Option<String>,
    headers: Option<BTreeMap<String, String>>,
    body: Option<RawBody>,
    key_header: Option<String>,
    key_format: Option<String>,
    answers: Option<RawAnswers>,
    results: Option<RawResults>,
}

/// `[targets.results]` of a provider-like target.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawResults {
    table: String,
    columns: BTreeMap<String, RawPointers>,
}

/// A result column's JSON pointer, or several tried in order.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum RawPointers {
    One(String),
    Several(Vec<String>),
}

impl RawTarget {
    /// The `http` kind's fields, taken out of `self`.
    fn take_http_call(&mut self) -> RawHttpCall {
        RawHttpCall {
            method: self.method.take(),
            url: self.url.take(),
            headers: self.headers.take(),
            body: self.body.take(),
            key_header: self.key_header.take(),
            key_format: self.key_format.take(),
            answers: self.answers.take(),
        }
    }
}

/// Everything a targets file configures.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Targets {
    pub tables: Vec<TargetSpec>,
    pub providers: Vec<ProviderSpec>,
}

/// A `provider` or `http` target: one call per event to an external API, through
/// dedup-service's intents (see `provider_target`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderSpec {
    pub name: String,
    pub dedup_url: String,
    /// provider-sim's base URL, or an `http` target's URL template: what logs name.
    pub provider_url: String,
    /// The request each event makes.
    pub call: ProviderCall,
    pub call_timeout: Duration,
    pub lease_ttl: Duration,
    pub concurrency: usize,
    /// Calls a second at most, and `Retry-After` honoured (`call_pacing`); `None`: no limit.
    pub rate_limit: Option<u32>,
    pub settle_timeout: Duration,
    /// The header that carries the provider's credential, and where its value is read from at
    /// start-up (never from the URL, which is logged).
    pub auth: Option<ProviderAuth>,
    pub ca_file: Option<PathBuf>,
    /// Where the useful part of each success is written, in the batch's transaction.
    pub results: Option<ResultsSpec>,
}

/// `[targets.results]`: one row per charged event in `table` (`event_id` unique, `operation_id`,
/// then `columns`), each column the first of its JSON pointers that the stored answer has
/// (docs/sink-writer.md "The answer in a table").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResultsSpec {
    pub table: String,
    pub columns: Vec<(String, Vec<String>)>,
}

/// `event_id` and `operation_id` are the results table's own columns.
const RESULTS_KEY_COLUMNS: [&str; 2] = ["event_id", "operation_id"];

fn results_spec(name: &str, raw: RawResults) -> Result<ResultsSpec, TargetsError> {
    let table = raw.table.trim().to_owned();
    if table.is_empty() {
        return Err(invalid(name, "results.table must not be empty"));
    }
    if raw.columns.is_empty() {
        return Err(invalid(
            name,
            "results.columns must name at least one column (a JSON pointer into the answer)",
        ));
    }
    let mut columns = Vec::with_capacity(raw.columns.len());
    for (column, pointers) in raw.columns {
        if RESULTS_KEY_COLUMNS.contains(&column.as_str()) {
            return Err(invalid(
                name,
                format!("results.columns.{column}: {column} is written by the sink itself"),
            ));
        }
        let pointers = match pointers {
            RawPointers::One(pointer) => vec![pointer],
            RawPointers::Several(pointers) => pointers,
        };
        if pointers.is_empty() || pointers.iter().any(|pointer| !pointer.starts_with('/')) {
            return Err(invalid(
                name,
                format!(
                    "results.columns.{column}: a JSON pointer into the answer (\"/id\") or a \
                     list of them"
                ),
            ));
        }
        columns.push((column, pointers));
    }
    Ok(ResultsSpec { table, columns })
}

/// The request a provider-like target makes per event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProviderCall {
    /// provider-sim's `POST {provider_url}/charges`; `amount` is `value` or a JSON pointer to an
    /// integer.
    Charges { amount: Source },
    /// Any HTTP API (`kind = "http"`).
    Http(HttpCall),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderAuth {
    pub header: String,
    pub value_from: SecretSource,
}

/// Where a secret is read from: the file or the variable is named here, the value never is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretSource {
    Env(String),
    File(PathBuf),
}

impl ProviderSpec {
    /// The operation id at dedup-service, and the provider's idempotency key.
    pub fn operation_id(&self, event_id: &str) -> String {
        format!("{}:{event_id}", self.name)
    }
}

/// One target as configured, validated for shape (the database check comes at start-up).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetSpec {
    pub table: String,
    pub kind: TargetKind,
    pub key: String,
    /// Versioned targets only.
    pub version_column: Option<String>,
    /// `(column, source)` in a stable order.
    pub columns: Vec<(String, Source)>,
    pub retention: Option<Retention>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retention {
    pub keep: Duration,
    pub column: String,
}

impl TargetSpec {
    pub fn source_of(&self, column: &str) -> Option<&Source> {
        self.columns
            .iter()
            .find(|(name, _)| name == column)
            .map(|(_, source)| source)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TargetsError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Parse { path: String, message: String },
    #[error("target {table}: {message}")]
    Invalid { table: String, message: String },
}

fn invalid(table: &str, message: impl Into<String>) -> TargetsError {
    TargetsError::Invalid {
        table: table.to_owned(),
        message: message.into(),
    }
}

/// Reads and validates a targets file.
pub fn load(path: &Path) -> Result<Targets, TargetsError> {
    let text = std::fs::read_to_string(path).map_err(|source| TargetsError::Read {
        path: path.display().to_string(),
        source,
    })?;
    parse(&text).map_err(|error| match error {
        TargetsError::Parse { message, .. } => TargetsError::Parse {
            path: path.display().to_string(),
            message,
        },
        other => other,
    })
}

pub fn parse(text: &str) -> Result<Targets, TargetsError> {
    let file: TargetsFile = toml::from_str(text).map_err(|e| TargetsError::Parse {
        path: String::new(),
        message: e.to_string(),
    })?;
    if file.targets.is_empty() {
        return Err(TargetsError::Parse {
            path: String::new(),
            message: "no [[targets]]".into(),
        });
    }
    let mut targets = Targets::default();
    for raw in file.targets {
        let kind = match raw.kind {
            RawKind::Append => TargetKind::Append,
            RawKind::Versioned => TargetKind::Versioned,
            RawKind::Provider | RawKind::Http => {
                let spec = validate_provider(raw)?;
                if targets.providers.iter().any(|p| p.name == spec.name) {
                    return Err(invalid(&spec.name, "listed twice"));
                }
                targets.providers.push(spec);
                continue;
            }
        };
        let spec = validate(raw, kind)?;
        if targets.tables.iter().any(|s| s.table == spec.table) {
            return Err(invalid(&spec.table, "listed twice"));
        }
        targets.tables.push(spec);
    }
    Ok(targets)
}

fn duration(
    target: &str,
    field: &str,
    text: Option<String>,
    default: Duration,
) -> Result<Duration, TargetsError> {
    match text {
        None => Ok(default),
        Some(text) => humantime::parse_duration(&text)
            .map_err(|e| invalid(target, format!("{field} {text:?}: {e}"))),
    }
}

fn validate_provider(mut raw: RawTarget) -> Result<ProviderSpec, TargetsError> {
    let name = raw.name.take().unwrap_or_default().trim().to_owned();
    if name.is_empty() || name.contains(':') {
        return Err(invalid(
            "<provider>",
            "a provider target needs a name without ':' (operation ids are <name>:<event_id>)",
        ));
    }
    refuse_table_fields(&name, &raw)?;
    let url = |field: &str, value: Option<String>| match value {
        Some(url) if url.starts_with("http://") || url.starts_with("https://") => Ok(url),
        // Shown without its user information, which could be a credential.
        Some(url) => Err(invalid(
            &name,
            format!(
                "{field} {:?} must be an http:// or https:// URL",
                eos_runtime::secrets::redact_url_userinfo(&url)
            ),
        )),
        None => Err(invalid(&name, format!("{field} is required"))),
    };
    let dedup_url = url("dedup_url", raw.dedup_url.take())?;
    let (provider_url, call) = if raw.kind == RawKind::Http {
        let charge_field = [
            ("provider_url", raw.provider_url.is_some()),
            ("amount", raw.amount.is_some()),
        ]
        .into_iter()
        .find_map(|(field, set)| set.then_some(field));
        refuse_other_kinds_field(&name, "http", charge_field)?;
        let call = HttpCall::parse(raw.take_http_call()).map_err(|e| invalid(&name, e))?;
        (call.url.clone(), ProviderCall::Http(call))
    } else {
        refuse_other_kinds_field(&name, "provider", raw.take_http_call().fields_set().next())?;
        let provider_url = url("provider_url", raw.provider_url.take())?;
        let amount = charge_amount(&name, raw.amount.as_deref())?;
        (provider_url, ProviderCall::Charges { amount })
    };
    let timing = provider_timing(&name, &raw)?;
    let concurrency = raw.concurrency.unwrap_or(DEFAULT_PROVIDER_CONCURRENCY);
    if concurrency == 0 {
        return Err(invalid(&name, "concurrency must be at least 1"));
    }
    let rate_limit = match raw.rate_limit {
        Some(0) => return Err(invalid(&name, "rate_limit 0: calls a second, at least 1")),
        rate => rate,
    };
    let auth = provider_auth(&name, &mut raw)?;
    let results = raw
        .results
        .take()
        .map(|results| results_spec(&name, results))
        .transpose()?;
    Ok(ProviderSpec {
        name,
        dedup_url,
        provider_url,
        call,
        call_timeout: timing.call_timeout,
        lease_ttl: timing.lease_ttl,
        concurrency,
        rate_limit,
        settle_timeout: timing.settle_timeout,
        auth,
        ca_file: raw.provider_ca_file,
        results,
    })
}

/// A field of the other provider-like kind on a `kind` target is a mistake, named.
fn refuse_other_kinds_field(
    name: &str,
    kind: &str,
    field: Option<&str>,
) -> Result<(), TargetsError> {
    match field {
        Some(field) => Err(invalid(
            name,
            format!(
                "{field} is not for {kind} targets (provider targets take provider_url and \
                 amount; http targets url, method, headers, body, key_header, key_format and \
                 answers)"
            ),
        )),
        None => Ok(()),
    }
}

/// provider-sim's charge amount: `value` or a JSON pointer to an integer.
fn charge_amount(name: &str, amount: Option<&str>) -> Result<Source, TargetsError> {
    match amount.unwrap_or("value") {
        "value" => Ok(Source::Value),
        pointer if pointer.starts_with('/') => Ok(Source::Pointer(pointer.to_owned())),
        other => Err(invalid(
            name,
            format!("amount {other:?}: expected value or a JSON pointer like /payload/amount"),
        )),
    }
}

/// A provider target's timeouts.
struct ProviderTiming {
    call_timeout: Duration,
    lease_ttl: Duration,
    settle_timeout: Duration,
}

fn provider_timing(name: &str, raw: &RawTarget) -> Result<ProviderTiming, TargetsError> {
    let call_timeout = duration(
        name,
        "call_timeout",
        raw.call_timeout.clone(),
        Duration::from_secs(2),
    )?;
    let lease_ttl = duration(
        name,
        "lease_ttl",
        raw.lease_ttl.clone(),
        Duration::from_secs(30),
    )?;
    let settle_timeout = duration(
        name,
        "settle_timeout",
        raw.settle_timeout.clone(),
        Duration::from_secs(60),
    )?;
    // The lease must outlive the call and the report after it, or a slow answer would find a
    // newer holder (harmless, but every such call would be reconciled instead of reported).
    if lease_ttl < call_timeout * 2 {
        return Err(invalid(
            name,
            format!(
                "lease_ttl {} must be at least twice call_timeout {}",
                humantime::format_duration(lease_ttl),
                humantime::format_duration(call_timeout)
            ),
        ));
    }
    Ok(ProviderTiming {
        call_timeout,
        lease_ttl,
        settle_timeout,
    })
}

/// The provider's credential: a header and where its value is read from, never the value.
fn provider_auth(name: &str, raw: &mut RawTarget) -> Result<Option<ProviderAuth>, TargetsError> {
    let value_from = match (raw.provider_auth_env.take(), raw.provider_auth_file.take()) {
        (Some(_), Some(_)) => {
            return Err(invalid(
                name,
                "give provider_auth_env or provider_auth_file, not both",
            ));
        }
        (Some(variable), None) => Some(SecretSource::Env(variable)),
        (None, Some(path)) => Some(SecretSource::File(path)),
        (None, None) => None,
    };
    match (value_from, raw.provider_auth_header.take()) {
        (Some(value_from), header) => Ok(Some(ProviderAuth {
            header: header.unwrap_or_else(|| "Authorization".to_owned()),
            value_from,
        })),
        (None, Some(_)) => Err(invalid(
            name,
            "provider_auth_header needs provider_auth_env or provider_auth_file",
        )),
        (None, None) => Ok(None),
    }
}

/// A table target's fields on a provider target are a mistake, named.
fn refuse_table_fields(name: &str, raw: &RawTarget) -> Result<(), TargetsError> {
    let table_fields = [
        ("table", raw.table.is_some()),
        ("key", raw.key.is_some()),
        ("version_column", raw.version_column.is_some()),
        ("retention", raw.retention.is_some()),
        ("retention_column", raw.retention_column.is_some()),
        ("columns", raw.columns.is_some()),
    ];
    match table_fields.iter().find(|(_, set)| *set) {
        Some((field, _)) => Err(invalid(
            name,
            format!("{field} is for table targets, not provider targets"),
        )),
        None => Ok(()),
    }
}

/// A provider-like target's fields on a table target are a mistake, named.
fn refuse_provider_fields(table: &str, raw: &mut RawTarget) -> Result<(), TargetsError> {
    if let Some(field) = raw.take_http_call().fields_set().next() {
        return Err(invalid(
            table,
            format!("{field} is for http targets, not table targets"),
        ));
    }
    let provider_fields = [
        ("name", raw.name.is_some()),
        ("dedup_url", raw.dedup_url.is_some()),
        ("provider_url", raw.provider_url.is_some()),
        ("amount", raw.amount.is_some()),
        ("call_timeout", raw.call_timeout.is_some()),
        ("lease_ttl", raw.lease_ttl.is_some()),
        ("provider_auth_header", raw.provider_auth_header.is_some()),
        ("provider_auth_env", raw.provider_auth_env.is_some()),
        ("provider_auth_file", raw.provider_auth_file.is_some()),
        ("provider_ca_file", raw.provider_ca_file.is_some()),
        ("concurrency", raw.concurrency.is_some()),
        ("rate_limit", raw.rate_limit.is_some()),
        ("settle_timeout", raw.settle_timeout.is_some()),
        ("results", raw.results.is_some()),
    ];
    if let Some((field, _)) = provider_fields.iter().find(|(_, set)| *set) {
        return Err(invalid(
            table,
            format!("{field} is for provider targets, not table targets"),
        ));
    }
    Ok(())
}

fn validate(mut raw: RawTarget, kind: TargetKind) -> Result<TargetSpec, TargetsError> {
    let table = raw.table.take().unwrap_or_default().trim().to_owned();
    if table.is_empty() {
        return Err(invalid("<empty>", "table must not be empty"));
    }
    refuse_provider_fields(&table, &mut raw)?;
    let raw_columns = raw.columns.unwrap_or_default();
    let mut columns = Vec::with_capacity(raw_columns.len());
    for (column, source) in raw_columns {
        let source =
            Source::parse(&source).map_err(|m| invalid(&table, format!("{column}: {m}")))?;
        columns.push((column, source));
    }
    let key = raw.key.unwrap_or_else(|| match kind {
        TargetKind::Append => "event_id".into(),
        TargetKind::Versioned => "entity_id".into(),
    });
    let mapped = |name: &str| columns.iter().any(|(c, _)| c == name);
    if !mapped(&key) {
        return Err(invalid(
            &table,
            format!("the key column {key:?} has no source in [targets.columns]"),
        ));
    }
    if columns.iter().any(|(c, s)| c == &key && *s == Source::Now) {
        return Err(invalid(&table, "the key column cannot come from `now`"));
    }
    let version_column = match kind {
        TargetKind::Append => {
            if raw.version_column.is_some() {
                return Err(invalid(
                    &table,
                    "version_column is only for versioned targets",
                ));
            }
            None
        }
        TargetKind::Versioned => {
            let column = raw.version_column.unwrap_or_else(|| "version".into());
            if !mapped(&column) {
                return Err(invalid(
                    &table,
                    format!("the version column {column:?} has no source in [targets.columns]"),
                ));
            }
            if column == key {
                return Err(invalid(&table, "the version column cannot be the key"));
            }
            Some(column)
        }
    };
    let retention = match (raw.retention, raw.retention_column) {
        (None, None) => None,
        (Some(keep), Some(column)) => {
            let keep = humantime::parse_duration(&keep)
                .map_err(|e| invalid(&table, format!("retention {keep:?}: {e}")))?;
            Some(Retention { keep, column })
        }
        (Some(_), None) => {
            return Err(invalid(
                &table,
                "retention needs retention_column (the timestamp the age is measured by)",
            ));
        }
        (None, Some(_)) => return Err(invalid(&table, "retention_column without retention")),
    };
    Ok(TargetSpec {
        table,
        kind,
        key,
        version_column,
        columns,
        retention,
    })
}

/// The default targets, the reference practice's tables (docs/ARCHITECTURE.md "The reference
/// practice"; created by the migrations): `event_sink`, append by `event_id`, and
/// `entity_state`, versioned by `entity_id`.
pub fn defaults() -> Vec<TargetSpec> {
    let columns = |pairs: &[(&str, Source)]| {
        pairs
            .iter()
            .map(|(c, s)| ((*c).to_owned(), s.clone()))
            .collect::<Vec<_>>()
    };
    vec![
        TargetSpec {
            table: "event_sink".into(),
            kind: TargetKind::Append,
            key: "event_id".into(),
            version_column: None,
            columns: columns(&[
                ("event_id", Source::EventId),
                ("entity_id", Source::EntityId),
                ("value", Source::Value),
                ("payload", Source::Payload),
                ("fingerprint", Source::Fingerprint),
                ("source_topic", Source::KafkaTopic),
                ("source_partition", Source::KafkaPartition),
                ("source_offset", Source::KafkaOffset),
                ("written_at", Source::Now),
            ]),
            retention: None,
        },
        TargetSpec {
            table: "entity_state".into(),
            kind: TargetKind::Versioned,
            key: "entity_id".into(),
            version_column: Some("version".into()),
            columns: columns(&[
                ("entity_id", Source::EntityId),
                ("version", Source::Version),
                ("payload", Source::Payload),
                ("event_id", Source::EventId),
                ("updated_at", Source::Now),
            ]),
            retention: None,
        },
    ]
}

/// The retention check (docs/architecture/retention.md "Retention and the replay horizon"): a purge
/// must not forget a key that a replay can still bring.
pub fn check_retention(
    specs: &[TargetSpec],
    replay_horizon: Duration,
    margin: Duration,
) -> Result<(), String> {
    let needed = replay_horizon + margin;
    for spec in specs {
        if let Some(retention) = &spec.retention
            && retention.keep < needed
        {
            return Err(format!(
                "target {}: retention {} is shorter than --replay-horizon {} plus \
                 --retention-margin {} (= {}); a replay older than the retention would write an \
                 event again. Keep rows longer, or lower the replay horizon if the input really \
                 cannot be replayed that far",
                spec.table,
                humantime::format_duration(retention.keep),
                humantime::format_duration(replay_horizon),
                humantime::format_duration(margin),
                humantime::format_duration(needed),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = r#"
        [[targets]]
        table = "payments_by_id"
        kind = "append"
        retention = "30d"
        retention_column = "written_at"
        [targets.columns]
        event_id = "event_id"
        amount = "value"
        note = "/payload/note"
        written_at = "now"

        [[targets]]
        table = "account_state"
        kind = "versioned"
        key = "account"
        [targets.columns]
        account = "entity_id"
        version = "version"
        state = "payload"
    "#;

    #[test]
    fn parses_both_kinds_with_defaults() -> Result<(), TargetsError> {
        let specs = parse(EXAMPLE)?.tables;
        assert_eq!(specs.len(), 2);
        assert_eq!(specs[0].key, "event_id");
        assert_eq!(
            specs[0].source_of("note"),
            Some(&Source::Pointer("/payload/note".into()))
        );
        assert_eq!(specs[0].source_of("written_at"), Some(&Source::Now));
        assert_eq!(
            specs[0].retention,
            Some(Retention {
                keep: Duration::from_secs(30 * 24 * 3600),
                column: "written_at".into()
            })
        );
        assert_eq!(specs[1].kind, TargetKind::Versioned);
        assert_eq!(specs[1].version_column.as_deref(), Some("version"));
        Ok(())
    }

    #[test]
    fn mistakes_name_the_table_and_the_column() {
        let cases = [
            (
                "[[targets]]\ntable='t'\nkind='append'\n[targets.columns]\nid='event_id'",
                "key column \"event_id\"",
            ),
            (
                "[[targets]]\ntable='t'\nkind='versioned'\n[targets.columns]\nentity_id='entity_id'",
                "version column",
            ),
            (
                "[[targets]]\ntable='t'\nkind='append'\n[targets.columns]\nevent_id='evnt_id'",
                "unknown source \"evnt_id\"",
            ),
            (
                "[[targets]]\ntable='t'\nkind='append'\nretention='1d'\n[targets.columns]\nevent_id='event_id'",
                "retention_column",
            ),
            (
                "[[targets]]\ntable='t'\nkind='merge'\n[targets.columns]\nevent_id='event_id'",
                "merge",
            ),
        ];
        for (text, expected) in cases {
            let error = parse(text).expect_err(text).to_string();
            assert!(error.contains(expected), "{text}: {error}");
        }
    }

    #[test]
    fn provider_targets_have_defaults_and_sit_beside_tables() -> Result<(), TargetsError> {
        let text = format!(
            "{EXAMPLE}\n[[targets]]\nkind = 'provider'\nname = 'payments'\n\
             dedup_url = 'http://127.0.0.1:50051'\nprovider_url = 'http://127.0.0.1:8081'\n"
        );
        let targets = parse(&text)?;
        assert_eq!(targets.tables.len(), 2);
        let provider = &targets.providers[0];
        assert_eq!(
            provider.call,
            ProviderCall::Charges {
                amount: Source::Value
            }
        );
        assert_eq!(provider.call_timeout, Duration::from_secs(2));
        assert_eq!(provider.lease_ttl, Duration::from_secs(30));
        assert_eq!(provider.concurrency, DEFAULT_PROVIDER_CONCURRENCY);
        assert_eq!(provider.operation_id("e-1"), "payments:e-1");
        Ok(())
    }

    #[test]
    fn an_http_target_takes_its_request_and_answers_from_the_file() -> Result<(), TargetsError> {
        let text = "[[targets]]\nkind = 'http'\nname = 'partner'\n\
             dedup_url = 'http://127.0.0.1:50051'\nmethod = 'PUT'\n\
             url = 'https://partner.example/v1/hooks/{event_id}'\nkey_header = 'X-Request-Id'\n\
             [targets.headers]\n'X-Api-Version' = '2024-06-20'\n\
             [targets.body]\namount = '/payload/amount'\nreference = 'key'\nlivemode = false\n\
             [targets.answers]\nretry = ['429', '503']\n";
        let targets = parse(text)?;
        let spec = &targets.providers[0];
        assert_eq!(
            spec.provider_url,
            "https://partner.example/v1/hooks/{event_id}"
        );
        let ProviderCall::Http(call) = &spec.call else {
            panic!("an http call: {:?}", spec.call);
        };
        assert_eq!(call.method, "PUT");
        assert_eq!(call.key_header.as_deref(), Some("X-Request-Id"));
        assert_eq!(
            call.headers,
            vec![("X-Api-Version".to_owned(), "2024-06-20".to_owned())]
        );
        assert_eq!(
            call.body,
            HttpBody::Fields(vec![
                ("amount".to_owned(), serde_json::json!("/payload/amount")),
                ("livemode".to_owned(), serde_json::json!(false)),
                ("reference".to_owned(), serde_json::json!("key")),
            ])
        );
        assert_eq!(call.answers.retry.len(), 2);
        assert_eq!(spec.results, None);
        Ok(())
    }

    #[test]
    fn a_provider_like_target_writes_its_answer_s_fields_to_a_results_table()
    -> Result<(), TargetsError> {
        let text = "[[targets]]\nkind = 'http'\nname = 'partner'\n\
             dedup_url = 'http://127.0.0.1:50051'\nurl = 'https://partner.example/v1/charges'\n\
             [targets.results]\ntable = 'partner_charges'\n\
             [targets.results.columns]\ncharge_id = ['/id', '/entry/id']\nanswer = '/entry'\n";
        let spec = &parse(text)?.providers[0];
        assert_eq!(
            spec.results,
            Some(ResultsSpec {
                table: "partner_charges".into(),
                columns: vec![
                    ("answer".into(), vec!["/entry".into()]),
                    ("charge_id".into(), vec!["/id".into(), "/entry/id".into()]),
                ],
            })
        );
        let base = "[[targets]]\nkind='provider'\nname='p'\ndedup_url='http://d'\nprovider_url='http://p'\n";
        for (results, expected) in [
            (
                "[targets.results]\ntable=''\ncolumns={id='/id'}",
                "results.table",
            ),
            (
                "[targets.results]\ntable='t'\ncolumns={}",
                "at least one column",
            ),
            (
                "[targets.results]\ntable='t'\ncolumns={id='id'}",
                "results.columns.id",
            ),
            (
                "[targets.results]\ntable='t'\ncolumns={id=[]}",
                "results.columns.id",
            ),
            (
                "[targets.results]\ntable='t'\ncolumns={event_id='/id'}",
                "by the sink itself",
            ),
            (
                "[targets.results]\ntable='t'\ncolumn={id='/id'}",
                "unknown field",
            ),
        ] {
            let text = format!("{base}{results}");
            let error = parse(&text).expect_err(&text).to_string();
            assert!(error.contains(expected), "{text}: {error}");
        }
        let on_a_table = "[[targets]]\ntable='t'\nkind='append'\n[targets.columns]\n\
             event_id='event_id'\n[targets.results]\ntable='r'\ncolumns={id='/id'}";
        let error = parse(on_a_table).expect_err("a table target").to_string();
        assert!(error.contains("results is for provider targets"), "{error}");
        Ok(())
    }

    #[test]
    fn provider_mistakes_are_named() {
        let base = "[[targets]]\nkind='provider'\nname='p'\ndedup_url='http://d'\nprovider_url='http://p'\n";
        let cases = [
            ("[[targets]]\nkind='provider'\ndedup_url='http://d'\nprovider_url='http://p'".to_owned(), "needs a name"),
            ("[[targets]]\nkind='provider'\nname='a:b'\ndedup_url='http://d'\nprovider_url='http://p'".to_owned(), "without ':'"),
            ("[[targets]]\nkind='provider'\nname='p'\nprovider_url='http://p'".to_owned(), "dedup_url is required"),
            ("[[targets]]\nkind='provider'\nname='p'\ndedup_url='d:50051'\nprovider_url='http://p'".to_owned(), "must be an http"),
            (format!("{base}table='t'"), "table is for table targets"),
            (format!("{base}amount='entity_id'"), "amount \"entity_id\""),
            (format!("{base}call_timeout='10s'\nlease_ttl='15s'"), "at least twice"),
            (format!("{base}concurrency=0"), "at least 1"),
            (format!("{base}rate_limit=0"), "rate_limit 0"),
            ("[[targets]]\ntable='t'\nkind='append'\nlease_ttl='1s'\n[targets.columns]\nevent_id='event_id'".to_owned(), "lease_ttl is for provider targets"),
            ("[[targets]]\ntable='t'\nkind='append'\nbody='event'\n[targets.columns]\nevent_id='event_id'".to_owned(), "body is for http targets"),
            (format!("{base}url='http://p/x'"), "url is not for provider targets"),
            ("[[targets]]\nkind='http'\nname='h'\ndedup_url='http://d'\nurl='http://h/'\namount='value'".to_owned(), "amount is not for http targets"),
            ("[[targets]]\nkind='http'\nname='h'\ndedup_url='http://d'".to_owned(), "target h: url is required"),
            ("[[targets]]\nkind='http'\nname='h'\ndedup_url='http://d'\nurl='http://h/{nope}'".to_owned(), "unknown placeholder {nope}"),
        ];
        for (text, expected) in cases {
            let error = parse(&text).expect_err(&text).to_string();
            assert!(error.contains(expected), "{text}: {error}");
        }
    }

    #[test]
    fn defaults_are_the_seed_tables() {
        let specs = defaults();
        assert_eq!(specs[0].table, "event_sink");
        assert_eq!(specs[0].kind, TargetKind::Append);
        assert_eq!(specs[1].table, "entity_state");
        assert_eq!(specs[1].kind, TargetKind::Versioned);
        assert_eq!(specs[1].key, "entity_id");
    }

    #[test]
    fn retention_shorter_than_the_replay_horizon_is_refused_naming_both() -> Result<(), TargetsError>
    {
        let specs = parse(EXAMPLE)?.tables;
        let day = Duration::from_secs(24 * 3600);
        assert!(check_retention(&specs, 7 * day, day).is_ok());
        let error = check_retention(&specs, 30 * day, day).expect_err("too short");
        assert!(error.contains("retention 30days"), "{error}");
        assert!(error.contains("--replay-horizon 30days"), "{error}");
        Ok(())
    }
}
