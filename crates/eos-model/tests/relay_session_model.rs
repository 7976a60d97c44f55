//! outbox-relay's logical mode reading a replication session, checked over every interleaving:
//! safe (every committed row published once, in commit order; the slot never past Kafka) and live
//! (every fair path ends with every committed row published), at the standard bounds and at other
//! batch sizes and backlogs.

use eos_model::check_exhaustively;
use eos_model::liveness::check_fair_suffix;
use eos_model::relay_session::{
    REACHABILITY_PROPERTIES, SAFETY_PROPERTIES, SessionModel, every_committed_row_published,
    in_fair_suffix,
};

fn assert_safe(model: &SessionModel, reach_all: bool) {
    let run = check_exhaustively(model.clone());
    println!(
        "session model {model:?}: {} unique states, depth {}, {:.1?}",
        run.unique_states, run.max_depth, run.elapsed
    );
    for property in SAFETY_PROPERTIES {
        if let Some(path) = run.discovery(property) {
            panic!("{property} violated:\n{}", path.join("\n"));
        }
    }
    if reach_all {
        for property in REACHABILITY_PROPERTIES {
            assert!(
                run.discovery(property).is_some(),
                "never reached, so the model proves less than it claims: {property}"
            );
        }
    }
    assert!(run.unique_states > 1000, "{} states", run.unique_states);
}

fn assert_live(model: &SessionModel) {
    let run = check_fair_suffix(model, in_fair_suffix, every_committed_row_published);
    println!(
        "session liveness {model:?}: {} unique states ({} in the fair suffix, {} path ends), \
         depth {}, {:.1?}",
        run.unique_states, run.suffix_states, run.path_ends, run.max_depth, run.elapsed
    );
    if let Some((problem, path)) = &run.counterexample {
        panic!("{problem}:\n{}", path.join("\n"));
    }
    assert!(run.path_ends > 0);
}

#[test]
fn every_interleaving_of_the_session_publishes_each_committed_row_once_in_commit_order() {
    assert_safe(&SessionModel::standard(), true);
}

#[test]
fn every_fair_path_of_the_session_publishes_every_committed_row() {
    assert_live(&SessionModel::standard());
}

/// Batches of 3 and 5 rows, and a seventh transaction (a longer backlog), with the same faults.
#[test]
fn the_session_with_other_batch_sizes_and_backlogs_is_safe_and_live() {
    for model in [
        SessionModel {
            batch_size: 3,
            ..SessionModel::standard()
        },
        SessionModel {
            batch_size: 5,
            ..SessionModel::standard()
        },
        SessionModel {
            txn_rows: vec![1, 1, 2, 1, 5, 1, 1],
            ..SessionModel::standard()
        },
    ] {
        assert_safe(&model, false);
        assert_live(&model);
    }
}

/// Each broken variant is caught: a safety property fails, or some fair path ends with a
/// committed row unpublished. Prints what was found.
#[test]
fn the_checker_catches_a_session_that_goes_on_anywhere_or_confirms_past_kafka() {
    use eos_model::relay_session::SessionBug;
    for bug in [
        SessionBug::AlwaysGoesOn,
        SessionBug::ConfirmsWhatItHandedOver,
    ] {
        let model = SessionModel::standard().with_bug(bug);
        let run = check_exhaustively(model.clone());
        let violated: Vec<&str> = SAFETY_PROPERTIES
            .into_iter()
            .filter(|property| run.discovery(property).is_some())
            .collect();
        let live = check_fair_suffix(&model, in_fair_suffix, every_committed_row_published);
        println!(
            "{bug:?}: safety violated: {violated:?}; liveness: {:?}",
            live.counterexample.as_ref().map(|(problem, _)| problem)
        );
        assert!(
            !violated.is_empty() || live.counterexample.is_some(),
            "{bug:?} was not caught"
        );
    }
}
