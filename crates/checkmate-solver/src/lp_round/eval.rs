//! Stage-local evaluation of keep matrices, so that the repair and the local search can judge a
//! move in time proportional to the stages it touches instead of the whole plan.
//!
//! Stage `t` of the cheapest schedule for a keep matrix (Algorithm 2, as
//! `Schedule::cheapest_given_keeps` computes it) computes `t`, what is kept into `t + 1` but not
//! into `t`, and the inputs of those that are not kept into `t`, recursively; none of them is
//! live when the stage starts, and the tensors live then are exactly `keeps[t]`. With the frees of
//! `Schedule::to_plan` (a tensor goes after its last reader in the stage unless kept into
//! `t + 1`; one neither read nor kept goes first), the stage's computes, cost and memory moments
//! depend on `keeps[t]` and `keeps[t + 1]` alone. So a move that changes rows `a..=b` of one
//! tensor changes stages `a - 1..=b` only, and the plan's cost, peak and excess are the sums and
//! the maximum of per-stage figures. [`super::Judged::of`] checks, in debug builds, that these
//! figures are the simulator's.

use checkmate_graph::{stage_computes, Graph};
use fixedbitset::FixedBitSet;

use crate::milp::model::Facts;

/// A plan's figures as [`super::Judged`] reports them, or one stage's part of them: the cost of
/// its computes, its highest moment (live bytes right after a compute plus that compute's
/// workspace) and the sum over its computes of the bytes of that moment above the budget.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Figures {
    pub(crate) cost: f64,
    pub(crate) peak: u64,
    pub(crate) excess: u64,
}

/// Per-stage figures of a schedule, and what a move needs to judge the stages it changes.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Profile {
    pub(crate) stats: Vec<Figures>,
    /// Every stage's moments (bytes right after each compute, with its workspace), in order;
    /// stage `t`'s are `moments[offsets[t]..offsets[t + 1]]`.
    moments: Vec<u64>,
    offsets: Vec<usize>,
    /// Bytes kept into each stage.
    kept: Vec<u64>,
    /// For each tensor, the stages (ascending) that compute it or a reader of it.
    touched: Vec<Vec<u32>>,
}

/// Scratch space and per-graph facts for stage evaluations.
pub(crate) struct Evaluator {
    facts: Facts,
    /// Last reader in the stage of each tensor (`usize::MAX`: none), reset after each stage.
    last_use: Vec<usize>,
    live: FixedBitSet,
    compute: FixedBitSet,
    stack: Vec<usize>,
    /// The moments of the last stage evaluated.
    moments: Vec<u64>,
    /// Rows of a moved keep matrix.
    row: FixedBitSet,
    next_row: FixedBitSet,
}

impl Evaluator {
    pub(crate) fn new(graph: &Graph) -> Evaluator {
        let n = graph.len();
        Evaluator {
            facts: Facts::of(graph),
            last_use: vec![usize::MAX; n],
            live: FixedBitSet::with_capacity(n),
            compute: FixedBitSet::with_capacity(n),
            stack: Vec::new(),
            moments: Vec::new(),
            row: FixedBitSet::with_capacity(n),
            next_row: FixedBitSet::with_capacity(n),
        }
    }

    /// The figures of stage `t` of the cheapest schedule whose keeps into `t` and `t + 1` are
    /// `keep` and `next` (`None` for the last stage), both cleaned (`warm::clean_keeps`); its
    /// computes are left in `self.compute` and its moments in `self.moments`.
    fn stage(
        &mut self,
        graph: &Graph,
        t: usize,
        keep: &FixedBitSet,
        next: Option<&FixedBitSet>,
        kept_bytes: u64,
        budget: u64,
    ) -> Figures {
        let kept_on = |i: usize| next.is_some_and(|s| s.contains(i));
        // Algorithm 2: `t`, what is kept into `t + 1` but not into `t`, and their missing inputs.
        stage_computes(graph, t, keep, next, &mut self.compute, &mut self.stack);
        self.moments.clear();
        // `Schedule::to_plan`'s frees, step by step.
        for k in self.compute.ones() {
            for &p in graph.preds(k) {
                self.last_use[p] = k;
            }
        }
        // What is live on entry (`kept_bytes`), less what the stage neither reads nor keeps.
        self.live.clone_from(keep);
        let mut mem = kept_bytes;
        for i in ones_without(keep, next) {
            if self.last_use[i] == usize::MAX {
                self.live.set(i, false);
                mem -= graph.node(i).bytes;
            }
        }
        let mut cost = 0.0;
        for k in self.compute.ones() {
            let node = graph.node(k);
            self.live.insert(k);
            mem += node.bytes;
            self.moments.push(mem + node.workspace_bytes);
            cost += node.cost;
            for &p in graph.preds(k) {
                if self.last_use[p] == k && !kept_on(p) && self.live.contains(p) {
                    self.live.set(p, false);
                    mem -= graph.node(p).bytes;
                }
            }
            if self.last_use[k] == usize::MAX && !kept_on(k) {
                self.live.set(k, false);
                mem -= node.bytes;
            }
        }
        for k in self.compute.ones() {
            for &p in graph.preds(k) {
                self.last_use[p] = usize::MAX;
            }
        }
        let (peak, excess) = peak_excess(self.moments.iter().copied(), budget);
        Figures { cost, peak, excess }
    }

