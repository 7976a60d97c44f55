//! Progress or alarm (docs/OBSERVABILITY.md "Liveness"): a service loop with work waiting either
//! makes progress or says that it does not.
//!
//! Exactly-once says nothing about *when*: a loop that reads the same input again and again, or
//! waits on a call that never returns, loses nothing and duplicates nothing, and without a watch
//! it looks healthy for ever. Each loop tells its [`ProgressWatch`] what it is doing while work
//! waits ([`ProgressWatch::working`]) and when that work moved ([`ProgressWatch::progressed`],
//! [`ProgressWatch::idle`]). A thread of the watch's own, independent of the loop and of the
//! async runtime, then:
//! - sets `eos_loop_stalled_seconds{loop}`: how long work has waited without progress (0 while
//!   the loop moves or has nothing to do), so the gauge grows while nothing moves, whatever the
//!   loop is stuck in;
//! - logs a warning naming what the loop waits for, once past `--stall-warning` and again every
//!   such period while the stall lasts, and `/readyz` answers 503 meanwhile;
//! - past `--stall-restart`, unless the loop is waiting out an outage it has reported
//!   ([`ProgressWatch::waiting_for_outage`]: a restart would not bring Kafka or PostgreSQL back),
//!   makes `/healthz` answer 503 so an orchestrator restarts the process: what a restart clears
//!   is a hang inside the process (a call that never returns, a lost wake-up).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use metrics::gauge;

/// The gauge, labelled by `loop`.
pub const STALLED_SECONDS: &str = "eos_loop_stalled_seconds";

/// How often the watch looks and sets its gauge.
const CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// When a stall is warned of and when it fails the health check, from `--stall-warning` and
/// `--stall-restart`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StallPolicy {
    pub warn_after: Duration,
    /// `None`: `/healthz` never fails for a stall.
    pub restart_after: Option<Duration>,
}

impl Default for StallPolicy {
    fn default() -> Self {
        Self {
            warn_after: Duration::from_secs(30),
            restart_after: Some(Duration::from_secs(300)),
        }
    }
}

/// What `/healthz` and `/readyz` learn from the watches: set and cleared by their threads.
#[derive(Debug, Clone, Default)]
pub struct StallState {
    stalled: Arc<AtomicBool>,
    restart_due: Arc<AtomicBool>,
    why: Arc<Mutex<String>>,
}

impl StallState {
    /// Some loop is stalled past its warning: the reason.
    pub fn stalled(&self) -> Option<String> {
        self.stalled
            .load(Ordering::Relaxed)
            .then(|| self.why.lock().map(|why| why.clone()).unwrap_or_default())
    }

    /// Some loop is stalled past its restart bound, not by a reported outage: the reason.
    pub fn restart_due(&self) -> Option<String> {
        self.restart_due
            .load(Ordering::Relaxed)
            .then(|| self.why.lock().map(|why| why.clone()).unwrap_or_default())
    }
}

#[derive(Debug, Clone, Copy)]
struct Waiting {
    since: Instant,
    step: &'static str,
    outage: bool,
}

/// One loop's progress, told by the loop and watched by a thread of its own.
#[derive(Debug)]
pub struct ProgressWatch {
    loop_name: &'static str,
    waiting: Mutex<Option<Waiting>>,
}

impl ProgressWatch {
    /// A watch of the loop `loop_name` (the gauge's `loop` label) and its thread, which reports
    /// into `state` under `policy` and ends when the watch is dropped.
    pub fn spawn(
        loop_name: &'static str,
        policy: StallPolicy,
        state: &StallState,
    ) -> std::io::Result<Arc<Self>> {
        let watch = Arc::new(Self {
            loop_name,
            waiting: Mutex::new(None),
        });
        gauge!(STALLED_SECONDS, "loop" => loop_name).set(0.0);
        let weak: Weak<Self> = Arc::downgrade(&watch);
        let state = state.clone();
        std::thread::Builder::new()
            .name(format!("{loop_name}-progress"))
            .spawn(move || {
                let mut warned_at: Option<Instant> = None;
                while let Some(watch) = weak.upgrade() {
                    watch.check(policy, &state, &mut warned_at);
                    drop(watch);
                    std::thread::sleep(CHECK_INTERVAL);
                }
            })?;
        Ok(watch)
    }

    /// Work waits and the loop is at `step` (what it waits for, in a few words). The stall
    /// clock runs from the first call since the last progress; the step is the latest.
    pub fn working(&self, step: &'static str) {
        self.set_waiting(step, false);
    }

    /// Like [`Self::working`], for a wait on a dependency the loop found unreachable: warned of
    /// and shown as any stall, but no reason for a restart, until the loop makes progress.
    pub fn waiting_for_outage(&self, step: &'static str) {
        self.set_waiting(step, true);
    }

