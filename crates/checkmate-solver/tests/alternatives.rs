//! Graphs whose nodes have several implementations: `milp` chooses per computation and finds the
//! exhaustive optimum, every other strategy returns a valid plan within budget that `milp` never
//! loses to, and bounds stay below every plan.

use checkmate_graph::{
    choose_implementations, simulate, Graph, Implementation, NodeKind, NodeSpec, Schedule,
};
use checkmate_solver::{
    solve, strategy_by_name, Error, Formulation, SolveOptions, Status, STRATEGY_NAMES,
};
use fixedbitset::FixedBitSet;
use proptest::prelude::*;

/// A random DAG of `n` nodes (each reads a random subset of the earlier ones); node `i` gets the
/// implementations `alts[i]` beside its default: `(cost, workspace)`.
fn random_dag(
    n: usize,
    edges: &[bool],
    bytes: &[u64],
    costs: &[u32],
    ws: &[u64],
    alts: &[Vec<(u32, u64)>],
) -> Graph {
    let mut e = edges.iter();
    let nodes = (0..n)
        .map(|i| NodeSpec {
            id: i as u64,
            name: format!("v{i}"),
            kind: NodeKind::Forward,
            cost: f64::from(costs[i]),
            bytes: bytes[i],
            workspace_bytes: ws[i],
            deps: (0..i)
                .filter(|_| *e.next().unwrap_or(&false))
                .map(|d| d as u64)
                .collect(),
            alternatives: alts[i]
                .iter()
                .enumerate()
                .map(|(k, &(c, w))| Implementation {
                    name: format!("alt{k}"),
                    cost: f64::from(c),
                    workspace_bytes: w,
                })
                .collect(),
        })
        .collect();
    Graph::new("random-dag-alternatives", "flops", 0, nodes).expect("valid graph")
}

/// Graphs of 3 to 6 nodes where about half the nodes have one or two alternatives: typically a
/// faster one with a bigger workspace, or a slower one with a smaller workspace.
fn dag_strategy() -> impl proptest::strategy::Strategy<Value = (Graph, f64)> {
    (3usize..=6).prop_flat_map(|n| {
        (
            proptest::collection::vec(proptest::bool::weighted(0.35), n * (n - 1) / 2),
            proptest::collection::vec(1u64..=8, n),
            proptest::collection::vec(2u32..=6, n),
            proptest::collection::vec(0u64..=4, n),
            proptest::collection::vec(proptest::collection::vec((1u32..=8, 0u64..=9), 0..=2), n),
            0.0f64..=1.0,
        )
            .prop_map(move |(edges, bytes, costs, ws, alts, frac)| {
                (random_dag(n, &edges, &bytes, &costs, &ws, &alts), frac)
            })
    })
}

/// Every keep matrix (keeps that can matter), `R` from Algorithm 2, each compute with the
/// cheapest implementation that fits (the best choice for that sequence of steps, as workspaces
/// live only during their compute): the least cost within `budget`.
fn exhaustive(g: &Graph, budget: u64) -> Option<f64> {
    let n = g.len();
    // Keeps that can matter: `i` has a descendant at stage `t` or later.
    let mut last_desc: Vec<Option<usize>> = vec![None; n];
    for i in (0..n).rev() {
        last_desc[i] = g
            .succs(i)
            .iter()
            .map(|&j| last_desc[j].map_or(j, |d| d.max(j)))
            .max();
    }
    let mut bits = Vec::new();
    for (i, d) in last_desc.iter().enumerate() {
        if let Some(d) = *d {
            for t in i + 1..=d {
                bits.push((t, i));
            }
        }
    }
    assert!(bits.len() <= 20, "too many keep bits: {}", bits.len());
    let mut best: Option<f64> = None;
    for mask in 0u64..(1u64 << bits.len()) {
        let mut keep = vec![FixedBitSet::with_capacity(n); n];
        for (b, &(t, i)) in bits.iter().enumerate() {
            if mask >> b & 1 == 1 {
                keep[t].insert(i);
            }
        }
        let s = Schedule::cheapest_given_keeps(g, keep).expect("keeps are before their stage");
        let plan = choose_implementations(g, &s.to_plan(g), Some(budget));
        let sim = simulate(g, &plan).expect("valid plan");
        if sim.peak_bytes <= budget && best.map_or(true, |b| sim.cost < b) {
            best = Some(sim.cost);
        }
    }
    best
}

