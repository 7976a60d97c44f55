//! outbox-relay's logical mode as it runs now (docs/architecture/outbox.md "Logical mode"): reads
//! from a replication session on the slot, as a [`stateright::Model`]. A writer commits a bounded
//! number of outbox transactions (one larger than a batch); the relay reads them through a session
//! that PostgreSQL's walsender feeds in commit order, publishes each batch in a Kafka transaction
//! with its position, reads the next batch while that transaction commits, and confirms the slot
//! only up to what Kafka committed; with SIGKILLs, Kafka transactions that abort or end with an
//! unknown outcome, and status updates sent at any later time.
//!
//! Every step the relay decides is decided by its own code: what a read makes of each transaction
//! and keepalive handed over, and when it ends, by `outbox_relay::logical_stream::HandOver`;
//! whether a read goes on with the open session or starts a new one, by `session_goes_on`.
//!
//! The model's own parts: the environment (the writer; the walsender, which hands over every
//! transaction committing at or after the session's start, in commit order, and its own position
//! once it has handed over all that is written; Kafka; crashes) and the loop around those
//! functions as `relay_loop.rs` and `LogicalSource::read_stream` run it. A read takes the session
//! out while it reads, so a read cut off (its batch aborted) leaves none behind.
//!
//! Positions and LSNs are counted as in [`crate::relay`]: position `k` is the end of the `k`-th
//! commit record; transaction `i` commits at LSN `2i + 1` and ends at `2i + 2`.
//!
//! Not modelled: the first start's table pass (the slot starts at the beginning of the WAL), a
//! read's one-second cap (`READ_AT_MOST`: it ends a read that keeps receiving transactions without
//! outbox rows; there are none here), the idle position commits (no WAL without outbox rows here),
//! `slot_advance_due` (every commit acknowledges its position: acknowledging less often only
//! delays confirmations), rows not yet visible after their commit, several relays.

use std::time::Duration;

use outbox_relay::Lsn;
use outbox_relay::logical::DecodedTxn;
use outbox_relay::logical_stream::{HandOver, session_goes_on};
use stateright::{Model, Property};

use crate::relay::{
    IN_COMMIT_ORDER_WITHOUT_GAP, KAFKA_POSITION_MATCHES_RECORDS, NEVER_PUBLISHED_TWICE,
    SLOT_NOT_PAST_KAFKA,
};

/// A deliberately broken variant, to show the checker finds what it must find. The product code
/// is never changed; the model takes the wrong step instead of calling it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SessionBug {
    /// A read always goes on with the open session, whatever position it reads after (instead
    /// of `session_goes_on`): after an aborted batch the session has already handed that batch
    /// over, so its rows would never be read again.
    AlwaysGoesOn,
    /// A session confirms what it handed over instead of what Kafka committed: a crash then
    /// finds the slot past Kafka's position.
    ConfirmsWhatItHandedOver,
}

/// The bounds of one run.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SessionModel {
    /// `--batch-size`: the rows a read asks for.
    pub batch_size: u8,
    /// The writer's transactions in commit order, by their number of outbox rows.
    pub txn_rows: Vec<u8>,
    /// SIGKILLs of the relay (each followed by a restart).
    pub crashes: u8,
    /// Kafka transactions that abort or end with an unknown outcome.
    pub failures: u8,
    /// `None`: the relay's code as it is.
    pub bug: Option<SessionBug>,
}

impl SessionModel {
    /// The bounds `cargo test` checks (docs/MODEL_CHECKING.md): batches of 4 rows; six
    /// transactions of 1, 2, 1, 5, 1 and 1 rows (the 5-row one is larger than a batch); two
    /// crashes, two Kafka failures.
    pub fn standard() -> Self {
        Self {
            batch_size: 4,
            txn_rows: vec![1, 2, 1, 5, 1, 1],
            crashes: 2,
            failures: 2,
            bug: None,
        }
    }

