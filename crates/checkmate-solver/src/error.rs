//! The one error type of `checkmate-solver`.

use thiserror::Error;

/// What can go wrong while scheduling.
#[derive(Debug, Error)]
pub enum Error {
    /// The budget is below what the strategy needs.
    #[error(
        "{strategy}: activation budget {budget_bytes} bytes is too small; {}",
        match (least_feasible_bytes, proven_lower_bound_bytes) {
            (Some(l), _) => format!("the least activation budget that works for {strategy} is {l} bytes (total {} with static memory)", l + static_bytes),
            (None, Some(lb)) => format!("no schedule fits in less than {lb} activation bytes (total {} with static memory)", lb + static_bytes),
            (None, None) => "no schedule was found".to_string(),
        }
    )]
    BudgetTooSmall {
        /// The strategy asked.
        strategy: String,
        /// The activation budget it was given.
        budget_bytes: u64,
        /// The graph's static bytes (added to report total budgets).
        static_bytes: u64,
        /// The least activation budget at which this strategy finds a plan, when known.
        least_feasible_bytes: Option<u64>,
        /// A proven lower bound on any plan's peak, when known.
        proven_lower_bound_bytes: Option<u64>,
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
