//! A client of the Confluent schema-registry API (`/schemas/ids/{id}`, `/subjects/...`), as
//! Confluent's registry and Apicurio's `/apis/ccompat/v7` serve it, on the workspace's `reqwest`
//! (rustls). Everything a record needs is cached: a schema by id forever (an id names one schema
//! text for good), a subject's registered schema by its text forever, and a subject's latest
//! version for [`RegistryClient::latest_max_age`], so the registry is asked once per schema, not
//! once per record.
//!
//! A small client of our own rather than `schema_registry_converter`: the caller must tell an
//! unreachable registry (retry, never skip) from an unknown id (dead letter), which
//! [`SchemaError`] does, and the decoding into the JSON event model is this crate's own anyway.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, Instant};

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use reqwest::header::{ACCEPT, CONTENT_TYPE, HeaderValue};
use serde::{Deserialize, Serialize};

use serde_json::Value as Json;

use crate::avro::AvroSchema;
use crate::error::SchemaError;
use crate::json_schema::JsonSchema;
use crate::protobuf::ProtobufSchema;
use crate::schema_id::SchemaId;
use crate::wire;

/// The most schemas one schema may reference, its references' references included.
pub const MAX_REFERENCES: usize = 64;

/// The registry's name for a schema's language; a schema without one is Avro.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum SchemaType {
    #[default]
    Avro,
    Protobuf,
    Json,
}

/// A schema another one imports (a Protobuf `import`, an Avro named type of another subject).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SchemaReference {
    pub name: String,
    pub subject: String,
    pub version: i64,
}

/// A schema's text as the registry keeps it, with its language and references.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Schema {
    pub schema: String,
    #[serde(default)]
    pub schema_type: SchemaType,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub references: Vec<SchemaReference>,
}

impl Schema {
    /// An Avro schema's text, without references.
    pub fn avro(text: impl Into<String>) -> Self {
        Schema {
            schema: text.into(),
            schema_type: SchemaType::Avro,
            references: Vec::new(),
        }
    }

    /// A `.proto` file's text, without references (the well-known types need none).
    pub fn protobuf(text: impl Into<String>) -> Self {
        Schema {
            schema: text.into(),
            schema_type: SchemaType::Protobuf,
            references: Vec::new(),
        }
    }

    /// A JSON Schema's text, without references.
    pub fn json(text: impl Into<String>) -> Self {
        Schema {
            schema: text.into(),
            schema_type: SchemaType::Json,
            references: Vec::new(),
        }
    }
}

/// One version of a subject.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubjectVersion {
    pub subject: String,
    pub version: i64,
    pub id: SchemaId,
    pub schema: Arc<Schema>,
}

/// Where and how to reach the registry.
#[derive(Clone)]
pub struct RegistryConfig {
    /// The API's base, e.g. `http://127.0.0.1:8085/apis/ccompat/v7` (Apicurio) or
    /// `https://registry.example.com` (Confluent).
    pub url: String,
    /// HTTP basic credentials, as Confluent's clients send `basic.auth.user.info`.
    pub basic_auth: Option<(String, String)>,
    /// Each request's limit; a request past it is [`SchemaError::Unreachable`].
    pub request_timeout: Duration,
    /// How long [`RegistryClient::latest`] keeps a subject's latest version before asking again:
    /// a producer moving to a new version is seen within this time.
    pub latest_max_age: Duration,
}

impl std::fmt::Debug for RegistryConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The password is left out: a secret is never printed (docs/security.md).
        f.debug_struct("RegistryConfig")
            .field("url", &self.url)
            .field("user", &self.basic_auth.as_ref().map(|(user, _)| user))
            .field("request_timeout", &self.request_timeout)
            .field("latest_max_age", &self.latest_max_age)
            .finish_non_exhaustive()
    }
}

impl RegistryConfig {
    pub fn new(url: impl Into<String>) -> Self {
        RegistryConfig {
            url: url.into(),
            basic_auth: None,
            request_timeout: Duration::from_secs(10),
            latest_max_age: Duration::from_secs(60),
        }
    }
}

/// The registry's error body: `{"error_code": 40403, "message": "Schema 7 not found"}`.
#[derive(Debug, Default, Deserialize)]
struct ErrorBody {
    #[serde(default)]
    error_code: i64,
    #[serde(default)]
    message: String,
}

