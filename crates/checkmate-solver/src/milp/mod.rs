//! `milp`: Checkmate's optimal schedule from a mixed-integer program solved by HiGHS.
//!
//! Two formulations ([`Formulation`]): the paper's, constraint for constraint, and our tightened
//! default, which fixes variables that cannot matter, makes `FREE` continuous with disaggregated
//! upper bounds and drops the constraints that only push `FREE` down. Both count memory
//! conservatively with respect to the simulator and exactly for every schedule without useless
//! keeps or computes, so they have the same optimum (see `docs/FORMULATION.md`).
//!
//! The solution's `S` is turned into a plan by Algorithm 2 and Algorithm 1 and judged by the
//! simulator; should floating-point tolerance ever let a plan exceed the budget, the model is
//! solved again with the budget reduced by the overshoot.

pub(crate) mod model;
pub(crate) mod run;
pub(crate) mod warm;

use std::time::{Duration, Instant};

use checkmate_graph::{Graph, Plan, Schedule};

use crate::error::Result;
use crate::strategy::{Outcome, SolveOptions, Status, Strategy};
use model::{BudgetMode, Model};
use run::{RunOptions, RunStatus};

/// Name of the strategy.
pub const NAME: &str = "milp";

/// The optimal MILP strategy (see the module docs).
#[derive(Debug, Clone, Copy, Default)]
pub struct Milp;

/// A heuristic schedule within budget: the starting incumbent.
#[derive(Debug, Clone)]
pub(crate) struct Incumbent {
    pub(crate) schedule: Schedule,
    pub(crate) plan: Plan,
    pub(crate) cost: f64,
}

/// The cheapest plan within `budget` among the other strategies that need no solver, turned into
/// a frontier-advancing schedule.
pub(crate) fn best_heuristic(
    graph: &Graph,
    budget: u64,
    options: &SolveOptions,
) -> Option<Incumbent> {
    let mut best: Option<Incumbent> = None;
    for &name in crate::STRATEGY_NAMES {
        if name == NAME || name == crate::lp_round::NAME {
            continue;
        }
        let Ok(strategy) = crate::strategy_by_name(name) else {
            continue;
        };
        let plan = match strategy.plan(graph, budget, options) {
            Ok(Outcome {
                plan: Some(plan), ..
            }) => plan,
            _ => continue,
        };
        let keeps = warm::keeps_of_plan(graph, &plan);
        let schedule = warm::schedule_for_keeps(graph, &keeps);
        let Some((plan, peak, cost)) = warm::judge(graph, &schedule) else {
            continue;
        };
        tracing::trace!(name, peak, cost, "heuristic incumbent candidate");
        if peak <= budget && best.as_ref().map_or(true, |b| cost < b.cost) {
            best = Some(Incumbent {
                schedule,
                plan,
                cost,
            });
        }
    }
    best
}

/// Result of one MILP solve with extraction.
#[derive(Debug, Clone)]
pub(crate) struct MilpResult {
    pub(crate) best: Option<Incumbent>,
    pub(crate) status: RunStatus,
    pub(crate) lower_bound: Option<f64>,
}

fn remaining(start: Instant, limit: Option<Duration>) -> Option<Duration> {
    limit.map(|l| l.saturating_sub(start.elapsed()))
}

