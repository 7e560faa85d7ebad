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
pub use model::{ModelSize, HIGHS_BYTES_PER_MODEL_BYTE};
pub(crate) mod run;
pub use run::abandoned_solves;
pub(crate) mod warm;

use std::sync::Arc;
use std::time::{Duration, Instant};

use checkmate_graph::{Graph, Plan, Schedule};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::error::Result;
use crate::strategy::{Formulation, LeastKnown, Limit, Outcome, SolveOptions, Status, Strategy};
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

impl Incumbent {
    /// `plan` as a frontier-advancing schedule (its keeps, Algorithm 2, without unused keeps),
    /// judged by the simulator: the incumbent and its peak, or `None` if the simulator rejects it.
    ///
    /// On a graph with alternatives each compute gets the cheapest implementation within `limit`
    /// ([`warm::judge`]).
    fn of_plan(graph: &Graph, plan: &Plan, limit: Option<u64>) -> Option<(Incumbent, u64)> {
        let schedule = warm::cleaned_schedule(graph, &warm::keeps_of_plan(graph, plan));
        let (plan, peak, cost) = warm::judge(graph, &schedule, limit)?;
        Some((
            Incumbent {
                schedule,
                plan,
                cost,
            },
            peak,
        ))
    }
}

/// The cheapest plan within `budget` among the other strategies that need no solver and the
/// caller's [`SolveOptions::incumbents`], turned into a frontier-advancing schedule.
pub(crate) fn best_heuristic(
    graph: &Graph,
    budget: u64,
    options: &SolveOptions,
) -> Option<Incumbent> {
    let mut best: Option<Incumbent> = None;
    for plan in &options.incumbents {
        if let Some((inc, peak)) = Incumbent::of_plan(graph, plan, Some(budget)) {
            tracing::trace!(peak, cost = inc.cost, "given incumbent");
            if peak <= budget && best.as_ref().map_or(true, |b| inc.cost < b.cost) {
                best = Some(inc);
            }
        }
    }
    // The heuristics get a quarter of the time limit (only `evict` takes long, on thousands of
    // nodes; the baselines take milliseconds).
    let mut quick = options.clone();
    quick.time_limit = options.time_limit.map(|l| l / 4);
    for &name in crate::STRATEGY_NAMES {
        if name == NAME || name == crate::lp_round::NAME {
            continue;
        }
        let Ok(strategy) = crate::strategy_by_name(name) else {
            continue;
        };
        // (On a graph with alternatives the heuristics plan in each node's leanest
        // implementation, and the judge picks the cheapest that fits.)
        let (planned_on, quick) = crate::strategy::planning_view(graph, strategy.as_ref(), &quick);
        let plan = match strategy.plan(&planned_on, budget, &quick) {
            Ok(Outcome {
                plan: Some(plan), ..
            }) => plan,
            _ => continue,
        };
        let Some((inc, peak)) = Incumbent::of_plan(graph, &plan, Some(budget)) else {
            continue;
        };
        tracing::trace!(name, peak, cost = inc.cost, "heuristic incumbent candidate");
        if peak <= budget && best.as_ref().map_or(true, |b| inc.cost < b.cost) {
            best = Some(inc);
        }
    }
    best
}

/// Share of the time limit by which `lp-round` ends where `milp` does not build the exact model
/// and lp-round skips its LP (the 1000-node random layered graphs): the stage-cover bound with
/// its cascade MILP runs first ([`CASCADE_SHARE`]), then the search, with the rest but a margin.
const ALONE_SEARCH_SHARE: f64 = 0.97;
/// Share of the time limit for the stage-cover bound with its cascade MILP where `milp` does not
/// build the exact model: 42 s of 120, which it had before at the end (it does not finish in
/// them at 1000 nodes, and its dual bound at the limit counts; a 400-node graph's at 0.7 of
/// its peak nearly does, and its incumbent is then a good start for the search).
const CASCADE_SHARE: f64 = 0.35;

