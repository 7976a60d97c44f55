//! Avro datums (the payload after the wire format's header) to and from the JSON event model a
//! transform sees, so that a topic's format is not the transform's concern.
//!
//! The JSON of a value, by its schema:
//!
//! | Avro | JSON |
//! | --- | --- |
//! | record | object keyed by field name |
//! | enum | its symbol |
//! | union | the value of its branch, or `null` (never Avro's `{"type": value}` wrapping) |
//! | map, array | object, array |
//! | int, long, float, double, boolean, string | number, boolean, string |
//! | bytes, fixed | base64 (standard, padded) |
//! | decimal | a string with exactly `scale` digits after the point: `"12.50"` (no rounding by a float) |
//! | timestamp-millis / -micros / -nanos | RFC 3339 in UTC with 3 / 6 / 9 digits: `"2024-05-01T12:00:00.250Z"` |
//! | local-timestamp-millis / -micros / -nanos | the same without the `Z` |
//! | date | `"2024-05-01"` |
//! | time-millis / -micros | `"12:00:00.250"` / `"12:00:00.250000"` |
//! | uuid | `"0f8fad5b-d9cb-469f-a165-70867728950e"` |
//! | duration | `{"months": 1, "days": 2, "millis": 3}` |
//!
//! Encoding takes the same forms, and also a timestamp, date or time as the integer Avro stores
//! (epoch milliseconds, days, ...), a decimal as a JSON number, and a timestamp with any UTC
//! offset. Nothing is rounded or dropped on the way in: more decimal places than the scale, a
//! time finer than the unit, a member the record does not have, or a number beyond the type is
//! [`SchemaError::DoesNotFit`], naming where. A record member that is absent takes the field's
//! default, or `null` when the field is a nullable union without one.

use std::collections::HashMap;
use std::str::FromStr;

use apache_avro::reader::datum::GenericDatumReader;
use apache_avro::schema::{
    DecimalSchema, InnerDecimalSchema, Name, RecordSchema, ResolvedSchema, Schema, UnionSchema,
};
use apache_avro::types::Value;
use apache_avro::writer::datum::GenericDatumWriter;
use apache_avro::{Days, Decimal, Duration, Millis, Months, Uuid};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use num_bigint::{BigInt, Sign};
use serde_json::{Map, Number, Value as Json};
use time::format_description::BorrowedFormatItem;
use time::format_description::well_known::Rfc3339;
use time::macros::format_description;
use time::{Date, OffsetDateTime, PrimitiveDateTime, Time};

use crate::error::SchemaError;
use crate::json_kind;
use crate::schema_id::SchemaId;
use crate::wire;

/// A parsed Avro schema and its named types, ready to decode and encode datums. Parse it once
/// per schema id ([`crate::RegistryClient::avro_schema`] keeps it), not once per record.
#[derive(Debug, Clone)]
pub struct AvroSchema {
    schema: Schema,
    /// Every named type (record, enum, fixed) by full name, for the schema's references to them.
    names: HashMap<Name, Schema>,
    /// What error messages call the schema: `id 7` for a registry's.
    label: String,
}

impl AvroSchema {
    /// Parses an Avro schema's JSON text; `label` names it in errors (`id 7`).
    pub fn parse(text: &str, label: impl Into<String>) -> Result<Self, SchemaError> {
        let label = label.into();
        let invalid = |detail: String| SchemaError::InvalidSchema {
            schema: label.clone(),
            detail,
        };
        let schema = Schema::parse_str(text).map_err(|error| invalid(error.to_string()))?;
        let names = ResolvedSchema::try_from(&schema)
            .map_err(|error| invalid(error.to_string()))?
            .get_names()
            .iter()
            .map(|(name, named)| (name.clone(), (*named).clone()))
            .collect();
        Ok(AvroSchema {
            schema,
            names,
            label,
        })
    }

    /// The parsed schema.
    pub fn schema(&self) -> &Schema {
        &self.schema
    }

    /// What errors call this schema.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The JSON value of an Avro datum written with this schema. Bytes left after the datum are
    /// an error: they mean the record was written with another schema than its id names.
    pub fn decode(&self, payload: &[u8]) -> Result<Json, SchemaError> {
        let undecodable = |detail: String| SchemaError::Undecodable {
            schema: self.label.clone(),
            detail,
        };
        let value = read_whole_datum(&self.schema, payload).map_err(undecodable)?;
        self.to_json(&value, &self.schema)
            .map_err(|misfit| undecodable(misfit.to_string()))
    }

    /// The JSON value of a datum written with `writer`, read as this (the reader's) schema by
    /// Avro's schema resolution: a field the writer lacks takes its default, one the reader lacks
    /// is skipped, an int is read as a long. So a producer that moves to a compatible schema
    /// mid-run yields the same event model. A pair that does not resolve is
    /// [`SchemaError::Undecodable`] naming both schemas.
    pub fn decode_from(&self, writer: &AvroSchema, payload: &[u8]) -> Result<Json, SchemaError> {
        let undecodable = |detail: String| SchemaError::Undecodable {
            schema: format!("{} read as {}", writer.label, self.label),
            detail,
        };
        let written = read_whole_datum(&writer.schema, payload).map_err(undecodable)?;
        let value = widen_decimals(written)
            .resolve_with_names(&self.schema, &self.names)
            .map_err(|error| undecodable(error.to_string()))?;
        self.to_json(&value, &self.schema)
            .map_err(|misfit| undecodable(misfit.to_string()))
    }

    /// Whether a datum written with `writer` resolves to this schema, by Avro's rules; the
    /// reason when it does not. Check a pair once, not once per record.
    pub fn can_read(&self, writer: &AvroSchema) -> Result<(), String> {
        apache_avro::schema_compatibility::SchemaCompatibility::can_read(
            &writer.schema,
            &self.schema,
        )
        .map(|_| ())
        .map_err(|error| error.to_string())
    }

    /// The Avro datum of `value`, which must fit the schema.
    pub fn encode(&self, value: &Json) -> Result<Vec<u8>, SchemaError> {
        let avro = self
            .to_avro(value, &self.schema)
            .map_err(|misfit| SchemaError::DoesNotFit {
                schema: self.label.clone(),
                path: misfit.path(),
                detail: misfit.detail,
            })?;
        // The conversion above checked every value against the schema, with a message that
        // names where; the library's own check stays as the last word.
        GenericDatumWriter::builder(&self.schema)
            .build()
            .and_then(|writer| writer.write_value_to_vec(avro))
            .map_err(|error| SchemaError::DoesNotFit {
                schema: self.label.clone(),
                path: "$".into(),
                detail: error.to_string(),
            })
    }

    /// `value` encoded and framed with `schema_id`: a record value as every Confluent-compatible
    /// deserializer reads it.
    pub fn encode_framed(&self, schema_id: SchemaId, value: &Json) -> Result<Vec<u8>, SchemaError> {
        let datum = self.encode(value)?;
        Ok(wire::frame(schema_id, &datum))
    }

