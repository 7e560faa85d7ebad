//! The MILP (or its LP relaxation) as arrays: the paper's formulation and our tightened one.
//!
//! See `docs/FORMULATION.md` for what is counted and why the two formulations share their optimum.
//! Memory is measured in units of `scale` bytes so that HiGHS sees moderate coefficients.

use checkmate_graph::{Graph, NodeIdx};

use crate::strategy::Formulation;

/// A variable of the model: fixed to 0, fixed to 1, or a column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Var {
    /// Fixed to 0 (no column).
    Zero,
    /// Fixed to 1 (no column).
    One,
    /// Column index.
    Col(u32),
}

/// What a column stands for (used to build warm starts).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ColKind {
    /// `R[t, i]`.
    R(u32, u32),
    /// `S[t, i]`.
    S(u32, u32),
    /// `FREE[t, (i, k)]`: tensor `i` freed right after computing `k` in stage `t`.
    Free(u32, u32, u32),
    /// `U[t, k]`: memory in use right after computing `k` in stage `t`.
    U(u32, u32),
    /// `A[t, k, a]`: stage `t` computes `k` with implementation `a >= 1` (at most one `a`, and
    /// only when `R[t, k]`; none: the default).
    Impl(u32, u32, u16),
    /// The peak-memory variable of the min-peak model.
    Peak,
    /// Fixed to 1; carries the cost of the fixed computes.
    Constant,
}

/// A linear model in HiGHS-ready arrays (rows stored sparse, row-wise).
#[derive(Debug, Clone, Default)]
pub(crate) struct Model {
    pub(crate) n: usize,
    /// Bytes per memory unit.
    pub(crate) scale: f64,
    pub(crate) r: Vec<Var>,
    pub(crate) s: Vec<Var>,
    pub(crate) col_kind: Vec<ColKind>,
    pub(crate) col_cost: Vec<f64>,
    pub(crate) col_lo: Vec<f64>,
    pub(crate) col_hi: Vec<f64>,
    pub(crate) col_int: Vec<bool>,
    pub(crate) row_lo: Vec<f64>,
    pub(crate) row_hi: Vec<f64>,
    pub(crate) row_start: Vec<usize>,
    pub(crate) row_idx: Vec<u32>,
    pub(crate) row_val: Vec<f64>,
    /// Budget in memory units (the `U` upper bound); `None` in the min-peak model.
    pub(crate) budget_units: Option<f64>,
    /// Cost per objective unit: costs are divided by this power of two so that HiGHS sees at most
    /// about 1e4 (fcn_8_vgg's costs reach 1e13, and its LP then did not solve in time).
    pub(crate) cost_scale: f64,
    /// Rows without columns that hold are left out ([`Model::build_fixed`]).
    pub(crate) drop_empty_rows: bool,
}

/// Values fixed in advance for some `R[t, i]` and `S[t, i]` ([`Model::build_fixed`]).
#[derive(Debug, Clone)]
pub(crate) struct Fixings {
    n: usize,
    /// Per `t * n + i`: 0 free, 1 fixed to 0, 2 fixed to 1.
    r: Vec<u8>,
    s: Vec<u8>,
}

impl Fixings {
    /// Nothing fixed, for a graph of `n` nodes.
    pub(crate) fn none(n: usize) -> Fixings {
        Fixings {
            n,
            r: vec![0; n * n],
            s: vec![0; n * n],
        }
    }

    /// Fixes `R[t, i]` (`s`: `S[t, i]`) to `value`.
    pub(crate) fn fix(&mut self, s: bool, t: usize, i: usize, value: bool) {
        let v = if s { &mut self.s } else { &mut self.r };
        v[t * self.n + i] = 1 + value as u8;
    }

    /// How many variables are fixed.
    pub(crate) fn count(&self) -> usize {
        self.r.iter().chain(&self.s).filter(|&&v| v != 0).count()
    }

    fn get(v: &[u8], k: usize) -> Option<bool> {
        match v[k] {
            0 => None,
            x => Some(x == 2),
        }
    }

    fn r(&self, t: usize, i: usize) -> Option<bool> {
        Fixings::get(&self.r, t * self.n + i)
    }

    fn s(&self, t: usize, i: usize) -> Option<bool> {
        Fixings::get(&self.s, t * self.n + i)
    }
}

/// A row under construction: terms over columns plus a constant from fixed variables.
#[derive(Default)]
struct Expr {
    terms: Vec<(u32, f64)>,
    constant: f64,
}