#[derive(Debug, Deserialize)]
struct IdAnswer {
    id: SchemaId,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SubjectVersionAnswer {
    subject: String,
    version: i64,
    id: SchemaId,
    schema: String,
    #[serde(default)]
    schema_type: SchemaType,
    #[serde(default)]
    references: Vec<SchemaReference>,
}

impl From<SubjectVersionAnswer> for SubjectVersion {
    fn from(answer: SubjectVersionAnswer) -> Self {
        SubjectVersion {
            subject: answer.subject,
            version: answer.version,
            id: answer.id,
            schema: Arc::new(Schema {
                schema: answer.schema,
                schema_type: answer.schema_type,
                references: answer.references,
            }),
        }
    }
}

/// What a request was about, so that a 404 becomes the error that names it.
enum Asked<'a> {
    Id(SchemaId),
    Subject(&'a str),
}

/// Characters escaped in a subject put in a URL path: all but letters, digits and `-._~`, so a
/// subject such as `payments.v1/value` stays one path segment.
const PATH_SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// A schema parsed and ready for records, whatever its language.
#[derive(Debug, Clone)]
pub enum ParsedSchema {
    Avro(Arc<AvroSchema>),
    Protobuf(Arc<ProtobufSchema>),
    Json(Arc<JsonSchema>),
}

impl ParsedSchema {
    /// The JSON value of a payload after the wire header, by the schema's language.
    pub fn decode(&self, payload: &[u8]) -> Result<Json, SchemaError> {
        match self {
            ParsedSchema::Avro(schema) => schema.decode(payload),
            ParsedSchema::Protobuf(schema) => schema.decode(payload),
            ParsedSchema::Json(schema) => schema.decode(payload),
        }
    }

    /// [`Self::decode`]'s value, and what it says for telling one event's content from
    /// another's across compatible versions of its schema: Avro's and Protobuf's without the
    /// fields at their default ([`AvroSchema::content`], [`ProtobufSchema::decode_with_content`]),
    /// JSON Schema's the value itself.
    pub fn decode_with_content(&self, payload: &[u8]) -> Result<(Json, Json), SchemaError> {
        match self {
            ParsedSchema::Avro(schema) => {
                let value = schema.decode(payload)?;
                let content = schema.content(&value);
                Ok((value, content))
            }
            ParsedSchema::Protobuf(schema) => schema.decode_with_content(payload),
            ParsedSchema::Json(schema) => {
                let value = schema.decode(payload)?;
                Ok((value.clone(), value))
            }
        }
    }

    /// `value` encoded and framed with `schema_id` (a Protobuf value as the file's first
    /// message).
    pub fn encode_framed(&self, schema_id: SchemaId, value: &Json) -> Result<Vec<u8>, SchemaError> {
        match self {
            ParsedSchema::Avro(schema) => schema.encode_framed(schema_id, value),
            ParsedSchema::Protobuf(schema) => schema.encode_framed(schema_id, value),
            ParsedSchema::Json(schema) => schema.encode_framed(schema_id, value),
        }
    }
}

#[derive(Default)]
struct Caches {
    by_id: HashMap<SchemaId, Arc<Schema>>,
    /// Parsed once per id: Avro's named types, Protobuf's descriptors, JSON Schema's compiled
    /// validator. Records only look them up.
    parsed: HashMap<SchemaId, ParsedSchema>,
    /// (writer id, reader id) → whether Avro's resolution reads the one as the other.
    avro_pairs: HashMap<(SchemaId, SchemaId), Result<(), String>>,
    /// How many schema texts have been parsed: the proof that records do not parse.
    parses: u64,
    /// Subject and schema → the subject's version of it (register and lookup).
    registered: HashMap<(String, Schema), SubjectVersionOrId>,
    latest: HashMap<String, (Instant, SubjectVersion)>,
}

/// A registration answers only the id; a lookup the whole version.
#[derive(Clone)]
enum SubjectVersionOrId {
    Id(SchemaId),
    Version(SubjectVersion),
}

/// The registry client; clone it freely (the clones share the HTTP connections and the caches).
#[derive(Clone)]
pub struct RegistryClient {
    http: reqwest::Client,
    base: String,
    basic_auth: Option<(String, String)>,
    latest_max_age: Duration,
    caches: Arc<RwLock<Caches>>,
}

impl fmt::Debug for RegistryClient {
    // No credentials in logs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegistryClient")
            .field("base", &self.base)
            .field(
                "basic_auth",
                &self.basic_auth.as_ref().map(|(user, _)| user),
            )
            .finish_non_exhaustive()
    }
}