/// `lp-round`'s plan (its search without its MILPs) as an incumbent, and its LP bound, given at
/// most a quarter of the time limit (half when it skips its LP: near the least feasible budget
/// its repair descent then needs the time, and on such graphs the MILP rarely proves anything;
/// 90% and its whole search, swaps and restricted MILPs included, when it is `alone`: no exact
/// model follows; [`ALONE_SEARCH_SHARE`] when it is alone without its LP). `known_bound` (the
/// stage-cover bound) ends its search once a plan meets it.
fn lp_round_incumbent(
    graph: &Graph,
    budget: u64,
    options: &SolveOptions,
    start: Instant,
    alone: bool,
    known_bound: Option<f64>,
    sketch: Option<&crate::bound::Sketch>,
) -> (Option<Incumbent>, Option<f64>) {
    let mut opts = options.clone();
    let share = |f: f64| {
        options
            .time_limit
            .map(|l| l.mul_f64(f).saturating_sub(start.elapsed()))
    };
    opts.time_limit = share(if alone { 0.9 } else { 0.25 });
    if !crate::lp_round::lp_attempted(graph, &opts) {
        // Without the LP (and so without lp-round's MILPs) its search takes the time: half when
        // the exact model follows; when `alone`, ALONE_SEARCH_SHARE, and the stage-cover bound
        // with its cascade MILP follows (`Milp::plan`).
        opts.time_limit = share(if alone { ALONE_SEARCH_SHARE } else { 0.5 });
    }
    if opts.time_limit.is_some_and(|l| l.is_zero()) {
        return (None, None);
    }
    // The swaps and the iterated search too (within the share): without them the incumbent was
    // the plain repaired rounding, and `milp` under a short limit returned plans costlier than
    // `lp-round`'s (ResNet50's operator graph at 0.35x of checkpoint-all: +44% against +15%).
    let (planned_on, opts) =
        crate::strategy::planning_view(graph, &crate::lp_round::LpRound, &opts);
    // A bound on `graph`'s costs bounds the plans' costs on the planning view only without
    // alternatives (the view is then `graph` itself).
    let known_bound = known_bound.filter(|_| !graph.has_alternatives());
    // The sketch is of the relaxed graph's plans; the planning view is that graph only without
    // alternatives.
    let sketch = sketch.filter(|_| !graph.has_alternatives());
    let Ok(out) = crate::lp_round::plan_lp_round(
        &planned_on,
        budget,
        &opts,
        alone,
        true,
        known_bound,
        sketch,
    ) else {
        return (None, None);
    };
    // On the leanest view the LP bounds the leanest implementations' costs only.
    let lp_bound = out.lower_bound.filter(|_| !graph.has_alternatives());
    let inc = out.plan.and_then(|plan| {
        let (inc, peak) = Incumbent::of_plan(graph, &plan, Some(budget))?;
        tracing::debug!(cost = inc.cost, peak, "lp-round incumbent");
        (peak <= budget).then_some(inc)
    });
    (inc, lp_bound)
}

/// [`Limit::Memory`] when the model of `graph` (`integer`: the MILP, else the LP) is estimated
/// to need more than the options' memory limit ([`model::estimate`]).
pub(crate) fn model_over_memory(
    graph: &Graph,
    formulation: Formulation,
    integer: bool,
    options: &SolveOptions,
) -> Option<Limit> {
    let size = model::estimate(graph, formulation, integer);
    let (need, limit) = (size.solve_bytes(), options.solver_memory());
    tracing::debug!(?size, need, limit, integer, "model size estimate");
    (need > limit).then_some(Limit::Memory {
        model_bytes: need,
        limit_bytes: limit,
    })
}

/// [`Limit::Startup`] when HiGHS's start-up on the MILP of `graph` (estimated from its size,
/// [`model::estimate`]) would outlast the options' time limit by more than a few seconds: the
/// model is then not built (a 1001-node training chain took 122 s under a 10 s limit).
pub(crate) fn model_too_slow(
    graph: &Graph,
    formulation: Formulation,
    options: &SolveOptions,
) -> Option<Limit> {
    let limit = options.time_limit?;
    let size = model::estimate(graph, formulation, true);
    run::starts_too_slowly(size.nonzeros, limit).then(|| Limit::Startup {
        startup_seconds: run::startup_seconds_for(size.nonzeros).ceil() as u64,
        limit_seconds: limit.as_secs_f64().ceil() as u64,
    })
}

/// [`Limit::LargeModel`] when the MILP of `graph` has more than [`run::LARGE_ROWS`] rows and
/// a time limit is set: there HiGHS's root analytic-centre computation (an interior point
/// method in a HiGHS instance of its own, with no time limit) ran for more than ten minutes
/// under a 300 s limit (ResNet50 at 0.5, 600k rows, 2026-12-05), and it cannot be switched off.
pub(crate) fn model_too_large(
    graph: &Graph,
    formulation: Formulation,
    options: &SolveOptions,
) -> Option<Limit> {
    options.time_limit?;
    let size = model::estimate(graph, formulation, true);
    (size.rows > run::LARGE_ROWS as u64).then_some(Limit::LargeModel { rows: size.rows })
}

/// Relative gaps above the LP bound tried as cutoffs before the plain solve (see [`Milp`]).
const CUTOFF_GAPS: &[f64] = &[0.0075, 0.02];
/// MILPs with fewer rows than this are solved without HiGHS's presolve, in both formulations.
/// On VGG16 and VGG19 (8.8k and 11.4k rows) its probing took half of a default-formulation solve
/// that is proven at the root either way (presolve off: 1.5x faster on all six of their bench
/// instances); on the larger models (23k-26k rows) it was faster on fcn_8_vgg and SegNet but much
/// slower on vgg_unet (LF+10%: 59 s -> 83 s), so it stays on there. The paper formulation took
/// 7.97 s against 7.86 s without it (geometric mean of the six), and HiGHS 1.16's presolve gets
/// some small paper-formulation models wrong in a way no check after the solve can see: given a
/// start, it reported the start optimal above the optimum (`tests/data/highs/`,
/// docs/FORMULATION.md "HiGHS's presolve"), so it follows the same rule.
pub(crate) const SMALL_MODEL_ROWS: usize = 15_000;
/// No cutoff search when the incumbent costs more than this times the LP bound.
const WEAK_BOUND: f64 = 1.25;

