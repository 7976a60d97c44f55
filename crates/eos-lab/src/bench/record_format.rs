//! The record formats `eos-lab bench processor --format` compares: JSON, and Avro and Protobuf
//! in a schema registry's wire format (docs/schemas.md). A registry format's input holds the same
//! events as the JSON input (the same workload, seed and padding), each JSON envelope encoded with
//! the input schema below; the processor reads it with `--input-format` and writes its outputs with
//! `--output-format`, by the schema registered under each output topic's subject. The schemas are
//! the ledger transform's: its input envelope, and that envelope with the fields it adds
//! (`entity_total`, `entity_count`, `source`).
//!
//! Every processor round's outputs are read back and counted (`verify_outputs`): one output per
//! input, each decoding to its event, and no dead letter, so a format that does not work cannot
//! report a fast figure.

use std::collections::HashSet;
use std::time::Duration;

use anyhow::{Context as _, bail};
use eos_core::dead_letter;
use eos_schema::{
    ParsedSchema, RegistryClient, RegistryConfig, Schema, SchemaError, SchemaId, wire,
};
use eosctl::kafka_client::KafkaSettings;
use eosctl::source_record::SourceRecord;
use eosctl::topic_reader::read_topics;
use eosctl::workload::{GeneratedRecord, Workload, WorkloadSpec};
use serde::Serialize;
use serde_json::Value;
use tokio::runtime::Handle;

/// How often a registration the registry failed (a 5xx, no answer) is tried: the local stack's
/// registry answers 500 while its database connections are being ended by other tests.
const REGISTRY_ATTEMPTS: u32 = 5;
const REGISTRY_RETRY_PAUSE: Duration = Duration::from_secs(1);
/// Each request of the clean-up is given up after this long.
const REGISTRY_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// How one throughput input's records are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum RecordFormat {
    /// A JSON object per record (the processor's default).
    Json,
    /// Avro in the schema registry's wire format.
    Avro,
    /// Protobuf in the schema registry's wire format.
    Protobuf,
}

impl RecordFormat {
    /// The name the processor's `--input-format` and `--output-format` take.
    pub fn name(self) -> &'static str {
        match self {
            Self::Json => "json",
            Self::Avro => "avro",
            Self::Protobuf => "protobuf",
        }
    }

    /// The ledger envelope's schema, its payload `shape`'s; `None` for JSON.
    fn input_schema(self, shape: &SchemaShape) -> Option<Schema> {
        match self {
            Self::Json => None,
            Self::Avro => Some(Schema::avro(avro_schema(shape.input_name, shape, ""))),
            Self::Protobuf => Some(Schema::protobuf(protobuf_schema(
                shape.input_name,
                shape,
                "",
            ))),
        }
    }

    /// The ledger transform's output: the envelope and the fields the transform adds.
    fn output_schema(self, shape: &SchemaShape) -> Option<Schema> {
        match self {
            Self::Json => None,
            Self::Avro => Some(Schema::avro(avro_schema(
                "LedgerEntry",
                shape,
                AVRO_ADDED_FIELDS,
            ))),
            Self::Protobuf => Some(Schema::protobuf(protobuf_schema(
                "LedgerEntry",
                shape,
                PROTOBUF_ADDED_FIELDS,
            ))),
        }
    }
}

/// What sets one workload's schemas apart: the input record's name, the namespace (Avro) or
/// package (Protobuf), and the fields of the envelope's `payload`.
#[derive(Debug)]
pub(crate) struct SchemaShape {
    input_name: &'static str,
    namespace: &'static str,
    /// The payload record's fields, as Avro field objects.
    avro_payload: &'static str,
    /// The same fields in a Protobuf message body.
    protobuf_payload: &'static str,
}

/// eosctl's workload, which the benchmark sends: `"payload": {"kind", "pad"}`.
pub(crate) const WORKLOAD: SchemaShape = SchemaShape {
    input_name: "LedgerEvent",
    namespace: "eos.bench",
    avro_payload: r#"{"name": "kind", "type": "string"},
    {"name": "pad", "type": "string"}"#,
    protobuf_payload: "string kind = 1;\n    string pad = 2;",
};

/// payments-api's events, which the demo sends: `"payload": {"payment_id", "currency"}`.
pub(crate) const PAYMENT: SchemaShape = SchemaShape {
    input_name: "Payment",
    namespace: "eos.demo",
    avro_payload: r#"{"name": "payment_id", "type": "string"},
    {"name": "currency", "type": "string"}"#,
    protobuf_payload: "string payment_id = 1;\n    string currency = 2;",
};

