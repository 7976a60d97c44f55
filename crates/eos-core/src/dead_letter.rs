//! Machine-readable reasons for quarantining a record, the headers that carry them, and the
//! building of a dead letter that always fits the dead-letter topic.
//!
//! Every service that dead-letters a record writes the original bytes plus these headers, so the
//! audit can account for each input exactly once by its source position. An input can be larger
//! than what the service's producer may write (a topic can accept records up to its own
//! `max.message.bytes`, above the producer's `message.max.bytes`): then the dead letter holds a
//! prefix of the original and says so — its original size and SHA-256 — and trims the original
//! headers, so a dead letter can never be refused by Kafka and stall the pipeline behind it
//! (docs/architecture/bad-input.md "Bad input").

use std::borrow::Cow;
use std::fmt::{self, Write as _};
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Header naming the [`DeadLetterReason`] of a dead-lettered record.
pub const REASON_HEADER: &str = "eos-dlq-reason";
/// Header with a transform's own reason code, on a `transform_refused` dead letter.
pub const TRANSFORM_REASON_HEADER: &str = "eos-dlq-transform-reason";
/// Header with a human-readable detail (which field, what was wrong).
pub const DETAIL_HEADER: &str = "eos-dlq-detail";
/// Headers with the position the dead-lettered record was read from.
pub const SOURCE_TOPIC_HEADER: &str = "eos-source-topic";
pub const SOURCE_PARTITION_HEADER: &str = "eos-source-partition";
pub const SOURCE_OFFSET_HEADER: &str = "eos-source-offset";
/// `true` on a dead letter whose value is a prefix of the original, `false` on a whole copy.
/// Always written after the original headers, so the last one is the dead-lettering service's
/// (an input could carry a header of the same name).
pub const TRUNCATED_HEADER: &str = "eos-dlq-truncated";
/// On a truncated dead letter: the original value's size in bytes.
pub const ORIGINAL_SIZE_HEADER: &str = "eos-original-size";
/// On a truncated dead letter: the SHA-256 of the original value, in lowercase hex.
pub const ORIGINAL_SHA256_HEADER: &str = "eos-original-sha256";
/// On a truncated dead letter: how many of the original headers were left out.
pub const HEADERS_DROPPED_HEADER: &str = "eos-dlq-headers-dropped";
/// On a truncated dead letter whose key had to be cut too: the original key's size in bytes.
pub const ORIGINAL_KEY_SIZE_HEADER: &str = "eos-original-key-size";

/// librdkafka's default producer `message.max.bytes`, for a client configuration without one.
pub const DEFAULT_PRODUCER_MESSAGE_MAX_BYTES: usize = 1_000_000;
/// Longest detail header (and `sink_dead_letters.detail`) kept, in bytes.
pub const MAX_DETAIL_BYTES: usize = 1024;
/// Room kept under the message limit for the record batch and record framing (a v2 record batch
/// header is 61 bytes, a record's own framing at most ~30) and the per-header varints.
const FRAMING_BYTES: usize = 512;
const PER_HEADER_FRAMING_BYTES: usize = 12;
/// A truncated dead letter keeps at most this much of the original key.
const MAX_TRUNCATED_KEY_BYTES: usize = 4096;
/// A truncated dead letter keeps original headers up to this many bytes (or a quarter of the
/// limit, when that is less); the rest of the room goes to the value's prefix.
const MAX_TRUNCATED_HEADER_BYTES: usize = 64 * 1024;

