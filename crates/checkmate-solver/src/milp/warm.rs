//! Converting between schedules, plans and model vectors: warm starts and solution extraction.

use checkmate_graph::{choose_implementations, simulate, Graph, Plan, Schedule, Step};
use fixedbitset::FixedBitSet;

use crate::milp::model::{ColKind, Facts, Model, Var};

/// Keeps that can matter: `S[t, i]` only while some consumer of `i` runs at stage `t` or later.
pub(crate) fn clean_keeps(graph: &Graph, keep: &[FixedBitSet]) -> Vec<FixedBitSet> {
    let facts = Facts::of(graph);
    let n = graph.len();
    (0..n)
        .map(|t| {
            let mut row = FixedBitSet::with_capacity(n);
            for i in keep[t].ones() {
                if facts.keep_useful(t, i) {
                    row.insert(i);
                }
            }
            row
        })
        .collect()
}

/// The cheapest schedule for the useful part of `keep` (Algorithm 2 after [`clean_keeps`]).
pub(crate) fn schedule_for_keeps(graph: &Graph, keep: &[FixedBitSet]) -> Schedule {
    Schedule::cheapest_given_keeps(graph, clean_keeps(graph, keep))
        .expect("clean keeps only hold tensors computed before their stage")
}

/// The cheapest schedule for `keep` without unused keeps ([`schedule_for_keeps`], then
/// [`without_unused_keeps`]): what `milp` makes of every plan it keeps as an incumbent or returns.
pub(crate) fn cleaned_schedule(graph: &Graph, keep: &[FixedBitSet]) -> Schedule {
    without_unused_keeps(graph, &schedule_for_keeps(graph, keep))
}

/// `schedule` without unused keeps: Algorithm 2 again without them, until none is left (dropping
/// one can make a compute of the stage before, and so a keep into it, unused). It never costs more
/// nor peaks higher, and the default formulation's rows (rule 7) require it of a warm start.
/// (The simulator frees an unused keep before the stage's first compute, but the compute that
/// made it may be dropped too. `lp-round` judges its many candidates without this step, which
/// would double their cost, and cleans only the plan it returns.)
pub(crate) fn without_unused_keeps(graph: &Graph, schedule: &Schedule) -> Schedule {
    let mut schedule = schedule.clone();
    // Each round drops keeps, so this ends.
    while let Some(fewer) = drop_unused_keeps(graph, &schedule) {
        schedule = Schedule::cheapest_given_keeps(graph, fewer)
            .expect("dropping unused keeps leaves valid keeps");
    }
    schedule
}

/// The keeps of `schedule` without those that no compute of their stage reads and that are not
/// kept into the next stage (`None` when there are none). The simulator frees such a tensor
/// before the stage's first compute (it may still have cost a compute in the stage before), but
/// the model counts it and rule 7's rows forbid it, so a warm start holding one is rejected by
/// HiGHS. Dropping it never adds a compute or raises the peak. Stages from the last, as a keep
/// into `t + 1` dropped can leave the keep into `t` unused.
pub(crate) fn drop_unused_keeps(graph: &Graph, schedule: &Schedule) -> Option<Vec<FixedBitSet>> {
    let n = graph.len();
    let mut keep: Vec<FixedBitSet> = (0..n).map(|t| schedule.keeps(t).clone()).collect();
    let mut dropped = false;
    for t in (1..n).rev() {
        let unused: Vec<usize> = keep[t]
            .ones()
            .filter(|&i| {
                let read = graph
                    .succs(i)
                    .iter()
                    .any(|&j| schedule.computes(t).contains(j));
                let kept_on = t + 1 < n && keep[t + 1].contains(i);
                !read && !kept_on
            })
            .collect();
        for i in unused {
            keep[t].set(i, false);
            dropped = true;
        }
    }
    dropped.then_some(keep)
}