impl std::fmt::Display for RecordFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The ledger envelope (`{"event_id", "entity_id", "value", "version", "occurred_at",
/// "payload"}`, the payload's fields `shape`'s) as an Avro record named `name`, with `added`
/// fields after it.
fn avro_schema(name: &str, shape: &SchemaShape, added: &str) -> String {
    let SchemaShape {
        namespace,
        avro_payload,
        ..
    } = shape;
    format!(
        r#"{{"type": "record", "name": "{name}", "namespace": "{namespace}", "fields": [
  {{"name": "event_id", "type": "string"}},
  {{"name": "entity_id", "type": "string"}},
  {{"name": "value", "type": "long"}},
  {{"name": "version", "type": "long"}},
  {{"name": "occurred_at", "type": "string"}},
  {{"name": "payload", "type": {{"type": "record", "name": "Payload", "fields": [
    {avro_payload}]}}}}{added}
]}}"#
    )
}

/// What the ledger transform adds to each output (eos-transform's `LEDGER_ADDED_FIELDS`).
const AVRO_ADDED_FIELDS: &str = r#",
  {"name": "entity_total", "type": "long"},
  {"name": "entity_count", "type": "long"},
  {"name": "source", "type": {"type": "record", "name": "Source", "fields": [
    {"name": "topic", "type": "string"},
    {"name": "partition", "type": "int"},
    {"name": "offset", "type": "long"}]}}"#;

/// The same envelope as a Protobuf message named `name` (the file's first, which the wire format
/// names with the index list `[0]`), with `added` fields after it.
fn protobuf_schema(name: &str, shape: &SchemaShape, added: &str) -> String {
    let SchemaShape {
        namespace,
        protobuf_payload,
        ..
    } = shape;
    format!(
        "syntax = \"proto3\";\npackage {namespace};\n\nmessage {name} {{\n  string event_id = 1;\n  \
         string entity_id = 2;\n  int64 value = 3;\n  uint64 version = 4;\n  string occurred_at = \
         5;\n  Payload payload = 6;{added}\n\n  message Payload {{\n    {protobuf_payload}\n  }}\n}}\n"
    )
}

const PROTOBUF_ADDED_FIELDS: &str = "\n  int64 entity_total = 7;\n  uint64 entity_count = 8;\n  \
     Source source = 9;\n\n  message Source {\n    string topic = 1;\n    int32 partition = 2;\n    \
     int64 offset = 3;\n  }";

/// How a processor run's records are written, and so how its outputs are read back.
#[derive(Debug, Clone)]
pub(crate) enum RunFormat {
    Json,
    /// A registry format, its outputs written with `output_schema` (id `output_id`).
    Registry {
        format: RecordFormat,
        registry_url: String,
        output_id: SchemaId,
        output_schema: ParsedSchema,
    },
}

impl RunFormat {
    pub(super) fn format(&self) -> RecordFormat {
        match self {
            Self::Json => RecordFormat::Json,
            Self::Registry { format, .. } => *format,
        }
    }

    /// The processor's flags for this format (none for JSON).
    pub(crate) fn processor_args(&self) -> Vec<String> {
        match self {
            Self::Json => Vec::new(),
            Self::Registry {
                format,
                registry_url,
                ..
            } => [
                "--input-format",
                format.name(),
                "--output-format",
                format.name(),
                "--schema-registry-url",
                registry_url,
            ]
            .map(String::from)
            .to_vec(),
        }
    }

    /// The `event_id` of an output value, decoded as the processor wrote it.
    fn output_event_id(&self, value: &[u8]) -> Result<String, String> {
        let json: Value = match self {
            Self::Json => serde_json::from_slice(value).map_err(|error| error.to_string())?,
            Self::Registry {
                output_id,
                output_schema,
                ..
            } => {
                let framed = wire::unframe(value).map_err(|error| error.to_string())?;
                if framed.schema_id != *output_id {
                    return Err(format!(
                        "written with schema id {}, not the output subject's {output_id}",
                        framed.schema_id
                    ));
                }
                output_schema
                    .decode(framed.payload)
                    .map_err(|error| error.to_string())?
            }
        };
        match json.get("event_id") {
            Some(Value::String(id)) => Ok(id.clone()),
            _ => Err("the output has no event_id".to_owned()),
        }
    }
}