    /// What `value` (this schema's record in the event model) says, for telling one event's
    /// content from another's: a copy without the record fields (at any depth) whose value is the
    /// field's default. A producer that moves to a newer compatible schema adding a field with a
    /// default writes the same event with that field at its default; read as its content it is
    /// the same event, and a field set to anything else is still a change. Only defaults written
    /// as the event model writes the value (null, booleans, numbers, strings, enum symbols) are
    /// compared; a field of another type is always kept.
    pub fn content(&self, value: &Json) -> Json {
        self.content_of(value, &self.schema)
    }

    fn content_of(&self, value: &Json, schema: &Schema) -> Json {
        let Ok(schema) = self.resolve(schema) else {
            return value.clone();
        };
        match (value, schema) {
            (Json::Object(object), Schema::Record(record)) => Json::Object(
                object
                    .iter()
                    .filter_map(|(name, field_value)| {
                        let field = record.lookup.get(name).and_then(|&i| record.fields.get(i));
                        match field {
                            Some(field) if self.is_default(field_value, field) => None,
                            Some(field) => {
                                Some((name.clone(), self.content_of(field_value, &field.schema)))
                            }
                            None => Some((name.clone(), field_value.clone())),
                        }
                    })
                    .collect(),
            ),
            (Json::Array(items), Schema::Array(array)) => Json::Array(
                items
                    .iter()
                    .map(|item| self.content_of(item, &array.items))
                    .collect(),
            ),
            (Json::Object(entries), Schema::Map(map)) => Json::Object(
                entries
                    .iter()
                    .map(|(key, item)| (key.clone(), self.content_of(item, &map.types)))
                    .collect(),
            ),
            // A union's value is its branch's: an object is the union's one record, if it has
            // exactly one.
            (Json::Object(_), Schema::Union(union)) => {
                let mut records = union
                    .variants()
                    .iter()
                    .filter(|variant| matches!(self.resolve(variant), Ok(Schema::Record(_))));
                match (records.next(), records.next()) {
                    (Some(record), None) => self.content_of(value, record),
                    _ => value.clone(),
                }
            }
            _ => value.clone(),
        }
    }

    /// Whether `value` is `field`'s default, written as the event model writes it.
    fn is_default(&self, value: &Json, field: &apache_avro::schema::RecordField) -> bool {
        let Some(default) = &field.default else {
            return false;
        };
        // A union's default is of its first branch.
        let schema = match self.resolve(&field.schema) {
            Ok(Schema::Union(union)) => union
                .variants()
                .first()
                .and_then(|first| self.resolve(first).ok()),
            Ok(other) => Some(other),
            Err(_) => None,
        };
        let comparable = matches!(
            schema,
            Some(
                Schema::Null
                    | Schema::Boolean
                    | Schema::Int
                    | Schema::Long
                    | Schema::Float
                    | Schema::Double
                    | Schema::String
                    | Schema::Enum(_)
            )
        );
        comparable && value == default
    }

    fn resolve<'a>(&'a self, schema: &'a Schema) -> Result<&'a Schema, Misfit> {
        match schema {
            Schema::Ref { name } => self
                .names
                .get(name)
                .ok_or_else(|| Misfit::new(format!("the schema names an unknown type {name}"))),
            other => Ok(other),
        }
    }

    fn to_json(&self, value: &Value, schema: &Schema) -> Result<Json, Misfit> {
        let schema = self.resolve(schema)?;
        Ok(match (value, schema) {
            (Value::Null, _) => Json::Null,
            (Value::Boolean(b), _) => Json::Bool(*b),
            (Value::Int(n), _) => Json::from(*n),
            (Value::Long(n), _) => Json::from(*n),
            (Value::Float(x), _) => finite(f64::from(*x))?,
            (Value::Double(x), _) => finite(*x)?,
            (Value::Bytes(bytes) | Value::Fixed(_, bytes), _) => Json::String(BASE64.encode(bytes)),
            (Value::String(text), _) => Json::String(text.clone()),
            (Value::Enum(_, symbol), _) => Json::String(symbol.clone()),
            (Value::Union(index, inner), Schema::Union(union)) => {
                let branch = union
                    .variants()
                    .get(*index as usize)
                    .ok_or_else(|| Misfit::new(format!("union branch {index} does not exist")))?;
                self.to_json(inner, branch)?
            }
            (Value::Array(items), Schema::Array(array)) => Json::Array(
                items
                    .iter()
                    .enumerate()
                    .map(|(i, item)| {
                        self.to_json(item, &array.items)
                            .map_err(|m| m.at(PathPart::Index(i)))
                    })
                    .collect::<Result<_, _>>()?,
            ),
            (Value::Map(entries), Schema::Map(map)) => Json::Object(
                entries
                    .iter()
                    .map(|(key, item)| {
                        Ok((
                            key.clone(),
                            self.to_json(item, &map.types)
                                .map_err(|m| m.at(PathPart::Member(key.clone())))?,
                        ))
                    })
                    .collect::<Result<_, Misfit>>()?,
            ),
            (Value::Record(fields), Schema::Record(record)) => {
                let mut object = Map::new();
                for (name, field_value) in fields {
                    let field = record
                        .lookup
                        .get(name)
                        .and_then(|&i| record.fields.get(i))
                        .ok_or_else(|| {
                            Misfit::new(format!("field {name:?} is not in the schema"))
                        })?;
                    let json = self
                        .to_json(field_value, &field.schema)
                        .map_err(|m| m.at(PathPart::Member(name.clone())))?;
                    object.insert(name.clone(), json);
                }
                Json::Object(object)
            }
            (Value::Decimal(decimal), Schema::Decimal(DecimalSchema { scale, .. })) => {
                Json::String(decimal_text(&BigInt::from(decimal.clone()), *scale))
            }
            (Value::BigDecimal(decimal), _) => Json::String(decimal.to_string()),
            (Value::Date(days), _) => Json::String(date_text(*days)?),
            (Value::TimeMillis(ms), _) => Json::String(time_text(i64::from(*ms), Unit::Millis)?),
            (Value::TimeMicros(us), _) => Json::String(time_text(*us, Unit::Micros)?),
            (Value::TimestampMillis(t), _) => Json::String(timestamp_text(*t, Unit::Millis, true)?),
            (Value::TimestampMicros(t), _) => Json::String(timestamp_text(*t, Unit::Micros, true)?),
            (Value::TimestampNanos(t), _) => Json::String(timestamp_text(*t, Unit::Nanos, true)?),
            (Value::LocalTimestampMillis(t), _) => {
                Json::String(timestamp_text(*t, Unit::Millis, false)?)
            }
            (Value::LocalTimestampMicros(t), _) => {
                Json::String(timestamp_text(*t, Unit::Micros, false)?)
            }
            (Value::LocalTimestampNanos(t), _) => {
                Json::String(timestamp_text(*t, Unit::Nanos, false)?)
            }
            (Value::Duration(duration), _) => serde_json::json!({
                "months": u32::from(duration.months()),
                "days": u32::from(duration.days()),
                "millis": u32::from(duration.millis()),
            }),
            (Value::Uuid(uuid), _) => Json::String(uuid.hyphenated().to_string()),
            (value, schema) => {
                return Err(Misfit::new(format!(
                    "decoded {value:?} where the schema has {}",
                    kind(schema)
                )));
            }
        })
    }

