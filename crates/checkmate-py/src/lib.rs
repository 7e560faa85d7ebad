//! `checkmate_rs._native`: checkmate-rs's graphs, strategies, simulator and sweeps for Python
//! (PyO3, stable ABI 3.8+). The Python package `checkmate_rs` (python/checkmate_rs) re-exports it
//! with type stubs; crates/checkmate-py/README.md shows its use.
//!
//! Errors of the Rust crates become `checkmate_rs.CheckmateError` with their messages; bad
//! arguments (an unknown strategy, a negative time limit) become `ValueError`. Solves release the
//! GIL.

#![warn(missing_docs)]

use std::time::Duration;

use checkmate_graph::{
    simulate as sim, Budget, Graph as RGraph, NodeKind, NodeSpec, Plan, PlanFile, Prediction, Step,
};
use checkmate_solver::baselines::CheckpointAll;
use checkmate_solver::sweep::{sweep as run_sweep, SweepOptions};
use checkmate_solver::{solve as run_solve, strategy_by_name, SolveOptions, STRATEGY_NAMES};
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

create_exception!(
    checkmate_rs,
    CheckmateError,
    PyException,
    "An error of checkmate-rs: a malformed graph or plan, a budget no plan fits, a solver failure. \
     The message names what is wrong and how to fix it."
);

fn err(e: impl std::fmt::Display) -> PyErr {
    CheckmateError::new_err(e.to_string())
}

/// A training graph: nodes in topological order with costs, output bytes, workspace and
/// dependencies, plus the static memory every step holds.
#[pyclass(module = "checkmate_rs", frozen)]
#[derive(Clone)]
pub struct Graph {
    inner: RGraph,
}

fn kind_of(s: &str) -> PyResult<NodeKind> {
    match s {
        "forward" => Ok(NodeKind::Forward),
        "loss" => Ok(NodeKind::Loss),
        "backward" => Ok(NodeKind::Backward),
        other => Err(PyValueError::new_err(format!(
            "node kind {other:?}: expected \"forward\", \"loss\" or \"backward\""
        ))),
    }
}

#[pymethods]
impl Graph {
    /// Builds a graph from Python lists: `costs[i]`, `bytes[i]` and `deps[i]` (indices of earlier
    /// nodes) per node; optional `names`, `kinds` ("forward", "loss", "backward"; default all
    /// forward) and `workspace` (bytes); `static_bytes` held throughout a step.
    #[new]
    #[pyo3(signature = (costs, bytes, deps, *, names=None, kinds=None, workspace=None, static_bytes=0, name="graph".to_string(), cost_unit="flops".to_string()))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        costs: Vec<f64>,
        bytes: Vec<u64>,
        deps: Vec<Vec<u64>>,
        names: Option<Vec<String>>,
        kinds: Option<Vec<String>>,
        workspace: Option<Vec<u64>>,
        static_bytes: u64,
        name: String,
        cost_unit: String,
    ) -> PyResult<Graph> {
        let n = costs.len();
        let check = |what: &str, len: usize| -> PyResult<()> {
            if len != n {
                return Err(PyValueError::new_err(format!(
                    "{what} has {len} entries for {n} nodes (costs): give one per node"
                )));
            }
            Ok(())
        };
        check("bytes", bytes.len())?;
        check("deps", deps.len())?;
        if let Some(v) = &names {
            check("names", v.len())?;
        }
        if let Some(v) = &kinds {
            check("kinds", v.len())?;
        }
        if let Some(v) = &workspace {
            check("workspace", v.len())?;
        }
        let mut specs = Vec::with_capacity(n);
        for i in 0..n {
            specs.push(NodeSpec {
                alternatives: Vec::new(),
                id: i as u64,
                name: names
                    .as_ref()
                    .map_or_else(|| format!("n{i}"), |v| v[i].clone()),
                kind: match &kinds {
                    Some(k) => kind_of(&k[i])?,
                    None => NodeKind::Forward,
                },
                cost: costs[i],
                bytes: bytes[i],
                workspace_bytes: workspace.as_ref().map_or(0, |w| w[i]),
                deps: deps[i].clone(),
            });
        }
        let inner = RGraph::new(name, cost_unit, static_bytes, specs).map_err(err)?;
        Ok(Graph { inner })
    }

    /// Reads a graph from JSON text: `checkmate-graph/1` or networkx node-link (Checkmate's files).
    #[staticmethod]
    #[pyo3(signature = (text, context="<string>"))]
    fn from_json(text: &str, context: &str) -> PyResult<Graph> {
        let inner = RGraph::from_json_str(text, context).map_err(err)?;
        Ok(Graph { inner })
    }

    /// Reads a graph file (either format).
    #[staticmethod]
    fn read(path: std::path::PathBuf) -> PyResult<Graph> {
        let inner = RGraph::read(&path).map_err(err)?;
        Ok(Graph { inner })
    }

    /// The graph as `checkmate-graph/1` JSON.
    fn to_json(&self) -> String {
        self.inner.to_json()
    }

    /// The graph's name.
    #[getter]
    fn name(&self) -> String {
        self.inner.name().to_string()
    }

    /// The unit of node costs (e.g. "flops", "s").
    #[getter]
    fn cost_unit(&self) -> String {
        self.inner.cost_unit().to_string()
    }

    /// Bytes held throughout a step (parameters, gradients, optimizer state, inputs).
    #[getter]
    fn static_bytes(&self) -> u64 {
        self.inner.static_bytes()
    }

    /// The cost of computing every node once.
    #[getter]
    fn total_cost(&self) -> f64 {
        self.inner.total_cost()
    }

    /// Activation peak of checkpoint-all (every output kept until its last reader): the
    /// reference of percentage budgets.
    #[getter]
    fn checkpoint_all_peak(&self) -> u64 {
        CheckpointAll::peak_bytes(&self.inner)
    }

    /// A proven lower bound on any plan's activation peak.
    #[getter]
    fn min_feasible_activation_bytes(&self) -> u64 {
        self.inner.min_feasible_activation_bytes()
    }

    /// Node names, in order.
    #[getter]
    fn names(&self) -> Vec<String> {
        self.inner.nodes().iter().map(|n| n.name.clone()).collect()
    }

    /// Per node, the indices of the nodes it reads.
    #[getter]
    fn deps(&self) -> Vec<Vec<usize>> {
        (0..self.inner.len())
            .map(|i| self.inner.preds(i).to_vec())
            .collect()
    }

    fn __len__(&self) -> usize {
        self.inner.len()
    }

    fn __repr__(&self) -> String {
        format!(
            "Graph({:?}, {} nodes, static {} bytes)",
            self.inner.name(),
            self.inner.len(),
            self.inner.static_bytes()
        )
    }
}