const REGISTRY_JSON: &str = "application/vnd.schemaregistry.v1+json";

impl RegistryClient {
    /// A client of the registry at `config.url`. Credentials in the URL (`https://user:pass@…`)
    /// are taken out of it and sent as basic authentication, unless `basic_auth` is given, so that
    /// the URL in errors and logs never carries a password.
    pub fn new(config: RegistryConfig) -> Result<Self, SchemaError> {
        let mut url = reqwest::Url::parse(&config.url)
            .map_err(|error| SchemaError::InvalidUrl(format!("{error}")))?;
        if !matches!(url.scheme(), "http" | "https") || url.cannot_be_a_base() {
            return Err(SchemaError::InvalidUrl(format!(
                "{} is not an http:// or https:// URL",
                url.scheme()
            )));
        }
        let in_url = (!url.username().is_empty()).then(|| {
            let decode = |part: &str| {
                percent_encoding::percent_decode_str(part)
                    .decode_utf8_lossy()
                    .into_owned()
            };
            (
                decode(url.username()),
                decode(url.password().unwrap_or_default()),
            )
        });
        // Setting both cannot fail on an http(s) URL, which has a host.
        let _ = url.set_username("");
        let _ = url.set_password(None);
        let http = reqwest::Client::builder()
            .timeout(config.request_timeout)
            .build()
            .map_err(|error| {
                SchemaError::InvalidUrl(format!("building the HTTP client: {error}"))
            })?;
        Ok(RegistryClient {
            http,
            base: url.as_str().trim_end_matches('/').to_owned(),
            basic_auth: config.basic_auth.or(in_url),
            latest_max_age: config.latest_max_age,
            caches: Arc::default(),
        })
    }

    /// The API's base URL, without credentials.
    pub fn url(&self) -> &str {
        &self.base
    }

    /// How long a subject's latest version is kept before [`RegistryClient::latest`] asks again.
    pub fn latest_max_age(&self) -> Duration {
        self.latest_max_age
    }

    /// The schema with this id (`GET /schemas/ids/{id}`); asked once, kept for good.
    pub async fn schema_by_id(&self, id: SchemaId) -> Result<Arc<Schema>, SchemaError> {
        if let Some(schema) = self.read_caches().by_id.get(&id) {
            return Ok(Arc::clone(schema));
        }
        let schema: Schema = self
            .send(
                self.http.get(format!("{}/schemas/ids/{id}", self.base)),
                Asked::Id(id),
            )
            .await?;
        let schema = Arc::new(schema);
        self.write_caches().by_id.insert(id, Arc::clone(&schema));
        Ok(schema)
    }

    /// The schema with this id, parsed once and kept: what decoding a record needs.
    pub async fn parsed_schema(&self, id: SchemaId) -> Result<ParsedSchema, SchemaError> {
        if let Some(parsed) = self.read_caches().parsed.get(&id) {
            return Ok(parsed.clone());
        }
        let schema = self.schema_by_id(id).await?;
        let label = format!("id {id}");
        let referenced = self.referenced_schemas(&label, &schema.references).await?;
        let invalid = |detail: String| SchemaError::InvalidSchema {
            schema: label.clone(),
            detail,
        };
        let parsed = match schema.schema_type {
            SchemaType::Avro if referenced.is_empty() => {
                ParsedSchema::Avro(Arc::new(AvroSchema::parse(&schema.schema, &label)?))
            }
            SchemaType::Avro => {
                let texts: Vec<&str> = referenced.iter().map(|(_, r)| r.schema.as_str()).collect();
                let whole = crate::avro_references::inline_references(&schema.schema, &texts)
                    .map_err(invalid)?;
                ParsedSchema::Avro(Arc::new(AvroSchema::parse(&whole, &label)?))
            }
            SchemaType::Protobuf => {
                let imports: Vec<(&str, &str)> = referenced
                    .iter()
                    .map(|(name, r)| (name.as_str(), r.schema.as_str()))
                    .collect();
                ParsedSchema::Protobuf(Arc::new(ProtobufSchema::parse_with_imports(
                    &schema.schema,
                    &label,
                    &imports,
                )?))
            }
            SchemaType::Json if referenced.is_empty() => {
                ParsedSchema::Json(Arc::new(JsonSchema::parse(&schema.schema, &label)?))
            }
            SchemaType::Json => {
                return Err(invalid(
                    "a JSON Schema that references other subjects' schemas, which this client \
                     does not resolve"
                        .into(),
                ));
            }
        };
        let mut caches = self.write_caches();
        caches.parses += 1;
        // Two tasks may have parsed the same id at once; both results are the same schema.
        Ok(caches.parsed.entry(id).or_insert(parsed).clone())
    }

