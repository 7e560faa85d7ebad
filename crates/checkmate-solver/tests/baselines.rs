//! The baselines (`chen-*`, `ap-*`, `griewank`) and the sweep on random training-like DAGs and the
//! shared Checkmate graphs.

use checkmate_graph::{simulate, Graph, NodeKind, NodeSpec};
use checkmate_solver::baselines::{
    articulation_points, revolve_forward_steps, CheckpointAll, Griewank,
};
use checkmate_solver::sweep::{sweep, PointStatus, SweepOptions};
use checkmate_solver::{
    solve, strategy_by_name, Error, SolveOptions, Status, Strategy as SolverStrategy,
};
use proptest::prelude::*;

const BASELINES: &[&str] = &[
    "chen-sqrtn",
    "chen-greedy",
    "ap-sqrtn",
    "ap-greedy",
    "griewank",
];

const VGG16: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../data/graphs/checkmate/VGG16_256_224.json"
);
const RESNET50: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../data/graphs/checkmate/ResNet50_256_224.json"
);

/// A training-like graph: `m` forward layers (a chain plus skip edges `(a, b)`: layer `b` also reads
/// layer `a`), a loss on the last layer, and one backward node per layer that reads the layer's
/// output, its inputs and the gradients of its consumers (the loss for the last layer).
fn training_graph(m: usize, skips: &[(usize, usize)], bytes: &[u64], costs: &[u32]) -> Graph {
    let mut fwd_deps: Vec<Vec<usize>> = (0..m)
        .map(|j| if j > 0 { vec![j - 1] } else { vec![] })
        .collect();
    for &(a, b) in skips {
        if a + 1 < b && b < m && !fwd_deps[b].contains(&a) {
            fwd_deps[b].push(a);
        }
    }
    let loss = m;
    let bwd = |j: usize| m + 1 + (m - 1 - j);
    let node = |id: usize, kind, deps: Vec<usize>| NodeSpec {
        alternatives: Vec::new(),
        id: id as u64,
        name: format!("n{id}"),
        kind,
        cost: f64::from(costs[id]),
        bytes: bytes[id],
        workspace_bytes: 0,
        deps: deps.into_iter().map(|d| d as u64).collect(),
    };
    let mut nodes = Vec::with_capacity(2 * m + 1);
    for (j, deps) in fwd_deps.iter().enumerate() {
        nodes.push(node(j, NodeKind::Forward, deps.clone()));
    }
    nodes.push(node(loss, NodeKind::Loss, vec![m - 1]));
    for j in (0..m).rev() {
        let mut deps = vec![j];
        deps.extend(fwd_deps[j].iter().copied());
        if j == m - 1 {
            deps.push(loss);
        }
        for (c, cd) in fwd_deps.iter().enumerate() {
            if cd.contains(&j) {
                deps.push(bwd(c));
            }
        }
        nodes.push(node(bwd(j), NodeKind::Backward, deps));
    }
    Graph::new("training", "flops", 0, nodes).expect("valid graph")
}

fn graph_strategy() -> impl Strategy<Value = (Graph, f64)> {
    (1usize..=12).prop_flat_map(|m| {
        let n = 2 * m + 1;
        (
            proptest::collection::vec((0..m, 0..m), 0..=m / 2),
            proptest::collection::vec(1u64..=64, n),
            proptest::collection::vec(1u32..=5, n),
            0.0f64..=1.0,
        )
            .prop_map(move |(skips, bytes, costs, frac)| {
                (training_graph(m, &skips, &bytes, &costs), frac)
            })
    })
}