/// Why a record went to a dead-letter destination instead of producing an effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeadLetterReason {
    /// The record value is not valid UTF-8.
    InvalidUtf8,
    /// The record value is not JSON, or not a JSON object.
    MalformedJson,
    /// A required envelope field is absent.
    MissingField,
    /// An envelope field has the wrong type or an invalid value.
    InvalidField,
    /// An identifier is longer than the envelope allows.
    FieldTooLong,
    /// The whole record is larger than the configured limit.
    OversizedRecord,
    /// The record has no value at all (a tombstone on an event topic).
    EmptyRecord,
    /// An `event_id` already seen with a different fingerprint: a broken producer contract.
    EventIdConflict,
    /// The event is older than the dedup horizon, so a duplicate could no longer be recognised.
    BeyondDedupHorizon,
    /// An external provider refused the effect for good (a non-retryable 4xx, e.g. a declined
    /// charge): nothing was applied, and asking again would be refused again.
    ProviderRejected,
    /// A JSON object has the same key twice: which value was meant is ambiguous.
    DuplicateKey,
    /// An integer does not fit 64 bits (signed or unsigned): it would be rounded.
    IntegerOutOfRange,
    /// A decimal number that a 64-bit float cannot hold exactly (e.g. more than 17 significant
    /// digits): two different numbers would get the same fingerprint.
    InexactNumber,
    /// Applying the event would overflow a running total: refused rather than saturated.
    TotalOverflow,
    /// A user's transform refused the event; its own reason code is in the
    /// `eos-dlq-transform-reason` header.
    TransformRefused,
    /// A user's transform panicked on the event: the event is set aside, the loop goes on.
    TransformPanic,
    /// A WebAssembly transform trapped on the event (a panic in the module's language,
    /// `unreachable`, an exit) or answered something that is not the interface's result.
    TransformTrap,
    /// A WebAssembly transform's call ran out of fuel or its instance out of memory.
    TransformLimit,
    /// The record is not in its topic's schema-registry format: not the wire format, a schema
    /// id the registry does not know or of another format, or a payload that does not decode
    /// with its schema. The detail names the id and the subject.
    UndecodableRecord,
    /// An output's value does not fit the schema of its topic's subject (an output in a
    /// schema-registry format): nothing of the event is written, its state stays as it was. The
    /// detail names the output, the subject, the schema id and where the value does not fit.
    OutputSchemaMisfit,
}

impl DeadLetterReason {
    pub const ALL: [DeadLetterReason; 20] = [
        Self::InvalidUtf8,
        Self::MalformedJson,
        Self::MissingField,
        Self::InvalidField,
        Self::FieldTooLong,
        Self::OversizedRecord,
        Self::EmptyRecord,
        Self::EventIdConflict,
        Self::BeyondDedupHorizon,
        Self::ProviderRejected,
        Self::DuplicateKey,
        Self::IntegerOutOfRange,
        Self::InexactNumber,
        Self::TotalOverflow,
        Self::TransformRefused,
        Self::TransformPanic,
        Self::TransformTrap,
        Self::TransformLimit,
        Self::UndecodableRecord,
        Self::OutputSchemaMisfit,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::InvalidUtf8 => "invalid_utf8",
            Self::MalformedJson => "malformed_json",
            Self::MissingField => "missing_field",
            Self::InvalidField => "invalid_field",
            Self::FieldTooLong => "field_too_long",
            Self::OversizedRecord => "oversized_record",
            Self::EmptyRecord => "empty_record",
            Self::EventIdConflict => "event_id_conflict",
            Self::BeyondDedupHorizon => "beyond_dedup_horizon",
            Self::ProviderRejected => "provider_rejected",
            Self::DuplicateKey => "duplicate_key",
            Self::IntegerOutOfRange => "integer_out_of_range",
            Self::InexactNumber => "inexact_number",
            Self::TotalOverflow => "total_overflow",
            Self::TransformRefused => "transform_refused",
            Self::TransformPanic => "transform_panic",
            Self::TransformTrap => "transform_trap",
            Self::TransformLimit => "transform_limit",
            Self::UndecodableRecord => "undecodable_record",
            Self::OutputSchemaMisfit => "output_schema_misfit",
        }
    }

    /// Whether the record itself is malformed, as opposed to well-formed but refused.
    pub fn is_malformed(self) -> bool {
        !matches!(
            self,
            Self::EventIdConflict
                | Self::BeyondDedupHorizon
                | Self::ProviderRejected
                | Self::TotalOverflow
                | Self::TransformRefused
                | Self::TransformPanic
                | Self::TransformTrap
                | Self::TransformLimit
        )
    }
}

impl fmt::Display for DeadLetterReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, thiserror::Error)]
#[error("unknown dead-letter reason {0:?}")]
pub struct UnknownReason(String);

impl FromStr for DeadLetterReason {
    type Err = UnknownReason;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|reason| reason.as_str() == s)
            .ok_or_else(|| UnknownReason(s.to_owned()))
    }
}

