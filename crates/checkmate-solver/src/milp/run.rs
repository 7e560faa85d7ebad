//! Passing a [`Model`] to HiGHS and reading back what it found.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};
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
    /// HiGHS's presolve (where [`run`]'s own rule for large models leaves it on).
    pub(crate) presolve: bool,
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
    /// An LP solved to optimality: each column's reduced cost, in the model's objective units
    /// (divided by `cost_scale`), for reduced-cost fixing.
    pub(crate) reduced_costs: Option<Vec<f64>>,
}

/// HiGHS does not support concurrent solves in one process (its task scheduler is global; see
/// HiGHS issues 810 and 1838): every solve holds this lock ([`highs_lock`]).
static HIGHS_LOCK: Mutex<()> = Mutex::new(());

/// MILP solves abandoned at their time limit ([`run`]) in this process.
static ABANDONED: AtomicUsize = AtomicUsize::new(0);

/// How many MILP solves this process abandoned because HiGHS did not return at its time limit
/// (each still runs on a thread of its own until HiGHS returns; see docs/FORMULATION.md, "Time
/// limits"). A program that ends while one runs should end without running static destructors
/// (`libc::_exit` after flushing its output), which HiGHS's thread may still use.
pub fn abandoned_solves() -> usize {
    ABANDONED.load(Ordering::SeqCst)
}

/// The HiGHS lock, waited for until `deadline` at most (`None`: however long it takes). A solve
/// abandoned at its limit may still hold it: then `None` at the deadline.
pub(crate) fn highs_lock(deadline: Option<Instant>) -> Option<MutexGuard<'static, ()>> {
    lock_until(&HIGHS_LOCK, deadline)
}

/// The HiGHS lock for an LP: waited for as long as it takes while no solve was abandoned (the
/// holder keeps to its own limit, and after the wait HiGHS's least limit, 0.01 s, is enough for
/// a hot-started LP), until `deadline` otherwise.
fn lp_lock(deadline: Option<Instant>) -> Option<MutexGuard<'static, ()>> {
    highs_lock(deadline.filter(|_| abandoned_solves() > 0))
}

/// `lock`, waited for until `deadline` at most.
fn lock_until(lock: &Mutex<()>, deadline: Option<Instant>) -> Option<MutexGuard<'_, ()>> {
    let Some(deadline) = deadline else {
        return Some(lock.lock().unwrap_or_else(|e| e.into_inner()));
    };
    loop {
        match lock.try_lock() {
            Ok(guard) => return Some(guard),
            Err(TryLockError::Poisoned(e)) => return Some(e.into_inner()),
            Err(TryLockError::WouldBlock) if Instant::now() >= deadline => return None,
            Err(TryLockError::WouldBlock) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
}

/// Why [`watched`] has no value.
#[derive(Debug, PartialEq, Eq)]
enum Unwatched {
    /// Still running at the deadline: left running.
    Late,
    /// The job panicked, or no thread could be started (the message says which).
    Failed(&'static str),
}

/// Runs `job` on a thread of its own and waits for it until `deadline`; past that, leaves it
/// running and counts it in `abandoned` ([`ABANDONED`] for HiGHS).
fn watched<T: Send + 'static>(
    deadline: Instant,
    abandoned: &AtomicUsize,
    job: impl FnOnce() -> T + Send + 'static,
) -> std::result::Result<T, Unwatched> {
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("highs".to_string())
        .spawn(move || {
            let _ = tx.send(job());
        })
        .map_err(|_| Unwatched::Failed("no thread could be started for HiGHS"))?;
    match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        Ok(v) => Ok(v),
        Err(RecvTimeoutError::Timeout) => {
            abandoned.fetch_add(1, Ordering::SeqCst);
            Err(Unwatched::Late)
        }
        Err(RecvTimeoutError::Disconnected) => Err(Unwatched::Failed("HiGHS's thread panicked")),
    }
}

/// A run that ended on its time limit without a solution or bound.
fn timed_out() -> RunResult {
    RunResult {
        status: RunStatus::TimeLimit,
        x: None,
        objective: None,
        dual_bound: None,
        reduced_costs: None,
    }
}

