//! The sink-writer's fenced checkpoints (`--offsets postgres`) as a [`stateright::Model`]: sink
//! owners over one partition of a short input log, a rebalance that reassigns the partition at
//! any point, owners that crash before or after their database commit, a zombie whose batch
//! (read before it lost the partition) arrives late, PostgreSQL restarts, and Kafka re-delivering
//! from any older position.
//!
//! Every step that sink-writer decides is decided by its own code:
//! - a fence leaves [`checkpoint_rule::fenced_epoch`] on the row;
//! - a batch's checkpoint moves only if [`checkpoint_rule::may_advance`]; the batch commits only
//!   if [`checkpoint_rule::fenced_partitions`] is empty, and its checkpoint is
//!   [`decision::next_offsets`] of its records;
//! - a record goes into the batch only if [`checkpoint_rule::accepts_record`];
//! - each target's rows: [`batch_plan::select_winners`] picks the row sent per key,
//!   [`batch_plan::classify`] gives every record its outcome (written, duplicate, stale,
//!   conflict) against what is stored, and the database applies a sent row by
//!   [`batch_plan::idempotent_outcome`] (append: insert only where nothing is stored) and
//!   [`batch_plan::upsert_applies`] (versioned: only over a lower version).
//!
//! What is the model's own: the environment (who runs when, the consumer group's assignment,
//! Kafka's fetch position, crashes, PostgreSQL restarts) and the bookkeeping around the rules
//! (the tables as maps, which offsets each commit wrote).
//!
//! Database-transaction assumption: a batch's transaction — its checkpoint move under the epoch
//! check, its rows and its conflict rows — is one atomic step, committed whole or not at all
//! (PostgreSQL's atomicity); so is a fence (its own transaction). A fence that waits on the row
//! lock of a batch in flight (`checkpoint_store.rs`) is the interleaving "the batch commits, then
//! the fence". The SQL's agreement with the rules is checked separately, against the real
//! PostgreSQL (`integration-tests`' `sink_rules`).

use std::collections::HashMap;
use std::sync::LazyLock;

use sink_writer::batch_plan::{self, Candidate, Outcome, Stored};
use sink_writer::checkpoint_rule;
use sink_writer::column_type::ColumnType;
use sink_writer::decision;
use sink_writer::mapping::{BoundColumn, InputRecord, MappedRow, RowShape};
use sink_writer::targets::{Source, TargetKind};
use stateright::{Model, Property};

/// One record of the input partition: an event with an id, its content, and the version it
/// gives the one entity (key `k`) of the versioned target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Record {
    pub event: u8,
    pub content: char,
    pub version: u8,
}

/// The input partition. Offset 2 is the producer's retry of offset 0 (same event, same
/// content: a duplicate, and an older version than what offset 1 stored: stale). Offset 3 is a
/// broken producer: event 2 again with other content, and version 2 again with other content —
/// a conflict in both targets.
pub const LOG: [Record; 4] = [
    Record {
        event: 1,
        content: 'a',
        version: 1,
    },
    Record {
        event: 2,
        content: 'b',
        version: 2,
    },
    Record {
        event: 1,
        content: 'a',
        version: 1,
    },
    Record {
        event: 2,
        content: 'c',
        version: 2,
    },
];
const LOG_LEN: u8 = LOG.len() as u8;
const TOPIC: &str = "input";
const PARTITION: i32 = 0;

/// A deliberately broken variant of one step, to show the checker finds what it must find.
/// The product code is never changed; the model takes the wrong step instead of calling it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Bug {
    /// The checkpoint update ignores the owner epoch: a fenced owner's batch commits.
    CheckpointWithoutEpochCheck,
    /// A new owner reads the checkpoint before it fences.
    ReadCheckpointBeforeFence,
    /// The versioned upsert applies an equal version too (`>=`).
    UpsertGreaterOrEqual,
    /// The versioned upsert has no version check.
    UpsertWithoutVersionCheck,
    /// The checkpoint moves in its own transaction (under the epoch check), committed before
    /// the rows' transaction.
    CheckpointInSeparateTransaction,
    /// The append insert overwrites the stored row on a conflict (`DO UPDATE` instead of
    /// `DO NOTHING`), recording nothing.
    InsertOverwritesConflict,
}