/// `text` cut to at most `max_bytes` at a char boundary, with a marker of the original length
/// when cut (the marker counts towards `max_bytes`).
pub fn truncate_with_marker(text: &str, max_bytes: usize) -> Cow<'_, str> {
    if text.len() <= max_bytes {
        return Cow::Borrowed(text);
    }
    let marker = format!("… [truncated, {} bytes in all]", text.len());
    let mut end = max_bytes.saturating_sub(marker.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let mut cut = String::with_capacity(end + marker.len());
    cut.push_str(&text[..end]);
    cut.push_str(&marker);
    Cow::Owned(cut)
}

/// The record being dead-lettered and why.
#[derive(Debug, Clone)]
pub struct DeadLetterInput<'a> {
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
    /// The original headers, in order.
    pub headers: Vec<(&'a str, Option<&'a [u8]>)>,
    pub source_topic: &'a str,
    pub source_partition: i32,
    pub source_offset: i64,
    pub reason: DeadLetterReason,
    /// A transform's own reason code, for a `transform_refused` letter.
    pub transform_reason: Option<&'a str>,
    pub detail: &'a str,
}

/// A dead letter ready to produce: it fits the limit it was built for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub headers: Vec<(String, Option<Vec<u8>>)>,
    /// Whether the value is a prefix of the original (see [`TRUNCATED_HEADER`]).
    pub truncated: bool,
}

impl DeadLetter {
    /// The size Kafka counts against `message.max.bytes`, with framing overestimated.
    pub fn wire_size(&self) -> usize {
        FRAMING_BYTES
            + self.key.as_ref().map_or(0, Vec::len)
            + self.value.as_ref().map_or(0, Vec::len)
            + self
                .headers
                .iter()
                .map(|(k, v)| header_size(k, v.as_deref()))
                .sum::<usize>()
    }

    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .and_then(|(_, v)| v.as_deref())
    }
}

fn header_size(key: &str, value: Option<&[u8]>) -> usize {
    PER_HEADER_FRAMING_BYTES + key.len() + value.map_or(0, <[u8]>::len)
}

/// The producer's effective message limit: its configured `message.max.bytes` (librdkafka's
/// default when unset or unreadable), lowered to the dead-letter topic's `max.message.bytes`
/// when that is known and smaller.
pub fn message_limit(producer_message_max_bytes: Option<&str>, topic_max: Option<usize>) -> usize {
    let producer = producer_message_max_bytes
        .and_then(|v| v.trim().parse::<usize>().ok())
        .unwrap_or(DEFAULT_PRODUCER_MESSAGE_MAX_BYTES);
    topic_max.map_or(producer, |topic| producer.min(topic))
}

/// SHA-256 in lowercase hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    let mut hex = String::with_capacity(64);
    for byte in Sha256::digest(bytes) {
        let _ = write!(hex, "{byte:02x}");
    }
    hex
}

