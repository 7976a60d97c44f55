//! How each target's UNKNOWN intents are settled and how long its provider keeps a key: the
//! policies the reconciler applies and the look-ups and the start-up checks read. Its own module,
//! so that the reconciler and the look-ups (which the reconciler calls) each use it without
//! using each other.

use std::collections::HashMap;
use std::time::Duration;

/// How a target's UNKNOWN intents are settled (`--reconcile-strategy TARGET=STRATEGY`; the
/// safety conditions of each are in docs/guarantees.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ReconcileStrategy {
    /// Ask the provider for the key (`GET {provider}/charges/{key}`): a record is SUCCEEDED,
    /// none after the in-flight window a retryable failure.
    Lookup,
    /// Let the caller send the same request with the same key again once the in-flight window
    /// has passed: an API with Stripe's idempotency contract answers the first result again (or
    /// applies it now, if the first never arrived). Exactly-once only while the API keeps the key
    /// (`--provider-key-ttl`); past it the intent is held.
    Replay,
    /// Never ask, never send again: hold the intent for an operator's Resolve (eosctl held).
    None,
}

/// Each target's way of settling UNKNOWN and how long its API keeps keys, by the operation id's
/// `<target>:` prefix (`--reconcile-strategy`, `--key-ttl`); a target not named looks up and
/// has `--provider-key-ttl`.
#[derive(Debug, Clone, Default)]
pub struct TargetPolicies {
    strategies: HashMap<String, ReconcileStrategy>,
    key_ttls: HashMap<String, Duration>,
    default_key_ttl: Duration,
}

impl TargetPolicies {
    pub fn new(
        strategies: impl IntoIterator<Item = (String, ReconcileStrategy)>,
        key_ttls: impl IntoIterator<Item = (String, Duration)>,
        default_key_ttl: Duration,
    ) -> Self {
        Self {
            strategies: strategies.into_iter().collect(),
            key_ttls: key_ttls.into_iter().collect(),
            default_key_ttl,
        }
    }

    /// The strategy of the target `operation_id` belongs to.
    pub fn of(&self, operation_id: &str) -> ReconcileStrategy {
        target_of(operation_id)
            .and_then(|target| self.strategies.get(target))
            .copied()
            .unwrap_or(ReconcileStrategy::Lookup)
    }

    /// How long the API of the target `operation_id` belongs to keeps its keys.
    pub fn key_ttl_of(&self, operation_id: &str) -> Duration {
        target_of(operation_id).map_or(self.default_key_ttl, |target| {
            self.key_ttl_of_target(target)
        })
    }

    /// How long `target`'s API keeps its keys.
    pub fn key_ttl_of_target(&self, target: &str) -> Duration {
        self.key_ttls
            .get(target)
            .copied()
            .unwrap_or(self.default_key_ttl)
    }
}

/// The target an operation id belongs to: what precedes its first `:`.
pub fn target_of(operation_id: &str) -> Option<&str> {
    operation_id.split_once(':').map(|(target, _)| target)
}
