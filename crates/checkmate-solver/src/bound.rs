//! A lower bound on plan cost that scales to graphs whose stage model is too large to build: the
//! stage-cover relaxation.
//!
//! Every plan of the stage model (nodes first computed in graph order, the plans of every strategy
//! here) computes node `t` for the first time at some moment, and at that moment its inputs, its
//! output and its workspace are in memory together with every earlier tensor that is kept for a
//! later first compute. Split each tensor's life at the first computes of its readers into
//! segments; a tensor that is not in memory at the first compute of a node `t` strictly inside one
//! of its segments must be computed again before the segment's end, and segments are disjoint, so
//! each segment dropped somewhere costs at least one more compute of the tensor. Choosing which
//! segments to drop so that every stage fits the budget is a covering problem over intervals; its
//! LP relaxation (coefficients capped at the stage's excess, a valid strengthening for binaries)
//! has one column per segment and one row per stage over budget, small enough for HiGHS at
//! thousands of nodes where the stage model has millions of columns.
//!
//! Recomputation cascades: a dropped segment's recomputation needs the tensor's inputs, and an
//! input that nothing reads any more (its last reader ran before the segment) must be computed
//! again or kept past its last reader, which costs memory at the stages in between; that
//! input's own recomputation needs its inputs in turn. The cascade MILP ([`cascade_bound`]) adds
//! those choices to the covering problem (a binary per dead input recomputed, a binary per
//! input kept alive through a stage), still one row per stage. It raises the bound on
//! forward-only graphs (a 100-node random layered graph at 0.7 of its checkpoint-all peak:
//! +13.6% over one compute per node against +8.3% without it; docs/FORMULATION.md, "Scale");
//! on training graphs the forward tensors are kept for the backward pass, so there is little to
//! add. What it still ignores: the memory of the recomputations themselves, and that a tensor
//! recomputed once may be needed again later.

use std::time::Instant;

use checkmate_graph::Graph;
use highs::{HighsModelStatus, RowProblem, Sense};

use crate::Result;

/// Name in HiGHS errors.
const NAME: &str = "milp";

/// One segment of a tensor's life: `tensor` kept across the first computes of nodes
/// `first..=last` (no reader of it among them).
struct Segment {
    tensor: usize,
    first: usize,
    last: usize,
}

/// What the stage-cover relaxation proves at one budget.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum StageCover {
    /// Every plan of the stage model within the budget costs at least this much (the graph's
    /// total cost plus the relaxation's least recomputation cost).
    Bound(f64),
    /// No plan of the stage model fits: some node's first compute needs more than the budget
    /// even with every other tensor dropped.
    Infeasible,
}

/// The stage-cover lower bound (see the module doc) at `budget_bytes` of activation memory. The
/// LP gets until `deadline`; if it does not solve by then, the best single-stage bound (a
/// fractional knapsack per stage, computed in closed form) is returned instead.
pub fn stage_cover_bound(
    graph: &Graph,
    budget_bytes: u64,
    deadline: Option<Instant>,
) -> Result<StageCover> {
    stage_cover(graph, budget_bytes, deadline, true)
}

