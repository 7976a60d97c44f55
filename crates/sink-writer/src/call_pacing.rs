//! A provider-like target's pace: at most `rate_limit` calls a second, and none while the API
//! asked to be left alone (`Retry-After` on a retryable answer), so a catch-up after an outage
//! does not flood a partner's API. `concurrency` bounds the calls in flight beside it
//! (docs/sink-writer.md "Calls to any HTTP API").
//!
//! Each call takes the next free moment: the later of now, the previous call's moment plus the
//! interval, and the end of the last pause asked for. Waiting happens before an intent is
//! acquired where it can, and a call whose lease the wait used up is given back, never made late.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

/// The longest pause one `Retry-After` may ask for: a longer ask waits this long, and the
/// stalled-loop alarm tells the operator why the target does not move.
pub(crate) const MAX_PAUSE: Duration = Duration::from_secs(300);

/// One target's pace, shared by its clones.
#[derive(Debug)]
pub(crate) struct CallPacing {
    /// The time between two calls' moments; `None`: no rate limit.
    interval: Option<Duration>,
    moments: Mutex<Moments>,
}

#[derive(Debug)]
struct Moments {
    /// The next call's earliest moment under the rate limit.
    next_free: Instant,
    /// The end of the last pause an answer asked for.
    paused_until: Instant,
}

impl CallPacing {
    /// `rate_limit` calls a second at most (`None`: unlimited).
    pub(crate) fn new(rate_limit: Option<f64>) -> Self {
        let now = Instant::now();
        Self {
            interval: rate_limit
                .filter(|rate| *rate > 0.0)
                .map(|rate| Duration::from_secs_f64(1.0 / rate)),
            moments: Mutex::new(Moments {
                next_free: now,
                paused_until: now,
            }),
        }
    }

    /// Takes the next call's moment and returns it; the caller waits until then.
    pub(crate) fn reserve(&self) -> Instant {
        let now = Instant::now();
        let mut moments = self.moments.lock().unwrap_or_else(PoisonError::into_inner);
        let moment = now.max(moments.paused_until).max(moments.next_free);
        if let Some(interval) = self.interval {
            moments.next_free = moment + interval;
        }
        moment
    }

    /// Waits for the next call's moment; the time waited.
    pub(crate) async fn wait_turn(&self) -> Duration {
        let moment = self.reserve();
        let waited = moment.saturating_duration_since(Instant::now());
        tokio::time::sleep_until(moment).await;
        waited
    }

    /// The API asked for `retry_after` without calls: no call of the target starts before it
    /// has passed (at most [`MAX_PAUSE`]).
    pub(crate) fn pause_for(&self, retry_after: Duration) {
        let until = Instant::now() + retry_after.min(MAX_PAUSE);
        let mut moments = self.moments.lock().unwrap_or_else(PoisonError::into_inner);
        moments.paused_until = moments.paused_until.max(until);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn calls_are_spaced_by_the_rate_and_held_back_by_a_pause() {
        let pacing = CallPacing::new(Some(10.0));
        let start = Instant::now();
        let moments: Vec<Duration> = (0..3).map(|_| pacing.reserve() - start).collect();
        assert_eq!(
            moments,
            [0, 100, 200].map(Duration::from_millis).to_vec(),
            "10 a second: 100 ms apart"
        );
        pacing.pause_for(Duration::from_secs(2));
        assert_eq!(
            pacing.reserve() - start,
            Duration::from_secs(2),
            "after the pause"
        );
        assert_eq!(
            pacing.reserve() - start,
            Duration::from_millis(2_100),
            "then at the rate again"
        );
        pacing.pause_for(Duration::from_secs(3_600));
        assert_eq!(pacing.reserve() - start, MAX_PAUSE, "a pause is capped");
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_rate_only_a_pause_holds_calls_back() {
        let pacing = CallPacing::new(None);
        let start = Instant::now();
        assert_eq!(pacing.wait_turn().await, Duration::ZERO);
        assert_eq!(pacing.reserve(), start);
        pacing.pause_for(Duration::from_secs(1));
        assert_eq!(pacing.wait_turn().await, Duration::from_secs(1));
        assert_eq!(Instant::now() - start, Duration::from_secs(1));
    }
}
