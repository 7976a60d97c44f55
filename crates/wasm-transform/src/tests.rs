//! Hostile and minimal modules, written in WAT, against the host's checks and limits; and the
//! example's Go module (examples/wasm/go, built by examples/wasm/build) for the interface.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde_json::json;

use super::*;
use eos_core::{EventContract, FieldLocation, RecordParts};

/// A module with the interface's two exports. `version` is what `eos_interface_version`
/// answers; `apply` is the body of `apply` (it may call `$out` with a pointer and length into
/// the data at 64, which holds `result`).
fn module(version: &str, result: &str, apply: &str, extra: &str) -> Vec<u8> {
    let escape = |text: &str| {
        text.replace('\\', "\\\\")
            .replace('"', "\\\"")
            .replace('\n', "\\n")
    };
    let text = format!(
        r#"(module
  (import "extism:host/env" "alloc" (func $alloc (param i64) (result i64)))
  (import "extism:host/env" "store_u8" (func $store_u8 (param i64 i32)))
  (import "extism:host/env" "output_set" (func $output_set (param i64 i64)))
  {extra}
  (memory (export "memory") 1)
  (data (i32.const 0) "{version}")
  (data (i32.const 64) "{result}")
  ;; Copies len bytes at ptr into Extism's memory and makes them the call's output.
  (func $out (param $ptr i32) (param $len i32)
    (local $offs i64) (local $i i32)
    (local.set $offs (call $alloc (i64.extend_i32_u (local.get $len))))
    (block $done (loop $next
      (br_if $done (i32.ge_u (local.get $i) (local.get $len)))
      (call $store_u8 (i64.add (local.get $offs) (i64.extend_i32_u (local.get $i)))
                      (i32.load8_u (i32.add (local.get $ptr) (local.get $i))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br $next)))
    (call $output_set (local.get $offs) (i64.extend_i32_u (local.get $len))))
  (func (export "eos_interface_version") (result i32)
    (call $out (i32.const 0) (i32.const {version_len}))
    (i32.const 0))
  (func (export "apply") (result i32)
    {apply}
    (call $out (i32.const 64) (i32.const {result_len}))
    (i32.const 0)))"#,
        version = escape(version),
        version_len = version.len(),
        result = escape(result),
        result_len = result.len(),
    );
    wat::parse_str(&text).expect("valid WAT")
}

fn answering(result: &str) -> Vec<u8> {
    module(INTERFACE_VERSION, result, "", "")
}

