//! The cost/memory frontier: every strategy's cost at evenly spaced activation budgets.
//!
//! ```
//! use checkmate_graph::{Graph, NodeKind, NodeSpec};
//! use checkmate_solver::sweep::{sweep, SweepOptions};
//! use checkmate_solver::strategy_by_name;
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
//! let strategies = vec![strategy_by_name("checkpoint-all")?, strategy_by_name("chen-greedy")?];
//! let result = sweep(&g, &strategies, &SweepOptions { points: 3, ..Default::default() }, &|_| {})?;
//! assert_eq!(result.budgets.len(), 3);
//! assert_eq!(result.points.len(), 6);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fmt;
use std::time::Instant;

use checkmate_graph::{Graph, Plan};
use rayon::prelude::*;

use crate::baselines::CheckpointAll;
use crate::error::{Error, Result};
use crate::strategy::{solve, SolveOptions, Status, Strategy};

/// How many budgets and with which solver options to sweep.
#[derive(Debug, Clone)]
pub struct SweepOptions {
    /// Number of budgets, evenly spaced from the least feasible budget to the checkpoint-all peak
    /// (both included; one point means the checkpoint-all peak only).
    pub points: usize,
    /// Options passed to every solve.
    pub solve: SolveOptions,
}

impl Default for SweepOptions {
    fn default() -> Self {
        SweepOptions {
            points: 10,
            solve: SolveOptions::default(),
        }
    }
}

/// What happened at one (budget, strategy) point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PointStatus {
    /// A plan within budget, as the strategy reported it (optimal, feasible or timeout).
    Solved(Status),
    /// Proven: no plan of any strategy fits this budget.
    Infeasible,
    /// The strategy found no plan within this budget (none is proven impossible).
    NoPlanFound,
    /// The strategy does not apply to the graph (e.g. `griewank` on a non-chain).
    NotApplicable,
    /// The strategy failed (solver error); the message is in [`SweepPoint::error`].
    Failed,
}

impl PointStatus {
    /// `optimal`, `feasible`, `timeout`, `infeasible`, `no-plan-found`, `not-applicable` or
    /// `failed`.
    pub fn as_str(self) -> &'static str {
        match self {
            PointStatus::Solved(s) => s.as_str(),
            PointStatus::Infeasible => "infeasible",
            PointStatus::NoPlanFound => "no-plan-found",
            PointStatus::NotApplicable => "not-applicable",
            PointStatus::Failed => "failed",
        }
    }
}

impl fmt::Display for PointStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One strategy at one activation budget.
#[derive(Debug, Clone)]
pub struct SweepPoint {
    /// Activation budget (total minus static).
    pub budget_bytes: u64,
    /// The strategy's name.
    pub strategy: String,
    /// Outcome.
    pub status: PointStatus,
    /// Simulated cost, when a plan fits.
    pub cost: Option<f64>,
    /// `cost / (one compute per node) - 1`, when a plan fits.
    pub overhead: Option<f64>,
    /// Simulated activation peak, when a plan fits.
    pub peak_bytes: Option<u64>,
    /// Wall-clock seconds spent on this point.
    pub seconds: f64,
    /// The error message for infeasible, not-applicable and failed points.
    pub error: Option<String>,
    /// A proven lower bound on the cost of any plan within this budget (the strategy's own, or
    /// one proven at a larger budget, which bounds every smaller one), when known.
    pub lower_bound: Option<f64>,
    /// The plan is the strategy's plan at this smaller budget: it found none cheaper here.
    pub carried_from: Option<u64>,
}

impl SweepPoint {
    /// Whether the point's plan is proven optimal (within the MIP gap).
    pub fn proven_optimal(&self) -> bool {
        self.status == PointStatus::Solved(Status::Optimal)
    }
}

/// A strategy's least feasible activation budget, as far as it can tell.
#[derive(Debug, Clone)]
pub struct StrategyBound {
    /// The strategy's name.
    pub strategy: String,
    /// The least activation budget at which it is known to have a plan
    /// ([`Strategy::least_known_budget`]), `None` when unknown or not applicable.
    pub least_feasible_bytes: Option<u64>,
    /// Whether that budget is proven least.
    pub least_proven: bool,
    /// Whether it can prove a plan optimal ([`Strategy::proves_optimality`]).
    pub proves_optimality: bool,
}

