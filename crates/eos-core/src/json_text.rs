//! Compact JSON text of a `serde_json::Value`, byte for byte what `serde_json::to_vec` writes,
//! with a faster path for strings.
//!
//! serde_json checks every byte of a string against its escape table and copies the runs between
//! escapes; on a record whose bulk is one long text field that per-byte loop was the processor's
//! largest item (docs/BENCHMARKS.md "Where the processor's CPU goes"). Here a string is first
//! checked eight bytes at a time in one machine word, and a string that needs no escaping —
//! nearly every one — is copied whole. A string that does need escaping goes to serde_json, so
//! the escapes are always serde_json's own.

use serde_json::Value;

/// `value` as compact JSON: the same bytes as `serde_json::to_vec(value)`.
pub fn to_vec(value: &Value) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    write_value(value, &mut out);
    out
}

/// Appends `value` as compact JSON, in the map's own key order.
pub fn write_value(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(b) => out.extend_from_slice(if *b { b"true" } else { b"false" }),
        // serde_json's own number formatting (itoa, ryu); writing to a Vec cannot fail.
        Value::Number(n) => {
            let _ = serde_json::to_writer(&mut *out, n);
        }
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
        Value::Object(object) => {
            out.push(b'{');
            for (i, (key, value)) in object.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_string(key, out);
                out.push(b':');
                write_value(value, out);
            }
            out.push(b'}');
        }
    }
}

/// Appends `s` as a JSON string, escaped exactly as serde_json escapes it.
pub fn write_string(s: &str, out: &mut Vec<u8>) {
    if needs_escape(s.as_bytes()) {
        // Encoding a &str into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut *out, s);
    } else {
        out.reserve(s.len() + 2);
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    }
}

/// Whether any byte is one serde_json escapes: a control character, `"` or `\`.
///
/// Eight bytes at a time as one `u64` (the exact "has a byte less than n" and "has a zero byte"
/// tests of the bit-twiddling folklore: a word passes only if none of its bytes is one of them).
fn needs_escape(bytes: &[u8]) -> bool {
    const ONES: u64 = u64::from_le_bytes([0x01; 8]);
    const HIGHS: u64 = u64::from_le_bytes([0x80; 8]);
    let has_byte_below = |word: u64, n: u8| word.wrapping_sub(ONES * u64::from(n)) & !word & HIGHS;
    let has_byte = |word: u64, b: u8| has_byte_below(word ^ (ONES * u64::from(b)), 1);
    let escaped = |b: u8| b < 0x20 || b == b'"' || b == b'\\';
    let mut words = bytes.chunks_exact(8);
    for word in &mut words {
        let mut lanes = [0u8; 8];
        lanes.copy_from_slice(word);
        let word = u64::from_le_bytes(lanes);
        if has_byte_below(word, 0x20) | has_byte(word, b'"') | has_byte(word, b'\\') != 0 {
            return true;
        }
    }
    words.remainder().iter().any(|&b| escaped(b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn any_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(Value::from),
            // Any text, and long text with the characters that are escaped.
            any::<String>().prop_map(Value::String),
            "[a-z\"\\\\\u{0}-\u{1f}\u{7f}é€😀 ]{0,80}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 64, 8, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
                prop::collection::btree_map("[a-z\"\\\\\n]{0,6}", inner, 0..8)
                    .prop_map(|map| Value::Object(map.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn the_bytes_are_serde_jsons(value in any_json()) {
            let expected = serde_json::to_vec(&value).expect("a Value always serialises");
            prop_assert_eq!(to_vec(&value), expected);
        }
    }

    #[test]
    fn every_byte_value_at_every_position_is_judged_as_one_at_a_time() {
        let escaped = |b: u8| b < 0x20 || b == b'"' || b == b'\\';
        // Fillers next to the limits the word tests use (0x20, the quote, the backslash, 0x80).
        for filler in [b'a', b' ', b'!', b'#', b'[', b']', 0x7f, 0x80, 0xff] {
            for len in [1, 7, 8, 9, 16, 23, 64] {
                for at in 0..len {
                    for byte in 0..=u8::MAX {
                        let mut bytes = vec![filler; len];
                        bytes[at] = byte;
                        assert_eq!(
                            needs_escape(&bytes),
                            escaped(byte) || escaped(filler),
                            "{byte:#x} at {at} of {len} among {filler:#x}"
                        );
                    }
                }
            }
        }
    }
}