/// The benchmark's schema registry: registers the schemas of its inputs and outputs under their
/// topics' subjects (TopicNameStrategy, `<topic>-value`) and deletes those subjects at the end.
pub(crate) struct SchemaRegistry {
    client: RegistryClient,
    url: String,
    runtime: Handle,
    /// Every subject registered, not yet deleted.
    subjects: Vec<String>,
}

impl SchemaRegistry {
    pub(crate) fn new(config: RegistryConfig, runtime: Handle) -> anyhow::Result<Self> {
        let url = config.url.trim_end_matches('/').to_owned();
        let client = RegistryClient::new(config)
            .with_context(|| format!("cannot make a client of the schema registry {url}"))?;
        Ok(Self {
            client,
            url,
            runtime,
            subjects: Vec::new(),
        })
    }

    /// Registers `format`'s input schema under `topic`'s subject: its id and the parsed schema.
    pub(crate) fn register_input(
        &mut self,
        format: RecordFormat,
        shape: &SchemaShape,
        topic: &str,
    ) -> anyhow::Result<(SchemaId, ParsedSchema)> {
        let schema = format
            .input_schema(shape)
            .context("JSON records have no schema")?;
        self.register(topic, &schema)
    }

    /// Registers `format`'s output schema under `topic`'s subject, where the processor looks for
    /// it at start-up: how a run of `format` writing to `topic` is read back.
    pub(crate) fn output_format(
        &mut self,
        format: RecordFormat,
        shape: &SchemaShape,
        topic: &str,
    ) -> anyhow::Result<RunFormat> {
        let Some(schema) = format.output_schema(shape) else {
            return Ok(RunFormat::Json);
        };
        let (output_id, output_schema) = self.register(topic, &schema)?;
        Ok(RunFormat::Registry {
            format,
            registry_url: self.url.clone(),
            output_id,
            output_schema,
        })
    }

    /// Registers `schema` under `topic`'s subject, asking again a few times while the registry
    /// fails: its id and the schema parsed.
    fn register(
        &mut self,
        topic: &str,
        schema: &Schema,
    ) -> anyhow::Result<(SchemaId, ParsedSchema)> {
        let subject = format!("{topic}-value");
        // Recorded first, so that a failure still deletes what may have been registered.
        self.subjects.push(subject.clone());
        let client = &self.client;
        self.runtime
            .block_on(async {
                let mut attempt = 1;
                loop {
                    let registered = async {
                        let id = client.register(&subject, schema).await?;
                        Ok::<_, SchemaError>((id, client.parsed_schema(id).await?))
                    };
                    match registered.await {
                        Err(error) if error.is_transient() && attempt < REGISTRY_ATTEMPTS => {
                            tracing::warn!(subject, %error, attempt, "the schema registry failed; asking again");
                            tokio::time::sleep(REGISTRY_RETRY_PAUSE).await;
                            attempt += 1;
                        }
                        result => return result,
                    }
                }
            })
            .with_context(|| {
                format!(
                    "registering a schema under subject {subject} in {}",
                    self.url
                )
            })
    }

    /// Deletes every subject registered (softly, then for good), warning of any that cannot be.
    /// Each request has a time limit: a registry that stops answering costs the clean-up that
    /// long, not the benchmark's end.
    pub(crate) fn delete_subjects(&mut self) {
        let subjects = std::mem::take(&mut self.subjects);
        if subjects.is_empty() {
            return;
        }
        let http = match reqwest::Client::builder()
            .timeout(REGISTRY_REQUEST_TIMEOUT)
            .build()
        {
            Ok(http) => http,
            Err(error) => {
                tracing::warn!(%error, ?subjects, "cannot delete the schema registry subjects");
                return;
            }
        };
        for subject in subjects {
            let base = format!("{}/subjects/{subject}", self.url);
            let deleted = self.runtime.block_on(async {
                for url in [base.clone(), format!("{base}?permanent=true")] {
                    let failed = |error: reqwest::Error| format!("{url}: {error}");
                    let response = http.delete(&url).send().await.map_err(failed)?;
                    let status = response.status();
                    // Read to its end, so that the connection can carry the next request.
                    response.bytes().await.map_err(failed)?;
                    if !status.is_success() && status != reqwest::StatusCode::NOT_FOUND {
                        return Err(format!("{url} answered {status}"));
                    }
                }
                Ok::<_, String>(())
            });
            if let Err(error) = deleted {
                tracing::warn!(subject, %error, "cannot delete the schema registry subject");
            }
        }
    }