    /// The work moved (a batch committed): the clock starts again at the next [`Self::working`].
    pub fn progressed(&self) {
        if let Ok(mut waiting) = self.waiting.lock() {
            *waiting = None;
        }
    }

    /// Nothing waits (caught up): the same as progress for the watch.
    pub fn idle(&self) {
        self.progressed();
    }

    /// How long work has waited without progress, and at what step.
    pub fn stalled_for(&self) -> Option<(&'static str, Duration)> {
        let waiting = (*self.waiting.lock().ok()?)?;
        Some((waiting.step, waiting.since.elapsed()))
    }

    fn set_waiting(&self, step: &'static str, outage: bool) {
        if let Ok(mut waiting) = self.waiting.lock() {
            // An outage seen in this stall stays its cause until progress: the steps retried
            // meanwhile (reading the same input again) are not a hang of their own.
            let (since, seen_outage) =
                waiting.map_or((Instant::now(), false), |w| (w.since, w.outage));
            *waiting = Some(Waiting {
                since,
                step,
                outage: outage || seen_outage,
            });
        }
    }

    fn check(&self, policy: StallPolicy, state: &StallState, warned_at: &mut Option<Instant>) {
        let waiting = self.waiting.lock().ok().and_then(|waiting| *waiting);
        let stalled = waiting.map_or(Duration::ZERO, |w| w.since.elapsed());
        gauge!(STALLED_SECONDS, "loop" => self.loop_name).set(stalled.as_secs_f64());
        let Some(waiting) = waiting.filter(|_| stalled >= policy.warn_after) else {
            if warned_at.take().is_some() {
                tracing::info!(r#loop = self.loop_name, "making progress again");
                state.stalled.store(false, Ordering::Relaxed);
                state.restart_due.store(false, Ordering::Relaxed);
            }
            return;
        };
        let why = format!(
            "{} has had work waiting for {}s without progress; it waits for: {}",
            self.loop_name,
            stalled.as_secs(),
            waiting.step
        );
        if let Ok(mut reason) = state.why.lock() {
            reason.clone_from(&why);
        }
        state.stalled.store(true, Ordering::Relaxed);
        let restart = !waiting.outage && policy.restart_after.is_some_and(|after| stalled >= after);
        state.restart_due.store(restart, Ordering::Relaxed);
        if warned_at.is_none_or(|at| at.elapsed() >= policy.warn_after) {
            *warned_at = Some(Instant::now());
            tracing::warn!(
                r#loop = self.loop_name,
                waiting_for = waiting.step,
                stalled_seconds = stalled.as_secs(),
                outage = waiting.outage,
                restart_due = restart,
                "no progress while work waits"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_runs_from_the_first_step_without_progress_and_stops_at_progress() {
        let state = StallState::default();
        let watch = ProgressWatch::spawn("test", StallPolicy::default(), &state).expect("thread");
        assert_eq!(watch.stalled_for(), None);
        watch.working("reading");
        std::thread::sleep(Duration::from_millis(30));
        watch.working("committing");
        let (step, stalled) = watch.stalled_for().expect("waiting");
        assert_eq!(step, "committing");
        assert!(stalled >= Duration::from_millis(30), "{stalled:?}");
        watch.progressed();
        assert_eq!(watch.stalled_for(), None);
        watch.working("reading");
        assert!(watch.stalled_for().expect("waiting").1 < Duration::from_millis(30));
        watch.idle();
        assert_eq!(watch.stalled_for(), None);
    }

    #[test]
    fn a_stall_past_its_bounds_marks_not_ready_then_restart_due_but_not_for_an_outage() {
        let policy = StallPolicy {
            warn_after: Duration::from_millis(100),
            restart_after: Some(Duration::from_millis(300)),
        };
        let state = StallState::default();
        let watch = ProgressWatch::spawn("stuck", policy, &state).expect("thread");
        watch.working("a call that never returns");
        let deadline = Instant::now() + Duration::from_secs(10);
        while state.restart_due().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let why = state.restart_due().expect("restart due within 10 s");
        assert!(why.contains("a call that never returns"), "{why}");
        assert!(state.stalled().is_some());
        watch.progressed();
        let deadline = Instant::now() + Duration::from_secs(10);
        while state.stalled().is_some() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(state.stalled(), None, "cleared once it moves");
        assert_eq!(state.restart_due(), None);

        watch.waiting_for_outage("PostgreSQL");
        let deadline = Instant::now() + Duration::from_secs(10);
        while state.stalled().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        std::thread::sleep(Duration::from_millis(1_500));
        assert!(state.stalled().is_some(), "an outage is still a stall");
        assert_eq!(
            state.restart_due(),
            None,
            "but a restart would not clear it"
        );
    }
}