/// The bounds of one exhaustive run.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SinkModel {
    /// Sink instances that may own the partition.
    pub owners: u8,
    /// Reassignments of the partition by the consumer group (after the first assignment).
    pub rebalances: u8,
    /// Owner crashes (the process dies; it may rejoin and be assigned again).
    pub crashes: u8,
    /// PostgreSQL restarts that lose an open batch transaction.
    pub pg_restarts: u8,
    /// Times Kafka hands an owner records again from an older position.
    pub rewinds: u8,
    /// `None`: the real protocol.
    pub bug: Option<Bug>,
}

impl SinkModel {
    /// The bounds `cargo test` checks exhaustively (see docs/MODEL_CHECKING.md).
    pub fn standard() -> Self {
        Self {
            owners: 2,
            rebalances: 2,
            crashes: 1,
            pg_restarts: 1,
            rewinds: 1,
            bug: None,
        }
    }

    pub fn with_bug(self, bug: Bug) -> Self {
        Self {
            bug: Some(bug),
            ..self
        }
    }
}

/// The two targets of the default configuration, reduced to what the rules read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Target {
    /// `event_sink`: append, keyed by event id.
    Events,
    /// `entity_state`: versioned, keyed by entity id.
    Entity,
}

/// What PostgreSQL has committed.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Database {
    /// `sink_checkpoints.owner_epoch`; `None` before the first fence created the row.
    pub owner_epoch: Option<u8>,
    /// `sink_checkpoints.next_offset`; `None`: nothing committed yet.
    pub next_offset: Option<u8>,
    /// `event_sink`: (event id, content), sorted by event id.
    pub events: Vec<(u8, char)>,
    /// `entity_state` of the one entity: (version, content).
    pub entity: Option<(u8, char)>,
    /// `sink_conflicts`: (target, source offset), sorted.
    pub conflicts: Vec<(Target, u8)>,
    /// Ghost: how many committed batch transactions wrote the rows of each offset.
    pub written_by: [u8; LOG.len()],
}

/// Where one sink instance is with the partition.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Owner {
    /// Not working on the partition: never assigned, revoked, restarted after a crash.
    Idle,
    /// Assigned by the group: fences next.
    Assigned,
    /// Bug `ReadCheckpointBeforeFence`: has read the checkpoint; fences next.
    ReadFirst { checkpoint: Option<u8> },
    /// Fenced: reads the checkpoint next.
    Fenced { epoch: u8 },
    /// Positioned (sought to the checkpoint): Kafka hands out the record at `fetch`; `next` is
    /// the loop's next expected offset; `batch` the offsets read and not yet committed;
    /// `committed`: a batch of this owner committed since it was positioned.
    Reading {
        epoch: u8,
        fetch: u8,
        next: Option<u8>,
        batch: Vec<u8>,
        committed: bool,
    },
    /// Bug `CheckpointInSeparateTransaction`: the checkpoint committed; the rows are next.
    RowsPending {
        epoch: u8,
        fetch: u8,
        next: Option<u8>,
        batch: Vec<u8>,
    },
    /// Its batch was refused by the epoch fence: it stopped the partition.
    Stopped,
}

#[derive(Clone, PartialEq, Eq, Hash)]
pub struct SinkState {
    pub db: Database,
    pub owners: Vec<Owner>,
    /// The owner the consumer group assigns the partition to now.
    pub assigned: u8,
    pub rebalances_left: u8,
    pub crashes_left: u8,
    pub pg_restarts_left: u8,
    pub rewinds_left: u8,
    /// Ghost: a batch committed while its owner's epoch was not the row's.
    pub fenced_batch_committed: bool,
    /// Ghost: a versioned row was replaced by one that is not a higher version.
    pub versioned_went_backwards: bool,
    /// Ghost: a batch was refused by the epoch fence.
    pub zombie_refused: bool,
    /// Ghost: an owner crashed after its batch committed, before it read more.
    pub crashed_after_commit: bool,
    /// Ghost: a PostgreSQL restart lost a batch transaction.
    pub restart_lost_batch: bool,
    /// Ghost: a record handed out again was dropped as stale.
    pub redelivery_dropped: bool,
}

