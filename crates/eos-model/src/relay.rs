//! outbox-relay's logical mode (docs/architecture/outbox.md "Outbox", "Logical mode") as a
//! [`stateright::Model`]: a writer committing a bounded number of outbox transactions (one of
//! them larger than the batch limit), the relay reading them through peeks of the replication
//! slot, publishing each batch in a Kafka transaction with its position, prefetching the next
//! batch while that transaction commits, and advancing the slot afterwards; with SIGKILLs, Kafka
//! transactions that abort or end with an unknown outcome, and slot advances that fail, at any
//! point.
//!
//! Every step the relay decides is decided by its own code:
//! - each peek's result is judged by [`judge_peek`]: the positions to publish, the position after
//!   them and whether to read again at once, or `DecodeFurther` (the peek's limit doubles);
//! - after each Kafka commit, [`slot_advance_due`] says whether the slot moves now.
//!
//! What is the model's own: the environment (the writer, PostgreSQL's peek, Kafka, crashes,
//! time) and the loop around those two functions, as `relay_loop.rs` `publish_until` and
//! `published` and `logical.rs` `read_stream` run it: a read takes the WAL's end, then peeks from
//! the slot's position (not the relay's) up to it, the first peek with twice the batch limit
//! when the slot is behind the read's position; a batch's read of the next batch starts before
//! its Kafka commit and its peeks interleave with the commit and the advance; a restart resumes
//! from Kafka's position and first advances the slot to it.
//!
//! PostgreSQL's peek, as the model computes it: the transactions committed up to the WAL end
//! asked for, from the slot's confirmed position on (PostgreSQL skips those before it), whole:
//! it stops after the first commit that brings the messages returned to the limit. A
//! transaction is its begin, one insert message per row, and its commit. pgoutput's Relation
//! message (before the first insert of a decoding session) is left out: it only makes a peek
//! stop one transaction sooner now and then.
//!
//! WAL positions are counted in transactions: position `k` is the end of the `k`-th commit
//! record, and transaction `i`'s commit record starts at LSN `2i + 1` and ends at `2i + 2`, so
//! "a transaction is in Kafka iff its commit record starts before the position" holds as it does
//! for real LSNs.
//!
//! Time is abstract: after an advance, `Tick` says the advance interval has elapsed; the rule is
//! asked with no time at all or more than any interval.
//!
//! Not modelled: the first start's table pass (the slot starts at the beginning of the WAL,
//! with nothing before it), transactions without outbox rows and other databases' WAL (so an
//! empty read never moves the position and `idle_position_due` is never due), rows not yet
//! visible after their commit (`load` waits for them), several relays.

use std::time::Duration;

use outbox_relay::Lsn;
use outbox_relay::logical::{Decoded, DecodedTxn, PeekJudgement, judge_peek};
use outbox_relay::relay_loop::slot_advance_due;
use stateright::{Model, Property};

/// A deliberately broken variant, to show the checker finds what it must find. The product
/// code is never changed; the model takes the wrong step instead of calling it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Bug {
    /// The relay before fe68279 ("a backlog of more than two batches no longer stalls the logical
    /// relay for good"): one peek of `--batch-size` messages whatever the
    /// slot's lag; a peek that stops before the read's position is taken as it is (nothing to
    /// publish, read again at once, the same position: `DecodeFurther` not honoured); and the
    /// slot advanced only once the interval elapsed, full read or not.
    BeforeTheFix,
    /// Only the read half of the fix undone: today's advance rule and first peek, but a peek
    /// that stops before the read's position is taken as it is, as before the fix.
    IgnoresDecodeFurther,
    /// Only the advance half of the fix undone: reads decode further as today, but the slot is
    /// advanced only once the interval elapsed, as before the fix. Not a bug: liveness holds (the
    /// advance after every full batch saves re-decoding, it is not what keeps the relay live).
    AdvancesOnlyOnInterval,
}

/// The bounds of one run.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RelayModel {
    /// `--batch-size`: the rows a read asks for, passed to the peek as its message limit.
    pub batch_size: u8,
    /// The writer's transactions in commit order, by their number of outbox rows.
    pub txn_rows: Vec<u8>,
    /// SIGKILLs of the relay (each followed by a restart).
    pub crashes: u8,
    /// Kafka transactions that abort or end with an unknown outcome, and failed slot advances.
    pub failures: u8,
    /// `None`: the relay's code as it is.
    pub bug: Option<Bug>,
}

