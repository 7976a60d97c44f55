//! sink-writer reading a topic in a schema registry's format (`--input-format avro`,
//! docs/schemas.md): each record decoded with the schema its id names into the JSON event the
//! columns read, Avro's logical types landing in their PostgreSQL types (uuid, decimal as an exact
//! numeric, enum as text, timestamp-millis, date, a nullable union), a re-delivery a duplicate,
//! the same id with other content a conflict, the same event re-encoded with a newer compatible
//! schema a duplicate (its fingerprint is of its content), and bytes that do not decode a dead
//! letter naming the subject and the schema id; and a registry that does not answer holds the
//! records back, nothing written or skipped, until it answers again.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use eos_schema::{RegistryClient, RegistryConfig, Schema, wire};
use eos_testkit::argv;
use integration_tests::fault_proxy::FaultProxy;
use integration_tests::{TestDatabase, create_topic, produce_records, unique_name};
use serde_json::{Value, json};

use crate::schema_input::{probe_until, registry_url};
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

/// A database with the table `TARGETS` writes, and the targets file naming it.
async fn payments_database() -> anyhow::Result<(TestDatabase, std::path::PathBuf)> {
    let db = TestDatabase::create().await?;
    sqlx::raw_sql(
        "CREATE TABLE avro_payments (payment_id uuid PRIMARY KEY, account text NOT NULL, \
         amount numeric(12,2) NOT NULL, currency text NOT NULL, paid_at timestamptz NOT NULL, \
         booked_on date NOT NULL, note text, fingerprint text NOT NULL)",
    )
    .execute(&db.pool)
    .await?;
    let targets = std::env::temp_dir().join(format!("{}.toml", unique_name("avro-targets")));
    std::fs::write(&targets, TARGETS)?;
    Ok((db, targets))
}

/// The sink's flags for `TARGETS` on an Avro topic read through `registry`.
fn sink_args(targets: &std::path::Path, registry: &str) -> Vec<String> {
    argv!(sink_writer::Config {
        config: targets.display().to_string(),
        input_format: "avro",
        registry.schema_registry_url: registry,
        registry.schema_registry_timeout: "1s",
        stall.stall_warning: "2s",
        event_id: "/payment_id",
        entity: "/account",
        occurred_at: "/paid_at",
        event_schema: "any",
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn an_avro_topic_lands_in_its_columns_once_per_event_and_bad_bytes_are_dead_letters()
-> anyhow::Result<()> {
    let url = registry_url()?;
    let (db, targets) = payments_database().await?;
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

    let sink = Sink::new(&topic, &db.url);
    let args = sink_args(&targets, &url);
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

/// The registry unreachable when the sink's first records arrive (a partitioned link): nothing is
/// written or dead-lettered, the wait is warned of and `/readyz` answers 503; once the link heals
/// every event lands once (the re-delivery a duplicate) within `DRAIN_BOUND`.
#[tokio::test(flavor = "multi_thread")]
async fn the_sink_waits_out_a_registry_outage_and_then_writes_every_event_once()
-> anyhow::Result<()> {
    const DRAIN_BOUND: Duration = Duration::from_secs(60);
    let url = registry_url()?;
    let (db, targets) = payments_database().await?;
    let topic = unique_name("avro-sink-outage");
    create_topic(&topic, 1).await?;
    let registry = RegistryClient::new(RegistryConfig::new(url.clone()))?;
    let id = registry
        .register(&format!("{topic}-value"), &Schema::avro(PAYMENT_AVRO))
        .await?;
    let schema = registry.parsed_schema(id).await?;
    let payments = [
        payment(1, "1.00", None),
        payment(2, "2.00", None),
        payment(3, "3.00", None),
    ];
    let mut records = payments
        .iter()
        .map(|p| Ok((Some("acc".to_owned()), schema.encode_framed(id, p)?)))
        .collect::<anyhow::Result<Vec<_>>>()?;
    records.push(records[0].clone());

    let upstream = url
        .strip_prefix("http://")
        .and_then(|rest| rest.split('/').next())
        .context("the registry URL is http://HOST:PORT/...")?
        .to_owned();
    let proxy = FaultProxy::start(&upstream).await?;
    proxy.partition();
    let proxied_url = url.replacen(&upstream, &proxy.addr().to_string(), 1);
    let sink = Sink::new(&topic, &db.url);
    let args = sink_args(&targets, &proxied_url);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut process = sink.spawn("avro-sink-outage-0", &args, &[])?;
    let addr: SocketAddr = process
        .wait_for_log_field("metrics_addr", Duration::from_secs(60))?
        .parse()?;
    produce_records(&topic, &records)?;

    tokio::task::block_in_place(|| {
        process.wait_for_log_line(
            "the schema registry does not answer",
            Duration::from_secs(60),
        )
    })
    .with_context(|| process.log_tail(30))?;
    let ready =
        tokio::task::block_in_place(|| probe_until(addr, "/readyz", 503, Duration::from_secs(20)));
    ensure!(
        ready == 503,
        "/readyz while the registry does not answer: {ready}"
    );
    let count = |table: &'static str| {
        let pool = db.pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(&format!("SELECT count(*) FROM {table}"))
                .fetch_one(&pool)
                .await
        }
    };
    ensure!(
        (
            count("avro_payments").await?,
            count("sink_dead_letters").await?
        ) == (0, 0),
        "nothing written or dead-lettered while the registry does not answer"
    );

    proxy.heal();
    let healed_at = Instant::now();
    let drained = tokio::time::timeout(DRAIN_BOUND, sink.wait_drained(&db.pool, &mut process))
        .await
        .with_context(|| format!("not drained within {DRAIN_BOUND:?} of the heal"))?;
    drained?;
    eprintln!(
        "drained {:?} after the registry's link healed (bound {DRAIN_BOUND:?})",
        healed_at.elapsed()
    );
    let ready =
        tokio::task::block_in_place(|| probe_until(addr, "/readyz", 200, Duration::from_secs(20)));
    ensure!(ready == 200, "/readyz once the registry answers: {ready}");
    process.stop_gracefully()?;
    let _ = std::fs::remove_file(&targets);
    let ids: Vec<String> =
        sqlx::query_scalar("SELECT payment_id::text FROM avro_payments ORDER BY payment_id")
            .fetch_all(&db.pool)
            .await?;
    let want: Vec<String> = payments
        .iter()
        .map(|p| p["payment_id"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(ids, want, "each event once");
    ensure!(
        (
            count("sink_dead_letters").await?,
            count("sink_conflicts").await?
        ) == (0, 0),
        "no dead letter, no conflict"
    );
    db.drop_database().await
}
