//! Frontiers a user can trust: on graphs nobody tuned the solver to, no strategy's sweep costs
//! more at a larger budget, and a point that says "optimal" is not beaten by another strategy.

use checkmate_graph::generate::{random_layered, with_backward, LayeredParams};
use checkmate_graph::Graph;
use checkmate_solver::sweep::{sweep, PointStatus, Sweep, SweepOptions};
use checkmate_solver::{strategy_by_name, SolveOptions, Strategy, STRATEGY_NAMES};
use std::time::Duration;

/// Every strategy: the baselines, `lp-round` and `milp`.
fn strategies() -> Vec<Box<dyn Strategy>> {
    STRATEGY_NAMES
        .iter()
        .map(|n| strategy_by_name(n).unwrap())
        .collect()
}

fn run(g: &Graph, points: usize, limit: f64) -> Sweep {
    let options = SweepOptions {
        points,
        solve: SolveOptions {
            time_limit: Some(Duration::from_secs_f64(limit)),
            threads: 1,
            ..SolveOptions::default()
        },
    };
    sweep(g, &strategies(), &options, &|_| {}).expect("sweep runs")
}

/// The frontier properties of one sweep.
fn check(s: &Sweep, what: &str) {
    let per = s.bounds.len();
    for (k, bound) in s.bounds.iter().enumerate() {
        let name = &bound.strategy;
        let mut last: Option<(u64, f64)> = None;
        for (b, &budget) in s.budgets.iter().enumerate() {
            let p = &s.points[b * per + k];
            assert_eq!(&p.strategy, name);
            if let Some(peak) = p.peak_bytes {
                assert!(peak <= budget, "{what}: {name} over budget at {budget}");
            }
            if let Some(from) = p.carried_from {
                assert!(
                    from < budget,
                    "{what}: {name} at {budget} carried from {from}"
                );
                assert!(p.cost.is_some(), "{what}: {name} carried no plan");
            }
            match (last, p.cost) {
                (Some((lb, lc)), Some(c)) => assert!(
                    c <= lc + 1e-9 * lc.abs(),
                    "{what}: {name} costs {c} at {budget}, more than {lc} at {lb}"
                ),
                (Some((lb, _)), None) => panic!(
                    "{what}: {name} has a plan at {lb} but none at {budget} ({})",
                    p.status
                ),
                _ => {}
            }
            if let Some(c) = p.cost {
                last = Some((budget, c));
            }
            if let (Some(lb), Some(c)) = (p.lower_bound, p.cost) {
                assert!(
                    lb <= c * (1.0 + 1e-9),
                    "{what}: {name} bound {lb} above {c}"
                );
            }
        }
    }
    // A point proven optimal is not beaten at its budget (within the MIP gap).
    for (b, &budget) in s.budgets.iter().enumerate() {
        let row = &s.points[b * per..(b + 1) * per];
        let best = row
            .iter()
            .filter_map(|p| p.cost)
            .fold(f64::INFINITY, f64::min);
        for p in row.iter().filter(|p| p.proven_optimal()) {
            let c = p.cost.unwrap();
            assert!(
                c <= best * (1.0 + 1e-4) + 1e-9,
                "{what}: {} 'optimal' {c} at {budget}, another strategy has {best}",
                p.strategy
            );
        }
        // milp starts from every baseline's plan: it is never worse than one.
        if let Some(m) = row
            .iter()
            .find(|p| p.strategy == "milp")
            .and_then(|p| p.cost)
        {
            for p in row.iter().filter(|p| p.strategy != "lp-round") {
                if let Some(c) = p.cost {
                    assert!(m <= c + 1e-9, "{what}: milp {m} above {} {c}", p.strategy);
                }
            }
        }
    }
}

#[test]
fn every_strategy_is_non_increasing_on_generated_layered_graphs() {
    let mut swept = 0;
    for seed in 0..6u64 {
        let n = 30 + (seed as usize * 7) % 20;
        let g = random_layered(&LayeredParams::moccasin(n, 0.3), 1000 + seed).unwrap();
        let s = run(&g, 6, 0.5);
        check(&s, &format!("layered seed {seed} ({n} nodes)"));
        swept += s.budgets.len();
        // The sweep starts where a plan is known, below checkpoint-all's peak where one exists.
        let solved = s
            .points
            .iter()
            .filter(|p| matches!(p.status, PointStatus::Solved(_)))
            .count();
        assert!(
            solved >= s.budgets.len(),
            "layered seed {seed}: {solved} plans"
        );
    }
    assert!(swept >= 20, "only {swept} budgets swept");
}

#[test]
fn every_strategy_is_non_increasing_on_generated_training_graphs() {
    for seed in 0..4u64 {
        let n = 14 + (seed as usize * 3) % 8;
        let f = random_layered(&LayeredParams::moccasin(n, 0.3), 2000 + seed).unwrap();
        let g = with_backward(&f).unwrap();
        let s = run(&g, 6, 0.5);
        check(&s, &format!("training seed {seed} ({} nodes)", g.len()));
    }
}
