//! An Avro schema that references other subjects' named types (the registry's `references`, as
//! Confluent's serializers register a record whose field is a type kept under its own subject),
//! made whole: each referenced type's definition is written in where the schema first uses its
//! name, so the text parses on its own and every path that reads or writes Avro (decoding,
//! encoding, a reader's resolution) sees one self-contained schema (docs/schemas.md "Schemas
//! that reference others").

use std::collections::{HashMap, HashSet};

use serde_json::{Map, Value as Json};

/// The names Avro gives its primitive types: never a reference.
const PRIMITIVES: [&str; 8] = [
    "null", "boolean", "int", "long", "float", "double", "bytes", "string",
];

/// `text` with the named types of `referenced` (each a referenced subject's schema text, the
/// references' own references among them) defined at their first use. A referenced text that
/// is not JSON or defines no named type is an error naming it.
pub(crate) fn inline_references(text: &str, referenced: &[&str]) -> Result<String, String> {
    let mut definitions = HashMap::new();
    for (index, text) in referenced.iter().enumerate() {
        let schema: Json = serde_json::from_str(text)
            .map_err(|error| format!("referenced schema {} is not JSON: {error}", index + 1))?;
        let full_name = defined_name(&schema, "").ok_or_else(|| {
            format!(
                "referenced schema {} defines no record, enum or fixed",
                index + 1
            )
        })?;
        definitions.insert(full_name.clone(), qualified(schema, &full_name));
    }
    let mut schema: Json =
        serde_json::from_str(text).map_err(|error| format!("the schema is not JSON: {error}"))?;
    let mut inliner = Inliner {
        definitions,
        defined: HashSet::new(),
    };
    inliner.walk(&mut schema, "");
    Ok(schema.to_string())
}

struct Inliner {
    /// Each referenced type's definition, by full name, its name written in full.
    definitions: HashMap<String, Json>,
    /// The full names defined so far, in Avro's parse order: a later use is by name.
    defined: HashSet<String>,
}

impl Inliner {
    /// Walks the schema at `schema` in the order Avro parses it, within `namespace`.
    fn walk(&mut self, schema: &mut Json, namespace: &str) {
        match schema {
            Json::String(name) => {
                if PRIMITIVES.contains(&name.as_str()) {
                    return;
                }
                let full = full_name(name, namespace);
                if self.defined.contains(&full) {
                    return;
                }
                if let Some(definition) = self.definitions.get(&full) {
                    *schema = definition.clone();
                    self.walk(schema, namespace);
                }
            }
            Json::Array(union) => {
                for branch in union {
                    self.walk(branch, namespace);
                }
            }
            Json::Object(object) => self.walk_object(object, namespace),
            _ => {}
        }
    }

    fn walk_object(&mut self, object: &mut Map<String, Json>, namespace: &str) {
        let kind = object
            .get("type")
            .and_then(Json::as_str)
            .unwrap_or_default();
        match kind {
            "record" | "error" | "enum" | "fixed" => {
                let Some(full) = defined_name(&Json::Object(object.clone()), namespace) else {
                    return;
                };
                self.defined.insert(full.clone());
                let inner = full.rsplit_once('.').map_or("", |(space, _)| space);
                let inner = inner.to_owned();
                if let Some(Json::Array(fields)) = object.get_mut("fields") {
                    for field in fields {
                        if let Some(field_type) = field.get_mut("type") {
                            self.walk(field_type, &inner);
                        }
                    }
                }
            }
            "array" => {
                if let Some(items) = object.get_mut("items") {
                    self.walk(items, namespace);
                }
            }
            "map" => {
                if let Some(values) = object.get_mut("values") {
                    self.walk(values, namespace);
                }
            }
            // `{"type": "com.example.Money"}`, or a primitive with a logical type.
            _ => {
                if let Some(inner) = object.get_mut("type") {
                    self.walk(inner, namespace);
                }
            }
        }
    }
}

/// The full name a record, enum or fixed at `schema` defines, within `namespace`.
fn defined_name(schema: &Json, namespace: &str) -> Option<String> {
    let object = schema.as_object()?;
    let kind = object.get("type")?.as_str()?;
    if !matches!(kind, "record" | "error" | "enum" | "fixed") {
        return None;
    }
    let name = object.get("name")?.as_str()?;
    if name.contains('.') {
        return Some(name.to_owned());
    }
    let space = match object.get("namespace") {
        Some(Json::String(space)) => space.as_str(),
        Some(Json::Null) => "",
        _ => namespace,
    };
    Some(full_name(name, space))
}