/// The keep matrix of a plan: `S[t]` = tensors live at the end of the first compute of node `t - 1`
/// (with the frees that follow it). Exact for plans made by `Schedule::to_plan`.
pub(crate) fn keeps_of_plan(graph: &Graph, plan: &Plan) -> Vec<FixedBitSet> {
    let n = graph.len();
    let mut keep = vec![FixedBitSet::with_capacity(n); n];
    let mut live = FixedBitSet::with_capacity(n);
    let mut seen = FixedBitSet::with_capacity(n);
    let mut pending: Option<usize> = None;
    let mut record = |pending: &mut Option<usize>, live: &FixedBitSet| {
        if let Some(v) = pending.take() {
            if v + 1 < n {
                for i in live.ones().filter(|&i| i <= v) {
                    keep[v + 1].insert(i);
                }
            }
        }
    };
    for step in &plan.steps {
        match *step {
            Step::Compute(v) if v < n => {
                record(&mut pending, &live);
                live.insert(v);
                if !seen.contains(v) {
                    seen.insert(v);
                    pending = Some(v);
                }
            }
            Step::Free(v) if v < n => live.set(v, false),
            _ => {}
        }
    }
    record(&mut pending, &live);
    keep
}

/// The simulated peak and cost of a schedule's plan, or `None` if the simulator rejects it. On a
/// graph with alternatives each compute gets the cheapest implementation that fits within
/// `limit` activation bytes (`None`: without raising the plan's least peak; see
/// [`choose_implementations`]).
pub(crate) fn judge(
    graph: &Graph,
    schedule: &Schedule,
    limit: Option<u64>,
) -> Option<(Plan, u64, f64)> {
    let plan = choose_implementations(graph, &schedule.to_plan(graph), limit);
    let sim = simulate(graph, &plan).ok()?;
    Some((plan, sim.peak_bytes, sim.cost))
}

/// The keep matrix of a model solution (`S` rounded at 0.5).
pub(crate) fn keeps_of_solution(model: &Model, x: &[f64]) -> Vec<FixedBitSet> {
    let n = model.n;
    (0..n)
        .map(|t| {
            let mut row = FixedBitSet::with_capacity(n);
            for i in 0..t {
                if Model::value(model.s[t * n + i], x) > 0.5 {
                    row.insert(i);
                }
            }
            row
        })
        .collect()
}

/// The model's column vector for `schedule`, or `None` when the schedule violates a fixing or
/// the model's (conservative) memory count exceeds the budget.
#[allow(clippy::needless_range_loop)] // (t, k) indexing mirrors the paper's notation
pub(crate) fn warm_vector(graph: &Graph, model: &Model, schedule: &Schedule) -> Option<Vec<f64>> {
    let schedule = &without_unused_keeps(graph, schedule);
    let n = model.n;
    let r = |t: usize, i: usize| schedule.computes(t).contains(i);
    let s = |t: usize, i: usize| t < n && schedule.keeps(t).contains(i);
    // Respect fixings.
    for t in 0..n {
        for i in 0..n {
            let ok = |v: Var, on: bool| match v {
                Var::Zero => !on,
                Var::One => on,
                Var::Col(_) => true,
            };
            if !ok(model.r[t * n + i], r(t, i)) || !ok(model.s[t * n + i], s(t, i)) {
                return None;
            }
        }
    }
    let mem = |i: usize| graph.node(i).bytes as f64 / model.scale;
    let ws_of = |i: usize, a: usize| graph.node(i).workspace_with(a) as f64 / model.scale;
    // The implementation of each compute: the rule of `choose_implementations` on the model's
    // memory count (the leanest in the min-peak model).
    let fits = |b: f64, need: f64| need <= b * (1.0 + 1e-9) + 1e-9;
    let choose = |k: usize, cur: f64| -> usize {
        graph.node(k).cheapest_implementation(|ws| {
            model
                .budget_units
                .is_some_and(|b| fits(b, cur + ws as f64 / model.scale))
        })
    };
    let mut chosen: std::collections::HashMap<(usize, usize), usize> = Default::default();
    // FREE's logical value: i dies right after k in stage t.
    let free = |t: usize, i: usize, k: usize| {
        r(t, k) && !s(t + 1, i) && !graph.succs(i).iter().any(|&j| j > k && j <= t && r(t, j))
    };
    // U[t, k] for every k <= t along the paper's chain.
    let mut u = vec![0.0; n];
    let mut u_all: Vec<Vec<f64>> = Vec::with_capacity(n);
    let mut peak: f64 = 0.0;
    for t in 0..n {
        let mut cur: f64 = (0..t).filter(|&i| s(t, i)).map(mem).sum();
        for k in 0..=t {
            if k > 0 {
                for &i in graph.preds(k - 1) {
                    if free(t, i, k - 1) {
                        cur -= mem(i);
                    }
                }
            }
            if r(t, k) {
                cur += mem(k);
                let a = choose(k, cur);
                if a != 0 {
                    chosen.insert((t, k), a);
                }
                peak = peak.max(cur + ws_of(k, a));
            }
            u[k] = cur;
        }
        u_all.push(u[..=t].to_vec());
    }
    if let Some(b) = model.budget_units {
        if !fits(b, peak) {
            return None;
        }
    }
    let x = model
        .col_kind
        .iter()
        .map(|kind| match *kind {
            ColKind::R(t, i) => f64::from(u8::from(r(t as usize, i as usize))),
            ColKind::S(t, i) => f64::from(u8::from(s(t as usize, i as usize))),
            ColKind::Free(t, i, k) => f64::from(u8::from(free(t as usize, i as usize, k as usize))),
            ColKind::U(t, k) => u_all[t as usize][k as usize],
            ColKind::Impl(t, k, a) => f64::from(u8::from(
                chosen.get(&(t as usize, k as usize)) == Some(&(a as usize)),
            )),
            ColKind::Peak => peak,
            ColKind::Constant => 1.0,
        })
        .collect();
    Some(x)
}

