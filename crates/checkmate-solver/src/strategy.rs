//! The strategy trait, solve options and solutions.

use std::fmt;
use std::time::{Duration, Instant};

use std::borrow::Cow;

use checkmate_graph::{choose_implementations, simulate, Graph, Plan, Simulation};

use crate::error::{Error, Result};

/// How a strategy's answer stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Proven optimal (within the MIP gap for `milp`).
    Optimal,
    /// Within budget, not proven optimal.
    Feasible,
    /// Proven: no plan within budget exists.
    Infeasible,
    /// The strategy found no plan within budget, and none is proven impossible.
    NoPlanFound,
    /// The time limit passed before any plan was found.
    Timeout,
}

impl Status {
    /// `optimal`, `feasible`, `infeasible`, `no-plan-found` or `timeout`.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Optimal => "optimal",
            Status::Feasible => "feasible",
            Status::Infeasible => "infeasible",
            Status::NoPlanFound => "no-plan-found",
            Status::Timeout => "timeout",
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which MILP formulation `milp` and `lp-round` build.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Formulation {
    /// Our tightened formulation (the default).
    #[default]
    Fast,
    /// The paper's formulation, constraint for constraint.
    Paper,
}

/// Options shared by all strategies; heuristics ignore the solver ones.
#[derive(Debug, Clone)]
pub struct SolveOptions {
    /// Wall-clock limit for MILP/LP solves.
    pub time_limit: Option<Duration>,
    /// Relative MIP gap at which `milp` stops.
    pub mip_gap: f64,
    /// Solver threads.
    pub threads: usize,
    /// MILP formulation.
    pub formulation: Formulation,
    /// Give `milp` the best heuristic plan as a starting incumbent.
    pub warm_start: bool,
    /// Seed for randomized rounding.
    pub seed: u64,
    /// Memory the exact models (`milp`'s MILP, `lp-round`'s LP, the least-feasible search's
    /// MILP) may take, HiGHS included, estimated before building ([`crate::milp::ModelSize`]);
    /// `None`: [`default_solver_memory`]. A model that would not fit is not built: the strategy
    /// answers from its memory-cheap paths and says so ([`Limit::Memory`]).
    pub memory_limit: Option<u64>,
    /// Plans known beforehand (e.g. found at smaller budgets by a sweep). [`solve`] returns the
    /// cheapest of them within the budget when the strategy's own plan costs more or there is
    /// none, so a strategy never answers worse than a plan it was given; strategies that
    /// [take incumbents](Strategy::takes_incumbents) also start their search from it.
    pub incumbents: Vec<Plan>,
}

impl Default for SolveOptions {
    fn default() -> Self {
        SolveOptions {
            time_limit: None,
            mip_gap: 1e-4,
            threads: 1,
            formulation: Formulation::Fast,
            warm_start: true,
            seed: 0,
            memory_limit: None,
            incumbents: Vec::new(),
        }
    }
}

/// The least activation budget at which a strategy is known to have a plan
/// ([`Strategy::least_known_budget`]).
#[derive(Debug, Clone)]
pub struct LeastKnown {
    /// The budget: a plan of the strategy peaks at (or below) it.
    pub bytes: u64,
    /// Whether no plan of any strategy fits a smaller budget (proven).
    pub proven: bool,
    /// A plan within `bytes`, when the strategy found one on the way.
    pub plan: Option<Plan>,
}

impl SolveOptions {
    /// The memory limit for exact models: [`SolveOptions::memory_limit`] or the default.
    pub fn solver_memory(&self) -> u64 {
        self.memory_limit.unwrap_or_else(default_solver_memory)
    }

