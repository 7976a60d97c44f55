//! The canonical fingerprint: SHA-256 over a canonical JSON encoding.
//!
//! Canonical means: object keys sorted by their UTF-8 bytes, no insignificant whitespace, strings
//! escaped as serde_json escapes them, and numbers written in one form per value — an integral
//! number (`100`, `100.0`, `1e2`) as an integer, any other as the shortest decimal that reads
//! back as the same `f64`. So two encodings of the same JSON document give the same fingerprint.

use std::fmt;
use std::io::Write as _;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Number, Value};
use sha2::{Digest, Sha256};

// Strings escaped as serde_json escapes them, which is deterministic.
use crate::json_text::write_string;

/// Largest magnitude below which every integer is exactly representable as an `f64`.
const EXACT_F64_INTEGER_LIMIT: f64 = 9_007_199_254_740_992.0;

#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    pub fn of_json_object(object: &Map<String, Value>) -> Self {
        let mut canonical = Vec::with_capacity(256);
        write_object(object, &mut canonical);
        Self::of_bytes(&canonical)
    }

    /// The fingerprint of the object with these fields (each key once), without building it.
    pub fn of_json_fields(mut fields: Vec<(&str, &Value)>) -> Self {
        let mut canonical = Vec::with_capacity(256);
        write_fields(&mut fields, &mut canonical);
        Self::of_bytes(&canonical)
    }

    pub fn of_json(value: &Value) -> Self {
        let mut canonical = Vec::with_capacity(256);
        write_value(value, &mut canonical);
        Self::of_bytes(&canonical)
    }

    fn of_bytes(bytes: &[u8]) -> Self {
        Self(Sha256::digest(bytes).into())
    }

    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    pub fn to_hex(&self) -> String {
        self.to_string()
    }

    /// The 64 lower-case hex digits, on the stack: the processor writes one per record into its
    /// changelog, where formatting byte by byte through `fmt` showed in the profile.
    fn hex_digits(&self) -> [u8; 64] {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut out = [0u8; 64];
        for (pair, byte) in out.chunks_exact_mut(2).zip(self.0) {
            pair[0] = DIGITS[usize::from(byte >> 4)];
            pair[1] = DIGITS[usize::from(byte & 0x0f)];
        }
        out
    }
}

/// The canonical text of a JSON value (the input of the fingerprint).
pub fn canonical_json(value: &Value) -> String {
    let mut out = Vec::new();
    write_value(value, &mut out);
    // Only valid UTF-8 is written: JSON punctuation, numbers and serde_json-escaped strings.
    String::from_utf8(out).unwrap_or_default()
}

fn write_value(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(b) => out.extend_from_slice(if *b { b"true" } else { b"false" }),
        Value::Number(n) => write_number(n, out),
        Value::String(s) => write_string(s, out),
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_value(item, out);
            }
            out.push(b']');
        }
        Value::Object(object) => write_object(object, out),
    }
}

fn write_object(object: &Map<String, Value>, out: &mut Vec<u8>) {
    let mut fields: Vec<(&str, &Value)> = object.iter().map(|(k, v)| (k.as_str(), v)).collect();
    write_fields(&mut fields, out);
}

fn write_fields(fields: &mut [(&str, &Value)], out: &mut Vec<u8>) {
    // Sorted here rather than trusting Map's order: another crate may turn on `preserve_order`.
    fields.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    out.push(b'{');
    for (i, (key, value)) in fields.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_string(key, out);
        out.push(b':');
        write_value(value, out);
    }
    out.push(b'}');
}

fn write_number(n: &Number, out: &mut Vec<u8>) {
    if let Some(i) = n.as_i64() {
        let _ = write!(out, "{i}");
    } else if let Some(u) = n.as_u64() {
        let _ = write!(out, "{u}");
    } else if let Some(f) = n.as_f64() {
        if f.fract() == 0.0 && f.abs() < EXACT_F64_INTEGER_LIMIT {
            // Exact: |f| < 2^53 and integral.
            let _ = write!(out, "{}", f as i64);
        } else {
            // Rust's Display for f64 is the shortest round-trip decimal, never in exponent form.
            let _ = write!(out, "{f}");
        }
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let digits = self.hex_digits();
        // Hex digits are ASCII.
        f.write_str(std::str::from_utf8(&digits).map_err(|_| fmt::Error)?)
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({self})")
    }
}

#[derive(Debug, thiserror::Error)]
#[error("a fingerprint is 64 hexadecimal digits")]
pub struct InvalidFingerprint;

impl FromStr for Fingerprint {
    type Err = InvalidFingerprint;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.len() != 64 || !s.is_ascii() {
            return Err(InvalidFingerprint);
        }
        let mut bytes = [0u8; 32];
        for (i, byte) in bytes.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|_| InvalidFingerprint)?;
        }
        Ok(Self(bytes))
    }
}

impl Serialize for Fingerprint {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let digits = self.hex_digits();
        // Hex digits are ASCII.
        serializer.serialize_str(std::str::from_utf8(&digits).map_err(serde::ser::Error::custom)?)
    }
}

impl<'de> Deserialize<'de> for Fingerprint {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn fingerprint_of_text(text: &str) -> Fingerprint {
        let value: Value = serde_json::from_str(text).expect("test JSON parses");
        Fingerprint::of_json(&value)
    }

