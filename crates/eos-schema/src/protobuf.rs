//! Protobuf messages (the payload after the wire format's header and message-index list) to and
//! from the JSON event model, the same model the Avro path gives, so a transform does not change
//! when a topic moves from Avro to Protobuf.
//!
//! The registered `.proto` text is compiled at run time, in Rust ([`protox`], no `protoc`), and
//! messages are read and written by its descriptors ([`prost_reflect`]). The JSON of a message:
//!
//! | Protobuf | JSON |
//! | --- | --- |
//! | message | object keyed by field name (the `.proto` name, not the lowerCamel JSON name) |
//! | every integer type, int64 and uint64 too | number (not proto3 JSON's string: the event model is the Avro path's) |
//! | float, double, bool, string | number, boolean, string |
//! | bytes | base64 (standard, padded) |
//! | enum | its value's name; a number the enum does not name (an open enum's) stays a number |
//! | repeated, map | array, object (keys as text) |
//! | `google.protobuf.Timestamp` | RFC 3339 in UTC with 0, 3, 6 or 9 digits: `"2024-05-01T12:00:00.250Z"` |
//! | `google.protobuf.Duration` | proto3 JSON's seconds: `"1.500s"` |
//! | `google.protobuf.*Value` wrappers | the wrapped value |
//!
//! Every field of the message is in its object: a field without presence as its value (the
//! default when unset), a field with presence (a message, `optional`, a oneof's member) as `null`
//! when unset. Encoding takes the same forms, also a field by its JSON name, an enum by number, an
//! integer as a decimal string, and `null` or an absent member for "unset". Nothing is rounded or
//! dropped on the way in: a member the message does not have, a number beyond the field's type or
//! a name the enum does not have is [`SchemaError::DoesNotFit`], naming where.

use std::collections::HashMap;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use prost_reflect::{
    DescriptorPool, DynamicMessage, FieldDescriptor, FileDescriptor, Kind, MapKey,
    MessageDescriptor, ReflectMessage as _, Value,
};
use protox::file::{ChainFileResolver, File, FileResolver, GoogleFileResolver};
use serde_json::{Map, Number, Value as Json};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::error::SchemaError;
use crate::json_kind;
use crate::schema_id::SchemaId;
use crate::wire;

/// The name the registered text is compiled under; imports of other names are the schema's
/// references (other subjects' files, by the name the reference gives) or the well-known types
/// (`google/protobuf/timestamp.proto`), which protox carries.
const SCHEMA_FILE: &str = "registered.proto";

/// A compiled `.proto` schema, ready to decode and encode its messages. Compile it once per
/// schema id ([`crate::RegistryClient::protobuf_schema`] keeps it), not once per record.
#[derive(Debug, Clone)]
pub struct ProtobufSchema {
    file: FileDescriptor,
    label: String,
}

/// The registered text and the files it imports from other subjects, by import name.
struct RegisteredFiles(HashMap<String, File>);

impl FileResolver for RegisteredFiles {
    fn open_file(&self, name: &str) -> Result<File, protox::Error> {
        match self.0.get(name) {
            Some(file) => Ok(File::from_file_descriptor_proto(
                file.file_descriptor_proto().clone(),
            )),
            None => Err(protox::Error::file_not_found(name)),
        }
    }
}

/// A registered file's text, `.proto` source or a serialized descriptor, as the file `name`.
fn registered_file(name: &str, text: &str) -> Result<File, String> {
    match serialized_descriptor(text) {
        Some(mut descriptor) => {
            descriptor.name = Some(name.to_owned());
            Ok(File::from_file_descriptor_proto(descriptor))
        }
        None => File::from_source(name, text).map_err(|e| e.to_string()),
    }
}

/// A schema registered in its serialized form: a base64 `FileDescriptorProto`, as Confluent's
/// own serializers send it (Python's and Go's `ProtobufSerializer`) and as a registry that keeps
/// what it was given (Apicurio's Confluent-compatible API) returns it. `.proto` text always has
/// spaces, base64 never does.
fn serialized_descriptor(text: &str) -> Option<prost_types::FileDescriptorProto> {
    let text = text.trim();
    if text.is_empty() || text.contains(char::is_whitespace) {
        return None;
    }
    let bytes = BASE64.decode(text).ok()?;
    prost::Message::decode(bytes.as_slice()).ok()
}

impl ProtobufSchema {
    /// Compiles a `.proto` file's text; `label` names it in errors (`id 7`).
    pub fn parse(text: &str, label: impl Into<String>) -> Result<Self, SchemaError> {
        Self::parse_with_imports(text, label, &[])
    }