/// Result of one MILP solve with extraction.
#[derive(Debug, Clone)]
pub(crate) struct MilpResult {
    pub(crate) best: Option<Incumbent>,
    pub(crate) status: RunStatus,
    pub(crate) lower_bound: Option<f64>,
    /// Whether the incumbent given is a point of the model (what "infeasible" then means: no plan
    /// at all, or none but the incumbent's where it is not).
    pub(crate) incumbent_fits: bool,
}

fn remaining(start: Instant, limit: Option<Duration>) -> Option<Duration> {
    limit.map(|l| l.saturating_sub(start.elapsed()))
}

/// Solves the MILP at `budget` and returns the best simulated plan within budget (the solver's or
/// the incumbent's). With `fixings` it solves the default formulation's restriction with those
/// `R` and `S` fixed ([`Model::build_fixed`]), whatever `options.formulation` says.
pub(crate) fn solve_milp(
    graph: &Graph,
    budget: u64,
    options: &SolveOptions,
    incumbent: Option<Incumbent>,
    cutoff: Option<f64>,
    fixings: Option<&model::Fixings>,
) -> Result<MilpResult> {
    let start = Instant::now();
    let mut model_budget = budget;
    let mut best = incumbent;
    let mut use_warm = true;
    // HiGHS 1.16's presolve can get small models wrong (see the retry below and run::run).
    let mut use_presolve = true;
    for attempt in 0..4 {
        let t0 = Instant::now();
        let model = Arc::new(match fixings {
            Some(f) => Model::build_fixed(
                graph,
                model_budget,
                model::memory_scale(graph, model_budget),
                f,
            ),
            None => Model::build(
                graph,
                BudgetMode::Bytes(model_budget),
                options.formulation,
                true,
            ),
        });
        tracing::debug!(
            attempt,
            formulation = ?options.formulation,
            fixed = fixings.map(|f| f.count()),
            cols = model.num_cols(),
            ints = model.num_int(),
            rows = model.num_rows(),
            seconds = t0.elapsed().as_secs_f64(),
            "built MILP"
        );
        let fitting = best
            .as_ref()
            .and_then(|b| warm::warm_vector(graph, &model, &b.schedule));
        let incumbent_fits = fitting.is_some();
        let warm_start = fitting.filter(|_| {
            use_warm && cutoff.map_or(true, |c| best.as_ref().is_some_and(|b| b.cost < c))
        });
        if let Some(w) = warm_start
            .as_ref()
            .filter(|_| tracing::enabled!(tracing::Level::DEBUG))
        {
            // HiGHS rejects a start that violates a row; say which (none should).
            for v in warm::violated_rows(&model, w) {
                tracing::debug!("warm start violates {v}");
            }
        }
        let warm_passed = warm_start.is_some();
        if best.is_some() && !incumbent_fits {
            tracing::debug!("the incumbent does not fit the model's memory count; not passed");
        }
        let opts = RunOptions {
            time_limit: remaining(start, options.time_limit),
            mip_gap: options.mip_gap,
            threads: options.threads,
            warm_start,
            seed: options.seed,
            cutoff,
            strategy: NAME,
            // Small models skip HiGHS's presolve (see SMALL_MODEL_ROWS).
            presolve: use_presolve && model.num_rows() >= SMALL_MODEL_ROWS,
        };
        let res = run::run(&model, &opts)?;
        let lower_bound = res.dual_bound.map(|b| b.max(0.0));
        let Some(x) = res.x.as_ref() else {
            return Ok(MilpResult {
                best,
                status: res.status,
                lower_bound,
                incumbent_fits,
            });
        };
        let keeps = warm::keeps_of_solution(&model, x);
        let schedule = warm::cleaned_schedule(graph, &keeps);
        let Some((plan, peak, cost)) = warm::judge(graph, &schedule, Some(budget)) else {
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
            // alone solves the model, or report the objective of a reduced model that presolve
            // got wrong (docs/FORMULATION.md, "HiGHS's presolve"); solve again without the start
            // and without presolve.
            tracing::debug!(
                cost,
                objective,
                "solution does not match the objective; re-solving cold without presolve"
            );
            use_warm = false;
            use_presolve = false;
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
                incumbent_fits,
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
                incumbent_fits,
            });
        }
    }
    Ok(MilpResult {
        best,
        status: RunStatus::TimeLimit,
        lower_bound: None,
        incumbent_fits: false,
    })
}

