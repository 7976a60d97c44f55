//! A retry-delay policy: delays that double from a first delay up to a cap, from the `backon`
//! crate. The sink's PostgreSQL retries, the dedup client's transient gRPC failures, the provider
//! target waiting for an outcome to settle and the processor's transactional calls take their
//! delays from here, so their retry storms look alike and are tuned in one place. Some loops
//! still wait on their own (docs/ARCHITECTURE.md lists eos-runtime's role as it is).

use std::time::Duration;

pub use backon::{
    BackoffBuilder, BlockingRetryable, ConstantBuilder, ExponentialBackoff, ExponentialBuilder,
    Retryable,
};

/// Delays `first`, `2 × first`, `4 × first`, … capped at `max`, with no limit on their number:
/// the caller stops on its own attempt count or deadline. Add `.with_jitter()` where many
/// callers may retry at once (a random extra of up to one delay spreads them apart).
pub fn doubling(first: Duration, max: Duration) -> ExponentialBuilder {
    ExponentialBuilder::default()
        .with_min_delay(first)
        .with_max_delay(max)
        .with_factor(2.0)
        .without_max_times()
}

/// Retries at once (the client library already waits between its own requests), at most
/// `retries` times after the first attempt.
pub fn immediate(retries: usize) -> ConstantBuilder {
    ConstantBuilder::default()
        .with_delay(Duration::ZERO)
        .with_max_times(retries)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubling_delays_double_up_to_the_cap_and_never_run_out() {
        let delays: Vec<Duration> =
            doubling(Duration::from_millis(100), Duration::from_millis(300))
                .build()
                .take(5)
                .collect();
        let millis: Vec<u128> = delays.iter().map(Duration::as_millis).collect();
        assert_eq!(millis, [100, 200, 300, 300, 300]);
    }

    #[test]
    fn immediate_allows_the_given_number_of_retries_without_waiting() {
        let delays: Vec<Duration> = immediate(3).build().collect();
        assert_eq!(delays, [Duration::ZERO; 3]);
    }
}