/// `name` in `namespace`, unless it is already full.
fn full_name(name: &str, namespace: &str) -> String {
    if name.contains('.') || namespace.is_empty() {
        name.to_owned()
    } else {
        format!("{namespace}.{name}")
    }
}

/// `schema` with its name written in full, so that it keeps `full_name` inside a record of
/// another namespace. A type of the null namespace cannot be: apache-avro reads an empty
/// `namespace` as none, so such a type first used inside a namespaced record takes that
/// namespace, and the schema then fails to parse, naming the type, rather than read wrong.
fn qualified(mut schema: Json, full_name: &str) -> Json {
    if let (Some(object), Some((space, name))) =
        (schema.as_object_mut(), full_name.rsplit_once('.'))
    {
        object.insert("name".into(), Json::String(name.to_owned()));
        object.insert("namespace".into(), Json::String(space.to_owned()));
    }
    schema
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::AvroSchema;

    const MONEY: &str = r#"{"type": "record", "name": "Money", "namespace": "com.example.common",
        "fields": [{"name": "cents", "type": "long"},
                   {"name": "currency", "type": {"type": "enum", "name": "Currency",
                                                 "symbols": ["EUR", "USD"]}}]}"#;
    const PAYMENT: &str = r#"{"type": "record", "name": "Payment", "namespace": "com.example",
        "fields": [{"name": "id", "type": "string"},
                   {"name": "amount", "type": "com.example.common.Money"},
                   {"name": "fee", "type": ["null", "com.example.common.Money"], "default": null},
                   {"name": "currencies", "type": {"type": "array",
                                                    "items": "com.example.common.Currency"}}]}"#;

    #[test]
    fn a_referenced_type_is_defined_at_its_first_use_and_named_after_it() {
        let whole = inline_references(PAYMENT, &[MONEY]).expect("inlines");
        let schema = AvroSchema::parse(&whole, "whole").expect("parses on its own");
        let payment = json!({"id": "p-1", "amount": {"cents": 1250, "currency": "EUR"},
                             "fee": {"cents": 5, "currency": "USD"}, "currencies": ["USD"]});
        let encoded = schema.encode(&payment).expect("fits");
        assert_eq!(schema.decode(&encoded).expect("decodes"), payment);
        // Without the reference the text does not parse: the name is unknown.
        assert!(AvroSchema::parse(PAYMENT, "alone").is_err());
    }

    #[test]
    fn references_of_references_are_defined_inside_the_type_that_uses_them() {
        let cents = r#"{"type": "fixed", "name": "Cents", "namespace": "com.example.units",
            "size": 8}"#;
        let money = r#"{"type": "record", "name": "Money", "namespace": "com.example.common",
            "fields": [{"name": "cents", "type": "com.example.units.Cents"}]}"#;
        // The null namespace: Payment's own names are not Money's.
        let payment = r#"{"type": "record", "name": "Payment",
            "fields": [{"name": "amount", "type": "com.example.common.Money"},
                       {"name": "refund", "type": "com.example.common.Money"}]}"#;
        for order in [[money, cents], [cents, money]] {
            let whole = inline_references(payment, &order).expect("inlines");
            let parsed: Json = serde_json::from_str(&whole).expect("JSON");
            let amount = &parsed["fields"][0]["type"];
            assert_eq!(amount["name"], "Money", "{whole}");
            assert_eq!(amount["fields"][0]["type"]["name"], "Cents", "{whole}");
            assert_eq!(
                parsed["fields"][1]["type"], "com.example.common.Money",
                "{whole}"
            );
            let schema = AvroSchema::parse(&whole, "whole").expect("parses on its own");
            let value = json!({"amount": {"cents": "AAAAAAAAAAE="},
                               "refund": {"cents": "AAAAAAAAAAI="}});
            let encoded = schema.encode(&value).expect("fits");
            assert_eq!(schema.decode(&encoded).expect("decodes"), value);
        }
    }

    #[test]
    fn a_referenced_text_that_defines_no_name_is_refused() {
        let refused = inline_references(PAYMENT, &[r#""string""#]).expect_err("refused");
        assert!(refused.contains("referenced schema 1"), "{refused}");
    }
}
