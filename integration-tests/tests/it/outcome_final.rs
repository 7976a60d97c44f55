//! An event's outcome is final (issue 51; docs/TRANSFORMS.md "An event's outcome is final"):
//! applied, consumed, refused or failed, a re-delivery of its id with the same content is a counted
//! duplicate and with other content an `event_id_conflict`, whatever the first outcome was — also
//! after a SIGKILL, a cold restore from the changelog and a warm one; judging it again is an
//! operator's re-drive, which takes effect exactly once (docs/TRANSFORMS.md "Re-driving dead
//! letters"); and the audit flags an event id with two outcomes. Through the example's real
//! binary (`examples/card-authorisations`), whose daily limit refuses authorisations, and the
//! ledger through the real eos-processor.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use card_authorisations::FLAGGED_OUTPUT;
use eos_core::dead_letter;
use eos_testkit::argv;

use crate::card_authorisations::{assert_replay_exact, example_transform, replay_run};
use integration_tests::aimed_kill::kill_when;
use integration_tests::service_process::{ServiceProcess, processor_state_dir};
use integration_tests::{
    Isolation, bootstrap_servers, client_config, create_topic, produce_records, read_topic,
    unique_name, wait_until_consumed,
};
use rdkafka::Message as _;
use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::message::{Headers as _, OwnedMessage};
use serde_json::{Value, json};

/// A record to write with headers of its own: key, value, headers.
type HeaderedRecord<'a> = (Option<String>, Vec<u8>, Vec<(&'a str, String)>);

/// Each run below drains (the group commits the input's end) within this, once its last record
/// is written.
const DRAIN_BOUND: Duration = Duration::from_secs(60);
/// How long an aimed kill may look for an open transaction.
const AIM_WITHIN: Duration = Duration::from_secs(30);
/// Cards, each with an approval, a refusal over its limit and an approval the next day.
const CARDS: usize = 30;
/// The limit the processor runs with: an authorisation of 90.00 then one of 50.00 on one day is
/// refused.
const DAILY_LIMIT: &str = "100.00";

/// The topics, group and instance of one card-authorisations pipeline.
struct Pipeline {
    bootstrap: String,
    input: String,
    approved: String,
    flagged: String,
    group: String,
    instance: &'static str,
}

impl Pipeline {
    async fn create(name: &str) -> anyhow::Result<Self> {
        let pipeline = Self {
            bootstrap: bootstrap_servers(),
            input: unique_name(&format!("{name}-auths")),
            approved: unique_name(&format!("{name}-approved")),
            flagged: unique_name(&format!("{name}-flagged")),
            group: unique_name(&format!("{name}-cards")),
            instance: "final-0",
        };
        create_topic(&pipeline.input, 2).await?;
        Ok(pipeline)
    }

    fn dlq(&self) -> String {
        format!("{}.dlq", self.input)
    }

    /// The example's binary with `daily_limit`, committing every `commit_interval`.
    fn spawn(&self, daily_limit: &str, commit_interval: &str) -> anyhow::Result<ServiceProcess> {
        ServiceProcess::spawn(
            "card-authorisations",
            &self.args(daily_limit, commit_interval),
            &[],
        )
    }

    /// The example binary's command line.
    fn args(&self, daily_limit: &str, commit_interval: &str) -> Vec<String> {
        argv!(card_authorisations::Args {
            processor.kafka.bootstrap_servers: &self.bootstrap,
            processor.input_topic: &self.input,
            processor.output_topic: &self.approved,
            processor.outputs: format!("{FLAGGED_OUTPUT}={}", self.flagged),
            processor.group_id: &self.group,
            processor.instance.instance_id: self.instance,
            processor.metrics_addr: "127.0.0.1:0",
            processor.commit_interval: commit_interval,
            daily_limit: daily_limit,
            flag_at: "1000.00",
        })
    }