    /// The subjects registered and not deleted (kept with `--keep-topics`).
    pub(super) fn subjects(&self) -> &[String] {
        &self.subjects
    }
}

/// The records of `spec`'s workload with each JSON value encoded with `schema` (id `id`) in the
/// registry's wire format: the same events, keys and headers as the JSON input of the same spec.
pub(super) fn encode_workload(
    spec: WorkloadSpec,
    schema: &ParsedSchema,
    id: SchemaId,
) -> anyhow::Result<Vec<GeneratedRecord>> {
    Workload::new(spec)?
        .map(|mut record| {
            let json: Value =
                serde_json::from_slice(&record.value).context("a generated record is not JSON")?;
            record.value = schema
                .encode_framed(id, &json)
                .with_context(|| format!("encoding {json} with schema id {id}"))?;
            Ok(record)
        })
        .collect()
}

/// What a round's outputs must be: `records` events, each once (exactly-once), or each at least
/// once (at-least-once).
#[derive(Debug, Clone, Copy)]
pub(super) struct ExpectedOutputs {
    pub records: i64,
    pub exactly_once: bool,
}

/// Reads a finished round's output and dead-letter topics (`read_committed`) and checks that
/// every input produced its output and nothing was dead-lettered.
pub(super) fn verify_outputs(
    settings: &KafkaSettings,
    label: &str,
    (output, dlq): (&str, &str),
    format: &RunFormat,
    expected: ExpectedOutputs,
    timeout: Duration,
) -> anyhow::Result<()> {
    let snapshots = read_topics(settings, &[output, dlq], timeout, &mut |_| {})
        .with_context(|| format!("{label}: reading its outputs back"))?;
    let [outputs, letters] = snapshots.as_slice() else {
        bail!("{label}: read {} topics, not 2", snapshots.len());
    };
    if let Some(first) = letters.records.first() {
        bail!(
            "{label} ({}): {} dead letters, the first {}: {}",
            format.format(),
            letters.records.len(),
            header(first, dead_letter::REASON_HEADER),
            header(first, dead_letter::DETAIL_HEADER)
        );
    }
    let mut event_ids = HashSet::with_capacity(outputs.records.len());
    for record in &outputs.records {
        let value = record.value.as_deref().unwrap_or_default();
        let event_id = format.output_event_id(value).map_err(|error| {
            anyhow::anyhow!(
                "{label} ({}): the output at partition {} offset {} does not read back: {error}",
                format.format(),
                record.partition,
                record.offset
            )
        })?;
        event_ids.insert(event_id);
    }
    let written = outputs.records.len() as i64;
    let distinct = event_ids.len() as i64;
    if distinct != expected.records || (expected.exactly_once && written != expected.records) {
        bail!(
            "{label} ({}): {written} outputs of {distinct} distinct events for {} input records",
            format.format(),
            expected.records
        );
    }
    Ok(())
}