    /// Compiles a `.proto` file's text that imports `imports` (each an import name, as the
    /// schema's references give it, and that file's text; their own imports among them).
    pub fn parse_with_imports(
        text: &str,
        label: impl Into<String>,
        imports: &[(&str, &str)],
    ) -> Result<Self, SchemaError> {
        let label = label.into();
        let invalid = |detail: String| SchemaError::InvalidSchema {
            schema: label.clone(),
            detail,
        };
        let mut files = HashMap::new();
        for (name, text) in imports {
            let file = registered_file(name, text)
                .map_err(|error| invalid(format!("imported file {name}: {error}")))?;
            files.insert((*name).to_owned(), file);
        }
        files.insert(
            SCHEMA_FILE.to_owned(),
            registered_file(SCHEMA_FILE, text).map_err(invalid)?,
        );
        let mut resolver = ChainFileResolver::new();
        resolver.add(RegisteredFiles(files));
        resolver.add(GoogleFileResolver::new());
        let mut compiler = protox::Compiler::with_file_resolver(resolver);
        compiler.include_imports(true);
        compiler
            .open_file(SCHEMA_FILE)
            .map_err(|e| invalid(e.to_string()))?;
        let pool: DescriptorPool = compiler.descriptor_pool();
        let file = pool
            .get_file_by_name(SCHEMA_FILE)
            .ok_or_else(|| invalid("the compiled file is missing".into()))?;
        if file.messages().len() == 0 {
            return Err(invalid("declares no message".into()));
        }
        Ok(ProtobufSchema { file, label })
    }

    /// What errors call this schema.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The message the wire format's message indexes name: `[0]` is the file's first message,
    /// `[2, 1]` the second nested message of the third (nested in declaration order, map
    /// entries included, as Confluent's serializers count them).
    pub fn message_by_indexes(&self, indexes: &[u32]) -> Option<MessageDescriptor> {
        let (&first, rest) = indexes.split_first()?;
        let mut message = self.file.messages().nth(first as usize)?;
        for &index in rest {
            let child = message.child_messages().nth(index as usize)?;
            message = child;
        }
        Some(message)
    }

    /// The message indexes of the message with this full name (`eos.Payment`).
    pub fn indexes_of(&self, full_name: &str) -> Option<Vec<u32>> {
        fn search(messages: Vec<MessageDescriptor>, name: &str, path: &mut Vec<u32>) -> bool {
            for (index, message) in messages.into_iter().enumerate() {
                path.push(index as u32);
                if message.full_name() == name
                    || search(message.child_messages().collect(), name, path)
                {
                    return true;
                }
                path.pop();
            }
            false
        }
        let mut path = Vec::new();
        search(self.file.messages().collect(), full_name, &mut path).then_some(path)
    }

    /// The JSON value of a payload after the wire header: the message-index list, then the
    /// message. Unknown fields are an error: they mean the record was written with another
    /// schema than its id names.
    pub fn decode(&self, payload: &[u8]) -> Result<Json, SchemaError> {
        let undecodable = |detail: String| SchemaError::Undecodable {
            schema: self.label.clone(),
            detail,
        };
        let (indexes, bytes) = wire::read_message_indexes(payload)?;
        let descriptor = self
            .message_by_indexes(&indexes)
            .ok_or_else(|| undecodable(format!("no message has the indexes {indexes:?}")))?;
        let message = DynamicMessage::decode(descriptor, bytes)
            .map_err(|error| undecodable(error.to_string()))?;
        message_to_json(&message).map_err(|misfit| undecodable(misfit.to_string()))
    }

    /// [`Self::decode`]'s value, and what it says for telling one event's content from
    /// another's: the value without the fields at their default (unset, zero, empty, an enum's
    /// first value), at any depth. A field added in a newer version of the schema is at its
    /// default in what an earlier version wrote, and the wire format does not tell an unset
    /// field from one at its default either.
    pub fn decode_with_content(&self, payload: &[u8]) -> Result<(Json, Json), SchemaError> {
        let (indexes, _) = wire::read_message_indexes(payload)?;
        let value = self.decode(payload)?;
        let content = match self.message_by_indexes(&indexes) {
            Some(descriptor) => content_of(&value, &descriptor),
            None => value.clone(),
        };
        Ok((value, content))
    }

    /// The payload after the wire header (message indexes, then the message) of `value` as the
    /// file's first message, which is what a topic's schema usually holds.
    pub fn encode(&self, value: &Json) -> Result<Vec<u8>, SchemaError> {
        self.encode_as(&[0], value)
    }

    /// As [`ProtobufSchema::encode`], as the message these indexes name.
    pub fn encode_as(&self, indexes: &[u32], value: &Json) -> Result<Vec<u8>, SchemaError> {
        let descriptor =
            self.message_by_indexes(indexes)
                .ok_or_else(|| SchemaError::InvalidSchema {
                    schema: self.label.clone(),
                    detail: format!("no message has the indexes {indexes:?}"),
                })?;
        let message =
            json_to_message(value, &descriptor).map_err(|misfit| SchemaError::DoesNotFit {
                schema: self.label.clone(),
                path: misfit.path(),
                detail: misfit.detail,
            })?;
        let mut out = Vec::new();
        wire::write_message_indexes(indexes, &mut out)?;
        prost::Message::encode(&message, &mut out).map_err(|error| SchemaError::DoesNotFit {
            schema: self.label.clone(),
            path: "$".into(),
            detail: error.to_string(),
        })?;
        Ok(out)
    }

