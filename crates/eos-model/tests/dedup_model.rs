//! The dedup intent protocol, checked over every interleaving at the standard bounds, and each
//! safety property shown able to fail with a deliberately broken step.

use eos_model::dedup::{
    AT_MOST_ONE_EFFECT, Bug, DedupModel, NO_ACQUISITION_AFTER_EFFECT,
    NO_CALL_WHILE_EFFECT_POSSIBLE, PAST_WINDOW_FAILS_CLOSED, REACHABILITY_PROPERTIES,
    REACHES_LOST_BEGIN_ANSWER_RETRIED, REACHES_RECONCILED_AFTER_RESTART, SAFETY_PROPERTIES,
    STALE_TOKEN_CHANGES_NOTHING, STUCK_REACHABILITY_PROPERTIES, STUCK_STAYS_UNKNOWN,
    every_unknown_settled, in_fair_suffix,
};
use eos_model::liveness::{ENDS_WITHOUT_GOAL, FairRun, check_fair_suffix};
use eos_model::{check_exhaustively, check_until_found};

/// Every safety property holds in every reachable state of `model`, and every one of
/// `reachable` is reached.
fn assert_safe(model: DedupModel, reachable: &[&str]) {
    let run = check_exhaustively(model.clone());
    println!(
        "dedup model {model:?}: {} unique states, depth {}, {:.1?}",
        run.unique_states, run.max_depth, run.elapsed
    );
    for property in SAFETY_PROPERTIES {
        if let Some(path) = run.discovery(property) {
            panic!("{property} violated:\n{}", path.join("\n"));
        }
    }
    for property in reachable {
        assert!(
            run.discovery(property).is_some(),
            "never reached, so the model proves less than it claims: {property}"
        );
    }
    // The exploration really ran to the end and is not trivially small.
    assert!(run.unique_states > 1000, "{} states", run.unique_states);
}

#[test]
fn every_interleaving_keeps_the_dedup_protocol_safe() {
    assert_safe(DedupModel::standard(), &REACHABILITY_PROPERTIES);
}

#[test]
fn a_provider_that_forgets_leaves_stuck_attempts_unknown_and_uncharged() {
    assert_safe(DedupModel::stuck(), &STUCK_REACHABILITY_PROPERTIES);
}

/// A broken variant must produce a counterexample for `property`; prints it.
fn assert_caught(bug: Bug, property: &'static str) {
    assert_caught_in(DedupModel::standard(), bug, property);
}

fn assert_caught_in(model: DedupModel, bug: Bug, property: &'static str) {
    let run = check_until_found(model.with_bug(bug), property);
    let Some(path) = run.discovery(property) else {
        panic!("{bug:?}: the checker found no counterexample for {property:?}");
    };
    println!(
        "{bug:?} breaks {property:?}; counterexample:\n{}",
        path.join("\n")
    );
}

#[test]
fn a_lease_expiry_to_failed_is_caught_as_a_double_charge() {
    assert_caught(Bug::ExpireToFailed, AT_MOST_ONE_EFFECT);
    assert_caught(Bug::ExpireToFailed, NO_CALL_WHILE_EFFECT_POSSIBLE);
}

#[test]
fn a_begin_that_reacquires_unknown_is_caught_as_a_double_charge() {
    assert_caught(Bug::BeginReacquiresUnknown, AT_MOST_ONE_EFFECT);
    assert_caught(Bug::BeginReacquiresUnknown, NO_CALL_WHILE_EFFECT_POSSIBLE);
}

#[test]
fn a_report_without_the_token_check_is_caught() {
    assert_caught(Bug::ReportIgnoresToken, STALE_TOKEN_CHANGES_NOTHING);
}

#[test]
fn a_reconciler_that_skips_the_in_flight_window_is_caught_as_a_double_charge() {
    assert_caught(Bug::ReconcilerSkipsInFlightWindow, AT_MOST_ONE_EFFECT);
}

