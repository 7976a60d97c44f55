//! When to try PostgreSQL again after a failure. The sink loop keeps polling Kafka while it
//! waits, so it asks whether an attempt is due instead of sleeping; the delays are the
//! workspace's one policy (`eos_runtime::backoff::doubling`).

use std::time::{Duration, Instant};

use eos_runtime::backoff::{BackoffBuilder as _, ExponentialBackoff, doubling};

const FIRST_BACKOFF: Duration = Duration::from_millis(100);

/// Exponential backoff for PostgreSQL retries.
#[derive(Debug)]
pub(crate) struct Backoff {
    max: Duration,
    delays: ExponentialBackoff,
    attempt: u32,
    next_try: Instant,
}

impl Backoff {
    pub(crate) fn new(max: Duration) -> Self {
        Self {
            max,
            delays: doubling(FIRST_BACKOFF, max).build(),
            attempt: 0,
            next_try: Instant::now(),
        }
    }

    pub(crate) fn reset(&mut self) {
        self.delays = doubling(FIRST_BACKOFF, self.max).build();
        self.attempt = 0;
        self.next_try = Instant::now();
    }

    pub(crate) fn due(&self) -> bool {
        Instant::now() >= self.next_try
    }

    /// Schedules the next attempt; returns (attempt number, delay).
    pub(crate) fn failed(&mut self) -> (u32, Duration) {
        self.attempt += 1;
        let delay = self.delays.next().unwrap_or(self.max);
        self.next_try = Instant::now() + delay;
        (self.attempt, delay)
    }

    /// Failed attempts since the last success.
    pub(crate) fn attempts(&self) -> u32 {
        self.attempt
    }

    /// Makes the next attempt due now, without forgetting the failures so far.
    pub(crate) fn try_now(&mut self) {
        self.next_try = Instant::now();
    }

    /// How long until the next attempt is due.
    pub(crate) fn remaining(&self) -> Duration {
        self.next_try.saturating_duration_since(Instant::now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The delays are computed in floating point; whole milliseconds are what the loop logs.
    fn failed_ms(backoff: &mut Backoff) -> (u32, u128) {
        let (attempt, delay) = backoff.failed();
        (attempt, delay.as_millis())
    }

    #[test]
    fn delays_double_up_to_the_max_and_reset_to_the_first() {
        let mut backoff = Backoff::new(Duration::from_millis(300));
        assert!(backoff.due());
        assert_eq!(failed_ms(&mut backoff), (1, 100));
        assert_eq!(failed_ms(&mut backoff), (2, 200));
        assert_eq!(failed_ms(&mut backoff), (3, 300));
        assert_eq!(failed_ms(&mut backoff), (4, 300));
        backoff.try_now();
        assert!(backoff.due());
        assert_eq!(backoff.attempts(), 4);
        backoff.reset();
        assert_eq!(backoff.attempts(), 0);
        assert_eq!(failed_ms(&mut backoff), (1, 100));
    }
}