/// What is known about the least activation budget at which a plan exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeastFeasible {
    /// The least peak of a schedule found: a plan exists at this budget.
    pub bytes: u64,
    /// A proven lower bound: no frontier-advancing schedule peaks below it.
    pub lower_bound: u64,
}

impl LeastFeasible {
    /// Whether `bytes` is proven to be the least feasible budget.
    pub fn proven(&self) -> bool {
        self.bytes <= self.lower_bound
    }
}

/// The baseline schedule with the least peak, lowered toward `target` by [`lower_peak`].
pub(crate) fn least_peak_heuristic(
    graph: &Graph,
    options: &SolveOptions,
    target: u64,
    deadline: Instant,
) -> crate::lp_round::Judged {
    use crate::lp_round::Judged;
    let mut best: Option<Judged> = None;
    // The heuristics' own searches (only `evict`'s takes long) end by a quarter of the time left.
    let mut quick = options.clone();
    quick.time_limit = Some(deadline.saturating_duration_since(Instant::now()) / 4);
    for &name in crate::STRATEGY_NAMES {
        if name == NAME || name == crate::lp_round::NAME {
            continue;
        }
        let Ok(strategy) = crate::strategy_by_name(name) else {
            continue;
        };
        let Ok(Some(least)) = strategy.least_feasible_budget(graph, &quick) else {
            continue;
        };
        if best.as_ref().is_some_and(|b| b.peak <= least) {
            continue;
        }
        let Ok(Outcome {
            plan: Some(plan), ..
        }) = strategy.plan(graph, least, &quick)
        else {
            continue;
        };
        let keeps = warm::keeps_of_plan(graph, &plan);
        if let Some(j) = Judged::of(graph, keeps, least) {
            tracing::debug!(name, peak = j.peak, least, "least-peak start candidate");
            if best.as_ref().map_or(true, |b| j.peak < b.peak) {
                best = Some(j);
            }
        }
    }
    let cur = best.unwrap_or_else(|| {
        let plan = crate::baselines::CheckpointAll::schedule(graph).to_plan(graph);
        Judged::of(graph, warm::keeps_of_plan(graph, &plan), u64::MAX)
            .expect("checkpoint-all is valid")
    });
    lower_peak(graph, cur, target, deadline, options.seed)
}

/// `cur` lowered by repair toward `target` (moves judged by all the excess above it), then at one
/// byte below its peak at a time, with random kicks where no move lowers the peak, until its
/// peak is at most `target`, [`PEAK_TRIES`] kicks in a row fail or the deadline passes: the
/// schedule of least peak reached.
pub(crate) fn lower_peak(
    graph: &Graph,
    mut cur: crate::lp_round::Judged,
    target: u64,
    deadline: Instant,
    seed: u64,
) -> crate::lp_round::Judged {
    use crate::lp_round::{repair, Judged};
    let target = target.max(graph.min_feasible_activation_bytes());
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x1ea5);
    // Perturbations in a row that did not lower the peak (0: the last step was a descent).
    let mut tries = 0usize;
    while cur.peak > target && Instant::now() < deadline {
        if tries > 0 {
            // Stuck where no single move lowers the peak: drop random keep runs and descend
            // again, kept when the peak ends lower (our 1000-node random layered graph: the
            // descent stopped at 0.66 of the checkpoint-all peak).
            if tries > PEAK_TRIES {
                break;
            }
            let mut keeps = cur.keeps.clone();
            if !repair::drop_random_runs(&mut keeps, &mut rng) {
                break;
            }
            tries += 1;
            if let Some(start) = Judged::of(graph, keeps, target) {
                let j = repair::lower_toward(graph, start, target, deadline);
                if j.peak < cur.peak {
                    tracing::trace!(peak = j.peak, cost = j.cost, tries, "least-peak kick");
                    cur = j;
                    tries = 0;
                }
            }
            continue;
        }
        // Straight at the target first: moves judged by all the excess above it lower every
        // high moment together (ResNet50's operator graph at 64x64, batch 8, from evict's plan
        // to 0.35 of checkpoint-all: 5 s, where byte-by-byte descents had not arrived in 10).
        if let Some(start) = Judged::of(graph, cur.keeps.clone(), target) {
            let j = repair::lower_toward(graph, start, target, deadline);
            if j.peak < cur.peak {
                tracing::trace!(
                    peak = j.peak,
                    cost = j.cost,
                    "least-peak descent to the target"
                );
                cur = j;
            }
        }
        if cur.peak <= target || Instant::now() >= deadline {
            break;
        }
        // Stuck: one byte below the peak, moves judged by the peak alone, then again.
        let goal = cur.peak - 1;
        let Some(start) = Judged::of(graph, cur.keeps.clone(), goal) else {
            break;
        };
        match repair::repair(graph, start, goal, deadline) {
            Some(j) if j.peak < cur.peak => {
                tracing::trace!(peak = j.peak, cost = j.cost, "least-peak descent");
                cur = j
            }
            _ => tries = 1,
        }
    }
    cur
}