    /// `value` as the file's first message, framed with `schema_id`: a record value as every
    /// Confluent-compatible deserializer reads it.
    pub fn encode_framed(&self, schema_id: SchemaId, value: &Json) -> Result<Vec<u8>, SchemaError> {
        let mut out = Vec::new();
        wire::write_header(schema_id, &mut out);
        out.extend_from_slice(&self.encode(value)?);
        Ok(out)
    }
}

/// Where in a value a misfit is, and what it is (the same paths as the Avro path's).
#[derive(Debug)]
struct Misfit {
    detail: String,
    /// Innermost first.
    path: Vec<String>,
}

impl Misfit {
    fn new(detail: impl Into<String>) -> Self {
        Misfit {
            detail: detail.into(),
            path: Vec::new(),
        }
    }

    fn at_member(mut self, name: &str) -> Self {
        self.path.push(format!(".{name}"));
        self
    }

    fn at_index(mut self, index: usize) -> Self {
        self.path.push(format!("[{index}]"));
        self
    }

    fn path(&self) -> String {
        let mut path = String::from("$");
        for part in self.path.iter().rev() {
            path.push_str(part);
        }
        path
    }
}

impl std::fmt::Display for Misfit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "at {}: {}", self.path(), self.detail)
    }
}

/// `value` (a message of `descriptor` in the event model) without its fields at their default.
fn content_of(value: &Json, descriptor: &MessageDescriptor) -> Json {
    let Json::Object(object) = value else {
        return value.clone();
    };
    // A well-known type's JSON is not its message's fields.
    if descriptor.full_name().starts_with("google.protobuf.") {
        return value.clone();
    }
    let mut content = Map::new();
    for (name, field_value) in object {
        let Some(field) = descriptor.get_field_by_name(name) else {
            content.insert(name.clone(), field_value.clone());
            continue;
        };
        if is_default(field_value, &field) {
            continue;
        }
        let nested = match (field.kind(), field_value) {
            (Kind::Message(message), Json::Object(entries)) if field.is_map() => {
                let value_kind = message.map_entry_value_field().kind();
                Json::Object(
                    entries
                        .iter()
                        .map(|(key, item)| (key.clone(), content_of_kind(item, &value_kind)))
                        .collect(),
                )
            }
            (kind, Json::Array(items)) if field.is_list() => Json::Array(
                items
                    .iter()
                    .map(|item| content_of_kind(item, &kind))
                    .collect(),
            ),
            (kind, single) => content_of_kind(single, &kind),
        };
        content.insert(name.clone(), nested);
    }
    Json::Object(content)
}

fn content_of_kind(value: &Json, kind: &Kind) -> Json {
    match kind {
        Kind::Message(message) => content_of(value, message),
        _ => value.clone(),
    }
}

/// Whether `value` is what the event model writes for `field` unset or at its default.
fn is_default(value: &Json, field: &FieldDescriptor) -> bool {
    if field.is_list() {
        return value.as_array().is_some_and(Vec::is_empty);
    }
    if field.is_map() {
        return value.as_object().is_some_and(Map::is_empty);
    }
    if value.is_null() {
        return true;
    }
    if field.supports_presence() {
        // Set, even to a zero: presence is part of what it says.
        return false;
    }
    match field.kind() {
        Kind::Bool => value == &Json::Bool(false),
        Kind::String | Kind::Bytes => value.as_str() == Some(""),
        Kind::Float | Kind::Double => value.as_f64() == Some(0.0),
        Kind::Enum(enumeration) => {
            let first = enumeration.default_value();
            value.as_str() == Some(first.name())
                || value.as_i64() == Some(i64::from(first.number()))
        }
        Kind::Message(_) => false,
        _ => value.as_i64() == Some(0) || value.as_u64() == Some(0),
    }
}

fn message_to_json(message: &DynamicMessage) -> Result<Json, Misfit> {
    let descriptor = message.descriptor();
    if let Some(json) = well_known_to_json(message, &descriptor)? {
        return Ok(json);
    }
    if let Some(unknown) = message.unknown_fields().next() {
        return Err(Misfit::new(format!(
            "field number {} is not in message {}",
            unknown.number(),
            descriptor.full_name()
        )));
    }
    let mut object = Map::new();
    for field in descriptor.fields() {
        let json = if field.supports_presence() && !message.has_field(&field) {
            Json::Null
        } else {
            field_to_json(&message.get_field(&field), &field)
                .map_err(|m| m.at_member(field.name()))?
        };
        object.insert(field.name().to_owned(), json);
    }
    Ok(Json::Object(object))
}

