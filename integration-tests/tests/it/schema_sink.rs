//! sink-writer reading a topic in a schema registry's format (`--input-format avro`,
//! docs/schemas.md): each record decoded with the schema its id names into the JSON event the
//! columns read, Avro's logical types landing in their PostgreSQL types (uuid, decimal as an exact
//! numeric, enum as text, timestamp-millis, date, a nullable union), a re-delivery a duplicate,
//! the same id with other content a conflict, the same event re-encoded with a newer compatible
//! schema a duplicate (its fingerprint is of its content), and bytes that do not decode a dead
//! letter naming the subject and the schema id.

use std::time::Instant;

use anyhow::ensure;
use eos_schema::{RegistryClient, RegistryConfig, Schema, wire};
use eos_testkit::argv;
use integration_tests::{TestDatabase, create_topic, produce_records, unique_name};
use serde_json::{Value, json};

use crate::schema_input::registry_url;
use crate::sink_writer::Sink;

const PAYMENT_AVRO: &str = r#"{
  "type": "record", "name": "Payment", "namespace": "com.example.pay",
  "fields": [
    {"name": "payment_id", "type": {"type": "string", "logicalType": "uuid"}},
    {"name": "account", "type": "string"},
    {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}},
    {"name": "currency", "type": {"type": "enum", "name": "Currency", "symbols": ["EUR", "USD"]}},
    {"name": "paid_at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "booked_on", "type": {"type": "int", "logicalType": "date"}},
    {"name": "note", "type": ["null", "string"], "default": null}
  ]
}"#;

const TARGETS: &str = r#"
[[targets]]
table = "avro_payments"
kind = "append"
key = "payment_id"
[targets.columns]
payment_id = "event_id"
account = "entity_id"
amount = "/amount"
currency = "/currency"
paid_at = "/paid_at"
booked_on = "/booked_on"
note = "/note"
fingerprint = "fingerprint"
"#;

/// A row of `avro_payments` as text: id, account, amount, currency, paid at, booked on, note.
type PaymentRow = (
    String,
    String,
    String,
    String,
    String,
    String,
    Option<String>,
);

