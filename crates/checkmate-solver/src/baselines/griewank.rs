//! `griewank`: Griewank & Walther's binomial checkpointing (Revolve) for chains.
//!
//! **Model.** The forward pass must be a chain `f_0 -> f_1 -> ... -> f_{m-1}` (each forward node
//! reads only the previous forward node, plus static inputs) followed by the loss and backward
//! nodes. Revolve's state `x_k` is the output of `f_{k-1}`; `x_0` is the input batch, which is
//! static memory, so it is always available. Step `k` computes `f_{k-1}`; reversing step `k` runs
//! the backward nodes of layer `k - 1`.
//!
//! **Schedule.** With `s` snapshot slots (one of them holds `x_0`, so `s - 1` activation
//! checkpoints), [`revolve_actions`] reverses the `m` steps by Griewank's recursion: advance `j`
//! steps, take a snapshot, reverse the right part with `s - 1` slots, release it, restore and
//! reverse the left part with `s` slots, where `j` minimizes the number of advances using the
//! closed form [`revolve_forward_steps`] `t(l, s) = r l - beta(s + 1, r - 1)` with
//! `beta(s, r - 1) < l <= beta(s, r)` and `beta(s, r) = C(s + r, s)` ([`binomial`]). Its advances add
//! up to exactly `t(m, s)`, the proven minimum.
//!
//! **Conversion to `(R, S)`.** Forward stages keep the snapshots taken so far in the first sweep plus
//! the current state (`f_{j-1}` into stage `f_j`). Each loss/backward stage is assigned the step it
//! reverses (one more than the largest forward node it reads; the loss and `f_{m-1}` belong to step
//! `m`, Revolve's "first turn") and keeps: the snapshots Revolve holds when that step's turn starts
//! (snapshots taken while advancing to it are added to `S` of the next stage, so Algorithm 2 computes
//! them in this one), forward tensors already present in an earlier stage of the same turn and read
//! by a later one (the turn's tape), and every loss/backward output until its last consumer.
//! Algorithm 2 then recomputes exactly Revolve's restore-and-advance from the nearest snapshot plus
//! the turn's own forward node, so a chain of `m` forward nodes costs `t(m, s) + m` forward
//! computes (each backward node once). Like Revolve, the schedule does not keep a turn's forward
//! output for the next turn, so even with `s = m` slots it recomputes `m - 1` forward nodes.
//!
//! **Budget.** Every `s` from 1 to `m` is simulated; [`Griewank`] returns the cheapest plan whose peak
//! fits (ties to the smaller peak), and its least feasible budget is the least peak over all `s`.
//! On a non-chain forward graph it returns [`Error::NotApplicable`] naming the first forward node
//! that breaks the chain: Revolve's optimality rests on a single-tensor state, which skip
//! connections break, and the paper reports Griewank only for chains.

use std::collections::BTreeSet;

use checkmate_graph::{Graph, NodeIdx, NodeKind, Schedule};
use fixedbitset::FixedBitSet;
use rayon::prelude::*;

use super::{best_within, evaluate_schedule, least_peak, Evaluated};
use crate::error::{Error, Result};
use crate::strategy::{Outcome, SolveOptions, Strategy};

/// `beta(s, r) = C(s + r, s)`, the longest chain `s` snapshots reverse with at most `r` advances per
/// step; saturates at `u64::MAX`.
pub fn binomial(s: u64, r: u64) -> u64 {
    let k = s.min(r) as u128;
    let n = (s + r) as u128;
    let mut acc: u128 = 1;
    for i in 0..k {
        acc = acc * (n - i) / (i + 1);
        if acc > u64::MAX as u128 {
            return u64::MAX;
        }
    }
    acc as u64
}

/// Griewank's minimal number of forward advances to reverse a chain of `l` steps with `s` snapshot
/// slots (including the one holding the initial state): `t(l, s) = r l - beta(s + 1, r - 1)`, `r`
/// the least integer with `beta(s, r) >= l`. `None` for `s = 0` with `l > 1` (impossible) and on
/// overflow.
pub fn revolve_forward_steps(l: u64, s: u64) -> Option<u64> {
    if l <= 1 {
        return Some(0);
    }
    if s == 0 {
        return None;
    }
    let mut r = 0u64;
    while binomial(s, r) < l {
        r += 1;
    }
    // r >= 1 because l > 1 = beta(s, 0).
    r.checked_mul(l)?.checked_sub(binomial(s + 1, r - 1))
}

/// One action of a Revolve schedule; states are `0..=l`, step `k` maps `x_{k-1}` to `x_k`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Compute the steps from state `from` to state `to` (`to - from` advances).
    Advance {
        /// The state advanced from.
        from: usize,
        /// The state reached.
        to: usize,
    },
    /// Store the current state in a slot.
    Snapshot(usize),
    /// Free the slot holding this state.
    Release(usize),
    /// Run step `k` forward from `x_{k-1}` and reverse it.
    Youturn(usize),
}