fn field_to_json(value: &Value, field: &FieldDescriptor) -> Result<Json, Misfit> {
    match value {
        Value::List(items) => Ok(Json::Array(
            items
                .iter()
                .enumerate()
                .map(|(i, item)| single_to_json(item, &field.kind()).map_err(|m| m.at_index(i)))
                .collect::<Result<_, _>>()?,
        )),
        Value::Map(entries) => {
            let Kind::Message(entry) = field.kind() else {
                return Err(Misfit::new("a map whose field is not a map entry"));
            };
            let value_kind = entry.map_entry_value_field().kind();
            let mut keyed: Vec<(String, &Value)> =
                entries.iter().map(|(k, v)| (map_key_text(k), v)).collect();
            // A map's order on the wire is arbitrary; sorted keys make one value one JSON.
            keyed.sort_by(|a, b| a.0.cmp(&b.0));
            let mut object = Map::new();
            for (key, item) in keyed {
                let json = single_to_json(item, &value_kind).map_err(|m| m.at_member(&key))?;
                object.insert(key, json);
            }
            Ok(Json::Object(object))
        }
        single => single_to_json(single, &field.kind()),
    }
}

fn map_key_text(key: &MapKey) -> String {
    match key {
        MapKey::Bool(b) => b.to_string(),
        MapKey::I32(n) => n.to_string(),
        MapKey::I64(n) => n.to_string(),
        MapKey::U32(n) => n.to_string(),
        MapKey::U64(n) => n.to_string(),
        MapKey::String(s) => s.clone(),
    }
}

fn single_to_json(value: &Value, kind: &Kind) -> Result<Json, Misfit> {
    Ok(match value {
        Value::Bool(b) => Json::Bool(*b),
        Value::I32(n) => Json::from(*n),
        Value::I64(n) => Json::from(*n),
        Value::U32(n) => Json::from(*n),
        Value::U64(n) => Json::from(*n),
        Value::F32(x) => finite(f64::from(*x))?,
        Value::F64(x) => finite(*x)?,
        Value::String(text) => Json::String(text.clone()),
        Value::Bytes(bytes) => Json::String(BASE64.encode(bytes)),
        Value::EnumNumber(number) => match kind {
            Kind::Enum(enumeration) => enumeration.get_value(*number).map_or_else(
                || Json::from(*number),
                |v| Json::String(v.name().to_owned()),
            ),
            _ => Json::from(*number),
        },
        Value::Message(message) => message_to_json(message)?,
        Value::List(_) | Value::Map(_) => {
            return Err(Misfit::new("a list or map inside a list or map"));
        }
    })
}

fn finite(x: f64) -> Result<Json, Misfit> {
    Number::from_f64(x)
        .map(Json::Number)
        .ok_or_else(|| Misfit::new(format!("{x} has no JSON number")))
}

/// The well-known types whose JSON is a scalar rather than an object.
fn well_known_to_json(
    message: &DynamicMessage,
    descriptor: &MessageDescriptor,
) -> Result<Option<Json>, Misfit> {
    let field = |name: &str| {
        message
            .get_field_by_name(name)
            .map(|v| v.into_owned())
            .ok_or_else(|| Misfit::new(format!("{} has no field {name}", descriptor.full_name())))
    };
    Ok(Some(match descriptor.full_name() {
        "google.protobuf.Timestamp" => {
            let (Value::I64(seconds), Value::I32(nanos)) = (field("seconds")?, field("nanos")?)
            else {
                return Err(Misfit::new("a Timestamp whose fields are not int64, int32"));
            };
            Json::String(timestamp_text(seconds, nanos)?)
        }
        "google.protobuf.Duration" => {
            let (Value::I64(seconds), Value::I32(nanos)) = (field("seconds")?, field("nanos")?)
            else {
                return Err(Misfit::new("a Duration whose fields are not int64, int32"));
            };
            Json::String(duration_text(seconds, nanos))
        }
        "google.protobuf.DoubleValue"
        | "google.protobuf.FloatValue"
        | "google.protobuf.Int64Value"
        | "google.protobuf.UInt64Value"
        | "google.protobuf.Int32Value"
        | "google.protobuf.UInt32Value"
        | "google.protobuf.BoolValue"
        | "google.protobuf.StringValue"
        | "google.protobuf.BytesValue" => {
            let inner = descriptor
                .get_field_by_name("value")
                .ok_or_else(|| Misfit::new("a wrapper without its value field"))?;
            single_to_json(&message.get_field(&inner), &inner.kind())?
        }
        _ => return Ok(None),
    }))
}

/// RFC 3339 in UTC with as many fraction digits as needed of 0, 3, 6, 9, as proto3 JSON writes.
fn timestamp_text(seconds: i64, nanos: i32) -> Result<String, Misfit> {
    let at = OffsetDateTime::from_unix_timestamp_nanos(
        i128::from(seconds) * 1_000_000_000 + i128::from(nanos),
    )
    .map_err(|error| Misfit::new(format!("a Timestamp beyond the calendar: {error}")))?;
    let whole = at
        .replace_nanosecond(0)
        .map_err(|error| Misfit::new(error.to_string()))?
        .format(&Rfc3339)
        .map_err(|error| Misfit::new(error.to_string()))?;
    let whole = whole.trim_end_matches('Z');
    Ok(format!("{whole}{}Z", fraction_text(at.nanosecond())))
}

