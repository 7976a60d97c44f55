//! The sink-writer's fenced checkpoints, checked over every interleaving at the standard bounds,
//! and each safety property shown able to fail with a deliberately broken step.

use eos_model::sink::{
    Bug, CHECKPOINT_NOT_PAST_UNWRITTEN, CONFLICT_NEVER_HIDDEN, FENCED_BATCH_NEVER_COMMITS,
    NEVER_WRITTEN_TWICE, REACHABILITY_PROPERTIES, SAFETY_PROPERTIES, SinkModel,
    VERSIONED_NEVER_BACKWARDS,
};
use eos_model::{check_exhaustively, check_until_found};

fn assert_safe_and_reaches_everything(model: SinkModel) -> usize {
    let run = check_exhaustively(model.clone());
    println!(
        "sink model {model:?}: {} unique states, depth {}, {:.1?}",
        run.unique_states, run.max_depth, run.elapsed
    );
    for property in SAFETY_PROPERTIES {
        if let Some(path) = run.discovery(property) {
            panic!("{property} violated:\n{}", path.join("\n"));
        }
    }
    for property in REACHABILITY_PROPERTIES {
        assert!(
            run.discovery(property).is_some(),
            "never reached, so the model proves less than it claims: {property}"
        );
    }
    run.unique_states
}

#[test]
fn every_interleaving_keeps_the_sink_checkpoints_exactly_once() {
    let states = assert_safe_and_reaches_everything(SinkModel::standard());
    // The exploration really ran to the end and is not trivially small.
    assert!(states > 1000, "{states} states");
}

/// A broken variant must produce a counterexample for `property`; prints it.
fn assert_caught(bug: Bug, property: &'static str) {
    let run = check_until_found(SinkModel::standard().with_bug(bug), property);
    let Some(path) = run.discovery(property) else {
        panic!("{bug:?}: the checker found no counterexample for {property:?}");
    };
    println!(
        "{bug:?} breaks {property:?}; counterexample:\n{}",
        path.join("\n")
    );
}

#[test]
fn a_checkpoint_written_outside_the_fence_is_caught() {
    assert_caught(Bug::CheckpointWithoutEpochCheck, FENCED_BATCH_NEVER_COMMITS);
    assert_caught(Bug::CheckpointWithoutEpochCheck, NEVER_WRITTEN_TWICE);
}

#[test]
fn reading_the_checkpoint_before_fencing_is_caught() {
    assert_caught(Bug::ReadCheckpointBeforeFence, NEVER_WRITTEN_TWICE);
}

#[test]
fn a_versioned_upsert_with_greater_or_equal_is_caught() {
    assert_caught(Bug::UpsertGreaterOrEqual, VERSIONED_NEVER_BACKWARDS);
    assert_caught(Bug::UpsertGreaterOrEqual, CONFLICT_NEVER_HIDDEN);
}

#[test]
fn a_versioned_upsert_without_a_version_check_is_caught() {
    assert_caught(Bug::UpsertWithoutVersionCheck, VERSIONED_NEVER_BACKWARDS);
}

#[test]
fn a_checkpoint_in_its_own_transaction_is_caught() {
    assert_caught(
        Bug::CheckpointInSeparateTransaction,
        CHECKPOINT_NOT_PAST_UNWRITTEN,
    );
}

#[test]
fn an_insert_that_overwrites_on_conflict_is_caught() {
    assert_caught(Bug::InsertOverwritesConflict, CONFLICT_NEVER_HIDDEN);
}

/// Three owners: `cargo test -p eos-model --test sink_model -- --ignored --nocapture`
/// (7,436,107 states, depth 29; about 4 minutes of CPU and 1 GB, 15 minutes on a shared 2-core
/// machine).
#[test]
#[ignore = "longer run (about 15 minutes); see docs/MODEL_CHECKING.md"]
fn three_owners_keep_the_sink_checkpoints_exactly_once() {
    assert_safe_and_reaches_everything(SinkModel {
        owners: 3,
        rebalances: 2,
        crashes: 1,
        pg_restarts: 1,
        rewinds: 1,
        bug: None,
    });
}
