//! A record as read from a topic, detached from the Kafka client, so the audit's logic can be fed
//! by Kafka, by a test, or later by another source without knowing where the bytes came from.

use std::fmt;

use serde::Serialize;

/// Where a record sits in its topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct Position {
    pub partition: i32,
    pub offset: i64,
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.partition, self.offset)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceRecord {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    /// `None` for a record without a value (a tombstone).
    pub value: Option<Vec<u8>>,
    pub headers: Vec<(String, Option<Vec<u8>>)>,
    /// The record's Kafka timestamp (create or log-append time), in Unix milliseconds.
    pub timestamp_ms: Option<i64>,
    /// How the value was read: as it is (JSON), or decoded from a schema registry's format.
    pub decoding: Decoding,
}

/// How a record's value was read (docs/schemas.md). A record decoded from a schema registry's
/// format holds its JSON event model in `value`, as the services that read it see it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Decoding {
    /// As it is on the topic: a JSON topic's records.
    #[default]
    AsRead,
    /// Decoded through the registry. `content` is the decoded content when it differs from the
    /// value (fields at their default left out): what the services take the fingerprint of, so
    /// that a newer compatible schema's encoding of the same event is the same event.
    Decoded { content: Option<Vec<u8>> },
    /// Not the registry's wire format, an id the registry does not have, or bytes that do not
    /// decode: the services' `undecodable_record`. `value` is left as it was read.
    Undecodable,
}

impl SourceRecord {
    pub fn position(&self) -> Position {
        Position {
            partition: self.partition,
            offset: self.offset,
        }
    }

    /// The value, with a missing value read as no bytes: both are the same bad input (an empty
    /// record) to the envelope parser.
    pub fn value_bytes(&self) -> &[u8] {
        self.value.as_deref().unwrap_or_default()
    }

    /// The first header named `name`, as UTF-8.
    pub fn header_str(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key == name)
            .and_then(|(_, value)| value.as_deref())
            .and_then(|value| std::str::from_utf8(value).ok())
    }

    /// The last header named `name`, as UTF-8: when a record is dead-lettered again, the newest
    /// header of a name is the one that describes this hop.
    pub fn last_header_str(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .rev()
            .find(|(key, _)| key == name)
            .and_then(|(_, value)| value.as_deref())
            .and_then(|value| std::str::from_utf8(value).ok())
    }

    /// `topic/partition@offset`, the way violations name records that have no usable event id.
    pub fn locator(&self) -> String {
        format!("{}/{}", self.topic, self.position())
    }
}
