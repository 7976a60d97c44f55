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
//! ```
//!
//! Sources: the envelope fields `event_id`, `entity_id`, `value`, `version`, `payload`,
//! `occurred_at`; `fingerprint` (hex SHA-256 of the event, DESIGN.md §2.2); `record` (the whole
//! record value as JSON); `kafka.topic`, `kafka.partition`, `kafka.offset`, `kafka.key` (where the
//! sink read it); `now` (the transaction time); or a JSON pointer starting with `/`.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

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

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTarget {
    table: String,
    kind: TargetKind,
    key: Option<String>,
    version_column: Option<String>,
    retention: Option<String>,
    retention_column: Option<String>,
    columns: BTreeMap<String, String>,
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
pub fn load(path: &Path) -> Result<Vec<TargetSpec>, TargetsError> {
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

pub fn parse(text: &str) -> Result<Vec<TargetSpec>, TargetsError> {
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
    let mut specs = Vec::with_capacity(file.targets.len());
    for raw in file.targets {
        let spec = validate(raw)?;
        if specs.iter().any(|s: &TargetSpec| s.table == spec.table) {
            return Err(invalid(&spec.table, "listed twice"));
        }
        specs.push(spec);
    }
    Ok(specs)
}

fn validate(raw: RawTarget) -> Result<TargetSpec, TargetsError> {
    let table = raw.table.trim().to_owned();
    if table.is_empty() {
        return Err(invalid("<empty>", "table must not be empty"));
    }
    let mut columns = Vec::with_capacity(raw.columns.len());
    for (column, source) in raw.columns {
        let source =
            Source::parse(&source).map_err(|m| invalid(&table, format!("{column}: {m}")))?;
        columns.push((column, source));
    }
    let key = raw.key.unwrap_or_else(|| match raw.kind {
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
    let version_column = match raw.kind {
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
        kind: raw.kind,
        key,
        version_column,
        columns,
        retention,
    })
}

/// The seed's tables (created by the migrations): `event_sink`, append by `event_id`, and
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

/// The retention check of seed 002: a purge must not forget a key that a replay can still bring.
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
        let specs = parse(EXAMPLE)?;
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
        let specs = parse(EXAMPLE)?;
        let day = Duration::from_secs(24 * 3600);
        assert!(check_retention(&specs, 7 * day, day).is_ok());
        let error = check_retention(&specs, 30 * day, day).expect_err("too short");
        assert!(error.contains("retention 30days"), "{error}");
        assert!(error.contains("--replay-horizon 30days"), "{error}");
        Ok(())
    }
}