impl RelayModel {
    /// The bounds `cargo test` checks (see docs/MODEL_CHECKING.md): batches of 4 rows; six
    /// transactions of 1, 2, 1, 5, 1 and 1 rows (a 1-row transaction is 3 messages, so two fill
    /// a peek; the 2-row one is 4, a peek's limit exactly; the 5-row one is larger than a batch),
    /// two crashes, two Kafka or slot failures.
    pub fn standard() -> Self {
        Self {
            batch_size: 4,
            txn_rows: vec![1, 2, 1, 5, 1, 1],
            crashes: 2,
            failures: 2,
            bug: None,
        }
    }

    pub fn with_bug(self, bug: Bug) -> Self {
        Self {
            bug: Some(bug),
            ..self
        }
    }

    fn transactions(&self) -> u8 {
        u8::try_from(self.txn_rows.len()).expect("a few transactions")
    }

    /// The outbox positions of transaction `txn`'s rows: numbered from 1 in commit order.
    fn positions_of(&self, txn: u8) -> std::ops::RangeInclusive<u8> {
        let before: u8 = self.txn_rows[..usize::from(txn)].iter().sum();
        before + 1..=before + self.txn_rows[usize::from(txn)]
    }

    /// Every row of the first `txns` transactions, in commit order.
    pub fn rows_before(&self, txns: u8) -> Vec<u8> {
        (0..txns).flat_map(|txn| self.positions_of(txn)).collect()
    }

    /// `pg_logical_slot_peek_binary_changes(slot, upto, limit)` with the slot at `slot`.
    fn peek(&self, slot: u8, upto: u8, limit: i32) -> Decoded {
        let limit = usize::try_from(limit).unwrap_or(usize::MAX);
        let mut decoded = Decoded::default();
        for txn in slot..upto {
            decoded.txns.push(DecodedTxn {
                xid: u32::from(txn) + 1,
                commit_lsn: Lsn(2 * u64::from(txn) + 1),
                end_lsn: lsn(txn + 1),
                commit_time: 0,
                positions: self.positions_of(txn).map(i64::from).collect(),
            });
            decoded.messages += usize::from(self.txn_rows[usize::from(txn)]) + 2;
            // Checked after each commit: a transaction is never split.
            if decoded.messages >= limit {
                break;
            }
        }
        decoded
    }
}

/// The LSN of position `txns` (the end of the `txns`-th commit record).
fn lsn(txns: u8) -> Lsn {
    Lsn(2 * u64::from(txns))
}

/// The position an LSN the relay computed stands for: it is always one of [`lsn`]'s.
fn position(lsn: Lsn) -> u8 {
    debug_assert_eq!(lsn.0 % 2, 0, "{lsn:?} is not a position");
    u8::try_from(lsn.0 / 2).expect("a small WAL")
}

/// What a read returned (`LogicalRead`): rows by outbox position, the position once they are
/// published, and whether it stopped at its limit (read again at once).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Batch {
    pub rows: Vec<u8>,
    pub next: u8,
    pub more: bool,
}

/// One `read_stream` after `after`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Read {
    pub after: u8,
    /// `None`: not started. Else the WAL end it reads up to, read first (`marks`).
    pub upto: Option<u8>,
    /// The next peek's message limit.
    pub peek_limit: i32,
    /// A prefetch's result, until the loop takes it.
    pub done: Option<Batch>,
}

impl Read {
    fn after(after: u8) -> Self {
        Self {
            after,
            upto: None,
            peek_limit: 0,
            done: None,
        }
    }
}

/// Where the relay loop is.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Reading the batch after its position: a fresh read, or the prefetch it now awaits.
    Reading(Read),
    /// Caught up (a read found nothing and was not full): waits for a notification.
    Waiting,
    /// The batch's Kafka transaction is open; the next batch's read runs beside it.
    Publishing { batch: Batch, next: Option<Read> },
    /// Kafka committed the batch; the slot's advance is next, the next batch's read beside it.
    Advancing { batch: Batch, next: Option<Read> },
}

