//! The paper's `(R, S)` schedule form, its conversion to a plan (Algorithm 1) and the cheapest
//! recomputation given what is kept (Algorithm 2).
//!
//! Stage `t` (one per node, in topological order) computes node `t` and whatever it recomputes.
//! `computes(t)` is the paper's row `R[t]`, `keeps(t)` its row `S[t]`: the tensors kept from stage
//! `t - 1` into stage `t`.

use fixedbitset::FixedBitSet;

use crate::error::{Error, Result};
use crate::graph::{Graph, NodeIdx};
use crate::plan::{Plan, Step};

/// A frontier-advancing schedule: which nodes each stage computes and which tensors it keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    compute: Vec<FixedBitSet>,
    keep: Vec<FixedBitSet>,
}

impl Schedule {
    /// The schedule of a graph of `n` nodes that computes nothing and keeps nothing.
    pub fn empty(n: usize) -> Schedule {
        Schedule {
            compute: vec![FixedBitSet::with_capacity(n); n],
            keep: vec![FixedBitSet::with_capacity(n); n],
        }
    }

    /// Number of stages (= nodes).
    pub fn stages(&self) -> usize {
        self.compute.len()
    }

    /// Nodes computed in stage `t` (row `R[t]`).
    pub fn computes(&self, t: usize) -> &FixedBitSet {
        &self.compute[t]
    }

    /// Tensors kept from stage `t - 1` into stage `t` (row `S[t]`).
    pub fn keeps(&self, t: usize) -> &FixedBitSet {
        &self.keep[t]
    }

    /// Sets whether stage `t` computes node `i`.
    pub fn set_compute(&mut self, t: usize, i: NodeIdx, on: bool) {
        self.compute[t].set(i, on);
    }

    /// Sets whether tensor `i` is kept into stage `t`.
    pub fn set_keep(&mut self, t: usize, i: NodeIdx, on: bool) {
        self.keep[t].set(i, on);
    }

    /// The cheapest schedule that keeps exactly `keep` (the paper's Algorithm 2).
    ///
    /// `keep[t]` holds the tensors kept into stage `t`; entries for `i >= t` are errors. Every stage
    /// computes its own node, every tensor that a later stage keeps but this stage did not receive,
    /// and every input of a computed node that is neither computed nor kept ([`stage_computes`]).
    /// No cheaper `R` exists for this `S`: each of these computes is forced.
    pub fn cheapest_given_keeps(graph: &Graph, keep: Vec<FixedBitSet>) -> Result<Schedule> {
        let n = graph.len();
        if keep.len() != n {
            return Err(Error::InvalidSchedule(format!(
                "keep matrix has {} rows, the graph {} nodes",
                keep.len(),
                n
            )));
        }
        for (t, row) in keep.iter().enumerate() {
            if let Some(i) = row.ones().find(|&i| i >= t) {
                return Err(Error::InvalidSchedule(format!(
                    "stage {t} keeps {} which is not computed before stage {t}",
                    graph.label(i.min(n - 1))
                )));
            }
        }
        let mut compute = vec![FixedBitSet::with_capacity(n); n];
        let mut stack = Vec::new();
        for (t, r) in compute.iter_mut().enumerate() {
            stage_computes(graph, t, &keep[t], keep.get(t + 1), r, &mut stack);
        }
        Ok(Schedule { compute, keep })
    }

    /// Checks the frontier-advancing rules: stage `t` computes `t` and nothing after it, keeps only
    /// earlier tensors that it received or computed the stage before, and every computed node finds
    /// its inputs computed earlier in the stage or kept.
    pub fn validate(&self, graph: &Graph) -> Result<()> {
        let n = graph.len();
        if self.compute.len() != n || self.keep.len() != n {
            return Err(Error::InvalidSchedule(format!(
                "schedule has {} stages, the graph {} nodes",
                self.compute.len(),
                n
            )));
        }
        for t in 0..n {
            let (r, s) = (&self.compute[t], &self.keep[t]);
            if !r.contains(t) {
                return Err(Error::InvalidSchedule(format!(
                    "stage {t} does not compute {}",
                    graph.label(t)
                )));
            }
            if let Some(i) = r.ones().find(|&i| i > t) {
                return Err(Error::InvalidSchedule(format!(
                    "stage {t} computes {}, which is after it",
                    graph.label(i.min(n - 1))
                )));
            }
            if let Some(i) = s.ones().find(|&i| i >= t) {
                return Err(Error::InvalidSchedule(format!(
                    "stage {t} keeps {}, which is not before it",
                    graph.label(i.min(n - 1))
                )));
            }
            if t > 0 {
                let (pr, ps) = (&self.compute[t - 1], &self.keep[t - 1]);
                if let Some(i) = s.ones().find(|&i| !pr.contains(i) && !ps.contains(i)) {
                    return Err(Error::InvalidSchedule(format!(
                        "stage {t} keeps {}, which stage {} neither computed nor kept",
                        graph.label(i),
                        t - 1
                    )));
                }
            }
            for k in r.ones() {
                if let Some(&p) = graph
                    .preds(k)
                    .iter()
                    .find(|&&p| !s.contains(p) && !r.contains(p))
                {
                    return Err(Error::InvalidSchedule(format!(
                        "stage {t} computes {} but its input {} is neither kept nor computed in the stage",
                        graph.label(k),
                        graph.label(p)
                    )));
                }
            }
        }
        Ok(())
    }