    /// The schemas `references` names, and theirs, each once (by subject and version), with the
    /// name each is referenced by: what a schema that uses other subjects' types is parsed with
    /// (docs/schemas.md "Schemas that reference others"). A reference the registry does not have
    /// makes the schema invalid, naming it; more than [`MAX_REFERENCES`] (a cycle, or a graph no
    /// producer writes) too.
    async fn referenced_schemas(
        &self,
        label: &str,
        references: &[SchemaReference],
    ) -> Result<Vec<(String, Arc<Schema>)>, SchemaError> {
        let mut found = Vec::new();
        let mut seen = std::collections::HashSet::new();
        let mut waiting: Vec<SchemaReference> = references.iter().rev().cloned().collect();
        while let Some(reference) = waiting.pop() {
            if !seen.insert((reference.subject.clone(), reference.version)) {
                continue;
            }
            if seen.len() > MAX_REFERENCES {
                return Err(SchemaError::InvalidSchema {
                    schema: label.to_owned(),
                    detail: format!("references more than {MAX_REFERENCES} schemas"),
                });
            }
            // Confluent's -1: the subject's latest version.
            let which = match reference.version {
                ..0 => "latest".to_owned(),
                version => version.to_string(),
            };
            let version = match self.fetch_version(&reference.subject, &which).await {
                Ok(version) => version,
                Err(error) if error.is_transient() => return Err(error),
                Err(error) => {
                    return Err(SchemaError::InvalidSchema {
                        schema: label.to_owned(),
                        detail: format!(
                            "its reference {} (subject {} version {which}) cannot be read: {error}",
                            reference.name, reference.subject
                        ),
                    });
                }
            };
            waiting.extend(version.schema.references.iter().rev().cloned());
            found.push((reference.name, version.schema));
        }
        Ok(found)
    }

    /// The Avro schema with this id, parsed once and kept.
    pub async fn avro_schema(&self, id: SchemaId) -> Result<Arc<AvroSchema>, SchemaError> {
        match self.parsed_schema(id).await? {
            ParsedSchema::Avro(schema) => Ok(schema),
            _ => Err(self.not_of_type(id, "Avro")),
        }
    }

    /// The Protobuf schema with this id, compiled once and kept.
    pub async fn protobuf_schema(&self, id: SchemaId) -> Result<Arc<ProtobufSchema>, SchemaError> {
        match self.parsed_schema(id).await? {
            ParsedSchema::Protobuf(schema) => Ok(schema),
            _ => Err(self.not_of_type(id, "Protobuf")),
        }
    }

    /// The JSON Schema with this id, compiled once and kept.
    pub async fn json_schema(&self, id: SchemaId) -> Result<Arc<JsonSchema>, SchemaError> {
        match self.parsed_schema(id).await? {
            ParsedSchema::Json(schema) => Ok(schema),
            _ => Err(self.not_of_type(id, "a JSON Schema")),
        }
    }

    fn not_of_type(&self, id: SchemaId, wanted: &str) -> SchemaError {
        let found = self
            .read_caches()
            .by_id
            .get(&id)
            .map(|schema| schema.schema_type)
            .unwrap_or_default();
        SchemaError::InvalidSchema {
            schema: format!("id {id}"),
            detail: format!("is {found:?}, not {wanted}"),
        }
    }

    /// A framed record's schema id and value, decoded with the schema its id names (Avro,
    /// Protobuf or JSON Schema). After the first record of an id, no request and no parse.
    pub async fn decode(&self, record: &[u8]) -> Result<(SchemaId, Json), SchemaError> {
        let framed = wire::unframe(record)?;
        let schema = self.parsed_schema(framed.schema_id).await?;
        Ok((framed.schema_id, schema.decode(framed.payload)?))
    }