    /// The [`Profile`] of the cheapest schedule for the cleaned `keeps`.
    pub(crate) fn profile(&mut self, graph: &Graph, keeps: &[FixedBitSet], budget: u64) -> Profile {
        let n = keeps.len();
        let mut p = Profile {
            stats: Vec::with_capacity(n),
            moments: Vec::new(),
            offsets: vec![0],
            kept: keeps
                .iter()
                .map(|k| k.ones().map(|i| graph.node(i).bytes).sum())
                .collect(),
            touched: vec![Vec::new(); n],
        };
        for t in 0..n {
            let s = self.stage(graph, t, &keeps[t], keeps.get(t + 1), p.kept[t], budget);
            p.stats.push(s);
            p.moments.extend_from_slice(&self.moments);
            p.offsets.push(p.moments.len());
            for k in self.compute.ones() {
                p.touched[k].push(t as u32);
                for &q in graph.preds(k) {
                    if p.touched[q].last() != Some(&(t as u32)) {
                        p.touched[q].push(t as u32);
                    }
                }
            }
        }
        p
    }

    /// The figures of the plan for `keeps` (cleaned, with [`Profile`] `profile` and figures
    /// `totals`) after setting `i`'s keeps into stages `a..=b` to `add` (where a keep can matter:
    /// as [`super::Judged::of`] cleans them). A stage whose keeps of `i` do not change is
    /// unchanged; one that keeps `i` across it before and not after (or the reverse) and neither
    /// computes nor reads `i` has the same computes with every moment `i`'s bytes lower (higher);
    /// only the others are evaluated again.
    pub(crate) fn with_move(
        &mut self,
        graph: &Graph,
        keeps: &[FixedBitSet],
        profile: &Profile,
        totals: Figures,
        (i, a, b, add): (usize, usize, usize, bool),
        budget: u64,
    ) -> Figures {
        let n = keeps.len();
        let facts = &self.facts;
        let kept_after = |t: usize| -> bool {
            if (a..=b).contains(&t) {
                add && facts.keep_useful(t, i)
            } else {
                t < n && keeps[t].contains(i)
            }
        };
        let kept_before = |t: usize| t < n && keeps[t].contains(i);
        let (ka, kb): (Vec<bool>, Vec<bool>) = (a.saturating_sub(1)..=(b + 1))
            .map(|t| (kept_after(t), kept_before(t)))
            .unzip();
        let first = a.saturating_sub(1);
        let idx = |t: usize| t - first;
        let mut cost = totals.cost;
        let mut excess = i128::from(totals.excess);
        let mut new_peak: Vec<(usize, u64)> = Vec::new();
        let bytes = graph.node(i).bytes;
        for t in first..=b.min(n - 1) {
            let before = (kb[idx(t)], kb[idx(t + 1)]);
            let after = (ka[idx(t)], ka[idx(t + 1)]);
            if before == after {
                continue;
            }
            let old = profile.stats[t];
            let touched = profile.touched[i].binary_search(&(t as u32)).is_ok();
            let s = if !touched && before.0 == before.1 && after.0 == after.1 {
                let moments = profile.moments[profile.offsets[t]..profile.offsets[t + 1]]
                    .iter()
                    .map(|&m| if after.0 { m + bytes } else { m - bytes });
                let (peak, excess) = peak_excess(moments, budget);
                Figures {
                    cost: old.cost,
                    peak,
                    excess,
                }
            } else {
                let mut row = std::mem::take(&mut self.row);
                let mut next_row = std::mem::take(&mut self.next_row);
                row.clone_from(&keeps[t]);
                row.set(i, after.0);
                let next = (t + 1 < n).then(|| {
                    next_row.clone_from(&keeps[t + 1]);
                    next_row.set(i, after.1);
                    &next_row
                });
                let kept = match (before.0, after.0) {
                    (false, true) => profile.kept[t] + bytes,
                    (true, false) => profile.kept[t] - bytes,
                    _ => profile.kept[t],
                };
                let s = self.stage(graph, t, &row, next, kept, budget);
                self.row = row;
                self.next_row = next_row;
                s
            };
            cost += s.cost - old.cost;
            excess += i128::from(s.excess) - i128::from(old.excess);
            new_peak.push((t, s.peak));
        }
        let mut peak = 0u64;
        let mut changed = new_peak.iter().peekable();
        for (t, s) in profile.stats.iter().enumerate() {
            match changed.peek() {
                Some(&&(c, p)) if c == t => {
                    peak = peak.max(p);
                    changed.next();
                }
                _ => peak = peak.max(s.peak),
            }
        }
        Figures {
            cost,
            peak,
            excess: u64::try_from(excess).unwrap_or(0),
        }
    }
}

