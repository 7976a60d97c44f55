//! A schema's id: what the wire format names a record's schema by, and what the registry keys
//! schemas by. Its own module, so that the formats, the errors and the registry client all use
//! it without using one another.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A schema's id in the registry, the 4 bytes of the wire format. With Apicurio it is the content
/// id (`apicurio.ccompat.legacy-id-mode.enabled=false`, deploy/local/README.md): one id per
/// schema text, the same under every subject, as Confluent's registry gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SchemaId(pub u32);

impl fmt::Display for SchemaId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}