    /// A framed Avro record read as the schema `reader` (a subject's latest, or a pinned id),
    /// resolved from the schema that wrote it (the record's id) by Avro's rules: records of a
    /// producer that moved to a compatible schema give the same event model as before. A pair
    /// that does not resolve is [`SchemaError::Undecodable`] naming both ids; each pair is checked
    /// once.
    pub async fn decode_avro_as(
        &self,
        record: &[u8],
        reader: SchemaId,
    ) -> Result<Json, SchemaError> {
        let framed = wire::unframe(record)?;
        let writer_id = framed.schema_id;
        let writer = self.avro_schema(writer_id).await?;
        if writer_id == reader {
            return writer.decode(framed.payload);
        }
        let reading = self.avro_schema(reader).await?;
        let known = self
            .read_caches()
            .avro_pairs
            .get(&(writer_id, reader))
            .cloned();
        let resolves = match known {
            Some(resolves) => resolves,
            None => {
                let resolves = reading.can_read(&writer);
                self.write_caches()
                    .avro_pairs
                    .insert((writer_id, reader), resolves.clone());
                resolves
            }
        };
        if let Err(reason) = resolves {
            return Err(SchemaError::Undecodable {
                schema: format!("id {writer_id} read as id {reader}"),
                detail: format!("the writer's schema does not resolve to the reader's: {reason}"),
            });
        }
        reading.decode_from(&writer, framed.payload)
    }

    /// A framed Avro record read as `subject`'s latest version ([`RegistryClient::latest`], kept
    /// for [`RegistryConfig::latest_max_age`]), as [`RegistryClient::decode_avro_as`] reads it.
    pub async fn decode_avro_latest(
        &self,
        record: &[u8],
        subject: &str,
    ) -> Result<Json, SchemaError> {
        let reader = self.latest(subject).await?.id;
        self.decode_avro_as(record, reader).await
    }

    /// How many schema texts this client (and its clones) has parsed, one per schema id used.
    pub fn schemas_parsed(&self) -> u64 {
        self.read_caches().parses
    }

    /// Registers `schema` under `subject` (`POST /subjects/{subject}/versions`) and answers its
    /// id; registering a schema the subject already has answers the existing id. Kept for good,
    /// so a producer's every record costs no request.
    pub async fn register(&self, subject: &str, schema: &Schema) -> Result<SchemaId, SchemaError> {
        let key = (subject.to_owned(), schema.clone());
        if let Some(known) = self.read_caches().registered.get(&key) {
            return Ok(match known {
                SubjectVersionOrId::Id(id) => *id,
                SubjectVersionOrId::Version(version) => version.id,
            });
        }
        let answer: IdAnswer = self
            .send(
                self.http
                    .post(format!(
                        "{}/subjects/{}/versions",
                        self.base,
                        segment(subject)
                    ))
                    .json(schema),
                Asked::Subject(subject),
            )
            .await?;
        self.write_caches()
            .registered
            .insert(key, SubjectVersionOrId::Id(answer.id));
        Ok(answer.id)
    }

    /// The subject's version of `schema` (`POST /subjects/{subject}`), without registering it:
    /// [`SchemaError::NotRegistered`] when the subject does not have it. Kept for good.
    pub async fn lookup(
        &self,
        subject: &str,
        schema: &Schema,
    ) -> Result<SubjectVersion, SchemaError> {
        let key = (subject.to_owned(), schema.clone());
        if let Some(SubjectVersionOrId::Version(version)) = self.read_caches().registered.get(&key)
        {
            return Ok(version.clone());
        }
        let answer: SubjectVersionAnswer = self
            .send(
                self.http
                    .post(format!("{}/subjects/{}", self.base, segment(subject)))
                    .json(schema),
                Asked::Subject(subject),
            )
            .await?;
        let version = SubjectVersion::from(answer);
        self.write_caches()
            .registered
            .insert(key, SubjectVersionOrId::Version(version.clone()));
        Ok(version)
    }

