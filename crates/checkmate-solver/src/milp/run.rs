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

/// Solves `model` (MILP when it has integer columns, LP otherwise) with HiGHS.
pub(crate) fn run(model: &Model, opts: &RunOptions) -> Result<RunResult> {
    let start = Instant::now();
    let _guard = HIGHS_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let waited = start.elapsed();
    let fail = |message: String| Error::Solver {
        strategy: opts.strategy.to_string(),
        message,
    };
    let mut pb = RowProblem::default();
    // With many integer columns in the objective, HiGHS's set-up partitions them into cliques
    // (`HighsObjectiveFunction::setupCliquePartition`), which does not check the time limit: on
    // ResNet50's paper formulation (62k binary `R` with costs, 224k binaries) it ran for 160 s
    // under a 10 s limit. The objective then goes through one continuous column `z = cost . x`
    // instead (the same problem; HiGHS skips the partition when no binary has a cost).
    let objective_column = model
        .col_int
        .iter()
        .zip(&model.col_cost)
        .filter(|&(&int, &c)| int && c != 0.0)
        .count()
        > OBJECTIVE_COLUMN_ABOVE;
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
    if objective_column {
        // Bounded by the warm start's objective (no better solution is cut off): a free `z`
        // would be substituted back into the objective by presolve.
        let warm_objective = opts
            .warm_start
            .as_ref()
            .filter(|w| w.len() == model.num_cols())
            .map(|w| objective_of(model, w));
        let hi = warm_objective.map_or(f64::INFINITY, |v| v + 1e-6 * v.abs().max(1.0));
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
