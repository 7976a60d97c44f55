//! The processor's format flags: the input topic's format and the outputs', and the schema
//! registry a registry format reads through (docs/schemas.md). Decoding is eos-schema's
//! [`eos_schema::RecordDecoder`], which the sink reads its topic with too.

use std::collections::BTreeMap;

use eos_schema::{RecordFormat, RegistryConfig, RegistryFlags, SchemaVersion, TopicSubject};

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

    /// One output's own format and, optionally, subject, as NAME=FORMAT or NAME=FORMAT@SUBJECT
    /// (repeat the flag, or separate them with commas in the environment variable): outputs
    /// not named take --output-format and TOPIC-value. A subject of the record's full name
    /// (flagged=avro@com.example.cards.Flagged) is Confluent's RecordNameStrategy; the output
    /// named default is --output-topic's.
    #[arg(long = "output-schema", env = "EOS_OUTPUT_SCHEMAS", value_name = "NAME=FORMAT[@SUBJECT]", value_delimiter = ',', value_parser = parse_output_schema)]
    pub output_schemas: Vec<OutputSchemaFlag>,

    /// Avro input only: read every record as this schema, SUBJECT or SUBJECT@VERSION (the
    /// latest at start-up, or that version), resolved from the schema that wrote it by Avro's
    /// rules, so the transform sees the same fields whatever compatible schema a producer moved
    /// to (docs/schemas.md "A reader's schema"). A writer's schema that does not resolve to it
    /// makes its records dead letters naming both. Without it, each record is read as its
    /// writer's schema.
    #[arg(long, env = "EOS_INPUT_READER_SCHEMA", value_name = "SUBJECT[@VERSION]", value_parser = parse_reader_schema)]
    pub input_reader_schema: Option<(String, SchemaVersion)>,

    /// The schema registry a registry format reads and writes through.
    #[command(flatten)]
    pub registry: RegistryFlags,
}

/// `SUBJECT` or `SUBJECT@VERSION`.
fn parse_reader_schema(text: &str) -> Result<(String, SchemaVersion), String> {
    let named = TopicSubject::parse(&format!("input={text}"))
        .map_err(|_| format!("{text:?} is not SUBJECT or SUBJECT@VERSION"))?;
    Ok((named.subject, named.version))
}

/// `--output-schema NAME=FORMAT[@SUBJECT]`: one output's format, and its subject when not
/// TopicNameStrategy's `TOPIC-value`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputSchemaFlag {
    /// The output's name (`default` for `--output-topic`'s).
    pub output: String,
    /// The format its values are written in.
    pub format: RecordFormat,
    /// The subject whose latest schema writes them; `None` for `TOPIC-value`.
    pub subject: Option<String>,
}