/// The frontier of several strategies on one graph.
#[derive(Debug, Clone)]
pub struct Sweep {
    /// The graph's name.
    pub graph: String,
    /// The graph's cost unit.
    pub cost_unit: String,
    /// Static bytes (add to an activation budget for the total).
    pub static_bytes: u64,
    /// Cost of one compute per node (overhead 0).
    pub base_cost: f64,
    /// Activation peak of checkpoint-all: the largest budget swept.
    pub checkpoint_all_peak: u64,
    /// The smallest budget swept: the least budget at which some strategy is known to have a
    /// plan, at least the graph's proven minimum.
    pub least_feasible_bytes: u64,
    /// Each strategy's least known budget, in the order given.
    pub bounds: Vec<StrategyBound>,
    /// The activation budgets, ascending.
    pub budgets: Vec<u64>,
    /// One point per budget and strategy, budget-major, strategies in the order given.
    pub points: Vec<SweepPoint>,
    /// Wall-clock seconds of the whole sweep.
    pub seconds: f64,
}

impl Sweep {
    /// The point of `strategy` at budget index `b`.
    pub fn point(&self, b: usize, strategy: &str) -> Option<&SweepPoint> {
        let per = self.bounds.len();
        self.points
            .get(b * per..(b + 1) * per)?
            .iter()
            .find(|p| p.strategy == strategy)
    }
}

/// `points` budgets evenly spaced over `[lo, hi]`, both included, deduplicated.
pub fn budget_grid(lo: u64, hi: u64, points: usize) -> Vec<u64> {
    let lo = lo.min(hi);
    let mut v: Vec<u64> = match points {
        0 => Vec::new(),
        1 => vec![hi],
        p => (0..p)
            .map(|k| lo + ((hi - lo) as u128 * k as u128 / (p - 1) as u128) as u64)
            .collect(),
    };
    v.dedup();
    v
}