/// The advance length (`1..l`) that reverses `l` steps with `s >= 2` slots in the fewest advances
/// (the largest such length on ties).
fn best_split(l: u64, s: u64) -> u64 {
    let mut best = (u64::MAX, 1);
    for j in 1..l {
        let cost = revolve_forward_steps(l - j, s - 1)
            .and_then(|a| {
                revolve_forward_steps(j, s).map(|b| j.saturating_add(a).saturating_add(b))
            })
            .unwrap_or(u64::MAX);
        if cost <= best.0 {
            best = (cost, j);
        }
    }
    best.1
}

/// Revolve's binomial schedule reversing steps `1..=l` from `x_0` with `s >= 1` slots (the first
/// holds `x_0`).
pub fn revolve_actions(l: usize, s: usize) -> Vec<Action> {
    let mut out = Vec::new();
    if l > 0 {
        reverse(0, l, s.max(1), &mut out);
    }
    out
}

/// Reverses steps `a + 1 ..= a + l`; `x_a` is held.
fn reverse(a: usize, l: usize, s: usize, out: &mut Vec<Action>) {
    let mut l = l;
    while s <= 1 && l > 1 {
        // One slot, already holding x_a: advance to the end, turn, repeat one shorter.
        out.push(Action::Advance {
            from: a,
            to: a + l - 1,
        });
        out.push(Action::Youturn(a + l));
        l -= 1;
    }
    if l == 1 {
        out.push(Action::Youturn(a + 1));
        return;
    }
    if l == 0 {
        return;
    }
    let j = best_split(l as u64, s as u64) as usize;
    out.push(Action::Advance { from: a, to: a + j });
    out.push(Action::Snapshot(a + j));
    reverse(a + j, l - j, s - 1, out);
    out.push(Action::Release(a + j));
    reverse(a, j, s, out);
}

/// The forward chain of `graph` in order, or why it is not one.
fn forward_chain(graph: &Graph) -> std::result::Result<Vec<NodeIdx>, String> {
    let fwd: Vec<NodeIdx> = graph.forward_nodes().collect();
    if fwd.is_empty() {
        return Err("it has no forward node".into());
    }
    for (k, &v) in fwd.iter().enumerate() {
        let fpreds: Vec<NodeIdx> = graph
            .preds(v)
            .iter()
            .copied()
            .filter(|&p| graph.node(p).kind == NodeKind::Forward)
            .collect();
        let expected: Vec<NodeIdx> = if k == 0 { vec![] } else { vec![fwd[k - 1]] };
        if fpreds != expected {
            return Err(format!(
                "its forward pass is not a chain: forward node {} reads {} forward inputs ({}) \
                 where a chain reads only {}; Revolve needs the state between layers to be one \
                 tensor (use ap-greedy or milp)",
                graph.label(v),
                fpreds.len(),
                fpreds
                    .iter()
                    .map(|&p| graph.label(p))
                    .collect::<Vec<_>>()
                    .join(", "),
                if k == 0 {
                    "static inputs".to_string()
                } else {
                    graph.label(fwd[k - 1])
                }
            ));
        }
    }
    let last = *fwd.last().expect("non-empty");
    if let Some(t) = (0..last).find(|&t| graph.node(t).kind != NodeKind::Forward) {
        return Err(format!(
            "{} node {} comes before the last forward node {}; Revolve needs the whole forward \
             pass first",
            graph.node(t).kind,
            graph.label(t),
            graph.label(last)
        ));
    }
    Ok(fwd)
}

