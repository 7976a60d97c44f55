//! Group commit: concurrent single `Begin` calls (and, apart, single `Complete` calls) go to
//! PostgreSQL together, as one statement and one commit, through the same batched statements
//! `BeginBatch` and `CompleteBatch` use. Each of those statements decides every row on its own
//! (one `INSERT … ON CONFLICT` or `UPDATE … FROM unnest` row per operation id), so a call in a
//! group gets the answer its own statement would have given; the group only shares the round
//! trip and the WAL flush, which is what a single call's time goes to
//! (docs/architecture/loop-invariants.md "Loop invariants", dedup-service).
//!
//! Leader/follower, with no added wait: a call that finds a group slot free goes at once, in its
//! own task (a group of one: at low load every call, with no hop through the queue); calls that
//! arrive while every slot is committing queue up, and the next free slot takes all of them (up
//! to `max_calls`). Two calls with the same operation id
//! never share a statement (`ON CONFLICT` cannot touch a row twice in one statement, and the
//! second must see the first's result): the later one waits for a later group, in arrival order.
//! A call whose caller went away before its group formed is left out; one that is already in a
//! group is decided with it (as a single statement already sent would be), and its answer is
//! dropped.
//!
//! Every call is watched (`write_watch.rs`, docs/OBSERVABILITY.md "Liveness") from its arrival
//! until its group's statement ends: a call queued behind groups whose commits hang is work
//! waiting, and a group committed is progress. The watch goes with the call into its group, so
//! a statement that outlives its callers' deadlines is still seen waiting.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use futures::future::BoxFuture;
use tokio::sync::{Semaphore, mpsc, oneshot};

use crate::error::DedupError;
use crate::intent_store::{BeginAnswer, IntentStore};
use crate::metrics;
use crate::validation::{BeginItem, CompleteItem};
use crate::write_watch::WriteWatch;
use dedup_client::state_machine::Intent;
use eos_runtime::progress_watch::InFlight;

/// How calls are grouped (`--group-commit-max-calls`, `--group-commit-groups`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GroupCommitSettings {
    /// Most calls in one statement; 1 turns grouping off.
    pub(crate) max_calls: usize,
    /// Groups of one kind in flight at once: while one waits for its commit, the next can form
    /// and go, so one slow commit does not stall every caller.
    pub(crate) groups: usize,
}

impl GroupCommitSettings {
    pub(crate) fn enabled(&self) -> bool {
        self.max_calls > 1
    }
}

/// The grouped single calls of one service: Begin and Complete, each with its own queue.
#[derive(Debug, Clone)]
pub(crate) struct GroupCommit {
    begin: Grouper<BeginItem, BeginAnswer>,
    complete: Grouper<CompleteItem, Intent>,
}

impl GroupCommit {
    /// Starts the two dispatchers (tokio tasks that end when the last `GroupCommit` clone is
    /// dropped); every call is told to `watch`.
    pub(crate) fn start(
        store: IntentStore,
        settings: GroupCommitSettings,
        watch: WriteWatch,
    ) -> Self {
        let begin_store = store.clone();
        let begin = Grouper::start(
            ("Begin", "a group commit of Begin calls"),
            (settings, watch.clone()),
            |item: &BeginItem| item.operation_id.as_str(),
            Arc::new(move |items: Vec<BeginItem>| {
                let store = begin_store.clone();
                Box::pin(async move {
                    let answers = store.begin_batch(&items).await?;
                    Ok(answers.into_iter().map(Ok).collect())
                }) as BoxFuture<'static, _>
            }),
        );
        let complete = Grouper::start(
            ("Complete", "a group commit of Complete calls"),
            (settings, watch),
            |item: &CompleteItem| item.operation_id.as_str(),
            Arc::new(move |items: Vec<CompleteItem>| {
                let store = store.clone();
                Box::pin(async move { store.complete_batch(&items).await }) as BoxFuture<'static, _>
            }),
        );
        Self { begin, complete }
    }

    /// One Begin, answered from its own row of its group's statement.
    pub(crate) async fn begin(&self, item: BeginItem) -> Result<BeginAnswer, DedupError> {
        self.begin.call(item).await
    }

