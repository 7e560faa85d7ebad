//! The least feasible budget (sound bounds, a plan at the reported budget) and the shared check that
//! rejects budgets below any single compute's need before a strategy runs.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use checkmate_graph::{simulate, Graph};
use checkmate_solver::baselines::CheckpointAll;
use checkmate_solver::{
    milp, solve, strategy_by_name, Error, Outcome, SolveOptions, Status, Strategy,
};

const VGG16: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../data/graphs/checkmate/VGG16_256_224.json"
);

fn vgg16() -> Graph {
    Graph::read(VGG16).unwrap_or_else(|e| panic!("cannot read {VGG16}: {e}"))
}

/// A strategy that counts how often it is asked and returns checkpoint-all.
struct Counting(AtomicUsize);

impl Strategy for Counting {
    fn name(&self) -> &'static str {
        "counting"
    }

    fn plan(
        &self,
        graph: &Graph,
        budget_bytes: u64,
        options: &SolveOptions,
    ) -> checkmate_solver::Result<Outcome> {
        self.0.fetch_add(1, Ordering::SeqCst);
        CheckpointAll.plan(graph, budget_bytes, options)
    }
}

#[test]
fn budgets_below_the_largest_single_compute_are_rejected_before_any_strategy_runs() {
    let g = vgg16();
    let floor = g.min_feasible_activation_bytes();
    let counting = Counting(AtomicUsize::new(0));
    match solve(&g, &counting, floor - 1, &SolveOptions::default()) {
        Err(Error::BudgetTooSmall {
            proven_lower_bound_bytes,
            ..
        }) => assert_eq!(proven_lower_bound_bytes, Some(floor)),
        other => panic!("expected BudgetTooSmall, got {other:?}"),
    }
    assert_eq!(counting.0.load(Ordering::SeqCst), 0, "the strategy ran");
    // Every registered strategy answers the same way (lp-round and milp included).
    for name in ["lp-round", "milp", "chen-greedy"] {
        let s = strategy_by_name(name).unwrap();
        let opts = SolveOptions {
            time_limit: Some(Duration::from_secs(5)),
            ..SolveOptions::default()
        };
        assert!(
            matches!(
                solve(&g, s.as_ref(), floor - 1, &opts),
                Err(Error::BudgetTooSmall { .. })
            ),
            "{name}"
        );
    }
}

#[test]
fn least_feasible_on_vgg16_is_bracketed_and_has_a_plan() {
    let g = vgg16();
    let options = SolveOptions {
        time_limit: Some(Duration::from_secs(10)),
        ..SolveOptions::default()
    };
    let lf = milp::least_feasible(&g, &options).expect("runs");
    assert!(lf.lower_bound >= g.min_feasible_activation_bytes());
    assert!(lf.lower_bound <= lf.bytes);
    assert!(lf.bytes <= CheckpointAll::peak_bytes(&g));
    // A plan exists at the reported budget: lp-round finds one, and it fits.
    let lp = strategy_by_name("lp-round").unwrap();
    let sol =
        solve(&g, lp.as_ref(), lf.bytes, &options).expect("a plan at the least feasible budget");
    assert!(matches!(sol.status, Status::Feasible | Status::Optimal));
    let plan = sol.plan.expect("plan");
    assert!(simulate(&g, &plan).unwrap().peak_bytes <= lf.bytes);
}
