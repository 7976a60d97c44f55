//! A topic's record values as the JSON event model (docs/schemas.md): plain JSON as it is, or a
//! schema registry's wire format (Avro, Protobuf or JSON Schema) decoded with the schema that
//! wrote it, so that what reads the event (the processor's transform, the sink's column mapping)
//! sees the same event whatever the topic's format, and the fingerprint that catches "same id,
//! other content" is the decoded content's.
//!
//! The registry is never on a record's path once its schema id has been seen: each id is asked
//! for and parsed once ([`RegistryClient`]), and its answer kept for the process's life (a
//! registry never gives an id to another schema). Asking happens before a record joins a batch
//! ([`RecordDecoder::prepare`]), so an unreachable registry holds no transaction open; decoding
//! ([`RecordDecoder::decode`]) is pure.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::wire;
use crate::{AvroSchema, ParsedSchema, RegistryClient, RegistryConfig, SchemaError, SchemaId};

/// How a topic's record values are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RecordFormat {
    /// A JSON object per record, no registry.
    Json,
    /// Avro in the registry's wire format, decoded with the schema that wrote it.
    Avro,
    /// Protobuf in the registry's wire format (with its message-index list).
    Protobuf,
    /// JSON validated against a JSON Schema, in the registry's wire format.
    JsonSchema,
}

impl RecordFormat {
    /// Whether `schema` is of this format's kind.
    pub fn fits(self, schema: &ParsedSchema) -> bool {
        matches!(
            (self, schema),
            (RecordFormat::Avro, ParsedSchema::Avro(_))
                | (RecordFormat::Protobuf, ParsedSchema::Protobuf(_))
                | (RecordFormat::JsonSchema, ParsedSchema::Json(_))
        )
    }

    /// The format's flag value.
    pub fn name(self) -> &'static str {
        match self {
            RecordFormat::Json => "json",
            RecordFormat::Avro => "avro",
            RecordFormat::Protobuf => "protobuf",
            RecordFormat::JsonSchema => "json-schema",
        }
    }
}

/// A schema's kind, as a refusal names it.
pub fn schema_name(schema: &ParsedSchema) -> &'static str {
    match schema {
        ParsedSchema::Avro(_) => "an Avro schema",
        ParsedSchema::Protobuf(_) => "a Protobuf schema",
        ParsedSchema::Json(_) => "a JSON Schema",
    }
}

/// Where a registry format's schema registry is, and how to authenticate to it.
#[derive(Debug, Clone, clap::Args)]
pub struct RegistryFlags {
    /// The schema registry's API, Confluent's or one compatible with it (Apicurio's
    /// /apis/ccompat/v7); required with a registry format. Credentials go in
    /// --schema-registry-auth-file, never in the URL.
    #[arg(
        long,
        env = "EOS_SCHEMA_REGISTRY_URL",
        value_name = "URL",
        hide_env_values = true
    )]
    pub schema_registry_url: Option<String>,

    /// A file holding USER:PASSWORD for the registry's HTTP basic authentication (one line).
    #[arg(long, env = "EOS_SCHEMA_REGISTRY_AUTH_FILE", value_name = "FILE")]
    pub schema_registry_auth_file: Option<PathBuf>,

    /// Each request to the registry is given up after this long, and asked again with backoff
    /// while the record waits.
    #[arg(long, env = "EOS_SCHEMA_REGISTRY_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub schema_registry_timeout: Duration,
}

impl RegistryFlags {
    /// `format` as a boundary line shows it: `json`, or `avro via URL`.
    pub fn describe(&self, format: RecordFormat) -> String {
        match (format, &self.schema_registry_url) {
            (RecordFormat::Json, _) | (_, None) => format.name().to_owned(),
            (format, Some(url)) => format!(
                "{} via {}",
                format.name(),
                eos_runtime::secrets::redact_url_userinfo(url)
            ),
        }
    }