/// Builds the dead letter of `input` so that its [`DeadLetter::wire_size`] is at most
/// `max_message_bytes`: the original key, value and headers when they fit, otherwise a prefix of
/// the value with its original size and SHA-256, the original headers that fit in a bounded
/// share, and the key cut to a bounded size. The reason, detail (cut to [`MAX_DETAIL_BYTES`]) and
/// source-position headers are always there.
pub fn build(input: &DeadLetterInput<'_>, max_message_bytes: usize) -> DeadLetter {
    let detail = truncate_with_marker(input.detail, MAX_DETAIL_BYTES);
    let partition = input.source_partition.to_string();
    let offset = input.source_offset.to_string();
    let mut position: Vec<(&str, &str)> = vec![(REASON_HEADER, input.reason.as_str())];
    if let Some(code) = input.transform_reason {
        position.push((TRANSFORM_REASON_HEADER, code));
    }
    position.extend([
        (DETAIL_HEADER, &*detail),
        (SOURCE_TOPIC_HEADER, input.source_topic),
        (SOURCE_PARTITION_HEADER, &partition),
        (SOURCE_OFFSET_HEADER, &offset),
    ]);
    let owned = |headers: &[(&str, Option<&[u8]>)]| -> Vec<(String, Option<Vec<u8>>)> {
        headers
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.map(<[u8]>::to_vec)))
            .collect()
    };
    let position_headers: Vec<(&str, Option<&[u8]>)> = position
        .iter()
        .map(|(k, v)| (*k, Some(v.as_bytes())))
        .collect();

    let whole = DeadLetter {
        key: input.key.map(<[u8]>::to_vec),
        value: input.value.map(<[u8]>::to_vec),
        headers: owned(&input.headers)
            .into_iter()
            .chain(owned(&position_headers))
            .chain(owned(&[(TRUNCATED_HEADER, Some(b"false".as_slice()))]))
            .collect(),
        truncated: false,
    };
    if whole.wire_size() <= max_message_bytes {
        return whole;
    }

    let original = input.value.unwrap_or_default();
    let original_key = input.key.unwrap_or_default();
    let key_cut = original_key.len() > MAX_TRUNCATED_KEY_BYTES;
    let key = input
        .key
        .map(|k| k[..k.len().min(MAX_TRUNCATED_KEY_BYTES)].to_vec());

    // The headers every truncated letter carries, sized with their longest values.
    let mut fixed: usize = FRAMING_BYTES
        + key.as_ref().map_or(0, Vec::len)
        + position_headers
            .iter()
            .map(|(k, v)| header_size(k, *v))
            .sum::<usize>()
        + header_size(TRUNCATED_HEADER, Some(b"true"))
        + header_size(ORIGINAL_SIZE_HEADER, Some(&[0; 20]))
        + header_size(ORIGINAL_SHA256_HEADER, Some(&[0; 64]))
        + header_size(HEADERS_DROPPED_HEADER, Some(&[0; 20]));
    if key_cut {
        fixed += header_size(ORIGINAL_KEY_SIZE_HEADER, Some(&[0; 20]));
    }
    let room = max_message_bytes.saturating_sub(fixed);

    // Original headers in order while they fit their share; the rest are counted as dropped.
    let header_share = MAX_TRUNCATED_HEADER_BYTES.min(room / 4);
    let mut kept = Vec::new();
    let mut kept_bytes = 0;
    for &(k, v) in &input.headers {
        let size = header_size(k, v);
        if kept_bytes + size <= header_share {
            kept_bytes += size;
            kept.push((k, v));
        }
    }
    let dropped = input.headers.len() - kept.len();
    let prefix = &original[..original.len().min(room - kept_bytes)];

    let size = original.len().to_string();
    let sha = sha256_hex(original);
    let dropped = dropped.to_string();
    let key_size = original_key.len().to_string();
    let mut headers = owned(&kept);
    headers.extend(owned(&position_headers));
    let mut info: Vec<(&str, Option<&[u8]>)> = vec![
        (TRUNCATED_HEADER, Some(b"true")),
        (ORIGINAL_SIZE_HEADER, Some(size.as_bytes())),
        (ORIGINAL_SHA256_HEADER, Some(sha.as_bytes())),
        (HEADERS_DROPPED_HEADER, Some(dropped.as_bytes())),
    ];
    if key_cut {
        info.push((ORIGINAL_KEY_SIZE_HEADER, Some(key_size.as_bytes())));
    }
    headers.extend(owned(&info));
    DeadLetter {
        key,
        value: Some(prefix.to_vec()),
        headers,
        truncated: true,
    }
}

