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

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

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
    /// Every stage's computes, in order; stage `t`'s are `computes[starts[t]..starts[t + 1]]`.
    computes: Vec<u32>,
    starts: Vec<usize>,
    /// The budget the excesses are measured against.
    budget: u64,
    /// Bytes kept into each stage.
    kept: Vec<u64>,
    /// For each tensor, the stages (ascending) that compute it or a reader of it.
    touched: Vec<Vec<u32>>,
    /// `before[t]`: the highest peak of stages `..t`; `from[t]`: of stages `t..` (one more
    /// entry each, 0 for no stage), so a move's peak needs only the stages it changes.
    before: Vec<u64>,
    from: Vec<u64>,
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
    /// Stage figures of earlier moves, when switched on ([`Evaluator::remembering`]).
    memo: Option<Memo>,
}

/// Stage figures after a change of one tensor's keeps, remembered while the rows they depend on
/// stand. Stage `t`'s figures after setting tensor `i`'s keeps into `t` and `t + 1` depend on
/// rows `t` and `t + 1` of the keep matrix alone (module doc), so a repair that tries the same
/// keep runs round after round, while each chosen move changes a few rows, evaluates each stage
/// once per change of its rows instead of once per try.
struct Memo {
    /// The budget the excesses were measured against.
    budget: u64,
    /// The keep matrix moves are judged against now ([`Evaluator::sync`]).
    base: Vec<FixedBitSet>,
    /// Per stage, how many times its rows changed ([`Evaluator::sync`]).
    epoch: Vec<u32>,
    /// `(i, t, kept into t, kept into t + 1)` ([`memo_key`]) to the stage's epoch then and its
    /// figures.
    figures: HashMap<u64, (u32, Figures), BuildHasherDefault<MixHasher>>,
    /// Stages answered from `figures` so far.
    hits: usize,
}

/// The memo's key of stage `t`'s figures with `i` kept into `t` and `t + 1` as `kept` says.
fn memo_key(i: usize, t: usize, kept: (bool, bool)) -> u64 {
    ((i as u64) << 34) | ((t as u64) << 2) | (u64::from(kept.0) << 1) | u64::from(kept.1)
}

/// A hasher for the memo's integer keys: one multiply-xorshift, no SipHash (the lookups are a
/// hot path of the repair and the keys are not attacker-controlled).
#[derive(Default)]
struct MixHasher(u64);

impl Hasher for MixHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    fn write_u64(&mut self, x: u64) {
        let h = (self.0 ^ x).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 = h ^ (h >> 32);
    }
}

