//! Liveness under fairness, judged soundly: "every path through the fair suffix ends, and ends
//! where the goal holds".
//!
//! stateright's `eventually` is not used for this: its documentation says it only works on
//! acyclic paths (it does not tell a cycle from two paths joining), so a path that loops
//! forever without reaching the goal can go unreported. Here the whole reachable graph is
//! built, and two things are checked over the states a model marks as its fair suffix:
//!
//! 1. **no cycle**: among the transitions that change the state, the suffix has no cycle, so
//!    every path through it is finite (a stutter — an action that leaves the state as it is —
//!    cannot be taken forever under weak fairness while another action is enabled, and is
//!    harmless where nothing else is);
//! 2. **the goal where paths end**: every suffix state in which no action changes the state (a
//!    path's end under fairness: nothing is starved, nothing left to do) satisfies the goal.
//!
//! Together: every fair path that enters the suffix reaches a state satisfying the goal and
//! stays there. A failure comes with the shortest path (BFS) to the bad end, or a path into
//! the cycle and the cycle itself: a cycle on which the goal never holds if there is one (a
//! path that never reaches it, the clearest evidence), else any (a path that never ends, e.g.
//! a loop that spins once its work is done, and would spin the same with work waiting).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use stateright::Model;

/// What one liveness check found.
#[derive(Debug)]
pub struct FairRun {
    pub unique_states: usize,
    /// States in the fair suffix.
    pub suffix_states: usize,
    /// Suffix states where fair paths end (no action changes the state).
    pub path_ends: usize,
    pub max_depth: usize,
    pub elapsed: Duration,
    /// `None`: the property holds. Otherwise why not, and the path that shows it, as `Debug`
    /// lines like [`crate::Run::discoveries`].
    pub counterexample: Option<(&'static str, Vec<String>)>,
}

pub const ENDS_WITHOUT_GOAL: &str = "a fair path ends where the goal does not hold";
pub const CYCLES_WITHOUT_END: &str = "a fair path can go on forever (a cycle in the suffix)";

/// Builds every reachable state of `model` and checks that every path through the suffix
/// (`in_suffix`, closed under the model's actions) is finite and ends where `goal` holds.
/// Stops at the first path end without the goal (so the counts are then partial).
pub fn check_fair_suffix<M>(
    model: &M,
    in_suffix: fn(&M::State) -> bool,
    goal: fn(&M::State) -> bool,
) -> FairRun
where
    M: Model,
    M::State: Clone + std::fmt::Debug + std::hash::Hash + Eq,
    M::Action: Clone + std::fmt::Debug,
{
    let started = Instant::now();
    let mut states: Vec<M::State> = Vec::new();
    let mut index: HashMap<M::State, usize> = HashMap::new();
    // How each state was first reached: (parent, action), for the counterexample path.
    let mut parent: Vec<Option<(usize, M::Action)>> = Vec::new();
    let mut depth: Vec<usize> = Vec::new();
    // Successors that differ from the state, for suffix states only.
    let mut successors: HashMap<usize, Vec<(usize, M::Action)>> = HashMap::new();
    for init in model.init_states() {
        if !index.contains_key(&init) {
            index.insert(init.clone(), states.len());
            states.push(init);
            parent.push(None);
            depth.push(0);
        }
    }
    let mut run = FairRun {
        unique_states: 0,
        suffix_states: 0,
        path_ends: 0,
        max_depth: 0,
        elapsed: Duration::ZERO,
        counterexample: None,
    };
    let mut actions = Vec::new();
    let mut next = 0;
    while next < states.len() {
        let current = next;
        next += 1;
        let state = states[current].clone();
        let suffix = in_suffix(&state);
        actions.clear();
        model.actions(&state, &mut actions);
        let mut moved = Vec::new();
        for action in actions.drain(..) {
            let Some(successor) = model.next_state(&state, action.clone()) else {
                continue;
            };
            if successor == state {
                continue;
            }
            let id = match index.get(&successor) {
                Some(id) => *id,
                None => {
                    let id = states.len();
                    index.insert(successor.clone(), id);
                    states.push(successor);
                    parent.push(Some((current, action.clone())));
                    depth.push(depth[current] + 1);
                    run.max_depth = run.max_depth.max(depth[current] + 1);
                    id
                }
            };
            if suffix {
                moved.push((id, action));
            }
        }
        if suffix {
            run.suffix_states += 1;
            if moved.is_empty() {
                run.path_ends += 1;
                if !goal(&state) {
                    // BFS order: the first one found is a shortest.
                    run.counterexample =
                        Some((ENDS_WITHOUT_GOAL, path_to(&states, &parent, current)));
                    break;
                }
            }
            successors.insert(current, moved);
        }
    }
    if run.counterexample.is_none() {
        let without_goal = |id: usize| !goal(&states[id]);
        run.counterexample = find_cycle(&states, &parent, &successors, without_goal)
            .or_else(|| find_cycle(&states, &parent, &successors, |_| true));
    }
    run.unique_states = states.len();
    run.elapsed = started.elapsed();
    run
}

/// The path from an initial state to `target`, as `Debug` lines.
fn path_to<S: std::fmt::Debug, A: std::fmt::Debug + Clone>(
    states: &[S],
    parent: &[Option<(usize, A)>],
    target: usize,
) -> Vec<String> {
    let mut steps = Vec::new();
    let mut at = target;
    while let Some((from, action)) = &parent[at] {
        steps.push((at, Some(action.clone())));
        at = *from;
    }
    steps.push((at, None));
    steps.reverse();
    let mut lines = Vec::new();
    for (id, action) in steps {
        if let Some(action) = action {
            lines.push(format!("  --{action:?}-->"));
        }
        lines.push(format!("state: {:?}", states[id]));
    }
    lines
}

/// A cycle among the suffix's state-changing transitions through `allowed` states only
/// (iterative DFS), as a path into it followed by the cycle.
fn find_cycle<S: std::fmt::Debug, A: std::fmt::Debug + Clone>(
    states: &[S],
    parent: &[Option<(usize, A)>],
    successors: &HashMap<usize, Vec<(usize, A)>>,
    allowed: impl Fn(usize) -> bool,
) -> Option<(&'static str, Vec<String>)> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Unseen,
        OnStack,
        Done,
    }
    let mut mark = vec![Mark::Unseen; states.len()];
    let mut roots: Vec<usize> = successors.keys().copied().collect();
    roots.sort_unstable();
    for root in roots {
        if mark[root] != Mark::Unseen || !allowed(root) {
            continue;
        }
        // (state, index of its next successor to look at)
        let mut stack = vec![(root, 0usize)];
        mark[root] = Mark::OnStack;
        while let Some((node, edge)) = stack.last().copied() {
            let edges = successors.get(&node).map(Vec::as_slice).unwrap_or(&[]);
            if edge == edges.len() {
                mark[node] = Mark::Done;
                stack.pop();
                continue;
            }
            if let Some(top) = stack.last_mut() {
                top.1 += 1;
            }
            let (to, _) = &edges[edge];
            if !allowed(*to) {
                continue;
            }
            match mark[*to] {
                Mark::Unseen => {
                    mark[*to] = Mark::OnStack;
                    stack.push((*to, 0));
                }
                Mark::OnStack => {
                    let mut lines = path_to(states, parent, *to);
                    lines.push("  the cycle, back to that state:".into());
                    let start = stack.iter().position(|(n, _)| n == to).unwrap_or(0);
                    for (n, e) in &stack[start..] {
                        let edges = successors.get(n).map(Vec::as_slice).unwrap_or(&[]);
                        let (next, action) = &edges[e - 1];
                        lines.push(format!("  --{action:?}-->"));
                        lines.push(format!("state: {:?}", states[*next]));
                    }
                    return Some((CYCLES_WITHOUT_END, lines));
                }
                Mark::Done => {}
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use stateright::Model;

    use super::*;

    /// States 0..=3; `next` says where each may go. Everything from 1 on is the suffix.
    struct Graph {
        next: &'static [&'static [u8]],
    }

    impl Model for Graph {
        type State = u8;
        type Action = u8;

        fn init_states(&self) -> Vec<u8> {
            vec![0]
        }

        fn actions(&self, state: &u8, actions: &mut Vec<u8>) {
            actions.extend_from_slice(self.next[usize::from(*state)]);
        }

        fn next_state(&self, _: &u8, action: u8) -> Option<u8> {
            Some(action)
        }
    }

    fn suffix(state: &u8) -> bool {
        *state >= 1
    }

    fn at_three(state: &u8) -> bool {
        *state == 3
    }

    #[test]
    fn every_path_ending_at_the_goal_holds_even_with_stutters() {
        // 0 → 1 → {2, 3}; 2 → 3; 3 only stutters.
        let run = check_fair_suffix(
            &Graph {
                next: &[&[1], &[2, 3], &[3], &[3]],
            },
            suffix,
            at_three,
        );
        assert!(run.counterexample.is_none(), "{:?}", run.counterexample);
        assert_eq!(
            (run.unique_states, run.suffix_states, run.path_ends),
            (4, 3, 1)
        );
    }

    #[test]
    fn a_path_ending_elsewhere_is_reported_with_its_path() {
        // 2 is a dead end that is not the goal.
        let run = check_fair_suffix(
            &Graph {
                next: &[&[1], &[2, 3], &[], &[]],
            },
            suffix,
            at_three,
        );
        let (problem, path) = run.counterexample.expect("2 is a bad end");
        assert_eq!(problem, ENDS_WITHOUT_GOAL);
        assert_eq!(path.last().map(String::as_str), Some("state: 2"));
    }

    #[test]
    fn a_cycle_that_never_reaches_the_goal_is_reported() {
        // 1 ⇄ 2 forever is a fair path too, although 3 is reachable.
        let run = check_fair_suffix(
            &Graph {
                next: &[&[1], &[2, 3], &[1], &[]],
            },
            suffix,
            at_three,
        );
        let (problem, path) = run.counterexample.expect("1 ⇄ 2 is a cycle");
        assert_eq!(problem, CYCLES_WITHOUT_END, "{path:?}");
    }

    #[test]
    fn a_cycle_that_never_reaches_the_goal_is_preferred_to_one_through_it() {
        // 1 ⇄ 3 passes through the goal and comes first in DFS order; 1 ⇄ 2 never reaches it.
        let run = check_fair_suffix(
            &Graph {
                next: &[&[1], &[3, 2], &[1], &[1]],
            },
            suffix,
            at_three,
        );
        let (problem, path) = run.counterexample.expect("two cycles");
        assert_eq!(problem, CYCLES_WITHOUT_END, "{path:?}");
        assert!(
            !path.iter().any(|line| line == "state: 3"),
            "the cycle that never reaches 3: {path:?}"
        );
    }
}