    /// The subject's latest version (`GET /subjects/{subject}/versions/latest`), asked again
    /// once it is older than [`RegistryConfig::latest_max_age`]. Its schema is cached by id too.
    pub async fn latest(&self, subject: &str) -> Result<SubjectVersion, SchemaError> {
        if let Some((fetched, version)) = self.read_caches().latest.get(subject)
            && fetched.elapsed() < self.latest_max_age
        {
            return Ok(version.clone());
        }
        let version = self.fetch_version(subject, "latest").await?;
        self.write_caches()
            .latest
            .insert(subject.to_owned(), (Instant::now(), version.clone()));
        Ok(version)
    }

    /// One version of the subject (`GET /subjects/{subject}/versions/{version}`): a pinned
    /// schema. Its schema is cached by id.
    pub async fn version(
        &self,
        subject: &str,
        version: u32,
    ) -> Result<SubjectVersion, SchemaError> {
        self.fetch_version(subject, &version.to_string()).await
    }

    /// `GET /subjects/{subject}/versions/{which}` (`latest` or a number); its schema is cached by
    /// id.
    async fn fetch_version(
        &self,
        subject: &str,
        which: &str,
    ) -> Result<SubjectVersion, SchemaError> {
        let answer: SubjectVersionAnswer = self
            .send(
                self.http.get(format!(
                    "{}/subjects/{}/versions/{which}",
                    self.base,
                    segment(subject)
                )),
                Asked::Subject(subject),
            )
            .await?;
        let version = SubjectVersion::from(answer);
        self.write_caches()
            .by_id
            .entry(version.id)
            .or_insert_with(|| Arc::clone(&version.schema));
        Ok(version)
    }

    async fn send<T: serde::de::DeserializeOwned>(
        &self,
        request: reqwest::RequestBuilder,
        asked: Asked<'_>,
    ) -> Result<T, SchemaError> {
        let mut request = request
            .header(ACCEPT, HeaderValue::from_static(REGISTRY_JSON))
            .header(CONTENT_TYPE, HeaderValue::from_static(REGISTRY_JSON));
        if let Some((user, password)) = &self.basic_auth {
            request = request.basic_auth(user, Some(password));
        }
        let unreachable = |error: reqwest::Error| SchemaError::Unreachable {
            url: self.base.clone(),
            detail: error.without_url().to_string(),
        };
        let response = request.send().await.map_err(unreachable)?;
        let status = response.status();
        let body = response.bytes().await.map_err(unreachable)?;
        if status.is_success() {
            return serde_json::from_slice(&body).map_err(|error| SchemaError::Unreachable {
                url: self.base.clone(),
                detail: format!(
                    "an answer that does not parse ({error}): {}",
                    excerpt(&body)
                ),
            });
        }
        let ErrorBody {
            error_code,
            message,
        } = serde_json::from_slice(&body).unwrap_or_else(|_| ErrorBody {
            error_code: 0,
            message: excerpt(&body),
        });
        let status = status.as_u16();
        Err(match (error_code, asked) {
            (40403, Asked::Id(id)) => SchemaError::UnknownSchemaId { id },
            // A lookup's 40403: the subject does not have this schema.
            (40403, Asked::Subject(subject)) => SchemaError::NotRegistered {
                subject: subject.to_owned(),
            },
            (40401 | 40402, Asked::Subject(subject)) => SchemaError::UnknownSubject {
                subject: subject.to_owned(),
                detail: message,
            },
            (_, Asked::Subject(subject)) if status == 409 || status == 422 => {
                SchemaError::Refused {
                    subject: subject.to_owned(),
                    status,
                    error_code,
                    message,
                }
            }
            _ if status >= 500 => SchemaError::RegistryFailed {
                url: self.base.clone(),
                status,
                message,
            },
            _ => SchemaError::Unexpected {
                url: self.base.clone(),
                status,
                error_code,
                message,
            },
        })
    }

    fn read_caches(&self) -> std::sync::RwLockReadGuard<'_, Caches> {
        // A panic elsewhere cannot leave a cache half-written: each write is one insert.
        self.caches.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write_caches(&self) -> std::sync::RwLockWriteGuard<'_, Caches> {
        self.caches.write().unwrap_or_else(PoisonError::into_inner)
    }
}

fn segment(subject: &str) -> String {
    utf8_percent_encode(subject, PATH_SEGMENT).to_string()
}