/// Above this many integer columns with a cost, the objective goes through one continuous column
/// (see [`run`]).
const OBJECTIVE_COLUMN_ABOVE: usize = 20_000;
/// Models with more rows than this get no presolve (see [`run`]), and a time limit with a margin.
pub(crate) const LARGE_ROWS: usize = 300_000;
/// The share of the time left that HiGHS does not get on such models, and its cap in seconds:
/// HiGHS returns from them after the iteration it is in at its limit, which ended 6.8 s late on
/// ResNet50 at 0.5 (600k rows, 252 s given).
const LARGE_MARGIN: f64 = 0.03;
const LARGE_MARGIN_MAX: f64 = 10.0;
/// HiGHS's MIP start-up that does not stop at the time limit, per non-zero of the model (see
/// [`startup_seconds_for`]).
const STARTUP_SECONDS_PER_NONZERO: f64 = 7e-6;
/// ... and its fixed part.
const STARTUP_SECONDS: f64 = 0.5;
/// How far past its time limit a solve may end (the "within a few seconds").
const OVERRUN_ALLOWED: Duration = Duration::from_secs(3);

/// Seconds HiGHS needs before it checks the time limit reliably on a MILP with `nonzeros`
/// non-zeros: passing the model in, its set-up (symmetry detection, clique table), the
/// feasibility-jump heuristic and the first phase of the root node, none of which stops at the
/// limit. Measured on the 2-core development machine with the defaults of [`run`]
/// (docs/FORMULATION.md, "Time limits"): 0.5 s for SegNet (80k non-zeros) to 81 s for a 1001-node
/// training chain (14.7M), 2.6-6.9 us per non-zero.
pub(crate) fn startup_seconds_for(nonzeros: u64) -> f64 {
    STARTUP_SECONDS + STARTUP_SECONDS_PER_NONZERO * nonzeros as f64
}

/// Whether a MILP with `nonzeros` non-zeros started with `left` of its time limit would end more
/// than [`OVERRUN_ALLOWED`] after it ([`startup_seconds_for`]).
pub(crate) fn starts_too_slowly(nonzeros: u64, left: Duration) -> bool {
    startup_seconds_for(nonzeros) > (left + OVERRUN_ALLOWED).as_secs_f64()
}

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
/// HiGHS's presolve checks the clock only between its passes and within probing, and on large
/// models it does not return at the limit: one pass over ResNet50's default model (600k rows)
/// took 15 s; on op-level ResNet50 (800k rows, 2.4M non-zeros) at 0.6 presolve used its whole
/// 90 s and ended 13-77 s late with no bound; on ResNet50 at 0.5 under a 300 s limit it ran for
/// 590 s in all. Models above [`LARGE_ROWS`] rows get no presolve: HiGHS then keeps to the
/// limit (120.6 s for that 120 s op-level solve) and returns its dual bound.
///
/// A MILP whose start-up ([`startup_seconds_for`]) would end more than [`OVERRUN_ALLOWED`] after
/// the time limit is not passed to HiGHS at all: the run ends at once with
/// [`RunStatus::TimeLimit`] and no solution, and the caller keeps its incumbent (a 1001-node
/// training chain under a 10 s limit ran for 122 s inside HiGHS, 8.9 GB resident).
///
/// HiGHS's MIP solver computes the analytic centre of the root LP with an interior-point solve
/// that has an iteration limit but no time limit, and waits for it once the root LP is solved:
/// on a 250-node random layered graph (lp-round's exact polish) and on ResNet50 at 0.5 it ran
/// for many minutes past the limit. So a MILP under a time limit runs on a thread of its own;
/// if HiGHS has not returned [`OVERRUN_ALLOWED`] after the limit, the run ends with
/// [`RunStatus::TimeLimit`] and no solution (the caller keeps its incumbent and its own bounds),
/// and the thread is left to finish ([`abandoned_solves`]; later solves wait for the lock only
/// until their own limits).
///
/// `model` is shared with that thread, not copied (the solver's memory estimate counts it once).
pub(crate) fn run(model: &Arc<Model>, opts: &RunOptions) -> Result<RunResult> {
    let start = Instant::now();
    let is_mip = model.is_mip();
    match opts.time_limit {
        Some(limit) if is_mip => {
            let deadline = start + limit + OVERRUN_ALLOWED;
            let (model, opts) = (Arc::clone(model), opts.clone());
            let strategy = opts.strategy;
            match watched(deadline, &ABANDONED, move || {
                let Some(_guard) = highs_lock(Some(deadline)) else {
                    return Ok(timed_out());
                };
                run_with_lock(&model, &opts, start)
            }) {
                Ok(res) => res,
                Err(Unwatched::Failed(why)) => Err(solver_error(strategy, why.to_string())),
                Err(Unwatched::Late) => {
                    tracing::warn!(
                        strategy,
                        seconds = start.elapsed().as_secs_f64(),
                        "HiGHS did not return at its time limit (its root node's analytic \
                         centre does not stop at it): solve abandoned, the incumbent stands"
                    );
                    Ok(timed_out())
                }
            }
        }
        _ => {
            let deadline = opts.time_limit.map(|l| start + l + OVERRUN_ALLOWED);
            let Some(_guard) = lp_lock(deadline) else {
                return Ok(timed_out());
            };
            run_with_lock(model, opts, start)
        }
    }
}