impl Expr {
    fn add(&mut self, v: Var, coef: f64) -> &mut Self {
        match v {
            Var::Zero => {}
            Var::One => self.constant += coef,
            Var::Col(c) => self.terms.push((c, coef)),
        }
        self
    }
}

/// How the budget enters the model.
#[derive(Debug, Clone, Copy)]
pub(crate) enum BudgetMode {
    /// A fixed activation budget in bytes.
    Bytes(u64),
    /// Minimize the peak (a variable) instead of the cost, knowing it lies in `[lo, hi]` bytes
    /// (a proven lower bound and the peak of a known schedule).
    MinPeak {
        /// Proven lower bound on the least peak.
        lo: u64,
        /// Peak of a known schedule.
        hi: u64,
    },
}

/// Per-graph facts both formulations use.
pub(crate) struct Facts {
    /// Largest index among the strict descendants of each node (`None`: a sink).
    pub(crate) last_desc: Vec<Option<usize>>,
}

impl Facts {
    pub(crate) fn of(graph: &Graph) -> Facts {
        let n = graph.len();
        let mut last_desc: Vec<Option<usize>> = vec![None; n];
        for i in (0..n).rev() {
            last_desc[i] = graph
                .succs(i)
                .iter()
                .map(|&j| last_desc[j].map_or(j, |d| d.max(j)))
                .max();
        }
        Facts { last_desc }
    }

    /// Sets `useful` (length `n`) to the computes that can matter in stage `t` of the default
    /// formulation: `t` itself and the ancestors of `t` and of the tensors that may be kept into
    /// `t + 1`.
    pub(crate) fn useful_computes(&self, graph: &Graph, t: usize, useful: &mut [bool]) {
        useful.iter_mut().for_each(|u| *u = false);
        useful[t] = true;
        for (v, u) in useful.iter_mut().enumerate().take(t) {
            if self.keep_useful(t + 1, v) {
                *u = true;
            }
        }
        for i in (0..=t).rev() {
            if useful[i] {
                for &p in graph.preds(i) {
                    useful[p] = true;
                }
            }
        }
    }

    /// Whether keeping `i` into stage `t` can ever matter: only nodes that descend from `i` read
    /// it, directly or through recomputation, and a stage computes only ancestors of nodes at or
    /// after it; so `i` must have a descendant at stage `t` or later.
    pub(crate) fn keep_useful(&self, t: usize, i: NodeIdx) -> bool {
        i < t && self.last_desc[i].is_some_and(|d| d >= t)
    }
}

/// Bytes per memory unit: the gcd of all sizes when that keeps numbers moderate, otherwise a power
/// of two that brings the largest quantity near 1e6.
pub(crate) fn memory_scale(graph: &Graph, budget_hint: u64) -> f64 {
    fn gcd(a: u64, b: u64) -> u64 {
        if b == 0 {
            a
        } else {
            gcd(b, a % b)
        }
    }
    let mut g = 0;
    let mut total: u64 = 0;
    for node in graph.nodes() {
        g = gcd(g, node.bytes);
        g = gcd(g, node.workspace_bytes);
        for a in &node.alternatives {
            g = gcd(g, a.workspace_bytes);
        }
        total = total.saturating_add(node.bytes);
    }
    let g = g.max(1);
    let top = budget_hint.max(1).min(total.max(1));
    if (top / g) <= 10_000_000 {
        return g as f64;
    }
    let mut s = g as f64;
    while (top as f64) / s > 1e6 {
        s *= 2.0;
    }
    s
}

/// What is surely live right after stage `t` computes `t` (rules 11 and 12): which `j < t` are
/// inputs of `t`, and the memory of those inputs, `t`'s output and `t`'s workspace.
fn need_at_compute(graph: &Graph, t: usize, mem: &[f64], ws: &[f64]) -> (Vec<bool>, f64) {
    let mut is_input = vec![false; t];
    let mut need = ws[t] + mem[t];
    for &i in graph.preds(t) {
        if !is_input[i] {
            is_input[i] = true;
            need += mem[i];
        }
    }
    (is_input, need)
}

impl Model {
    /// Builds the model of `graph` under `budget` in the given formulation.
    ///
    /// `integer` makes `R`, `S` (and the paper's `FREE`) binary; otherwise the LP relaxation.
    pub(crate) fn build(
        graph: &Graph,
        budget: BudgetMode,
        formulation: Formulation,
        integer: bool,
    ) -> Model {
        let hint = match budget {
            BudgetMode::Bytes(b) => b,
            BudgetMode::MinPeak { hi, .. } => hi,
        };
        let scale = memory_scale(graph, hint);
        Model::build_at_scale(graph, budget, formulation, integer, scale)
    }