    /// One Complete, answered from its own row of its group's statement: the intent, or the
    /// error the single call gives (not found, stale token, wrong secret, wrong state).
    pub(crate) async fn complete(&self, item: CompleteItem) -> Result<Intent, DedupError> {
        self.complete.call(item).await
    }
}

/// One group's statement: the items in, one answer per item in the same order, or one error for
/// the whole group (the database's; a conflict was retried inside the store already).
type RunGroup<I, A> = Arc<
    dyn Fn(Vec<I>) -> BoxFuture<'static, Result<Vec<Result<A, DedupError>>, DedupError>>
        + Send
        + Sync,
>;

struct Call<I, A> {
    item: I,
    reply: oneshot::Sender<Result<A, DedupError>>,
    queued_at: Instant,
    /// The call on the watch, until its group's statement ends.
    waiting: InFlight,
}

struct Grouper<I, A> {
    method: &'static str,
    /// What a call of this grouper waits for, as the watch names it.
    step: &'static str,
    queue: mpsc::UnboundedSender<Call<I, A>>,
    /// The group slots, shared with the dispatcher.
    slots: Arc<Semaphore>,
    run: RunGroup<I, A>,
    watch: WriteWatch,
}

impl<I, A> Clone for Grouper<I, A> {
    fn clone(&self) -> Self {
        Self {
            method: self.method,
            step: self.step,
            queue: self.queue.clone(),
            slots: Arc::clone(&self.slots),
            run: Arc::clone(&self.run),
            watch: self.watch.clone(),
        }
    }
}

impl<I, A> std::fmt::Debug for Grouper<I, A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grouper").finish_non_exhaustive()
    }
}

impl<I: Send + 'static, A: Send + 'static> Grouper<I, A> {
    fn start(
        (method, step): (&'static str, &'static str),
        (settings, watch): (GroupCommitSettings, WriteWatch),
        key: fn(&I) -> &str,
        run: RunGroup<I, A>,
    ) -> Self {
        // Unbounded: what bounds the queue is the callers, each waiting for its answer
        // (--concurrency-per-connection per connection, --request-timeout each).
        let (queue, calls) = mpsc::unbounded_channel();
        let slots = Arc::new(Semaphore::new(settings.groups.max(1)));
        tokio::spawn(dispatch(
            method,
            settings,
            key,
            (Arc::clone(&run), watch.clone()),
            Arc::clone(&slots),
            calls,
        ));
        Self {
            method,
            step,
            queue,
            slots,
            run,
            watch,
        }
    }

    async fn call(&self, item: I) -> Result<A, DedupError> {
        let waiting = self.watch.enter(self.step);
        // A free slot means no call is queued for one (a freed slot goes to the waiting
        // dispatcher first): this call goes at once, in its own task, as a group of one. At low
        // load that is every call, with no hop to another task and back.
        if let Ok(slot) = Arc::clone(&self.slots).try_acquire_owned() {
            ::metrics::histogram!(metrics::GROUP_COMMIT_CALLS, "method" => self.method).record(1.0);
            let answer = (self.run)(vec![item]).await;
            drop(slot);
            self.watch.call_ended(waiting, &answer);
            return match answer {
                Ok(mut answers) if answers.len() == 1 => {
                    answers.pop().unwrap_or(Err(DedupError::GroupCommitLost))
                }
                Ok(answers) => Err(DedupError::CorruptRow(format!(
                    "one {} call got {} answers",
                    self.method,
                    answers.len()
                ))),
                Err(error) => Err(error),
            };
        }
        let (reply, answer) = oneshot::channel();
        let call = Call {
            item,
            reply,
            queued_at: Instant::now(),
            waiting,
        };
        self.queue
            .send(call)
            .map_err(|_| DedupError::GroupCommitLost)?;
        answer.await.map_err(|_| DedupError::GroupCommitLost)?
    }
}

