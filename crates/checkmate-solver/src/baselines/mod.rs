//! Baseline strategies from the literature, generalized to DAGs as in the Checkmate paper.
//!
//! Each picks a set of forward checkpoints; [`schedule_from_checkpoints`] or
//! [`segment_schedule`] turns it into the `S` matrix and Algorithm 2 gives the cheapest `R` for it.
//!
//! - `checkpoint-all`, `checkpoint-last` ([`simple`](CheckpointAll));
//! - `chen-sqrtn`, `chen-greedy` ([`ChenSqrtN`], [`ChenGreedy`]): Chen et al. (2016) on the
//!   linearized forward order (every forward node is a candidate);
//! - `ap-sqrtn`, `ap-greedy` ([`ApSqrtN`], [`ApGreedy`]): the same on the articulation points of the
//!   undirected forward graph ([`articulation_points`]);
//! - `griewank` ([`Griewank`]): Griewank & Walther's binomial (Revolve) schedule for chains.

mod ap;
mod chen;
mod griewank;
mod simple;

pub use ap::{articulation_points, ApGreedy, ApSqrtN};
pub use chen::{ChenGreedy, ChenSqrtN};
pub use griewank::{binomial, revolve_actions, revolve_forward_steps, Action, Griewank};
pub use simple::{CheckpointAll, CheckpointLast};

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};

use checkmate_graph::{simulate, Graph, NodeIdx, NodeKind, Schedule};

use fixedbitset::FixedBitSet;
use rayon::prelude::*;

use crate::strategy::{Outcome, Status};

/// The schedule that keeps every checkpoint (and every loss/backward output) from the stage after
/// it is computed until its last consumer, recomputing all other forward tensors where needed.
pub fn schedule_from_checkpoints(graph: &Graph, is_checkpoint: &[bool]) -> Schedule {
    let n = graph.len();
    let last_consumer: Vec<usize> = (0..n).map(|i| graph.last_reader(i).unwrap_or(i)).collect();
    let keep: Vec<FixedBitSet> = (0..n)
        .map(|t| {
            let mut row = FixedBitSet::with_capacity(n);
            for i in 0..t {
                let kept_kind = graph.node(i).kind != NodeKind::Forward || is_checkpoint[i];
                if kept_kind && last_consumer[i] >= t {
                    row.insert(i);
                }
            }
            row
        })
        .collect();
    Schedule::cheapest_given_keeps(graph, keep).expect("keeps only tensors computed earlier")
}

/// Chen et al.'s segment schedule for a checkpoint set ("recompute each segment once").
///
/// The `S` matrix keeps:
/// - every loss/backward output and every checkpoint from the stage after it is computed until its
///   last consumer;
/// - during the forward pass, every other forward tensor until its last forward (or loss) consumer,
///   so the forward pass computes each node once and drops non-checkpoints as soon as the forward
///   pass no longer reads them;
/// - during the backward pass (transitions out of a loss or backward stage), every forward tensor
///   that the previous stage computed or kept and that a later stage still reads: a segment
///   recomputed for one backward node stays for the backward nodes after it, as in Chen et al.
///
/// `R` is the cheapest for this `S` (Algorithm 2). With every node a checkpoint this is the
/// checkpoint-all schedule.
pub fn segment_schedule(graph: &Graph, is_checkpoint: &[bool]) -> Schedule {
    let n = graph.len();
    let last_consumer: Vec<usize> = (0..n).map(|i| graph.last_reader(i).unwrap_or(i)).collect();
    // Last consumer that is not a backward node (usize::MAX: none).
    let last_fwd_consumer: Vec<usize> = (0..n)
        .map(|i| {
            graph
                .succs(i)
                .iter()
                .rev()
                .find(|&&j| graph.node(j).kind != NodeKind::Backward)
                .copied()
                .unwrap_or(usize::MAX)
        })
        .collect();
    let is_fwd: Vec<bool> = (0..n)
        .map(|i| graph.node(i).kind == NodeKind::Forward)
        .collect();
    // The part of S[t] that does not depend on R: checkpoints, loss/backward outputs, forward liveness.
    let fixed = |t: usize| {
        let mut row = FixedBitSet::with_capacity(n);
        for i in 0..t {
            let always = !is_fwd[i] || is_checkpoint.get(i).copied().unwrap_or(false);
            if (always && last_consumer[i] >= t)
                || (is_fwd[i] && last_fwd_consumer[i] != usize::MAX && last_fwd_consumer[i] >= t)
            {
                row.insert(i);
            }
        }
        row
    };
    let mut keep: Vec<FixedBitSet> = Vec::with_capacity(n);
    keep.push(FixedBitSet::with_capacity(n));
    for t in 0..n.saturating_sub(1) {
        let mut next = fixed(t + 1);
        if !is_fwd[t] {
            // What stage t holds: its keeps and its computes (Algorithm 2's closure, which only
            // needs S[t] and the new keeps of S[t + 1]; the sticky part below adds none).
            let s = &keep[t];
            let mut r = FixedBitSet::with_capacity(n);
            r.insert(t);
            for v in next.ones() {
                if !s.contains(v) {
                    r.insert(v);
                }
            }
            for i in (0..=t).rev() {
                if r.contains(i) {
                    for &p in graph.preds(i) {
                        if !s.contains(p) {
                            r.insert(p);
                        }
                    }
                }
            }
            r.union_with(s);
            for i in r.ones() {
                if i <= t && is_fwd[i] && last_consumer[i] > t {
                    next.insert(i);
                }
            }
        }
        keep.push(next);
    }
    Schedule::cheapest_given_keeps(graph, keep).expect("keeps only tensors computed earlier")
}

