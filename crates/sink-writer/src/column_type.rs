//! The column types the sink can write, and the check that a value fits one *before* it is sent.
//!
//! Every value travels as text in a `text[]` and is cast in SQL to the column's real type. A value
//! that would make the cast fail (a string in a bigint column, `\u0000` in jsonb, a version past
//! `i64::MAX`) would fail the whole batch again and again — a poison record. So values are checked
//! here, and a record with a value that does not fit goes to the dead-letter topic instead.

use serde_json::Value;
use time::Date;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// A supported column type, by what its values must look like.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ColumnKind {
    Int {
        min: i64,
        max: i64,
    },
    Numeric,
    Float,
    /// `text`, or `varchar(n)` with its limit in characters.
    Text {
        max_chars: Option<usize>,
    },
    Json,
    Timestamp,
    /// A calendar date, `YYYY-MM-DD` (what an Avro `date` decodes to).
    Date,
    Bool,
    Uuid,
}

/// A column's type as PostgreSQL names it (`format_type`) and how to check values for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColumnType {
    pub kind: ColumnKind,
    /// For the SQL cast, e.g. `bigint`, `character varying(64)`, `jsonb`.
    pub sql_name: String,
    /// `json` has no equality operator: compare it as `jsonb`.
    pub compare_as_jsonb: bool,
}

pub const SUPPORTED: &str = "smallint, integer, bigint, numeric, real, double precision, text, \
                             varchar, jsonb, json, timestamptz, timestamp, date, boolean, uuid";

impl ColumnType {
    /// From `pg_type.typname`, `format_type(...)` and `atttypmod`; `None` for types the sink
    /// does not write.
    pub fn from_catalog(typname: &str, sql_name: &str, typmod: i32) -> Option<Self> {
        let kind = match typname {
            "int2" => ColumnKind::Int {
                min: i64::from(i16::MIN),
                max: i64::from(i16::MAX),
            },
            "int4" => ColumnKind::Int {
                min: i64::from(i32::MIN),
                max: i64::from(i32::MAX),
            },
            "int8" => ColumnKind::Int {
                min: i64::MIN,
                max: i64::MAX,
            },
            "numeric" => ColumnKind::Numeric,
            "float4" | "float8" => ColumnKind::Float,
            "text" => ColumnKind::Text { max_chars: None },
            // varchar's typmod is the limit plus the 4-byte header; -1 when unlimited.
            "varchar" => ColumnKind::Text {
                max_chars: usize::try_from(typmod - 4).ok().filter(|_| typmod >= 4),
            },
            "jsonb" | "json" => ColumnKind::Json,
            "timestamptz" | "timestamp" => ColumnKind::Timestamp,
            "date" => ColumnKind::Date,
            "bool" => ColumnKind::Bool,
            "uuid" => ColumnKind::Uuid,
            _ => return None,
        };
        Some(Self {
            kind,
            sql_name: sql_name.to_owned(),
            compare_as_jsonb: typname == "json",
        })
    }

    pub fn is_integer(&self) -> bool {
        matches!(self.kind, ColumnKind::Int { .. })
    }

    pub fn is_timestamp(&self) -> bool {
        matches!(self.kind, ColumnKind::Timestamp)
    }

    /// The text sent for `value`: `Ok(None)` is SQL NULL; `Err` says why it does not fit.
    pub fn encode(&self, value: &Value) -> Result<Option<String>, String> {
        if value.is_null() {
            return Ok(None);
        }
        let text = match &self.kind {
            ColumnKind::Int { min, max } => {
                let n = match value {
                    Value::Number(n) => n
                        .as_i64()
                        .ok_or_else(|| format!("{n} is not an integer in range"))?,
                    Value::String(s) => s
                        .parse::<i64>()
                        .map_err(|_| format!("{s:?} is not an integer"))?,
                    other => return Err(format!("{} is not an integer", kind_of(other))),
                };
                if n < *min || n > *max {
                    return Err(format!("{n} is out of range for {}", self.sql_name));
                }
                n.to_string()
            }
            ColumnKind::Numeric | ColumnKind::Float => match value {
                Value::Number(n) => n.to_string(),
                // A decimal kept exact as text (an Avro or Protobuf decimal, a money amount).
                Value::String(s) if self.kind == ColumnKind::Numeric && is_decimal_text(s) => {
                    s.clone()
                }
                other => return Err(format!("{} is not a number", kind_of(other))),
            },
            ColumnKind::Text { max_chars } => {
                let text = match value {
                    Value::String(s) => s.clone(),
                    Value::Number(n) => n.to_string(),
                    Value::Bool(b) => b.to_string(),
                    other => eos_core::fingerprint::canonical_json(other),
                };
                if text.contains('\0') {
                    return Err("text contains a NUL character".into());
                }
                if let Some(limit) = max_chars
                    && text.chars().count() > *limit
                {
                    return Err(format!(
                        "{} characters, over the {limit}-character limit of {}",
                        text.chars().count(),
                        self.sql_name
                    ));
                }
                text
            }
            ColumnKind::Json => {
                if contains_nul(value) {
                    return Err("JSON contains \\u0000, which jsonb cannot store".into());
                }
                eos_core::fingerprint::canonical_json(value)
            }
            ColumnKind::Timestamp => {
                let Value::String(s) = value else {
                    return Err(format!("{} is not an RFC 3339 timestamp", kind_of(value)));
                };
                let parsed = OffsetDateTime::parse(s, &Rfc3339)
                    .map_err(|e| format!("{s:?} is not an RFC 3339 timestamp: {e}"))?;
                if parsed.year() < 1 {
                    return Err(format!("{s:?} is before year 1"));
                }
                s.clone()
            }
            ColumnKind::Date => {
                let Value::String(s) = value else {
                    return Err(format!("{} is not a date (YYYY-MM-DD)", kind_of(value)));
                };
                let parsed = Date::parse(s, DATE)
                    .map_err(|e| format!("{s:?} is not a date (YYYY-MM-DD): {e}"))?;
                if parsed.year() < 1 {
                    return Err(format!("{s:?} is before year 1"));
                }
                s.clone()
            }
            ColumnKind::Bool => match value {
                Value::Bool(b) => b.to_string(),
                other => return Err(format!("{} is not a boolean", kind_of(other))),
            },
            ColumnKind::Uuid => {
                let Value::String(s) = value else {
                    return Err(format!("{} is not a UUID", kind_of(value)));
                };
                if !is_uuid(s) {
                    return Err(format!("{s:?} is not a UUID"));
                }
                s.to_ascii_lowercase()
            }
        };
        Ok(Some(text))
    }
}

fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn contains_nul(value: &Value) -> bool {
    match value {
        Value::String(s) => s.contains('\0'),
        Value::Array(items) => items.iter().any(contains_nul),
        Value::Object(map) => map.iter().any(|(k, v)| k.contains('\0') || contains_nul(v)),
        _ => false,
    }
}

const DATE: &[time::format_description::BorrowedFormatItem<'_>] =
    time::macros::format_description!("[year]-[month]-[day]");

/// A decimal number as text, as PostgreSQL's `numeric` reads it: an optional sign, digits, and
/// an optional fraction; no exponent, no `NaN` or `Infinity`.
fn is_decimal_text(s: &str) -> bool {
    let digits = s.strip_prefix(['-', '+']).unwrap_or(s);
    let (whole, fraction) = digits.split_once('.').unwrap_or((digits, ""));
    !(whole.is_empty() && fraction.is_empty())
        && whole.bytes().all(|b| b.is_ascii_digit())
        && fraction.bytes().all(|b| b.is_ascii_digit())
}

fn is_uuid(s: &str) -> bool {
    let bytes = s.as_bytes();
    bytes.len() == 36
        && bytes.iter().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => *b == b'-',
            _ => b.is_ascii_hexdigit(),
        })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn ty(typname: &str, typmod: i32) -> ColumnType {
        ColumnType::from_catalog(typname, typname, typmod).expect("supported")
    }

    #[test]
    fn integers_are_range_checked_and_strings_of_digits_accepted() {
        let int4 = ty("int4", -1);
        assert_eq!(int4.encode(&json!(17)), Ok(Some("17".into())));
        assert_eq!(int4.encode(&json!("17")), Ok(Some("17".into())));
        assert!(int4.encode(&json!(3_000_000_000_i64)).is_err());
        assert!(int4.encode(&json!("seventeen")).is_err());
        assert!(int4.encode(&json!(1.5)).is_err());
        let int8 = ty("int8", -1);
        assert!(int8.encode(&json!(u64::MAX)).is_err(), "past i64::MAX");
        assert_eq!(int8.encode(&Value::Null), Ok(None));
    }

    #[test]
    fn numeric_takes_decimal_text_exactly_and_float_does_not() {
        let numeric = ty("numeric", -1);
        for exact in [
            "12.50",
            "-0.01",
            "+7",
            "123456789012345678901234567890.12",
            ".5",
            "5.",
        ] {
            assert_eq!(
                numeric.encode(&json!(exact)),
                Ok(Some(exact.into())),
                "{exact}"
            );
        }
        for refused in ["", ".", "1e3", "NaN", "Infinity", "1,5", "12.5.0", "--1"] {
            assert!(numeric.encode(&json!(refused)).is_err(), "{refused:?}");
        }
        assert!(ty("float8", -1).encode(&json!("12.50")).is_err());
    }

    #[test]
    fn text_and_json_refuse_what_postgres_would_refuse() {
        let varchar = ty("varchar", 4 + 3);
        assert_eq!(varchar.encode(&json!("abc")), Ok(Some("abc".into())));
        assert!(varchar.encode(&json!("abcd")).is_err());
        assert!(ty("text", -1).encode(&json!("a\u{0}b")).is_err());
        let jsonb = ty("jsonb", -1);
        assert_eq!(
            jsonb.encode(&json!({"b": 1, "a": [true]})),
            Ok(Some(r#"{"a":[true],"b":1}"#.into()))
        );
        assert!(jsonb.encode(&json!({"a": "x\u{0}"})).is_err());
    }

    #[test]
    fn timestamps_uuids_and_unsupported_types() {
        let ts = ty("timestamptz", -1);
        assert!(ts.encode(&json!("2026-01-02T03:04:05Z")).is_ok());
        assert!(ts.encode(&json!("yesterday")).is_err());
        let uuid = ty("uuid", -1);
        assert_eq!(
            uuid.encode(&json!("A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11")),
            Ok(Some("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11".into()))
        );
        assert!(uuid.encode(&json!("not-a-uuid")).is_err());
        let date = ty("date", -1);
        assert_eq!(
            date.encode(&json!("2026-12-06")),
            Ok(Some("2026-12-06".into()))
        );
        assert!(date.encode(&json!("2026-13-01")).is_err());
        assert!(date.encode(&json!(20_428)).is_err());
        assert!(ColumnType::from_catalog("bytea", "bytea", -1).is_none());
        assert!(ty("json", -1).compare_as_jsonb);
    }

    /// Whatever JSON a record carries, encoding for any column type never panics, and a value it
    /// accepts is one PostgreSQL's cast accepts: the text reads back as the column's type, within
    /// its limits, without NUL; JSON re-encodes to the same text.
    mod properties {
        use super::*;
        use proptest::prelude::*;

        fn arb_json() -> impl Strategy<Value = Value> {
            let leaf = prop_oneof![
                Just(Value::Null),
                any::<bool>().prop_map(Value::Bool),
                any::<i64>().prop_map(Value::from),
                any::<u64>().prop_map(Value::from),
                any::<f64>().prop_map(Value::from),
                ".{0,12}".prop_map(Value::String),
                "[0-9a-fA-F-]{36}".prop_map(Value::String),
                "-?[0-9]{1,20}".prop_map(Value::String),
                "20[0-9]{2}-[01][0-9]-[0-3][0-9]T[0-2][0-9]:[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,9})?(Z|[+-][01][0-9]:[0-5][0-9])"
                    .prop_map(Value::String),
            ];
            leaf.prop_recursive(2, 16, 4, |inner| {
                prop_oneof![
                    prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                    prop::collection::btree_map(".{0,4}", inner, 0..4)
                        .prop_map(|m| Value::Object(m.into_iter().collect())),
                ]
            })
        }

        fn arb_type() -> impl Strategy<Value = ColumnType> {
            prop_oneof![
                Just(("int2", -1)),
                Just(("int4", -1)),
                Just(("int8", -1)),
                Just(("numeric", -1)),
                Just(("float8", -1)),
                Just(("text", -1)),
                (0i32..20).prop_map(|n| ("varchar", n + 4)),
                Just(("varchar", -1)),
                Just(("jsonb", -1)),
                Just(("json", -1)),
                Just(("timestamptz", -1)),
                Just(("date", -1)),
                Just(("bool", -1)),
                Just(("uuid", -1)),
            ]
            .prop_map(|(typname, typmod)| ty(typname, typmod))
        }

        fn fits(ty: &ColumnType, text: &str) -> Result<(), TestCaseError> {
            prop_assert!(!text.contains('\0'));
            match &ty.kind {
                ColumnKind::Int { min, max } => {
                    let n: i64 = text
                        .parse()
                        .map_err(|_| TestCaseError::fail(text.to_owned()))?;
                    prop_assert!((*min..=*max).contains(&n));
                }
                ColumnKind::Numeric => {
                    prop_assert!(
                        is_decimal_text(text) || text.parse::<f64>().is_ok_and(f64::is_finite)
                    );
                }
                ColumnKind::Float => {
                    let f: f64 = text
                        .parse()
                        .map_err(|_| TestCaseError::fail(text.to_owned()))?;
                    prop_assert!(f.is_finite());
                }
                ColumnKind::Date => prop_assert!(Date::parse(text, DATE).is_ok()),
                ColumnKind::Text { max_chars } => {
                    prop_assert!(max_chars.is_none_or(|max| text.chars().count() <= max));
                }
                ColumnKind::Json => {
                    let parsed: Value = serde_json::from_str(text)
                        .map_err(|e| TestCaseError::fail(format!("{text}: {e}")))?;
                    prop_assert_eq!(ty.encode(&parsed), Ok(Some(text.to_owned())));
                }
                ColumnKind::Timestamp => {
                    prop_assert!(OffsetDateTime::parse(text, &Rfc3339).is_ok());
                }
                ColumnKind::Bool => prop_assert!(text == "true" || text == "false"),
                ColumnKind::Uuid => {
                    prop_assert!(is_uuid(text));
                    prop_assert_eq!(text.to_ascii_lowercase(), text);
                }
            }
            Ok(())
        }

        proptest! {
            #[test]
            fn encoding_any_value_is_total_and_what_it_accepts_fits(ty in arb_type(), value in arb_json()) {
                match ty.encode(&value) {
                    Ok(None) => prop_assert!(value.is_null()),
                    Ok(Some(text)) => {
                        fits(&ty, &text)?;
                        prop_assert_eq!(ty.encode(&value), Ok(Some(text)), "deterministic");
                    }
                    Err(reason) => prop_assert!(!reason.is_empty()),
                }
            }
        }
    }
}