fn doing(apply: &str) -> Vec<u8> {
    module(INTERFACE_VERSION, r#"{"state":1}"#, apply, "")
}

fn small_limits() -> Options {
    Options {
        limits: Limits {
            fuel: 5_000_000,
            max_memory_bytes: 16 * 1024 * 1024,
            timeout: std::time::Duration::from_millis(500),
        },
        state_compatible: false,
    }
}

fn load(bytes: &[u8]) -> WasmModule {
    WasmModule::from_bytes(bytes, small_limits()).expect("a valid module")
}

fn event(value: serde_json::Value) -> Event {
    let text = value.to_string();
    Event::parse(
        &EventContract {
            event_id: FieldLocation::Pointer("/auth_id".into()),
            entity: FieldLocation::Pointer("/card".into()),
            occurred_at: Some("/at".into()),
            ..EventContract::default()
        },
        RecordParts {
            key: Some(b"c-7"),
            value: Some(text.as_bytes()),
            headers: &[("traceparent", Some(b"00-abc"))],
        },
    )
    .expect("an event")
}

fn any_event() -> Event {
    event(json!({"auth_id": "a-1", "card": "c-7", "at": "2026-12-04T10:00:00+01:00"}))
}

const AT: Position = Position {
    partition: 2,
    offset: 41,
};

#[test]
fn a_module_without_the_exports_or_with_another_version_is_refused_at_load() {
    let no_apply = wat::parse_str(
        r#"(module (func (export "eos_interface_version") (result i32) (i32.const 0)))"#,
    )
    .expect("WAT");
    let error = WasmModule::from_bytes(&no_apply, small_limits()).expect_err("no apply");
    assert!(
        matches!(error, LoadError::MissingExport("apply")),
        "{error}"
    );
    assert!(error.to_string().contains("docs/TRANSFORMS.md"), "{error}");

    let no_version =
        wat::parse_str(r#"(module (func (export "apply") (result i32) (i32.const 0)))"#)
            .expect("WAT");
    let error = WasmModule::from_bytes(&no_version, small_limits()).expect_err("no version");
    assert!(
        matches!(error, LoadError::MissingExport(VERSION_EXPORT)),
        "{error}"
    );

    let old = module("eos-transform/0", "{}", "", "");
    let error = WasmModule::from_bytes(&old, small_limits()).expect_err("old version");
    assert!(
        error.to_string().contains("\"eos-transform/0\"")
            && error.to_string().contains(INTERFACE_VERSION),
        "{error}"
    );

    let error = WasmModule::from_bytes(b"not wasm", small_limits()).expect_err("garbage");
    assert!(matches!(error, LoadError::NotWasm), "{error}");

    // An import the host does not provide is refused when the module is linked, not when
    // the first event calls it.
    let foreign = module(
        INTERFACE_VERSION,
        "{}",
        "",
        r#"(import "env" "now" (func $now (result i64)))"#,
    );
    let error = WasmModule::from_bytes(&foreign, small_limits()).expect_err("unknown import");
    assert!(matches!(error, LoadError::Compile(_)), "{error}");
}

#[test]
fn the_result_becomes_state_stamped_with_the_digest_and_outputs() {
    let bytes = answering(
        r#"{"state":{"n":1},"outputs":[{"output":"default","value":{"ok":true}},
            {"output":"flagged","key":"k","value":2,"headers":{"h":"v"}}]}"#,
    );
    let wasm = load(&bytes);
    assert_eq!(wasm.digest(), digest(&bytes));
    assert!(wasm.digest().starts_with("sha256:") && wasm.digest().len() == 7 + 64);
    let mut state = WasmState::default();
    let outputs = wasm.apply(&mut state, &any_event(), AT).expect("applied");
    assert_eq!(state.state, json!({"n": 1}));
    assert_eq!(state.digest.as_deref(), Some(wasm.digest()));
    assert_eq!(outputs.len(), 2);
    assert_eq!(outputs[1].key.as_deref(), Some("k"));
    assert_eq!(outputs[1].headers["h"], "v");

    let refusing = load(&answering(
        r#"{"refusal":{"code":"over_daily_limit","detail":"too much"}}"#,
    ));
    let mut fresh = WasmState::default();
    let error = refusing
        .apply(&mut fresh, &any_event(), AT)
        .expect_err("refused");
    assert_eq!(error.code(), "over_daily_limit");
    assert_eq!(error.to_string(), "too much");
    assert_eq!(fresh, WasmState::default());

    for bad in [
        r#"not json"#,
        r#"{"outputs":[]}"#,
        r#"{"state":1,"refusal":{"code":"x"}}"#,
        r#"{"state":1,"outputs":[{"value":1}]}"#,
        r#"{"state":1,"surprise":true}"#,
    ] {
        let error = load(&answering(bad))
            .apply(&mut WasmState::default(), &any_event(), AT)
            .expect_err(bad);
        assert_eq!(error.code(), "transform_trap", "{bad}: {error}");
    }
    // A stateless module answers state null.
    let stateless = load(&answering(r#"{"state":null}"#));
    let mut state = WasmState::default();
    assert_eq!(stateless.apply(&mut state, &any_event(), AT), Ok(vec![]));
    assert_eq!(state.state, serde_json::Value::Null);
}

/// A module that answers `version` and declares `contract` in `eos_contract`.
fn declaring(version: &str, contract: &str) -> Vec<u8> {
    let escaped = contract.replace('\\', "\\\\").replace('"', "\\\"");
    module(
        version,
        r#"{"state":1}"#,
        "",
        &format!(
            r#"(data (i32.const 512) "{escaped}")
  (func (export "eos_contract") (result i32)
    (call $out (i32.const 512) (i32.const {})) (i32.const 0))"#,
            contract.len()
        ),
    )
}

#[test]
fn a_declared_contract_is_read_at_load_and_a_bad_one_refused() {
    assert_eq!(load(&answering(r#"{"state":1}"#)).declared(), None);
    let wasm = load(&declaring(
        INTERFACE_VERSION,
        r#"{"event_id":"/auth_id","entity":"key","occurred_at":"/at","outputs":["default","flagged"]}"#,
    ));
    assert_eq!(
        wasm.declared(),
        Some(&DeclaredContract {
            event_id: Some(FieldLocation::Pointer("/auth_id".into())),
            entity: Some(FieldLocation::Key),
            occurred_at: Some("/at".into()),
            outputs: Some(vec!["default".into(), "flagged".into()]),
            reads: None,
        })
    );
    // Every member may be left out.
    let outputs_only = load(&declaring(INTERFACE_VERSION, r#"{"outputs":["tier"]}"#));
    assert_eq!(
        outputs_only.declared(),
        Some(&DeclaredContract {
            outputs: Some(vec!["tier".into()]),
            ..DeclaredContract::default()
        })
    );
    for (contract, says) in [
        (r#"{"event_id":"auth_id"}"#, "event id at \"auth_id\""),
        (r#"{"occurred_at":"header:at"}"#, "not a JSON pointer"),
        (r#"{"outputs":["tier","tier"]}"#, "\"tier\" twice"),
        (r#"{"outputs":[""]}"#, "(empty)"),
        (r#"{"output":["tier"]}"#, "unknown field"),
        ("tier", "is not"),
    ] {
        let error = WasmModule::from_bytes(&declaring(INTERFACE_VERSION, contract), small_limits())
            .expect_err(contract);
        assert!(matches!(error, LoadError::Contract(_)), "{error}");
        assert!(
            error.to_string().contains("eos_contract") && error.to_string().contains(says),
            "{contract}: {error}"
        );
    }
}

#[test]
fn a_module_that_declares_what_it_reads_is_given_only_that() {
    let event = event(json!({"auth_id": "a-1", "card": "c-7", "merchant": "m".repeat(900)}));
    let given = |reads: Option<&[String]>| -> serde_json::Value {
        let input = interface::input(&serde_json::Value::Null, &event, AT, reads).expect("input");
        serde_json::from_slice::<serde_json::Value>(&input).expect("JSON")["event"]["value"].clone()
    };
    assert_eq!(given(None), serde_json::Value::Object(event.value.clone()));
    let reads = ["card".to_owned(), "amount".to_owned()];
    assert_eq!(given(Some(&reads)), json!({"card": "c-7"}));
    let declared = load(&declaring(
        INTERFACE_VERSION,
        r#"{"reads":["card","amount"]}"#,
    ));
    assert_eq!(
        declared.declared().and_then(|d| d.reads.clone()),
        Some(reads.to_vec())
    );
    let error = WasmModule::from_bytes(
        &declaring(INTERFACE_VERSION, r#"{"reads":["card","card"]}"#),
        small_limits(),
    )
    .expect_err("twice");
    assert!(error.to_string().contains("\"card\" twice"), "{error}");
}

/// What a module is given of an event's value (docs/TRANSFORMS.md "What a module is given"):
/// the record's JSON parsed and written again, not its bytes.
#[test]
fn a_module_is_given_the_value_parsed_and_written_again() {
    let record =
        br#"{ "z": 1, "a": 12.50, "n": 1e2, "f": 1.0, "neg": -0, "big": 18446744073709551615,
        "s": "caf\u00e9 \/ <tab>\t", "nested": {"y": [1, 2.5e-3], "x": null} }"#;
    let event = Event::parse(
        &EventContract::default(),
        RecordParts {
            key: Some(b"k"),
            value: Some(record),
            headers: &[("event_id", Some(b"e-1"))],
        },
    )
    .expect("an event");
    let input = interface::input(&serde_json::Value::Null, &event, AT, None).expect("input");
    let input = String::from_utf8(input).expect("UTF-8");
    let value = input
        .split_once(r#""value":"#)
        .and_then(|(_, rest)| rest.split_once(r#","event_id""#))
        .map(|(value, _)| value)
        .expect("the value");
    assert_eq!(
        value,
        r#"{"a":12.5,"big":18446744073709551615,"f":1.0,"n":100.0,"neg":-0.0,"nested":{"x":null,"y":[1,0.0025]},"s":"café / <tab>\t","z":1}"#
    );
}

#[test]
fn both_interface_versions_run_and_another_is_refused() {
    for version in INTERFACE_VERSIONS {
        let wasm = load(&module(version, r#"{"state":1}"#, "", ""));
        assert!(
            wasm.apply(&mut WasmState::default(), &any_event(), AT)
                .is_ok()
        );
    }
    let error = WasmModule::from_bytes(&module("eos-transform/3", "{}", "", ""), small_limits())
        .expect_err("a version from the future");
    assert!(matches!(error, LoadError::WrongVersion { .. }), "{error}");
}

#[test]
fn an_output_may_be_the_events_value_with_members_set() {
    let wasm = load(&answering(
        r#"{"state":1,"outputs":[{"output":"default","event_value_with":{"status":"approved","card":"c-8"}}]}"#,
    ));
    let event = any_event();
    let outputs = wasm
        .apply(&mut WasmState::default(), &event, AT)
        .expect("applied");
    let mut expected = event.value.clone();
    expected.insert("status".into(), json!("approved"));
    expected.insert("card".into(), json!("c-8"));
    assert_eq!(outputs[0].value, serde_json::Value::Object(expected));
    for both_or_neither in [
        r#"{"state":1,"outputs":[{"output":"default","value":1,"event_value_with":{}}]}"#,
        r#"{"state":1,"outputs":[{"output":"default"}]}"#,
    ] {
        let error = load(&answering(both_or_neither))
            .apply(&mut WasmState::default(), &event, AT)
            .expect_err(both_or_neither);
        assert_eq!(error.code(), "transform_trap", "{error}");
        assert!(error.to_string().contains("event_value_with"), "{error}");
    }
    // A null value is a value.
    let null = load(&answering(
        r#"{"state":1,"outputs":[{"output":"default","value":null}]}"#,
    ));
    let outputs = null
        .apply(&mut WasmState::default(), &event, AT)
        .expect("a null value");
    assert_eq!(outputs[0].value, serde_json::Value::Null);
}

#[test]
fn state_of_another_module_is_refused_at_restore_unless_upgraded_or_declared_compatible() {
    let old = load(&answering(r#"{"state":{"v":1}}"#));
    let mut state = WasmState::default();
    old.apply(&mut state, &any_event(), AT).expect("applied");
    assert_eq!(old.admit(state.clone()), Ok(state.clone()));
    assert_eq!(
        old.admit(WasmState::default()),
        Ok(WasmState::default()),
        "no state yet is anyone's"
    );

    let new_bytes = answering(r#"{"state":{"v":2}}"#);
    let new = load(&new_bytes);
    assert!(!new.upgrades());
    let error = new.admit(state.clone()).expect_err("other digest");
    assert!(matches!(error, AdmitError::ForeignState { .. }));
    assert!(error.to_string().contains(old.digest()), "{error}");
    assert!(
        error.to_string().contains("--wasm-state-compatible"),
        "{error}"
    );

    let compatible = WasmModule::from_bytes(
        &new_bytes,
        Options {
            state_compatible: true,
            ..small_limits()
        },
    )
    .expect("loads");
    let mut admitted = compatible
        .admit(state.clone())
        .expect("declared compatible");
    assert_eq!(admitted, state, "admitted as it is");
    compatible
        .apply(&mut admitted, &any_event(), AT)
        .expect("applied");
    assert_eq!(admitted.state, json!({"v": 2}));
    assert_eq!(admitted.digest.as_deref(), Some(compatible.digest()));
    // Stored as {digest, state}, the processor's state format version 1 (bare JSON).
    let stored = serde_json::to_value(&admitted).expect("json");
    assert_eq!(stored["digest"], compatible.digest());
    assert_eq!(
        serde_json::from_value::<WasmState>(stored).expect("reads back"),
        admitted
    );

    // A module that exports the upgrade gets the old state and the old digest, and its answer
    // is stamped with its own digest, with or without the flag.
    let upgrade = |answer: &str| {
        let answer_len = answer.len();
        let answer = answer.replace('"', "\\\"");
        module(
            INTERFACE_VERSION,
            r#"{"state":{"v":3}}"#,
            "",
            &format!(
                r#"(data (i32.const 1024) "{answer}")
  (func (export "eos_upgrade_state") (result i32)
    (call $out (i32.const 1024) (i32.const {answer_len}))
    (i32.const 0))"#
            ),
        )
    };
    let upgrading = load(&upgrade(r#"{"state":{"v":"upgraded"}}"#));
    assert!(upgrading.upgrades());
    let upgraded = upgrading.admit(state.clone()).expect("upgraded");
    assert_eq!(upgraded.state, json!({"v": "upgraded"}));
    assert_eq!(upgraded.digest.as_deref(), Some(upgrading.digest()));
    let broken = load(&upgrade(r#"{"v":"no state key"}"#));
    let error = broken.admit(state).expect_err("a broken upgrade");
    assert!(
        matches!(&error, AdmitError::Upgrade { error, .. } if error.code() == "transform_trap"),
        "{error}"
    );
}

#[test]
fn an_endless_loop_hits_the_fuel_limit_and_the_next_call_works() {
    let wasm = load(&doing("(loop $forever (br $forever))"));
    let started = std::time::Instant::now();
    let error = wasm
        .apply(&mut WasmState::default(), &any_event(), AT)
        .expect_err("endless");
    assert_eq!(error.code(), "transform_limit", "{error}");
    assert!(error.to_string().contains("fuel"), "{error}");
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
    // Deterministic: the same event runs out of fuel again, on a fresh instance.
    let again = wasm
        .apply(&mut WasmState::default(), &any_event(), AT)
        .expect_err("endless");
    assert_eq!(again, error);
}

#[test]
fn the_default_fuel_of_an_endless_loop_is_spent_within_the_default_wall_clock_limit() {
    // The figure behind `Limits::default()`'s 2 s: how long the whole default fuel takes. It
    // depends on the machine, so it is printed, not asserted; either limit is transform_limit.
    let wasm = WasmModule::from_bytes(&doing("(loop $forever (br $forever))"), Options::default())
        .expect("loads");
    let started = std::time::Instant::now();
    let error = wasm
        .apply(&mut WasmState::default(), &any_event(), AT)
        .expect_err("endless");
    eprintln!(
        "the default fuel ({} units) of an endless loop: {:?}, ended by: {error}",
        Limits::default().fuel,
        started.elapsed()
    );
    assert_eq!(error.code(), "transform_limit", "{error}");
}

#[test]
fn a_huge_allocation_hits_the_memory_limit() {
    // 65,535 more pages: the whole 4 GiB a 32-bit module can address.
    let wasm = load(&doing(
        "(if (i32.eq (memory.grow (i32.const 65535)) (i32.const -1)) (then (unreachable)))",
    ));
    let error = wasm
        .apply(&mut WasmState::default(), &any_event(), AT)
        .expect_err("too big");
    assert_eq!(error.code(), "transform_limit", "{error}");
    assert!(error.to_string().contains("memory"), "{error}");
    // Within the limit the same module's growth is fine.
    let modest = load(&doing("(drop (memory.grow (i32.const 16)))"));
    assert!(
        modest
            .apply(&mut WasmState::default(), &any_event(), AT)
            .is_ok()
    );
}

#[test]
fn a_trap_is_a_trap_and_the_instance_is_replaced() {
    // Traps on its second call only: the first call (at load) answers the version, so a
    // global counts apply's calls; after the trap a fresh instance counts from zero again.
    let bytes = module(
        INTERFACE_VERSION,
        r#"{"state":1}"#,
        "(global.set $calls (i32.add (global.get $calls) (i32.const 1)))
         (if (i32.eq (global.get $calls) (i32.const 2)) (then (unreachable)))",
        "(global $calls (mut i32) (i32.const 0))",
    );
    let wasm = load(&bytes);
    let mut state = WasmState::default();
    assert!(wasm.apply(&mut state, &any_event(), AT).is_ok());
    let error = wasm
        .apply(&mut state, &any_event(), AT)
        .expect_err("second call traps");
    assert_eq!(error.code(), "transform_trap", "{error}");
    assert!(error.to_string().contains("unreachable"), "{error}");
    assert!(wasm.apply(&mut state, &any_event(), AT).is_ok());

    let divide = load(&doing("(drop (i32.div_u (i32.const 1) (i32.const 0)))"));
    let error = divide
        .apply(&mut WasmState::default(), &any_event(), AT)
        .expect_err("divide by zero");
    assert_eq!(error.code(), "transform_trap", "{error}");
}

#[test]
fn a_module_that_opens_a_file_gets_an_error_never_the_file() {
    // path_open relative to the first preopened directory (fd 3): there is none, so WASI
    // answers EBADF (8) every time; the module writes the errno it got as its state.
    let bytes = module(
        INTERFACE_VERSION,
        r#"{"state":0}"#,
        r#"(i32.store8 (i32.const 73)
             (i32.add (i32.const 48)
               (call $path_open (i32.const 3) (i32.const 0) (i32.const 200) (i32.const 11)
                 (i32.const 0) (i64.const 0) (i64.const 0) (i32.const 0) (i32.const 300))))"#,
        r#"(import "wasi_snapshot_preview1" "path_open"
             (func $path_open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
           (data (i32.const 200) "/etc/passwd")"#,
    );
    let wasm = load(&bytes);
    let mut state = WasmState::default();
    wasm.apply(&mut state, &any_event(), AT).expect("applied");
    assert_eq!(
        state.state,
        json!(8),
        "errno EBADF, written at the result's digit"
    );
}

#[test]
fn the_clock_is_fixed_random_is_zeros_and_a_sleep_traps() {
    // Fills 16 bytes with 0xff, asks WASI for the realtime and monotonic clocks and for 16
    // random bytes over them, and traps unless every answer is the fixed one.
    let reads = r#"(memory.fill (i32.const 2000) (i32.const 255) (i32.const 32))
        (if (call $clock_time_get (i32.const 0) (i64.const 1) (i32.const 2000)) (then (unreachable)))
        (if (call $clock_time_get (i32.const 1) (i64.const 1) (i32.const 2008)) (then (unreachable)))
        (if (call $random_get (i32.const 2016) (i32.const 16)) (then (unreachable)))
        (if (i64.ne (i64.load (i32.const 2000)) (i64.const 946684800000000000)) (then (unreachable)))
        (if (i64.ne (i64.load (i32.const 2008)) (i64.const 946684800000000000)) (then (unreachable)))
        (if (i64.ne (i64.load (i32.const 2016)) (i64.const 0)) (then (unreachable)))
        (if (i64.ne (i64.load (i32.const 2024)) (i64.const 0)) (then (unreachable)))"#;
    let imports = r#"(import "wasi_snapshot_preview1" "clock_time_get"
             (func $clock_time_get (param i32 i64 i32) (result i32)))
           (import "wasi_snapshot_preview1" "random_get"
             (func $random_get (param i32 i32) (result i32)))
           (import "wasi_snapshot_preview1" "poll_oneoff"
             (func $poll_oneoff (param i32 i32 i32 i32) (result i32)))"#;
    let wasm = load(&module(INTERFACE_VERSION, r#"{"state":1}"#, reads, imports));
    for _ in 0..3 {
        let mut state = WasmState::default();
        wasm.apply(&mut state, &any_event(), AT)
            .expect("the fixed clock and zero random bytes");
        assert_eq!(state.state, json!(1));
    }

    // A sleep: one clock subscription of 1 s. It traps at once rather than wait.
    let sleeps = load(&module(
        INTERFACE_VERSION,
        r#"{"state":1}"#,
        "(i64.store (i32.const 2024) (i64.const 1000000000))
         (drop (call $poll_oneoff (i32.const 2000) (i32.const 3000) (i32.const 1) (i32.const 4000)))",
        imports,
    ));
    let started = std::time::Instant::now();
    let error = sleeps
        .apply(&mut WasmState::default(), &any_event(), AT)
        .expect_err("a sleep");
    assert_eq!(error.code(), "transform_trap", "{error}");
    assert!(started.elapsed() < std::time::Duration::from_millis(500));

    // A runtime's own pause of 1 ms (Go's panic path waits so before it prints the panic)
    // passes at once, with the clock event reported, and the clock has not moved.
    let pauses = load(&module(
        INTERFACE_VERSION,
        r#"{"state":1}"#,
        "(i64.store (i32.const 2000) (i64.const 77))
         (i64.store (i32.const 2024) (i64.const 1000000))
         (if (call $poll_oneoff (i32.const 2000) (i32.const 3000) (i32.const 1) (i32.const 4000))
           (then (unreachable)))
         (if (i32.ne (i32.load (i32.const 4000)) (i32.const 1)) (then (unreachable)))
         (if (i64.ne (i64.load (i32.const 3000)) (i64.const 77)) (then (unreachable)))
         (if (i32.ne (i32.load16_u (i32.const 3008)) (i32.const 0)) (then (unreachable)))",
        imports,
    ));
    let mut state = WasmState::default();
    pauses
        .apply(&mut state, &any_event(), AT)
        .expect("a 1 ms pause passes");
    assert_eq!(state.state, json!(1));

    // An import with a WASI name and another signature is refused at load.
    let error = WasmModule::from_bytes(
        &module(
            INTERFACE_VERSION,
            r#"{"state":1}"#,
            "",
            r#"(import "wasi_snapshot_preview1" "random_get" (func (param i32) (result i32)))"#,
        ),
        small_limits(),
    )
    .expect_err("a wrong signature");
    assert!(matches!(error, LoadError::Rewrite(_)), "{error}");
    assert!(error.to_string().contains("random_get"), "{error}");
}

/// The example's modules, built from source by examples/wasm/build (which fails loudly when a
/// toolchain is missing): the Go one and the AssemblyScript one.
fn example_modules() -> &'static (Vec<u8>, Vec<u8>) {
    // Built once per test run: two tests writing a file at once could read it half written.
    static MODULES: std::sync::OnceLock<(Vec<u8>, Vec<u8>)> = std::sync::OnceLock::new();
    MODULES.get_or_init(|| {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
        let status = std::process::Command::new(root.join("examples/wasm/build"))
            .status()
            .expect("runs examples/wasm/build");
        assert!(status.success(), "examples/wasm/build failed");
        let read = |name: &str| {
            std::fs::read(root.join("target/wasm").join(name))
                .unwrap_or_else(|e| panic!("target/wasm/{name}: {e}"))
        };
        (read("card.wasm"), read("card-as.wasm"))
    })
}

fn card_module() -> Vec<u8> {
    example_modules().0.clone()
}

/// examples/wasm/go/hostile: echoes each event, burns 64 MiB `memory.fill`s for ever on
/// `"do": "memory.fill"` and panics on `"do": "panic"`.
fn hostile_module() -> Vec<u8> {
    example_modules();
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/wasm/hostile.wasm");
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn a_go_panic_keeps_its_message_and_a_go_memory_fill_loop_hits_the_wall_clock() {
    let options = Options {
        limits: Limits {
            timeout: std::time::Duration::from_millis(500),
            ..Limits::default()
        },
        ..Options::default()
    };
    let wasm =
        std::sync::Arc::new(WasmModule::from_bytes(&hostile_module(), options).expect("loads"));
    let panics = event(json!({"auth_id": "a-panic", "card": "c-7", "do": "panic"}));
    let error = wasm
        .apply(&mut WasmState::default(), &panics, AT)
        .expect_err("panics");
    assert_eq!(error.code(), "transform_trap", "{error}");
    // The panic's own message, not a sleep's trap: Go's runtime pauses 1 ms before it prints
    // a panic, and the pause used to trap first.
    assert!(
        error
            .to_string()
            .contains("panic: event a-panic asked for a panic"),
        "{error}"
    );
    // Go's runtime.abort ends a fatal panic with `unreachable`; the pause that trapped before
    // it was in runtime.freezetheworld.
    assert!(error.to_string().contains("runtime.fatalpanic"), "{error}");
    assert!(!error.to_string().contains("freezetheworld"), "{error}");
    // The next event is echoed by a fresh instance.
    let mut state = WasmState::default();
    let outputs = wasm
        .apply(&mut state, &any_event(), AT)
        .expect("the next event");
    assert_eq!(outputs[0].value["auth_id"], "a-1");

    let burner = wasm.clone();
    let (error, took) = within(std::time::Duration::from_secs(10), move || {
        let burns = event(json!({"auth_id": "a-burn", "card": "c-7", "do": "memory.fill"}));
        burner
            .apply(&mut WasmState::default(), &burns, AT)
            .expect_err("burns")
    });
    assert_eq!(error.code(), "transform_limit", "{error}");
    assert!(
        error.to_string().contains("wall-clock limit of 500ms"),
        "{error}"
    );
    assert!(
        took < std::time::Duration::from_secs(3),
        "ended after {took:?}"
    );
    assert!(wasm.apply(&mut state, &any_event(), AT).is_ok());
}

fn auth(id: &str, amount: &str, at: &str) -> Event {
    event(json!({
        "auth_id": id, "card": "c-7", "amount": amount, "currency": "EUR",
        "merchant": "m-1", "at": at,
    }))
}

#[test]
fn the_go_card_module_keeps_the_daily_spend_refuses_and_flags() {
    // 1% of the default fuel is plenty, the Go runtime's start-up included (docs/TRANSFORMS.md
    // "Determinism and limits" says so).
    let options = Options {
        limits: Limits {
            fuel: Limits::default().fuel / 100,
            ..Limits::default()
        },
        ..Options::default()
    };
    let wasm = WasmModule::from_bytes(&card_module(), options).expect("loads");
    let mut card = WasmState::default();
    let outputs = wasm
        .apply(
            &mut card,
            &auth("a-1", "600.00", "2026-12-04T10:00:00Z"),
            AT,
        )
        .expect("approved");
    assert_eq!(
        outputs
            .iter()
            .map(|o| o.output.as_str())
            .collect::<Vec<_>>(),
        ["flagged", "default"]
    );
    assert_eq!(outputs[0].headers["eos-flag"], "large_amount");
    assert_eq!(outputs[1].value["status"], "approved");
    assert_eq!(outputs[1].value["day_spent"], "600.00");
    assert_eq!(outputs[1].value["merchant"], "m-1");
    assert_eq!(
        card.state,
        json!({"day": "2026-12-04", "spent": {"EUR": 60000}})
    );

    let error = wasm
        .apply(
            &mut card,
            &auth("a-2", "400.01", "2026-12-04T23:00:00Z"),
            AT,
        )
        .expect_err("over the limit");
    assert_eq!(error.code(), "over_daily_limit");
    assert!(error.to_string().contains("1000.01 EUR"), "{error}");
    // The day is the UTC day of the event's time: 00:30 at +01:00 is still the 4th in UTC.
    let outputs = wasm
        .apply(
            &mut card,
            &auth("a-3", "400", "2026-12-05T00:30:00+01:00"),
            AT,
        )
        .expect("approved");
    assert_eq!(outputs.len(), 1);
    assert_eq!(outputs[0].value["day_spent"], "1000.00");
    let outputs = wasm
        .apply(&mut card, &auth("a-4", "1.5", "2026-12-05T10:00:00Z"), AT)
        .expect("a new day");
    assert_eq!(outputs[0].value["day_spent"], "1.50");
    let error = wasm
        .apply(&mut card, &auth("a-5", "1.505", "2026-12-05T10:00:00Z"), AT)
        .expect_err("three places");
    assert_eq!(error.code(), "invalid_amount");
}

#[test]
fn the_go_runtime_that_cannot_start_within_the_limits_is_refused_at_load() {
    let bytes = card_module();
    // The Go runtime alone needs more than 1 MiB: its start-up is refused at load.
    let tiny = Options {
        limits: Limits {
            max_memory_bytes: 1024 * 1024,
            ..Limits::default()
        },
        ..Options::default()
    };
    let error = WasmModule::from_bytes(&bytes, tiny).expect_err("no room for Go");
    assert!(error.to_string().contains("memory"), "{error}");
    // Nor does it start on 10,000 instructions.
    let starved = Options {
        limits: Limits {
            fuel: 10_000,
            ..Limits::default()
        },
        ..Options::default()
    };
    let error = WasmModule::from_bytes(&bytes, starved).expect_err("no fuel for Go");
    assert!(error.to_string().contains("fuel"), "{error}");
}

/// Authorisations that take each path of the logic: approvals, flags, the daily limit, a new
/// UTC day, amounts that are not two-place decimal strings (a number, null, missing, three
/// places, a sign, an exponent, past an i64), currencies that are not ISO codes, no time, and
/// text that needs escaping (quotes, backslashes, <, >, &, control and non-ASCII characters).
fn varied_authorisations() -> Vec<Event> {
    let amounts = [
        json!("12.50"),
        json!("600"),
        json!("499.99"),
        json!("500.00"),
        json!("0.5"),
        json!("250.1"),
        json!(12),
        json!(null),
        json!("12.345"),
        json!("-5.00"),
        json!("1e3"),
        json!("99999999999999999999"),
        json!(".50"),
        json!("3\"0"),
    ];
    let currencies = [
        json!("EUR"),
        json!("USD"),
        json!("eur"),
        json!(null),
        json!("EURO"),
    ];
    let merchants = [
        json!("m-1"),
        json!("<Caf\u{e9} & Co>"),
        json!("tab\tnew\nline \"quoted\" back\\slash"),
        json!("\u{2028}\u{1F4B3}"),
        json!({"id": 7, "tags": ["a", "<b>"]}),
    ];
    let mut events = Vec::new();
    for i in 0..600usize {
        let card = format!("c-{}", i % 7);
        let day = 4 + (i / 150);
        let hour = i % 24;
        let mut value = json!({
            "auth_id": format!("a-{i}"),
            "card": card,
            "amount": amounts[i % amounts.len()],
            "currency": currencies[(i / 3) % currencies.len()],
            "merchant": merchants[(i / 2) % merchants.len()],
            "at": format!("2026-12-{day:02}T{hour:02}:15:00+01:00"),
        });
        if i % 41 == 0 {
            value.as_object_mut().expect("object").remove("at");
        }
        if i % 53 == 0 {
            value.as_object_mut().expect("object").remove("amount");
        }
        let text = value.to_string();
        events.push(
            Event::parse(
                &EventContract {
                    event_id: FieldLocation::Pointer("/auth_id".into()),
                    entity: FieldLocation::Pointer("/card".into()),
                    occurred_at: Some("/at".into()),
                    ..EventContract::default()
                },
                RecordParts {
                    key: Some(card.as_bytes()),
                    value: Some(text.as_bytes()),
                    headers: &[],
                },
            )
            .expect("an event"),
        );
    }
    events
}

#[test]
fn the_go_and_assemblyscript_modules_answer_the_same_bytes() {
    let (go_bytes, as_bytes) = example_modules();
    let go = WasmModule::from_bytes(go_bytes, Options::default()).expect("Go module");
    let assemblyscript =
        WasmModule::from_bytes(as_bytes, Options::default()).expect("AssemblyScript module");
    assert_ne!(go.digest(), assemblyscript.digest());
    // Both declare where an authorisation keeps its id, card and time, and both outputs.
    let declared = DeclaredContract {
        event_id: Some(FieldLocation::Pointer("/auth_id".into())),
        entity: Some(FieldLocation::Pointer("/card".into())),
        occurred_at: Some("/at".into()),
        outputs: Some(vec!["default".into(), "flagged".into()]),
        reads: Some(vec!["amount".into(), "currency".into()]),
    };
    assert_eq!(go.declared(), Some(&declared));
    assert_eq!(assemblyscript.declared(), Some(&declared));

    // Each card's state is threaded through the calls, so both modules see the same input at
    // every step, and every answer, state and outputs and refusals, is compared byte for byte.
    let mut states: BTreeMap<String, serde_json::Value> = BTreeMap::new();
    let mut answers: BTreeMap<&str, usize> = BTreeMap::new();
    for (offset, event) in varied_authorisations().iter().enumerate() {
        let state = states
            .get(event.entity.as_str())
            .cloned()
            .unwrap_or(serde_json::Value::Null);
        let position = Position {
            partition: 0,
            offset: i64::try_from(offset).expect("small"),
        };
        let reads = go.declared().and_then(|d| d.reads.as_deref());
        let input = interface::input(&state, event, position, reads).expect("input");
        let from_go = go.call(APPLY_EXPORT, &input).expect("Go answers");
        let from_as = assemblyscript
            .call(APPLY_EXPORT, &input)
            .expect("AssemblyScript answers");
        assert_eq!(
            String::from_utf8_lossy(&from_as),
            String::from_utf8_lossy(&from_go),
            "input {}",
            String::from_utf8_lossy(&input)
        );
        match interface::result(&from_go, &event.value).expect("the interface's result") {
            InterfaceResult::Applied { state, outputs } => {
                states.insert(event.entity.as_str().to_owned(), state);
                *answers
                    .entry(if outputs.len() == 2 {
                        "flagged"
                    } else {
                        "approved"
                    })
                    .or_default() += 1;
            }
            InterfaceResult::Refused(refusal) => {
                *answers
                    .entry(match refusal.code.as_str() {
                        "over_daily_limit" => "over_daily_limit",
                        "invalid_amount" => "invalid_amount",
                        "invalid_currency" => "invalid_currency",
                        "missing_time" => "missing_time",
                        _ => "other",
                    })
                    .or_default() += 1;
            }
        }
    }
    // Every path was taken, so the agreement covers each of them.
    for path in [
        "approved",
        "flagged",
        "over_daily_limit",
        "invalid_amount",
        "invalid_currency",
        "missing_time",
    ] {
        assert!(
            answers.get(path).copied().unwrap_or(0) > 0,
            "{path}: {answers:?}"
        );
    }
    assert_eq!(answers.get("other"), None, "{answers:?}");
}

/// Runs `call` on a thread of its own and returns its result and how long it took; panics when
/// it is still running after `bound`, so a call that never ends fails the test instead of
/// hanging it (the thread is left behind, spinning, until the test binary exits).
fn within<T: Send + 'static>(
    bound: std::time::Duration,
    call: impl FnOnce() -> T + Send + 'static,
) -> (T, std::time::Duration) {
    let started = std::time::Instant::now();
    let (done, result) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(call());
    });
    match result.recv_timeout(bound) {
        Ok(value) => (value, started.elapsed()),
        Err(_) => panic!("the call was still running after {bound:?}"),
    }
}

/// An event whose input is longer than `LONG_INPUT` bytes, which the modules below take as
/// the one to hang on; `any_event()`'s input is shorter.
fn hanging_event() -> Event {
    event(
        json!({"auth_id": "a-9", "card": "c-7", "at": "2026-12-04T10:00:00Z",
                 "pad": "x".repeat(2000)}),
    )
}

const LONG_INPUT: i64 = 1000;

/// A module whose `apply` runs `burn` for ever when its input is long (the hanging event) and
/// answers at once otherwise; `extra` may define what `burn` needs.
fn burning(burn: &str, extra: &str) -> Vec<u8> {
    module(
        INTERFACE_VERSION,
        r#"{"state":1}"#,
        &format!(
            "(if (i64.gt_u (call $input_length) (i64.const {LONG_INPUT}))
               (then (call $burn)))"
        ),
        &format!(
            r#"(import "extism:host/env" "input_length" (func $input_length (result i64)))
               {extra}
               (func $burn {burn})"#
        ),
    )
}

/// The small limits with room for the 64 MiB the burning modules grow to.
fn burn_limits() -> Options {
    Options {
        limits: Limits {
            max_memory_bytes: 256 * 1024 * 1024,
            ..small_limits().limits
        },
        ..small_limits()
    }
}

/// Every way found to spend wall time without fuel: wasmtime charges one unit of fuel for a
/// bulk-memory or bulk-table instruction whatever its length, so each loop below runs for ever
/// on a few units per pass.
fn fuel_free_burns() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        (
            // The issue's module: 64 MiB filled again and again.
            "memory.fill",
            burning(
                "(drop (memory.grow (i32.const 1024)))
                 (loop $forever
                   (memory.fill (i32.const 0) (i32.const 0) (i32.const 67108864))
                   (br $forever))",
                "",
            ),
        ),
        (
            "memory.copy",
            burning(
                "(drop (memory.grow (i32.const 1024)))
                 (loop $forever
                   (memory.copy (i32.const 0) (i32.const 33554432) (i32.const 33554432))
                   (br $forever))",
                "",
            ),
        ),
        (
            // A table is not under the memory limit; 4 million references are 32 MB.
            "table.fill",
            burning(
                "(drop (table.grow $t (ref.null func) (i32.const 4000000)))
                 (loop $forever
                   (table.fill $t (i32.const 0) (ref.null func) (i32.const 4000000))
                   (br $forever))",
                "(table $t 1 funcref)",
            ),
        ),
        (
            "table.copy",
            burning(
                "(drop (table.grow $t (ref.null func) (i32.const 4000000)))
                 (loop $forever
                   (table.copy $t $t (i32.const 0) (i32.const 2000000) (i32.const 2000000))
                   (br $forever))",
                "(table $t 1 funcref)",
            ),
        ),
    ]
}

#[test]
fn a_call_that_burns_wall_time_without_fuel_hits_the_wall_clock_limit_and_the_next_works() {
    for (name, bytes) in fuel_free_burns() {
        let wasm =
            std::sync::Arc::new(WasmModule::from_bytes(&bytes, burn_limits()).expect("loads"));
        assert!(
            wasm.apply(&mut WasmState::default(), &any_event(), AT)
                .is_ok(),
            "{name}: a short input answers at once"
        );
        let hanging = wasm.clone();
        let (error, took) = within(std::time::Duration::from_secs(10), move || {
            hanging
                .apply(&mut WasmState::default(), &hanging_event(), AT)
                .expect_err("runs for ever")
        });
        eprintln!("{name}: ended after {took:?} by: {error}");
        assert_eq!(error.code(), "transform_limit", "{name}: {error}");
        assert!(
            error.to_string().contains("wall-clock limit of 500ms"),
            "{name}: {error}"
        );
        assert!(
            took < std::time::Duration::from_secs(2),
            "{name}: ended after {took:?}"
        );
        // The next call gets a fresh instance and works.
        let mut state = WasmState::default();
        wasm.apply(&mut state, &any_event(), AT)
            .unwrap_or_else(|e| panic!("{name}: the next call: {e}"));
        assert_eq!(state.state, json!(1), "{name}");
        // The same event is the same failure again, on a fresh instance.
        let again = wasm
            .apply(&mut WasmState::default(), &hanging_event(), AT)
            .expect_err("runs for ever again");
        assert_eq!(again, error, "{name}");
    }
}

#[test]
fn an_interrupted_call_stops_at_once_and_is_no_outcome() {
    // A wall-clock limit far beyond the test: only the interruption can end the call.
    let options = Options {
        limits: Limits {
            timeout: std::time::Duration::from_secs(600),
            ..burn_limits().limits
        },
        ..burn_limits()
    };
    let (_, bytes) = fuel_free_burns().swap_remove(0);
    let wasm = std::sync::Arc::new(WasmModule::from_bytes(&bytes, options).expect("loads"));
    let interrupter = wasm.interrupter();
    assert!(!interrupter.is_interrupted());
    let hanging = wasm.clone();
    let stopper = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(300));
        interrupter.interrupt();
    });
    let (error, took) = within(std::time::Duration::from_secs(10), move || {
        hanging
            .apply(&mut WasmState::default(), &hanging_event(), AT)
            .expect_err("interrupted")
    });
    stopper.join().expect("the stopper");
    eprintln!("interrupted 300 ms into the call: ended after {took:?}");
    assert_eq!(error, CallError::Interrupted, "{error}");
    assert!(
        took < std::time::Duration::from_secs(2),
        "interrupted after {took:?}"
    );
    // A later call runs, on a fresh instance; one that fails is an interruption too, so that
    // nothing a failed call decided is committed on the way out.
    let mut state = WasmState::default();
    wasm.apply(&mut state, &any_event(), AT)
        .expect("a call after the interrupt");
    assert_eq!(state.state, json!(1));
    let trapping = load(&doing("(unreachable)"));
    trapping.interrupter().interrupt();
    assert_eq!(
        trapping.apply(&mut WasmState::default(), &any_event(), AT),
        Err(CallError::Interrupted)
    );
}
