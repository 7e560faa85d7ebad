//! Passing a [`Model`] to HiGHS and reading back what it found.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use highs::{HighsModelStatus, HighsSolutionStatus, RowProblem, Sense};

use crate::error::{Error, Result};
use crate::milp::model::Model;

/// Solver settings for one run.
#[derive(Debug, Clone)]
pub(crate) struct RunOptions {
    /// Wall-clock limit.
    pub(crate) time_limit: Option<Duration>,
    /// Relative MIP gap.
    pub(crate) mip_gap: f64,
    /// HiGHS threads.
    pub(crate) threads: usize,
    /// Starting incumbent (a full column vector).
    pub(crate) warm_start: Option<Vec<f64>>,
    /// HiGHS random seed.
    pub(crate) seed: u64,
    /// Only look for solutions with a smaller objective (HiGHS `objective_bound`); `Infeasible`
    /// then means "none below the cutoff".
    pub(crate) cutoff: Option<f64>,
    /// Strategy name for error messages.
    pub(crate) strategy: &'static str,
}

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RunStatus {
    /// Proven optimal (within the gap).
    Optimal,
    /// Proven infeasible.
    Infeasible,
    /// Stopped by the time limit (a solution may exist).
    TimeLimit,
}

/// What HiGHS returned.
#[derive(Debug, Clone)]
pub(crate) struct RunResult {
    pub(crate) status: RunStatus,
    /// Column values of the best solution, when one exists.
    pub(crate) x: Option<Vec<f64>>,
    /// Objective of that solution.
    pub(crate) objective: Option<f64>,
    /// Proven lower bound on the objective (MIP dual bound or LP optimum).
    pub(crate) dual_bound: Option<f64>,
}

/// HiGHS does not support concurrent solves in one process (its task scheduler is global; see
/// HiGHS issues 810 and 1838): every solve holds this lock.
static HIGHS_LOCK: Mutex<()> = Mutex::new(());

/// Above this many integer columns with a cost, the objective goes through one continuous column
/// (see [`run`]).
const OBJECTIVE_COLUMN_ABOVE: usize = 20_000;
/// Models with more rows than this get no presolve under a short time limit (see [`run`]).
const LARGE_ROWS: usize = 300_000;
/// A time limit long enough for presolve on a large model.
const PRESOLVE_LIMIT: Duration = Duration::from_secs(60);

/// Solves `model` (MILP when it has integer columns, LP otherwise) with HiGHS.
///
/// With many integer columns in the objective, HiGHS's set-up partitions them into cliques
/// (`HighsObjectiveFunction::setupCliquePartition`), which does not check the time limit: on
/// ResNet50's paper formulation (62k binary `R` with costs, 224k binaries) it ran for 160 s under
/// a 10 s limit. Above [`OBJECTIVE_COLUMN_ABOVE`] such columns the objective goes through one
/// continuous column `z = cost . x` instead (the same problem; HiGHS skips the partition when no
/// binary has a cost). `z` needs an upper bound below the one its row implies, or presolve
/// substitutes it back: the warm start's cost when there is one (nothing better is cut off).
/// Without a warm start presolve would tighten the implied bound below any bound known here, so
/// presolve is switched off (the clique table the partition uses is then empty) and `z` is
/// bounded by the sum of the positive costs less half the smallest, which excludes only the
/// solution with every costed column at 1; should that leave the model infeasible it is solved
/// again as given. (ResNet50's paper formulation near the least feasible budget, where no
/// baseline fits: 235 s under a 10 s limit with presolve, 23.5 s without.)
///
/// HiGHS's presolve checks the clock only between its passes, and one pass over ResNet50's default
/// model (600k rows) took 15 s: on models above [`LARGE_ROWS`] rows under a limit shorter than
/// [`PRESOLVE_LIMIT`] presolve is off (such solves prove nothing in that time either way; the
/// warm start is what they return).
pub(crate) fn run(model: &Model, opts: &RunOptions) -> Result<RunResult> {
    let start = Instant::now();
    let _guard = HIGHS_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let presolve =
        model.num_rows() <= LARGE_ROWS || opts.time_limit.map_or(true, |l| l >= PRESOLVE_LIMIT);
    let costed: Vec<f64> = model
        .col_int
        .iter()
        .zip(&model.col_cost)
        .filter(|&(&int, &c)| int && c != 0.0)
        .map(|(_, &c)| c)
        .collect();
    if costed.len() <= OBJECTIVE_COLUMN_ABOVE {
        return run_locked(model, opts, start, None, presolve);
    }
    let warm_objective = opts
        .warm_start
        .as_ref()
        .filter(|w| w.len() == model.num_cols())
        .map(|w| objective_of(model, w));
    if let Some(v) = warm_objective {
        let bound = Some(v + 1e-6 * v.abs().max(1.0));
        return run_locked(model, opts, start, bound, presolve);
    }
    let positive: f64 = model.col_cost.iter().filter(|&&c| c > 0.0).sum();
    let smallest = costed.iter().map(|c| c.abs()).fold(f64::INFINITY, f64::min);
    let res = run_locked(model, opts, start, Some(positive - 0.5 * smallest), false)?;
    if res.status == RunStatus::Infeasible {
        return run_locked(model, opts, start, None, presolve);
    }
    Ok(res)
}

