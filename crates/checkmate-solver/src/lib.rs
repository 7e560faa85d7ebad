//! Rematerialization strategies: given a training graph and a memory budget, a plan.
//!
//! Every strategy implements [`Strategy`]; [`solve`] runs one and judges its plan with the
//! simulator of `checkmate-graph` (strategies never report their own peak or cost). This crate does
//! not depend on any tensor library.
//!
//! ```
//! use checkmate_graph::{Graph, NodeKind, NodeSpec};
//! use checkmate_solver::{solve, strategy_by_name, SolveOptions, Status};
//!
//! let spec = |id, kind, deps: &[u64]| NodeSpec {
//!     id, name: format!("n{id}"), kind, cost: 1.0, bytes: 10, workspace_bytes: 0, deps: deps.to_vec(),
//!     alternatives: Vec::new(),
//! };
//! let g = Graph::new("chain", "flops", 0, vec![
//!     spec(0, NodeKind::Forward, &[]),
//!     spec(1, NodeKind::Forward, &[0]),
//!     spec(2, NodeKind::Loss, &[1]),
//!     spec(3, NodeKind::Backward, &[1, 2]),
//!     spec(4, NodeKind::Backward, &[0, 3]),
//! ])?;
//! let all = strategy_by_name("checkpoint-all")?;
//! let sol = solve(&g, all.as_ref(), 1_000, &SolveOptions::default())?;
//! assert_eq!(sol.status, Status::Optimal);
//! assert_eq!(sol.cost(), Some(5.0));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![warn(missing_docs)]

pub mod baselines;
pub mod bound;
mod error;
pub mod evict;
pub mod knapsack;
pub mod lp_round;
pub mod milp;
mod strategy;
pub mod sweep;

pub use error::{Error, Result};
pub use strategy::{
    default_solver_memory, peak_resident_bytes, planning_view, reset_peak_resident, solve,
    Formulation, LeastKnown, Limit, Outcome, Solution, SolveOptions, Status, Strategy,
};

use checkmate_graph::{simulate, Graph, Schedule};

/// Names of every strategy, as accepted by [`strategy_by_name`].
pub const STRATEGY_NAMES: &[&str] = &[
    "checkpoint-all",
    "checkpoint-last",
    "chen-sqrtn",
    "chen-greedy",
    "ap-sqrtn",
    "ap-greedy",
    "griewank",
    "evict",
    "lp-round",
    "milp",
];

/// The strategy called `name` on the command line.
pub fn strategy_by_name(name: &str) -> Result<Box<dyn Strategy>> {
    Ok(match name {
        "checkpoint-all" => Box::new(baselines::CheckpointAll),
        "checkpoint-last" => Box::new(baselines::CheckpointLast),
        "chen-sqrtn" => Box::new(baselines::ChenSqrtN),
        "chen-greedy" => Box::new(baselines::ChenGreedy),
        "ap-sqrtn" => Box::new(baselines::ApSqrtN),
        "ap-greedy" => Box::new(baselines::ApGreedy),
        "griewank" => Box::new(baselines::Griewank),
        "evict" => Box::new(evict::Evict),
        "lp-round" => Box::new(lp_round::LpRound),
        "milp" => Box::new(milp::Milp),
        other => return Err(Error::UnknownStrategy(other.to_string())),
    })
}

/// Simulated activation peak of a schedule's plan (the schedule must be valid).
pub(crate) fn peak_of(graph: &Graph, schedule: &Schedule) -> u64 {
    simulate(graph, &schedule.to_plan(graph))
        .expect("schedules built by strategies are valid")
        .peak_bytes
}
