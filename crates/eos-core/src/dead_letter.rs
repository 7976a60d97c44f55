//! Machine-readable reasons for quarantining a record, and the headers that carry them.
//!
//! Every service that dead-letters a record writes the original bytes plus these headers, so the
//! audit can account for each input exactly once by its source position.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Header naming the [`DeadLetterReason`] of a dead-lettered record.
pub const REASON_HEADER: &str = "eos-dlq-reason";
/// Header with a human-readable detail (which field, what was wrong).
pub const DETAIL_HEADER: &str = "eos-dlq-detail";
/// Headers with the position the dead-lettered record was read from.
pub const SOURCE_TOPIC_HEADER: &str = "eos-source-topic";
pub const SOURCE_PARTITION_HEADER: &str = "eos-source-partition";
pub const SOURCE_OFFSET_HEADER: &str = "eos-source-offset";

/// Why a record went to a dead-letter destination instead of producing an effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeadLetterReason {
    /// The record value is not valid UTF-8.
    InvalidUtf8,
    /// The record value is not JSON, or not a JSON object.
    MalformedJson,
    /// A required envelope field is absent.
    MissingField,
    /// An envelope field has the wrong type or an invalid value.
    InvalidField,
    /// An identifier is longer than the envelope allows.
    FieldTooLong,
    /// The whole record is larger than the configured limit.
    OversizedRecord,
    /// The record has no value at all (a tombstone on an event topic).
    EmptyRecord,
    /// An `event_id` already seen with a different fingerprint: a broken producer contract.
    EventIdConflict,
    /// The event is older than the dedup horizon, so a duplicate could no longer be recognised.
    BeyondDedupHorizon,
    /// An external provider refused the effect for good (a non-retryable 4xx, e.g. a declined
    /// charge): nothing was applied, and asking again would be refused again.
    ProviderRejected,
}

impl DeadLetterReason {
    pub const ALL: [DeadLetterReason; 10] = [
        Self::InvalidUtf8,
        Self::MalformedJson,
        Self::MissingField,
        Self::InvalidField,
        Self::FieldTooLong,
        Self::OversizedRecord,
        Self::EmptyRecord,
        Self::EventIdConflict,
        Self::BeyondDedupHorizon,
        Self::ProviderRejected,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::InvalidUtf8 => "invalid_utf8",
            Self::MalformedJson => "malformed_json",
            Self::MissingField => "missing_field",
            Self::InvalidField => "invalid_field",
            Self::FieldTooLong => "field_too_long",
            Self::OversizedRecord => "oversized_record",
            Self::EmptyRecord => "empty_record",
            Self::EventIdConflict => "event_id_conflict",
            Self::BeyondDedupHorizon => "beyond_dedup_horizon",
            Self::ProviderRejected => "provider_rejected",
        }
    }

    /// Whether the record itself is malformed, as opposed to well-formed but refused.
    pub fn is_malformed(self) -> bool {
        !matches!(
            self,
            Self::EventIdConflict | Self::BeyondDedupHorizon | Self::ProviderRejected
        )
    }
}

impl fmt::Display for DeadLetterReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, thiserror::Error)]
#[error("unknown dead-letter reason {0:?}")]
pub struct UnknownReason(String);

impl FromStr for DeadLetterReason {
    type Err = UnknownReason;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|reason| reason.as_str() == s)
            .ok_or_else(|| UnknownReason(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reason_codes_round_trip() {
        for reason in DeadLetterReason::ALL {
            assert_eq!(
                reason.as_str().parse::<DeadLetterReason>().ok(),
                Some(reason)
            );
            assert_eq!(
                serde_json::to_string(&reason).ok(),
                Some(format!("\"{}\"", reason.as_str()))
            );
        }
        assert!("nonsense".parse::<DeadLetterReason>().is_err());
    }
}