/// [`stage_cover_bound`], with or without its cascade MILP.
pub(crate) fn stage_cover(
    graph: &Graph,
    budget_bytes: u64,
    deadline: Option<Instant>,
    with_cascades: bool,
) -> Result<StageCover> {
    let n = graph.len();
    let base = graph.total_cost();
    // Segments, and the bytes each stage must hold.
    let mut segments = Vec::new();
    // Bytes kept across each stage, as differences between consecutive stages.
    let mut live = vec![0i128; n + 1];
    for i in 0..n {
        let mut readers: Vec<usize> = graph.succs(i).to_vec();
        readers.sort_unstable();
        let mut from = i;
        for &r in &readers {
            if r > from + 1 {
                segments.push(Segment {
                    tensor: i,
                    first: from + 1,
                    last: r - 1,
                });
                live[from + 1] += i128::from(graph.node(i).bytes);
                live[r] -= i128::from(graph.node(i).bytes);
            }
            from = r;
        }
    }
    let mut excess = vec![0u64; n];
    // The same, signed (negative: room left at that stage).
    let mut signed = vec![0i128; n];
    let mut kept = 0i128;
    for t in 0..n {
        kept += live[t];
        let node = graph.node(t);
        let fixed = node.bytes
            + node.workspace_bytes
            + graph
                .preds(t)
                .iter()
                .map(|&p| graph.node(p).bytes)
                .sum::<u64>();
        if fixed > budget_bytes {
            return Ok(StageCover::Infeasible);
        }
        signed[t] = kept + i128::from(fixed) - i128::from(budget_bytes);
        excess[t] = u64::try_from(signed[t]).unwrap_or(0);
    }
    let over: Vec<usize> = (0..n).filter(|&t| excess[t] > 0).collect();
    if over.is_empty() {
        return Ok(StageCover::Bound(base));
    }
    // Segments that cover each stage over budget, for the closed-form bound and the rows.
    let mut covering: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (k, s) in segments.iter().enumerate() {
        for t in s.first..=s.last {
            if excess[t] > 0 {
                covering[t].push(k);
            }
        }
    }
    let cost = |k: usize| graph.node(segments[k].tensor).cost;
    let bytes = |k: usize| graph.node(segments[k].tensor).bytes;
    let mut single = 0.0f64;
    for &t in &over {
        let e = excess[t];
        let mut items: Vec<(f64, u64)> = covering[t]
            .iter()
            .map(|&k| (cost(k), bytes(k).min(e)))
            .filter(|&(_, b)| b > 0)
            .collect();
        items.sort_by(|a, b| (a.0 * b.1 as f64).total_cmp(&(b.0 * a.1 as f64)));
        let (mut need, mut c) = (e, 0.0);
        for (ci, bi) in items {
            if need == 0 {
                break;
            }
            let take = bi.min(need);
            c += ci * take as f64 / bi as f64;
            need -= take;
        }
        // The segments across a stage hold all its kept bytes, and its excess is at most those
        // (its own bytes fit the budget, checked above): dropping them all always covers it.
        debug_assert_eq!(need, 0, "stage {t}: the kept bytes do not cover the excess");
        single = single.max(c);
    }
    let lp = cover_lp(&segments, &covering, &over, &excess, graph, deadline, false)?;
    // The covering problem itself (binaries) where time is left: its dual bound is at least the
    // LP's (ResNet50 at 0.5: 6080 against 6036 extra, in milliseconds).
    let ip = cover_lp(&segments, &covering, &over, &excess, graph, deadline, true)?;
    let cascade = if with_cascades {
        cascade_bound(&segments, &excess, &signed, graph, deadline)?
    } else {
        None
    };
    tracing::debug!(single, ?lp, ?ip, ?cascade, "stage cover");
    // HiGHS's optimum is feasible to within its tolerances; a relative margin keeps the bound
    // below the true LP optimum.
    let extra = lp
        .into_iter()
        .chain(ip)
        .chain(cascade)
        .map(|v| v * (1.0 - 1e-7))
        .fold(single, f64::max);
    Ok(StageCover::Bound(base + extra))
}

/// The covering LP's optimum (extra cost), or `None` if HiGHS did not solve it by `deadline`.
fn cover_lp(
    segments: &[Segment],
    covering: &[Vec<usize>],
    over: &[usize],
    excess: &[u64],
    graph: &Graph,
    deadline: Option<Instant>,
    integer: bool,
) -> Result<Option<f64>> {
    let used: Vec<bool> = {
        let mut u = vec![false; segments.len()];
        for &t in over {
            for &k in &covering[t] {
                u[k] = true;
            }
        }
        u
    };
    let cmax = segments
        .iter()
        .enumerate()
        .filter(|&(k, _)| used[k])
        .map(|(_, s)| graph.node(s.tensor).cost)
        .fold(0.0, f64::max);
    if cmax <= 0.0 {
        return Ok(Some(0.0));
    }
    let Some(_guard) = crate::milp::run::highs_lock(deadline) else {
        return Ok(None);
    };
    let mut pb = RowProblem::default();
    let cols: Vec<Option<highs::Col>> = segments
        .iter()
        .enumerate()
        .map(|(k, s)| {
            used[k].then(|| {
                let c = graph.node(s.tensor).cost / cmax;
                if integer {
                    pb.add_integer_column(c, 0.0..=1.0)
                } else {
                    pb.add_column(c, 0.0..=1.0)
                }
            })
        })
        .collect();
    for &t in over {
        pb.add_row(
            1.0..,
            capped_row(&covering[t], excess[t], segments, &cols, graph),
        );
    }
    let Some(solved) = solve_until(pb, deadline)? else {
        return Ok(None);
    };
    if solved.status() == HighsModelStatus::Optimal && !integer {
        return Ok(Some(solved.objective_value() * cmax));
    }
    if integer {
        return Ok(mip_dual_bound(&solved).map(|d| d * cmax));
    }
    Ok(None)
}

