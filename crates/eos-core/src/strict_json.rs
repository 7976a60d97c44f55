//! JSON parsing that refuses what plain `serde_json::Value` would silently guess at
//! (docs/architecture/wire-format.md "Wire format"): an object with the same key twice (serde_json
//! keeps the last value), an integer beyond 64 bits, and a decimal that a 64-bit float cannot hold
//! exactly (serde_json rounds both to the nearest `f64`). Each would let two different inputs get
//! the same fingerprint, or one input mean different things to different readers.
//!
//! How: a custom serde visitor builds the `Value` and sees every object's keys, so duplicates are
//! found in the same pass; numbers are checked on the text, because a visitor only ever sees them
//! after rounding. serde_json's `arbitrary_precision` feature would keep the digits, but features
//! are unified across the whole build: it would change `serde_json::Number` for every crate of the
//! workspace and its dependencies (sqlx, reqwest, tonic's JSON users), which is not a change to
//! make for one parser.

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

/// Why text is not unambiguous JSON.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StrictJsonError {
    /// Not JSON at all (serde_json's message).
    Malformed(String),
    DuplicateKey(String),
    IntegerOutOfRange(String),
    InexactNumber(String),
}

/// Marks the visitor's own error, so it is told apart from serde_json's syntax errors.
const DUPLICATE_KEY_MARK: &str = "duplicate key ";

/// Parses `text` as JSON, refusing duplicate keys and numbers that would be rounded.
pub fn parse(text: &str) -> Result<Value, StrictJsonError> {
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let value = StrictValue
        .deserialize(&mut deserializer)
        .and_then(|value| deserializer.end().map(|()| value))
        .map_err(|error| {
            let message = error.to_string();
            match message.strip_prefix(DUPLICATE_KEY_MARK) {
                Some(rest) if error.is_data() => StrictJsonError::DuplicateKey(rest.to_owned()),
                _ => StrictJsonError::Malformed(message),
            }
        })?;
    check_numbers(text)?;
    Ok(value)
}

/// Builds a `Value`, refusing an object key seen twice in the same object.
struct StrictValue;

impl<'de> DeserializeSeed<'de> for StrictValue {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for StrictValue {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        // serde_json never yields a non-finite number; refuse one rather than turn it into null.
        Number::from_f64(v)
            .map(Value::Number)
            .ok_or_else(|| E::custom("non-finite number"))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element_seed(StrictValue)? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut object = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if object.contains_key(&key) {
                let shown = crate::dead_letter::truncate_with_marker(&key, 128);
                return Err(de::Error::custom(format_args!(
                    "{DUPLICATE_KEY_MARK}{shown:?}"
                )));
            }
            let value = map.next_value_seed(StrictValue)?;
            object.insert(key, value);
        }
        Ok(Value::Object(object))
    }
}

/// Checks every number token of `text`, which serde_json has already accepted as JSON.
fn check_numbers(text: &str) -> Result<(), StrictJsonError> {
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'"' => {
                // Skip the string, escapes included, a word at a time up to the next quote or
                // backslash: a record's long strings are most of its bytes.
                i += 1;
                loop {
                    match bytes
                        .get(i..)
                        .and_then(|rest| memchr::memchr2(b'"', b'\\', rest))
                    {
                        Some(found) if bytes[i + found] == b'"' => {
                            i += found;
                            break;
                        }
                        Some(found) => i += found + 2,
                        None => {
                            i = bytes.len();
                            break;
                        }
                    }
                }
                i += 1;
            }
            b'-' | b'0'..=b'9' => {
                let start = i;
                while i < bytes.len()
                    && matches!(bytes[i], b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9')
                {
                    i += 1;
                }
                check_number(&text[start..i], start)?;
            }
            _ => i += 1,
        }
    }
    Ok(())
}

fn shown(token: &str) -> String {
    crate::dead_letter::truncate_with_marker(token, 64).into_owned()
}

/// An integer must fit `i64` or `u64`; any other number must be exactly the decimal its `f64`
/// reads back as (so the canonical form, the shortest round-trip decimal, is the number itself).
fn check_number(token: &str, at: usize) -> Result<(), StrictJsonError> {
    let is_integer = !token.contains(['.', 'e', 'E']);
    if is_integer {
        if token.parse::<i64>().is_ok() || token.parse::<u64>().is_ok() {
            return Ok(());
        }
        return Err(StrictJsonError::IntegerOutOfRange(format!(
            "integer {} at byte {at} does not fit 64 bits",
            shown(token)
        )));
    }
    let exact = token
        .parse::<f64>()
        .ok()
        .filter(|f| f.is_finite())
        .is_some_and(|f| decimal(token) == decimal(&format!("{f:e}")));
    if exact {
        Ok(())
    } else {
        Err(StrictJsonError::InexactNumber(format!(
            "number {} at byte {at} is not exactly representable as a 64-bit float",
            shown(token)
        )))
    }
}