    /// [`Model::build`] with `scale` bytes per memory unit (models of one graph at several budgets
    /// then differ only in bounds; see [`memory_scale`]).
    pub(crate) fn build_at_scale(
        graph: &Graph,
        budget: BudgetMode,
        formulation: Formulation,
        integer: bool,
        scale: f64,
    ) -> Model {
        Model::build_inner(graph, budget, formulation, integer, scale, None)
    }

    /// The default formulation's MILP at `budget` bytes with `scale` bytes per memory unit, its
    /// `R` and `S` fixed as `fixings` says: a fixed variable is a constant, not a column, and a
    /// row left without columns is dropped (a violated one is kept, for HiGHS to call the model
    /// infeasible). Reduced-cost fixing ([`crate::lp_round`]) builds its model this way.
    pub(crate) fn build_fixed(graph: &Graph, budget: u64, scale: f64, fixings: &Fixings) -> Model {
        Model::build_inner(
            graph,
            BudgetMode::Bytes(budget),
            Formulation::Fast,
            true,
            scale,
            Some(fixings),
        )
    }

    #[allow(clippy::needless_range_loop)] // (t, i) indexing mirrors the paper's notation
    fn build_inner(
        graph: &Graph,
        budget: BudgetMode,
        formulation: Formulation,
        integer: bool,
        scale: f64,
        fixings: Option<&Fixings>,
    ) -> Model {
        let n = graph.len();
        let facts = Facts::of(graph);
        let mem: Vec<f64> = graph
            .nodes()
            .iter()
            .map(|x| x.bytes as f64 / scale)
            .collect();
        let ws: Vec<f64> = graph
            .nodes()
            .iter()
            .map(|x| x.workspace_bytes as f64 / scale)
            .collect();
        // Rule 11 holds for every implementation: it counts the least workspace.
        let least_ws: Vec<f64> = graph
            .nodes()
            .iter()
            .map(|x| x.least_workspace() as f64 / scale)
            .collect();
        let paper = formulation == Formulation::Paper;
        let mut m = Model {
            n,
            scale,
            r: vec![Var::Zero; n * n],
            s: vec![Var::Zero; n * n],
            drop_empty_rows: fixings.is_some(),
            ..Model::default()
        };
        // The cost of the computes fixed to 1.
        let mut fixed_cost = 0.0;
        let budget_units = match budget {
            BudgetMode::Bytes(b) => Some(b as f64 / scale),
            BudgetMode::MinPeak { .. } => None,
        };
        m.budget_units = budget_units;
        let max_cost = graph.nodes().iter().map(|x| x.cost).fold(0.0, f64::max);
        m.cost_scale = 1.0;
        // (The min-peak model's objective is the peak, not a cost: unscaled.)
        while matches!(budget, BudgetMode::Bytes(_)) && max_cost / m.cost_scale > 1e4 {
            m.cost_scale *= 2.0;
        }
        let cost_scale = m.cost_scale;
        let (u_hi, peak) = match budget {
            BudgetMode::Bytes(_) => (budget_units.unwrap_or(f64::INFINITY), None),
            BudgetMode::MinPeak { lo, hi } => {
                // The bounds cut the search: no schedule peaks below `lo`, and one peaks at `hi`.
                let (lo, hi) = (lo as f64 / scale, hi as f64 / scale);
                let lo = (lo * (1.0 - 1e-9)).min(hi);
                let hi = hi * (1.0 + 1e-9) + 1e-9;
                (hi, Some(m.add_col(ColKind::Peak, 1.0, lo, hi, false)))
            }
        };
        let obj_r = if peak.is_some() { 0.0 } else { 1.0 };

        // R and S.
        let mut useful = vec![false; n];
        for t in 0..n {
            if paper {
                for i in 0..=t {
                    let lo = if i == t { 1.0 } else { 0.0 };
                    let c = m.add_col(
                        ColKind::R(t as u32, i as u32),
                        obj_r * graph.node(i).cost / cost_scale,
                        lo,
                        1.0,
                        integer,
                    );
                    m.r[t * n + i] = Var::Col(c);
                }
                for i in 0..t {
                    let c = m.add_col(ColKind::S(t as u32, i as u32), 0.0, 0.0, 1.0, integer);
                    m.s[t * n + i] = Var::Col(c);
                }
            } else {
                facts.useful_computes(graph, t, &mut useful);
                m.r[t * n + t] = Var::One;
                for i in 0..t {
                    if useful[i] {
                        m.r[t * n + i] = match fixings.and_then(|f| f.r(t, i)) {
                            Some(false) => Var::Zero,
                            Some(true) => {
                                fixed_cost += graph.node(i).cost;
                                Var::One
                            }
                            None => Var::Col(m.add_col(
                                ColKind::R(t as u32, i as u32),
                                obj_r * graph.node(i).cost / cost_scale,
                                0.0,
                                1.0,
                                integer,
                            )),
                        };
                    }
                }
                for i in 0..t {
                    if facts.keep_useful(t, i) {
                        m.s[t * n + i] = match fixings.and_then(|f| f.s(t, i)) {
                            Some(false) => Var::Zero,
                            Some(true) => Var::One,
                            None => Var::Col(m.add_col(
                                ColKind::S(t as u32, i as u32),
                                0.0,
                                0.0,
                                1.0,
                                integer,
                            )),
                        };
                    }
                }
            }
        }
        if !paper && peak.is_none() {
            // The fixed R[t, t] = 1: a constant column carries their cost so that HiGHS's
            // objective (and relative gap) is the schedule's cost.
            let offset: f64 = graph.nodes().iter().map(|x| x.cost).sum::<f64>() + fixed_cost;
            m.add_col(ColKind::Constant, offset / cost_scale, 1.0, 1.0, false);
        }

        // A kept tensor was kept or computed in the stage before.
        for t in 0..n.saturating_sub(1) {
            for i in 0..=t {
                let next = m.s[(t + 1) * n + i];
                if next == Var::Zero {
                    continue;
                }
                let mut e = Expr::default();
                e.add(next, 1.0)
                    .add(m.s[t * n + i], -1.0)
                    .add(m.r[t * n + i], -1.0);
                m.add_row(e, f64::NEG_INFINITY, 0.0);
            }
        }
        // Inputs are resident.
        for t in 0..n {
            for k in 0..=t {
                let rk = m.r[t * n + k];
                if rk == Var::Zero {
                    continue;
                }
                for &i in graph.preds(k) {
                    let mut e = Expr::default();
                    e.add(rk, 1.0)
                        .add(m.r[t * n + i], -1.0)
                        .add(m.s[t * n + i], -1.0);
                    m.add_row(e, f64::NEG_INFINITY, 0.0);
                }
            }
        }

        if !paper && integer {
            // (MILP only: they slow the LP down and do not move its bound much.)
            // No useless work: a compute (other than t) or a keep in stage t is read in the stage
            // or kept into the next one. Some optimal schedule satisfies this (dropping useless
            // work costs nothing and frees memory).
            for t in 0..n {
                for i in 0..t {
                    let sn = if t + 1 < n {
                        m.s[(t + 1) * n + i]
                    } else {
                        Var::Zero
                    };
                    for v in [m.r[t * n + i], m.s[t * n + i]] {
                        if !matches!(v, Var::Col(_)) {
                            continue;
                        }
                        let mut e = Expr::default();
                        e.add(v, 1.0).add(sn, -1.0);
                        for &j in graph.succs(i) {
                            if j <= t {
                                e.add(m.r[t * n + j], -1.0);
                            }
                        }
                        m.add_row(e, f64::NEG_INFINITY, 0.0);
                    }
                }
            }
        }

        // Memory: FREE and the U chain, stage by stage.
        let mut free_of: Vec<Vec<(NodeIdx, u32)>> = vec![Vec::new(); n];
        for t in 0..n {
            let next_s = |i: NodeIdx, m: &Model| {
                if t + 1 < n {
                    m.s[(t + 1) * n + i]
                } else {
                    Var::Zero
                }
            };
            // FREE variables after each compute k of the stage.
            for (k, frees) in free_of.iter_mut().enumerate().take(t + 1) {
                frees.clear();
                let rk = m.r[t * n + k];
                if rk == Var::Zero {
                    continue;
                }
                for &i in graph.preds(k) {
                    if paper {
                        let c = m.add_col(
                            ColKind::Free(t as u32, i as u32, k as u32),
                            0.0,
                            0.0,
                            1.0,
                            integer,
                        );
                        frees.push((i, c));
                        // hazards = (1 - R[t,k]) + S[t+1,i] + sum_{j in succ(i), j > k} R[t,j]
                        let later: Vec<NodeIdx> =
                            graph.succs(i).iter().copied().filter(|&j| j > k).collect();
                        let kappa = 1.0 + later.len() as f64 + if t + 1 < n { 1.0 } else { 0.0 };
                        let mut h = Expr::default();
                        h.constant += 1.0;
                        h.add(rk, -1.0);
                        if t + 1 < n {
                            h.add(m.s[(t + 1) * n + i], 1.0);
                        }
                        for &j in &later {
                            if j <= t {
                                h.add(m.r[t * n + j], 1.0);
                            }
                        }
                        // 1 - FREE <= hazards  <=>  hazards + FREE >= 1
                        let mut a = Expr {
                            terms: h.terms.clone(),
                            constant: h.constant,
                        };
                        a.add(Var::Col(c), 1.0);
                        m.add_row(a, 1.0, f64::INFINITY);
                        // kappa (1 - FREE) >= hazards  <=>  hazards + kappa FREE <= kappa
                        let mut b = h;
                        b.add(Var::Col(c), kappa);
                        m.add_row(b, f64::NEG_INFINITY, kappa);
                    } else {
                        if m.r[t * n + i] == Var::Zero && m.s[t * n + i] == Var::Zero {
                            continue;
                        }
                        let later: Vec<NodeIdx> = graph
                            .succs(i)
                            .iter()
                            .copied()
                            .filter(|&j| j > k && j <= t)
                            .collect();
                        if later.iter().any(|&j| m.r[t * n + j] == Var::One) {
                            continue; // a later compute of the stage surely reads i
                        }
                        let c = m.add_col(
                            ColKind::Free(t as u32, i as u32, k as u32),
                            0.0,
                            0.0,
                            1.0,
                            false,
                        );
                        frees.push((i, c));
                        if let Var::Col(rc) = rk {
                            let mut e = Expr::default();
                            e.add(Var::Col(c), 1.0).add(Var::Col(rc), -1.0);
                            m.add_row(e, f64::NEG_INFINITY, 0.0);
                        }
                        let sn = next_s(i, &m);
                        if sn != Var::Zero {
                            let mut e = Expr::default();
                            e.add(Var::Col(c), 1.0).add(sn, 1.0);
                            m.add_row(e, f64::NEG_INFINITY, 1.0);
                        }
                        for &j in &later {
                            let rj = m.r[t * n + j];
                            if rj != Var::Zero {
                                let mut e = Expr::default();
                                e.add(Var::Col(c), 1.0).add(rj, 1.0);
                                m.add_row(e, f64::NEG_INFINITY, 1.0);
                            }
                        }
                    }
                }
            }
            // U chain over the moments of the stage.
            let mut prev: Option<(u32, NodeIdx)> = None;
            for k in 0..=t {
                let rk = m.r[t * n + k];
                if rk == Var::Zero {
                    continue;
                }
                let u = m.add_col(ColKind::U(t as u32, k as u32), 0.0, 0.0, u_hi, false);
                let mut e = Expr::default();
                e.add(Var::Col(u), 1.0).add(rk, -mem[k]);
                match prev {
                    None => {
                        for i in 0..t {
                            e.add(m.s[t * n + i], -mem[i]);
                        }
                    }
                    Some((pu, pk)) => {
                        e.add(Var::Col(pu), -1.0);
                        for &(i, c) in &free_of[pk] {
                            e.add(Var::Col(c), mem[i]);
                        }
                    }
                }
                m.add_row(e, 0.0, 0.0);
                // Alternative implementations of k: A[t, k, a] <= R[t, k] in all, each with its
                // cost and workspace as a difference to the default's.
                let node = graph.node(k);
                let mut alt_ws = Vec::new();
                let mut one_of = Expr::default();
                one_of.add(rk, -1.0);
                for a in 1..node.implementation_count() {
                    if !node.alternative_matters(a - 1) {
                        continue; // slower and larger than the default: never chosen
                    }
                    let c = m.add_col(
                        ColKind::Impl(t as u32, k as u32, a as u16),
                        obj_r * (node.cost_with(a) - node.cost) / cost_scale,
                        0.0,
                        1.0,
                        integer,
                    );
                    one_of.add(Var::Col(c), 1.0);
                    alt_ws.push((c, (node.workspace_with(a) as f64 / scale) - ws[k]));
                }
                if !alt_ws.is_empty() {
                    m.add_row(one_of, f64::NEG_INFINITY, 0.0);
                }
                if ws[k] > 0.0 || peak.is_some() || !alt_ws.is_empty() {
                    let mut e = Expr::default();
                    e.add(Var::Col(u), 1.0).add(rk, ws[k]);
                    for &(c, d) in &alt_ws {
                        e.add(Var::Col(c), d);
                    }
                    match peak {
                        Some(p) => {
                            e.add(Var::Col(p), -1.0);
                            m.add_row(e, f64::NEG_INFINITY, 0.0);
                        }
                        None => m.add_row(e, f64::NEG_INFINITY, u_hi),
                    }
                }
                prev = Some((u, k));
            }
            if !paper && integer {
                // (MILP only, like rule 7. Rule 11 in `lp-round`'s LP changed which roundings
                // fit, and its plan at SegNet LF+10% went from 1.001x to 1.079x the optimum;
                // rule 12 there made the MILP's total time shorter on two instances, equal on
                // one and longer on one, so `lp-round` keeps the LP it was measured with.)
                if let Some(b) = budget_units {
                    let (is_input, need) = need_at_compute(graph, t, &mem, &least_ws);
                    m.add_too_big_rows(t, b - need, &mem, &is_input, &free_of);
                    m.add_kept_at_compute_row(t, b - need, &mem, &is_input);
                }
            }
        }
        m
    }