/// The covering row of a stage with `excess` bytes over the budget, normalized to `>= 1`: each
/// segment across it (`covering`, with its column in `cols`) drops its bytes, capped at the
/// excess (valid for binaries).
fn capped_row(
    covering: &[usize],
    excess: u64,
    segments: &[Segment],
    cols: &[Option<highs::Col>],
    graph: &Graph,
) -> Vec<(highs::Col, f64)> {
    let e = excess as f64;
    covering
        .iter()
        .filter_map(|&k| {
            let b = graph.node(segments[k].tensor).bytes as f64;
            cols[k].map(|c| (c, b.min(e) / e))
        })
        .collect()
}

/// Most kept-alive terms (non-zeros of the memory rows) the cascade MILP is built with.
const MAX_ALIVE_TERMS: usize = 4_000_000;

/// The stage-cover MILP with recomputation cascades: its dual bound on the extra cost by
/// `deadline`, `None` where no recomputation needs a tensor past its last reader (training
/// graphs, whose forward inputs are kept for the backward pass) or HiGHS has no bound.
///
/// A dropped segment of tensor `i` (kept across stages `a..=b`) is recomputed in some stage
/// `s` in `a+1..=b+1`, and every input `j` of `i` must be in memory then. If nothing reads `j`
/// after stage `L_j < a` (its last reader), then either `j` is computed again after `L_j`
/// (`y_j`, at least `cost(j)`), or it stays in memory from `L_j` on without a recompute, so at the
/// first compute of every stage `L_j+1..=a` (`E[j, a]`, its bytes counted in those stages' rows):
/// `x_seg <= y_j + E[j, a]`. Likewise a recompute of `j` (after `L_j`) needs each input `k` with
/// `L_k < L_j`: `y_j <= y_k + E[k, L_j]`, so the cascade goes down to the sources. `E[j, a]`
/// implies `E[j, a']` for `a' < a` (a tensor kept through `a` was kept through `a'`). Each stage's
/// first compute is the last compute of its stage, so "in memory at the end of stage `t`" is
/// "in memory at its first compute"; the memory of the recomputations themselves is still not
/// counted, so this stays a relaxation of every plan of the stage model.
fn cascade_bound(
    segments: &[Segment],
    excess: &[u64],
    signed: &[i128],
    graph: &Graph,
    deadline: Option<Instant>,
) -> Result<Option<f64>> {
    use std::collections::{BTreeSet, HashMap};
    let n = graph.len();
    // Last reader of each tensor (its last stage in memory without a recompute).
    let last: Vec<Option<usize>> = (0..n)
        .map(|i| graph.succs(i).iter().copied().max())
        .collect();
    // Inputs of `v` that are dead (no reader) after stage `before - 1`, i.e. `L_j < before`.
    let dead_inputs = |v: usize, before: usize| -> Vec<usize> {
        let mut js: Vec<usize> = graph
            .preds(v)
            .iter()
            .copied()
            .filter(|&j| last[j].is_some_and(|l| l < before))
            .collect();
        js.sort_unstable();
        js.dedup();
        js
    };
    // Pairs (segment, dead input, the segment's first stage), then the `y` closure.
    let mut pairs: Vec<(usize, usize, usize)> = Vec::new(); // (segment, j, a)
    for (k, seg) in segments.iter().enumerate() {
        for j in dead_inputs(seg.tensor, seg.first) {
            pairs.push((k, j, seg.first));
        }
    }
    if pairs.is_empty() {
        return Ok(None);
    }
    let mut y_needed: Vec<bool> = vec![false; n];
    let mut work: Vec<usize> = Vec::new();
    for &(_, j, _) in &pairs {
        if !y_needed[j] {
            y_needed[j] = true;
            work.push(j);
        }
    }
    let mut chains: Vec<(usize, usize, usize)> = Vec::new(); // y_j <= y_k + E[k, L_j]
    while let Some(j) = work.pop() {
        let lj = last[j].expect("an input has a reader");
        for k in dead_inputs(j, lj) {
            chains.push((j, k, lj));
            if !y_needed[k] {
                y_needed[k] = true;
                work.push(k);
            }
        }
    }
    // E variables per tensor, at the stages named.
    let mut e_at: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); n];
    for &(_, j, a) in &pairs {
        e_at[j].insert(a);
    }
    for &(_, k, l) in &chains {
        e_at[k].insert(l);
    }
    // Stages whose row the LP gets: over budget, or reachable by a kept-alive tensor whose bytes
    // could take it over.
    let mut rows_at: Vec<bool> = excess.iter().map(|&e| e > 0).collect();
    let mut extra_room: Vec<i128> = vec![0; n];
    let mut alive_terms = 0usize;
    for j in 0..n {
        if let (Some(&top), Some(l)) = (e_at[j].iter().next_back(), last[j]) {
            for room in &mut extra_room[l + 1..=top] {
                *room += i128::from(graph.node(j).bytes);
            }
            alive_terms += top - l;
        }
    }
    // Building the model is not bounded by the deadline: past this size, no cascade MILP (the
    // 1000-node random layered graphs have about 0.3M).
    if alive_terms > MAX_ALIVE_TERMS {
        tracing::debug!(alive_terms, "cascade MILP too large; skipped");
        return Ok(None);
    }
    for t in 0..n {
        if signed[t] + extra_room[t] > 0 && extra_room[t] > 0 {
            rows_at[t] = true;
        }
    }
    let mut covering: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut used = vec![false; segments.len()];
    for (k, s) in segments.iter().enumerate() {
        for t in s.first..=s.last {
            if rows_at[t] {
                covering[t].push(k);
                used[k] = true;
            }
        }
    }
    let cmax = graph.nodes().iter().map(|v| v.cost).fold(0.0, f64::max);
    let bmax = graph
        .nodes()
        .iter()
        .map(|v| v.bytes)
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    if cmax <= 0.0 {
        return Ok(Some(0.0));
    }
    let Some(_guard) = crate::milp::run::highs_lock(deadline) else {
        return Ok(None);
    };
    let mut pb = RowProblem::default();
    let x: Vec<Option<highs::Col>> = segments
        .iter()
        .enumerate()
        .map(|(k, s)| {
            used[k].then(|| pb.add_integer_column(graph.node(s.tensor).cost / cmax, 0.0..=1.0))
        })
        .collect();
    let y: Vec<Option<highs::Col>> = (0..n)
        .map(|j| y_needed[j].then(|| pb.add_integer_column(graph.node(j).cost / cmax, 0.0..=1.0)))
        .collect();
    let mut e: HashMap<(usize, usize), highs::Col> = HashMap::new();
    for (j, stages) in e_at.iter().enumerate() {
        let mut prev: Option<highs::Col> = None;
        // Descending stages: E[j, a] <= E[j, a'] for a' < a.
        for &a in stages.iter().rev() {
            let c = pb.add_integer_column(0.0, 0.0..=1.0);
            if let Some(p) = prev {
                pb.add_row(0.0.., [(c, 1.0), (p, -1.0)]);
            }
            prev = Some(c);
            e.insert((j, a), c);
        }
    }
    for &(k, j, a) in &pairs {
        if let Some(xk) = x[k] {
            let yj = y[j].expect("needed");
            pb.add_row(0.0.., [(yj, 1.0), (e[&(j, a)], 1.0), (xk, -1.0)]);
        }
    }
    for &(j, k, l) in &chains {
        let (yj, yk) = (y[j].expect("needed"), y[k].expect("needed"));
        pb.add_row(0.0.., [(yk, 1.0), (e[&(k, l)], 1.0), (yj, -1.0)]);
    }
    // Kept-alive tensors in memory at each stage: the E of the least named stage at or after it.
    let mut alive_at: Vec<Vec<(usize, highs::Col)>> = vec![Vec::new(); n];
    for j in 0..n {
        let Some(l) = last[j] else { continue };
        let mut from = l + 1;
        for &a in &e_at[j] {
            for t in from..=a {
                if rows_at[t] {
                    alive_at[t].push((j, e[&(j, a)]));
                }
            }
            from = a + 1;
        }
    }
    let mut nnz = 0usize;
    let mut rows = 0usize;
    for t in 0..n {
        if !rows_at[t] {
            continue;
        }
        // Bytes dropped >= excess + bytes kept alive.
        let mut row: Vec<(highs::Col, f64)> = covering[t]
            .iter()
            .filter_map(|&k| x[k].map(|c| (c, graph.node(segments[k].tensor).bytes as f64 / bmax)))
            .collect();
        row.extend(
            alive_at[t]
                .iter()
                .map(|&(j, c)| (c, -(graph.node(j).bytes as f64) / bmax)),
        );
        nnz += row.len();
        rows += 1;
        pb.add_row((signed[t] as f64 / bmax).., &row);
        // Where the stage is over budget anyway, the capped covering row of the plain LP too.
        if excess[t] > 0 {
            pb.add_row(
                1.0..,
                capped_row(&covering[t], excess[t], segments, &x, graph),
            );
        }
    }
    tracing::debug!(
        pairs = pairs.len(),
        chains = chains.len(),
        e = e.len(),
        rows,
        nnz,
        "cascade MILP"
    );
    let Some(solved) = solve_until(pb, deadline)? else {
        return Ok(None);
    };
    let d = mip_dual_bound(&solved).map(|d| d * cmax);
    tracing::debug!(status = ?solved.status(), bound = ?d, "cascade MILP");
    Ok(d)
}