/// `""`, `".250"`, `".250000"` or `".250000001"`: the fewest of 0, 3, 6, 9 digits that hold it.
fn fraction_text(nanos: u32) -> String {
    if nanos == 0 {
        String::new()
    } else if nanos.is_multiple_of(1_000_000) {
        format!(".{:03}", nanos / 1_000_000)
    } else if nanos.is_multiple_of(1_000) {
        format!(".{:06}", nanos / 1_000)
    } else {
        format!(".{nanos:09}")
    }
}

fn duration_text(seconds: i64, nanos: i32) -> String {
    let sign = if seconds < 0 || nanos < 0 { "-" } else { "" };
    format!(
        "{sign}{}{}s",
        seconds.unsigned_abs(),
        fraction_text(nanos.unsigned_abs())
    )
}

fn json_to_message(json: &Json, descriptor: &MessageDescriptor) -> Result<DynamicMessage, Misfit> {
    if let Some(message) = well_known_from_json(json, descriptor)? {
        return Ok(message);
    }
    let object = json.as_object().ok_or_else(|| {
        Misfit::new(format!(
            "{} is not message {}",
            json_kind(json),
            descriptor.full_name()
        ))
    })?;
    let mut message = DynamicMessage::new(descriptor.clone());
    let mut oneofs_set: HashMap<String, String> = HashMap::new();
    for (name, member) in object {
        let field = descriptor
            .get_field_by_name(name)
            .or_else(|| descriptor.get_field_by_json_name(name))
            .ok_or_else(|| {
                Misfit::new(format!(
                    "message {} has no field {name:?}",
                    descriptor.full_name()
                ))
                .at_member(name)
            })?;
        if member.is_null() {
            continue;
        }
        if let Some(oneof) = field.containing_oneof()
            && let Some(earlier) = oneofs_set.insert(oneof.full_name().to_owned(), name.to_owned())
        {
            // Setting the second would silently clear the first: refuse rather than drop.
            return Err(Misfit::new(format!(
                "{earlier:?} and {name:?} are both of oneof {}",
                oneof.name()
            ))
            .at_member(name));
        }
        let value = field_from_json(member, &field).map_err(|m| m.at_member(name))?;
        message
            .try_set_field(&field, value)
            .map_err(|error| Misfit::new(error.to_string()).at_member(name))?;
    }
    Ok(message)
}

fn field_from_json(json: &Json, field: &FieldDescriptor) -> Result<Value, Misfit> {
    if field.is_map() {
        let Kind::Message(entry) = field.kind() else {
            return Err(Misfit::new("a map whose field is not a map entry"));
        };
        let key_kind = entry.map_entry_key_field().kind();
        let value_kind = entry.map_entry_value_field().kind();
        let object = json
            .as_object()
            .ok_or_else(|| Misfit::new(format!("{} is not a map", json_kind(json))))?;
        let mut map = HashMap::with_capacity(object.len());
        for (key, item) in object {
            let value = single_from_json(item, &value_kind).map_err(|m| m.at_member(key))?;
            map.insert(
                map_key(key, &key_kind).map_err(|m| m.at_member(key))?,
                value,
            );
        }
        return Ok(Value::Map(map));
    }
    if field.is_list() {
        let items = json
            .as_array()
            .ok_or_else(|| Misfit::new(format!("{} is not an array", json_kind(json))))?;
        return Ok(Value::List(
            items
                .iter()
                .enumerate()
                .map(|(i, item)| single_from_json(item, &field.kind()).map_err(|m| m.at_index(i)))
                .collect::<Result<_, _>>()?,
        ));
    }
    single_from_json(json, &field.kind())
}

fn map_key(key: &str, kind: &Kind) -> Result<MapKey, Misfit> {
    let bad = || Misfit::new(format!("map key {key:?} is not {kind:?}").to_lowercase());
    Ok(match kind {
        Kind::String => MapKey::String(key.to_owned()),
        Kind::Bool => MapKey::Bool(key.parse().map_err(|_| bad())?),
        Kind::Int32 | Kind::Sint32 | Kind::Sfixed32 => MapKey::I32(key.parse().map_err(|_| bad())?),
        Kind::Int64 | Kind::Sint64 | Kind::Sfixed64 => MapKey::I64(key.parse().map_err(|_| bad())?),
        Kind::Uint32 | Kind::Fixed32 => MapKey::U32(key.parse().map_err(|_| bad())?),
        Kind::Uint64 | Kind::Fixed64 => MapKey::U64(key.parse().map_err(|_| bad())?),
        _ => return Err(bad()),
    })
}

/// An integer of type `T` from a number (`100.0` is 100) or a decimal string (proto3 JSON's
/// form of a 64-bit integer).
fn integer<T: TryFrom<i128>>(json: &Json, what: &str) -> Result<T, Misfit> {
    let whole: Option<i128> = match json {
        Json::Number(n) => n
            .as_i64()
            .map(i128::from)
            .or_else(|| n.as_u64().map(i128::from))
            .or_else(|| {
                n.as_f64()
                    .filter(|x| x.fract() == 0.0 && x.abs() < 9.007_199_254_740_992e15)
                    .map(|x| x as i128)
            }),
        Json::String(text) => text.trim().parse::<i128>().ok(),
        _ => None,
    };
    whole
        .and_then(|n| T::try_from(n).ok())
        .ok_or_else(|| Misfit::new(format!("{json} is not {what}")))
}