/// What a plan does, as the simulator judges it.
fn simulation_dict<'py>(py: Python<'py>, g: &RGraph, plan: &Plan) -> PyResult<Bound<'py, PyDict>> {
    let s = sim(g, plan).map_err(err)?;
    let d = PyDict::new(py);
    d.set_item("cost", s.cost)?;
    d.set_item("peak_bytes", s.peak_bytes)?;
    d.set_item("total_peak_bytes", s.peak_bytes + g.static_bytes())?;
    d.set_item("peak_step", s.peak_step)?;
    d.set_item("computes", s.computes)?;
    d.set_item("overhead", s.overhead(g))?;
    d.set_item("live_after_step", s.live_after_step)?;
    Ok(d)
}

/// A plan as Python: a list of `("compute", i)` / `("free", i)`.
fn steps_list(plan: &Plan) -> Vec<(&'static str, usize)> {
    plan.steps
        .iter()
        .map(|s| match *s {
            Step::Compute(v) => ("compute", v),
            Step::Free(v) => ("free", v),
        })
        .collect()
}

fn plan_of(g: &RGraph, steps: &Bound<'_, PyAny>) -> PyResult<Plan> {
    if let Ok(text) = steps.extract::<String>() {
        return Ok(PlanFile::from_json_str(&text, g, "<plan>")
            .map_err(err)?
            .plan);
    }
    let items: Vec<(String, usize)> = steps.extract().map_err(|_| {
        PyValueError::new_err(
            "a plan is a list of (\"compute\", i) / (\"free\", i) pairs or checkmate-plan/1 JSON text",
        )
    })?;
    let mut out = Vec::with_capacity(items.len());
    for (op, v) in items {
        if v >= g.len() {
            return Err(PyValueError::new_err(format!(
                "plan step ({op:?}, {v}): the graph has {} nodes",
                g.len()
            )));
        }
        out.push(match op.as_str() {
            "compute" => Step::Compute(v),
            "free" => Step::Free(v),
            other => {
                return Err(PyValueError::new_err(format!(
                    "plan step {other:?}: expected \"compute\" or \"free\""
                )))
            }
        });
    }
    Ok(Plan::new(out))
}

fn budget_bytes(g: &RGraph, budget: &Bound<'_, PyAny>) -> PyResult<u64> {
    let b = if let Ok(n) = budget.extract::<u64>() {
        Budget::Bytes(n)
    } else if let Ok(s) = budget.extract::<String>() {
        s.parse::<Budget>()
            .map_err(|e| PyValueError::new_err(format!("budget {s:?}: {e}")))?
    } else {
        return Err(PyValueError::new_err(
            "budget: give total bytes (int) or text such as \"80%\", \"6GiB\"",
        ));
    };
    let total = b.total_bytes(g.static_bytes(), CheckpointAll::peak_bytes(g));
    // The CLI's error, word for word.
    total.checked_sub(g.static_bytes()).ok_or_else(|| {
        err(checkmate_solver::Error::BelowStatic {
            total_bytes: total,
            static_bytes: g.static_bytes(),
        })
    })
}