/// Counterexamples print one state per line: the database, the owners, the assignment, the
/// budgets left, and only the ghost flags that are set.
impl std::fmt::Debug for SinkState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let flags: Vec<&str> = [
            (self.fenced_batch_committed, "fenced_batch_committed"),
            (self.versioned_went_backwards, "versioned_went_backwards"),
            (self.zombie_refused, "zombie_refused"),
            (self.crashed_after_commit, "crashed_after_commit"),
            (self.restart_lost_batch, "restart_lost_batch"),
            (self.redelivery_dropped, "redelivery_dropped"),
        ]
        .into_iter()
        .filter_map(|(set, name)| set.then_some(name))
        .collect();
        write!(
            f,
            "{:?} owners: {:?} assigned: {} left(rebalances {}, crashes {}, pg restarts {}, \
             rewinds {}) flags: {flags:?}",
            self.db,
            self.owners,
            self.assigned,
            self.rebalances_left,
            self.crashes_left,
            self.pg_restarts_left,
            self.rewinds_left,
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// The group assigns the partition to this owner (revoking it from the previous one, which
    /// may not notice: a zombie).
    Rebalance(u8),
    /// An owner that lost the partition sees the revocation: drops its batch, stops reading.
    Revoke(u8),
    /// `checkpoint_store::fence`: bump the owner epoch.
    Fence(u8),
    /// `checkpoint_store::read`, then the seek.
    ReadCheckpoint(u8),
    /// Kafka hands out the record at the owner's fetch position.
    Deliver(u8),
    /// Kafka hands out records again from an older position.
    Rewind { owner: u8, to: u8 },
    /// The batch transaction commits (or is refused by the fence and rolls back).
    Commit(u8),
    /// Bug `CheckpointInSeparateTransaction`: the rows' own transaction.
    CommitRows(u8),
    /// The owner's process dies; its volatile state is gone.
    Crash(u8),
    /// PostgreSQL restarts while this owner's batch transaction is open: it is lost; the owner
    /// re-positions (fences again, re-reads the checkpoint).
    PgRestart(u8),
}

fn text_column(name: &str, source: Source) -> BoundColumn {
    BoundColumn {
        name: name.into(),
        source,
        ty: ColumnType::from_catalog("text", "text", -1).expect("text is supported"),
        required: true,
    }
}

/// `event_sink` as the batch code sees it: key `event_id`, content `payload`.
static EVENTS_SHAPE: LazyLock<RowShape> = LazyLock::new(|| RowShape {
    table: "event_sink".into(),
    columns: vec![
        text_column("event_id", Source::EventId),
        text_column("payload", Source::Payload),
    ],
    key_index: 0,
    version_index: None,
    content_indices: vec![1],
});

/// `entity_state`: key `entity_id`, version `version`, content `version` and `payload`.
static ENTITY_SHAPE: LazyLock<RowShape> = LazyLock::new(|| RowShape {
    table: "entity_state".into(),
    columns: vec![
        text_column("entity_id", Source::EntityId),
        BoundColumn {
            name: "version".into(),
            source: Source::Version,
            ty: ColumnType::from_catalog("int8", "int8", -1).expect("int8 is supported"),
            required: true,
        },
        text_column("payload", Source::Payload),
    ],
    key_index: 0,
    version_index: Some(1),
    content_indices: vec![1, 2],
});

/// The content `event_sink` stores under `event`, if any.
fn stored_content(events: &[(u8, char)], event: u8) -> Option<char> {
    events
        .iter()
        .find(|(id, _)| *id == event)
        .map(|(_, content)| *content)
}

fn event_key(event: u8) -> String {
    format!("e{event}")
}

/// The batch's records as the loop holds them (what `decision::next_offsets` reads).
fn input_records(batch: &[u8]) -> Vec<InputRecord> {
    batch
        .iter()
        .map(|&offset| InputRecord {
            topic: TOPIC.into(),
            partition: PARTITION,
            offset: i64::from(offset),
            key: None,
            payload: None,
            headers: Vec::new(),
            timestamp_ms: None,
            decoded: None,
        })
        .collect()
}

impl SinkModel {
    /// The rows of one batch, applied to the tables the way the batch transaction does.
    fn write_rows(&self, state: &mut SinkState, batch: &[u8]) {
        self.write_events(state, batch);
        self.write_entity(state, batch);
        for &offset in batch {
            let count = &mut state.db.written_by[usize::from(offset)];
            *count = count.saturating_add(1);
        }
    }

