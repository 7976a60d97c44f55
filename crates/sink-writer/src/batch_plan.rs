//! The decisions of a batch, without I/O, defined so that **batch boundaries change nothing**:
//! every record gets the outcome it would get if records were applied one at a time in
//! consumption order. A crash re-batches a replay differently; the rows, the conflicts and the
//! counts must not depend on that.
//!
//! Two steps. [`select_winners`]: which row of each key is sent — for an append target the first
//! (what a one-at-a-time replay inserts), for a versioned target the highest version, the earliest
//! of equal ones (what one-at-a-time upserts end with). Then, once the database has said what was
//! stored *before* the write, [`classify`] replays the batch in order against that stored row.

use std::collections::HashMap;

use crate::mapping::{MappedRow, RowShape};
use crate::targets::TargetKind;

/// A mapped row and the index of the batch record it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub record: usize,
    pub row: MappedRow,
}

/// What became of one record in one target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Inserted, or (versioned) applied over a lower version — possibly replaced by a higher
    /// version later in the same batch, exactly as one-at-a-time upserts would have done.
    Written,
    /// The same content is already there (stored or earlier in the batch): a repeated delivery.
    Duplicate,
    /// Same key (and, versioned, same version), other content. `earlier` is the batch record it
    /// contradicts, `None` when it contradicts the stored row.
    Conflict { earlier: Option<usize> },
    /// A version lower than the one current when it arrived.
    Stale,
}

/// The row stored under a candidate's key before this batch's write, as the database compared it
/// with that candidate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    /// Versioned targets: the stored version (`None` if NULL).
    pub version: Option<i64>,
    /// Whether the stored row's content differs from this candidate's.
    pub differs: bool,
}

/// The versioned upsert's guard: whether a row of `incoming_version` replaces the stored one
/// (`None`: its version is NULL). The single statement of the rule; the upsert of
/// `schema::statements` repeats it in SQL (`WHERE t.version IS NULL OR t.version <
/// EXCLUDED.version`), and `integration-tests`' `sink_rules` checks the two agree. An incoming row
/// always has a version: a versioned target skips events without one.
pub fn upsert_applies(stored_version: Option<i64>, incoming_version: i64) -> bool {
    stored_version.is_none_or(|stored| stored < incoming_version)
}

/// The idempotent insert's rule, keyed by the target's unique column: a row is inserted when
/// nothing is stored under its key (`ON CONFLICT DO NOTHING` inserts), a duplicate when the same
/// content is stored, and a conflict when other content is (kept in `sink_conflicts`, never
/// hidden, never overwriting). `stored_differs`: `None` when nothing is stored under the key.
/// Versioned rows follow it too when their version equals the stored one.
pub fn idempotent_outcome(stored_differs: Option<bool>) -> Outcome {
    match stored_differs {
        None => Outcome::Written,
        Some(false) => Outcome::Duplicate,
        Some(true) => Outcome::Conflict { earlier: None },
    }
}

/// Per candidate: whether it is the one row of its key sent to the database.
pub fn select_winners(kind: TargetKind, candidates: &[Candidate]) -> Vec<bool> {
    let mut winner_of: HashMap<&str, usize> = HashMap::new();
    for (i, candidate) in candidates.iter().enumerate() {
        let key = candidate.row.key.as_str();
        match winner_of.get(key) {
            None => {
                winner_of.insert(key, i);
            }
            Some(&w) => {
                if kind == TargetKind::Versioned
                    && candidate
                        .row
                        .version
                        .is_some_and(|v| upsert_applies(candidates[w].row.version, v))
                {
                    winner_of.insert(key, i);
                }
            }
        }
    }
    let mut send = vec![false; candidates.len()];
    for i in winner_of.into_values() {
        send[i] = true;
    }
    send
}

/// What is current for a key while the batch is replayed.
enum Current {
    Nothing,
    /// The row stored before the batch.
    Stored(Option<i64>),
    /// A candidate of this batch (index into `candidates`).
    Batch(usize),
}