/// The relay process: what a SIGKILL loses.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Relay {
    /// Where the next read starts.
    pub position: u8,
    /// Since the last advance: `None` none yet (`advanced_at` unset), `Some(false)` no time,
    /// `Some(true)` the interval has elapsed.
    pub advanced: Option<bool>,
    pub phase: Phase,
}

#[derive(Clone, PartialEq, Eq, Hash)]
pub struct RelayState {
    /// Transactions the writer has committed (the WAL's end).
    pub written: u8,
    /// Their rows: positions 1 to this (what the liveness goal compares Kafka with).
    pub rows_written: u8,
    /// Kafka's committed records, by outbox position, in order.
    pub published: Vec<u8>,
    /// Kafka's committed position (the position record of the last committed transaction).
    pub kafka_at: u8,
    /// The slot's confirmed position.
    pub slot: u8,
    pub relay: Relay,
    pub crashes_left: u8,
    pub failures_left: u8,
    /// Ghost: a read's peek was judged `DecodeFurther` and peeked again.
    pub decoded_further: bool,
    /// Ghost: a crash came between a Kafka commit and the slot's advance.
    pub crashed_before_advance: bool,
    /// Ghost: the read of the next batch peeked while the slot was behind its position.
    pub next_read_behind: bool,
}

/// Counterexamples print one state per line.
impl std::fmt::Debug for RelayState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let flags: Vec<&str> = [
            (self.decoded_further, "decoded_further"),
            (self.crashed_before_advance, "crashed_before_advance"),
            (self.next_read_behind, "next_read_behind"),
        ]
        .into_iter()
        .filter_map(|(set, name)| set.then_some(name))
        .collect();
        write!(
            f,
            "written {} | kafka at {} {:?} | slot {} | relay at {} advanced {:?} {:?} | \
             left(crashes {}, failures {}) flags: {flags:?}",
            self.written,
            self.kafka_at,
            self.published,
            self.slot,
            self.relay.position,
            self.relay.advanced,
            self.relay.phase,
            self.crashes_left,
            self.failures_left,
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// The writer commits its next transaction.
    Write,
    /// The advance interval elapses.
    Tick,
    /// A read takes the WAL's end and the slot's position (`marks`, `slot_position`); `next`:
    /// the read of the next batch, beside the Kafka transaction.
    StartRead { next: bool },
    /// A read peeks the slot and judges what it got.
    Peek { next: bool },
    /// A notification (the writer committed) wakes the caught-up relay.
    Wake,
    /// Kafka commits the batch with its position.
    Commit,
    /// Kafka aborts the batch's transaction (`AbortAndRedo`): nothing of it is visible.
    Abort,
    /// The commit's outcome is unknown (`ReplaceProducer`): `landed` or not, the relay reads the
    /// position back from Kafka (`recover`, which advances the slot to it).
    OutcomeUnknown { landed: bool },
    /// After the commit: the slot moves to it if [`slot_advance_due`].
    Advance,
    /// The advance was due and failed (the slot stays; it moves with a later batch).
    AdvanceFails,
    /// SIGKILL, and the restart: Kafka's open transaction is aborted, the relay resumes from
    /// Kafka's position after advancing the slot to it.
    Crash,
}

impl RelayModel {
    /// A read's first step: `upto` is the WAL's end (never before the read's position); the
    /// first peek asks twice the batch limit when the slot is behind the position (the batch in
    /// flight, typically).
    fn start(&self, state: &RelayState, read: &mut Read) {
        let limit = i32::from(self.batch_size);
        read.upto = Some(state.written.max(read.after));
        read.peek_limit = match self.bug {
            Some(Bug::BeforeTheFix) => limit,
            _ if state.slot < read.after => limit.saturating_mul(2),
            _ => limit,
        };
    }