fn parse_output_schema(text: &str) -> Result<OutputSchemaFlag, String> {
    use clap::ValueEnum as _;
    let refused = || format!("{text:?} is not NAME=FORMAT or NAME=FORMAT@SUBJECT");
    let (output, rest) = text.split_once('=').ok_or_else(refused)?;
    let (format, subject) = match rest.split_once('@') {
        Some((format, subject)) if !subject.is_empty() => (format, Some(subject.to_owned())),
        Some(_) => return Err(refused()),
        None => (rest, None),
    };
    if output.is_empty() {
        return Err(refused());
    }
    let format = RecordFormat::from_str(format, false)
        .map_err(|_| format!("{text:?}: {format:?} is not json, avro, protobuf or json-schema"))?;
    Ok(OutputSchemaFlag {
        output: output.to_owned(),
        format,
        subject,
    })
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
        if self.input_reader_schema.is_some() && self.input_format != RecordFormat::Avro {
            return Err(format!(
                "--input-reader-schema is for --input-format avro, not {}",
                self.input_format.name()
            ));
        }
        let mut formats = vec![
            ("--input-format", self.input_format),
            ("--output-format", self.output_format),
        ];
        formats.extend(
            self.output_schemas
                .iter()
                .map(|schema| ("--output-schema", schema.format)),
        );
        self.registry.registry_config(&formats)
    }

    /// Each output's format and subject (TopicNameStrategy's `TOPIC-value` unless
    /// `--output-schema` names another), for `outputs` (name → topic). `Err` names an
    /// `--output-schema` of an output that is not there.
    pub fn output_plan(
        &self,
        outputs: &BTreeMap<String, String>,
    ) -> Result<BTreeMap<String, (RecordFormat, String)>, String> {
        if let Some(unknown) = self
            .output_schemas
            .iter()
            .find(|schema| !outputs.contains_key(&schema.output))
        {
            return Err(format!(
                "--output-schema names output {:?}, which is not one of the outputs ({})",
                unknown.output,
                outputs.keys().cloned().collect::<Vec<_>>().join(", ")
            ));
        }
        Ok(outputs
            .iter()
            .map(|(output, topic)| {
                let own = self
                    .output_schemas
                    .iter()
                    .rev()
                    .find(|schema| &schema.output == output);
                let format = own.map_or(self.output_format, |schema| schema.format);
                let subject = own
                    .and_then(|schema| schema.subject.clone())
                    .unwrap_or_else(|| format!("{topic}-value"));
                (output.clone(), (format, subject))
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory as _, FromArgMatches as _, Parser};

    use super::*;

    #[derive(Debug, Parser)]
    struct Flags {
        #[command(flatten)]
        formats: InputFormatFlags,
    }

    /// Parsed as the binary does, without the environment (`make test` exports the registry).
    fn flags(args: &[&str]) -> Result<InputFormatFlags, String> {
        let matches = Flags::command()
            .mut_args(|arg| arg.env(None))
            .try_get_matches_from(std::iter::once("test").chain(args.iter().copied()))
            .map_err(|error| error.to_string())?;
        Ok(Flags::from_arg_matches(&matches)
            .map_err(|error| error.to_string())?
            .formats)
    }

    #[test]
    fn each_output_takes_its_own_format_and_subject_or_the_defaults() {
        let outputs: BTreeMap<String, String> = [
            ("default".to_owned(), "approved".to_owned()),
            ("flagged".to_owned(), "flagged".to_owned()),
            ("audit".to_owned(), "audit-log".to_owned()),
        ]
        .into();
        let parsed = flags(&[
            "--output-format",
            "avro",
            "--output-schema",
            "flagged=protobuf@com.example.cards.Flagged",
            "--output-schema",
            "audit=json",
        ])
        .expect("parses");
        let plan = parsed.output_plan(&outputs).expect("known outputs");
        assert_eq!(
            plan,
            [
                (
                    "audit".to_owned(),
                    (RecordFormat::Json, "audit-log-value".to_owned())
                ),
                (
                    "default".to_owned(),
                    (RecordFormat::Avro, "approved-value".to_owned())
                ),
                (
                    "flagged".to_owned(),
                    (
                        RecordFormat::Protobuf,
                        "com.example.cards.Flagged".to_owned()
                    )
                ),
            ]
            .into()
        );
        assert_eq!(
            parsed.registry_config().expect_err("needs a registry"),
            "--output-format avro needs --schema-registry-url"
        );
        let only_one = flags(&["--output-schema", "flagged=avro"]).expect("parses");
        assert_eq!(
            only_one.registry_config().expect_err("needs a registry"),
            "--output-schema avro needs --schema-registry-url",
            "one output in a registry format needs the registry"
        );
        let unknown = flags(&["--output-schema", "typo=avro"])
            .expect("parses")
            .output_plan(&outputs)
            .expect_err("refused");
        assert!(
            unknown.contains("\"typo\"") && unknown.contains("audit, default, flagged"),
            "{unknown}"
        );
        for bad in ["flagged", "=avro", "flagged=xml", "flagged=avro@"] {
            assert!(
                flags(&["--output-schema", bad]).is_err(),
                "{bad:?} is refused"
            );
        }
    }
}
