//! Exponential backoff for PostgreSQL retries. The sink loop keeps polling Kafka while it waits,
//! so it asks whether an attempt is due instead of sleeping.

use std::time::{Duration, Instant};

const FIRST_BACKOFF: Duration = Duration::from_millis(100);

/// Exponential backoff for PostgreSQL retries.
#[derive(Debug)]
pub(crate) struct Backoff {
    max: Duration,
    delay: Duration,
    attempt: u32,
    next_try: Instant,
}

impl Backoff {
    pub(crate) fn new(max: Duration) -> Self {
        Self {
            max,
            delay: FIRST_BACKOFF,
            attempt: 0,
            next_try: Instant::now(),
        }
    }

    pub(crate) fn reset(&mut self) {
        self.delay = FIRST_BACKOFF;
        self.attempt = 0;
        self.next_try = Instant::now();
    }

    pub(crate) fn due(&self) -> bool {
        Instant::now() >= self.next_try
    }

    /// Schedules the next attempt; returns (attempt number, delay).
    pub(crate) fn failed(&mut self) -> (u32, Duration) {
        self.attempt += 1;
        let delay = self.delay;
        self.next_try = Instant::now() + delay;
        self.delay = (self.delay * 2).min(self.max);
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

    #[test]
    fn delays_double_up_to_the_max_and_reset_to_the_first() {
        let mut backoff = Backoff::new(Duration::from_millis(300));
        assert!(backoff.due());
        assert_eq!(backoff.failed(), (1, Duration::from_millis(100)));
        assert_eq!(backoff.failed(), (2, Duration::from_millis(200)));
        assert_eq!(backoff.failed(), (3, Duration::from_millis(300)));
        assert_eq!(backoff.failed(), (4, Duration::from_millis(300)));
        backoff.try_now();
        assert!(backoff.due());
        assert_eq!(backoff.attempts(), 4);
        backoff.reset();
        assert_eq!(backoff.attempts(), 0);
        assert_eq!(backoff.failed(), (1, Duration::from_millis(100)));
    }
}