/// One evaluated checkpoint set: its simulated peak and cost.
#[derive(Debug, Clone)]
pub(crate) struct Evaluated {
    pub(crate) peak: u64,
    pub(crate) cost: f64,
    pub(crate) schedule: Schedule,
}

/// Builds and simulates the segment schedule of a checkpoint set.
pub(crate) fn evaluate_checkpoints(graph: &Graph, is_checkpoint: &[bool]) -> Evaluated {
    evaluate_schedule(graph, segment_schedule(graph, is_checkpoint))
}

/// Simulates a schedule built by a baseline.
pub(crate) fn evaluate_schedule(graph: &Graph, schedule: Schedule) -> Evaluated {
    let sim = simulate(graph, &schedule.to_plan(graph))
        .expect("schedules from Algorithm 2 are valid plans");
    Evaluated {
        peak: sim.peak_bytes,
        cost: sim.cost,
        schedule,
    }
}

/// The cheapest candidate whose peak fits, as an [`Outcome`] (no plan when none fits).
pub(crate) fn best_within(graph: &Graph, candidates: &[Evaluated], budget: u64) -> Outcome {
    let best = cheapest_within(candidates, budget, |e| (e.peak, e.cost));
    match best {
        Some(e) => Outcome {
            exact_model: false,
            plan: Some(e.schedule.to_plan(graph)),
            status: Status::Feasible,
            lower_bound: None,
            limit: None,
        },
        None => Outcome {
            exact_model: false,
            plan: None,
            status: Status::NoPlanFound,
            lower_bound: None,
            limit: None,
        },
    }
}

/// The cheapest of `items` whose peak fits `budget` (then the lowest peak; the first of equals);
/// `judge` gives an item's `(peak, cost)`.
fn cheapest_within<T>(items: &[T], budget: u64, judge: impl Fn(&T) -> (u64, f64)) -> Option<&T> {
    items
        .iter()
        .filter(|e| judge(e).0 <= budget)
        .min_by(|a, b| {
            let ((pa, ca), (pb, cb)) = (judge(a), judge(b));
            ca.total_cmp(&cb).then(pa.cmp(&pb))
        })
}

/// The least simulated peak among candidates.
pub(crate) fn least_peak(candidates: &[Evaluated]) -> Option<u64> {
    candidates.iter().map(|e| e.peak).min()
}

/// One checkpoint set of a greedy frontier, simulated: its peak and cost, and the set itself (the
/// schedule is rebuilt for the set a strategy returns, so the memo holds a few bytes per node
/// instead of a schedule: on ResNet50 the memoized schedules held 19 MB for the process's life).
#[derive(Debug, Clone)]
pub(crate) struct GreedySet {
    pub(crate) peak: u64,
    pub(crate) cost: f64,
    pub(crate) checkpoints: Vec<bool>,
}

/// [`best_within`] over a greedy frontier: the cheapest set within `budget` (then the lowest
/// peak), its schedule rebuilt.
pub(crate) fn best_set_within(graph: &Graph, sets: &[GreedySet], budget: u64) -> Outcome {
    match cheapest_within(sets, budget, |e| (e.peak, e.cost)) {
        Some(e) => best_within(
            graph,
            &[evaluate_checkpoints(graph, &e.checkpoints)],
            budget,
        ),
        None => best_within(graph, &[], budget),
    }
}

/// The least simulated peak of a greedy frontier.
pub(crate) fn least_set_peak(sets: &[GreedySet]) -> Option<u64> {
    sets.iter().map(|e| e.peak).min()
}