/// Whether a dead letter's value stands for `original`: the same bytes, or — on a letter marked
/// truncated — a prefix of it whose size and SHA-256 headers match `original`. `header` looks up
/// one of the letter's headers by name.
pub fn stands_for<'h>(
    letter_value: &[u8],
    header: impl Fn(&str) -> Option<&'h [u8]>,
    original: &[u8],
) -> bool {
    if header(TRUNCATED_HEADER) != Some(b"true".as_slice()) {
        return letter_value == original;
    }
    let size_matches = header(ORIGINAL_SIZE_HEADER)
        .and_then(|v| std::str::from_utf8(v).ok())
        .and_then(|v| v.parse::<usize>().ok())
        == Some(original.len());
    let sha_matches = header(ORIGINAL_SHA256_HEADER) == Some(sha256_hex(original).as_bytes());
    size_matches && sha_matches && original.starts_with(letter_value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const LIMIT: usize = 1_000_000;

    fn input<'a>(
        key: &'a [u8],
        value: &'a [u8],
        headers: Vec<(&'a str, Option<&'a [u8]>)>,
    ) -> DeadLetterInput<'a> {
        DeadLetterInput {
            key: Some(key),
            value: Some(value),
            headers,
            source_topic: "payments",
            source_partition: 2,
            source_offset: 41,
            reason: DeadLetterReason::OversizedRecord,
            transform_reason: None,
            detail: "record is too big",
        }
    }

    #[test]
    fn a_letter_that_fits_is_the_original_plus_the_position() {
        let letter = build(
            &input(b"17", b"{bad", vec![("traceparent", Some(b"00-x"))]),
            LIMIT,
        );
        assert!(!letter.truncated);
        assert_eq!(letter.value.as_deref(), Some(b"{bad".as_slice()));
        assert_eq!(letter.key.as_deref(), Some(b"17".as_slice()));
        assert_eq!(letter.header("traceparent"), Some(b"00-x".as_slice()));
        assert_eq!(letter.header(SOURCE_OFFSET_HEADER), Some(b"41".as_slice()));
        assert_eq!(
            letter.header(REASON_HEADER),
            Some(b"oversized_record".as_slice())
        );
        assert_eq!(letter.header(TRUNCATED_HEADER), Some(b"false".as_slice()));
        assert_eq!(letter.header(TRANSFORM_REASON_HEADER), None);
        assert!(stands_for(b"{bad", |h| letter.header(h), b"{bad"));
        assert!(!stands_for(b"{ba", |h| letter.header(h), b"{bad"));
        // A transform's refusal carries its own reason code next to the suite's.
        let refused = build(
            &DeadLetterInput {
                reason: DeadLetterReason::TransformRefused,
                transform_reason: Some("over_limit"),
                ..input(b"17", b"{}", Vec::new())
            },
            LIMIT,
        );
        assert_eq!(
            refused.header(REASON_HEADER),
            Some(b"transform_refused".as_slice())
        );
        assert_eq!(
            refused.header(TRANSFORM_REASON_HEADER),
            Some(b"over_limit".as_slice())
        );
        // An input's own header of that name does not make a whole copy pass for a cut one.
        let sha = sha256_hex(b"{bad");
        let forged = vec![
            (TRUNCATED_HEADER, Some(b"true".as_slice())),
            (ORIGINAL_SIZE_HEADER, Some(b"4".as_slice())),
            (ORIGINAL_SHA256_HEADER, Some(sha.as_bytes())),
        ];
        let letter = build(&input(b"17", b"{bad", forged), LIMIT);
        assert_eq!(letter.header(TRUNCATED_HEADER), Some(b"false".as_slice()));
        assert!(!stands_for(b"{ba", |h| letter.header(h), b"{bad"));
    }

    #[test]
    fn a_letter_too_big_is_cut_with_its_coordinates() {
        let value = vec![b'x'; 4 * 1024 * 1024];
        let big_header = vec![b'h'; 300 * 1024];
        let headers = vec![
            ("traceparent", Some(b"00-abc".as_slice())),
            ("huge", Some(big_header.as_slice())),
            ("after", None),
        ];
        let long_key = vec![b'k'; 10_000];
        let letter = build(&input(&long_key, &value, headers), LIMIT);
        assert!(letter.truncated);
        assert!(letter.wire_size() <= LIMIT, "{}", letter.wire_size());
        assert!(letter.value.as_ref().is_some_and(|v| v.len() > LIMIT / 2));
        assert_eq!(letter.header(TRUNCATED_HEADER), Some(b"true".as_slice()));
        assert_eq!(
            letter.header(ORIGINAL_SIZE_HEADER),
            Some(value.len().to_string().as_bytes())
        );
        assert_eq!(
            letter.header(ORIGINAL_SHA256_HEADER),
            Some(sha256_hex(&value).as_bytes())
        );
        assert_eq!(letter.header(HEADERS_DROPPED_HEADER), Some(b"1".as_slice()));
        assert_eq!(letter.header("traceparent"), Some(b"00-abc".as_slice()));
        assert!(
            letter
                .headers
                .iter()
                .any(|(k, v)| k == "after" && v.is_none())
        );
        assert_eq!(letter.header("huge"), None);
        assert_eq!(
            letter.key.as_ref().map(Vec::len),
            Some(MAX_TRUNCATED_KEY_BYTES)
        );
        assert_eq!(
            letter.header(ORIGINAL_KEY_SIZE_HEADER),
            Some(b"10000".as_slice())
        );
        assert_eq!(
            letter.header(SOURCE_TOPIC_HEADER),
            Some(b"payments".as_slice())
        );
        let prefix = letter.value.as_deref().unwrap_or_default();
        assert!(stands_for(prefix, |h| letter.header(h), &value));
        let mut other = value.clone();
        other[value.len() - 1] = b'y';
        assert!(
            !stands_for(prefix, |h| letter.header(h), &other),
            "SHA-256 differs"
        );
    }

    #[test]
    fn the_detail_is_cut_at_a_char_boundary_with_its_length() {
        let detail = "é".repeat(MAX_DETAIL_BYTES);
        let cut = truncate_with_marker(&detail, MAX_DETAIL_BYTES);
        assert!(cut.len() <= MAX_DETAIL_BYTES);
        assert!(
            cut.ends_with(&format!("[truncated, {} bytes in all]", detail.len())),
            "{cut}"
        );
        assert_eq!(truncate_with_marker("short", 10), "short");
    }

    #[test]
    fn the_limit_is_the_smaller_of_producer_and_topic() {
        assert_eq!(
            message_limit(None, None),
            DEFAULT_PRODUCER_MESSAGE_MAX_BYTES
        );
        assert_eq!(message_limit(Some("2000000"), Some(1_048_588)), 1_048_588);
        assert_eq!(message_limit(Some("500000"), Some(1_048_588)), 500_000);
        assert_eq!(
            message_limit(Some("junk"), None),
            DEFAULT_PRODUCER_MESSAGE_MAX_BYTES
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn every_letter_fits_and_stands_for_its_original(
            value_len in 0usize..300_000,
            header_lens in prop::collection::vec(0usize..40_000, 0..6),
            key_len in 0usize..8_000,
            limit in 20_000usize..200_000,
        ) {
            let value = vec![b'v'; value_len];
            let header_values: Vec<Vec<u8>> = header_lens.iter().map(|&n| vec![b'h'; n]).collect();
            let headers = header_values.iter().map(|v| ("h", Some(v.as_slice()))).collect();
            let key = vec![b'k'; key_len];
            let letter = build(&input(&key, &value, headers), limit);
            prop_assert!(letter.wire_size() <= limit, "{} > {limit}", letter.wire_size());
            let letter_value = letter.value.clone().unwrap_or_default();
            prop_assert!(stands_for(&letter_value, |h| letter.header(h), &value));
            prop_assert_eq!(letter.header(SOURCE_OFFSET_HEADER), Some(b"41".as_slice()));
        }
    }

    #[test]
    fn reason_codes_round_trip() {
        for reason in DeadLetterReason::ALL {
            assert_eq!(
                reason.as_str().parse::<DeadLetterReason>().ok(),
                Some(reason)
            );
            assert_eq!(
                serde_json::to_string(&reason).ok(),
                Some(format!("\"{}\"", reason.as_str()))
            );
        }
        assert!("nonsense".parse::<DeadLetterReason>().is_err());
    }

    /// The wire names are read by the audit, dashboards and operators: they never change.
    #[test]
    fn wire_names_are_stable() {
        let names: Vec<&str> = DeadLetterReason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(
            names,
            [
                "invalid_utf8",
                "malformed_json",
                "missing_field",
                "invalid_field",
                "field_too_long",
                "oversized_record",
                "empty_record",
                "event_id_conflict",
                "beyond_dedup_horizon",
                "provider_rejected",
                "duplicate_key",
                "integer_out_of_range",
                "inexact_number",
                "total_overflow",
                "transform_refused",
                "transform_panic",
                "transform_trap",
                "transform_limit",
                "undecodable_record",
                "output_schema_misfit",
            ]
        );
    }
}