    /// Whether a lower bound `bound` proves a plan of cost `cost` optimal: within the relative
    /// gap [`SolveOptions::mip_gap`], as HiGHS's MILP means "optimal".
    pub fn proves_optimal(&self, cost: f64, bound: f64) -> bool {
        cost <= bound * (1.0 + self.mip_gap.max(0.0))
    }
}

/// Half the memory the OS says is available (`MemAvailable` in `/proc/meminfo`), or 4 GiB where
/// it does not say: what an exact model may take by default, leaving the rest to the caller's
/// process (users solve inside their training jobs).
pub fn default_solver_memory() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            let line = m.lines().find(|l| l.starts_with("MemAvailable:"))?;
            let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kib * 1024 / 2)
        })
        .unwrap_or(4 << 30)
}

/// The process's peak resident memory (`VmHWM` in `/proc/self/status`) since it started or since
/// the last [`reset_peak_resident`]; `None` where the OS does not report it. What the
/// out-of-memory killer judges, so what `checkmate solve --json` and the solver benchmarks report
/// beside a solve's time.
pub fn peak_resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Starts a new [`peak_resident_bytes`] from the memory resident now (Linux 4.0+: writes `5` to
/// `/proc/self/clear_refs`); `false` where that is not possible.
pub fn reset_peak_resident() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// Which limit ended a solve before the strategy was done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// The time limit passed (the plan is the best found by then).
    Time,
    /// The exact model would need `model_bytes` (estimated), more than `limit_bytes`: it was not
    /// built, and the plan comes from the memory-cheap paths (baselines, repair, local search).
    Memory {
        /// Estimated bytes of the exact model's solve, HiGHS included.
        model_bytes: u64,
        /// The memory limit it was compared with.
        limit_bytes: u64,
    },
    /// HiGHS's start-up on the exact model, which does not stop at the time limit, would take
    /// about `startup_seconds` (estimated from its size), more than the time limit allows: the
    /// model was not built, and the plan comes from the paths that keep to the limit.
    Startup {
        /// Estimated seconds before HiGHS checks the time limit on this model.
        startup_seconds: u64,
        /// The time limit, seconds.
        limit_seconds: u64,
    },
    /// The exact model has more than `rows` rows; on models this large HiGHS's MILP runs a root
    /// phase with no time limit (an interior point method for the analytic centre: over ten
    /// minutes on ResNet50 at 0.5, 600k rows), so under a time limit the MILP is not run: the
    /// plan comes from the paths that keep to the limit, the bound from the LP relaxation and
    /// the stage-cover bound.
    LargeModel {
        /// Rows of the exact model (estimated).
        rows: u64,
    },
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Limit::Time => f.write_str("the time limit"),
            Limit::Memory {
                model_bytes,
                limit_bytes,
            } => write!(
                f,
                "the memory limit: the exact model would take about {}, more than the {} allowed \
                 (--solver-memory); it was not built",
                checkmate_graph::format_bytes(*model_bytes),
                checkmate_graph::format_bytes(*limit_bytes)
            ),
            Limit::Startup {
                startup_seconds,
                limit_seconds,
            } => write!(
                f,
                "the time limit: HiGHS would need about {startup_seconds} s to start on the exact \
                 model, more than the {limit_seconds} s allowed (--time-limit); it was not built"
            ),
            Limit::LargeModel { rows } => write!(
                f,
                "the time limit: the exact model has about {rows} rows, where HiGHS's MILP does \
                 not keep to a time limit (its root analytic-centre computation ignores it); the \
                 MILP was not run (run without --time-limit to run it)"
            ),
        }
    }
}

/// What a strategy returns before the simulator judges it.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The plan, if one was found.
    pub plan: Option<Plan>,
    /// Optimal, feasible, infeasible or timeout.
    pub status: Status,
    /// A proven lower bound on the cost of any plan within the budget.
    pub lower_bound: Option<f64>,
    /// The limit that ended the search early, if one did.
    pub limit: Option<Limit>,
    /// HiGHS solved the strategy's exact MILP (`milp`'s stage model, in the formulation asked
    /// for) for this answer; `false` where the answer came without it: a heuristic's plan that
    /// meets a proven bound, a model too large to build, or a strategy that has none.
    pub exact_model: bool,
}