    /// Rule 11 of docs/FORMULATION.md: when stage `t` computes `t`, its inputs, its output and its
    /// workspace are live; a tensor bigger than what the budget leaves beside them cannot be live
    /// then, so it is not kept into the stage unless freed before that moment. The row is
    /// `S[t,j] + R[t,j] - sum FREE[t,(j,k)] <= 0` (k < t): the model's count of `j` at that
    /// moment, 0 or 1 for integral `R`, `S` and logical `FREE`. The memory row alone lets a
    /// fraction of such a tensor fit, which is much of the LP's gap at tight budgets. (The same
    /// rows at the stage's earlier moments, conditional on their compute, added 0-5 rows on the
    /// shared graphs and did not move the bound.)
    /// `room`: the budget less `need_t` ([`need_at_compute`]).
    fn add_too_big_rows(
        &mut self,
        t: usize,
        room: f64,
        mem: &[f64],
        is_input: &[bool],
        free_of: &[Vec<(NodeIdx, u32)>],
    ) {
        let n = self.n;
        let too_big: Vec<NodeIdx> = (0..t)
            .filter(|&j| !is_input[j] && mem[j] > room * (1.0 + 1e-9) + 1e-9)
            .collect();
        if too_big.is_empty() {
            return;
        }
        // The stage's FREE columns of each tensor.
        let mut frees_of: Vec<Vec<u32>> = vec![Vec::new(); t];
        for frees in &free_of[..t] {
            for &(i, c) in frees {
                frees_of[i].push(c);
            }
        }
        for j in too_big {
            let mut e = Expr::default();
            e.add(self.s[t * n + j], 1.0).add(self.r[t * n + j], 1.0);
            if e.terms.is_empty() {
                continue;
            }
            for &c in &frees_of[j] {
                e.add(Var::Col(c), -1.0);
            }
            self.add_row(e, f64::NEG_INFINITY, 0.0);
        }
    }