/// Solves the MILP at `budget` and returns the best simulated plan within budget (the solver's or
/// the incumbent's).
pub(crate) fn solve_milp(
    graph: &Graph,
    budget: u64,
    options: &SolveOptions,
    incumbent: Option<Incumbent>,
) -> Result<MilpResult> {
    let start = Instant::now();
    let mut model_budget = budget;
    let mut best = incumbent;
    let mut use_warm = true;
    for attempt in 0..4 {
        let t0 = Instant::now();
        let model = Model::build(
            graph,
            BudgetMode::Bytes(model_budget),
            options.formulation,
            true,
        );
        tracing::debug!(
            attempt,
            formulation = ?options.formulation,
            cols = model.num_cols(),
            ints = model.num_int(),
            rows = model.num_rows(),
            seconds = t0.elapsed().as_secs_f64(),
            "built MILP"
        );
        let warm_start = best
            .as_ref()
            .filter(|_| use_warm)
            .and_then(|b| warm::warm_vector(graph, &model, &b.schedule));
        let warm_passed = warm_start.is_some();
        if best.is_some() && warm_start.is_none() {
            tracing::debug!("the incumbent does not fit the model's memory count; not passed");
        }
        let opts = RunOptions {
            time_limit: remaining(start, options.time_limit),
            mip_gap: options.mip_gap,
            threads: options.threads,
            warm_start,
            seed: options.seed,
            strategy: NAME,
        };
        let res = run::run(&model, &opts)?;
        let lower_bound = res.dual_bound.map(|b| b.max(0.0));
        let Some(x) = res.x.as_ref() else {
            return Ok(MilpResult {
                best,
                status: res.status,
                lower_bound,
            });
        };
        let keeps = warm::keeps_of_solution(&model, x);
        let schedule = warm::schedule_for_keeps(graph, &keeps);
        let Some((plan, peak, cost)) = warm::judge(graph, &schedule) else {
            return Err(crate::Error::Solver {
                strategy: NAME.into(),
                message: "the MILP solution gave an invalid schedule (a bug)".into(),
            });
        };
        tracing::debug!(peak, cost, objective = ?res.objective, status = ?res.status, "MILP solution");
        let objective = res.objective.unwrap_or(f64::INFINITY);
        let slack = options.mip_gap.max(0.0) * objective.abs() + 1e-6 * (1.0 + objective.abs());
        if warm_passed && res.status == RunStatus::Optimal && cost > objective + slack {
            // HiGHS can return the MIP start instead of the solution it reports when presolve
            // alone solves the model; solve again without the start.
            tracing::debug!(
                cost,
                objective,
                "solution does not match the objective; re-solving cold"
            );
            use_warm = false;
            continue;
        }
        if peak <= budget {
            if best.as_ref().map_or(true, |b| cost < b.cost) {
                best = Some(Incumbent {
                    schedule,
                    plan,
                    cost,
                });
            }
            return Ok(MilpResult {
                best,
                status: res.status,
                lower_bound,
            });
        }
        // Only floating-point tolerance can get here: tighten and solve again.
        tracing::warn!(
            peak,
            budget,
            "MILP plan exceeds the budget by {} bytes (solver tolerance); re-solving",
            peak - budget
        );
        model_budget = model_budget.saturating_sub(peak - budget + 1);
        if remaining(start, options.time_limit).is_some_and(|d| d.is_zero()) || attempt == 3 {
            return Ok(MilpResult {
                best,
                status: RunStatus::TimeLimit,
                lower_bound: None,
            });
        }
    }
    Ok(MilpResult {
        best,
        status: RunStatus::TimeLimit,
        lower_bound: None,
    })
}

/// The least activation budget of any frontier-advancing schedule, solved as a MILP that minimizes
/// the peak. `Ok(Some)` only when proven optimal within the time limit.
pub fn least_feasible_budget(graph: &Graph, options: &SolveOptions) -> Result<Option<u64>> {
    let model = Model::build(graph, BudgetMode::MinPeak, options.formulation, true);
    let incumbent = best_heuristic(graph, u64::MAX, options);
    let warm_start = incumbent
        .as_ref()
        .and_then(|b| warm::warm_vector(graph, &model, &b.schedule));
    let opts = RunOptions {
        time_limit: options.time_limit,
        mip_gap: 0.0,
        threads: options.threads,
        warm_start,
        seed: options.seed,
        strategy: NAME,
    };
    let res = run::run(&model, &opts)?;
    if res.status != RunStatus::Optimal {
        return Ok(None);
    }
    let Some(x) = res.x.as_ref() else {
        return Ok(None);
    };
    let schedule = warm::schedule_for_keeps(graph, &warm::keeps_of_solution(&model, x));
    Ok(warm::judge(graph, &schedule).map(|(_, peak, _)| peak))
}

impl Strategy for Milp {
    fn name(&self) -> &'static str {
        NAME
    }

    fn plan(&self, graph: &Graph, budget_bytes: u64, options: &SolveOptions) -> Result<Outcome> {
        if budget_bytes < graph.min_feasible_activation_bytes() {
            return Ok(Outcome {
                plan: None,
                status: Status::Infeasible,
                lower_bound: None,
            });
        }
        let incumbent = if options.warm_start {
            best_heuristic(graph, budget_bytes, options)
        } else {
            None
        };
        if let Some(inc) = &incumbent {
            tracing::debug!(cost = inc.cost, "warm start");
        }
        let res = solve_milp(graph, budget_bytes, options, incumbent)?;
        let lower_bound = res.lower_bound.map(|b| {
            b.max(graph.total_cost())
                .min(res.best.as_ref().map_or(f64::INFINITY, |b| b.cost))
        });
        Ok(match (res.status, res.best) {
            (RunStatus::Optimal, Some(b)) => Outcome {
                plan: Some(b.plan),
                status: Status::Optimal,
                lower_bound,
            },
            (RunStatus::Infeasible, None) | (RunStatus::Optimal, None) => Outcome {
                plan: None,
                status: Status::Infeasible,
                lower_bound: None,
            },
            (_, Some(b)) => Outcome {
                plan: Some(b.plan),
                status: Status::Feasible,
                lower_bound,
            },
            (RunStatus::TimeLimit, None) => Outcome {
                plan: None,
                status: Status::Timeout,
                lower_bound,
            },
        })
    }

    fn least_feasible_budget(&self, graph: &Graph, options: &SolveOptions) -> Result<Option<u64>> {
        let mut opts = options.clone();
        opts.time_limit = Some(options.time_limit.unwrap_or(Duration::from_secs(60)));
        least_feasible_budget(graph, &opts)
    }
}
