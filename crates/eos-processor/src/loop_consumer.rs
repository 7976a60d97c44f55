//! The loop's Kafka consumer type: a `BaseConsumer` whose context records the group's
//! rebalances for the loop to act on between polls. Its own module, so that the loop and the
//! lag watch (which reads the consumer's positions) each name it without using each other.

use rdkafka::consumer::BaseConsumer;

use eos_runtime::rebalance::RebalanceRecorder;

pub(crate) type LoopConsumer = BaseConsumer<RebalanceRecorder>;
