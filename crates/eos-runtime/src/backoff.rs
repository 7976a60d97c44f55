//! The one retry-delay policy: delays that double from a first delay up to a cap, from the
//! `backon` crate. Every retry and wait loop of the services takes its delays from here — the
//! sink's PostgreSQL retries and its connect at start-up, the dedup client's transient gRPC
//! failures, the store's serialization conflicts, the provider target waiting for an outcome to
//! settle, the processor's transactional calls, waits for a new topic's metadata, and a full
//! producer queue ([`send_when_queue_has_room`]) — so their retry storms look alike and are
//! tuned in one place. The periodic purges share [`crate::batched_purge`].

use std::time::Duration;

use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;

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

/// Polls for something the broker or the database finishes on its own (a topic's metadata after
/// its creation, a queue draining): from 50 ms, doubling to 1 s.
pub fn polling() -> ExponentialBuilder {
    doubling(Duration::from_millis(50), Duration::from_secs(1))
}

/// Hands `record` to a producer's `send`, waiting while librdkafka's local queue is full
/// (`queue.buffering.max.messages`): the queue drains as the broker acknowledges, so the wait is
/// short and grows only while the broker is slow — from 1 ms, doubling to 50 ms. `wait` spends
/// each delay: `std::thread::sleep` for a `ThreadedProducer`, whose thread serves the
/// acknowledgements, or a `BaseProducer`'s `poll`, which must serve them itself. Any other
/// error comes back with the record.
pub fn send_when_queue_has_room<R>(
    mut record: R,
    mut send: impl FnMut(R) -> Result<(), (KafkaError, R)>,
    mut wait: impl FnMut(Duration),
) -> Result<(), (KafkaError, R)> {
    let mut delays = doubling(Duration::from_millis(1), Duration::from_millis(50)).build();
    loop {
        match send(record) {
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), returned)) => {
                record = returned;
                wait(delays.next().unwrap_or(Duration::from_millis(50)));
            }
            other => return other,
        }
    }
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
    fn a_full_queue_is_waited_out_and_other_errors_come_back_with_the_record() {
        let mut full_for = 3;
        let mut waited = Vec::new();
        let sent = send_when_queue_has_room(
            "record",
            |record| {
                if full_for == 0 {
                    return Ok(());
                }
                full_for -= 1;
                Err((
                    KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull),
                    record,
                ))
            },
            |delay| waited.push(delay.as_millis()),
        );
        assert!(sent.is_ok());
        assert_eq!(waited, [1, 2, 4], "a doubling wait per full queue");

        let refused = send_when_queue_has_room(
            "record",
            |record| {
                Err((
                    KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge),
                    record,
                ))
            },
            |_| panic!("no wait for an error other than a full queue"),
        );
        let (error, record) = refused.expect_err("not a full queue");
        assert_eq!(
            error,
            KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge)
        );
        assert_eq!(record, "record");
    }

    #[test]
    fn immediate_allows_the_given_number_of_retries_without_waiting() {
        let delays: Vec<Duration> = immediate(3).build().collect();
        assert_eq!(delays, [Duration::ZERO; 3]);
    }
}
