//! A replayed run whose topics are in a schema registry's format (docs/schemas.md, `eosctl audit
//! --replay --input-format`): each input record is decoded into the JSON event model as the
//! processor decoded it (eos-schema's `RecordDecoder`, the fingerprint of the decoded content),
//! and each output into JSON, before the replay and the comparison. An input record that does not
//! decode is what the processor dead-lettered as `undecodable_record` before any decision: the
//! replay expects that dead letter for it.
//!
//! The counting audit (`eosctl audit --input-format`) reads such a run the same way:
//! [`decode_topics`] gives each record its JSON event model and says how it was read
//! ([`Decoding`]).

use eos_core::DeadLetterReason;
use eos_schema::{RecordDecoder, RecordFormat, RegistryConfig};
use eos_transform::replay::{CommittedRecord, CommittedRecords, ReplayDeadLetter};

use crate::source_record::{Decoding, SourceRecord};

/// The run's formats, as the processor was told (`--input-format`, `--output-format`).
#[derive(Debug, Clone)]
pub struct RunFormats {
    pub input: RecordFormat,
    pub output: RecordFormat,
    /// Set when either is a registry format.
    pub registry: Option<RegistryConfig>,
}

impl RunFormats {
    /// Plain JSON on every topic.
    pub fn json() -> Self {
        Self {
            input: RecordFormat::Json,
            output: RecordFormat::Json,
            registry: None,
        }
    }
}

/// The input records that did not decode, by source position, with their dead letter.
pub type Undecodable = Vec<((i32, i64), ReplayDeadLetter)>;

/// `records` with every value in a registry format decoded to JSON. Call it on a thread that may
/// block, inside the Tokio runtime (the decoder waits for the registry there).
pub fn decode_run(
    mut records: CommittedRecords,
    input_topic: &str,
    formats: &RunFormats,
) -> anyhow::Result<(CommittedRecords, Undecodable)> {
    let mut undecodable = Vec::new();
    if formats.input != RecordFormat::Json {
        let mut decoder = RecordDecoder::new(formats.input, input_topic, formats.registry.clone())?;
        let mut decoded = Vec::with_capacity(records.inputs.len());
        for record in records.inputs {
            match decode(&mut decoder, record)? {
                Ok(record) => decoded.push(record),
                Err((position, _)) => undecodable.push((
                    position,
                    ReplayDeadLetter::reason(DeadLetterReason::UndecodableRecord),
                )),
            }
        }
        records.inputs = decoded;
    }
    if formats.output != RecordFormat::Json {
        for (_, outputs) in &mut records.outputs {
            let mut decoder =
                RecordDecoder::new(formats.output, input_topic, formats.registry.clone())?;
            for record in std::mem::take(outputs) {
                // An output that does not decode is kept as it is, and differs.
                outputs.push(decode(&mut decoder, record)?.unwrap_or_else(|(_, record)| record));
            }
        }
    }
    Ok((records, undecodable))
}

/// A record that does not decode, with its source position.
type NotDecoded = ((i32, i64), CommittedRecord);

/// One record decoded, or its position (and the record) when it does not decode; `Err` when
/// the registry cannot answer.
fn decode(
    decoder: &mut RecordDecoder,
    mut record: CommittedRecord,
) -> anyhow::Result<Result<CommittedRecord, NotDecoded>> {
    decoder
        .prepare(record.value.as_deref())
        .map_err(|error| anyhow::anyhow!("the schema registry cannot answer: {error}"))?;
    let decoded = match decoder.decode(record.value.as_deref()) {
        Ok(Some(decoded)) => (decoded.value.into_owned(), decoded.content),
        Ok(None) => return Ok(Ok(record)),
        Err(_) => return Ok(Err(((record.partition, record.offset), record))),
    };
    record.value = Some(decoded.0);
    record.content = decoded.1;
    Ok(Ok(record))
}

/// The counting audit's records with every value in a registry format decoded into the JSON
/// event model, each marked with how it was read: the input and its dead letters (which hold the
/// input's bytes) by the input's format, the output by the output's. Call it on a thread that may
/// block, inside the Tokio runtime; `Err` when the registry cannot answer.
pub fn decode_topics(
    [input, output, dead_letters]: [&mut [SourceRecord]; 3],
    input_topic: &str,
    output_topic: &str,
    formats: &RunFormats,
) -> anyhow::Result<()> {
    if formats.input != RecordFormat::Json {
        let mut decoder = RecordDecoder::new(formats.input, input_topic, formats.registry.clone())?;
        for record in input.iter_mut().chain(dead_letters.iter_mut()) {
            decode_source(&mut decoder, record)?;
        }
    }
    if formats.output != RecordFormat::Json {
        let mut decoder =
            RecordDecoder::new(formats.output, output_topic, formats.registry.clone())?;
        for record in output {
            decode_source(&mut decoder, record)?;
        }
    }
    Ok(())
}

/// `record`'s value decoded in place, or marked undecodable.
fn decode_source(decoder: &mut RecordDecoder, record: &mut SourceRecord) -> anyhow::Result<()> {
    decoder
        .prepare(record.value.as_deref())
        .map_err(|error| anyhow::anyhow!("the schema registry cannot answer: {error}"))?;
    let decoded = decoder
        .decode(record.value.as_deref())
        .map(|decoded| decoded.map(eos_schema::Decoded::into_owned));
    record.decoding = match decoded {
        Ok(Some(decoded)) => {
            record.value = Some(decoded.value.into_owned());
            Decoding::Decoded {
                content: decoded.content,
            }
        }
        // A record without a value stays one.
        Ok(None) => Decoding::AsRead,
        Err(_) => Decoding::Undecodable,
    };
    Ok(())
}