    fn write_events(&self, state: &mut SinkState, batch: &[u8]) {
        let shape = &*EVENTS_SHAPE;
        let candidates: Vec<Candidate> = batch
            .iter()
            .enumerate()
            .map(|(index, &offset)| {
                let record = LOG[usize::from(offset)];
                let key = event_key(record.event);
                Candidate {
                    record: index,
                    row: MappedRow {
                        values: vec![Some(key.clone()), Some(record.content.to_string())],
                        key,
                        version: None,
                    },
                }
            })
            .collect();
        // What the statement's `pre` reads: the stored row under each candidate's key.
        let stored: HashMap<usize, Stored> = batch
            .iter()
            .enumerate()
            .filter_map(|(index, &offset)| {
                let record = LOG[usize::from(offset)];
                stored_content(&state.db.events, record.event).map(|content| {
                    (
                        index,
                        Stored {
                            version: None,
                            differs: content != record.content,
                        },
                    )
                })
            })
            .collect();
        let outcomes = batch_plan::classify(TargetKind::Append, shape, &candidates, &stored);
        let send = batch_plan::select_winners(TargetKind::Append, &candidates);
        for (index, &offset) in batch.iter().enumerate() {
            if matches!(outcomes[index], Outcome::Conflict { .. }) {
                state.db.conflicts.push((Target::Events, offset));
            }
            if !send[index] {
                continue;
            }
            let record = LOG[usize::from(offset)];
            let stored = stored_content(&state.db.events, record.event);
            let differs = stored.map(|content| content != record.content);
            let insert = match batch_plan::idempotent_outcome(differs) {
                Outcome::Written => true,
                Outcome::Conflict { .. } => self.bug == Some(Bug::InsertOverwritesConflict),
                Outcome::Duplicate | Outcome::Stale => false,
            };
            if insert {
                state.db.events.retain(|(id, _)| *id != record.event);
                state.db.events.push((record.event, record.content));
                state.db.events.sort();
            }
        }
        state.db.conflicts.sort();
        state.db.conflicts.dedup();
    }

    fn write_entity(&self, state: &mut SinkState, batch: &[u8]) {
        let shape = &*ENTITY_SHAPE;
        let candidates: Vec<Candidate> = batch
            .iter()
            .enumerate()
            .map(|(index, &offset)| {
                let record = LOG[usize::from(offset)];
                Candidate {
                    record: index,
                    row: MappedRow {
                        key: "k".into(),
                        values: vec![
                            Some("k".into()),
                            Some(record.version.to_string()),
                            Some(record.content.to_string()),
                        ],
                        version: Some(i64::from(record.version)),
                    },
                }
            })
            .collect();
        let stored: HashMap<usize, Stored> = match state.db.entity {
            None => HashMap::new(),
            Some((version, content)) => batch
                .iter()
                .enumerate()
                .map(|(index, &offset)| {
                    let record = LOG[usize::from(offset)];
                    (
                        index,
                        Stored {
                            version: Some(i64::from(version)),
                            differs: (version, content) != (record.version, record.content),
                        },
                    )
                })
                .collect(),
        };
        let outcomes = batch_plan::classify(TargetKind::Versioned, shape, &candidates, &stored);
        let send = batch_plan::select_winners(TargetKind::Versioned, &candidates);
        for (index, &offset) in batch.iter().enumerate() {
            if matches!(outcomes[index], Outcome::Conflict { .. }) {
                state.db.conflicts.push((Target::Entity, offset));
            }
            if !send[index] {
                continue;
            }
            let record = LOG[usize::from(offset)];
            let stored_version = state.db.entity.map(|(version, _)| i64::from(version));
            let incoming = i64::from(record.version);
            let applies = match self.bug {
                Some(Bug::UpsertGreaterOrEqual) => stored_version.is_none_or(|s| s <= incoming),
                Some(Bug::UpsertWithoutVersionCheck) => true,
                _ => batch_plan::upsert_applies(stored_version, incoming),
            };
            if applies {
                let replaced = (record.version, record.content);
                if let Some(before) = state.db.entity
                    && before != replaced
                    && replaced.0 <= before.0
                {
                    state.versioned_went_backwards = true;
                }
                state.db.entity = Some(replaced);
            }
        }
        state.db.conflicts.sort();
        state.db.conflicts.dedup();
    }

