//! Which Kafka client errors pass by themselves. On a replicated cluster a broker that dies or
//! restarts moves its partition leaderships and its group and transaction coordinators to
//! another broker within seconds; until the client has followed them, calls fail with the codes
//! below. A service asks again (with the delays of [`crate::backoff`]) instead of stopping.

use rdkafka::error::{KafkaError, RDKafkaErrorCode};

/// True for an error that a later attempt of the same call can get past without anyone acting:
/// a leader or coordinator that is moving or loading, a broker that cannot be reached right
/// now, a request that timed out, offsets held unstable by a transaction still open.
pub fn passes_by_itself(error: &KafkaError) -> bool {
    matches!(
        error.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::NotLeaderForPartition
                | RDKafkaErrorCode::LeaderNotAvailable
                | RDKafkaErrorCode::UnknownTopicOrPartition
                | RDKafkaErrorCode::UnknownPartition
                | RDKafkaErrorCode::NotCoordinator
                | RDKafkaErrorCode::CoordinatorNotAvailable
                | RDKafkaErrorCode::CoordinatorLoadInProgress
                | RDKafkaErrorCode::UnstableOffsetCommit
                | RDKafkaErrorCode::BrokerTransportFailure
                | RDKafkaErrorCode::AllBrokersDown
                | RDKafkaErrorCode::RequestTimedOut
                | RDKafkaErrorCode::OperationTimedOut
                | RDKafkaErrorCode::NetworkException
        )
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_moving_coordinator_passes_and_a_fenced_member_does_not() {
        let moving = KafkaError::MetadataFetch(RDKafkaErrorCode::NotCoordinator);
        assert!(passes_by_itself(&moving));
        let unreachable = KafkaError::MessageConsumption(RDKafkaErrorCode::BrokerTransportFailure);
        assert!(passes_by_itself(&unreachable));
        let fenced = KafkaError::MessageConsumptionFatal(RDKafkaErrorCode::FencedInstanceId);
        assert!(!passes_by_itself(&fenced));
        let no_leader_yet = KafkaError::MetadataFetch(RDKafkaErrorCode::NotLeaderForPartition);
        assert!(passes_by_itself(&no_leader_yet));
        let denied = KafkaError::MetadataFetch(RDKafkaErrorCode::GroupAuthorizationFailed);
        assert!(!passes_by_itself(&denied));
        let topic_denied = KafkaError::MetadataFetch(RDKafkaErrorCode::TopicAuthorizationFailed);
        assert!(!passes_by_itself(&topic_denied));
    }
}