/// [`run`] with the HiGHS lock held; `objective_bound`: put the objective in a column `z` with
/// this upper bound; `presolve`: HiGHS's presolve on or off.
fn run_locked(
    model: &Model,
    opts: &RunOptions,
    start: Instant,
    objective_bound: Option<f64>,
    presolve: bool,
) -> Result<RunResult> {
    let waited = start.elapsed();
    let fail = |message: String| Error::Solver {
        strategy: opts.strategy.to_string(),
        message,
    };
    let mut pb = RowProblem::default();
    let objective_column = objective_bound.is_some();
    let cols: Vec<highs::Col> = (0..model.num_cols())
        .map(|c| {
            pb.add_column_with_integrality(
                if objective_column {
                    0.0
                } else {
                    model.col_cost[c]
                },
                model.col_lo[c]..=model.col_hi[c],
                model.col_int[c],
            )
        })
        .collect();
    if let Some(hi) = objective_bound {
        let lo = model.col_cost.iter().map(|c| c.min(0.0)).sum::<f64>();
        let z = pb.add_column(1.0, lo..=hi);
        let mut row: Vec<(highs::Col, f64)> = cols
            .iter()
            .zip(&model.col_cost)
            .filter(|&(_, &c)| c != 0.0)
            .map(|(&col, &c)| (col, c))
            .collect();
        row.push((z, -1.0));
        pb.add_row(0.0..=0.0, &row);
    }
    let mut row: Vec<(highs::Col, f64)> = Vec::new();
    for r in 0..model.num_rows() {
        row.clear();
        let (a, b) = (model.row_start[r], model.row_start[r + 1]);
        row.extend(
            model.row_idx[a..b]
                .iter()
                .zip(&model.row_val[a..b])
                .map(|(&c, &v)| (cols[c as usize], v)),
        );
        let (lo, hi) = (model.row_lo[r], model.row_hi[r]);
        pb.add_row(lo..=hi, &row);
    }
    let is_mip = model.col_int.iter().any(|&b| b);
    let mut hm = pb
        .try_optimise(Sense::Minimise)
        .map_err(|e| fail(format!("HiGHS rejected the model: {e:?}")))?;
    let name = opts.strategy;
    if std::env::var_os("CHECKMATE_HIGHS_LOG").is_some() {
        // HiGHS's own log on stdout, for debugging.
        set_option(&mut hm, name, "output_flag", true)?;
        set_option(&mut hm, name, "log_to_console", true)?;
    }
    set_option(&mut hm, name, "threads", opts.threads.max(1) as i32)?;
    set_option(
        &mut hm,
        name,
        "random_seed",
        (opts.seed % (i32::MAX as u64)) as i32,
    )?;
    if let Some(limit) = opts.time_limit {
        let left = limit.saturating_sub(waited);
        set_option(&mut hm, name, "time_limit", left.as_secs_f64().max(0.01))?;
    }
    if is_mip {
        set_option(&mut hm, name, "mip_rel_gap", opts.mip_gap.max(0.0))?;
    }
    if !presolve {
        set_option(&mut hm, name, "presolve", "off")?;
    }
    if let Ok(extra) = std::env::var("CHECKMATE_HIGHS_OPTIONS") {
        // Extra HiGHS options `name=value,...`, for experiments.
        for kv in extra.split(',').filter(|s| !s.is_empty()) {
            let Some((k, v)) = kv.split_once('=') else {
                continue;
            };
            if let Ok(b) = v.parse::<bool>() {
                set_option(&mut hm, name, k, b)?;
            } else if let Ok(i) = v.parse::<i32>() {
                set_option(&mut hm, name, k, i)?;
            } else if let Ok(f) = v.parse::<f64>() {
                set_option(&mut hm, name, k, f)?;
            } else {
                set_option(&mut hm, name, k, v)?;
            }
        }
    }
    if let Some(c) = opts.cutoff {
        set_option(&mut hm, name, "objective_bound", c / model.cost_scale)?;
    }
    if let Some(w) = &opts.warm_start {
        if w.len() == model.num_cols() {
            let mut w = w.clone();
            if objective_column {
                w.push(objective_of(model, &w));
            }
            if let Err(e) = hm.try_set_solution(Some(&w), None, None, None) {
                tracing::debug!("HiGHS ignored the warm start: {e:?}");
            }
        }
    }
    tracing::debug!(
        cols = model.num_cols(),
        rows = model.num_rows(),
        ints = model.num_int(),
        nnz = model.row_idx.len(),
        "running HiGHS"
    );
    let solved = hm
        .try_solve()
        .map_err(|e| fail(format!("HiGHS failed: {e:?}")))?;
    let status = solved.status();
    let has_solution = solved.primal_solution_status() == HighsSolutionStatus::Feasible;
    let x = has_solution.then(|| solved.get_solution().columns()[..model.num_cols()].to_vec());
    // Back to cost units (the model's objective is divided by `cost_scale`).
    let objective = has_solution.then(|| solved.objective_value() * model.cost_scale);
    let dual_bound = if is_mip {
        solved
            .double_info_value(c"mip_dual_bound")
            .ok()
            .map(|v| v * model.cost_scale)
            .filter(|v| v.is_finite())
    } else if status == HighsModelStatus::Optimal {
        objective
    } else {
        None
    };
    let status = match status {
        HighsModelStatus::Optimal => RunStatus::Optimal,
        HighsModelStatus::Infeasible => RunStatus::Infeasible,
        HighsModelStatus::ObjectiveBound if opts.cutoff.is_some() => RunStatus::Infeasible,
        HighsModelStatus::ReachedTimeLimit
        | HighsModelStatus::ReachedIterationLimit
        | HighsModelStatus::ReachedSolutionLimit
        | HighsModelStatus::ReachedInterrupt
        | HighsModelStatus::ReachedMemoryLimit => RunStatus::TimeLimit,
        HighsModelStatus::ModelEmpty => RunStatus::Optimal,
        other => return Err(fail(format!("HiGHS ended with status {other:?}"))),
    };
    Ok(RunResult {
        status,
        x,
        objective,
        dual_bound,
    })
}