/// At most 300 bytes of an answer body, for an error message.
fn excerpt(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    match text.char_indices().nth(300) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.into_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_schema_without_a_type_is_avro_and_serializes_as_confluent_expects() {
        let schema: Schema = serde_json::from_str(r#"{"schema":"\"string\""}"#).expect("parses");
        assert_eq!(schema, Schema::avro("\"string\""));
        let body = serde_json::to_value(Schema {
            schema: "syntax = \"proto3\";".into(),
            schema_type: SchemaType::Protobuf,
            references: Vec::new(),
        })
        .expect("serializes");
        assert_eq!(
            body,
            serde_json::json!({"schema": "syntax = \"proto3\";", "schemaType": "PROTOBUF"})
        );
    }

    #[test]
    fn subjects_stay_one_path_segment() {
        assert_eq!(segment("payments-value"), "payments-value");
        assert_eq!(segment("a/b c:d.e_f~g"), "a%2Fb%20c%3Ad.e_f~g");
    }

    #[test]
    fn credentials_in_the_url_become_basic_auth_and_leave_the_url() {
        let client = RegistryClient::new(RegistryConfig::new(
            "https://svc%40a:p%3Ass@registry.example/ccompat/",
        ))
        .expect("client");
        assert_eq!(client.url(), "https://registry.example/ccompat");
        assert_eq!(
            client.basic_auth,
            Some(("svc@a".to_owned(), "p:ss".to_owned()))
        );
        for bad in ["registry:8081", "file:///etc/passwd", "not a url"] {
            let error = RegistryClient::new(RegistryConfig::new(bad)).expect_err("refused");
            assert!(
                matches!(error, SchemaError::InvalidUrl(_)),
                "{bad}: {error}"
            );
        }
    }

    #[test]
    fn debug_shows_no_password() {
        let mut config = RegistryConfig::new("http://127.0.0.1:1/");
        config.basic_auth = Some(("user".into(), "secret".into()));
        let client = RegistryClient::new(config).expect("client");
        let shown = format!("{client:?}");
        assert!(
            shown.contains("user") && !shown.contains("secret"),
            "{shown}"
        );
        assert_eq!(client.url(), "http://127.0.0.1:1");
    }

    /// A registry on loopback that answers every request from `answers` (by request line) and
    /// counts the requests it gets, each on a connection of its own.
    async fn counting_registry(
        answers: &'static [(&'static str, &'static str)],
    ) -> (String, Arc<std::sync::atomic::AtomicUsize>) {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("address"));
        let requests = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&requests);
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let mut request = Vec::new();
                let mut buffer = [0u8; 4096];
                // Headers, then as much body as Content-Length says.
                loop {
                    let n = socket.read(&mut buffer).await.unwrap_or(0);
                    request.extend_from_slice(&buffer[..n]);
                    let text = String::from_utf8_lossy(&request).to_lowercase();
                    if let Some(end) = text.find("\r\n\r\n") {
                        let length = text
                            .lines()
                            .find_map(|line| line.strip_prefix("content-length:"))
                            .and_then(|value| value.trim().parse::<usize>().ok())
                            .unwrap_or(0);
                        if n == 0 || request.len() >= end + 4 + length {
                            break;
                        }
                    } else if n == 0 {
                        break;
                    }
                }
                counted.fetch_add(1, Ordering::SeqCst);
                let text = String::from_utf8_lossy(&request);
                let line = text.lines().next().unwrap_or_default();
                let body = answers
                    .iter()
                    .find(|(asked, _)| line.starts_with(asked))
                    .map_or(
                        r#"{"error_code": 40401, "message": "not here"}"#,
                        |(_, body)| body,
                    );
                let status = if body.contains("error_code") {
                    "404 Not Found"
                } else {
                    "200 OK"
                };
                let answer = format!(
                    "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = socket.write_all(answer.as_bytes()).await;
            }
        });
        (url, requests)
    }

    #[tokio::test]
    async fn the_registry_is_asked_once_per_schema_not_once_per_record() {
        use std::sync::atomic::Ordering;
        const ANSWERS: &[(&str, &str)] = &[
            ("GET /schemas/ids/7 ", r#"{"schema": "\"string\""}"#),
            ("POST /subjects/s-value/versions ", r#"{"id": 7}"#),
            (
                "GET /subjects/s-value/versions/latest ",
                r#"{"subject": "s-value", "version": 1, "id": 8, "schema": "\"long\""}"#,
            ),
        ];
        let (url, requests) = counting_registry(ANSWERS).await;
        let client = RegistryClient::new(RegistryConfig::new(&url)).expect("client");
        for _ in 0..3 {
            assert_eq!(
                client
                    .schema_by_id(SchemaId(7))
                    .await
                    .expect("known")
                    .schema,
                "\"string\""
            );
            client
                .avro_schema(SchemaId(7))
                .await
                .expect("an Avro string");
        }
        assert_eq!(requests.load(Ordering::SeqCst), 1, "one request for id 7");
        for _ in 0..3 {
            let id = client
                .register("s-value", &Schema::avro("\"string\""))
                .await;
            assert_eq!(id.expect("registered"), SchemaId(7));
        }
        assert_eq!(requests.load(Ordering::SeqCst), 2, "one more to register");
        for _ in 0..3 {
            assert_eq!(
                client.latest("s-value").await.expect("a version").id,
                SchemaId(8)
            );
        }
        // The latest version's schema is known by its id from then on.
        client.avro_schema(SchemaId(8)).await.expect("an Avro long");
        assert_eq!(
            requests.load(Ordering::SeqCst),
            3,
            "one more for the latest version"
        );

        // Once the latest version is older than its age limit, it is asked for again.
        let mut config = RegistryConfig::new(&url);
        config.latest_max_age = Duration::ZERO;
        let always_asks = RegistryClient::new(config).expect("client");
        always_asks.latest("s-value").await.expect("a version");
        always_asks.latest("s-value").await.expect("a version");
        assert_eq!(requests.load(Ordering::SeqCst), 5);
        let error = always_asks
            .latest("gone-value")
            .await
            .expect_err("no such subject");
        assert!(
            matches!(error, SchemaError::UnknownSubject { .. }),
            "{error}"
        );
    }

    #[tokio::test]
    async fn a_known_id_decodes_with_no_request_and_no_parse() {
        use std::sync::atomic::Ordering;
        const ANSWERS: &[(&str, &str)] = &[
            ("GET /schemas/ids/1 ", r#"{"schema": "\"string\""}"#),
            (
                "GET /schemas/ids/2 ",
                r#"{"schemaType": "PROTOBUF", "schema": "syntax = \"proto3\"; message M { int64 n = 1; }"}"#,
            ),
            (
                "GET /schemas/ids/3 ",
                r#"{"schemaType": "JSON", "schema": "{\"type\": \"object\", \"required\": [\"n\"]}"}"#,
            ),
        ];
        let (url, requests) = counting_registry(ANSWERS).await;
        let client = RegistryClient::new(RegistryConfig::new(&url)).expect("client");
        let avro = AvroSchema::parse("\"string\"", "local").expect("parses");
        let protobuf =
            ProtobufSchema::parse("syntax = \"proto3\"; message M { int64 n = 1; }", "local")
                .expect("compiles");
        let records = [
            (
                avro.encode_framed(SchemaId(1), &serde_json::json!("hi")),
                serde_json::json!("hi"),
            ),
            (
                protobuf.encode_framed(SchemaId(2), &serde_json::json!({"n": 5})),
                serde_json::json!({"n": 5}),
            ),
            (
                Ok(wire::frame(SchemaId(3), br#"{"n": 1}"#)),
                serde_json::json!({"n": 1}),
            ),
        ];
        for round in 1..=3 {
            for (record, value) in &records {
                let record = record.as_ref().expect("fits");
                assert_eq!(&client.decode(record).await.expect("decodes").1, value);
            }
            assert_eq!(
                client.schemas_parsed(),
                3,
                "round {round}: one parse per id"
            );
            assert_eq!(
                requests.load(Ordering::SeqCst),
                3,
                "round {round}: one request per id"
            );
        }
        let error = client
            .avro_schema(SchemaId(2))
            .await
            .expect_err("a Protobuf schema");
        assert!(error.to_string().contains("Protobuf, not Avro"), "{error}");
    }

    #[tokio::test]
    async fn an_unreachable_registry_is_transient() {
        // Port 1 on loopback: nothing listens there, the connection is refused at once.
        let client =
            RegistryClient::new(RegistryConfig::new("http://127.0.0.1:1")).expect("client");
        let error = client
            .schema_by_id(SchemaId(1))
            .await
            .expect_err("nothing listens");
        assert!(error.is_transient(), "{error}");
    }
}