fn budget_of(g: &Graph, frac: f64) -> u64 {
    let lo = g.min_feasible_activation_bytes();
    let hi = g
        .nodes()
        .iter()
        .map(|n| n.bytes + n.workspace_bytes)
        .sum::<u64>()
        + 10;
    lo + ((hi - lo) as f64 * frac) as u64
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn milp_chooses_implementations_optimally((g, frac) in dag_strategy()) {
        let budget = budget_of(&g, frac);
        let truth = exhaustive(&g, budget);
        let options = SolveOptions::default();
        let milp = strategy_by_name("milp").expect("registered");
        let opt = match solve(&g, milp.as_ref(), budget, &options) {
            Ok(sol) => {
                prop_assert_eq!(sol.status, Status::Optimal);
                let cost = sol.cost().expect("a plan");
                prop_assert!(sol.peak_bytes().expect("a plan") <= budget);
                prop_assert!(sol.lower_bound.is_some_and(|lb| lb <= cost + 1e-9));
                Some(cost)
            }
            Err(Error::BudgetTooSmall { .. }) => None,
            Err(e) => return Err(TestCaseError::fail(e.to_string())),
        };
        match (opt, truth) {
            (Some(a), Some(b)) => prop_assert!((a - b).abs() < 1e-9, "milp {a}, exhaustive {b}"),
            (None, None) => {}
            other => prop_assert!(false, "milp/exhaustive {other:?}"),
        }
        // The paper's formulation carries the same implementation columns.
        let paper = SolveOptions { formulation: Formulation::Paper, ..SolveOptions::default() };
        if let Ok(sol) = solve(&g, milp.as_ref(), budget, &paper) {
            let cost = sol.cost().expect("a plan");
            prop_assert!(opt.is_some_and(|o| (o - cost).abs() < 1e-9), "paper {cost}, fast {opt:?}");
        } else {
            prop_assert!(opt.is_none());
        }
        for &name in STRATEGY_NAMES {
            let s = strategy_by_name(name).expect("registered");
            match solve(&g, s.as_ref(), budget, &options) {
                Ok(sol) => {
                    let plan = sol.plan.as_ref().expect("a plan");
                    let sim = simulate(&g, plan).expect("valid");
                    prop_assert!(sim.peak_bytes <= budget, "{name} over budget");
                    let opt = opt.expect("a strategy fits, so milp must");
                    prop_assert!(opt <= sim.cost + 1e-9, "{name} costs {} < milp {opt}", sim.cost);
                    if let Some(lb) = sol.lower_bound {
                        prop_assert!(lb <= opt + 1e-9, "{name}'s bound {lb} above the optimum {opt}");
                    }
                }
                Err(Error::BudgetTooSmall { .. }) => prop_assert!(opt.is_none(), "{name} says infeasible, milp has a plan"),
                Err(Error::NoPlanFound { .. }) => prop_assert!(opt.is_none() || name != "lp-round", "lp-round found no plan, milp did"),
                Err(Error::NotApplicable { .. }) => {}
                Err(e) => return Err(TestCaseError::fail(format!("{name}: {e}"))),
            }
        }
    }
}

/// A node whose default needs more workspace than the budget leaves: the leaner alternative
/// makes the budget feasible, and with room the faster one is chosen.
#[test]
fn alternatives_decide_feasibility_and_cost() {
    let chain = |alts: Vec<(u32, u64)>| {
        let alts = vec![vec![], alts, vec![]];
        random_dag(
            3,
            &[true, false, true],
            &[10, 10, 10],
            &[4, 4, 4],
            &[0, 30, 0],
            &alts,
        )
    };
    let g = chain(vec![(6, 0), (2, 60)]);
    let milp = strategy_by_name("milp").unwrap();
    let options = SolveOptions::default();
    // The default (30 bytes of workspace beside 20 live) does not fit in 25: the lean one does.
    let sol = solve(&g, milp.as_ref(), 25, &options).expect("feasible with the lean one");
    assert_eq!(sol.cost(), Some(4.0 + 6.0 + 4.0));
    // With 80 bytes the fast one fits.
    let sol = solve(&g, milp.as_ref(), 80, &options).unwrap();
    assert_eq!(sol.cost(), Some(4.0 + 2.0 + 4.0));
    assert_eq!(sol.plan.unwrap().implementation(1), 2);
    // Without alternatives 25 bytes are too few.
    let plain = chain(vec![]);
    assert!(matches!(
        solve(&plain, milp.as_ref(), 25, &options),
        Err(Error::BudgetTooSmall { .. })
    ));
}