/// A decimal number as (negative, significant digits without leading or trailing zeros, exponent
/// of the last digit); zero is `(false, "", 0)` whatever its sign or spelling.
fn decimal(token: &str) -> (bool, String, i64) {
    let (negative, unsigned) = match token.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, token),
    };
    let (mantissa, exponent) = match unsigned.split_once(['e', 'E']) {
        Some((m, e)) => (m, parse_exponent(e)),
        None => (unsigned, 0),
    };
    let (int_part, frac_part) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits: String = int_part.chars().chain(frac_part.chars()).collect();
    let mut exponent = exponent.saturating_sub(frac_part.len() as i64);
    let trimmed = digits.trim_start_matches('0');
    let without_trailing = trimmed.trim_end_matches('0');
    exponent = exponent.saturating_add((trimmed.len() - without_trailing.len()) as i64);
    if without_trailing.is_empty() {
        return (false, String::new(), 0);
    }
    (negative, without_trailing.to_owned(), exponent)
}

/// An exponent's value, saturated: a hundred-digit exponent is simply huge.
fn parse_exponent(text: &str) -> i64 {
    let (negative, digits) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    let magnitude = digits.bytes().fold(0i64, |acc, d| {
        acc.saturating_mul(10).saturating_add(i64::from(d - b'0'))
    });
    if negative { -magnitude } else { magnitude }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_json_parses_as_serde_json_does() {
        let text = r#"{"a":[1,-2,3.5,1e2,"x\"}",{"b":null,"c":true}],"d":18446744073709551615}"#;
        let expected: Value = serde_json::from_str(text).expect("valid");
        assert_eq!(parse(text), Ok(expected));
    }

    #[test]
    fn duplicate_keys_are_refused_at_any_depth() {
        for text in [
            r#"{"a":1,"a":1}"#,
            r#"{"a":{"b":1,"c":2,"b":3}}"#,
            r#"{"a":[{"x":1},{"x":1,"x":2}]}"#,
            r#"{"a":1,"\u0061":2}"#,
        ] {
            assert!(
                matches!(parse(text), Err(StrictJsonError::DuplicateKey(_))),
                "{text}: {:?}",
                parse(text)
            );
        }
        // The same key in sibling objects is not a duplicate.
        assert!(parse(r#"[{"a":1},{"a":2}]"#).is_ok());
    }

    #[test]
    fn integers_beyond_64_bits_are_refused() {
        assert!(parse("-9223372036854775808").is_ok());
        assert!(parse("18446744073709551615").is_ok());
        for text in [
            "18446744073709551616",
            "-9223372036854775809",
            "[1,123456789012345678901234]",
        ] {
            assert!(
                matches!(parse(text), Err(StrictJsonError::IntegerOutOfRange(_))),
                "{text}"
            );
        }
    }

    #[test]
    fn only_exact_decimals_are_accepted() {
        for exact in [
            "0.1",
            "2.50",
            "1e2",
            "-0.0",
            "1.5e-3",
            "100.0",
            "1e30",
            "0.30000000000000004",
            "123456789.123",
        ] {
            assert!(parse(exact).is_ok(), "{exact}: {:?}", parse(exact));
        }
        for inexact in [
            "0.10000000000000000001",
            "9007199254740993.0",
            "1.00000000000000000000000001",
            "1e-400",
            "3.141592653589793238462643383279",
        ] {
            assert!(
                matches!(parse(inexact), Err(StrictJsonError::InexactNumber(_))),
                "{inexact}: {:?}",
                parse(inexact)
            );
        }
    }

    #[test]
    fn numbers_inside_strings_are_not_numbers() {
        assert!(
            parse(r#"{"a":"123456789012345678901234567890","b":"\\\"0.1000000000000000000001"}"#)
                .is_ok()
        );
    }

    /// The string skip stops at the string's real end, whatever escapes precede it, so the
    /// numbers after a string are still checked.
    #[test]
    fn numbers_after_strings_with_escapes_are_checked() {
        for text in [
            r#"{"a":"x\"y","b":123456789012345678901234567890}"#,
            r#"{"a":"\\","b":123456789012345678901234567890}"#,
            r#"{"a":"\\\"\u0022","b":123456789012345678901234567890}"#,
            r#"["","\\",123456789012345678901234567890]"#,
        ] {
            assert!(
                matches!(parse(text), Err(StrictJsonError::IntegerOutOfRange(_))),
                "{text}: {:?}",
                parse(text)
            );
        }
    }

    #[test]
    fn malformed_json_stays_malformed() {
        for text in ["{", "[1,]", "{\"a\":1} x", "nul", "1e999"] {
            assert!(
                matches!(parse(text), Err(StrictJsonError::Malformed(_))),
                "{text}"
            );
        }
    }
}