    /// Rule 12 of docs/FORMULATION.md: right after stage `t` computes `t`, its inputs, its output,
    /// its workspace and every tensor kept into stage `t + 1` are live, so
    /// `sum_j M_j S[t+1,j] <= budget - need_t` over the tensors `j < t` that are not inputs of
    /// `t`. Every integer point of the model satisfies it (such a `j` cannot be freed in stage
    /// `t`, so the model counts it at that moment), but the LP relaxation can free a fraction of
    /// a tensor that it keeps a fraction of; and it is a knapsack row in binaries alone, whose
    /// cover cuts HiGHS separates, where the `U` chain hides that structure.
    /// `room`: the budget less `need_t` ([`need_at_compute`]).
    fn add_kept_at_compute_row(&mut self, t: usize, room: f64, mem: &[f64], is_input: &[bool]) {
        let n = self.n;
        if t + 1 >= n {
            return;
        }
        let mut e = Expr::default();
        let mut total = 0.0;
        for j in 0..t {
            if !is_input[j] {
                let v = self.s[(t + 1) * n + j];
                if v != Var::Zero {
                    e.add(v, mem[j]);
                    total += mem[j];
                }
            }
        }
        // A row that no keep pattern can violate is left out.
        if total > room {
            self.add_row(e, f64::NEG_INFINITY, room);
        }
    }