fn load(path: &str) -> Graph {
    Graph::read(path).expect("shared graph loads")
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Every baseline's plan is valid and within budget whenever `solve` succeeds; below its least
    /// feasible budget it fails with `NoPlanFound` naming that budget (a baseline proves nothing),
    /// and at that budget it succeeds.
    #[test]
    fn baselines_are_valid_and_within_budget((g, frac) in graph_strategy()) {
        let opts = SolveOptions::default();
        let lo = g.min_feasible_activation_bytes();
        let hi = CheckpointAll::peak_bytes(&g).max(lo);
        let budget = lo + ((hi - lo) as f64 * frac).round() as u64;
        for &name in BASELINES {
            let s = strategy_by_name(name).unwrap();
            let least = match s.least_feasible_budget(&g, &opts) {
                Ok(l) => l.expect("baselines know their least feasible budget"),
                Err(Error::NotApplicable { .. }) => {
                    prop_assert_eq!(name, "griewank");
                    continue;
                }
                Err(e) => panic!("{name}: {e}"),
            };
            prop_assert!(least >= lo, "{}: least {} below the proven minimum {}", name, least, lo);
            match solve(&g, s.as_ref(), budget, &opts) {
                Ok(sol) => {
                    let plan = sol.plan.as_ref().unwrap();
                    let sim = simulate(&g, plan).expect("valid plan");
                    // A baseline proves nothing, except that one compute per node is optimal.
                    let trivial = sim.cost <= g.total_cost() * (1.0 + 1e-12);
                    let expected = if trivial { Status::Optimal } else { Status::Feasible };
                    prop_assert_eq!(sol.status, expected);
                    prop_assert!(sim.peak_bytes <= budget, "{}: peak {} > {}", name, sim.peak_bytes, budget);
                    prop_assert_eq!(Some(sim.peak_bytes), sol.peak_bytes());
                    prop_assert!(sim.cost >= g.total_cost() - 1e-9);
                    prop_assert!(budget >= least);
                }
                Err(Error::NoPlanFound { least_feasible_bytes, .. }) => {
                    prop_assert!(budget < least, "{}: refused {} although {} works", name, budget, least);
                    prop_assert_eq!(least_feasible_bytes, Some(least));
                }
                Err(e) => panic!("{name}: {e}"),
            }
            if least > 0 {
                let err = solve(&g, s.as_ref(), least - 1, &opts).unwrap_err();
                match err {
                    // Below the proven floor it is proven infeasible, above it only not found.
                    Error::BudgetTooSmall { least_feasible_bytes, .. } if least <= lo => {
                        prop_assert_eq!(least_feasible_bytes, Some(least));
                    }
                    Error::NoPlanFound { least_feasible_bytes, .. } if least > lo => {
                        prop_assert_eq!(least_feasible_bytes, Some(least));
                    }
                    e => panic!("{name}: {e}"),
                }
            }
            let at_least = solve(&g, s.as_ref(), least, &opts).expect("the least budget works");
            prop_assert!(at_least.peak_bytes().unwrap() <= least);
        }
    }
}

#[test]
fn griewank_on_a_chain_matches_the_binomial_formula() {
    // Unit costs: forward = t(m, s) advances + m turns, loss and backward once each.
    for m in [1usize, 2, 3, 5, 8, 13] {
        let g = training_graph(m, &[], &vec![8; 2 * m + 1], &vec![1; 2 * m + 1]);
        for s in 1..=m.min(4) {
            let sch = Griewank::schedule(&g, s).unwrap();
            let sim = simulate(&g, &sch.to_plan(&g)).unwrap();
            let t = revolve_forward_steps(m as u64, s as u64).unwrap() as f64;
            assert_eq!(sim.cost, t + (2 * m + 1) as f64, "m={m} s={s}");
        }
    }
    // Two classic values: 10 steps, 3 slots: r = 2, t = 2 * 10 - C(5, 1) = 15; 1 slot: 45.
    assert_eq!(revolve_forward_steps(10, 3), Some(15));
    assert_eq!(revolve_forward_steps(10, 1), Some(45));
}

#[test]
fn griewank_refuses_non_chains_with_a_reason() {
    let g = training_graph(4, &[(0, 2)], &[4; 9], &[1; 9]);
    let err = solve(&g, &Griewank, u64::MAX, &SolveOptions::default()).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, Error::NotApplicable { .. }), "{msg}");
    assert!(msg.contains("not a chain"), "{msg}");
}

#[test]
fn ap_candidates_on_vgg16_are_every_forward_node() {
    let g = load(VGG16);
    let fwd: Vec<usize> = g.forward_nodes().collect();
    assert_eq!(fwd.len(), 22);
    assert_eq!(articulation_points(&g), fwd);
}

#[test]
fn ap_candidates_on_resnet50_are_the_block_boundaries() {
    let g = load(RESNET50);
    let aps = articulation_points(&g);
    let names: Vec<&str> = aps.iter().map(|&v| g.node(v).name.as_str()).collect();
    // Every residual block's output (and the add feeding it) cuts the network.
    let outs: Vec<usize> = g
        .forward_nodes()
        .filter(|&v| g.node(v).name.ends_with("_out"))
        .collect();
    assert_eq!(outs.len(), 16, "ResNet50 has 16 residual blocks");
    for v in &outs {
        assert!(
            aps.contains(v),
            "{} is not an articulation point",
            g.node(*v).name
        );
    }
    // Nothing inside a block (the two parallel paths between block boundaries) is one.
    for &v in &aps {
        let name = &g.node(v).name;
        let inside = name.contains("_block") && !name.ends_with("_out") && !name.ends_with("_add");
        assert!(
            !inside,
            "{name} inside a block is an articulation point: {names:?}"
        );
    }
    // The stem and the head are chains: all of their nodes are articulation points.
    for name in ["conv1_conv", "pool1_pool", "avg_pool", "probs"] {
        let v = g.forward_nodes().find(|&v| g.node(v).name == name).unwrap();
        assert!(aps.contains(&v), "{name} should be an articulation point");
    }
    assert_eq!(aps.len(), 16 * 2 + 6 + 2, "{names:?}");
}