    /// Sum of the costs of all computes.
    pub fn cost(&self, graph: &Graph) -> f64 {
        self.compute
            .iter()
            .flat_map(|r| r.ones())
            .map(|i| graph.node(i).cost)
            .sum()
    }

    /// The plan that runs the stages in order with eager frees (the paper's Algorithm 1).
    ///
    /// Within stage `t` the nodes of `R[t]` are computed in topological order; a tensor is freed as
    /// soon as no later compute of the stage reads it and `S[t + 1]` does not keep it, so kept
    /// tensors that the stage does not read and will not keep are freed before its first compute. A
    /// node that `R[t]` recomputes while it is already kept is not computed again. After the last
    /// stage nothing is live. Call [`Schedule::validate`] first; on an invalid schedule the plan
    /// will be rejected by the simulator.
    pub fn to_plan(&self, graph: &Graph) -> Plan {
        let n = graph.len();
        let mut steps = Vec::new();
        let mut live = FixedBitSet::with_capacity(n);
        let empty = FixedBitSet::with_capacity(n);
        // last_use[i] = last node of the current stage that reads i (usize::MAX: none).
        let mut last_use = vec![usize::MAX; n];
        for t in 0..n {
            let r = &self.compute[t];
            let next_keep = if t + 1 < n { &self.keep[t + 1] } else { &empty };
            for k in r.ones() {
                for &p in graph.preds(k) {
                    last_use[p] = k;
                }
            }
            // Tensors live from the previous stage that this one neither reads nor keeps.
            let stale: Vec<NodeIdx> = live
                .ones()
                .filter(|&i| last_use[i] == usize::MAX && !next_keep.contains(i))
                .collect();
            for i in stale {
                steps.push(Step::Free(i));
                live.set(i, false);
            }
            for k in r.ones() {
                if !live.contains(k) {
                    steps.push(Step::Compute(k));
                    live.insert(k);
                }
                for &p in graph.preds(k) {
                    if last_use[p] == k && !next_keep.contains(p) && live.contains(p) {
                        steps.push(Step::Free(p));
                        live.set(p, false);
                    }
                }
                // The output itself, when nothing later in the stage reads it and it is not kept.
                if last_use[k] == usize::MAX && !next_keep.contains(k) {
                    steps.push(Step::Free(k));
                    live.set(k, false);
                }
            }
            for k in r.ones() {
                for &p in graph.preds(k) {
                    last_use[p] = usize::MAX;
                }
            }
        }
        Plan::new(steps)
    }
}

/// Algorithm 2 for one stage: into `compute` (cleared first, `graph.len()` bits), the computes of
/// stage `t` that receives `keep` and keeps `next` into stage `t + 1` (`None` for the last): its
/// own node, every tensor of `next` it did not receive, and every input of a compute that is
/// neither received nor computed, recursively. Each is forced, so no stage with these keeps
/// computes less. `stack` is scratch space.
pub fn stage_computes(
    graph: &Graph,
    t: NodeIdx,
    keep: &FixedBitSet,
    next: Option<&FixedBitSet>,
    compute: &mut FixedBitSet,
    stack: &mut Vec<NodeIdx>,
) {
    compute.clear();
    compute.grow(graph.len());
    stack.clear();
    compute.insert(t);
    stack.push(t);
    for v in next.into_iter().flat_map(|s| s.ones()) {
        if !keep.contains(v) && !compute.contains(v) {
            compute.insert(v);
            stack.push(v);
        }
    }
    while let Some(v) = stack.pop() {
        for &p in graph.preds(v) {
            if !keep.contains(p) && !compute.contains(p) {
                compute.insert(p);
                stack.push(p);
            }
        }
    }
}
