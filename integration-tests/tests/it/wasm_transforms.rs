//! A WebAssembly transform under the processor's chaos test (docs/TRANSFORMS.md "WebAssembly
//! transforms"): the card-authorisations logic written in Go (examples/wasm/go, built from
//! source by examples/wasm/build) runs in the real `eos-processor` binary with
//! `--transform wasm:PATH` while card authorisations with re-deliveries are produced and the
//! binary is SIGKILLed at random moments; then the replay proof (`eos_processor::replay`), run
//! with the same module, must find every approved and flagged output and every refusal exactly
//! once, as computed — in the test, and in `eosctl audit --replay --transform wasm:PATH`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use eos_core::{EventContract, FieldLocation};
use eos_processor::DEFAULT_OUTPUT;
use eos_processor::wasm::{Options, WasmTransform};
use eos_runtime::kafka_clients;
use eos_testkit::argv;
use eos_transform::replay::{self, RunTopics};
use integration_tests::service_process::ServiceProcess;
use integration_tests::{
    Isolation, bootstrap_servers, client_config, create_topic, read_topic, unique_name,
    wait_until_consumed,
};
use rand::{Rng as _, SeedableRng as _};
use rdkafka::Message as _;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer as _};
use serde_json::json;

use crate::card_authorisations::{READ_STALL, assert_replay_exact, header, replay_paths};

const AUTHORISATIONS: usize = 2_000;
const CARDS: usize = 200;
const KILLS: usize = 5;
/// The Go module's second output (its daily limit is 1000.00, its flag threshold 500.00).
const FLAGGED: &str = "flagged";

/// The module, built from source: the build script fails when Go is missing, never skips.
/// Built once per test run: two tests building at once could each load a module the other is
/// writing.
fn card_module() -> anyhow::Result<PathBuf> {
    static BUILT: std::sync::OnceLock<Result<PathBuf, String>> = std::sync::OnceLock::new();
    let build = || -> anyhow::Result<PathBuf> {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .context("integration-tests lives inside the workspace")?
            .to_owned();
        let status = std::process::Command::new(root.join("examples/wasm/build")).status()?;
        anyhow::ensure!(status.success(), "examples/wasm/build failed");
        Ok(root.join("target/wasm/card.wasm"))
    };
    BUILT
        .get_or_init(|| build().map_err(|error| format!("{error:#}")))
        .clone()
        .map_err(anyhow::Error::msg)
}

/// Where the authorisations keep their id, card and time: given to the binary as flags and
/// to the replay as the same contract.
fn contract() -> EventContract {
    EventContract {
        event_id: FieldLocation::Pointer("/auth_id".into()),
        entity: FieldLocation::Pointer("/card".into()),
        occurred_at: Some("/at".into()),
        ..EventContract::default()
    }
}

/// Each card's authorisations over one UTC day (about ten per card, up to 700.00 each, so the
/// later ones pass the limit and about a quarter are flagged), 5% sent twice: (card, value).
fn authorisations(seed: u64) -> anyhow::Result<Vec<(String, Vec<u8>)>> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let midnight = time::OffsetDateTime::now_utc().replace_time(time::Time::MIDNIGHT);
    let mut records = Vec::with_capacity(AUTHORISATIONS * 21 / 20);
    for n in 0..AUTHORISATIONS {
        let card = format!("card-{}", rng.random_range(0..CARDS));
        let at = midnight + time::Duration::seconds(n as i64);
        let value = json!({
            "auth_id": format!("auth-{seed}-{n}"),
            "card": card,
            "amount": card_authorisations::decimal(rng.random_range(100..70_000)),
            "currency": if rng.random_bool(0.8) { "EUR" } else { "USD" },
            "merchant": format!("m-{}", rng.random_range(0..500)),
            "at": at.format(&time::format_description::well_known::Rfc3339)?,
        })
        .to_string()
        .into_bytes();
        if rng.random_bool(0.05) {
            records.push((card.clone(), value.clone()));
        }
        records.push((card, value));
    }
    Ok(records)
}