    // One arm per kind of schema, kept in one match (over 100 lines) so that the compiler checks
    // every kind is handled; each arm's work is a call or a few lines.
    fn to_avro(&self, json: &Json, schema: &Schema) -> Result<Value, Misfit> {
        let schema = self.resolve(schema)?;
        let expected = || Misfit::new(format!("{} is not {}", json_kind(json), kind(schema)));
        Ok(match schema {
            Schema::Null => match json {
                Json::Null => Value::Null,
                _ => return Err(expected()),
            },
            Schema::Boolean => Value::Boolean(json.as_bool().ok_or_else(expected)?),
            Schema::Int => Value::Int(integer(json, "an int")?),
            Schema::Long => Value::Long(integer(json, "a long")?),
            // A float holds what f32 holds: the nearest to the number given, as every Avro
            // writer does; a number beyond f32 would become infinity, which no reader can turn
            // back into JSON.
            Schema::Float => {
                let nearest = json.as_f64().ok_or_else(expected)? as f32;
                if !nearest.is_finite() {
                    return Err(Misfit::new(format!("{json} is beyond a float")));
                }
                Value::Float(nearest)
            }
            Schema::Double => Value::Double(json.as_f64().ok_or_else(expected)?),
            Schema::String => Value::String(json.as_str().ok_or_else(expected)?.to_owned()),
            Schema::Bytes => Value::Bytes(base64_bytes(json)?),
            Schema::Fixed(fixed) => fixed_to_avro(json, fixed)?,
            Schema::Enum(enumeration) => {
                enum_to_avro(json.as_str().ok_or_else(expected)?, enumeration)?
            }
            Schema::Union(union) => self.union_to_avro(json, union)?,
            Schema::Array(array) => Value::Array(
                json.as_array()
                    .ok_or_else(expected)?
                    .iter()
                    .enumerate()
                    .map(|(i, item)| {
                        self.to_avro(item, &array.items)
                            .map_err(|m| m.at(PathPart::Index(i)))
                    })
                    .collect::<Result<_, _>>()?,
            ),
            Schema::Map(map) => Value::Map(
                json.as_object()
                    .ok_or_else(expected)?
                    .iter()
                    .map(|(key, item)| {
                        Ok((
                            key.clone(),
                            self.to_avro(item, &map.types)
                                .map_err(|m| m.at(PathPart::Member(key.clone())))?,
                        ))
                    })
                    .collect::<Result<_, Misfit>>()?,
            ),
            Schema::Record(record) => {
                self.record_to_avro(json.as_object().ok_or_else(expected)?, record)?
            }
            Schema::Decimal(_)
            | Schema::BigDecimal
            | Schema::Uuid(_)
            | Schema::Date
            | Schema::TimeMillis
            | Schema::TimeMicros
            | Schema::TimestampMillis
            | Schema::TimestampMicros
            | Schema::TimestampNanos
            | Schema::LocalTimestampMillis
            | Schema::LocalTimestampMicros
            | Schema::LocalTimestampNanos
            | Schema::Duration(_) => logical_to_avro(json, schema)?,
            Schema::Ref { .. } => return Err(Misfit::new("a reference to a reference".into())),
        })
    }

    /// The first branch `json` fits, in the schema's order; `null` takes the null branch.
    fn union_to_avro(&self, json: &Json, union: &UnionSchema) -> Result<Value, Misfit> {
        let branches = union.variants();
        if json.is_null()
            && let Some(index) = branches.iter().position(|b| matches!(b, Schema::Null))
        {
            return Ok(Value::Union(index as u32, Box::new(Value::Null)));
        }
        let candidates: Vec<(usize, &Schema)> = branches
            .iter()
            .enumerate()
            .filter(|(_, b)| !matches!(b, Schema::Null))
            .collect();
        // One candidate, as in the usual nullable field: its own message says what is wrong.
        if let [(index, branch)] = candidates[..] {
            let value = self.to_avro(json, branch)?;
            return Ok(Value::Union(index as u32, Box::new(value)));
        }
        for (index, branch) in &candidates {
            if let Ok(value) = self.to_avro(json, branch) {
                return Ok(Value::Union(*index as u32, Box::new(value)));
            }
        }
        Err(Misfit::new(format!(
            "{} fits none of the union's branches ({})",
            json_kind(json),
            branches.iter().map(kind).collect::<Vec<_>>().join(", ")
        )))
    }

    fn record_to_avro(
        &self,
        object: &Map<String, Json>,
        record: &RecordSchema,
    ) -> Result<Value, Misfit> {
        if let Some(unknown) = object.keys().find(|key| !record.lookup.contains_key(*key)) {
            return Err(
                Misfit::new(format!("record {} has no field {unknown:?}", record.name))
                    .at(PathPart::Member(unknown.clone())),
            );
        }
        let mut fields = Vec::with_capacity(record.fields.len());
        for field in &record.fields {
            let at = || PathPart::Member(field.name.clone());
            let value = match (object.get(&field.name), &field.default) {
                (Some(json), _) => self.to_avro(json, &field.schema).map_err(|m| m.at(at()))?,
                (None, Some(default)) => self
                    .default_to_avro(default, &field.schema)
                    .map_err(|m| m.at(at()))?,
                (None, None) => match self.resolve(&field.schema)? {
                    Schema::Union(union) if union.is_nullable() => {
                        self.union_to_avro(&Json::Null, union)?
                    }
                    _ => {
                        return Err(
                            Misfit::new("missing, and the field has no default".into()).at(at())
                        );
                    }
                },
            };
            fields.push((field.name.clone(), value));
        }
        Ok(Value::Record(fields))
    }

    /// A field default, in Avro's JSON form: a union's is its first branch's, and bytes are a
    /// string of code points 0-255, one per byte.
    fn default_to_avro(&self, default: &Json, schema: &Schema) -> Result<Value, Misfit> {
        let latin1 = |json: &Json| -> Result<Vec<u8>, Misfit> {
            json.as_str()
                .ok_or_else(|| Misfit::new("a bytes default that is not a string".into()))?
                .chars()
                .map(|c| u8::try_from(u32::from(c)))
                .collect::<Result<_, _>>()
                .map_err(|_| Misfit::new("a bytes default beyond code point 255".into()))
        };
        match self.resolve(schema)? {
            Schema::Union(union) => {
                let first = union
                    .variants()
                    .first()
                    .ok_or_else(|| Misfit::new("an empty union".into()))?;
                Ok(Value::Union(
                    0,
                    Box::new(self.default_to_avro(default, first)?),
                ))
            }
            Schema::Bytes => Ok(Value::Bytes(latin1(default)?)),
            Schema::Fixed(fixed) => Ok(Value::Fixed(fixed.size, latin1(default)?)),
            Schema::Decimal(_) => Ok(Value::Decimal(Decimal::from(latin1(default)?))),
            other => self.to_avro(default, other),
        }
    }
}