#[test]
fn baselines_on_vgg16_trade_memory_for_compute() {
    let g = load(VGG16);
    let opts = SolveOptions::default();
    let all = CheckpointAll::peak_bytes(&g);
    for &name in BASELINES {
        let s = strategy_by_name(name).unwrap();
        let least = s.least_feasible_budget(&g, &opts).unwrap().unwrap();
        assert!(
            least < all,
            "{name}: least {least} not below checkpoint-all {all}"
        );
        let sol = solve(&g, s.as_ref(), least, &opts).unwrap();
        assert!(
            sol.cost().unwrap() > g.total_cost(),
            "{name} recomputes nothing at its least budget"
        );
    }
    // With the full checkpoint-all budget the greedy variants find the no-recompute plan.
    for name in ["chen-greedy", "ap-greedy"] {
        let sol = solve(&g, strategy_by_name(name).unwrap().as_ref(), all, &opts).unwrap();
        assert_eq!(sol.cost(), Some(g.total_cost()), "{name}");
    }
}

#[test]
fn sweep_on_vgg16_marks_infeasible_points_and_is_monotone() {
    let g = load(VGG16);
    let strategies: Vec<Box<dyn SolverStrategy>> =
        ["checkpoint-all", "chen-greedy", "ap-sqrtn", "griewank"]
            .iter()
            .map(|n| strategy_by_name(n).unwrap())
            .collect();
    let calls = std::sync::atomic::AtomicUsize::new(0);
    let result = sweep(
        &g,
        &strategies,
        &SweepOptions {
            points: 4,
            ..Default::default()
        },
        &|_| {
            calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        },
    )
    .unwrap();
    assert_eq!(result.budgets.len(), 4);
    assert_eq!(result.points.len(), 16);
    assert_eq!(calls.into_inner(), 16);
    assert_eq!(*result.budgets.last().unwrap(), result.checkpoint_all_peak);
    let least = result
        .bounds
        .iter()
        .filter_map(|b| b.least_feasible_bytes)
        .min()
        .unwrap();
    assert_eq!(
        result.budgets[0],
        least.max(g.min_feasible_activation_bytes())
    );
    for (b, &budget) in result.budgets.iter().enumerate() {
        let all = result.point(b, "checkpoint-all").unwrap();
        if budget < result.checkpoint_all_peak {
            assert_eq!(all.status, PointStatus::NoPlanFound);
            assert!(all.cost.is_none());
        } else {
            assert_eq!(all.overhead, Some(0.0));
        }
        for p in result.points.iter().filter(|p| p.budget_bytes == budget) {
            if let Some(peak) = p.peak_bytes {
                assert!(peak <= budget, "{}: {peak} > {budget}", p.strategy);
            }
        }
    }
    // The greedy frontier only gets cheaper with more memory.
    let costs: Vec<f64> = (0..4)
        .filter_map(|b| result.point(b, "chen-greedy").unwrap().cost)
        .collect();
    assert!(costs.windows(2).all(|w| w[1] <= w[0]), "{costs:?}");
}

/// `solve` never answers worse than a plan it was given: the cheapest incumbent within budget
/// replaces a costlier plan (and says so); one over budget is ignored.
#[test]
fn solve_returns_a_cheaper_incumbent_and_ignores_one_over_budget() {
    let m = 9;
    let g = training_graph(m, &[], &vec![8; 2 * m + 1], &vec![1; 2 * m + 1]);
    let all = CheckpointAll::peak_bytes(&g);
    let everything = CheckpointAll::schedule(&g).to_plan(&g);
    let chen = strategy_by_name("chen-sqrtn").unwrap();
    let own = solve(&g, chen.as_ref(), all, &SolveOptions::default()).unwrap();
    assert!(
        own.cost().unwrap() > g.total_cost(),
        "chen-sqrtn recomputes"
    );
    let given = SolveOptions {
        incumbents: vec![everything],
        ..SolveOptions::default()
    };
    let sol = solve(&g, chen.as_ref(), all, &given).unwrap();
    assert_eq!(sol.cost(), Some(g.total_cost()));
    assert!(sol.from_incumbent);
    // (One compute per node: no plan is cheaper.)
    assert_eq!(sol.status, Status::Optimal);
    let tighter = solve(&g, chen.as_ref(), all - 1, &given).unwrap();
    assert!(!tighter.from_incumbent);
    assert!(tighter.peak_bytes().unwrap() < all);
}
