//! Fault injection, drawn from a seeded RNG so a run can be repeated.

use std::time::Duration;

use rand::{Rng as _, SeedableRng as _};
use rand_chacha::ChaCha8Rng;

/// Probabilities of what happens to a charge request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FaultPlan {
    /// Answer 503 without applying.
    pub error_before_apply: f64,
    /// Apply, then close the connection without an answer.
    pub drop_after_apply: f64,
    /// Apply, then answer only after `delay`.
    pub delay_after_apply: f64,
    pub delay: Duration,
    /// Apply, then answer 500.
    pub error_after_apply: f64,
}

impl FaultPlan {
    pub const NONE: FaultPlan = FaultPlan {
        error_before_apply: 0.0,
        drop_after_apply: 0.0,
        delay_after_apply: 0.0,
        delay: Duration::ZERO,
        error_after_apply: 0.0,
    };

    /// Each probability in [0, 1]; the after-apply ones (one draw picks at most one) sum to <= 1.
    pub fn validate(&self) -> Result<(), String> {
        let named = [
            ("--error-before-apply-probability", self.error_before_apply),
            (
                "--drop-response-after-apply-probability",
                self.drop_after_apply,
            ),
            ("--delay-after-apply-probability", self.delay_after_apply),
            ("--error-after-apply-probability", self.error_after_apply),
        ];
        for (flag, p) in named {
            if !(0.0..=1.0).contains(&p) {
                return Err(format!("{flag} must be within [0, 1], got {p}"));
            }
        }
        let after = self.drop_after_apply + self.delay_after_apply + self.error_after_apply;
        if after > 1.0 + 1e-9 {
            return Err(format!(
                "the after-apply probabilities (drop, delay, error) sum to {after}, more than 1"
            ));
        }
        if self.delay_after_apply > 0.0 && self.delay.is_zero() {
            return Err("--delay-after-apply-probability needs --delay-after-apply".into());
        }
        Ok(())
    }
}

/// What happens after a charge was applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AfterApply {
    Answer,
    DropConnection,
    AnswerLate(Duration),
    ServerError,
}

#[derive(Debug)]
pub(crate) struct Faults {
    plan: FaultPlan,
    rng: ChaCha8Rng,
}

impl Faults {
    pub(crate) fn new(plan: FaultPlan, seed: u64) -> Self {
        Self {
            plan,
            rng: ChaCha8Rng::seed_from_u64(seed),
        }
    }

    /// Whether to fail before applying.
    pub(crate) fn fail_before_apply(&mut self) -> bool {
        self.plan.error_before_apply > 0.0 && self.rng.random_bool(self.plan.error_before_apply)
    }

    pub(crate) fn after_apply(&mut self) -> AfterApply {
        let draw: f64 = self.rng.random();
        let plan = self.plan;
        if draw < plan.drop_after_apply {
            AfterApply::DropConnection
        } else if draw < plan.drop_after_apply + plan.delay_after_apply {
            AfterApply::AnswerLate(plan.delay)
        } else if draw < plan.drop_after_apply + plan.delay_after_apply + plan.error_after_apply {
            AfterApply::ServerError
        } else {
            AfterApply::Answer
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(drop: f64, delay: f64, error: f64) -> FaultPlan {
        FaultPlan {
            error_before_apply: 0.0,
            drop_after_apply: drop,
            delay_after_apply: delay,
            delay: Duration::from_secs(2),
            error_after_apply: error,
        }
    }

    #[test]
    fn frequencies_follow_the_plan_and_the_seed_repeats_them() {
        let draws = |seed| {
            let mut faults = Faults::new(plan(0.3, 0.1, 0.1), seed);
            (0..10_000)
                .map(|_| faults.after_apply())
                .collect::<Vec<_>>()
        };
        let run = draws(7);
        assert_eq!(run, draws(7));
        let share =
            |kind: AfterApply| run.iter().filter(|a| **a == kind).count() as f64 / run.len() as f64;
        assert!((share(AfterApply::DropConnection) - 0.3).abs() < 0.02);
        assert!((share(AfterApply::AnswerLate(Duration::from_secs(2))) - 0.1).abs() < 0.02);
        assert!((share(AfterApply::ServerError) - 0.1).abs() < 0.02);
        assert!((share(AfterApply::Answer) - 0.5).abs() < 0.02);
    }

    #[test]
    fn no_faults_means_always_answer() {
        let mut faults = Faults::new(FaultPlan::NONE, 1);
        assert!((0..1000).all(|_| faults.after_apply() == AfterApply::Answer));
        assert!(!(0..1000).any(|_| faults.fail_before_apply()));
    }

    #[test]
    fn impossible_plans_are_refused() {
        assert!(plan(0.6, 0.3, 0.2).validate().is_err());
        assert!(plan(-0.1, 0.0, 0.0).validate().is_err());
        let mut no_delay = plan(0.0, 0.5, 0.0);
        no_delay.delay = Duration::ZERO;
        assert!(no_delay.validate().is_err());
        assert!(plan(0.3, 0.1, 0.1).validate().is_ok());
    }
}