    pub fn with_bug(self, bug: SessionBug) -> Self {
        Self {
            bug: Some(bug),
            ..self
        }
    }

    fn transactions(&self) -> u8 {
        u8::try_from(self.txn_rows.len()).expect("a few transactions")
    }

    fn positions_of(&self, txn: u8) -> std::ops::RangeInclusive<u8> {
        let before: u8 = self.txn_rows[..usize::from(txn)].iter().sum();
        before + 1..=before + self.txn_rows[usize::from(txn)]
    }

    /// Every row of the first `txns` transactions, in commit order.
    pub fn rows_before(&self, txns: u8) -> Vec<u8> {
        (0..txns).flat_map(|txn| self.positions_of(txn)).collect()
    }

    /// Transaction `txn` as the session hands it over.
    fn decoded(&self, txn: u8) -> DecodedTxn {
        DecodedTxn {
            xid: u32::from(txn) + 1,
            commit_lsn: Lsn(2 * u64::from(txn) + 1),
            end_lsn: lsn(txn + 1),
            commit_time: 0,
            positions: self.positions_of(txn).map(i64::from).collect(),
        }
    }
}

fn lsn(position: u8) -> Lsn {
    Lsn(2 * u64::from(position))
}

fn position(lsn: Lsn) -> u8 {
    debug_assert_eq!(lsn.0 % 2, 0, "{lsn:?} is not a position");
    u8::try_from(lsn.0 / 2).expect("a small WAL")
}

/// A replication session: what the walsender hands over next, and what the session confirms.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Session {
    /// The next transaction the walsender hands over.
    pub next_txn: u8,
    /// Every transaction committing before it was handed over to a read.
    pub handed_over: u8,
    /// What its status updates confirm (`acknowledge`, or the ack it started with).
    pub confirms: u8,
}

/// What a read returned: rows by outbox position, the position once they are published, and
/// whether it stopped at its limit.
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
    /// Started: the session it took out of the source, and what it made of the hand-over.
    pub reading: Option<(Session, HandOver)>,
    /// A prefetch's result, until the loop takes it.
    pub done: Option<Batch>,
}