    /// Waits until the group has committed the input's end, within [`DRAIN_BOUND`]; how long
    /// that took.
    fn drain(&self, processor: &ServiceProcess) -> anyhow::Result<Duration> {
        let started = Instant::now();
        wait_until_consumed(&self.bootstrap, &self.group, &self.input, DRAIN_BOUND)
            .with_context(|| processor.log_tail(40))?;
        Ok(started.elapsed())
    }

    /// Forgets the instance's local store, so that its next start restores cold, from the
    /// changelog alone.
    fn forget_local_state(&self) -> anyhow::Result<()> {
        let dir = eos_processor::state_store::instance_dir(
            &processor_state_dir(),
            &self.group,
            self.instance,
        );
        std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))
    }
}

/// An authorisation of `amount` on `card` at `at`, keyed by the card.
fn authorisation(
    auth_id: &str,
    card: &str,
    amount: &str,
    merchant: &str,
    at: time::OffsetDateTime,
) -> (Option<String>, Vec<u8>) {
    let at = at
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default();
    let value = json!({
        "auth_id": auth_id, "card": card, "amount": amount, "currency": "EUR",
        "merchant": merchant, "at": at,
    });
    (Some(card.to_owned()), value.to_string().into_bytes())
}

/// Yesterday and today at 10:00 UTC: within the default dedup horizon, and two days, so the
/// second day's first authorisation starts the card's spend from zero.
fn days() -> (time::OffsetDateTime, time::OffsetDateTime) {
    let today = time::OffsetDateTime::now_utc()
        .replace_time(time::macros::time!(10:00))
        .min(time::OffsetDateTime::now_utc());
    (today - time::Duration::days(1), today)
}

/// The three kinds of authorisation per card: approved (`x`), refused over the limit (`r`),
/// refused for a malformed amount (`b`, every third card) and, the next day, approved (`y`).
struct Cards {
    first: Vec<(Option<String>, Vec<u8>)>,
}

fn card(k: usize) -> String {
    format!("card-{k}")
}

fn first_outcomes() -> Cards {
    let (yesterday, today) = days();
    let mut first = Vec::new();
    for k in 0..CARDS {
        let card = card(k);
        let second = time::Duration::seconds(k as i64);
        first.push(authorisation(
            &format!("x-{k}"),
            &card,
            "90.00",
            "m-1",
            yesterday + second,
        ));
        first.push(authorisation(
            &format!("r-{k}"),
            &card,
            "50.00",
            "m-2",
            yesterday + second,
        ));
        if k % 3 == 0 {
            first.push(authorisation(
                &format!("b-{k}"),
                &card,
                "12.5x",
                "m-3",
                yesterday + second,
            ));
        }
        first.push(authorisation(
            &format!("y-{k}"),
            &card,
            "10.00",
            "m-4",
            today + second,
        ));
    }
    Cards { first }
}

/// Re-deliveries after the first outcomes: every refused authorisation again with its content (a
/// duplicate: its spend would fit now, since the card's day moved on), every even card's refused
/// one with a smaller amount (a conflict), the malformed ones again (duplicates), and the
/// approved ones again, every fifth with other content (a conflict).
fn redeliveries(cards: &Cards) -> Vec<(Option<String>, Vec<u8>)> {
    let (yesterday, _) = days();
    let by_id: BTreeMap<String, &(Option<String>, Vec<u8>)> = cards
        .first
        .iter()
        .map(|record| (auth_id(&record.1), record))
        .collect();
    let mut again = Vec::new();
    for k in 0..CARDS {
        let card = card(k);
        let second = time::Duration::seconds(k as i64);
        again.push(by_id[&format!("r-{k}")].clone());
        if k % 2 == 0 {
            again.push(authorisation(
                &format!("r-{k}"),
                &card,
                "5.00",
                "m-2",
                yesterday + second,
            ));
        }
        if k % 3 == 0 {
            again.push(by_id[&format!("b-{k}")].clone());
        }
        again.push(by_id[&format!("x-{k}")].clone());
        if k % 5 == 0 {
            again.push(authorisation(
                &format!("x-{k}"),
                &card,
                "1.00",
                "m-1",
                yesterday + second,
            ));
        }
    }
    again
}