/// A `time_limit` argument: positive seconds or none.
fn seconds(time_limit: Option<f64>) -> PyResult<Option<Duration>> {
    match time_limit {
        Some(s) if s.is_finite() && s > 0.0 => Ok(Some(Duration::from_secs_f64(s))),
        Some(s) => Err(PyValueError::new_err(format!(
            "time_limit {s}: give a positive number of seconds"
        ))),
        None => Ok(None),
    }
}

fn options(
    time_limit: Option<f64>,
    threads: usize,
    mip_gap: f64,
    seed: u64,
    warm_start: bool,
) -> PyResult<SolveOptions> {
    let time_limit = seconds(time_limit)?;
    if !(mip_gap.is_finite() && mip_gap >= 0.0) {
        return Err(PyValueError::new_err(format!(
            "mip_gap {mip_gap}: give a non-negative number"
        )));
    }
    Ok(SolveOptions {
        time_limit,
        mip_gap,
        threads: threads.max(1),
        warm_start,
        seed,
        ..SolveOptions::default()
    })
}

fn strategy(name: &str) -> PyResult<Box<dyn checkmate_solver::Strategy>> {
    strategy_by_name(name).map_err(|e| PyValueError::new_err(e.to_string()))
}

/// The keys of `solve`'s answer that come with a plan (the first five from the simulator).
const PLAN_KEYS: [&str; 7] = [
    "cost",
    "peak_bytes",
    "total_peak_bytes",
    "overhead",
    "computes",
    "plan",
    "plan_json",
];

/// Solves `graph` under `budget` (total bytes as int, or "80%" of the checkpoint-all activation
/// peak plus static memory, or units such as "6GiB") with `strategy` (see `strategies()`), as
/// `checkmate solve` does. Returns a dict: strategy, status, cost, lower_bound, peak_bytes,
/// total_peak_bytes, overhead, computes, plan (list of steps), plan_json (checkmate-plan/1),
/// solve_seconds, budget_bytes (total), activation_budget_bytes, limit, exact_model (whether HiGHS
/// solved the exact MILP for this answer). Raises CheckmateError when
/// no plan fits (the message names the least feasible budget when known).
#[pyfunction]
#[pyo3(signature = (graph, budget, strategy="milp", *, time_limit=None, threads=1, mip_gap=1e-4, seed=0, warm_start=true))]
#[allow(clippy::too_many_arguments)]
fn solve<'py>(
    py: Python<'py>,
    graph: &Graph,
    budget: &Bound<'py, PyAny>,
    strategy: &str,
    time_limit: Option<f64>,
    threads: usize,
    mip_gap: f64,
    seed: u64,
    warm_start: bool,
) -> PyResult<Bound<'py, PyDict>> {
    let g = &graph.inner;
    let activation = budget_bytes(g, budget)?;
    let opts = options(time_limit, threads, mip_gap, seed, warm_start)?;
    let s = self::strategy(strategy)?;
    let solution = py
        .allow_threads(|| run_solve(g, s.as_ref(), activation, &opts))
        .map_err(err)?;
    let d = PyDict::new(py);
    d.set_item("strategy", &solution.strategy)?;
    d.set_item("status", solution.status.as_str())?;
    d.set_item("lower_bound", solution.lower_bound)?;
    d.set_item("solve_seconds", solution.solve_seconds)?;
    d.set_item("budget_bytes", activation + g.static_bytes())?;
    d.set_item("activation_budget_bytes", activation)?;
    d.set_item("limit", solution.limit.as_ref().map(|l| l.to_string()))?;
    d.set_item("exact_model", solution.exact_model)?;
    match &solution.plan {
        Some(plan) => {
            let s = simulation_dict(py, g, plan)?;
            for key in &PLAN_KEYS[..5] {
                d.set_item(key, s.get_item(key)?)?;
            }
            d.set_item("plan", steps_list(plan))?;
            let file = PlanFile {
                graph: g.name().to_string(),
                strategy: solution.strategy.clone(),
                budget_bytes: Some(activation + g.static_bytes()),
                predicted: Some(Prediction {
                    peak_bytes: s.get_item("peak_bytes")?.map_or(Ok(0), |v| v.extract())?,
                    cost: s.get_item("cost")?.map_or(Ok(0.0), |v| v.extract())?,
                }),
                plan: plan.clone(),
            };
            d.set_item("plan_json", file.to_json(g))?;
        }
        None => {
            for key in PLAN_KEYS {
                d.set_item(key, py.None())?;
            }
        }
    }
    Ok(d)
}

