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
//!
//! A loop whose work comes as concurrent calls (a server's requests, dedup-service's group
//! commit) takes an [`InFlight`] per call instead ([`ProgressWatch::enter`]): work waits while any
//! call is in flight, and progress is a call answered by the dependency it waited on
//! ([`InFlight::answered`]). A call that ends unanswered (its deadline passed, its caller went
//! away, the statement failed) is not progress: the clock keeps running, even with nothing in
//! flight, until a call is answered or no call has come for [`CALLERS_GONE_AFTER`]. Otherwise a
//! dependency that hangs every call until its deadline would reset the clock at each deadline
//! and never be warned of.
//!
//! Each watch reports its own loop into the process's [`StallState`]; `/readyz` and `/healthz`
//! fail while any loop of the process is stalled, whatever the others do.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use metrics::gauge;

/// The gauge, labelled by `loop`.
pub const STALLED_SECONDS: &str = "eos_loop_stalled_seconds";

/// How often the watch looks and sets its gauge.
const CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// After a call ended unanswered, how long no call may come before nothing is taken to wait any
/// more: the callers that retry (dedup-client within 2 s, the sink's and a payment client's
/// retries) come back well within it, and the stall they retry into stays counted.
pub const CALLERS_GONE_AFTER: Duration = Duration::from_secs(10);

/// How long [`postgres_outage`]'s connection attempt may take.
#[cfg(feature = "postgres")]
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Whether `error`, which a call on `pool` met, is an outage of PostgreSQL for the watch
/// ([`InFlight::met_outage`]): PostgreSQL unreachable or refusing connections
/// ([`crate::postgres_pool::is_unreachable`]). A pool timeout is either that (sqlx retries a
/// refused connect until the pool's acquire timeout) or every connection of the pool taken by
/// calls that do not return, a hang a restart clears; one connection attempt outside the pool
/// tells them apart. One such attempt at a time in the process: a call that finds one under way
/// answers `false`, and the attempt's verdict marks the stall they share.
#[cfg(feature = "postgres")]
pub fn postgres_outage(
    error: &sqlx::Error,
    pool: &sqlx::PgPool,
) -> impl std::future::Future<Output = bool> + Send + 'static {
    use std::sync::atomic::{AtomicBool, Ordering};
    static PROBING: AtomicBool = AtomicBool::new(false);
    let unreachable = crate::postgres_pool::is_unreachable(error);
    let probe = matches!(error, sqlx::Error::PoolTimedOut).then(|| pool.clone());
    async move {
        let Some(pool) = probe else {
            return unreachable;
        };
        if PROBING.swap(true, Ordering::AcqRel) {
            return false;
        }
        let options = pool.connect_options();
        let connected = tokio::time::timeout(
            PROBE_TIMEOUT,
            sqlx::ConnectOptions::connect(options.as_ref()),
        )
        .await;
        PROBING.store(false, Ordering::Release);
        match connected {
            Ok(Ok(connection)) => {
                let _ = sqlx::Connection::close(connection).await;
                false
            }
            Ok(Err(error)) => crate::postgres_pool::is_unreachable(&error),
            Err(_) => true,
        }
    }
}

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

/// What `/healthz` and `/readyz` learn from the watches: each watch's thread sets and clears the
/// entry of its own loop, so one loop that moves again does not clear another's stall.
#[derive(Debug, Clone, Default)]
pub struct StallState {
    loops: Arc<Mutex<BTreeMap<&'static str, LoopStall>>>,
}

/// One loop stalled past its warning.
#[derive(Debug, Clone)]
struct LoopStall {
    why: String,
    restart_due: bool,
}

impl StallState {
    /// Some loop is stalled past its warning: the reason (every such loop's, joined).
    pub fn stalled(&self) -> Option<String> {
        self.reasons(|_| true)
    }

    /// Some loop is stalled past its restart bound, not by a reported outage: the reason.
    pub fn restart_due(&self) -> Option<String> {
        self.reasons(|stall| stall.restart_due)
    }

    fn reasons(&self, which: impl Fn(&LoopStall) -> bool) -> Option<String> {
        let loops = self.loops.lock().ok()?;
        let reasons: Vec<&str> = loops
            .values()
            .filter(|stall| which(stall))
            .map(|stall| stall.why.as_str())
            .collect();
        (!reasons.is_empty()).then(|| reasons.join("; "))
    }