/// The `(R, S)` schedule of Revolve with `s` slots on the chain `fwd` (see the module docs).
fn revolve_schedule(graph: &Graph, fwd: &[NodeIdx], s: usize) -> Schedule {
    let n = graph.len();
    let m = fwd.len();
    let actions = revolve_actions(m, s);
    // Snapshot timeline, per reversed step.
    let mut held: BTreeSet<usize> = BTreeSet::new();
    let mut taken: Vec<usize> = Vec::new();
    let mut sweep_snaps: Vec<usize> = Vec::new();
    let mut held_at: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); m + 1];
    let mut taken_for: Vec<Vec<usize>> = vec![Vec::new(); m + 1];
    let mut first_turn_done = false;
    for a in &actions {
        match *a {
            Action::Advance { .. } => {}
            Action::Snapshot(k) => {
                held.insert(k);
                taken.push(k);
                if !first_turn_done {
                    sweep_snaps.push(k);
                }
            }
            Action::Release(k) => {
                held.remove(&k);
            }
            Action::Youturn(k) => {
                held_at[k] = held.clone();
                taken_for[k] = std::mem::take(&mut taken);
                first_turn_done = true;
            }
        }
    }
    // State k >= 1 is the output of fwd[k - 1]; x_0 is static.
    let tensor = |k: usize| fwd[k - 1];
    // Step of each stage: forward stages before the last are the sweep (0), the last forward
    // node starts step m, every other stage reverses 1 + its largest forward input.
    let mut pos_in_chain = vec![usize::MAX; n];
    for (k, &v) in fwd.iter().enumerate() {
        pos_in_chain[v] = k;
    }
    let last_fwd = fwd[m - 1];
    let mut step = vec![0usize; n];
    let mut current = m;
    for (t, st) in step.iter_mut().enumerate() {
        if graph.node(t).kind == NodeKind::Forward {
            *st = if t == last_fwd { m } else { 0 };
            continue;
        }
        if let Some(k) = graph
            .preds(t)
            .iter()
            .filter(|&&p| graph.node(p).kind == NodeKind::Forward)
            .map(|&p| pos_in_chain[p])
            .max()
        {
            current = current.min(k + 1).max(1);
        }
        *st = current;
    }
    let last_consumer: Vec<usize> = (0..n).map(|i| graph.last_reader(i).unwrap_or(i)).collect();
    // Forward tensors a stage holds: its forward inputs and itself.
    let present = |t: usize| {
        graph
            .preds(t)
            .iter()
            .copied()
            .chain(std::iter::once(t))
            .filter(|&p| graph.node(p).kind == NodeKind::Forward)
    };
    let mut keep = vec![FixedBitSet::with_capacity(n); n];
    let mut turn_start = 0usize;
    for t in 0..n {
        let row = &mut keep[t];
        for (i, &last) in last_consumer.iter().enumerate().take(t) {
            if graph.node(i).kind != NodeKind::Forward && last >= t {
                row.insert(i);
            }
        }
        if step[t] == 0 {
            // First sweep: snapshots taken so far and the current state.
            let j = pos_in_chain[t];
            for &k in &sweep_snaps {
                if k - 1 < j {
                    row.insert(tensor(k));
                }
            }
            if j > 0 {
                row.insert(fwd[j - 1]);
            }
            continue;
        }
        let i = step[t];
        let first = t == 0 || step[t - 1] != i;
        if first {
            turn_start = t;
        }
        if i == m && first {
            // The last forward node starts the first turn: the sweep's snapshots and the state.
            for &k in &sweep_snaps {
                row.insert(tensor(k));
            }
            if m >= 2 {
                row.insert(fwd[m - 2]);
            }
            continue;
        }
        for &k in &held_at[i] {
            if k == 0 || (first && taken_for[i].contains(&k)) {
                continue;
            }
            row.insert(tensor(k));
        }
        if !first {
            // The turn's tape: forward tensors present earlier in this turn and read later in it.
            let mut earlier = FixedBitSet::with_capacity(n);
            for u in turn_start..t {
                for p in present(u) {
                    earlier.insert(p);
                }
            }
            for u in (t..n).take_while(|&u| step[u] == i) {
                for &p in graph.preds(u) {
                    if earlier.contains(p) && p < t {
                        row.insert(p);
                    }
                }
            }
        }
    }
    Schedule::cheapest_given_keeps(graph, keep).expect("keeps only tensors computed earlier")
}

/// `griewank`: Revolve's binomial schedule on a chain, its number of slots chosen for the budget.
#[derive(Debug, Clone, Copy, Default)]
pub struct Griewank;

/// Chains up to this many forward nodes have every slot count evaluated; longer ones are searched
/// by bisection (each schedule is `O(n^2)` to build and simulate: evaluating all 2000 of a
/// 2000-node chain took minutes and gigabytes).
const EXHAUSTIVE_SLOTS: usize = 64;

impl Griewank {
    /// The Revolve schedules for `s = 1..=m` slots, simulated (up to [`EXHAUSTIVE_SLOTS`]); on
    /// longer chains those of `s = 1`, `s = m` and the bisection for the largest `s` whose peak
    /// fits `budget` (more slots never cost more on a chain, and hold more memory).
    fn frontier(graph: &Graph, budget: Option<u64>) -> Result<Vec<Evaluated>> {
        let fwd = forward_chain(graph).map_err(|reason| Error::NotApplicable {
            strategy: "griewank".into(),
            graph: graph.name().to_string(),
            reason,
        })?;
        let m = fwd.len();
        let eval = |s: usize| evaluate_schedule(graph, revolve_schedule(graph, &fwd, s));
        if m <= EXHAUSTIVE_SLOTS {
            return Ok((1..=m).into_par_iter().map(eval).collect());
        }
        let mut out = vec![eval(1)];
        let Some(budget) = budget else {
            return Ok(out);
        };
        out.push(eval(m));
        let (mut lo, mut hi) = (1usize, m);
        if out[0].peak > budget || out[1].peak <= budget {
            return Ok(out);
        }
        // Invariant: s = lo fits, s = hi does not.
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            let e = eval(mid);
            if e.peak <= budget {
                lo = mid;
            } else {
                hi = mid;
            }
            out.push(e);
        }
        Ok(out)
    }

    /// The Revolve schedule with `slots` snapshot slots (one holds the static input), if the forward
    /// graph is a chain.
    pub fn schedule(graph: &Graph, slots: usize) -> Result<Schedule> {
        let fwd = forward_chain(graph).map_err(|reason| Error::NotApplicable {
            strategy: "griewank".into(),
            graph: graph.name().to_string(),
            reason,
        })?;
        Ok(revolve_schedule(graph, &fwd, slots.max(1)))
    }
}