/// [`run`] once the HiGHS lock is held.
///
/// HiGHS 1.16's presolve can reduce a MILP wrongly (5-node graphs with an alternative
/// implementation, paper formulation, `tests/data/highs/`): it called one infeasible (with a MIP
/// start that it had itself checked feasible, it reported objective 11 for that start, which
/// costs 13), and it reduced another to an empty model whose solution violates a row, which
/// ends in a solve error. A MILP that fails with presolve, or that HiGHS calls infeasible with
/// presolve, is solved again without it: when it fails, when it has no cutoff (such answers are
/// rare and decide that no plan exists), or when the warm start satisfies every row and bound
/// and is below the cutoff (docs/FORMULATION.md, "HiGHS's presolve").
fn run_with_lock(model: &Model, opts: &RunOptions, start: Instant) -> Result<RunResult> {
    let res = run_with_lock_once(model, opts, start);
    if !model.is_mip() || !presolve_for(model, opts) {
        return res;
    }
    let start_fits = || {
        opts.warm_start.as_ref().is_some_and(|w| {
            satisfies(model, w)
                && opts
                    .cutoff
                    .map_or(true, |c| objective_of(model, w) < c / model.cost_scale)
        })
    };
    let doubtful = match &res {
        Err(_) => true,
        Ok(r) => r.status == RunStatus::Infeasible && (opts.cutoff.is_none() || start_fits()),
    };
    if !doubtful {
        return res;
    }
    tracing::debug!(
        strategy = opts.strategy,
        result = ?res.as_ref().map(|r| r.status),
        "HiGHS failed or says infeasible after presolve: solving again without presolve"
    );
    let opts = RunOptions {
        presolve: false,
        ..opts.clone()
    };
    run_with_lock_once(model, &opts, start)
}

/// Whether `x` is within the column bounds of `model` (integral where it must be) and satisfies
/// every row, to HiGHS's default tolerance.
fn satisfies(model: &Model, x: &[f64]) -> bool {
    const TOL: f64 = 1e-6;
    x.len() == model.num_cols()
        && (0..model.num_cols()).all(|c| {
            let v = x[c];
            v >= model.col_lo[c] - TOL
                && v <= model.col_hi[c] + TOL
                && (!model.col_int[c] || (v - v.round()).abs() <= TOL)
        })
        && (0..model.num_rows()).all(|r| {
            let v = model.row_activity(r, x);
            v <= model.row_hi[r] + TOL && v >= model.row_lo[r] - TOL
        })
}

