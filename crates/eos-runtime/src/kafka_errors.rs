//! librdkafka's client-level errors (its error callback) as clear log lines, and the last
//! refusal a process's Kafka clients met, for the error a command or a failed start-up ends
//! with.
//!
//! A broker that refuses a client — a wrong SASL password, a missing or untrusted client
//! certificate — does not fail any one call: librdkafka reports it through the error callback
//! and keeps reconnecting (with `reconnect.backoff.ms` up to `reconnect.backoff.max.ms`, the
//! same error repeated at most every 30 s), while the calls wait and at most time out. Without
//! a callback of ours those reports go nowhere and the process looks hung, so every Kafka client
//! context of eos-suite sends them through [`report_client_error`]: a refusal becomes an ERROR
//! that says authentication (or the TLS handshake) failed, with librdkafka's reason, which never
//! holds a property value such as `sasl.password`.
//!
//! Errors that pass by themselves are told apart too ([`passes_by_itself`]): on a replicated
//! cluster a broker that dies or restarts moves its partition leaderships and its group and
//! transaction coordinators to another broker within seconds, and until the client has followed
//! them, calls fail with those codes; a service asks again (with the delays of
//! [`crate::backoff`]) instead of stopping.
//!
//! A long-running service keeps retrying rather than exiting: a credential the broker learns a
//! few seconds late (a rotation) then needs no restart, and its `/readyz` stays false meanwhile
//! because no partition is assigned. A start-up step that gives up (a metadata request that timed
//! out) ends the process with the refusal named (see [`last_refusal`]); the commands of eosctl
//! end the same way, exit 2.

use std::sync::Mutex;
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::client::ClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer as _, ConsumerContext};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::types::RDKafkaErrorCode;

/// The last refusal any Kafka client of this process was told about, as a sentence.
static LAST_REFUSAL: Mutex<Option<String>> = Mutex::new(None);

/// What kind of client-level error librdkafka reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientErrorKind {
    /// SASL authentication failed (wrong user or password, unknown mechanism).
    Authentication,
    /// The TLS handshake failed: an untrusted server certificate, or a broker that requires a
    /// client certificate and got none (or one it does not trust).
    Tls,
    /// Anything else (a broker down, a timeout): librdkafka retries on its own.
    Other,
}

impl ClientErrorKind {
    pub fn of(error: &KafkaError, reason: &str) -> Self {
        match error.rdkafka_error_code() {
            Some(RDKafkaErrorCode::Authentication) => Self::Authentication,
            Some(RDKafkaErrorCode::SSL) => Self::Tls,
            // A broker that requires a client certificate answers a client without one with a
            // TLS alert ("bad certificate", "certificate required"), which librdkafka reports as
            // a transport failure.
            _ if [
                "SSL alert",
                "SSL handshake",
                "certificate required",
                "certificate verify",
            ]
            .iter()
            .any(|sign| reason.contains(sign)) =>
            {
                Self::Tls
            }
            _ => Self::Other,
        }
    }
}

/// Logs one client-level error of librdkafka and, for a refusal, records it for
/// [`last_refusal`]. Called from every Kafka client context of eos-suite.
pub fn report_client_error(error: &KafkaError, reason: &str) {
    match ClientErrorKind::of(error, reason) {
        ClientErrorKind::Authentication => {
            let refusal = format!("Kafka authentication failed: {reason}");
            tracing::error!(
                %error,
                reason,
                "Kafka authentication failed: the broker refused this client's SASL credentials \
                 (check sasl.mechanism, sasl.username and sasl.password); retrying"
            );
            record(refusal);
        }
        ClientErrorKind::Tls => {
            let refusal = format!("Kafka TLS handshake failed: {reason}");
            tracing::error!(
                %error,
                reason,
                "Kafka TLS handshake failed (check ssl.ca.location, and ssl.certificate.location \
                 and ssl.key.location where the broker requires a client certificate); retrying"
            );
            record(refusal);
        }
        ClientErrorKind::Other => tracing::warn!(%error, reason, "Kafka client error"),
    }
}

fn record(refusal: String) {
    if let Ok(mut last) = LAST_REFUSAL.lock() {
        *last = Some(refusal);
    }
}

/// The last authentication or TLS refusal any Kafka client of this process met, if one did:
/// the likely cause of a Kafka call that timed out.
pub fn last_refusal() -> Option<String> {
    LAST_REFUSAL.lock().ok().and_then(|last| last.clone())
}

