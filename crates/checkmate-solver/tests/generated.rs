//! Properties on graphs nobody tuned the solver to: our own random layered DAGs (the family of
//! Moccasin's benchmark, at the size where `lp-round` once called feasible budgets infeasible).
//!
//! At budgets between the proven floor and the checkpoint-all peak:
//! - `lp-round` returns a plan wherever `milp` finds one;
//! - no error names a least budget at or below the budget it refuses, and "no plan found" is
//!   never reported as "infeasible" below a plan `milp` found.
//!
//! On every family of [`Family`] (chains, U-Nets with skips, residual blocks, transformer blocks,
//! random layered), `lp-round` is within 5% of `milp`'s proven optimum.
//!
//! The graphs where lp-round used to fail are kept as data in `tests/data/generated/`
//! (`cases.json`), each with its proven optimum: lp-round must now be within 5% of it.

use std::sync::Mutex;
use std::time::Duration;

use checkmate_graph::generate::{random_layered, Family, LayeredParams};
use checkmate_graph::Graph;
use checkmate_solver::baselines::CheckpointAll;
use checkmate_solver::{solve, strategy_by_name, Error, Solution, SolveOptions, Status};

/// HiGHS runs one solve at a time per process (`milp::run`'s lock): the tests of this file would
/// otherwise wait for each other's solves inside their own time limits (on CI, lp-round spent part
/// of its 11 s on `layered_n44_s11` waiting for the other test's 20 s `milp`, and missed 5%).
/// Each test holds this lock for its whole run.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

fn options(limit: f64) -> SolveOptions {
    SolveOptions {
        time_limit: Some(Duration::from_secs_f64(limit)),
        threads: 1,
        ..SolveOptions::default()
    }
}

/// A random layered DAG of 20 to 36 nodes (up to about 12 levels), the family of the report of
/// issue 24 (its graphs had about 40 nodes; the MILP proofs on these stay within seconds).
fn small_layered(seed: u64) -> Graph {
    let nodes = 20 + (seed as usize * 7) % 17;
    random_layered(&LayeredParams::moccasin(nodes, 0.27), seed).expect("valid parameters")
}

/// Budgets a quarter, half and three quarters of the way from the floor to checkpoint-all's peak.
fn budgets(g: &Graph) -> Vec<u64> {
    let floor = g.min_feasible_activation_bytes();
    let all = CheckpointAll::peak_bytes(g);
    [0.25, 0.5, 0.75]
        .iter()
        .map(|f| floor + ((all - floor) as f64 * f) as u64)
        .collect()
}

/// Checks an error's figures against the budget it refuses.
fn check_error(e: &Error, budget: u64, what: &str) {
    match e {
        Error::BudgetTooSmall {
            least_feasible_bytes,
            proven_lower_bound_bytes,
            ..
        } => {
            assert!(
                least_feasible_bytes.map_or(true, |l| l > budget),
                "{what}: {e}"
            );
            assert!(
                proven_lower_bound_bytes.map_or(true, |l| l > budget),
                "{what}: {e}"
            );
        }
        Error::NoPlanFound {
            least_feasible_bytes,
            proven_floor_bytes,
            ..
        } => {
            assert!(
                least_feasible_bytes.map_or(true, |l| l > budget),
                "{what}: {e}"
            );
            assert!(*proven_floor_bytes <= budget, "{what}: {e}");
        }
        other => panic!("{what}: unexpected error {other}"),
    }
}

fn run(g: &Graph, name: &str, budget: u64, limit: f64) -> Result<Solution, Error> {
    let s = strategy_by_name(name).unwrap();
    solve(g, s.as_ref(), budget, &options(limit))
}

/// lp-round finds a plan wherever milp does, and says "infeasible" only with a proof.
fn lp_round_matches_milp(g: &Graph, what: &str) -> (usize, f64) {
    let (mut compared, mut worst) = (0usize, 1.0f64);
    for budget in budgets(g) {
        let what = format!("{what} at {budget}");
        // 10 s: every proof on these graphs takes under 5 s; a budget milp cannot settle in 10 s
        // (seed 108's tightest) checks only that neither claims what it cannot prove.
        let milp = run(g, "milp", budget, 10.0);
        let lp = run(g, "lp-round", budget, 8.0);
        if let Err(e) = &milp {
            check_error(e, budget, &what);
        }
        if let Err(e) = &lp {
            check_error(e, budget, &what);
        }
        match (&milp, &lp) {
            (Ok(m), Ok(l)) => {
                if let (Some(mc), Some(lc)) = (m.cost(), l.cost()) {
                    compared += 1;
                    worst = worst.max(lc / mc);
                }
            }
            (Ok(m), Err(e)) if m.plan.is_some() => {
                panic!(
                    "{what}: milp found a plan (cost {:?}), lp-round: {e}",
                    m.cost()
                )
            }
            (Err(Error::BudgetTooSmall { .. }), Ok(l)) if l.plan.is_some() => {
                panic!("{what}: milp says infeasible, lp-round has a plan")
            }
            _ => {}
        }
    }
    (compared, worst)
}