#[test]
fn a_holder_sending_after_its_lease_breaks_the_protocol_alone() {
    assert_caught(Bug::ClientSendsAfterLease, AT_MOST_ONE_EFFECT);
}

#[test]
fn a_purge_that_ignores_retention_is_caught_reopening_a_charged_operation() {
    assert_caught(Bug::PurgeIgnoresRetention, NO_ACQUISITION_AFTER_EFFECT);
    assert_caught(Bug::PurgeIgnoresRetention, AT_MOST_ONE_EFFECT);
}

#[test]
fn a_begin_past_the_window_that_acquires_is_caught() {
    assert_caught(Bug::ExpiredBeginAcquires, PAST_WINDOW_FAILS_CLOSED);
}

#[test]
fn a_reconciler_that_retries_stuck_attempts_is_caught_as_a_double_charge() {
    assert_caught_in(
        DedupModel::stuck(),
        Bug::ReconcilerRetriesStuck,
        STUCK_STAYS_UNKNOWN,
    );
    assert_caught_in(
        DedupModel::stuck(),
        Bug::ReconcilerRetriesStuck,
        AT_MOST_ONE_EFFECT,
    );
}

fn check_liveness(model: &DedupModel) -> FairRun {
    let run = check_fair_suffix(model, in_fair_suffix, every_unknown_settled);
    println!(
        "dedup liveness {model:?}: {} unique states ({} in the fair suffix, {} path ends), \
         depth {}, {:.1?}",
        run.unique_states, run.suffix_states, run.path_ends, run.max_depth, run.elapsed
    );
    run
}

#[test]
fn once_faults_stop_every_unknown_is_settled() {
    let run = check_liveness(&DedupModel::liveness());
    if let Some((problem, path)) = &run.counterexample {
        panic!("{problem}:\n{}", path.join("\n"));
    }
    // The suffix was really explored, and fair paths really end somewhere.
    assert!(
        run.suffix_states > 1000,
        "{} suffix states",
        run.suffix_states
    );
    assert!(run.path_ends > 0);
}

/// A broken variant must leave an UNKNOWN unsettled at the end of a fair path; prints it.
fn assert_liveness_caught(bug: Bug) {
    let run = check_liveness(&DedupModel::liveness().with_bug(bug));
    let Some((problem, path)) = &run.counterexample else {
        panic!("{bug:?}: the checker found no fair path that leaves an UNKNOWN");
    };
    assert_eq!(*problem, ENDS_WITHOUT_GOAL, "{}", path.join("\n"));
    println!("{bug:?}: {problem}; counterexample:\n{}", path.join("\n"));
}

#[test]
fn a_reconciler_that_never_takes_no_record_as_failure_is_caught_leaving_unknown() {
    assert_liveness_caught(Bug::ReconcilerWaitsForever);
}

#[test]
fn a_purge_that_deletes_unknown_rows_is_caught_leaving_one_unsettled() {
    assert_liveness_caught(Bug::PurgeDeletesUnknown);
}

/// Three clients, a longer clock, retention 3 ticks; no restarts (the standard bounds check
/// them): `cargo test -p eos-model -- --ignored --nocapture`. Measured figures are in
/// docs/MODEL_CHECKING.md.
#[test]
#[ignore = "longer run (several minutes); see docs/MODEL_CHECKING.md"]
fn three_clients_keep_the_dedup_protocol_safe() {
    let model = DedupModel {
        clients: 3,
        begins_per_client: 2,
        max_tick: 5,
        retention: Some(3),
        restarts: 0,
        ..DedupModel::standard()
    };
    let without_restarts: Vec<&str> = REACHABILITY_PROPERTIES
        .into_iter()
        .filter(|property| {
            ![
                REACHES_LOST_BEGIN_ANSWER_RETRIED,
                REACHES_RECONCILED_AFTER_RESTART,
            ]
            .contains(property)
        })
        .collect();
    assert_safe(model, &without_restarts);
}