/// Writes `records` at about `rate` per second, idempotently.
fn produce(topic: &str, records: &[(String, Vec<u8>)], rate: u64) -> anyhow::Result<()> {
    let producer: BaseProducer = kafka_clients::idempotent_producer(&client_config())
        .set("linger.ms", "5")
        .create()?;
    let started = std::time::Instant::now();
    for (sent, (card, value)) in records.iter().enumerate() {
        loop {
            match producer.send(BaseRecord::to(topic).key(card).payload(value)) {
                Ok(()) => break,
                Err((error, _)) if error.rdkafka_error_code().is_some() => {
                    producer.poll(Duration::from_millis(50));
                }
                Err((error, _)) => return Err(error.into()),
            }
        }
        producer.poll(Duration::ZERO);
        let due = Duration::from_secs_f64(sent as f64 / rate as f64);
        if let Some(wait) = due.checked_sub(started.elapsed()) {
            std::thread::sleep(wait);
        }
    }
    producer.flush(Duration::from_secs(60))?;
    Ok(())
}

#[test]
fn a_go_webassembly_transform_survives_repeated_sigkill_and_replays_exactly() -> anyhow::Result<()>
{
    let module = card_module()?;
    let bootstrap = bootstrap_servers();
    let input = unique_name("wasm-auths");
    let approved = unique_name("wasm-approved");
    let flagged = unique_name("wasm-flagged");
    let group = unique_name("wasm-cards");
    tokio::runtime::Runtime::new()?.block_on(create_topic(&input, 3))?;
    let seed = 20_261_234;
    let records = authorisations(seed)?;
    let producer = {
        let (input, records) = (input.clone(), records.clone());
        std::thread::spawn(move || produce(&input, &records, 80))
    };
    let args = argv!(eos_processor::ServiceConfig {
        processor.kafka.bootstrap_servers: &bootstrap,
        transform: format!("wasm:{}", module.display()),
        processor.event_id: "/auth_id",
        processor.entity: "/card",
        processor.occurred_at: "/at",
        processor.input_topic: &input,
        processor.output_topic: &approved,
        processor.outputs: format!("{FLAGGED}={flagged}"),
        processor.group_id: &group,
        processor.instance.instance_id: "wasm-cards",
        processor.metrics_addr: "127.0.0.1:0",
    });
    let spawn = || ServiceProcess::spawn("eos-processor", &args, &[]);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    for _ in 0..KILLS {
        let mut processor = spawn()?;
        // Compiling the Go module takes seconds in a debug build: a kill at a fixed time after
        // the spawn could land before any record is processed, so it is timed from the first
        // restored partition instead.
        processor.wait_for_log_line("state restored", Duration::from_secs(60))?;
        std::thread::sleep(Duration::from_millis(rng.random_range(200..1_500)));
        let status = processor.kill_hard()?;
        assert!(
            status.code().is_none(),
            "killed by a signal, not exited: {status}\n{}",
            processor.log_tail(30)
        );
    }
    let mut last = spawn()?;
    producer
        .join()
        .map_err(|_| anyhow::anyhow!("producer thread panicked"))??;
    wait_until_consumed(&bootstrap, &group, &input, Duration::from_secs(180))
        .with_context(|| last.log_tail(40))?;
    // Which module runs shows on /boundary and as a metric label.
    let digest = eos_processor::wasm::digest(&std::fs::read(&module)?);
    let addr = last.wait_for_log_field("metrics_addr", Duration::from_secs(30))?;
    let boundary: serde_json::Value =
        reqwest::blocking::get(format!("http://{addr}/boundary"))?.json()?;
    assert_eq!(
        boundary["transform"],
        format!("webassembly module {digest}"),
        "{boundary}"
    );
    let metrics = reqwest::blocking::get(format!("http://{addr}/metrics"))?.text()?;
    assert!(
        metrics.contains(&format!(
            "eos_processor_transform_module_info{{digest=\"{digest}\"}} 1"
        )),
        "{metrics}"
    );
    last.stop_gracefully()?;

    let topics = RunTopics {
        input: input.clone(),
        outputs: [(DEFAULT_OUTPUT, &approved), (FLAGGED, &flagged)]
            .map(|(name, topic)| (name.to_owned(), topic.clone()))
            .into(),
        dead_letters: format!("{input}.dlq"),
    };
    let run = replay::read_committed_run(&client_config(), &topics, READ_STALL)?;
    assert_eq!(
        run.inputs.len(),
        records.len(),
        "every record produced is read"
    );
    let mut codes: BTreeMap<String, usize> = BTreeMap::new();
    for letter in read_topic(&format!("{input}.dlq"), Isolation::ReadCommitted)? {
        *codes
            .entry(
                header(&letter, "eos-dlq-transform-reason")
                    .unwrap_or("-")
                    .to_owned(),
            )
            .or_default() += 1;
    }
    // Every dead letter is the module's own refusal: no trap, no limit, no state of another
    // module across the restarts.
    assert_eq!(
        codes.keys().map(String::as_str).collect::<Vec<_>>(),
        ["over_daily_limit"],
        "{codes:?}"
    );

    // The replay runs the same module, loaded afresh, over the committed input.
    let transform = WasmTransform::load(&module, Options::default())?;
    let expected = replay::expected(&transform, &contract(), &topics.output_names(), &run.inputs)?;
    let paths = replay_paths(&expected, records.len(), FLAGGED);
    assert!(
        paths.0 > 500 && paths.1 > 100 && paths.2 > 100 && paths.3 > 20,
        "(applied, flagged, refused, duplicates) = {paths:?}"
    );
    eprintln!("replayed (applied, flagged, refused, duplicates) = {paths:?}");
    assert_replay_exact(&expected, &run);

    // The operator's proof of the same run: eosctl loads the module with the processor's host
    // and takes the flags the processor had.
    let started = std::time::Instant::now();
    let flagged_output = format!("{FLAGGED}={flagged}");
    let proof = integration_tests::eosctl::audit_with(
        &bootstrap,
        &input,
        &approved,
        &topics.dead_letters,
        &[
            "--replay",
            "--transform",
            &format!("wasm:{}", module.display()),
            "--event-id",
            "/auth_id",
            "--entity",
            "/card",
            "--occurred-at",
            "/at",
            "--named-output",
            &flagged_output,
        ],
    )?;
    eprintln!("eosctl audit --replay wasm: in {:?}", started.elapsed());
    assert!(proof.passed(), "{}", proof.report);
    assert_eq!(
        proof.report["transform"],
        format!("webassembly module {}", transform.digest())
    );
    assert_eq!(
        proof.report["matched"].as_u64(),
        Some(run.outputs.len() as u64),
        "{}",
        proof.report
    );
    assert_eq!(
        proof.report["dead_letters"].as_u64(),
        Some(expected.dead_letters.len() as u64)
    );

    // Another module over the state the Go module wrote: the same logic in AssemblyScript, so
    // another digest. Without a word from the operator it is refused at the first state it
    // restores, and nothing of the new authorisation is committed; with
    // --wasm-state-compatible (its state format is the Go module's) it goes on.
    let other = module.with_file_name("card-as.wasm");
    let other_args: Vec<String> = args
        .iter()
        .map(|arg| {
            if arg.starts_with("wasm:") {
                format!("wasm:{}", other.display())
            } else {
                arg.clone()
            }
        })
        .collect();
    let (card, _) = &records[0];
    let late = json!({
        "auth_id": "a-late", "card": card, "amount": "0.01", "currency": "EUR",
        "merchant": "m-late", "at": "2026-12-04T23:59:00Z",
    })
    .to_string()
    .into_bytes();
    produce(&input, &[(card.clone(), late)], 100)?;
    let mut refused = ServiceProcess::spawn("eos-processor", &other_args, &[])?;
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(status) = refused.try_wait()? {
            break status;
        }
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "a module over another module's state kept running\n{}",
            refused.log_tail(30)
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let log = refused.log_tail(60);
    assert!(!status.success(), "exited with {status}\n{log}");
    assert!(
        log.contains(transform.digest()) && log.contains("--wasm-state-compatible"),
        "the error names the digest that wrote the state and the way out\n{log}"
    );
    let approved_before = read_topic(&approved, Isolation::ReadCommitted)?.len();
    let compatible_args: Vec<String> = other_args
        .iter()
        .cloned()
        .chain(["--wasm-state-compatible".to_owned()])
        .collect();
    let mut compatible = ServiceProcess::spawn("eos-processor", &compatible_args, &[])?;
    wait_until_consumed(&bootstrap, &group, &input, Duration::from_secs(120))
        .with_context(|| compatible.log_tail(40))?;
    compatible.stop_gracefully()?;
    let approved_after = read_topic(&approved, Isolation::ReadCommitted)?;
    assert_eq!(approved_after.len(), approved_before + 1);
    let last: serde_json::Value = serde_json::from_slice(
        approved_after
            .iter()
            .find(|m| header(m, "event_id") == Some("a-late"))
            .and_then(|m| m.payload())
            .context("the late authorisation is approved")?,
    )?;
    assert_eq!(last["status"], "approved", "{last}");
    Ok(())
}