#[test]
fn lp_round_finds_a_plan_wherever_milp_does_on_generated_graphs() {
    let _serial = serial();
    let mut compared = 0;
    let mut worst = 1.0f64;
    // Eight seeds (24 budgets, about 100 s in CI); the family test below covers the 5% bound on
    // more graph shapes.
    for seed in 100..108 {
        let g = small_layered(seed);
        let (c, w) = lp_round_matches_milp(&g, &format!("seed {seed} ({} nodes)", g.len()));
        compared += c;
        worst = worst.max(w);
    }
    assert!(compared >= 16, "only {compared} budgets compared");
    assert!(worst <= 1.05, "lp-round / milp worst {worst:.3}");
}

#[test]
fn lp_round_is_within_five_percent_where_it_once_failed() {
    let _serial = serial();
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/generated");
    let text = std::fs::read_to_string(format!("{dir}/cases.json")).unwrap();
    let cases: serde_json::Value = serde_json::from_str(&text).unwrap();
    let cases = cases["cases"].as_array().unwrap();
    assert!(cases.len() >= 5);
    for case in cases {
        let file = case["graph"].as_str().unwrap();
        let g = Graph::read(format!("{dir}/{file}")).unwrap();
        let budget = case["budget_bytes"].as_u64().unwrap();
        let optimum = case["optimal_cost"].as_f64().unwrap();
        // Three times lp-round's default limit for graphs of this size (0.25 s per node, at least
        // 8 s): this test asserts the quality of the plan, not its speed. Within the default limit
        // the polish MILP reached 5% alone, but not when `cargo xtask ci` ran other test binaries
        // on the same two cores (it failed at 11 s there); the time lp-round takes is measured by
        // `cargo xtask bench solver`. A proven optimum ends the solve early, so the longer limit
        // costs nothing where the plan is settled.
        let limit = 3.0 * (g.len() as f64 * 0.25).max(8.0);
        let sol = run(&g, "lp-round", budget, limit)
            .unwrap_or_else(|e| panic!("{file} at {budget}: {e}"));
        let cost = sol.cost().unwrap();
        assert!(
            cost >= optimum - 1e-6,
            "{file}: {cost} below the proven optimum"
        );
        assert!(
            cost <= 1.05 * optimum,
            "{file} at {budget}: lp-round {cost} vs optimum {optimum} ({:.3}x)",
            cost / optimum
        );
    }
}

/// `lp-round` within 5% of `milp`'s proven optimum on training graphs of every generated family
/// (21 to 41 nodes, three budgets each), with a plan wherever `milp` has one. (With 61-node graphs
/// too, 44 proven optima: geometric mean 1.0000, worst 1.0007; 3.5 minutes, too long for CI.)
#[test]
fn lp_round_is_within_five_percent_on_every_family() {
    let _serial = serial();
    let mut ratios = Vec::new();
    for family in Family::ALL {
        for (i, nodes) in [10, 20].into_iter().enumerate() {
            let seed = 300 + i as u64;
            let g = family.training(nodes, seed).unwrap();
            for budget in budgets(&g) {
                let what = format!("{} ({} nodes) at {budget}", g.name(), g.len());
                let milp = run(&g, "milp", budget, 30.0);
                let lp = run(&g, "lp-round", budget, 5.0);
                match (&milp, &lp) {
                    (Ok(m), Ok(l)) if m.status == Status::Optimal => {
                        let (mc, lc) = (m.cost().unwrap(), l.cost().unwrap());
                        ratios.push((lc / mc, what.clone()));
                    }
                    (Ok(m), Err(e)) if m.plan.is_some() => {
                        panic!("{what}: milp found a plan, lp-round: {e}")
                    }
                    (Err(e), _) => check_error(e, budget, &what),
                    _ => {}
                }
                if let Err(e) = &lp {
                    check_error(e, budget, &what);
                }
            }
        }
    }
    assert!(ratios.len() >= 24, "only {} proven optima", ratios.len());
    let geomean = (ratios.iter().map(|(r, _)| r.ln()).sum::<f64>() / ratios.len() as f64).exp();
    let (worst, at) = ratios.iter().max_by(|a, b| a.0.total_cmp(&b.0)).unwrap();
    eprintln!(
        "{} proven optima: lp-round / optimum geometric mean {geomean:.4}, worst {worst:.4} ({at})",
        ratios.len()
    );
    assert!(
        *worst <= 1.05,
        "lp-round / optimum {worst:.3} at {at} (geometric mean {geomean:.4})"
    );
}