fn auth_id(value: &[u8]) -> String {
    serde_json::from_slice::<Value>(value)
        .ok()
        .and_then(|value| value["auth_id"].as_str().map(str::to_owned))
        .unwrap_or_default()
}

fn header<'a>(message: &'a OwnedMessage, name: &str) -> Option<&'a str> {
    message
        .headers()?
        .iter()
        .filter(|h| h.key == name)
        .last()
        .and_then(|h| h.value)
        .and_then(|v| std::str::from_utf8(v).ok())
}

/// Whether a transaction is open on one of `topics`: a partition whose last stable offset is
/// behind its end. Asked while the processor is frozen, that is a batch a SIGKILL now loses.
fn transaction_open_on(topics: &[&str]) -> anyhow::Result<bool> {
    let committed: BaseConsumer = client_config()
        .set("isolation.level", "read_committed")
        .create()?;
    let uncommitted: BaseConsumer = client_config()
        .set("isolation.level", "read_uncommitted")
        .create()?;
    for topic in topics {
        let metadata = uncommitted.fetch_metadata(Some(topic), Duration::from_secs(10))?;
        for partition in metadata.topics().iter().flat_map(|t| t.partitions()) {
            let (_, end) =
                uncommitted.fetch_watermarks(topic, partition.id(), Duration::from_secs(10))?;
            let (_, stable) =
                committed.fetch_watermarks(topic, partition.id(), Duration::from_secs(10))?;
            if stable < end {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

/// What one event id came to, as committed: its dead letters (reason, transform code, source
/// offset) and how many outputs it has on each output.
#[derive(Debug, Default)]
struct Outcomes {
    dead_letters: Vec<(String, String, String)>,
    approved: usize,
    flagged: usize,
}

fn committed_outcomes(pipeline: &Pipeline) -> anyhow::Result<BTreeMap<String, Outcomes>> {
    let mut outcomes: BTreeMap<String, Outcomes> = BTreeMap::new();
    for letter in read_topic(&pipeline.dlq(), Isolation::ReadCommitted)? {
        let id = auth_id(letter.payload().unwrap_or_default());
        let field = |name| header(&letter, name).unwrap_or_default().to_owned();
        outcomes.entry(id).or_default().dead_letters.push((
            field(dead_letter::REASON_HEADER),
            field(dead_letter::TRANSFORM_REASON_HEADER),
            field(dead_letter::SOURCE_OFFSET_HEADER),
        ));
    }
    for message in read_topic(&pipeline.approved, Isolation::ReadCommitted)? {
        let id = header(&message, "event_id").unwrap_or_default().to_owned();
        outcomes.entry(id).or_default().approved += 1;
    }
    for message in read_topic(&pipeline.flagged, Isolation::ReadCommitted)? {
        let id = header(&message, "event_id").unwrap_or_default().to_owned();
        outcomes.entry(id).or_default().flagged += 1;
    }
    Ok(outcomes)
}

/// The finality rule under SIGKILL: refused authorisations (over the daily limit, a malformed
/// amount) re-delivered with the same content are counted duplicates — no second dead letter, and
/// no approval although the card's spend would allow it by then — and with other content
/// `event_id_conflict`s; the same after a SIGKILL and a cold restore from the changelog, and with
/// a SIGKILL aimed at an open transaction of the re-deliveries and a warm restore after it.
#[test]
fn a_refused_event_keeps_its_outcome_through_redeliveries_and_sigkills() -> anyhow::Result<()> {
    let started = Instant::now();
    let runtime = tokio::runtime::Runtime::new()?;
    let pipeline = runtime.block_on(Pipeline::create("final"))?;
    let cards = first_outcomes();
    produce_records(&pipeline.input, &cards.first)?;
    let mut first = pipeline.spawn(DAILY_LIMIT, "100ms")?;
    let drained = pipeline.drain(&first)?;
    eprintln!("first outcomes drained in {drained:?}");
    // Idle, so nothing is lost; its store goes too, so the next start restores cold.
    first.kill_hard()?;
    pipeline.forget_local_state()?;

    // A long commit interval keeps each batch's transaction open long enough to aim at.
    let mut second = pipeline.spawn(DAILY_LIMIT, "1s")?;
    second.wait_for_log_line("state restored", Duration::from_secs(60))?;
    produce_records(&pipeline.input, &redeliveries(&cards))?;
    let dlq = pipeline.dlq();
    let topics = [dlq.as_str(), pipeline.approved.as_str()];
    kill_when(&mut second, AIM_WITHIN, || {
        Ok(transaction_open_on(&topics)?.then_some(()))
    })?
    .with_context(|| {
        format!(
            "no open transaction of the re-deliveries within {AIM_WITHIN:?}\n{}",
            second.log_tail(30)
        )
    })?;
    // The same instance again: its init_transactions aborts the open batch, and it restores warm.
    let mut third = pipeline.spawn(DAILY_LIMIT, "100ms")?;
    let drained = pipeline.drain(&third)?;
    eprintln!("re-deliveries drained in {drained:?} after the aimed kill");
    third.stop_gracefully()?;

    let outcomes = committed_outcomes(&pipeline)?;
    let none = Outcomes::default();
    for k in 0..CARDS {
        let refused = format!("r-{k}");
        let got = outcomes.get(&refused).unwrap_or(&none);
        assert_eq!(
            got.approved, 0,
            "{refused} was refused over its daily limit, then approved when re-delivered: {got:?}"
        );
        let over_limit = got
            .dead_letters
            .iter()
            .filter(|(_, code, _)| code == "over_daily_limit")
            .count();
        assert_eq!(
            over_limit, 1,
            "{refused}: one over_daily_limit dead letter, its re-delivery a duplicate: {got:?}"
        );
        let conflicts = got
            .dead_letters
            .iter()
            .filter(|(reason, _, _)| reason == "event_id_conflict")
            .count();
        assert_eq!(
            conflicts,
            usize::from(k % 2 == 0),
            "{refused}: other content after a refusal is an event_id_conflict: {got:?}"
        );
        if k % 3 == 0 {
            let malformed = format!("b-{k}");
            let got = outcomes.get(&malformed).unwrap_or(&none);
            assert_eq!(
                (got.dead_letters.len(), got.approved),
                (1, 0),
                "{malformed}: one invalid_amount dead letter, its re-delivery a duplicate: {got:?}"
            );
            assert_eq!(got.dead_letters[0].1, "invalid_amount", "{got:?}");
        }
        for approved in [format!("x-{k}"), format!("y-{k}")] {
            let got = outcomes.get(&approved).unwrap_or(&none);
            assert_eq!(got.approved, 1, "{approved}: approved once: {got:?}");
            let conflicts = usize::from(approved.starts_with('x') && k % 5 == 0);
            assert_eq!(got.dead_letters.len(), conflicts, "{approved}: {got:?}");
        }
    }
    // The replay, under the configuration of the run's binary, decides as the run did.
    let (expected, run) = replay_run(&pipeline.args(DAILY_LIMIT, "100ms"), example_transform)?;
    assert_replay_exact(&expected, &run);
    eprintln!("finality under SIGKILL: {:?} in all", started.elapsed());
    Ok(())
}

/// Runs the real `eosctl` with `args` against the local stack; its JSON answer.
fn eosctl_json(args: &[&str]) -> anyhow::Result<Value> {
    let output = std::process::Command::new(integration_tests::workspace_binary("eosctl")?)
        .args(args)
        .args(["--bootstrap-servers", &bootstrap_servers(), "--json"])
        .output()?;
    anyhow::ensure!(
        output.status.success(),
        "eosctl {args:?}: {}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).context("eosctl printed no JSON")
}

/// A re-drive exactly once, with a SIGKILL during it: authorisations refused over a daily limit
/// of 100.00; the limit raised to 1,000.00 and the processor restarted; an operator re-drives
/// the over_daily_limit dead letters with `eosctl dead-letters redrive`, and the processor is
/// SIGKILLed while the re-drive's approvals are in an open transaction. Meanwhile the re-drive
/// records are delivered a second time and the refused authorisations re-delivered plainly. Each
/// refused authorisation is then approved exactly once, by that re-drive (its output names it),
/// its dead letter stays the only one, and the log says who re-drove it and why; the same
/// command again re-drives nothing.
#[test]
fn a_redrive_replaces_a_refusal_exactly_once_under_sigkill() -> anyhow::Result<()> {
    let started = Instant::now();
    let runtime = tokio::runtime::Runtime::new()?;
    let pipeline = runtime.block_on(Pipeline::create("redrive"))?;
    let (yesterday, _) = days();
    let mut first = Vec::new();
    for k in 0..CARDS {
        let second = time::Duration::seconds(k as i64);
        first.push(authorisation(
            &format!("x-{k}"),
            &card(k),
            "90.00",
            "m-1",
            yesterday + second,
        ));
        first.push(authorisation(
            &format!("r-{k}"),
            &card(k),
            "50.00",
            "m-2",
            yesterday + second,
        ));
    }
    produce_records(&pipeline.input, &first)?;
    let mut strict = pipeline.spawn(DAILY_LIMIT, "100ms")?;
    pipeline.drain(&strict)?;
    strict.stop_gracefully()?;

    // The limit raised; the refusals stand until an operator re-drives them.
    let raised = "1000.00";
    let mut second = pipeline.spawn(raised, "1s")?;
    second.wait_for_log_line("state restored", Duration::from_secs(60))?;
    let dlq = pipeline.dlq();
    let redrive_args = [
        "dead-letters",
        "redrive",
        "--dlq",
        &dlq,
        "--transform-reason",
        "over_daily_limit",
        "--event-id",
        "/auth_id",
        "--by",
        "it-operator",
        "--why",
        "daily limit raised to 1000.00",
    ];
    let redrive = eosctl_json(&redrive_args)?;
    let redrive_id = redrive["redrive_id"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert_eq!(
        redrive["redriven"].as_array().map(Vec::len),
        Some(CARDS),
        "{redrive}"
    );
    let approved = pipeline.approved.clone();
    kill_when(&mut second, AIM_WITHIN, || {
        Ok(transaction_open_on(&[approved.as_str()])?.then_some(()))
    })?
    .with_context(|| {
        format!(
            "no open transaction of the re-drive within {AIM_WITHIN:?}\n{}",
            second.log_tail(30)
        )
    })?;
    // The re-drive records delivered again (a retrying producer), and the refused ones
    // re-delivered plainly: duplicates, all of them.
    let redrive_copies: Vec<HeaderedRecord<'_>> =
        read_topic(&pipeline.input, Isolation::ReadCommitted)?
            .iter()
            .filter(|record| header(record, eos_core::redrive::REDRIVE_ID_HEADER).is_some())
            .map(|record| {
                let headers = [
                    eos_core::redrive::REDRIVE_ID_HEADER,
                    eos_core::redrive::REDRIVEN_BY_HEADER,
                ]
                .into_iter()
                .filter_map(|name| Some((name, header(record, name)?.to_owned())))
                .collect();
                (
                    record
                        .key()
                        .map(|key| String::from_utf8_lossy(key).into_owned()),
                    record.payload().unwrap_or_default().to_vec(),
                    headers,
                )
            })
            .collect();
    assert_eq!(redrive_copies.len(), CARDS);
    produce_with_headers(&pipeline.input, &redrive_copies)?;
    let refused_again: Vec<_> = first
        .iter()
        .filter(|(_, value)| auth_id(value).starts_with("r-"))
        .cloned()
        .collect();
    produce_records(&pipeline.input, &refused_again)?;
    let mut third = pipeline.spawn(raised, "100ms")?;
    let drained = pipeline.drain(&third)?;
    eprintln!("re-drive drained in {drained:?} after the aimed kill");
    third.stop_gracefully()?;

    let outcomes = committed_outcomes(&pipeline)?;
    let redriven_by: BTreeMap<String, String> =
        read_topic(&pipeline.approved, Isolation::ReadCommitted)?
            .iter()
            .filter_map(|output| {
                Some((
                    header(output, "event_id")?.to_owned(),
                    header(output, eos_core::redrive::REDRIVE_ID_HEADER)?.to_owned(),
                ))
            })
            .collect();
    let none = Outcomes::default();
    for k in 0..CARDS {
        let refused = format!("r-{k}");
        let got = outcomes.get(&refused).unwrap_or(&none);
        assert_eq!(
            got.approved, 1,
            "{refused}: approved exactly once, by the re-drive: {got:?}"
        );
        assert_eq!(redriven_by.get(&refused), Some(&redrive_id), "{refused}");
        assert_eq!(
            got.dead_letters.len(),
            1,
            "{refused}: its refusal is the only dead letter: {got:?}"
        );
        let approved = format!("x-{k}");
        let got = outcomes.get(&approved).unwrap_or(&none);
        assert_eq!((got.approved, got.dead_letters.len()), (1, 0), "{approved}");
    }
    let log: Vec<Value> = read_topic(
        &format!("{}.redrives", pipeline.input),
        Isolation::ReadCommitted,
    )?
    .iter()
    .filter_map(|record| serde_json::from_slice(record.payload()?).ok())
    .collect();
    assert_eq!(log.len(), CARDS, "one log record per dead letter re-driven");
    for record in &log {
        assert_eq!(record["redriven_by"], "it-operator");
        assert_eq!(record["reason"], "daily limit raised to 1000.00");
        assert_eq!(record["redrive_id"], redrive_id.as_str());
    }
    // The act is on the record: listed as re-driven, and not re-driven twice.
    let listed = eosctl_json(&[
        "dead-letters",
        "list",
        "--dlq",
        &dlq,
        "--event-id",
        "/auth_id",
        "--transform-reason",
        "over_daily_limit",
    ])?;
    let listed = listed.as_array().cloned().unwrap_or_default();
    assert_eq!(listed.len(), CARDS);
    assert!(
        listed
            .iter()
            .all(|letter| letter["redriven"]["redrive_id"] == redrive_id.as_str()),
        "{listed:?}"
    );
    let again = eosctl_json(&redrive_args)?;
    assert_eq!(
        again["redriven"].as_array().map(Vec::len),
        Some(0),
        "{again}"
    );
    assert_eq!(again["skipped"].as_array().map(Vec::len), Some(CARDS));
    eprintln!("re-drive exactly once: {:?} in all", started.elapsed());
    Ok(())
}

/// Writes `records` (key, value, headers) to `topic` with an idempotent producer: what a
/// processor of the code before finality wrote, forged after the fact.
fn produce_with_headers(topic: &str, records: &[HeaderedRecord<'_>]) -> anyhow::Result<()> {
    use rdkafka::message::{Header, OwnedHeaders};
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer as _};
    let producer: BaseProducer =
        eos_runtime::kafka_clients::idempotent_producer(&client_config()).create()?;
    for (key, value, headers) in records {
        let mut owned = OwnedHeaders::new();
        for (name, header) in headers {
            owned = owned.insert(Header {
                key: name,
                value: Some(header.as_bytes()),
            });
        }
        let mut record = BaseRecord::<str, [u8]>::to(topic)
            .payload(value.as_slice())
            .headers(owned);
        if let Some(key) = key {
            record = record.key(key.as_str());
        }
        producer.send(record).map_err(|(error, _)| error)?;
    }
    producer.flush(Duration::from_secs(30))?;
    Ok(())
}

/// The audit flags an event id with two outcomes: the ledger through the real eos-processor
/// (an overflow refused, its re-delivery a duplicate although a refund made room) is exact;
/// then what the processor before finality committed on top — the re-delivery applied (an output
/// after the refusal), then refused a second time (another dead letter) — is `two_outcomes`,
/// once per extra outcome, in `eosctl audit` and in its replay proof.
#[test]
fn the_audit_flags_an_event_id_with_two_outcomes() -> anyhow::Result<()> {
    let bootstrap = bootstrap_servers();
    let (input, output, group) = (
        unique_name("two-outcomes-payments"),
        unique_name("two-outcomes-ledger"),
        unique_name("two-outcomes-processor"),
    );
    tokio::runtime::Runtime::new()?.block_on(create_topic(&input, 1))?;
    let dlq = format!("{input}.dlq");
    let ledger = |event_id: &str, value: i64| {
        (
            Some("big".to_owned()),
            json!({"event_id": event_id, "entity_id": "big", "value": value})
                .to_string()
                .into_bytes(),
        )
    };
    let events = [
        ledger("e-a", i64::MAX - 10),
        ledger("e-b", 100), // overflows
        ledger("e-c", -200),
        ledger("e-b", 100), // re-delivered: it would fit now, but its outcome is final
    ];
    produce_records(&input, &events)?;
    let args = argv!(eos_processor::Config {
        kafka.bootstrap_servers: &bootstrap,
        input_topic: &input,
        output_topic: &output,
        group_id: &group,
        instance.instance_id: "two-outcomes",
        metrics_addr: "127.0.0.1:0",
    });
    let mut processor = ServiceProcess::spawn("eos-processor", &args, &[])?;
    let started = Instant::now();
    wait_until_consumed(&bootstrap, &group, &input, DRAIN_BOUND)
        .with_context(|| processor.log_tail(40))?;
    eprintln!("ledger drained in {:?}", started.elapsed());
    processor.stop_gracefully()?;
    let exact = integration_tests::eosctl::audit(&input, &output, &dlq)?;
    assert!(exact.passed(), "audit not exact:\n{}", exact.failures());
    assert_eq!(exact.violations("two_outcomes"), 0);
    assert_eq!(exact.figure("duplicate_deliveries"), 1);

    // The code before: the re-delivery at offset 3 applied, with the totals it had then.
    let applied_again = json!({
        "event_id": "e-b", "entity_id": "big", "value": 100,
        "entity_total": i64::MAX - 110, "entity_count": 3,
        "source": {"topic": input, "partition": 0, "offset": 3},
    });
    produce_records(
        &output,
        &[(
            Some("big".to_owned()),
            applied_again.to_string().into_bytes(),
        )],
    )?;
    let audit = integration_tests::eosctl::audit(&input, &output, &dlq)?;
    assert!(!audit.passed(), "a refusal and an output for e-b passed");
    assert_eq!(audit.violations("two_outcomes"), 1, "{}", audit.failures());
    assert_eq!(
        audit.report["violations"]["two_outcomes"]["examples"][0],
        "e-b"
    );
    // And refused a second time: another dead letter that judged e-b.
    let (_, refused_again) = ledger("e-b", 100);
    produce_with_headers(
        &dlq,
        &[(
            Some("big".to_owned()),
            refused_again,
            vec![
                (dead_letter::REASON_HEADER, "total_overflow".to_owned()),
                (dead_letter::SOURCE_TOPIC_HEADER, input.clone()),
                (dead_letter::SOURCE_PARTITION_HEADER, "0".to_owned()),
                (dead_letter::SOURCE_OFFSET_HEADER, "3".to_owned()),
                (dead_letter::TRUNCATED_HEADER, "false".to_owned()),
            ],
        )],
    )?;
    let audit = integration_tests::eosctl::audit(&input, &output, &dlq)?;
    assert_eq!(audit.violations("two_outcomes"), 2, "{}", audit.failures());
    // The replay proof, deciding as the processor does, names it too.
    let replay = integration_tests::eosctl::audit_with(
        &bootstrap,
        &input,
        &output,
        &dlq,
        &["--replay", "--transform", "ledger"],
    )?;
    assert_eq!(replay.exit_code, 1, "{}", replay.report);
    assert_eq!(replay.report["two_outcomes"], 1, "{}", replay.report);
    assert_eq!(replay.report["examples"]["two_outcomes"][0], "e-b");
    Ok(())
}