/// Remembered stage figures beyond which the memo starts again (about 40 MB).
const MEMO_CAP: usize = 1 << 20;

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
            memo: None,
        }
    }

    /// An evaluator that remembers the stage figures of the moves it judges, for a caller that
    /// judges moves against one keep matrix after another and reports each new matrix with
    /// [`Evaluator::sync`] before judging against it.
    pub(crate) fn remembering(graph: &Graph, budget: u64) -> Evaluator {
        let mut ev = Evaluator::new(graph);
        ev.memo = Some(Memo {
            budget,
            base: Vec::new(),
            epoch: vec![0; graph.len()],
            figures: HashMap::default(),
            hits: 0,
        });
        ev
    }

    /// Moves are judged against `keeps` from now on: forgets the remembered figures of the stages
    /// whose rows differ from the previous matrix's (stage `t` depends on rows `t` and `t + 1`).
    pub(crate) fn sync(&mut self, keeps: &[FixedBitSet]) {
        let Some(memo) = &mut self.memo else {
            return;
        };
        if memo.base.len() != keeps.len() {
            memo.base = keeps.to_vec();
            memo.epoch.iter_mut().for_each(|e| *e += 1);
            return;
        }
        for (t, (o, n)) in memo.base.iter_mut().zip(keeps).enumerate() {
            if o != n {
                o.clone_from(n);
                memo.epoch[t] += 1;
                if t > 0 {
                    memo.epoch[t - 1] += 1;
                }
            }
        }
    }

    /// The remembered figures under `key` of stage `t`, if its rows have not changed since.
    fn remembered(&mut self, key: u64, t: usize, budget: u64) -> Option<Figures> {
        let m = self.memo.as_mut()?;
        debug_assert_eq!(
            m.budget, budget,
            "a remembering evaluator serves one budget"
        );
        let f = m
            .figures
            .get(&key)
            .filter(|(epoch, _)| *epoch == m.epoch[t])
            .map(|&(_, f)| f);
        m.hits += usize::from(f.is_some());
        f
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
    #[cfg(test)]
    pub(crate) fn profile(&mut self, graph: &Graph, keeps: &[FixedBitSet], budget: u64) -> Profile {
        self.profile_near(graph, keeps, budget, None)
    }

    /// [`Evaluator::profile`], taking the figures of each stage whose rows (`t` and `t + 1`) are
    /// those of `base`'s keeps from `base`'s profile (measured against the same budget) instead
    /// of evaluating the stage again: the plan after a move differs from the plan before it in a
    /// few stages only.
    pub(crate) fn profile_near(
        &mut self,
        graph: &Graph,
        keeps: &[FixedBitSet],
        budget: u64,
        base: Option<(&[FixedBitSet], &Profile)>,
    ) -> Profile {
        let n = keeps.len();
        let base = base.filter(|(k, p)| k.len() == n && p.budget == budget);
        let same_row = |t: usize| t >= n || base.is_some_and(|(k, _)| k[t] == keeps[t]);
        let mut p = Profile {
            stats: Vec::with_capacity(n),
            moments: Vec::new(),
            offsets: vec![0],
            computes: Vec::new(),
            starts: vec![0],
            budget,
            kept: (0..n)
                .map(|t| match base {
                    Some((_, b)) if same_row(t) => b.kept[t],
                    _ => keeps[t].ones().map(|i| graph.node(i).bytes).sum(),
                })
                .collect(),
            touched: vec![Vec::new(); n],
            before: Vec::new(),
            from: Vec::new(),
        };
        for t in 0..n {
            match base {
                Some((_, b)) if same_row(t) && same_row(t + 1) => {
                    p.stats.push(b.stats[t]);
                    p.moments
                        .extend_from_slice(&b.moments[b.offsets[t]..b.offsets[t + 1]]);
                    p.computes
                        .extend_from_slice(&b.computes[b.starts[t]..b.starts[t + 1]]);
                }
                _ => {
                    let s = self.stage(graph, t, &keeps[t], keeps.get(t + 1), p.kept[t], budget);
                    p.stats.push(s);
                    p.moments.extend_from_slice(&self.moments);
                    p.computes.extend(self.compute.ones().map(|k| k as u32));
                }
            }
            p.offsets.push(p.moments.len());
            p.starts.push(p.computes.len());
            for &k in &p.computes[p.starts[t]..] {
                let k = k as usize;
                p.touched[k].push(t as u32);
                for &q in graph.preds(k) {
                    if p.touched[q].last() != Some(&(t as u32)) {
                        p.touched[q].push(t as u32);
                    }
                }
            }
        }
        p.before = std::iter::once(0)
            .chain(p.stats.iter().scan(0, |m, s| {
                *m = s.peak.max(*m);
                Some(*m)
            }))
            .collect();
        p.from = vec![0; n + 1];
        for t in (0..n).rev() {
            p.from[t] = p.from[t + 1].max(p.stats[t].peak);
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
        debug_assert!(
            self.memo.as_ref().map_or(true, |m| m.base == keeps),
            "moves judged against a keep matrix the evaluator was not synced to"
        );
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
            } else if let Some(f) = self.remembered(memo_key(i, t, after), t, budget) {
                f
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
                if let Some(m) = &mut self.memo {
                    if m.figures.len() >= MEMO_CAP {
                        m.figures.clear();
                    }
                    m.figures.insert(memo_key(i, t, after), (m.epoch[t], s));
                }
                s
            };
            cost += s.cost - old.cost;
            excess += i128::from(s.excess) - i128::from(old.excess);
            new_peak.push((t, s.peak));
        }
        // Stages outside `first..=b` keep their peaks; inside, the unchanged ones too.
        let last = b.min(n - 1);
        let mut peak = profile.before[first].max(profile.from[last + 1]);
        let mut changed = new_peak.iter().peekable();
        for t in first..=last {
            match changed.peek() {
                Some(&&(c, p)) if c == t => {
                    peak = peak.max(p);
                    changed.next();
                }
                _ => peak = peak.max(profile.stats[t].peak),
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

    /// A keep matrix of `n` stages keeping each earlier tensor with probability 0.3.
    fn random_keeps(n: usize, rng: &mut ChaCha8Rng) -> Vec<FixedBitSet> {
        (0..n)
            .map(|t| {
                let mut r = FixedBitSet::with_capacity(n);
                for i in 0..t {
                    if rng.gen_bool(0.3) {
                        r.insert(i);
                    }
                }
                r
            })
            .collect()
    }

    /// A random move on `n` stages: a tensor, a run of stages after it, kept or dropped.
    fn random_move(n: usize, rng: &mut ChaCha8Rng) -> super::super::Move {
        let i = rng.gen_range(0..n - 1);
        let a = rng.gen_range(i + 1..n);
        let b = rng.gen_range(a..n);
        (i, a, b, rng.gen_bool(0.5))
    }

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
            let keeps = random_keeps(n, &mut rng);
            let cur = Judged::of(&g, keeps, budget).unwrap();
            let mut ev = Evaluator::new(&g);
            assert_eq!(ev.profile(&g, &cur.keeps, budget), cur.profile);
            for _ in 0..40 {
                let mv = random_move(n, &mut rng);
                let f = cur.figures_after(&g, &mut ev, mv, budget);
                let j = cur.after(&g, mv, budget).unwrap();
                assert_eq!(
                    j.profile,
                    ev.profile(&g, &j.keeps, budget),
                    "seed {seed}, {mv:?}"
                );
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

    /// A remembering evaluator synced to a keep matrix that changes by moves (as in the repair)
    /// judges every move as a fresh evaluator does, answering many stages from its memo.
    #[test]
    fn remembered_stage_figures_follow_the_changing_matrix() {
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        let mut hits = 0;
        for seed in 0..6 {
            let g = random_layered(&LayeredParams::moccasin(40 + 10 * seed as usize, 0.3), seed)
                .unwrap();
            let n = g.len();
            let budget = g.nodes().iter().map(|v| v.bytes).sum::<u64>() / 3;
            let keeps = random_keeps(n, &mut rng);
            let mut cur = Judged::of(&g, keeps, budget).unwrap();
            let mut memo = Evaluator::remembering(&g, budget);
            let pool: Vec<_> = (0..8).map(|_| random_move(n, &mut rng)).collect();
            for round in 0..60 {
                memo.sync(&cur.keeps);
                for &mv in &pool {
                    let remembered = cur.figures_after(&g, &mut memo, mv, budget);
                    let fresh = cur.figures_after(&g, &mut Evaluator::new(&g), mv, budget);
                    assert_eq!(remembered, fresh, "seed {seed}, round {round}, {mv:?}");
                }
                // The matrix moves on, as after a repair's chosen move.
                cur = cur.after(&g, random_move(n, &mut rng), budget).unwrap();
            }
            hits += memo.memo.as_ref().unwrap().hits;
        }
        assert!(hits > 1000, "only {hits} stages answered from the memo");
    }
}