    /// A peek, judged by the relay's `judge_peek`; `None`: the read goes on (it peeks further).
    fn peek_and_judge(&self, state: &mut RelayState, read: &mut Read) -> Option<Batch> {
        let upto = read.upto.expect("a started read");
        let decoded = self.peek(state.slot, upto, read.peek_limit);
        match judge_peek(&decoded, read.peek_limit, lsn(read.after), lsn(upto)) {
            PeekJudgement::Read {
                positions,
                next,
                more,
            } => Some(Batch {
                rows: positions
                    .into_iter()
                    .map(|p| u8::try_from(p).expect("small positions"))
                    .collect(),
                next: position(next),
                more,
            }),
            PeekJudgement::DecodeFurther
                if matches!(
                    self.bug,
                    Some(Bug::BeforeTheFix | Bug::IgnoresDecodeFurther)
                ) =>
            {
                // The code before the fix published what the peek held after the position
                // (nothing: it stopped before it) and went on from the end of its last commit
                // or the position, whichever is later (the position), as a full read.
                let last_end = decoded.txns.last().map_or(lsn(read.after), |t| t.end_lsn);
                Some(Batch {
                    rows: Vec::new(),
                    next: position(last_end.max(lsn(read.after))),
                    more: true,
                })
            }
            PeekJudgement::DecodeFurther => {
                state.decoded_further = true;
                read.peek_limit = read.peek_limit.saturating_mul(2);
                None
            }
        }
    }

    /// The loop takes a read's batch (`publish_until`): nothing to publish moves the position
    /// and reads again at once (full) or waits (caught up); rows are published, and a full read
    /// starts the next batch's read before the commit.
    fn take(relay: &mut Relay, batch: Batch) {
        relay.phase = if batch.rows.is_empty() {
            relay.position = batch.next;
            if batch.more {
                Phase::Reading(Read::after(relay.position))
            } else {
                Phase::Waiting
            }
        } else {
            Phase::Publishing {
                next: batch.more.then(|| Read::after(batch.next)),
                batch,
            }
        };
    }

    /// The top of the loop after a batch: the next batch's read if one was started, else a
    /// fresh one.
    fn after_batch(relay: &mut Relay, next: Option<Read>) {
        match next {
            Some(Read {
                done: Some(batch), ..
            }) => Self::take(relay, batch),
            Some(read) => relay.phase = Phase::Reading(read),
            None => relay.phase = Phase::Reading(Read::after(relay.position)),
        }
    }

    fn since_last_advance(relay: &Relay) -> Option<Duration> {
        // No time at all, or more than any interval.
        relay.advanced.map(|elapsed| {
            if elapsed {
                Duration::MAX
            } else {
                Duration::ZERO
            }
        })
    }

    fn advance_due(&self, relay: &Relay, full_read: bool) -> bool {
        let full_read = match self.bug {
            // Before the fix the rule was the interval alone.
            Some(Bug::BeforeTheFix | Bug::AdvancesOnlyOnInterval) => false,
            _ => full_read,
        };
        slot_advance_due(full_read, Self::since_last_advance(relay))
    }
}

impl Model for RelayModel {
    type State = RelayState;
    type Action = Action;

    fn init_states(&self) -> Vec<Self::State> {
        vec![RelayState {
            written: 0,
            rows_written: 0,
            published: Vec::new(),
            kafka_at: 0,
            slot: 0,
            relay: Relay {
                position: 0,
                advanced: None,
                phase: Phase::Reading(Read::after(0)),
            },
            crashes_left: self.crashes,
            failures_left: self.failures,
            decoded_further: false,
            crashed_before_advance: false,
            next_read_behind: false,
        }]
    }

    fn actions(&self, state: &Self::State, actions: &mut Vec<Self::Action>) {
        if state.written < self.transactions() {
            actions.push(Action::Write);
        }
        if state.relay.advanced == Some(false) {
            actions.push(Action::Tick);
        }
        if state.crashes_left > 0 {
            actions.push(Action::Crash);
        }
        let read_step = |read: &Read, next: bool, actions: &mut Vec<Action>| match read {
            Read { done: Some(_), .. } => {}
            Read { upto: None, .. } => actions.push(Action::StartRead { next }),
            Read { upto: Some(_), .. } => actions.push(Action::Peek { next }),
        };
        match &state.relay.phase {
            Phase::Reading(read) => read_step(read, false, actions),
            Phase::Waiting => {
                if state.written > state.relay.position {
                    actions.push(Action::Wake);
                }
            }
            Phase::Publishing { next, .. } => {
                actions.push(Action::Commit);
                if state.failures_left > 0 {
                    actions.push(Action::Abort);
                    actions.push(Action::OutcomeUnknown { landed: true });
                    actions.push(Action::OutcomeUnknown { landed: false });
                }
                if let Some(read) = next {
                    read_step(read, true, actions);
                }
            }
            Phase::Advancing { batch, next } => {
                actions.push(Action::Advance);
                if state.failures_left > 0 && self.advance_due(&state.relay, batch.more) {
                    actions.push(Action::AdvanceFails);
                }
                if let Some(read) = next {
                    read_step(read, true, actions);
                }
            }
        }
    }