/// Every decimal in `value` sign-extended to 64 bytes, the same number. apache-avro 0.22's
/// resolution refuses a bytes decimal whose length could not hold the reader's whole precision
/// (1234.50 in a `decimal(12, 2)` is 3 bytes, and 3 bytes hold only 7 digits), which is every
/// small value; 0.23 checks the digits instead. 64 bytes hold 153 digits, beyond any precision a
/// registered schema uses.
fn widen_decimals(value: Value) -> Value {
    const WIDE: usize = 64;
    match value {
        Value::Decimal(decimal) => {
            let unscaled = BigInt::from(decimal);
            let bytes = unscaled.to_signed_bytes_be();
            let fill = if unscaled.sign() == Sign::Minus {
                0xff
            } else {
                0x00
            };
            let mut wide = vec![fill; WIDE.saturating_sub(bytes.len())];
            wide.extend_from_slice(&bytes);
            Value::Decimal(Decimal::from(wide))
        }
        Value::Union(index, inner) => Value::Union(index, Box::new(widen_decimals(*inner))),
        Value::Array(items) => Value::Array(items.into_iter().map(widen_decimals).collect()),
        Value::Map(entries) => Value::Map(
            entries
                .into_iter()
                .map(|(key, item)| (key, widen_decimals(item)))
                .collect(),
        ),
        Value::Record(fields) => Value::Record(
            fields
                .into_iter()
                .map(|(name, field)| (name, widen_decimals(field)))
                .collect(),
        ),
        other => other,
    }
}

/// Where in a value a misfit is, and what it is.
#[derive(Debug)]
struct Misfit {
    detail: String,
    /// Innermost first; [`Misfit::path`] renders it outermost first.
    path: Vec<PathPart>,
}

#[derive(Debug)]
enum PathPart {
    Member(String),
    Index(usize),
}

impl Misfit {
    fn new(detail: String) -> Self {
        Misfit {
            detail,
            path: Vec::new(),
        }
    }

    fn at(mut self, part: PathPart) -> Self {
        self.path.push(part);
        self
    }

    fn path(&self) -> String {
        let mut path = String::from("$");
        for part in self.path.iter().rev() {
            match part {
                PathPart::Member(name) => {
                    path.push('.');
                    path.push_str(name);
                }
                PathPart::Index(i) => path.push_str(&format!("[{i}]")),
            }
        }
        path
    }
}

impl std::fmt::Display for Misfit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "at {}: {}", self.path(), self.detail)
    }
}

fn kind(schema: &Schema) -> String {
    match schema {
        Schema::Record(record) => format!("record {}", record.name),
        Schema::Enum(enumeration) => format!("enum {}", enumeration.name),
        Schema::Fixed(fixed) => format!("fixed {}", fixed.name),
        Schema::Ref { name } => name.to_string(),
        Schema::Decimal(decimal) => format!("decimal({}, {})", decimal.precision, decimal.scale),
        other => format!("{:?}", apache_avro::schema::SchemaKind::from(other)).to_lowercase(),
    }
}

/// The one datum `payload` holds, written with `schema`; bytes left after it are an error (the
/// record was written with another schema than its id names).
fn read_whole_datum(schema: &Schema, payload: &[u8]) -> Result<Value, String> {
    let mut rest = payload;
    let value = GenericDatumReader::builder(schema)
        .build()
        .and_then(|reader| reader.read_value(&mut rest))
        .map_err(|error| error.to_string())?;
    if !rest.is_empty() {
        return Err(format!(
            "{} bytes left after the datum's {}",
            rest.len(),
            payload.len() - rest.len()
        ));
    }
    Ok(value)
}

fn finite(x: f64) -> Result<Json, Misfit> {
    Number::from_f64(x)
        .map(Json::Number)
        .ok_or_else(|| Misfit::new(format!("{x} has no JSON number")))
}

/// An integer of the type `T`; a number with a zero fraction (`100.0`) is that integer.
fn integer<T: TryFrom<i64>>(json: &Json, what: &str) -> Result<T, Misfit> {
    let whole = match json {
        Json::Number(n) => n.as_i64().or_else(|| {
            n.as_f64()
                .filter(|x| x.fract() == 0.0 && x.abs() < 9.007_199_254_740_992e15)
                .map(|x| x as i64)
        }),
        _ => None,
    };
    whole
        .and_then(|n| T::try_from(n).ok())
        .ok_or_else(|| Misfit::new(format!("{json} is not {what}")))
}

fn base64_bytes(json: &Json) -> Result<Vec<u8>, Misfit> {
    let text = json
        .as_str()
        .ok_or_else(|| Misfit::new(format!("{} is not base64 bytes", json_kind(json))))?;
    BASE64
        .decode(text)
        .map_err(|error| Misfit::new(format!("not base64: {error}")))
}

/// The unscaled integer as text with `scale` digits after the point: (-5, 2) is `-0.05`.
fn decimal_text(unscaled: &BigInt, scale: usize) -> String {
    let digits = unscaled.magnitude().to_string();
    let sign = if unscaled.sign() == Sign::Minus {
        "-"
    } else {
        ""
    };
    if scale == 0 {
        return format!("{sign}{digits}");
    }
    let padded = format!("{digits:0>width$}", width = scale + 1);
    let (whole, fraction) = padded.split_at(padded.len() - scale);
    format!("{sign}{whole}.{fraction}")
}

fn decimal_input(json: &Json) -> Result<String, Misfit> {
    match json {
        Json::String(text) => Ok(text.trim().to_owned()),
        Json::Number(n) => Ok(n.to_string()),
        other => Err(Misfit::new(format!(
            "{} is not a decimal",
            json_kind(other)
        ))),
    }
}

