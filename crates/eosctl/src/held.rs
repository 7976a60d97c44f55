//! Held provider operations (docs/architecture/held-operations.md "Held operations"): events the
//! sink-writer set aside in `sink_held_operations` because dedup-service's reconciler cannot settle
//! their operation (UNKNOWN, older than the provider's key retention). Listing them, and settling
//! one: dedup-service's Resolve with an operator's evidence first, then the rows marked resolved.

use std::fmt::Write as _;

use comfy_table::Table;
use comfy_table::presets::UTF8_FULL_CONDENSED;
use dedup_client::{ClientError, DedupClient};
use eos_proto::dedup::v1 as pb;
use serde::Serialize;
use sqlx::PgPool;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

#[derive(Debug, thiserror::Error)]
pub enum HeldError {
    #[error("reading or updating sink_held_operations")]
    Database(#[from] sqlx::Error),
    #[error("no event is held for operation {operation_id:?} (see `eosctl held list`)")]
    NotHeld { operation_id: String },
    #[error("dedup-service refused to resolve operation {operation_id:?}")]
    Resolve {
        operation_id: String,
        source: ClientError,
    },
}

/// What the operator found out about a held operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum HeldOutcome {
    /// The provider applied the charge.
    Succeeded,
    /// The provider did not apply it. Final: the held event is not charged later.
    Failed,
}

impl HeldOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
        }
    }
}

/// One `sink_held_operations` row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub struct HeldOperation {
    pub sink: String,
    pub target: String,
    pub operation_id: String,
    pub event_id: String,
    pub source_topic: String,
    pub source_partition: i32,
    pub source_offset: i64,
    pub reason: String,
    #[serde(with = "time::serde::rfc3339")]
    pub held_at: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339::option")]
    pub resolved_at: Option<OffsetDateTime>,
    pub resolution: Option<String>,
}

/// Held events, oldest first; resolved ones too with `all`.
pub async fn list(pool: &PgPool, all: bool) -> Result<Vec<HeldOperation>, HeldError> {
    Ok(sqlx::query_as::<_, HeldOperation>(
        "SELECT sink, target, operation_id, event_id, source_topic, source_partition,
             source_offset, reason, held_at, resolved_at, resolution
         FROM sink_held_operations
         WHERE $1 OR resolved_at IS NULL
         ORDER BY held_at, sink, target, source_topic, source_partition, source_offset",
    )
    .bind(all)
    .fetch_all(pool)
    .await?)
}

/// What `resolve` did.
#[derive(Debug, Clone, Serialize)]
pub struct Resolved {
    pub operation_id: String,
    pub outcome: HeldOutcome,
    /// The intent's state at dedup-service afterwards.
    pub intent_state: String,
    /// Rows of `sink_held_operations` marked resolved now (re-deliveries of the event are rows
    /// of their own).
    pub rows_resolved: u64,
}

/// Settles a held operation: Resolve at dedup-service (which must accept it: an UNKNOWN intent,
/// or one already settled the same way, so a repeated command is harmless), then the held rows.
/// Resolve comes first, so a failure in between leaves the rows held and the command can be run
/// again; the rows never say resolved while the intent is not.
pub async fn resolve(
    pool: &PgPool,
    dedup: &DedupClient,
    operation_id: &str,
    outcome: HeldOutcome,
    evidence: &str,
) -> Result<Resolved, HeldError> {
    let held: i64 =
        sqlx::query_scalar("SELECT count(*) FROM sink_held_operations WHERE operation_id = $1")
            .bind(operation_id)
            .fetch_one(pool)
            .await?;
    if held == 0 {
        return Err(HeldError::NotHeld {
            operation_id: operation_id.to_owned(),
        });
    }
    let state = match outcome {
        HeldOutcome::Succeeded => pb::IntentState::Succeeded,
        HeldOutcome::Failed => pb::IntentState::Failed,
    };
    let intent = dedup
        .resolve(pb::ResolveRequest {
            operation_id: operation_id.to_owned(),
            outcome: state as i32,
            evidence: format!("operator (eosctl held resolve): {evidence}"),
            result: Vec::new(),
            retryable: false,
            expected_fencing_token: 0,
        })
        .await
        .map_err(|source| HeldError::Resolve {
            operation_id: operation_id.to_owned(),
            source,
        })?;
    let rows_resolved = sqlx::query(
        "UPDATE sink_held_operations SET resolved_at = now(), resolution = $2
         WHERE operation_id = $1 AND resolved_at IS NULL",
    )
    .bind(operation_id)
    .bind(outcome.as_str())
    .execute(pool)
    .await?
    .rows_affected();
    Ok(Resolved {
        operation_id: operation_id.to_owned(),
        outcome,
        intent_state: pb::IntentState::try_from(intent.state)
            .map_or_else(|_| intent.state.to_string(), |s| s.as_str_name().to_owned()),
        rows_resolved,
    })
}

