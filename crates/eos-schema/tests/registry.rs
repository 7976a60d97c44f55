//! eos-schema against the real registry of the local stack (Apicurio Registry's
//! Confluent-compatible API, deploy/local/README.md): registering, looking up and reading back
//! schemas, and the ids a Confluent client would see. `make test` passes the registry's URL in
//! EOS_SCHEMA_REGISTRY_URL; each test works on subjects of its own.

use std::time::{SystemTime, UNIX_EPOCH};

use eos_schema::{
    AvroSchema, ProtobufSchema, RegistryClient, RegistryConfig, Schema, SchemaError, SchemaId,
    SchemaReference, SchemaType, wire,
};
use serde_json::json;

fn registry_client() -> RegistryClient {
    let url = std::env::var("EOS_SCHEMA_REGISTRY_URL").unwrap_or_else(|_| {
        panic!(
            "EOS_SCHEMA_REGISTRY_URL is not set: it is the schema registry these tests talk to. \
             Start the local stack and export its URLs (set -a; eval \"$(deploy/local/stack up)\"; \
             set +a), or run `make test`, which passes it"
        )
    });
    RegistryClient::new(RegistryConfig::new(url)).expect("a registry client")
}

/// A subject no other test or run uses.
fn fresh_subject(test: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("a clock after 1970")
        .as_nanos();
    format!("eos-schema-{test}-{}-{nanos}-value", std::process::id())
}