/// Rows of `model` that `x` violates (beyond 1e-6), with their terms, for debugging warm starts.
pub(crate) fn violated_rows(model: &Model, x: &[f64]) -> Vec<String> {
    let mut out = Vec::new();
    for r in 0..model.num_rows() {
        let (a, b) = (model.row_start[r], model.row_start[r + 1]);
        let v = model.row_activity(r, x);
        if v > model.row_hi[r] + 1e-6 || v < model.row_lo[r] - 1e-6 {
            let terms: Vec<String> = (a..b)
                .map(|k| {
                    let c = model.row_idx[k] as usize;
                    format!("{}*{:?}={}", model.row_val[k], model.col_kind[c], x[c])
                })
                .collect();
            out.push(format!(
                "row {r}: {} <= {v} <= {}: {}",
                model.row_lo[r],
                model.row_hi[r],
                terms.join(" + ")
            ));
        }
    }
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::baselines::tests::chain;
    use crate::milp::model::BudgetMode;
    use crate::Formulation;
    use proptest::prelude::*;

    /// A keep matrix of `n` stages from random bits (`S[t, i]` = `bits[t * n + i]`, `i < t`;
    /// missing bits are 0).
    pub(crate) fn keeps_from_bits(n: usize, bits: &[bool]) -> Vec<FixedBitSet> {
        (0..n)
            .map(|t| {
                let mut row = FixedBitSet::with_capacity(n);
                for i in 0..t {
                    if bits.get(t * n + i).copied().unwrap_or(false) {
                        row.insert(i);
                    }
                }
                row
            })
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Any keep matrix becomes a schedule without unused keeps whose model vector satisfies
        /// every row of the default formulation (rule 7 included): a warm start HiGHS accepts.
        #[test]
        fn warm_starts_satisfy_every_row(
            m in 2usize..6,
            bits in proptest::collection::vec(any::<bool>(), 0..400),
        ) {
            let g = chain(m, 10);
            let n = g.len();
            let keep = keeps_from_bits(n, &bits);
            let schedule = without_unused_keeps(&g, &schedule_for_keeps(&g, &keep));
            prop_assert!(drop_unused_keeps(&g, &schedule).is_none());
            let (_, peak, _) = judge(&g, &schedule, None).expect("a valid schedule");
            // At the schedule's own simulated peak its keeps fit the memory count, unused ones
            // aside (docs/FORMULATION.md), so the vector must exist and satisfy every row.
            let model = Model::build(&g, BudgetMode::Bytes(peak), Formulation::Fast, true);
            let x = warm_vector(&g, &model, &schedule);
            prop_assert!(x.is_some(), "no warm vector at the schedule's own peak {}", peak);
            let bad = violated_rows(&model, &x.unwrap());
            prop_assert!(bad.is_empty(), "violated: {:?}", bad);
        }
    }
}
