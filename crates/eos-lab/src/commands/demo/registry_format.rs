//! The demo in a schema registry's format (`--format avro|protobuf`, docs/schemas.md "The demo
//! in a registry format"): the payment's and the ledger entry's schemas registered under the
//! topics' subjects (TopicNameStrategy) before anything starts, and every service and the audit
//! told the format. The outbox rows stay JSON in PostgreSQL; outbox-relay writes them in the
//! format.

use anyhow::Context as _;
use clap::ValueEnum as _;
use eos_schema::{RegistryFlags, SchemaId, wire};
use eosctl::workload::GeneratedRecord;
use tokio::runtime::Handle;

use crate::bench::record_format::{PAYMENT, RecordFormat, SchemaRegistry};

/// A schema id no registry gives out soon: a record naming it is not decodable.
const UNKNOWN_SCHEMA_ID: SchemaId = SchemaId(i32::MAX.unsigned_abs());

/// The run's format, its registry and the subjects registered in it.
pub(super) struct RegistryFormat {
    format: RecordFormat,
    /// The flags the services and the audit are given, as the demo was.
    flags: RegistryFlags,
    registry: SchemaRegistry,
    /// The payment schema's id: the records that do not decode are framed with it too.
    input_id: SchemaId,
}

impl RegistryFormat {
    /// Registers the payment schema under `input`'s subject and the ledger entry's under
    /// `output`'s; `None` for JSON. Blocks the thread while the registry answers.
    pub(super) fn register(
        format: RecordFormat,
        flags: &RegistryFlags,
        [input, output]: [&str; 2],
    ) -> anyhow::Result<Option<Self>> {
        if format == RecordFormat::Json {
            return Ok(None);
        }
        let schema_format =
            eos_schema::RecordFormat::from_str(format.name(), false).map_err(anyhow::Error::msg)?;
        let config = flags
            .registry_config(&[("--format", schema_format)])
            .map_err(anyhow::Error::msg)?
            .context("a registry format has a registry")?;
        let mut registry = SchemaRegistry::new(config, Handle::current())?;
        let (input_id, _) = tokio::task::block_in_place(|| {
            let input = registry.register_input(format, &PAYMENT, input)?;
            registry.output_format(format, &PAYMENT, output)?;
            Ok::<_, anyhow::Error>(input)
        })?;
        Ok(Some(Self {
            format,
            flags: flags.clone(),
            registry,
            input_id,
        }))
    }

    pub(super) fn format(&self) -> RecordFormat {
        self.format
    }

    /// outbox-relay's flags: each row written with the topic's subject's latest schema.
    pub(super) fn relay_args(&self) -> Vec<String> {
        self.flags(&["--value-format"])
    }

    /// eos-processor's flags: the input read and the outputs written in the format.
    pub(super) fn processor_args(&self) -> Vec<String> {
        self.flags(&["--input-format", "--output-format"])
    }

    /// sink-writer's flags: the ledger read in the format.
    pub(super) fn sink_args(&self) -> Vec<String> {
        self.flags(&["--input-format"])
    }

    /// The audit's flags: both topics decoded as the processor decoded them before counting.
    pub(super) fn audit_args(&self) -> Vec<String> {
        self.flags(&["--input-format", "--output-format"])
    }

    /// `format_flags` set to the format, and the registry's flags as the demo was given them.
    fn flags(&self, format_flags: &[&str]) -> Vec<String> {
        let mut flags = Vec::new();
        for flag in format_flags {
            flags.extend([(*flag).to_owned(), self.format.name().to_owned()]);
        }
        if let Some(url) = &self.flags.schema_registry_url {
            flags.extend(["--schema-registry-url".to_owned(), url.clone()]);
        }
        if let Some(file) = &self.flags.schema_registry_auth_file {
            flags.extend([
                "--schema-registry-auth-file".to_owned(),
                file.display().to_string(),
            ]);
        }
        flags.extend([
            "--schema-registry-timeout".to_owned(),
            humantime::format_duration(self.flags.schema_registry_timeout).to_string(),
        ]);
        flags
    }

    /// `records` (the JSON workload's ambiguous records) made into three that do not decode, in
    /// the ways a registry topic meets them: a value that is not the wire format (the first, left
    /// as JSON), one naming a schema id the registry does not have, and one whose bytes the
    /// payment schema does not decode. Each must end as an `undecodable_record` dead letter.
    pub(super) fn undecodable_records(
        &self,
        mut records: Vec<GeneratedRecord>,
    ) -> Vec<GeneratedRecord> {
        let framed = |id: SchemaId, payload: &[u8]| {
            let mut value = Vec::new();
            wire::write_header(id, &mut value);
            value.extend(payload);
            value
        };
        if let Some(record) = records.get_mut(1) {
            record.value = framed(UNKNOWN_SCHEMA_ID, &record.value);
        }
        if let Some(record) = records.get_mut(2) {
            // A string field's length of -1: no schema of the format reads it.
            record.value = framed(self.input_id, &[0x01, 0xff, 0xff, 0xff]);
        }
        records
    }

    /// Deletes the subjects registered (the run's database dropped with them).
    pub(super) fn delete_subjects(&mut self) {
        tokio::task::block_in_place(|| self.registry.delete_subjects());
    }
}