/// Chen's `sqrt(n)` rule on a candidate list: split it into segments of `floor(sqrt(len))`
/// candidates and checkpoint the last candidate of each full segment (Checkmate's
/// `(idx + 1) % k == 0`).
pub(crate) fn sqrtn_checkpoints(n: usize, candidates: &[NodeIdx]) -> Vec<bool> {
    let mut is_checkpoint = vec![false; n];
    let k = (candidates.len() as f64).sqrt().floor().max(1.0) as usize;
    for (idx, &v) in candidates.iter().enumerate() {
        if (idx + 1) % k == 0 {
            is_checkpoint[v] = true;
        }
    }
    is_checkpoint
}

/// Chen's greedy rule: walk the forward nodes in topological order summing output bytes and
/// checkpoint a candidate when the running sum exceeds `threshold`, then restart the sum.
pub(crate) fn greedy_checkpoints(
    graph: &Graph,
    is_candidate: &[bool],
    threshold: u64,
) -> Vec<bool> {
    let mut is_checkpoint = vec![false; graph.len()];
    let mut running: u64 = 0;
    for v in graph.forward_nodes() {
        running = running.saturating_add(graph.node(v).bytes);
        if is_candidate[v] && running > threshold {
            is_checkpoint[v] = true;
            running = 0;
        }
    }
    is_checkpoint
}

/// Most checkpoint sets `*-greedy` simulates per call; beyond it the thresholds are thinned
/// evenly.
pub(crate) const MAX_GREEDY_SETS: usize = 256;

/// Every distinct checkpoint set the greedy rule produces over all thresholds, simulated.
///
/// The rule only changes where the threshold crosses a running sum, i.e. the bytes of a run of
/// consecutive forward nodes that starts after a candidate (or at the first forward node) and ends
/// at a candidate; thresholds `0` and every such sum cover all outcomes. When more than
/// [`MAX_GREEDY_SETS`] distinct sets arise, an evenly spaced subset (by threshold) is simulated.
///
/// Results are memoized for the last few (graph, candidates) pairs, so a sweep or a `solve` that
/// also asks for the least feasible budget simulates each set once.
pub(crate) fn greedy_frontier(graph: &Graph, is_candidate: &[bool]) -> Arc<Vec<GreedySet>> {
    let key = fingerprint(graph, is_candidate);
    if let Some(hit) = lock_cache().iter().find(|(k, _)| *k == key) {
        return Arc::clone(&hit.1);
    }
    let computed = Arc::new(compute_greedy_frontier(graph, is_candidate));
    let mut cache = lock_cache();
    if !cache.iter().any(|(k, _)| *k == key) {
        if cache.len() >= GREEDY_CACHE_ENTRIES {
            cache.remove(0);
        }
        cache.push((key, Arc::clone(&computed)));
    }
    computed
}

/// How many greedy frontiers stay memoized.
const GREEDY_CACHE_ENTRIES: usize = 4;

type GreedyCache = Vec<(u64, Arc<Vec<GreedySet>>)>;

fn lock_cache() -> std::sync::MutexGuard<'static, GreedyCache> {
    static CACHE: Mutex<GreedyCache> = Mutex::new(Vec::new());
    // A panic while holding the lock cannot leave the vector inconsistent: use it anyway.
    CACHE.lock().unwrap_or_else(|e| e.into_inner())
}

/// A hash of everything the greedy frontier depends on.
fn fingerprint(graph: &Graph, is_candidate: &[bool]) -> u64 {
    let mut h = DefaultHasher::new();
    graph.len().hash(&mut h);
    for (i, node) in graph.nodes().iter().enumerate() {
        node.kind.hash(&mut h);
        node.cost.to_bits().hash(&mut h);
        node.bytes.hash(&mut h);
        node.workspace_bytes.hash(&mut h);
        graph.preds(i).hash(&mut h);
    }
    is_candidate.hash(&mut h);
    h.finish()
}