/// Random perturbations in a row without a lower peak after which the least-peak descent stops.
const PEAK_TRIES: usize = 60;

/// The least activation budget of any frontier-advancing schedule, as far as `options.time_limit`
/// allows (default 60 s).
///
/// The lower bound starts at [`Graph::min_feasible_activation_bytes`] (a node, its inputs and its
/// workspace are live together); the best peak starts at the least-peak baseline lowered by repair
/// ([`least_peak_heuristic`]). When they differ, the MILP that minimizes the peak, bounded by both
/// and warm-started with that schedule, closes the gap or raises the bound to its proven dual bound.
pub fn least_feasible(graph: &Graph, options: &SolveOptions) -> Result<LeastFeasible> {
    Ok(least_feasible_with_plan(graph, options)?.0)
}

/// [`least_feasible`] and a plan whose peak is its `bytes`.
pub(crate) fn least_feasible_with_plan(
    graph: &Graph,
    options: &SolveOptions,
) -> Result<(LeastFeasible, Plan)> {
    if graph.has_alternatives() {
        // Each node's leanest implementation never raises a peak: the least peak is the
        // leanest view's, and its plan keeps it with the cheapest implementations that fit.
        let (lean, options) = crate::strategy::leanest_view(graph, options);
        let (lf, plan) = least_feasible_with_plan(&lean, &options)?;
        let plan = checkmate_graph::choose_implementations(graph, &plan, Some(lf.bytes));
        return Ok((lf, plan));
    }
    let start = Instant::now();
    let limit = options.time_limit.unwrap_or(Duration::from_secs(60));
    let floor = graph.min_feasible_activation_bytes();
    let heuristic_deadline = start + limit.mul_f64(0.25);
    let heuristic = least_peak_heuristic(graph, options, floor, heuristic_deadline);
    let mut plan = heuristic.plan;
    let (schedule, peak) = (heuristic.schedule, heuristic.peak);
    let mut out = LeastFeasible {
        bytes: peak,
        lower_bound: floor.min(peak),
    };
    tracing::debug!(
        floor,
        heuristic = peak,
        seconds = start.elapsed().as_secs_f64(),
        "least peak heuristic"
    );
    if out.proven() {
        return Ok((out, plan));
    }
    let with_limit = SolveOptions {
        time_limit: Some(limit),
        ..options.clone()
    };
    if !crate::lp_round::lp_attempted(graph, &with_limit)
        || model_over_memory(graph, options.formulation, true, options).is_some()
    {
        // The min-peak model of such a graph (500k+ rows) takes longer than the time limit to
        // build and presolve (HiGHS's presolve does not stop at it): the bound stays the floor.
        tracing::debug!(
            nodes = graph.len(),
            "least feasible budget: no MILP for a graph this large"
        );
        return Ok((out, plan));
    }
    let model = Arc::new(Model::build(
        graph,
        BudgetMode::MinPeak {
            lo: floor,
            hi: peak,
        },
        options.formulation,
        true,
    ));
    let warm_start = warm::warm_vector(graph, &model, &schedule);
    let opts = RunOptions {
        time_limit: remaining(start, Some(limit)),
        mip_gap: 0.0,
        threads: options.threads,
        warm_start,
        seed: options.seed,
        cutoff: None,
        strategy: NAME,
        // An "optimal" here is a proof, and HiGHS's presolve has returned a start as optimal on
        // small models (see SMALL_MODEL_ROWS): the same rule as the cost MILPs.
        presolve: model.num_rows() >= SMALL_MODEL_ROWS,
    };
    let res = run::run(&model, &opts)?;
    if let Some(x) = res.x.as_ref() {
        let schedule = warm::cleaned_schedule(graph, &warm::keeps_of_solution(&model, x));
        if let Some((milp_plan, p, _)) = warm::judge(graph, &schedule, None) {
            if p < out.bytes {
                out.bytes = p;
                plan = milp_plan;
            }
        }
    }
    if res.status == RunStatus::Optimal {
        // The model's least peak is the least simulated peak (docs/FORMULATION.md).
        out.lower_bound = out.bytes;
    } else if let Some(d) = res.dual_bound {
        // Sizes are multiples of `scale` bytes when it is their gcd; round down to be safe.
        let bound = (d * model.scale * (1.0 - 1e-9)).floor().max(0.0) as u64;
        out.lower_bound = out.lower_bound.max(bound).min(out.bytes);
    }
    tracing::debug!(?out, status = ?res.status, seconds = start.elapsed().as_secs_f64(), "least feasible budget");
    Ok((out, plan))
}