/// The rows as a table, with a count first.
pub fn held_text(rows: &[HeldOperation]) -> String {
    let mut out = String::new();
    let open = rows.iter().filter(|row| row.resolved_at.is_none()).count();
    let _ = writeln!(out, "{open} held, {} resolved", rows.len() - open);
    if rows.is_empty() {
        return out;
    }
    let mut table = Table::new();
    table.load_preset(UTF8_FULL_CONDENSED);
    table.set_header([
        "operation_id",
        "event_id",
        "sink / target",
        "source",
        "held_at",
        "resolution",
        "reason",
    ]);
    for row in rows {
        table.add_row([
            row.operation_id.clone(),
            row.event_id.clone(),
            format!("{} / {}", row.sink, row.target),
            format!(
                "{}[{}]@{}",
                row.source_topic, row.source_partition, row.source_offset
            ),
            row.held_at.format(&Rfc3339).unwrap_or_default(),
            match (&row.resolution, row.resolved_at) {
                (Some(resolution), Some(at)) => {
                    format!(
                        "{resolution} at {}",
                        at.format(&Rfc3339).unwrap_or_default()
                    )
                }
                _ => "held".to_owned(),
            },
            row.reason.clone(),
        ]);
    }
    let _ = writeln!(out, "{table}");
    out
}

#[cfg(test)]
mod tests {
    use time::macros::datetime;

    use super::*;

    fn row(resolved: bool) -> HeldOperation {
        HeldOperation {
            sink: "sink".into(),
            target: "payments".into(),
            operation_id: "payments:e-1".into(),
            event_id: "e-1".into(),
            source_topic: "out".into(),
            source_partition: 0,
            source_offset: 7,
            reason: "older than the provider's key TTL".into(),
            held_at: datetime!(2026-01-01 0:00 UTC),
            resolved_at: resolved.then_some(datetime!(2026-01-01 1:00 UTC)),
            resolution: resolved.then(|| "failed".into()),
        }
    }

    #[test]
    fn the_table_counts_held_and_resolved_and_shows_each_row() {
        let text = held_text(&[row(false), row(true)]);
        assert!(text.starts_with("1 held, 1 resolved\n"), "{text}");
        assert!(text.contains("payments:e-1"), "{text}");
        assert!(text.contains("out[0]@7"), "{text}");
        assert!(text.contains("failed at 2026-01-01T01:00:00Z"), "{text}");
        assert_eq!(held_text(&[]), "0 held, 0 resolved\n");
    }

    #[test]
    fn json_rows_carry_times_as_rfc3339() -> Result<(), serde_json::Error> {
        let json = serde_json::to_value(row(false))?;
        assert_eq!(json["held_at"], "2026-01-01T00:00:00Z");
        assert_eq!(json["resolved_at"], serde_json::Value::Null);
        assert_eq!(json["source_offset"], 7);
        Ok(())
    }
}
