//! Model checks of eos-suite's protocols: every interleaving of a bounded scenario, explored
//! breadth-first, with each step decided by the services' own transition code.
//!
//! [`dedup`] checks the dedup intent protocol: its actions call `dedup_client::state_machine`
//! (`next_state`, `begin_outcome`, `Transition::from_states`/`needs_token`),
//! `dedup_client::provider_client::classify` and `dedup_service::reconciler::decide` — never a
//! copy of them.
//!
//! [`sink`] checks the sink-writer's fenced checkpoints (`--offsets postgres`): its actions call
//! `sink_writer::checkpoint_rule` (`fenced_epoch`, `may_advance`, `fenced_partitions`,
//! `accepts_record`), `sink_writer::decision::next_offsets` and `sink_writer::batch_plan`
//! (`select_winners`, `classify`, `upsert_applies`, `idempotent_outcome`).
//!
//! [`relay_session`] checks outbox-relay's logical mode as it runs now, reading a replication
//! session, for safety (every committed row published once, in commit order; the slot never
//! past Kafka) and liveness (every committed row is eventually published, whatever the backlog
//! and the crash points): each read's hand-over decided by
//! `outbox_relay::logical_stream::HandOver`, each choice of session by `session_goes_on`.
//! [`relay`] checks the peek protocol the relay ran before (it still peeks in its first start's
//! table pass): each peek judged by `outbox_relay::logical::judge_peek` and each advance decided
//! by `outbox_relay::relay_loop::slot_advance_due`.
//!
//! Each model's bounds, properties and how to read a counterexample are in
//! docs/MODEL_CHECKING.md.
//!
//! The checker is [`stateright`]: a library, so the model is ordinary Rust that links the real
//! crates (a TLA+ spec could only restate them); exhaustive BFS with `always`/`sometimes`
//! properties and the shortest counterexample path; no code generation and no external tool,
//! so `cargo test` runs it on a fresh clone. It builds with Rust 1.95 and adds about a minute
//! of dependency compilation.

pub mod dedup;
pub mod liveness;
pub mod relay;
pub mod relay_session;
pub mod sink;

use std::time::{Duration, Instant};

use stateright::{Checker, CheckerBuilder, HasDiscoveries, Model};

/// What one exhaustive run found.
#[derive(Debug)]
pub struct Run<M: Model> {
    pub unique_states: usize,
    pub max_depth: usize,
    pub elapsed: Duration,
    /// Property name → the path that shows it (a counterexample for `always`, a witness for
    /// `sometimes`), as `Debug` lines: the initial state, then each action and the state it led to.
    pub discoveries: Vec<(&'static str, Vec<String>)>,
    _model: std::marker::PhantomData<M>,
}

impl<M: Model> Run<M> {
    pub fn discovery(&self, name: &str) -> Option<&[String]> {
        self.discoveries
            .iter()
            .find(|(found, _)| *found == name)
            .map(|(_, path)| path.as_slice())
    }
}

/// Explores every state of `model` breadth-first, to the end: a property with no discovery holds
/// in every reachable state (an `always`) or in none (a `sometimes`).
pub fn check_exhaustively<M>(model: M) -> Run<M>
where
    M: Model + Send + Sync + 'static,
    M::State: Clone + std::fmt::Debug + std::hash::Hash + PartialEq + Send + Sync + 'static,
    M::Action: Clone + std::fmt::Debug + PartialEq + Send + Sync + 'static,
{
    explore(model.checker())
}

/// Explores breadth-first until `property` has a discovery (the shortest one) or every state
/// was seen: for a broken variant, where only the counterexample matters.
pub fn check_until_found<M>(model: M, property: &'static str) -> Run<M>
where
    M: Model + Send + Sync + 'static,
    M::State: Clone + std::fmt::Debug + std::hash::Hash + PartialEq + Send + Sync + 'static,
    M::Action: Clone + std::fmt::Debug + PartialEq + Send + Sync + 'static,
{
    let wanted = std::collections::BTreeSet::from([property]);
    explore(model.checker().finish_when(HasDiscoveries::AllOf(wanted)))
}

fn explore<M>(builder: CheckerBuilder<M>) -> Run<M>
where
    M: Model + Send + Sync + 'static,
    M::State: Clone + std::fmt::Debug + std::hash::Hash + PartialEq + Send + Sync + 'static,
    M::Action: Clone + std::fmt::Debug + PartialEq + Send + Sync + 'static,
{
    let started = Instant::now();
    let checker = builder.spawn_bfs().join();
    let mut discoveries: Vec<(&'static str, Vec<String>)> = checker
        .discoveries()
        .into_iter()
        .map(|(name, path)| {
            let mut lines = Vec::new();
            for (state, action) in path.into_vec() {
                lines.push(format!("state: {state:?}"));
                if let Some(action) = action {
                    lines.push(format!("  --{action:?}-->"));
                }
            }
            (name, lines)
        })
        .collect();
    discoveries.sort_by_key(|(name, _)| *name);
    Run {
        unique_states: checker.unique_state_count(),
        max_depth: checker.max_depth(),
        elapsed: started.elapsed(),
        discoveries,
        _model: std::marker::PhantomData,
    }
}
