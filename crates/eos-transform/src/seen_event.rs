//! What the processor remembers of an event id for dedup: its fingerprint, expiry and final
//! outcome. Its own module, so that the state store (which keeps it) and the partition state
//! (which judges by it) each use it without using each other.

use eos_core::{DeadLetterReason, Fingerprint};
use serde::{Deserialize, Serialize};

/// An event id remembered for dedup with its final outcome, until `expires_at` (unix seconds).
///
/// In the changelog it is JSON (`seen/<event_id>`): `{"fp":…,"exp":…}` for an applied event,
/// exactly as before outcomes were recorded, so a changelog written then restores unchanged (every
/// id in it was applied); `"dl"` and `"rd"` are added only when there is something to say.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeenEvent {
    /// The fingerprint of the content first judged under this id.
    #[serde(rename = "fp")]
    pub fingerprint: Fingerprint,
    /// Unix seconds after which the id is forgotten (the dedup horizon).
    #[serde(rename = "exp")]
    pub expires_at: i64,
    /// The dead letter's reason when the event was refused or failed; `None` when it was applied.
    #[serde(rename = "dl", default, skip_serializing_if = "Option::is_none")]
    pub dead_letter: Option<DeadLetterReason>,
    /// The re-drives (`eos-redrive-id`) that judged the event again, oldest first: each is
    /// admitted once.
    #[serde(rename = "rd", default, skip_serializing_if = "Vec::is_empty")]
    pub redrives: Vec<String>,
}

impl SeenEvent {
    /// An applied event (outputs written, or consumed with none).
    pub fn applied(fingerprint: Fingerprint, expires_at: i64) -> Self {
        Self {
            fingerprint,
            expires_at,
            dead_letter: None,
            redrives: Vec::new(),
        }
    }

    /// Whether a record with this re-drive id is judged again: only a re-drive, only of a
    /// dead-lettered outcome (an applied event's effects are written; judging it again would
    /// apply it twice), and only once per re-drive id.
    pub(crate) fn admits_redrive(&self, redrive: Option<&str>) -> bool {
        redrive.is_some_and(|id| {
            self.dead_letter.is_some() && !self.redrives.iter().any(|seen| seen == id)
        })
    }

    pub(crate) fn outcome(&self) -> String {
        match self.dead_letter {
            None => "applied".to_owned(),
            Some(reason) => format!("dead-lettered ({reason})"),
        }
    }
}