    fn set(&self, loop_name: &'static str, stall: Option<LoopStall>) {
        if let Ok(mut loops) = self.loops.lock() {
            match stall {
                Some(stall) => loops.insert(loop_name, stall),
                None => loops.remove(loop_name),
            };
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Waiting {
    since: Instant,
    step: &'static str,
    outage: bool,
}

/// What the loop has told the watch.
#[derive(Debug, Default)]
struct Told {
    waiting: Option<Waiting>,
    /// Calls in flight ([`ProgressWatch::enter`]); always 0 for a loop that tells
    /// [`ProgressWatch::working`].
    in_flight: usize,
    /// When the last call in flight ended unanswered: the clock runs on until a call is
    /// answered or none has come for [`CALLERS_GONE_AFTER`].
    unanswered_at: Option<Instant>,
}

/// One loop's progress, told by the loop and watched by a thread of its own.
#[derive(Debug)]
pub struct ProgressWatch {
    loop_name: &'static str,
    told: Mutex<Told>,
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
            told: Mutex::new(Told::default()),
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
                // The loop is gone: a stall of it no longer holds the process back.
                state.set(loop_name, None);
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
        if let Ok(mut told) = self.told.lock() {
            told.waiting = None;
        }
    }

    /// Nothing waits (caught up): the same as progress for the watch.
    pub fn idle(&self) {
        self.progressed();
    }

    /// One concurrent call starts waiting at `step` (what it waits for, in a few words); the
    /// returned [`InFlight`] tells how it ended. The clock runs from the first call since the
    /// last progress.
    pub fn enter(self: &Arc<Self>, step: &'static str) -> InFlight {
        if let Ok(mut told) = self.told.lock() {
            told.in_flight += 1;
            told.unanswered_at = None;
            told.waiting = Some(told.waiting.map_or(
                Waiting {
                    since: Instant::now(),
                    step,
                    outage: false,
                },
                |waiting| Waiting { step, ..waiting },
            ));
        }
        InFlight {
            watch: Arc::clone(self),
            ended: false,
        }
    }

    /// How long work has waited without progress, and at what step.
    pub fn stalled_for(&self) -> Option<(&'static str, Duration)> {
        let waiting = self.told.lock().ok()?.waiting?;
        Some((waiting.step, waiting.since.elapsed()))
    }

    fn set_waiting(&self, step: &'static str, outage: bool) {
        if let Ok(mut told) = self.told.lock() {
            // An outage seen in this stall stays its cause until progress: the steps retried
            // meanwhile (reading the same input again) are not a hang of their own.
            let (since, seen_outage) = told
                .waiting
                .map_or((Instant::now(), false), |w| (w.since, w.outage));
            told.waiting = Some(Waiting {
                since,
                step,
                outage: outage || seen_outage,
            });
        }
    }

    /// A call ended: answered (progress: the clock restarts for the calls still in flight) or
    /// not (the clock runs on).
    fn call_ended(&self, answered: bool) {
        let Ok(mut told) = self.told.lock() else {
            return;
        };
        told.in_flight = told.in_flight.saturating_sub(1);
        if answered {
            told.unanswered_at = None;
            told.waiting = match told.waiting {
                Some(waiting) if told.in_flight > 0 => Some(Waiting {
                    since: Instant::now(),
                    step: waiting.step,
                    outage: false,
                }),
                _ => None,
            };
        } else if told.in_flight == 0 {
            told.unanswered_at = Some(Instant::now());
        }
    }

    fn call_met_outage(&self) {
        if let Ok(mut told) = self.told.lock()
            && let Some(waiting) = told.waiting.as_mut()
        {
            waiting.outage = true;
        }
    }

    /// What waits now: a stall of calls whose callers have all been gone for
    /// [`CALLERS_GONE_AFTER`] ends here.
    fn waiting_now(&self) -> Option<Waiting> {
        let mut told = self.told.lock().ok()?;
        if told.in_flight == 0
            && told
                .unanswered_at
                .is_some_and(|at| at.elapsed() >= CALLERS_GONE_AFTER)
        {
            told.unanswered_at = None;
            told.waiting = None;
        }
        told.waiting
    }

    fn check(&self, policy: StallPolicy, state: &StallState, warned_at: &mut Option<Instant>) {
        let waiting = self.waiting_now();
        let stalled = waiting.map_or(Duration::ZERO, |w| w.since.elapsed());
        gauge!(STALLED_SECONDS, "loop" => self.loop_name).set(stalled.as_secs_f64());
        let Some(waiting) = waiting.filter(|_| stalled >= policy.warn_after) else {
            if warned_at.take().is_some() {
                tracing::info!(r#loop = self.loop_name, "making progress again");
                state.set(self.loop_name, None);
            }
            return;
        };
        let why = format!(
            "{} has had work waiting for {}s without progress; it waits for: {}",
            self.loop_name,
            stalled.as_secs(),
            waiting.step
        );
        let restart = !waiting.outage && policy.restart_after.is_some_and(|after| stalled >= after);
        state.set(
            self.loop_name,
            Some(LoopStall {
                why,
                restart_due: restart,
            }),
        );
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

/// One call in flight on a [`ProgressWatch`] ([`ProgressWatch::enter`]). Dropped without
/// [`InFlight::answered`], it ended unanswered: no progress.
#[derive(Debug)]
#[must_use = "dropped at once, the call counts as ended unanswered"]
pub struct InFlight {
    watch: Arc<ProgressWatch>,
    ended: bool,
}

impl InFlight {
    /// The dependency answered the call (with a result or a refusal it decided): progress.
    pub fn answered(mut self) {
        self.ended = true;
        self.watch.call_ended(true);
    }

    /// The call found its dependency unreachable: the stall, until the next progress, is an
    /// outage, warned of and shown but no reason for a restart (as
    /// [`ProgressWatch::waiting_for_outage`]). The call still ends unanswered when dropped.
    pub fn met_outage(&self) {
        self.watch.call_met_outage();
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if !self.ended {
            self.watch.call_ended(false);
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

    /// Waits up to 10 s for `condition`.
    fn within_10s(condition: impl Fn() -> bool) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !condition() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        condition()
    }

    #[test]
    fn concurrent_calls_wait_until_one_is_answered_and_unanswered_ends_are_no_progress() {
        let state = StallState::default();
        let watch = ProgressWatch::spawn("calls", StallPolicy::default(), &state).expect("thread");
        let first = watch.enter("a commit");
        std::thread::sleep(Duration::from_millis(30));
        let second = watch.enter("a commit");
        let (step, waited) = watch.stalled_for().expect("calls in flight");
        assert_eq!(step, "a commit");
        assert!(waited >= Duration::from_millis(30), "{waited:?}");

        // One answered: the clock restarts for the other, still in flight.
        first.answered();
        let after_answer = watch.stalled_for().expect("one still in flight").1;
        assert!(after_answer < Duration::from_millis(30), "{after_answer:?}");

        // Ended unanswered (a deadline, a failed statement): no progress, even with nothing in
        // flight, and the next call inherits the clock.
        std::thread::sleep(Duration::from_millis(30));
        drop(second);
        let third = watch.enter("a commit");
        let (_, waited) = watch.stalled_for().expect("still stalled");
        assert!(waited >= Duration::from_millis(30), "{waited:?}");

        // Answered with nothing else in flight: nothing waits.
        third.answered();
        assert_eq!(watch.stalled_for(), None);
    }

    #[test]
    fn a_stall_of_calls_that_end_unanswered_is_warned_of_and_a_met_outage_is_no_restart() {
        let policy = StallPolicy {
            warn_after: Duration::from_millis(200),
            restart_after: Some(Duration::from_millis(400)),
        };
        let state = StallState::default();
        let watch = ProgressWatch::spawn("hung", policy, &state).expect("thread");
        // Each call gives up after 100 ms, shorter than the warning: the stall is still seen.
        let caller = {
            let watch = Arc::clone(&watch);
            std::thread::spawn(move || {
                for _ in 0..20 {
                    let call = watch.enter("a statement that does not return");
                    std::thread::sleep(Duration::from_millis(100));
                    drop(call);
                    std::thread::sleep(Duration::from_millis(20));
                }
            })
        };
        assert!(within_10s(|| state.restart_due().is_some()), "restart due");
        let why = state.restart_due().unwrap_or_default();
        assert!(
            why.contains("hung") && why.contains("does not return"),
            "{why}"
        );
        caller.join().expect("caller");

        // The next call is answered: it all clears.
        watch.enter("a statement that does not return").answered();
        assert!(within_10s(|| state.stalled().is_none()), "cleared");

        // Calls that find the dependency unreachable: a stall, but no restart.
        let call = watch.enter("PostgreSQL");
        call.met_outage();
        assert!(within_10s(|| state.stalled().is_some()), "warned of");
        std::thread::sleep(Duration::from_millis(1_500));
        assert_eq!(
            state.restart_due(),
            None,
            "an outage is no reason to restart"
        );
        drop(call);
    }

    #[test]
    fn one_loop_moving_again_does_not_clear_another_loops_stall() {
        let policy = StallPolicy {
            warn_after: Duration::from_millis(100),
            restart_after: Some(Duration::from_millis(300)),
        };
        let state = StallState::default();
        let stuck = ProgressWatch::spawn("stuck", policy, &state).expect("thread");
        let flapping = ProgressWatch::spawn("flapping", policy, &state).expect("thread");
        stuck.working("a call that never returns");
        flapping.waiting_for_outage("PostgreSQL");
        assert!(within_10s(|| state.restart_due().is_some()), "restart due");
        // Each loop's own thread lists its stall: on a busy machine one may come a check later.
        assert!(
            within_10s(|| state
                .stalled()
                .is_some_and(|why| why.contains("stuck") && why.contains("flapping"))),
            "both listed: {:?}",
            state.stalled()
        );
        flapping.progressed();
        assert!(within_10s(|| state
            .stalled()
            .is_some_and(|why| !why.contains("flapping"))));
        // Over a few checks of both threads, the stuck loop's restart stays due throughout.
        for _ in 0..30 {
            let why = state.restart_due().unwrap_or_default();
            assert!(why.contains("stuck"), "{why:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
        drop(stuck);
        assert!(
            within_10s(|| state.stalled().is_none()),
            "a dropped loop's stall goes with it"
        );
    }
}
