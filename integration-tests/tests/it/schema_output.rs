//! eos-processor writing its outputs in a schema registry's format (`--output-format`,
//! docs/schemas.md): Avro in, Avro out, each output written with the latest schema of its topic's
//! subject and read back by the registry's id; an event whose output does not fit that schema is
//! a dead letter `output_schema_misfit` with nothing of it written, and its outcome is final; a
//! subject with no schema stops the start, naming it; and Avro in and out through SIGKILLs, every
//! event once and the run drained within a bound.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use eos_core::dead_letter;
use eos_schema::{RegistryClient, RegistryConfig, Schema};
use eos_testkit::argv;
use integration_tests::service_process::ServiceProcess;
use integration_tests::{
    bootstrap_servers, create_topic, produce_records, unique_name, wait_until_consumed,
};
use rand::{Rng as _, SeedableRng as _};
use rdkafka::Message as _;
use serde_json::Value;

use crate::card_authorisations::header;
use crate::schema_input::{AUTHORISATION_AVRO, authorisation, registry_url};

/// How long the processor may take to read every record once they are all written.
const DRAIN_BOUND: Duration = Duration::from_secs(60);

fn processor_args(input: &str, output: &str, group: &str, registry: &str) -> Vec<String> {
    argv!(eos_processor::ServiceConfig {
        processor.kafka.bootstrap_servers: &bootstrap_servers(),
        processor.input_topic: input,
        processor.output_topic: output,
        processor.group_id: group,
        processor.instance.instance_id: group,
        processor.metrics_addr: "127.0.0.1:0",
        processor.input_format.input_format: "avro",
        processor.input_format.output_format: "avro",
        processor.input_format.registry.schema_registry_url: registry,
        transform: "pass-through",
        processor.event_id: "/auth/id",
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn avro_outputs_are_written_with_their_subjects_schema_and_a_misfit_is_a_dead_letter()
-> anyhow::Result<()> {
    let url = registry_url()?;
    let input = unique_name("avro-out-in");
    let output = unique_name("avro-out");
    let group = unique_name("avro-out-processor");
    let dlq = format!("{input}.dlq");
    create_topic(&input, 1).await?;
    let registry = RegistryClient::new(RegistryConfig::new(url.clone()))?;
    let input_id = registry
        .register(&format!("{input}-value"), &Schema::avro(AUTHORISATION_AVRO))
        .await?;
    let input_schema = registry.parsed_schema(input_id).await?;
    // The output's schema takes euros only: a dollar authorisation fits the input, not it.
    let output_subject = format!("{output}-value");
    let output_id = registry
        .register(
            &output_subject,
            &Schema::avro(AUTHORISATION_AVRO.replace(r#"["EUR", "USD"]"#, r#"["EUR"]"#)),
        )
        .await?;
    let (a1, a3) = (
        authorisation("a-1", "c-1", "12.50"),
        authorisation("a-3", "c-1", "7.25"),
    );
    let mut a2 = authorisation("a-2", "c-2", "3.00");
    a2["currency"] = "USD".into();
    let encode = |value: &Value| input_schema.encode_framed(input_id, value);
    let records: Vec<(Option<String>, Vec<u8>)> = vec![
        (Some("c-1".into()), encode(&a1)?),
        (Some("c-2".into()), encode(&a2)?),
        (Some("c-1".into()), encode(&a3)?),
        // Again: a-1 is a duplicate, and a-2's dead letter is its outcome for good.
        (Some("c-1".into()), encode(&a1)?),
        (Some("c-2".into()), encode(&a2)?),
    ];
    produce_records(&input, &records)?;

    let started = Instant::now();
    let mut processor = ServiceProcess::spawn(
        "eos-processor",
        &processor_args(&input, &output, &group, &url),
        &[],
    )?;
    let bootstrap = bootstrap_servers();
    tokio::task::block_in_place(|| wait_until_consumed(&bootstrap, &group, &input, DRAIN_BOUND))
        .with_context(|| processor.log_tail(40))?;
    eprintln!("drained in {:?} (bound {DRAIN_BOUND:?})", started.elapsed());
    processor.stop_gracefully()?;
    ensure!(
        processor.log().contains(&format!("schema_id={output_id}")),
        "the start-up names the output's schema id\n{}",
        processor.log_tail(40)
    );

    let (outputs, letters) = crate::schema_input::outputs_and_dead_letters(output, dlq).await?;
    let mut written = Vec::new();
    for message in &outputs {
        let (id, value) = registry
            .decode(message.payload().unwrap_or_default())
            .await
            .with_context(|| format!("output of {}", header(message, "event_id").unwrap_or("")))?;
        ensure!(
            id == output_id,
            "written with the output subject's schema id {output_id}, not {id}"
        );
        written.push((header(message, "event_id").unwrap_or("").to_owned(), value));
    }
    written.sort_by(|a, b| a.0.cmp(&b.0));
    ensure!(
        written == [("a-1".to_owned(), a1), ("a-3".to_owned(), a3)],
        "a-1 and a-3 once each, as their events: {written:?}"
    );
    ensure!(
        letters.len() == 1,
        "one dead letter, a-2's: {}",
        letters.len()
    );
    let letter = &letters[0];
    let detail = header(letter, dead_letter::DETAIL_HEADER).unwrap_or("");
    ensure!(
        header(letter, dead_letter::REASON_HEADER) == Some("output_schema_misfit")
            && detail.contains(&output_subject)
            && detail.contains(&output_id.to_string()),
        "a-2 is an output_schema_misfit naming the subject and the id: {detail}"
    );
    ensure!(
        letter.payload() == Some(records[1].1.as_slice()),
        "the dead letter holds the input record's bytes"
    );
    Ok(())
}

/// `--output-schema`: the default output written with the schema of a subject named by the
/// record's full name (RecordNameStrategy) instead of `TOPIC-value`, which has none here; and
/// the same output set back to JSON while `--output-format` says avro.
#[tokio::test(flavor = "multi_thread")]
async fn an_output_takes_its_own_subject_or_format_from_output_schema() -> anyhow::Result<()> {
    let url = registry_url()?;
    let input = unique_name("avro-own-subject-in");
    create_topic(&input, 1).await?;
    let registry = RegistryClient::new(RegistryConfig::new(url.clone()))?;
    let input_id = registry
        .register(&format!("{input}-value"), &Schema::avro(AUTHORISATION_AVRO))
        .await?;
    // RecordNameStrategy: the subject is the record's full name.
    let record_subject = "com.example.cards.Authorisation";
    let record_id = registry
        .register(record_subject, &Schema::avro(AUTHORISATION_AVRO))
        .await?;
    let avro = registry.parsed_schema(input_id).await?;
    let events = [
        authorisation("a-1", "c-1", "1.50"),
        authorisation("a-2", "c-2", "2.50"),
    ];
    let records = events
        .iter()
        .map(|event| Ok((Some("c".to_owned()), avro.encode_framed(input_id, event)?)))
        .collect::<anyhow::Result<Vec<_>>>()?;
    produce_records(&input, &records)?;

    let bootstrap = bootstrap_servers();
    for (own_schema, registered) in [
        (format!("default=avro@{record_subject}"), true),
        ("default=json".to_owned(), false),
    ] {
        let output = unique_name("avro-own-subject-out");
        let group = unique_name("avro-own-subject");
        let mut args = processor_args(&input, &output, &group, &url);
        args.extend(["--output-schema".to_owned(), own_schema.clone()]);
        let mut processor = ServiceProcess::spawn("eos-processor", &args, &[])?;
        tokio::task::block_in_place(|| {
            wait_until_consumed(&bootstrap, &group, &input, DRAIN_BOUND)
        })
        .with_context(|| processor.log_tail(40))?;
        processor.stop_gracefully()?;
        let (outputs, letters) =
            crate::schema_input::outputs_and_dead_letters(output, format!("{input}.dlq")).await?;
        ensure!(
            letters.is_empty() && outputs.len() == events.len(),
            "{own_schema}: {} outputs, {} dead letters",
            outputs.len(),
            letters.len()
        );
        let mut written = Vec::new();
        for message in &outputs {
            let payload = message.payload().unwrap_or_default();
            let value = if registered {
                let (id, value) = registry.decode(payload).await?;
                ensure!(
                    id == record_id,
                    "{own_schema}: written with {record_subject}'s id {record_id}, not {id}"
                );
                value
            } else {
                serde_json::from_slice(payload)
                    .with_context(|| format!("{own_schema}: the output is JSON"))?
            };
            written.push(value);
        }
        written.sort_by_key(|value| value["auth"]["id"].as_str().unwrap_or("").to_owned());
        ensure!(
            written == events,
            "{own_schema}: each event once, as its event: {written:?}"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn an_output_subject_without_a_schema_stops_the_start_naming_it() -> anyhow::Result<()> {
    let url = registry_url()?;
    let input = unique_name("avro-out-missing-in");
    let output = unique_name("avro-out-missing");
    let group = unique_name("avro-out-missing-processor");
    create_topic(&input, 1).await?;
    let mut processor = ServiceProcess::spawn(
        "eos-processor",
        &processor_args(&input, &output, &group, &url),
        &[],
    )?;
    let status = processor
        .wait_timeout(Duration::from_secs(60))?
        .with_context(|| format!("still running\n{}", processor.log_tail(30)))?;
    ensure!(
        !status.success()
            && processor
                .log()
                .contains(&format!("subject {output}-value has no schema")),
        "exits non-zero naming the subject ({status})\n{}",
        processor.log_tail(30)
    );
    Ok(())
}

/// Avro in and Avro out while events keep coming (with a retried tenth of them) and the processor
/// is SIGKILLed `KILLS` times: each event is in the output once, as its event, by event id, with
/// nothing dead-lettered, and the last instance drains within `DRAIN_BOUND` of the last record.
#[tokio::test(flavor = "multi_thread")]
async fn avro_in_and_out_through_sigkills_writes_every_event_once() -> anyhow::Result<()> {
    const EVENTS: usize = 4_000;
    const KILLS: usize = 5;
    let url = registry_url()?;
    let input = unique_name("avro-chaos-in");
    let output = unique_name("avro-chaos-out");
    let group = unique_name("avro-chaos-processor");
    let dlq = format!("{input}.dlq");
    create_topic(&input, 3).await?;
    let registry = RegistryClient::new(RegistryConfig::new(url.clone()))?;
    let schema = Schema::avro(AUTHORISATION_AVRO);
    let input_id = registry
        .register(&format!("{input}-value"), &schema)
        .await?;
    let output_id = registry
        .register(&format!("{output}-value"), &schema)
        .await?;
    let avro = registry.parsed_schema(input_id).await?;
    let mut expected = BTreeMap::new();
    let mut records = Vec::new();
    for n in 0..EVENTS {
        let event = authorisation(
            &format!("a-{n}"),
            &format!("c-{}", n % 7),
            &format!("{n}.25"),
        );
        let record = (
            Some(format!("c-{}", n % 7)),
            avro.encode_framed(input_id, &event)?,
        );
        if n % 10 == 3 {
            // Retried by its producer a little later.
            records.push(record.clone());
        }
        records.push(record);
        expected.insert(format!("a-{n}"), event);
    }
    // About 8 s of input, so the kills land while it comes.
    let producing = {
        let input = input.clone();
        std::thread::spawn(move || -> anyhow::Result<()> {
            for chunk in records.chunks(110) {
                produce_records(&input, chunk)?;
                std::thread::sleep(Duration::from_millis(200));
            }
            Ok(())
        })
    };
    let args = processor_args(&input, &output, &group, &url);
    let mut rng = rand::rngs::StdRng::seed_from_u64(52);
    let mut killed_while_producing = 0;
    for _ in 0..KILLS {
        let mut processor = ServiceProcess::spawn("eos-processor", &args, &[])?;
        tokio::time::sleep(Duration::from_millis(rng.random_range(700..2_200))).await;
        processor.kill_hard()?;
        killed_while_producing += usize::from(!producing.is_finished());
    }
    ensure!(
        killed_while_producing >= 3,
        "only {killed_while_producing} of {KILLS} kills landed while the input still came"
    );
    let mut last = ServiceProcess::spawn("eos-processor", &args, &[])?;
    producing
        .join()
        .map_err(|_| anyhow::anyhow!("the producing thread panicked"))??;
    let produced_at = Instant::now();
    let bootstrap = bootstrap_servers();
    tokio::task::block_in_place(|| wait_until_consumed(&bootstrap, &group, &input, DRAIN_BOUND))
        .with_context(|| last.log_tail(40))?;
    let drained_in = produced_at.elapsed();
    last.stop_gracefully()?;

    let (outputs, letters) =
        crate::schema_input::outputs_and_dead_letters(output.clone(), dlq).await?;
    ensure!(letters.is_empty(), "{} dead letters", letters.len());
    let mut written: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for message in &outputs {
        let (id, value) = registry
            .decode(message.payload().unwrap_or_default())
            .await?;
        ensure!(
            id == output_id,
            "written with schema id {id}, not {output_id}"
        );
        written
            .entry(header(message, "event_id").unwrap_or("").to_owned())
            .or_default()
            .push(value);
    }
    let doubled: Vec<&String> = written
        .iter()
        .filter(|(_, values)| values.len() > 1)
        .map(|(id, _)| id)
        .collect();
    ensure!(
        doubled.is_empty(),
        "{} event ids written twice, e.g. {:?}",
        doubled.len(),
        doubled.first()
    );
    ensure!(
        written.len() == expected.len(),
        "{} of {} events written",
        written.len(),
        expected.len()
    );
    for (id, event) in &expected {
        ensure!(
            written.get(id).is_some_and(|values| values[0] == *event),
            "{id} is written as its event"
        );
    }
    eprintln!(
        "avro in and out: {EVENTS} events ({} retried), {KILLS} SIGKILLs, {} outputs, drained \
         {drained_in:?} after the last record (bound {DRAIN_BOUND:?})",
        EVENTS / 10,
        outputs.len()
    );

    // The replay proof of the run, its input and output decoded as the processor decoded them:
    // every output is the transform's. Read as JSON, the same run is no transform's.
    let replay = |formats: &[&str]| -> anyhow::Result<(Option<i32>, Value)> {
        let run = std::process::Command::new(integration_tests::workspace_binary("eosctl")?)
            .args(["audit", "--bootstrap-servers", &bootstrap, "--json"])
            .args(["--input", &input, "--output", &output, "--replay"])
            .args(["--transform", "pass-through", "--event-id", "/auth/id"])
            .args(["--schema-registry-url", &url])
            .args(formats)
            .output()?;
        let report = serde_json::from_slice(&run.stdout)
            .with_context(|| format!("no JSON report: {}", String::from_utf8_lossy(&run.stderr)))?;
        Ok((run.status.code(), report))
    };
    let (code, report) = tokio::task::block_in_place(|| {
        replay(&["--input-format", "avro", "--output-format", "avro"])
    })?;
    eprintln!("avro replay: {report}");
    ensure!(code == Some(0), "the replay passes: {report}");
    ensure!(
        report["applied"] == EVENTS && report["duplicates"] == EVENTS / 10,
        "every event applied once, the retried ones duplicates: {report}"
    );
    ensure!(
        report["matched"] == EVENTS && report["missing"] == 0 && report["unexpected"] == 0,
        "{report}"
    );
    let (code, report) = tokio::task::block_in_place(|| replay(&[]))?;
    ensure!(
        code == Some(1) && report["passed"] == false,
        "read as JSON, the Avro run cannot be the transform's: {report}"
    );
    Ok(())
}