impl Read {
    fn after(after: u8) -> Self {
        Self {
            after,
            reading: None,
            done: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Phase {
    Reading(Read),
    /// Caught up: waits for a notification.
    Waiting,
    /// The batch's Kafka transaction is open; the next batch's read runs beside it.
    Publishing {
        batch: Batch,
        next: Option<Read>,
    },
}

/// The relay process: what a SIGKILL loses.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Relay {
    /// Where the next read starts.
    pub position: u8,
    /// The highest position Kafka committed that the relay knows of (`LogicalSource::committed`).
    pub committed: u8,
    /// The session between reads (`LogicalSource::stream`).
    pub session: Option<Session>,
    pub phase: Phase,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SessionState {
    pub written: u8,
    pub rows_written: u8,
    pub published: Vec<u8>,
    pub kafka_at: u8,
    pub slot: u8,
    pub relay: Relay,
    pub crashes_left: u8,
    pub failures_left: u8,
    /// Ghost: a read went on with the session the last read left.
    pub session_went_on: bool,
    /// Ghost: a read started a new session after one was cut off or left at another position.
    pub session_restarted: bool,
    /// Ghost: a crash came while Kafka was ahead of the slot.
    pub crashed_ahead_of_slot: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// The writer commits its next transaction.
    Write,
    /// A read takes the WAL's end, then the open session or a new one (`next`: the read of the
    /// next batch, beside the Kafka transaction).
    StartRead {
        next: bool,
    },
    /// The walsender hands the read its next transaction.
    HandOverTxn {
        next: bool,
    },
    /// Nothing more is written: the walsender's keepalive with its position.
    KeepAlive {
        next: bool,
    },
    /// Nothing more came within the read's wait: it ends with what it has.
    WaitEnds {
        next: bool,
    },
    Wake,
    Commit,
    Abort,
    OutcomeUnknown {
        landed: bool,
    },
    /// A session's standby status update reaches the server.
    Confirm,
    Crash,
}

impl SessionModel {
    fn take_read(state: &SessionState, next: bool) -> Option<Read> {
        match (&state.relay.phase, next) {
            (Phase::Reading(read), false) => Some(read.clone()),
            (
                Phase::Publishing {
                    next: Some(read), ..
                },
                true,
            ) => Some(read.clone()),
            _ => None,
        }
    }

    fn put_read(state: &mut SessionState, next: bool, read: Read) {
        match (&mut state.relay.phase, next) {
            (Phase::Reading(slot), false) => *slot = read,
            (
                Phase::Publishing {
                    next: Some(slot), ..
                },
                true,
            ) => *slot = read,
            _ => unreachable!("take_read found the read there"),
        }
    }

    /// The read ends: the session goes back with what it handed over, acknowledging what Kafka
    /// committed, and the batch is the loop's (at once, or when it awaits the prefetch).
    fn finish(&self, state: &mut SessionState, next: bool, mut read: Read, more: bool) {
        let Some((mut session, hand_over)) = read.reading.take() else {
            return;
        };
        session.handed_over = position(hand_over.handed_over());
        session.confirms = match self.bug {
            Some(SessionBug::ConfirmsWhatItHandedOver) => session.handed_over,
            _ => session.confirms.max(state.relay.committed),
        };
        state.relay.session = Some(session);
        let done = hand_over.finish(more);
        let batch = Batch {
            rows: done
                .txns
                .iter()
                .flat_map(|txn| txn.positions.iter())
                .map(|&p| u8::try_from(p).expect("small positions"))
                .collect(),
            next: position(done.next),
            more: done.more,
        };
        if next {
            read.done = Some(batch);
            Self::put_read(state, next, read);
        } else {
            Self::take(&mut state.relay, batch);
        }
    }

    /// `publish_until` takes a batch: nothing to publish moves the position; rows are
    /// published, and a full read starts the next batch's read before the commit.
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

    fn after_batch(relay: &mut Relay, next: Option<Read>) {
        match next {
            Some(Read {
                done: Some(batch), ..
            }) => Self::take(relay, batch),
            Some(read) => relay.phase = Phase::Reading(read),
            None => relay.phase = Phase::Reading(Read::after(relay.position)),
        }
    }

    /// `LogicalSource::advance` after Kafka committed `to`: the open session acknowledges it; a
    /// read holding the session passes it on when it ends; with none open, the slot is advanced.
    fn advance(state: &mut SessionState, to: u8, read_holds_session: bool) {
        state.relay.committed = state.relay.committed.max(to);
        match (&mut state.relay.session, read_holds_session) {
            (Some(session), _) => session.confirms = session.confirms.max(to),
            (None, true) => {}
            (None, false) => state.slot = state.slot.max(to),
        }
    }

    fn prefetch_holds_session(next: Option<&Read>) -> bool {
        next.is_some_and(|read| read.reading.is_some())
    }

    fn read_actions(read: &Read, next: bool, written: u8, actions: &mut Vec<Action>) {
        match &read.reading {
            _ if read.done.is_some() => {}
            None => actions.push(Action::StartRead { next }),
            Some((session, hand_over)) => {
                if session.next_txn < written {
                    actions.push(Action::HandOverTxn { next });
                } else {
                    if position(hand_over.handed_over()) < written {
                        actions.push(Action::KeepAlive { next });
                    }
                    actions.push(Action::WaitEnds { next });
                }
            }
        }
    }
}

impl Model for SessionModel {
    type State = SessionState;
    type Action = Action;

    fn init_states(&self) -> Vec<Self::State> {
        vec![SessionState {
            written: 0,
            rows_written: 0,
            published: Vec::new(),
            kafka_at: 0,
            slot: 0,
            relay: Relay {
                position: 0,
                committed: 0,
                session: None,
                phase: Phase::Reading(Read::after(0)),
            },
            crashes_left: self.crashes,
            failures_left: self.failures,
            session_went_on: false,
            session_restarted: false,
            crashed_ahead_of_slot: false,
        }]
    }

    fn actions(&self, state: &Self::State, actions: &mut Vec<Self::Action>) {
        if state.written < self.transactions() {
            actions.push(Action::Write);
        }
        if state.crashes_left > 0 {
            actions.push(Action::Crash);
        }
        let confirms = state
            .relay
            .session
            .iter()
            .chain(match &state.relay.phase {
                Phase::Reading(read)
                | Phase::Publishing {
                    next: Some(read), ..
                } => read.reading.as_ref().map(|(session, _)| session),
                _ => None,
            })
            .any(|session| session.confirms > state.slot);
        if confirms {
            actions.push(Action::Confirm);
        }
        match &state.relay.phase {
            Phase::Reading(read) => Self::read_actions(read, false, state.written, actions),
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
                    Self::read_actions(read, true, state.written, actions);
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
            Action::StartRead { next } => {
                let mut read = Self::take_read(&state, next)?;
                let upto = state.written.max(read.after);
                let open = state.relay.session.take();
                let session = match open {
                    Some(session)
                        if self.bug == Some(SessionBug::AlwaysGoesOn)
                            || session_goes_on(Some(lsn(session.handed_over)), lsn(read.after)) =>
                    {
                        state.session_went_on = true;
                        session
                    }
                    other => {
                        if other.is_some() || state.relay.committed > 0 {
                            state.session_restarted = true;
                        }
                        // A new session at the read's position, confirming what Kafka holds.
                        let confirms = match state.relay.committed {
                            0 => state.slot,
                            committed => committed,
                        };
                        Session {
                            next_txn: read.after,
                            handed_over: read.after,
                            confirms: confirms.min(read.after),
                        }
                    }
                };
                let hand_over = HandOver::new(
                    lsn(session.handed_over),
                    lsn(read.after),
                    lsn(upto),
                    usize::from(self.batch_size),
                );
                read.reading = Some((session, hand_over));
                Self::put_read(&mut state, next, read);
            }
            Action::HandOverTxn { next } => {
                let mut read = Self::take_read(&state, next)?;
                let (session, hand_over) = read.reading.as_mut()?;
                hand_over.committed(self.decoded(session.next_txn));
                session.next_txn += 1;
                match hand_over.ends(Duration::ZERO) {
                    Some(more) => self.finish(&mut state, next, read, more),
                    None => Self::put_read(&mut state, next, read),
                }
            }
            Action::KeepAlive { next } => {
                let mut read = Self::take_read(&state, next)?;
                let (_, hand_over) = read.reading.as_mut()?;
                hand_over.walsender_at(lsn(state.written));
                Self::put_read(&mut state, next, read);
            }
            Action::WaitEnds { next } => {
                let read = Self::take_read(&state, next)?;
                self.finish(&mut state, next, read, false);
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
                Self::advance(
                    &mut state,
                    batch.next,
                    Self::prefetch_holds_session(next.as_ref()),
                );
                Self::after_batch(&mut state.relay, next);
            }
            Action::Abort => {
                state.failures_left -= 1;
                // The next batch's read is dropped: a read in progress takes its session along.
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
                // `recover`: the position read back from Kafka, and acknowledged.
                state.relay.position = state.kafka_at;
                let next = next.filter(|_| state.relay.position == batch.next);
                let kafka_at = state.kafka_at;
                Self::advance(
                    &mut state,
                    kafka_at,
                    Self::prefetch_holds_session(next.as_ref()),
                );
                Self::after_batch(&mut state.relay, next);
            }
            Action::Confirm => {
                let held = match &state.relay.phase {
                    Phase::Reading(read)
                    | Phase::Publishing {
                        next: Some(read), ..
                    } => read.reading.as_ref().map(|(session, _)| session.confirms),
                    _ => None,
                };
                let confirms = state
                    .relay
                    .session
                    .as_ref()
                    .map(|session| session.confirms)
                    .into_iter()
                    .chain(held)
                    .max()?;
                state.slot = state.slot.max(confirms);
            }
            Action::Crash => {
                state.crashes_left -= 1;
                if state.kafka_at > state.slot {
                    state.crashed_ahead_of_slot = true;
                }
                // `recover_logical` (no session open yet): the slot advanced to Kafka's position.
                state.slot = state.slot.max(state.kafka_at);
                state.relay = Relay {
                    position: state.kafka_at,
                    committed: state.kafka_at,
                    session: None,
                    phase: Phase::Reading(Read::after(state.kafka_at)),
                };
            }
        }
        Some(state)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(NEVER_PUBLISHED_TWICE, |_, s: &SessionState| {
                let mut seen = s.published.clone();
                seen.sort_unstable();
                seen.dedup();
                seen.len() == s.published.len()
            }),
            Property::always(IN_COMMIT_ORDER_WITHOUT_GAP, |model, s: &SessionState| {
                model.rows_before(s.written).starts_with(&s.published)
            }),
            Property::always(KAFKA_POSITION_MATCHES_RECORDS, |model, s: &SessionState| {
                s.published == model.rows_before(s.kafka_at)
            }),
            Property::always(SLOT_NOT_PAST_KAFKA, |_, s: &SessionState| {
                s.slot <= s.kafka_at
            }),
            Property::sometimes(
                REACHES_ALL_AFTER_SESSION_WENT_ON,
                |model, s: &SessionState| s.session_went_on && all_published(model, s),
            ),
            Property::sometimes(
                REACHES_ALL_AFTER_SESSION_RESTARTED,
                |model, s: &SessionState| s.session_restarted && all_published(model, s),
            ),
            Property::sometimes(
                REACHES_ALL_AFTER_CRASH_AHEAD_OF_SLOT,
                |model, s: &SessionState| s.crashed_ahead_of_slot && all_published(model, s),
            ),
        ]
    }
}

fn all_published(model: &SessionModel, state: &SessionState) -> bool {
    state.written == model.transactions() && state.published == model.rows_before(state.written)
}

/// The liveness goal: every committed row is in Kafka, in order, once.
pub fn every_committed_row_published(state: &SessionState) -> bool {
    state.published.len() == usize::from(state.rows_written)
        && state.published.iter().copied().eq(1..=state.rows_written)
}

/// The faults are bounded, so every reachable state is in the fair suffix.
pub fn in_fair_suffix(_: &SessionState) -> bool {
    true
}

pub const REACHES_ALL_AFTER_SESSION_WENT_ON: &str =
    "reachable: a read went on with the session the last one left, and every row was published";
pub const REACHES_ALL_AFTER_SESSION_RESTARTED: &str =
    "reachable: a read started a new session mid run, and every row was published";
pub const REACHES_ALL_AFTER_CRASH_AHEAD_OF_SLOT: &str =
    "reachable: a crash while Kafka was ahead of the slot, and every row was published";

/// The safety properties (those of the peek model, the same product promises).
pub const SAFETY_PROPERTIES: [&str; 4] = [
    NEVER_PUBLISHED_TWICE,
    IN_COMMIT_ORDER_WITHOUT_GAP,
    KAFKA_POSITION_MATCHES_RECORDS,
    SLOT_NOT_PAST_KAFKA,
];

/// States the model must reach, or it proves nothing.
pub const REACHABILITY_PROPERTIES: [&str; 3] = [
    REACHES_ALL_AFTER_SESSION_WENT_ON,
    REACHES_ALL_AFTER_SESSION_RESTARTED,
    REACHES_ALL_AFTER_CRASH_AHEAD_OF_SLOT,
];