fn payment(n: u32, amount: &str, note: Option<&str>) -> Value {
    json!({
        "payment_id": format!("00000000-0000-4000-8000-00000000000{n}"),
        "account": format!("acc-{}", n % 2),
        "amount": amount,
        "currency": if n == 2 { "USD" } else { "EUR" },
        "paid_at": format!("2026-12-0{n}T10:15:30.250Z"),
        "booked_on": format!("2026-12-0{n}"),
        "note": note,
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn an_avro_topic_lands_in_its_columns_once_per_event_and_bad_bytes_are_dead_letters()
-> anyhow::Result<()> {
    let url = registry_url()?;
    let db = TestDatabase::create().await?;
    sqlx::raw_sql(
        "CREATE TABLE avro_payments (payment_id uuid PRIMARY KEY, account text NOT NULL, \
         amount numeric(12,2) NOT NULL, currency text NOT NULL, paid_at timestamptz NOT NULL, \
         booked_on date NOT NULL, note text, fingerprint text NOT NULL)",
    )
    .execute(&db.pool)
    .await?;
    let topic = unique_name("avro-sink");
    create_topic(&topic, 1).await?;
    let subject = format!("{topic}-value");
    let registry = RegistryClient::new(RegistryConfig::new(url.clone()))?;
    let v1 = registry
        .register(&subject, &Schema::avro(PAYMENT_AVRO))
        .await?;
    let v1_schema = registry.parsed_schema(v1).await?;
    let encode_v1 = |value: &Value| v1_schema.encode_framed(v1, value);
    let (p1, p2, p3) = (
        payment(1, "12.50", None),
        payment(2, "0.01", Some("first")),
        payment(3, "1234567890.99", None),
    );
    let mut p2_other = p2.clone();
    p2_other["amount"] = "0.02".into();
    let mut undecodable = wire::frame(v1, &[0xff; 3]);
    undecodable.truncate(7);
    let mut records = vec![
        (Some("acc-1".to_owned()), encode_v1(&p1)?),
        (Some("acc-0".to_owned()), encode_v1(&p2)?),
        (Some("acc-1".to_owned()), encode_v1(&p3)?),
        // A re-delivery: a duplicate.
        (Some("acc-1".to_owned()), encode_v1(&p1)?),
        // Same id, other amount: a conflict, never an overwrite.
        (Some("acc-0".to_owned()), encode_v1(&p2_other)?),
        // Framed with v1's id, but not a Payment: a dead letter.
        (Some("acc-1".to_owned()), undecodable),
    ];
    // The producer moves to a compatible v2 (a field with a default) mid-topic: p3 written
    // again with it at its default is the same event; p4 is new.
    let v2_text = PAYMENT_AVRO.replace(
        r#"{"name": "note""#,
        r#"{"name": "channel", "type": "string", "default": "web"},
    {"name": "note""#,
    );
    let v2 = registry.register(&subject, &Schema::avro(v2_text)).await?;
    ensure!(v2 != v1, "v2 is a schema of its own");
    let v2_schema = registry.parsed_schema(v2).await?;
    let with_channel = |value: &Value| {
        let mut value = value.clone();
        value["channel"] = "web".into();
        value
    };
    let p4 = payment(4, "99.00", Some("v2"));
    records.push((
        Some("acc-1".to_owned()),
        v2_schema.encode_framed(v2, &with_channel(&p3))?,
    ));
    records.push((
        Some("acc-0".to_owned()),
        v2_schema.encode_framed(v2, &with_channel(&p4))?,
    ));
    produce_records(&topic, &records)?;

    let targets = std::env::temp_dir().join(format!("{}.toml", unique_name("avro-targets")));
    std::fs::write(&targets, TARGETS)?;
    let sink = Sink::new(&topic, &db.url);
    let args = argv!(sink_writer::Config {
        config: targets.display().to_string(),
        input_format: "avro",
        registry.schema_registry_url: &url,
        event_id: "/payment_id",
        entity: "/account",
        occurred_at: "/paid_at",
        event_schema: "any",
    });
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let started = Instant::now();
    let mut process = sink.spawn("avro-sink-0", &args, &[])?;
    sink.wait_drained(&db.pool, &mut process).await?;
    eprintln!("drained in {:?}", started.elapsed());
    ensure!(
        process.log().contains("format=avro via"),
        "the boundary line names the format\n{}",
        process.log_tail(30)
    );
    process.stop_gracefully()?;
    let _ = std::fs::remove_file(&targets);

    let rows: Vec<PaymentRow> = sqlx::query_as(
        "SELECT payment_id::text, account, amount::text, currency, \
             to_char(paid_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS'), \
             booked_on::text, note FROM avro_payments ORDER BY payment_id",
    )
    .fetch_all(&db.pool)
    .await?;
    let want: Vec<_> = [(&p1, "EUR"), (&p2, "USD"), (&p3, "EUR"), (&p4, "EUR")]
        .iter()
        .map(|(p, currency)| {
            let text = |field: &str| p[field].as_str().unwrap_or_default().to_owned();
            (
                text("payment_id"),
                text("account"),
                text("amount"),
                (*currency).to_owned(),
                text("paid_at").trim_end_matches('Z').to_owned(),
                text("booked_on"),
                p["note"].as_str().map(str::to_owned),
            )
        })
        .collect();
    assert_eq!(
        rows, want,
        "one row per event, each column as its event says"
    );

    let conflicts: Vec<(String, String)> =
        sqlx::query_as("SELECT event_id, reason FROM sink_conflicts ORDER BY id")
            .fetch_all(&db.pool)
            .await?;
    assert_eq!(
        conflicts
            .iter()
            .map(|(id, _)| id.as_str())
            .collect::<Vec<_>>(),
        [p2["payment_id"].as_str().unwrap_or_default()],
        "p2 with another amount is the one conflict; p3 under v2 at its default is none: \
         {conflicts:?}"
    );
    let letters: Vec<(String, String)> =
        sqlx::query_as("SELECT reason, detail FROM sink_dead_letters ORDER BY source_offset")
            .fetch_all(&db.pool)
            .await?;
    ensure!(
        letters.len() == 1
            && letters[0].0 == "undecodable_record"
            && letters[0].1.contains(&subject)
            && letters[0].1.contains(&format!("schema id {v1}")),
        "one dead letter, undecodable_record naming {subject} and schema id {v1}: {letters:?}"
    );
    db.drop_database().await
}
