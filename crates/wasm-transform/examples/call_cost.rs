//! The cost of one `apply` call, in µs of CPU: each module given, and a minimal WAT module that
//! answers a constant without reading its input, which is the host's own share (Extism's call,
//! the fuel, the input's JSON). Part of the WebAssembly benchmark (docs/BENCHMARKS.md
//! "WebAssembly transforms"):
//!
//! ```sh
//! examples/wasm/build
//! cargo run --release -p wasm-transform --example call_cost -- target/wasm/card.wasm target/wasm/card-as.wasm
//! ```
//!
//! Each module applies 1 KB card authorisations over 100 cards, as the processor would, in
//! rounds of 2,000 calls. The figure is the calling thread's CPU time (Linux's
//! /proc/thread-self/schedstat), which other processes on a busy machine do not inflate as they
//! do the wall clock; the process's CPU, every thread's, is printed beside it: Extism's timer
//! thread works at every call.

use std::time::Duration;

use eos_core::{Event, EventContract, FieldLocation, RecordParts};
use wasm_transform::{Options, Position, WasmModule, WasmState};

const CALLS: usize = 20_000;
const ROUNDS: usize = 10;
const CARDS: usize = 100;

/// Answers `{"state":1}` to every call.
const MINIMAL: &str = r#"(module
  (import "extism:host/env" "alloc" (func $alloc (param i64) (result i64)))
  (import "extism:host/env" "store_u8" (func $store_u8 (param i64 i32)))
  (import "extism:host/env" "output_set" (func $output_set (param i64 i64)))
  (memory (export "memory") 1)
  (data (i32.const 0) "eos-transform/1")
  (data (i32.const 64) "{\"state\":1}")
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
    (call $out (i32.const 0) (i32.const 15)) (i32.const 0))
  (func (export "apply") (result i32) (call $out (i32.const 64) (i32.const 11)) (i32.const 0)))"#;

fn authorisation(sequence: usize) -> anyhow::Result<Event> {
    let text = serde_json::json!({
        "auth_id": format!("auth-{sequence}"),
        "card": format!("card-{}", sequence % CARDS),
        "amount": "1.25",
        "currency": "EUR",
        "merchant": "m".repeat(880),
        "at": "2026-12-04T10:00:00Z",
    })
    .to_string();
    Ok(Event::parse(
        &EventContract {
            event_id: FieldLocation::Pointer("/auth_id".into()),
            entity: FieldLocation::Pointer("/card".into()),
            occurred_at: Some("/at".into()),
            ..EventContract::default()
        },
        RecordParts {
            key: None,
            value: Some(text.as_bytes()),
            headers: &[],
        },
    )?)
}

/// The CPU time this thread has run, from /proc (Linux): a busy machine's other processes
/// delay a call by the wall clock, not by this.
fn thread_cpu() -> anyhow::Result<Duration> {
    let schedstat = std::fs::read_to_string("/proc/thread-self/schedstat")?;
    let nanos = schedstat
        .split_whitespace()
        .next()
        .and_then(|field| field.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("/proc/thread-self/schedstat: {schedstat:?}"))?;
    Ok(Duration::from_nanos(nanos))
}

/// The CPU time of the whole process, every thread's (Extism's timer thread among them), in
/// clock ticks of 10 ms: over a round of hundreds of calls.
fn process_cpu() -> anyhow::Result<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks: u64 = fields
        .get(11..13)
        .ok_or_else(|| anyhow::anyhow!("/proc/self/stat: {stat:?}"))?
        .iter()
        .map(|field| field.parse::<u64>())
        .sum::<Result<u64, _>>()?;
    Ok(Duration::from_millis(ticks * 10))
}

fn measure(name: &str, bytes: &[u8], events: &[Event]) -> anyhow::Result<()> {
    let module = WasmModule::from_bytes(bytes, Options::default())?;
    let mut states = vec![WasmState::default(); CARDS];
    // Each round's CPU µs per apply; the median round is the figure.
    let mut rounds = Vec::with_capacity(ROUNDS);
    let process_started = process_cpu()?;
    for round in events.chunks(events.len() / ROUNDS) {
        let started = thread_cpu()?;
        for (sequence, event) in round.iter().enumerate() {
            let position = Position {
                partition: 0,
                offset: i64::try_from(sequence)?,
            };
            module.apply(&mut states[sequence % CARDS], event, position)?;
        }
        rounds.push((thread_cpu()? - started).as_secs_f64() * 1e6 / round.len() as f64);
    }
    let process = (process_cpu()? - process_started).as_secs_f64() * 1e6 / events.len() as f64;
    rounds.sort_by(f64::total_cmp);
    println!(
        "{name}: {:.1} µs of CPU per apply (median of {} rounds of {} calls; {:.1}–{:.1}); \
         the process's, every thread's: {process:.1}",
        rounds[rounds.len() / 2],
        rounds.len(),
        events.len() / ROUNDS,
        rounds[0],
        rounds[rounds.len() - 1]
    );
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let events = (0..CALLS)
        .map(authorisation)
        .collect::<anyhow::Result<Vec<_>>>()?;
    measure(
        "minimal WAT module (the host's share)",
        &wat::parse_str(MINIMAL)?,
        &events,
    )?;
    for path in std::env::args().skip(1) {
        measure(&path, &std::fs::read(&path)?, &events)?;
    }
    Ok(())
}