/// A record schema whose name is unique to the run, so its text (and so its content id) is
/// registered by this run first.
fn payment_schema(name: &str, with_note: bool) -> String {
    let note = if with_note {
        r#", {"name": "note", "type": ["null", "string"], "default": null}"#
    } else {
        ""
    };
    format!(
        r#"{{"type": "record", "name": "{name}", "namespace": "eos.schema.test", "fields": [
            {{"name": "id", "type": {{"type": "string", "logicalType": "uuid"}}}},
            {{"name": "amount", "type": {{"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}}}},
            {{"name": "at", "type": {{"type": "long", "logicalType": "timestamp-millis"}}}}{note}
        ]}}"#
    )
}

fn unique_name(test: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("a clock after 1970")
        .as_nanos();
    format!("{test}_{}_{nanos}", std::process::id())
}

#[tokio::test]
async fn a_registered_schema_comes_back_by_its_id_and_a_record_round_trips() {
    let registry = registry_client();
    let subject = fresh_subject("round-trip");
    let text = payment_schema(&unique_name("RoundTrip"), false);

    let id = registry
        .register(&subject, &Schema::avro(&text))
        .await
        .expect("registered");
    let fetched = registry.schema_by_id(id).await.expect("the id is known");
    let given = AvroSchema::parse(&text, "given").expect("parses");
    let stored = AvroSchema::parse(&fetched.schema, format!("id {id}")).expect("parses");
    assert_eq!(
        stored.schema().canonical_form(),
        given.schema().canonical_form(),
        "the registry gives back the schema registered"
    );

    let latest = registry
        .latest(&subject)
        .await
        .expect("the subject has a version");
    assert_eq!((latest.id, latest.version), (id, 1));

    let payment = json!({
        "id": "0f8fad5b-d9cb-469f-a165-70867728950e",
        "amount": "1234.50",
        "at": "2024-05-01T12:00:00.250Z",
    });
    let record = given.encode_framed(id, &payment).expect("fits");
    let framed = wire::unframe(&record).expect("the wire format");
    assert_eq!(framed.schema_id, id);
    let reader = registry
        .avro_schema(framed.schema_id)
        .await
        .expect("the id's schema");
    assert_eq!(reader.decode(framed.payload).expect("decodes"), payment);
}

/// Confluent's registry gives one id to one schema text, whatever the subject, and a new id to
/// a new text. Apicurio's Confluent-compatible API does the same only when its ids are content
/// ids; with global ids (`apicurio.ccompat.legacy-id-mode.enabled=true`) every registration would
/// get an id of its own, and the second subject's id below would differ.
#[tokio::test]
async fn ids_are_content_ids_as_a_confluent_client_sees_them() {
    let registry = registry_client();
    let orders = fresh_subject("orders");
    let refunds = fresh_subject("refunds");
    let name = unique_name("ContentId");
    let first = Schema::avro(payment_schema(&name, false));
    let evolved = Schema::avro(payment_schema(&name, true));

    let first_id = registry
        .register(&orders, &first)
        .await
        .expect("registered");
    let evolved_id = registry
        .register(&orders, &evolved)
        .await
        .expect("a backward-compatible version registers");
    assert_ne!(evolved_id, first_id, "a new schema text gets a new id");

    let same_text_elsewhere = registry
        .register(&refunds, &first)
        .await
        .expect("registered");
    assert_eq!(
        same_text_elsewhere, first_id,
        "the same schema text has the same id under another subject"
    );

    // A second client, its caches empty, hears the same from the registry itself.
    let fresh = registry_client();
    let looked_up = fresh
        .lookup(&orders, &first)
        .await
        .expect("registered under orders");
    assert_eq!((looked_up.id, looked_up.version), (first_id, 1));
    let latest = fresh.latest(&orders).await.expect("two versions");
    assert_eq!((latest.id, latest.version), (evolved_id, 2));
    assert_eq!(
        fresh
            .register(&refunds, &first)
            .await
            .expect("already there"),
        first_id,
        "registering a subject's existing schema again answers its id"
    );
}

#[tokio::test]
async fn unknown_ids_subjects_and_schemas_are_errors_that_say_which() {
    let registry = registry_client();
    let subject = fresh_subject("unknown");
    // Content ids count up from 1; no test run registers two billion schemas.
    let unknown = SchemaId(2_000_000_000);
    match registry.schema_by_id(unknown).await {
        Err(SchemaError::UnknownSchemaId { id }) => assert_eq!(id, unknown),
        other => panic!("expected an unknown id, got {other:?}"),
    }

    match registry.latest(&subject).await {
        Err(SchemaError::UnknownSubject { subject: named, .. }) => assert_eq!(named, subject),
        other => panic!("expected an unknown subject, got {other:?}"),
    }

    let registered = Schema::avro(payment_schema(&unique_name("Known"), false));
    registry
        .register(&subject, &registered)
        .await
        .expect("registered");
    let other = Schema::avro(payment_schema(&unique_name("Other"), false));
    match registry.lookup(&subject, &other).await {
        Err(SchemaError::NotRegistered { subject: named }) => assert_eq!(named, subject),
        other => panic!("expected a schema the subject does not have, got {other:?}"),
    }

    let broken = Schema::avro(r#"{"type": "record", "name": "Broken", "fields": [{"name": "a"}]}"#);
    match registry.register(&subject, &broken).await {
        Err(error @ SchemaError::Refused { .. }) => assert!(!error.is_transient(), "{error}"),
        other => panic!("expected the registry to refuse an invalid schema, got {other:?}"),
    }
}

#[tokio::test]
async fn a_protobuf_schema_registers_and_a_record_round_trips_by_its_id() {
    let registry = registry_client();
    let subject = fresh_subject("protobuf");
    // A message name unique to the run, so the text (and its content id) is this run's.
    let name = unique_name("Payment");
    let text = format!(
        r#"syntax = "proto3";
package eos.schema.test;
import "google/protobuf/timestamp.proto";

message {name} {{
  enum State {{ PENDING = 0; SETTLED = 1; }}
  string id = 1;
  int64 amount_cents = 2;
  State state = 3;
  bytes digest = 4;
  google.protobuf.Timestamp at = 5;
  repeated string tags = 6;
}}
"#
    );
    let id = registry
        .register(&subject, &Schema::protobuf(&text))
        .await
        .expect("registered");
    let local = ProtobufSchema::parse(&text, "given").expect("compiles");
    let payment = json!({
        "id": "p-1",
        "amount_cents": 9_007_199_254_740_993_i64,
        "state": "SETTLED",
        "digest": "AP8=",
        "at": "2024-05-01T12:00:00.250Z",
        "tags": ["a", "b"],
    });
    let record = local.encode_framed(id, &payment).expect("fits");

    // A client with empty caches reads the record by its id alone.
    let reader = registry_client();
    let (read_id, value) = reader.decode(&record).await.expect("decodes");
    assert_eq!((read_id, value), (id, payment));
    let fetched = reader.schema_by_id(id).await.expect("known");
    assert_eq!(fetched.schema_type, SchemaType::Protobuf);
}

#[tokio::test]
async fn a_json_schema_registers_and_only_fitting_records_pass() {
    let registry = registry_client();
    let subject = fresh_subject("json");
    let text = format!(
        r#"{{"$schema": "http://json-schema.org/draft-07/schema#", "title": "{}",
            "type": "object",
            "properties": {{"id": {{"type": "string"}}, "amount": {{"type": "number", "minimum": 0}}}},
            "required": ["id", "amount"]}}"#,
        unique_name("Payment")
    );
    let id = registry
        .register(&subject, &Schema::json(&text))
        .await
        .expect("registered");
    let schema = registry.json_schema(id).await.expect("compiles");
    let payment = json!({"id": "p-1", "amount": 12.5});
    let record = schema.encode_framed(id, &payment).expect("fits");
    let reader = registry_client();
    assert_eq!(
        reader.decode(&record).await.expect("decodes"),
        (id, payment)
    );

    match schema.encode(&json!({"id": "p-2", "amount": -1})) {
        Err(SchemaError::DoesNotFit { path, .. }) => assert_eq!(path, "$.amount"),
        other => panic!("expected a misfit at $.amount, got {other:?}"),
    }
    let forged = wire::frame(id, br#"{"id": "p-3"}"#);
    match reader.decode(&forged).await {
        Err(SchemaError::Undecodable { schema, .. }) => assert_eq!(schema, format!("id {id}")),
        other => panic!("expected a record that does not fit to be undecodable, got {other:?}"),
    }
}

/// A producer moves to a BACKWARD-compatible version mid-run: records of both versions read as
/// the subject's latest give the same event model; a reader that cannot resolve the writer's
/// schema is an error naming both ids.
#[tokio::test]
async fn avro_records_of_an_earlier_version_read_as_the_latest() {
    let registry = registry_client();
    let subject = fresh_subject("evolution");
    let name = unique_name("Evolving");
    let v1 = payment_schema(&name, false);
    let v2 = payment_schema(&name, true);
    let v1_id = registry
        .register(&subject, &Schema::avro(&v1))
        .await
        .expect("registered");
    let v2_id = registry
        .register(&subject, &Schema::avro(&v2))
        .await
        .expect("a backward-compatible version registers");

    let payment = json!({
        "id": "0f8fad5b-d9cb-469f-a165-70867728950e",
        "amount": "1234.50",
        "at": "2024-05-01T12:00:00.250Z",
    });
    let old = AvroSchema::parse(&v1, "v1")
        .expect("parses")
        .encode_framed(v1_id, &payment)
        .expect("fits");
    let mut with_note = payment.clone();
    with_note["note"] = json!(null);
    let new = AvroSchema::parse(&v2, "v2")
        .expect("parses")
        .encode_framed(v2_id, &with_note)
        .expect("fits");

    let reader = registry_client();
    let latest = reader.latest(&subject).await.expect("two versions").id;
    assert_eq!(latest, v2_id);
    assert_eq!(
        reader
            .decode_avro_latest(&old, &subject)
            .await
            .expect("resolves"),
        with_note
    );
    assert_eq!(
        reader
            .decode_avro_as(&new, latest)
            .await
            .expect("same schema"),
        with_note
    );

    // A reader whose field the writer lacks, with no default: does not resolve.
    let strict = format!(
        r#"{{"type": "record", "name": "{name}", "namespace": "eos.schema.test", "fields": [
            {{"name": "id", "type": {{"type": "string", "logicalType": "uuid"}}}},
            {{"name": "required_later", "type": "string"}}
        ]}}"#
    );
    let strict_id = registry
        .register(&fresh_subject("evolution-strict"), &Schema::avro(&strict))
        .await
        .expect("registered under a subject of its own");
    match reader.decode_avro_as(&old, strict_id).await {
        Err(SchemaError::Undecodable { schema, .. }) => {
            assert_eq!(schema, format!("id {v1_id} read as id {strict_id}"))
        }
        other => panic!("expected an incompatible pair, got {other:?}"),
    }
}

