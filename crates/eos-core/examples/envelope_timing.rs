//! Time per 1 KB record of the three things eos-processor does to every record's JSON: the
//! strict parse, the fingerprint, and the output's serialisation (docs/BENCHMARKS.md,
//! eos-processor). `cargo run --release -p eos-core --example envelope_timing`

use std::hint::black_box;
use std::time::Instant;

use eos_core::{EnvelopeError, EventEnvelope};

const RECORDS: u32 = 200_000;

fn nanos_each(mut work: impl FnMut()) -> f64 {
    let started = Instant::now();
    for _ in 0..RECORDS {
        work();
    }
    started.elapsed().as_nanos() as f64 / f64::from(RECORDS)
}

fn main() -> Result<(), EnvelopeError> {
    let note = "abcdefghij".repeat(90);
    let record = format!(
        r#"{{"event_id":"e-1234567","entity_id":"17","value":12500,"occurred_at":"2026-12-03T10:00:00Z","payload":{{"note":"{note}","n":3}}}}"#
    );
    let envelope = EventEnvelope::parse(record.as_bytes())?;
    for round in 1..=3 {
        let parse = nanos_each(|| {
            black_box(EventEnvelope::parse(black_box(record.as_bytes())).ok());
        });
        let fingerprint = nanos_each(|| {
            black_box(envelope.fingerprint());
        });
        let output = nanos_each(|| {
            black_box(serde_json::to_vec(&envelope.clone().into_json()).ok());
        });
        println!(
            "round {round}: {} bytes: parse {parse:.0} ns, fingerprint {fingerprint:.0} ns, \
             copy + serialise {output:.0} ns",
            record.len()
        );
    }
    Ok(())
}