    /// The registry's settings when one of `formats` (each with the flag that set it) is a
    /// registry format, `None` when all are plain JSON; an error naming the flag when they do
    /// not fit together.
    pub fn registry_config(
        &self,
        formats: &[(&str, RecordFormat)],
    ) -> Result<Option<RegistryConfig>, String> {
        // An empty value is no URL: what `EOS_SCHEMA_REGISTRY_URL=` in a compose file gives.
        let url = self
            .schema_registry_url
            .as_deref()
            .filter(|url| !url.is_empty());
        let registry_format = formats
            .iter()
            .find(|(_, format)| *format != RecordFormat::Json);
        let url = match (registry_format, url) {
            (None, _) => return Ok(None),
            (Some((flag, format)), None) => {
                return Err(format!(
                    "{flag} {} needs --schema-registry-url",
                    format.name()
                ));
            }
            (Some(_), Some(url)) => url,
        };
        if eos_runtime::secrets::url_has_userinfo(url) {
            return Err(
                "--schema-registry-url carries credentials: put USER:PASSWORD in \
                 --schema-registry-auth-file instead"
                    .into(),
            );
        }
        let mut config = RegistryConfig::new(url.trim_end_matches('/'));
        config.request_timeout = self.schema_registry_timeout;
        if let Some(path) = &self.schema_registry_auth_file {
            let text = eos_runtime::secrets::read_secret_file(path)
                .map_err(|error| format!("--schema-registry-auth-file: {error}"))?;
            let Some((user, password)) = text.split_once(':') else {
                return Err(format!(
                    "--schema-registry-auth-file {}: not USER:PASSWORD",
                    path.display()
                ));
            };
            config.basic_auth = Some((user.to_owned(), password.to_owned()));
        }
        Ok(Some(config))
    }
}

/// A schema id's fate, kept for the process's life: its schema, or why its records are refused.
#[derive(Debug, Clone)]
enum Known {
    Schema(ParsedSchema),
    Refused(String),
}

#[cfg(test)]
impl Known {
    fn schema(self) -> ParsedSchema {
        match self {
            Known::Schema(schema) => schema,
            Known::Refused(why) => panic!("refused: {why}"),
        }
    }
}

/// The registry a registry format reads through, and what it answered.
struct Registry {
    client: RegistryClient,
    /// The processor's loop runs on a blocking thread: it waits for the client's answers here.
    runtime: tokio::runtime::Handle,
    known: HashMap<SchemaId, Known>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("url", &self.client.url())
            .field("known_ids", &self.known.len())
            .finish_non_exhaustive()
    }
}

/// The Avro schema every record is read as, whatever schema wrote it (a consumer's reader
/// schema): found at start-up.
#[derive(Debug, Clone)]
pub struct ReaderSchema {
    /// The subject it is a version of, for messages.
    pub subject: String,
    pub id: SchemaId,
    pub schema: Arc<AvroSchema>,
}

/// Turns a topic's record values into the JSON event model.
#[derive(Debug)]
pub struct RecordDecoder {
    format: RecordFormat,
    /// TopicNameStrategy's subject of the input's values, named in refusals so that an operator
    /// knows where to look.
    subject: String,
    registry: Option<Registry>,
    /// Avro only: every record read as this schema, resolved from its writer's by Avro's rules.
    reader: Option<ReaderSchema>,
}

impl RecordDecoder {
    /// A decoder of `format`'s records of `input_topic`; `registry` is required for a registry
    /// format and must be called from within the Tokio runtime whose handle it keeps.
    pub fn new(
        format: RecordFormat,
        input_topic: &str,
        registry: Option<RegistryConfig>,
    ) -> Result<Self, SchemaError> {
        let registry = match registry {
            Some(config) if format != RecordFormat::Json => Some(Registry {
                client: RegistryClient::new(config)?,
                runtime: tokio::runtime::Handle::current(),
                known: HashMap::new(),
            }),
            _ => None,
        };
        Ok(Self {
            format,
            subject: format!("{input_topic}-value"),
            registry,
            reader: None,
        })
    }

    /// Reads every record as `reader` (Avro): a transform sees the reader's fields whatever
    /// compatible schema a producer wrote with, and a writer's schema that does not resolve to
    /// it makes its records dead letters naming both ids.
    pub fn with_reader(mut self, reader: ReaderSchema) -> Self {
        self.reader = Some(reader);
        self
    }

    /// A plain-JSON decoder: values pass as they are.
    pub fn json() -> Self {
        Self {
            format: RecordFormat::Json,
            subject: String::new(),
            registry: None,
            reader: None,
        }
    }

