//! `evict` on graphs nobody tuned it to: every generated family, training and forward graphs, up
//! to 1000 nodes (where the stage-matrix models do not fit).
//!
//! - Every plan it returns is valid and within the budget (the simulator judges it).
//! - At the checkpoint-all peak it recomputes nothing (so `solve` proves it optimal).
//! - It reaches budgets below the checkpoint-all peak, and the least budget it reports is one
//!   at which it really has a plan, never below the proven floor.

use checkmate_graph::generate::{random_layered, Family, LayeredParams};
use checkmate_graph::{simulate, Graph};
use checkmate_solver::baselines::CheckpointAll;
use checkmate_solver::evict::{evict_plan, least_evict_budget, Evict};
use checkmate_solver::{solve, Error, SolveOptions, Status, Strategy};

fn check_budgets(g: &Graph) -> usize {
    let all = CheckpointAll::peak_bytes(g);
    let floor = g.min_feasible_activation_bytes();
    let mut fitted = 0;
    for fraction in [1.0, 0.9, 0.8, 0.7, 0.6, 0.5] {
        let budget = ((all as f64 * fraction) as u64).max(floor);
        let Some((plan, cost, peak)) = evict_plan(g, budget) else {
            assert!(
                fraction < 1.0,
                "{}: no plan at the checkpoint-all peak",
                g.name()
            );
            continue;
        };
        let sim = simulate(g, &plan).expect("evict's plans are valid");
        assert_eq!(sim.peak_bytes, peak);
        assert_eq!(sim.cost, cost);
        assert!(peak <= budget, "{}: peak {peak} over {budget}", g.name());
        assert!(cost >= g.total_cost() - 1e-9);
        if fraction == 1.0 {
            assert_eq!(sim.computes, g.len(), "{}: recomputes at 100%", g.name());
        } else {
            fitted += 1;
        }
    }
    fitted
}

#[test]
fn plans_are_valid_and_within_budget_on_every_family() {
    let mut below_peak = 0;
    let mut graphs = 0;
    for family in Family::ALL {
        for (nodes, seed) in [(12, 1), (30, 2), (60, 3), (120, 4)] {
            for g in [
                family.forward(nodes, seed).unwrap(),
                family.training(nodes, seed).unwrap(),
            ] {
                below_peak += check_budgets(&g);
                graphs += 1;
            }
        }
    }
    // Most budgets below the peak are reached (where the floor allows; a plan is not always
    // possible): at least half of the five per graph.
    assert!(
        below_peak * 2 >= graphs * 5,
        "{below_peak} plans below the peak on {graphs} graphs"
    );
}

#[test]
fn least_budget_is_a_budget_with_a_plan() {
    for family in Family::ALL {
        let g = family.training(40, 7).unwrap();
        let (least, plan) = least_evict_budget(&g, None);
        assert!(least >= g.min_feasible_activation_bytes());
        assert!(least <= CheckpointAll::peak_bytes(&g));
        let (_, _, peak) = evict_plan(&g, least).expect("a plan at the least budget");
        assert!(peak <= least);
        if let Some(plan) = plan {
            assert!(simulate(&g, &plan).unwrap().peak_bytes <= least);
        }
    }
}

/// A 1000-node random layered graph (Moccasin's family): `evict` answers in well under a second
/// per budget, well below the checkpoint-all peak.
#[test]
fn scales_to_a_thousand_nodes() {
    let g = random_layered(&LayeredParams::moccasin(1000, 0.31), 0).unwrap();
    let all = CheckpointAll::peak_bytes(&g);
    let budget = all * 9 / 10;
    let options = SolveOptions::default();
    let sol = solve(&g, &Evict, budget, &options).expect("a plan at 90%");
    assert_eq!(sol.status, Status::Feasible);
    assert!(sol.peak_bytes().unwrap() <= budget);
    let overhead = sol.cost().unwrap() / g.total_cost() - 1.0;
    assert!(overhead < 0.5, "overhead {overhead}");
    assert_eq!(Evict.name(), "evict");
}

/// Between the proven floor and the least budget `evict` reaches, `solve` says that nothing is
/// proven and names the budget where `evict` has a plan.
#[test]
fn refusals_name_the_least_budget_reached() {
    let g = random_layered(&LayeredParams::moccasin(200, 0.31), 1).unwrap();
    let floor = g.min_feasible_activation_bytes();
    match solve(&g, &Evict, floor, &SolveOptions::default()) {
        Err(e @ Error::NoPlanFound { .. }) => {
            let Error::NoPlanFound {
                least_feasible_bytes: Some(l),
                ..
            } = e
            else {
                panic!("no least budget named: {e}")
            };
            assert!(l > floor && l < CheckpointAll::peak_bytes(&g));
            assert!(evict_plan(&g, l).is_some());
        }
        Ok(sol) => assert!(sol.peak_bytes().unwrap() <= floor),
        Err(e) => panic!("unexpected: {e}"),
    }
}