/// Serves the events `consumer` has queued: rust-rdkafka delivers librdkafka's error and log
/// callbacks through the client's queue, served only by a poll, and a client used for metadata
/// alone is never polled. Called after such a call failed, so that a refusal the broker sent is
/// reported (and recorded for [`last_refusal`]) before the failure is.
pub fn serve_pending_events<C: ConsumerContext>(consumer: &BaseConsumer<C>) {
    // A bounded number of zero-wait polls: each serves at most one queued event (a log line,
    // an error) and none waits. `None` does not mean the queue is empty (a served log event
    // answers `None` too), so all of them are made.
    for _ in 0..64 {
        let _ = consumer.poll(Duration::ZERO);
    }
}

/// Asks the cluster for its metadata once, waiting up to `timeout`: a start-up check for a
/// process whose first Kafka call would otherwise be an admin request, which a refused client
/// waits on for its whole request timeout without a word. A refusal is reported (and recorded)
/// when it fails.
pub fn check_reachable(client_config: &ClientConfig, timeout: Duration) -> KafkaResult<()> {
    let consumer: BaseConsumer<ReportingContext> =
        client_config.create_with_context(ReportingContext)?;
    consumer
        .fetch_metadata(None, timeout)
        .map(|_| ())
        .inspect_err(|_| serve_pending_events(&consumer))
}

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

/// A client context with nothing but the error reporting, for the clients that need no other
/// callback (admin clients, metadata consumers).
#[derive(Debug, Clone, Copy, Default)]
pub struct ReportingContext;

impl ClientContext for ReportingContext {
    fn error(&self, error: KafkaError, reason: &str) {
        report_client_error(&error, reason);
    }
}

impl ConsumerContext for ReportingContext {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_told_apart_from_transient_errors() {
        let auth = KafkaError::Global(RDKafkaErrorCode::Authentication);
        assert_eq!(
            ClientErrorKind::of(&auth, "SASL authentication error"),
            ClientErrorKind::Authentication
        );
        let tls = KafkaError::Global(RDKafkaErrorCode::SSL);
        assert_eq!(
            ClientErrorKind::of(&tls, "SSL handshake failed"),
            ClientErrorKind::Tls
        );
        let transport = KafkaError::Global(RDKafkaErrorCode::BrokerTransportFailure);
        assert_eq!(
            ClientErrorKind::of(
                &transport,
                "Receive failed: error:0A000412:SSL routines::ssl/tls alert bad certificate: SSL \
                 alert number 42"
            ),
            ClientErrorKind::Tls
        );
        assert_eq!(
            ClientErrorKind::of(&transport, "Connection refused"),
            ClientErrorKind::Other
        );
    }

    #[test]
    fn a_reported_refusal_is_the_last_refusal() {
        report_client_error(
            &KafkaError::Global(RDKafkaErrorCode::Authentication),
            "invalid credentials with SASL mechanism SCRAM-SHA-512",
        );
        let refusal = last_refusal().expect("recorded");
        assert!(
            refusal.starts_with("Kafka authentication failed: invalid credentials"),
            "{refusal}"
        );
    }

    #[test]
    fn a_moving_coordinator_passes_and_a_fenced_member_does_not() {
        let moving = KafkaError::MetadataFetch(RDKafkaErrorCode::NotCoordinator);
        assert!(passes_by_itself(&moving));
        let unreachable = KafkaError::MessageConsumption(RDKafkaErrorCode::BrokerTransportFailure);
        assert!(passes_by_itself(&unreachable));
        let no_leader_yet = KafkaError::MetadataFetch(RDKafkaErrorCode::NotLeaderForPartition);
        assert!(passes_by_itself(&no_leader_yet));
        let fenced = KafkaError::MessageConsumptionFatal(RDKafkaErrorCode::FencedInstanceId);
        assert!(!passes_by_itself(&fenced));
        let denied = KafkaError::MetadataFetch(RDKafkaErrorCode::GroupAuthorizationFailed);
        assert!(!passes_by_itself(&denied));
        let topic_denied = KafkaError::MetadataFetch(RDKafkaErrorCode::TopicAuthorizationFailed);
        assert!(!passes_by_itself(&topic_denied));
        let refused = KafkaError::Global(RDKafkaErrorCode::Authentication);
        assert!(!passes_by_itself(&refused));
    }
}
