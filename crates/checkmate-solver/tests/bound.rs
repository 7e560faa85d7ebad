//! The stage-cover bound (`checkmate_solver::bound`) is a lower bound: never above `milp`'s proven
//! optimum, never above the cost of any strategy's plan, on generated graphs of every family; and
//! it is exact where the answer is known by hand.

use checkmate_graph::generate::{random_layered, Family, LayeredParams};
use checkmate_graph::{Graph, NodeKind, NodeSpec};
use checkmate_solver::baselines::CheckpointAll;
use checkmate_solver::bound::{stage_cover_bound, StageCover};
use checkmate_solver::{solve, strategy_by_name, SolveOptions, Status, STRATEGY_NAMES};
use std::time::Duration;

fn bound(g: &Graph, budget: u64) -> Option<f64> {
    match stage_cover_bound(g, budget, None).expect("HiGHS runs") {
        StageCover::Bound(b) => Some(b),
        StageCover::Infeasible => None,
    }
}

fn budgets(g: &Graph) -> Vec<u64> {
    let floor = g.min_feasible_activation_bytes();
    let all = CheckpointAll::peak_bytes(g);
    [0.0, 0.5, 1.0]
        .iter()
        .map(|f| floor + ((all - floor) as f64 * f) as u64)
        .collect()
}

/// Below every plan of every strategy, and below milp's proven optimum.
#[test]
fn is_below_every_plan_and_the_proven_optimum() {
    let options = SolveOptions {
        time_limit: Some(Duration::from_secs(10)),
        threads: 1,
        ..SolveOptions::default()
    };
    let mut graphs: Vec<Graph> = Family::ALL
        .iter()
        .map(|f| f.training(9, 7).unwrap())
        .collect();
    graphs.push(random_layered(&LayeredParams::moccasin(24, 0.27), 3).unwrap());
    let (mut proven, mut above_base) = (0, 0);
    for g in &graphs {
        for budget in budgets(g) {
            let b = bound(g, budget).expect("budgets at or above the floor");
            assert!(b >= g.total_cost() - 1e-9);
            if b > g.total_cost() * (1.0 + 1e-9) {
                above_base += 1;
            }
            // Every strategy but lp-round (whose plans milp's optimum bounds; it would only add
            // time): the baselines and evict in milliseconds, milp with its proof.
            for &name in STRATEGY_NAMES.iter().filter(|&&n| n != "lp-round") {
                let s = strategy_by_name(name).unwrap();
                let Ok(sol) = solve(g, s.as_ref(), budget, &options) else {
                    continue;
                };
                let Some(cost) = sol.cost() else { continue };
                assert!(
                    b <= cost * (1.0 + 1e-9),
                    "{} at {budget}: bound {b} above {name}'s plan {cost}",
                    g.name()
                );
                if name == "milp" && sol.status == Status::Optimal {
                    proven += 1;
                }
            }
        }
    }
    assert!(proven >= 10, "only {proven} proven optima compared");
    assert!(
        above_base >= 3,
        "the bound rose above one compute per node at only {above_base} budgets"
    );
}

/// A chain a -> b -> c -> loss -> c' -> b' -> a' (forward tensors of 10 bytes, read by the
/// matching backward node): with room for only part of the forward tensors, the cheapest drop
/// is known by hand.
#[test]
fn equals_the_cheapest_drop_on_a_small_chain() {
    let spec = |id: u64, cost: f64, deps: &[u64]| NodeSpec {
        alternatives: Vec::new(),
        id,
        name: format!("n{id}"),
        kind: NodeKind::Forward,
        cost,
        bytes: 10,
        workspace_bytes: 0,
        deps: deps.to_vec(),
    };
    // 0 -> 1 -> 2 -> 3 (loss); backward 4 reads 3 and 2, 5 reads 4 and 1, 6 reads 5 and 0.
    let g = Graph::new(
        "chain",
        "flops",
        0,
        vec![
            spec(0, 5.0, &[]),
            spec(1, 1.0, &[0]),
            spec(2, 3.0, &[1]),
            spec(3, 1.0, &[2]),
            spec(4, 1.0, &[3, 2]),
            spec(5, 1.0, &[4, 1]),
            spec(6, 1.0, &[5, 0]),
        ],
    )
    .unwrap();
    let base = g.total_cost();
    // First compute of 4: 4, 3 and 2 (30 bytes) with 0 and 1 kept for 5 and 6: 50 bytes, the
    // checkpoint-all peak. With 40, one of 0 (cost 5) and 1 (cost 1) must go: the cheapest drop
    // costs 1. With 30, both must go at 4 (cost 6), which also covers 3 and 5.
    assert_eq!(bound(&g, 50), Some(base));
    let close = |b: Option<f64>, want: f64| b.is_some_and(|b| (b - want).abs() < 1e-6);
    assert!(close(bound(&g, 40), base + 1.0), "{:?}", bound(&g, 40));
    assert!(close(bound(&g, 30), base + 6.0), "{:?}", bound(&g, 30));
    // Below the floor (node 4 with its inputs: 30 bytes), no plan.
    assert_eq!(bound(&g, 29), None);
}