    /// Asks the registry for the schema `value` names, unless its id was seen before. `Err` only
    /// while the registry cannot answer (transient: the record waits and is asked for again);
    /// everything else, a refusal included, is kept for [`Self::decode`].
    pub fn prepare(&mut self, value: Option<&[u8]>) -> Result<(), SchemaError> {
        let Some(registry) = &mut self.registry else {
            return Ok(());
        };
        let Some(Ok(framed)) = value.map(wire::unframe) else {
            return Ok(());
        };
        let id = framed.schema_id;
        if registry.known.contains_key(&id) {
            return Ok(());
        }
        let known = match registry.runtime.block_on(registry.client.parsed_schema(id)) {
            Ok(schema) if self.format.fits(&schema) => match (&self.reader, &schema) {
                (Some(reader), ParsedSchema::Avro(writer)) => {
                    match reader.schema.can_read(writer) {
                        Ok(()) => Known::Schema(schema),
                        Err(reason) => Known::Refused(format!(
                            "schema id {id} does not resolve to the reader's schema, subject {} id \
                         {}: {reason}",
                            reader.subject, reader.id
                        )),
                    }
                }
                _ => Known::Schema(schema),
            },
            Ok(schema) => Known::Refused(format!(
                "schema id {id} is {}, and the input's format is {}",
                schema_name(&schema),
                self.format.name()
            )),
            Err(error) if error.is_transient() => return Err(error),
            Err(error) => Known::Refused(error.to_string()),
        };
        registry.known.insert(id, known);
        Ok(())
    }

    /// `value` as the JSON event model: as it is for plain JSON, decoded for a registry format
    /// (after [`Self::prepare`]). `Err` says why the record is an `undecodable_record` dead
    /// letter, naming the subject and the schema id.
    pub fn decode<'a>(&self, value: Option<&'a [u8]>) -> Result<Option<Decoded<'a>>, String> {
        let (Some(registry), Some(value)) = (&self.registry, value) else {
            // A tombstone stays one (an empty_record dead letter).
            return Ok(value.map(|value| Decoded {
                value: Cow::Borrowed(value),
                content: None,
            }));
        };
        let subject = &self.subject;
        let framed = wire::unframe(value).map_err(|error| format!("subject {subject}: {error}"))?;
        let id = framed.schema_id;
        let schema = match registry.known.get(&id) {
            Some(Known::Schema(schema)) => schema,
            Some(Known::Refused(why)) => return Err(format!("subject {subject}: {why}")),
            None => {
                return Err(format!(
                    "subject {subject}: schema id {id} was not asked for (a bug: prepare comes first)"
                ));
            }
        };
        let (decoded, content) = match (&self.reader, schema) {
            // The reader's view is the content: another writer's encoding of it is the same.
            (Some(reader), ParsedSchema::Avro(writer)) => reader
                .schema
                .decode_from(writer, framed.payload)
                .map(|decoded| (decoded.clone(), decoded)),
            _ => schema.decode_with_content(framed.payload),
        }
        .map_err(|error| format!("subject {subject}, schema id {id}: {error}"))?;
        if !decoded.is_object() {
            return Err(format!(
                "subject {subject}, schema id {id}: the record decodes to {decoded}, not an object"
            ));
        }
        Ok(Some(Decoded {
            content: (content != decoded).then(|| eos_core::json_text::to_vec(&content)),
            value: Cow::Owned(eos_core::json_text::to_vec(&decoded)),
        }))
    }
}

impl Decoded<'_> {
    /// The same, owning its bytes.
    pub fn into_owned(self) -> Decoded<'static> {
        Decoded {
            value: Cow::Owned(self.value.into_owned()),
            content: self.content,
        }
    }
}