    #[test]
    fn canonical_form_is_sorted_and_compact() {
        let value: Value =
            serde_json::from_str(r#" { "b" : [1, 2.50, 1e2], "a" : {"y":null,"x":"\u00e9"} } "#)
                .expect("valid");
        assert_eq!(
            canonical_json(&value),
            r#"{"a":{"x":"é","y":null},"b":[1,2.5,100]}"#
        );
    }

    #[test]
    fn hex_round_trips() {
        let fingerprint = fingerprint_of_text(r#"{"a":1}"#);
        assert_eq!(
            fingerprint.to_hex().parse::<Fingerprint>().ok(),
            Some(fingerprint)
        );
        assert!("zz".parse::<Fingerprint>().is_err());
    }

    #[test]
    fn hex_and_serde_forms_are_the_two_digits_of_each_byte() {
        for text in [r#"{"a":1}"#, "null", r#"[0,255]"#] {
            let fingerprint = fingerprint_of_text(text);
            let reference: String = fingerprint
                .as_bytes()
                .iter()
                .map(|byte| format!("{byte:02x}"))
                .collect();
            assert_eq!(fingerprint.to_string(), reference);
            assert_eq!(
                serde_json::to_string(&fingerprint).expect("serialises"),
                format!("\"{reference}\"")
            );
        }
    }

    /// Arbitrary JSON with integer and decimal numbers, nested a few levels.
    fn arb_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            (-1_000_000i64..1_000_000, 1u32..4)
                .prop_map(|(m, d)| Value::from(m as f64 / 10f64.powi(d as i32))),
            "[a-zA-Z0-9 é\"\\\\]{0,8}".prop_map(Value::String),
        ];
        leaf.prop_recursive(3, 32, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
                prop::collection::btree_map("[a-z]{1,4}", inner, 0..5)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    /// Writes `value` as JSON text with shuffled keys, random whitespace and alternative number
    /// spellings — the same document, formatted differently.
    fn reformat(value: &Value, rng: &mut impl FnMut() -> u32, out: &mut String) {
        let pad = |rng: &mut dyn FnMut() -> u32, out: &mut String| {
            for _ in 0..rng() % 3 {
                out.push([' ', '\n', '\t'][(rng() % 3) as usize]);
            }
        };
        pad(rng, out);
        match value {
            Value::Number(n) => {
                if let Some(i) = n.as_i64() {
                    match rng() % 3 {
                        0 => out.push_str(&i.to_string()),
                        1 if i.unsigned_abs() < (1 << 53) => out.push_str(&format!("{i}.0")),
                        _ if i.unsigned_abs() < (1 << 53) && i != 0 => {
                            out.push_str(&format!("{:e}", i as f64))
                        }
                        _ => out.push_str(&i.to_string()),
                    }
                } else if let Some(f) = n.as_f64() {
                    if rng().is_multiple_of(2) {
                        out.push_str(&format!("{f:e}"));
                    } else {
                        out.push_str(&format!("{f}"));
                    }
                }
            }
            Value::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    reformat(item, rng, out);
                }
                out.push(']');
            }
            Value::Object(object) => {
                let mut keys: Vec<&String> = object.keys().collect();
                // Rotate by a random amount and maybe reverse: a different key order.
                let len = keys.len().max(1);
                keys.rotate_left(rng() as usize % len);
                if rng().is_multiple_of(2) {
                    keys.reverse();
                }
                out.push('{');
                for (i, key) in keys.into_iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&serde_json::to_string(key).unwrap_or_default());
                    pad(rng, out);
                    out.push(':');
                    reformat(&object[key], rng, out);
                }
                out.push('}');
            }
            other => out.push_str(&other.to_string()),
        }
        pad(rng, out);
    }

    proptest! {
        #[test]
        fn formatting_does_not_change_the_fingerprint(value in arb_json(), seed in any::<u64>()) {
            let mut state = seed | 1;
            let mut rng = move || {
                // xorshift: a cheap deterministic stream from the proptest seed.
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state >> 32) as u32
            };
            let mut text = String::new();
            reformat(&value, &mut rng, &mut text);
            prop_assert_eq!(fingerprint_of_text(&text), Fingerprint::of_json(&value), "{}", text);
        }

        #[test]
        fn different_content_gives_a_different_fingerprint(a in arb_json(), b in arb_json()) {
            prop_assume!(canonical_json(&a) != canonical_json(&b));
            prop_assert_ne!(Fingerprint::of_json(&a), Fingerprint::of_json(&b));
        }

        #[test]
        fn envelope_field_order_does_not_matter(value in any::<i64>(), entity in "[a-z0-9]{1,12}") {
            let one = format!(r#"{{"event_id":"e","entity_id":"{entity}","value":{value}}}"#);
            let two = format!(r#"{{ "value" : {value},"entity_id":"{entity}" , "event_id":"e" }}"#);
            let a = crate::EventEnvelope::parse(one.as_bytes()).map(|e| e.fingerprint());
            let b = crate::EventEnvelope::parse(two.as_bytes()).map(|e| e.fingerprint());
            prop_assert_eq!(a, b);
        }
    }
}