/// A logical type's value (decimal, uuid, date, time, timestamp, duration) from its JSON form.
fn logical_to_avro(json: &Json, schema: &Schema) -> Result<Value, Misfit> {
    let expected = || Misfit::new(format!("{} is not {}", json_kind(json), kind(schema)));
    Ok(match schema {
        Schema::Decimal(decimal) => Value::Decimal(decimal_value(json, decimal)?),
        Schema::BigDecimal => Value::BigDecimal(
            apache_avro::BigDecimal::from_str(&decimal_input(json)?)
                .map_err(|error| Misfit::new(format!("not a decimal number: {error}")))?,
        ),
        Schema::Uuid(_) => Value::Uuid(
            Uuid::parse_str(json.as_str().ok_or_else(expected)?)
                .map_err(|error| Misfit::new(format!("not a UUID: {error}")))?,
        ),
        Schema::Date => Value::Date(date_value(json)?),
        Schema::TimeMillis => Value::TimeMillis(
            i32::try_from(time_value(json, Unit::Millis)?)
                .map_err(|_| Misfit::new("beyond a time-millis".into()))?,
        ),
        Schema::TimeMicros => Value::TimeMicros(time_value(json, Unit::Micros)?),
        Schema::TimestampMillis => {
            Value::TimestampMillis(timestamp_value(json, Unit::Millis, true)?)
        }
        Schema::TimestampMicros => {
            Value::TimestampMicros(timestamp_value(json, Unit::Micros, true)?)
        }
        Schema::TimestampNanos => Value::TimestampNanos(timestamp_value(json, Unit::Nanos, true)?),
        Schema::LocalTimestampMillis => {
            Value::LocalTimestampMillis(timestamp_value(json, Unit::Millis, false)?)
        }
        Schema::LocalTimestampMicros => {
            Value::LocalTimestampMicros(timestamp_value(json, Unit::Micros, false)?)
        }
        Schema::LocalTimestampNanos => {
            Value::LocalTimestampNanos(timestamp_value(json, Unit::Nanos, false)?)
        }
        Schema::Duration(_) => Value::Duration(duration_value(json)?),
        _ => return Err(expected()),
    })
}

/// A fixed's bytes, from base64, exactly its size.
fn fixed_to_avro(json: &Json, fixed: &apache_avro::schema::FixedSchema) -> Result<Value, Misfit> {
    let bytes = base64_bytes(json)?;
    if bytes.len() != fixed.size {
        return Err(Misfit::new(format!(
            "{} bytes where fixed {} holds {}",
            bytes.len(),
            fixed.name,
            fixed.size
        )));
    }
    Ok(Value::Fixed(fixed.size, bytes))
}

/// An enum's symbol, one the enum has.
fn enum_to_avro(
    symbol: &str,
    enumeration: &apache_avro::schema::EnumSchema,
) -> Result<Value, Misfit> {
    let index = enumeration
        .symbols
        .iter()
        .position(|s| s == symbol)
        .ok_or_else(|| {
            Misfit::new(format!(
                "{symbol:?} is not a symbol of enum {} ({})",
                enumeration.name,
                enumeration.symbols.join(", ")
            ))
        })?;
    Ok(Value::Enum(index as u32, symbol.to_owned()))
}

/// A decimal's unscaled value at the schema's scale, from text (`"12.5"`, `"-1e3"`) or a number;
/// refused when it needs more places than the scale or more digits than the precision.
fn decimal_value(json: &Json, schema: &DecimalSchema) -> Result<Decimal, Misfit> {
    let text = decimal_input(json)?;
    let not_decimal = || Misfit::new(format!("{text:?} is not a decimal number"));
    let (mantissa, exponent) = match text.find(['e', 'E']) {
        Some(at) => (
            &text[..at],
            text[at + 1..].parse::<i64>().map_err(|_| not_decimal())?,
        ),
        None => (text.as_str(), 0),
    };
    let (negative, unsigned) = match mantissa.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, mantissa.strip_prefix('+').unwrap_or(mantissa)),
    };
    let (whole, fraction) = unsigned.split_once('.').unwrap_or((unsigned, ""));
    if whole.is_empty() && fraction.is_empty()
        || !whole
            .bytes()
            .chain(fraction.bytes())
            .all(|b| b.is_ascii_digit())
    {
        return Err(not_decimal());
    }
    // digits × 10^(exponent - fraction digits); the schema wants digits × 10^-scale.
    let mut digits = format!("{whole}{fraction}");
    let shift = exponent - fraction.len() as i64 + schema.scale as i64;
    if shift >= 0 {
        if shift > 1_000 {
            return Err(Misfit::new(format!(
                "{text:?} is beyond any decimal precision"
            )));
        }
        digits.extend(std::iter::repeat_n('0', shift as usize));
    } else {
        let cut = (-shift) as usize;
        let kept = digits.len().saturating_sub(cut);
        if digits[kept..].bytes().any(|b| b != b'0') {
            return Err(Misfit::new(format!(
                "{text:?} has more than the scale's {} decimal places",
                schema.scale
            )));
        }
        digits.truncate(kept);
    }
    let magnitude = digits.trim_start_matches('0');
    if magnitude.len() > schema.precision {
        return Err(Misfit::new(format!(
            "{text:?} has more than the precision's {} digits",
            schema.precision
        )));
    }
    let mut unscaled = BigInt::from_str(if magnitude.is_empty() { "0" } else { magnitude })
        .map_err(|_| not_decimal())?;
    if negative {
        unscaled = -unscaled;
    }
    let bytes = unscaled.to_signed_bytes_be();
    if let InnerDecimalSchema::Fixed(fixed) = &schema.inner
        && bytes.len() > fixed.size
    {
        return Err(Misfit::new(format!(
            "{text:?} needs {} bytes, more than fixed {} holds ({})",
            bytes.len(),
            fixed.name,
            fixed.size
        )));
    }
    Ok(Decimal::from(bytes))
}

#[derive(Debug, Clone, Copy)]
enum Unit {
    Millis,
    Micros,
    Nanos,
}

impl Unit {
    fn nanos(self) -> i128 {
        match self {
            Unit::Millis => 1_000_000,
            Unit::Micros => 1_000,
            Unit::Nanos => 1,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Unit::Millis => "milliseconds",
            Unit::Micros => "microseconds",
            Unit::Nanos => "nanoseconds",
        }
    }
}