/// Forms the groups: waits for a call, then for a free slot, then takes every queued call (up to
/// `max_calls`, duplicates of an operation id left for a later group) and runs them.
async fn dispatch<I: Send + 'static, A: Send + 'static>(
    method: &'static str,
    settings: GroupCommitSettings,
    key: fn(&I) -> &str,
    (run, watch): (RunGroup<I, A>, WriteWatch),
    slots: Arc<Semaphore>,
    mut calls: mpsc::UnboundedReceiver<Call<I, A>>,
) {
    let max_calls = settings.max_calls.max(1);
    // Calls taken from the queue but not yet in a group (duplicates), in arrival order: they go
    // before anything still in the queue.
    let mut waiting: VecDeque<Call<I, A>> = VecDeque::new();
    loop {
        if waiting.is_empty() {
            match calls.recv().await {
                Some(call) => waiting.push_back(call),
                None => return,
            }
        }
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
            return;
        };
        let mut group: Vec<Call<I, A>> = Vec::new();
        let mut ids: HashSet<String> = HashSet::new();
        let mut later: VecDeque<Call<I, A>> = VecDeque::new();
        let mut cancelled = 0usize;
        while group.len() < max_calls {
            let next = match waiting.pop_front() {
                Some(call) => call,
                None => match calls.try_recv() {
                    Ok(call) => call,
                    Err(_) => break,
                },
            };
            if next.reply.is_closed() {
                cancelled += 1;
                continue;
            }
            if ids.contains(key(&next.item)) {
                later.push_back(next);
                continue;
            }
            ids.insert(key(&next.item).to_owned());
            group.push(next);
        }
        // The duplicates were taken before whatever is still waiting (the group filled up).
        later.append(&mut waiting);
        waiting = later;
        if cancelled > 0 {
            tracing::debug!(
                method,
                cancelled,
                "calls left out of the group commit: their callers went away"
            );
        }
        if group.is_empty() {
            continue;
        }
        let (run, watch) = (Arc::clone(&run), watch.clone());
        let deferred = waiting.len();
        tokio::spawn(async move {
            run_group(method, group, deferred, (run, watch)).await;
            drop(slot);
        });
    }
}