fn single_from_json(json: &Json, kind: &Kind) -> Result<Value, Misfit> {
    let expected = |what: &str| Misfit::new(format!("{} is not {what}", json_kind(json)));
    Ok(match kind {
        Kind::Double => Value::F64(json.as_f64().ok_or_else(|| expected("a double"))?),
        Kind::Float => {
            // The nearest f32, as every Protobuf writer does; beyond f32 would be infinity.
            let nearest = json.as_f64().ok_or_else(|| expected("a float"))? as f32;
            if !nearest.is_finite() {
                return Err(Misfit::new(format!("{json} is beyond a float")));
            }
            Value::F32(nearest)
        }
        Kind::Int32 | Kind::Sint32 | Kind::Sfixed32 => Value::I32(integer(json, "an int32")?),
        Kind::Int64 | Kind::Sint64 | Kind::Sfixed64 => Value::I64(integer(json, "an int64")?),
        Kind::Uint32 | Kind::Fixed32 => Value::U32(integer(json, "a uint32")?),
        Kind::Uint64 | Kind::Fixed64 => Value::U64(integer(json, "a uint64")?),
        Kind::Bool => Value::Bool(json.as_bool().ok_or_else(|| expected("a bool"))?),
        Kind::String => Value::String(json.as_str().ok_or_else(|| expected("a string"))?.into()),
        Kind::Bytes => {
            let text = json.as_str().ok_or_else(|| expected("base64 bytes"))?;
            Value::Bytes(
                BASE64
                    .decode(text)
                    .map_err(|error| Misfit::new(format!("not base64: {error}")))?
                    .into(),
            )
        }
        Kind::Enum(enumeration) => {
            let value = match json {
                Json::String(name) => enumeration.get_value_by_name(name),
                Json::Number(_) => enumeration.get_value(integer(json, "an enum number")?),
                _ => None,
            };
            let names: Vec<String> = enumeration.values().map(|v| v.name().to_owned()).collect();
            let value = value.ok_or_else(|| {
                Misfit::new(format!(
                    "{json} is not a value of enum {} ({})",
                    enumeration.name(),
                    names.join(", ")
                ))
            })?;
            Value::EnumNumber(value.number())
        }
        Kind::Message(descriptor) => Value::Message(json_to_message(json, descriptor)?),
    })
}

fn well_known_from_json(
    json: &Json,
    descriptor: &MessageDescriptor,
) -> Result<Option<DynamicMessage>, Misfit> {
    let mut message = DynamicMessage::new(descriptor.clone());
    let mut set = |name: &str, value: Value| {
        message
            .try_set_field_by_name(name, value)
            .map_err(|error| Misfit::new(error.to_string()))
    };
    match descriptor.full_name() {
        "google.protobuf.Timestamp" => {
            let text = json
                .as_str()
                .ok_or_else(|| Misfit::new(format!("{} is not a timestamp", json_kind(json))))?;
            let at = OffsetDateTime::parse(text, &Rfc3339)
                .map_err(|error| Misfit::new(format!("{text:?} is not RFC 3339: {error}")))?;
            set("seconds", Value::I64(at.unix_timestamp()))?;
            // nanosecond() is below 10^9, an i32.
            set("nanos", Value::I32(at.nanosecond() as i32))?;
        }
        "google.protobuf.Duration" => {
            let (seconds, nanos) = duration_value(json)?;
            set("seconds", Value::I64(seconds))?;
            set("nanos", Value::I32(nanos))?;
        }
        "google.protobuf.DoubleValue"
        | "google.protobuf.FloatValue"
        | "google.protobuf.Int64Value"
        | "google.protobuf.UInt64Value"
        | "google.protobuf.Int32Value"
        | "google.protobuf.UInt32Value"
        | "google.protobuf.BoolValue"
        | "google.protobuf.StringValue"
        | "google.protobuf.BytesValue" => {
            let inner = descriptor
                .get_field_by_name("value")
                .ok_or_else(|| Misfit::new("a wrapper without its value field"))?;
            set("value", single_from_json(json, &inner.kind())?)?;
        }
        _ => return Ok(None),
    }
    Ok(Some(message))
}