/// A schema that uses a type kept under another subject, as Confluent's serializers register
/// one (`references`): the client reads the referenced subject's version and parses the whole,
/// and a record of it round-trips by its id. Avro (a named record of another subject) and
/// Protobuf (an imported file).
#[tokio::test]
async fn schemas_that_reference_other_subjects_are_read_with_them() {
    let registry = registry_client();
    let money_name = unique_name("Money");
    let money_subject = fresh_subject("money");
    let money = format!(
        r#"{{"type": "record", "name": "{money_name}", "namespace": "eos.schema.common",
            "fields": [{{"name": "cents", "type": "long"}},
                       {{"name": "currency", "type": "string"}}]}}"#
    );
    registry
        .register(&money_subject, &Schema::avro(&money))
        .await
        .expect("the referenced schema registers");
    let full_name = format!("eos.schema.common.{money_name}");
    let payment = format!(
        r#"{{"type": "record", "name": "{}", "namespace": "eos.schema.test",
            "fields": [{{"name": "id", "type": "string"}},
                       {{"name": "amount", "type": "{full_name}"}},
                       {{"name": "fee", "type": ["null", "{full_name}"], "default": null}}]}}"#,
        unique_name("Referencing")
    );
    let mut schema = Schema::avro(&payment);
    schema.references = vec![SchemaReference {
        name: full_name,
        subject: money_subject.clone(),
        version: 1,
    }];
    let id = registry
        .register(&fresh_subject("referencing"), &schema)
        .await
        .expect("a schema with a reference registers");
    let fetched = registry.schema_by_id(id).await.expect("the id is known");
    assert_eq!(
        fetched.references.len(),
        1,
        "the registry keeps the reference"
    );
    let value = json!({"id": "p-1", "amount": {"cents": 1250, "currency": "EUR"},
                       "fee": {"cents": 5, "currency": "EUR"}});
    let parsed = registry
        .parsed_schema(id)
        .await
        .expect("parsed with its reference");
    let framed = parsed.encode_framed(id, &value).expect("fits");
    assert_eq!(
        registry.decode(&framed).await.expect("decodes"),
        (id, value)
    );

    let package = unique_name("money").to_lowercase();
    let money_proto = format!(
        "syntax = \"proto3\";\npackage {package};\n\nmessage Money {{\n  int64 cents = 1;\n  \
         string currency = 2;\n}}\n"
    );
    let money_subject = fresh_subject("money-proto");
    registry
        .register(&money_subject, &Schema::protobuf(&money_proto))
        .await
        .expect("the imported file registers");
    let payment_proto = format!(
        "syntax = \"proto3\";\npackage eos.schema.test;\n\nimport \"{package}/money.proto\";\n\n\
         message {} {{\n  string id = 1;\n  {package}.Money amount = 2;\n}}\n",
        unique_name("Referencing")
    );
    let mut schema = Schema::protobuf(&payment_proto);
    schema.references = vec![SchemaReference {
        name: format!("{package}/money.proto"),
        subject: money_subject,
        version: 1,
    }];
    let id = registry
        .register(&fresh_subject("importing"), &schema)
        .await
        .expect("a file with an import registers");
    let value = json!({"id": "p-2", "amount": {"cents": 700, "currency": "USD"}});
    let parsed = registry
        .parsed_schema(id)
        .await
        .expect("compiled with its import");
    let framed = parsed.encode_framed(id, &value).expect("fits");
    assert_eq!(
        registry.decode(&framed).await.expect("decodes"),
        (id, value)
    );

    // A reference the registry does not have: the schema is invalid, naming it, not retried.
    let mut schema = Schema::avro(payment.replace("Referencing", "Dangling"));
    schema.references = vec![SchemaReference {
        name: "eos.schema.common.Nowhere".into(),
        subject: fresh_subject("nowhere"),
        version: 1,
    }];
    match registry.register(&fresh_subject("dangling"), &schema).await {
        Ok(id) => {
            let refused = registry.parsed_schema(id).await.expect_err("invalid");
            eprintln!("registered with a dangling reference; parsing it: {refused}");
            assert!(!refused.is_transient(), "{refused}");
            assert!(refused.to_string().contains("Nowhere"), "{refused}");
        }
        // A registry that checks references refuses it at once: also not an outage.
        Err(refused) => {
            eprintln!("the registry refused the dangling reference: {refused}");
            assert!(!refused.is_transient(), "{refused}");
        }
    }
}