const UTC_MILLIS: &[BorrowedFormatItem<'_>] =
    format_description!("[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z");
const UTC_MICROS: &[BorrowedFormatItem<'_>] =
    format_description!("[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:6]Z");
const UTC_NANOS: &[BorrowedFormatItem<'_>] =
    format_description!("[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:9]Z");
const LOCAL_MILLIS: &[BorrowedFormatItem<'_>] =
    format_description!("[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]");
const LOCAL_MICROS: &[BorrowedFormatItem<'_>] =
    format_description!("[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:6]");
const LOCAL_NANOS: &[BorrowedFormatItem<'_>] =
    format_description!("[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:9]");
const LOCAL_INPUT: &[BorrowedFormatItem<'_>] =
    format_description!("[year]-[month]-[day]T[hour]:[minute]:[second][optional [.[subsecond]]]");
const DATE: &[BorrowedFormatItem<'_>] = format_description!("[year]-[month]-[day]");
const TIME_MILLIS: &[BorrowedFormatItem<'_>] =
    format_description!("[hour]:[minute]:[second].[subsecond digits:3]");
const TIME_MICROS: &[BorrowedFormatItem<'_>] =
    format_description!("[hour]:[minute]:[second].[subsecond digits:6]");
const TIME_INPUT: &[BorrowedFormatItem<'_>] =
    format_description!("[hour]:[minute]:[second][optional [.[subsecond]]]");

fn timestamp_text(value: i64, unit: Unit, utc: bool) -> Result<String, Misfit> {
    let instant = OffsetDateTime::from_unix_timestamp_nanos(i128::from(value) * unit.nanos())
        .map_err(|_| Misfit::new(format!("timestamp {value} {} is out of range", unit.name())))?;
    let format = match (unit, utc) {
        (Unit::Millis, true) => UTC_MILLIS,
        (Unit::Micros, true) => UTC_MICROS,
        (Unit::Nanos, true) => UTC_NANOS,
        (Unit::Millis, false) => LOCAL_MILLIS,
        (Unit::Micros, false) => LOCAL_MICROS,
        (Unit::Nanos, false) => LOCAL_NANOS,
    };
    instant
        .format(format)
        .map_err(|error| Misfit::new(format!("timestamp {value}: {error}")))
}

/// Nanoseconds as whole `unit`s, refused when finer than the unit.
fn whole_units(nanos: i128, unit: Unit, text: &str) -> Result<i64, Misfit> {
    if nanos % unit.nanos() != 0 {
        return Err(Misfit::new(format!(
            "{text:?} is finer than {}",
            unit.name()
        )));
    }
    i64::try_from(nanos / unit.nanos())
        .map_err(|_| Misfit::new(format!("{text:?} is out of range")))
}

fn timestamp_value(json: &Json, unit: Unit, utc: bool) -> Result<i64, Misfit> {
    let Some(text) = json.as_str() else {
        return integer(json, "a timestamp");
    };
    let instant = if utc {
        OffsetDateTime::parse(text, &Rfc3339)
    } else {
        PrimitiveDateTime::parse(text, LOCAL_INPUT).map(PrimitiveDateTime::assume_utc)
    }
    .map_err(|error| {
        let form = if utc {
            "an RFC 3339 timestamp"
        } else {
            "a local date-time"
        };
        Misfit::new(format!("{text:?} is not {form}: {error}"))
    })?;
    whole_units(instant.unix_timestamp_nanos(), unit, text)
}

/// The Julian day of 1970-01-01, where Avro's dates count from.
const UNIX_EPOCH_JULIAN_DAY: i32 = 2_440_588;

fn date_text(days: i32) -> Result<String, Misfit> {
    days.checked_add(UNIX_EPOCH_JULIAN_DAY)
        .and_then(|julian| Date::from_julian_day(julian).ok())
        .and_then(|date| date.format(DATE).ok())
        .ok_or_else(|| Misfit::new(format!("date {days} days from 1970-01-01 is out of range")))
}

fn date_value(json: &Json) -> Result<i32, Misfit> {
    let Some(text) = json.as_str() else {
        return integer(json, "a date");
    };
    Date::parse(text, DATE)
        .map(|date| date.to_julian_day() - UNIX_EPOCH_JULIAN_DAY)
        .map_err(|error| Misfit::new(format!("{text:?} is not a date: {error}")))
}

const DAY_NANOS: i128 = 86_400 * 1_000_000_000;

fn time_text(value: i64, unit: Unit) -> Result<String, Misfit> {
    let nanos = i128::from(value) * unit.nanos();
    if !(0..DAY_NANOS).contains(&nanos) {
        return Err(Misfit::new(format!(
            "time of day {value} {} is out of range",
            unit.name()
        )));
    }
    let seconds = (nanos / 1_000_000_000) as u32;
    let time = Time::from_hms_nano(
        (seconds / 3600) as u8,
        (seconds / 60 % 60) as u8,
        (seconds % 60) as u8,
        (nanos % 1_000_000_000) as u32,
    )
    .map_err(|error| Misfit::new(format!("time of day {value}: {error}")))?;
    let format = match unit {
        Unit::Millis => TIME_MILLIS,
        Unit::Micros | Unit::Nanos => TIME_MICROS,
    };
    time.format(format)
        .map_err(|error| Misfit::new(format!("time of day {value}: {error}")))
}

fn time_value(json: &Json, unit: Unit) -> Result<i64, Misfit> {
    let Some(text) = json.as_str() else {
        let value: i64 = integer(json, "a time of day")?;
        if !(0..DAY_NANOS).contains(&(i128::from(value) * unit.nanos())) {
            return Err(Misfit::new(format!(
                "{value} is beyond a day's {}",
                unit.name()
            )));
        }
        return Ok(value);
    };
    let time = Time::parse(text, TIME_INPUT)
        .map_err(|error| Misfit::new(format!("{text:?} is not a time of day: {error}")))?;
    let (hour, minute, second, nano) = time.as_hms_nano();
    let nanos = (i128::from(hour) * 3600 + i128::from(minute) * 60 + i128::from(second))
        * 1_000_000_000
        + i128::from(nano);
    whole_units(nanos, unit, text)
}

fn duration_value(json: &Json) -> Result<Duration, Misfit> {
    let object = json
        .as_object()
        .ok_or_else(|| Misfit::new(format!("{} is not a duration object", json_kind(json))))?;
    if let Some(unknown) = object
        .keys()
        .find(|key| !matches!(key.as_str(), "months" | "days" | "millis"))
    {
        return Err(Misfit::new(format!(
            "a duration has months, days and millis, not {unknown:?}"
        )));
    }
    let part = |name: &str| -> Result<u32, Misfit> {
        object
            .get(name)
            .map_or(Ok(0), |n| integer(n, "a duration part (0 to 4294967295)"))
    };
    Ok(Duration::new(
        Months::new(part("months")?),
        Days::new(part("days")?),
        Millis::new(part("millis")?),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema(text: &str) -> AvroSchema {
        AvroSchema::parse(text, "test").expect("a valid schema")
    }

    fn round_trip(schema: &AvroSchema, value: &Json) -> Json {
        let bytes = schema.encode(value).expect("fits");
        schema.decode(&bytes).expect("decodes")
    }

    const PAYMENT: &str = r#"{
        "type": "record", "name": "Payment", "namespace": "eos.test",
        "fields": [
            {"name": "id", "type": {"type": "string", "logicalType": "uuid"}},
            {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}},
            {"name": "fee", "type": {"type": "fixed", "name": "Fee", "size": 4, "logicalType": "decimal", "precision": 6, "scale": 3}},
            {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
            {"name": "settled_at", "type": ["null", {"type": "long", "logicalType": "timestamp-micros"}]},
            {"name": "booked_on", "type": {"type": "int", "logicalType": "date"}},
            {"name": "cutoff", "type": {"type": "int", "logicalType": "time-millis"}},
            {"name": "state", "type": {"type": "enum", "name": "State", "symbols": ["PENDING", "SETTLED"]}},
            {"name": "note", "type": ["null", "string"], "default": null},
            {"name": "attempts", "type": "int", "default": 1},
            {"name": "tags", "type": {"type": "array", "items": "string"}},
            {"name": "limits", "type": {"type": "map", "values": "long"}},
            {"name": "payer", "type": {"type": "record", "name": "Party", "fields": [
                {"name": "name", "type": "string"},
                {"name": "digest", "type": "bytes"}
            ]}},
            {"name": "payee", "type": ["null", "Party"]}
        ]
    }"#;

    fn a_payment() -> Json {
        json!({
            "id": "0f8fad5b-d9cb-469f-a165-70867728950e",
            "amount": "-1234.50",
            "fee": "0.125",
            "at": "2024-05-01T12:00:00.250Z",
            "settled_at": "2024-05-01T12:00:01.000001Z",
            "booked_on": "2024-05-01",
            "cutoff": "17:30:00.000",
            "state": "SETTLED",
            "note": "first",
            "attempts": 2,
            "tags": ["a", "b"],
            "limits": {"day": 5000},
            "payer": {"name": "Ada", "digest": "AAEC/w=="},
            "payee": {"name": "Bob", "digest": ""}
        })
    }

    #[test]
    fn a_record_round_trips_with_its_logical_types_kept_meaningful() {
        let payment = schema(PAYMENT);
        assert_eq!(round_trip(&payment, &a_payment()), a_payment());
    }

    #[test]
    fn nullable_unions_are_the_plain_value_or_null_and_defaults_fill_absent_fields() {
        let payment = schema(PAYMENT);
        let mut value = a_payment();
        let object = value.as_object_mut().expect("an object");
        object.insert("settled_at".into(), Json::Null);
        object.insert("payee".into(), Json::Null);
        object.remove("note");
        object.remove("attempts");
        let back = round_trip(&payment, &value);
        assert_eq!(back["settled_at"], Json::Null);
        assert_eq!(back["payee"], Json::Null);
        assert_eq!(back["note"], Json::Null);
        assert_eq!(back["attempts"], json!(1));
    }

    #[test]
    fn the_bytes_are_avros_binary_encoding() {
        // A record of a long, a nullable string and an enum: zigzag varints, a union's branch
        // index, the string's length, the enum's index.
        let small = schema(
            r#"{"type": "record", "name": "R", "fields": [
                {"name": "n", "type": "long"},
                {"name": "s", "type": ["null", "string"]},
                {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A", "B"]}}
            ]}"#,
        );
        let bytes = small
            .encode(&json!({"n": -2, "s": "hi", "e": "B"}))
            .expect("fits");
        assert_eq!(bytes, [0x03, 0x02, 0x04, b'h', b'i', 0x02]);
        assert_eq!(
            small.decode(&bytes).expect("decodes"),
            json!({"n": -2, "s": "hi", "e": "B"})
        );
    }

    #[test]
    fn decimals_keep_their_scale_and_are_never_rounded() {
        let price =
            schema(r#"{"type": "bytes", "logicalType": "decimal", "precision": 5, "scale": 2}"#);
        for (given, read) in [
            (json!("12.5"), "12.50"),
            (json!("12.500"), "12.50"),
            (json!(12.5), "12.50"),
            (json!(7), "7.00"),
            (json!("-0.05"), "-0.05"),
            (json!("1.2e2"), "120.00"),
            (json!("0"), "0.00"),
            (json!("999.99"), "999.99"),
        ] {
            assert_eq!(round_trip(&price, &given), json!(read), "{given}");
        }
        // 0.125 needs a third place; 1000.00 a sixth digit.
        for misfit in [
            json!("0.125"),
            json!("1000"),
            json!("12,5"),
            json!("abc"),
            json!(true),
        ] {
            let error = price.encode(&misfit).expect_err("does not fit");
            assert!(
                matches!(error, SchemaError::DoesNotFit { .. }),
                "{misfit}: {error}"
            );
        }
    }

    #[test]
    fn timestamps_dates_and_times_read_as_text_and_are_written_from_text_or_integers() {
        let at = schema(r#"{"type": "long", "logicalType": "timestamp-millis"}"#);
        assert_eq!(
            round_trip(&at, &json!(0)),
            json!("1970-01-01T00:00:00.000Z")
        );
        assert_eq!(
            round_trip(&at, &json!(-1)),
            json!("1969-12-31T23:59:59.999Z")
        );
        // Any offset is the same instant in UTC.
        assert_eq!(
            round_trip(&at, &json!("2024-05-01T14:00:00.250+02:00")),
            json!("2024-05-01T12:00:00.250Z")
        );
        assert_eq!(
            at.encode(&json!("1970-01-01T00:00:01Z")).ok(),
            at.encode(&json!(1000)).ok()
        );
        let error = at
            .encode(&json!("2024-05-01T12:00:00.0001Z"))
            .expect_err("finer than milliseconds");
        assert!(
            error.to_string().contains("finer than milliseconds"),
            "{error}"
        );

        let micros = schema(r#"{"type": "long", "logicalType": "timestamp-micros"}"#);
        assert_eq!(
            round_trip(&micros, &json!(1)),
            json!("1970-01-01T00:00:00.000001Z")
        );
        let local = schema(r#"{"type": "long", "logicalType": "local-timestamp-millis"}"#);
        assert_eq!(
            round_trip(&local, &json!("2024-05-01T12:00:00")),
            json!("2024-05-01T12:00:00.000")
        );

        let date = schema(r#"{"type": "int", "logicalType": "date"}"#);
        assert_eq!(round_trip(&date, &json!(19_844)), json!("2024-05-01"));
        assert_eq!(round_trip(&date, &json!(-1)), json!("1969-12-31"));

        let cutoff = schema(r#"{"type": "long", "logicalType": "time-micros"}"#);
        assert_eq!(
            round_trip(&cutoff, &json!("23:59:59.999999")),
            json!("23:59:59.999999")
        );
        assert!(cutoff.encode(&json!(86_400_000_000_i64)).is_err());
    }

    #[test]
    fn uuids_enums_bytes_and_durations() {
        let id = schema(r#"{"type": "string", "logicalType": "uuid"}"#);
        assert!(id.encode(&json!("not-a-uuid")).is_err());
        let state = schema(r#"{"type": "enum", "name": "S", "symbols": ["A", "B"]}"#);
        let error = state.encode(&json!("C")).expect_err("no such symbol");
        assert!(
            error.to_string().contains("not a symbol of enum S (A, B)"),
            "{error}"
        );
        let digest = schema(r#"{"type": "fixed", "name": "D", "size": 2}"#);
        assert_eq!(round_trip(&digest, &json!("AP8=")), json!("AP8="));
        assert!(
            digest.encode(&json!("AAAA")).is_err(),
            "three bytes in a fixed of two"
        );
        let wait =
            schema(r#"{"type": "fixed", "name": "W", "size": 12, "logicalType": "duration"}"#);
        assert_eq!(
            round_trip(&wait, &json!({"months": 1, "days": 2, "millis": 3})),
            json!({"months": 1, "days": 2, "millis": 3})
        );
    }

    #[test]
    fn a_value_that_does_not_fit_is_refused_with_where() {
        let payment = schema(PAYMENT);
        let mut value = a_payment();
        value["tags"][1] = json!(7);
        let error = payment
            .encode(&value)
            .expect_err("a number in a string array");
        match &error {
            SchemaError::DoesNotFit { path, .. } => assert_eq!(path, "$.tags[1]"),
            other => panic!("{other}"),
        }
        let mut value = a_payment();
        value["payer"]["nickname"] = json!("A");
        let error = payment.encode(&value).expect_err("an unknown member");
        assert!(error.to_string().contains("$.payer.nickname"), "{error}");
        let mut value = a_payment();
        value.as_object_mut().expect("object").remove("amount");
        let error = payment
            .encode(&value)
            .expect_err("a required field missing");
        assert!(error.to_string().contains("$.amount: missing"), "{error}");
        assert!(schema(r#""float""#).encode(&json!(1e300)).is_err());
        let small_int = schema(r#""int""#);
        assert!(small_int.encode(&json!(2_147_483_648_i64)).is_err());
        assert_eq!(round_trip(&small_int, &json!(100.0)), json!(100));
    }

    #[test]
    fn bytes_that_are_not_the_schemas_datum_do_not_decode() {
        let payment = schema(PAYMENT);
        let bytes = payment.encode(&a_payment()).expect("fits");
        // Cut short, and with a byte left over.
        for broken in [
            &bytes[..bytes.len() - 3],
            &[bytes.as_slice(), &[0]].concat(),
        ] {
            let error = payment.decode(broken).expect_err("broken");
            assert!(matches!(error, SchemaError::Undecodable { .. }), "{error}");
        }
    }

    #[test]
    fn content_leaves_out_fields_at_their_default_so_a_newer_schema_writes_the_same_event() {
        let v1 = AvroSchema::parse(
            r#"{"type": "record", "name": "Auth", "fields": [
                {"name": "id", "type": "string"},
                {"name": "card", "type": {"type": "record", "name": "Card", "fields": [
                    {"name": "number", "type": "string"}]}}]}"#,
            "v1",
        )
        .expect("parses");
        let v2 = AvroSchema::parse(
            r#"{"type": "record", "name": "Auth", "fields": [
                {"name": "id", "type": "string"},
                {"name": "card", "type": {"type": "record", "name": "Card", "fields": [
                    {"name": "number", "type": "string"},
                    {"name": "brand", "type": {"type": "enum", "name": "Brand",
                        "symbols": ["UNKNOWN", "VISA"]}, "default": "UNKNOWN"}]}},
                {"name": "note", "type": ["null", "string"], "default": null},
                {"name": "tries", "type": "int", "default": 0},
                {"name": "fee", "type": {"type": "bytes", "logicalType": "decimal",
                    "precision": 4, "scale": 2}, "default": "\u0000"}]}"#,
            "v2",
        )
        .expect("parses");
        let as_v1 = json!({"id": "a-1", "card": {"number": "4111"}});
        let as_v2 = json!({"id": "a-1", "card": {"number": "4111", "brand": "UNKNOWN"},
                           "note": null, "tries": 0, "fee": "0.00"});
        let read = |schema: &AvroSchema, value: &Json| {
            let bytes = schema.encode(value).expect("fits");
            schema.content(&schema.decode(&bytes).expect("decodes"))
        };
        // The decimal's default is not compared (its JSON is not the event model's): kept.
        let mut without_fee = read(&v2, &as_v2);
        assert_eq!(without_fee["fee"], json!("0.00"));
        without_fee
            .as_object_mut()
            .expect("an object")
            .remove("fee");
        assert_eq!(read(&v1, &as_v1), without_fee, "the same event");
        for changed in [
            json!({"note": "late"}),
            json!({"tries": 1}),
            json!({"card": {"number": "4111", "brand": "VISA"}}),
        ] {
            let mut value = as_v2.clone();
            for (key, field) in changed.as_object().expect("an object") {
                value[key] = field.clone();
            }
            let mut content = read(&v2, &value);
            content.as_object_mut().expect("an object").remove("fee");
            assert_ne!(read(&v1, &as_v1), content, "{changed} is a change");
        }
    }

    #[test]
    fn a_framed_record_names_its_schema_id() {
        let text = schema(r#""string""#);
        let framed = text
            .encode_framed(SchemaId(42), &json!("hi"))
            .expect("fits");
        assert_eq!(framed, b"\x00\x00\x00\x00\x2a\x04hi");
        let unframed = wire::unframe(&framed).expect("framed");
        assert_eq!(unframed.schema_id, SchemaId(42));
        assert_eq!(text.decode(unframed.payload).expect("decodes"), json!("hi"));
    }

    #[test]
    fn a_schema_that_does_not_parse_says_which() {
        let error = AvroSchema::parse(r#"{"type": "record"}"#, "id 9").expect_err("no name");
        assert!(error.to_string().starts_with("schema id 9: "), "{error}");
    }

    #[test]
    fn a_reader_schema_resolves_a_datum_written_with_an_older_or_newer_one() {
        let v1 = AvroSchema::parse(
            r#"{"type": "record", "name": "P", "fields": [
                {"name": "id", "type": "string"},
                {"name": "count", "type": "int"},
                {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}},
                {"name": "gone", "type": "string"}
            ]}"#,
            "id 1",
        )
        .expect("parses");
        // v2: count widened to a long, a new field with a default, `gone` dropped.
        let v2 = AvroSchema::parse(
            r#"{"type": "record", "name": "P", "fields": [
                {"name": "id", "type": "string"},
                {"name": "count", "type": "long"},
                {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}},
                {"name": "note", "type": ["null", "string"], "default": null}
            ]}"#,
            "id 2",
        )
        .expect("parses");
        assert!(v2.can_read(&v1).is_ok());
        let old = v1
            .encode(&json!({"id": "a", "count": 3, "price": "-1234.50", "gone": "x"}))
            .expect("fits");
        let new = v2
            .encode(&json!({"id": "a", "count": 3, "price": "-1234.50", "note": null}))
            .expect("fits");
        // Both read as v2 give the same event.
        let read_old = v2.decode_from(&v1, &old).expect("resolves");
        // -1234.50 is 3 bytes, which apache-avro 0.22's resolution alone refuses for a
        // decimal(12, 2).
        assert_eq!(
            read_old,
            json!({"id": "a", "count": 3, "price": "-1234.50", "note": null})
        );
        assert_eq!(read_old, v2.decode_from(&v2, &new).expect("same schema"));

        // v1 cannot read v2's datums: `gone` has no default.
        let reason = v1.can_read(&v2).expect_err("incompatible");
        assert!(!reason.is_empty());
        let error = v1.decode_from(&v2, &new).expect_err("does not resolve");
        assert!(
            matches!(&error, SchemaError::Undecodable { schema, .. } if schema == "id 2 read as id 1"),
            "{error}"
        );
    }
}
