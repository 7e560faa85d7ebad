//! The one error type of `checkmate-solver`.

use thiserror::Error;

/// What can go wrong while scheduling.
#[derive(Debug, Error)]
pub enum Error {
    /// Proven infeasible: no schedule of any strategy fits the budget (it is below a proven floor
    /// on every plan's peak, or the exact solver proved it).
    #[error(
        "{strategy}: activation budget {budget_bytes} bytes is too small: {}{}",
        match proven_lower_bound_bytes {
            Some(lb) => format!("no schedule fits in less than {lb} activation bytes (total {} with static memory)", lb + static_bytes),
            None => format!("{strategy} proved that no schedule fits within it"),
        },
        match least_feasible_bytes {
            Some(l) => format!("; the least activation budget that works for {strategy} is {l} bytes (total {} with static memory)", l + static_bytes),
            None => String::new(),
        }
    )]
    BudgetTooSmall {
        /// The strategy asked.
        strategy: String,
        /// The activation budget it was given.
        budget_bytes: u64,
        /// The graph's static bytes (added to report total budgets).
        static_bytes: u64,
        /// The least activation budget at which this strategy finds a plan, when known (always
        /// above `budget_bytes`).
        least_feasible_bytes: Option<u64>,
        /// A proven lower bound on any plan's peak, above `budget_bytes`; `None` when the proof is
        /// the solver's infeasibility proof at this budget.
        proven_lower_bound_bytes: Option<u64>,
    },
    /// The strategy found no plan within the budget, but none is proven impossible: the budget is
    /// at or above the proven floor, so another strategy, a longer time limit or a larger budget
    /// may find one. The least feasible budget lies between `proven_floor_bytes` and
    /// `known_plan_bytes`, and the message says so with the gap.
    #[error(
        "{strategy} found no plan within {budget_bytes} activation bytes (total {} with static memory){}; this does not prove that none exists: the least feasible activation budget is bracketed between {proven_floor_bytes} bytes (proven: no plan fits below) and {known_plan_bytes} bytes ({known_plan_by} has a plan there), a gap of {:.1}%: try {}a longer --time-limit, or a larger budget",
        budget_bytes + static_bytes,
        match least_feasible_bytes {
            Some(l) => format!("; the least activation budget at which {strategy} finds one is {l} bytes (total {} with static memory)", l + static_bytes),
            None => String::new(),
        },
        100.0 * (*known_plan_bytes as f64 / (*proven_floor_bytes).max(1) as f64 - 1.0),
        if strategy == "milp" { "" } else { "--strategy milp, " }
    )]
    NoPlanFound {
        /// The strategy asked.
        strategy: String,
        /// The activation budget it was given.
        budget_bytes: u64,
        /// The graph's static bytes.
        static_bytes: u64,
        /// The least activation budget at which this strategy finds a plan, when known (always
        /// above `budget_bytes`).
        least_feasible_bytes: Option<u64>,
        /// The proven floor on every plan's peak (at most `budget_bytes`).
        proven_floor_bytes: u64,
        /// The least activation budget at which a plan is known (of this strategy, of `evict`
        /// or checkpoint-all's peak, whichever is least; above `budget_bytes`): the upper end of
        /// the bracket on the least feasible budget.
        known_plan_bytes: u64,
        /// The strategy that has a plan at `known_plan_bytes`.
        known_plan_by: String,
    },
    /// The total budget does not even hold the static memory.
    #[error("budget {total_bytes} bytes does not hold the static memory ({static_bytes} bytes: parameters, gradients, optimizer state, inputs); give at least {static_bytes} plus the activation memory")]
    BelowStatic {
        /// The total budget.
        total_bytes: u64,
        /// The graph's static bytes.
        static_bytes: u64,
    },
    /// No strategy of that name exists.
    #[error("unknown strategy {0:?}; known strategies: {known}", known = crate::STRATEGY_NAMES.join(", "))]
    UnknownStrategy(String),
    /// The strategy does not apply to this graph.
    #[error("{strategy} does not apply to graph {graph:?}: {reason}")]
    NotApplicable {
        /// The strategy.
        strategy: String,
        /// The graph's name.
        graph: String,
        /// Why.
        reason: String,
    },
    /// The LP/MILP solver failed.
    #[error("{strategy}: solver failure: {message}")]
    Solver {
        /// The strategy.
        strategy: String,
        /// What HiGHS reported.
        message: String,
    },
    /// A bug: a strategy produced a plan that the simulator rejects.
    #[error("{strategy} produced an invalid plan (a bug, please report it): {source}")]
    InvalidPlan {
        /// The strategy.
        strategy: String,
        /// The simulator's verdict.
        source: checkmate_graph::PlanError,
    },
    /// An error from the graph crate.
    #[error(transparent)]
    Graph(#[from] checkmate_graph::Error),
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
