//! Retention against the replay horizon (docs/architecture/retention.md, "Retention and the replay
//! horizon"):
//!
//! `retention >= max(client retry horizon, broker replay retention, restore horizon) + margin`
//!
//! An operation can come back as long as any of those can replay it; if its dedup row were gone
//! by then, the replay would acquire it again and call the provider a second time. The service
//! refuses to start with a shorter retention, and answers `EXPIRED` (fail closed) for operations
//! older than the window instead of acquiring them.

use std::fmt;
use std::time::Duration;

/// The figures of the formula, each named after its flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RetentionPolicy {
    pub(crate) retention: Duration,
    pub(crate) client_retry_horizon: Duration,
    pub(crate) broker_replay_retention: Duration,
    pub(crate) restore_horizon: Duration,
    pub(crate) margin: Duration,
}

/// Retention is shorter than the replay horizon plus the margin.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "--retention {retention} is shorter than the replay horizon: it must be at least \
     max(--client-retry-horizon {client_retry_horizon}, --broker-replay-retention \
     {broker_replay_retention}, --restore-horizon {restore_horizon}) + --retention-margin \
     {margin} = {required}; a replay older than the retained dedup state would be applied a \
     second time"
)]
pub(crate) struct RetentionTooShort {
    pub(crate) retention: Human,
    pub(crate) client_retry_horizon: Human,
    pub(crate) broker_replay_retention: Human,
    pub(crate) restore_horizon: Human,
    pub(crate) margin: Human,
    pub(crate) required: Human,
}

/// A duration printed the way the flags take it (`7days 1h`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Human(pub(crate) Duration);

impl fmt::Display for Human {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", humantime::format_duration(self.0))
    }
}

impl RetentionPolicy {
    /// The replay horizon: the longest time after which an operation may still be replayed.
    pub(crate) fn replay_horizon(&self) -> Duration {
        self.client_retry_horizon
            .max(self.broker_replay_retention)
            .max(self.restore_horizon)
    }

    /// `max(parts) + margin`, saturating.
    pub(crate) fn required_retention(&self) -> Duration {
        self.replay_horizon().saturating_add(self.margin)
    }

    /// Fails, naming every figure, when retention < max(parts) + margin.
    pub(crate) fn check(&self) -> Result<(), RetentionTooShort> {
        let required = self.required_retention();
        if self.retention >= required {
            return Ok(());
        }
        Err(RetentionTooShort {
            retention: Human(self.retention),
            client_retry_horizon: Human(self.client_retry_horizon),
            broker_replay_retention: Human(self.broker_replay_retention),
            restore_horizon: Human(self.restore_horizon),
            margin: Human(self.margin),
            required: Human(required),
        })
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const HOUR: u64 = 3600;
    const DAY: u64 = 24 * HOUR;

    fn policy(
        retention: u64,
        client: u64,
        broker: u64,
        restore: u64,
        margin: u64,
    ) -> RetentionPolicy {
        RetentionPolicy {
            retention: Duration::from_secs(retention),
            client_retry_horizon: Duration::from_secs(client),
            broker_replay_retention: Duration::from_secs(broker),
            restore_horizon: Duration::from_secs(restore),
            margin: Duration::from_secs(margin),
        }
    }

    #[test]
    fn the_largest_part_plus_the_margin_is_required() {
        let p = policy(30 * DAY, DAY, 7 * DAY, 14 * DAY, DAY);
        assert_eq!(p.replay_horizon(), Duration::from_secs(14 * DAY));
        assert_eq!(p.required_retention(), Duration::from_secs(15 * DAY));
        assert!(p.check().is_ok());
    }

    #[test]
    fn exactly_the_required_retention_is_enough() {
        assert!(policy(8 * DAY, DAY, 7 * DAY, 2 * DAY, DAY).check().is_ok());
        assert!(
            policy(8 * DAY - 1, DAY, 7 * DAY, 2 * DAY, DAY)
                .check()
                .is_err()
        );
    }

    #[test]
    fn each_part_alone_can_make_retention_too_short() {
        for (client, broker, restore) in [(10, 1, 1), (1, 10, 1), (1, 1, 10)] {
            let p = policy(10 * DAY, client * DAY, broker * DAY, restore * DAY, HOUR);
            assert!(p.check().is_err(), "{p:?}");
        }
    }

    #[test]
    fn the_refusal_names_every_figure() {
        let error = policy(3 * DAY, DAY, 7 * DAY, 2 * DAY, 12 * HOUR)
            .check()
            .expect_err("3 days < 7.5 days");
        let message = error.to_string();
        for needle in [
            "--retention 3days",
            "--client-retry-horizon 1day",
            "--broker-replay-retention 7days",
            "--restore-horizon 2days",
            "--retention-margin 12h",
            "= 7days 12h",
        ] {
            assert!(message.contains(needle), "{needle:?} missing in: {message}");
        }
    }

    proptest! {
        #[test]
        fn check_agrees_with_the_formula(
            retention in 0u64..100 * DAY,
            client in 0u64..40 * DAY,
            broker in 0u64..40 * DAY,
            restore in 0u64..40 * DAY,
            margin in 0u64..5 * DAY,
        ) {
            let p = policy(retention, client, broker, restore, margin);
            let formula = retention >= client.max(broker).max(restore) + margin;
            prop_assert_eq!(p.check().is_ok(), formula);
        }
    }
}
