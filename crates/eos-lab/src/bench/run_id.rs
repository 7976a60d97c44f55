//! A benchmark run's seed base and id: distinct per run (the clock and the process id), and
//! short enough to read in topic and directory names.

use std::time::{SystemTime, UNIX_EPOCH};

/// The run's seed base, and its id: the base as eight hex digits.
pub(crate) fn seed_base_and_id() -> (u64, String) {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_nanos());
    let seed_base = u64::from((nanos as u32) ^ std::process::id().rotate_left(16));
    (seed_base, format!("{seed_base:08x}"))
}