    fn next_state(&self, last: &Self::State, action: Self::Action) -> Option<Self::State> {
        let mut state = last.clone();
        match action {
            Action::Write => {
                state.rows_written += self.txn_rows[usize::from(state.written)];
                state.written += 1;
            }
            Action::Tick => state.relay.advanced = Some(true),
            Action::Crash => {
                state.crashes_left -= 1;
                if matches!(state.relay.phase, Phase::Advancing { .. }) {
                    state.crashed_before_advance = true;
                }
                // `recover_logical`: the slot is moved up to Kafka's position, never back.
                state.slot = state.slot.max(state.kafka_at);
                state.relay = Relay {
                    position: state.kafka_at,
                    advanced: None,
                    phase: Phase::Reading(Read::after(state.kafka_at)),
                };
            }
            Action::StartRead { next } => {
                let mut read = self.take_read(&mut state, next)?;
                self.start(&state, &mut read);
                self.put_read(&mut state, next, read);
            }
            Action::Peek { next } => {
                let mut read = self.take_read(&mut state, next)?;
                if next && state.slot < read.after {
                    state.next_read_behind = true;
                }
                match self.peek_and_judge(&mut state, &mut read) {
                    None => self.put_read(&mut state, next, read),
                    Some(batch) if next => {
                        read.done = Some(batch);
                        self.put_read(&mut state, next, read);
                    }
                    Some(batch) => Self::take(&mut state.relay, batch),
                }
            }
            Action::Wake => {
                state.relay.phase = Phase::Reading(Read::after(state.relay.position));
            }
            Action::Commit => {
                let Phase::Publishing { batch, next } = state.relay.phase.clone() else {
                    return None;
                };
                state.published.extend_from_slice(&batch.rows);
                state.kafka_at = batch.next;
                state.relay.position = batch.next;
                state.relay.phase = Phase::Advancing { batch, next };
            }
            Action::Abort => {
                state.failures_left -= 1;
                // The next batch's read is dropped; the same rows are read again.
                state.relay.phase = Phase::Reading(Read::after(state.relay.position));
            }
            Action::OutcomeUnknown { landed } => {
                state.failures_left -= 1;
                let Phase::Publishing { batch, next } = state.relay.phase.clone() else {
                    return None;
                };
                if landed {
                    state.published.extend_from_slice(&batch.rows);
                    state.kafka_at = batch.next;
                }
                // `recover`: the position read back from Kafka, the slot moved up to it.
                state.slot = state.slot.max(state.kafka_at);
                state.relay.position = state.kafka_at;
                // The next batch's read is kept only if the batch is in.
                let next = next.filter(|_| state.relay.position == batch.next);
                Self::after_batch(&mut state.relay, next);
            }
            Action::Advance | Action::AdvanceFails => {
                let Phase::Advancing { batch, next } = state.relay.phase.clone() else {
                    return None;
                };
                if self.advance_due(&state.relay, batch.more) {
                    state.relay.advanced = Some(false);
                    if action == Action::AdvanceFails {
                        state.failures_left -= 1;
                    } else {
                        // `LogicalSource::advance`: to Kafka's committed position, never back.
                        state.slot = state.slot.max(batch.next);
                    }
                }
                Self::after_batch(&mut state.relay, next);
            }
        }
        Some(state)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(NEVER_PUBLISHED_TWICE, |_, s: &RelayState| {
                let mut seen = s.published.clone();
                seen.sort_unstable();
                seen.dedup();
                seen.len() == s.published.len()
            }),
            Property::always(IN_COMMIT_ORDER_WITHOUT_GAP, |model, s: &RelayState| {
                model.rows_before(s.written).starts_with(&s.published)
            }),
            Property::always(KAFKA_POSITION_MATCHES_RECORDS, |model, s: &RelayState| {
                s.published == model.rows_before(s.kafka_at)
            }),
            Property::always(SLOT_NOT_PAST_KAFKA, |_, s: &RelayState| {
                s.slot <= s.kafka_at
            }),
            Property::sometimes(
                REACHES_ALL_AFTER_DECODING_FURTHER,
                |model, s: &RelayState| s.decoded_further && all_published(model, s),
            ),
            Property::sometimes(
                REACHES_ALL_AFTER_CRASH_BEFORE_ADVANCE,
                |model, s: &RelayState| s.crashed_before_advance && all_published(model, s),
            ),
            Property::sometimes(REACHES_ALL_AFTER_FAILURE, |model, s: &RelayState| {
                s.failures_left == 0 && all_published(model, s)
            }),
            Property::sometimes(
                REACHES_ALL_AFTER_NEXT_READ_BEHIND,
                |model, s: &RelayState| s.next_read_behind && all_published(model, s),
            ),
        ]
    }
}