    /// The checkpoint move's guard: the partitions it moved (`advance`'s `RETURNING`).
    fn advance(&self, db: &Database, held_epoch: u8) -> Vec<i32> {
        let matches = db.owner_epoch.is_some_and(|row_epoch| {
            self.bug == Some(Bug::CheckpointWithoutEpochCheck)
                || checkpoint_rule::may_advance(i64::from(row_epoch), i64::from(held_epoch))
        });
        if matches { vec![PARTITION] } else { Vec::new() }
    }

    fn checkpoint_after(batch: &[u8]) -> u8 {
        let next = decision::next_offsets(&input_records(batch));
        next.get(&PARTITION)
            .and_then(|next| u8::try_from(*next).ok())
            .expect("a batch has records of the partition")
    }

    fn fence(state: &mut SinkState) -> u8 {
        let epoch = checkpoint_rule::fenced_epoch(state.db.owner_epoch.map(i64::from));
        let epoch = u8::try_from(epoch).expect("few fences");
        state.db.owner_epoch = Some(epoch);
        epoch
    }

    fn positioned(epoch: u8, checkpoint: Option<u8>) -> Owner {
        Owner::Reading {
            epoch,
            // `Offset::Beginning` without a checkpoint.
            fetch: checkpoint.unwrap_or(0),
            next: checkpoint,
            batch: Vec::new(),
            committed: false,
        }
    }
}

impl Model for SinkModel {
    type State = SinkState;
    type Action = Action;

    fn init_states(&self) -> Vec<Self::State> {
        let mut owners = vec![Owner::Idle; usize::from(self.owners)];
        owners[0] = Owner::Assigned;
        vec![SinkState {
            db: Database {
                owner_epoch: None,
                next_offset: None,
                events: Vec::new(),
                entity: None,
                conflicts: Vec::new(),
                written_by: [0; LOG.len()],
            },
            owners,
            assigned: 0,
            rebalances_left: self.rebalances,
            crashes_left: self.crashes,
            pg_restarts_left: self.pg_restarts,
            rewinds_left: self.rewinds,
            fenced_batch_committed: false,
            versioned_went_backwards: false,
            zombie_refused: false,
            crashed_after_commit: false,
            restart_lost_batch: false,
            redelivery_dropped: false,
        }]
    }

    fn actions(&self, state: &Self::State, actions: &mut Vec<Self::Action>) {
        let read_first = self.bug == Some(Bug::ReadCheckpointBeforeFence);
        for i in 0..self.owners {
            let owner = &state.owners[usize::from(i)];
            let idle = matches!(owner, Owner::Idle | Owner::Stopped);
            if state.rebalances_left > 0 && (i != state.assigned || idle) {
                actions.push(Action::Rebalance(i));
            }
            if i != state.assigned && !idle {
                actions.push(Action::Revoke(i));
            }
            if state.crashes_left > 0 && !matches!(owner, Owner::Idle) {
                actions.push(Action::Crash(i));
            }
            match owner {
                Owner::Idle | Owner::Stopped => {}
                Owner::Assigned if read_first => actions.push(Action::ReadCheckpoint(i)),
                Owner::Assigned | Owner::ReadFirst { .. } => actions.push(Action::Fence(i)),
                Owner::Fenced { .. } => actions.push(Action::ReadCheckpoint(i)),
                Owner::Reading { fetch, batch, .. } => {
                    if *fetch < LOG_LEN {
                        actions.push(Action::Deliver(i));
                    }
                    if state.rewinds_left > 0 {
                        for to in 0..*fetch {
                            actions.push(Action::Rewind { owner: i, to });
                        }
                    }
                    if !batch.is_empty() {
                        actions.push(Action::Commit(i));
                        if state.pg_restarts_left > 0 {
                            actions.push(Action::PgRestart(i));
                        }
                    }
                }
                Owner::RowsPending { .. } => {
                    actions.push(Action::CommitRows(i));
                    if state.pg_restarts_left > 0 {
                        actions.push(Action::PgRestart(i));
                    }
                }
            }
        }
    }