/// The least activation budget of any frontier-advancing schedule, when proven within the time
/// limit (see [`least_feasible`]).
pub fn least_feasible_budget(graph: &Graph, options: &SolveOptions) -> Result<Option<u64>> {
    let lf = least_feasible(graph, options)?;
    Ok(lf.proven().then_some(lf.bytes))
}

/// The most time the stage-cover bound gets.
const STAGE_COVER_MAX: Duration = Duration::from_secs(10);
/// Where the exact model is not built, the stage-cover bound runs again with the time left less
/// this margin, if that is more than [`COVER_AGAIN_MIN`].
const COVER_AGAIN_MARGIN: Duration = Duration::from_secs(2);
const COVER_AGAIN_MIN: Duration = Duration::from_secs(5);

/// The stage-cover bound on cost at `budget` (crate::bound) within a tenth of the time left, at
/// most [`STAGE_COVER_MAX`]; `None` where it proves the budget infeasible (the floor every
/// strategy checks first says so too); with its cascade MILP's sketch of a plan.
fn cover_bound(
    graph: &Graph,
    budget: u64,
    start: Instant,
    options: &SolveOptions,
    cascades: bool,
) -> Result<(Option<f64>, Option<crate::bound::Sketch>)> {
    let share = remaining(start, options.time_limit)
        .map_or(STAGE_COVER_MAX, |d| d.mul_f64(0.1).min(STAGE_COVER_MAX));
    cover_bound_for(graph, budget, share, cascades)
}

/// The stage-cover bound within `share`, with or without its cascade MILP, and that MILP's
/// incumbent as a sketch of a plan.
fn cover_bound_for(
    graph: &Graph,
    budget: u64,
    share: Duration,
    cascades: bool,
) -> Result<(Option<f64>, Option<crate::bound::Sketch>)> {
    let relaxed;
    let graph = if graph.has_alternatives() {
        relaxed = graph.relaxed();
        &relaxed
    } else {
        graph
    };
    let deadline = Some(Instant::now() + share);
    let (cover, sketch) = crate::bound::stage_cover(graph, budget, deadline, cascades)?;
    let bound = match cover {
        crate::bound::StageCover::Bound(b) => Some(b),
        crate::bound::StageCover::Infeasible => None,
    };
    tracing::debug!(?bound, sketched = sketch.is_some(), "stage-cover bound");
    Ok((bound, sketch))
}

impl Strategy for Milp {
    fn uses_highs(&self, _graph: &Graph, _options: &SolveOptions) -> bool {
        true
    }

    fn takes_incumbents(&self) -> bool {
        true
    }

    fn proves_optimality(&self) -> bool {
        true
    }

    fn chooses_implementations(&self) -> bool {
        true
    }