impl RelayModel {
    /// The read a `StartRead`/`Peek` works on, taken out of the phase.
    fn take_read(&self, state: &mut RelayState, next: bool) -> Option<Read> {
        match (&mut state.relay.phase, next) {
            (Phase::Reading(read), false) => Some(read.clone()),
            (
                Phase::Publishing {
                    next: Some(read), ..
                }
                | Phase::Advancing {
                    next: Some(read), ..
                },
                true,
            ) => Some(read.clone()),
            _ => None,
        }
    }

    fn put_read(&self, state: &mut RelayState, next: bool, read: Read) {
        match (&mut state.relay.phase, next) {
            (Phase::Reading(slot), false) => *slot = read,
            (
                Phase::Publishing {
                    next: Some(slot), ..
                }
                | Phase::Advancing {
                    next: Some(slot), ..
                },
                true,
            ) => *slot = read,
            _ => unreachable!("take_read found the read there"),
        }
    }
}

/// Every transaction written, every row in Kafka.
fn all_published(model: &RelayModel, state: &RelayState) -> bool {
    state.written == model.transactions() && state.published == model.rows_before(state.written)
}

/// The liveness goal: every committed row is in Kafka (in order, once: positions 1 to the last
/// one written).
pub fn every_committed_row_published(state: &RelayState) -> bool {
    state.published.len() == usize::from(state.rows_written)
        && state.published.iter().copied().eq(1..=state.rows_written)
}

/// The liveness check's suffix is every reachable state: the faults are bounded, so each path
/// has finitely many, and from then on the relay and the writer are all that move.
pub fn in_fair_suffix(_: &RelayState) -> bool {
    true
}

pub const NEVER_PUBLISHED_TWICE: &str = "no row is published twice";
pub const IN_COMMIT_ORDER_WITHOUT_GAP: &str =
    "Kafka holds committed rows in commit order, none skipped (a prefix of the commit order)";
pub const KAFKA_POSITION_MATCHES_RECORDS: &str =
    "Kafka's position covers exactly the rows Kafka holds (a restart resumes right after them)";
pub const SLOT_NOT_PAST_KAFKA: &str = "the slot never passes Kafka's committed position";
pub const REACHES_ALL_AFTER_DECODING_FURTHER: &str =
    "reachable: a read decoded further, and every row was published";
pub const REACHES_ALL_AFTER_CRASH_BEFORE_ADVANCE: &str =
    "reachable: a crash between a Kafka commit and the slot's advance, and every row was published";
pub const REACHES_ALL_AFTER_FAILURE: &str =
    "reachable: a Kafka or slot failure, and every row was published";
pub const REACHES_ALL_AFTER_NEXT_READ_BEHIND: &str = "reachable: the read of the next batch \
    peeked while the slot was behind its position, and every row was published";

/// The always-properties, for tests that check each one.
pub const SAFETY_PROPERTIES: [&str; 4] = [
    NEVER_PUBLISHED_TWICE,
    IN_COMMIT_ORDER_WITHOUT_GAP,
    KAFKA_POSITION_MATCHES_RECORDS,
    SLOT_NOT_PAST_KAFKA,
];

/// The sometimes-properties: states the model must reach, or it proves nothing.
pub const REACHABILITY_PROPERTIES: [&str; 4] = [
    REACHES_ALL_AFTER_DECODING_FURTHER,
    REACHES_ALL_AFTER_CRASH_BEFORE_ADVANCE,
    REACHES_ALL_AFTER_FAILURE,
    REACHES_ALL_AFTER_NEXT_READ_BEHIND,
];