/// [`run_with_lock`] without its second try.
fn run_with_lock_once(model: &Model, opts: &RunOptions, start: Instant) -> Result<RunResult> {
    if let Some(limit) = opts.time_limit {
        let left = limit.saturating_sub(start.elapsed());
        let nonzeros = model.row_idx.len() as u64;
        if model.is_mip() && starts_too_slowly(nonzeros, left) {
            tracing::info!(
                strategy = opts.strategy,
                nonzeros,
                startup_seconds = startup_seconds_for(nonzeros),
                seconds_left = left.as_secs_f64(),
                "not passing the MILP to HiGHS: its start-up would outlast the time limit"
            );
            return Ok(timed_out());
        }
    }
    let presolve = presolve_for(model, opts);
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

/// Whether HiGHS presolves `model` (see [`run`]).
fn presolve_for(model: &Model, opts: &RunOptions) -> bool {
    opts.presolve && model.num_rows() <= LARGE_ROWS
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
    let hm = prepare(model, opts, start, objective_bound, presolve)?;
    solve_and_read(hm, model, opts).map(|(res, _)| res)
}

pub(crate) fn solver_error(strategy: &str, message: String) -> Error {
    Error::Solver {
        strategy: strategy.to_string(),
        message,
    }
}

/// Sets HiGHS's time limit to what `opts` leaves after `spent` (no limit without one: a solved
/// model keeps its last limit until it is replaced), less [`LARGE_MARGIN`] of it on models above
/// [`LARGE_ROWS`] rows.
fn set_time_limit(
    hm: &mut highs::Model,
    model: &Model,
    opts: &RunOptions,
    spent: Duration,
) -> Result<()> {
    let left = opts.time_limit.map_or(f64::INFINITY, |limit| {
        let left = limit.saturating_sub(spent).as_secs_f64();
        let margin = if model.num_rows() > LARGE_ROWS {
            (left * LARGE_MARGIN).min(LARGE_MARGIN_MAX)
        } else {
            0.0
        };
        (left - margin).max(0.01)
    });
    set_option(hm, opts.strategy, "time_limit", left)
}

/// `model` as a HiGHS model with the options of `opts` set (see [`run_locked`]).
fn prepare(
    model: &Model,
    opts: &RunOptions,
    start: Instant,
    objective_bound: Option<f64>,
    presolve: bool,
) -> Result<highs::Model> {
    let waited = start.elapsed();
    let fail = |message: String| solver_error(opts.strategy, message);
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
    let is_mip = model.is_mip();
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
    set_time_limit(&mut hm, model, opts, waited)?;
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
    Ok(hm)
}

/// Solves `hm` (made from `model` by [`prepare`]) and reads back the result; also returns the
/// solved HiGHS model, which keeps its basis.
fn solve_and_read(
    hm: highs::Model,
    model: &Model,
    opts: &RunOptions,
) -> Result<(RunResult, highs::SolvedModel)> {
    let is_mip = model.is_mip();
    tracing::debug!(
        cols = model.num_cols(),
        rows = model.num_rows(),
        ints = model.num_int(),
        nnz = model.row_idx.len(),
        "running HiGHS"
    );
    let solved = hm
        .try_solve()
        .map_err(|e| solver_error(opts.strategy, format!("HiGHS failed: {e:?}")))?;
    let status = solved.status();
    let has_solution = solved.primal_solution_status() == HighsSolutionStatus::Feasible;
    let solution = has_solution.then(|| solved.get_solution());
    let x = solution
        .as_ref()
        .map(|s| s.columns()[..model.num_cols()].to_vec());
    let reduced_costs = solution
        .as_ref()
        .filter(|_| !is_mip && status == HighsModelStatus::Optimal)
        .map(|s| s.dual_columns()[..model.num_cols()].to_vec());
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
        other => {
            return Err(solver_error(
                opts.strategy,
                format!("HiGHS ended with status {other:?}"),
            ))
        }
    };
    Ok((
        RunResult {
            status,
            x,
            objective,
            dual_bound,
            reduced_costs,
        },
        solved,
    ))
}

/// LPs that differ only in their column and row bounds (`lp-round`'s relaxations at several
/// budgets, built at one memory scale): each after the first is a bound change on the HiGHS model
/// of the one before, so the dual simplex starts from its optimal basis instead of from scratch
/// (and skips presolve).
#[derive(Default)]
pub(crate) struct LpSeries {
    last: Option<(highs::Model, Model)>,
    /// How many solves started from the previous one.
    pub(crate) hot_starts: usize,
}

impl LpSeries {
    /// Solves the LP `model` (no integer columns), from the last basis when the last model has
    /// the same matrix and costs.
    pub(crate) fn solve(&mut self, model: &Model, opts: &RunOptions) -> Result<RunResult> {
        let start = Instant::now();
        let deadline = opts.time_limit.map(|l| start + l + OVERRUN_ALLOWED);
        let Some(_guard) = lp_lock(deadline) else {
            return Ok(timed_out());
        };
        let hm = match self.last.take() {
            Some((mut hm, last)) if same_matrix(&last, model) => {
                self.hot_starts += 1;
                for c in 0..model.num_cols() {
                    if (last.col_lo[c], last.col_hi[c]) != (model.col_lo[c], model.col_hi[c]) {
                        change_bounds(&mut hm, Bound::Col(c), model.col_lo[c], model.col_hi[c]);
                    }
                }
                for r in 0..model.num_rows() {
                    if (last.row_lo[r], last.row_hi[r]) != (model.row_lo[r], model.row_hi[r]) {
                        change_bounds(&mut hm, Bound::Row(r), model.row_lo[r], model.row_hi[r]);
                    }
                }
                // HiGHS measures `time_limit` against the run time of the instance, which adds
                // up over its solves: without this, each LP of the series had the time of the
                // ones before taken from its limit (at SegNet's least feasible budget with 10 s,
                // every LP after the second stopped at once on its time limit).
                zero_clocks(&mut hm);
                set_time_limit(&mut hm, model, opts, start.elapsed())?;
                hm
            }
            _ => prepare(model, opts, start, None, presolve_for(model, opts))?,
        };
        let (res, solved) = solve_and_read(hm, model, opts)?;
        self.last = Some((solved.into(), model.clone()));
        Ok(res)
    }
}