    fn add_col(&mut self, kind: ColKind, cost: f64, lo: f64, hi: f64, int: bool) -> u32 {
        let c = self.col_kind.len() as u32;
        self.col_kind.push(kind);
        self.col_cost.push(cost);
        self.col_lo.push(lo);
        self.col_hi.push(hi);
        self.col_int.push(int);
        c
    }

    fn add_row(&mut self, e: Expr, lo: f64, hi: f64) {
        const TOL: f64 = 1e-9;
        if self.drop_empty_rows
            && e.terms.is_empty()
            && lo - TOL <= e.constant
            && e.constant <= hi + TOL
        {
            return;
        }
        if self.row_start.is_empty() {
            self.row_start.push(0);
        }
        self.row_lo.push(lo - e.constant);
        self.row_hi.push(hi - e.constant);
        for (c, v) in e.terms {
            self.row_idx.push(c);
            self.row_val.push(v);
        }
        self.row_start.push(self.row_idx.len());
    }

    /// Number of columns.
    pub(crate) fn num_cols(&self) -> usize {
        self.col_kind.len()
    }

    /// Number of rows.
    pub(crate) fn num_rows(&self) -> usize {
        self.row_lo.len()
    }

    /// Number of integer columns.
    pub(crate) fn num_int(&self) -> usize {
        self.col_int.iter().filter(|&&b| b).count()
    }