/// The last value of header `name` as text, or "".
fn header(record: &SourceRecord, name: &str) -> String {
    record
        .headers
        .iter()
        .rev()
        .find(|(key, _)| key == name)
        .and_then(|(_, value)| value.as_deref())
        .map(|value| String::from_utf8_lossy(value).into_owned())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use eos_schema::{AvroSchema, ProtobufSchema};
    use serde_json::json;

    use super::*;

    /// A ledger output as the transform writes it.
    fn ledger_output() -> Value {
        json!({
            "event_id": "evt-7-0", "entity_id": "ent-3", "value": -1250, "version": 4,
            "occurred_at": "2026-12-01T10:00:00.001Z",
            "payload": {"kind": "refund", "pad": "Ab3"},
            "entity_total": 99, "entity_count": 4,
            "source": {"topic": "in", "partition": 2, "offset": 41}
        })
    }

    fn without_added_fields(mut value: Value) -> Value {
        if let Some(object) = value.as_object_mut() {
            for field in ["entity_total", "entity_count", "source"] {
                object.remove(field);
            }
        }
        value
    }

    fn parsed(schema: &Schema) -> ParsedSchema {
        match schema.schema_type {
            eos_schema::SchemaType::Avro => ParsedSchema::Avro(
                AvroSchema::parse(&schema.schema, "test")
                    .expect("the Avro schema parses")
                    .into(),
            ),
            _ => ParsedSchema::Protobuf(
                ProtobufSchema::parse(&schema.schema, "test")
                    .expect("the Protobuf schema parses")
                    .into(),
            ),
        }
    }

    /// The demo's ledger output: a payments-api event and what the transform adds.
    fn payment_output() -> Value {
        json!({
            "event_id": "pay-1f", "entity_id": "acct-3", "value": 1250, "version": 7,
            "occurred_at": "2026-12-01T10:00:00.001Z",
            "payload": {"payment_id": "pay-1f", "currency": "EUR"},
            "entity_total": 9900, "entity_count": 7,
            "source": {"topic": "in", "partition": 2, "offset": 41}
        })
    }

    #[test]
    fn the_schemas_round_trip_the_ledger_input_and_output() {
        for (shape, output) in [(&WORKLOAD, ledger_output()), (&PAYMENT, payment_output())] {
            round_trip(shape, &output);
        }
        assert!(RecordFormat::Json.input_schema(&WORKLOAD).is_none());
    }

    fn round_trip(shape: &SchemaShape, output: &Value) {
        let input = without_added_fields(output.clone());
        for format in [RecordFormat::Avro, RecordFormat::Protobuf] {
            for (schema, value) in [
                (format.input_schema(shape), &input),
                (format.output_schema(shape), output),
            ] {
                let schema = parsed(&schema.expect("a registry format has schemas"));
                let framed = schema
                    .encode_framed(SchemaId(7), value)
                    .expect("the value fits");
                let decoded = schema
                    .decode(wire::unframe(&framed).expect("framed").payload)
                    .expect("decodes");
                assert_eq!(&decoded, value, "{format} {}", shape.input_name);
            }
        }
    }

    #[test]
    fn encoded_workload_records_are_the_json_events() {
        let spec = WorkloadSpec {
            seed: 5,
            count: 20,
            entities: 3,
            duplicate_ratio: 0.0,
            bad_ratio: 0.0,
            conflict_ratio: 0.0,
            value_bytes: 300,
            occurred_at_base: time::OffsetDateTime::UNIX_EPOCH,
        };
        let json: Vec<GeneratedRecord> = Workload::new(spec.clone()).expect("valid").collect();
        for format in [RecordFormat::Avro, RecordFormat::Protobuf] {
            let schema = parsed(&format.input_schema(&WORKLOAD).expect("has a schema"));
            let encoded = encode_workload(spec.clone(), &schema, SchemaId(9)).expect("encodes");
            assert_eq!(encoded.len(), json.len());
            for (encoded, json) in encoded.iter().zip(&json) {
                assert_eq!((&encoded.key, &encoded.headers), (&json.key, &json.headers));
                let value = schema
                    .decode(wire::unframe(&encoded.value).expect("framed").payload)
                    .expect("decodes");
                let original: Value = serde_json::from_slice(&json.value).expect("JSON");
                assert_eq!(value, original, "{format}");
                assert!(
                    encoded.value.len() < json.value.len(),
                    "{format} is smaller"
                );
            }
        }
    }

    #[test]
    fn output_event_ids_are_read_in_each_format() {
        let output = ledger_output();
        let json = RunFormat::Json;
        let bytes = serde_json::to_vec(&output).expect("serialisable");
        assert_eq!(json.output_event_id(&bytes), Ok("evt-7-0".to_owned()));
        assert!(json.output_event_id(b"not json").is_err());

        let schema = parsed(
            &RecordFormat::Avro
                .output_schema(&WORKLOAD)
                .expect("has a schema"),
        );
        let avro = RunFormat::Registry {
            format: RecordFormat::Avro,
            registry_url: "http://registry".into(),
            output_id: SchemaId(3),
            output_schema: schema.clone(),
        };
        let framed = schema.encode_framed(SchemaId(3), &output).expect("fits");
        assert_eq!(avro.output_event_id(&framed), Ok("evt-7-0".to_owned()));
        let other_id = schema.encode_framed(SchemaId(4), &output).expect("fits");
        let refused = avro.output_event_id(&other_id).expect_err("another id");
        assert!(refused.contains("schema id 4"), "{refused}");
        assert_eq!(
            avro.processor_args(),
            [
                "--input-format",
                "avro",
                "--output-format",
                "avro",
                "--schema-registry-url",
                "http://registry"
            ]
        );
        assert!(json.processor_args().is_empty());
    }
}
