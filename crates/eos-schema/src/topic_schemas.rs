//! Values written in a registry format per topic, as a producer with Confluent's serializers and
//! `auto.register.schemas=false` writes them: each topic's subject (`<topic>-value` by
//! TopicNameStrategy, or one named per topic, e.g. a record's full name) and its latest or a
//! pinned version, looked up at a topic's first record and kept for the process's life, so the
//! registry is not on a record's path. A value is written only when all of it fits.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use serde_json::Value as Json;

use crate::record_decoder::schema_name;
use crate::{ParsedSchema, RecordFormat, RegistryClient, SchemaError, SchemaId};

/// Which version of a subject a topic's values are written with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SchemaVersion {
    /// The subject's latest at the topic's first record.
    Latest,
    /// This version, whatever is registered later.
    Pinned(u32),
}

/// A topic's subject, named instead of `<topic>-value`, and its version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicSubject {
    pub topic: String,
    pub subject: String,
    pub version: SchemaVersion,
}

impl TopicSubject {
    /// `TOPIC=SUBJECT` or `TOPIC=SUBJECT@VERSION`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let (topic, rest) = text
            .split_once('=')
            .filter(|(topic, rest)| !topic.is_empty() && !rest.is_empty())
            .ok_or_else(|| format!("{text:?} is not TOPIC=SUBJECT[@VERSION]"))?;
        let (subject, version) = match rest.rsplit_once('@') {
            Some((subject, version)) => (
                subject,
                SchemaVersion::Pinned(
                    version
                        .parse()
                        .ok()
                        .filter(|version| *version > 0)
                        .ok_or_else(|| {
                            format!("{text:?}: {version:?} is not a version (1, 2, …)")
                        })?,
                ),
            ),
            None => (rest, SchemaVersion::Latest),
        };
        if subject.is_empty() {
            return Err(format!("{text:?}: the subject is empty"));
        }
        Ok(Self {
            topic: topic.to_owned(),
            subject: subject.to_owned(),
            version,
        })
    }
}

/// The schema a topic's values are written with.
#[derive(Debug)]
pub struct SubjectSchema {
    pub subject: String,
    pub id: SchemaId,
    pub schema: ParsedSchema,
}

impl SubjectSchema {
    /// `value` in the registry's wire format; `Err` names the subject, the id and where it does
    /// not fit.
    pub fn encode(&self, value: &Json) -> Result<Vec<u8>, String> {
        self.schema.encode_framed(self.id, value).map_err(|error| {
            format!(
                "does not fit subject {}, schema id {}: {error}",
                self.subject, self.id
            )
        })
    }
}

/// Why a topic has no schema to write with.
#[derive(Debug, thiserror::Error)]
pub enum TopicSchemaError {
    /// The registry cannot answer now: the record waits, it is never skipped.
    #[error("{0}")]
    Registry(#[source] SchemaError),
    /// The subject has no such schema, or one of another format: a configuration to fix.
    #[error("{0}")]
    Unusable(String),
}

impl TopicSchemaError {
    /// True when asking again later may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Registry(error) if error.is_transient())
    }
}

/// Each topic's schema in one registry format, found at its first record.
#[derive(Debug)]
pub struct TopicSchemas {
    format: RecordFormat,
    client: RegistryClient,
    named: HashMap<String, TopicSubject>,
    found: Mutex<HashMap<String, Arc<SubjectSchema>>>,
}

impl TopicSchemas {
    /// `format` is a registry format; `named`: the topics whose subject is not `<topic>-value`,
    /// or whose version is pinned.
    pub fn new(format: RecordFormat, client: RegistryClient, named: Vec<TopicSubject>) -> Self {
        Self {
            format,
            client,
            named: named
                .into_iter()
                .map(|named| (named.topic.clone(), named))
                .collect(),
            found: Mutex::new(HashMap::new()),
        }
    }

    /// `topic`'s subject and version.
    pub fn subject_of(&self, topic: &str) -> (String, SchemaVersion) {
        match self.named.get(topic) {
            Some(named) => (named.subject.clone(), named.version),
            None => (format!("{topic}-value"), SchemaVersion::Latest),
        }
    }

    /// `topic`'s schema: asked of the registry once, then kept.
    pub async fn schema_for(&self, topic: &str) -> Result<Arc<SubjectSchema>, TopicSchemaError> {
        if let Some(found) = self.lock().get(topic) {
            return Ok(Arc::clone(found));
        }
        let (subject, version) = self.subject_of(topic);
        let registered = match version {
            SchemaVersion::Latest => self.client.latest(&subject).await,
            SchemaVersion::Pinned(version) => self.client.version(&subject, version).await,
        };
        let registered = registered.map_err(|error| match error {
            SchemaError::UnknownSubject { .. } => TopicSchemaError::Unusable(format!(
                "topic {topic}: subject {subject} has no such schema in the registry \
                 ({error}): register the topic's schema before writing to it"
            )),
            other => TopicSchemaError::Registry(other),
        })?;
        let schema = self
            .client
            .parsed_schema(registered.id)
            .await
            .map_err(TopicSchemaError::Registry)?;
        if !self.format.fits(&schema) {
            return Err(TopicSchemaError::Unusable(format!(
                "topic {topic}: subject {subject}'s schema id {} is {}, and the format is {}",
                registered.id,
                schema_name(&schema),
                self.format.name()
            )));
        }
        let found = Arc::new(SubjectSchema {
            subject,
            id: registered.id,
            schema,
        });
        self.lock().insert(topic.to_owned(), Arc::clone(&found));
        Ok(found)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<SubjectSchema>>> {
        self.found.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_topic_names_its_subject_and_may_pin_a_version() {
        assert_eq!(
            TopicSubject::parse("orders=com.example.Order@3"),
            Ok(TopicSubject {
                topic: "orders".into(),
                subject: "com.example.Order".into(),
                version: SchemaVersion::Pinned(3),
            })
        );
        assert_eq!(
            TopicSubject::parse("orders=orders-value").map(|named| named.version),
            Ok(SchemaVersion::Latest)
        );
        for bad in [
            "orders",
            "=s",
            "orders=",
            "orders=s@0",
            "orders=s@x",
            "orders=@2",
        ] {
            assert!(TopicSubject::parse(bad).is_err(), "{bad}");
        }
    }
}