/// Whether `a` and `b` are LPs with the same columns, costs and matrix (bounds may differ).
fn same_matrix(a: &Model, b: &Model) -> bool {
    !a.col_int.iter().chain(&b.col_int).any(|&i| i)
        && a.col_cost == b.col_cost
        && a.row_start == b.row_start
        && a.row_idx == b.row_idx
        && a.row_val == b.row_val
}

/// A column or a row of a HiGHS model.
enum Bound {
    Col(usize),
    Row(usize),
}

/// Sets the bounds of a column or row of `hm` (the `highs` crate has no call for rows, and its
/// column handles cannot be made from an index).
fn change_bounds(hm: &mut highs::Model, which: Bound, lo: f64, hi: f64) {
    // SAFETY: `hm` owns a live HiGHS instance, and the index is one of its columns or rows
    // (`same_matrix` checked that the model has the counts of the one it was built from).
    unsafe {
        match which {
            Bound::Col(c) => {
                highs_sys::Highs_changeColBounds(hm.as_mut_ptr(), c as highs_sys::HighsInt, lo, hi)
            }
            Bound::Row(r) => {
                highs_sys::Highs_changeRowBounds(hm.as_mut_ptr(), r as highs_sys::HighsInt, lo, hi)
            }
        };
    }
}

/// Zeroes the clocks of `hm`, whose `time_limit` then counts from its next solve.
fn zero_clocks(hm: &mut highs::Model) {
    // SAFETY: `hm` owns a live HiGHS instance.
    unsafe {
        highs_sys::Highs_zeroAllClocks(hm.as_mut_ptr());
    }
}

/// `cost . x` for a full column vector.
fn objective_of(model: &Model, x: &[f64]) -> f64 {
    x.iter().zip(&model.col_cost).map(|(x, c)| x * c).sum()
}