/// `"1.5s"`, `"-0.001s"`: seconds with at most 9 fraction digits.
fn duration_value(json: &Json) -> Result<(i64, i32), Misfit> {
    let text = json
        .as_str()
        .ok_or_else(|| Misfit::new(format!("{} is not a duration", json_kind(json))))?;
    let bad = || Misfit::new(format!("{text:?} is not a duration such as \"1.5s\""));
    let number = text.strip_suffix('s').ok_or_else(bad)?;
    let (negative, unsigned) = match number.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, number),
    };
    let (whole, fraction) = unsigned.split_once('.').unwrap_or((unsigned, ""));
    if whole.is_empty()
        || fraction.len() > 9
        || !whole
            .bytes()
            .chain(fraction.bytes())
            .all(|b| b.is_ascii_digit())
    {
        return Err(bad());
    }
    let seconds: i64 = whole.parse().map_err(|_| bad())?;
    let nanos: i32 = format!("{fraction:0<9}").parse().map_err(|_| bad())?;
    Ok(if negative {
        (-seconds, -nanos)
    } else {
        (seconds, nanos)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const PAYMENT: &str = r#"
        syntax = "proto3";
        package eos.test;
        import "google/protobuf/timestamp.proto";
        import "google/protobuf/wrappers.proto";

        message Payment {
          enum State { PENDING = 0; SETTLED = 1; }
          message Party { string name = 1; }
          string id = 1;
          int64 amount_cents = 2;
          State state = 3;
          bytes digest = 4;
          google.protobuf.Timestamp at = 5;
          repeated string tags = 6;
          map<string, int32> counts = 7;
          Party payer = 8;
          optional string note = 9;
          google.protobuf.Int64Value retries = 10;
          double rate = 11;
          uint64 sequence = 12;
        }

        message Refund { string payment_id = 1; }
    "#;

    fn schema() -> ProtobufSchema {
        ProtobufSchema::parse(PAYMENT, "test").expect("the schema compiles")
    }

    fn a_payment() -> Json {
        json!({
            "id": "p-1",
            "amount_cents": 9_007_199_254_740_993_i64,
            "state": "SETTLED",
            "digest": "AP8=",
            "at": "2024-05-01T12:00:00.250Z",
            "tags": ["a", "b"],
            "counts": {"x": 1, "y": 2},
            "payer": {"name": "Ann"},
            "note": "first",
            "retries": 3,
            "rate": 0.5,
            "sequence": 18_446_744_073_709_551_615_u64,
        })
    }

    #[test]
    fn a_message_round_trips_through_the_event_model() {
        let payment = schema();
        let bytes = payment.encode(&a_payment()).expect("fits");
        assert_eq!(bytes[0], 0, "the first message's index list is a lone zero");
        assert_eq!(payment.decode(&bytes).expect("decodes"), a_payment());
    }

    #[test]
    fn a_schema_registered_as_a_serialized_descriptor_reads_as_its_text_does() {
        let from_text = schema();
        let descriptor = prost::Message::encode_to_vec(from_text.file.file_descriptor_proto());
        let from_descriptor = ProtobufSchema::parse(&BASE64.encode(descriptor), "serialized")
            .expect("a base64 FileDescriptorProto compiles, with its well-known imports");
        let bytes = from_text.encode(&a_payment()).expect("fits");
        assert_eq!(
            from_descriptor.decode(&bytes).expect("decodes"),
            a_payment()
        );
        assert_eq!(from_descriptor.indexes_of("eos.test.Refund"), Some(vec![1]));
        assert!(
            ProtobufSchema::parse("bm90IGEgZGVzY3JpcHRvcg", "x").is_err(),
            "base64 that is no descriptor is refused"
        );
    }

    #[test]
    fn content_leaves_out_fields_at_their_default_so_a_newer_version_writes_the_same_event() {
        let v1 = schema();
        let v2 = ProtobufSchema::parse(
            &PAYMENT
                .replace(
                    "uint64 sequence = 12;",
                    "uint64 sequence = 12; string channel = 13; repeated Party others = 14;",
                )
                .replace(
                    "message Party { string name = 1; }",
                    "message Party { string name = 1; int32 age = 2; }",
                ),
            "v2",
        )
        .expect("compiles");
        let read = |schema: &ProtobufSchema, value: &Json| {
            let bytes = schema.encode(value).expect("fits");
            schema.decode_with_content(&bytes).expect("decodes").1
        };
        let as_v1 = read(&v1, &a_payment());
        let mut same = a_payment();
        same["channel"] = json!("");
        same["others"] = json!([]);
        same["payer"] = json!({"name": "Ann", "age": 0});
        assert_eq!(read(&v2, &same), as_v1, "the new fields at their default");
        assert_eq!(as_v1["payer"], json!({"name": "Ann"}));
        assert!(
            as_v1.get("state").is_some(),
            "SETTLED is not the enum's default"
        );
        for (field, changed) in [
            ("channel", json!("web")),
            ("others", json!([{"name": "Bo"}])),
            ("payer", json!({"name": "Ann", "age": 40})),
        ] {
            let mut value = same.clone();
            value[field] = changed.clone();
            assert_ne!(read(&v2, &value), as_v1, "{field} = {changed} is a change");
        }
        // Set to its zero, a field with presence is still said.
        let mut noted = a_payment();
        noted["note"] = json!("");
        assert_eq!(read(&v1, &noted)["note"], json!(""));
    }

    #[test]
    fn unset_fields_read_as_defaults_or_null_by_presence() {
        let payment = schema();
        let bytes = payment.encode(&json!({"id": "p-2"})).expect("fits");
        assert_eq!(
            payment.decode(&bytes).expect("decodes"),
            json!({
                "id": "p-2", "amount_cents": 0, "state": "PENDING", "digest": "",
                "at": null, "tags": [], "counts": {}, "payer": null, "note": null,
                "retries": null, "rate": 0.0, "sequence": 0,
            })
        );
    }

    #[test]
    fn integers_enums_and_timestamps_are_taken_in_their_other_forms() {
        let payment = schema();
        let given = json!({
            "amountCents": "-5", "state": 1, "at": "2024-05-01T14:00:00+02:00", "rate": 2,
        });
        let back = payment
            .decode(&payment.encode(&given).expect("fits"))
            .expect("decodes");
        assert_eq!(back["amount_cents"], json!(-5));
        assert_eq!(back["state"], json!("SETTLED"));
        assert_eq!(back["at"], json!("2024-05-01T12:00:00Z"));
        assert_eq!(back["rate"], json!(2.0));
    }

    #[test]
    fn the_second_message_is_named_by_its_index() {
        let payment = schema();
        assert_eq!(payment.indexes_of("eos.test.Refund"), Some(vec![1]));
        assert_eq!(
            payment.indexes_of("eos.test.Payment.Party"),
            Some(vec![0, 0])
        );
        let bytes = payment
            .encode_as(&[1], &json!({"payment_id": "p-1"}))
            .expect("fits");
        assert_eq!(&bytes[..2], [0x02, 0x02], "count 1, index 1");
        assert_eq!(
            payment.decode(&bytes).expect("decodes"),
            json!({"payment_id": "p-1"})
        );
        let framed = payment
            .encode_framed(SchemaId(7), &json!({"id": "p"}))
            .expect("fits");
        let unframed = wire::unframe(&framed).expect("framed");
        assert_eq!(unframed.schema_id, SchemaId(7));
        assert_eq!(
            payment.decode(unframed.payload).expect("decodes")["id"],
            "p"
        );
    }

    #[test]
    fn a_value_that_does_not_fit_is_refused_with_where() {
        let payment = schema();
        for (change, path, detail) in [
            (
                json!({"tags": ["a", 7]}),
                "$.tags[1]",
                "a number is not a string",
            ),
            (
                json!({"payer": {"nick": "A"}}),
                "$.payer.nick",
                "has no field",
            ),
            (
                json!({"state": "LOST"}),
                "$.state",
                "not a value of enum State",
            ),
            (
                json!({"counts": {"x": 1.5}}),
                "$.counts.x",
                "is not an int32",
            ),
            (
                json!({"amount_cents": 1e30}),
                "$.amount_cents",
                "is not an int64",
            ),
            (json!({"sequence": -1}), "$.sequence", "is not a uint64"),
            (json!({"at": "yesterday"}), "$.at", "not RFC 3339"),
            (json!({"digest": "!!"}), "$.digest", "not base64"),
        ] {
            let error = payment.encode(&change).expect_err("does not fit");
            match &error {
                SchemaError::DoesNotFit {
                    path: at,
                    detail: why,
                    ..
                } => {
                    assert_eq!(at, path, "{change}: {error}");
                    assert!(why.contains(detail), "{change}: {error}");
                }
                other => panic!("{change}: {other}"),
            }
        }
    }

    #[test]
    fn bytes_that_are_not_the_schemas_message_do_not_decode() {
        let payment = schema();
        let bytes = payment.encode(&a_payment()).expect("fits");
        // Cut short; a field number the schema does not have (field 99, varint 1); indexes of
        // no message.
        let mut unknown_field = payment.encode(&json!({"id": "p"})).expect("fits");
        unknown_field.extend_from_slice(&[0x98, 0x06, 0x01]);
        for broken in [
            &bytes[..bytes.len() - 3],
            &unknown_field[..],
            &[0x02, 0x0a][..],
        ] {
            let error = payment.decode(broken).expect_err("broken");
            assert!(
                matches!(
                    error,
                    SchemaError::Undecodable { .. } | SchemaError::WireFormat(_)
                ),
                "{error}"
            );
        }
    }

    #[test]
    fn a_schema_that_does_not_compile_says_which() {
        let error =
            ProtobufSchema::parse("syntax = \"proto3\"; message {", "id 9").expect_err("broken");
        assert!(error.to_string().starts_with("schema id 9: "), "{error}");
        let error = ProtobufSchema::parse("syntax = \"proto3\";", "id 9").expect_err("empty");
        assert!(error.to_string().contains("no message"), "{error}");
    }

    #[test]
    fn timestamps_take_the_fewest_digits_and_durations_read_as_seconds() {
        assert_eq!(
            timestamp_text(0, 0).ok(),
            Some("1970-01-01T00:00:00Z".into())
        );
        assert_eq!(
            timestamp_text(-1, 1_000).ok(),
            Some("1969-12-31T23:59:59.000001Z".into())
        );
        assert_eq!(duration_text(1, 500_000_000), "1.500s");
        assert_eq!(duration_text(0, -1), "-0.000000001s");
        assert_eq!(
            duration_value(&json!("-1.5s")).ok(),
            Some((-1, -500_000_000))
        );
        assert!(duration_value(&json!("1.5")).is_err());
    }
}
