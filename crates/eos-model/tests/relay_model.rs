//! outbox-relay's logical-mode reads and slot advances, checked over every interleaving: safe
//! (every committed row published once, in commit order; the slot never past Kafka) and live
//! (every fair path ends with every committed row published), at the standard bounds and at
//! other batch sizes and transaction shapes; and the relay before the fix for issue 55 part 1
//! caught stalling for good.

use eos_model::check_exhaustively;
use eos_model::liveness::{CYCLES_WITHOUT_END, ENDS_WITHOUT_GOAL, FairRun, check_fair_suffix};
use eos_model::relay::{
    Bug, REACHABILITY_PROPERTIES, RelayModel, SAFETY_PROPERTIES, every_committed_row_published,
    in_fair_suffix,
};

/// Every safety property holds in every reachable state of `model`; with `reach_all`, every
/// reachability property is reached too.
fn assert_safe(model: &RelayModel, reach_all: bool) {
    let run = check_exhaustively(model.clone());
    println!(
        "relay model {model:?}: {} unique states, depth {}, {:.1?}",
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
    // The exploration really ran to the end and is not trivially small.
    assert!(run.unique_states > 1000, "{} states", run.unique_states);
}

fn check_liveness(model: &RelayModel) -> FairRun {
    let run = check_fair_suffix(model, in_fair_suffix, every_committed_row_published);
    println!(
        "relay liveness {model:?}: {} unique states ({} in the fair suffix, {} path ends), \
         depth {}, {:.1?}",
        run.unique_states, run.suffix_states, run.path_ends, run.max_depth, run.elapsed
    );
    run
}

fn assert_live(model: &RelayModel) {
    let run = check_liveness(model);
    if let Some((problem, path)) = &run.counterexample {
        panic!("{problem}:\n{}", path.join("\n"));
    }
    assert!(run.path_ends > 0);
}

#[test]
fn every_interleaving_publishes_each_committed_row_once_in_commit_order() {
    assert_safe(&RelayModel::standard(), true);
}

#[test]
fn every_fair_path_publishes_every_committed_row() {
    assert_live(&RelayModel::standard());
}

/// Batches of 3 and 5 rows, and a seventh transaction (a longer backlog), with the same faults.
#[test]
fn other_batch_sizes_and_backlogs_are_safe_and_live() {
    for model in [
        RelayModel {
            batch_size: 3,
            ..RelayModel::standard()
        },
        RelayModel {
            batch_size: 5,
            ..RelayModel::standard()
        },
        RelayModel {
            txn_rows: vec![1, 1, 2, 1, 5, 1, 1],
            ..RelayModel::standard()
        },
    ] {
        assert_safe(&model, false);
        assert_live(&model);
    }
}

/// A broken variant must leave a committed row unpublished on some fair path (a cycle of reads
/// that find nothing new, or an end without it); prints the path.
fn assert_stall_caught(model: &RelayModel) {
    let run = check_liveness(model);
    let Some((problem, path)) = &run.counterexample else {
        panic!("{model:?}: the checker found no fair path that leaves a row unpublished");
    };
    assert!(
        [CYCLES_WITHOUT_END, ENDS_WITHOUT_GOAL].contains(problem),
        "{problem}"
    );
    println!(
        "{:?}: {problem}; counterexample:\n{}",
        model.bug,
        path.join("\n")
    );
}

/// Issue 55 part 1: the relay before the fix stalls for good on a backlog of more than two
/// batches, with no fault at all, and at the standard bounds.
#[test]
fn the_relay_before_the_fix_is_caught_stalling_for_good() {
    assert_stall_caught(&RelayModel {
        crashes: 0,
        failures: 0,
        ..RelayModel::standard().with_bug(Bug::BeforeTheFix)
    });
    assert_stall_caught(&RelayModel::standard().with_bug(Bug::BeforeTheFix));
}

/// Advancing the slot after every full batch is not enough on its own: once an advance fails
/// (the slot stays a batch behind), a read that does not decode further stalls.
#[test]
fn a_read_that_does_not_decode_further_is_caught_stalling_after_a_failed_advance() {
    assert_stall_caught(&RelayModel::standard().with_bug(Bug::IgnoresDecodeFurther));
}

/// Decoding further is what keeps the relay live: with the slot advanced only once the interval
/// elapsed, every fair path still publishes every row (the advance after every full batch saves
/// decoding the same WAL again, it is not needed for progress).
#[test]
fn decoding_further_alone_keeps_the_relay_live() {
    let model = RelayModel::standard().with_bug(Bug::AdvancesOnlyOnInterval);
    assert_safe(&model, false);
    assert_live(&model);
}