/// Solves `pb` (minimising, one thread) until `deadline`; `None` when no time is left for it.
fn solve_until(pb: RowProblem, deadline: Option<Instant>) -> Result<Option<highs::SolvedModel>> {
    let mut hm = pb.try_optimise(Sense::Minimise).map_err(|e| {
        crate::milp::run::solver_error(NAME, format!("HiGHS rejected the model: {e:?}"))
    })?;
    use crate::milp::run::set_option;
    set_option(&mut hm, NAME, "threads", 1)?;
    if let Some(d) = deadline {
        let left = d.saturating_duration_since(Instant::now()).as_secs_f64();
        if left < 0.05 {
            return Ok(None);
        }
        set_option(&mut hm, NAME, "time_limit", left)?;
    }
    let solved = hm
        .try_solve()
        .map_err(|e| crate::milp::run::solver_error(NAME, format!("HiGHS failed: {e:?}")))?;
    Ok(Some(solved))
}

/// A MILP's dual bound, proven whether or not it finished (`None` where HiGHS has none).
fn mip_dual_bound(solved: &highs::SolvedModel) -> Option<f64> {
    let d = solved
        .double_info_value(c"mip_dual_bound")
        .unwrap_or(f64::NEG_INFINITY);
    d.is_finite().then_some(d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SolveOptions;
    use checkmate_graph::generate::{random_layered, LayeredParams};

    fn extra(g: &Graph, budget: u64, cascades: bool) -> f64 {
        match stage_cover(g, budget, None, cascades).unwrap() {
            StageCover::Bound(b) => b - g.total_cost(),
            StageCover::Infeasible => f64::INFINITY,
        }
    }

    /// On forward-only random layered graphs (where recomputing a tensor needs inputs nothing
    /// else reads any more), the cascade MILP stays below the optimum HiGHS proves on the whole
    /// stage model (`solve_milp` alone: `milp` itself trusts this bound) and raises the bound at
    /// some budgets.
    #[test]
    fn cascades_raise_the_bound_and_stay_below_the_optimum() {
        let options = SolveOptions {
            threads: 1,
            ..SolveOptions::default()
        };
        let (mut compared, mut raised) = (0, 0);
        for seed in 0..8 {
            let g = random_layered(&LayeredParams::moccasin(20, 0.3), seed).unwrap();
            let all = crate::baselines::CheckpointAll::peak_bytes(&g);
            for frac in [0.7, 0.8, 0.9] {
                let budget = (all as f64 * frac) as u64;
                let (plain, with) = (extra(&g, budget, false), extra(&g, budget, true));
                assert!(
                    with >= plain - 1e-6,
                    "seed {seed} at {frac}: {with} < {plain}"
                );
                let res = crate::milp::solve_milp(&g, budget, &options, None, None, None).unwrap();
                let opt = match (res.status, res.best) {
                    (crate::milp::run::RunStatus::Optimal, Some(b)) => b.cost - g.total_cost(),
                    (crate::milp::run::RunStatus::Infeasible, _) => {
                        assert!(with.is_infinite() || plain <= with, "seed {seed} at {frac}");
                        continue;
                    }
                    other => panic!("seed {seed} at {frac}: {other:?}"),
                };
                assert!(
                    with <= opt + 1e-6 * (1.0 + opt),
                    "seed {seed} at {frac}: cascade bound {with} above the optimum {opt}"
                );
                compared += 1;
                if with > plain + 1e-6 {
                    raised += 1;
                }
            }
        }
        assert!(compared >= 15, "only {compared} optima compared");
        assert!(
            raised >= 3,
            "cascades raised the bound at only {raised} budgets"
        );
    }
}