fn compute_greedy_frontier(graph: &Graph, is_candidate: &[bool]) -> Vec<GreedySet> {
    let fwd: Vec<NodeIdx> = graph.forward_nodes().collect();
    let mut prefix = Vec::with_capacity(fwd.len() + 1);
    prefix.push(0u64);
    for &v in &fwd {
        let last = *prefix.last().unwrap_or(&0);
        prefix.push(last.saturating_add(graph.node(v).bytes));
    }
    // Run starts: 0 and right after every candidate; run ends: candidates.
    let starts: Vec<usize> = std::iter::once(0)
        .chain(
            fwd.iter()
                .enumerate()
                .filter(|(_, &v)| is_candidate[v])
                .map(|(k, _)| k + 1),
        )
        .filter(|&s| s < fwd.len())
        .collect();
    let ends: Vec<usize> = fwd
        .iter()
        .enumerate()
        .filter(|(_, &v)| is_candidate[v])
        .map(|(k, _)| k)
        .collect();
    let mut thresholds: Vec<u64> = vec![0];
    for &s in &starts {
        for &e in ends.iter().filter(|&&e| e >= s) {
            thresholds.push(prefix[e + 1] - prefix[s]);
        }
    }
    thresholds.sort_unstable();
    thresholds.dedup();
    let mut sets: Vec<Vec<bool>> = Vec::new();
    for &b in &thresholds {
        let set = greedy_checkpoints(graph, is_candidate, b);
        if sets.last() != Some(&set) && !sets.contains(&set) {
            sets.push(set);
        }
    }
    if sets.len() > MAX_GREEDY_SETS {
        let m = sets.len();
        sets = (0..MAX_GREEDY_SETS)
            .map(|k| sets[k * (m - 1) / (MAX_GREEDY_SETS - 1)].clone())
            .collect();
    }
    tracing::debug!(
        thresholds = thresholds.len(),
        sets = sets.len(),
        "greedy checkpoint sets"
    );
    sets.into_par_iter()
        .map(|set| {
            let e = evaluate_checkpoints(graph, &set);
            GreedySet {
                peak: e.peak,
                cost: e.cost,
                checkpoints: set,
            }
        })
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use checkmate_graph::NodeSpec;

    /// One of Checkmate's graphs in the repository's data/graphs/checkmate, e.g.
    /// `shared_graph("VGG16_256_224")`.
    pub(crate) fn shared_graph(name: &str) -> Graph {
        let path = format!(
            "{}/../../data/graphs/checkmate/{name}.json",
            env!("CARGO_MANIFEST_DIR")
        );
        Graph::read(&path).unwrap_or_else(|e| panic!("the shared graph {name}: {e}"))
    }

    /// A chain of `m` unit layers with a loss and mirrored backward nodes.
    pub(crate) fn chain(m: usize, bytes: u64) -> Graph {
        let mut nodes = Vec::new();
        let spec = |id: usize, kind, deps: Vec<usize>| NodeSpec {
            alternatives: Vec::new(),
            id: id as u64,
            name: format!("n{id}"),
            kind,
            cost: 1.0,
            bytes,
            workspace_bytes: 0,
            deps: deps.into_iter().map(|d| d as u64).collect(),
        };
        for j in 0..m {
            nodes.push(spec(
                j,
                NodeKind::Forward,
                if j > 0 { vec![j - 1] } else { vec![] },
            ));
        }
        nodes.push(spec(m, NodeKind::Loss, vec![m - 1]));
        for j in (0..m).rev() {
            let id = m + 1 + (m - 1 - j);
            let mut deps = vec![j];
            if j > 0 {
                deps.push(j - 1);
            }
            deps.push(if j == m - 1 { m } else { id - 1 });
            nodes.push(spec(id, NodeKind::Backward, deps));
        }
        Graph::new("chain", "flops", 0, nodes).unwrap()
    }

    #[test]
    fn segment_schedule_with_all_checkpoints_is_checkpoint_all() {
        let g = chain(7, 10);
        let all = segment_schedule(&g, &vec![true; g.len()]);
        assert_eq!(all, schedule_from_checkpoints(&g, &vec![true; g.len()]));
        assert_eq!(all.cost(&g), g.total_cost());
    }

    #[test]
    fn segments_are_recomputed_once() {
        // 16 layers, checkpoints every 4th: one extra forward pass at most.
        let m = 16;
        let g = chain(m, 10);
        let mut cp = vec![false; g.len()];
        for j in (3..m).step_by(4) {
            cp[j] = true;
        }
        let s = segment_schedule(&g, &cp);
        s.validate(&g).unwrap();
        let extra = s.cost(&g) - g.total_cost();
        assert!(extra <= m as f64, "extra {extra}");
        assert!(extra > 0.0);
        let e = evaluate_schedule(&g, s);
        let all = evaluate_checkpoints(&g, &vec![true; g.len()]);
        assert!(e.peak < all.peak, "{} vs {}", e.peak, all.peak);
    }

    #[test]
    fn greedy_thresholds_cover_checkpoint_all_and_none() {
        let g = chain(9, 10);
        let cand = vec![true; g.len()];
        let sets = greedy_frontier(&g, &cand);
        // Threshold 0 checkpoints every forward node: no recomputation.
        assert!(sets.iter().any(|e| e.cost == g.total_cost()));
        assert!(sets.len() >= 3);
    }
}