    /// Whether the model has integer columns (a MILP; an LP otherwise).
    pub(crate) fn is_mip(&self) -> bool {
        self.col_int.iter().any(|&b| b)
    }

    /// The value of row `r` at the column vector `x`.
    pub(crate) fn row_activity(&self, r: usize, x: &[f64]) -> f64 {
        let (a, b) = (self.row_start[r], self.row_start[r + 1]);
        (a..b)
            .map(|k| self.row_val[k] * x[self.row_idx[k] as usize])
            .sum()
    }

    /// Value of `R[t, i]` (or `S`) in a column vector.
    pub(crate) fn value(v: Var, x: &[f64]) -> f64 {
        match v {
            Var::Zero => 0.0,
            Var::One => 1.0,
            Var::Col(c) => x[c as usize],
        }
    }
}

/// The size of a model before it is built ([`estimate`]): columns, rows and non-zeros, counted
/// as [`Model::build_at_scale`] creates them (the memory rows' terms bounded from above).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelSize {
    /// Nodes of the graph (the `R` and `S` index arrays hold `2 n^2` entries).
    pub nodes: u64,
    /// Columns.
    pub cols: u64,
    /// Rows.
    pub rows: u64,
    /// Non-zeros of the constraint matrix.
    pub nonzeros: u64,
}

/// Bytes HiGHS holds per byte of the model it is given (its own row- and column-wise copies,
/// presolve's reduced copy, the LP factorization and the branch-and-bound's tree and cuts),
/// measured as peak resident memory over [`ModelSize::model_bytes`] on chains and random layered
/// graphs of 200 to 1000 nodes (docs/FORMULATION.md, "Memory"), with a margin.
pub const HIGHS_BYTES_PER_MODEL_BYTE: u64 = 8;

impl ModelSize {
    /// Bytes of the model's arrays as HiGHS receives them: 8-byte values and 4-byte indices per
    /// non-zero (twice: row- and column-wise), 33 bytes per column, 24 per row.
    pub fn model_bytes(&self) -> u64 {
        24 * self.nonzeros + 33 * self.cols + 24 * self.rows
    }

    /// Bytes a solve of this model needs in all: our arrays (the `R`/`S` index maps, columns and
    /// rows as built) and HiGHS's ([`HIGHS_BYTES_PER_MODEL_BYTE`] per model byte).
    pub fn solve_bytes(&self) -> u64 {
        let ours =
            16 * self.nodes * self.nodes + 41 * self.cols + 24 * self.rows + 12 * self.nonzeros;
        ours.saturating_add(HIGHS_BYTES_PER_MODEL_BYTE.saturating_mul(self.model_bytes()))
    }
}