/// Runs every strategy at `options.points` budgets between the least feasible budget and the
/// checkpoint-all peak, in parallel (rayon) across points; `on_point` is called as each point
/// finishes (from worker threads).
///
/// A strategy's cost never rises with the budget: any plan within a smaller budget is within a
/// larger one. Strategies that [take incumbents](Strategy::takes_incumbents) (`milp`,
/// `lp-round`) run their budgets in ascending order, each solve given the cheapest plan of the
/// smaller budgets as its incumbent (unless `options.solve.warm_start` is off); the others run
/// all their points in parallel, and a point costlier than a smaller budget's (or without a plan)
/// takes that plan afterwards ([`SweepPoint::carried_from`]). A lower bound proven at a budget
/// bounds every smaller one, and makes a point there optimal when its plan meets it.
///
/// The points of strategies that solve with HiGHS ([`Strategy::uses_highs`]: `milp`, and
/// `lp-round` where it runs its LP) run one after another, beside the parallel others: HiGHS
/// allows one solve at a time per process, and a point waiting for another's solve spent its
/// time limit waiting (a 10 s `milp` at SegNet's 9.89 GiB point returned a plan at +4.4% instead
/// of the +0.5% it proves alone in 2.5 s). Each such point gets its whole time limit.
///
/// Infeasible budgets and inapplicable strategies are points with that status, not errors.
pub fn sweep(
    graph: &Graph,
    strategies: &[Box<dyn Strategy>],
    options: &SweepOptions,
    on_point: &(dyn Fn(&SweepPoint) + Sync),
) -> Result<Sweep> {
    let start = Instant::now();
    let _span =
        tracing::info_span!("sweep", graph = graph.name(), points = options.points).entered();
    let checkpoint_all_peak = CheckpointAll::peak_bytes(graph);
    // Each strategy's least known budget, and the plan it found there (the first incumbent of a
    // chained strategy).
    let (bounds, least_plans): (Vec<StrategyBound>, Vec<Option<Plan>>) = strategies
        .par_iter()
        .map(|s| {
            let (planned_on, solve_options) =
                crate::strategy::planning_view(graph, s.as_ref(), &options.solve);
            let least = match s.least_known_budget(&planned_on, &solve_options) {
                Ok(l) => l,
                Err(e) => {
                    tracing::info!(strategy = s.name(), error = %e, "no least feasible budget");
                    None
                }
            };
            let bound = StrategyBound {
                strategy: s.name().to_string(),
                least_feasible_bytes: least.as_ref().map(|l| l.bytes),
                least_proven: least.as_ref().is_some_and(|l| l.proven),
                proves_optimality: s.proves_optimality(),
            };
            let plan = least
                .and_then(|l| l.plan)
                .map(|p| checkmate_graph::choose_implementations(graph, &p, None));
            (bound, plan)
        })
        .unzip();
    let floor = graph.min_feasible_activation_bytes();
    let least_feasible_bytes = bounds
        .iter()
        .filter_map(|b| b.least_feasible_bytes)
        .min()
        .unwrap_or(floor)
        .max(floor)
        .min(checkpoint_all_peak);
    let budgets = budget_grid(least_feasible_bytes, checkpoint_all_peak, options.points);
    tracing::debug!(?budgets, "sweep budgets");
    let per = strategies.len();
    let n_points = budgets.len() * per;
    let highs: Vec<bool> = strategies
        .iter()
        .map(|s| s.uses_highs(graph, &options.solve))
        .collect();
    let chained: Vec<bool> = strategies
        .iter()
        .map(|s| s.takes_incumbents() && options.solve.warm_start)
        .collect();
    // Jobs, each run in order (point indices are budget-major, so a strategy's budgets ascend):
    // every HiGHS point in one; each other chained strategy's points in one; the rest alone.
    let mut jobs: Vec<Vec<usize>> = vec![(0..n_points).filter(|&k| highs[k % per]).collect()];
    for s in (0..per).filter(|&s| chained[s] && !highs[s]) {
        jobs.push((0..budgets.len()).map(|b| b * per + s).collect());
    }
    jobs.extend(
        (0..n_points)
            .filter(|&k| !highs[k % per] && !chained[k % per])
            .map(|k| vec![k]),
    );
    // A chained strategy's first incumbent: the plan at its least known budget, with its cost
    // and peak (simulated once here, not per job).
    let seeds: Vec<Option<(f64, Plan, u64)>> = least_plans
        .into_iter()
        .zip(&chained)
        .map(|(plan, &chain)| {
            let plan = plan.filter(|_| chain)?;
            let sim = checkmate_graph::simulate(graph, &plan).ok()?;
            Some((sim.cost, plan, sim.peak_bytes))
        })
        .collect();
    let run_job = |job: Vec<usize>| {
        // Per chained strategy of the job: the cheapest plan so far, its cost and its budget.
        let mut best: Vec<Option<(f64, Plan, u64)>> = vec![None; per];
        for &k in &job {
            if best[k % per].is_none() {
                best[k % per] = seeds[k % per].clone();
            }
        }
        job.into_iter()
            .map(|k| {
                let (s, budget) = (k % per, budgets[k / per]);
                let mut opts = options.solve.clone();
                let given = best[s].as_ref();
                if let Some((_, plan, _)) = given {
                    opts.incumbents.push(plan.clone());
                }
                let (mut p, plan) = run_point(graph, strategies[s].as_ref(), budget, &opts);
                if p.carried_from.is_some() {
                    // The least known budget's plan, at that budget, is the strategy's own.
                    p.carried_from = given.map(|g| g.2).filter(|&from| from < budget);
                }
                if let (Some(cost), Some(plan), true) = (p.cost, plan, chained[s]) {
                    if best[s].as_ref().map_or(true, |b| cost < b.0) {
                        best[s] = Some((cost, plan, budget));
                    }
                }
                on_point(&p);
                (k, p)
            })
            .collect::<Vec<_>>()
    };
    let mut points: Vec<(usize, SweepPoint)> =
        jobs.into_par_iter().flat_map_iter(run_job).collect();
    points.sort_by_key(|&(k, _)| k);
    let mut points: Vec<SweepPoint> = points.into_iter().map(|(_, p)| p).collect();
    monotone(&mut points, per, &options.solve);
    Ok(Sweep {
        graph: graph.name().to_string(),
        cost_unit: graph.cost_unit().to_string(),
        static_bytes: graph.static_bytes(),
        base_cost: graph.total_cost(),
        checkpoint_all_peak,
        least_feasible_bytes,
        bounds,
        budgets,
        points,
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// Makes each strategy's frontier non-increasing (`points` budget-major, `per` strategies): a
/// point costlier than a smaller budget's plan, or without a plan where the strategy found one
/// at a smaller budget, takes that plan; a lower bound carries down to the smaller budgets, and a
/// plan that meets its bound (within `options.mip_gap`) is optimal.
fn monotone(points: &mut [SweepPoint], per: usize, options: &SolveOptions) {
    let budgets = points.len() / per.max(1);
    for s in 0..per {
        let mut best: Option<SweepPoint> = None;
        for b in 0..budgets {
            let p = &mut points[b * per + s];
            let carries = matches!(p.status, PointStatus::Solved(_) | PointStatus::NoPlanFound);
            match &best {
                Some(q) if carries && p.cost.map_or(true, |c| q.cost.is_some_and(|qc| qc < c)) => {
                    let own_bound = p.lower_bound;
                    let status = match p.status {
                        PointStatus::Solved(Status::Optimal) => p.status,
                        _ => PointStatus::Solved(Status::Feasible),
                    };
                    *p = SweepPoint {
                        budget_bytes: p.budget_bytes,
                        seconds: p.seconds,
                        status,
                        error: None,
                        lower_bound: own_bound,
                        carried_from: q.carried_from.or(Some(q.budget_bytes)),
                        ..q.clone()
                    };
                }
                _ => {
                    if p.cost.is_some() {
                        best = Some(p.clone());
                    }
                }
            }
        }
        let mut bound: Option<f64> = None;
        for b in (0..budgets).rev() {
            let p = &mut points[b * per + s];
            bound = crate::strategy::larger_bound(bound, p.lower_bound);
            if let Some(c) = p.cost {
                p.lower_bound = bound.map(|l| l.min(c));
            }
            if let (Some(c), Some(l), PointStatus::Solved(Status::Feasible | Status::Timeout)) =
                (p.cost, bound, p.status)
            {
                if options.proves_optimal(c, l) {
                    p.status = PointStatus::Solved(Status::Optimal);
                }
            }
        }
    }
}

/// Solves one point; errors become statuses. Returns the plan too, when there is one.
fn run_point(
    graph: &Graph,
    strategy: &dyn Strategy,
    budget_bytes: u64,
    options: &SolveOptions,
) -> (SweepPoint, Option<Plan>) {
    let start = Instant::now();
    let result = solve(graph, strategy, budget_bytes, options);
    let seconds = start.elapsed().as_secs_f64();
    let mut p = SweepPoint {
        budget_bytes,
        strategy: strategy.name().to_string(),
        status: PointStatus::Failed,
        cost: None,
        overhead: None,
        peak_bytes: None,
        seconds,
        error: None,
        lower_bound: None,
        carried_from: None,
    };
    let mut plan = None;
    match result {
        Ok(sol) => {
            p.status = PointStatus::Solved(sol.status);
            p.lower_bound = sol.lower_bound;
            if let Some(sim) = &sol.simulation {
                p.cost = Some(sim.cost);
                p.overhead = Some(sim.overhead(graph));
                p.peak_bytes = Some(sim.peak_bytes);
            }
            // The exact budget is filled in by the caller, which knows where it came from.
            p.carried_from = sol.from_incumbent.then_some(0);
            plan = sol.plan;
        }
        Err(e) => {
            p.status = match e {
                Error::BudgetTooSmall { .. } => PointStatus::Infeasible,
                Error::NoPlanFound { .. } => PointStatus::NoPlanFound,
                Error::NotApplicable { .. } => PointStatus::NotApplicable,
                _ => {
                    tracing::warn!(strategy = strategy.name(), budget_bytes, error = %e, "point failed");
                    PointStatus::Failed
                }
            };
            p.error = Some(e.to_string());
        }
    }
    (p, plan)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;
    use crate::baselines::tests::chain;
    use crate::baselines::CheckpointAll;
    use crate::strategy::Outcome;

    /// Checkpoint-all's plan, after a pause, counting how many calls overlap.
    struct Slow {
        highs: bool,
        running: &'static AtomicUsize,
        most: &'static AtomicUsize,
    }

    impl Strategy for Slow {
        fn name(&self) -> &'static str {
            if self.highs {
                "slow-highs"
            } else {
                "slow"
            }
        }
        fn plan(&self, graph: &Graph, budget: u64, options: &SolveOptions) -> Result<Outcome> {
            let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
            self.most.fetch_max(now, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(30));
            self.running.fetch_sub(1, Ordering::SeqCst);
            CheckpointAll.plan(graph, budget, options)
        }
        fn uses_highs(&self, _graph: &Graph, _options: &SolveOptions) -> bool {
            self.highs
        }
    }

    /// Points of strategies that use HiGHS never run at the same time (each keeps its whole time
    /// limit); the others still run in parallel; points come back in budget-major order.
    #[test]
    fn highs_points_run_one_at_a_time() {
        static RUNNING: AtomicUsize = AtomicUsize::new(0);
        static MOST: AtomicUsize = AtomicUsize::new(0);
        static OTHER_RUNNING: AtomicUsize = AtomicUsize::new(0);
        static OTHER_MOST: AtomicUsize = AtomicUsize::new(0);
        let g = chain(4, 10);
        let strategies: Vec<Box<dyn Strategy>> = vec![
            Box::new(Slow {
                highs: true,
                running: &RUNNING,
                most: &MOST,
            }),
            Box::new(Slow {
                highs: true,
                running: &RUNNING,
                most: &MOST,
            }),
            Box::new(Slow {
                highs: false,
                running: &OTHER_RUNNING,
                most: &OTHER_MOST,
            }),
        ];
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(4)
            .build()
            .unwrap();
        let options = SweepOptions {
            points: 6,
            ..Default::default()
        };
        let result = pool
            .install(|| sweep(&g, &strategies, &options, &|_| {}))
            .unwrap();
        assert_eq!(MOST.load(Ordering::SeqCst), 1);
        assert!(
            OTHER_MOST.load(Ordering::SeqCst) > 1,
            "the others ran one at a time"
        );
        assert_eq!(result.points.len(), 3 * result.budgets.len());
        for (k, p) in result.points.iter().enumerate() {
            assert_eq!(p.strategy, strategies[k % 3].name());
            assert_eq!(p.budget_bytes, result.budgets[k / 3]);
        }
    }

    fn point(
        budget: u64,
        status: PointStatus,
        cost: Option<f64>,
        bound: Option<f64>,
    ) -> SweepPoint {
        SweepPoint {
            budget_bytes: budget,
            strategy: "s".into(),
            status,
            cost,
            overhead: cost.map(|c| c / 10.0 - 1.0),
            peak_bytes: cost.map(|_| budget),
            seconds: 0.0,
            error: None,
            lower_bound: bound,
            carried_from: None,
        }
    }

    /// A costlier point, or one without a plan, takes the smaller budget's plan; bounds carry
    /// down and make a point that meets them optimal.
    #[test]
    fn frontiers_never_rise_and_bounds_carry_down() {
        let feasible = PointStatus::Solved(Status::Feasible);
        let mut pts = vec![
            point(10, PointStatus::NoPlanFound, None, None),
            point(20, feasible, Some(15.0), None),
            point(30, feasible, Some(17.0), Some(12.0)),
            point(40, PointStatus::NoPlanFound, None, None),
            point(50, feasible, Some(12.0), Some(12.0)),
            point(60, PointStatus::NotApplicable, None, None),
        ];
        monotone(
            &mut pts,
            1,
            &SolveOptions {
                mip_gap: 1e-4,
                ..SolveOptions::default()
            },
        );
        assert_eq!(pts[0].cost, None, "nothing below to carry");
        assert_eq!((pts[1].cost, pts[1].carried_from), (Some(15.0), None));
        assert_eq!((pts[2].cost, pts[2].carried_from), (Some(15.0), Some(20)));
        assert_eq!(pts[2].peak_bytes, Some(20));
        assert_eq!(pts[2].lower_bound, Some(12.0));
        assert_eq!((pts[3].cost, pts[3].carried_from), (Some(15.0), Some(20)));
        assert_eq!(pts[3].status, feasible);
        // Proven optimal by its own bound; the bound also holds below it.
        assert!(pts[4].proven_optimal());
        assert_eq!(pts[1].lower_bound, Some(12.0));
        assert!(!pts[1].proven_optimal());
        assert_eq!(pts[5].status, PointStatus::NotApplicable);
    }

    /// Several strategies are kept apart (points are budget-major).
    #[test]
    fn strategies_are_kept_apart() {
        let feasible = PointStatus::Solved(Status::Feasible);
        let mut pts = vec![
            point(10, feasible, Some(20.0), None),
            point(10, PointStatus::NoPlanFound, None, None),
            point(20, feasible, Some(25.0), None),
            point(20, feasible, Some(30.0), None),
        ];
        monotone(
            &mut pts,
            2,
            &SolveOptions {
                mip_gap: 1e-4,
                ..SolveOptions::default()
            },
        );
        assert_eq!(pts[2].cost, Some(20.0));
        assert_eq!(pts[3].cost, Some(30.0));
        assert_eq!(pts[1].cost, None);
    }

    #[test]
    fn grid_spans_both_ends() {
        assert_eq!(budget_grid(10, 20, 3), vec![10, 15, 20]);
        assert_eq!(budget_grid(10, 20, 1), vec![20]);
        assert_eq!(budget_grid(30, 20, 4), vec![20]);
        assert!(budget_grid(1, 2, 0).is_empty());
    }
}