/// CPU seconds (user and system) the process has used so far, from /proc.
fn cpu_seconds(pid: i32) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The fields after the command name, which is in parentheses and may hold spaces.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .context("a /proc stat line")?
        .1
        .split_whitespace()
        .collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    let ticks: f64 = fields
        .get(11..13)
        .context("utime and stime")?
        .iter()
        .map(|field| field.parse::<f64>())
        .sum::<Result<f64, _>>()?;
    // USER_HZ, 100 on Linux whatever the kernel's own tick.
    Ok(ticks / 100.0)
}

/// A module that spends wall time without fuel, in the real binary (docs/TRANSFORMS.md
/// "Determinism and limits"): examples/wasm/go/hostile echoes every event to the default
/// output, except one that makes it `clear` a 64 MiB slice for ever (one `memory.fill` a pass,
/// one unit of fuel whatever its length). First SIGTERM comes while that call hangs under a
/// 60 s limit: the processor must end within `SIGTERM_WITHIN`, committing nothing of the
/// batch. Then, restarted with the default limit (2 s), it must make that event a
/// `transform_limit` dead letter and put every other event out, on every partition, within
/// `DRAINED_WITHIN`; and the replay, running the module again, must agree.
#[test]
fn a_bulk_memory_event_is_a_dead_letter_and_sigterm_interrupts_its_call() -> anyhow::Result<()> {
    /// From SIGTERM to the exit, with the call under a 60 s limit: only its interruption can
    /// end it this soon.
    const SIGTERM_WITHIN: Duration = Duration::from_secs(10);
    /// From the restart to every event committed: compiling the module (seconds in a debug
    /// build), the 2 s limit once, and 301 events.
    const DRAINED_WITHIN: Duration = Duration::from_secs(90);
    const OTHERS: usize = 298;
    let module = card_module()?.with_file_name("hostile.wasm");
    let bootstrap = bootstrap_servers();
    let input = unique_name("wasm-hostile");
    let output = unique_name("wasm-hostile-out");
    let group = unique_name("wasm-hostile");
    tokio::runtime::Runtime::new()?.block_on(create_topic(&input, 3))?;
    let args = argv!(eos_processor::ServiceConfig {
        processor.kafka.bootstrap_servers: &bootstrap,
        transform: format!("wasm:{}", module.display()),
        processor.event_id: "/id",
        processor.entity: "/entity",
        processor.input_topic: &input,
        processor.output_topic: &output,
        processor.group_id: &group,
        processor.instance.instance_id: "wasm-hostile",
        processor.metrics_addr: "127.0.0.1:0",
        // Room for phase one's 60 s call limit (at most half of it).
        processor.transaction_timeout: "120s",
    });
    let event = |id: &str, entity: &str, extra: serde_json::Value| {
        let mut value = json!({"id": id, "entity": entity});
        if let (Some(value), Some(extra)) = (value.as_object_mut(), extra.as_object()) {
            value.extend(extra.clone());
        }
        (entity.to_owned(), value.to_string().into_bytes())
    };

    // Phase one: a warm processor (an event out on each partition, so that the group has an
    // offset on each), then the burning event.
    let warm: BaseProducer = kafka_clients::idempotent_producer(&client_config()).create()?;
    for partition in 0..3 {
        let (key, value) = event(&format!("e-warm-{partition}"), "k-warm", json!({}));
        warm.send(
            BaseRecord::to(&input)
                .partition(partition)
                .key(&key)
                .payload(&value),
        )
        .map_err(|(error, _)| error)?;
    }
    warm.flush(Duration::from_secs(30))?;
    let hanging_args: Vec<String> = args
        .iter()
        .cloned()
        .chain(["--wasm-timeout".to_owned(), "60s".to_owned()])
        .chain(argv!(eos_processor::Config {
            stall.stall_warning: "1s",
            stall.stall_restart: "3s",
        }))
        .collect();
    let mut processor = ServiceProcess::spawn("eos-processor", &hanging_args, &[])?;
    wait_until_consumed(&bootstrap, &group, &input, Duration::from_secs(120))
        .with_context(|| processor.log_tail(40))?;
    produce(
        &input,
        &[event("e-burn", "k-burn", json!({"do": "memory.fill"}))],
        100,
    )?;
    // The call spins a core for 60 s once the event is polled: wait until the processor has
    // burnt a whole second of CPU within two of wall clock, so SIGTERM lands inside the call.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut samples = std::collections::VecDeque::new();
    loop {
        let now = std::time::Instant::now();
        samples.push_back((now, cpu_seconds(processor.pid().as_raw())?));
        while samples.len() > 1 && now - samples[0].0 > Duration::from_secs(2) {
            samples.pop_front();
        }
        if samples.back().map(|s| s.1).unwrap_or_default() - samples[0].1 >= 1.0 {
            break;
        }
        anyhow::ensure!(
            now < deadline,
            "the burning event's call never ran\n{}",
            processor.log_tail(30)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // The hanging call is a stall: warned of (naming the call) and, a restart being the cure
    // for a call that never returns, past --stall-restart /healthz answers 503.
    let warning =
        processor.wait_for_log_line("no progress while work waits", Duration::from_secs(30))?;
    assert!(warning.contains("a transform call"), "{warning}");
    let metrics_addr = processor.wait_for_log_field("metrics_addr", Duration::from_secs(5))?;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let status = reqwest::blocking::get(format!("http://{metrics_addr}/healthz"))?.status();
        if status.as_u16() == 503 {
            break;
        }
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "/healthz still {status} during a hanging call\n{}",
            processor.log_tail(20)
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    let signalled = std::time::Instant::now();
    let status = processor.terminate(SIGTERM_WITHIN).with_context(|| {
        format!(
            "SIGTERM during a hanging call did not end the processor within {SIGTERM_WITHIN:?}\n{}",
            processor.log_tail(30)
        )
    })?;
    let stopped_in = signalled.elapsed();
    eprintln!("SIGTERM during a hanging call: exited in {stopped_in:?}");
    let log = processor.log_tail(40);
    assert!(status.success(), "exited with {status}\n{log}");
    assert!(
        log.contains("shutdown interrupted a transform call"),
        "the call was running when SIGTERM came\n{log}"
    );
    let letters = read_topic(&format!("{input}.dlq"), Isolation::ReadCommitted)?;
    assert!(
        letters.is_empty(),
        "nothing of the interrupted batch is committed"
    );
    assert_eq!(read_topic(&output, Isolation::ReadCommitted)?.len(), 3);

    // Phase two: the burning event among 298 others on three partitions, some behind it on
    // its own; restarted with the default limit.
    let others: Vec<(String, Vec<u8>)> = (0..OTHERS)
        .map(|n| event(&format!("e-{n}"), &format!("k-{}", n % 30), json!({"n": n})))
        .collect();
    produce(&input, &others, 2_000)?;
    let restarted = std::time::Instant::now();
    let mut processor = ServiceProcess::spawn("eos-processor", &args, &[])?;
    wait_until_consumed(&bootstrap, &group, &input, DRAINED_WITHIN)
        .with_context(|| processor.log_tail(40))?;
    let drained_in = restarted.elapsed();
    eprintln!("restarted with the default --wasm-timeout: every event committed in {drained_in:?}");
    processor.stop_gracefully()?;

    let letters = read_topic(&format!("{input}.dlq"), Isolation::ReadCommitted)?;
    assert_eq!(letters.len(), 1, "one dead letter");
    let letter = &letters[0];
    assert_eq!(
        header(letter, eos_core::dead_letter::REASON_HEADER),
        Some("transform_limit")
    );
    assert_eq!(
        header(letter, eos_core::dead_letter::TRANSFORM_REASON_HEADER),
        Some("transform_limit")
    );
    let detail = header(letter, eos_core::dead_letter::DETAIL_HEADER).unwrap_or_default();
    assert!(
        detail.contains("wall-clock limit of 2s (--wasm-timeout)"),
        "{detail}"
    );
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(letter.payload().unwrap_or_default())?["id"],
        "e-burn"
    );
    let out: std::collections::BTreeSet<String> = read_topic(&output, Isolation::ReadCommitted)?
        .iter()
        .filter_map(|m| header(m, "event_id").map(str::to_owned))
        .collect();
    assert_eq!(out.len(), OTHERS + 3, "every other event is out");
    assert!(out.contains("e-warm-0") && !out.contains("e-burn"));

    // The replay runs the module again under the default limits: the burning event meets the
    // clock there too, and the committed run is exactly what it computes.
    let topics = RunTopics {
        input: input.clone(),
        outputs: [(DEFAULT_OUTPUT.to_owned(), output.clone())].into(),
        dead_letters: format!("{input}.dlq"),
    };
    let run = replay::read_committed_run(&client_config(), &topics, READ_STALL)?;
    let transform = WasmTransform::load(&module, Options::default())?;
    let contract = EventContract {
        event_id: FieldLocation::Pointer("/id".into()),
        entity: FieldLocation::Pointer("/entity".into()),
        ..EventContract::default()
    };
    let expected = replay::expected(&transform, &contract, &topics.output_names(), &run.inputs)?;
    assert_eq!(expected.applied as usize, OTHERS + 3);
    assert_eq!(expected.dead_letters.len(), 1);
    assert_replay_exact(&expected, &run);
    Ok(())
}

/// Spawns eos-processor with `args` and waits for it to exit on its own, which a refused
/// start-up does: its status and the tail of its log.
fn refused_start(args: &[String]) -> anyhow::Result<(std::process::ExitStatus, String)> {
    let mut processor = ServiceProcess::spawn("eos-processor", args, &[])?;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = processor.try_wait()? {
            return Ok((status, processor.log_tail(30)));
        }
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "the processor kept running\n{}",
            processor.log_tail(30)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A module that declares its contract (`eos_contract`; docs/TRANSFORMS.md "The interface")
/// against the flags (issue 51, part 4): the Go card module declares its event locations and its
/// outputs, default and flagged. Without `--output flagged=TOPIC`, or with an `--event-id` of
/// another place, the processor refuses to start with an error that says what to give, before
/// it creates any topic; a forgotten output no longer shows only as every large authorisation
/// becoming an `unknown_output` dead letter.
#[test]
fn a_modules_declared_outputs_are_refused_when_a_flag_is_missing() -> anyhow::Result<()> {
    let module = card_module()?;
    let base = unique_name("wasm-declared");
    let args = argv!(eos_processor::ServiceConfig {
        processor.kafka.bootstrap_servers: bootstrap_servers(),
        transform: format!("wasm:{}", module.display()),
        processor.input_topic: format!("{base}-in"),
        processor.output_topic: format!("{base}-approved"),
        processor.group_id: &base,
        processor.instance.instance_id: "wasm-declared",
        processor.metrics_addr: "127.0.0.1:0",
    });
    let (status, log) = refused_start(&args)?;
    assert!(!status.success(), "{status}\n{log}");
    // The log's text format escapes the quotes around the output's name.
    assert!(
        log.contains("configure it with --output flagged=TOPIC"),
        "{log}"
    );
    let elsewhere: Vec<String> = args
        .iter()
        .cloned()
        .chain(argv!(eos_processor::ServiceConfig {
            processor.outputs: format!("{FLAGGED}={base}-flagged"),
            processor.event_id: "/id",
        }))
        .collect();
    let (status, log) = refused_start(&elsewhere)?;
    assert!(!status.success(), "{status}\n{log}");
    assert!(
        log.contains(
            "--event-id /id disagrees with the WebAssembly module, which declares /auth_id"
        ),
        "{log}"
    );
    let metadata = integration_tests::admin()?
        .inner()
        .fetch_metadata(None, Duration::from_secs(10))?;
    let created: Vec<&str> = metadata
        .topics()
        .iter()
        .map(|topic| topic.name())
        .filter(|name| name.starts_with(&base))
        .collect();
    assert!(created.is_empty(), "{created:?}");
    Ok(())
}

/// A module's trap in the real binary is a dead letter whose `eos-dlq-transform-reason` says so
/// (`transform_trap`), as a refusal's carries the module's own code: examples/wasm/go/hostile
/// panics on `"do": "panic"` and echoes the event after it from a fresh instance.
#[test]
fn a_trapping_modules_dead_letter_carries_its_reason() -> anyhow::Result<()> {
    let module = card_module()?.with_file_name("hostile.wasm");
    let bootstrap = bootstrap_servers();
    let base = unique_name("wasm-trap");
    let (input, output) = (format!("{base}-in"), format!("{base}-out"));
    tokio::runtime::Runtime::new()?.block_on(create_topic(&input, 1))?;
    let record = |id: &str, extra: serde_json::Value| {
        let mut value = json!({"id": id, "entity": "k-1"});
        if let (Some(value), Some(extra)) = (value.as_object_mut(), extra.as_object()) {
            value.extend(extra.clone());
        }
        ("k-1".to_owned(), value.to_string().into_bytes())
    };
    produce(
        &input,
        &[
            record("e-panic", json!({"do": "panic"})),
            record("e-after", json!({})),
        ],
        100,
    )?;
    let args = argv!(eos_processor::ServiceConfig {
        processor.kafka.bootstrap_servers: &bootstrap,
        transform: format!("wasm:{}", module.display()),
        processor.event_id: "/id",
        processor.entity: "/entity",
        processor.input_topic: &input,
        processor.output_topic: &output,
        processor.group_id: &base,
        processor.instance.instance_id: "wasm-trap",
        processor.metrics_addr: "127.0.0.1:0",
    });
    let mut processor = ServiceProcess::spawn("eos-processor", &args, &[])?;
    wait_until_consumed(&bootstrap, &base, &input, Duration::from_secs(60))
        .with_context(|| processor.log_tail(40))?;
    processor.stop_gracefully()?;
    let letters = read_topic(&format!("{input}.dlq"), Isolation::ReadCommitted)?;
    assert_eq!(letters.len(), 1, "one dead letter");
    for (name, value) in [
        (eos_core::dead_letter::REASON_HEADER, "transform_trap"),
        (
            eos_core::dead_letter::TRANSFORM_REASON_HEADER,
            "transform_trap",
        ),
    ] {
        assert_eq!(header(&letters[0], name), Some(value), "{name}");
    }
    let out = read_topic(&output, Isolation::ReadCommitted)?;
    assert_eq!(out.len(), 1);
    assert_eq!(header(&out[0], "event_id"), Some("e-after"));
    Ok(())
}
