//! The outputs' formats: plain JSON, or a schema registry's wire format (Avro, Protobuf or JSON
//! Schema; docs/schemas.md), each output its own (`--output-format`, `--output-schema`). An
//! output in a registry format is written with the latest schema of its subject (TopicNameStrategy's
//! `<topic>-value`, or the subject `--output-schema` names, e.g. a record's full name for
//! RecordNameStrategy), looked up once at start-up: the team registers its output schemas, and a
//! new version is taken at the next start. The registry is not on a record's path.
//!
//! Each output's value is checked against its schema by the decision
//! ([`eos_transform::partition_state::OutputFit`]) before the event's effects are kept: a value
//! that does not fit makes the event a dead letter (`output_schema_misfit`), never a
//! half-written one. [`OutputEncoder::encode`] then writes what was checked.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use eos_runtime::backoff::{BackoffBuilder as _, doubling};
use eos_schema::{
    ParsedSchema, RegistryClient, RegistryConfig, SchemaError, SchemaId, SchemaVersion,
};
use eos_transform::partition_state::OutputFit;
use serde_json::Value as Json;
use tokio_util::sync::CancellationToken;

use eos_schema::RecordFormat;

/// One output topic's schema.
#[derive(Debug)]
struct OutputSchema {
    subject: String,
    id: SchemaId,
    schema: ParsedSchema,
}

/// Writes each output's values in its registered format, or as JSON.
#[derive(Debug)]
pub(crate) struct OutputEncoder {
    /// Output name → its subject's schema; an output not here is written as JSON.
    schemas: HashMap<String, OutputSchema>,
}

impl OutputEncoder {
    /// Looks up the latest schema of the subject of each output in a registry format (`plan`:
    /// output → its format and subject). Waits (with backoff, warning) while the registry cannot
    /// answer; `Ok(None)` when `shutdown` comes meanwhile. A subject without a schema, or with
    /// one of another format, stops the start naming it.
    pub(crate) async fn load(
        plan: &BTreeMap<String, (RecordFormat, String)>,
        registry: RegistryConfig,
        shutdown: &CancellationToken,
    ) -> Result<Option<Self>, String> {
        let client = RegistryClient::new(registry).map_err(|error| error.to_string())?;
        let mut schemas = HashMap::new();
        for (output, (format, subject)) in plan {
            if *format == RecordFormat::Json {
                continue;
            }
            let Some((id, schema)) =
                subject_schema(&client, (subject, SchemaVersion::Latest), shutdown).await?
            else {
                return Ok(None);
            };
            if !format.fits(&schema) {
                return Err(format!(
                    "output {output:?}: subject {subject}'s latest schema, id {id}, is {}, and \
                     the output's format is {}",
                    eos_schema::record_decoder::schema_name(&schema),
                    format.name()
                ));
            }
            tracing::info!(output, subject, schema_id = %id, "output schema");
            schemas.insert(
                output.clone(),
                OutputSchema {
                    subject: subject.clone(),
                    id,
                    schema,
                },
            );
        }
        Ok(Some(Self { schemas }))
    }

    /// `value` in `output`'s wire format, or as JSON for an output in plain JSON; `Err` naming
    /// the subject, the id and where it does not fit.
    pub(crate) fn encode(&self, output: &str, value: &Json) -> Result<Vec<u8>, String> {
        let Some(schema) = self.schemas.get(output) else {
            return Ok(eos_core::json_text::to_vec(value));
        };
        schema
            .schema
            .encode_framed(schema.id, value)
            .map_err(|error| {
                format!(
                    "does not fit subject {}, schema id {}: {error}",
                    schema.subject, schema.id
                )
            })
    }
}

impl OutputFit for OutputEncoder {
    fn check(&self, output: &str, value: &Json) -> Result<(), String> {
        self.encode(output, value).map(drop)
    }
}

/// `subject`'s latest schema or one version of it, asked again with backoff while the registry
/// cannot answer; `Ok(None)` when `shutdown` comes meanwhile.
pub(crate) async fn subject_schema(
    client: &RegistryClient,
    (subject, version): (&str, SchemaVersion),
    shutdown: &CancellationToken,
) -> Result<Option<(SchemaId, ParsedSchema)>, String> {
    let mut delays = doubling(Duration::from_millis(200), Duration::from_secs(10))
        .with_jitter()
        .build();
    loop {
        let registered = match version {
            SchemaVersion::Latest => client.latest(subject).await,
            SchemaVersion::Pinned(version) => client.version(subject, version).await,
        };
        let answer = match registered {
            Ok(latest) => client
                .parsed_schema(latest.id)
                .await
                .map(|schema| (latest.id, schema)),
            Err(error) => Err(error),
        };
        match answer {
            Ok(found) => return Ok(Some(found)),
            Err(error) if error.is_transient() => {
                let delay = delays.next().unwrap_or(Duration::from_secs(10));
                tracing::warn!(%error, subject, ?delay, "the schema registry cannot answer for a schema needed at start-up; asking again");
                tokio::select! {
                    () = shutdown.cancelled() => return Ok(None),
                    () = tokio::time::sleep(delay) => {}
                }
            }
            Err(SchemaError::UnknownSubject { .. }) => {
                let missing = match version {
                    SchemaVersion::Latest => "schema".to_owned(),
                    SchemaVersion::Pinned(version) => format!("version {version}"),
                };
                return Err(format!(
                    "subject {subject} has no {missing} in the registry: register it before \
                     starting (docs/schemas.md)"
                ));
            }
            Err(error) => return Err(format!("subject {subject}: {error}")),
        }
    }
}