/// A rematerialization strategy: given a graph and an activation budget, a plan.
pub trait Strategy: Send + Sync {
    /// The strategy's name as on the command line.
    fn name(&self) -> &'static str;

    /// Finds a plan whose activation peak should stay within `budget_bytes`.
    ///
    /// The caller ([`solve`]) simulates the plan and rejects it if it is over budget; strategies never
    /// report their own peak or cost.
    fn plan(&self, graph: &Graph, budget_bytes: u64, options: &SolveOptions) -> Result<Outcome>;

    /// The least activation budget at which this strategy returns a plan, when it can tell cheaply.
    fn least_feasible_budget(&self, graph: &Graph, options: &SolveOptions) -> Result<Option<u64>> {
        let _ = (graph, options);
        Ok(None)
    }

    /// The least activation budget at which this strategy is known to return a plan, whether it
    /// is proven least, and a plan there when the strategy has one at hand: what a sweep starts
    /// from. By default the [least feasible budget](Strategy::least_feasible_budget), proven.
    fn least_known_budget(
        &self,
        graph: &Graph,
        options: &SolveOptions,
    ) -> Result<Option<LeastKnown>> {
        Ok(self
            .least_feasible_budget(graph, options)?
            .map(|bytes| LeastKnown {
                bytes,
                proven: true,
                plan: None,
            }))
    }

    /// Whether the strategy solves with HiGHS on this graph, which runs one solve at a time per
    /// process: such points are not run concurrently with each other (see [`crate::sweep::sweep`]).
    fn uses_highs(&self, graph: &Graph, options: &SolveOptions) -> bool {
        let _ = (graph, options);
        false
    }

    /// Whether the strategy searches from [`SolveOptions::incumbents`] (`milp`, `lp-round`), so
    /// that a sweep runs its budgets in ascending order, each starting from the plans of the
    /// smaller ones; for the others [`solve`]'s fallback to the incumbent is all they gain.
    fn takes_incumbents(&self) -> bool {
        false
    }

    /// Whether the strategy can prove its plans optimal (status `optimal`, with a lower bound):
    /// `milp`, and `lp-round` through its LP bound. A sweep marks their other points as not
    /// proven; the baselines never claim optimality.
    fn proves_optimality(&self) -> bool {
        false
    }

    /// Whether the strategy chooses among nodes' implementations itself (`milp`). The others
    /// plan on [`Graph::leanest`] (every node in its least-workspace implementation), and
    /// [`solve`] then gives each compute the cheapest implementation that fits the budget
    /// ([`choose_implementations`]).
    fn chooses_implementations(&self) -> bool {
        false
    }
}

/// A plan judged by the simulator.
#[derive(Debug, Clone)]
pub struct Solution {
    /// The strategy's name.
    pub strategy: String,
    /// Optimal, feasible, infeasible or timeout.
    pub status: Status,
    /// The plan, when one was found.
    pub plan: Option<Plan>,
    /// The simulator's verdict on the plan (peak and cost come only from here).
    pub simulation: Option<Simulation>,
    /// A proven lower bound on the cost, when the strategy has one.
    pub lower_bound: Option<f64>,
    /// The activation budget given.
    pub budget_bytes: u64,
    /// Wall-clock seconds spent in the strategy.
    pub solve_seconds: f64,
    /// The plan is one of [`SolveOptions::incumbents`]: the strategy found nothing cheaper.
    pub from_incumbent: bool,
    /// The limit that ended the strategy's search early, if one did.
    pub limit: Option<Limit>,
    /// See [`Outcome::exact_model`]: whether HiGHS solved the exact MILP for this answer.
    pub exact_model: bool,
}

impl Solution {
    /// The simulated cost, if there is a plan.
    pub fn cost(&self) -> Option<f64> {
        self.simulation.as_ref().map(|s| s.cost)
    }

    /// The simulated activation peak, if there is a plan.
    pub fn peak_bytes(&self) -> Option<u64> {
        self.simulation.as_ref().map(|s| s.peak_bytes)
    }
}

/// The larger of two lower bounds on cost, either of which may be missing.
pub(crate) fn larger_bound(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}

