//! The processor's format flags: the input topic's format and the outputs', and the schema
//! registry a registry format reads through (docs/schemas.md). Decoding is eos-schema's
//! [`eos_schema::RecordDecoder`], which the sink reads its topic with too.

use eos_schema::{RecordFormat, RegistryConfig, RegistryFlags};

/// The input's and the outputs' formats and, for a registry format, where the registry is.
#[derive(Debug, Clone, clap::Args)]
pub struct InputFormatFlags {
    /// The input topic's record format: json (a JSON object per record), or avro, protobuf or
    /// json-schema in a schema registry's wire format (magic byte 0, the schema id, the
    /// payload), decoded with the schema the id names. A transform sees the same JSON event
    /// whatever the format (docs/schemas.md).
    #[arg(long, env = "EOS_INPUT_FORMAT", value_enum, default_value_t = RecordFormat::Json)]
    pub input_format: RecordFormat,

    /// The output topics' record format: json, or avro, protobuf or json-schema in the
    /// registry's wire format, each written with the latest schema of its topic's subject
    /// (TOPIC-value, looked up at start-up; register it first). An output value that does not
    /// fit its schema makes the event a dead letter, output_schema_misfit. The dead letters and
    /// the changelog stay JSON.
    #[arg(long, env = "EOS_OUTPUT_FORMAT", value_enum, default_value_t = RecordFormat::Json)]
    pub output_format: RecordFormat,

    /// The schema registry a registry format reads and writes through.
    #[command(flatten)]
    pub registry: RegistryFlags,
}

impl InputFormatFlags {
    /// The input's format as the boundary line shows it: `json`, or `avro via URL`.
    pub fn describe(&self) -> String {
        self.registry.describe(self.input_format)
    }

    /// The outputs' format, as [`Self::describe`] shows the input's.
    pub fn describe_output(&self) -> String {
        self.registry.describe(self.output_format)
    }

    /// The registry's settings when the input or the outputs are in a registry format, `None`
    /// for plain JSON; an error naming the flag when they do not fit together.
    pub fn registry_config(&self) -> Result<Option<RegistryConfig>, String> {
        self.registry.registry_config(&[
            ("--input-format", self.input_format),
            ("--output-format", self.output_format),
        ])
    }
}
