//! The dedup intent protocol, checked over every interleaving at the standard bounds, and each
//! safety property shown able to fail with a deliberately broken step.

use eos_model::dedup::{
    AT_MOST_ONE_EFFECT, Bug, DedupModel, NO_CALL_WHILE_EFFECT_POSSIBLE, REACHABILITY_PROPERTIES,
    SAFETY_PROPERTIES, STALE_TOKEN_CHANGES_NOTHING,
};
use eos_model::{check_exhaustively, check_until_found};

#[test]
fn every_interleaving_keeps_the_dedup_protocol_safe() {
    let model = DedupModel::standard();
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
    for property in REACHABILITY_PROPERTIES {
        assert!(
            run.discovery(property).is_some(),
            "never reached, so the model proves less than it claims: {property}"
        );
    }
    // The exploration really ran to the end and is not trivially small.
    assert!(run.unique_states > 1000, "{} states", run.unique_states);
}

/// A broken variant must produce a counterexample for `property`; prints it.
fn assert_caught(bug: Bug, property: &'static str) {
    let run = check_until_found(DedupModel::standard().with_bug(bug), property);
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

/// Three clients, a longer clock: `cargo test -p eos-model -- --ignored --nocapture`
/// (12,287,466 states, about 5 minutes and 1.1 GB on 2 cores).
#[test]
#[ignore = "longer run (about 5 minutes); see docs/MODEL_CHECKING.md"]
fn three_clients_keep_the_dedup_protocol_safe() {
    let model = DedupModel {
        clients: 3,
        begins_per_client: 2,
        max_tick: 5,
        bug: None,
    };
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
    for property in REACHABILITY_PROPERTIES {
        assert!(
            run.discovery(property).is_some(),
            "never reached: {property}"
        );
    }
}