    fn next_state(&self, last: &Self::State, action: Self::Action) -> Option<Self::State> {
        let mut state = last.clone();
        match action {
            Action::Rebalance(i) => {
                state.rebalances_left -= 1;
                state.assigned = i;
                state.owners[usize::from(i)] = Owner::Assigned;
            }
            Action::Revoke(i) => state.owners[usize::from(i)] = Owner::Idle,
            Action::Crash(i) => {
                state.crashes_left -= 1;
                if let Owner::Reading {
                    batch,
                    committed: true,
                    ..
                } = &state.owners[usize::from(i)]
                    && batch.is_empty()
                {
                    state.crashed_after_commit = true;
                }
                state.owners[usize::from(i)] = Owner::Idle;
            }
            Action::Fence(i) => {
                let epoch = Self::fence(&mut state);
                state.owners[usize::from(i)] = match state.owners[usize::from(i)] {
                    // The bug: positioned at what was read before the fence.
                    Owner::ReadFirst { checkpoint } => Self::positioned(epoch, checkpoint),
                    _ => Owner::Fenced { epoch },
                };
            }
            Action::ReadCheckpoint(i) => {
                let checkpoint = state.db.next_offset;
                state.owners[usize::from(i)] = match state.owners[usize::from(i)] {
                    Owner::Fenced { epoch } => Self::positioned(epoch, checkpoint),
                    _ => Owner::ReadFirst { checkpoint },
                };
            }
            Action::Deliver(i) => {
                let Owner::Reading {
                    fetch, next, batch, ..
                } = &mut state.owners[usize::from(i)]
                else {
                    return None;
                };
                let offset = *fetch;
                *fetch += 1;
                if checkpoint_rule::accepts_record(next.map(i64::from), i64::from(offset)) {
                    *next = Some(offset + 1);
                    batch.push(offset);
                } else {
                    state.redelivery_dropped = true;
                }
            }
            Action::Rewind { owner, to } => {
                state.rewinds_left -= 1;
                let Owner::Reading { fetch, .. } = &mut state.owners[usize::from(owner)] else {
                    return None;
                };
                *fetch = to;
            }
            Action::Commit(i) => {
                let Owner::Reading {
                    epoch,
                    fetch,
                    next,
                    batch,
                    ..
                } = state.owners[usize::from(i)].clone()
                else {
                    return None;
                };
                let moved = self.advance(&state.db, epoch);
                if !checkpoint_rule::fenced_partitions(&[PARTITION], &moved).is_empty() {
                    // Rolled back, rows and all; the instance stops the partition.
                    state.zombie_refused = true;
                    state.owners[usize::from(i)] = Owner::Stopped;
                    return Some(state);
                }
                state.db.next_offset = Some(Self::checkpoint_after(&batch));
                if self.bug == Some(Bug::CheckpointInSeparateTransaction) {
                    state.owners[usize::from(i)] = Owner::RowsPending {
                        epoch,
                        fetch,
                        next,
                        batch,
                    };
                    return Some(state);
                }
                if state.db.owner_epoch != Some(epoch) {
                    state.fenced_batch_committed = true;
                }
                self.write_rows(&mut state, &batch);
                state.owners[usize::from(i)] = Owner::Reading {
                    epoch,
                    fetch,
                    next,
                    batch: Vec::new(),
                    committed: true,
                };
            }
            Action::CommitRows(i) => {
                let Owner::RowsPending {
                    epoch,
                    fetch,
                    next,
                    batch,
                } = state.owners[usize::from(i)].clone()
                else {
                    return None;
                };
                if state.db.owner_epoch != Some(epoch) {
                    state.fenced_batch_committed = true;
                }
                self.write_rows(&mut state, &batch);
                state.owners[usize::from(i)] = Owner::Reading {
                    epoch,
                    fetch,
                    next,
                    batch: Vec::new(),
                    committed: true,
                };
            }
            Action::PgRestart(i) => {
                state.pg_restarts_left -= 1;
                state.restart_lost_batch = true;
                // Rolled back; the loop re-positions: fence again, re-read, seek.
                state.owners[usize::from(i)] = Owner::Assigned;
            }
        }
        Some(state)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(NEVER_WRITTEN_TWICE, |_, s: &SinkState| {
                s.db.written_by.iter().all(|&count| count <= 1)
            }),
            Property::always(CHECKPOINT_NOT_PAST_UNWRITTEN, |_, s: &SinkState| {
                let upto = s.db.next_offset.unwrap_or(0);
                (0..upto).all(|offset| {
                    let record = LOG[usize::from(offset)];
                    s.db.written_by[usize::from(offset)] >= 1
                        && s.db.events.iter().any(|(id, _)| *id == record.event)
                        && s.db.entity.is_some()
                })
            }),
            Property::always(FENCED_BATCH_NEVER_COMMITS, |_, s: &SinkState| {
                !s.fenced_batch_committed
            }),
            Property::always(VERSIONED_NEVER_BACKWARDS, |_, s: &SinkState| {
                !s.versioned_went_backwards
            }),
            Property::always(CONFLICT_NEVER_HIDDEN, |_, s: &SinkState| {
                conflicts_all_recorded(&s.db)
            }),
            Property::sometimes(REACHES_ALL_APPLIED, |_, s: &SinkState| {
                s.db.next_offset == Some(LOG_LEN)
                    && s.db.events == [(1, 'a'), (2, 'b')]
                    && s.db.entity == Some((2, 'b'))
                    && s.db.conflicts == [(Target::Events, 3), (Target::Entity, 3)]
            }),
            Property::sometimes(REACHES_ZOMBIE_REFUSED, |_, s: &SinkState| s.zombie_refused),
            Property::sometimes(REACHES_CRASH_AFTER_COMMIT_RECOVERED, |_, s: &SinkState| {
                s.crashed_after_commit && s.db.next_offset == Some(LOG_LEN)
            }),
            Property::sometimes(REACHES_RESTART_RECOVERED, |_, s: &SinkState| {
                s.restart_lost_batch && s.db.next_offset == Some(LOG_LEN)
            }),
            Property::sometimes(REACHES_REDELIVERY_DROPPED, |_, s: &SinkState| {
                s.redelivery_dropped
            }),
        ]
    }
}