/// Replays the batch one record at a time against the rows stored before it. `stored` is keyed by
/// candidate index; a candidate without an entry has no stored row under its key.
pub fn classify(
    kind: TargetKind,
    shape: &RowShape,
    candidates: &[Candidate],
    stored: &HashMap<usize, Stored>,
) -> Vec<Outcome> {
    let mut current: HashMap<&str, Current> = HashMap::new();
    let mut outcomes = Vec::with_capacity(candidates.len());
    for (i, candidate) in candidates.iter().enumerate() {
        let key = candidate.row.key.as_str();
        let now = current.entry(key).or_insert_with(|| match stored.get(&i) {
            Some(row) => Current::Stored(row.version),
            None => Current::Nothing,
        });
        let outcome = match (&*now, kind) {
            (Current::Nothing, _) => idempotent_outcome(None),
            (Current::Stored(_), TargetKind::Append) => {
                idempotent_outcome(Some(stored.get(&i).is_some_and(|row| row.differs)))
            }
            (Current::Stored(version), TargetKind::Versioned) => {
                let differs = stored.get(&i).is_none_or(|row| row.differs);
                if candidate
                    .row
                    .version
                    .is_some_and(|incoming| upsert_applies(*version, incoming))
                {
                    Outcome::Written
                } else if candidate.row.version == *version {
                    // Not newer and not older: the same version again.
                    idempotent_outcome(Some(differs))
                } else {
                    Outcome::Stale
                }
            }
            (Current::Batch(w), _) => {
                let earlier = &candidates[*w];
                let same_content = earlier.row.content(shape) == candidate.row.content(shape);
                let order = match kind {
                    TargetKind::Append => std::cmp::Ordering::Equal,
                    TargetKind::Versioned => candidate.row.version.cmp(&earlier.row.version),
                };
                match order {
                    std::cmp::Ordering::Greater => Outcome::Written,
                    std::cmp::Ordering::Less => Outcome::Stale,
                    std::cmp::Ordering::Equal if same_content => Outcome::Duplicate,
                    std::cmp::Ordering::Equal => Outcome::Conflict {
                        earlier: Some(earlier.record),
                    },
                }
            }
        };
        if outcome == Outcome::Written {
            *now = Current::Batch(i);
        }
        outcomes.push(outcome);
    }
    outcomes
}

/// An append row the insert did not apply although nothing was stored when the batch read it:
/// another writer inserted the key in between. Classified against what is stored now.
pub fn classify_late_append(content_differs: bool) -> Outcome {
    idempotent_outcome(Some(content_differs))
}

/// A versioned row the upsert did not apply although it was higher than what the batch read:
/// another writer stored a version at least as high in between.
pub fn classify_late_versioned(same_version: bool, content_differs: bool) -> Outcome {
    match (same_version, content_differs) {
        (false, _) => Outcome::Stale,
        (true, false) => Outcome::Duplicate,
        (true, true) => Outcome::Conflict { earlier: None },
    }
}

#[cfg(test)]
mod tests {
    use rand::seq::SliceRandom as _;
    use rand::{Rng as _, SeedableRng as _};

    use super::*;
    use crate::column_type::ColumnType;
    use crate::mapping::BoundColumn;
    use crate::targets::Source;

    fn shape(kind: TargetKind) -> RowShape {
        let ty = |name: &str| ColumnType::from_catalog(name, name, -1).expect("supported");
        RowShape {
            table: "t".into(),
            columns: vec![
                BoundColumn {
                    name: "k".into(),
                    source: Source::EntityId,
                    ty: ty("text"),
                    required: true,
                },
                BoundColumn {
                    name: "version".into(),
                    source: Source::Version,
                    ty: ty("int8"),
                    required: true,
                },
                BoundColumn {
                    name: "payload".into(),
                    source: Source::Payload,
                    ty: ty("jsonb"),
                    required: false,
                },
            ],
            key_index: 0,
            version_index: (kind == TargetKind::Versioned).then_some(1),
            content_indices: vec![1, 2],
        }
    }