/// Runs `strategy` under an activation budget and judges its plan with the simulator.
///
/// No plan within budget is an error: [`Error::BudgetTooSmall`] when that is proven (the budget is
/// below the proven floor on every plan's peak, or the strategy proved it), else
/// [`Error::NoPlanFound`]; both name the least budget the strategy needs where it can tell. A
/// solver time-out instead returns a solution with status `timeout` and no plan.
pub fn solve(
    graph: &Graph,
    strategy: &dyn Strategy,
    budget_bytes: u64,
    options: &SolveOptions,
) -> Result<Solution> {
    let name = strategy.name();
    let _span = tracing::info_span!("solve", strategy = name, budget_bytes).entered();
    let start = Instant::now();
    // No plan of any strategy fits below the largest single-compute need (a node, its inputs and
    // its workspace live together): answer without running the strategy.
    let mut outcome = if budget_bytes < graph.min_feasible_activation_bytes() {
        Outcome {
            exact_model: false,
            plan: None,
            status: Status::Infeasible,
            lower_bound: None,
            limit: None,
        }
    } else if graph.has_alternatives() {
        let (planned_on, options) = planning_view(graph, strategy, options);
        let mut outcome = strategy.plan(&planned_on, budget_bytes, &options)?;
        if !strategy.chooses_implementations() {
            if let Some(plan) = &mut outcome.plan {
                *plan = choose_implementations(graph, plan, Some(budget_bytes));
            }
            // A bound or proof on the leanest view is about its costs, not the cheaper
            // implementations'.
            outcome.lower_bound = None;
            if outcome.status == Status::Optimal {
                outcome.status = Status::Feasible;
            }
        }
        outcome
    } else {
        strategy.plan(graph, budget_bytes, options)?
    };
    let solve_seconds = start.elapsed().as_secs_f64();
    let mut simulation = match &outcome.plan {
        Some(plan) => Some(simulate(graph, plan).map_err(|source| Error::InvalidPlan {
            strategy: name.to_string(),
            source,
        })?),
        None => None,
    };
    let mut from_incumbent = false;
    if let Some((plan, sim)) = cheapest_incumbent(graph, &options.incumbents, budget_bytes) {
        let own = simulation
            .as_ref()
            .filter(|s| s.peak_bytes <= budget_bytes)
            .map(|s| s.cost);
        if own.map_or(true, |c| sim.cost < c) {
            tracing::debug!(cost = sim.cost, own = ?own, "an incumbent is cheaper than the strategy's plan");
            // A proof of optimality still holds (the incumbent is within the gap); a claim that
            // nothing fits cannot, and no plan at all is a plan now.
            if outcome.status != Status::Optimal {
                outcome.status = Status::Feasible;
            }
            outcome.plan = Some(plan.clone());
            simulation = Some(sim);
            from_incumbent = true;
        }
    }
    let fits = simulation
        .as_ref()
        .is_some_and(|s| s.peak_bytes <= budget_bytes);
    if !fits && outcome.status != Status::Timeout {
        let floor = graph.min_feasible_activation_bytes();
        // A least budget at or below this one would contradict the failure: never reported.
        // The time limit covers this search too: it gets what is left (at least a tenth of the
        // limit, up to 2 s, so that the error can still name a budget).
        let mut rest = options.clone();
        rest.time_limit = options.time_limit.map(|l| {
            l.saturating_sub(start.elapsed())
                .max((l / 10).min(Duration::from_secs(2)))
        });
        let (planned_on, rest) = planning_view(graph, strategy, &rest);
        let least_feasible_bytes = strategy
            .least_feasible_budget(&planned_on, &rest)?
            .filter(|&l| l > budget_bytes);
        let strategy = name.to_string();
        let static_bytes = graph.static_bytes();
        return Err(
            if budget_bytes < floor || outcome.status == Status::Infeasible {
                Error::BudgetTooSmall {
                    strategy,
                    budget_bytes,
                    static_bytes,
                    least_feasible_bytes,
                    proven_lower_bound_bytes: (budget_bytes < floor).then_some(floor),
                }
            } else {
                // The bracket's upper end: the least budget with a known plan (`evict` reaches
                // far below the checkpoint-all peak in a few seconds on 1000 nodes).
                let mut known = (
                    crate::baselines::CheckpointAll::peak_bytes(graph),
                    "checkpoint-all",
                );
                if let Some(l) = least_feasible_bytes {
                    if l < known.0 {
                        known = (l, name);
                    }
                }
                if name != crate::evict::NAME {
                    // Within what is left of the time limit (at least 2 s).
                    let deadline = options.time_limit.map(|l| {
                        Instant::now()
                            + l.saturating_sub(start.elapsed())
                                .max(Duration::from_secs(2))
                    });
                    let (l, _) = crate::evict::least_evict_budget(graph, deadline);
                    if l < known.0 && l > budget_bytes {
                        known = (l, crate::evict::NAME);
                    }
                }
                Error::NoPlanFound {
                    strategy,
                    budget_bytes,
                    static_bytes,
                    least_feasible_bytes,
                    proven_floor_bytes: floor,
                    known_plan_bytes: known.0,
                    known_plan_by: known.1.to_string(),
                }
            },
        );
    }
    // No plan costs less than one compute per node: a plan at that cost is optimal.
    let base = graph.least_total_cost();
    if fits
        && simulation
            .as_ref()
            .is_some_and(|s| s.cost <= base * (1.0 + 1e-12))
    {
        outcome.status = Status::Optimal;
        outcome.lower_bound = Some(base);
        // (A memory limit still says that the exact model was not built.)
        if outcome.limit == Some(Limit::Time) {
            outcome.limit = None;
        }
    }
    tracing::debug!(seconds = solve_seconds, status = %outcome.status, "solved");
    Ok(Solution {
        strategy: name.to_string(),
        status: if fits {
            outcome.status
        } else {
            Status::Timeout
        },
        plan: if fits { outcome.plan } else { None },
        simulation: if fits { simulation } else { None },
        lower_bound: outcome.lower_bound,
        budget_bytes,
        solve_seconds,
        from_incumbent: fits && from_incumbent,
        limit: outcome.limit,
        exact_model: outcome.exact_model,
    })
}