/// The size of [`Model::build`]'s model of `graph` in `formulation` (`integer`: the MILP, else
/// its LP relaxation), without building it: one pass over the stages, `O(n (n + edges))` time
/// and `O(n)` memory.
#[allow(clippy::needless_range_loop)]
pub(crate) fn estimate(graph: &Graph, formulation: Formulation, integer: bool) -> ModelSize {
    let n = graph.len();
    let facts = Facts::of(graph);
    let paper = formulation == Formulation::Paper;
    let (mut cols, mut rows, mut nnz) = (0u64, 0u64, 0u64);
    // Which R[t, i] and S[t, i] exist (column or fixed 1) in stage t, and S of stage t + 1.
    let mut r = vec![false; n];
    let mut s = vec![false; n];
    let mut s_next = vec![false; n];
    let keep = |t: usize, i: usize| {
        if paper {
            i < t
        } else {
            facts.keep_useful(t, i)
        }
    };
    for t in 0..n {
        if paper {
            r.iter_mut().enumerate().for_each(|(i, x)| *x = i <= t);
        } else {
            facts.useful_computes(graph, t, &mut r);
        }
        for i in 0..n {
            s[i] = keep(t, i);
            s_next[i] = t + 1 < n && keep(t + 1, i);
        }
        let r_cols = (0..=t).filter(|&i| r[i] && (paper || i < t)).count() as u64;
        let s_cols = (0..t).filter(|&i| s[i]).count() as u64;
        cols += r_cols + s_cols;
        // Kept tensors were kept or computed in the stage before (rows of stage t - 1's S).
        let keep_rows = (0..=t).filter(|&i| s_next[i]).count() as u64;
        rows += keep_rows;
        nnz += 3 * keep_rows;
        // Inputs are resident.
        let input_rows: u64 = (0..=t)
            .filter(|&k| r[k])
            .map(|k| graph.preds(k).len() as u64)
            .sum();
        rows += input_rows;
        nnz += 3 * input_rows;
        if !paper && integer {
            // No useless work.
            for i in 0..t {
                let later = graph.succs(i).iter().filter(|&&j| j <= t).count() as u64;
                let each = 2 + later;
                let count = u64::from(r[i]) + u64::from(s[i]);
                rows += count;
                nnz += count * each;
            }
        }
        // FREE columns and their rows, then the U chain.
        let mut prev_frees = 0u64;
        let mut first = true;
        for k in 0..=t {
            if !r[k] {
                continue;
            }
            let mut frees = 0u64;
            for &i in graph.preds(k) {
                // (A later compute of the stage, `t` itself, surely reads `i`: no FREE.)
                if !paper && ((!r[i] && !s[i]) || (k < t && graph.succs(i).contains(&t))) {
                    continue;
                }
                let later = graph.succs(i).iter().filter(|&&j| j > k && j <= t).count() as u64;
                frees += 1;
                if paper {
                    rows += 2;
                    nnz += 2 * (3 + later);
                } else {
                    let count = 2 + later;
                    rows += count;
                    nnz += 2 * count;
                }
            }
            cols += frees + 1;
            rows += 2;
            nnz += 2 + if first { s_cols } else { 1 + prev_frees } + 3;
            prev_frees = frees;
            first = false;
        }
        if !paper && integer {
            // Rules 11 and 12: at most one row per tensor of the stage, one knapsack row.
            rows += t as u64 + 1;
            nnz += s_cols + (0..=t).filter(|&i| s_next[i]).count() as u64 + 2 * t as u64;
        }
    }
    ModelSize {
        nodes: n as u64,
        cols,
        rows,
        nonzeros: nnz,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use checkmate_graph::generate::{random_layered, with_backward, LayeredParams};

    /// The estimate counts columns exactly in the default formulation and bounds rows and
    /// non-zeros from above, not by much.
    #[test]
    fn estimate_matches_the_built_model() {
        for seed in 0..6u64 {
            let f = random_layered(&LayeredParams::moccasin(12 + 5 * seed as usize, 0.3), seed)
                .unwrap();
            for g in [f.clone(), with_backward(&f).unwrap()] {
                for (formulation, integer) in [
                    (Formulation::Fast, true),
                    (Formulation::Fast, false),
                    (Formulation::Paper, true),
                ] {
                    let budget = g.nodes().iter().map(|x| x.bytes).sum::<u64>() / 2;
                    let m = Model::build(&g, BudgetMode::Bytes(budget), formulation, integer);
                    let e = estimate(&g, formulation, integer);
                    let what = format!("{} {formulation:?} integer={integer}", g.name());
                    let (cols, rows, nnz) = (
                        m.num_cols() as u64,
                        m.num_rows() as u64,
                        m.row_idx.len() as u64,
                    );
                    // (+1: the constant column of the default MILP.)
                    assert!(
                        e.cols <= cols + 1 && cols <= e.cols + 1,
                        "{what}: cols {} vs {cols}",
                        e.cols
                    );
                    assert!(
                        e.rows >= rows && e.rows <= 2 * rows + 10,
                        "{what}: rows {} vs {rows}",
                        e.rows
                    );
                    assert!(
                        e.nonzeros >= nnz && e.nonzeros <= 2 * nnz + 10,
                        "{what}: non-zeros {} vs {nnz}",
                        e.nonzeros
                    );
                }
            }
        }
    }
}