impl Strategy for Griewank {
    fn name(&self) -> &'static str {
        "griewank"
    }

    fn plan(&self, graph: &Graph, budget_bytes: u64, _options: &SolveOptions) -> Result<Outcome> {
        Ok(best_within(
            graph,
            &Self::frontier(graph, Some(budget_bytes))?,
            budget_bytes,
        ))
    }

    fn least_feasible_budget(&self, graph: &Graph, _options: &SolveOptions) -> Result<Option<u64>> {
        Ok(least_peak(&Self::frontier(graph, None)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::baselines::tests::chain;

    /// The recurrence `T(l, s) = min_j j + T(l - j, s - 1) + T(j, s)`, `T(1, s) = 0`,
    /// `T(l, 1) = l (l - 1) / 2`, by dynamic programming.
    fn dp(lmax: usize, smax: usize) -> Vec<Vec<u64>> {
        let mut t = vec![vec![u64::MAX; smax + 1]; lmax + 1];
        for l in 1..=lmax {
            for s in 1..=smax {
                t[l][s] = if l == 1 {
                    0
                } else if s == 1 {
                    (l * (l - 1) / 2) as u64
                } else {
                    (1..l)
                        .map(|j| j as u64 + t[l - j][s - 1] + t[j][s])
                        .min()
                        .unwrap()
                };
            }
        }
        t
    }

    #[test]
    fn closed_form_matches_the_recurrence() {
        let t = dp(40, 6);
        for l in 1..=40u64 {
            for s in 1..=6u64 {
                assert_eq!(
                    revolve_forward_steps(l, s),
                    Some(t[l as usize][s as usize]),
                    "l={l} s={s}"
                );
            }
        }
        assert_eq!(binomial(3, 2), 10);
        assert_eq!(revolve_forward_steps(5, 0), None);
    }

    #[test]
    fn actions_advance_exactly_the_optimum_and_respect_slots() {
        for l in 1..=25usize {
            for s in 1..=5usize {
                let acts = revolve_actions(l, s);
                let advances: usize = acts
                    .iter()
                    .map(|a| match a {
                        Action::Advance { from, to } => to - from,
                        _ => 0,
                    })
                    .sum();
                assert_eq!(
                    Some(advances as u64),
                    revolve_forward_steps(l as u64, s as u64)
                );
                let turns: Vec<usize> = acts
                    .iter()
                    .filter_map(|a| match a {
                        Action::Youturn(k) => Some(*k),
                        _ => None,
                    })
                    .collect();
                assert_eq!(turns, (1..=l).rev().collect::<Vec<_>>());
                let mut held = 1usize;
                for a in &acts {
                    match a {
                        Action::Snapshot(_) => held += 1,
                        Action::Release(_) => held -= 1,
                        _ => {}
                    }
                    assert!(held <= s, "l={l} s={s}");
                }
            }
        }
    }

    #[test]
    fn chain_cost_is_the_binomial_formula() {
        for m in 1..=12usize {
            let g = chain(m, 10);
            for s in 1..=m {
                let sch = Griewank::schedule(&g, s).unwrap();
                sch.validate(&g).unwrap();
                let e = evaluate_schedule(&g, sch);
                let t = revolve_forward_steps(m as u64, s as u64).unwrap() as f64;
                // Forward: t(m, s) advances plus one turn per step; loss and backward once each.
                assert_eq!(e.cost, t + m as f64 + 1.0 + m as f64, "m={m} s={s}");
            }
        }
    }

    #[test]
    fn more_slots_never_cost_more_on_a_chain() {
        let g = chain(10, 10);
        let costs: Vec<f64> = (1..=10)
            .map(|s| Griewank::schedule(&g, s).unwrap().cost(&g))
            .collect();
        assert!(costs.windows(2).all(|w| w[1] <= w[0]), "{costs:?}");
    }
}