/// What `strategy` plans on: `graph` itself, or for a strategy that does not
/// [choose implementations](Strategy::chooses_implementations) on a graph with alternatives, its
/// [leanest](Graph::leanest) view, with the options' incumbents reduced to their steps (their
/// implementations are the full graph's).
pub fn planning_view<'g>(
    graph: &'g Graph,
    strategy: &dyn Strategy,
    options: &SolveOptions,
) -> (Cow<'g, Graph>, SolveOptions) {
    if !graph.has_alternatives() || strategy.chooses_implementations() {
        return (Cow::Borrowed(graph), options.clone());
    }
    let (lean, options) = leanest_view(graph, options);
    (Cow::Owned(lean), options)
}

/// [`Graph::leanest`] and `options` with its incumbents reduced to their steps (their
/// implementations are `graph`'s).
pub(crate) fn leanest_view(graph: &Graph, options: &SolveOptions) -> (Graph, SolveOptions) {
    let mut options = options.clone();
    for p in &mut options.incumbents {
        p.implementations.clear();
    }
    (graph.leanest(), options)
}

/// The cheapest of `plans` whose simulated peak is within `budget_bytes`, with its simulation
/// (plans the simulator rejects are skipped).
fn cheapest_incumbent<'a>(
    graph: &Graph,
    plans: &'a [Plan],
    budget_bytes: u64,
) -> Option<(&'a Plan, Simulation)> {
    plans
        .iter()
        .filter_map(|p| simulate(graph, p).ok().map(|s| (p, s)))
        .filter(|(_, s)| s.peak_bytes <= budget_bytes)
        .min_by(|a, b| a.1.cost.total_cmp(&b.1.cost))
}