/// `cost . x` for a full column vector.
fn objective_of(model: &Model, x: &[f64]) -> f64 {
    x.iter().zip(&model.col_cost).map(|(x, c)| x * c).sum()
}

fn set_option<V: highs::HighsOptionValue>(
    hm: &mut highs::Model,
    strategy: &str,
    option: &str,
    value: V,
) -> Result<()> {
    hm.try_set_option(option, value).map_err(|e| Error::Solver {
        strategy: strategy.to_string(),
        message: format!("cannot set HiGHS option {option}: {e:?}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::baselines::tests::chain;
    use crate::baselines::CheckpointAll;
    use crate::milp::model::BudgetMode;
    use crate::Formulation;

    /// The objective-column form (used on large models) is the same problem: same optimum, with
    /// the bound from a warm start or from the costs alone.
    #[test]
    fn objective_column_keeps_the_optimum() {
        let g = chain(6, 10);
        let lo = g.min_feasible_activation_bytes();
        let budget = lo + (CheckpointAll::peak_bytes(&g) - lo) / 3;
        let _guard = HIGHS_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        for formulation in [Formulation::Fast, Formulation::Paper] {
            let model = Model::build(&g, BudgetMode::Bytes(budget), formulation, true);
            let mut opts = RunOptions {
                time_limit: Some(Duration::from_secs(60)),
                mip_gap: 0.0,
                threads: 1,
                warm_start: None,
                seed: 0,
                cutoff: None,
                strategy: "milp",
            };
            let plain = run_locked(&model, &opts, Instant::now(), None, true).unwrap();
            assert_eq!(plain.status, RunStatus::Optimal);
            let optimum = plain.objective.unwrap();
            let positive: f64 = model.col_cost.iter().filter(|&&c| c > 0.0).sum();
            assert!(
                optimum < positive,
                "the test needs a solution below the bound"
            );
            let from_costs =
                run_locked(&model, &opts, Instant::now(), Some(positive - 0.5), false).unwrap();
            opts.warm_start = plain.x.clone();
            let from_warm =
                run_locked(&model, &opts, Instant::now(), Some(optimum + 1e-6), true).unwrap();
            for r in [from_costs, from_warm] {
                assert_eq!(r.status, RunStatus::Optimal);
                assert!((r.objective.unwrap() - optimum).abs() < 1e-6 * optimum.max(1.0));
                assert_eq!(r.x.unwrap().len(), model.num_cols());
            }
        }
    }
}