    fn candidate(record: usize, key: &str, version: i64, payload: &str) -> Candidate {
        Candidate {
            record,
            row: MappedRow {
                key: key.into(),
                values: vec![
                    Some(key.into()),
                    Some(version.to_string()),
                    Some(format!("\"{payload}\"")),
                ],
                version: Some(version),
            },
        }
    }

    /// A tiny in-memory table with the database's comparison, to check `classify` against a
    /// one-at-a-time replay.
    #[derive(Debug, Clone, Default)]
    struct Table(HashMap<String, Candidate>);

    impl Table {
        fn stored_for(&self, shape: &RowShape, candidates: &[Candidate]) -> HashMap<usize, Stored> {
            candidates
                .iter()
                .enumerate()
                .filter_map(|(i, c)| {
                    self.0.get(&c.row.key).map(|row| {
                        (
                            i,
                            Stored {
                                version: row.row.version,
                                differs: row.row.content(shape) != c.row.content(shape),
                            },
                        )
                    })
                })
                .collect()
        }

        /// Applies a batch the way the database does: the winners, guarded by the version.
        fn apply(&mut self, kind: TargetKind, candidates: &[Candidate], send: &[bool]) {
            for (candidate, send) in candidates.iter().zip(send) {
                if !send {
                    continue;
                }
                match self.0.get(&candidate.row.key) {
                    None => {
                        self.0.insert(candidate.row.key.clone(), candidate.clone());
                    }
                    Some(stored)
                        if kind == TargetKind::Versioned
                            && stored.row.version < candidate.row.version =>
                    {
                        self.0.insert(candidate.row.key.clone(), candidate.clone());
                    }
                    Some(_) => {}
                }
            }
        }

        fn run_batch(&mut self, kind: TargetKind, candidates: &[Candidate]) -> Vec<Outcome> {
            let shape = shape(kind);
            let stored = self.stored_for(&shape, candidates);
            let outcomes = classify(kind, &shape, candidates, &stored);
            self.apply(kind, candidates, &select_winners(kind, candidates));
            outcomes
        }
    }

    fn normalise(outcomes: Vec<Outcome>) -> Vec<Outcome> {
        // Which earlier record a conflict names depends on the batch; that it is one does not.
        outcomes
            .into_iter()
            .map(|o| match o {
                Outcome::Conflict { .. } => Outcome::Conflict { earlier: None },
                other => other,
            })
            .collect()
    }

    #[test]
    fn the_seed_versions_in_any_arrival_order() {
        let kind = TargetKind::Versioned;
        let incoming = vec![
            candidate(0, "17", 1, "a"),
            candidate(1, "17", 2, "b"),
            candidate(2, "28", 2, "y"),
            candidate(3, "39", 1, "m"),
            candidate(4, "39", 2, "n"),
        ];
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for _ in 0..20 {
            let mut order = incoming.clone();
            order.shuffle(&mut rng);
            let mut table = Table::default();
            table.0.insert("17".into(), candidate(90, "17", 3, "c"));
            table.0.insert("28".into(), candidate(91, "28", 1, "x"));
            table.run_batch(kind, &order);
            let state: Vec<(i64, String)> = ["17", "28", "39"]
                .iter()
                .map(|k| {
                    let row = &table.0[*k].row;
                    (
                        row.version.unwrap_or(-1),
                        row.values[2].clone().unwrap_or_default(),
                    )
                })
                .collect();
            assert_eq!(
                state,
                vec![
                    (3, "\"c\"".to_owned()),
                    (2, "\"y\"".to_owned()),
                    (2, "\"n\"".to_owned())
                ]
            );
        }
    }