    fn name(&self) -> &'static str {
        NAME
    }

    fn plan(&self, graph: &Graph, budget_bytes: u64, options: &SolveOptions) -> Result<Outcome> {
        let start = Instant::now();
        let skip = model_over_memory(graph, options.formulation, true, options)
            .or_else(|| model_too_slow(graph, options.formulation, options))
            .or_else(|| model_too_large(graph, options.formulation, options));
        if let Some(limit) = skip {
            // The exact model would not fit in memory, not start in time or not keep to the
            // limit: the paths that keep to the limits only, and the stage-cover bound, which
            // stays small. lp-round (which skips its LP too where the model is over memory)
            // starts from the best heuristic and only improves it, with most of the time; the
            // heuristics alone when it had no time.
            tracing::info!(%limit, "milp: not building the exact model");
            // The stage-cover bound with its cascade MILP first (CASCADE_SHARE of the time
            // limit, else STAGE_COVER_MAX): that MILP's incumbent sketches a plan from which
            // the search starts too (docs/FORMULATION.md, "Plans from the bound").
            let share = options.time_limit.map_or(STAGE_COVER_MAX, |l| {
                l.mul_f64(CASCADE_SHARE).saturating_sub(start.elapsed())
            });
            let (bound, sketch) = cover_bound_for(graph, budget_bytes, share, true)?;
            let (inc, lp_bound) = lp_round_incumbent(
                graph,
                budget_bytes,
                options,
                start,
                true,
                bound,
                sketch.as_ref(),
            );
            let inc = inc.or_else(|| best_heuristic(graph, budget_bytes, options));
            let mut bound = crate::strategy::larger_bound(bound, lp_bound);
            // Within the MILP gap, as the exact path below (ResNet50 at 0.5 with 600 s: 411755
            // against 411750 from lp-round's search, which stops there).
            let proven = |bound: Option<f64>| {
                inc.as_ref()
                    .zip(bound)
                    .is_some_and(|(i, b)| options.proves_optimal(i.cost, b))
            };
            // Where the incumbent search ends early (it gives up), the time left goes to the
            // stage-cover bound again, whose cascade MILP may finish now (docs/FORMULATION.md,
            // "Scale"): only when that is more than its first run had, as the model is the same
            // (after the 90% of the limit lp-round gets with its LP, on operator-level ResNet50,
            // the rerun had 10 s against the first run's 42 s and could not raise the bound).
            let left =
                remaining(start, options.time_limit).map(|d| d.saturating_sub(COVER_AGAIN_MARGIN));
            // Only with a plan: a "no plan found" answer states no cost bound, and the time
            // left goes to the bracket on the least feasible budget (`evict`'s bisection in
            // `strategy::solve`; with the cascade MILP here it had 2 s, too few at 1000 nodes,
            // and the bracket's top fell back to the checkpoint-all peak).
            let again = |d: &Duration| *d > COVER_AGAIN_MIN.max(share) && inc.is_some();
            if let Some(left) = left.filter(again) {
                if !proven(bound) {
                    let again = cover_bound_for(graph, budget_bytes, left, true)?.0;
                    tracing::debug!(?again, "stage-cover bound with the time left");
                    bound = crate::strategy::larger_bound(bound, again);
                }
            }
            let optimal = proven(bound);
            return Ok(Outcome {
                exact_model: false,
                status: match (&inc, optimal) {
                    (Some(_), true) => Status::Optimal,
                    (Some(_), false) => Status::Feasible,
                    (None, _) => Status::NoPlanFound,
                },
                lower_bound: bound.map(|b| inc.as_ref().map_or(b, |i| b.min(i.cost))),
                plan: inc.map(|b| b.plan),
                limit: Some(limit),
            });
        }
        let mut incumbent = if options.warm_start {
            best_heuristic(graph, budget_bytes, options)
        } else {
            None
        };
        // The stage-cover bound (crate::bound; milliseconds on graphs whose exact model is
        // built): above HiGHS's dual bound on ResNet50 at 0.5 even after 300 s, and a bound
        // where HiGHS's root LP does not finish in time. Computed before `lp-round`'s incumbent
        // step, which it can make unnecessary: where the best heuristic's plan meets it (VGG16,
        // fcn_8_vgg and vgg_unet at some of the solver benchmark's budgets), the proof took
        // 2-8 s before, nearly all of it in that step (docs/SOLVER_BENCH.md).
        let (cover, sketch) = cover_bound(graph, budget_bytes, start, options, true)?;
        let proven_by_cover = |inc: &Option<Incumbent>| {
            inc.as_ref()
                .zip(cover)
                .is_some_and(|(i, b)| options.proves_optimal(i.cost, b))
        };
        let mut lp_bound = None;
        if options.warm_start
            && options.formulation == Formulation::Fast
            && !proven_by_cover(&incumbent)
        {
            let (inc, bound) = lp_round_incumbent(
                graph,
                budget_bytes,
                options,
                start,
                false,
                cover,
                sketch.as_ref(),
            );
            lp_bound = bound;
            if let Some(inc) = inc {
                if incumbent.as_ref().map_or(true, |b| inc.cost < b.cost) {
                    incumbent = Some(inc);
                }
            }
        }
        if let Some(inc) = &incumbent {
            tracing::debug!(cost = inc.cost, "warm start");
        }
        if proven_by_cover(&incumbent) {
            let lower_bound = cover.zip(incumbent.as_ref()).map(|(b, i)| b.min(i.cost));
            return Ok(Outcome {
                exact_model: false,
                plan: incumbent.map(|i| i.plan),
                status: Status::Optimal,
                lower_bound,
                limit: None,
            });
        }
        // Cutoff search (default formulation): a near-optimal cutoff lets HiGHS fix most columns
        // by reduced cost right after the root. Try cutoffs just above the LP bound first; "no
        // solution below c" proves the optimum is at least c; a solution below c that HiGHS proves
        // optimal is optimal overall. A try gets a share of the time; the plain solve follows.
        let mut proven_lb = lp_bound;
        if let (Some(lb), true) = (lp_bound, incumbent.is_some()) {
            let gaps: Vec<f64> = std::env::var("CHECKMATE_CUTOFF_GAPS")
                .ok()
                .map(|v| v.split(',').filter_map(|x| x.parse().ok()).collect())
                .unwrap_or_else(|| CUTOFF_GAPS.to_vec());
            for (k, &gap) in gaps.iter().enumerate() {
                let c = lb * (1.0 + gap);
                let inc_cost = incumbent.as_ref().map_or(f64::INFINITY, |i| i.cost);
                if c >= inc_cost * (1.0 - options.mip_gap) {
                    break;
                }
                if inc_cost > lb * WEAK_BOUND {
                    // The LP bound is too weak to place a cutoff near the optimum (SegNet LF+10%:
                    // the optimum is 40% above it; both tries ended "infeasible" in presolve,
                    // 1.2 s each, and proved nothing the plain solve needed).
                    break;
                }
                if k == 0 && inc_cost - c < 0.5 * (inc_cost - lb) {
                    // The incumbent is nearly as good a cutoff: the try would only repeat the
                    // plain solve's presolve and root (VGG16 LF+30% and LF+50%: 0.2-0.4 s).
                    continue;
                }
                let mut opts = options.clone();
                let share = if k == 0 { 0.2 } else { 0.3 };
                opts.time_limit = remaining(start, options.time_limit).map(|d| d.mul_f64(share));
                let res = solve_milp(graph, budget_bytes, &opts, None, Some(c), None)?;
                tracing::debug!(c, status = ?res.status, cost = ?res.best.as_ref().map(|b| b.cost), "cutoff try");
                match (res.status, res.best) {
                    (RunStatus::Optimal, Some(b)) if b.cost < c => {
                        return Ok(Outcome {
                            exact_model: true,
                            limit: None,
                            lower_bound: Some(
                                res.lower_bound
                                    .unwrap_or(b.cost)
                                    .max(graph.least_total_cost())
                                    .min(b.cost),
                            ),
                            plan: Some(b.plan),
                            status: Status::Optimal,
                        });
                    }
                    (RunStatus::Infeasible, _) => proven_lb = Some(c),
                    // HiGHS keeps a solution above the cutoff that it found as its incumbent
                    // but prunes with the cutoff: "optimal" then means that no solution is
                    // below c (to within the gap; its reported dual bound is that incumbent's
                    // cost, which is not a bound). The plain solve follows, as before this case
                    // was told apart (going on to the next cutoff instead left it less time:
                    // MobileNet's bound after 30 s fell from 168450 to 162080).
                    (RunStatus::Optimal, Some(b)) => {
                        proven_lb = Some(c * (1.0 - options.mip_gap.max(0.0)));
                        if incumbent.as_ref().map_or(true, |i| b.cost < i.cost) {
                            incumbent = Some(b);
                        }
                        break;
                    }
                    (_, Some(b)) => {
                        if b.cost < c {
                            if let Some(d) = res.lower_bound {
                                proven_lb = proven_lb.map(|p| p.max(d.min(c)));
                            }
                        }
                        if incumbent.as_ref().map_or(true, |i| b.cost < i.cost) {
                            incumbent = Some(b);
                        }
                        break;
                    }
                    (_, None) => {
                        if let Some(d) = res.lower_bound {
                            proven_lb = proven_lb.map(|p| p.max(d.min(c)));
                        }
                        break;
                    }
                }
            }
        }
        // The time limit covers the heuristics too.
        let mut rest = options.clone();
        rest.time_limit = remaining(start, options.time_limit);
        let mut res = solve_milp(graph, budget_bytes, &rest, incumbent, None, None)?;
        if let (Some(p), Some(l)) = (proven_lb, res.lower_bound) {
            res.lower_bound = Some(l.max(p));
        }
        let lower_bound = crate::strategy::larger_bound(res.lower_bound, cover).map(|b| {
            b.max(graph.least_total_cost())
                .min(res.best.as_ref().map_or(f64::INFINITY, |b| b.cost))
        });
        let limit = (res.status == RunStatus::TimeLimit).then_some(Limit::Time);
        Ok(match (res.status, res.best) {
            (RunStatus::Optimal, Some(b)) => Outcome {
                exact_model: true,
                plan: Some(b.plan),
                status: Status::Optimal,
                lower_bound,
                limit,
            },
            (RunStatus::Infeasible, None) | (RunStatus::Optimal, None) => Outcome {
                exact_model: true,
                plan: None,
                status: Status::Infeasible,
                lower_bound: None,
                limit,
            },
            (_, Some(b)) => Outcome {
                exact_model: true,
                plan: Some(b.plan),
                status: Status::Feasible,
                lower_bound,
                limit,
            },
            (RunStatus::TimeLimit, None) => Outcome {
                exact_model: true,
                plan: None,
                status: Status::Timeout,
                lower_bound,
                limit,
            },
        })
    }

    fn least_feasible_budget(&self, graph: &Graph, options: &SolveOptions) -> Result<Option<u64>> {
        let mut opts = options.clone();
        opts.time_limit = Some(options.time_limit.unwrap_or(Duration::from_secs(60)));
        least_feasible_budget(graph, &opts)
    }

    /// The least peak [`least_feasible`] reaches (a schedule with that peak exists, and it is
    /// `milp`'s warm start there), proven or not.
    fn least_known_budget(
        &self,
        graph: &Graph,
        options: &SolveOptions,
    ) -> Result<Option<LeastKnown>> {
        let mut opts = options.clone();
        opts.time_limit = Some(options.time_limit.unwrap_or(Duration::from_secs(60)));
        let (lf, plan) = least_feasible_with_plan(graph, &opts)?;
        Ok(Some(LeastKnown {
            bytes: lf.bytes,
            proven: lf.proven(),
            plan: Some(plan),
        }))
    }
}