async fn run_group<I, A>(
    method: &'static str,
    group: Vec<Call<I, A>>,
    deferred: usize,
    (run, watch): (RunGroup<I, A>, WriteWatch),
) {
    let calls = group.len();
    let oldest_wait = group
        .iter()
        .map(|call| call.queued_at.elapsed())
        .max()
        .unwrap_or_default();
    ::metrics::histogram!(metrics::GROUP_COMMIT_CALLS, "method" => method).record(calls as f64);
    let mut waiting = Vec::with_capacity(calls);
    let (items, replies): (Vec<I>, Vec<_>) = group
        .into_iter()
        .map(|call| {
            waiting.push(call.waiting);
            (call.item, call.reply)
        })
        .unzip();
    let started = Instant::now();
    let outcome = run(items).await;
    // Decided before the answers take the outcome; told after they are sent.
    let watched = watch.ended(waiting, outcome.as_ref().err());
    tracing::debug!(
        method,
        calls,
        deferred,
        queued_ms = oldest_wait.as_secs_f64() * 1000.0,
        statement_ms = started.elapsed().as_secs_f64() * 1000.0,
        ok = outcome.is_ok(),
        "group commit"
    );
    match outcome {
        Ok(answers) if answers.len() == replies.len() => {
            for (reply, answer) in replies.into_iter().zip(answers) {
                // A caller that went away meanwhile does not take its answer; nothing to do.
                let _ = reply.send(answer);
            }
        }
        Ok(answers) => {
            let problem = format!(
                "a group of {calls} {method} calls got {} answers",
                answers.len()
            );
            tracing::error!(
                method,
                calls,
                answers = answers.len(),
                "group commit answered the wrong number of calls"
            );
            for reply in replies {
                let _ = reply.send(Err(DedupError::CorruptRow(problem.clone())));
            }
        }
        Err(error) if replies.len() == 1 => {
            // A group of one fails exactly as the single call did.
            if let Some(reply) = replies.into_iter().next() {
                let _ = reply.send(Err(error));
            }
        }
        Err(error) => {
            tracing::warn!(method, calls, %error, "group commit failed: every call of the group gets its error");
            let shared = Arc::new(error);
            for reply in replies {
                let _ = reply.send(Err(DedupError::Group(Arc::clone(&shared))));
            }
        }
    }
    watched.await;
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::Duration;

    use super::*;

    use eos_runtime::progress_watch::{ProgressWatch, StallPolicy, StallState};

    /// The call numbers of each group, in the order the groups ran.
    type Groups = Arc<Mutex<Vec<Vec<usize>>>>;

    /// A grouper over `(operation id, call number)` whose statement records each group and
    /// answers every call with its own number, or fails the whole group; every group waits at
    /// `gate` first, so the test decides when a group commits.
    fn grouper(
        max_calls: usize,
        fail: bool,
        gate: Arc<tokio::sync::Mutex<()>>,
    ) -> (Grouper<(String, usize), usize>, Groups) {
        let (grouper, groups, _) = watched_grouper(max_calls, fail, gate);
        (grouper, groups)
    }

    /// [`grouper`], with the progress watch its calls are told to.
    fn watched_grouper(
        max_calls: usize,
        fail: bool,
        gate: Arc<tokio::sync::Mutex<()>>,
    ) -> (Grouper<(String, usize), usize>, Groups, Arc<ProgressWatch>) {
        let groups = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&groups);
        let watch = ProgressWatch::spawn("test", StallPolicy::default(), &StallState::default())
            .expect("the watch's thread");
        let grouper = Grouper::start(
            ("Test", "a group commit of Test calls"),
            (
                GroupCommitSettings {
                    max_calls,
                    groups: 1,
                },
                WriteWatch::new(Arc::clone(&watch), None),
            ),
            |item: &(String, usize)| item.0.as_str(),
            Arc::new(move |items: Vec<(String, usize)>| {
                let seen = Arc::clone(&seen);
                let gate = Arc::clone(&gate);
                Box::pin(async move {
                    seen.lock()
                        .expect("not poisoned")
                        .push(items.iter().map(|item| item.1).collect());
                    let _open = gate.lock().await;
                    if fail {
                        return Err(DedupError::from(sqlx::Error::PoolTimedOut));
                    }
                    Ok(items.into_iter().map(|item| Ok(item.1)).collect())
                }) as BoxFuture<'static, _>
            }),
        );
        (grouper, groups, watch)
    }

    async fn until(condition: impl Fn() -> bool) {
        for _ in 0..500 {
            if condition() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        panic!("condition not reached");
    }

    /// Calls one group holds up, queued in this order while it commits.
    fn queue_behind(
        grouper: &Grouper<(String, usize), usize>,
        calls: &[(&str, usize)],
    ) -> Vec<tokio::task::JoinHandle<Result<usize, DedupError>>> {
        calls
            .iter()
            .map(|(id, n)| {
                let grouper = grouper.clone();
                let item = ((*id).to_owned(), *n);
                tokio::spawn(async move { grouper.call(item).await })
            })
            .collect()
    }

    #[tokio::test]
    async fn calls_queued_behind_a_commit_go_together_and_duplicates_wait_in_order() {
        let gate = Arc::new(tokio::sync::Mutex::new(()));
        let closed = gate.lock().await;
        let (grouper, groups) = grouper(3, false, Arc::clone(&gate));
        let first = queue_behind(&grouper, &[("a", 0)]);
        until(|| groups.lock().expect("not poisoned").len() == 1).await;
        let queued = queue_behind(&grouper, &[("a", 1)]);
        tokio::time::sleep(Duration::from_millis(20)).await;
        let queued: Vec<_> = queued
            .into_iter()
            .chain(queue_behind(&grouper, &[("b", 2)]))
            .collect();
        tokio::time::sleep(Duration::from_millis(20)).await;
        let queued: Vec<_> = queued
            .into_iter()
            .chain(queue_behind(&grouper, &[("a", 3)]))
            .collect();
        tokio::time::sleep(Duration::from_millis(20)).await;
        let queued: Vec<_> = queued
            .into_iter()
            .chain(queue_behind(&grouper, &[("c", 4), ("d", 5), ("e", 6)]))
            .collect();
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(closed);
        for (handle, n) in first.into_iter().chain(queued).zip([0, 1, 2, 3, 4, 5, 6]) {
            assert_eq!(handle.await.expect("joined").expect("answered"), n);
        }
        // No wait for the first; then at most 3 a group, "a" once a group, in arrival order.
        assert_eq!(
            *groups.lock().expect("not poisoned"),
            vec![vec![0], vec![1, 2, 4], vec![3, 5, 6]]
        );
    }

    #[tokio::test]
    async fn a_failed_group_gives_every_call_the_single_calls_status() {
        let gate = Arc::new(tokio::sync::Mutex::new(()));
        let closed = gate.lock().await;
        let (grouper, groups) = grouper(8, true, Arc::clone(&gate));
        let first = queue_behind(&grouper, &[("a", 0)]);
        until(|| groups.lock().expect("not poisoned").len() == 1).await;
        let queued = queue_behind(&grouper, &[("b", 1), ("c", 2)]);
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(closed);
        for handle in first.into_iter().chain(queued) {
            let error = handle.await.expect("joined").expect_err("the group failed");
            assert_eq!(tonic::Status::from(error).code(), tonic::Code::Unavailable);
        }
        assert_eq!(groups.lock().expect("not poisoned").len(), 2);
    }

    #[tokio::test]
    async fn a_caller_that_went_away_is_left_out_and_the_others_are_answered() {
        let gate = Arc::new(tokio::sync::Mutex::new(()));
        let closed = gate.lock().await;
        let (grouper, groups) = grouper(8, false, Arc::clone(&gate));
        let first = queue_behind(&grouper, &[("a", 0)]);
        until(|| groups.lock().expect("not poisoned").len() == 1).await;
        let gone = queue_behind(&grouper, &[("b", 1)]);
        tokio::time::sleep(Duration::from_millis(20)).await;
        let kept = queue_behind(&grouper, &[("c", 2)]);
        tokio::time::sleep(Duration::from_millis(20)).await;
        for handle in &gone {
            handle.abort();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(closed);
        for (handle, n) in first.into_iter().chain(kept).zip([0, 2]) {
            assert_eq!(handle.await.expect("joined").expect("answered"), n);
        }
        assert_eq!(
            *groups.lock().expect("not poisoned"),
            vec![vec![0], vec![2]]
        );
    }

    #[tokio::test]
    async fn calls_behind_a_hanging_commit_are_work_waiting_until_their_group_commits() {
        let gate = Arc::new(tokio::sync::Mutex::new(()));
        let closed = gate.lock().await;
        let (grouper, groups, watch) = watched_grouper(8, false, Arc::clone(&gate));
        assert_eq!(watch.stalled_for(), None, "nothing waits yet");
        let first = queue_behind(&grouper, &[("a", 0)]);
        until(|| groups.lock().expect("not poisoned").len() == 1).await;
        let queued = queue_behind(&grouper, &[("b", 1), ("c", 2)]);
        tokio::time::sleep(Duration::from_millis(50)).await;
        let (step, waited) = watch.stalled_for().expect("calls wait on a commit");
        assert_eq!(step, "a group commit of Test calls");
        assert!(waited >= Duration::from_millis(50), "{waited:?}");
        drop(closed);
        for handle in first.into_iter().chain(queued) {
            handle.await.expect("joined").expect("answered");
        }
        assert_eq!(
            watch.stalled_for(),
            None,
            "committed: progress, and nothing waits"
        );
    }

    #[tokio::test]
    async fn a_failed_group_is_no_progress() {
        let gate = Arc::new(tokio::sync::Mutex::new(()));
        let (grouper, _, watch) = watched_grouper(8, true, gate);
        let calls = queue_behind(&grouper, &[("a", 0), ("b", 1)]);
        for handle in calls {
            handle.await.expect("joined").expect_err("the group failed");
        }
        // Told in a task of its own once the callers have their answers.
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(
            watch.stalled_for().is_some(),
            "a write that failed moved nothing: the clock runs on"
        );
    }
}