    #[test]
    fn append_against_the_stored_row_and_within_the_batch() {
        let kind = TargetKind::Append;
        let mut table = Table::default();
        table
            .0
            .insert("e-102".into(), candidate(90, "e-102", 1, "12500"));
        let outcomes = table.run_batch(
            kind,
            &[
                candidate(0, "e-102", 1, "99999"),
                candidate(1, "e-102", 1, "12500"),
                candidate(2, "e-103", 1, "7000"),
                candidate(3, "e-103", 1, "7000"),
                candidate(4, "e-103", 1, "1"),
            ],
        );
        assert_eq!(
            outcomes,
            vec![
                Outcome::Conflict { earlier: None },
                Outcome::Duplicate,
                Outcome::Written,
                Outcome::Duplicate,
                Outcome::Conflict { earlier: Some(2) },
            ]
        );
        assert_eq!(table.0["e-102"].row.values[2].as_deref(), Some("\"12500\""));
    }

    #[test]
    fn an_equal_version_is_a_conflict_even_when_a_higher_one_follows_in_the_batch() {
        let kind = TargetKind::Versioned;
        let mut table = Table::default();
        table.0.insert("k".into(), candidate(90, "k", 3, "stored"));
        let outcomes = table.run_batch(
            kind,
            &[
                candidate(0, "k", 2, "old"),
                candidate(1, "k", 3, "other"),
                candidate(2, "k", 3, "stored"),
                candidate(3, "k", 4, "new"),
                candidate(4, "k", 4, "new"),
                candidate(5, "k", 4, "clash"),
                candidate(6, "k", 5, "newest"),
            ],
        );
        assert_eq!(
            outcomes,
            vec![
                Outcome::Stale,
                Outcome::Conflict { earlier: None },
                Outcome::Duplicate,
                Outcome::Written,
                Outcome::Duplicate,
                Outcome::Conflict { earlier: Some(3) },
                Outcome::Written,
            ]
        );
        assert_eq!(table.0["k"].row.version, Some(5));
    }

    #[test]
    fn winners_are_the_first_or_the_highest_version() {
        let candidates = [
            candidate(0, "a", 2, "x"),
            candidate(1, "a", 3, "y"),
            candidate(2, "a", 3, "z"),
            candidate(3, "b", 1, "x"),
        ];
        assert_eq!(
            select_winners(TargetKind::Versioned, &candidates),
            vec![false, true, false, true]
        );
        assert_eq!(
            select_winners(TargetKind::Append, &candidates),
            vec![true, false, false, true]
        );
    }

    /// The property the module promises: cutting a stream into batches anywhere gives the same
    /// outcomes and the same final table as applying it one record at a time.
    #[test]
    fn batch_boundaries_change_nothing() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(42);
        for kind in [TargetKind::Append, TargetKind::Versioned] {
            for _ in 0..300 {
                let stream: Vec<Candidate> = (0..rng.random_range(1..40))
                    .map(|i| {
                        let key = format!("k{}", rng.random_range(0..4));
                        let version = rng.random_range(1..5);
                        let payload = format!("p{}", rng.random_range(0..2));
                        candidate(i, &key, version, &payload)
                    })
                    .collect();
                let mut one_by_one = Table::default();
                let mut expected = Vec::new();
                for c in &stream {
                    expected.extend(one_by_one.run_batch(kind, std::slice::from_ref(c)));
                }
                let mut batched = Table::default();
                let mut actual = Vec::new();
                let mut rest = stream.as_slice();
                while !rest.is_empty() {
                    let (batch, tail) = rest.split_at(rng.random_range(1..=rest.len()));
                    actual.extend(batched.run_batch(kind, batch));
                    rest = tail;
                }
                assert_eq!(
                    normalise(actual),
                    normalise(expected),
                    "{kind:?} {stream:?}"
                );
                let final_rows = |t: &Table| {
                    let mut rows: Vec<_> = t.0.values().map(|c| c.row.clone()).collect();
                    rows.sort_by(|a, b| a.key.cmp(&b.key));
                    rows
                };
                assert_eq!(final_rows(&batched), final_rows(&one_by_one));
            }
        }
    }
}
