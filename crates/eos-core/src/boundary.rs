//! How a service states its guarantee: for a named boundary, never for "the message".

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Guarantee {
    ExactlyOnce,
    AtLeastOnce,
}

impl Guarantee {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ExactlyOnce => "exactly-once",
            Self::AtLeastOnce => "at-least-once",
        }
    }
}

impl fmt::Display for Guarantee {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, thiserror::Error)]
#[error("unknown guarantee {0:?}: expected exactly-once or at-least-once")]
pub struct UnknownGuarantee(String);

impl FromStr for Guarantee {
    type Err = UnknownGuarantee;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "exactly-once" => Ok(Self::ExactlyOnce),
            "at-least-once" => Ok(Self::AtLeastOnce),
            other => Err(UnknownGuarantee(other.to_owned())),
        }
    }
}

/// A guarantee tied to a named boundary: what is read, what result is made, where the position
/// is stored and how recovery finds it again. Logged at start-up and served on status endpoints.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Boundary {
    pub guarantee: Guarantee,
    /// e.g. `kafka topic=payments group=eos-processor`
    pub input: String,
    /// e.g. `kafka topic=ledger` or `postgres table=event_sink`
    pub result: String,
    /// e.g. `kafka transaction (consumer offsets)` or `postgres table=sink_checkpoints`
    pub checkpoint: String,
    /// One sentence: how a restarted instance resumes without losing or repeating an effect.
    pub recovery: String,
    /// The logic between input and result when it is loaded from outside the binary, e.g.
    /// `webassembly module sha256:…`; absent for logic compiled in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transform: Option<String>,
}

impl fmt::Display for Boundary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} from [{}] to [{}], checkpoint in [{}]; recovery: {}",
            self.guarantee, self.input, self.result, self.checkpoint, self.recovery
        )
    }
}

/// A consumed position. `next_offset` is the offset of the next record to read (the last
/// processed offset + 1), never the last one read — the Kafka convention for committed offsets.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Checkpoint {
    pub topic: String,
    pub partition: i32,
    pub next_offset: i64,
}

impl Checkpoint {
    /// The checkpoint after processing the record at `offset`.
    pub fn after(topic: impl Into<String>, partition: i32, offset: i64) -> Self {
        Self {
            topic: topic.into(),
            partition,
            next_offset: offset + 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoint_points_past_the_processed_record() {
        let checkpoint = Checkpoint::after("payments", 3, 41);
        assert_eq!(checkpoint.next_offset, 42);
        assert_eq!(checkpoint.partition, 3);
    }

    #[test]
    fn guarantee_parses_its_own_display() {
        for guarantee in [Guarantee::ExactlyOnce, Guarantee::AtLeastOnce] {
            assert_eq!(
                guarantee.to_string().parse::<Guarantee>().ok(),
                Some(guarantee)
            );
        }
        assert!("maybe-once".parse::<Guarantee>().is_err());
    }

    #[test]
    fn boundary_display_names_every_part() {
        let boundary = Boundary {
            guarantee: Guarantee::ExactlyOnce,
            input: "kafka topic=payments".into(),
            result: "kafka topic=ledger".into(),
            checkpoint: "kafka transaction".into(),
            recovery: "resume from committed offsets".into(),
            transform: None,
        };
        let text = boundary.to_string();
        for part in [
            "exactly-once",
            "payments",
            "ledger",
            "kafka transaction",
            "resume",
        ] {
            assert!(text.contains(part), "{text}");
        }
    }
}