/// A record's value in the JSON event model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decoded<'a> {
    pub value: Cow<'a, [u8]>,
    /// What the event's fingerprint is of, when not `value`: an Avro or Protobuf value without
    /// its fields at their default, so the same event written with a newer compatible schema
    /// keeps its fingerprint (docs/schemas.md "Schema evolution").
    pub content: Option<Vec<u8>>,
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::{AvroSchema, ProtobufSchema};
    use clap::{CommandFactory as _, FromArgMatches as _, Parser};
    use serde_json::json;

    use super::*;

    /// The registry flags beside an input and an output format, as eos-processor has them.
    #[derive(Debug, Parser)]
    struct Flags {
        #[arg(long, value_enum, default_value_t = RecordFormat::Json)]
        input_format: RecordFormat,
        #[arg(long, value_enum, default_value_t = RecordFormat::Json)]
        output_format: RecordFormat,
        #[command(flatten)]
        registry: RegistryFlags,
    }

    impl Flags {
        fn registry_config(&self) -> Result<Option<RegistryConfig>, String> {
            self.registry.registry_config(&[
                ("--input-format", self.input_format),
                ("--output-format", self.output_format),
            ])
        }

        fn describe(&self) -> String {
            self.registry.describe(self.input_format)
        }

        fn describe_output(&self) -> String {
            self.registry.describe(self.output_format)
        }
    }

    /// Parsed as a binary does, but without the environment: `make test` exports
    /// EOS_SCHEMA_REGISTRY_URL, which would otherwise fill --schema-registry-url.
    fn flags(args: &[&str]) -> Flags {
        let command = Flags::command().mut_args(|arg| arg.env(None));
        let matches = command
            .try_get_matches_from(std::iter::once("test").chain(args.iter().copied()))
            .expect("flags parse");
        Flags::from_arg_matches(&matches).expect("flags parse")
    }

    const AVRO: &str = r#"{"type": "record", "name": "E", "fields": [
        {"name": "event_id", "type": "string"}, {"name": "value", "type": "long"}]}"#;

    /// A decoder of `format` that already knows schema ids 1 (Avro) and 2 (Protobuf) and that
    /// id 3 was refused, as `prepare` would have left it.
    fn decoder(format: RecordFormat, runtime: &tokio::runtime::Runtime) -> RecordDecoder {
        let _entered = runtime.enter();
        let mut decoder = RecordDecoder::new(
            format,
            "orders",
            Some(RegistryConfig::new("http://127.0.0.1:9")),
        )
        .expect("a client");
        let registry = decoder.registry.as_mut().expect("a registry format");
        let avro = AvroSchema::parse(AVRO, "id 1").expect("parses");
        let proto = ProtobufSchema::parse(
            "syntax = \"proto3\";\nmessage E { string event_id = 1; int64 value = 2; }\n",
            "id 2",
        )
        .expect("parses");
        for (id, schema) in [
            (1, ParsedSchema::Avro(Arc::new(avro))),
            (2, ParsedSchema::Protobuf(Arc::new(proto))),
        ] {
            let known = if format.fits(&schema) {
                Known::Schema(schema)
            } else {
                Known::Refused(format!("schema id {id} is {}", schema_name(&schema)))
            };
            registry.known.insert(SchemaId(id), known);
        }
        registry.known.insert(
            SchemaId(3),
            Known::Refused("schema id 3 is not in the registry".into()),
        );
        decoder
    }

    #[test]
    fn a_registry_format_needs_a_url_without_credentials() {
        assert!(
            flags(&[]).registry_config().expect("test set-up").is_none(),
            "json: none"
        );
        for empty in [
            &["--input-format", "avro"][..],
            &["--input-format", "avro", "--schema-registry-url", ""],
        ] {
            assert_eq!(
                flags(empty).registry_config().expect_err("refused"),
                "--input-format avro needs --schema-registry-url"
            );
        }
        assert_eq!(
            flags(&["--output-format", "json-schema"])
                .registry_config()
                .expect_err("refused"),
            "--output-format json-schema needs --schema-registry-url",
            "a registry format for the outputs only needs the registry too"
        );
        let outputs_only = flags(&[
            "--output-format",
            "avro",
            "--schema-registry-url",
            "http://registry:8081",
        ]);
        assert!(outputs_only.registry_config().expect("fits").is_some());
        assert_eq!(
            (outputs_only.describe(), outputs_only.describe_output()),
            (
                "json".to_owned(),
                "avro via http://registry:8081/".to_owned()
            )
        );
        let refused = flags(&[
            "--input-format",
            "protobuf",
            "--schema-registry-url",
            "http://user:hunter2@registry:8081",
        ])
        .registry_config()
        .expect_err("refused");
        assert!(
            refused.contains("--schema-registry-auth-file") && !refused.contains("hunter2"),
            "{refused}"
        );
        let config = flags(&[
            "--input-format",
            "json-schema",
            "--schema-registry-url",
            "http://registry:8081/",
            "--schema-registry-timeout",
            "2s",
        ])
        .registry_config()
        .expect("test set-up")
        .expect("a registry");
        assert_eq!(config.url, "http://registry:8081");
        assert_eq!(config.request_timeout, Duration::from_secs(2));
        assert_eq!(
            flags(&[
                "--input-format",
                "avro",
                "--schema-registry-url",
                "http://r:1"
            ])
            .describe(),
            "avro via http://r:1/"
        );
    }

    #[test]
    fn the_auth_file_holds_user_and_password() {
        let dir = std::env::temp_dir().join(format!("eos-input-format-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("test set-up");
        let good = dir.join("good");
        std::fs::write(&good, "svc:s3cret:with-colon\n").expect("test set-up");
        let bad = dir.join("bad");
        std::fs::write(&bad, "no-colon-here").expect("test set-up");
        let with = |file: &std::path::Path| {
            flags(&[
                "--input-format",
                "avro",
                "--schema-registry-url",
                "http://r:1",
                "--schema-registry-auth-file",
                file.to_str().expect("test set-up"),
            ])
            .registry_config()
        };
        let config = with(&good).expect("test set-up").expect("test set-up");
        assert_eq!(
            config.basic_auth,
            Some(("svc".into(), "s3cret:with-colon".into()))
        );
        let refused = with(&bad).expect_err("refused");
        assert!(
            refused.contains("not USER:PASSWORD") && !refused.contains("no-colon-here"),
            "{refused}"
        );
        std::fs::remove_dir_all(&dir).expect("test set-up");
    }

    #[test]
    fn plain_json_passes_as_it_is() {
        let decoder = RecordDecoder::json();
        let value = br#"{"event_id":"e-1"}"#;
        assert_eq!(
            decoder
                .decode(Some(value))
                .expect("test set-up")
                .map(|decoded| decoded.value),
            Some(Cow::Borrowed(&value[..]))
        );
        assert_eq!(decoder.decode(None).expect("test set-up"), None);
    }

    #[test]
    fn a_framed_record_becomes_its_json_event_or_a_refusal_naming_subject_and_id() {
        let runtime = tokio::runtime::Runtime::new().expect("test set-up");
        let decoder = decoder(RecordFormat::Avro, &runtime);
        let ParsedSchema::Avro(avro) = decoder.registry.as_ref().expect("test set-up").known
            [&SchemaId(1)]
            .clone()
            .schema()
        else {
            unreachable!()
        };
        let framed = avro
            .encode_framed(SchemaId(1), &json!({"event_id": "e-1", "value": 5}))
            .expect("test set-up");
        let decoded = decoder
            .decode(Some(&framed))
            .expect("test set-up")
            .expect("test set-up");
        assert_eq!(&*decoded.value, br#"{"event_id":"e-1","value":5}"#);
        assert_eq!(
            decoded.content, None,
            "no field at a default: the value is its content"
        );
        assert_eq!(
            decoder.decode(None).expect("test set-up"),
            None,
            "a tombstone stays one"
        );

        for (value, names) in [
            (
                br#"{"event_id":"e-1"}"#.to_vec(),
                "subject orders-value: not the schema registry's wire format",
            ),
            (
                wire::frame(SchemaId(2), b"\x00"),
                "subject orders-value: schema id 2 is a Protobuf schema",
            ),
            (
                wire::frame(SchemaId(3), b"\x00"),
                "subject orders-value: schema id 3 is not in the registry",
            ),
            (
                wire::frame(SchemaId(1), b"\xff"),
                "subject orders-value, schema id 1: payload does not decode",
            ),
            (
                wire::frame(SchemaId(4), b"\x00"),
                "schema id 4 was not asked for",
            ),
        ] {
            let refused = decoder.decode(Some(&value)).expect_err("refused");
            assert!(
                refused.starts_with(names) || refused.contains(names),
                "{refused}"
            );
        }
    }

    #[test]
    fn prepare_asks_nothing_for_json_unframed_or_known_ids() {
        let runtime = tokio::runtime::Runtime::new().expect("test set-up");
        let mut decoder = decoder(RecordFormat::Avro, &runtime);
        // Known ids and bytes that are not framed need no registry (port 9 would refuse).
        assert!(
            decoder
                .prepare(Some(&wire::frame(SchemaId(1), b"")))
                .is_ok()
        );
        assert!(
            decoder
                .prepare(Some(&wire::frame(SchemaId(3), b"")))
                .is_ok()
        );
        assert!(decoder.prepare(Some(b"{}")).is_ok());
        assert!(decoder.prepare(None).is_ok());
        // An unknown id asks, and an unreachable registry is transient: nothing is kept.
        let error = std::thread::spawn(move || {
            let error = decoder.prepare(Some(&wire::frame(SchemaId(5), b"")));
            (
                error,
                decoder
                    .registry
                    .expect("test set-up")
                    .known
                    .contains_key(&SchemaId(5)),
            )
        })
        .join()
        .expect("test set-up");
        assert!(
            matches!(&error.0, Err(e) if e.is_transient()),
            "{:?}",
            error.0
        );
        assert!(!error.1, "an outage's answer is not kept");
    }
}