/// Every committed record either is what its target stores under its key, or has its conflict
/// row: append, when another content is stored under its event id; versioned, when another
/// content is stored at its version.
fn conflicts_all_recorded(db: &Database) -> bool {
    (0..LOG_LEN)
        .filter(|&offset| db.written_by[usize::from(offset)] > 0)
        .all(|offset| {
            let record = LOG[usize::from(offset)];
            let events_ok = db
                .events
                .iter()
                .find(|(id, _)| *id == record.event)
                .is_none_or(|(_, content)| *content == record.content)
                || db.conflicts.contains(&(Target::Events, offset));
            let entity_ok = db.entity.is_none_or(|(version, content)| {
                version != record.version || content == record.content
            }) || db.conflicts.contains(&(Target::Entity, offset));
            events_ok && entity_ok
        })
}

pub const NEVER_WRITTEN_TWICE: &str =
    "no record is written by two committed batches (each applied exactly once)";
pub const CHECKPOINT_NOT_PAST_UNWRITTEN: &str = "the checkpoint never moves past unwritten rows";
pub const FENCED_BATCH_NEVER_COMMITS: &str = "a fenced owner's batch never commits";
pub const VERSIONED_NEVER_BACKWARDS: &str = "versioned state never goes backwards";
pub const CONFLICT_NEVER_HIDDEN: &str = "a conflict is recorded, never hidden";
pub const REACHES_ALL_APPLIED: &str =
    "reachable: every record applied, the checkpoint at the end, both conflicts recorded";
pub const REACHES_ZOMBIE_REFUSED: &str = "reachable: a zombie's batch refused by the epoch fence";
pub const REACHES_CRASH_AFTER_COMMIT_RECOVERED: &str =
    "reachable: an owner crashed after its commit, and the log was finished without a duplicate";
pub const REACHES_RESTART_RECOVERED: &str =
    "reachable: a PostgreSQL restart lost a batch, and the log was finished";
pub const REACHES_REDELIVERY_DROPPED: &str =
    "reachable: Kafka handed out a record again and the loop dropped it";

/// The always-properties, for tests that check each one.
pub const SAFETY_PROPERTIES: [&str; 5] = [
    NEVER_WRITTEN_TWICE,
    CHECKPOINT_NOT_PAST_UNWRITTEN,
    FENCED_BATCH_NEVER_COMMITS,
    VERSIONED_NEVER_BACKWARDS,
    CONFLICT_NEVER_HIDDEN,
];

/// The sometimes-properties: states the model must reach, or it proves nothing.
pub const REACHABILITY_PROPERTIES: [&str; 5] = [
    REACHES_ALL_APPLIED,
    REACHES_ZOMBIE_REFUSED,
    REACHES_CRASH_AFTER_COMMIT_RECOVERED,
    REACHES_RESTART_RECOVERED,
    REACHES_REDELIVERY_DROPPED,
];