/// The members of `a` that are not in `b`, word by word.
fn ones_without<'a>(
    a: &'a FixedBitSet,
    b: Option<&'a FixedBitSet>,
) -> impl Iterator<Item = usize> + 'a {
    let bits = usize::BITS as usize;
    a.as_slice().iter().enumerate().flat_map(move |(w, &word)| {
        let mut m = word & !b.and_then(|b| b.as_slice().get(w)).copied().unwrap_or(0);
        std::iter::from_fn(move || {
            (m != 0).then(|| {
                let k = m.trailing_zeros() as usize;
                m &= m - 1;
                w * bits + k
            })
        })
    })
}

/// The highest of `moments` and the sum of their bytes above `budget`.
fn peak_excess(moments: impl Iterator<Item = u64>, budget: u64) -> (u64, u64) {
    moments.fold((0, 0), |(p, e), m| (p.max(m), e + m.saturating_sub(budget)))
}

#[cfg(test)]
mod tests {
    use super::super::Judged;
    use super::*;
    use checkmate_graph::generate::{random_layered, LayeredParams};
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// Random keep matrices and random moves on random layered graphs (workspaces included): the
    /// figures judged from the changed stages are the simulator's for the moved matrix.
    #[test]
    fn moves_judged_from_their_stages_match_the_simulator() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let mut checked = 0;
        for seed in 0..12 {
            let mut g = random_layered(&LayeredParams::moccasin(30 + 5 * seed as usize, 0.3), seed)
                .unwrap();
            if seed % 2 == 1 {
                let mut specs = g.to_specs();
                for (v, s) in specs.iter_mut().enumerate() {
                    s.workspace_bytes = (v as u64 % 3) * 7;
                }
                g = Graph::new(g.name(), g.cost_unit(), 0, specs).unwrap();
            }
            let n = g.len();
            let budget = rng.gen_range(0..2 * g.nodes().iter().map(|v| v.bytes).sum::<u64>() / 3);
            let keeps: Vec<FixedBitSet> = (0..n)
                .map(|t| {
                    let mut r = FixedBitSet::with_capacity(n);
                    for i in 0..t {
                        if rng.gen_bool(0.3) {
                            r.insert(i);
                        }
                    }
                    r
                })
                .collect();
            let cur = Judged::of(&g, keeps, budget).unwrap();
            let mut ev = Evaluator::new(&g);
            assert_eq!(ev.profile(&g, &cur.keeps, budget), cur.profile);
            for _ in 0..40 {
                let i = rng.gen_range(0..n - 1);
                let a = rng.gen_range(i + 1..n);
                let b = rng.gen_range(a..n);
                let mv = (i, a, b, rng.gen_bool(0.5));
                let f = cur.figures_after(&g, &mut ev, mv, budget);
                let j = cur.after(&g, mv, budget).unwrap();
                assert_eq!(
                    (f.peak, f.excess),
                    (j.peak, j.excess),
                    "seed {seed}, {mv:?}"
                );
                assert!(
                    (f.cost - j.cost).abs() <= 1e-9 * (1.0 + j.cost),
                    "seed {seed}, {mv:?}"
                );
                checked += 1;
            }
        }
        assert_eq!(checked, 480);
    }
}