pub(crate) fn set_option<V: highs::HighsOptionValue>(
    hm: &mut highs::Model,
    strategy: &str,
    option: &str,
    value: V,
) -> Result<()> {
    hm.try_set_option(option, value)
        .map_err(|e| solver_error(strategy, format!("cannot set HiGHS option {option}: {e:?}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::baselines::tests::{chain, shared_graph};
    use crate::baselines::CheckpointAll;
    use crate::milp::model::BudgetMode;
    use crate::Formulation;

    /// A job that outlives its deadline is left running and the caller goes on at the deadline;
    /// one that ends in time gives its value. (What HiGHS's analytic centre does on large models:
    /// the solve does not return at its limit.)
    #[test]
    fn watched_jobs_are_abandoned_at_their_deadline() {
        // A counter of its own: HiGHS's would change how the other tests' LPs wait.
        let abandoned = AtomicUsize::new(0);
        let start = Instant::now();
        let v = watched(start + Duration::from_millis(200), &abandoned, || {
            std::thread::sleep(Duration::from_secs(30));
            1
        });
        assert_eq!(v, Err(Unwatched::Late));
        assert!(start.elapsed() < Duration::from_secs(10));
        assert_eq!(abandoned.load(Ordering::SeqCst), 1);
        let later = Instant::now() + Duration::from_secs(30);
        assert_eq!(watched(later, &abandoned, || 2), Ok(2));
        // A panicking job is an error, not an abandoned job.
        assert!(matches!(
            watched(later, &abandoned, || -> i32 { panic!("boom") }),
            Err(Unwatched::Failed(_))
        ));
        assert_eq!(abandoned.load(Ordering::SeqCst), 1);
    }

    /// While an abandoned solve holds the lock, a later solve waits for it only until its own
    /// deadline. (A lock of its own: the HiGHS lock would hold up the other tests' solves.)
    #[test]
    fn the_lock_is_waited_for_only_until_the_deadline() {
        static LOCK: Mutex<()> = Mutex::new(());
        let (tx, rx) = mpsc::channel();
        let holder = std::thread::spawn(move || {
            let _guard = lock_until(&LOCK, None);
            tx.send(()).unwrap();
            std::thread::sleep(Duration::from_secs(3));
        });
        rx.recv().unwrap();
        let start = Instant::now();
        assert!(lock_until(&LOCK, Some(start + Duration::from_millis(100))).is_none());
        assert!(start.elapsed() < Duration::from_secs(3));
        holder.join().unwrap();
        assert!(lock_until(&LOCK, Some(Instant::now())).is_some());
    }

    /// Exact solves (gap 0) on one thread within a minute.
    fn exact_options(strategy: &'static str) -> RunOptions {
        RunOptions {
            time_limit: Some(Duration::from_secs(60)),
            mip_gap: 0.0,
            threads: 1,
            warm_start: None,
            seed: 0,
            cutoff: None,
            strategy,
            presolve: true,
        }
    }

    /// A series of LPs at several budgets (one memory scale) solved from each other's bases has
    /// the optima of the same LPs solved from scratch, infeasible ones included, and the series
    /// goes on after an infeasible one.
    #[test]
    fn lp_series_matches_cold_solves() {
        let g = shared_graph("VGG16_256_224");
        let lo = g.min_feasible_activation_bytes();
        let all = CheckpointAll::peak_bytes(&g);
        let scale = crate::milp::model::memory_scale(&g, all);
        let opts = exact_options("lp-round");
        let mut series = LpSeries::default();
        let mut statuses = Vec::new();
        let at = |frac: f64| (lo as f64 + frac * (all - lo) as f64) as u64;
        // (A quarter of the least feasible budget leaves the LP infeasible too.)
        for budget in [at(0.5), at(0.2), at(0.35), lo / 4, at(0.05), at(1.0)] {
            let model = Arc::new(Model::build_at_scale(
                &g,
                BudgetMode::Bytes(budget),
                Formulation::Fast,
                false,
                scale,
            ));
            let hot = series.solve(&model, &opts).unwrap();
            let cold = run(&model, &opts).unwrap();
            assert_eq!(hot.status, cold.status, "budget {budget}");
            statuses.push(hot.status);
            if let (Some(h), Some(c)) = (hot.objective, cold.objective) {
                assert!(
                    (h - c).abs() <= 1e-6 * c.abs().max(1.0),
                    "{h} vs {c} at {budget}"
                );
            }
            assert_eq!(hot.objective.is_some(), cold.objective.is_some());
        }
        assert!(statuses.contains(&RunStatus::Infeasible));
        assert_eq!(
            series.hot_starts, 5,
            "every LP after the first is a bound change"
        );
        assert_eq!(statuses.last(), Some(&RunStatus::Optimal));
    }

    /// Each LP of a series gets its whole time limit: HiGHS's clock, which adds up over the
    /// solves of one instance, restarts with each. `lp-round`'s LPs at vgg_unet LF+10%, each
    /// re-solve allowed 1.5 times as long as the cold first solve took (a margin for a loaded
    /// machine: the test failed once with 1x while a build ran beside it), all finish (from the
    /// last basis they take a fraction of that); with the clock adding up, the limit ran out
    /// after one or two of them.
    #[test]
    fn lp_series_time_limits_count_from_each_solve() {
        let g = shared_graph("vgg_unet_32_416x608");
        let budget = 9_555_096_371.0; // LF+10%
        let scale = crate::milp::model::memory_scale(&g, budget as u64);
        let model_at = |eps: f64| {
            Model::build_at_scale(
                &g,
                BudgetMode::Bytes(((1.0 - eps) * budget) as u64),
                Formulation::Fast,
                false,
                scale,
            )
        };
        let mut series = LpSeries::default();
        let first = model_at(0.0);
        let t0 = Instant::now();
        let res = series.solve(&first, &exact_options("lp-round")).unwrap();
        assert_eq!(res.status, RunStatus::Optimal);
        let mut opts = exact_options("lp-round");
        opts.time_limit = Some(t0.elapsed().mul_f64(1.5));
        for eps in [0.1, 0.05, 0.2, 0.0, 0.1, 0.05] {
            let res = series.solve(&model_at(eps), &opts).unwrap();
            assert_eq!(res.status, RunStatus::Optimal, "eps {eps}");
        }
        assert_eq!(series.hot_starts, 6);
    }

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
            let mut opts = exact_options("milp");
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