/// Judges a plan (a list of ("compute", i) / ("free", i), or checkmate-plan/1 JSON text) on
/// `graph`: a dict with cost, peak_bytes, total_peak_bytes, peak_step, computes, overhead and
/// live_after_step. Raises CheckmateError for an invalid plan (a missing input, a node never
/// computed), naming the step.
#[pyfunction]
fn simulate<'py>(
    py: Python<'py>,
    graph: &Graph,
    plan: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyDict>> {
    let p = plan_of(&graph.inner, plan)?;
    simulation_dict(py, &graph.inner, &p)
}

/// The cost/memory frontier of `strategies` at `points` budgets evenly spaced from the least
/// feasible one to the checkpoint-all peak, as `checkmate sweep`: a list of dicts (strategy,
/// budget_bytes (activations), total_budget_bytes, status, cost, overhead, peak_bytes).
#[pyfunction]
#[pyo3(signature = (graph, strategies=None, points=5, *, time_limit=None, threads=1, mip_gap=1e-4, seed=0))]
#[allow(clippy::too_many_arguments)]
fn sweep<'py>(
    py: Python<'py>,
    graph: &Graph,
    strategies: Option<Vec<String>>,
    points: usize,
    time_limit: Option<f64>,
    threads: usize,
    mip_gap: f64,
    seed: u64,
) -> PyResult<Bound<'py, PyList>> {
    let g = &graph.inner;
    let names = strategies.unwrap_or_else(|| {
        ["checkpoint-all", "chen-greedy", "lp-round", "milp"]
            .iter()
            .map(|s| s.to_string())
            .collect()
    });
    let boxed = names
        .iter()
        .map(|n| strategy(n))
        .collect::<PyResult<Vec<_>>>()?;
    if points == 0 {
        return Err(PyValueError::new_err("points: give at least 1"));
    }
    let opts = SweepOptions {
        points,
        solve: options(time_limit, threads, mip_gap, seed, true)?,
    };
    let result = py
        .allow_threads(|| run_sweep(g, &boxed, &opts, &|_| {}))
        .map_err(err)?;
    let out = PyList::empty(py);
    for p in &result.points {
        let d = PyDict::new(py);
        d.set_item("strategy", &p.strategy)?;
        d.set_item("budget_bytes", p.budget_bytes)?;
        d.set_item("total_budget_bytes", p.budget_bytes + result.static_bytes)?;
        d.set_item("status", p.status.as_str())?;
        d.set_item("cost", p.cost)?;
        d.set_item("overhead", p.overhead)?;
        d.set_item("peak_bytes", p.peak_bytes)?;
        out.append(d)?;
    }
    Ok(out)
}

/// The exact 0/1 knapsack (HiGHS): items maximizing the total of `values` with the total of
/// `weights` at most `capacity` (PyTorch's `activation_memory_budget` problem: save the
/// activations whose recomputation would cost most within a memory budget). Returns a dict:
/// chosen (sorted item indices), value, weight, optimal (false when `time_limit` seconds stopped
/// the search). Raises CheckmateError for negative or non-finite input, naming the item.
#[pyfunction]
#[pyo3(signature = (values, weights, capacity, *, time_limit=None))]
fn knapsack<'py>(
    py: Python<'py>,
    values: Vec<f64>,
    weights: Vec<f64>,
    capacity: f64,
    time_limit: Option<f64>,
) -> PyResult<Bound<'py, PyDict>> {
    let limit = seconds(time_limit)?;
    let k = py
        .allow_threads(|| checkmate_solver::knapsack::solve(&values, &weights, capacity, limit))
        .map_err(err)?;
    let d = PyDict::new(py);
    let chosen: Vec<usize> = (0..k.chosen.len()).filter(|&i| k.chosen[i]).collect();
    d.set_item("chosen", chosen)?;
    d.set_item("value", k.value)?;
    d.set_item("weight", k.weight)?;
    d.set_item("optimal", k.optimal)?;
    Ok(d)
}

/// The strategy names `solve` and `sweep` take.
#[pyfunction]
fn strategies() -> Vec<&'static str> {
    STRATEGY_NAMES.to_vec()
}

/// The module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Graph>()?;
    m.add_function(wrap_pyfunction!(solve, m)?)?;
    m.add_function(wrap_pyfunction!(simulate, m)?)?;
    m.add_function(wrap_pyfunction!(sweep, m)?)?;
    m.add_function(wrap_pyfunction!(strategies, m)?)?;
    m.add_function(wrap_pyfunction!(knapsack, m)?)?;
    m.add("CheckmateError", m.py().get_type::<CheckmateError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
